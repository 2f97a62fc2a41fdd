#!/usr/bin/env python3
"""hicoll against its baselines (Open MPI, hicoll's ring, a 1-core memcpy) as markdown tables,
computed from the agbench JSON in a results directory (perf/measure.sh writes them): the 64 MiB
AllGather and ReduceScatter on 1 node x 2 ranks, both on 2 emulated nodes x 2 ranks, and the
AllGather from 8 B to 64 KiB. Every figure is a median over the run's repetitions; ratios
compare variants measured side by side in the same run; "goal" is the ratio each comparison
was first measured against.

    python perf/vs_baselines.py perf/results > perf/results/vs_baselines.md
"""
import json
import os
import sys


def load(d, name):
    path = os.path.join(d, name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def row_at(run, size=64 << 20):
    rows = [r for r in run["rows"] if r["size"] == size]
    return rows[0] if rows else run["rows"][-1]


def main_variant(row):
    return next(v for k, v in row["variants"].items() if k.startswith("hicoll"))


def spread(m):
    t = m.get("times_us", [])
    return f"{min(t) / 1e3:.1f}-{max(t) / 1e3:.1f} ms" if t else "-"


def verdict(value, goal):
    return "met" if value >= goal else "**missed**"


def allgather_1x2(d, out):
    run = load(d, "allgather_64M_1x2")
    if not run:
        return
    r = row_at(run)
    h, m = main_variant(r), r["variants"].get("mpi", {})
    cpy = r.get("memcpy_gbps", 0)
    out.append("### 1 node x 2 ranks, AllGather, 64 MiB\n")
    out.append("| figure | hicoll busbw | baseline | ratio | goal | |")
    out.append("|---|---|---|---|---|---|")
    ip, oop = h["ip"]["busbw"], h["oop"]["busbw"]
    out.append(f"| in-place vs 1-core memcpy | {ip:.2f} GB/s | memcpy {cpy:.2f} GB/s | {ip / cpy:.2f} | >= 0.6 | {verdict(ip / cpy, 0.6)} |")
    if m:
        mip, moop = m["ip"]["busbw"], m["oop"]["busbw"]
        out.append(f"| in-place vs MPI_Allgather(MPI_IN_PLACE) | {ip:.2f} GB/s | {mip:.2f} GB/s | {ip / mip:.2f} | >= 1.5 | {verdict(ip / mip, 1.5)} |")
        out.append(f"| out-of-place vs MPI_Allgather | {oop:.2f} GB/s | {moop:.2f} GB/s | {oop / moop:.2f} | >= 1.3 | {verdict(oop / moop, 1.3)} |")
    out.append(f"\nhicoll times per call over the 5 repetitions: out-of-place {spread(h['oop'])}, in-place {spread(h['ip'])}.\n")


def reducescatter_1x2(d, out):
    run = load(d, "reducescatter_64M_1x2")
    if not run:
        return
    r = row_at(run)
    h, m = main_variant(r), r["variants"].get("mpi", {})
    cpy = r.get("memcpy_gbps", 0)
    out.append("### 1 node x 2 ranks, ReduceScatter fp32 sum, 64 MiB\n")
    out.append("| placement | hicoll busbw | memcpy | ratio (goal >= 0.4) | | Open MPI busbw | hicoll/MPI |")
    out.append("|---|---|---|---|---|---|---|")
    for key, name in (("oop", "out-of-place"), ("ip", "in-place")):
        b = h[key]["busbw"]
        mb = m.get(key, {}).get("busbw") if m else None
        mtxt = f"{mb:.2f} GB/s | {b / mb:.2f}" if mb else "- | -"
        out.append(f"| {name} | {b:.2f} GB/s | {cpy:.2f} GB/s | {b / cpy:.2f} | {verdict(b / cpy, 0.4)} | {mtxt} |")
    out.append("")


def emulated_2x2(d, out):
    out.append("### 2 emulated nodes x 2 ranks (network namespaces, 1 Gbit/s links), 64 MiB\n")
    out.append("| collective | placement | hier busbw | ring | hier/ring (>= 1.3) | MPI tcp | hier/MPI (>= 1.5) | MPI han | hier/han (>= 1.0) |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    stats_lines = []
    for coll in ("allgather", "reducescatter"):
        tcp, han = load(d, f"{coll}_64M_2x2_tcp"), load(d, f"{coll}_64M_2x2_han")
        if not tcp:
            continue
        r = row_at(tcp)
        h = main_variant(r)
        ring, mpi = r["variants"].get("ring"), r["variants"].get("mpi")
        rh = row_at(han) if han else None
        for key, name in (("oop", "out-of-place"), ("ip", "in-place")):
            b = h[key]["busbw"]
            cells = [coll, name, f"{b:.3f}"]
            for base, goal in ((ring, 1.3), (mpi, 1.5)):
                if base and base[key].get("ran"):
                    x = base[key]["busbw"]
                    cells += [f"{x:.3f}", f"{b / x:.2f} {verdict(b / x, goal)}"]
                else:
                    cells += ["-", "-"]
            if rh:
                hh, hm = main_variant(rh), rh["variants"].get("mpi")
                if hm and hm[key].get("ran"):
                    x = hm[key]["busbw"]
                    # han and hier of the han run were measured side by side
                    cells += [f"{x:.3f}", f"{hh[key]['busbw'] / x:.2f} {verdict(hh[key]['busbw'] / x, 1.0)}"]
                else:
                    cells += ["-", "-"]
            else:
                cells += ["-", "-"]
            out.append("| " + " | ".join(cells) + " |")
        s = h.get("stats")
        if s:
            per_node = s["inter_bytes_per_call_by_node"]
            stats_lines.append(
                f"- {coll}: hicoll path calls hier {s['calls_hier']} / ring {s['calls_ring']} / fallback "
                f"{s['calls_fallback']}; inter-node bytes per call by node {', '.join(f'{x:.0f}' for x in per_node)}"
                f" = {max(per_node) / r['size']:.3f} of the {r['size']} B buffer (ideal (N-1)/N = 0.500)")
        if ring and ring.get("stats"):
            per_node = ring["stats"]["inter_bytes_per_call_by_node"]
            stats_lines.append(f"- {coll} ring: inter-node bytes per call by node {max(per_node) / r['size']:.3f} of the buffer")
    out.append("\nFrom hcCommGetStats (agbench -v):\n")
    out.extend(stats_lines)
    out.append("")


def small_allgather(d, out):
    out.append("### AllGather 8 B - 64 KiB, time per call: hicoll vs Open MPI (same run)\n")
    out.append("| layout | size (B) | hicoll oop (us) | MPI oop (us) | hicoll in-place (us) | MPI in-place (us) | hicoll <= MPI |")
    out.append("|---|---|---|---|---|---|---|")
    for name, label in (("allgather_small_1x2", "1x2 shm"), ("allgather_small_2x2", "2x2 netns"),
                        ("allgather_small_2x1", "2x1 netns")):
        run = load(d, name)
        if not run:
            continue
        ok = total = 0
        for r in run["rows"]:
            h, m = main_variant(r), r["variants"].get("mpi")
            if not m or r["count"] == 0:
                continue
            res = []
            for key in ("oop", "ip"):
                total += 1
                good = h[key]["time_us"] <= m[key]["time_us"]
                ok += good
                res.append("yes" if good else "**no**")
            out.append(f"| {label} | {r['size']} | {h['oop']['time_us']:.1f} | {m['oop']['time_us']:.1f} | "
                       f"{h['ip']['time_us']:.1f} | {m['ip']['time_us']:.1f} | {' / '.join(res)} |")
        out.append(f"| {label} | **{ok} of {total}** cases at or below MPI | | | | | |")
    out.append("")


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "results")
    out = []
    for t in (allgather_1x2, reducescatter_1x2, emulated_2x2, small_allgather):
        t(d, out)
    print("\n".join(out))


if __name__ == "__main__":
    main()
