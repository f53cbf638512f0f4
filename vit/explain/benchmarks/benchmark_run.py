"""The field's faithfulness benchmarks over a set of images, batch by batch, and their report.

Chefer et al.'s segmentation and perturbation tests, ROAD and SaCo (the metrics: ``vit.explain.benchmarks.metrics``) as
``python -m vit.faithfulness --benchmark ...``, its Ray job's actors (``vit.runs.ray_faithfulness``) and the Analyse
page run them: ``score_batch`` scores one batch of images for every method (what an actor returns), ``score_items``
runs the batches of a set here, ``report`` joins the batches' parts in the set's order into the JSON the command
prints, and ``table``, ``figure`` and ``write_out`` give its Markdown table, its plot and its files.

A batch's random numbers (the ``random`` baseline's maps, ROAD's imputation noise) come from generators seeded by
the seed and the batch's first item (``batch_seed``), never from a stream running through the set: a batch scored on
another machine, in any order, gives the numbers it gives here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from vit.checkpoint import Checkpoint
from vit.core.images import MAX_SIDE, ImageError, normalize, open_image, to_uint8
from vit.core.runfiles import atomic_write_files, lies_inside, open_regular, remove_dead_writers_temp_files
from vit.costs import memory, plan
from vit.costs.bounds import ANALYSIS_MEMORY_ENV, TooManyTokens, forward_flops, memory_limit
from vit.explain.benchmarks import metrics as bench

BENCHMARKS = ("segmentation", "perturbation", "road", "saco")
# What ``write_out`` writes into ``--out``, in its order (the plot, the table, the JSON last); vit.faithfulness names
# them too, to check the folder before torch loads (tests/test_faithfulness_files.py checks the two agree).
REPORT_FILES = ("faithfulness.png", "faithfulness.md", "faithfulness.json")
# What each benchmark's items carry besides the image: a mask (segmentation), the true class (perturbation), nothing.
# vit.api.explain's call: (checkpoint, image, method, target=class or None) -> an object with .map (gh, gw)
Explain = Callable[..., Any]


class BenchmarkError(ValueError):
    """Input the benchmark cannot score (no images, no mask for an image, none readable); one line saying what to do."""


@dataclass(frozen=True)
class Settings:
    """What a benchmark run is: the same for every batch, here or on a cluster's actors."""

    benchmark: str  # one of BENCHMARKS
    methods: tuple[str, ...]
    groups: int = bench.SACO_GROUPS  # SaCo's K (the paper's 10)
    batch_size: int = 16  # images per batch, and perturbed copies per forward
    seed: int = 0  # the random baseline and ROAD's noise (batch_seed)

    def __post_init__(self):  # each method once: the same one named a thousand times is scored once, not 1,000 times
        object.__setattr__(self, "methods", tuple(dict.fromkeys(self.methods)))


@dataclass
class BatchScores:
    """One batch's share of a benchmark: per method what ``report`` joins over the set (see ``summary``)."""

    start: int  # the batch's first item in the set: batches join in this order
    count: int  # images scored
    parts: dict[str, Any] = field(default_factory=dict)
    intact: np.ndarray | None = None  # perturbation: (count,) 1.0 where the intact image's prediction is its label
    seconds: dict[str, float] = field(default_factory=dict)  # per method: its maps and perturbed forwards
    skipped: list[str] = field(default_factory=list)  # one line per unreadable image


def batch_seed(seed: int, start: int) -> int:
    """The seed of the batch whose first item is ``start``: ``seed`` for the first batch, a mix of both for the
    others (64-bit golden-ratio stride, so neighbouring seeds do not share batches)."""
    return seed if start == 0 else (seed + start * 0x9E3779B97F4A7C15) % 2**63


