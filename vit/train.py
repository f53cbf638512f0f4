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
import datetime as dt
import json
import logging
import logging.handlers
import math
import os
import platform
import signal
import socket
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torchvision.transforms import v2

from vit.checkpoint import CheckpointError, Preprocessing, read_checkpoint_payload, save_checkpoint
from vit.data import (
    AUGMENTATIONS,
    MAX_MAGNITUDE,
    BatchAugment,
    DataError,
    Dataset,
    folder_layout,
    load_dataset,
    parse_dataset,
)
from vit.images import normalize
from vit.model import PRESETS, ViT, ViTConfig, count_parameters

log = logging.getLogger("vit.train")

STATES = ("running", "completed", "failed", "cancelled")
HEARTBEAT_SECONDS = 5.0  # status.json is rewritten at least this often while running
STALE_SECONDS = 60.0  # a "running" status without a heartbeat for this long belongs to a dead process
FAULT_ENV = "VIT_TRAIN_FAULT_AT_STEP"  # test hook: raise inside training at this global step

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
RESUME_OPTIONS = ("epochs", "device", "threads", "compile", "eval_batch_size", "log_every", "data_dir",
                  "cache_dir")

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

data: each dataset is decoded once into a uint8 tensor cache (--cache-dir) that later runs
  reuse; augmentation runs on whole batches of tensors (on the GPU when training there).
  Greyscale data for a 3-channel model is expanded, every image resized to the model's size.

stopping and resuming:
  SIGTERM or Ctrl-C finishes the current step, saves last.pt and marks the run cancelled.
  --resume RUN_DIR continues from last.pt exactly where it stopped (weights, optimizer,
  schedule, EMA, random state, epoch and step). With --epochs N it trains a finished run
  further; the learning-rate schedule is then planned for N epochs. Only --epochs, --device,
  --threads, --compile, --eval-batch-size, --log-every, --data-dir and --cache-dir may be
  given with --resume; everything else stays the run's own.

several GPUs (or CPU processes):
  torchrun --standalone --nproc_per_node=N -m vit.train ...
  NCCL on GPUs, gloo on CPUs; --batch-size is the global batch, split over the processes;
  each process trains on its own shard of every batch; only rank 0 writes the run folder.

exit status: 0 completed or cancelled; 1 training failed (status.json says why);
  2 invalid arguments or unusable data (reported before anything is written);
  128 + the signal number when stopped before training started.

environment: VIT_TRAIN_FAULT_AT_STEP=N raises an error at step N (to test failure handling).
"""


class UsageError(ValueError):
    """Invalid arguments; reported as one line before anything is written."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints usage + error; we want one line
        raise UsageError(message)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _int_in(low: int, high: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in {low}..{high}, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an integer in {low}..{high}, got {text!r}")
        return value
    return parse


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _float_in(low: float, high: float):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not low <= value < high:  # also false for NaN
            raise argparse.ArgumentTypeError(f"expected a number in [{low:g}, {high:g}), got {text!r}")
        return value
    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
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
    g.add_argument("--lr", type=_positive_float, help="peak learning rate (ours 2e-3, seed 1e-2)")
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

    g = p.add_argument_group("speed")
    g.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="auto (default): bf16 autocast on CUDA, fp32 on CPU")
    g.add_argument("--compile", action="store_true", help="torch.compile the model (slow first steps)")
    g.add_argument("--threads", type=_positive_int, help="CPU threads per process (default: torch's choice)")
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
    if args.preset not in PRESETS:
        raise UsageError(f"unknown preset {args.preset!r}; choose one of: {', '.join(PRESETS)}")
    try:
        parse_dataset(args.dataset)
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
    _device(args.device)
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


def resolve_model(args: argparse.Namespace, num_classes: int) -> ViTConfig:
    """Fix the model of a new run: the preset's channels, the dataset's classes, the overrides."""
    args.num_classes = num_classes
    args.channels = PRESETS[args.preset].num_channels
    config = model_config(args, num_channels=args.channels, num_classes=num_classes)
    args.model = config.to_dict()
    args.image_size_resolved = config.image_size
    return config


