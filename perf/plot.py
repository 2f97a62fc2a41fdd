#!/usr/bin/env python3
"""Plot bus bandwidth against size from agbench JSON files (agbench -J).

    python perf/plot.py -o busbw.png --title "..." run1.json run2.json=han [--skip REGEX]

Every variant in a file (hicoll as measured, the ring and mpi baselines) gives an out-of-place
and an in-place series; "file=prefix" names a file's series "prefix <variant>" so that runs of
the same variant under different settings (Open MPI tuned vs coll/han) stay apart. memcpy
figures, when the run measured them, are drawn as a dashed line.
"""
import argparse
import json
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PLACEMENT = {"oop": "out-of-place", "ip": "in-place"}


def human(n):
    for unit in ("", "K", "M", "G"):
        if n < 1024 or unit == "G":
            return f"{n:g}{unit}"
        n /= 1024
    return str(n)


def load(spec, metric="busbw"):
    path, _, prefix = spec.partition("=")
    with open(path) as f:
        run = json.load(f)
    series = {}
    memcpy = []
    for row in run["rows"]:
        if "memcpy_gbps" in row:
            memcpy.append((row["size"], row["memcpy_gbps"]))
        for name, v in row["variants"].items():
            label = name if name.startswith("hicoll") else (
                "hicoll/ring" if name == "ring" else "Open MPI" if name == "mpi" else name)
            if prefix:
                label = f"{prefix} {label}"
            for key in ("oop", "ip"):
                m = v.get(key, {})
                if not m.get("ran") or row["size"] == 0:
                    continue
                y = m["busbw"] if metric == "busbw" else m["time_us"]
                series.setdefault(f"{label} {PLACEMENT[key]}", []).append((row["size"], y))
    return run, series, memcpy


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="agbench JSON files, optionally file=prefix")
    ap.add_argument("-o", "--out", required=True, help="PNG to write")
    ap.add_argument("--title", default=None)
    ap.add_argument("--skip", default=None, help="regex of series names to leave out")
    ap.add_argument("--metric", choices=("busbw", "time"), default="busbw",
                    help="plot bus bandwidth (GB/s) or time per call (us)")
    ap.add_argument("--logy", action="store_true", help="logarithmic y axis")
    ap.add_argument("--memcpy-from", type=int, default=1 << 20,
                    help="draw memcpy figures from this size up (default 1 MiB)")
    args = ap.parse_args()

    fig, ax = plt.subplots(figsize=(9, 5.5))
    first = None
    memcpy_done = False
    for spec in args.runs:
        run, series, memcpy = load(spec, args.metric)
        first = first or run
        for name, pts in series.items():
            if args.skip and re.search(args.skip, name):
                continue
            pts.sort()
            style = "-." if "ring" in name else "--" if "MPI" in name else "-"
            marker = "s" if "in-place" in name else "o"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker=marker, ms=4, label=name)
        # Small copies run from cache; only the sizes that go to memory are a physical limit.
        memcpy = [p for p in memcpy if p[0] >= args.memcpy_from]
        if memcpy and not memcpy_done and args.metric == "busbw":
            memcpy.sort()
            ax.plot([p[0] for p in memcpy], [p[1] for p in memcpy], ":", color="gray",
                    label="memcpy, 1 core (GB/s)")
            memcpy_done = True
    ax.set_xscale("log", base=2)
    if args.logy:
        ax.set_yscale("log")
    ticks = sorted({p for spec in args.runs for p in [r["size"] for r in load(spec)[0]["rows"]] if p > 0})
    if len(ticks) > 12:
        ticks = ticks[:: (len(ticks) + 11) // 12]
    ax.set_xticks(ticks)
    ax.set_xticklabels([human(t) for t in ticks], rotation=45)
    ax.set_xlabel("size (bytes, the full buffer)")
    ax.set_ylabel("bus bandwidth (GB/s)" if args.metric == "busbw" else "time per call (us, median)")
    nodes = first.get("nodes", "?")
    ax.set_title(args.title or f"{first['collective']}, {first['nranks']} ranks on {nodes} node(s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
