#!/usr/bin/env python3
"""Plot train_gpt loss curves: plot_loss.py OUT.png LABEL=run.jsonl [LABEL=run.jsonl ...]

Each run file holds train_gpt's stdout (one JSON object per line; lines with "step" are
plotted). Needs matplotlib (in the project's .venv).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    fig, ax = plt.subplots(figsize=(7, 4))
    for spec in argv[2:]:
        label, _, path = spec.partition("=")
        steps, losses = [], []
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if "step" in rec:
                    steps.append(rec["step"])
                    losses.append(rec["loss"])
        if not steps:
            sys.exit(f"{path}: no step lines")
        ax.plot(steps, losses, label=label, marker="." if len(steps) < 60 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / byte)")
    ax.set_title("train_gpt on the fortunes corpus")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(argv[1], dpi=110)


if __name__ == "__main__":
    main(sys.argv)
