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
import datetime as dt
import json
import logging
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
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torchvision.transforms import v2

from vit.checkpoint import CheckpointError, Preprocessing, atomic_torch_save, read_checkpoint_payload, save_checkpoint
from vit.data import AUGMENTATIONS, BatchAugment, DataError, Dataset, check_dataset, load_dataset, parse_dataset
from vit.images import normalize
from vit.model import PRESETS, ViT, ViTConfig, count_parameters

log = logging.getLogger("vit.train")

STATES = ("running", "completed", "failed", "cancelled")
HEARTBEAT_SECONDS = 5.0
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


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _float_in(low: float, high: float, closed_high: bool = False):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        inside = low <= value <= high if closed_high else low <= value < high
        if not inside or math.isnan(value):
            bracket = "]" if closed_high else ")"
            raise argparse.ArgumentTypeError(f"expected a number in [{low:g}, {high:g}{bracket}, got {text!r}")
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
    p = OneLineParser(prog="python -m vit.train", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("run")
    g.add_argument("--dataset", help="cifar10, cifar100, mnist, fashion-mnist (torchvision, downloaded into "
                   "--data-dir when online) or folder:PATH (PATH/train/<class>/... with optional "
                   "PATH/val/<class>/..., or PATH/<class>/...)")
    g.add_argument("--out", help="run folder to create (required unless --resume)")
    g.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last.pt; "
                   "combine with --epochs N to train it further")
    g.add_argument("--data-dir", default="data", help="where torchvision datasets live (default: data)")
    g.add_argument("--cache-dir", help="where decoded uint8 dataset caches go (default: DATA_DIR/cache)")
    g.add_argument("--val-fraction", type=_float_in(0.0, 1.0), default=0.1,
                   help="share of each class held out for validation when the dataset has no validation "
                   "split of its own (default 0.1; fixed by --seed)")
    g.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    g.add_argument("--seed", type=_non_negative_int, default=0, help="seed for init, split and augmentation")

    g = p.add_argument_group("model (a preset, optionally with fields changed)")
    g.add_argument("--preset", default="tintn-cifar10", help=f"one of: {', '.join(PRESETS)} "
                   "(default tintn-cifar10); classes and channels follow the dataset")
    g.add_argument("--image-size", type=_positive_int, help="input side in pixels")
    g.add_argument("--patch-size", type=_positive_int, help="patch side in pixels")
    g.add_argument("--hidden-size", type=_positive_int, help="token width")
    g.add_argument("--num-layers", type=_positive_int, help="encoder blocks")
    g.add_argument("--num-heads", type=_positive_int, help="attention heads per block")
    g.add_argument("--mlp-size", type=_positive_int, help="MLP hidden width")
    g.add_argument("--dropout", type=_float_in(0.0, 1.0), help="dropout rate")
    g.add_argument("--attention-dropout", type=_float_in(0.0, 1.0), help="dropout on attention probabilities")
    g.add_argument("--drop-path", type=_float_in(0.0, 1.0), help="stochastic depth rate of the last block")

    g = p.add_argument_group("recipe (unset options take the --recipe's value)")
    g.add_argument("--recipe", choices=tuple(RECIPES), default="ours",
                   help="ours (warmup + cosine, label smoothing, TrivialAugment) or seed (the seed blog's "
                   "constant-lr AdamW with flip + RandomResizedCrop)")
    g.add_argument("--epochs", type=_positive_int, help="epochs to train in total (ours/seed: 100)")
    g.add_argument("--batch-size", type=_positive_int, help="global batch size (256)")
    g.add_argument("--lr", type=_positive_float, help="peak learning rate (ours 2e-3, seed 1e-2)")
    g.add_argument("--min-lr", type=_float_in(0.0, 1.0), help="learning rate at the end of the cosine")
    g.add_argument("--weight-decay", type=_float_in(0.0, 10.0), help="AdamW weight decay (ours 0.05)")
    g.add_argument("--warmup-epochs", type=_float_in(0.0, 1e6), help="linear warmup length in epochs (ours: 5, at most a tenth of --epochs)")
    g.add_argument("--schedule", choices=("cosine", "constant"), help="learning-rate schedule after warmup")
    g.add_argument("--label-smoothing", type=_float_in(0.0, 1.0), help="label smoothing (ours 0.1)")
    g.add_argument("--grad-clip", type=_float_in(0.0, 1e6), help="max gradient norm, 0 = off (ours 1.0)")
    g.add_argument("--ema", type=_float_in(0.0, 1.0), help="EMA decay of the weights per step, 0 = off; "
                   "validation and checkpoints then use the EMA weights")
    g.add_argument("--augment", choices=AUGMENTATIONS, help="training augmentation policy")
    g.add_argument("--aug-magnitude", type=_non_negative_int, default=9, help="RandAugment magnitude (9)")
    g.add_argument("--aug-ops", type=_positive_int, default=2, help="RandAugment ops per image (2)")
    g.add_argument("--mixup", type=_float_in(0.0, 1e3), help="mixup alpha, 0 = off")
    g.add_argument("--cutmix", type=_float_in(0.0, 1e3), help="cutmix alpha, 0 = off")

    g = p.add_argument_group("speed")
    g.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="auto: bf16 autocast on CUDA, fp32 on CPU")
    g.add_argument("--compile", action="store_true", help="torch.compile the model")
    g.add_argument("--threads", type=_positive_int, help="CPU threads (default: all cores)")
    g.add_argument("--eval-batch-size", type=_positive_int, default=500, help="batch size for validation")
    g.add_argument("--log-every", type=_positive_float, default=30.0,
                   help="seconds between progress lines when not on a terminal (30)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check everything that can be checked without the data; raises UsageError."""
    args = build_parser().parse_args(argv)
    if args.resume:
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
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out} already holds files; continue it with --resume {out} or choose another --out")
    _device(args.device)
    return args


