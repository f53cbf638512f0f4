"""The options of ``python -m vit.train``: the parser, the recipes, and what a run's model, settings
and data follow from them (shared by the command and the Train page's launch checks).

The parser needs neither torch nor the rest of the wing: ``vit.train`` parses first, so ``--help`` and
usage errors answer at once; what a run needs beyond its arguments is imported where it is used."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from vit.core.cli import OneLineParser, UsageError, command_name
from vit.training.budget import BUDGET_MAX_EPOCHS, PLAN_EPOCH, parse_duration
from vit.training.specs import AUGMENTATIONS, MAX_MAGNITUDE, check_device, parse_dataset

if TYPE_CHECKING:
    from vit.model import ViTConfig
    from vit.training.data import Dataset
    from vit.training.session import TrainSettings

# The names of vit.model.PRESETS, for --help without torch (tests/test_train.py checks they are the same).
PRESET_NAMES = ("tintn-cifar10", "cifar10-p8", "mnist-p7", "cifar-s", "cifar-m", "cifar-m-sl", "mnist-p4",
                "vit-base-16", "vit-large-16", "vit-huge-14")

# What "--recipe" fills in for every option left unset on the command line.
RECIPES: dict[str, dict] = {
    # Ours: AdamW, warmup + cosine, label smoothing, clipping, crop/flip + TrivialAugment.
    "ours": dict(epochs=100, batch_size=256, lr=2e-3, min_lr=1e-5, weight_decay=0.05, warmup_epochs=5,
                 schedule="cosine", label_smoothing=0.1, grad_clip=1.0, ema=0.0, augment="trivialaugment",
                 mixup=0.0, cutmix=0.0, mix_prob=1.0, random_erasing=0.0),
    # The seed blog's: AdamW 1e-2, wd 1e-2, constant lr, batch 256, flip + RandomResizedCrop 0.8-1.0.
    "seed": dict(epochs=100, batch_size=256, lr=1e-2, min_lr=0.0, weight_decay=1e-2, warmup_epochs=0,
                 schedule="constant", label_smoothing=0.0, grad_clip=0.0, ema=0.0, augment="seed",
                 mixup=0.0, cutmix=0.0, mix_prob=1.0, random_erasing=0.0),
}

PRECISIONS = ("auto", "fp32", "bf16")  # auto: bf16 autocast on CUDA, fp32 on the CPU
MODEL_FIELDS = ("image_size", "patch_size", "hidden_size", "num_layers", "num_heads", "mlp_size",
                "dropout", "attention_dropout", "drop_path", "drop_path_schedule", "patch_shift", "attention",
                "mimetic_init")
DROP_PATH_SCHEDULES = ("linear", "uniform")  # vit.model.config.DROP_PATH_SCHEDULES, without torch
REPEAT_SAMPLERS = ("passes", "copies")  # vit.training.sampling.REPEAT_SAMPLERS, without torch
MAX_REPEAT_AUG = 64
MIMETIC_DEFAULTS = (0.7, 0.7, 0.4, 0.4)  # vit.model.config.MIMETIC_DEFAULTS, without torch
PATCH_SHIFT_CHOICES = ("none", "diagonal", "cardinal")  # vit.model.config.PATCH_SHIFTS, without torch
ATTENTION_CHOICES = ("dot", "lsa", "lsa_temperature")  # of vit.model.config.ATTENTIONS, for a plain ViT



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
                 vit/training/snapshots.py); readable while the run writes
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



# torch's thread pools crash far above this (--threads 100000 segfaulted); more threads than cores only slow down.
MAX_THREADS = 4 * (os.cpu_count() or 1)



MAX_LR = 10.0  # AdamW diverges long before; 1e300 used to pass

_positive_int = _checked(int, lambda v: v > 0, "a positive integer")
_non_negative_int = _checked(int, lambda v: v >= 0, "an integer >= 0")
_positive_float = _checked(float, lambda v: v > 0 and not math.isinf(v), "a positive number")

_duration = _checked(parse_duration, lambda v: True, "a duration above 0 and at most 366 days: seconds, or a "
                     "number with s, m, h or d (600, 10m, 1.5h)")


# torchvision draws the mixing weight from a float32 Beta(alpha, alpha): an alpha it rounds to 0 (1e-300) fails
# the run at its start with torch's Dirichlet message, so anything below float32's smallest normal number is refused.
MIN_MIX_ALPHA = 2.0 ** -126
MAX_MIX_ALPHA = 1e3
_mix_alpha = _checked(float, lambda v: v == 0 or MIN_MIX_ALPHA <= v < MAX_MIX_ALPHA,
                      f"0 (off) or a number in [{MIN_MIX_ALPHA:.2g}, {MAX_MIX_ALPHA:g})", "a number")
_probability = _checked(float, lambda v: 0 <= v <= 1, "a number in [0, 1]", "a number")
_layer_decay = _checked(float, lambda v: 0 < v <= 1, "a number in (0, 1]", "a number")
FINETUNE_MODES = ("full", "linear-probe")
DROPOUT_FIELDS = ("dropout", "attention_dropout", "drop_path")


_learning_rate = _checked(float, lambda v: 0 < v <= MAX_LR, f"a positive number of at most {MAX_LR:g}",
                          "a positive number")



def _threads(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_THREADS} threads (4 per CPU core of this machine), "
                                         f"got {text!r}")
    return value



def _mimetic(text: str) -> tuple[float, ...]:
    """--mimetic-init's ALPHA1,BETA1,ALPHA2,BETA2: four numbers in [0, 10]."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 4 or not all(0 <= v <= 10 for v in values):
        raise argparse.ArgumentTypeError(f"expected four numbers in [0, 10] separated by commas (alpha1,beta1,alpha2,"
                                         f"beta2), got {text!r}")
    return values



