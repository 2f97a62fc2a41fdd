#!/usr/bin/env python3
"""torch's own DistributedTest._DistTestBase, the whole class, with BACKEND=gloo and with
BACKEND=hicoll on the same torch (tests/torch/test_peer.py with HICOLL_PEER_ALL=1): a table of
every test's outcome on each, and the tests that pass on gloo but not on hicoll. Not a test (it
takes long: each of ~285 tests spawns its ranks); CI runs test_peer.SELECTED.

    .venv/bin/python perf/torch/peer_compare.py [-k EXPR] [--markdown OUT.md] [--timeout S]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))


def run(backend: str, expr: str, timeout: int) -> dict:
    """pytest's outcome per test name: passed, failed, skipped (with the reason) or error."""
    with tempfile.TemporaryDirectory() as d:
        xml = os.path.join(d, "junit.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
               os.path.join(REPO, "tests", "torch", "test_peer.py")] + (["-k", expr] if expr else [])
        env = dict(os.environ, BACKEND=backend, HICOLL_PEER_ALL="1")
        subprocess.run(cmd, env=env, cwd=REPO, timeout=timeout, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        out = {}
        for case in ET.parse(xml).getroot().iter("testcase"):
            outcome = "passed"
            for child in case:
                if child.tag in ("failure", "error"):
                    outcome = "failed"
                elif child.tag == "skipped":
                    outcome = "skipped: " + (child.get("message") or "")[:80]
            out[case.get("name")] = outcome
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", default="", help="pytest -k expression (a slice of the class)")
    ap.add_argument("--markdown", help="write the table here too")
    ap.add_argument("--timeout", type=int, default=7200, help="seconds per backend")
    args = ap.parse_args()
    res = {b: run(b, args.k, args.timeout) for b in ("gloo", "hicoll")}
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
