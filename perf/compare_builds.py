#!/usr/bin/env python3
"""Two builds of hicoll side by side: runs the same agbench command from each build in turn
(OLD, NEW, NEW, OLD, ...: the order alternates every round), R rounds, and prints per size the
median time of each and NEW/OLD (a before/after check of a change; agbench's own --reps
interleaves variants inside one build, this interleaves builds).

  perf/compare_builds.py OLD_BUILD NEW_BUILD [--rounds R] -- allgather --np 2 -b 8 -e 64K -f 8

With --libs, OLD and NEW are folders holding a libhicoll.so.0 (a copy of build/src's) that one
agbench (--agbench, build/perf/agbench by default) loads in turn through LD_LIBRARY_PATH. With a
--baseline in the agbench arguments it also prints, per size, the median of each run's
baseline time over hicoll's (above 1: hicoll is faster), for OLD and for NEW.

--old-env / --new-env KEY=VALUE (repeatable) set the environment of one side's runs: the same
build twice with a knob's two values (--libs with one folder twice) compares the knob.

Prints the load average before and after (these machines are shared)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(where, args, json_path, agbench=None, extra_env=()):
    """hicoll's time per (size, mode), and each baseline's time over it."""
    env = dict(os.environ)
    env.update(kv.split("=", 1) for kv in extra_env)
    if agbench:
        env["LD_LIBRARY_PATH"] = where
    cmd = [agbench or os.path.join(where, "perf", "agbench")] + args + ["-J", json_path]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900, env=env)
    if r.returncode != 0:
        sys.exit(f"compare_builds: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}")
    rows = json.load(open(json_path))["rows"]
    out, vs = {}, {}
    for row in rows:
        v = row["variants"]["hicoll"]
        for mode in ("oop", "ip"):
            if v.get(mode, {}).get("ran"):
                out[(row["size"], mode)] = v[mode]["time_us"]
                for name, b in row["variants"].items():
                    if name != "hicoll" and b.get(mode, {}).get("ran"):
                        vs[(row["size"], mode, name)] = b[mode]["time_us"] / v[mode]["time_us"]
    return out, vs


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--libs", action="store_true", help="OLD and NEW are folders holding libhicoll.so.0")
    p.add_argument("--agbench", default="build/perf/agbench", help="the agbench --libs runs")
    p.add_argument("--old-env", action="append", default=[], metavar="KEY=VALUE", help="environment of OLD's runs")
    p.add_argument("--new-env", action="append", default=[], metavar="KEY=VALUE", help="environment of NEW's runs")
    argv = sys.argv[1:]
    if "--" not in argv:
        p.error("the agbench arguments follow --")
    cut = argv.index("--")
    a = p.parse_args(argv[:cut])
    args = argv[cut + 1:]
    times = {"old": {}, "new": {}}
    vs = {"old": {}, "new": {}}
    env_note = "".join(f"; {w} env {' '.join(e)}" for w, e in (("old", a.old_env), ("new", a.new_env)) if e)
    print(f"# load before: {os.getloadavg()[0]:.2f}; agbench {' '.join(args)}; {a.rounds} rounds{env_note}")
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.rounds):
            order = ["old", "new"] if i % 2 == 0 else ["new", "old"]
            for which in order:
                res, ratios = run(getattr(a, which), args, os.path.join(tmp, f"{which}{i}.json"),
                                  a.agbench if a.libs else None, getattr(a, f"{which}_env"))
                for k, t in res.items():
                    times[which].setdefault(k, []).append(t)
                for k, x in ratios.items():
                    vs[which].setdefault(k, []).append(x)
    print(f"# load after: {os.getloadavg()[0]:.2f}")
    names = sorted({k[2] for k in vs["old"]})
    head = "".join(f" {n + '/old':>10} {n + '/new':>10}" for n in names)
    print(f"{'size':>12} {'mode':>4} {'old_us':>10} {'new_us':>10} {'new/old':>8}{head}")
    ratios = []
    for k in sorted(times["old"]):
        if k not in times["new"]:
            continue
        o, n = statistics.median(times["old"][k]), statistics.median(times["new"][k])
        ratios.append(n / o)
        cols = ""
        for name in names:
            for which in ("old", "new"):
                x = vs[which].get(k + (name,))
                cols += f" {statistics.median(x):>10.2f}" if x else f" {'-':>10}"
        print(f"{k[0]:>12} {k[1]:>4} {o:>10.2f} {n:>10.2f} {n / o:>8.3f}{cols}")
    print(f"# median new/old over {len(ratios)} rows: {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
