"""The training loop: a ViT trained on a uint8 tensor dataset, with the settings of a ``TrainSettings``.

What a session works from and keeps (the settings, ``Progress``, the step clock, the stop signal) is
``vit.training.session``'s; the parameter groups and the learning rate's schedule are ``vit.training.optimization``'s.

``Trainer`` knows nothing of the command line (``vit.train`` builds its settings from the
arguments) nor of the run folder's format beyond writing metrics and checkpoints at epoch ends
through ``vit.core.runfiles`` and ``vit.checkpoint``. Under several processes (``vit.training.distributed``)
every rank trains on its shard of each global batch and only rank 0 writes.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import math
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from vit.checkpoint import CheckpointError, Preprocessing, save_checkpoint
from vit.core.cli import UsageError  # noqa: F401 (invalid arguments or settings: one line before anything is written)
from vit.core.images import normalize
from vit.core.runfiles import (
    BEST_CHECKPOINT,
    CONFIG_FILE,
    LAST_CHECKPOINT,
    METRICS_FILE,
    STEPS_FILE,
    Status,
    epoch_checkpoint_path,
    epoch_checkpoints,
    epochs_to_prune,
    now_iso,
    parse_json,
    read_text_bounded,
    resume_hint,
    write_json,
    write_metrics,
)
from vit.model import ViT, count_parameters
from vit.training import sampling
from vit.training.budget import BUDGET_SPACING, BUDGET_TOLERANCE, PLAN_EPOCH, plan_epochs
from vit.training.data import BatchAugment, Dataset, random_erasing
from vit.training.optimization import layer_id, param_groups, schedule_factor  # noqa: F401 (layer_id: importable where it was)
from vit.training.session import (
    EtaClock,
    Progress,
    StopRequest,
    TrainSettings,
    check_data,
    global_batch,
)
from vit.training.snapshots import (
    has_probe,
    load_probe,
    make_probe,
    save_probe,
    snapshot_path,
    take_snapshot,
    write_snapshot,
)

log = logging.getLogger(__name__)

FAULT_ENV = "VIT_TRAIN_FAULT_AT_STEP"  # test hook: raise inside training at this global step

STEP_ROW_SECONDS = 2.0  # steps.jsonl: a row at most this often (and at each epoch's end)
MAX_STEP_ROWS = 20_000  # then every other row goes and the interval doubles: ~11 h at 2 s before the first thinning


class Trainer:
    """Trains the model of ``settings`` on ``data``; writes into ``run_dir`` (rank 0 only) at epoch ends."""

    def __init__(self, settings: TrainSettings, data: Dataset, run_dir: Path | None,
                 resume_payload: dict | None = None, rank: int = 0, world: int = 1,
                 device: torch.device | str = "cpu", stop: StopRequest | None = None,
                 launched: float | None = None) -> None:
        check_data(settings, data, world)
        self.launched = time.time() if launched is None else launched  # the budget's origin: the command's start
        self.epoch_ends: list[float] = []  # when this session's epochs ended, for the budget's plan
        self.settings, self.data, self.run_dir = settings, data, run_dir
        self.rank, self.world, self.device = rank, world, torch.device(device)
        self.is_main = rank == 0
        self.stop = stop if stop is not None else StopRequest()
        self.eval_seconds: float | None = None  # the last validation's duration, for the ETA
        self.batch_size, self.lr_factor = global_batch(settings, world)
        self.local_batch = self.batch_size // world
        self.steps_per_epoch = sampling.steps_per_epoch(len(data.train), self.batch_size, settings.repeat_aug)
        # A host sync (.item(), .cpu()) costs nothing on the CPU; on a GPU it drains the queue of
        # launched kernels, so the statistics stay on the device between syncs.
        self.sync_every = settings.sync_every or (1 if self.device.type == "cpu" else 32)
        self.total_steps = self.steps_per_epoch * settings.epochs
        on_gpu = self.device.type == "cuda"  # the whole uint8 dataset lives on the GPU there
        self.train = data.train.to(self.device) if on_gpu else data.train
        self.val = data.val.to(self.device) if on_gpu else data.val

        torch.manual_seed(settings.seed)
        self.config = settings.model
        self.model = ViT(self.config)
        if settings.init:
            from vit.training.finetune import freeze_all_but_head, load_init, prepare_init

            if resume_payload is None:  # a resumed run's weights come from its last.pt
                load_init(self.model, prepare_init(settings.init, settings.num_classes, data.class_names,
                                                   self.config.image_size))
            if settings.finetune == "linear-probe":
                freeze_all_but_head(self.model)
        self.model = self.model.to(self.device)
        # The EMA's step counter lives on the device; _update_ema keeps its own count on the host.
        self.ema = (AveragedModel(self.model, device=self.device, multi_avg_fn=get_ema_multi_avg_fn(settings.ema))
                    if settings.ema > 0 else None)
        groups = param_groups(self.model, settings.weight_decay, decay_everything=settings.recipe == "seed",
                              layer_decay=settings.layer_decay)
        self.lr_scales = [group.pop("lr_scale") for group in groups]  # kept here: a resume reloads the groups
        # Fused AdamW on a GPU: one kernel per step instead of a dozen per parameter group.
        self.optimizer = torch.optim.AdamW(groups, lr=settings.lr * self.lr_factor,
                                           weight_decay=settings.weight_decay, betas=(0.9, 0.999),
                                           fused=True if on_gpu else None)
        self.progress = Progress()
        self.metrics: list[dict] = []
        self.steps: list[dict] = []  # steps.jsonl: the training loss every few seconds (rank 0)
        self.step_seconds = STEP_ROW_SECONDS  # doubled each time the rows are thinned to stay bounded
        self.rng_state: dict | None = None
        if resume_payload is not None:
            self._restore(resume_payload)
        self.ema_updates = int(self.ema.n_averaged) if self.ema is not None else 0  # one sync, here
        self.planned_at = self.progress.epoch  # the budget's last plan or correction (a resumed session: its start)
        self.scheduler = self._scheduler()
        self.net: nn.Module = self.model
        if self.world > 1:
            self.net = nn.parallel.DistributedDataParallel(
                self.net, device_ids=[self.device.index] if on_gpu else None)
        self.eval_net: nn.Module = self.ema.module if self.ema is not None else self.model
        self.augment = BatchAugment(settings.augment, magnitude=settings.aug_magnitude, num_ops=settings.aug_ops)
        self.augment.prepare(*self.train.images.shape[-2:], self.train.images.device)  # outside any compiled graph
        self.compile_mode = (resolve_compile_mode(settings.compile_mode, self.device, world) if settings.compile
                             else None)  # what torch.compile runs, recorded in config.json
        if self.compile_mode is not None:
            self.net = torch.compile(self.net, mode=self.compile_mode)
            if on_gpu:  # on the CPU the augmentation runs op by op on subsets: data-dependent shapes
                self.augment = compiled_augmentation(self.augment, self.compile_mode)
                self.eval_net = torch.compile(self.eval_net, mode=self.compile_mode)
        self.autocast_dtype = _autocast_dtype(settings.precision, self.device)
        mixers = []
        if settings.mixup > 0 or settings.cutmix > 0:
            # Here, not at the top: only MixUp and CutMix need torchvision, whose models and ops cost every training
            # process (torchrun's ranks, Ray's workers) ~0.3 s of CPU at start-up (the torch._dynamo it loads comes
            # anyway: the optimizer loads it on its first parameter group).
            from torchvision.transforms import v2
        if settings.mixup > 0:
            mixers.append(v2.MixUp(alpha=settings.mixup, num_classes=settings.num_classes))
        if settings.cutmix > 0:
            mixers.append(v2.CutMix(alpha=settings.cutmix, num_classes=settings.num_classes))
        if mixers and settings.mix_prob < 1:  # the other batches keep their labels
            share = settings.mix_prob / len(mixers)
            mixers, odds = [*mixers, v2.Identity()], [share] * len(mixers) + [1 - settings.mix_prob]
        else:
            odds = None
        self.mixer = v2.RandomChoice(mixers, p=odds) if mixers else None
        self.preprocessing = Preprocessing(self.config.image_size, self.config.num_channels,
                                           self.data.mean, self.data.std)
        self.session_start = time.time()
        self.elapsed_before = self.progress.elapsed
        self.last_saved: float | None = None  # when this session last wrote last.pt
        self.snapshot_inputs: tuple[torch.Tensor, torch.Tensor] | None = None  # (probe, sample), set by fit

    def _scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        """Linear warmup then cosine (or constant), per step, fast-forwarded when resuming.

        One factor of the step for every group, each group's rate being its share of the peak (its
        layer-wise scale), as MAE's ``lr_sched.adjust_learning_rate`` does: the cosine's floor
        --min-lr is scaled with it. Replaying the steps gives the rates of an uninterrupted run with
        the same --epochs, and re-plans the schedule for a run extended with a larger --epochs.
        """
        settings = self.settings
        for group, scale in zip(self.optimizer.param_groups, self.lr_scales, strict=True):
            group["lr"] = settings.lr * self.lr_factor * scale
            group.pop("initial_lr", None)
        warmup = int(round(settings.warmup_epochs * self.steps_per_epoch))
        p, total, segments = self.progress, self.total_steps, ()
        if p.planned_epochs and p.planned_epochs == settings.epochs:  # a budget's plan, not a later --epochs
            total = p.budget_base_epochs * self.steps_per_epoch
            segments = tuple(tuple(segment) for segment in p.budget_segments)
        factor = functools.partial(schedule_factor, warmup=warmup, total=total, schedule=settings.schedule,
                                   floor=settings.min_lr / settings.lr, segments=segments)
        scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
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
        self.steps = [row for row in state.get("steps") or [] if row.get("step", 0) <= self.progress.global_step]
        self.step_seconds = float(state.get("step_seconds") or STEP_ROW_SECONDS)
        rng = state.get("rng") or []
        if self.settings.scale_batch and len(rng) not in (0, self.world):
            raise CheckpointError(f"the run trained with --scale-batch under {len(rng)} process(es); resume it "
                                  f"with {len(rng)}, not {self.world}, or its batch and learning rate change")
        if len(rng) == self.world:  # else (another process count) each epoch is re-seeded
            self.rng_state = rng[self.rank]

    # -- the loop ------------------------------------------------------------------------------

    def fit(self, status: Status | None) -> str:
        """Train until the last epoch or a stop signal; returns the final state."""
        settings, p = self.settings, self.progress
        self.session_start, self.elapsed_before = time.time(), p.elapsed
        clock = EtaClock()
        last_status = last_log = 0.0
        if self._snapshots_on():
            self._prepare_snapshots()
            if p.step_in_epoch == 0 and not snapshot_path(self.run_dir, p.epoch).is_file():
                _say_phase(status, "attention snapshot of the initial weights" if p.epoch == 0 else
                           f"attention snapshot of epoch {p.epoch}")
                self._snapshot()  # the initial weights, or an epoch whose snapshot a kill cut off
        _say_phase(status, self.opening_phase())
        first_step = True
        while p.epoch < self.settings.epochs:  # a time budget's plan can change it
            order = self.epoch_order(p.epoch)
            if self.train.images.device.type == "cuda":  # one pinned copy per epoch, none per step
                order = order.pin_memory().to(self.train.images.device, non_blocking=True)
            self._seed_epoch()
            epoch_start = time.time() - p.epoch_seconds
            self.net.train()
            bar = _progress_bar(self.is_main, self.steps_per_epoch, p.step_in_epoch, p.epoch + 1,
                                self.settings.epochs)
            # The epoch's running (loss sum, hits) on the device, folded into p at each sync.
            sums = torch.tensor([p.loss_sum, p.correct], dtype=torch.float64, device=self.device)
            synced = sums.clone()
            stopping = False
            last_row = (time.time(), p.loss_sum, p.correct, p.seen)  # the training loss since: steps.jsonl
            while p.step_in_epoch < self.steps_per_epoch:
                idx = order[p.step_in_epoch * self.local_batch:(p.step_in_epoch + 1) * self.local_batch]
                stats = self.step(idx)  # (mean loss, hits) of this rank's share
                if first_step and settings.compile:  # compiled: now the epoch itself runs
                    _say_phase(status, self.opening_phase(compiled=True))
                first_step = False
                sums[0] += stats[0] * len(idx)
                sums[1] += stats[1]
                p.seen += len(idx)
                p.step_in_epoch += 1
                p.global_step += 1
                now = time.time()
                clock.step_done(now)
                sync = p.step_in_epoch % self.sync_every == 0 or p.step_in_epoch == self.steps_per_epoch
                if self.world == 1:
                    stopping = self.stop.requested  # a host flag: checked every step
                if sync or stopping:
                    stopping = self._sync_stats(sums, synced) or stopping
                    if now - last_row[0] >= self.step_seconds or p.step_in_epoch == self.steps_per_epoch:
                        last_row = self._step_row(last_row, now)
                if bar is not None:
                    bar.update(1)
                    if sync:
                        bar.set_postfix(loss=f"{p.loss_sum / p.seen:.3f}", lr=f"{self.lr():.2e}", refresh=False)
                elif self.is_main and sync and now - last_log >= settings.log_every:
                    last_log = now
                    log.info("epoch %d step %d/%d loss %.4f acc %.4f lr %.2e", p.epoch + 1, p.step_in_epoch,
                             self.steps_per_epoch, p.loss_sum / p.seen, p.correct / p.seen, self.lr())
                if status is not None and now - last_status >= 1.0:
                    last_status = now
                    status.update(epoch=p.epoch + 1, step=p.global_step,
                                  progress=round(p.global_step / self.total_steps, 5),
                                  eta_seconds=self._eta(clock), elapsed_seconds=round(self._elapsed(), 3))
                if stopping:
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
            self.epoch_ends.append(time.time())
            clock.exclude(self.epoch_ends[-1] - start)
            if settings.time_budget and not p.planned_epochs and p.epoch >= PLAN_EPOCH:
                self._plan_when_due(status, clock, self.epoch_ends[-1] - start)
            elif settings.time_budget and p.planned_epochs:
                self._replan_when_off(status)
        return "completed"

    # -- a time budget ---------------------------------------------------------------------------

    def _plan_when_due(self, status: Status | None, clock: EtaClock, end_seconds: float) -> None:
        """With a time budget, fix the run's epochs at the end of its warmup (at the earliest PLAN_EPOCH; with a
        constant rate at PLAN_EPOCH), or sooner when not one more epoch fits: rank 0's plan, for every rank.
        Then re-plan what follows from it: the schedule's cosine, the totals, config.json and status.json.

        An epoch's time is the mean wall time of this session's epochs after its first (which compiles): each
        from the end of the one before, with its steps, validation, snapshot and checkpoints. A session that has
        ended only one epoch has its steps' pace and this epoch end's time.
        """
        settings, p = self.settings, self.progress
        ends = self.epoch_ends
        if len(ends) >= 2:
            epoch_seconds = (ends[-1] - ends[0]) / (len(ends) - 1)
        else:
            epoch_seconds = (clock.seconds_per_step() or 0.0) * self.steps_per_epoch + end_seconds
        spent = self.elapsed_before + ends[-1] - self.launched  # earlier sessions' training, and all of this one
        planned = plan_epochs(settings.time_budget, spent, epoch_seconds, p.epoch, settings.epochs)
        plan_at = max(PLAN_EPOCH, int(settings.warmup_epochs)) if settings.schedule == "cosine" else PLAN_EPOCH
        due = p.epoch >= plan_at or planned <= p.epoch
        planned, due = self._rank_0s(planned, due)
        if not due:
            return
        p.planned_epochs = p.budget_base_epochs = planned
        p.budget_max_epochs = settings.epochs
        self._apply_plan(status, planned, spent, epoch_seconds)

    def _replan_when_off(self, status: Status | None) -> None:
        """After the plan, at each epoch's end: when the epochs take so much more or less time than planned that
        what fits in the budget now differs from the plan by two epochs or more (and by 1 % of the budget), correct
        the plan to it. The pace is the mean of this session's epochs after its first, as for the plan. The cosine
        continues from the rate it has reached and ends at the new last epoch."""
        settings, p, ends = self.settings, self.progress, self.epoch_ends
        if p.epoch >= settings.epochs or p.planned_epochs != settings.epochs or len(ends) < 2:
            return  # ended, extended past the plan by --epochs, or no epoch after the session's first yet
        if p.epoch - self.planned_at < max(2, math.ceil(BUDGET_SPACING * settings.epochs)):
            return  # too soon after the last plan: the pace's mean is still noisy
        epoch_seconds = (ends[-1] - ends[0]) / (len(ends) - 1)
        spent = self.elapsed_before + ends[-1] - self.launched
        fits = plan_epochs(settings.time_budget, spent, epoch_seconds, p.epoch, p.budget_max_epochs)
        off = abs(fits - settings.epochs) >= max(2, math.ceil(BUDGET_TOLERANCE * settings.time_budget /
                                                               max(epoch_seconds, 1e-9)))
        fits, off = self._rank_0s(fits, off)
        if not off:
            return
        if settings.schedule == "cosine":
            reached = self.scheduler.lr_lambdas[0](p.global_step)
            p.budget_segments.append([p.global_step, reached, fits * self.steps_per_epoch])
        p.planned_epochs = fits
        self._apply_plan(status, fits, spent, epoch_seconds)

    def _rank_0s(self, epochs: int, decided: bool) -> tuple[int, bool]:
        """Rank 0's (epochs, decision) of a time budget's plan, for every rank (each measured its own clock)."""
        if self.world == 1:
            return epochs, decided
        flag = torch.tensor([epochs, float(decided)], dtype=torch.float64, device=self.device)
        dist.broadcast(flag, src=0)
        return int(flag[0].item()), bool(flag[1].item())

    def _apply_plan(self, status: Status | None, planned: int, spent: float, epoch_seconds: float) -> None:
        """The run's epochs become ``planned``: the totals, the schedule, the record and last.pt."""
        settings, p = self.settings, self.progress
        self.planned_at = p.epoch
        self.settings = replace(settings, epochs=planned)
        self.total_steps = self.steps_per_epoch * planned
        self.scheduler = self._scheduler()  # the same rates up to here, then the planned cosine
        if self.is_main:
            self._record_plan(status, spent, epoch_seconds)
        if planned <= p.epoch and self._snapshots_on() and p.epoch % settings.attention_every:
            self._snapshot()  # the last epoch's, which its end did not know it was
        self._save_last()  # the plan itself: a resume from here keeps it

    def _record_plan(self, status: Status | None, spent: float, epoch_seconds: float) -> None:
        """The plan in the log, config.json (its epochs, and ``budget_plan``) and status.json's totals."""
        settings, p = self.settings, self.progress
        planned, most = settings.epochs, p.budget_max_epochs
        corrected = p.planned_epochs != p.budget_base_epochs or p.budget_segments
        log.info("time budget %.0f s: %.1f s spent, %.2f s an epoch; %s %d epochs in all%s",
                 settings.time_budget, spent, epoch_seconds, "the plan is now" if corrected else "planned",
                 planned, f" (--epochs {most} bounds it)" if planned == most else "")
        if planned <= p.epoch:
            log.warning("time budget: no epoch after the %d planning ones fits in %.0f s; the run ends here%s",
                        p.epoch, settings.time_budget, ", inside its warmup" if settings.schedule == "cosine" else "")
        if self.run_dir is not None:
            config_file = self.run_dir / CONFIG_FILE
            record = parse_json(read_text_bounded(config_file))
            record["args"]["epochs"] = planned
            plan = {"time_budget": settings.time_budget, "at_epoch": p.epoch, "spent_seconds": round(spent, 3),
                    "epoch_seconds": round(epoch_seconds, 3), "epochs": planned, "max_epochs": most}
            if corrected:
                record["budget_plan"].setdefault("corrections", []).append(plan)
                record["budget_plan"]["epochs"] = planned
            else:
                record["budget_plan"] = plan
            write_json(config_file, record)
        if status is not None:
            status.update(total_epochs=planned, total_steps=self.total_steps,
                          progress=round(p.global_step / self.total_steps, 5))

    def opening_phase(self, compiled: bool = False) -> str | None:
        """What this session does before its first epoch ends, as status.json's ``phase`` says it (None once an
        epoch has ended: the table's epoch and progress say the rest). Compiling comes first with --compile: its
        first step takes from seconds to minutes."""
        if self.settings.compile and not compiled:
            return "compiling the model (the first step)"
        p = self.progress
        return "first epoch" if p.global_step == 0 or (p.epoch == 0 and compiled) else \
            f"resumed in epoch {p.epoch + 1}"

    def _seed_epoch(self) -> None:
        """Continue a resumed epoch's random stream exactly; start every other epoch from its seed."""
        p = self.progress
        if p.step_in_epoch > 0 and self.rng_state is not None:
            _set_rng(self.rng_state, self.device)
        else:
            torch.manual_seed(_mix(self.settings.seed, p.epoch, p.step_in_epoch, self.rank))
        self.rng_state = None

    def _elapsed(self) -> float:
        return self.elapsed_before + time.time() - self.session_start

    def _eta(self, clock: EtaClock) -> float | None:
        p, settings = self.progress, self.settings
        if settings.time_budget and not p.planned_epochs:  # before the plan: what is left of the budget
            return round(max(settings.time_budget - self.elapsed_before - (time.time() - self.launched), 0.0), 1)
        eval_seconds = self.eval_seconds
        if eval_seconds is None:  # before the first validation: forward only, about a third of a step
            rate = clock.seconds_per_step() or 0.0
            eval_seconds = rate / self.local_batch * len(self.val) / self.world / 3
        eta = clock.eta(self.total_steps - p.global_step, settings.epochs - p.epoch, eval_seconds)
        return None if eta is None else round(eta, 1)

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """This rank's sample indices for ``epoch`` (``vit.training.sampling``), from a seed per epoch."""
        return sampling.epoch_order(len(self.train), self.batch_size, _mix(self.settings.seed, epoch, 0, 0),
                                    self.world, self.rank, self.settings.repeat_aug, self.settings.repeat_aug_sampler)

    def _step_row(self, since: tuple[float, float, float, int], now: float) -> tuple[float, float, float, int]:
        """Append the training loss and accuracy since ``since`` (time, loss sum, hits, images seen) to
        steps.jsonl (rank 0); returns the new mark. Past ``MAX_STEP_ROWS`` every other row is dropped and the
        interval doubled, so a run of any length keeps a bounded file."""
        p = self.progress
        images = p.seen - since[3]
        if not self.is_main or self.run_dir is None or images <= 0:
            return now, p.loss_sum, p.correct, p.seen
        row = {"step": p.global_step, "epoch": round(p.epoch + p.step_in_epoch / self.steps_per_epoch, 5),
               "train_loss": (p.loss_sum - since[1]) / images, "train_acc": (p.correct - since[2]) / images,
               "images": images, "lr": self.lr(), "elapsed_seconds": round(self._elapsed(), 3)}
        self.steps.append(row)
        if len(self.steps) > MAX_STEP_ROWS:
            self.steps = self.steps[(len(self.steps) - 1) % 2::2]  # every other row, the newest kept
            self.step_seconds *= 2
            write_metrics(self.run_dir / STEPS_FILE, self.steps)
        else:
            with open(self.run_dir / STEPS_FILE, "a") as f:  # a torn last line is skipped by every reader
                f.write(json.dumps(row) + "\n")
        return now, p.loss_sum, p.correct, p.seen

    def _sync_stats(self, sums: torch.Tensor, synced: torch.Tensor) -> bool:
        """Fold the device's running sums into ``progress``; under DDP sum every rank's share and
        learn whether any rank got a stop signal, in one all-reduce. Returns that stop flag."""
        stop = self.stop.requested
        if self.world > 1:
            delta = torch.cat([sums - synced, torch.tensor([1.0 if stop else 0.0], dtype=torch.float64,
                                                           device=self.device)])
            dist.all_reduce(delta)
            sums.copy_(synced + delta[:2] / self.world)  # the global batch's mean loss and hits per rank
            stop = bool(delta[2] > 0)
        synced.copy_(sums)
        self.progress.loss_sum, self.progress.correct = sums.tolist()
        return stop

    def step(self, idx: torch.Tensor) -> torch.Tensor:
        """One optimizer step on this rank's training images ``idx``.

        Returns (mean loss, hits) of those images as a float64 tensor on the device, without
        waiting for it: the caller sums them there and syncs every ``sync_every`` steps.
        """
        settings = self.settings
        if FAULT_ENV in os.environ and self.progress.global_step + 1 == int(os.environ[FAULT_ENV]):
            raise RuntimeError(f"injected fault at step {self.progress.global_step + 1} ({FAULT_ENV})")
        phase = torch.profiler.record_function  # labels for bench/profile_train_step.py; ~1 us each when idle
        idx = idx.to(self.train.images.device)
        with phase("step: augment"):
            images = self.augment(self.train.images[idx])
            images = normalize(images.to(self.device, non_blocking=True), self.data.mean, self.data.std)
            if settings.random_erasing > 0:
                images = random_erasing(images, settings.random_erasing)
            labels = self.train.labels[idx].to(self.device, non_blocking=True)
            targets = labels
            if self.mixer is not None:
                images, targets = self.mixer(images, labels)
        with phase("step: forward"), torch.autocast(self.device.type, dtype=self.autocast_dtype,
                                                    enabled=self.autocast_dtype is not None):
            logits, _ = self.net(images)
            loss = F.cross_entropy(logits.float(), targets, label_smoothing=settings.label_smoothing)
        with phase("step: backward"):
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        with phase("step: optimizer"):
            if settings.grad_clip > 0:
                nn.utils.clip_grad_norm_(self.model.parameters(), settings.grad_clip)
            self.optimizer.step()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.scheduler.step()
        if self.ema is not None:
            with phase("step: ema"):
                self._update_ema()
        correct = (logits.argmax(1) == (targets.argmax(1) if targets.dim() == 2 else targets)).sum()
        return torch.stack([loss.detach().float(), correct.float()]).double()

    @torch.no_grad()
    def _update_ema(self) -> None:
        """``AveragedModel.update_parameters`` with ``get_ema_multi_avg_fn``, the same arithmetic,
        without its host syncs: whether this is the first update is counted on the host. With ``ema_warmup``,
        the decay of timm's ``ModelEmaV3(use_warmup=True).get_decay`` at update ``n`` (its ``step``, counted
        from 1): 0 at the first (a copy), then ``1 - (1 + n - 1) ** -2/3`` up to the set decay."""
        ema_params, params = list(self.ema.module.parameters()), list(self.model.parameters())
        decay = self.settings.ema
        if self.settings.ema_warmup and self.ema_updates > 0:
            decay = min(decay, 1 - (1 + self.ema_updates) ** (-2 / 3))
        if self.ema_updates == 0:
            torch._foreach_copy_(ema_params, params)
        else:
            torch._foreach_lerp_(ema_params, params, 1 - decay)
        for ema_buffer, buffer in zip(self.ema.module.buffers(), self.model.buffers(), strict=True):
            ema_buffer.copy_(buffer)
        self.ema.n_averaged += 1
        self.ema_updates += 1

    def lr(self) -> float:
        """The learning rate of the top layers (the classifier's): the others' are its layer-wise share."""
        return max(group["lr"] for group in self.optimizer.param_groups)

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        """Validation (loss, accuracy) of the weights that get saved (EMA ones when enabled)."""
        model = self.eval_net
        model.eval()
        n = len(self.val)
        shard = torch.arange(self.rank, n, self.world)
        totals = torch.zeros(3, dtype=torch.float64, device=self.device)
        if self.val.images.device.type == "cuda":
            shard = shard.pin_memory().to(self.val.images.device, non_blocking=True)
        for chunk in shard.split(self.settings.eval_batch_size):
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
                     "lr %.2e %.1fs %.0f img/s", row["epoch"], self.settings.epochs, row["train_loss"],
                     row["train_acc"], row["val_loss"], row["val_acc"], row["lr"], row["epoch_seconds"],
                     row["images_per_second"])
            write_metrics(self.run_dir / METRICS_FILE, self.metrics)
        if self._snapshots_on():  # before last.pt: a kill in between retrains this epoch and rewrites it
            self._snapshot()
        if self._last_due():
            self._save_last()
        if self.is_main and improved:
            self._save_model(self.run_dir / BEST_CHECKPOINT, val_acc)
        if self.is_main and self.run_dir is not None and self.settings.save_every > 0 \
                and p.epoch % self.settings.save_every == 0:
            self._save_epoch_checkpoint(val_acc)
        if status is not None:
            status.update(epoch=p.epoch, step=p.global_step, progress=round(p.global_step / self.total_steps, 5),
                          best_val_acc=p.best_val_acc, elapsed_seconds=round(p.elapsed, 3), phase=None)

    # -- attention snapshots (see vit.snapshots) -------------------------------------------------

    def _snapshots_on(self) -> bool:
        return self.is_main and self.run_dir is not None and self.settings.attention_every > 0

    def _prepare_snapshots(self) -> None:
        """The probe set (chosen once from the validation split, then read back from the run folder) and
        the statistics sample, as normalised inputs on the training device."""
        if not has_probe(self.run_dir):
            save_probe(self.run_dir, make_probe(self.val.images, self.val.labels, self.data.class_names,
                                                seed=self.settings.seed))
        probe = load_probe(self.run_dir)
        sample = torch.tensor([i for i in probe.sample_indices if i < len(self.val)], dtype=torch.long)
        mean, std = self.data.mean, self.data.std
        self.snapshot_inputs = (normalize(probe.images.to(self.device), mean, std),
                                normalize(self.val.images[sample.to(self.val.images.device)].to(self.device), mean,
                                          std))

    def _snapshot(self) -> None:
        """Record the attention of the weights that get saved (EMA ones when enabled) if this epoch is due."""
        p, every = self.progress, self.settings.attention_every
        if not (p.epoch % every == 0 or p.epoch == self.settings.epochs):
            return
        start = time.time()
        model = self.ema.module if self.ema is not None else self.model
        probe, sample = self.snapshot_inputs
        arrays = take_snapshot(model, probe, sample, self.config.patch_size, model.num_prefix_tokens,
                               batch_size=min(self.settings.eval_batch_size, 64))
        seconds = time.time() - start
        write_snapshot(self.run_dir, p.epoch, arrays, seconds=seconds)
        train_seconds = self.metrics[-1]["epoch_seconds"] if p.epoch > 0 and self.metrics else None
        share = f" ({100 * seconds / train_seconds:.1f} % of the epoch's training)" if train_seconds else ""
        log.info("attention snapshot of epoch %d in %.2f s%s", p.epoch, seconds, share)

    # -- checkpoints ---------------------------------------------------------------------------

    def _save_epoch_checkpoint(self, val_acc: float) -> None:
        """checkpoints/epoch_N.pt (--save-every), then the older ones --keep does not keep."""
        self._save_model(epoch_checkpoint_path(self.run_dir, self.progress.epoch), val_acc)
        accuracies = {row["epoch"]: row["val_acc"] for row in self.metrics}
        saved = epoch_checkpoints(self.run_dir)
        # The best saved epoch: the first to reach the highest accuracy, as best.pt picks it.
        best = max(saved, key=lambda e: (accuracies.get(e, -1.0), -e), default=None)
        for epoch in epochs_to_prune(list(saved), self.settings.keep, best):
            saved[epoch].unlink(missing_ok=True)

    def _metadata(self, val_acc: float | None) -> dict:
        p = self.progress
        return {"dataset": self.settings.dataset, "epochs": p.epoch, "val_acc": val_acc,
                "best_val_acc": p.best_val_acc if p.best_val_acc >= 0 else None,
                "train_size": len(self.data.train), "val_size": len(self.data.val),
                "preset": self.settings.preset, "recipe": self.settings.recipe,
                "parameters": count_parameters(self.model),
                "date": now_iso(), "run": self.run_dir.name, "train_seconds": round(p.elapsed, 1),
                "hardware": hardware(self.device, self.world), "ema": self.settings.ema > 0}

    def _save_model(self, path: Path, val_acc: float | None, training_state: dict | None = None) -> None:
        model = self.ema.module if self.ema is not None else self.model
        try:
            save_checkpoint(path, model, self.data.class_names, self.preprocessing,
                            metadata=self._metadata(val_acc), training_state=training_state)
        except OSError as e:  # a full disk: the message says where the run goes on from
            if e.errno != errno.ENOSPC:
                raise
            raise OSError(e.errno, f"{e.strerror}{resume_hint(path)}") from e

    def _last_due(self) -> bool:
        """Whether an epoch end writes last.pt: the run's last epoch, this session's first, and
        then once ``checkpoint_seconds`` have passed (a write with fsync can take a fast GPU epoch's
        third). Every rank takes rank 0's decision, as writing it gathers every rank's state."""
        due = (self.progress.epoch >= self.settings.epochs or self.last_saved is None
               or time.time() - self.last_saved >= self.settings.checkpoint_seconds)
        if self.world > 1:
            flag = torch.tensor([1.0 if due else 0.0], device=self.device)
            dist.broadcast(flag, src=0)
            due = bool(flag.item() > 0)
        return due

    def _save_last(self) -> None:
        """last.pt: the saved weights plus everything to resume (every rank's RNG too)."""
        self.last_saved = time.time()
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
                 "progress": vars(p).copy(), "metrics": self.metrics, "rng": states, "steps": self.steps,
                 "step_seconds": self.step_seconds}
        last_acc = self.metrics[-1]["val_acc"] if self.metrics else None
        self._save_model(self.run_dir / LAST_CHECKPOINT, last_acc, training_state=state)


