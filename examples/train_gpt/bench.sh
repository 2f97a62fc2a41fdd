#!/usr/bin/env bash
# Tokens/s and communication share of train_gpt at sharded_data_parallel_degree 1, 2, 4
# (world 4 over 2 simulated nodes), each run REPEATS times; prints a markdown table.
#   examples/train_gpt/bench.sh BUILD_DIR [extra train_gpt flags...]
# Env: STEPS (default 40), REPEATS (default 3), DEGREES (default "1 2 4"), NP, NODES.
set -euo pipefail
build=${1:?usage: bench.sh BUILD_DIR [train_gpt flags...]}
shift
bin=$build/examples/train_gpt/train_gpt
[[ -x $bin ]] || { echo "bench.sh: $bin not built" >&2; exit 1; }
steps=${STEPS:-40} repeats=${REPEATS:-3} np=${NP:-4} nodes=${NODES:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for d in ${DEGREES:-1 2 4}; do
  for r in $(seq 1 "$repeats"); do
    "$bin" --np "$np" --nodes "$nodes" --sdp-degree "$d" --steps "$steps" --seed 7 "$@" \
      > "$out/d$d.r$r.jsonl"
  done
done
python3 - "$out" "$np" "$nodes" "$@" <<'PY'
import glob, json, os, statistics, sys
out, np_, nodes = sys.argv[1], sys.argv[2], sys.argv[3]
print(f"world {np_} on {nodes} nodes, flags: {' '.join(sys.argv[4:]) or '(defaults)'}")
print("| degree | tokens/s (median of runs) | comm share | exposed comm (wait) share | state bytes/rank | peak gathered elements |")
print("|---|---|---|---|---|---|")
runs = {}
for f in sorted(glob.glob(os.path.join(out, "d*.jsonl"))):
    d = int(os.path.basename(f)[1:].split(".")[0])
    for line in open(f):
        j = json.loads(line)
        if "summary" in j:
            runs.setdefault(d, []).append(j["summary"])
for d in sorted(runs):
    s = runs[d]
    med = lambda k: statistics.median(x[k] for x in s)
    r0 = s[0]["ranks"][0]
    print(f"| {d} | {med('tokens_per_s'):.0f} | {med('comm_share'):.2f} | {med('comm_wait_share'):.2f} "
          f"| {r0['state_bytes_peak']:.0f} | {r0['live_params_peak']:.0f} |")
PY
