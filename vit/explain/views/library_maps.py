"""The maps of a model opened by the library road (``Checkpoint.road == "library"``: transformers' or timm's own model,
its attention recorded, ``vit.sources.library_road.transformers_models.LibraryModel``,
``vit.sources.library_road.timm_models``): each layer's and head's attention for a query, and the attention rollout
(Abnar & Zuidema), from the recorded post-softmax attention over the library's own forward. The model is read through
what it offers (``run``, ``layout``, ``num_layers``, ``num_heads``), so this wing imports nothing of ``vit.sources``.
The other maps are refused in one line until the library road draws them (issue 91)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from vit.checkpoint import Checkpoint
from vit.core.inference import Prediction, predictions_from_logits, preprocess
from vit.explain.methods.attention import rollout_factor, rollout_rows

METHODS = ("attention", "rollout")  # what the library road draws today, the default first


@dataclass
class LibraryMap:
    """One map of one image on the library road: ``map`` (gh, gw), ``heads`` (H, gh, gw) of ``heads_layer`` (the
    attention map's layer; None for rollout), the patch ``grid``, the prefix tokens, the prediction of a
    classifier."""

    map: np.ndarray
    heads: np.ndarray | None
    heads_layer: int | None
    grid: tuple[int, int]
    num_prefix_tokens: int
    prediction: Prediction | None


def refusal(method: str) -> str | None:
    """Why ``method`` is not drawn on the library road, or None when it is."""
    if method in METHODS:
        return None
    return (f"{method} is not drawn yet for a model opened as its library builds it (the library road draws "
            f"{', '.join(METHODS)}); issue 91 tracks the rest")


def library_map(checkpoint: Checkpoint, image: Image.Image, method: str, layer: int, head: int | None,
                query: int) -> LibraryMap:
    """``method`` (``attention`` of ``layer``, ``head`` or the heads' mean, for token ``query``; ``rollout`` up to
    ``layer`` from ``query``) of ``image`` at the model's own input size. ``layer``, ``head`` and ``query`` are
    already in range (``vit.explain``'s checks). The recording keeps only what the map reads: one row of one
    layer for ``attention``, the layers up to ``layer`` for ``rollout``, counted by the cost model first."""
    problem = refusal(method)
    if problem:
        raise ValueError(problem)
    model = checkpoint.model
    pixels = preprocess([image], checkpoint.preprocessing).to(next(model.parameters()).device)
    grid = model.layout.grid
    prefix = model.layout.num_prefix_tokens
    L = model.num_layers
    if method == "attention":
        out, kept = model.run(pixels, layers=[layer], rows=[query])
        row = kept[layer % L]  # (1, H, 1, T)
        heads = row[0, :, 0, prefix:].float().reshape(-1, *grid)  # (H, gh, gw): the prefix keys dropped, row-major
        chosen = heads.mean(0) if head is None else heads[head]
        value, heads_layer = chosen, layer % L
    else:
        asked = range(layer % L + 1)
        out, kept = model.run(pixels, layers=asked)
        factors = [rollout_factor(kept[i], "mean", 0.0, prefix) for i in asked]  # (1, T, T) each
        row = rollout_rows(factors, query)[0]  # (T,)
        value = row[prefix:].reshape(grid).float()
        heads, heads_layer = None, None
    logits = out.logits if model.is_classifier else None
    prediction = None if logits is None else predictions_from_logits(logits[:1], checkpoint.class_names, 5)[0]
    return LibraryMap(value.cpu().numpy().astype(np.float32),
                      None if heads is None else heads.cpu().numpy().astype(np.float32), heads_layer, grid, prefix,
                      prediction)

