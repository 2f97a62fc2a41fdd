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

PY=""
# shellcheck source=../gpu/build_env.sh
. "$ROOT/tests/gpu/build_env.sh"
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

gpu_find_nccl

# ---- 1. libhicoll with CUDA ----------------------------------------------------------------
gpu_find_tools
if [ -z "$CMAKE" ] || [ -z "$CXX_BIN" ] || [ -z "$NVCC" ]; then
  RESULTS+=("libhicoll: no toolchain (cmake, c++ and nvcc are needed)"); finish
fi
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
gpu_find_deps

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
# plugins/torch's CMake project directly (what pip's scikit-build-core runs), on that libhicoll.
(export HICOLL_PLUGIN_CUDA=1 PATH=$SHIM/bin:$PATH
 timeout "$(step_timeout 30)" "$CMAKE" -S "$ROOT/plugins/torch" -B "$PLUG/build" \
   -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$PY" -DHICOLL_BUILD_DIR="$(dirname "$LIB")" \
   -DHICOLL_INCLUDE_DIR="$ROOT/include" &&
 timeout "$(step_timeout 150)" "$CMAKE" --build "$PLUG/build" -j "$NPROC" &&
 "$CMAKE" --install "$PLUG/build" --component hicoll_python --prefix "$PLUG/lib" &&
 cp "$ROOT"/plugins/torch/hicoll/*.py "$PLUG/lib/hicoll/") > "$OUT/plugin_build.log" 2>&1
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
