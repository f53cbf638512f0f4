"""Training throughput and model FLOP utilisation (MFU), data path included, on a GPU or the CPU.

    python bench/bench_gpu.py                                  # cifar-s, cifar-m, vit-base-16 on cuda or cpu
    python bench/bench_gpu.py --device cuda --compile --measure-peak
    python bench/bench_gpu.py --device cpu --models cifar-s --steps 3    # what CI and 2-core sessions run

Each model trains through ``vit.trainer.Trainer.step`` exactly as ``vit.train`` runs it: uint8
images on the device, crop/flip + TrivialAugment on the batch, normalisation, bf16 autocast on a
GPU, loss, backward, clipping, AdamW, schedule. CIFAR presets train on 32 px images (random
pixels, or the CIFAR-10 cache with ``--cifar DIR``), ViT-B/16 on synthetic 224 px images.

- images/s: timed steps after warm-up steps (which pay for allocation and compilation), between
  device synchronisations.
- FLOP per image: ``torch.utils.flop_counter.FlopCounterMode`` over one forward and backward
  (matrix products and attention; what MFU conventionally counts).
- MFU: FLOP per image x images/s / the GPU's dense bf16 peak (datasheet, table below, or
  ``--peak-tflops``); with ``--measure-peak`` also against an 8192^3 bf16 matrix product timed
  on the device, the ceiling reachable in practice. n/a on the CPU.

A second table compares the augmentation before and after its vectorisation side by side on the
same device: the previous path (reflect-pad + advanced-index crop, torchvision's
TrivialAugmentWide applied per group of 8 images), kept here as the baseline, against
``vit.data.BatchAugment``; per batch of 256 CIFAR images, with the number of tensor operations
each launches (each one a kernel launch on a GPU), and a cifar-s training step with each.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode
from torchvision.transforms import v2

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from vit.model import PRESETS, ViT, count_parameters  # noqa: E402
from vit.training.data import BatchAugment, Dataset, Split, channel_stats, load_dataset  # noqa: E402
from vit.training.options import parse_args, resolve_model, settings_from_args  # noqa: E402
from vit.training.trainer import Trainer  # noqa: E402

# Dense bf16 tensor-core peaks (no sparsity), TFLOP/s, from the vendors' datasheets; matched as
# substrings of torch.cuda.get_device_name, first match wins.
BF16_PEAK_TFLOPS = (
    ("H200", 989.4),  # SXM; the H100 SXM's tensor cores (NVIDIA H200 datasheet)
    ("H100 PCIe", 756.0),
    ("H100", 989.4),  # SXM / HBM3
    ("A100", 312.0),
    ("L40S", 362.1),
    ("L4", 121.0),
    ("A10G", 70.0),
)

# Per model on (GPU, CPU): batch, warm-up steps, timed steps. GPU batches are large enough to fill
# an H200 with the small CIFAR models; the CPU ones keep a 2-core run to seconds.
DEFAULTS = {"cifar-s": ((1024, 10, 40), (256, 1, 3)), "cifar-m": ((1024, 10, 40), (128, 1, 2)),
            "vit-base-16": ((256, 10, 30), (8, 1, 2))}


def peak_tflops(device: torch.device) -> tuple[str, float | None]:
    """(device name, dense bf16 peak in TFLOP/s or None when unknown or a CPU)."""
    if device.type != "cuda":
        return "CPU", None
    name = torch.cuda.get_device_name(device)
    for key, tflops in BF16_PEAK_TFLOPS:
        if key in name:
            return name, tflops
    return name, None


def measured_peak_tflops(device: torch.device, n: int = 8192, repeats: int = 10) -> float:
    """A large bf16 matrix product's rate on random data (METHOD.md: never on zeros), median of ``repeats``."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize(device)
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * n ** 3 / sorted(times)[len(times) // 2] / 1e12


def parse_model(spec: str) -> tuple[str, int | None]:
    """``PRESET`` or ``PRESET:pN`` (the preset with N-pixel patches, as ``vit.train --patch-size N``)."""
    preset, _, patch = spec.partition(":p")
    if preset not in PRESETS or (patch and not patch.isdigit()):
        raise SystemExit(f"unknown model {spec!r}: give a preset ({', '.join(PRESETS)}), optionally with :pN")
    return preset, int(patch) if patch else None


def model_config(spec: str):
    preset, patch = parse_model(spec)
    return replace(PRESETS[preset], patch_size=patch) if patch else PRESETS[preset]


def train_flops_per_image(spec: str, batch: int = 2) -> float:
    """FLOP of one forward and backward per image, counted on the CPU in fp32 (same count as bf16)."""
    model = ViT(model_config(spec))
    x = torch.randn(batch, model.config.num_channels, model.config.image_size, model.config.image_size)
    with FlopCounterMode(display=False) as counter:
        logits, _ = model(x)
        F.cross_entropy(logits, torch.zeros(batch, dtype=torch.long)).backward()
    return counter.get_total_flops() / batch


def synthetic_data(n: int, size: int, classes: int, seed: int = 0) -> Dataset:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, classes, (n,), generator=generator)
    split = Split(images, labels)
    mean, std = channel_stats(images[:1000])
    return Dataset("synthetic", [str(c) for c in range(classes)], split, Split(images[:64], labels[:64]),
                   mean, std, True)


