#!/usr/bin/env bash
# The speed targets of the performance work in one command: every comparison runs with its
# variants interleaved in the same processes (agbench --reps, the median), writes its
# agbench JSON and table to OUT, and perf/targets_report.py prints each figure beside its goal.
# Needs root for the emulated nodes (perf/netns_emulate.sh). About 15 minutes on 2 cores;
# --long adds the cost model's held-out check and the FSDP2 steps (about an hour more).
#
#   perf/targets.sh [-o OUT] [-r REPS] [-l LAUNCHES] [--long] [ROW...]
#
# -l: the small rows run LAUNCHES times each (new processes, the collectives in turn) and the
# report compares the medians across launches: a launch's small-call times can sit up to 2x
# apart from the next one's, for hicoll and Open MPI alike but not together (the shared pages
# each lands on), so one launch's ratio says little below a few microseconds.
#
# Rows: small_1x2 small_1x4 (AllGather, AllReduce, Broadcast, ReduceScatter 8 B - 64 KiB
# against Open MPI), quantized_2x2 (int8 AllGather fp32 / bf16 / fp16 and ReduceScatter fp32 against
# the exact call, 64 MiB at 1 Gbit/s), node_memory_1x2 (64 MiB AllGather in node memory
# against a 1-core memcpy and Open MPI), scratch_2x2 (128 MiB AllGather at 1 Gbit/s: pieces
# through the scratch buffer against SMDDP's strict rule, the ring), model_4x1 (the
# uncalibrated model's prediction of a 64 MiB AllGather at 1 Gbit/s against the measurement);
# with --long: model_heldout (perf/model_validate.sh), fsdp2_2x2 (perf/torch/fsdp2_emulated.sh).
set -euo pipefail
cd "$(dirname "$0")/.."  # relative paths: the results record their command lines
out=perf/results/targets-$(date -u +%F)
reps=5
launches=1
long=0
rows=()
while (($#)); do
  case $1 in
    -o) out=$2; shift 2 ;;
    -r) reps=$2; shift 2 ;;
    -l) launches=$2; shift 2 ;;
    --long) long=1; shift ;;
    -h | --help) sed -n 2,21p "$0"; exit 0 ;;
    *) rows+=("$1"); shift ;;
  esac
done
((${#rows[@]})) || rows=(small_1x2 small_1x4 quantized_2x2 node_memory_1x2 scratch_2x2 model_4x1)
((long)) && rows+=(model_heldout fsdp2_2x2)
B=build/perf/agbench
NS="perf/netns_emulate.sh -a $B"
mkdir -p "$out"
unset HICOLL_MODEL_FILE  # the model as a user without a calibration file has it

run() {  # name, command... (agbench arguments last; -J appended)
  local name=$1
  shift
  echo "== $name ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  { printf '$'; printf ' %s' "$@" -J "$out/$name.json"; echo; } >"$out/$name.txt"
  "$@" -J "$out/$name.json" 2>&1 | grep -v '^#  Rank' >>"$out/$name.txt" || echo "# exit status $?" >>"$out/$name.txt"
}

small() {  # ranks; launch k > 1 writes NAME.lK.json
  local k sfx
  for ((k = 1; k <= launches; k++)); do
    sfx=
    ((k == 1)) || sfx=.l$k
    # What a cache line costs between two cores now: the small calls' times follow it.
    echo "small_1x$1$sfx: $(build/perf/linelat 100000 3)" >>"$out/linelat.txt"
    for coll in allgather allreduce broadcast reducescatter; do
      run "small_1x$1_$coll$sfx" "$B" "$coll" --np "$1" -b 8 -e 64K -f 2 -n 4000 -w 400 --reps "$reps" --baseline mpi
    done
  done
}

for row in "${rows[@]}"; do
  case $row in
    small_1x2) small 2 ;;
    small_1x4) small 4 ;;
    quantized_2x2)
      for dt in float bfloat16 half; do
        run "quantized_2x2_allgather_$dt" $NS -N 2 -L 2 -- allgather -b 64M -e 64M -d "$dt" --quant 256 -n 5 -w 2 --reps "$reps"
      done
      run quantized_2x2_reducescatter_float $NS -N 2 -L 2 -- reducescatter -b 64M -e 64M --quant 256 -n 5 -w 2 --reps "$reps"
      ;;
    node_memory_1x2)
      run node_memory_1x2 "$B" allgather --np 2 -b 64M -e 64M --mem node -n 10 -w 3 --reps "$reps" --baseline mpi,memcpy
      ;;
    scratch_2x2)
      run scratch_2x2_pieces $NS -N 2 -L 2 -- allgather -b 128M -e 128M -n 3 -w 1 --reps 3 -v
      run scratch_2x2_strict env HICOLL_SCRATCH_STRICT=1 $NS -N 2 -L 2 -- allgather -b 128M -e 128M -n 3 -w 1 --reps 3 -v
      ;;
    model_4x1) run model_4x1 $NS -N 4 -L 1 -- allgather -b 64M -e 64M -n 3 -w 1 --reps 3 -v ;;
    model_heldout) perf/model_validate.sh 2>&1 | tee "$out/model_heldout.txt" ;;
    fsdp2_2x2) perf/torch/fsdp2_emulated.sh 2>&1 | tee "$out/fsdp2_2x2.txt" ;;
    *) echo "targets.sh: unknown row '$row' (see --help)" >&2; exit 2 ;;
  esac
done
"${PYTHON:-python3}" perf/targets_report.py "$out"
