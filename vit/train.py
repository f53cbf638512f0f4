"""Train a ViT: ``python -m vit.train --dataset cifar10 --preset cifar-s --out runs/NAME``.

Every run lives in its own folder, written atomically so any file survives a SIGKILL:
``config.json`` (arguments, model, dataset), ``metrics.jsonl`` (one line per epoch),
``status.json`` (state and a heartbeat), ``last.pt`` / ``best.pt`` (checkpoints with
class names and preprocessing) and ``train.log``. ``--resume RUN_DIR`` continues from
``last.pt``; SIGTERM/SIGINT stop after the current step as ``cancelled``. Under
``torchrun`` it trains with DistributedDataParallel and only rank 0 writes.

With ``--ray ADDRESS --workers N [--gpus-per-worker G]`` (options of this one parser) the run is submitted to a Ray cluster
as a job and followed until it ends (``vit.runs.ray_jobs``); Ctrl-C stops the job gracefully.

The options are ``vit.training.options``; a run's lifecycle (folder, logging, signals, the
training itself) is ``vit.training.run``.
"""

import sys

from vit.training.run import main


def cli(argv: list[str]) -> int:
    """The command: a local run, or with ``--ray`` a run submitted to a Ray cluster."""
    if any(a == "--ray" or a.startswith("--ray=") for a in argv):
        from vit.runs.ray_jobs import main as submit_and_follow

        return submit_and_follow(argv)
    return main(argv)


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