def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=command_name("vit.train"), description=__doc__, epilog=EPILOG,
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
    g.add_argument("--preset", default="tintn-cifar10", help=f"one of: {', '.join(PRESET_NAMES)} "
                   "(default tintn-cifar10). The number of classes follows the dataset, the number of "
                   "channels the preset (greyscale images are expanded for a 3-channel model)")
    g.add_argument("--init", metavar="FILE_OR_FOLDER", help="fine-tune a model you have instead of a preset: one "
                   "of our .pt checkpoints, a Hugging Face or timm folder, or timm / torchvision weights (see "
                   "vit.convert), or a Hub id (ORG/NAME[@REV], a timm name). Its classifier is kept when the dataset "
                   "has its classes, else replaced; images "
                   "are normalised with its own mean and std. Only --image-size and the dropout rates may change")
    g.add_argument("--finetune", choices=FINETUNE_MODES, default="full",
                   help="with --init: full (default: every weight trains) or linear-probe (only the classifier "
                   "trains, on the frozen model's features, as MAE's and DINO's linear evaluation; the frozen "
                   "part runs without dropout or stochastic depth, so it gives the features it gives at inference)")
    g.add_argument("--layer-decay", type=_layer_decay, default=1.0, metavar="DECAY",
                   help="with --init and --finetune full: layer-wise learning-rate decay (BEiT, MAE), in (0, 1]. "
                   "Of L blocks, block i trains at --lr x DECAY^(L - i), the embeddings at DECAY^(L + 1), the "
                   "final norm and classifier at --lr. Default 1 (off); MAE's FINETUNE.md fine-tunes ViT-B with "
                   "0.65 and ViT-L/H with 0.75 (BEiT: 0.65 for ViT-B)")
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
    g.add_argument("--drop-path-schedule", choices=DROP_PATH_SCHEDULES,
                   help="how --drop-path spreads over the blocks: linear (the presets': 0 at the first, the rate at "
                   "the last, timm's rule) or uniform (the rate in every block: Lee et al. 2021's one shared DropPath)")
    g.add_argument("--patch-shift", choices=PATCH_SHIFT_CHOICES,
                   help="shifted patch tokens (Lee et al. 2021): each patch also sees 4 shifted copies of the image, "
                   "normed before the projection. diagonal: the authors' (half a patch towards each corner); "
                   "cardinal: vit-pytorch's (one pixel each way); none (the presets' but cifar-m-sl's)")
    g.add_argument("--attention", choices=ATTENTION_CHOICES,
                   help="dot (softmax of q . k / sqrt(head width), the presets' but cifar-m-sl's); lsa: locality "
                   "self-attention (Lee et al. 2021: each token's own key masked out, a learned scale per head); "
                   "lsa_temperature: vit-pytorch's (one learned exp(temperature) per layer)")
    g.add_argument("--mimetic-init", type=_mimetic, nargs="?", const=MIMETIC_DEFAULTS, metavar="A1,B1,A2,B2",
                   help="mimetic initialisation of the attention (Trockman & Kolter 2023): each head's W_q W_k^T "
                   "starts near alpha1 Z + beta1 I, each layer's W_v W_proj near alpha2 Z - beta2 I (Z random). "
                   "Alone: the paper's ViT values 0.7,0.7,0.4,0.4; off by default")

    g = p.add_argument_group("recipe (options left unset take the --recipe's value)")
    g.add_argument("--recipe", choices=tuple(RECIPES), default="ours",
                   help="ours (default: AdamW, linear warmup then cosine, label smoothing, gradient "
                   "clipping, crop + flip + TrivialAugment) or seed (the seed blog's AdamW lr 1e-2, "
                   "wd 1e-2, constant lr, batch 256, flip + RandomResizedCrop 0.8-1.0)")
    g.add_argument("--epochs", type=_positive_int, help="epochs to train in total (ours and seed: 100); with "
                   f"--time-budget, the most it may plan (default {BUDGET_MAX_EPOCHS:,})")
    g.add_argument("--time-budget", type=_duration, metavar="DURATION",
                   help="train as many epochs as fit in this wall time, counted from the command's launch (600, "
                   "10m, 1.5h). The run plans them at the end of its warmup, from the mean time of its epochs "
                   "after the first (start-up, compilation and validation count towards the budget), and the "
                   "schedule's cosine then ends at the last planned epoch, as if --epochs had said it: config.json's "
                   "epochs and status.json's total_epochs change to the plan. When the pace drifts so far that what "
                   "fits differs by two epochs or more (and 1 %% of the budget), the plan is corrected: the cosine "
                   "goes on from the rate reached and ends at the new last epoch. With the cosine "
                   f"schedule, --warmup-epochs must be at least {PLAN_EPOCH} (default 5), so that the epochs before "
                   f"the plan train at the same rates; with a constant one it plans at epoch {PLAN_EPOCH}. A budget "
                   "that runs out sooner is planned when not one more epoch fits, and the run ends there")
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
    g.add_argument("--ema-warmup", action="store_true",
                   help="with --ema: warm the decay up as timm's ModelEmaV3(use_warmup=True) does, 1 - (1 + step)^-2/3 "
                   "up to --ema. Without it the first weights keep decay^steps of the average: 10 %% of a run of "
                   "11,400 steps at 0.9998")
    g.add_argument("--augment", choices=AUGMENTATIONS,
                   help="training augmentation on batches: none; crop (reflect-pad 4 px, random crop: for "
                   "digits and text); flip-crop (crop + horizontal flip); trivialaugment or randaugment "
                   "(torchvision's, after flip-crop); autoaugment (torchvision's AutoAugment, its CIFAR-10 policy, "
                   "after flip-crop, as Lee et al. 2021 train); seed (flip + RandomResizedCrop 0.8-1.0). "
                   "Ours trivialaugment, seed seed")
    g.add_argument("--repeat-aug", type=_int_in(1, MAX_REPEAT_AUG), default=1, metavar="K",
                   help="repeated augmentation: every training image drawn K times an epoch, each time augmented "
                   "anew, so an epoch is K passes (default 1: one). Lee et al. 2021 train 100 epochs at K = 3, "
                   "DeiT at K = 3; the order is --repeat-aug-sampler's")
    g.add_argument("--repeat-aug-sampler", choices=REPEAT_SAMPLERS, default="passes",
                   help="with --repeat-aug K: passes (default; Lee et al.'s RASampler as their main.py builds it: K "
                   "shuffled passes one after the other) or copies (DeiT's RASampler: each image K times in a "
                   "row, the copies on different processes at the same step under torchrun, side by side in a "
                   "batch in one; the epoch keeps all K copies where DeiT cuts it to one pass's length)")
    g.add_argument("--aug-magnitude", type=_int_in(0, MAX_MAGNITUDE), default=9,
                   help=f"RandAugment magnitude, 0..{MAX_MAGNITUDE} (default 9)")
    g.add_argument("--aug-ops", type=_positive_int, default=2, help="RandAugment ops per image (default 2)")
    g.add_argument("--mixup", type=_mix_alpha, help="mixup alpha, 0 = off (default)")
    g.add_argument("--cutmix", type=_mix_alpha, help="cutmix alpha, 0 = off (default); with "
                   "--mixup too, each batch uses one of the two")
    g.add_argument("--random-erasing", type=_probability,
                   metavar="P", help="random erasing (Zhong et al. 2017, torchvision's box rule): each training "
                   "image loses a box of 2-33 %% of its area to the data's mean with probability P (default 0; "
                   "Lee et al. 2021: 0.25)")
    g.add_argument("--mix-prob", type=_probability,
                   help="with --mixup or --cutmix: the share of batches mixed (default 1, DeiT's; Lee et al. 2021 "
                   "mix half, 0.5), the others train on their own labels")

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
    g.add_argument("--precision", choices=PRECISIONS, default="auto",
                   help="auto (default): bf16 autocast on CUDA, fp32 on CPU")
    g.add_argument("--compile", action="store_true", help="torch.compile the model, and on a GPU the augmentation "
                   "and validation too (slow first steps)")
    g.add_argument("--compile-mode", choices=("auto", "default", "reduce-overhead", "max-autotune"), default="auto",
                   help="torch.compile's mode with --compile; auto (default): reduce-overhead in a one-process run "
                   "on a GPU (the model's forward and backward replayed as CUDA graphs: 2.4x a small ViT's step on "
                   "an H100), default on the CPU and under several processes")
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

    g = p.add_argument_group("on a Ray cluster (the run becomes a Ray job, followed here until it ends)")
    g.add_argument("--ray", metavar="ADDRESS", help="the cluster's dashboard address (http://HEAD:8265). Every node "
                   "runs the job with the python on its PATH, which must be this project's environment: start "
                   "them as PATH=/path/to/.venv/bin:$PATH ray start ... The run folder and data must be on storage "
                   "every node sees; Ctrl-C stops the job gracefully")
    g.add_argument("--workers", type=_positive_int, default=1, metavar="N",
                   help="with --ray: training processes (Ray Train workers, DistributedDataParallel; default 1)")
    g.add_argument("--gpus-per-worker", type=_float_in(0.0, 1e3), default=0.0, metavar="G",
                   help="with --ray: GPUs each worker asks for (default 0: CPU workers)")
    return p


