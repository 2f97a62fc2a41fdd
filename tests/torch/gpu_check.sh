#!/usr/bin/env bash
# The GPU check of the torch plugin: one prepared run for a lent GPU machine, under 5 minutes.
#
#   OUT=/some/dir bash tests/torch/gpu_check.sh      (OUT defaults to ./build-torchgpu-out)
#
# 1. Builds libhicoll with CUDA as tests/gpu/device_check.sh does (cmake -S tests/gpu, target
#    hicoll only): tools from where they are (PATH, /usr/local/cuda, pip's cmake/ninja);
#    libfabric, fmt, nlohmann_json and pkg-config missing on the machine come from the carried
#    build-gpu-deps/ (tests/gpu/pack_deps.sh).
# 2. Builds the extension (hicoll._C with -DHICOLL_PLUGIN_CUDA) against the torch of $PYTHON
#    (default: /opt/torch/.venv/bin/python, else .venv/bin/python, else python3) into a private
#    directory used through PYTHONPATH: that environment is not modified.
# 3. Runs only tests/torch/test_gpu.py (2 ranks sharing cuda:0, 1 and 2 simulated nodes): with
#    pytest when that Python has it, else as a script.
# Prints a PASS/FAIL summary (also $OUT/summary.txt); exits 0 only when the GPU test passed.
# Without a GPU everything up to the test runs, and the test reports "no CUDA device: skipped".
# GPU_CHECK_USE_CARRIED=1 takes libfabric/fmt/json/pkg-config from build-gpu-deps even when the
# machine has them (rehearses the GPU machine on the dev machine).
set -u
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-285}  # under 5 minutes
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/build-torchgpu-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
DEPS=$ROOT/build-gpu-deps
BUILD=${GPU_CHECK_BUILD_DIR:-$ROOT/build-torchgpu}
SHIM=$BUILD-shim
PLUG=$BUILD-plugin
NPROC=$(nproc 2>/dev/null || echo 8)
CARRIED=${GPU_CHECK_USE_CARRIED:-0}
RESULTS=()
STATUS=FAIL

left() { echo $((BUDGET - ($(date +%s) - START))); }
step_timeout() {  # min(wanted, time left - 10), at least 5
  local want=$1 l
  l=$(($(left) - 10))
  [ "$l" -lt "$want" ] && want=$l
  [ "$want" -lt 5 ] && want=5
  echo "$want"
}
say() { echo "== [$(($(date +%s) - START))s] $*"; }
first() { for c in "$@"; do [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }; done; return 1; }
finish() {
  {
    echo "===== torch plugin GPU check: $STATUS ====="
    printf '  %s\n' "${RESULTS[@]}"
    echo "  total: $(($(date +%s) - START)) s; logs in $OUT"
  } | tee "$OUT/summary.txt"
  [ "$STATUS" = PASS ] || [ "$STATUS" = SKIPPED ]
  exit $?
}

PY=$(first "${PYTHON:-}" /opt/torch/.venv/bin/python "$ROOT/.venv/bin/python" "$(command -v python3)") || {
  RESULTS+=("python: none found"); finish; }
