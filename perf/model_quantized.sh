#!/usr/bin/env bash
# Validation of the cost model's quantized paths (perf/README.md, "The cost model"): calibrate
# on 2x2 emulated nodes (agbench calibrate, which measures quant_Bps too), then
# hcAllGatherQuantized and hcReduceScatterQuantized (fp32 and bf16, block 256) beside the exact
# call at every layout and size, one run each, every variant printing its predicted time
# beside the measured one; and one node (1x2, no emulation) with HICOLL_QUANT_MIN_NODES=1 so
# that it quantizes. `perf/model_report.py --quantized OUT` makes the table and checks the
# choice HICOLL_QUANT_MIN_NODES=0 would make against the faster variant measured.
#
#   perf/model_quantized.sh [-a agbench] [-o OUT] [-r 1gbit] [-l "2x1 2x2 4x1"] [-s "1M 64M"]
#                           [-c "allgather reducescatter"] [-k (keep OUT's calibration)]
set -euo pipefail
cd "$(dirname "$0")/.."  # relative paths: the results record their command line
agbench=build/perf/agbench
out=perf/results/model_quantized
rate=1gbit
layouts="2x1 2x2 4x1"
sizes="1M 64M"
colls="allgather reducescatter"
keep=0
while getopts "a:o:r:l:s:c:kh" o; do
  case $o in
    a) agbench=$OPTARG ;; o) out=$OPTARG ;; r) rate=$OPTARG ;; l) layouts=$OPTARG ;; s) sizes=$OPTARG ;;
    c) colls=$OPTARG ;; k) keep=1 ;;
    *) sed -n 2,11p "$0"; exit 2 ;;
  esac
done
read -r lo hi <<<"$sizes"
mkdir -p "$out"
quiet() { grep -v '^# netns_emulate: link\|^# netns_emulate: tcp\|^#  Rank'; }
echo "# model_quantized: $(date -u +%FT%TZ) rate $rate layouts [$layouts] sizes $lo..$hi x4, load $(cut -d' ' -f1-3 /proc/loadavg)"
cal="$out/calibrate_$rate.json"
[[ $keep == 1 && -f $cal ]] || perf/netns_emulate.sh -N 2 -L 2 -r "$rate" -t 300 -a "$agbench" -- calibrate -J "$cal" | quiet
run=(-b "$lo" -e "$hi" -f 4 -n 2 --iters-bytes 16M -w 1 -c 1 --reps 3 --quant 256 -v)
for lay in $layouts; do
  N=${lay%x*} L=${lay#*x}
  for coll in $colls; do
    for dt in float bfloat16; do
      f="$out/${coll}_${dt}_${lay}_$rate"
      extra=()
      [ "$coll" = reducescatter ] && extra=(-o sum)
      HICOLL_MODEL_FILE="$cal" perf/netns_emulate.sh -N "$N" -L "$L" -r "$rate" -t 600 -a "$agbench" -- "$coll" \
        "${run[@]}" "${extra[@]}" -d "$dt" -J "$f.json" | quiet >"$f.txt" || { echo "failed: $f" >&2; exit 1; }
      echo "# done $coll $dt $lay ($(date -u +%T), load $(cut -d' ' -f1 /proc/loadavg))"
    done
  done
done
# One node: memory bounds it. The hicoll-int8 variant quantizes only because of the variable.
[[ " $colls " == *" allgather "* ]] || exit 0
for dt in float bfloat16; do
  f="$out/allgather_${dt}_1x2_none"
  HICOLL_QUANT_MIN_NODES=1 HICOLL_MODEL_FILE="$cal" "$agbench" allgather --np 2 "${run[@]}" -d "$dt" -J "$f.json" \
    | quiet >"$f.txt"
  echo "# done allgather $dt 1x2 ($(date -u +%T))"
done
