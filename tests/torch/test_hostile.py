"""The hostile-environment tier, torch part (issue 27): FSDP2 with --pg-alloc and
QuantizedAllGather in containers (hostile.py). Every case: correct results on every rank (against
a single-process run and computed values), or a clean error naming the cause on every rank,
within the timeout; no rank dies of a signal; nothing of hicoll's left in the /dev/shm the job
saw (nor in a rank's own one). Needs root and mount namespaces; skipped, saying why, without."""
import json
import os
import re
import subprocess
import sys

import pytest

import hostile

HERE = os.path.dirname(os.path.abspath(__file__))


def _outcome(r: dict) -> str:
    s = r["status"]
    if s == 124:
        return "TIMED OUT"
    if s >= 128:
        return f"KILLED BY SIGNAL {s - 128}"
    res = r["result"] or {}
    return res.get("outcome", f"exit {s} without a RESULT")


@pytest.mark.parametrize("env", list(hostile.ENVS))
def test_fsdp2_pg_alloc_and_quantized(env):
    if os.geteuid() != 0:
        pytest.skip("the hostile tier needs root (unshare, mount)")
    p = subprocess.run([sys.executable, os.path.join(HERE, "hostile.py"), "container", env],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=hostile.JOB_TIMEOUT_S + 60)
    lines = [l for l in p.stdout.splitlines() if l.startswith("HOSTILE_SUMMARY ")]
    assert lines, f"the container printed no summary (rc {p.returncode}):\n{p.stdout[-4000:]}"
    d = json.loads(lines[-1][len("HOSTILE_SUMMARY "):])
    if "not_permitted" in d:
        pytest.skip(f"namespaces or mounts not permitted here: {d['not_permitted']}")
    assert "setup_error" not in d, d["setup_error"]

    cause = re.compile(hostile.ENVS[env][4], re.I)
    report = [f"{env} ({d['seconds']} s):"]
    for rank, r in enumerate(d["ranks"]):
        res = r["result"] or {}
        report.append(f"  rank {rank}: {_outcome(r)}" + (f" at {res['stage']}: {res['error'][:600]}"
                                                       if res.get("error") else ""))
        if r["own_shm_left"]:
            report.append(f"    left in its own /dev/shm: {r['own_shm_left']}")
    nothing = "(nothing of hicoll's)"
    report.append(f"  job's /dev/shm afterwards: {d['shm_left'] or nothing}")
    report = "\n".join(report)
    print(report)
    tails = "\n".join(f"----- rank {i} (status {r['status']}) -----\n{r['tail']}" for i, r in enumerate(d["ranks"]))

    problems = []
    outcomes = [_outcome(r) for r in d["ranks"]]
    for rank, r in enumerate(d["ranks"]):
        res = r["result"] or {}
        if r["status"] >= 128 and r["status"] != 124:
            problems.append(f"rank {rank} died of signal {r['status'] - 128}")
        if r["status"] == 124:
            problems.append(f"rank {rank} did not finish within {hostile.JOB_TIMEOUT_S} s")
        if res.get("outcome") == "wrong":
            problems.append(f"rank {rank}: wrong results at {res['stage']}")
        if res.get("outcome") == "error" and not cause.search(res.get("error", "")):
            problems.append(f"rank {rank}'s error does not name the cause ({hostile.ENVS[env][4]})")
        if r["own_shm_left"]:
            problems.append(f"rank {rank} left {len(r['own_shm_left'])} names in its own /dev/shm")
    if not (all(o == "correct" for o in outcomes) or all(o == "error" for o in outcomes)):
        problems.append(f"want correct results on every rank or a clean error on every rank: {outcomes}")
    if d["shm_left"]:
        problems.append(f"{len(d['shm_left'])} hicoll names left in the job's /dev/shm")
    assert not problems, "\n".join(problems) + "\n" + report + "\n" + tails