pyexec() { "$PY" -c "$1" 2>/dev/null; }
TORCH_LIB=$(pyexec 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
say "python: $PY; torch: $(pyexec 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())' || echo 'NOT IMPORTABLE')"
if command -v nvidia-smi >/dev/null; then
  say "GPU: $(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>&1 | head -1)"
else
  say "GPU: no nvidia-smi"
fi
[ -n "$TORCH_LIB" ] || { RESULTS+=("torch: not importable by $PY"); finish; }
# The tools of that environment (pip's cmake and ninja live next to its python).
export PATH=$(dirname "$PY"):$PATH

# ---- NCCL for libhicoll's own fallback (as device_check.sh) -------------------------------
NCCL=""
for c in "${HICOLL_NCCL_LIB:-}" \
  "$(pyexec 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))')" \
  "$TORCH_LIB/libnccl.so.2" /usr/lib/x86_64-linux-gnu/libnccl.so.2 /usr/local/cuda/lib64/libnccl.so.2; do
  [ -n "$c" ] && [ -f "$c" ] && { NCCL=$c; break; }
done
[ -n "$NCCL" ] && export HICOLL_NCCL_LIB=$NCCL
say "NCCL for libhicoll's fallback: ${NCCL:-none found}"

# ---- 1. libhicoll with CUDA ----------------------------------------------------------------
CMAKE=$(first "$(command -v cmake)" "$(pyexec 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))')") || CMAKE=""
NINJA=$(first "$(command -v ninja)" "$(pyexec 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))')") || NINJA=""
CXX_BIN=$(first "${CXX:-}" "$(command -v g++)" "$(command -v c++)" "$(command -v clang++)") || CXX_BIN=""
NVCC=$(first "${CUDACXX:-}" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" /usr/local/cuda/bin/nvcc "$(command -v nvcc)") || NVCC=""
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
[ -z "$ARCH" ] && ARCH=90
say "tools: cmake=${CMAKE:--} ninja=${NINJA:--} c++=${CXX_BIN:--} nvcc=${NVCC:--} arch=sm_$ARCH"
if [ -z "$CMAKE" ] || [ -z "$CXX_BIN" ] || [ -z "$NVCC" ]; then
  RESULTS+=("libhicoll: no toolchain (cmake, c++ and nvcc are needed)"); finish
fi
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}

CMAKE_ARGS=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DCMAKE_CUDA_FLAGS=-allow-unsupported-compiler
  -DCMAKE_CXX_COMPILER="$CXX_BIN" -DCMAKE_CUDA_HOST_COMPILER="$CXX_BIN" -DCMAKE_CUDA_COMPILER="$NVCC")
[ -n "$NINJA" ] && CMAKE_ARGS+=(-G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA")
EXTRA_LD=""
mkdir -p "$SHIM/bin"
FAB_INC="" FAB_LIB=""
if [ "$CARRIED" != 1 ] && pkg-config --exists libfabric 2>/dev/null; then
  say "libfabric: the machine's ($(pkg-config --modversion libfabric))"
elif [ "$CARRIED" != 1 ] && [ -f /usr/include/rdma/fabric.h ] && ls /usr/lib/x86_64-linux-gnu/libfabric.so >/dev/null 2>&1; then
  FAB_INC=/usr/include FAB_LIB=/usr/lib/x86_64-linux-gnu
  say "libfabric: the machine's, without a pkg-config entry"
elif [ -d "$DEPS/libfabric" ]; then
  FAB_INC=$DEPS/libfabric/include FAB_LIB=$DEPS/libfabric/lib
  EXTRA_LD=$FAB_LIB
  say "libfabric: carried ($(cat "$DEPS/libfabric/VERSION" 2>/dev/null))"
else
  say "libfabric: not found and nothing carried (run tests/gpu/pack_deps.sh, carry build-gpu-deps)"
fi
if [ -n "$FAB_INC" ]; then
  mkdir -p "$SHIM/pkgconfig"
  cat > "$SHIM/pkgconfig/libfabric.pc" <<EOF
prefix=$(dirname "$FAB_INC")
includedir=$FAB_INC
libdir=$FAB_LIB
Name: libfabric
Description: libfabric (for the hicoll torch GPU check)
Version: 1.17.0
Cflags: -I\${includedir}
Libs: -L\${libdir} -lfabric
EOF
  export PKG_CONFIG_PATH=$SHIM/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  if [ "$CARRIED" = 1 ] || ! command -v pkg-config >/dev/null; then
    # Answers FindPkgConfig's questions about libfabric, and only those.
    cat > "$SHIM/bin/pkg-config" <<EOF
#!/bin/sh
out=""
for a in "\$@"; do
  case "\$a" in
    --version) echo 0.29.2; exit 0 ;;
    --modversion) out="1.17.0" ;;
    --variable=prefix) out="$(dirname "$FAB_INC")" ;;
    --variable=includedir) out="$FAB_INC" ;;
    --variable=libdir) out="$FAB_LIB" ;;
    --variable=*) out="" ;;
    --cflags|--cflags-only-I) out="-I$FAB_INC" ;;
    --libs) out="-L$FAB_LIB -lfabric" ;;
    --libs-only-L) out="-L$FAB_LIB" ;;
    --libs-only-l) out="-lfabric" ;;
    --cflags-only-other|--libs-only-other|--exists|--print-errors|--short-errors|--static|libfabric) ;;
    *) echo "pkg-config shim: only libfabric is known" >&2; exit 1 ;;
  esac
