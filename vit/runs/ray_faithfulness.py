"""The faithfulness benchmarks on a Ray cluster: ``python -m vit.faithfulness MODEL --benchmark B ... --ray ADDRESS``.

As ``vit.analyze --ray`` (``vit.runs.ray_analyze``, whose pieces this reuses): the client submits the command with
``--ray-job`` as a Ray job; inside the cluster it lists and samples the items as a local run does and calls
``score_on_cluster``: Ray Data maps blocks of items, one block per batch, through a pool of ``Scorer`` actors that
each open the model once and return the batch's ``BatchScores``
(``vit.explain.benchmarks.benchmark_run.score_batch``: per method a few numbers per image, never a map). The driver
joins them in the set's order with the local ``report``, so
every score is the local run's: the same batches through the same code, each batch's random numbers seeded by its
first item (``batch_seed``), Chefer's pixel counts summed and the per-image AUCs, ROAD changes and SaCo coefficients
averaged in the set's order whatever order the batches came back in.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable, Iterator, Sequence
from functools import partial

import numpy as np

from vit.explain.benchmarks.benchmark_run import (
    BatchScores,
    Explain,
    Settings,
    check_batch,
    input_item,
    read_file,
    read_items,
    score_batch,
)
from vit.runs.ray_analyze import ClusterError, blocks_dataset, cause_line, plan_actors


class Scorer:
    """A Ray Data actor: opens the model once, then scores each batch of items (one block) for every method."""

    def __init__(self, checkpoint: str, device: str, settings: Settings, gtsegs: str | None,
                 explain: Explain | None) -> None:
        import torch

        from vit.sources.open import open_source

        self.checkpoint = open_source(checkpoint, None, map_location=torch.device(device))
        self.settings, self.explain = settings, explain
        check_batch(self.checkpoint, settings, settings.batch_size)  # the job asked too; this node's limit
        self.gtsegs = None
        if gtsegs is not None:
            from vit.explain.benchmarks.gtsegs import GtSegs

            self.gtsegs = GtSegs(gtsegs)

    def read(self, item: tuple):
        """An item's image and target: a file and its label or mask, or the ``gtsegs_ijcv.mat`` entry's pair."""
        if self.gtsegs is None:
            return read_file(item)
        from PIL import Image

        image, mask = self.gtsegs.item(item[0])
        return image, Image.fromarray(mask)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        index = np.asarray(batch["index"])
        items = [unpack(source, label, mask, self.gtsegs is not None) for source, label, mask in
                 zip(batch["source"], batch["label"], batch["mask"], strict=True)]
        images, targets, skipped = read_items(items, self.read,
                                              partial(input_item, self.checkpoint, self.settings.benchmark))
        scores = score_batch(self.checkpoint, self.settings, int(index.min()), images, targets, self.explain)
        scores.skipped = skipped
        return {"start": np.asarray([scores.start]), "scores": np.asarray([pickle.dumps(scores)], dtype=object)}


def pack(item: tuple, gtsegs: bool) -> tuple[str, int, str]:
    """An item ``(source, target)`` as a block's row: the source as text, a label (-1: none), a mask path ('')."""
    source, target = item
    if gtsegs or target is None:
        return str(source), -1, ""
    if isinstance(target, (int, np.integer)):
        return str(source), int(target), ""
    return str(source), -1, str(target)


def unpack(source: str, label: int, mask: str, gtsegs: bool) -> tuple:
    """``pack``'s row back as an item (``gtsegs``: the source is an entry of the ``.mat`` file)."""
    from pathlib import Path

    if gtsegs:
        return int(source), None
    if mask:
        return Path(str(source)), Path(str(mask))
    if int(label) >= 0:
        return Path(str(source)), int(label)
    return Path(str(source)), None


def score_on_cluster(checkpoint_path: str, settings: Settings, items: Sequence[tuple], workers: int | None = None,
                     device: str = "auto", gtsegs: str | None = None, explain: Explain | None = None,
                     progress: Callable[[int, int], None] | None = None) -> tuple[list[BatchScores], int]:
    """``score_items`` of ``items`` on the Ray cluster this process is connected to: ``(the batches' scores, the
    actors)``, the scores those of the local run's batches. ``checkpoint_path`` is what each actor opens;
    ``gtsegs`` the ``gtsegs_ijcv.mat`` the items index (their sources are its entries), else None; ``explain`` draws
    the maps beyond the benchmark's own (a module-level function: the actors import it). ``progress(maps done,
    maps in all)`` after each returned batch."""
    import pandas as pd
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    if not items:
        raise ValueError("no images to score")
    if not ray.is_initialized():
        ray.init()  # inside a job: the job's cluster
    size = settings.batch_size
    batches = math.ceil(len(items) / size)
    actors, use_gpu = plan_actors(ray.cluster_resources(), device, workers, batches)
    DataContext.get_current().enable_progress_bars = False  # the command draws one bar, as a local run does
    rows = [pack(item, gtsegs is not None) for item in items]
    # One block per batch: each actor scores exactly the local run's batches (same images per forward pass, same
    # batch seeds).
    blocks = [pd.DataFrame({"index": np.arange(start, min(start + size, len(items))),
                            "source": [r[0] for r in rows[start:start + size]],
                            "label": [r[1] for r in rows[start:start + size]],
                            "mask": [r[2] for r in rows[start:start + size]]})
              for start in range(0, len(items), size)]
    scored = blocks_dataset(blocks).map_batches(
        Scorer, batch_size=size, batch_format="numpy", compute=ActorPoolStrategy(size=actors),
        fn_constructor_kwargs={"checkpoint": checkpoint_path, "device": "cuda" if use_gpu else "cpu",
                               "settings": settings, "gtsegs": gtsegs, "explain": explain},
        **({"num_gpus": 1} if use_gpu else {"num_cpus": 1}))
    total, done, found = len(items) * len(settings.methods), 0, {}
    for scores in _scores(scored):
        if scores.start in found:
            raise RuntimeError(f"the cluster returned the batch from item {scores.start} twice")
        found[scores.start] = scores
        done += (scores.count + len(scores.skipped)) * len(settings.methods)
        if progress is not None:
            progress(done, total)
    if len(found) != batches:
        raise RuntimeError(f"the cluster returned {len(found)} of {batches} batches")
    return [found[start] for start in sorted(found)], actors


def _scores(dataset) -> Iterator[BatchScores]:
    """The batches' scores as they come; an actor's error as a ClusterError in one line."""
    try:
        for block in dataset.iter_batches(batch_size=None, batch_format="numpy"):
            for blob in block["scores"]:
                yield pickle.loads(blob)  # noqa: S301 - written by our own actors in this job
    except Exception as e:  # noqa: BLE001 - Ray wraps an actor's error in its own types, over many lines
        raise ClusterError(f"the benchmark failed on the cluster: {cause_line(e)}") from None