def model_config(args: argparse.Namespace, num_channels: int, num_classes: int) -> ViTConfig:
    overrides = {k: getattr(args, k) for k in MODEL_FIELDS if getattr(args, k) is not None}
    return ViTConfig.from_preset(args.preset, num_channels=num_channels, num_classes=num_classes, **overrides)


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
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: Path, value: dict) -> None:
    atomic_write_text(path, json.dumps(value, indent=2) + "\n")


class Status:
    """``status.json``, rewritten atomically on every change and by a heartbeat thread."""

    def __init__(self, path: Path, initial: dict) -> None:
        self.path, self.values = path, dict(initial)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def update(self, **values) -> None:
        with self.lock:
            self.values.update(values)
            self.values["updated_time"] = now_iso()
            write_json(self.path, self.values)

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT_SECONDS):
            self.update()

    def start(self) -> None:
        self.update()
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()


# ---------------------------------------------------------------------------------------------
# Training


@dataclass
class Progress:
    """Where training stands; saved in last.pt so a resume continues exactly here."""

    epoch: int = 0  # completed epochs
    step_in_epoch: int = 0  # optimizer steps done in the current epoch
    global_step: int = 0
    loss_sum: float = 0.0  # running sums of the current epoch
    correct: float = 0.0
    seen: int = 0
    epoch_seconds: float = 0.0
    best_val_acc: float = -1.0
    elapsed: float = 0.0  # training seconds over all sessions


