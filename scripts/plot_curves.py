"""Plot a run's training curves (loss, accuracy, learning rate) from its metrics.jsonl to a PNG.

    python scripts/plot_curves.py runs/cifar10-cifar-s checkpoints/cifar10-cifar-s-curves.png [RUN ...]

Several runs may be given before the output path; they are overlaid for comparison.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def main() -> int:
    if len(sys.argv) < 3:
        print("usage: plot_curves.py RUN_DIR [RUN_DIR ...] OUT.png", file=sys.stderr)
        return 2
    *runs, out = sys.argv[1:]
    fig, (loss_ax, acc_ax, lr_ax) = plt.subplots(1, 3, figsize=(13, 3.6))
    for run in map(Path, runs):
        rows = read_metrics(run)
        epochs = [r["epoch"] for r in rows]
        (line,) = loss_ax.plot(epochs, [r["train_loss"] for r in rows], label=f"{run.name} train")
        loss_ax.plot(epochs, [r["val_loss"] for r in rows], "--", color=line.get_color(), label=f"{run.name} val")
        acc_ax.plot(epochs, [100 * r["train_acc"] for r in rows], color=line.get_color(), label=f"{run.name} train")
        acc_ax.plot(epochs, [100 * r["val_acc"] for r in rows], "--", color=line.get_color(), label=f"{run.name} val")
        lr_ax.plot(epochs, [r["lr"] for r in rows], color=line.get_color(), label=run.name)
    loss_ax.set(title="loss (train: with augmentation and label smoothing)", xlabel="epoch")
    acc_ax.set(title="accuracy %", xlabel="epoch")
    lr_ax.set(title="learning rate (end of epoch)", xlabel="epoch")
    for ax in (loss_ax, acc_ax, lr_ax):
        ax.grid(alpha=0.3)
    acc_ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
