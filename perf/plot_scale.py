#!/usr/bin/env python3
"""Plot of the cost model's predictions at scale (busbw per path vs nodes).

    hicoll_model scale --gbps 400 > a.txt; hicoll_model scale --gbps 3200 > b.txt
    perf/plot_scale.py a.txt b.txt -o perf/img/model_scale.png
"""
import argparse
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def parse(path):
    gbps = None
    rows = []
    for line in open(path):
        m = re.match(r"# per node (\d+) Gbit/s", line)
        if m:
            gbps = int(m.group(1))
        f = [x.strip() for x in line.split("|")]
        if len(f) < 5 or not f[0].split() or f[0].split()[0] not in ("allgather", "reducescatter"):
            continue
        coll, nodes, mb = f[0].split()
        num = lambda s: float(s) if s not in ("-", "") else None
        rows.append(dict(coll=coll, nodes=int(nodes), mb=float(mb), hier=num(f[1].split()[1]),
                         ring=num(f[2].split()[1]), logstep=num(f[3].split()[1]) if f[3].split()[0] != "-" else None))
    return gbps, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--mb", type=float, default=250)
    a = ap.parse_args()
    fig, axes = plt.subplots(1, len(a.files), figsize=(5.2 * len(a.files), 4.2), squeeze=False)
    for ax, path in zip(axes[0], a.files):
        gbps, rows = parse(path)
        for coll, style in (("allgather", "-"), ("reducescatter", "--")):
            for algo, mark in (("hier", "o"), ("ring", "^"), ("logstep", "s")):
                pts = [(r["nodes"], r[algo]) for r in rows if r["coll"] == coll and r["mb"] == a.mb and r[algo]]
                if pts:
                    ax.plot(*zip(*pts), style, marker=mark, label=f"{coll} {algo}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("nodes (8 GPUs each)")
        ax.set_ylabel("predicted busbw (GB/s)")
        ax.set_title(f"{a.mb:.0f} MB bf16, {gbps} Gbit/s per node")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)


if __name__ == "__main__":
    main()