def make_trainer(spec: str, data: Dataset, batch: int, device: torch.device, compile_: bool,
                 compile_mode: str) -> Trainer:
    preset, patch = parse_model(spec)
    argv = ["--dataset", "folder:unused", "--out", "unused", "--preset", preset, "--batch-size", str(batch),
            "--epochs", "1", "--device", str(device), "--compile-mode", compile_mode]
    argv += ["--patch-size", str(patch)] if patch else []
    args = parse_args(argv + (["--compile"] if compile_ else []), check_out=False)
    resolve_model(args, len(data.class_names))
    return Trainer(settings_from_args(args), data, run_dir=None, device=device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(trainer: Trainer, warmup: int, steps: int) -> float:
    """Images per second of ``steps`` training steps after ``warmup`` untimed ones."""
    device, batch = trainer.device, trainer.local_batch
    order = trainer.epoch_order(0).to(trainer.train.images.device)
    n = len(order) // batch
    trainer.net.train()
    for i in range(warmup):
        trainer.step(order[(i % n) * batch:(i % n + 1) * batch])
    _sync(device)
    start = time.perf_counter()
    for i in range(warmup, warmup + steps):
        trainer.step(order[(i % n) * batch:(i % n + 1) * batch])
    _sync(device)
    return steps * batch / (time.perf_counter() - start)


def ops_per_step(trainer: Trainer) -> int:
    """ATen operations of one eager training step (augmentation to EMA): each a kernel launch on a GPU."""
    batch = trainer.local_batch
    with OpCount() as count:
        trainer.step(trainer.epoch_order(0)[:batch].to(trainer.train.images.device))
    return count.count


# -- the augmentation before its vectorisation, kept as the baseline ---------------------------


def legacy_random_crop_flip(images: torch.Tensor, padding: int = 4) -> torch.Tensor:
    """vit.data.random_crop_flip before the vectorisation commit: a padded copy and advanced indexing."""
    B, C, H, W = images.shape
    device = images.device
    padded = F.pad(images.float(), (padding,) * 4, mode="reflect").to(images.dtype)
    dy = torch.randint(0, 2 * padding + 1, (B,), device=device)
    dx = torch.randint(0, 2 * padding + 1, (B,), device=device)
    rows = (dy[:, None] + torch.arange(H, device=device))[:, None, :, None]
    cols = (dx[:, None] + torch.arange(W, device=device))[:, None, None, :]
    batch = torch.arange(B, device=device)[:, None, None, None]
    channel = torch.arange(C, device=device)[None, :, None, None]
    out = padded[batch, channel, rows, cols]
    mask = torch.rand(B, device=device) < 0.5
    return torch.where(mask[:, None, None, None], out.flip(-1), out)


class LegacyTrivialAugment:
    """The previous BatchAugment("trivialaugment"): torchvision's op drawn once per group of 8 images."""

    def __init__(self, group: int = 8) -> None:
        self.op, self.group = v2.TrivialAugmentWide(), group

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        images = legacy_random_crop_flip(images)
        return torch.cat([self.op(chunk) for chunk in images.split(self.group)])


class OpCount(TorchDispatchMode):
    """Counts ATen operations: on a GPU each is (at least) one kernel launch."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def augmentation_table(device: torch.device, rounds: int, repeats: int, step_batch: int, steps: int) -> list[str]:
    """Before/after rows, measured in alternating rounds on one trainer (medians), so that a busy
    machine's drift hits both sides alike."""
    images = torch.randint(0, 256, (256, 3, 32, 32), dtype=torch.uint8, device=device)
    augments = {"before (groups of 8)": LegacyTrivialAugment(), "after (per image)": BatchAugment("trivialaugment")}
    trainer = make_trainer("cifar-s", synthetic_data(max(steps * step_batch, 1024), 32, 10), step_batch, device,
                           False, "default")
    order = trainer.epoch_order(0).to(trainer.train.images.device)
    trainer.net.train()
    ops, ms, rates = {}, {name: [] for name in augments}, {name: [] for name in augments}
    for name, augment in augments.items():
        with OpCount() as count:
            augment(images)
        ops[name] = count.count
        trainer.augment = augment
        trainer.step(order[:step_batch])  # warm-up
    for _ in range(rounds):
        for name, augment in augments.items():
            _sync(device)
            start = time.perf_counter()
            for _ in range(repeats):
                augment(images)
            _sync(device)
            ms[name].append((time.perf_counter() - start) / repeats * 1e3)
            trainer.augment = augment
            start = time.perf_counter()
            for i in range(steps):
                trainer.step(order[i * step_batch:(i + 1) * step_batch])
            _sync(device)
            rates[name].append(steps * step_batch / (time.perf_counter() - start))
    rows = [(name, ops[name], _median(ms[name]), _median(rates[name])) for name in augments]
    lines = [f"TrivialAugment + crop/flip on {device}: a batch of 256 32x32 images, and cifar-s training steps at "
             f"batch {step_batch} with each (medians of {rounds} alternating rounds)",
             f"{'augmentation':<22} {'ops':>6} {'ms/batch':>9} {'aug img/s':>10} {'step img/s':>11}"]
    lines += [f"{n:<22} {c:>6} {m:>9.2f} {256 / m * 1e3:>10.0f} {r:>11.1f}" for n, c, m, r in rows]
    (_, c0, m0, r0), (_, c1, m1, r1) = rows
    lines.append(f"{'after / before':<22} {c1 / c0:>6.2f} {m1 / m0:>9.2f} {m0 / m1:>10.2f} {r1 / r0:>11.2f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default="cifar-s,cifar-m,vit-base-16",
                        help="comma-separated presets, each optionally PRESET:pN for N-pixel patches")
    parser.add_argument("--batch", type=int, help="batch size for every model (default: per model and device)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default: per model and device)")
    parser.add_argument("--steps", type=int, help="timed steps (default: per model and device)")
    parser.add_argument("--compile", action="store_true", help="train with --compile")
    parser.add_argument("--compile-mode", default="default", choices=("default", "reduce-overhead", "max-autotune"))
    parser.add_argument("--cifar", metavar="DIR", help="CIFAR-10 image folder (<class>/<image>) for the 32 px "
                        "models, decoded once into --cache-dir; default: random pixels")
    parser.add_argument("--cache-dir", default="data/cache")
    parser.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak (default: the table)")
    parser.add_argument("--measure-peak", action="store_true", help="also time a bf16 8192^3 matrix product")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--skip-augmentation", action="store_true", help="leave out the before/after table")
    parser.add_argument("--json", metavar="FILE", help="also write each model's row as JSON lines to FILE")
    args = parser.parse_args(argv)
    for spec in args.models.split(","):
        parse_model(spec)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    name, peak = peak_tflops(device)
    peak = args.peak_tflops or peak
    measured = measured_peak_tflops(device) if args.measure_peak and device.type == "cuda" else None
    print(f"device: {name}; dense bf16 peak: {f'{peak:.0f} TFLOP/s' if peak else 'n/a'}"
          + (f"; measured bf16 matmul: {measured:.0f} TFLOP/s" if measured else "")
          + f"; torch {torch.__version__}; compile: {args.compile_mode if args.compile else 'off'}")

    cifar = None
    if args.cifar:
        cifar = load_dataset(f"folder:{args.cifar}", 32, 3, cache_dir=args.cache_dir)
    header = (f"{'model':<12} {'params':>8} {'px':>4} {'batch':>6} {'ops/step':>9} {'GFLOP/img':>10} {'img/s':>9} "
              f"{'s/50k img':>10} {'TFLOP/s':>8} {'MFU':>6}" + (f" {'MFU(meas)':>10}" if measured else ""))
    lines = [header]
    for preset in args.models.split(","):
        config = model_config(preset)
        (batch, warmup, steps) = DEFAULTS.get(parse_model(preset)[0], ((256, 10, 30), (8, 1, 2)))[device.type != "cuda"]
        batch, warmup, steps = args.batch or batch, args.warmup or warmup, args.steps or steps
        if config.image_size == 32 and cifar is not None:
            data = cifar
        else:
            data = synthetic_data(max(2 * batch, 64), config.image_size, 10)
        trainer = make_trainer(preset, data, batch, device, args.compile, args.compile_mode)
        rate = time_steps(trainer, warmup, steps)
        ops = "-" if args.compile else str(ops_per_step(trainer))  # a dispatch mode would undo compilation
        flops = train_flops_per_image(preset)
        achieved = flops * rate / 1e12
        mfu = f"{achieved / peak:6.1%}" if peak else f"{'n/a':>6}"
        line = (f"{preset:<12} {count_parameters(trainer.model) / 1e6:>7.2f}M {config.image_size:>4} {batch:>6} "
                f"{ops:>9} {flops / 1e9:>10.3f} {rate:>9.1f} {50_000 / rate:>10.1f} {achieved:>8.2f} {mfu}")
        if measured:
            line += f" {achieved / measured:>10.1%}"
        lines.append(line)
        print(line, flush=True)
        if args.json:
            row = {"model": preset, "params": count_parameters(trainer.model), "image_size": config.image_size,
                   "batch": batch, "compile": args.compile_mode if args.compile else None,
                   "flops_per_image": flops, "images_per_s": rate, "tflops": achieved,
                   "mfu": achieved / peak if peak else None, "mfu_measured": achieved / measured if measured else None,
                   "device": name, "measured_peak_tflops": measured, "torch": torch.__version__}
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
        del trainer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print()
    print("\n".join(lines))
    if not args.skip_augmentation:
        print()
        on_gpu = device.type == "cuda"
        print("\n".join(augmentation_table(device, rounds=5, repeats=20 if on_gpu else 5,
                                           step_batch=256 if on_gpu else 64, steps=20 if on_gpu else 3)))


if __name__ == "__main__":
    main()
