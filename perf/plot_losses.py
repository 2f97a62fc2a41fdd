#!/usr/bin/env python3
"""Loss curves of train_gpt runs (its JSON lines on stdout) in one PNG.

    python perf/plot_losses.py -o losses.png exact.jsonl="exact" int8.jsonl="int8 AllGather"

Prints each run's first and final loss and the final loss's difference from the first run's.
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            if line.startswith("{"):
                j = json.loads(line)
                if "step" in j:
                    out[j["step"]] = j["loss"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--title", default="train_gpt loss")
    ap.add_argument("runs", nargs="+", help="FILE or FILE=label")
    a = ap.parse_args()
    fig, ax = plt.subplots(figsize=(7, 4))
    first = None
    for spec in a.runs:
        path, _, label = spec.partition("=")
        ls = losses(path)
        steps = sorted(ls)
        ax.plot(steps, [ls[s] for s in steps], label=label or path, linewidth=1)
        final = ls[steps[-1]]
        first = final if first is None else first
        print(f"{label or path}: loss {ls[steps[0]]:.5f} -> {final:.5f} at step {steps[-1]} "
              f"({(final - first) / first * 100:+.3f} % vs the first run)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(a.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)


if __name__ == "__main__":
    main()
