"""Train a ViT: ``python -m vit.train --dataset cifar10 --preset cifar-s --out runs/NAME``.

Every run lives in its own folder, written atomically so any file survives a SIGKILL:
``config.json`` (arguments, model, dataset), ``metrics.jsonl`` (one line per epoch),
``status.json`` (state and a heartbeat), ``last.pt`` / ``best.pt`` (checkpoints with
class names and preprocessing) and ``train.log``. ``--resume RUN_DIR`` continues from
``last.pt``; SIGTERM/SIGINT stop after the current step as ``cancelled``. Under
``torchrun`` it trains with DistributedDataParallel and only rank 0 writes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import logging.handlers
import math
import os
import signal
import socket
import sys
import threading
from dataclasses import fields
from pathlib import Path

import torch

from vit.checkpoint import CheckpointError, read_checkpoint_payload
from vit.data import (
    AUGMENTATIONS,
    MAX_MAGNITUDE,
    DataError,
    Dataset,
    folder_layout,
    load_dataset,
    parse_dataset,
)
from vit.distributed import close_distributed, init_distributed, main_rank_first, parse_device, rank_device
from vit.model import PRESETS, ViTConfig, count_parameters
from vit.runfiles import (
    CONFIG_FILE,
    LAST_CHECKPOINT,
    LOG_FILE,
    METRICS_FILE,
    STALE_SECONDS,
    STATUS_FILE,
    Status,
    append_traceback,
    now_iso,
    read_json,
    record_resume,
    remove_stray_temp_files,
    seconds_since,
    write_json,
    write_metrics,
)
from vit.trainer import StopRequest, Trainer, TrainSettings, UsageError, hardware

log = logging.getLogger("vit.train")


# What "--recipe" fills in for every option left unset on the command line.
RECIPES: dict[str, dict] = {
    # Ours: AdamW, warmup + cosine, label smoothing, clipping, crop/flip + TrivialAugment.
    "ours": dict(epochs=100, batch_size=256, lr=2e-3, min_lr=1e-5, weight_decay=0.05, warmup_epochs=5,
                 schedule="cosine", label_smoothing=0.1, grad_clip=1.0, ema=0.0, augment="trivialaugment",
                 mixup=0.0, cutmix=0.0),
    # The seed blog's: AdamW 1e-2, wd 1e-2, constant lr, batch 256, flip + RandomResizedCrop 0.8-1.0.
    "seed": dict(epochs=100, batch_size=256, lr=1e-2, min_lr=0.0, weight_decay=1e-2, warmup_epochs=0,
                 schedule="constant", label_smoothing=0.0, grad_clip=0.0, ema=0.0, augment="seed",
                 mixup=0.0, cutmix=0.0),
}
MODEL_FIELDS = ("image_size", "patch_size", "hidden_size", "num_layers", "num_heads", "mlp_size",
                "dropout", "attention_dropout", "drop_path")
# The only options a resumed run may change: how and where it runs, never what it trains.
RESUME_OPTIONS = ("epochs", "device", "threads", "compile", "compile_mode", "sync_every", "checkpoint_seconds",
                  "eval_batch_size", "log_every", "data_dir", "cache_dir", "attention_every", "save_every", "keep")

EPILOG = """\
run folder (--out RUN_DIR); each file is replaced atomically (train.log is appended to), so a SIGKILL
leaves every one readable:
  config.json    every argument, the model config, the dataset and its class names
  metrics.jsonl  one line per epoch: epoch, train_loss, train_acc, val_loss, val_acc, lr,
                 epoch_seconds, images_per_second
  status.json    state (running, completed, failed, cancelled), epoch, step, total_epochs,
                 total_steps, progress (0-1), pid, host, start_time, updated_time (a heartbeat
                 every 5 s while running), eta_seconds, elapsed_seconds, best_val_acc, error
  last.pt        the latest weights with optimizer, schedule position, EMA and RNG state
  best.pt        the weights with the best validation accuracy so far
  train.log      the log, with the traceback when training failed
  probe/         the attention snapshots' probe set: 8 validation images (stratified, fixed by
                 --seed) as PNGs, and probe.json (their labels, and the 256 validation images
                 behind the head statistics)
  attention/     epoch_0003.npz ...: per snapshotted epoch (0 = the initial weights) the probe
                 images' logits, every layer's and head's CLS attention over the patches, the
                 rollout map, and each head's mean attention distance and entropy (see
                 vit/snapshots.py); readable while the run writes
  checkpoints/   epoch_0003.pt ...: with --save-every N, the weights of every Nth epoch in the
                 usual checkpoint format (no training state); --keep K keeps the K most recent
                 and the best epoch's

