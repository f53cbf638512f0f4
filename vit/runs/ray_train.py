"""The entrypoint of a run submitted to a Ray cluster (``vit.runs.ray_jobs`` submits it):
``python -m vit.runs.ray_train --workers N --gpus-per-worker G -- TRAIN_ARGS…``.

It starts a Ray Train ``TorchTrainer`` whose N workers each run ``vit.training.run.main`` (the
same code as ``python -m vit.train``) with the process group Ray Train has set up: gloo on
CPUs, NCCL on GPUs. Rank 0 writes the run folder, as under torchrun.

Stopping: the job's SIGTERM (``ray job stop``) reaches this driver only, so it sets a flag in a
small actor that every worker polls; the workers then stop as on their own SIGTERM (finish the
step, write last.pt, end ``cancelled``). ``fit`` runs in a second thread because Ray Train
aborts the workers at once on a SIGINT in the main thread, before last.pt could be written.
"""

from __future__ import annotations

import argparse
import io
import signal
import sys
import threading

from vit.runs.stop_flag import StopFlag, watch

# Ray and Ray Train are imported in ``main``, after ``check_before_the_workers``: a job refused there (bad arguments, a
# dataset without two classes) then ends without loading them (~1.3 s of CPU: Ray Train brings Ray Data, pandas and
# pyarrow); the workers and Train's controller, which import this module for ``train_worker``, load Ray anyway.


class WorkerError(RuntimeError):
    """A worker's ``vit.train`` ended with a non-zero status; the message is its one-line error."""


class _Tee(io.TextIOBase):
    """Writes to the real stream and keeps the last ``PROG:`` line (the one-line error)."""

    def __init__(self, stream, prog: str = "vit.train") -> None:
        self.stream, self.last, self.prog = stream, "", prog

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.startswith(f"{self.prog}:"):
                self.last = line
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def train_worker(config: dict) -> None:
    """One Ray Train worker: ``vit.train`` with the given arguments; raises WorkerError on failure."""
    # Imported here, not at the top: the driver and Ray Train's controller import this module too (to unpickle
    # this function) and never train; the trainer's torchvision and torch._dynamo cost each of them seconds.
    from vit.training import run
    from vit.training.session import StopRequest

    stop, done = StopRequest(), threading.Event()
    watcher = threading.Thread(target=watch, args=(config["stop"], stop, done), daemon=True)
    watcher.start()
    tee = _Tee(sys.stderr)
    previous, sys.stderr = sys.stderr, tee
    try:
        status = run.main(list(config["argv"]), stop=stop)
    finally:
        sys.stderr = previous
        done.set()
    if status != 0:
        raise WorkerError(tee.last or f"vit.train ended with status {status}")


def _one_line(error: BaseException, prog: str = "vit.train") -> str:
    """The worker's ``PROG:`` line inside Ray's wrapped error, else its last line."""
    text = str(error)
    for line in text.splitlines():
        if f"{prog}:" in line:
            return line[line.index(f"{prog}:"):].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{prog}: {lines[-1] if lines else type(error).__name__}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vit.runs.ray_train")
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--gpus-per-worker", type=float, default=0.0)
    parser.add_argument("--name", required=True)
    parser.add_argument("train_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    refused = check_before_the_workers(train_args)
    if refused is not None:
        return refused
    import ray
    from ray.train import RunConfig, ScalingConfig

    from vit.runs.lean_trainer import LeanTorchTrainer

    ray.init(log_to_driver=True)
    flag = StopFlag()
    use_gpu = args.gpus_per_worker > 0
    resources = {"CPU": 1, "GPU": args.gpus_per_worker} if use_gpu else {"CPU": 1}
    trainer = LeanTorchTrainer(train_worker, train_loop_config={"argv": train_args, "stop": flag},
                           scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=use_gpu,
                                                        resources_per_worker=resources),
                           run_config=RunConfig(name=args.name))
    return fit_until_done(trainer, flag, "vit.train")


def check_before_the_workers(train_args: list[str]) -> int | None:
    """None, or the usage status after ``vit.train``'s one-line error on stderr: what the workers would refuse before
    training, checked here (the driver sees the storage every node mounts): the arguments and a new run's dataset
    (a folder without two classes of images). A job with bad input then fails seconds sooner, and without starting
    Ray Train's controller and workers (each a process importing torch) for nothing."""
    from vit.core.cli import UsageError, usage_error
    from vit.training.options import parse_args
    from vit.training.specs import check_run_data

    try:
        args = parse_args(train_args, check_out=False, device_here=False)
        if not args.resume:
            check_run_data(args)
    except UsageError as e:
        return usage_error("vit.train", e)
    return None


def fit_until_done(trainer, flag: StopFlag, prog: str) -> int:
    """``trainer.fit()`` in a second thread while this (main) thread turns SIGTERM/SIGINT into ``flag``'s stop
    request; 0 when it ends, 1 with the workers' one-line error (``PROG: ...``) on stderr. The flag is cleared
    once the run has ended."""
    requested = threading.Event()
    signals: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        signals.append(signum)
        requested.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    outcome: dict = {}

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as e:  # noqa: BLE001 - reported below as one line
            outcome["error"] = e

    thread = threading.Thread(target=fit, name="ray-train-fit")
    thread.start()
    while thread.is_alive():
        if requested.is_set():
            requested.clear()
            print(f"{prog}: stopping on {signal.Signals(signals[-1]).name}: the workers finish their step "
                  "and write last.pt", flush=True)
            flag.request(int(signals[-1]))
        thread.join(0.2)
    try:
        flag.clear()
    except Exception:  # noqa: BLE001 - a cluster going away takes the key with it
        pass
    if "error" in outcome:
        print(_one_line(outcome["error"], prog), file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    from vit.core.cli import run_command

    run_command(main)