def matched_masks(images: Sequence[Path], masks: Path, data: Path) -> list[tuple[Path, Path]]:
    """``(image, mask)`` for every image of ``images`` (the files of ``data``), its mask the PNG of its stem under
    ``masks``; BenchmarkError in one line when a stem repeats, an image has no mask, or its mask links out of
    ``masks`` or is no regular file (a FIFO would block the run)."""
    if not images:
        raise BenchmarkError(f"no images in {data}; give a folder of images and a folder of their masks")
    pngs: dict[str, Path] = {}
    for path in sorted(masks.rglob("*")):
        if path.suffix.lower() == ".png":
            if path.stem in pngs:
                raise BenchmarkError(f"two masks named {path.stem} in {masks} ({pngs[path.stem]}, {path}); "
                                     "stems must be unique")
            pngs[path.stem] = path
    stems = [p.stem for p in images]
    repeated = sorted({s for s in stems if stems.count(s) > 1})
    if repeated:
        raise BenchmarkError(f"images share the stem(s) {', '.join(repeated[:5])} in {data}; masks are matched by "
                             "stem, so rename them")
    missing = [s for s in stems if s not in pngs]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise BenchmarkError(f"no mask in {masks} for image(s) {', '.join(missing[:5])}{more}; give a PNG named by "
                             "each image's stem (e.g. cat.jpg -> cat.png)")
    for stem in stems:  # the masks that will be read: files of the folder, as its images are (image_files)
        if not lies_inside(pngs[stem], masks):
            raise BenchmarkError(f"the mask {pngs[stem]} links to a file outside {masks}; only files inside the "
                                 "masks folder are read: copy it in")
        if not pngs[stem].is_file():
            raise BenchmarkError(f"the mask {pngs[stem]} is not a regular file (a FIFO, a device or a folder); "
                                 "give a PNG")
    return [(p, pngs[p.stem]) for p in images]


def open_mask(mask: Path | Image.Image, hw: tuple[int, int]) -> Tensor:
    """A 0/1 ``(H, W)`` long tensor of the PNG at ``mask`` (or a PIL image of one) resized to ``hw`` nearest (their
    ``Image.NEAREST``)."""
    try:
        if isinstance(mask, Image.Image):
            mask = mask.convert("L").resize((hw[1], hw[0]), Image.NEAREST)
        else:  # a regular file only: a FIFO put in its place would block the run beyond Stop
            with open_regular(mask) as file, Image.open(file) as image:
                mask = image.convert("L").resize((hw[1], hw[0]), Image.NEAREST)
    except (OSError, Image.DecompressionBombError) as e:
        raise BenchmarkError(f"cannot read the mask {mask} ({e}); give a PNG, 0 for background") from None
    return torch.from_numpy((np.asarray(mask) > 0).astype(np.int64))


def method_maps(checkpoint: Checkpoint, x: Tensor, pixels: Tensor, method: str, class_index: Tensor,
                generator: torch.Generator | None, as_pixels: bool = False, explain: Explain | None = None,
                start_layer: int = 0) -> Tensor:
    """``(B, gh, gw)`` maps of ``x`` (normalised) for each image's ``class_index``: the benchmark's own methods
    batched (``vit.explain.benchmarks.metrics.method_maps``), any other map image by image through ``explain``
    (``vit.api.explain``, which draws every map of ``vit.methods()``) on the same ``pixels (B, C, H, W)`` (uint8,
    already at the input's size: resized straight to it, not cropped again). ``as_pixels``: a method that maps the
    input's pixels (full LRP) gives its ``(B, H, W)`` map as it is. ``start_layer``: the first layer the benchmark's
    rollout and transformer attribution roll out (``bench.CHEFER_START_LAYER`` in Chefer et al.'s two tests)."""
    from dataclasses import replace

    from vit import registry

    if method in bench.METHODS:
        return bench.method_maps(checkpoint.model, x, method, class_index, generator, pixels=as_pixels,
                                 start_layer=start_layer)
    if explain is None:
        raise BenchmarkError(f"unknown method {method!r}; choose from: {', '.join(bench.METHODS)}")
    straight = replace(checkpoint, preprocessing=replace(checkpoint.preprocessing, resize_size=None,
                                                         resize_mode="square"))
    found = registry.find_method(method)  # a built-in's or a plugin's
    reads_class = found is not None and "class" in found.reads
    # a pixel method's map summed over each patch: the benchmarks read the patch grid
    summed = {"patch_sums": True} if found is not None and found.pixels else {}
    maps = [explain(straight, image, method, target=int(c) if reads_class else None, **summed).map
            for image, c in zip(pixels, class_index.tolist(), strict=True)]
    return torch.from_numpy(np.stack(maps)).to(x.device)