data: each dataset is decoded once into a uint8 tensor cache (--cache-dir) that later runs
  reuse; augmentation runs on whole batches of tensors (on the GPU when training there).
  Greyscale data for a 3-channel model is expanded, every image resized to the model's size.

stopping and resuming:
  SIGTERM or Ctrl-C finishes the current step, saves last.pt and marks the run cancelled.
  --resume RUN_DIR continues from last.pt exactly where it stopped (weights, optimizer,
  schedule, EMA, random state, epoch and step). With --epochs N it trains a finished run
  further; the learning-rate schedule is then planned for N epochs. Only --epochs, --device,
  --threads, --compile, --compile-mode, --sync-every, --checkpoint-seconds, --eval-batch-size,
  --log-every, --data-dir, --cache-dir, --attention-every, --save-every and --keep may be
  given with --resume; everything else stays the run's own. last.pt is written at most every
  --checkpoint-seconds at epoch ends, so a SIGKILL (not SIGTERM) loses at most that much
  training. Attention snapshots continue exactly: epochs trained again after a SIGKILL rewrite
  theirs with the same values, and an epoch whose snapshot a kill cut off is taken again.

several GPUs (or CPU processes):
  torchrun --standalone --nproc_per_node=N -m vit.train ...
  NCCL on GPUs, gloo on CPUs; --batch-size is the global batch, split over the processes
  (with --scale-batch each process takes --batch-size and the learning rates grow by sqrt(N));
  each process trains on its own shard of every batch; only rank 0 writes the run folder.

exit status: 0 completed or cancelled; 1 training failed (status.json says why);
  2 invalid arguments or unusable data (reported before anything is written);
  128 + the signal number when stopped before training started.

environment: VIT_TRAIN_FAULT_AT_STEP=N raises an error at step N (to test failure handling).
"""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints usage + error; we want one line
        raise UsageError(message)


def _checked(convert, accept, expected: str, not_a_number: str | None = None):
    """An argparse type: ``convert`` the text, then ``accept`` the value, else 'expected …, got …'."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {not_a_number or expected}, got {text!r}") from None
        if not accept(value):  # comparisons are also false for NaN
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return parse


def _int_in(low: int, high: int):
    return _checked(int, lambda v: low <= v <= high, f"an integer in {low}..{high}")


def _float_in(low: float, high: float):
    return _checked(float, lambda v: low <= v < high, f"a number in [{low:g}, {high:g})", "a number")


_positive_int = _checked(int, lambda v: v > 0, "a positive integer")
_non_negative_int = _checked(int, lambda v: v >= 0, "an integer >= 0")
_positive_float = _checked(float, lambda v: v > 0 and not math.isinf(v), "a positive number")

# torch's thread pools crash far above this (--threads 100000 segfaulted); more threads than cores only slow down.
MAX_THREADS = 4 * (os.cpu_count() or 1)
MAX_LR = 10.0  # AdamW diverges long before; 1e300 used to pass

_learning_rate = _checked(float, lambda v: 0 < v <= MAX_LR, f"a positive number of at most {MAX_LR:g}",
                          "a positive number")