done
[ -n "\$out" ] && echo "\$out"
exit 0
EOF
    chmod +x "$SHIM/bin/pkg-config"
    CMAKE_ARGS+=(-DPKG_CONFIG_EXECUTABLE="$SHIM/bin/pkg-config")
    say "pkg-config: a shim for libfabric"
  fi
fi
if [ "$CARRIED" = 1 ] || ! ls /usr/lib/*/cmake/fmt/fmt-config.cmake /usr/lib/cmake/fmt/fmt-config.cmake \
  /usr/local/lib*/cmake/fmt/fmt-config.cmake /usr/lib64/cmake/fmt/fmt-config.cmake >/dev/null 2>&1; then
  FMT_INC=""
  if [ -f "$DEPS/fmt/include/fmt/format.h" ]; then
    FMT_INC=$DEPS/fmt/include
  elif [ -f "$TORCH_LIB/../include/fmt/format.h" ]; then
    FMT_INC=$(cd "$TORCH_LIB/../include" && pwd)
  fi
  if [ -n "$FMT_INC" ]; then
    mkdir -p "$SHIM/fmt-include" "$SHIM/fmt-cmake"
    rm -rf "$SHIM/fmt-include/fmt"
    ln -s "$FMT_INC/fmt" "$SHIM/fmt-include/fmt"
    cat > "$SHIM/fmt-cmake/fmt-config.cmake" <<EOF
if(NOT TARGET fmt::fmt)
  add_library(fmt::fmt INTERFACE IMPORTED)
  set_target_properties(fmt::fmt PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "$SHIM/fmt-include"
                        INTERFACE_COMPILE_DEFINITIONS "FMT_HEADER_ONLY=1")
endif()
set(fmt_FOUND TRUE)
EOF
    CMAKE_ARGS+=(-Dfmt_DIR="$SHIM/fmt-cmake")
    say "fmt: header-only from $FMT_INC"
  else
    say "fmt: not found"
  fi
fi
if [ "$CARRIED" = 1 ] || ! ls /usr/share/cmake/nlohmann_json /usr/lib/*/cmake/nlohmann_json /usr/lib/cmake/nlohmann_json \
  /usr/local/share/cmake/nlohmann_json /usr/local/lib*/cmake/nlohmann_json >/dev/null 2>&1; then
  if [ -d "$DEPS/json/share/cmake/nlohmann_json" ]; then
    CMAKE_ARGS+=(-Dnlohmann_json_DIR="$DEPS/json/share/cmake/nlohmann_json")
    say "nlohmann_json: carried"
  else
    say "nlohmann_json: not found"
  fi
fi

say "libhicoll: configure + build (-j$NPROC) -> $OUT/lib_build.log"
PATH=$SHIM/bin:$PATH timeout "$(step_timeout 60)" "$CMAKE" -S "$ROOT/tests/gpu" -B "$BUILD" "${CMAKE_ARGS[@]}" \
  > "$OUT/lib_build.log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
  PATH=$SHIM/bin:$PATH timeout "$(step_timeout 180)" "$CMAKE" --build "$BUILD" -j "$NPROC" --target hicoll \
    >> "$OUT/lib_build.log" 2>&1
  rc=$?
fi
LIB=$(find "$BUILD" -name libhicoll.so -newer "$OUT/lib_build.log" 2>/dev/null | head -1)
[ -z "$LIB" ] && LIB=$(find "$BUILD" -name libhicoll.so 2>/dev/null | head -1)
if [ $rc -ne 0 ] || [ -z "$LIB" ]; then
  tail -25 "$OUT/lib_build.log"
  RESULTS+=("libhicoll: build FAILED (rc $rc), see lib_build.log"); finish