def read_file(item: tuple) -> tuple[Image.Image, Any]:
    """``(image, target)`` of an item ``(path, target)``: the file opened (ImageError when it cannot be)."""
    return open_image(item[0]), item[1]


def read_items(items: Sequence[tuple], read: Callable[[tuple], tuple[Image.Image, Any]] = read_file,
               prepare: Callable[[Image.Image, Any], tuple[Any, Any]] | None = None
               ) -> tuple[list[Any], list[Any], list[str]]:
    """``(images, their targets, skipped)`` of ``items``: ``read(item)`` each (default ``read_file``), then
    ``prepare(image, target)`` at once (``input_item``: the batch then holds inputs, not decoded photographs); an
    ImageError skips the item with its line."""
    images, targets, skipped = [], [], []
    for item in items:
        try:
            image, target = read(item)
        except ImageError as e:
            skipped.append(str(e))
            continue
        if prepare is not None:
            image, target = prepare(image, target)
        images.append(image)
        targets.append(target)
    return images, targets, skipped


def input_item(checkpoint: Checkpoint, benchmark: str, image: Image.Image, target: Any) -> tuple[Tensor, Any]:
    """An item as its batch holds it: the image as the model's input ``(C, H, W)`` uint8, resized straight to the
    input, no crop (Chefer's ``Resize((224, 224))``), and for segmentation the mask as ``open_mask``'s 0/1
    ``(H, W)`` at that size; other targets as they are. What was decoded is dropped as the next item is read."""
    p = checkpoint.preprocessing
    hw = tuple(p.image_hw)
    pixels = to_uint8(image, hw, p.num_channels, resample=p.resample, backend=p.backend)
    return pixels, open_mask(target, hw) if benchmark == "segmentation" else target


def batched_method_bytes(model, grid: tuple[int, int], method: str) -> int:
    """Bytes one image adds to a batch while ``method``'s maps are formed, where the benchmark forms them for the
    whole batch at once (``faithfulness.method_maps``: a backward through every image of the batch together): the
    cost model's count for one image (``vit.costs.memory``, ``plan.gradient``). A map drawn image by image through
    ``vit.explain`` counts its own cost there, one image at a time: 0 here, as for the random maps."""
    if method not in bench.METHODS or method == "random":
        return 0
    if method in ("attention", "rollout", "flow"):  # every layer's attention, returned by the batch's forward
        return memory.attentions_bytes(model, grid)
    if method == "legrad":
        return memory.legrad_bytes(model, grid)
    if method == "attnlrp" and not model.config.stage_depths:  # the whole path: the benchmark does not checkpoint
        return memory.attnlrp_bytes(model, grid)
    return plan.gradient(model, grid, bench.METHODS[method]).memory  # every layer's attention and its gradient


