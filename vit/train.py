"""Train a ViT: ``python -m vit.train --dataset cifar10 --preset cifar-s --out runs/NAME``.

Every run lives in its own folder, written atomically so any file survives a SIGKILL:
``config.json`` (arguments, model, dataset), ``metrics.jsonl`` (one line per epoch),
``status.json`` (state and a heartbeat), ``last.pt`` / ``best.pt`` (checkpoints with
class names and preprocessing) and ``train.log``. ``--resume RUN_DIR`` continues from
``last.pt``; SIGTERM/SIGINT stop after the current step as ``cancelled``. Under
``torchrun`` it trains with DistributedDataParallel and only rank 0 writes.

With ``--ray ADDRESS --workers N [--gpus-per-worker G]`` (options of the one parser) the run is submitted to a
Ray cluster as a job and followed until it ends (``vit.runs.ray_jobs``); Ctrl-C stops the job gracefully.

The options are ``vit.training.options``; a run's lifecycle (folder, logging, signals, the
training itself) is ``vit.training.run``.
"""

import sys
import time

from vit.core.cli import UsageError, usage_error
from vit.training.options import build_parser  # the parser alone: torch loads after it has read the arguments


def main(argv: list[str] | None = None, stop=None) -> int:
    """A local run: ``vit.training.run.main`` (see there), imported when called."""
    launched = time.time()  # --time-budget counts from here: PyTorch's loading is the run's time too
    from vit.core.runfiles import record_run_phase

    record_run_phase("loading PyTorch")  # seconds on a busy machine, before the run can say anything else
    from vit.training.run import main as run_main

    return run_main(argv, stop, launched)


def cli(argv: list[str]) -> int:
    """The command: a local run, or with ``--ray`` a run submitted to a Ray cluster."""
    try:
        args = build_parser().parse_args(argv)  # --help and malformed arguments answer here, at once
        if args.ray is None:
            check_before_torch(argv)
    except UsageError as e:
        return usage_error("vit.train", e)
    if args.ray is not None:
        from vit.runs.ray_jobs import main as submit_and_follow

        return submit_and_follow(argv)
    return main(argv)


def check_before_torch(argv: list[str]) -> None:
    """UsageError for what a local run's arguments and its dataset's layout refuse (``parse_args``,
    ``check_run_data``), raised before torch loads (seconds), so a mistyped option is answered at once. Whether this
    machine has the device asked for, the data's images and an ``--init`` model are checked by the run itself, after
    it has loaded torch."""
    from vit.core.runfiles import speaks_for_the_run
    from vit.training.options import parse_args
    from vit.training.specs import check_run_data

    args = parse_args(argv, check_out=speaks_for_the_run(), device_here=False)
    if not args.resume:
        check_run_data(args)


def command() -> None:
    """The ``vit-train`` console command (pyproject.toml) and ``python -m``: a fast, quiet exit."""
    from vit.core.cli import run_command

    run_command(lambda: cli(sys.argv[1:]))


if __name__ == "__main__":
    command()