class Trainer:
    def __init__(self, args: argparse.Namespace, run_dir: Path, resume_payload: dict | None) -> None:
        self.args, self.run_dir = args, run_dir
        self.rank, self.world = _init_distributed(args)
        self.is_main = self.rank == 0
        self.device = _device(args.device) if self.world == 1 else _rank_device(args)
        if args.threads:
            torch.set_num_threads(args.threads)
        self.stop_signal: int | None = None
        self.eval_seconds = 0.0  # the last validation's duration, for the ETA

        self.data: Dataset = load_dataset(args.dataset, args.image_size_resolved, args.channels,
                                          data_dir=args.data_dir, cache_dir=args.cache_dir,
                                          val_fraction=args.val_fraction, seed=args.seed)
        if len(self.data.class_names) != args.num_classes:
            raise DataError(f"{args.dataset} has {len(self.data.class_names)} classes, the run expects "
                            f"{args.num_classes}")
        if args.batch_size > len(self.data.train):
            raise UsageError(f"--batch-size {args.batch_size} is larger than the {len(self.data.train)} "
                             f"training images of {args.dataset}; use at most {len(self.data.train)}")
        if args.batch_size % self.world:
            raise UsageError(f"--batch-size {args.batch_size} must be divisible by the {self.world} processes")
        self.local_batch = args.batch_size // self.world
        self.steps_per_epoch = len(self.data.train) // args.batch_size
        self.total_steps = self.steps_per_epoch * args.epochs
        keep_on_device = self.device.type == "cuda"
        self.train = self.data.train.to(self.device) if keep_on_device else self.data.train
        self.val = self.data.val.to(self.device) if keep_on_device else self.data.val

        torch.manual_seed(args.seed)
        self.config = ViTConfig.from_dict(args.model)
        self.model = ViT(self.config).to(self.device)
        self.ema = (AveragedModel(self.model, multi_avg_fn=get_ema_multi_avg_fn(args.ema))
                    if args.ema > 0 else None)
        self.optimizer = torch.optim.AdamW(self._param_groups(), lr=args.lr, weight_decay=args.weight_decay,
                                           betas=(0.9, 0.999))
        self.progress = Progress()
        self.metrics: list[dict] = []
        self.rng_state = None
        if resume_payload is not None:
            self._restore(resume_payload)
        self.scheduler = self._scheduler()
        self.net: nn.Module = self.model
        if args.compile:
            self.net = torch.compile(self.net)
        if self.world > 1:
            self.net = nn.parallel.DistributedDataParallel(
                self.net, device_ids=[self.device.index] if self.device.type == "cuda" else None)
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

    def _param_groups(self) -> list[dict]:
        # No weight decay on biases, norms, the CLS token and position embeddings (timm's rule).
        decay, no_decay = [], []
        for name, param in self.model.named_parameters():
            (no_decay if param.ndim <= 1 or name in ("cls_token", "pos_embed") else decay).append(param)
        return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]

    def _scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        """Linear warmup then cosine (or constant), per step, fast-forwarded when resuming."""
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
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.ema is not None and state.get("ema") is not None:
            self.ema.load_state_dict(state["ema"])
        self.progress = Progress(**state["progress"])
        self.metrics = list(state["metrics"])
        rng = state.get("rng") or []
        if len(rng) == self.world:
            self.rng_state = rng[self.rank]

    # -- the loop ------------------------------------------------------------------------------

    def fit(self, status: Status | None) -> str:
        """Train until the last epoch or a stop signal; returns the final state."""
        args, p = self.args, self.progress
        session_start, session_steps, mark = time.time(), 0, time.time()
        last_status = 0.0
        while p.epoch < args.epochs:
            epoch_start = time.time() - p.epoch_seconds
            order = self._epoch_order(p.epoch)
            if p.step_in_epoch == 0 or self.rng_state is None:
                torch.manual_seed(_mix(args.seed, p.epoch, p.step_in_epoch, self.rank))
            else:
                _set_rng(self.rng_state, self.device)
            self.rng_state = None
            self.net.train()
            bar = _progress_bar(self.is_main, self.steps_per_epoch, p.step_in_epoch, p.epoch + 1, args.epochs)
            last_log = time.time()
            while p.step_in_epoch < self.steps_per_epoch:
                idx = order[p.step_in_epoch * self.local_batch:(p.step_in_epoch + 1) * self.local_batch]
                loss, correct = self._step(idx)
                p.loss_sum += loss * len(idx)
                p.correct += correct
                p.seen += len(idx)
                p.step_in_epoch += 1
                p.global_step += 1
                session_steps += 1
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{p.loss_sum / p.seen:.3f}", lr=f"{self.lr():.2e}")
                elif self.is_main and time.time() - last_log > args.log_every:
                    last_log = time.time()
                    log.info("epoch %d step %d/%d loss %.4f acc %.4f lr %.2e", p.epoch + 1, p.step_in_epoch,
                             self.steps_per_epoch, p.loss_sum / p.seen, p.correct / p.seen, self.lr())
                if status is not None and time.time() - last_status >= 1.0:
                    last_status = time.time()
                    rate = (time.time() - session_start) / session_steps
                    status.update(epoch=p.epoch + 1, step=p.global_step,
                                  progress=round(p.global_step / self.total_steps, 5),
                                  eta_seconds=round(rate * (self.total_steps - p.global_step) +
                                                    self.eval_seconds * (args.epochs - p.epoch), 1))
                if self._should_stop():
                    p.epoch_seconds = time.time() - epoch_start
                    p.elapsed += time.time() - mark
                    if bar is not None:
                        bar.close()
                    self._save_last()
                    return "cancelled"
            if bar is not None:
                bar.close()
            p.epoch_seconds = time.time() - epoch_start
            p.elapsed += time.time() - mark
            mark = time.time()
            self._end_epoch(status)
        return "completed"

    def _epoch_order(self, epoch: int) -> torch.Tensor:
        """This rank's sample indices for ``epoch``: one global permutation per epoch, sharded."""
        generator = torch.Generator().manual_seed(_mix(self.args.seed, epoch, 0, 0))
        order = torch.randperm(len(self.train), generator=generator)
        order = order[:self.steps_per_epoch * self.args.batch_size]
        return order.view(self.steps_per_epoch, self.args.batch_size)[:, self.rank::self.world].reshape(-1)

    def _step(self, idx: torch.Tensor) -> tuple[float, float]:
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
        stats = torch.tensor([loss.detach().float().item(), correct.item()], dtype=torch.float64)
        if self.world > 1:  # the mean loss and summed hits of the whole global batch
            stats = stats.to(self.device)
            dist.all_reduce(stats)
            stats = stats.cpu()
            stats[0] /= self.world
            return stats[0].item(), stats[1].item() / self.world
        return stats[0].item(), stats[1].item()

    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def _should_stop(self) -> bool:
        flag = self.stop_signal is not None
        if self.world > 1:
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
        if self.is_main:
            log.info("epoch %d/%d train_loss %.4f train_acc %.4f val_loss %.4f val_acc %.4f "
                     "lr %.2e %.1fs %.0f img/s", row["epoch"], self.args.epochs, row["train_loss"],
                     row["train_acc"], row["val_loss"], row["val_acc"], row["lr"], row["epoch_seconds"],
                     row["images_per_second"])
            atomic_write_text(self.run_dir / "metrics.jsonl", "".join(json.dumps(m) + "\n" for m in self.metrics))
        self._save_last()
        if self.is_main and improved:
            self._save_model(self.run_dir / "best.pt", val_acc)
        if status is not None:
            status.update(epoch=p.epoch, best_val_acc=p.best_val_acc)

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
    use_cuda = args.device != "cpu" and torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if use_cuda else "gloo")
    return dist.get_rank(), dist.get_world_size()


