"""A sparse autoencoder's run on a Ray cluster: ``python -m vit.sae train … --ray ADDRESS --workers N``.

The client submits ``python -m vit.sae train … --ray-job --workers N`` as a Ray job (``vit.runs.ray_jobs``: the
allow-listed code as working_dir, the log followed, Ctrl-C or the Train page's Stop stops it). Inside the cluster
that command starts a Ray Train ``TorchTrainer`` of one worker, on a GPU when the cluster has one, which runs
``vit.sae``'s own training (the same run files, last.pt and resume) with the activations harvested by Ray Data:
each epoch's image batches, one block each, mapped through a pool of N ``Harvester`` actors that open the model
once and return the layer's tokens (``map_batches``), in file order (``preserve_order``) into the trainer's bounded
shuffle buffer. The SAE is small and the harvest is the model's forward: the actors do the heavy part, one worker
trains, and the shuffled batches are those of a local run on the same files, so the SAE is the local one.

Stopping: the job's SIGTERM reaches the driver only; it sets ``vit.runs.stop_flag.StopFlag``, which the worker
polls and turns into the stop a local SIGTERM makes (finish the step, write last.pt, end ``cancelled``).
"""

from __future__ import annotations

import re
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from vit.runs.ray_jobs import RayRunError

PROG = "vit.sae"


def job_id(out: Path) -> str:
    """A new Ray submission id for the SAE run in ``out``: its name and a random suffix (a resume is a new job)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", out.name) or "sae"
    return f"sae-{name}-{uuid.uuid4().hex[:8]}"


def plan(resources: dict, workers: int) -> tuple[bool, dict, dict]:
    """(use_gpu, the trainer's resources, each harvest actor's) on a cluster of ``resources``
    (``ray.cluster_resources()``): with GPUs the trainer and the N actors share them (a fraction each, at most
    one); else the trainer and each actor take a CPU. RayRunError before anything starts when the cluster cannot
    hold them (Ray would wait forever)."""
    gpus, cpus = float(resources.get("GPU", 0)), float(resources.get("CPU", 0))
    if gpus > 0:
        share = min(1.0, gpus / (workers + 1))
        return True, {"CPU": 0, "GPU": share}, {"num_cpus": 0, "num_gpus": share}
    if cpus < workers + 1:
        raise RayRunError(f"--workers {workers} needs {workers + 1} CPUs on the Ray cluster (one per harvesting "
                          f"actor and one for the trainer); it has {cpus:g}: give --workers {max(int(cpus) - 1, 1)}"
                          if cpus >= 2 else f"the Ray cluster has {cpus:g} CPU(s); an SAE run needs at least 2")
    return False, {"CPU": 1}, {"num_cpus": 1}


class Harvester:
    """A Ray Data actor: opens the model once, then turns each batch of image paths into the layer's tokens."""

    def __init__(self, model: str, arch: str | None, hook: str, device: str) -> None:
        import torch

        from vit.sources.open import open_source

        self.device = torch.device(device)
        self.checkpoint = open_source(model, arch, map_location=self.device)  # as the command opens it
        self.checkpoint.model.eval()
        self.hook = hook

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from vit.features.harvest import image_batches, layer_tokens

        paths = [Path(str(p)) for p in batch["path"]]
        images = next(image_batches(self.checkpoint, paths, len(paths), self.device))
        tokens = layer_tokens(self.checkpoint.model, images, self.hook)  # (B, T, D)
        return {"index": np.asarray(batch["index"]), "tokens": tokens.float().cpu().numpy()}


