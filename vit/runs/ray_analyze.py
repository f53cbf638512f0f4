"""The dataset analysis on a Ray cluster: ``python -m vit.analyze CKPT --data DIR --ray ADDRESS``.

The client submits ``python -m vit.analyze … --ray-job`` as a Ray job (``vit.runs.ray_jobs``: the
project's code as working_dir, the log followed, Ctrl-C stops it). Inside the cluster that command
lists and samples the files as the local one does and calls ``analyze_on_cluster``: Ray Data maps
blocks of ``(index, path, label)`` rows, one block per batch, through a pool of ``Summarizer`` actors
(``map_batches``); each actor opens the model once (``vit.sources.open.open_source``, as the local
command does) and returns ``image_summaries`` (and ``mechanism_summaries``) per image: a few small
arrays, never an attention matrix. The driver puts them back in file order and aggregates them with
the local code, so the report is the local one.

A page that submitted the job (``vit.analyze.submit``) waits for it with ``wait_for_job``, which reads the images
done from the job's log and stops the job (Ray's Jobs API, ``stop_job``, as the Train page stops a Ray run) as soon
as the page's progress callback raises: its Stop, or its session's end. A stopped job writes no report.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from vit.checkpoint import Checkpoint
from vit.explain.views.dataset import (
    Aggregator,
    DatasetAnalysis,
    MechanismAggregator,
    check_batch_size,
    image_summaries,
    mechanism_summaries,
    readout,
)
from vit.runs.ray_jobs import TERMINAL, RayRunError, _first_line

MECHANISM = "mechanism_"  # the prefix of the mechanism's columns in an actor's output


def job_id(out: Path) -> str:
    """A new Ray submission id for an analysis written to ``out``: its name and a random suffix (an analysis
    may be run again into the same folder; each run is a new job)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", out.name) or "analysis"
    return f"analyze-{name}-{uuid.uuid4().hex[:8]}"


def plan_actors(resources: dict, device: str, workers: int | None, batches: int) -> tuple[int, bool]:
    """(actors, one GPU each?) for a cluster of ``resources`` (``ray.cluster_resources()``).

    ``device`` auto takes a GPU per actor when the cluster has GPUs, else a CPU; ``workers`` None is one
    actor per GPU (or CPU). Never more actors than ``batches``: each one loads the model. RayRunError when
    the cluster cannot hold what is asked, before any actor is started (Ray would wait for it forever)."""
    gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
    use_gpu = device == "cuda" or (device == "auto" and gpus > 0)
    if use_gpu and gpus == 0:
        raise RayRunError("--device cuda: the Ray cluster has no GPU; leave --device at auto to run on CPUs")
    have, kind = (gpus, "GPU") if use_gpu else (cpus, "CPU")
    if have == 0:
        raise RayRunError(f"the Ray cluster has no whole {kind} for an actor")
    if workers is not None and workers > have:
        raise RayRunError(f"--workers {workers} needs {workers} {kind}(s), one per actor; the Ray cluster has {have}")
    return min(workers or have, batches), use_gpu


def blocks_dataset(blocks: list):
    """A Ray Dataset of ``blocks`` (pandas DataFrames), one block each as given. ``ray.data.from_blocks`` reads each
    block's size and schema here; ``from_pandas`` runs a Ray task per block for them, which started two more worker
    processes a job (each importing Ray and pandas; part of the Ray modules' 373 -> 324 s of CPU,
    bench/results/cpu-2026-11-29f/ray-*.txt) to describe a few rows.
    ``from_blocks`` is Ray's DeveloperAPI: a Ray that drops or changes it fails the cluster tests, which compare each
    job with its local run (test_analyze_ray, test_faithfulness_ray, test_sae_ray)."""
    import ray

    return ray.data.from_blocks(blocks)


class ClusterError(RuntimeError):
    """The Ray Data pipeline failed; the message is one line, the actor's own error where Ray gives it."""