def _device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise UsageError(f"--device {spec!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {spec}: CUDA is not available on this machine; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"--device {spec}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif device.type != "cpu":
        raise UsageError(f"--device {spec!r} is not supported; use auto, cpu, cuda or cuda:N")
    return device


# ---------------------------------------------------------------------------------------------
# Run files


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path``, fsync, then rename over it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, value: dict) -> None:
    atomic_write_text(path, json.dumps(value, indent=2) + "\n")


def write_metrics(path: Path, rows: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))


class Status:
    """``status.json``, rewritten atomically on every change and by a heartbeat thread."""

    def __init__(self, path: Path, initial: dict) -> None:
        self.path, self.values = path, dict(initial)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="status-heartbeat", daemon=True)
        self.failed_beats = 0

    def update(self, **values) -> None:
        with self.lock:
            self.values.update(values)
            self.values["updated_time"] = now_iso()
            write_json(self.path, self.values)

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT_SECONDS):
            try:
                self.update()
            except OSError as e:  # a full disk must not end the heartbeat for good
                self.failed_beats += 1
                if self.failed_beats == 1:
                    log.warning("cannot update %s (%s); will keep trying", self.path, e)

    def start(self) -> None:
        self.update()
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()


def _seconds_since(iso: object) -> float | None:
    try:
        then = dt.datetime.fromisoformat(str(iso))
    except ValueError:
        return None
    if then.tzinfo is None:
        then = then.replace(tzinfo=dt.UTC)
    return (dt.datetime.now(dt.UTC) - then).total_seconds()


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
    try:
        status = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return
    if not isinstance(status, dict) or status.get("state") != "running":
        return
    age = _seconds_since(status.get("updated_time"))
    if age is None or age > STALE_SECONDS:
        return
    pid, host = status.get("pid"), status.get("host")
    if host == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid):
        return
    raise UsageError(f"{run_dir} is still running (pid {pid} on {host}, heartbeat {age:.0f} s ago); "
                     "stop it first (SIGTERM) or wait for it to end")


# ---------------------------------------------------------------------------------------------
# Training


class EtaClock:
    """Seconds per training step, leaving out each session's first step (compilation, warm-up)
    and any time excluded explicitly (validation, checkpoints)."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.steps = 0
        self.excluded = 0.0

    def step_done(self, now: float) -> None:
        if self.first is None:
            self.first = now
        else:
            self.steps += 1
        self.last = now

    def exclude(self, seconds: float) -> None:
        if self.first is not None:
            self.excluded += seconds

    def seconds_per_step(self) -> float | None:
        if not self.steps:
            return None
        return max(self.last - self.first - self.excluded, 0.0) / self.steps

    def eta(self, remaining_steps: int, remaining_evals: int, eval_seconds: float) -> float | None:
        rate = self.seconds_per_step()
        if rate is None:
            return None
        return rate * remaining_steps + remaining_evals * eval_seconds


class StopRequest:
    """The SIGTERM/SIGINT handler: once armed (training started) it only records the signal, so
    the step in flight finishes; before that it aborts the setup with KeyboardInterrupt."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.armed = False

    def __call__(self, signum: int, frame: object) -> None:
        self.signum = signum
        if not self.armed:
            raise KeyboardInterrupt

    @property
    def requested(self) -> bool:
        return self.signum is not None


@dataclass
class Progress:
    """Where training stands; saved in last.pt so a resume continues exactly here."""

    epoch: int = 0  # completed epochs
    step_in_epoch: int = 0  # optimizer steps done in the current epoch
    global_step: int = 0
    loss_sum: float = 0.0  # running sums of the current epoch
    correct: float = 0.0
    seen: int = 0
    epoch_seconds: float = 0.0  # training seconds of the current epoch so far, over all sessions
    best_val_acc: float = -1.0
    elapsed: float = 0.0  # wall seconds of training (with validation) over all sessions

    @classmethod
    def from_dict(cls, values: dict) -> Progress:
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            raise CheckpointError(f"last.pt's progress has unknown field(s) {', '.join(unknown)}; it was "
                                  "written by a newer version")
        return cls(**values)