def _rank_device(args: argparse.Namespace) -> torch.device:
    if args.device != "cpu" and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _progress_bar(is_main: bool, total: int, done: int, epoch: int, epochs: int):
    if not (is_main and sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc=f"epoch {epoch}/{epochs}", leave=False, dynamic_ncols=True)


# ---------------------------------------------------------------------------------------------
# Entry point


def _setup_logging(run_dir: Path | None, is_main: bool) -> None:
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    if not is_main:
        root.setLevel(logging.WARNING)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S")
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(fmt)
    root.addHandler(console)
    if run_dir is not None and is_main:
        file = logging.FileHandler(run_dir / "train.log")
        file.setFormatter(fmt)
        root.addHandler(file)


def _prepare(args: argparse.Namespace) -> tuple[argparse.Namespace, Path, dict | None]:
    """Resolve a new run's or a resumed run's arguments; nothing is written yet."""
    if args.resume:
        run_dir = Path(args.resume)
        config_file = run_dir / "config.json"
        if not config_file.is_file():
            raise UsageError(f"{run_dir} is not a run folder (no config.json); give the --out of an earlier run")
        stored = json.loads(config_file.read_text())["args"]
        extra_epochs = args.epochs
        device, threads = args.device, args.threads
        args = argparse.Namespace(**stored)
        args.resume, args.device, args.threads = str(run_dir), device, threads or args.threads
        if extra_epochs is not None:
            args.epochs = extra_epochs
        last = run_dir / "last.pt"
        if not last.is_file():
            raise UsageError(f"{run_dir} has no last.pt to resume from; start it again with --out")
        try:
            payload = read_checkpoint_payload(last)
        except CheckpointError as e:
            raise UsageError(str(e)) from None
        done = payload["training_state"]["progress"]["epoch"] if payload.get("training_state") else 0
        if done >= args.epochs:
            raise UsageError(f"{run_dir} has already trained {done} of {args.epochs} epochs; "
                             f"pass --epochs N with N > {done} to train further")
        _device(args.device)
        return args, run_dir, payload
    run_dir = Path(args.out)
    try:
        class_names = check_dataset(args.dataset, args.data_dir)
    except DataError as e:
        raise UsageError(str(e)) from None
    args.num_classes = len(class_names) if class_names else _builtin_classes(args.dataset)
    args.channels = PRESETS[args.preset].num_channels
    config = model_config(args, num_channels=args.channels, num_classes=args.num_classes)
    args.model = config.to_dict()
    args.image_size_resolved = config.image_size
    return args, run_dir, None


