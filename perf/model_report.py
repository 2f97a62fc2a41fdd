#!/usr/bin/env python3
"""The cost model's validation report from perf/model_validate.sh's JSON files.

    perf/model_report.py DIR [DIR ...] [--plot perf/img/model_predicted_vs_measured.png] [--markdown F]
                         [--repeat DIR [DIR ...]]
    perf/model_report.py --quantized DIR [--markdown F]

A point is (collective, layout, link rate, size, path) for the two fixed paths, hierarchical
(the --baseline hier communicator) and ring, out of place and in place: the prediction is the
engine's own (hcStats.predicted_us), the measurement agbench's median. The choice check
compares what HICOLL_ALGO=auto (the main column) measured with the best fixed path measured in
the same run. --repeat reads a second run of the same sweep: how often the two runs' measurements
agree within 20 % (the emulator's own reproducibility, beside the model's accuracy).

--quantized reads perf/model_quantized.sh's files instead: the exact call (hicoll) and the
quantized one (hicoll-int8) per collective, type, layout and size, and checks the choice that
HICOLL_QUANT_MIN_NODES=0 makes (quantize where the quantized call's prediction is the lower)
against the faster of the two measured in the same run.
"""
import argparse
import glob
import json
import math
import os
import re
import statistics
import sys


def load(dirs):
    points, choices = [], []
    for f in sorted(f for d in dirs for f in glob.glob(os.path.join(d, "*_*x*_*.json"))):
        m = re.match(r"(allgather|reducescatter|allreduce)_(\d+)x(\d+)_(\w+)\.json", os.path.basename(f))
        if not m:
            continue
        coll, N, L, rate = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        for row in json.load(open(f))["rows"]:
            v = row["variants"]
            # agbench rounds sizes down to whole elements per rank: file them under the size asked.
            row["size"] = 1 << round(math.log2(row["size"]))
            for place in ("oop", "ip"):
                meas = {}
                for name, key in (("hier", "hier"), ("ring", "ring"), ("auto", "hicoll")):
                    x = v.get(key, {}).get(place, {})
                    if x.get("ran") is False or "time_us" not in x:
                        continue
                    meas[name] = x["time_us"]
                    if name != "auto" and x.get("predicted_us"):
                        points.append(dict(coll=coll, N=N, L=L, rate=rate, size=row["size"], algo=name,
                                           place=place, pred=x["predicted_us"], meas=x["time_us"]))
                if {"hier", "ring", "auto"} <= meas.keys():
                    best = min(meas["hier"], meas["ring"])
                    # The path auto took, from its statistics: where a fixed variant ran the same
                    # path (same calls, same bytes), that variant's time is the path's time too.
                    st = {k: v[k].get("stats", {}) for k in ("hicoll", "hier", "ring")}
                    same = None
                    for k in ("hier", "ring"):
                        if (st["hicoll"].get("calls_ring", 0) > 0) == (k == "ring") and \
                                st["hicoll"].get("inter_bytes_per_call_by_node") == st[k].get("inter_bytes_per_call_by_node"):
                            same = k
                    path_time = min(meas["auto"], meas[same]) if same else meas["auto"]
                    pred = {k: v[k][place].get("predicted_us", 0) for k in ("hier", "ring")}
                    choices.append(dict(coll=coll, N=N, L=L, rate=rate, size=row["size"], place=place,
                                        auto=meas["auto"], hier=meas["hier"], ring=meas["ring"],
                                        pred_hier=pred["hier"], pred_ring=pred["ring"],
                                        auto_pred=v["hicoll"][place].get("predicted_us", 0),
                                        path=same or "own split", ratio=meas["auto"] / best,
                                        path_ratio=path_time / best))
    return points, choices


def load_quantized(dirs):
    points, choices = [], []
    for f in sorted(f for d in dirs for f in glob.glob(os.path.join(d, "*_*_*x*_*.json"))):
        m = re.match(r"(allgather|reducescatter)_(\w+?)_(\d+)x(\d+)_(\w+)\.json", os.path.basename(f))
        if not m:
            continue
        coll, dtype, N, L, rate = m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), m.group(5)
        for row in json.load(open(f))["rows"]:
            v = row["variants"]
            size = 1 << round(math.log2(row["size"]))
            for place in ("oop", "ip"):
                got = {}
                for name, key in (("exact", "hicoll"), ("int8", "hicoll-int8")):
                    x = v.get(key, {}).get(place, {})
                    if x.get("ran") is False or "time_us" not in x or not x.get("predicted_us"):
                        continue
                    got[name] = x
                    points.append(dict(coll=coll, dtype=dtype, N=N, L=L, rate=rate, size=size, algo=name,
                                       place=place, pred=x["predicted_us"], meas=x["time_us"]))
                if len(got) == 2:
                    # The decision is made out of place on every rank (the flag may differ).
                    oop = {k: v[key]["oop"]["predicted_us"] for k, key in (("exact", "hicoll"), ("int8", "hicoll-int8"))}
                    pick = "int8" if oop["int8"] < oop["exact"] else "exact"
                    best = min(got[k]["time_us"] for k in got)
                    choices.append(dict(coll=coll, dtype=dtype, N=N, L=L, rate=rate, size=size, place=place,
                                        pick=pick, exact=got["exact"]["time_us"], int8=got["int8"]["time_us"],
                                        ratio=got[pick]["time_us"] / best))
    return points, choices