def _threads(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_THREADS} threads (4 per CPU core of this machine), "
                                         f"got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m vit.train", description=__doc__, epilog=EPILOG,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("run")
    g.add_argument("--dataset", help="cifar10, cifar100, mnist, fashion-mnist (torchvision's, downloaded into "
                   "DATA_DIR/<name> on a connected machine) or folder:PATH (PATH/train/<class>/<image> with "
                   "optional PATH/val/<class>/<image>, or PATH/<class>/<image>); class names come from the "
                   "dataset. Required for a new run")
    g.add_argument("--out", metavar="RUN_DIR", help="run folder to create; it must not exist or be empty. "
                   "Required for a new run")
    g.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last.pt; "
                   "with --epochs N, train it to N epochs in total")
    g.add_argument("--data-dir", default="data", help="where torchvision datasets live (default: data)")
    g.add_argument("--cache-dir", help="where decoded uint8 dataset caches go (default: DATA_DIR/cache)")
    g.add_argument("--val-fraction", type=_float_in(0.0, 1.0), default=0.1,
                   help="share of each class held out for validation when a folder dataset has no val/ "
                   "folder (default 0.1; the split is stratified and fixed by --seed)")
    g.add_argument("--device", default="auto", help="auto (CUDA when available, default), cpu, cuda or "
                   "cuda:N; under torchrun each process takes the GPU of its local rank")
    g.add_argument("--seed", type=_non_negative_int, default=0,
                   help="seed for initialisation, validation split, data order and augmentation (default 0)")

    g = p.add_argument_group("model (a preset, optionally with fields changed)")
    g.add_argument("--preset", default="tintn-cifar10", help=f"one of: {', '.join(PRESETS)} "
                   "(default tintn-cifar10). The number of classes follows the dataset, the number of "
                   "channels the preset (greyscale images are expanded for a 3-channel model)")
    g.add_argument("--init", metavar="FILE_OR_FOLDER", help="fine-tune a model you have instead of a preset: one "
                   "of our .pt checkpoints, a Hugging Face or timm folder, or timm / torchvision weights (see "
                   "vit.convert). Its classifier is kept when the dataset has its classes, else replaced; images "
                   "are normalised with its own mean and std. Only --image-size and the dropout rates may change")
    g.add_argument("--image-size", type=_positive_int, help="input side in pixels; images are resized to it")
    g.add_argument("--patch-size", type=_positive_int, help="patch side in pixels; must divide --image-size")
    g.add_argument("--hidden-size", type=_positive_int, help="token width; must be divisible by --num-heads")
    g.add_argument("--num-layers", type=_positive_int, help="encoder blocks")
    g.add_argument("--num-heads", type=_positive_int, help="attention heads per block")
    g.add_argument("--mlp-size", type=_positive_int, help="MLP hidden width")
    g.add_argument("--dropout", type=_float_in(0.0, 1.0), help="dropout rate after embeddings, attention "
                   "projection and MLP, in [0, 1)")
    g.add_argument("--attention-dropout", type=_float_in(0.0, 1.0),
                   help="dropout on the attention probabilities, in [0, 1)")
    g.add_argument("--drop-path", type=_float_in(0.0, 1.0), help="stochastic depth rate of the last block "
                   "(linear from 0 at the first), in [0, 1)")

    g = p.add_argument_group("recipe (options left unset take the --recipe's value)")
    g.add_argument("--recipe", choices=tuple(RECIPES), default="ours",
                   help="ours (default: AdamW, linear warmup then cosine, label smoothing, gradient "
                   "clipping, crop + flip + TrivialAugment) or seed (the seed blog's AdamW lr 1e-2, "
                   "wd 1e-2, constant lr, batch 256, flip + RandomResizedCrop 0.8-1.0)")
    g.add_argument("--epochs", type=_positive_int, help="epochs to train in total (ours and seed: 100)")
    g.add_argument("--batch-size", type=_positive_int, help="global batch size (256); at most the number of "
                   "training images")
    g.add_argument("--lr", type=_learning_rate, help=f"peak learning rate (ours 2e-3, seed 1e-2; at most {MAX_LR:g})")
    g.add_argument("--min-lr", type=_float_in(0.0, 1.0),
                   help="learning rate at the end of the cosine (ours 1e-5); at most --lr")
    g.add_argument("--weight-decay", type=_float_in(0.0, 10.0),
                   help="AdamW weight decay (ours 0.05, not applied to biases, norms, CLS token and "
                   "positions; seed 0.01 on every parameter, as the blog)")
    g.add_argument("--warmup-epochs", type=_float_in(0.0, 1e6),
                   help="linear warmup in epochs, may be fractional (ours: 5, but at most a tenth of --epochs)")
    g.add_argument("--schedule", choices=("cosine", "constant"),
                   help="learning rate after warmup (ours cosine, seed constant)")
    g.add_argument("--label-smoothing", type=_float_in(0.0, 1.0), help="label smoothing (ours 0.1, seed 0)")
    g.add_argument("--grad-clip", type=_float_in(0.0, 1e6),
                   help="max gradient norm, 0 = off (ours 1.0, seed 0)")
    g.add_argument("--ema", type=_float_in(0.0, 1.0), help="EMA decay of the weights per step, 0 = off "
                   "(default); validation and checkpoints then use the EMA weights")
    g.add_argument("--augment", choices=AUGMENTATIONS,
                   help="training augmentation on batches: none; crop (reflect-pad 4 px, random crop: for "
                   "digits and text); flip-crop (crop + horizontal flip); trivialaugment or randaugment "
                   "(torchvision's, after flip-crop); seed (flip + RandomResizedCrop 0.8-1.0). "
                   "Ours trivialaugment, seed seed")
    g.add_argument("--aug-magnitude", type=_int_in(0, MAX_MAGNITUDE), default=9,
                   help=f"RandAugment magnitude, 0..{MAX_MAGNITUDE} (default 9)")
    g.add_argument("--aug-ops", type=_positive_int, default=2, help="RandAugment ops per image (default 2)")
    g.add_argument("--mixup", type=_float_in(0.0, 1e3), help="mixup alpha, 0 = off (default)")
    g.add_argument("--cutmix", type=_float_in(0.0, 1e3), help="cutmix alpha, 0 = off (default); with "
                   "--mixup too, each batch uses one of the two")

    g = p.add_argument_group("attention snapshots and per-epoch checkpoints")
    g.add_argument("--attention-every", type=_non_negative_int, default=1, metavar="N",
                   help="record the probe images' attention maps and every head's mean attention distance and "
                   "entropy every N epochs, at the last epoch and before training (default 1; 0 = off); "
                   "see attention/ below")
    g.add_argument("--save-every", type=_non_negative_int, default=0, metavar="N",
                   help="also keep the weights of every Nth epoch as checkpoints/epoch_NNNN.pt, to compare "
                   "epochs in the explorer (default 0 = off)")
    g.add_argument("--keep", type=_non_negative_int, default=0, metavar="K",
                   help="with --save-every: keep only the K most recent epoch checkpoints plus the best "
                   "epoch's (default 0 = keep all)")

    g = p.add_argument_group("speed")
    g.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="auto (default): bf16 autocast on CUDA, fp32 on CPU")
    g.add_argument("--compile", action="store_true", help="torch.compile the model, and on a GPU the augmentation "
                   "and validation too (slow first steps)")
    g.add_argument("--compile-mode", choices=("default", "reduce-overhead", "max-autotune"), default="default",
                   help="torch.compile's mode with --compile (default: default); reduce-overhead replays the "
                   "model's forward and backward as CUDA graphs on a GPU")
    g.add_argument("--scale-batch", action="store_true", help="under N processes (torchrun), train N x "
                   "--batch-size images per step, each process keeping --batch-size, with the learning rates "
                   "x sqrt(N) (the square-root rule for Adam); without it --batch-size is split over them")
    g.add_argument("--sync-every", type=_non_negative_int, default=0,
                   help="steps between host syncs of the loss and accuracy (and, under several processes, "
                   "of stop signals); 0 (default): every step on the CPU, 32 on a GPU")
    g.add_argument("--checkpoint-seconds", type=_float_in(0.0, 1e9), default=60.0,
                   help="write last.pt at an epoch end at most this often (default 60; 0 = every epoch); "
                   "always after the first and last epoch and when stopped")
    g.add_argument("--threads", type=_threads, help="CPU threads per process (default: torch's choice; at most "
                   f"{MAX_THREADS}, 4 per core)")
    g.add_argument("--eval-batch-size", type=_positive_int, default=500,
                   help="batch size for validation (default 500)")
    g.add_argument("--log-every", type=_positive_float, default=30.0,
                   help="seconds between progress lines when not on a terminal (default 30); on a "
                   "terminal a progress bar shows instead")
    return p


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def given_options(argv: list[str]) -> set[str]:
    """The destinations of the options written on the command line (not left to defaults)."""
    parser = build_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))