RAY_OPTIONS = ("--ray", "--workers", "--gpus-per-worker")


def without_ray_options(argv: list[str]) -> list[str]:
    """``argv`` less ``RAY_OPTIONS`` and their values: the run's own arguments, as the job's workers get them."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in RAY_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in RAY_OPTIONS)):
            out.append(arg)
    return out



def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")



def given_options(argv: list[str]) -> set[str]:
    """The destinations of the options written on the command line (not left to defaults)."""
    parser = build_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))



def parse_args(argv: list[str] | None = None, check_out: bool = True, device_here: bool = True
               ) -> argparse.Namespace:
    """Parse and check everything that can be checked without the data; raises UsageError.

    ``check_out`` is False on the ranks other than 0 of a distributed run, which never write. ``device_here``
    False (and with ``--ray``): the run's devices are the cluster's, not this machine's, so ``--device cuda`` is
    not refused on a submitting machine without CUDA.
    """
    from vit.model import PRESETS  # vit.model.config's: no torch

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.ray is None and {"workers", "gpus_per_worker"} & given_options(argv):
        raise UsageError("--workers and --gpus-per-worker go with --ray ADDRESS (a local run uses torchrun for "
                         "several processes)")
    if args.ray is not None:  # vit.runs.ray_jobs hands the rest to the job; these are not the run's own
        argv = without_ray_options(argv)
    if args.compile_mode not in ("auto", "default") and not args.compile:
        raise UsageError(f"--compile-mode {args.compile_mode} needs --compile")
    if args.repeat_aug == 1 and "repeat_aug_sampler" in given_options(argv):
        raise UsageError("--repeat-aug-sampler orders the copies of --repeat-aug K; give K above 1 as well")
    if args.ema_warmup and not args.ema:
        raise UsageError("--ema-warmup needs --ema DECAY (the decay it warms up to)")
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
    if args.time_budget and args.epochs is None:
        args.epochs = BUDGET_MAX_EPOCHS
    for key, value in RECIPES[args.recipe].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if not explicit_warmup and not args.time_budget:  # short runs get a proportionally short warmup
        args.warmup_epochs = min(args.warmup_epochs, args.epochs / 10)
    if args.time_budget:
        _check_budget(args)
    if args.init:
        fixed = sorted(given_options(argv) & {"preset", "patch_size", "hidden_size", "num_layers", "num_heads",
                                              "mlp_size", "patch_shift", "attention", "mimetic_init",
                                              "drop_path_schedule"})
        if fixed:
            raise UsageError(f"{', '.join(_flag(name) for name in fixed)} cannot be given with --init: the model "
                             "is the one you start from (only --image-size and the dropout rates may change)")
    elif args.preset not in PRESETS:
        raise UsageError(f"unknown preset {args.preset!r}; choose one of: {', '.join(PRESETS)}")
    _check_finetune(args)
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
        check_run_folder(Path(args.out))
    check_device(args.device)  # the spelling: a --ray run's devices are the cluster's, so no torch here
    if device_here and args.ray is None:  # a local run: whether this machine has it (torch loads, as the run will)
        from vit.training.distributed import parse_device

        parse_device(args.device)
    return args



def _check_budget(args: argparse.Namespace) -> None:
    """--time-budget: the planning epochs must fit in --epochs and, with the cosine, in the warmup."""
    if args.epochs <= PLAN_EPOCH:
        raise UsageError(f"--time-budget plans the epochs at the end of epoch {PLAN_EPOCH}, so --epochs (the most "
                         f"it may plan) must be above {PLAN_EPOCH}, not {args.epochs}")
    if args.schedule == "cosine" and args.warmup_epochs < PLAN_EPOCH:
        raise UsageError(f"--time-budget with the cosine schedule needs --warmup-epochs {PLAN_EPOCH} or more (got "
                         f"{args.warmup_epochs:g}): the epochs are planned at the end of epoch {PLAN_EPOCH}, and only "
                         "the warmup's rates do not depend on how many follow")



def _check_finetune(args: argparse.Namespace) -> None:
    """--finetune and --layer-decay: fine-tuning options, for a run that starts from --init."""
    probe = args.finetune == "linear-probe"
    if probe and not args.init:
        raise UsageError("--finetune linear-probe needs --init FILE_OR_FOLDER: a probe trains a classifier on a "
                         "trained model's features, and a preset's are random")
    if args.layer_decay != 1.0 and not args.init:
        raise UsageError("--layer-decay needs --init FILE_OR_FOLDER: it keeps a trained model's lower layers near "
                         "their weights, and a preset has none to keep (leave it at 1)")
    if args.layer_decay != 1.0 and probe:
        raise UsageError("--layer-decay has no effect with --finetune linear-probe: only the classifier trains")
    dropouts = [name for name in DROPOUT_FIELDS if getattr(args, name) is not None]
    if probe and dropouts:
        raise UsageError(f"{', '.join(_flag(name) for name in dropouts)} cannot be given with --finetune "
                         "linear-probe: the frozen model runs without dropout, so it gives its inference features")



def check_run_folder(out: Path) -> None:
    """Refuse an --out that is a file, holds files already, or cannot be created."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder for the run")
    if out.is_dir() and any(out.iterdir()):
        raise UsageError(f"{out} already holds files; continue it with --resume {out} or choose another --out")
    existing = next(p for p in (out, *out.absolute().parents) if p.exists())
    if not os.access(existing, os.W_OK):
        raise UsageError(f"cannot create the run folder {out}: {existing} is not writable")