def quantized_report(dirs):
    points, choices = load_quantized(dirs)
    if not points:
        sys.exit(f"no quantized results in {dirs}")
    out = []
    # The accuracy is counted on the emulated nodes; one node (no emulation, cache-resident
    # buffers at the small sizes) is there for the verdict.
    for algo in ("exact", "int8"):
        ps = [p for p in points if p["algo"] == algo and p["N"] > 1]
        if not ps:
            continue
        within = sum(abs(p["pred"] / p["meas"] - 1) <= 0.2 for p in ps)
        out.append(f"{algo}, emulated nodes: {len(ps)} points, prediction within 20 % of the measured median at "
                   f"{within} ({100 * within / len(ps):.1f} %), median |error| "
                   f"{100 * statistics.median(abs(p['pred'] / p['meas'] - 1) for p in ps):.1f} %.")
    for name, cs in (("emulated nodes", [c for c in choices if c["N"] > 1]), ("one node", [c for c in choices if c["N"] == 1])):
        if cs:
            ok = sum(c["ratio"] <= 1.10 for c in cs)
            out.append(f"Choice on {name} (quantize where predicted faster; its measured time / the faster "
                       f"measured): {ok} of {len(cs)} within 10 %, median {statistics.median(c['ratio'] for c in cs):.3f}.")
    sizes = sorted({p["size"] for p in points})
    idx = {(p["coll"], p["dtype"], p["N"], p["L"], p["size"], p["algo"], p["place"]): p for p in points}
    cidx = {(c["coll"], c["dtype"], c["N"], c["L"], c["size"], c["place"]): c for c in choices}
    out.append("")
    out.append("Predicted / measured, out of place, exact | int8 (measured speedup of int8; the model's pick):")
    out.append("")
    out.append("| collective | type | layout | " + " | ".join(size_name(s) for s in sizes) + " |")
    out.append("|---|---|---|" + "---|" * len(sizes))
    for coll in ("allgather", "reducescatter"):
        for dtype in sorted({p["dtype"] for p in points}):
            for N, L in sorted({(p["N"], p["L"]) for p in points if p["coll"] == coll and p["dtype"] == dtype}):
                cells = []
                for s in sizes:
                    e, q = (idx.get((coll, dtype, N, L, s, a, "oop")) for a in ("exact", "int8"))
                    c = cidx.get((coll, dtype, N, L, s, "oop"))
                    cell = " \\| ".join(f"{x['pred'] / x['meas']:.2f}" if x else "-" for x in (e, q))
                    if c:
                        cell += f" ({c['exact'] / c['int8']:.2f}x; {c['pick']})"
                    cells.append(cell)
                out.append(f"| {coll} | {dtype} | {N}x{L} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("Worst points:")
    for p in sorted(points, key=lambda p: -abs(p["pred"] / p["meas"] - 1))[:8]:
        out.append(f"- {p['coll']} {p['dtype']} {p['N']}x{p['L']} {size_name(p['size'])} {p['algo']} {p['place']}: "
                   f"predicted {p['pred']:.0f} us, measured {p['meas']:.0f} us ({p['pred'] / p['meas']:.2f})")
    for c in (c for c in choices if c["ratio"] > 1.10):
        out.append(f"- wrong pick: {c['coll']} {c['dtype']} {c['N']}x{c['L']} {size_name(c['size'])} {c['place']}: "
                   f"picked {c['pick']}, exact {c['exact']:.0f} us, int8 {c['int8']:.0f} us ({c['ratio']:.2f})")
    return "\n".join(out) + "\n"


def size_name(b):
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div}{unit}"
    return str(b)


