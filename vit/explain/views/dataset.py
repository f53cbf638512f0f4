"""Attention over a whole dataset, and its report (the command is ``python -m vit.analyze``).

For every image of ``DIR`` (one subfolder per class, as for ``vit.evaluate``; ``--limit N``
takes N images after a seeded shuffle): the mean attention distance and entropy of every
head by layer (the ViT paper's Fig. 7), averaged over the images; per true class, the mean
CLS attention of the last layer (heads averaged) and the mean CLS rollout map; the confusion
matrix; and the most confident mistakes. Writes ``analysis.json``, PNG plots and one
self-contained ``report.html`` into ``--out`` (default ``analysis/<checkpoint name>``) and
prints the JSON's path. A progress bar is drawn on stderr.

A model with stages (Swin, Hiera; ``vit.model.stages``) has no CLS token and each layer its own grid and heads:
distance and entropy are each layer's on its own grids (``vit.explain.methods.stage_maps.layer_stats``), ``(L, H)`` with
NaN past a layer's heads (``null`` in the JSON); the class maps read what its average pooling reads (``readout ==
"average pooling"``): the last layer's attention averaged over every query, and the rollout through the stages from
every last-layer token (``vit.explain.methods.stage_maps.rollout_row``), both on the image's patch grid. """

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from vit.checkpoint import Checkpoint
from vit.core.inference import predict_files
from vit.core.runfiles import atomic_write_text, atomic_write_with, lies_inside
from vit.core.text import escape_plotly
from vit.costs import plan
from vit.explain.methods.attention import fuse_heads, layer_stats, rollout, token_map


@dataclass
class Mistake:
    path: str
    label: str  # the true class
    predicted: str
    confidence: float  # probability of the predicted class


@dataclass
class DatasetAnalysis:
    """Dataset-level statistics; arrays are NumPy. ``K`` classes, ``L`` layers, ``H`` heads."""

    class_names: list[str]
    count: int  # images analysed
    skipped: list[str]  # one line per unreadable file
    distance: np.ndarray  # (L, H) mean attention distance in input pixels, averaged over images
    entropy: np.ndarray  # (L, H) mean attention entropy in nats
    class_counts: np.ndarray  # (K,) images per true class
    class_attention: np.ndarray  # (K, gh, gw) mean last-layer CLS attention (heads averaged) per true class
    class_rollout: np.ndarray  # (K, gh, gw) mean CLS rollout map per true class
    confusion: np.ndarray  # (K, K) counts: row = true class, column = predicted
    mistakes: list[Mistake] = field(default_factory=list)  # most confident first
    mechanism: MechanismStats | None = None  # with ``vit.analyze --mechanism``
    readout: str = "CLS"  # what the class maps start from: the CLS token, or "average pooling" (stages)

    @property
    def accuracy(self) -> float | None:
        total = self.confusion.sum()
        return float(np.trace(self.confusion) / total) if total else None

    def to_json(self) -> dict:
        return {"count": self.count, "accuracy": self.accuracy, "skipped": len(self.skipped),
                "class_names": self.class_names, "class_counts": self.class_counts.tolist(),
                "mean_attention_distance": _nulls(self.distance), "attention_entropy": _nulls(self.entropy),
                "readout": self.readout,
                "class_cls_attention": self.class_attention.tolist(), "class_rollout": self.class_rollout.tolist(),
                "confusion": self.confusion.tolist(),
                "most_confident_mistakes": [vars(m) for m in self.mistakes],
                **({"mechanism": self.mechanism.to_json()} if self.mechanism is not None else {})}

    @classmethod
    def from_json(cls, data: object, folder: str | os.PathLike | None = None) -> DatasetAnalysis:
        """The analysis ``to_json`` wrote (``analysis.json`` of a run elsewhere, e.g. on a Ray cluster), checked:
        ValueError (one line) for anything that is not such a file. The unreadable files come back as a count,
        the mechanism is not read back. With ``folder`` (the analysed image folder), every mistake must lie inside
        it, links resolved: the file is written elsewhere, and a page opens its mistakes."""
        try:
            names = data["class_names"]
            K = len(names)
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or not 0 < K <= 100_000:
                raise ValueError("class_names is not a list of names")

            def array(key: str, dims: int, leading: tuple[int, ...] = (), gaps: bool = False) -> np.ndarray:
                value = np.asarray(data[key], dtype=np.float64)  # null -> NaN: a stage's missing heads (gaps)
                finite = np.isfinite(value) | (gaps & np.isnan(value))
                if value.ndim != dims or value.shape[:len(leading)] != leading or not finite.all():
                    raise ValueError(f"{key} has the shape {value.shape}")
                return value

            distance = array("mean_attention_distance", 2, gaps=True)
            readout = data.get("readout", "CLS")
            if readout not in ("CLS", "average pooling"):
                raise ValueError(f"readout is {str(readout)[:40]!r}")
            mistakes = [Mistake(str(m["path"]), str(m["label"]), str(m["predicted"]), float(m["confidence"]))
                        for m in data["most_confident_mistakes"][:1000]]
            if folder is not None and not all(lies_inside(m.path, folder) for m in mistakes):
                raise ValueError("a mistake it lists lies outside the analysed folder")
            skipped = int(data["skipped"])
            return cls(class_names=names, count=int(data["count"]),
                       skipped=[f"{skipped} unreadable file(s); see the job's log"] if skipped else [],
                       distance=distance, entropy=array("attention_entropy", 2, distance.shape, gaps=True),
                       class_counts=array("class_counts", 1, (K,)).astype(np.int64),
                       class_attention=array("class_cls_attention", 3, (K,)),
                       class_rollout=array("class_rollout", 3, (K,)),
                       confusion=array("confusion", 2, (K, K)).astype(np.int64), mistakes=mistakes,
                       readout=readout)
        except (KeyError, TypeError, IndexError, OverflowError) as e:
            raise ValueError(f"not an analysis.json of this project ({type(e).__name__}: {e})") from None


