"""Where a training step's time goes: ``vit.train``'s own step, profiled phase by phase.

    python bench/profile_train_step.py                                  # cifar-m, the GPU recipe, random images
    python bench/profile_train_step.py --data data/cifar10/train --batch-size 1024 --out step.txt
    python bench/profile_train_step.py --device cpu --steps 3 --warmup 1 -- --preset tintn-cifar10
    python bench/profile_train_step.py --device cpu --steps 2 --warmup 1 --images 500 -- --preset tintn-cifar10

Why: on an H200 (bench/results/h200-2026-11-26) a 256-image step of cifar-m took about 23 ms inside ``vit.train``,
about what ``bench_gpu.py`` measured for a 1,024-image step of the model alone: a fixed cost per step, not the
GPU's arithmetic, set the pace. This script builds ``vit.training.trainer.Trainer`` exactly as ``vit.train`` does
(the recipe of ``bench/train_gpu_default.py`` unless other ``vit.train`` options follow ``--``), warms it up
(compilation included), then:

1. times ``--steps`` steps end to end (a device sync before and after: the steady wall time per step), and a
   validation twice: the first compiles its model, the second is what each epoch's costs;
2. profiles as many with ``torch.profiler`` (CPU and, on a GPU, CUDA) and prints, for each phase that
   ``Trainer.step`` labels (augment, forward, backward, optimizer, ema), the host's time in it and the device's
   kernel time, then the 20 costliest operators by host time.

A phase whose host time is far over its kernel time is launch-bound: fewer, larger launches (a larger batch, CUDA
graphs, one compiled region) are the cure there; one whose kernel time dominates is the GPU's arithmetic.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from bench.train_gpu_default import RECIPE  # noqa: E402
from vit.training import options  # noqa: E402
from vit.training.data import Dataset, Split, load_dataset  # noqa: E402
from vit.training.trainer import Trainer  # noqa: E402

RANDOM_IMAGES = 50_000  # CIFAR-10's training split: 45,000 trained on, 5,000 validated (a tenth held out)
PHASES = ("step: augment", "step: forward", "step: backward", "step: optimizer", "step: ema")


def random_data(count: int, channels: int, side: int) -> Dataset:
    """``count`` random images of ``side`` px in 10 classes, the last tenth held out for validation: at the default
    ``RANDOM_IMAGES``, CIFAR-10's training split's shape (45,000 + 5,000)."""
    images = torch.randint(0, 256, (count, channels, side, side), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(0))
    labels = torch.arange(count) % 10
    train = count - count // 10
    return Dataset("random", [str(i) for i in range(10)], Split(images[:train], labels[:train]),
                   Split(images[train:], labels[train:]), (0.5,) * 3, (0.25,) * 3, True)


def build(device: str, data_dir: str | None, extra: list[str], images: int = RANDOM_IMAGES) -> Trainer:
    """A Trainer as ``vit.train`` builds it for ``RECIPE + extra`` (no run folder); without ``data_dir``, on
    ``images`` random images (``random_data``)."""
    recipe = RECIPE if device.startswith("cuda") else [a for a in RECIPE if a not in ("--compile", "--precision",
                                                                                       "bf16")]
    args = options.parse_args(["--dataset", f"folder:{data_dir or 'unused'}", "--out", "unused", *recipe, *extra,
                               "--device", device], check_out=False)
    options.resolve_model(args, num_classes=10)
    side = args.image_size_resolved
    if data_dir:
        data = load_dataset(f"folder:{data_dir}", side, args.channels, val_fraction=0.1, seed=0)
    else:  # CIFAR-10's training split's shape by default: 45,000 + 5,000 random images
        data = random_data(images, args.channels, side)
    return Trainer(options.settings_from_args(args), data, None, device=device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def batches(trainer: Trainer, count: int, offset: int) -> list[torch.Tensor]:
    """``count`` batches of indices, as an epoch's order hands them out."""
    order = torch.randperm(len(trainer.train), generator=torch.Generator().manual_seed(offset))
    order = order.to(trainer.train.images.device)
    size = trainer.local_batch
    return [order[(i * size) % (len(order) - size):][:size] for i in range(count)]


def device_time_us(event) -> float:
    """An event's kernel time on the device (the attribute's name moved across torch versions)."""
    for name in ("device_time_total", "cuda_time_total"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data", help="image folder <class>/<image> (default: random CIFAR-shaped images)")
    parser.add_argument("--batch-size", type=int, help="overrides the recipe's")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first (compilation)")
    parser.add_argument("--steps", type=int, default=50, help="timed and then profiled steps")
    parser.add_argument("--out", type=Path, help="also write the report here")
    parser.add_argument("--images", type=int, default=RANDOM_IMAGES,
                        help="without --data: how many random images, a tenth of them validated (default: "
                             "CIFAR-10's 45,000 + 5,000)")
    parser.add_argument("extra", nargs="*", help="vit.train options after --, e.g. -- --preset cifar-s")
    return parser


def main() -> int:
    args = parser().parse_args()
    if args.images < 20:
        raise SystemExit("profile_train_step.py: error: --images needs at least 20 (a tenth, at least 2, is "
                         "validated)")
    extra = list(args.extra) + (["--batch-size", str(args.batch_size)] if args.batch_size else [])
    trainer = build(args.device, args.data, extra, args.images)
    device = trainer.device
    lines = [f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, torch "
             f"{torch.__version__}, batch {trainer.local_batch}, recipe {' '.join(RECIPE + extra)}"]

    start = time.perf_counter()
    for idx in batches(trainer, args.warmup, 1):
        trainer.step(idx)
    sync(device)
    lines.append(f"warm-up: {args.warmup} steps in {time.perf_counter() - start:.1f} s (compilation included)")

    timed = batches(trainer, args.steps, 2)
    sync(device)
    start = time.perf_counter()
    for idx in timed:
        trainer.step(idx)
    sync(device)
    per_step = (time.perf_counter() - start) / args.steps
    lines.append(f"steady: {per_step * 1e3:.2f} ms a step, {trainer.local_batch / per_step:,.0f} images/s")

    # Validation: the first compiles the evaluation model (with --compile on a GPU), the second is an epoch's.
    evals = []
    for _ in range(2):
        start = time.perf_counter()
        trainer.evaluate()
        sync(device)
        evals.append(time.perf_counter() - start)
    lines.append(f"validation of {len(trainer.val)} images: first {evals[0]:.2f} s (compilation included), then "
                 f"{evals[1]:.3f} s")

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiled = batches(trainer, args.steps, 3)
    with torch.profiler.profile(activities=activities) as profile:
        for idx in profiled:
            trainer.step(idx)
        sync(device)
    averages = profile.key_averages()
    by_name = {event.key: event for event in averages}
    kernels = sum(getattr(e, "self_device_time_total", 0.0) for e in averages
                  if str(getattr(e, "device_type", "")).endswith("CUDA"))
    lines.append(f"profiled: {args.steps} steps; device kernels {kernels / args.steps / 1e3:.2f} ms a step")
    lines.append(f"{'phase':<18} {'host ms/step':>13} {'device ms/step':>15}")
    for name in PHASES:
        event = by_name.get(name)
        if event is not None:
            lines.append(f"{name:<18} {event.cpu_time_total / args.steps / 1e3:>13.2f} "
                         f"{device_time_us(event) / args.steps / 1e3:>15.2f}")
    lines.append(averages.table(sort_by="cpu_time_total", row_limit=20))
    report = "\n".join(lines) + "\n"
    print(report, flush=True)
    if args.out:
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
