#!/usr/bin/env bash
# train_gpt on emulated nodes (perf/netns_emulate.sh: one namespace per node, rate-limited
# links): exact, int8 parameter gathers, and int8 gathers + int8 gradient ReduceScatters, run
# interleaved REPEATS times each with the same seed; prints tokens/s (median of the runs' summary
# lines), exposed communication share and final loss per variant. Needs root (ip netns, tc).
#   perf/train_gpt_emulated.sh [-b build] [-o outdir] [-r 1gbit] [-N 2] [-L 2] [-- train_gpt flags]
# Env: STEPS (default 300), REPEATS (default 2), DEGREE (default 4).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build="$here/../build" out="" rate=1gbit nodes=2 per=2
while getopts "b:o:r:N:L:h" o; do
  case $o in
    b) build=$OPTARG ;; o) out=$OPTARG ;; r) rate=$OPTARG ;; N) nodes=$OPTARG ;; L) per=$OPTARG ;;
    h) sed -n '2,7p' "$0"; exit 0 ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[[ ${1:-} == -- ]] && shift
bin=$(readlink -f "$build/examples/train_gpt/train_gpt")
[[ -x $bin ]] || { echo "train_gpt_emulated: $bin not built" >&2; exit 1; }
steps=${STEPS:-300} repeats=${REPEATS:-2} degree=${DEGREE:-4}
keep=1
[[ -n $out ]] || { out=$(mktemp -d); keep=0; }
mkdir -p "$out"
declare -A flags=([exact]="" [int8_allgather]="--sdp-quantized-allgather"
                  [int8_both]="--sdp-quantized-allgather --sdp-quantized-reducescatter")
echo "# train_gpt_emulated: $(date -u +%FT%TZ) ${nodes}x${per} at $rate, degree $degree, $steps steps, $repeats runs each, load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$repeats"); do
  for v in exact int8_allgather int8_both; do
    # shellcheck disable=SC2086
    "$here/netns_emulate.sh" -N "$nodes" -L "$per" -r "$rate" -a "$bin" -t 900 -- \
      --sdp-degree "$degree" --steps "$steps" --seed 7 ${flags[$v]} "$@" 2>/dev/null \
      | grep '^{' >"$out/$v.r$r.jsonl"
  done
done
python3 - "$out" <<'PY'
import glob, json, os, statistics, sys
out = sys.argv[1]
runs = {}
for f in sorted(glob.glob(os.path.join(out, "*.r*.jsonl"))):
    v = os.path.basename(f).split(".r")[0]
    for line in open(f):
        j = json.loads(line)
        if "summary" in j:
            runs.setdefault(v, []).append(j["summary"])
print("| variant | tokens/s (median) | runs | exposed comm share | final loss |")
print("|---|---|---|---|---|")
base = None
for v in ("exact", "int8_allgather", "int8_both"):
    s = runs.get(v)
    if not s:
        print(f"| {v} | (no run finished) | 0 | - | - |")
        continue
    tps = statistics.median(x["tokens_per_s"] for x in s)
    base = base or tps
    print(f"| {v} | {tps:.0f} ({tps / base:.2f}x) | {len(s)} | "
          f"{statistics.median(x['comm_wait_share'] for x in s):.2f} | {s[0]['final_loss']:.5f} |")
PY
(( keep )) || rm -rf "$out"
