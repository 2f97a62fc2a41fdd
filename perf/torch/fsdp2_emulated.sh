#!/usr/bin/env bash
# examples/fsdp2_train.py on emulated nodes (perf/netns_emulate.sh, one namespace per node,
# rate-limited links; perf/torch/node_launch.sh starts each node's ranks): gloo, hicoll exact,
# and hicoll with int8 parameter all-gathers (hicoll.torch.QuantizedAllGather through FSDP2's
# set_custom_all_gather), run interleaved REPEATS times with the same data; prints the median
# steady-state step, the final loss and the bytes node 0 sent over its link per step.
# Needs root (ip netns, tc).
#   perf/torch/fsdp2_emulated.sh [-r 1gbit] [-N 2] [-L 2] [-- more fsdp2_train.py flags]
# Env: STEPS (default 30), REPEATS (default 3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
rate=1gbit nodes=2 per=2
while getopts "r:N:L:h" o; do
  case $o in
    r) rate=$OPTARG ;; N) nodes=$OPTARG ;; L) per=$OPTARG ;;
    *) sed -n 2,9p "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[[ ${1:-} == -- ]] && shift
steps=${STEPS:-30} repeats=${REPEATS:-3}
declare -A flags=([gloo]="--backend gloo" [hicoll]="" [hicoll_int8_allgather]="--quantized-allgather")
order=(gloo hicoll hicoll_int8_allgather)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "# fsdp2_emulated: $(date -u +%FT%TZ) ${nodes}x${per} at $rate, $steps steps, $repeats runs each, load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$repeats"); do
  for v in "${order[@]}"; do
    # shellcheck disable=SC2086
    "$repo/perf/netns_emulate.sh" -N "$nodes" -L "$per" -r "$rate" -a "$here/node_launch.sh" -t 900 -- \
      "$repo/examples/fsdp2_train.py" --steps "$steps" ${flags[$v]} "$@" >"$work/$v.$r.txt" 2>&1 ||
      { echo "fsdp2_emulated: $v run $r failed:" >&2; tail -20 "$work/$v.$r.txt" >&2; exit 1; }
    grep -h "ms/step" "$work/$v.$r.txt" | sed "s/^/# $v run $r: /"
  done
done
python3 - "$work" "$steps" "${order[@]}" <<'PY'
import glob, re, statistics, sys
work, steps, order = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = {}
for v in order:
    ms, loss, sent = [], [], []
    for f in sorted(glob.glob(f"{work}/{v}.*.txt")):
        t = open(f).read()
        m = re.search(r"loss [\d.]+ -> ([\d.]+), ([\d.]+) ms/step", t)
        ms.append(float(m.group(2))); loss.append(float(m.group(1)))
        b = re.search(r"link node0->bridge\s+sent (\d+) bytes", t)
        sent.append(int(b.group(1)) / steps if b else 0)
    rows[v] = (statistics.median(ms), loss[-1], statistics.median(sent), ms)
base = rows["hicoll"][0]
print(f"{'variant':24} {'ms/step':>8} {'vs hicoll':>9} {'final loss':>10} {'MB/step node0':>13}  runs")
for v in order:
    m, l, s, all_ms = rows[v]
    print(f"{v:24} {m:8.1f} {base / m:8.2f}x {l:10.4f} {s / 1e6:13.2f}  " + " ".join(f"{x:.1f}" for x in all_ms))
PY
