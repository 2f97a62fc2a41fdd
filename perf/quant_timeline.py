#!/usr/bin/env python3
"""Where a quantized AllGather's time goes, piece by piece, from its HICOLL_DEBUG=TRACE lines.

hcAllGatherQuantized cuts each rank's block into pieces; a helper thread gathers the packed
images piece after piece (one exact call each) while the caller quantizes the next pieces and
dequantizes the gathered ones (src/algorithms/quantized.cc). With HICOLL_DEBUG=TRACE every call
logs one line, "timeline (ms) p0 q Q g FROM-TO d D; p1 ...": when piece p was quantized, its
gather's start and end, when it was dequantized, in ms from the call's start.

  HICOLL_DEBUG=TRACE perf/netns_emulate.sh -N 2 -L 2 -- allgather -b 64M -e 64M --quant 256 \\
      -n 5 -w 2 --reps 1 2>&1 | perf/quant_timeline.py

For each call (rank, call) it prints the total, the gathers' sum (the time the link had work),
the gaps between gathers (the link idle while the next piece waited, or between calls' ends
and starts), the compute before the first gather and after the last one (the exposed
quantize / dequantize), and the median over the calls of every rank.
"""
import re
import statistics
import sys

LINE = re.compile(r"hicoll \[rank (\d+)[^\]]*\] \w+ (.*): timeline \(ms\) (.*)$")
PIECE = re.compile(r"p(\d+) q ([\d.]+) g ([\d.]+)-([\d.]+) d ([\d.]+)")


def parse(lines):
    calls = []
    for line in lines:
        m = LINE.search(line)
        if not m:
            continue
        pieces = [tuple(float(x) for x in p.groups()[1:]) for p in PIECE.finditer(m.group(3))]
        if pieces:
            calls.append((int(m.group(1)), m.group(2), pieces))
    return calls


def summary(pieces):
    total = max(max(d, g1) for _, _, g1, d in pieces)
    gathers = sum(g1 - g0 for _, g0, g1, _ in pieces)
    gaps = sum(max(0.0, pieces[i + 1][1] - pieces[i][2]) for i in range(len(pieces) - 1))
    # The part of each gap spent waiting for the next piece's quantization.
    waited = sum(max(0.0, min(pieces[i + 1][1] - pieces[i][2], pieces[i + 1][0] - pieces[i][2]))
                 for i in range(len(pieces) - 1))
    before = pieces[0][1]
    after = total - pieces[-1][2]
    return {"total": total, "gathers": gathers, "gaps": gaps, "gaps_quant": waited,
            "before": before, "after": after, "pieces": len(pieces)}


def main():
    calls = parse(sys.stdin)
    if not calls:
        sys.exit("no 'timeline (ms)' lines: run with HICOLL_DEBUG=TRACE")
    keys = ["total", "gathers", "gaps", "gaps_quant", "before", "after"]
    print("# rank  pieces " + " ".join(f"{k:>10}" for k in keys) + "   (ms)")
    rows = []
    for rank, what, pieces in calls:
        s = summary(pieces)
        rows.append(s)
        print(f"  {rank:4d}  {s['pieces']:6d} " + " ".join(f"{s[k]:10.2f}" for k in keys))
    med = {k: statistics.median(r[k] for r in rows) for k in keys}
    print("# median " + " " * 6 + " ".join(f"{med[k]:10.2f}" for k in keys))
    print(f"# of the median call: gathers {med['gathers'] / med['total']:.0%}, gaps between gathers "
          f"{med['gaps'] / med['total']:.0%} (waiting for a quantized piece {med['gaps_quant'] / med['total']:.0%}), "
          f"before the first gather {med['before'] / med['total']:.0%}, after the last {med['after'] / med['total']:.0%}")


if __name__ == "__main__":
    main()
