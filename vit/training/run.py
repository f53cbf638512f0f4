"""One training run's lifecycle behind ``python -m vit.train``: prepare, open the run folder, train, close.

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
import json
import logging
import logging.handlers
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import torch

from vit.checkpoint import CheckpointError, read_checkpoint_payload
from vit.core.cli import use_free_cores
from vit.core.runfiles import (
    CONFIG_FILE,
    LAST_CHECKPOINT,
    LOG_FILE,
    METRICS_FILE,
    STATUS_FILE,
    STEPS_FILE,
    Status,
    append_traceback,
    now_iso,
    read_json,
    record_resume,
    record_run_phase,
    remove_stray_temp_files,
    speaks_for_the_run,
    still_running,
    write_json,
    write_metrics,
)
from vit.model import count_parameters
from vit.training.data import DataError
from vit.training.distributed import close_distributed, init_distributed, parse_device, rank_device
from vit.training.options import (
    RECIPES,
    RESUME_OPTIONS,
    build_parser,
    check_run_folder,
    given_options,
    load_run_data,
    parse_args,
    resolve_model,
    settings_from_args,
)
from vit.training.session import StopRequest
from vit.training.specs import check_run_data
from vit.training.trainer import Trainer, UsageError, hardware

log = logging.getLogger("vit.train")


# ---------------------------------------------------------------------------------------------
# Resuming


def _check_not_running(run_dir: Path) -> None:
    """Refuse to resume a run whose process still beats (it would overwrite its files)."""
    running = still_running(read_json(run_dir / STATUS_FILE))
    if running:
        raise UsageError(f"{run_dir} is still running ({running}); stop it first (SIGTERM) or wait for it to end")


# ---------------------------------------------------------------------------------------------
# Entry point


def _prepare(args: argparse.Namespace, argv: list[str]) -> tuple[argparse.Namespace, Path, dict | None]:
    """Resolve a new run's or a resumed run's arguments; nothing is written yet."""
    if args.resume:
        return _prepare_resume(args, argv)
    run_dir = Path(args.out)
    num_classes, class_names = check_run_data(args)
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


def _setup_logging(is_main: bool) -> tuple[logging.Logger, logging.handlers.MemoryHandler, tuple]:
    """Log lines of the ``vit`` package to stdout, and keep them until train.log exists; and the ``vit`` logger's
    handlers, level and propagation as they were, which ``_restore_logging`` puts back when the run ends (a caller's
    own handlers set aside meanwhile, not closed: a library leaves its caller's logging as it found it)."""
    logger = logging.getLogger("vit")
    previous = (list(logger.handlers), logger.level, logger.propagate)
    for handler in previous[0]:
        logger.removeHandler(handler)
    logger.setLevel(logging.INFO if is_main else logging.WARNING)
    logger.propagate = False
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(_LOG_FORMAT)
    buffer = logging.handlers.MemoryHandler(capacity=1_000_000, flushLevel=logging.CRITICAL + 1)
    logger.addHandler(console)
    logger.addHandler(buffer)
    return logger, buffer, previous


def _restore_logging(logger: logging.Logger, previous: tuple) -> None:
    """Close the run's handlers and put back the logger's handlers, level and propagation (``_setup_logging``'s)."""
    _close_logging(logger)
    handlers, level, propagate = previous
    for handler in handlers:
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = propagate


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
        check_run_folder(run_dir)
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
            write_metrics(run_dir / STEPS_FILE, trainer.steps)  # rows past last.pt's step are gone
        else:
            written.append(run_dir / CONFIG_FILE)
            write_json(run_dir / CONFIG_FILE, _config_record(args, argv, trainer))
        written.append(run_dir / STATUS_FILE)
        status = Status(run_dir / STATUS_FILE, {
            "state": "running", "epoch": p.epoch, "step": p.global_step, "total_epochs": args.epochs,
            "total_steps": trainer.total_steps, "progress": round(p.global_step / trainer.total_steps, 5),
            "pid": os.getpid(), "host": socket.gethostname(), "start_time": now_iso(), "eta_seconds": None,
            "elapsed_seconds": round(p.elapsed, 3), "best_val_acc": p.best_val_acc if p.best_val_acc >= 0 else None,
            "device": str(trainer.device), "world_size": trainer.world, "error": None,
            "phase": "starting to train"})
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
    if trainer.compile_mode is not None:
        log.info("compiled with torch.compile, mode %s", trainer.compile_mode)
    if resumed:
        log.info("continuing at epoch %d step %d of %d epochs", p.epoch + 1, p.step_in_epoch, args.epochs)
    return status


def _config_record(args: argparse.Namespace, argv: list[str], trainer: Trainer) -> dict:
    data = trainer.data
    return {"args": vars(args), "model": trainer.config.to_dict(), "parameters": count_parameters(trainer.model),
            "dataset": {"name": args.dataset, "class_names": data.class_names, "train_size": len(data.train),
                        "val_size": len(data.val), "mean": list(data.mean), "std": list(data.std),
                        "from_cache": data.from_cache},
            "world_size": trainer.world, "device": str(trainer.device), "compile_mode": trainer.compile_mode,
            "created": now_iso(),
            "command": [sys.executable, "-m", "vit.train", *argv]}


def _record_resume(config_file: Path, args: argparse.Namespace, argv: list[str], trainer: Trainer) -> None:
    """config.json keeps the run's arguments current (the new --epochs) and lists every resume."""
    record_resume(config_file, {name: getattr(args, name) for name in RESUME_OPTIONS}, {
        "time": now_iso(), "command": [sys.executable, "-m", "vit.train", *argv],
        "from_epoch": trainer.progress.epoch, "from_step": trainer.progress.global_step,
        # Epochs done, as steps.jsonl counts them: where the page marks the resume on the curves (a stop mid-epoch
        # resumes mid-epoch).
        "at_epoch": round(trainer.progress.epoch + trainer.progress.step_in_epoch / trainer.steps_per_epoch, 5),
        "world_size": trainer.world, "device": str(trainer.device)})


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def _usage_error(error: Exception) -> int:
    from vit.core.cli import usage_error

    return usage_error("vit.train", error)


def main(argv: list[str] | None = None, stop: StopRequest | None = None, launched: float | None = None) -> int:
    """The command line; returns the exit status (see ``--help``).

    ``stop`` lets a caller that is not the main thread (a Ray Train worker) request the stop
    that SIGTERM requests here; by default the signals are the only way. ``launched``: when the command started
    (``time.time()``), the origin of ``--time-budget``; by default, now."""
    launched = time.time() if launched is None else launched
    argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
    is_main = speaks_for_the_run()
    try:
        args = parse_args(argv, check_out=is_main)
        args, run_dir, payload = _prepare(args, argv)
    except UsageError as e:
        return _usage_error(e)
    resumed = payload is not None
    logger, buffer, previous_logging = _setup_logging(is_main)
    stop = stop or StopRequest()
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
            elif world == 1:  # torchrun's processes share the cores as it set them
                use_free_cores()
            record_run_phase("reading the data")
            data = load_run_data(args, rank, world)
            record_run_phase("restoring the model from last.pt" if resumed else "building the model")
            trainer = Trainer(settings_from_args(args), data, run_dir, payload, rank, world, device, stop,
                              launched)
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
                status.update(state="failed", error=message, eta_seconds=None, phase=None)
            print(f"vit.train: failed: {message} (details in {run_dir / 'train.log'})", file=sys.stderr)
            return 1
        if status is not None:
            status.close()
            p = trainer.progress
            status.update(state=state, eta_seconds=0 if state == "completed" else None, epoch=p.epoch,
                          step=p.global_step, progress=round(p.global_step / trainer.total_steps, 5),
                          elapsed_seconds=round(p.elapsed, 3),
                          best_val_acc=p.best_val_acc if p.best_val_acc >= 0 else None, phase=None)
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
        _restore_logging(logger, previous_logging)
        close_distributed()


if __name__ == "__main__":
    from vit.core.cli import run_command

    run_command(main)