def parse_args(argv: list[str] | None = None, check_out: bool = True) -> argparse.Namespace:
    """Parse and check everything that can be checked without the data; raises UsageError.

    ``check_out`` is False on the ranks other than 0 of a distributed run, which never write.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.compile_mode != "default" and not args.compile:
        raise UsageError(f"--compile-mode {args.compile_mode} needs --compile")
    if args.resume:
        fixed = sorted(given_options(argv) - set(RESUME_OPTIONS) - {"resume"})
        if fixed:
            raise UsageError(f"{', '.join(_flag(name) for name in fixed)} cannot change when resuming: a "
                             f"resumed run keeps its own settings; with --resume only "
                             f"{', '.join(_flag(name) for name in RESUME_OPTIONS)} may be given")
        return args
    if not args.dataset:
        raise UsageError("--dataset is required (or --resume RUN_DIR)")
    if not args.out:
        raise UsageError("--out RUN_DIR is required (or --resume RUN_DIR)")
    explicit_warmup = args.warmup_epochs is not None
    for key, value in RECIPES[args.recipe].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if not explicit_warmup:  # short runs get a proportionally short warmup
        args.warmup_epochs = min(args.warmup_epochs, args.epochs / 10)
    if args.init:
        fixed = sorted(given_options(argv) & {"preset", "patch_size", "hidden_size", "num_layers", "num_heads",
                                              "mlp_size"})
        if fixed:
            raise UsageError(f"{', '.join(_flag(name) for name in fixed)} cannot be given with --init: the model "
                             "is the one you start from (only --image-size and the dropout rates may change)")
    elif args.preset not in PRESETS:
        raise UsageError(f"unknown preset {args.preset!r}; choose one of: {', '.join(PRESETS)}")
    try:
        parse_dataset(args.dataset)
        if not args.init:
            model_config(args, num_channels=PRESETS[args.preset].num_channels,
                         num_classes=PRESETS[args.preset].num_classes)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.warmup_epochs >= args.epochs and args.warmup_epochs > 0:
        raise UsageError(f"--warmup-epochs ({args.warmup_epochs:g}) must be below --epochs ({args.epochs})")
    if args.min_lr > args.lr:
        raise UsageError(f"--min-lr ({args.min_lr:g}) must not exceed --lr ({args.lr:g})")
    if check_out:
        _check_out(Path(args.out))
    parse_device(args.device)
    return args


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder for the run")
    if out.is_dir() and any(out.iterdir()):
        raise UsageError(f"{out} already holds files; continue it with --resume {out} or choose another --out")
    existing = next(p for p in (out, *out.absolute().parents) if p.exists())
    if not os.access(existing, os.W_OK):
        raise UsageError(f"cannot create the run folder {out}: {existing} is not writable")


def model_config(args: argparse.Namespace, num_channels: int, num_classes: int) -> ViTConfig:
    overrides = {k: getattr(args, k) for k in MODEL_FIELDS if getattr(args, k) is not None}
    return ViTConfig.from_preset(args.preset, num_channels=num_channels, num_classes=num_classes, **overrides)


def resolve_model(args: argparse.Namespace, num_classes: int, class_names: list[str] | None = None) -> ViTConfig:
    """Fix the model of a new run: the preset's channels, the dataset's classes, the overrides;
    with ``--init`` the imported model's (its classifier replaced when the classes differ)."""
    args.num_classes = num_classes
    if getattr(args, "init", None):
        return _resolve_init(args, num_classes, class_names)
    args.channels = PRESETS[args.preset].num_channels
    config = model_config(args, num_channels=args.channels, num_classes=num_classes)
    args.model = config.to_dict()
    args.image_size_resolved = config.image_size
    return config