def batch_cost(checkpoint: Checkpoint, settings: Settings, items: int) -> plan.Cost:
    """What a batch of ``min(settings.batch_size, items)`` images holds at once, for ``decide`` before the work
    (``vit.costs.plan``): the item being read, its image reduced as every decode is (``vit.core.images.MAX_SIDE``, up to
    4 bytes a pixel) beside gtsegs_ijcv.mat's mask; every image's input (uint8 and float32) and a perturbed copy;
    the batch's forward (``memory.forward_bytes`` per image: its rows run at once, for the predictions and for
    each perturbed step); and the costliest method's maps, formed for the batch at once (``batched_method_bytes``
    per image: a gradient method's backward holds every image's attention and gradient together; the methods run
    one after another, so only the largest counts). The refusal names the largest batch that fits."""
    model = checkpoint.model
    h, w = checkpoint.preprocessing.image_hw
    grid = model.patch_grid(h, w)
    tokens, count = model.num_prefix_tokens + grid[0] * grid[1], max(1, min(settings.batch_size, items))
    read = 5 * MAX_SIDE**2  # up to 4 bytes a pixel (RGBA, 32-bit greys) and 1 for a mask
    costliest = max(settings.methods, key=lambda m: batched_method_bytes(model, grid, m), default="random")
    per_image = {"every image's input and a perturbed copy": 2 * memory.input_bytes(model, grid, resized=True),
                 "the batch's forward": memory.forward_bytes(model, grid),
                 f"the {costliest} maps, formed for the batch at once": batched_method_bytes(model, grid, costliest)}
    parts = {"the item being read": read, **{k: count * v for k, v in per_image.items() if v}}

    def refuse(need: int, limit: int) -> TooManyTokens:
        fits = max(0, (limit - read) // sum(per_image.values()))
        fewer = f"choose at most {fits:,} images per batch, or raise" if fits else "raise"
        maps = f", {costliest}'s maps" if batched_method_bytes(model, grid, costliest) else ""
        return TooManyTokens(f"A batch of {count:,} images holds about {need / 2**20:,.0f} MB at once (their inputs"
                             f"{maps} and the batch's forward at {w}×{h} px, and the item being read), over the "
                             f"{limit / 2**20:,.0f} MB limit ({ANALYSIS_MEMORY_ENV}); {fewer} {ANALYSIS_MEMORY_ENV}.")
    return plan.Cost("benchmark batch", tokens, sum(parts.values()), count * forward_flops(model.config, tokens),
                     memory_limit(), refuse, tuple(parts.items()))


def check_batch(checkpoint: Checkpoint, settings: Settings, items: int) -> None:
    """``batch_cost``'s answer before the work: ``TooManyTokens`` (one line) when a batch would not fit."""
    plan.decide(batch_cost(checkpoint, settings, items))


def score_batch(checkpoint: Checkpoint, settings: Settings, start: int, images: Sequence[Tensor],
                targets: Sequence[Any], explain: Explain | None = None,
                done: Callable[[str], None] | None = None) -> BatchScores:
    """Every method of ``settings`` on one batch: ``images`` as ``input_item`` gives them (``(C, H, W)`` uint8),
    each with its target (segmentation: its ``(H, W)`` 0/1 mask; perturbation: the true class; otherwise None), the
    batch's first item being ``start`` of the set. ``done(method)`` after each method's maps and scores."""
    model = checkpoint.model.eval()
    device = next(model.parameters()).device
    p = checkpoint.preprocessing
    scores = BatchScores(start, len(images))
    if not len(images):
        return scores
    pixels = torch.stack(list(images))  # (B, C, H, W) uint8
    x = normalize(pixels, p.mean, p.std).to(device)
    with torch.no_grad():
        predicted = model(x)[0].argmax(dim=-1)
    benchmark, seed = settings.benchmark, batch_seed(settings.seed, start)
    if benchmark == "segmentation":
        masks = torch.stack(list(targets))
    elif benchmark == "perturbation":
        target = torch.tensor(list(targets), device=device)
        scores.intact = (predicted == target).cpu().numpy().astype(np.float64)
        zero = normalize(torch.zeros(1, p.num_channels, 1, 1, dtype=torch.uint8), p.mean, p.std)[0, :, 0, 0]  # black
    generator = torch.Generator().manual_seed(seed)  # the random baseline's maps
    for method in settings.methods:
        began = time.perf_counter()
        # their vis_class "top"; full LRP's pixels as they are in Chefer's tests (their full_lrp: no upsampling), and
        # rollout and transformer attribution from their start_layer
        chefer = benchmark in ("segmentation", "perturbation")
        maps = method_maps(checkpoint, x, pixels, method, predicted, generator, chefer, explain,
                           bench.CHEFER_START_LAYER if chefer else 0)
        if benchmark == "segmentation":
            part = bench.segmentation_counts(maps, masks)
        elif benchmark == "perturbation":
            part = [bench.perturbation_hits(model, x, maps, target, zero, negative, settings.batch_size)
                    for negative in (False, True)]
        elif benchmark == "road":  # their ROADCombined's order: least relevant first, then most; the same noise
            noise = torch.Generator().manual_seed(seed)  # for every method
            part = [bench.road_scores(model, x, maps, predicted, most, generator=noise,
                                      batch_size=settings.batch_size) for most in (False, True)]
        else:
            part = bench.saco_coefficient(*bench.saco_groups(model, x, maps, predicted, settings.groups,
                                                             settings.batch_size))
        scores.parts[method] = part
        scores.seconds[method] = time.perf_counter() - began
        if done is not None:
            done(method)
    return scores


def score_items(checkpoint: Checkpoint, settings: Settings, items: Sequence[tuple],
                read: Callable[[tuple], tuple[Image.Image, Any]] = read_file, explain: Explain | None = None,
                progress: Callable[[int, int], None] | None = None) -> list[BatchScores]:
    """``score_batch`` over ``items`` (``(source, target)`` each, ``read(item)`` its image and target, made the
    model's input at once: ``input_item``) in batches of ``settings.batch_size``, here, once ``check_batch`` says a
    batch fits. ``progress(maps done, maps in all)`` after each method of each batch (an
    unreadable image counts as its maps done); what it raises (a page's Stop) ends the run."""
    check_batch(checkpoint, settings, len(items))
    total, done = len(items) * len(settings.methods), 0
    batches = []

    def step(count: int) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(done, total)

    if progress is not None:
        progress(0, total)
    for start in range(0, len(items), settings.batch_size):
        chunk = items[start:start + settings.batch_size]
        images, targets, skipped = read_items(chunk, read, partial(input_item, checkpoint, settings.benchmark))
        scored = len(images)
        batch = score_batch(checkpoint, settings, start, images, targets, explain, done=lambda _, n=scored: step(n))
        batch.skipped = skipped
        batches.append(batch)
        step(len(skipped) * len(settings.methods))
    return batches


def summary(benchmark: str, parts: list, accuracy: float | None) -> dict:
    """One method's scores from its per-batch ``parts`` in the set's order (``score_batch``)."""
    if benchmark == "segmentation":
        return bench.segmentation_scores(*(np.concatenate(arrays) for arrays in zip(*parts, strict=True)))
    if benchmark == "perturbation":
        scores = {}
        for i, order in enumerate(("positive", "negative")):
            curve = np.concatenate([part[i] for part in parts], axis=1).mean(axis=1)  # (S,)
            scores[f"{order}_auc"] = bench.perturbation_auc(float(accuracy), curve)
            scores[f"{order}_accuracy"] = [float(accuracy), *map(float, curve)]
        return scores
    if benchmark == "road":
        least, most = (np.concatenate([part[i] for part in parts], axis=1) for i in (0, 1))  # (P, images)
        return {"most_relevant_first": float(most.mean()), "least_relevant_first": float(least.mean()),
                "combined": float(((least.mean(axis=0) - most.mean(axis=0)) / 2).mean()),
                "most_relevant_first_curve": most.mean(axis=1).tolist(),
                "least_relevant_first_curve": least.mean(axis=1).tolist()}
    coefficients = np.concatenate(parts)
    defined = coefficients[~np.isnan(coefficients)]
    return {"saco": float(defined.mean()) if len(defined) else None,
            "saco_std": float(defined.std()) if len(defined) else None,
            "undefined": int(np.isnan(coefficients).sum())}


def report(settings: Settings, batches: Sequence[BatchScores], about: dict, workers: int | None = None) -> dict:
    """The benchmark's JSON from its ``batches`` (any order: joined by their ``start``): ``about`` (checkpoint,
    data, ...) first, then the images, each method's scores and ``images_per_s`` (images over the seconds its maps
    and perturbed forwards took, summed over batches: per worker when they ran on ``workers`` actors, which the
    report then names with ``maps_per_s_per_worker``, every method's maps over all their seconds).
    BenchmarkError when no image was scored."""
    batches = sorted((b for b in batches if b.count), key=lambda b: b.start)
    count = sum(b.count for b in batches)
    if count == 0:
        raise BenchmarkError(f"none of the {sum(len(b.skipped) for b in batches) or 'given'} images could be read")
    benchmark, methods = settings.benchmark, settings.methods
    accuracy = float(np.concatenate([b.intact for b in batches]).mean()) if benchmark == "perturbation" else None
    scores = {m: summary(benchmark, [b.parts[m] for b in batches], accuracy) for m in methods}
    seconds = {m: sum(b.seconds[m] for b in batches) for m in methods}
    for m in methods:
        scores[m]["images_per_s"] = count / seconds[m] if seconds[m] else None
    result = {**about, "benchmark": benchmark, "images": count, "explained_class": "predicted", "methods": scores}
    if benchmark == "perturbation":
        result["removed"] = [0.0, *bench.PERTURBATION_STEPS]
        result["model_accuracy"] = accuracy
    elif benchmark == "road":
        result["percentiles"] = list(bench.ROAD_PERCENTILES)
        result["removed"] = [(100 - q) / 100 for q in bench.ROAD_PERCENTILES]
        result["noise"] = bench.ROAD_NOISE
    elif benchmark == "saco":
        result["groups"] = settings.groups
    if workers is not None:
        total = sum(seconds.values())
        result["workers"] = workers
        result["maps_per_s_per_worker"] = count * len(methods) / total if total else None
    return result


def table_rows(result: dict) -> tuple[list[str], dict[str, list[str]]]:
    """``(columns, {method: cells})`` of ``result``'s scalar scores, as text (4 decimals; '-' for none)."""
    rows = result["methods"]
    columns = [k for k, v in next(iter(rows.values())).items() if not isinstance(v, (list, dict))]
    if not columns:  # deletion: {"mean", "std"} each
        columns = list(next(iter(rows.values())))
        return columns, {m: [f"{s[c]['mean']:.4f} ± {s[c]['std']:.4f}" for c in columns] for m, s in rows.items()}
    return columns, {m: ["-" if s[c] is None else f"{s[c]:.4f}" for c in columns] for m, s in rows.items()}


ARROWS = {"higher": "↑", "lower": "↓"}


def header(column: str) -> str:
    """A report column's header with the side that is better (``bench.BETTER``): 'deletion_auc ↓', 'mAP ↑'; a
    column with no better side (SaCo's std, its count of flat maps) as it is."""
    better = bench.BETTER.get(column)
    return column if better is None else f"{column} {ARROWS[better]}"


def legend(columns: Sequence[str]) -> str:
    """The line under a report's table that says what the arrows of its ``columns`` mean."""
    sides = {bench.BETTER[c] for c in columns if c in bench.BETTER}
    parts = [f"{ARROWS[side]} {side} is better" for side in ("higher", "lower") if side in sides]
    speed = " (images_per_s: faster)" if "images_per_s" in columns else ""
    return ("; ".join(parts) + speed + ".") if parts else ""


def table(result: dict) -> str:
    """A Markdown table of ``result``'s scalar scores per method, each header with its better side, and the legend
    of those sides under it."""
    columns, cells = table_rows(result)
    lines = [f"| method | {' | '.join(map(header, columns))} |", "|---" * (len(columns) + 1) + "|"]
    lines += [f"| {m} | {' | '.join(c)} |" for m, c in cells.items()]
    key = legend(columns)
    return "\n".join(lines) + (f"\n\n{key}" if key else "")


PATH_FIELDS = ("checkpoint", "data", "masks")  # where a report names the model and the folders by their paths


def shared(result: dict) -> dict:
    """The report as a page hands it to a visitor: the model and the folders by their names, never their paths on
    the server (the command's own ``--out`` keeps them, on the machine that ran it)."""
    return {**result, **{k: Path(result[k]).name for k in PATH_FIELDS if isinstance(result.get(k), str)}}


def markdown(result: dict, text: str | None = None) -> str:
    """The report's Markdown file: a title, the model and the table (``text``, default ``table(result)``)."""
    title = f"# {result.get('benchmark', 'deletion')} on {result['images']} images of {result['data']}"
    return f"{title}\n\nModel: {result['checkpoint']}\n\n{table(result) if text is None else text}\n"


def write_out(out: str | Path | None, result: dict, text: str | None = None) -> None:
    """``--out DIR``: ``faithfulness.json``, ``faithfulness.md`` (the table) and, but for deletion, the plot
    ``faithfulness.png`` (``REPORT_FILES``), written as one set (``vit.core.runfiles.atomic_write_files``): a rerun
    killed while it writes leaves the previous report whole, not a plot of one run beside the JSON of another, and
    a deletion run removes an earlier run's plot. The JSON goes last, so a new one means a complete set. The
    temporary files of a run killed before (``.faithfulness.*.tmp``) are removed first."""
    import io
    import json

    if out is None:
        return
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    remove_dead_writers_temp_files(folder, REPORT_FILES)
    png, md, report = (folder / name for name in REPORT_FILES)
    files = {}
    if result.get("benchmark", "deletion") != "deletion":
        fig, drawn = figure(result), io.BytesIO()  # figure() chooses matplotlib's backend before pyplot loads
        import matplotlib.pyplot as plt

        try:
            fig.savefig(drawn, dpi=120, format="png")
        finally:
            plt.close(fig)
        files[png] = drawn.getvalue()
    files[md] = markdown(result, text).encode("utf-8")
    files[report] = (json.dumps(result, indent=2) + "\n").encode("utf-8")
    atomic_write_files(files, gone=() if png in files else (png,))


def figure(result: dict):
    """The report's matplotlib figure: the segmentation and SaCo scores as bars per method, the perturbation and
    ROAD curves per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = result["methods"]
    if result["benchmark"] == "segmentation":
        fig, ax = plt.subplots(figsize=(1.6 + 0.9 * len(methods), 3.6))
        metrics = ("pixel_accuracy", "mIoU", "mAP")
        width = 0.8 / len(metrics)
        for i, metric in enumerate(metrics):
            ax.bar(np.arange(len(methods)) + (i - 1) * width, [s[metric] for s in methods.values()], width,
                   label=header(metric))
        ax.set_xticks(range(len(methods)), list(methods), rotation=30, ha="right")
        ax.set_ylim(0, 1)
        ax.legend()
    elif result["benchmark"] == "saco":
        fig, ax = plt.subplots(figsize=(1.6 + 0.7 * len(methods), 3.6))
        ax.bar(range(len(methods)), [np.nan if s["saco"] is None else s["saco"] for s in methods.values()],
               yerr=[np.nan if s["saco_std"] is None else s["saco_std"] for s in methods.values()], capsize=3)
        ax.set_xticks(range(len(methods)), list(methods), rotation=30, ha="right")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_ylim(-1, 1)
        ax.set_ylabel(f"{header('saco')} (K = {result['groups']}), mean ± std")
    elif result["benchmark"] == "road":
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
        for ax, order in zip(axes, ("most_relevant_first", "least_relevant_first"), strict=True):
            for method, scores in methods.items():
                ax.plot(result["removed"], scores[f"{order}_curve"], marker="o", ms=3,
                        label=f"{method} ({scores[order]:.3f})")
            ax.set_title(f"{order.replace('_', ' ')} imputed ({ARROWS[bench.BETTER[order]]} "
                         f"{bench.BETTER[order]} is better)")
            ax.set_xlabel("share of pixels imputed")
            ax.axhline(0, color="grey", lw=0.8)
            ax.legend(fontsize=7)
        axes[0].set_ylabel("change of the class probability")
    else:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
        for ax, order in zip(axes, ("positive", "negative"), strict=True):
            for method, scores in methods.items():
                ax.plot(result["removed"], scores[f"{order}_accuracy"], marker="o", ms=3,
                        label=f"{method} ({scores[f'{order}_auc']:.3f})")
            better = bench.BETTER[f"{order}_auc"]
            ax.set_title(f"{order}: {'most' if order == 'positive' else 'least'} relevant removed first "
                         f"(AUC {ARROWS[better]} {better} is better)", fontsize=9)
            ax.set_xlabel("share of pixels removed")
            ax.legend(fontsize=7)
        axes[0].set_ylabel("top-1 accuracy")
    fig.suptitle(f"{result['benchmark']}, {result['images']} images")
    fig.tight_layout()
    return fig
