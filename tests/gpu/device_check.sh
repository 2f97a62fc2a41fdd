#!/usr/bin/env bash
# The GPU check of hicoll: one prepared run for a lent accelerator machine, under 8 minutes.
#
#   OUT=/some/dir bash tests/gpu/device_check.sh        (OUT defaults to ./build-devcheck-out)
#
# 1. Reports the machine (GPU, driver, tools, NCCL) in $OUT/env.txt.
# 2. Builds the library and the GPU tests from this tree: tests/gpu is a top-level CMake
#    project there, so GTest, MPI and torch are not needed. Tools are taken from where they
#    are (PATH, /usr/local/cuda, $CUDA_HOME, pip's cmake/ninja); libfabric, fmt, nlohmann_json
#    and pkg-config missing on the machine come from build-gpu-deps/ (tests/gpu/pack_deps.sh,
#    carried along).
#    If it cannot build, it runs the programs prebuilt in build-gpu-deps/bin.
# 3. Runs the GPU tests: several ranks as processes sharing the GPU through CUDA IPC on
#    simulated nodes, every datatype and op against the host reference, stream ordering, and
#    the NCCL fallback with a one-rank communicator ($OUT/gpu_<scenario>.log).
# 4. Runs the device-buffer bandwidth bench with the D2D copy ceiling measured in the same run
#    ($OUT/bench_*.txt).
# Prints a summary (also $OUT/summary.txt); exits 0 when every test passed.
set -u
START=$(date +%s)
BUDGET=${DEVICE_CHECK_BUDGET_S:-450}  # leaves room under 8 minutes
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/build-devcheck-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/device_check.log") 2>&1
DEPS=$ROOT/build-gpu-deps
BUILD=$ROOT/build-devcheck
SHIM=$BUILD-shim
NPROC=$(nproc 2>/dev/null || echo 8)
# DEVICE_CHECK_USE_CARRIED=1 takes libfabric, fmt, nlohmann_json and pkg-config from
# build-gpu-deps even when the machine has them, DEVICE_CHECK_PREBUILT=1 runs the prebuilt
# programs without building (both rehearse the GPU machine's worst cases on the dev machine).
CARRIED=${DEVICE_CHECK_USE_CARRIED:-0}
RESULTS=()

PY=$(command -v python3)
# shellcheck source=build_env.sh
. "$ROOT/tests/gpu/build_env.sh"