def _resolve_init(args: argparse.Namespace, num_classes: int, class_names: list[str] | None) -> ViTConfig:
    from vit.finetune import prepare_init  # opens HF / timm / torchvision sources only when asked

    try:
        init = prepare_init(args.init, num_classes, class_names, args.image_size)
        dropouts = {k: getattr(args, k) for k in ("dropout", "attention_dropout", "drop_path")
                    if getattr(args, k) is not None}
        config = ViTConfig.from_dict({**init.config.to_dict(), **dropouts})
    except (CheckpointError, ValueError) as e:
        raise UsageError(f"--init {args.init}: {e}") from None
    args.preset = f"init:{Path(args.init).name}"
    args.channels = config.num_channels
    args.init_mean, args.init_std = list(init.mean), list(init.std)
    args.model = config.to_dict()
    args.image_size_resolved = config.image_size
    return config


def settings_from_args(args: argparse.Namespace) -> TrainSettings:
    """The Trainer's settings from parsed (and for a new run, resolved) arguments."""
    values = {f.name: getattr(args, f.name) for f in fields(TrainSettings)}
    return TrainSettings(**{**values, "model": ViTConfig.from_dict(args.model)})


def load_run_data(args: argparse.Namespace, rank: int = 0, world: int = 1) -> Dataset:
    """The run's dataset. Under several processes rank 0 decodes and caches it first, then the
    others read that cache instead of all decoding at once."""
    with main_rank_first(rank, world):
        data = load_dataset(args.dataset, args.image_size_resolved, args.channels, data_dir=args.data_dir,
                            cache_dir=args.cache_dir, val_fraction=args.val_fraction, seed=args.seed)
    if getattr(args, "init_mean", None):  # an imported model keeps the normalisation its weights were trained with
        data = dataclasses.replace(data, mean=tuple(args.init_mean), std=tuple(args.init_std))
    return data


