"""Train a ViT: ``python -m vit.train --dataset cifar10 --preset cifar-s --out runs/NAME``.

Every run lives in its own folder, written atomically so any file survives a SIGKILL:
``config.json`` (arguments, model, dataset), ``metrics.jsonl`` (one line per epoch),
``status.json`` (state and a heartbeat), ``last.pt`` / ``best.pt`` (checkpoints with
class names and preprocessing) and ``train.log``. ``--resume RUN_DIR`` continues from
``last.pt``; SIGTERM/SIGINT stop after the current step as ``cancelled``. Under
``torchrun`` it trains with DistributedDataParallel and only rank 0 writes.

The options are ``vit.training.options``; a run's lifecycle (folder, logging, signals, the
training itself) is ``vit.training.run``.
"""

import sys

from vit.training.run import main

if __name__ == "__main__":
    sys.exit(main())
