#!/usr/bin/env bash
# What a C++ user types first must work: `cmake -S . -B build && cmake --build build` with the
# default generator (Unix Makefiles), with CUDA when a toolkit is found and without. Configures
# both into scratch directories and builds the library's tool in the host-only one.
set -euo pipefail
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for cuda in AUTO OFF; do
  echo "== cmake -G 'Unix Makefiles' (HICOLL_WITH_CUDA=$cuda)"
  cmake -S "$src" -B "$work/$cuda" -G "Unix Makefiles" -DHICOLL_WITH_CUDA=$cuda -DHICOLL_BUILD_EXAMPLES=OFF >"$work/$cuda.log" 2>&1 \
    || { cat "$work/$cuda.log"; exit 1; }
done
cmake --build "$work/OFF" --target hicoll_info -j 2 >"$work/build.log" 2>&1 || { tail -50 "$work/build.log"; exit 1; }
"$work/OFF/src/hicoll_info" >/dev/null
echo "makefile_generator: ok"