def check_data(args: argparse.Namespace, data: Dataset, world: int = 1) -> None:
    """Checks that need the loaded data; raise UsageError or DataError before training starts."""
    if len(data.class_names) != args.num_classes:
        raise DataError(f"{args.dataset} has {len(data.class_names)} classes, the run expects {args.num_classes}")
    if args.batch_size > len(data.train):
        raise UsageError(f"--batch-size {args.batch_size} is larger than the {len(data.train)} training images "
                         f"of {args.dataset}; use at most {len(data.train)}")
    if args.batch_size % world:
        raise UsageError(f"--batch-size {args.batch_size} must be divisible by the {world} processes")
    if len(data.val) == 0:
        raise DataError(f"{args.dataset} has no validation images; add PATH/val/<class>/ images or raise "
                        "--val-fraction")


class Trainer:
    """Trains the model of ``args`` on ``data``; writes into ``run_dir`` (rank 0 only) at epoch ends."""

    def __init__(self, args: argparse.Namespace, data: Dataset, run_dir: Path | None,
                 resume_payload: dict | None = None, rank: int = 0, world: int = 1,
                 device: torch.device | str = "cpu", stop: StopRequest | None = None) -> None:
        check_data(args, data, world)
        self.args, self.data, self.run_dir = args, data, run_dir
        self.rank, self.world, self.device = rank, world, torch.device(device)
        self.is_main = rank == 0
        self.stop = stop if stop is not None else StopRequest()
        self.eval_seconds: float | None = None  # the last validation's duration, for the ETA
        self.local_batch = args.batch_size // world
        self.steps_per_epoch = len(data.train) // args.batch_size
        self.total_steps = self.steps_per_epoch * args.epochs
        on_gpu = self.device.type == "cuda"  # the whole uint8 dataset lives on the GPU there
        self.train = data.train.to(self.device) if on_gpu else data.train
        self.val = data.val.to(self.device) if on_gpu else data.val

        torch.manual_seed(args.seed)
        self.config = ViTConfig.from_dict(args.model)
        self.model = ViT(self.config).to(self.device)
        self.ema = (AveragedModel(self.model, multi_avg_fn=get_ema_multi_avg_fn(args.ema))
                    if args.ema > 0 else None)
        self.optimizer = torch.optim.AdamW(self._param_groups(), lr=args.lr, weight_decay=args.weight_decay,
                                           betas=(0.9, 0.999))
        self.progress = Progress()
        self.metrics: list[dict] = []
        self.rng_state: dict | None = None
        if resume_payload is not None:
            self._restore(resume_payload)
        self.scheduler = self._scheduler()
        self.net: nn.Module = self.model
        if self.world > 1:
            self.net = nn.parallel.DistributedDataParallel(
                self.net, device_ids=[self.device.index] if on_gpu else None)
        if args.compile:
            self.net = torch.compile(self.net)
        self.autocast_dtype = _autocast_dtype(args.precision, self.device)
        self.augment = BatchAugment(args.augment, magnitude=args.aug_magnitude, num_ops=args.aug_ops)
        mixers = []
        if args.mixup > 0:
            mixers.append(v2.MixUp(alpha=args.mixup, num_classes=args.num_classes))
        if args.cutmix > 0:
            mixers.append(v2.CutMix(alpha=args.cutmix, num_classes=args.num_classes))
        self.mixer = v2.RandomChoice(mixers) if mixers else None
        self.preprocessing = Preprocessing(self.config.image_size, self.config.num_channels,
                                           self.data.mean, self.data.std)
        self.session_start = time.time()
        self.elapsed_before = self.progress.elapsed

    def _param_groups(self) -> list[dict]:
        # No weight decay on biases, norms, the CLS token and position embeddings (timm's rule),
        # except in the seed recipe: the blog's AdamW decays every parameter. Two groups either
        # way, so that a checkpoint's optimizer state always fits.
        decay, no_decay = [], []
        for name, param in self.model.named_parameters():
            (no_decay if param.ndim <= 1 or name in ("cls_token", "pos_embed") else decay).append(param)
        no_decay_wd = self.args.weight_decay if self.args.recipe == "seed" else 0.0
        return [{"params": decay}, {"params": no_decay, "weight_decay": no_decay_wd}]

    def _scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        """Linear warmup then cosine (or constant), per step, fast-forwarded when resuming.

        Replaying the steps gives bit-identical rates to an uninterrupted run with the same
        --epochs, and re-plans the schedule for a run extended with a larger --epochs.
        """
        args = self.args
        for group in self.optimizer.param_groups:
            group["lr"] = args.lr
            group.pop("initial_lr", None)
        warmup = int(round(args.warmup_epochs * self.steps_per_epoch))
        sched = torch.optim.lr_scheduler
        if args.schedule == "cosine":
            after = sched.CosineAnnealingLR(self.optimizer, T_max=max(self.total_steps - warmup, 1),
                                            eta_min=args.min_lr)
        else:
            after = sched.ConstantLR(self.optimizer, factor=1.0, total_iters=0)
        if warmup > 0:
            first = sched.LinearLR(self.optimizer, start_factor=1e-3, end_factor=1.0, total_iters=warmup)
            scheduler = sched.SequentialLR(self.optimizer, [first, after], milestones=[warmup])
        else:
            scheduler = after
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "scheduler.step() before optimizer.step()"
            for _ in range(self.progress.global_step):
                scheduler.step()
        return scheduler

    def _restore(self, payload: dict) -> None:
        state = payload.get("training_state")
        if not state:
            raise CheckpointError("last.pt holds no training state; it cannot be resumed")
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            if self.ema is not None and state.get("ema") is not None:
                self.ema.load_state_dict(state["ema"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise CheckpointError(f"last.pt does not fit the run's model or optimizer ({str(e).splitlines()[0]})"
                                  ) from None
        self.progress = Progress.from_dict(state["progress"])
        self.metrics = list(state["metrics"])
        rng = state.get("rng") or []
        if len(rng) == self.world:  # else (another process count) each epoch is re-seeded
            self.rng_state = rng[self.rank]

    # -- the loop ------------------------------------------------------------------------------

    def fit(self, status: Status | None) -> str:
        """Train until the last epoch or a stop signal; returns the final state."""
        args, p = self.args, self.progress
        self.session_start, self.elapsed_before = time.time(), p.elapsed
        clock = EtaClock()
        last_status = last_log = 0.0
        while p.epoch < args.epochs:
            order = self.epoch_order(p.epoch)
            self._seed_epoch()
            epoch_start = time.time() - p.epoch_seconds
            self.net.train()
            bar = _progress_bar(self.is_main, self.steps_per_epoch, p.step_in_epoch, p.epoch + 1, args.epochs)
            while p.step_in_epoch < self.steps_per_epoch:
                idx = order[p.step_in_epoch * self.local_batch:(p.step_in_epoch + 1) * self.local_batch]
                loss, correct = self.step(idx)
                p.loss_sum += loss * len(idx)
                p.correct += correct
                p.seen += len(idx)
                p.step_in_epoch += 1
                p.global_step += 1
                now = time.time()
                clock.step_done(now)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{p.loss_sum / p.seen:.3f}", lr=f"{self.lr():.2e}")
                elif self.is_main and now - last_log >= args.log_every:
                    last_log = now
                    log.info("epoch %d step %d/%d loss %.4f acc %.4f lr %.2e", p.epoch + 1, p.step_in_epoch,
                             self.steps_per_epoch, p.loss_sum / p.seen, p.correct / p.seen, self.lr())
                if status is not None and now - last_status >= 1.0:
                    last_status = now
                    status.update(epoch=p.epoch + 1, step=p.global_step,
                                  progress=round(p.global_step / self.total_steps, 5),
                                  eta_seconds=self._eta(clock), elapsed_seconds=round(self._elapsed(), 3))
                if self._should_stop():
                    p.epoch_seconds = time.time() - epoch_start
                    p.elapsed = self._elapsed()
                    if bar is not None:
                        bar.close()
                    self._save_last()
                    return "cancelled"
            if bar is not None:
                bar.close()
            p.epoch_seconds = time.time() - epoch_start
            start = time.time()
            self._end_epoch(status)
            clock.exclude(time.time() - start)
        return "completed"

    def _seed_epoch(self) -> None:
        """Continue a resumed epoch's random stream exactly; start every other epoch from its seed."""
        p = self.progress
        if p.step_in_epoch > 0 and self.rng_state is not None:
            _set_rng(self.rng_state, self.device)
        else:
            torch.manual_seed(_mix(self.args.seed, p.epoch, p.step_in_epoch, self.rank))
        self.rng_state = None

    def _elapsed(self) -> float:
        return self.elapsed_before + time.time() - self.session_start

    def _eta(self, clock: EtaClock) -> float | None:
        p, args = self.progress, self.args
        eval_seconds = self.eval_seconds
        if eval_seconds is None:  # before the first validation: forward only, about a third of a step
            rate = clock.seconds_per_step() or 0.0
            eval_seconds = rate / self.local_batch * len(self.val) / self.world / 3
        eta = clock.eta(self.total_steps - p.global_step, args.epochs - p.epoch, eval_seconds)
        return None if eta is None else round(eta, 1)

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """This rank's sample indices for ``epoch``: one global permutation per epoch, sharded."""
        generator = torch.Generator().manual_seed(_mix(self.args.seed, epoch, 0, 0))
        order = torch.randperm(len(self.train), generator=generator)
        order = order[:self.steps_per_epoch * self.args.batch_size]
        return order.view(self.steps_per_epoch, self.args.batch_size)[:, self.rank::self.world].reshape(-1)

    def step(self, idx: torch.Tensor) -> tuple[float, float]:
        """One optimizer step on the training images ``idx``: (mean loss, hits) of the global batch."""
        args = self.args
        if FAULT_ENV in os.environ and self.progress.global_step + 1 == int(os.environ[FAULT_ENV]):
            raise RuntimeError(f"injected fault at step {self.progress.global_step + 1} ({FAULT_ENV})")
        idx = idx.to(self.train.images.device)
        images = self.augment(self.train.images[idx])
        images = normalize(images.to(self.device, non_blocking=True), self.data.mean, self.data.std)
        labels = self.train.labels[idx].to(self.device, non_blocking=True)
        targets = labels
        if self.mixer is not None:
            images, targets = self.mixer(images, labels)
        with torch.autocast(self.device.type, dtype=self.autocast_dtype,
                            enabled=self.autocast_dtype is not None):
            logits, _ = self.net(images)
            loss = F.cross_entropy(logits.float(), targets, label_smoothing=args.label_smoothing)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), args.grad_clip)
        self.optimizer.step()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.scheduler.step()
        if self.ema is not None:
            self.ema.update_parameters(self.model)
        correct = (logits.argmax(1) == (targets.argmax(1) if targets.dim() == 2 else targets)).sum()
        stats = torch.stack([loss.detach().float(), correct.float()]).double()
        if self.world > 1:  # the mean loss and summed hits of the whole global batch
            dist.all_reduce(stats)
            stats = stats.cpu()
            return stats[0].item() / self.world, stats[1].item() / self.world
        stats = stats.cpu()
        return stats[0].item(), stats[1].item()

    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def _should_stop(self) -> bool:
        flag = self.stop.requested
        if self.world > 1:  # every rank stops after the same step, whichever got the signal
            t = torch.tensor([1.0 if flag else 0.0], device=self.device)
            dist.all_reduce(t)
            flag = t.item() > 0
        return flag

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        """Validation (loss, accuracy) of the weights that get saved (EMA ones when enabled)."""
        model = self.ema.module if self.ema is not None else self.model
        model.eval()
        n = len(self.val)
        shard = torch.arange(self.rank, n, self.world)
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)
        for chunk in shard.split(self.args.eval_batch_size):
            chunk = chunk.to(self.val.images.device)
            images = normalize(self.val.images[chunk].to(self.device), self.data.mean, self.data.std)
            labels = self.val.labels[chunk].to(self.device)
            with torch.autocast(self.device.type, dtype=self.autocast_dtype,
                                enabled=self.autocast_dtype is not None):
                logits, _ = model(images)
            totals[0] += F.cross_entropy(logits.float(), labels, reduction="sum").double()
            totals[1] += (logits.argmax(1) == labels).sum().double()
            totals[2] += len(chunk)
        if self.world > 1:
            dist.all_reduce(totals)
        return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()

    def _end_epoch(self, status: Status | None) -> None:
        p = self.progress
        start = time.time()
        val_loss, val_acc = self.evaluate()
        self.eval_seconds = time.time() - start
        row = {"epoch": p.epoch + 1, "train_loss": round(p.loss_sum / p.seen, 6),
               "train_acc": round(p.correct / p.seen, 6), "val_loss": round(val_loss, 6),
               "val_acc": round(val_acc, 6), "lr": self.lr(), "epoch_seconds": round(p.epoch_seconds, 3),
               "images_per_second": round(p.seen * self.world / max(p.epoch_seconds, 1e-9), 1)}
        self.metrics.append(row)
        improved = val_acc > p.best_val_acc
        p.best_val_acc = max(p.best_val_acc, val_acc)
        p.epoch += 1
        p.step_in_epoch, p.loss_sum, p.correct, p.seen, p.epoch_seconds = 0, 0.0, 0.0, 0, 0.0
        p.elapsed = self._elapsed()
        if self.is_main:
            log.info("epoch %d/%d train_loss %.4f train_acc %.4f val_loss %.4f val_acc %.4f "
                     "lr %.2e %.1fs %.0f img/s", row["epoch"], self.args.epochs, row["train_loss"],
                     row["train_acc"], row["val_loss"], row["val_acc"], row["lr"], row["epoch_seconds"],
                     row["images_per_second"])
            write_metrics(self.run_dir / "metrics.jsonl", self.metrics)
        self._save_last()
        if self.is_main and improved:
            self._save_model(self.run_dir / "best.pt", val_acc)
        if status is not None:
            status.update(epoch=p.epoch, step=p.global_step, progress=round(p.global_step / self.total_steps, 5),
                          best_val_acc=p.best_val_acc, elapsed_seconds=round(p.elapsed, 3))

    # -- checkpoints ---------------------------------------------------------------------------

    def _metadata(self, val_acc: float | None) -> dict:
        p = self.progress
        return {"dataset": self.args.dataset, "epochs": p.epoch, "val_acc": val_acc,
                "best_val_acc": p.best_val_acc if p.best_val_acc >= 0 else None,
                "train_size": len(self.data.train), "val_size": len(self.data.val),
                "preset": self.args.preset, "recipe": self.args.recipe, "parameters": count_parameters(self.model),
                "date": now_iso(), "run": self.run_dir.name, "train_seconds": round(p.elapsed, 1),
                "hardware": _hardware(self.device, self.world), "ema": self.args.ema > 0}

    def _save_model(self, path: Path, val_acc: float | None, training_state: dict | None = None) -> None:
        model = self.ema.module if self.ema is not None else self.model
        save_checkpoint(path, model, self.data.class_names, self.preprocessing,
                        metadata=self._metadata(val_acc), training_state=training_state)

    def _save_last(self) -> None:
        """last.pt: the saved weights plus everything to resume (every rank's RNG too)."""
        rng = _get_rng(self.device)
        states = [None] * self.world
        if self.world > 1:
            dist.all_gather_object(states, rng)
        else:
            states = [rng]
        if not self.is_main:
            return
        p = self.progress
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "ema": self.ema.state_dict() if self.ema is not None else None,
                 "progress": vars(p).copy(), "metrics": self.metrics, "rng": states}
        last_acc = self.metrics[-1]["val_acc"] if self.metrics else None
        self._save_model(self.run_dir / "last.pt", last_acc, training_state=state)


