#!/usr/bin/env bash
# The term the cost model lacks on emulated nodes (perf/README.md, "The cost model"): the
# scheduler's. A 4 KiB AllGather on loopback (no link limit, nothing to wait for but the other
# ranks) at every validation layout, on both cores and with every rank pinned to one core
# (taskset), on the hierarchical path and the ring, each beside the model's prediction. At one
# layout only the ranks per core change between the two runs; what grows with them is the time
# a dependent step waits for a descheduled rank, which a node with a core per rank never sees.
#
#   perf/model_sched.sh [-a agbench] [-o outdir] [-l "2x1 3x1 4x1 2x2 3x2 8x1"]  (paths from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."  # paths relative to the repository root: the results carry no machine's paths
agbench=build/perf/agbench
out=perf/results/model/sched
layouts="2x1 3x1 4x1 2x2 3x2 8x1"
while getopts "a:o:l:h" o; do
  case $o in
    a) agbench=$OPTARG ;; o) out=$OPTARG ;; l) layouts=$OPTARG ;;
    h) sed -n '2,9p' "$0"; exit 0 ;;
    *) exit 2 ;;
  esac
done
mkdir -p "$out"
echo "# model_sched: $(date -u +%FT%TZ) layouts [$layouts], load $(cut -d' ' -f1-3 /proc/loadavg)"
# The figures of this host as launched for the validation's calibration (2 x 2 on loopback).
"$agbench" calibrate --np 4 --nodes 2 -T 120 -J "$out/calibrate_loopback.json" >/dev/null
for lay in $layouts; do
  N=${lay%x*} L=${lay#*x}
  for cpus in 0-1 0; do
    f="$out/allgather_${lay}_cpus$cpus"
    HICOLL_MODEL_FILE="$out/calibrate_loopback.json" taskset -c "$cpus" "$agbench" allgather --np $((N * L)) \
      --nodes "$N" -b 4K -e 4K -d uint8 -n 200 -w 20 -c 1 --reps 5 --baseline hier,ring -v -T 300 \
      -J "$f.json" >"$f.txt"
  done
done
python3 - "$out" $layouts <<'EOF'
import json, sys
out, layouts = sys.argv[1], sys.argv[2:]
print("| layout | cores | ranks per core | hier measured (us) | hier predicted | ring measured | ring predicted |")
print("|---|---|---|---|---|---|---|")
for lay in layouts:
    N, L = map(int, lay.split("x"))
    for cpus, cores in (("0-1", 2), ("0", 1)):
        v = json.load(open(f"{out}/allgather_{lay}_cpus{cpus}.json"))["rows"][0]["variants"]
        h, r = v["hier"]["oop"], v["ring"]["oop"]
        print(f"| {lay} | {cores} | {N * L / cores:g} | {h['time_us']:.0f} | {h['predicted_us']:.0f} | "
              f"{r['time_us']:.0f} | {r['predicted_us']:.0f} |")
EOF