def model_config(args: argparse.Namespace, num_channels: int, num_classes: int) -> ViTConfig:
    from vit.model import ViTConfig

    overrides = {k: getattr(args, k) for k in MODEL_FIELDS if getattr(args, k) is not None}
    return ViTConfig.from_preset(args.preset, num_channels=num_channels, num_classes=num_classes, **overrides)



def resolve_model(args: argparse.Namespace, num_classes: int, class_names: list[str] | None = None) -> ViTConfig:
    """Fix the model of a new run: the preset's channels, the dataset's classes, the overrides;
    with ``--init`` the imported model's (its classifier replaced when the classes differ)."""
    from vit.model import PRESETS

    args.num_classes = num_classes
    if getattr(args, "init", None):
        return _resolve_init(args, num_classes, class_names)
    args.channels = PRESETS[args.preset].num_channels
    config = model_config(args, num_channels=args.channels, num_classes=num_classes)
    args.model = config.to_dict()
    args.image_size_resolved = config.image_size
    return config



def _resolve_init(args: argparse.Namespace, num_classes: int, class_names: list[str] | None) -> ViTConfig:
    from vit.checkpoint import CheckpointError
    from vit.model import ViTConfig
    from vit.training.finetune import prepare_init  # opens HF / timm / torchvision sources only when asked

    try:
        init = prepare_init(args.init, num_classes, class_names, args.image_size)
        dropouts = {k: getattr(args, k) for k in DROPOUT_FIELDS if getattr(args, k) is not None}
        if getattr(args, "finetune", "full") == "linear-probe":  # frozen features: the same in training as after
            dropouts = dict.fromkeys(DROPOUT_FIELDS, 0.0)
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
    from dataclasses import fields

    from vit.model import ViTConfig
    from vit.training.session import TrainSettings

    values = {f.name: getattr(args, f.name) for f in fields(TrainSettings)}
    return TrainSettings(**{**values, "model": ViTConfig.from_dict(args.model)})



def load_run_data(args: argparse.Namespace, rank: int = 0, world: int = 1) -> Dataset:
    """The run's dataset. Under several processes rank 0 decodes and caches it first, then the
    others read that cache instead of all decoding at once."""
    from vit.training.data import load_dataset
    from vit.training.distributed import main_rank_first

    with main_rank_first(rank, world):
        data = load_dataset(args.dataset, args.image_size_resolved, args.channels, data_dir=args.data_dir,
                            cache_dir=args.cache_dir, val_fraction=args.val_fraction, seed=args.seed)
    if getattr(args, "init_mean", None):  # an imported model keeps the normalisation its weights were trained with
        data = dataclasses.replace(data, mean=tuple(args.init_mean), std=tuple(args.init_std))
    return data