def harvest_on_cluster(model: str, arch: str | None, hook: str, files: Sequence[Path], image_batch: int,
                       workers: int, actor_resources: dict, device: str) -> Iterator:
    """The layer's tokens of ``files`` as ``(B, T, D)`` tensors in file order, harvested by ``workers`` actors of
    the Ray cluster this process is connected to; each block is one local image batch, so every forward sees
    the images the local harvest gives it."""
    import pandas as pd
    import torch
    from ray.data import ActorPoolStrategy, DataContext

    from vit.runs.ray_analyze import blocks_dataset

    context = DataContext.get_current()
    context.enable_progress_bars = False  # the command draws one bar, as a local run does
    context.execution_options.preserve_order = True  # the shuffle buffer must see the files in order
    blocks = [pd.DataFrame({"index": np.arange(start, min(start + image_batch, len(files))),
                            "path": [str(path) for path in files[start:start + image_batch]]})
              for start in range(0, len(files), image_batch)]
    dataset = blocks_dataset(blocks).map_batches(
        Harvester, batch_size=image_batch, batch_format="numpy", compute=ActorPoolStrategy(size=workers),
        fn_constructor_kwargs={"model": model, "arch": arch, "hook": hook, "device": device}, **actor_resources)
    following = 0
    try:
        for part in dataset.iter_batches(batch_size=None, batch_format="numpy"):
            index = np.asarray(part["index"])
            if len(index) and (index != np.arange(following, following + len(index))).any():
                raise RuntimeError(f"the cluster returned images {index[0]}... where {following} was due")
            following += len(index)
            yield torch.from_numpy(np.ascontiguousarray(part["tokens"]))
    except RuntimeError:
        raise
    except Exception as e:  # noqa: BLE001 - Ray wraps an actor's error in its own types, over many lines
        from vit.runs.ray_analyze import cause_line

        raise RuntimeError(f"the harvest failed on the cluster: {cause_line(e)}") from None
    if following != len(files):
        raise RuntimeError(f"the cluster returned the tokens of {following} of {len(files)} images")


def sae_worker(config: dict) -> None:
    """The Ray Train worker: ``config["command"](argv, stop, harvest)`` (``vit.sae``'s training, harvesting through
    Ray Data); raises ``WorkerError`` with the command's one-line error when it fails."""
    from functools import partial

    from vit.runs.ray_train import WorkerError
    from vit.runs.stop_flag import watch
    from vit.training.session import StopRequest

    stop, done = StopRequest(), threading.Event()
    watcher = threading.Thread(target=watch, args=(config["stop"], stop, done), daemon=True)
    watcher.start()
    harvest = partial(harvest_on_cluster, workers=config["workers"], actor_resources=config["actors"],
                      device=config["device"])
    try:
        config["command"](config["argv"], config["device"], stop, harvest)
    except Exception as e:
        line = str(e).splitlines()[0] if str(e) else type(e).__name__
        line = line if line.startswith(f"{PROG}:") else f"{PROG}: failed: {line}"
        print(line, file=sys.stderr, flush=True)
        raise WorkerError(line) from None
    finally:
        done.set()


def run_job(command, argv: list[str], workers: int, name: str) -> int:
    """Inside the Ray job: the TorchTrainer of ``sae_worker`` running ``command(argv, device, stop, harvest)``
    (``vit.sae.train_in_worker``: argv is vit.sae's arguments, no Ray options), a GPU when the cluster has one;
    SIGTERM stops it gracefully."""
    import ray
    from ray.train import RunConfig, ScalingConfig

    from vit.runs.lean_trainer import LeanTorchTrainer
    from vit.runs.ray_train import fit_until_done
    from vit.runs.stop_flag import StopFlag

    ray.init(log_to_driver=True)
    try:
        use_gpu, trainer_resources, actor_resources = plan(ray.cluster_resources(), workers)
    except RayRunError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return 2
    flag = StopFlag()
    device = "cuda" if use_gpu else "cpu"
    trainer = LeanTorchTrainer(sae_worker, train_loop_config={"command": command, "argv": argv, "stop": flag,
                                                          "workers": workers,
                                                          "actors": actor_resources, "device": device},
                           scaling_config=ScalingConfig(num_workers=1, use_gpu=use_gpu,
                                                        resources_per_worker=trainer_resources),
                           run_config=RunConfig(name=name))
    return fit_until_done(trainer, flag, PROG)