def _nulls(values: np.ndarray) -> list:
    """``values.tolist()`` with NaN (a stage's missing heads) as None: ``null`` in the JSON, which stays standard."""
    return np.where(np.isnan(values), None, values).tolist()


def check_one_grid(checkpoint: Checkpoint) -> None:
    """ValueError, before any image, for a model whose summaries are not defined: a model with stages and
    windows but no average pooling to read from (SAM 2's Hiera has no classifier to analyse)."""
    model = checkpoint.model
    if getattr(model.config, "stage_depths", ()) and model.head is None:
        raise ValueError("the dataset analysis needs a classifier, and this model with stages has none")


def check_forward_fits(checkpoint: Checkpoint) -> None:
    """ValueError, before any image: ``check_one_grid``, then the cost model's answer for one image's forward at
    the checkpoint's own size with every layer's attention it returns, which the summaries read
    (``vit.costs.plan.forward``; ``TooManyTokens``, one line, over the memory limit per image). Asked once by each
    entry: ``vit.analyze`` (then ``summarize_files``), ``analyze_files`` (the Analyse page's), ``image_summaries``
    (the Ray actors', a batch each)."""
    check_one_grid(checkpoint)
    model = checkpoint.model
    h, w = checkpoint.preprocessing.image_hw
    plan.decide(plan.forward(model, model.patch_grid(h, w), f"The model's {w}×{h} px input", attentions=True))


def _stage_summaries(model, attentions: Sequence[np.ndarray], grid: tuple[int, int]
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One image's summaries for a model with stages: distance and entropy ``(L, H_max)`` (NaN past a layer's
    heads), the last layer's attention averaged over queries and heads and the rollout from every last-layer token,
    ``(gh, gw)`` each on the image's patch grid."""
    from vit.explain.methods.attention import layer_on_grid
    from vit.explain.methods.stage_maps import layer_stats as stage_stats
    from vit.explain.methods.stage_maps import on_patch_grid, rollout_row

    layouts = model.layer_layouts(grid)
    layers = [torch.from_numpy(a).reshape(-1, *a.shape[-3:]) for a in attentions]  # (nw, H, nq, nk) of one image
    distances, entropies = stage_stats(layers, layouts, model.config.patch_size)  # per layer (1, H_l)
    H = max(d.shape[1] for d in distances)
    distance, entropy = (np.full((len(layers), H), np.nan, dtype=np.float32) for _ in range(2))
    for i, (d, e) in enumerate(zip(distances, entropies, strict=True)):
        distance[i, :d.shape[1]], entropy[i, :e.shape[1]] = d[0].numpy(), e[0].numpy()
    last = layouts[-1]
    read = layer_on_grid(layers[-1], last)[0].mean(dim=(0, 1)).reshape(last.key_grid).numpy()  # (kh, kw)
    return distance, entropy, on_patch_grid(read, grid), rollout_row(layers, layouts, -1, None)[0].numpy()


def image_summaries(checkpoint: Checkpoint, paths: Sequence[str | Path]) -> dict[str, np.ndarray]:
    """``check_forward_fits``, then ``summaries`` of ``paths`` (what each Ray actor runs on a batch)."""
    check_forward_fits(checkpoint)
    return summaries(checkpoint, paths)


