#!/usr/bin/env bash
# Prepares build-gpu-deps/ (ignored by git) for tests/gpu/device_check.sh, to be carried to a
# GPU machine that may lack some of what the build needs:
#   libfabric/   headers, libfabric.so.1 and the libraries it links (Debian 12, glibc >= 2.34)
#   fmt/         fmt's headers (used header-only there)
#   json/        nlohmann_json (headers and CMake package; src/sharded requires it)
#   lib/         libcudart and libfmt for the prebuilt programs (which then need glibc >= 2.34
#                and libstdc++ of GCC >= 11 on the GPU machine)
#   bin/         gpu_collectives and gpu_bench prebuilt here (sm_80, sm_90 + PTX), used only
#                when the GPU machine cannot build
# Usage: tests/gpu/pack_deps.sh [--no-prebuilt]      (about 3 minutes on 2 cores)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEPS=$ROOT/build-gpu-deps
BUILD=$ROOT/build-gpu-bundle
PREBUILT=1
[ "${1:-}" = "--no-prebuilt" ] && PREBUILT=0

rm -rf "$DEPS"
mkdir -p "$DEPS/libfabric/include" "$DEPS/libfabric/lib" "$DEPS/fmt/include" "$DEPS/lib" "$DEPS/bin"

# libfabric and the shared libraries it needs (not glibc's own).
cp -r /usr/include/rdma "$DEPS/libfabric/include/"
pkg-config --modversion libfabric > "$DEPS/libfabric/VERSION"
fab=$(readlink -f /usr/lib/x86_64-linux-gnu/libfabric.so.1)
cp "$fab" "$DEPS/libfabric/lib/libfabric.so.1"
ln -s libfabric.so.1 "$DEPS/libfabric/lib/libfabric.so"
ldd "$fab" | awk '/=> \// {print $1, $3}' | while read -r name path; do
  case "$name" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libgcc_s.so.*|libstdc++.so.*) continue ;;
  esac
  cp "$(readlink -f "$path")" "$DEPS/libfabric/lib/$name"
done

# fmt, header-only on the GPU machine.
cp -r /usr/include/fmt "$DEPS/fmt/include/"
# nlohmann_json: its CMake package finds the headers relative to itself (prefix/share/cmake).
mkdir -p "$DEPS/json/include" "$DEPS/json/share/cmake"
cp -r /usr/include/nlohmann "$DEPS/json/include/"
cp -r /usr/share/cmake/nlohmann_json "$DEPS/json/share/cmake/"

if [ "$PREBUILT" = 1 ]; then
  cmake -S "$ROOT/tests/gpu" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="80-real;90-real;90-virtual" -DHCGPU_PORTABLE=ON > "$BUILD.log" 2>&1 ||
    { tail -30 "$BUILD.log"; exit 1; }
  ninja -C "$BUILD" -j"$(nproc)" gpu_collectives gpu_bench >> "$BUILD.log" 2>&1 || { tail -30 "$BUILD.log"; exit 1; }
  cp "$BUILD/gpu_collectives" "$BUILD/gpu_bench" "$DEPS/bin/"
  strip --strip-debug "$DEPS/bin/gpu_collectives" "$DEPS/bin/gpu_bench"
  cp "$(readlink -f /usr/local/cuda/lib64/libcudart.so.13)" "$DEPS/lib/libcudart.so.13"
  for l in libfmt.so.9; do
    cp "$(readlink -f /usr/lib/x86_64-linux-gnu/$l)" "$DEPS/lib/$l"
  done
  need() { objdump -T "$DEPS"/bin/gpu_* "$DEPS"/lib/* "$DEPS"/libfabric/lib/* 2>/dev/null | grep -o "$1"'_[0-9.]*' | sort -uV | tail -1; }
  echo "prebuilt programs need $(need GLIBC) and $(need GLIBCXX) or newer"
  git -C "$ROOT" rev-parse HEAD > "$DEPS/bin/COMMIT" 2>/dev/null || true
fi
du -sh "$DEPS"
echo "carry it: run(..., carry=[\"build-gpu-deps\"])"