def cause_line(error: BaseException) -> str:
    """The line of Ray's wrapped error that names what went wrong in the actor (``ValueError: …``): the last
    ``SomethingError: message`` line that is not one of Ray's own, else its first line."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(error).splitlines()]
    named = [line for line in lines if re.match(r"[A-Za-z_][\w.]*(Error|Exception): ", line)
             and not line.startswith("ray.")]
    if named:
        return named[-1][:300]
    return next((line[:300] for line in lines if line), type(error).__name__)


class Summarizer:
    """A Ray Data actor: opens the model once, then turns each batch of rows into per-image summaries."""

    def __init__(self, checkpoint: str, device: str, mechanism: bool) -> None:
        import torch

        from vit.sources.open import open_source

        self.checkpoint = open_source(checkpoint, None, map_location=torch.device(device))
        self.mechanism = mechanism

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        paths = [str(path) for path in batch["path"]]
        out = {"index": np.asarray(batch["index"]), **image_summaries(self.checkpoint, paths)}
        if self.mechanism:
            files = list(zip(paths, np.asarray(batch["label"]).tolist(), strict=True))
            out.update({MECHANISM + key: value for key, value in mechanism_summaries(self.checkpoint, files).items()})
        return out


def analyze_on_cluster(checkpoint_path: str, checkpoint: Checkpoint, files: Sequence[tuple[Path, int]],
                       batch_size: int, top_mistakes: int = 20, mechanism: bool = False,
                       norm_threshold: float | None = None, workers: int | None = None, device: str = "auto",
                       progress: Callable[[int, int], None] | None = None) -> DatasetAnalysis:
    """``analyze_files`` (and with ``mechanism`` ``analyze_mechanism``) of ``files`` on the Ray cluster this
    process is connected to; the same numbers as the local analysis of the same batches.

    ``checkpoint`` is the model opened here (class names, patch grid: what aggregating needs);
    ``checkpoint_path`` is what each actor opens. ``progress(done, total)`` after each returned batch."""
    import pandas as pd
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    check_batch_size(batch_size)
    if not files:
        raise ValueError("no images to analyse")
    if not ray.is_initialized():
        ray.init()  # inside a job: the job's cluster
    batches = math.ceil(len(files) / batch_size)
    actors, use_gpu = plan_actors(ray.cluster_resources(), device, workers, batches)
    DataContext.get_current().enable_progress_bars = False  # the command draws one bar, as a local run does
    # One block per batch: Ray Data then hands each actor exactly the batches the local analysis makes, so
    # every forward pass sees the same images (and numbers do not move with a batch's composition).
    blocks = [pd.DataFrame({"index": np.arange(start, min(start + batch_size, len(files))),
                            "path": [str(path) for path, _ in files[start:start + batch_size]],
                            "label": [label for _, label in files[start:start + batch_size]]})
              for start in range(0, len(files), batch_size)]
    summaries = blocks_dataset(blocks).map_batches(
        Summarizer, batch_size=batch_size, batch_format="numpy", compute=ActorPoolStrategy(size=actors),
        fn_constructor_kwargs={"checkpoint": checkpoint_path, "device": "cuda" if use_gpu else "cpu",
                               "mechanism": mechanism},
        **({"num_gpus": 1} if use_gpu else {"num_cpus": 1}))
    images = Aggregator(checkpoint.class_names, files, top_mistakes, readout(checkpoint))
    heads = MechanismAggregator(checkpoint, files, norm_threshold) if mechanism else None
    for run in in_file_order(_batches(summaries), len(files)):
        images.add(run)
        if heads is not None:
            heads.add({key.removeprefix(MECHANISM): value for key, value in run.items() if key.startswith(MECHANISM)})
        if progress is not None:
            progress(images.done, len(files))
    analysis = images.result()
    if heads is not None:
        analysis.mechanism = heads.result()
    return analysis


def _batches(dataset) -> Iterator[dict[str, np.ndarray]]:
    """The dataset's blocks as they come; an actor's error as a ClusterError in one line."""
    try:
        yield from dataset.iter_batches(batch_size=None, batch_format="numpy")
    except Exception as e:  # noqa: BLE001 - Ray wraps an actor's error in its own types, over many lines
        raise ClusterError(f"the analysis failed on the cluster: {cause_line(e)}") from None


def in_file_order(parts: Iterable[dict[str, np.ndarray]], total: int) -> Iterator[dict[str, np.ndarray]]:
    """The rows of ``parts`` (columns of per-image summaries with an ``index``: the file's position; in any order,
    split anyhow) as runs of consecutive files from the first, each as soon as the files before it have come:
    what an ``Aggregator`` takes. Only the runs that arrive early wait. RuntimeError when a file is missing or
    came twice."""
    waiting: dict[int, dict[str, np.ndarray]] = {}  # first file of a run -> the run
    following = 0  # the next file to hand on
    for part in parts:
        order = np.argsort(part["index"], kind="stable")
        part = {key: np.asarray(value)[order] for key, value in part.items()}
        index = part["index"]
        for rows in np.split(np.arange(len(index)), np.flatnonzero(np.diff(index) != 1) + 1):
            if len(rows) and int(index[rows[0]]) >= following and int(index[rows[0]]) not in waiting:
                waiting[int(index[rows[0]])] = {key: value[rows] for key, value in part.items()}
            elif len(rows):
                raise RuntimeError(f"the cluster returned the summary of file {int(index[rows[0]])} twice")
        while following in waiting:
            run = waiting.pop(following)
            following += len(run["index"])
            yield run
    if following != total or waiting:
        raise RuntimeError(f"the cluster returned image summaries for {following} of {total} files in order")


_BAR = r"{}:[^\n\r|]*\|[^|\n\r]*\|\s*(\d+)/(\d+)"  # a command's tqdm bar, "DESC: ... | 8/25 [..."


def images_done(log: str, desc: str = "analysing") -> int:
    """The images the job's log says are analysed: its progress bar's last count (0 before the first batch);
    ``desc``: the bar's name (vit.faithfulness's is its benchmark, counting maps)."""
    found = re.findall(_BAR.format(re.escape(desc)), log[-65536:])  # the bar's latest states are at the end
    return int(found[-1][0]) if found else 0


def wait_for_job(jobs, sid: str, total: int, progress: Callable[[int, int], None], poll: float = 1.0,
                 stop_wait: float = 30.0, desc: str = "analysing") -> str:
    """Wait for the analysis job ``sid`` (``jobs``: its JobSubmissionClient) to end; Ray's final status
    (SUCCEEDED, FAILED, STOPPED). Every ``poll`` seconds ``progress(done, total)`` is told the images done (the
    count of the log's bar named ``desc``).

    Whatever ``progress`` raises (a page's Stop, its session's end) stops the job through the Jobs API first, waits
    up to ``stop_wait`` seconds for it to end, then propagates; a job that cannot be stopped is a RayRunError in one
    line that names it, and so is a cluster that no longer answers about it."""
    done = 0
    while True:
        try:
            status = str(jobs.get_job_status(sid).value)
            if status in TERMINAL:
                return status
            done = max(done, images_done(jobs.get_job_logs(sid), desc))
        except Exception as e:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ... over many lines
            raise RayRunError(f"lost the analysis job {sid}: {_first_line(e)}; see it with `ray job status {sid}`"
                              ) from None
        try:
            progress(done, total)
        except BaseException:
            stop_job(jobs, sid, stop_wait)
            raise
        time.sleep(poll)


def stop_job(jobs, sid: str, wait: float = 30.0) -> None:
    """Stop job ``sid`` (Ray sends its entrypoint SIGTERM, then SIGKILL) and wait up to ``wait`` seconds for it to
    end, asking again while it has not (a job that had not started yet may miss the first ask); RayRunError in one
    line when it does not end or Ray refuses."""
    deadline = time.monotonic() + wait
    try:
        while True:
            jobs.stop_job(sid)
            if str(jobs.get_job_status(sid).value) in TERMINAL:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"still running after {wait:g} s")
            time.sleep(0.5)
    except Exception as e:  # noqa: BLE001 - Ray raises RuntimeError, ConnectionError, ...
        raise RayRunError(f"could not stop Ray job {sid} ({_first_line(e)}); stop it with `ray job stop {sid}`"
                          ) from None