def summaries(checkpoint: Checkpoint, paths: Sequence[str | Path]) -> dict[str, np.ndarray]:
    """Everything ``Aggregator`` needs of each image of one batch of files, never a whole attention matrix; the
    caller asked ``check_forward_fits``.

    One forward pass of all ``paths`` (the batch), then per image: ``read (N,)`` bool, ``error (N,)`` str
    (empty when read), ``predicted (N,)`` int, ``confidence (N,)`` float (its probability), ``distance`` and
    ``entropy (N, L, H)``, ``cls_attention`` and ``cls_rollout (N, gh, gw)``. An unreadable image is zeros and
    its error. The local analysis and the Ray one (``vit.runs.ray_analyze``) both call this on the same batches,
    so their summaries are the same numbers.
    """
    model = checkpoint.model
    grid, prefix = model.patch_grid(*checkpoint.preprocessing.image_hw), model.num_prefix_tokens
    patch = model.config.patch_size
    staged = bool(getattr(model.config, "stage_depths", ()))
    H = max(block.attn.num_heads for block in model.blocks)  # a stage's own heads: the widest stage's
    L, N = len(model.blocks), len(paths)
    errors = [""] * N
    out = {"read": np.zeros(N, dtype=bool), "predicted": np.full(N, -1, dtype=np.int64), "confidence": np.zeros(N),
           "distance": np.zeros((N, L, H), dtype=np.float32), "entropy": np.zeros((N, L, H), dtype=np.float32),
           "cls_attention": np.zeros((N, *grid), dtype=np.float32),
           "cls_rollout": np.zeros((N, *grid), dtype=np.float32)}
    results = predict_files(checkpoint, paths, top_k=1, output_attentions=True, batch_size=max(N, 1))
    for i, result in enumerate(results):
        if result.prediction is None:
            errors[i] = result.error
            continue
        p = result.prediction
        out["read"][i] = True
        out["predicted"][i] = p.class_index
        out["confidence"][i] = float(p.probabilities[p.class_index])
        if staged:
            (out["distance"][i], out["entropy"][i], out["cls_attention"][i],
             out["cls_rollout"][i]) = _stage_summaries(model, p.attentions, grid)
            continue
        attentions = [torch.from_numpy(a)[None] for a in p.attentions]  # per layer (1, H, T, T)
        stats = layer_stats(attentions, grid, patch, prefix)  # each (L, 1, H)
        out["distance"][i], out["entropy"][i] = stats["distance"][:, 0].numpy(), stats["entropy"][:, 0].numpy()
        out["cls_attention"][i] = token_map(fuse_heads(attentions[-1]), 0, grid, prefix)[0].numpy()
        out["cls_rollout"][i] = token_map(rollout(attentions, num_prefix_tokens=prefix), 0, grid, prefix)[0].numpy()
    out["error"] = np.array(errors, dtype=str)
    return out


def _add_rows(total: np.ndarray, rows: np.ndarray) -> None:
    """``total += row`` for each row in order, in float64: the same digits however the rows were batched."""
    for row in rows:
        total += row


class Aggregator:
    """Running sums of ``image_summaries`` of ``files``, fed a batch at a time in file order; ``result()`` is the
    ``DatasetAnalysis``. Adds go image by image in float64, so any split of the files into batches gives the same
    numbers, and only the ``top_mistakes`` most confident mistakes are kept: memory does not grow with the files.
    """

    def __init__(self, class_names: list[str], files: Sequence[tuple[Path, int]], top_mistakes: int = 20,
                 readout: str = "CLS") -> None:
        K = len(class_names)
        self.readout = readout  # DatasetAnalysis.readout
        self.class_names, self.files, self.top_mistakes = class_names, files, top_mistakes
        self.labels = np.array([label for _, label in files], dtype=np.int64)
        self.done = self.count = 0  # files added, images read
        self.skipped: list[str] = []
        self.class_counts = np.zeros(K, dtype=np.int64)
        self.confusion = np.zeros((K, K), dtype=np.int64)
        self.sums: dict[str, np.ndarray] = {}  # distance, entropy (L, H); class maps (K, gh, gw): made on the first add
        self.mistakes: list[tuple[float, int, int]] = []  # (-confidence, file index, predicted), best first

    def add(self, summaries: dict[str, np.ndarray]) -> None:
        """The next ``len(summaries["read"])`` files' summaries."""
        read = summaries["read"]
        start, end = self.done, self.done + len(read)
        if end > len(self.files):
            raise ValueError(f"image summaries for {end} files; there are {len(self.files)}")
        labels, predicted, confidence = self.labels[start:end], summaries["predicted"], summaries["confidence"]
        if not self.sums:
            K, (L, H) = len(self.class_names), summaries["distance"].shape[1:]
            grid = summaries["cls_attention"].shape[1:]
            self.sums = {"distance": np.zeros((L, H)), "entropy": np.zeros((L, H)),
                         "cls_attention": np.zeros((K, *grid)), "cls_rollout": np.zeros((K, *grid))}
        for key in ("distance", "entropy"):
            _add_rows(self.sums[key], summaries[key][read].astype(np.float64))
        for key in ("cls_attention", "cls_rollout"):  # per true class, image by image (np.add.at goes in order)
            np.add.at(self.sums[key], labels[read], summaries[key][read].astype(np.float64))
        np.add.at(self.class_counts, labels[read], 1)
        np.add.at(self.confusion, (labels[read], predicted[read]), 1)
        self.skipped += [str(error) for error in summaries["error"][~read]]
        wrong = np.flatnonzero(read & (predicted != labels))
        # most confident first; equal confidences in file order, as one sort of all the files would give
        self.mistakes = sorted(self.mistakes + [(-float(confidence[i]), start + int(i), int(predicted[i]))
                                                for i in wrong])[:self.top_mistakes]
        self.done, self.count = end, self.count + int(read.sum())

    def result(self) -> DatasetAnalysis:
        """The analysis of all the files; ValueError when some were not added or none could be read."""
        if self.done != len(self.files):
            raise ValueError(f"image summaries for {self.done} of {len(self.files)} files")
        if self.count == 0:
            raise ValueError(f"none of the {len(self.files)} images could be read")
        names, seen = self.class_names, np.maximum(self.class_counts, 1)[:, None, None]
        mistakes = [Mistake(str(self.files[i][0]), names[self.labels[i]], names[predicted], -negative)
                    for negative, i, predicted in self.mistakes]
        return DatasetAnalysis(names, self.count, self.skipped, self.sums["distance"] / self.count,
                               self.sums["entropy"] / self.count, self.class_counts,
                               self.sums["cls_attention"] / seen, self.sums["cls_rollout"] / seen, self.confusion,
                               mistakes, readout=self.readout)