# ---------------------------------------------------------------------------------------------
# Resuming


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _check_not_running(run_dir: Path) -> None:
    """Refuse to resume a run whose process still beats (it would overwrite its files)."""
    status = read_json(run_dir / STATUS_FILE)
    if status is None or status.get("state") != "running":
        return
    age = seconds_since(status.get("updated_time"))
    if age is None or age > STALE_SECONDS:
        return
    pid, host = status.get("pid"), status.get("host")
    if host == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid):
        return
    raise UsageError(f"{run_dir} is still running (pid {pid} on {host}, heartbeat {age:.0f} s ago); "
                     "stop it first (SIGTERM) or wait for it to end")


# ---------------------------------------------------------------------------------------------
# Entry point


def _prepare(args: argparse.Namespace, argv: list[str]) -> tuple[argparse.Namespace, Path, dict | None]:
    """Resolve a new run's or a resumed run's arguments; nothing is written yet."""
    if args.resume:
        return _prepare_resume(args, argv)
    run_dir = Path(args.out)
    try:
        kind, value = parse_dataset(args.dataset)
        if kind == "folder":
            _, val_root, class_names = folder_layout(value)
            if val_root is None and not 0 < args.val_fraction < 1:
                raise UsageError(f"{value} has no val/ folder, so --val-fraction must be above 0 "
                                 f"(got {args.val_fraction:g})")
            num_classes = len(class_names)
        else:
            num_classes, class_names = _builtin_classes(value), None
    except DataError as e:
        raise UsageError(str(e)) from None
    resolve_model(args, num_classes, class_names)
    return args, run_dir, None


