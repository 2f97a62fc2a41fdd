#!/usr/bin/env bash
# What a C++ user types first must work: `cmake -S . -B build && cmake --build build` with the
# default generator (Unix Makefiles), with CUDA when a toolkit is found and without. Configures
# both into scratch directories and builds the library's tool in the host-only one, with the
# library's headers precompiled as `pip install .` builds it (HICOLL_PCH=ON; the project's own
# builds leave it off, so this is where that configuration compiles).
#
#   makefile_generator.sh SOURCE_DIR [WORK_DIR]
# WORK_DIR (emptied first) is a fixed place so that ccache finds the objects of the last run:
# a temporary directory's new path would miss every one.
set -euo pipefail
src=$1
work=${2:-$(mktemp -d)}
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
for cuda in AUTO OFF; do
  echo "== cmake -G 'Unix Makefiles' (HICOLL_WITH_CUDA=$cuda)"
  pch=OFF
  [ "$cuda" = OFF ] && pch=ON
  cmake -S "$src" -B "$work/$cuda" -G "Unix Makefiles" -DHICOLL_WITH_CUDA=$cuda -DHICOLL_BUILD_EXAMPLES=OFF \
    -DHICOLL_PCH=$pch >"$work/$cuda.log" 2>&1 \
    || { cat "$work/$cuda.log"; exit 1; }
done
cmake --build "$work/OFF" --target hicoll_info -j 2 >"$work/build.log" 2>&1 || { tail -50 "$work/build.log"; exit 1; }
"$work/OFF/src/hicoll_info" >/dev/null
echo "makefile_generator: ok"