fi
if ! grep -q "CUDA=ON" "$OUT/lib_build.log" && ! grep -q "HICOLL_HAVE_CUDA" "$BUILD/CMakeCache.txt" 2>/dev/null; then
  say "warning: could not confirm a CUDA build of libhicoll"
fi
RESULTS+=("libhicoll: built with CUDA ($(($(date +%s) - START)) s): $LIB")
[ -n "$EXTRA_LD" ] && export LD_LIBRARY_PATH=$EXTRA_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# ---- 2. the extension ----------------------------------------------------------------------
say "plugin: build against $PY's torch -> $PLUG ($OUT/plugin_build.log)"
rm -rf "$PLUG"
mkdir -p "$PLUG/lib"
(cd "$ROOT/plugins/torch" && MAX_JOBS=$NPROC HICOLL_PLUGIN_CUDA=1 HICOLL_BUILD_DIR=$(dirname "$LIB") \
  timeout "$(step_timeout 150)" "$PY" setup.py -q build --build-base "$PLUG/build" --build-lib "$PLUG/lib") \
  > "$OUT/plugin_build.log" 2>&1
rc=$?
grep -m1 "hicoll plugin:" "$OUT/plugin_build.log"
if [ $rc -ne 0 ] || ! ls "$PLUG"/lib/hicoll/_C*.so >/dev/null 2>&1; then
  grep -E "error|Error" "$OUT/plugin_build.log" | head -15
  tail -15 "$OUT/plugin_build.log"
  RESULTS+=("plugin: build FAILED (rc $rc), see plugin_build.log"); finish
fi
export PYTHONPATH=$PLUG/lib${PYTHONPATH:+:$PYTHONPATH}
if ! (cd "$OUT" && "$PY" -c 'import hicoll.torch as ht, hicoll; assert ht.cuda_build(), "not a CUDA build"; print("import hicoll.torch:", hicoll.__file__)'); then
  RESULTS+=("plugin: built but import hicoll.torch FAILED"); finish
fi
RESULTS+=("plugin: built with CUDA ($(($(date +%s) - START)) s)")

# ---- 3. the GPU test -----------------------------------------------------------------------
export HICOLL_GPU_TEST_TIMEOUT_S=$(($(step_timeout 200) / 2 - 5))
[ "$HICOLL_GPU_TEST_TIMEOUT_S" -lt 20 ] && HICOLL_GPU_TEST_TIMEOUT_S=20
say "test_gpu.py (each case bounded by ${HICOLL_GPU_TEST_TIMEOUT_S} s) -> $OUT/test_gpu.log"
cd "$ROOT"
if "$PY" -c 'import pytest' 2>/dev/null; then
  timeout "$(step_timeout 200)" "$PY" -m pytest -v -s -rs -p no:cacheprovider tests/torch/test_gpu.py \
    > "$OUT/test_gpu.log" 2>&1
  rc=$?
  runner=pytest
else
  timeout "$(step_timeout 200)" "$PY" tests/torch/test_gpu.py > "$OUT/test_gpu.log" 2>&1
  rc=$?
  runner="script (no pytest in $PY)"
fi
grep -E "PASSED|FAILED|SKIPPED|passed|failed|skipped|library paths|Error" "$OUT/test_gpu.log" | head -20
if grep -qE "SKIPPED|skipped" "$OUT/test_gpu.log" && ! grep -qE "PASSED|passed" "$OUT/test_gpu.log"; then
  STATUS=SKIPPED
  RESULTS+=("test_gpu.py ($runner): no CUDA device: skipped")
elif [ $rc -eq 0 ]; then
  STATUS=PASS
  RESULTS+=("test_gpu.py ($runner): PASS")
else
  [ $rc -eq 124 ] && RESULTS+=("test_gpu.py ($runner): TIMEOUT") || RESULTS+=("test_gpu.py ($runner): FAIL (rc $rc)")
  grep -v "INFO" "$OUT/test_gpu.log" | tail -40
fi
finish
