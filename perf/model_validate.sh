#!/usr/bin/env bash
# Validation of the cost model on emulated nodes (perf/README.md, "The cost model"): for each
# link rate, calibrate on 2x2 (agbench calibrate), then measure AllGather, ReduceScatter and
# AllReduce at every layout and size with three variants in one run each: the model's choice
# (HICOLL_ALGO=auto, the main column), the fixed rules (--baseline hier) and the flat ring
# (--baseline ring), every hicoll variant printing its predicted time beside the measured one.
# perf/model_report.py turns the JSON files into the table and the plot.
#
#   perf/model_validate.sh [-a agbench] [-o outdir] [-r "500mbit 1gbit 2gbit"]
#                          [-l "2x1 3x1 4x1 2x2 3x2"] [-s "64K 32M"] [-u]
#
# -u: uncalibrated, as a user without a model file runs: no calibration, no HICOLL_MODEL_FILE
# (the built-in figures, the link measured at each communicator's first call).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
agbench="$here/../build/perf/agbench"
out="$here/results/model"
rates="500mbit 1gbit 2gbit"
layouts="2x1 3x1 4x1 2x2 3x2"
sizes="64K 32M"
uncalibrated=0
while getopts "a:o:r:l:s:uh" o; do
  case $o in
    a) agbench=$OPTARG ;; o) out=$OPTARG ;; r) rates=$OPTARG ;; l) layouts=$OPTARG ;; s) sizes=$OPTARG ;;
    u) uncalibrated=1 ;;
    h) sed -n '2,14p' "$0"; exit 0 ;;
    *) exit 2 ;;
  esac
done
read -r lo hi <<<"$sizes"
mkdir -p "$out"
emu() { "$here/netns_emulate.sh" -a "$agbench" "$@"; }
echo "# model_validate: $(date -u +%FT%TZ) rates [$rates] layouts [$layouts] sizes $lo..$hi x8, load $(cut -d' ' -f1-3 /proc/loadavg)"
for rate in $rates; do
  cal="$out/calibrate_$rate.json"
  if ((uncalibrated)); then
    cal=""
  else
    emu -N 2 -L 2 -r "$rate" -t 300 -- calibrate -J "$cal" | grep -v '^# netns_emulate: link\|^# netns_emulate: tcp' || exit 1
  fi
  for lay in $layouts; do
    N=${lay%x*} L=${lay#*x}
    for coll in allgather reducescatter allreduce; do
      f="$out/${coll}_${lay}_$rate"
      HICOLL_MODEL_FILE="$cal" emu -N "$N" -L "$L" -r "$rate" -t 600 -- "$coll" -b "$lo" -e "$hi" -f 8 \
        -n 2 --iters-bytes 16M -w 1 -c 1 --reps 3 --baseline hier,ring -v -J "$f.json" \
        | grep -v '^# netns_emulate: link\|^# netns_emulate: tcp' >"$f.txt" || { echo "failed: $f" >&2; exit 1; }
      echo "# done $coll $lay $rate ($(date -u +%T), load $(cut -d' ' -f1 /proc/loadavg))"
    done
  done
done
