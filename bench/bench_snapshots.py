"""What attention snapshots cost: one real training epoch per shipped preset, with the snapshot's share of it.

    python bench/bench_snapshots.py                              # both presets, the shipped runs' data sizes
    python bench/bench_snapshots.py --presets mnist-p4 --train-images 2000

Each preset trains one epoch through ``vit.trainer.Trainer.fit`` (the CLI's loop, run folder in a
temporary directory) on generated images of its real size and number: cifar-s on 45,000 training /
5,000 validation 32-px colour images at batch 256, mnist-p4 on 8,000 / 2,000 28-px greyscale ones
at batch 64, as the shipped checkpoints were trained (see checkpoints/README.md). The snapshot (8
probe images: logits, every layer's and head's CLS map, the rollout; 256 validation images: each
head's mean attention distance and entropy) is timed where the trainer takes it, at the end of the
epoch, and set against the epoch's training time measured in the same run, side by side. The
snapshot of the initial weights, taken once per run before the first step, is listed apart: it
also pays for the first forward pass's warm-up.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from vit.core.runfiles import read_metrics  # noqa: E402
from vit.training.data import Dataset, Split, channel_stats  # noqa: E402
from vit.training.options import parse_args, resolve_model, settings_from_args  # noqa: E402
from vit.training.snapshots import load_snapshot  # noqa: E402
from vit.training.trainer import Trainer  # noqa: E402

# preset: (train images, val images, image size, channels, batch, the shipped run's other options)
PRESETS = {
    "cifar-s": (45_000, 5_000, 32, 3, 256, ["--recipe", "ours"]),
    "mnist-p4": (8_000, 2_000, 28, 1, 64, ["--lr", "1e-3", "--augment", "crop"]),
}
CLASSES = 10


def one_epoch(preset: str, train_images: int | None, device: torch.device) -> dict:
    """Train one epoch of ``preset`` with snapshots on; returns the seconds of each part."""
    n_train, n_val, size, channels, batch, extra = PRESETS[preset]
    n_train = train_images or n_train
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n_train + n_val, channels, size, size), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, CLASSES, (n_train + n_val,), generator=generator)
    mean, std = channel_stats(images[:n_train])
    data = Dataset("bench", [str(c) for c in range(CLASSES)], Split(images[:n_train], labels[:n_train]),
                   Split(images[n_train:], labels[n_train:]), mean, std, True)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        args = parse_args(["--dataset", "folder:unused", "--out", str(run), "--preset", preset, "--epochs", "1",
                           "--batch-size", str(batch), "--device", str(device), "--attention-every", "1", *extra])
        resolve_model(args, CLASSES)
        run.mkdir()
        trainer = Trainer(settings_from_args(args), data, run_dir=run, device=device)
        start = time.perf_counter()
        trainer.fit(None)
        total = time.perf_counter() - start
        [row] = read_metrics(run / "metrics.jsonl")
        before, after = load_snapshot(run, 0).seconds, load_snapshot(run, 1).seconds
    return {"preset": preset, "train_images": n_train, "train_seconds": row["epoch_seconds"],
            "images_per_second": row["images_per_second"], "snapshot_seconds": after,
            "initial_snapshot_seconds": before, "total_seconds": total}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    parser.add_argument("--train-images", type=int, help="fewer training images than the shipped run (faster)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (default 2, as the shipped runs)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"{'preset':<10} {'train images':>12} {'epoch (train)':>14} {'img/s':>7} {'snapshot':>9} "
          f"{'share':>7} {'whole epoch':>12} {'epoch 0 snapshot':>17}")
    for preset in args.presets:
        r = one_epoch(preset, args.train_images, device)
        share = 100 * r["snapshot_seconds"] / r["train_seconds"]
        print(f"{preset:<10} {r['train_images']:>12,} {r['train_seconds']:>13.1f}s {r['images_per_second']:>7.0f} "
              f"{r['snapshot_seconds']:>8.2f}s {share:>6.2f}% {r['total_seconds']:>11.1f}s "
              f"{r['initial_snapshot_seconds']:>16.2f}s", flush=True)


if __name__ == "__main__":
    main()
