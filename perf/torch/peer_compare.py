#!/usr/bin/env python3
"""torch's own DistributedTest._DistTestBase, the whole class, with BACKEND=gloo and with
BACKEND=hicoll on the same torch (tests/torch/test_peer.py with HICOLL_PEER_ALL=1): a table of
every test's outcome on each, and the tests that pass on gloo but not on hicoll. Not a test (it
takes long: each of ~285 tests spawns its ranks); CI runs test_peer.SELECTED.

    .venv/bin/python perf/torch/peer_compare.py [-k EXPR] [--chunk I/N] [--save DIR]
                                                [--markdown OUT.md] [--timeout S]

Each test's outcome is recorded as it ends, so a run cut by --timeout keeps the tests it
finished. --chunk I/N runs the I-th (1-based) of N contiguous slices of the collected tests;
with --save DIR each backend's outcomes are merged into DIR/<backend>.json, and the table is
made from everything saved there (run the slices one by one, the last call prints the whole
table). torch's per-test limit is DISTRIBUTED_TESTS_DEFAULT_TIMEOUT (300 s) in the environment.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
TEST_FILE = os.path.join(REPO, "tests", "torch", "test_peer.py")

# Loaded into pytest with -p: appends one JSON line per test phase as it ends.
PLUGIN = '''
import json, os
def pytest_runtest_logreport(report):
    msg = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        msg = str(report.longrepr[2])
        if msg.startswith("Skipped: "):
            msg = msg[len("Skipped: "):]
    with open(os.environ["PEER_COMPARE_LOG"], "a") as f:
        f.write(json.dumps({"name": report.nodeid.split("::")[-1], "when": report.when,
                            "outcome": report.outcome, "msg": msg, "s": report.duration}) + "\\n")
'''


def collect(expr: str) -> list:
    env = dict(os.environ, HICOLL_PEER_ALL="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", TEST_FILE]
    cmd += ["-k", expr] if expr else []
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines() if "::" in line]


def run(backend: str, expr: str, ids: list, timeout: int) -> dict:
    """pytest's outcome per test name: passed, failed, skipped (with the reason) or error."""
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "_peer_compare_log.py"), "w") as f:
            f.write(PLUGIN)
        log = os.path.join(d, "log.jsonl")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "_peer_compare_log"]
        cmd += [os.path.join(REPO, i) for i in ids] if ids else [TEST_FILE]
        cmd += ["-k", expr] if expr and not ids else []
        pypath = os.pathsep.join([d] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
        env = dict(os.environ, BACKEND=backend, HICOLL_PEER_ALL="1", PEER_COMPARE_LOG=log,
                   PYTHONPATH=pypath)
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"{backend}: cut after {timeout} s", file=sys.stderr)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        out = {}
        rank = {"passed": 0, "skipped": 1, "failed": 2}
        if os.path.exists(log):
            for line in open(log):
                r = json.loads(line)
                outcome = "skipped: " + r["msg"][:80] if r["outcome"] == "skipped" else r["outcome"]
                prev = out.get(r["name"])
                if prev is None or rank[outcome.split(":")[0]] > rank[prev.split(":")[0]]:
                    out[r["name"]] = outcome
        print(f"{backend}: {len(out)} tests in {time.monotonic() - t0:.0f} s", file=sys.stderr)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", default="", help="pytest -k expression (a slice of the class)")
    ap.add_argument("--chunk", help="I/N: run only the I-th of N contiguous slices of the tests")
    ap.add_argument("--save", help="merge each backend's outcomes into DIR/<backend>.json; table of all saved")
    ap.add_argument("--markdown", help="write the table here too")
    ap.add_argument("--timeout", type=int, default=7200, help="seconds per backend")
    args = ap.parse_args()
    ids = []
    if args.chunk:
        i, n = (int(x) for x in args.chunk.split("/"))
        every = collect(args.k)
        ids = every[(i - 1) * len(every) // n: i * len(every) // n]
    res = {}
    for b in ("gloo", "hicoll"):
        res[b] = run(b, args.k, ids, args.timeout)
        if args.save:
            os.makedirs(args.save, exist_ok=True)
            path = os.path.join(args.save, f"{b}.json")
            saved = json.load(open(path)) if os.path.exists(path) else {}
            saved.update(res[b])
            with open(path, "w") as f:
                json.dump(saved, f, indent=0, sort_keys=True)
            res[b] = saved
    names = sorted(set(res["gloo"]) | set(res["hicoll"]))
    rows = [(n, res["gloo"].get(n, "-"), res["hicoll"].get(n, "-")) for n in names]
    lost = [r for r in rows if r[1] == "passed" and r[2] != "passed"]
    count = {b: sum(1 for n in names if res[b].get(n) == "passed") for b in res}
    lines = [f"{len(names)} tests: passed on gloo {count['gloo']}, on hicoll {count['hicoll']}; "
             f"passed on gloo but not on hicoll: {len(lost)}", "",
             "| test | gloo | hicoll |", "|---|---|---|"]
    lines += [f"| {n} | {g} | {h} |" for n, g, h in (lost + [r for r in rows if r not in lost])]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