def readout(checkpoint: Checkpoint) -> str:
    """What the class maps start from (``DatasetAnalysis.readout``): the CLS token, or a staged model's average
    pooling."""
    return "average pooling" if getattr(checkpoint.model.config, "stage_depths", ()) else "CLS"


def check_batch_size(batch_size: int) -> None:
    """ValueError unless ``batch_size`` is a whole number of at least 1."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number of at least 1, got {batch_size!r}")


def analyze_files(checkpoint: Checkpoint, files: Sequence[tuple[Path, int]], batch_size: int = 64,
                  top_mistakes: int = 20, progress: Callable[[int, int], None] | None = None) -> DatasetAnalysis:
    """Analyse ``(image file, true class)`` pairs; ``progress(done, total)`` is called after each file.

    ``check_forward_fits``, then ``summarize_files``."""
    check_batch_size(batch_size)
    check_forward_fits(checkpoint)
    return summarize_files(checkpoint, files, batch_size, top_mistakes, progress)


def summarize_files(checkpoint: Checkpoint, files: Sequence[tuple[Path, int]], batch_size: int = 64,
                    top_mistakes: int = 20, progress: Callable[[int, int], None] | None = None) -> DatasetAnalysis:
    """``analyze_files`` for a caller that asked ``check_forward_fits`` (``vit.analyze``): ``summaries`` of each run
    of ``batch_size`` files, added to an ``Aggregator``."""
    check_batch_size(batch_size)
    if not files:
        raise ValueError("no images to analyse")
    total = Aggregator(checkpoint.class_names, files, top_mistakes, readout(checkpoint))
    for start in range(0, len(files), batch_size):
        chunk = files[start:start + batch_size]
        total.add(summaries(checkpoint, [path for path, _ in chunk]))
        if progress is not None:
            for done in range(start + 1, start + len(chunk) + 1):
                progress(done, len(files))
    return total.result()


# --- figures ------------------------------------------------------------------------------------

def confusion_figure(confusion: np.ndarray, class_names: list[str]) -> go.Figure:
    """Rows: true class; columns: predicted; each row as shares of that class, counts on hover."""
    shares = confusion / np.maximum(confusion.sum(axis=1, keepdims=True), 1)
    class_names = [escape_plotly(name) for name in class_names]  # Plotly reads HTML tags in labels
    fig = go.Figure(go.Heatmap(z=shares, x=class_names, y=class_names, colorscale="Blues", zmin=0, zmax=1,
                               customdata=confusion, colorbar=dict(title="share"),
                               hovertemplate="true %{y} → predicted %{x}: %{customdata} (%{z:.1%})<extra></extra>"))
    # automargin: with the margins at 0 the class names and axis titles were drawn outside the figure.
    fig.update_xaxes(title="predicted class", type="category", automargin=True)
    fig.update_yaxes(title="true class", autorange="reversed", type="category", automargin=True)
    fig.update_layout(title="Confusion matrix", height=520, margin=dict(l=0, r=0, t=40, b=0))
    return fig


def class_maps_figure(maps: np.ndarray, class_names: list[str], title: str, colormap: str = "inferno") -> go.Figure:
    """One heatmap per class of ``maps (K, gh, gw)``, each on its own scale."""
    K = len(class_names)
    class_names = [escape_plotly(name) for name in class_names]  # Plotly reads HTML tags in titles
    cols = min(K, 5)
    rows = -(-K // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=class_names, horizontal_spacing=0.02,
                        vertical_spacing=0.08)
    for k in range(K):
        fig.add_trace(go.Heatmap(z=maps[k], colorscale=colormap, showscale=False,
                                 hovertemplate=f"{class_names[k]}: row %{{y}}, col %{{x}}: %{{z:.4f}}<extra></extra>"),
                      row=k // cols + 1, col=k % cols + 1)
    fig.update_yaxes(autorange="reversed", showticklabels=False, scaleanchor="x")
    fig.update_xaxes(showticklabels=False)
    fig.update_layout(title=title, height=40 + 200 * rows, margin=dict(l=0, r=0, t=60, b=0))
    return fig


def figures(analysis: DatasetAnalysis) -> dict[str, go.Figure]:
    """Every plot of the analysis by file stem."""
    from vit.explain.views.figures import (
        layer_stats_figure,  # the explorer's per-image version of the ViT paper's Fig. 7
    )

    a = analysis
    read = "CLS" if a.readout == "CLS" else "average pooling's"  # a model with stages reads every token
    return {
        "distance": layer_stats_figure(a.distance, "mean attention distance (px)", "Mean attention distance per head"),
        "entropy": layer_stats_figure(a.entropy, "attention entropy (nats)", "Attention entropy per head"),
        "class_attention": class_maps_figure(a.class_attention, a.class_names,
                                             f"Mean {read} attention of the last layer, per true class"),
        "class_rollout": class_maps_figure(a.class_rollout, a.class_names, f"Mean {read} rollout, per true class"),
        "confusion": confusion_figure(a.confusion, a.class_names),
        **(mechanism_figures(a.mechanism, a.class_names) if a.mechanism is not None else {}),
    }


def _png(analysis: DatasetAnalysis, stem: str, path: Path) -> None:
    """The matplotlib version of one plot (static, for papers and READMEs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = analysis
    if stem.startswith("mechanism_"):
        return _mechanism_png(mechanism_figures(a.mechanism, a.class_names)[stem], stem, path)
    if stem in ("distance", "entropy"):
        values = a.distance if stem == "distance" else a.entropy
        fig, ax = plt.subplots(figsize=(6, 4))
        L, H = values.shape
        for h in range(H):
            ax.scatter(np.arange(1, L + 1), values[:, h], s=14)
        ax.plot(np.arange(1, L + 1), np.nanmean(values, axis=1), "k--", lw=1, label="mean over heads")
        ax.set_xlabel("layer")
        ax.set_ylabel("mean attention distance (px)" if stem == "distance" else "attention entropy (nats)")
        ax.legend()
    elif stem == "confusion":
        fig, ax = plt.subplots(figsize=(6, 5))
        shares = a.confusion / np.maximum(a.confusion.sum(axis=1, keepdims=True), 1)
        image = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
        ax.set_xticks(range(len(a.class_names)), a.class_names, rotation=90)
        ax.set_yticks(range(len(a.class_names)), a.class_names)
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
        fig.colorbar(image)
    else:
        maps = a.class_attention if stem == "class_attention" else a.class_rollout
        K = len(a.class_names)
        cols = min(K, 5)
        rows = -(-K // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(2 * cols, 2.2 * rows), squeeze=False)
        for k, ax in enumerate(axes.flat):
            ax.axis("off")
            if k < K:
                ax.imshow(maps[k], cmap="inferno")
                ax.set_title(a.class_names[k], fontsize=8)
    fig.tight_layout()
    atomic_write_with(path, lambda f: fig.savefig(f, dpi=120, format="png"))
    plt.close(fig)


def write_outputs(analysis: DatasetAnalysis, out: Path, extra: dict | None = None,
                  sections: Sequence[str] = ()) -> list[Path]:
    """``analysis.json`` (with ``extra``), one PNG per plot and a self-contained ``report.html`` (the plots, then
    ``sections``, more HTML) in ``out``; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    path = out / "analysis.json"
    atomic_write_text(path, json.dumps({**(extra or {}), **analysis.to_json()}, indent=2))
    written.append(path)
    html = []
    for i, (stem, fig) in enumerate(figures(analysis).items()):
        png = out / f"{stem}.png"
        _png(analysis, stem, png)
        written.append(png)
        html.append(fig.to_html(full_html=False, include_plotlyjs=i == 0))  # plotly.js once, offline
    path = out / "report.html"
    atomic_write_text(path, "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Dataset analysis</title>"
                      "</head><body>" + "\n".join([*html, *sections]) + "</body></html>")
    written.append(path)
    return written




def sample_files(files: list, limit: int | None, seed: int) -> list:
    """``limit`` items of ``files`` after a seeded shuffle (all of them, shuffled, without a limit)."""
    files = list(files)
    random.Random(seed).shuffle(files)
    return files if limit is None else files[:limit]


# --- the mechanism over a dataset (issue 24) ------------------------------------------------------

@dataclass
class MechanismStats:
    """Dataset versions of the explorer's Mechanism view; ``K`` classes, ``L`` layers, ``H`` heads."""

    class_counts: np.ndarray  # (K,) images per true class
    dla_heads: np.ndarray  # (K, L, H) mean direct logit attribution of each head to the true class's logit
    dla_mlps: np.ndarray  # (K, L)
    ablation: np.ndarray | None  # (L, H) mean change of the true class's logit when each head alone is zeroed
    norm_threshold: float  # what counts as a high-norm token
    high_norm_rate: np.ndarray  # (L + 1,) share of patch tokens over the threshold, after the embedding and each layer
    high_norm_positions: np.ndarray  # (gh, gw) share of images whose patch is over it after the last layer
    prefix_high_norm_rate: np.ndarray  # (P,) the same for each prefix token (CLS, DIST, REG ...)
    massive: np.ndarray  # (L, 4) mean over images of the top 1-3 and median |block output|
    sink_mass: np.ndarray  # (L, H) mean share of attention on each head's strongest key
    sink_value_norm: np.ndarray  # (L, H) mean value norm of that key
    sink_on_prefix: np.ndarray  # (L, H) share of images whose strongest key is a prefix token

    def to_json(self) -> dict:
        return {key: (value.tolist() if isinstance(value, np.ndarray) else value) for key, value in vars(self).items()}


def mechanism_summaries(checkpoint: Checkpoint, files: Sequence[tuple[Path, int]],
                        ablation: bool = True) -> dict[str, np.ndarray]:
    """What ``aggregate_mechanism`` needs of each ``(image file, true class)``, one image at a time at the
    checkpoint's size.

    Per image: ``read (N,)`` bool; ``dla_heads (N, L, H)`` and ``dla_mlps (N, L)`` (attribution to the true
    class's logit); ``ablation (N, L, H)`` (zeros without ``ablation``); ``massive (N, L, 4)``; ``norms
    (N, L + 1, T)`` (every token's norm after the embedding and each layer); ``sink_mass``, ``sink_value_norm``
    and ``sink_on_prefix (N, L, H)``. An unreadable image is zeros (``image_summaries`` names it).
    Raises MechanismError (a ValueError) for a model the analyses do not support.
    """
    from vit.core.images import ImageError, open_image
    from vit.core.inference import preprocess
    from vit.explain.mechanism import components as mechanism
    from vit.explain.mechanism import phenomena

    model = checkpoint.model
    mechanism.check_supported(model, needs_head=True)
    grid, prefix = model.patch_grid(*checkpoint.preprocessing.image_hw), model.num_prefix_tokens
    L, H, T, N = len(model.blocks), model.blocks[0].attn.num_heads, prefix + grid[0] * grid[1], len(files)
    out = {"read": np.zeros(N, dtype=bool), "dla_heads": np.zeros((N, L, H)), "dla_mlps": np.zeros((N, L)),
           "ablation": np.zeros((N, L, H)), "massive": np.zeros((N, L, 4)),
           "norms": np.zeros((N, L + 1, T), dtype=np.float32), "sink_mass": np.zeros((N, L, H)),
           "sink_value_norm": np.zeros((N, L, H)), "sink_on_prefix": np.zeros((N, L, H), dtype=bool)}
    device = next(model.parameters()).device
    for i, (path, label) in enumerate(files):
        try:
            image = open_image(Path(path).read_bytes(), name=Path(path).name)
        except (OSError, ImageError):
            continue
        x = preprocess([image], checkpoint.preprocessing).to(device)
        target = torch.tensor([label], device=device)
        with torch.inference_mode():
            states = mechanism.hidden_states(model, x)
            dla = mechanism.direct_logit_attribution(model, x, target)
            sinks = phenomena.sink_stats(model, states, model.patch_grid(*x.shape[-2:]))
            if ablation:
                out["ablation"][i] = mechanism.ablation_grid(model, x, target)[0].double().cpu().numpy()
            out["massive"][i] = phenomena.massive_activations(states)[0].double().cpu().numpy()
            out["norms"][i] = phenomena.token_norms(states)[0].cpu().numpy()
        out["read"][i] = True
        out["dla_heads"][i] = dla.heads[0].double().cpu().numpy()
        out["dla_mlps"][i] = dla.mlps[0].double().cpu().numpy()
        out["sink_mass"][i] = sinks.mass[0].double().cpu().numpy()
        out["sink_value_norm"][i] = sinks.value_norm[0].double().cpu().numpy()
        out["sink_on_prefix"][i] = (sinks.token[0] < prefix).cpu().numpy()
    return out


class MechanismAggregator:
    """Running sums of ``mechanism_summaries`` of ``files``, fed in file order, image by image in float64 (see
    ``Aggregator``); ``result()`` is the ``MechanismStats``. Every read image's token norms are kept (small:
    ``(L + 1, T)`` floats each) to choose the default threshold after the pass."""

    def __init__(self, checkpoint: Checkpoint, files: Sequence[tuple[Path, int]], norm_threshold: float | None = None,
                 ablation: bool = True) -> None:
        model = checkpoint.model
        self.grid, self.prefix = model.patch_grid(*checkpoint.preprocessing.image_hw), model.num_prefix_tokens
        self.files, self.norm_threshold, self.ablation = files, norm_threshold, ablation
        self.labels = np.array([label for _, label in files], dtype=np.int64)
        K, L, H = len(checkpoint.class_names), len(model.blocks), model.blocks[0].attn.num_heads
        self.done = 0
        self.counts = np.zeros(K, dtype=np.int64)
        self.per_class = {"dla_heads": np.zeros((K, L, H)), "dla_mlps": np.zeros((K, L))}
        self.sums = {"ablation": np.zeros((L, H)), "massive": np.zeros((L, 4)), "sink_mass": np.zeros((L, H)),
                     "sink_value_norm": np.zeros((L, H)), "sink_on_prefix": np.zeros((L, H))}
        self.norms: list[np.ndarray] = []  # per read image (L + 1, T)

    def add(self, summaries: dict[str, np.ndarray]) -> None:
        """The next ``len(summaries["read"])`` files' summaries."""
        read = summaries["read"]
        start, end = self.done, self.done + len(read)
        if end > len(self.files):
            raise ValueError(f"mechanism summaries for {end} files; there are {len(self.files)}")
        labels = self.labels[start:end][read]
        np.add.at(self.counts, labels, 1)
        for key, total in self.per_class.items():
            np.add.at(total, labels, summaries[key][read].astype(np.float64))
        for key, total in self.sums.items():
            _add_rows(total, summaries[key][read].astype(np.float64))
        self.norms += list(summaries["norms"][read])
        self.done = end

    def result(self) -> MechanismStats:
        """The statistics of all the files; ValueError when some were not added or none could be read."""
        if self.done != len(self.files):
            raise ValueError(f"mechanism summaries for {self.done} of {len(self.files)} files")
        n, prefix = len(self.norms), self.prefix
        if n == 0:
            raise ValueError(f"none of the {len(self.files)} images could be read")
        all_norms = np.stack(self.norms)  # (n, L + 1, T)
        threshold = self.norm_threshold
        if threshold is None:
            threshold = float(2 * np.median(all_norms[:, -1, prefix:]))
        high = all_norms > threshold
        seen = np.maximum(self.counts, 1)
        return MechanismStats(
            class_counts=self.counts, dla_heads=self.per_class["dla_heads"] / seen[:, None, None],
            dla_mlps=self.per_class["dla_mlps"] / seen[:, None],
            ablation=self.sums["ablation"] / n if self.ablation else None, norm_threshold=threshold,
            high_norm_rate=high[:, :, prefix:].mean(axis=(0, 2)),
            high_norm_positions=high[:, -1, prefix:].mean(axis=0).reshape(self.grid),
            prefix_high_norm_rate=high[:, -1, :prefix].mean(axis=0), massive=self.sums["massive"] / n,
            sink_mass=self.sums["sink_mass"] / n, sink_value_norm=self.sums["sink_value_norm"] / n,
            sink_on_prefix=self.sums["sink_on_prefix"] / n)


def analyze_mechanism(checkpoint: Checkpoint, files: Sequence[tuple[Path, int]], norm_threshold: float | None = None,
                      ablation: bool = True, progress: Callable[[int, int], None] | None = None) -> MechanismStats:
    """The mechanism statistics of ``(image file, true class)`` pairs, one image at a time at the checkpoint's size.

    ``norm_threshold`` None: twice the median patch-token norm after the last layer over the images (the
    artefact tokens of Darcet et al. are far above it; give a value to compare models on one scale).
    ``ablation`` runs one pass of the remaining layers per layer and image (the slow part).
    Unreadable images are skipped (``analyze_files`` names them).
    """
    from vit.explain.mechanism import components as mechanism

    mechanism.check_supported(checkpoint.model, needs_head=True)  # before the first image, not after it
    if not files:
        raise ValueError("no images to analyse")
    total = MechanismAggregator(checkpoint, files, norm_threshold, ablation)
    for done, file in enumerate(files, start=1):
        total.add(mechanism_summaries(checkpoint, [file], ablation))
        if progress is not None:
            progress(done, len(files))
    return total.result()


def mechanism_figures(stats: MechanismStats, class_names: list[str]) -> dict[str, go.Figure]:
    """The mechanism plots by file stem."""
    from vit.explain.views.figures import layer_head_figure, massive_activations_figure

    shown = [k for k in range(len(class_names)) if stats.class_counts[k]]
    figs = {}
    if shown:
        cols = min(len(shown), 4)
        rows = -(-len(shown) // cols)
        bound = float(np.abs(stats.dla_heads[shown]).max()) or 1.0
        titles = [escape_plotly(class_names[k]) for k in shown]  # Plotly reads HTML tags in titles
        fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.03,
                            vertical_spacing=0.1)
        L, H = stats.dla_heads.shape[1:]
        for i, k in enumerate(shown):
            fig.add_trace(go.Heatmap(z=stats.dla_heads[k], x=list(range(1, H + 1)), y=list(range(1, L + 1)),
                                     colorscale="RdBu", reversescale=True, zmid=0, zmin=-bound, zmax=bound,
                                     showscale=i == 0,
                                     hovertemplate=f"{titles[i]}: layer %{{y}}, head %{{x}}: %{{z:.4g}}"
                                                   "<extra></extra>"),
                          row=i // cols + 1, col=i % cols + 1)
        fig.update_yaxes(autorange="reversed")
        fig.update_layout(title="Mean direct logit attribution of each head to the true class, per class",
                          height=60 + 240 * rows, margin=dict(l=0, r=0, t=70, b=0))
        figs["mechanism_dla"] = fig
    if stats.ablation is not None:
        figs["mechanism_ablation"] = layer_head_figure(stats.ablation, "Mean logit change of the true class when "
                                                       "each head alone is zeroed", "Δ logit")
    layers = ["embedding"] + [f"layer {i + 1}" for i in range(len(stats.high_norm_rate) - 1)]
    rate = go.Figure(go.Bar(x=layers, y=stats.high_norm_rate, marker_color="#8fa3bf",
                            hovertemplate="%{x}: %{y:.2%} of patch tokens<extra></extra>"))
    rate.update_yaxes(title=f"share of patch tokens with norm > {stats.norm_threshold:.3g}", tickformat=".0%")
    rate.update_layout(title="High-norm patch tokens per layer", height=360, margin=dict(l=0, r=0, t=40, b=0))
    figs["mechanism_high_norm_rate"] = rate
    where = go.Figure(go.Heatmap(z=stats.high_norm_positions, colorscale="Reds", zmin=0,
                                 hovertemplate="patch row %{y}, column %{x}: %{z:.1%} of images<extra></extra>"))
    where.update_yaxes(autorange="reversed", scaleanchor="x")
    where.update_layout(title="Where high-norm patches sit after the last layer", height=420,
                        margin=dict(l=0, r=0, t=40, b=0))
    figs["mechanism_high_norm_positions"] = where
    figs["mechanism_massive"] = massive_activations_figure(stats.massive, "Massive activations (mean over images)")
    figs["mechanism_sinks"] = layer_head_figure(stats.sink_mass, "Attention on each head's strongest key (mean "
                                                "over images)", "mass", signed=False)
    return figs


def _mechanism_png(fig: go.Figure, stem: str, path: Path) -> None:
    """A static version of a mechanism plot: the first trace's heatmap, bars or lines with matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(6, 4))
    for trace in fig.data:
        if trace.type == "heatmap":
            image = ax.imshow(np.asarray(trace.z, dtype=float), cmap="RdBu_r" if trace.zmid == 0 else "Reds")
            figure.colorbar(image)
            break
        if trace.type == "bar":
            ax.bar(range(len(trace.y)), trace.y)
        elif trace.type == "scatter":
            ax.plot(np.asarray(trace.x), np.asarray(trace.y), marker="o", label=trace.name)
    if any(t.type == "scatter" for t in fig.data):
        ax.legend()
    ax.set_title(fig.layout.title.text or stem, fontsize=8)
    figure.tight_layout()
    atomic_write_with(path, lambda f: figure.savefig(f, dpi=120, format="png"))
    plt.close(figure)