# ---- 1. the machine ------------------------------------------------------------------------
say "environment -> $OUT/env.txt"
{
  echo "date: $(date -u)"
  echo "host: $(uname -a)"
  echo "glibc: $(ldd --version 2>&1 | head -1)"
  echo "cpus: $NPROC; memory: $(free -g 2>/dev/null | awk '/Mem:/ {print $2 " GiB"}')"
  nvidia-smi 2>&1 | head -20
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv 2>&1
  nvidia-smi topo -m 2>&1 | head -12
  for t in cmake ninja make g++ c++ clang++ nvcc pkg-config python3; do
    printf '%-10s %s\n' "$t" "$(command -v $t || echo -)"
  done
  echo "torch: $(pyexec 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version() if torch.cuda.is_available() else "")' || echo -)"
  echo "pip cmake: $(pyexec 'import cmake, os; print(cmake.CMAKE_BIN_DIR)' || echo -)"
  echo "pip ninja: $(pyexec 'import ninja; print(ninja.BIN_DIR)' || echo -)"
  echo "libfabric: $(pkg-config --modversion libfabric 2>/dev/null || echo 'no pkg-config entry') ($(ls /usr/lib/x86_64-linux-gnu/libfabric.so* /usr/lib64/libfabric.so* 2>/dev/null | head -1))"
  echo "fi_info: $(fi_info --version 2>/dev/null | head -1 || echo -)"
  echo "carried deps: $(ls "$DEPS" 2>/dev/null | tr '\n' ' ')"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

gpu_find_nccl

# ---- 2. build ------------------------------------------------------------------------------
gpu_find_tools
gpu_find_deps

BIN=""
if [ "${DEVICE_CHECK_PREBUILT:-0}" = 1 ]; then
  RESULTS+=("build: skipped (DEVICE_CHECK_PREBUILT=1)")
elif [ -n "$CMAKE" ] && [ -n "$CXX_BIN" ] && [ -n "$NVCC" ]; then
  say "configure -> $OUT/build.log"
  PATH=$SHIM/bin:$PATH timeout "$(step_timeout 120)" "$CMAKE" -S "$ROOT/tests/gpu" -B "$BUILD" "${CMAKE_ARGS[@]}" \
    > "$OUT/build.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    say "build (-j$NPROC)"
    PATH=$SHIM/bin:$PATH timeout "$(step_timeout 300)" "$CMAKE" --build "$BUILD" -j "$NPROC" \
      --target gpu_collectives gpu_bench >> "$OUT/build.log" 2>&1
    rc=$?
  fi
  if [ $rc -eq 0 ]; then
    BIN=$BUILD
    RESULTS+=("build: built here ($(( $(date +%s) - START ))s)")
  else
    say "build failed (rc $rc); last lines:"
    tail -25 "$OUT/build.log"
    RESULTS+=("build: FAILED here (rc $rc), see build.log")
  fi
else
  RESULTS+=("build: no toolchain here (cmake/c++/nvcc)")
fi
if [ -z "$BIN" ] && [ -x "$DEPS/bin/gpu_collectives" ]; then
  BIN=$DEPS/bin
  EXTRA_LD=$DEPS/lib:$DEPS/libfabric/lib
  say "using the programs prebuilt on the dev machine (commit $(cat "$DEPS/bin/COMMIT" 2>/dev/null))"
  RESULTS+=("build: using prebuilt programs from build-gpu-deps/bin")
fi
if [ -z "$BIN" ]; then
  say "nothing to run"
  printf '%s\n' "${RESULTS[@]}" | tee "$OUT/summary.txt"
  exit 1
fi
[ -n "$EXTRA_LD" ] && export LD_LIBRARY_PATH=$EXTRA_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# ---- 3. GPU tests --------------------------------------------------------------------------
FAILED=0
MULTI_OK=1
run_scenario() {  # name, timeout
  local sc=$1 rc
  if [ "$(left)" -lt 60 ]; then
    RESULTS+=("$sc: NOT RUN (time budget)")
    return 1
  fi
  say "gpu test $sc"
  timeout "$(step_timeout "$2")" "$BIN/gpu_collectives" "$sc" > "$OUT/gpu_$sc.log" 2>&1
  rc=$?
  grep -E '^\[ (RUN|FAIL| OK )|^  |skipped' "$OUT/gpu_$sc.log" | head -12
  case $rc in
    0) RESULTS+=("$sc: PASS") ;;
    77) RESULTS+=("$sc: SKIPPED (no CUDA device)") ;;
    124) RESULTS+=("$sc: TIMEOUT"); FAILED=1; tail -5 "$OUT/gpu_$sc.log" ;;
    *) RESULTS+=("$sc: FAIL (rc $rc)"); FAILED=1; grep -v '^hicoll .*INFO' "$OUT/gpu_$sc.log" | tail -12 ;;
  esac
  return $rc
}
run_scenario one_rank_hier 90
# Several processes on the GPU: if the small case fails, the big ones would only burn the
# budget (the one-rank NCCL scenarios still run).
run_scenario smoke_one_node_x2 60
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 77 ] && MULTI_OK=0
run_scenario one_rank_nccl_fallback 90
run_scenario one_rank_scratch_fallback 90
if [ $MULTI_OK = 1 ]; then
  for sc in nodes_2x1 one_node_x4 nodes_2x2 nodes_2x2_interleaved nodes_3x1; do run_scenario $sc 100; done
else
  RESULTS+=("multi-rank scenarios and bench: NOT RUN (smoke_one_node_x2 failed)")
fi

# ---- 4. bandwidth vs the D2D copy ceiling --------------------------------------------------
if [ $MULTI_OK = 1 ] && [ "$(left)" -gt 60 ]; then
  say "bench: 4 ranks on one node, device buffers"
  timeout "$(step_timeout 120)" "$BIN/gpu_bench" -np 4 -nodes 1 -b 1M -e 256M -f 4 -n 20 -w 5 \
    > "$OUT/bench_4ranks_1node.txt" 2>&1
  rc=$?
  cat "$OUT/bench_4ranks_1node.txt"
  RESULTS+=("bench 4 ranks x 1 node: rc $rc")
fi
if [ $MULTI_OK = 1 ] && [ "$(left)" -gt 45 ]; then
  say "bench: 2 simulated nodes (inter-node staged through pinned host memory over loopback TCP)"
  timeout "$(step_timeout 90)" "$BIN/gpu_bench" -np 2 -nodes 2 -b 1M -e 16M -f 4 -n 5 -w 2 -c ag,rs \
    > "$OUT/bench_2nodes.txt" 2>&1
  rc=$?
  cat "$OUT/bench_2nodes.txt"
  RESULTS+=("bench 2 nodes x 1: rc $rc")
fi
grep -h "inter-node data\|FI_HMEM\|fallback: " "$OUT"/gpu_*.log 2>/dev/null | sort | uniq -c | sort -rn | head -8 \
  > "$OUT/paths.txt"

say "summary -> $OUT/summary.txt"
{
  printf '%s\n' "${RESULTS[@]}"
  echo "paths logged (count, line):"
  cat "$OUT/paths.txt"
  grep -h "^# D2D\|^# .* copied by\|^# paths" "$OUT"/bench_*.txt 2>/dev/null
  echo "total: $(( $(date +%s) - START )) s"
} | tee "$OUT/summary.txt"
exit $FAILED