def _mix(*numbers: int) -> int:
    value = 0x9E3779B97F4A7C15
    for n in numbers:
        value = (value ^ (n + 0x9E3779B97F4A7C15 + (value << 6) + (value >> 2))) & 0x7FFFFFFFFFFFFFFF
    return value


def _get_rng(device: torch.device) -> dict:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"].cpu())
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def _autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def _hardware(device: torch.device, world: int) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return f"{world} x {name}" if world > 1 else name
    cpu = platform.processor() or platform.machine()
    threads = torch.get_num_threads()
    return f"CPU ({cpu}, {threads} threads{f', {world} processes' if world > 1 else ''})"


def _init_distributed(args: argparse.Namespace) -> tuple[int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    if _rank_device(args).type == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def _rank_device(args: argparse.Namespace) -> torch.device:
    """Under torchrun: the GPU of this process's local rank, unless the run is on the CPU."""
    if _device(args.device).type == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if local_rank >= torch.cuda.device_count():
            raise UsageError(f"local rank {local_rank} has no GPU: this machine has {torch.cuda.device_count()}; "
                             "start fewer processes per node")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _progress_bar(is_main: bool, total: int, done: int, epoch: int, epochs: int):
    if not (is_main and sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc=f"epoch {epoch}/{epochs}", leave=False, dynamic_ncols=True)


def load_run_data(args: argparse.Namespace, rank: int = 0, world: int = 1) -> Dataset:
    """The run's dataset. Under several processes rank 0 decodes and caches it first, then the
    others read that cache instead of all decoding at once."""
    if world > 1 and rank != 0:
        dist.barrier()
    data = load_dataset(args.dataset, args.image_size_resolved, args.channels, data_dir=args.data_dir,
                        cache_dir=args.cache_dir, val_fraction=args.val_fraction, seed=args.seed)
    if world > 1 and rank == 0:
        dist.barrier()
    return data


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
            num_classes = _builtin_classes(value)
    except DataError as e:
        raise UsageError(str(e)) from None
    resolve_model(args, num_classes)
    return args, run_dir, None


def _prepare_resume(args: argparse.Namespace, argv: list[str]) -> tuple[argparse.Namespace, Path, dict]:
    run_dir = Path(args.resume)
    config_file = run_dir / "config.json"
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
    last = run_dir / "last.pt"
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
    _device(args.device)
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
    try:
        file = logging.FileHandler(run_dir / "train.log")
        written.append(run_dir / "train.log")
        file.setFormatter(_LOG_FORMAT)
        buffer.setTarget(file)
        buffer.flush()
        logger.removeHandler(buffer)
        logger.addHandler(file)
        p = trainer.progress
        if resumed:
            _record_resume(run_dir / "config.json", args, argv, trainer)
            write_metrics(run_dir / "metrics.jsonl", trainer.metrics)
        else:
            written.append(run_dir / "config.json")
            write_json(run_dir / "config.json", _config_record(args, argv, trainer))
        written.append(run_dir / "status.json")
        status = Status(run_dir / "status.json", {
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
             _hardware(trainer.device, trainer.world))
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
    record = json.loads(config_file.read_text())
    record["args"].update({name: getattr(args, name) for name in RESUME_OPTIONS})
    record.setdefault("resumes", []).append({
        "time": now_iso(), "command": [sys.executable, "-m", "vit.train", *argv],
        "from_epoch": trainer.progress.epoch, "from_step": trainer.progress.global_step,
        "world_size": trainer.world, "device": str(trainer.device)})
    write_json(config_file, record)


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
            rank, world = _init_distributed(args)
            device = _device(args.device) if world == 1 else _rank_device(args)
            if args.threads:
                torch.set_num_threads(args.threads)
            data = load_run_data(args, rank, world)
            trainer = Trainer(args, data, run_dir, payload, rank, world, device, stop)
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
                _append_traceback(run_dir)
            print(f"vit.train: failed before training started: {_one_line(e)}", file=sys.stderr)
            return 1
        try:
            state = trainer.fit(status)
        except Exception as e:
            message = _one_line(e)
            if is_main:
                log.error("training failed: %s", message)
                _append_traceback(run_dir)
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
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _append_traceback(run_dir: Path) -> None:
    with open(run_dir / "train.log", "a") as f:
        f.write(traceback.format_exc())


if __name__ == "__main__":
    sys.exit(main())
