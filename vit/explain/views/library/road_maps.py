"""The maps of a model opened by the library road (``Checkpoint.road == "library"``: transformers' or timm's own model,
its attention recorded, ``vit.sources.library_road.transformers_models.LibraryModel``,
``vit.sources.library_road.timm_models``), from the recorded post-softmax attention over the library's own forward.
The model is read through what it offers (``run``, ``layout``, ``num_layers``, ``num_heads``), so this wing imports
nothing of ``vit.sources``.

Each map the road draws is a ``LibraryMethod``: its name, the ``explain`` arguments it reads, whether it explains a
class, and the function that draws it. This module draws each layer's and head's attention for a query and the
attention rollout (Abnar & Zuidema); its wings add theirs (``WINGS``: the gradient maps, captum's attributions and
RISE), each in its own module. Any other map is refused in one line naming what the road draws."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from vit.checkpoint import Checkpoint
from vit.core.inference import Prediction, predictions_from_logits, preprocess
from vit.explain.methods.attention import pooled_readout, rollout_factor, rollout_rows, rollout_vector

# The modules that add maps to the library road, each with a ``METHODS`` tuple of ``LibraryMethod``s
WINGS = ("vit.explain.views.library.road_gradients", "vit.explain.views.library.road_attributions")


@dataclass
class LibraryMap:
    """One map of one image on the library road: ``map`` (gh, gw) (a pixel method's ``(H, W)`` on the model's input
    pixels, ``pixels``), ``heads`` (H, gh, gw) of ``heads_layer`` (the attention map's layer; None otherwise), the
    patch ``grid``, the prefix tokens, the prediction of a classifier, the explained class's name (``target``)."""

    map: np.ndarray
    heads: np.ndarray | None
    heads_layer: int | None
    grid: tuple[int, int]
    num_prefix_tokens: int
    prediction: Prediction | None
    target: str | None = None
    pixels: bool = False


@dataclass(frozen=True)
class LibraryMethod:
    """A map the library road draws: ``reads`` (the ``explain`` arguments it takes: ``layer``, ``head``, ``query``,
    ``target``, and option names), ``classifier`` (it explains a class: refused for a model without one),
    ``describe(layer, head, query, target)`` (its caption) and ``draw(checkpoint, pixels, layer, head, query,
    class_index, options) -> LibraryMap``, where ``pixels`` is the image preprocessed ``(1, C, H, W)`` on the
    model's device, ``layer`` (from 0), ``head`` and ``query`` already in range (``head`` None: the heads' mean),
    ``class_index`` the explained class (None: the predicted one, or a map of no class) and ``options`` the rest of
    ``explain``'s keywords."""

    name: str
    reads: tuple[str, ...]
    classifier: bool
    draw: Callable[..., LibraryMap]
    describe: Callable[..., str]
    # why the map cannot be drawn for a model (a library-road model), in one line, or None: what reaches only some
    # models (AttnLRP's rules, transformers' modules alone)
    problem: Callable[[object], str | None] | None = None
    default_layer: int = -1  # the layer when none is given (LeGrad's first explained layer: the last but one)


def gradient_problem(model) -> str | None:
    """Why a map that reads a gradient from the pixels on through the model's forward (the class map's and LeGrad's
    gradients at its attention, AttnLRP's and captum's at its pixels) is not drawn for ``model``, or None: it
    declares that none passes (``LibraryModel.no_gradient``). The CAMs read theirs from a layer's input on."""
    why = getattr(model, "no_gradient", None)
    return None if why is None else (f"this map reads a gradient through the model from its pixels, and no gradient "
                                     f"passes there: {why}; its attention, rollout, CAMs and perturbation maps draw")


def attention_gradient_problem(model) -> str | None:
    """Why a map that reads the gradient at the attention probabilities (the class map, LeGrad) is not drawn for
    ``model``, or None: ``gradient_problem``, or a layer whose attention ``nn.MultiheadAttention`` computes, whose
    function hands its per-head weights back beside its output (a view off the output's path: no gradient reaches
    them)."""
    if (why := gradient_problem(model)):
        return why
    if "mha" in getattr(model, "attention_kinds", ()):
        return ("this map reads the gradient at each layer's attention, and this model's attention runs through "
                "nn.MultiheadAttention, whose per-head weights are handed back beside its output, off the path the "
                "gradient takes; its CAMs, captum's maps and RISE draw")
    return None


def prediction_of(checkpoint: Checkpoint, logits: torch.Tensor | None) -> Prediction | None:
    """The top-5 prediction of a classifier's ``logits`` (1, classes), None without them."""
    if logits is None or not checkpoint.class_names:
        return None
    return predictions_from_logits(logits[:1].detach(), checkpoint.class_names, 5)[0]


def _logits(model, out) -> torch.Tensor | None:
    return out.logits if model.is_classifier else None


def centre_token(grid: tuple[int, int], num_prefix_tokens: int) -> int:
    """The token of the patch at the grid's centre (row ``gh // 2``, column ``gw // 2``): the one token's map a model
    without CLS defaults to, where token 0 would be its top-left corner patch."""
    return num_prefix_tokens + (grid[0] // 2) * grid[1] + grid[1] // 2


def default_query(method: str, query: int | None, grid: tuple[int, int], num_prefix_tokens: int) -> int | None:
    """The token ``method``'s map starts from: ``query`` where given; else CLS (token 0) where the model has prefix
    tokens; else, for a model without (I-JEPA: its classifier reads the mean of its patch tokens), the centre patch
    for one token's attention and None for rollout and the class map, which then start from the mean of the
    patches' rows (``pooled_readout``), as a pooled classifier reads them."""
    if query is not None or num_prefix_tokens:
        return 0 if query is None else query
    return centre_token(grid, num_prefix_tokens) if method == "attention" else None


def describe_query(query: int | None) -> str:
    """What a map starts from, for its caption: token ``query``, or the pooled readout (None)."""
    return f"token {query}" if query is not None else "the mean of the patch tokens (what the classifier reads)"


def _attention(checkpoint, pixels, layer, head, query, class_index, options) -> LibraryMap:
    model = checkpoint.model
    grid, prefix, L = model.input_grid(pixels), model.layout.num_prefix_tokens, model.num_layers
    query = default_query("attention", query, grid, prefix)
    out, kept = model.run(pixels, layers=[layer], rows=[query])
    row = kept[layer % L]  # (1, H, 1, T): the layer's extra tokens (EoMT's queries) first where it has them
    keys = prefix + model.layout.extra_of(layer % L)
    place = getattr(model, "places", ())[layer % L] if getattr(model, "places", ()) else None
    if place is not None:  # a layer on its own grid (a stage's, pooled keys): its row over its own keys
        keys, grid = place.key_prefix, place.key_grid
    patches = row[0, :, 0, keys:keys + grid[0] * grid[1]]  # the prefix keys dropped, and any after the patches
    heads = patches.float().reshape(-1, *grid)  # (H, gh, gw), row-major
    chosen = heads.mean(0) if head is None else heads[head]
    return LibraryMap(chosen.cpu().numpy().astype(np.float32), heads.cpu().numpy().astype(np.float32), layer % L,
                      grid, prefix, prediction_of(checkpoint, _logits(model, out)))


def _rollout(checkpoint, pixels, layer, head, query, class_index, options) -> LibraryMap:
    model = checkpoint.model
    grid, prefix, L = model.input_grid(pixels), model.layout.num_prefix_tokens, model.num_layers
    asked = range(layer % L + 1)
    if any(model.layout.extra_of(i) for i in asked):
        first = next(i for i in asked if model.layout.extra_of(i))
        raise ValueError(f"rollout multiplies layers over the same tokens, and layer {first + 1} adds "
                         f"{model.layout.extra_of(first)} tokens (its object queries); choose a layer up to {first}")
    out, kept = model.run(pixels, layers=asked, heads_mean=True)  # each layer's heads' mean: its factor's fusion
    factors = [rollout_factor(kept[i], "mean", 0.0, prefix) for i in asked]  # (1, T, T) each
    query = default_query("rollout", query, grid, prefix)
    T = factors[0].shape[-1]
    row = (rollout_rows(factors, query) if query is not None else  # from the mean of the patches' rows: (1, T)
           rollout_vector(factors, pooled_readout(T, prefix, grid[0] * grid[1]).to(factors[0].device)))[0]  # (T,)
    value = row[prefix:prefix + grid[0] * grid[1]].reshape(grid).float()  # the patches' keys
    return LibraryMap(value.cpu().numpy().astype(np.float32), None, None, grid, prefix,
                      prediction_of(checkpoint, _logits(model, out)))


def _which(head) -> str:
    return "the heads' mean" if head is None else f"head {head + 1}"  # from 1, as the caption's layer


BUILT_IN = (
    LibraryMethod("attention", ("layer", "head", "query"), False, _attention,
                  lambda layer, head, query, target: f"Layer {layer + 1}, {_which(head)}: what token {query} attends "
                                                     "to."),
    LibraryMethod("rollout", ("layer", "query"), False, _rollout,
                  lambda layer, head, query, target: f"Attention rollout up to layer {layer + 1}: what "
                                                     f"{describe_query(query)} draws on."),
)


@functools.cache
def _every() -> tuple[LibraryMethod, ...]:
    """``BUILT_IN`` and each wing's ``METHODS``, imported once (static tuples; the explorer asks on every rerun)."""
    return BUILT_IN + tuple(m for wing in WINGS for m in importlib.import_module(wing).METHODS)


def methods() -> dict[str, LibraryMethod]:
    """Every map the library road draws, by name, in the explorer's order: the attention and rollout, then each
    wing's (``WINGS``)."""
    return {m.name: m for m in _every()}


def method_names(classifier: bool = True, model=None) -> list[str]:
    """The names of the maps the library road draws for a model with (or without) a classifier, the default first;
    with ``model`` (a library-road model) only those that reach it (``LibraryMethod.problem``)."""
    return [name for name, m in methods().items() if (classifier or not m.classifier)
            and (model is None or m.problem is None or m.problem(model) is None)
            and (model is None or _own_grids_problem(model, name) is None)]


def refusal(method: str, classifier: bool = True, model=None) -> str | None:
    """Why ``method`` is not drawn on the library road for a model with (or without) a classifier (and, given, for
    ``model``), or None when it is."""
    chosen = methods().get(method)
    if chosen is None:
        return (f"{method} is not drawn yet for a model opened as its library builds it (the library road draws "
                f"{', '.join(method_names())}); issue 91 tracks the rest")
    if chosen.classifier and not classifier:
        return f"{method} explains a class: this model has no classifier"
    if model is not None and chosen.problem is not None:
        return chosen.problem(model)
    return None if model is None else _own_grids_problem(model, method)


def _own_grids_problem(model, method: str) -> str | None:
    """Why ``method`` is not drawn on a model whose layers each run over tokens of their own (``model.places``:
    stages, windows, class tokens), or None: such a model draws each layer's attention and the maps that read its
    logits alone (captum's, RISE: ``road_attributions``)."""
    if not getattr(model, "places", ()) or method == "attention":
        return None
    if method in {m.name for m in importlib.import_module(WINGS[1]).METHODS}:
        return None
    return (f"{method} reads every layer over the same tokens, and this model's layers run over different ones "
            "(stages, windows or class tokens, each layer on its own grid): its attention is drawn layer by layer")


def library_map(checkpoint: Checkpoint, image: Image.Image, method: str, layer: int, head: int | None,
                query: int | None, class_index: int | None = None, options: Mapping[str, object] | None = None
                ) -> LibraryMap:
    """``method``'s map of ``image`` at the model's own input size (``attention`` of ``layer``, ``head`` or the
    heads' mean, for token ``query``; ``rollout`` up to ``layer`` from ``query``; a wing's map). ``layer``, ``head``,
    ``query`` and ``class_index`` are already in range (``vit.explain``'s checks); ``query`` None: the default,
    CLS where the model has one, else the centre patch for one token's attention and the mean of the patch tokens
    (what a pooled classifier reads) for rollout and the class map. The recording keeps only what the
    map reads (one row of one layer for ``attention``, the layers up to ``layer`` for ``rollout``), counted by the
    cost model first."""
    model = checkpoint.model
    problem = refusal(method, bool(checkpoint.class_names), model)
    if problem:
        raise ValueError(problem)
    pixels = preprocess([image], checkpoint.preprocessing).to(next(model.parameters()).device)
    return methods()[method].draw(checkpoint, pixels, layer, head, query, class_index, dict(options or {}))