def _prepare_resume(args: argparse.Namespace, argv: list[str]) -> tuple[argparse.Namespace, Path, dict]:
    run_dir = Path(args.resume)
    config_file = run_dir / CONFIG_FILE
    if not config_file.is_file():
        raise UsageError(f"{run_dir} is not a run folder (no config.json); give the --out of an earlier run")
    try:
        stored = dict(json.loads(config_file.read_text())["args"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{config_file} cannot be read ({type(e).__name__}); the run cannot be resumed") from None
    missing = [k for k in ("dataset", "preset", "recipe", "num_classes", "channels", "model",
                           "image_size_resolved") if k not in stored]
    if missing:
        raise UsageError(f"{config_file} lacks {', '.join(missing)}; it was not written by this program")
    _check_not_running(run_dir)
    # Options added after the run was made take their defaults (or the run's recipe's value).
    defaults = {a.dest: a.default for a in build_parser()._actions if a.dest != "help"}
    merged = {**defaults, **RECIPES.get(stored["recipe"], {}), **stored}
    for name in given_options(argv) & set(RESUME_OPTIONS):
        merged[name] = getattr(args, name)
    args = argparse.Namespace(**merged)
    last = run_dir / LAST_CHECKPOINT
    if not last.is_file():
        raise UsageError(f"{run_dir} has no last.pt to resume from (it stopped before saving one); start it "
                         "again with --out")
    try:
        payload = read_checkpoint_payload(last)
    except CheckpointError as e:
        raise UsageError(str(e)) from None
    state = payload.get("training_state")
    if not isinstance(state, dict) or "progress" not in state:
        raise UsageError(f"{last} holds no training state; it cannot be resumed")
    done = state["progress"].get("epoch", 0)
    if done >= args.epochs:
        raise UsageError(f"{run_dir} has already trained {done} of {args.epochs} epochs; pass --epochs N with "
                         f"N > {done} to train it further")
    parse_device(args.device)
    return args, run_dir, payload


def _builtin_classes(name: str) -> int:
    return 100 if name == "cifar100" else 10


def _setup_logging(is_main: bool) -> tuple[logging.Logger, logging.handlers.MemoryHandler]:
    """Log lines of the ``vit`` package to stdout, and keep them until train.log exists."""
    logger = logging.getLogger("vit")
    _close_logging(logger)
    logger.setLevel(logging.INFO if is_main else logging.WARNING)
    logger.propagate = False
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(_LOG_FORMAT)
    buffer = logging.handlers.MemoryHandler(capacity=1_000_000, flushLevel=logging.CRITICAL + 1)
    logger.addHandler(console)
    logger.addHandler(buffer)
    return logger, buffer


_LOG_FORMAT = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S")


def _close_logging(logger: logging.Logger) -> None:
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()


def _open_run(args: argparse.Namespace, argv: list[str], run_dir: Path, trainer: Trainer, resumed: bool,
              logger: logging.Logger, buffer: logging.handlers.MemoryHandler) -> Status:
    """Create (or reopen) the run folder once everything is ready: train.log with the setup's
    log lines, config.json, metrics.jsonl and a running status.json with its heartbeat."""
    created = False
    if not resumed:
        _check_out(run_dir)
        created = not run_dir.exists()
        run_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for stray in remove_stray_temp_files(run_dir):  # a killed session's half-written files; nothing else writes here
        log.info("removed %s, left by an interrupted write", stray.name)
    try:
        file = logging.FileHandler(run_dir / LOG_FILE)
        written.append(run_dir / LOG_FILE)
        file.setFormatter(_LOG_FORMAT)
        buffer.setTarget(file)
        buffer.flush()
        logger.removeHandler(buffer)
        logger.addHandler(file)
        p = trainer.progress
        if resumed:
            _record_resume(run_dir / CONFIG_FILE, args, argv, trainer)
            write_metrics(run_dir / METRICS_FILE, trainer.metrics)
        else:
            written.append(run_dir / CONFIG_FILE)
            write_json(run_dir / CONFIG_FILE, _config_record(args, argv, trainer))
        written.append(run_dir / STATUS_FILE)
        status = Status(run_dir / STATUS_FILE, {
            "state": "running", "epoch": p.epoch, "step": p.global_step, "total_epochs": args.epochs,
            "total_steps": trainer.total_steps, "progress": round(p.global_step / trainer.total_steps, 5),
            "pid": os.getpid(), "host": socket.gethostname(), "start_time": now_iso(), "eta_seconds": None,
            "elapsed_seconds": round(p.elapsed, 3), "best_val_acc": p.best_val_acc if p.best_val_acc >= 0 else None,
            "device": str(trainer.device), "world_size": trainer.world, "error": None})
        status.start()
    except BaseException:
        if not resumed:  # leave no half-made run behind
            _close_logging(logger)
            for path in written:
                path.unlink(missing_ok=True)
            if created:
                with contextlib.suppress(OSError):
                    run_dir.rmdir()
        raise
    log.info("%s run %s: %s, %d parameters, %d train / %d val images, %d classes, %d steps on %s",
             "resuming" if resumed else "starting", run_dir, args.preset, count_parameters(trainer.model),
             len(trainer.data.train), len(trainer.data.val), len(trainer.data.class_names), trainer.total_steps,
             hardware(trainer.device, trainer.world))
    if resumed:
        log.info("continuing at epoch %d step %d of %d epochs", p.epoch + 1, p.step_in_epoch, args.epochs)
    return status


def _config_record(args: argparse.Namespace, argv: list[str], trainer: Trainer) -> dict:
    data = trainer.data
    return {"args": vars(args), "model": trainer.config.to_dict(), "parameters": count_parameters(trainer.model),
            "dataset": {"name": args.dataset, "class_names": data.class_names, "train_size": len(data.train),
                        "val_size": len(data.val), "mean": list(data.mean), "std": list(data.std),
                        "from_cache": data.from_cache},
            "world_size": trainer.world, "device": str(trainer.device), "created": now_iso(),
            "command": [sys.executable, "-m", "vit.train", *argv]}


def _record_resume(config_file: Path, args: argparse.Namespace, argv: list[str], trainer: Trainer) -> None:
    """config.json keeps the run's arguments current (the new --epochs) and lists every resume."""
    record_resume(config_file, {name: getattr(args, name) for name in RESUME_OPTIONS}, {
        "time": now_iso(), "command": [sys.executable, "-m", "vit.train", *argv],
        "from_epoch": trainer.progress.epoch, "from_step": trainer.progress.global_step,
        "world_size": trainer.world, "device": str(trainer.device)})


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def _usage_error(error: Exception) -> int:
    print(f"vit.train: error: {error}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit status (see ``--help``)."""
    argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
    is_main = int(os.environ.get("RANK", "0")) == 0
    try:
        args = parse_args(argv, check_out=is_main)
        args, run_dir, payload = _prepare(args, argv)
    except UsageError as e:
        return _usage_error(e)
    resumed = payload is not None
    logger, buffer = _setup_logging(is_main)
    stop = StopRequest()
    previous_handlers = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous_handlers[sig] = signal.signal(sig, stop)
    status: Status | None = None
    try:
        try:
            rank, world = init_distributed(args.device)
            device = parse_device(args.device) if world == 1 else rank_device(args.device)
            if args.threads:
                torch.set_num_threads(args.threads)
            data = load_run_data(args, rank, world)
            trainer = Trainer(settings_from_args(args), data, run_dir, payload, rank, world, device, stop)
            stop.armed = True
            if is_main:
                status = _open_run(args, argv, run_dir, trainer, resumed, logger, buffer)
        except (UsageError, DataError, CheckpointError) as e:
            return _usage_error(e)
        except KeyboardInterrupt:
            signum = stop.signum or signal.SIGINT
            print(f"vit.train: stopped by {signal.Signals(signum).name} before training started; "
                  f"{'the run is unchanged' if resumed else 'nothing was written'}", file=sys.stderr)
            return 128 + signum
        except Exception as e:
            if resumed and is_main:
                append_traceback(run_dir)
            print(f"vit.train: failed before training started: {_one_line(e)}", file=sys.stderr)
            return 1
        try:
            state = trainer.fit(status)
        except Exception as e:
            message = _one_line(e)
            if is_main:
                log.error("training failed: %s", message)
                append_traceback(run_dir)
                status.close()
                status.update(state="failed", error=message, eta_seconds=None)
            print(f"vit.train: failed: {message} (details in {run_dir / 'train.log'})", file=sys.stderr)
            return 1
        if status is not None:
            status.close()
            p = trainer.progress
            status.update(state=state, eta_seconds=0 if state == "completed" else None, epoch=p.epoch,
                          step=p.global_step, progress=round(p.global_step / trainer.total_steps, 5),
                          elapsed_seconds=round(p.elapsed, 3),
                          best_val_acc=p.best_val_acc if p.best_val_acc >= 0 else None)
            how = ""
            if state == "cancelled":  # under torchrun the signal may have reached another rank only
                how = f" by {signal.Signals(stop.signum).name}" if stop.requested else " by another process's signal"
            log.info("run %s %s%s after %d epochs (step %d); best val_acc %s", run_dir, state, how, p.epoch,
                     p.global_step,
                     f"{p.best_val_acc:.4f}" if p.best_val_acc >= 0 else "none yet")
        return 0
    finally:
        if status is not None:
            status.close()
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        _close_logging(logger)
        close_distributed()


if __name__ == "__main__":
    sys.exit(main())
