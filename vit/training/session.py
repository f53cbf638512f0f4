"""What a training session works from and keeps, beside the model and the loop (``vit.training.trainer``): the
run's settings (``TrainSettings``, checked against the data and the process count by ``check_data``), where training
stands (``Progress``, saved in last.pt so a resume continues exactly there), the clock of its steps (``EtaClock``)
and its stop signal (``StopRequest``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from vit.checkpoint import CheckpointError
from vit.core.cli import UsageError
from vit.model import ViTConfig
from vit.training.data import DataError, Dataset


@dataclass(frozen=True)
class TrainSettings:
    """What a run trains and how: the resolved model and recipe (``vit.train`` fills in defaults)."""

    dataset: str  # the --dataset spec, recorded in checkpoints and error messages
    preset: str  # the model preset the config came from, recorded in checkpoints
    recipe: str  # "ours" or "seed"; the seed recipe decays every parameter, as the blog does
    model: ViTConfig  # with the dataset's classes and the preset's channels
    num_classes: int  # the dataset's
    epochs: int  # in total, over every session of the run
    batch_size: int  # global: split over the processes
    lr: float  # peak learning rate
    min_lr: float  # at the end of the cosine
    weight_decay: float
    warmup_epochs: float  # may be fractional
    schedule: str  # "cosine" or "constant" after the warmup
    label_smoothing: float
    grad_clip: float  # max gradient norm, 0 = off
    ema: float  # EMA decay per step, 0 = off
    augment: str  # a vit.training.data.AUGMENTATIONS policy
    aug_magnitude: int
    aug_ops: int
    mixup: float  # alpha, 0 = off
    cutmix: float  # alpha, 0 = off
    mix_prob: float  # the share of batches mixed (with mixup or cutmix)
    random_erasing: float  # the probability that a training image loses a box to the data's mean
    seed: int
    precision: str = "auto"  # auto (bf16 on CUDA), fp32 or bf16
    ema_warmup: bool = False  # the EMA's decay warmed up as timm's ModelEmaV3(use_warmup=True)
    compile: bool = False  # torch.compile the model (and on a GPU the augmentation and validation)
    compile_mode: str = "auto"  # torch.compile's mode; "reduce-overhead" replays the step as CUDA graphs; "auto":
    # reduce-overhead in a one-process run on a GPU (the step is launch-bound there: 2.4x, issue 89), else "default"
    scale_batch: bool = False  # under N processes: N x batch_size per step, peak and final LR x sqrt(N)
    sync_every: int = 0  # steps between host syncs of the statistics (and DDP stop checks); 0: 1 on CPU, 32 on GPU
    checkpoint_seconds: float = 60.0  # last.pt at an epoch end at most this often (always at the end and on stop)
    eval_batch_size: int = 500
    log_every: float = 30.0  # seconds between progress lines when not on a terminal
    init: str | None = None  # fine-tune this model (vit.finetune) instead of a random initialisation
    finetune: str = "full"  # with init: "full", or "linear-probe" (only the classifier trains)
    layer_decay: float = 1.0  # layer-wise lr decay (BEiT / MAE): layer l of L+1 trains at lr x decay^(L+1-l); 1 = off
    attention_every: int = 1  # attention snapshot every N epochs, the last and the initial weights too; 0 = off
    save_every: int = 0  # a checkpoint of every Nth epoch in checkpoints/ (epochs, not time); 0 = off
    keep: int = 0  # of those, the K most recent plus the best epoch's are kept; 0 = all
    time_budget: float | None = None  # seconds from launch: epochs is then the most to plan (see plan_epochs)
    repeat_aug: int = 1  # each image drawn this many times an epoch (repeated augmentation); 1 = one pass
    repeat_aug_sampler: str = "passes"  # their order: vit.training.sampling.REPEAT_SAMPLERS


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
    # With a time budget: the epochs planned (0: not yet), as later corrected; the first plan, whose cosine the
    # schedule follows; the most it may plan; and each correction's continuation of the cosine, [its first step,
    # the rate's share of the peak there, the step where it ends].
    planned_epochs: int = 0
    budget_base_epochs: int = 0
    budget_max_epochs: int = 0
    budget_segments: list = field(default_factory=list)

    @classmethod
    def from_dict(cls, values: dict) -> Progress:
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            raise CheckpointError(f"last.pt's progress has unknown field(s) {', '.join(unknown)}; it was "
                                  "written by a newer version")
        return cls(**values)


def global_batch(settings: TrainSettings, world: int) -> tuple[int, float]:
    """(images per optimizer step, learning-rate factor) of a run under ``world`` processes.

    --batch-size is the global batch, split over the processes, unless ``scale_batch``: then each
    process keeps it, the global batch grows N-fold, and the learning rates grow sqrt(N)-fold, the
    square-root rule for Adam-type optimizers (Malladi et al. 2022, "On the SDEs and Scaling Rules
    for Adaptive Gradient Algorithms"; SGD's linear rule, Goyal et al. 2017, overshoots with AdamW).
    """
    if settings.scale_batch and world > 1:
        return settings.batch_size * world, math.sqrt(world)
    return settings.batch_size, 1.0


def check_data(settings: TrainSettings, data: Dataset, world: int = 1) -> None:
    """Checks that need the loaded data; raise UsageError or DataError before training starts."""
    if len(data.class_names) != settings.num_classes:
        raise DataError(f"{settings.dataset} has {len(data.class_names)} classes, the run expects "
                        f"{settings.num_classes}")
    batch = global_batch(settings, world)[0]
    if batch > len(data.train):
        per_process = batch // settings.batch_size
        scaled = f" (x {world} processes with --scale-batch)" if per_process > 1 else ""
        raise UsageError(f"--batch-size {settings.batch_size}{scaled} is larger than the {len(data.train)} training "
                         f"images of {settings.dataset}; use at most {len(data.train) // per_process}")
    if settings.batch_size % world and not settings.scale_batch:
        raise UsageError(f"--batch-size {settings.batch_size} must be divisible by the {world} processes")
    if len(data.val) == 0:
        raise DataError(f"{settings.dataset} has no validation images; add PATH/val/<class>/ images or raise "
                        "--val-fraction")