def repeat_lines(points, again):
    """How well two runs of the same sweep agree: the fixed paths' measured medians, point by
    point, and the model against the second run. Where the measurement itself moves by more
    than 20 % between runs, no prediction can be within 20 % of both."""
    key = lambda p: (p["coll"], p["N"], p["L"], p["rate"], p["size"], p["algo"], p["place"])
    first = {key(p): p for p in points}
    pairs = [(first[key(q)], q) for q in again if key(q) in first]
    if not pairs:
        return ["Repeat: no point of the second run is in the first."]
    # The first run's median taken as a prediction of the second's, judged as the model is.
    agree = [abs(p["meas"] / q["meas"] - 1) <= 0.2 for p, q in pairs]
    model = sum(abs(q["pred"] / q["meas"] - 1) <= 0.2 for q in again)
    out = [f"Repeat (a second run of the same sweep): the first run's measured medians, taken as predictions of "
           f"the second's, within 20 % at {sum(agree)} of {len(pairs)} points ({100 * sum(agree) / len(pairs):.1f} %); "
           f"the model within 20 % of the second run at {model} of {len(again)} ({100 * model / len(again):.1f} %)."]
    stable = [p for p, q in pairs if max(p["meas"] / q["meas"], q["meas"] / p["meas"]) <= 1.1]
    if stable:
        ok = sum(abs(p["pred"] / p["meas"] - 1) <= 0.2 for p in stable)
        out.append(f"Where the two runs measured within 10 % of each other ({len(stable)} points), the model is "
                   f"within 20 % of the first run at {ok} ({100 * ok / len(stable):.1f} %).")
    for name, group in (("rate", lambda p: p["rate"]), ("size", lambda p: size_name(p["size"])),
                        ("host", lambda p: "a core per rank" if p["N"] * p["L"] <= 2 else "ranks beyond cores")):
        g = {}
        for (p, q), ok in zip(pairs, agree):
            g.setdefault(group(p), []).append(ok)
        out.append(f"Runs agree within 20 % by {name}: " +
                   ", ".join(f"{k} {100 * sum(v) / len(v):.1f} % of {len(v)}" for k, v in sorted(g.items())))
    return out