def _builtin_classes(name: str) -> int:
    return 100 if name == "cifar100" else 10


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        args, run_dir, payload = _prepare(args)
    except UsageError as e:
        print(f"vit.train: error: {e}", file=sys.stderr)
        return 2
    rank = int(os.environ.get("RANK", "0"))
    is_main = rank == 0
    if is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    _setup_logging(run_dir if is_main else None, is_main)

    status: Status | None = None
    trainer: Trainer | None = None

    def request_stop(signum, frame):
        if trainer is not None:
            trainer.stop_signal = signum
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        try:
            trainer = Trainer(args, run_dir, payload)
        except (UsageError, DataError) as e:
            # Found only once the data is loaded: still before training, so no run is left behind.
            if is_main and payload is None:
                _remove_empty_run(run_dir)
            print(f"vit.train: error: {e}", file=sys.stderr)
            return 2
        if is_main:
            if payload is None:
                write_json(run_dir / "config.json", _config_record(args, trainer))
            else:
                atomic_write_text(run_dir / "metrics.jsonl",
                                  "".join(json.dumps(m) + "\n" for m in trainer.metrics))
            p = trainer.progress
            status = Status(run_dir / "status.json", {
                "state": "running", "epoch": p.epoch, "step": p.global_step, "total_epochs": args.epochs,
                "total_steps": trainer.total_steps, "progress": round(p.global_step / trainer.total_steps, 5),
                "pid": os.getpid(), "host": socket.gethostname(), "start_time": now_iso(),
                "eta_seconds": None, "best_val_acc": p.best_val_acc if p.best_val_acc >= 0 else None,
                "device": str(trainer.device), "world_size": trainer.world, "error": None})
            status.start()
            log.info("%s run %s: %s, %d parameters, %d train / %d val images, %d steps on %s",
                     "resuming" if payload else "starting", run_dir, args.preset,
                     count_parameters(trainer.model), len(trainer.data.train), len(trainer.data.val),
                     trainer.total_steps, _hardware(trainer.device, trainer.world))
        state = trainer.fit(status)
        if status is not None:
            status.close()
            p = trainer.progress
            status.update(state=state, eta_seconds=0 if state == "completed" else None, epoch=p.epoch,
                          step=p.global_step, progress=round(p.global_step / trainer.total_steps, 5),
                          best_val_acc=p.best_val_acc)
            log.info("run %s %s after %d epochs; best val_acc %.4f", run_dir, state, trainer.progress.epoch,
                     trainer.progress.best_val_acc)
        return 0
    except KeyboardInterrupt:
        print("vit.train: interrupted before training started", file=sys.stderr)
        return 130
    except Exception as e:
        message = f"{type(e).__name__}: {e}".splitlines()[0]
        log.debug("%s", traceback.format_exc())
        if is_main:
            with open(run_dir / "train.log", "a") as f:
                f.write(traceback.format_exc())
        if status is not None:
            status.close()
            status.update(state="failed", error=message, eta_seconds=None)
        elif is_main and (run_dir / "config.json").exists():
            write_json(run_dir / "status.json", {"state": "failed", "error": message, "pid": os.getpid(),
                                                 "updated_time": now_iso()})
        print(f"vit.train: failed: {message} (details in {run_dir / 'train.log'})", file=sys.stderr)
        return 1
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _remove_empty_run(run_dir: Path) -> None:
    for name in ("train.log",):
        (run_dir / name).unlink(missing_ok=True)
    try:
        run_dir.rmdir()
    except OSError:
        pass


def _config_record(args: argparse.Namespace, trainer: Trainer) -> dict:
    data = trainer.data
    return {"args": vars(args), "model": trainer.config.to_dict(), "parameters": count_parameters(trainer.model),
            "dataset": {"name": args.dataset, "class_names": data.class_names, "train_size": len(data.train),
                        "val_size": len(data.val), "mean": list(data.mean), "std": list(data.std)},
            "world_size": trainer.world, "device": str(trainer.device), "created": now_iso(),
            "command": [sys.executable, "-m", "vit.train", *sys.argv[1:]]}


if __name__ == "__main__":
    sys.exit(main())