def _say_phase(status: Status | None, phase: str | None) -> None:
    """status.json's ``phase``: what the run does now, where the run has a status file (rank 0)."""
    if status is not None:
        status.update(phase=phase)


def resolve_compile_mode(mode: str, device: torch.device, world: int) -> str:
    """torch.compile's mode for ``--compile-mode``: "auto" is reduce-overhead (the step replayed as CUDA graphs) in a
    one-process run on a GPU, where a small ViT's step is bound by kernel launches (an H100: 21.3 -> 8.9 ms a
    256-image cifar-m step, ``bench/results/h100-2026-11-26``), and "default" on the CPU and under DDP (whose
    gradient hooks CUDA graphs do not capture; untried on several GPUs). Any other mode is kept as asked."""
    if mode != "auto":
        return mode
    return "reduce-overhead" if device.type == "cuda" and world == 1 else "default"


def compiled_augmentation(augment: BatchAugment, mode: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``augment`` compiled for a GPU, with static shapes: a batch of another size (a bench's next model, a smaller
    last batch) compiles again. With dynamic shapes the second size failed to trace (torch.randint of a symbolic
    batch size, torch 2.11 to 2.15): ViT-B/16's row of bench_gpu after the CIFAR rows on an H100."""
    return torch.compile(augment, mode=mode, dynamic=False)



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


def hardware(device: torch.device, world: int) -> str:
    """What the run trains on, for logs and checkpoints: '2 x NVIDIA H100' or 'CPU (x86_64, 8 threads)'."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return f"{world} x {name}" if world > 1 else name
    cpu = platform.processor() or platform.machine()
    threads = torch.get_num_threads()
    return f"CPU ({cpu}, {threads} threads{f', {world} processes' if world > 1 else ''})"


def _progress_bar(is_main: bool, total: int, done: int, epoch: int, epochs: int):
    if not (is_main and sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    # Redrawn at most twice a second: a redraw per step costs a fast GPU step's time.
    return tqdm(total=total, initial=done, desc=f"epoch {epoch}/{epochs}", leave=False, dynamic_ncols=True,
                mininterval=0.5)