def margin_lines(choices):
    """Whether preferring one path unless the model predicts the other faster by a margin would
    have chosen better: the fixed paths' predictions and measurements of each point, re-decided."""
    cs = [c for c in choices if c["coll"] != "allreduce" and c["pred_hier"] and c["pred_ring"]]
    out = [f"Tie margins ({len(cs)} AllGather / ReduceScatter points; the measured time of the path taken / the "
           f"best fixed path, beyond 10 %):"]
    for toward in ("hier", "ring"):
        for m in (0.0, 0.01, 0.02, 0.05, 0.1):
            bad = 0
            for c in cs:
                ring = c["pred_ring"] < c["pred_hier"] * (1 - m if toward == "hier" else 1 + m)
                bad += (c["ring"] if ring else c["hier"]) / min(c["hier"], c["ring"]) > 1.10
            out.append(f"- toward {toward}, margin {100 * m:.0f} %: {bad} of {len(cs)} beyond 10 %")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", help="model_validate.sh output folders (their points are merged)")
    ap.add_argument("--plot")
    ap.add_argument("--markdown")
    ap.add_argument("--quantized", action="store_true", help="perf/model_quantized.sh's files")
    ap.add_argument("--repeat", nargs="+", metavar="DIR",
                    help="a second run of the same sweep: how far the measurements move between runs")
    ap.add_argument("--margins", action="store_true",
                    help="also: the choices a tie margin toward either path would make (AllGather, ReduceScatter)")
    a = ap.parse_args()
    if a.quantized:
        text = quantized_report(a.dirs)
        print(text, end="")
        if a.markdown:
            open(a.markdown, "w").write(text)
        return
    points, choices = load(a.dirs)
    if not points:
        sys.exit(f"no results in {a.dirs}")
    out = []
    err = [p["pred"] / p["meas"] - 1 for p in points]
    within = sum(abs(e) <= 0.2 for e in err)
    within25 = sum(abs(e) <= 0.25 for e in err)
    out.append(f"Points: {len(points)} (hier and ring, out of place and in place); prediction within 20 % of "
               f"the measured median: {within} ({100 * within / len(points):.1f} %), within 25 %: {within25} "
               f"({100 * within25 / len(points):.1f} %); median |error| "
               f"{100 * statistics.median(abs(e) for e in err):.1f} %.")
    for key, name in ((lambda p: p["rate"], "rate"), (lambda p: f"{p['N']}x{p['L']}", "layout"),
                      (lambda p: size_name(p["size"]), "size")):
        groups = {}
        for p, e in zip(points, err):
            groups.setdefault(key(p), []).append(abs(e) <= 0.2)
        out.append(f"Within 20 % by {name}: " + ", ".join(
            f"{k} {100 * sum(v) / len(v):.1f} % of {len(v)}" for k, v in sorted(groups.items())))
    if choices:
        ok = sum(c["ratio"] <= 1.10 for c in choices)
        worst = max(choices, key=lambda c: c["ratio"])
        out.append(f"Choice (auto measured / best fixed path measured, same run): {ok} of {len(choices)} within "
                   f"10 %; median {statistics.median(c['ratio'] for c in choices):.3f}; worst {worst['ratio']:.2f} "
                   f"({worst['coll']} {worst['N']}x{worst['L']} {worst['rate']} {size_name(worst['size'])} "
                   f"{worst['place']}).")
        ok = sum(c["path_ratio"] <= 1.10 for c in choices)
        out.append(f"The chosen path's time (the fixed variant's measurement of the same path where one ran it, "
                   f"so that run-to-run noise of one variant is not counted as a wrong choice) / best: {ok} of "
                   f"{len(choices)} within 10 %; beyond it:")
        for c in sorted((c for c in choices if c["path_ratio"] > 1.10), key=lambda c: -c["path_ratio"]):
            out.append(f"- {c['coll']} {c['N']}x{c['L']} {c['rate']} {size_name(c['size'])} {c['place']}: auto took "
                       f"{c['path']} ({c['auto']:.0f} us), hier {c['hier']:.0f}, ring {c['ring']:.0f} "
                       f"({c['path_ratio']:.2f})")
        if a.margins:
            out.extend(margin_lines(choices))
        gains = sorted((c for c in choices if c["hier"] / c["auto"] >= 1.15), key=lambda c: -c["hier"] / c["auto"])
        if gains:
            out.append("")
            out.append(f"Where auto beat the fixed rules (HICOLL_ALGO=hier) by 15 % or more, same run: {len(gains)} "
                       f"points; the largest:")
            out.append("")
            out.append("| collective | layout | rate | size | placement | fixed rules (us) | auto (us) | auto took | gain |")
            out.append("|---|---|---|---|---|---|---|---|---|")
            for c in gains[:12]:
                out.append(f"| {c['coll']} | {c['N']}x{c['L']} | {c['rate']} | {size_name(c['size'])} | {c['place']} | "
                           f"{c['hier']:.0f} | {c['auto']:.0f} | {c['path']} | {c['hier'] / c['auto']:.2f}x |")
    if a.repeat:
        again, _ = load(a.repeat)
        out.append("")
        out.extend(repeat_lines(points, again))
    # The table: predicted / measured per point, oop, hier | ring.
    rates = sorted({p["rate"] for p in points}, key=lambda r: float(re.sub(r"[a-z]+", "", r)) *
                   (1 if "gbit" in r else 1e-3))
    sizes = sorted({p["size"] for p in points})
    out.append("")
    out.append("Predicted / measured, out of place, hier | ring:")
    out.append("")
    out.append("| rate | layout | collective | " + " | ".join(size_name(s) for s in sizes) + " |")
    out.append("|---|---|---|" + "---|" * len(sizes))
    idx = {(p["coll"], p["N"], p["L"], p["rate"], p["size"], p["algo"], p["place"]): p for p in points}
    for rate in rates:
        for N, L in sorted({(p["N"], p["L"]) for p in points if p["rate"] == rate}):
            for coll in ("allgather", "reducescatter", "allreduce"):
                cells = []
                for s in sizes:
                    h = idx.get((coll, N, L, rate, s, "hier", "oop"))
                    r = idx.get((coll, N, L, rate, s, "ring", "oop"))
                    cells.append(" \\| ".join(f"{x['pred'] / x['meas']:.2f}" if x else "-" for x in (h, r)))
                if any(c != "- \\| -" for c in cells):
                    out.append(f"| {rate} | {N}x{L} | {coll} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("Worst points:")
    for p in sorted(points, key=lambda p: -abs(p["pred"] / p["meas"] - 1))[:10]:
        out.append(f"- {p['coll']} {p['N']}x{p['L']} {p['rate']} {size_name(p['size'])} {p['algo']} {p['place']}: "
                   f"predicted {p['pred']:.0f} us, measured {p['meas']:.0f} us ({p['pred'] / p['meas']:.2f})")
    text = "\n".join(out) + "\n"
    print(text, end="")
    if a.markdown:
        open(a.markdown, "w").write(text)
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.4, 6))
        for algo, mark in (("hier", "o"), ("ring", "^")):
            xs = [p["meas"] / 1e3 for p in points if p["algo"] == algo]
            ys = [p["pred"] / 1e3 for p in points if p["algo"] == algo]
            ax.scatter(xs, ys, s=12, marker=mark, alpha=0.7, label=algo)
        lo = min(p["meas"] for p in points) / 1e3 / 1.5
        hi = max(p["meas"] for p in points) / 1e3 * 1.5
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.plot([lo, hi], [lo * 1.2, hi * 1.2], "k:", lw=0.6)
        ax.plot([lo, hi], [lo / 1.2, hi / 1.2], "k:", lw=0.6, label="±20 %")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured median (ms)")
        ax.set_ylabel("predicted (ms)")
        ax.set_title("hicoll cost model on emulated nodes (netns, 0.5-2 Gbit/s)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)


if __name__ == "__main__":
    main()
