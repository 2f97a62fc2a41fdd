#!/usr/bin/env python3
"""Two builds of hicoll side by side: runs the same agbench command from each build in turn
(OLD, NEW, NEW, OLD, ...: the order alternates every round), R rounds, and prints per size the
median time of each and NEW/OLD (a before/after check of a change; agbench's own --reps
interleaves variants inside one build, this interleaves builds).

  perf/compare_builds.py OLD_BUILD NEW_BUILD [--rounds R] -- allgather --np 2 -b 8 -e 64K -f 8

Prints the load average before and after (these machines are shared)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(build, args, json_path):
    cmd = [os.path.join(build, "perf", "agbench")] + args + ["-J", json_path]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit(f"compare_builds: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}")
    rows = json.load(open(json_path))["rows"]
    out = {}
    for row in rows:
        v = row["variants"]["hicoll"]
        for mode in ("oop", "ip"):
            if v.get(mode, {}).get("ran"):
                out[(row["size"], mode)] = v[mode]["time_us"]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=5)
    argv = sys.argv[1:]
    if "--" not in argv:
        p.error("the agbench arguments follow --")
    cut = argv.index("--")
    a = p.parse_args(argv[:cut])
    args = argv[cut + 1:]
    times = {"old": {}, "new": {}}
    print(f"# load before: {os.getloadavg()[0]:.2f}; agbench {' '.join(args)}; {a.rounds} rounds")
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.rounds):
            order = ["old", "new"] if i % 2 == 0 else ["new", "old"]
            for which in order:
                res = run(getattr(a, which), args, os.path.join(tmp, f"{which}{i}.json"))
                for k, t in res.items():
                    times[which].setdefault(k, []).append(t)
    print(f"# load after: {os.getloadavg()[0]:.2f}")
    print(f"{'size':>12} {'mode':>4} {'old_us':>10} {'new_us':>10} {'new/old':>8}")
    ratios = []
    for k in sorted(times["old"]):
        if k not in times["new"]:
            continue
        o, n = statistics.median(times["old"][k]), statistics.median(times["new"][k])
        ratios.append(n / o)
        print(f"{k[0]:>12} {k[1]:>4} {o:>10.2f} {n:>10.2f} {n / o:>8.3f}")
    print(f"# median new/old over {len(ratios)} rows: {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
