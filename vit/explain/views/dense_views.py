"""The dense-feature views of the explorer and the notebook: PCA colours, patch similarity and correspondences of
one layer's patch tokens, read from an ``image_analysis.Analysis`` (its hidden states: no second forward) and bounded
like every other view. The tensor computations are ``vit.explain.methods.dense``'s; this module reads an analysis's
tokens for them and places their answers on the image's patch grid (the pages and ``vit.api`` both call it).

A layer's tokens are that block's output after the model's final norm, as DINO's
``get_intermediate_layers(norm=True)`` gives them (the last layer's are the model's output tokens); CLS and
registers are left out. Layers count from 0, a negative one from the end.

A model with stages (Swin, Hiera; ``Analysis.staged``): a layer's tokens are its output on its own grid and width
(``Analysis.outputs``, row-major), through the final norm in the last stage only (the norm is that stage's width:
timm's ``forward_intermediates(norm=True)``). A patch of the image means the token of the layer's grid covering it
(``covering_token``); maps and colours come back on the image's patch grid, each cell repeated over the patches it
covers (``on_patch_grid``), and matches are cells of the layers' grids, placed by ``patch_centres`` over the image.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

import matplotlib
import numpy as np
import torch
from PIL import Image, ImageDraw

from vit.checkpoint import Checkpoint
from vit.core.images import to_mode
from vit.core.inference import TRAINING_SIZE, InputSize, input_shape
from vit.costs import memory
from vit.costs.bounds import TooManyTokens
from vit.costs.fits import CHUNK_BYTES, LAYER_CACHE_BYTES, analysis_limits, has_logit_bias
from vit.costs.plan import largest_square_side
from vit.explain.methods import dense
from vit.explain.methods.dense import DENSE_COPIES
from vit.explain.methods.stage_maps import on_patch_grid
from vit.explain.views.image_analysis import Analysis


def dense_bytes(checkpoint: Checkpoint, tokens: int) -> int:
    """Bytes one image's dense view can hold at most: the analysis (hidden states, cache, a chunk) and its copies of
    the patch tokens (and the query chunk of a relative position bias, BEiT's or SAM's, that a forward forms)."""
    return memory.dense_bytes(checkpoint.model.config, tokens, DENSE_COPIES)


def check_dense_fits(checkpoint: Checkpoint, image: Image.Image, size: InputSize = TRAINING_SIZE,
                     what: str = "The PCA and similarity views") -> None:
    """``TooManyTokens`` (one line naming the largest square input that fits) when ``image`` at ``size`` is over the
    analysis memory bound (VIT_ANALYSIS_MEMORY_MB) with the dense views' copies of its tokens. Checked before any
    work."""
    model = checkpoint.model
    config, prefix = model.config, model.num_prefix_tokens
    shape = input_shape(image, checkpoint.preprocessing, config.patch_size, size)
    grid = model.patch_grid(*shape)
    tokens = prefix + grid[0] * grid[1]
    need = dense_bytes(checkpoint, tokens)
    _, limit = analysis_limits()
    if need > limit:
        per_token = dense_bytes(checkpoint, 1) - dense_bytes(checkpoint, 0)
        # A bias's query chunk: at most BIAS_CHUNK_BYTES of rows and their index, plus one row a token (per_token)
        bias = memory.bias_chunk_most(config.num_heads) if has_logit_bias(config) else 0
        most = max(limit - LAYER_CACHE_BYTES - CHUNK_BYTES - bias, 0) // per_token
        side = largest_square_side(config.patch_size, max(most - prefix, 1))
        raise TooManyTokens(f"{what} at {shape[1]}×{shape[0]} px ({tokens:,} tokens) need about "
                            f"{need / 2**20:,.0f} MB, over the {limit / 2**20:,.0f} MB limit per image "
                            f"(VIT_ANALYSIS_MEMORY_MB); the largest square input that fits is {side} px. Choose a "
                            "smaller input size.")


def layer_index(analysis: Analysis, layer: int | None) -> int:
    """``layer`` (None: the last) counted from 0; ValueError naming the range."""
    L = analysis.num_layers
    if layer is None:
        return L - 1
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not -L <= layer < L:
        raise ValueError(f"layer {layer!r} is out of range: this model has {L} layers, numbered 0 to {L - 1} "
                         f"(or -{L} to -1 from the end)")
    return int(layer) % L


def library_analysis(checkpoint: Checkpoint, image: Image.Image) -> Analysis:
    """The dense views' analysis of ``image`` through a model opened as its library builds it
    (``Checkpoint.road == "library"``: it offers ``run`` and ``layout``), at its own input size: the library's own
    last hidden state ``(T, D)`` (``library_states``), its prefix tokens first (``layout.num_prefix_tokens``), then
    the patches row-major on ``layout.grid``; its prediction where it has a classifier. ValueError in one line for a
    model whose output has no last hidden state (a depth model's head)."""
    from vit.core.inference import predictions_from_logits, preprocess

    model = checkpoint.model
    layout = model.layout
    pixels = preprocess([image], checkpoint.preprocessing).to(next(model.parameters()).device)  # (1, C, H, W)
    with torch.inference_mode():
        logits, states = library_states(model, pixels)
    if states is None:
        raise ValueError("this model's output has no last hidden state (its head gives another output: a depth "
                         "model's); the PCA, similarity and correspondences read a model's patch tokens")
    gh, gw = model.input_grid(pixels)  # the layout's, or the image's own (DPT's keep-aspect resize)
    if states.shape[1] != layout.num_prefix_tokens + gh * gw + layout.num_suffix_tokens:
        raise ValueError(f"its last hidden state has {states.shape[1]} tokens, not the {layout.num_prefix_tokens} "
                         f"prefix tokens and {gh}x{gw} patches its layout places")
    if logits is None:  # a feature model: no prediction
        logits = pixels.new_zeros(1, 0)
    [prediction] = predictions_from_logits(logits.float(), checkpoint.class_names, 5, model=model)
    return Analysis(prediction, tuple(torch.empty(1, model.num_heads, 0, 0) for _ in range(model.num_layers)),
                    (gh, gw), layout.patch_hw, tuple(pixels.shape[-2:]), layout.num_prefix_tokens,
                    last_hidden_state=states[0, :layout.num_prefix_tokens + gh * gw].float().cpu())


_LIBRARY_STATES: contextvars.ContextVar[dict | None] = contextvars.ContextVar("vit_library_states", default=None)


def _keep_output(module, args, output) -> None:
    kept = _LIBRARY_STATES.get()  # this context's call only: two threads over one model never mix
    if kept is not None:
        kept["out"] = output


def library_states(model, pixels: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """A library model's logits ``(B, classes)`` (None without a classifier) and last hidden state ``(B, T, D)``
    of ``pixels`` (None where it has none): timm's ``forward_features`` of its trunk (the final norm included), or
    transformers' base model's ``last_hidden_state`` (a classifier's ViT's, read as it passes in the library's own
    forward: ``model.run``)."""
    trunk = getattr(model, "trunk", None)
    if trunk is not None:  # timm: the features its head reads, and the head's logits of them (timm's forward)
        features = trunk.forward_features(pixels)
        return (model.model.forward_head(features) if model.is_classifier else None), features
    base = model.model.base_model  # transformers' PreTrainedModel: the model a head wraps, or the model itself
    kept: dict = {}
    token = _LIBRARY_STATES.set(kept)
    handle = base.register_forward_hook(_keep_output)
    try:
        out = model.run(pixels)[0]
    finally:
        handle.remove()
        _LIBRARY_STATES.reset(token)
    return (out.logits if model.is_classifier else None), getattr(kept.get("out"), "last_hidden_state", None)


def _library_layer(analysis: Analysis, index: int) -> None:
    """ValueError in one line when a library model's dense view asks a layer other than its last."""
    L = analysis.num_layers
    if index != L - 1:
        raise ValueError(f"layer {index}: a model opened as its library builds it gives its dense views of its last "
                         f"hidden state only (layer -1, or {L - 1}); its library applies no final norm to the others")


def patch_tokens(checkpoint: Checkpoint, analysis: Analysis, layer: int | None = None) -> torch.Tensor:
    """Layer ``layer``'s patch tokens after the final norm, ``(gh * gw, D)`` float32 row-major, kept in the
    analysis's cache (a library model's: its last hidden state's patches, ``library_analysis``)."""
    if analysis.hidden is None and not analysis.staged and analysis.last_hidden_state is None:
        raise ValueError("this analysis has no hidden states; run image_analysis.analyse")
    index = layer_index(analysis, layer)
    if analysis.last_hidden_state is not None:
        _library_layer(analysis, index)
        return analysis.last_hidden_state[analysis.num_prefix_tokens:]

    def compute() -> torch.Tensor:
        model = checkpoint.model
        parameter = next(model.parameters())
        if analysis.staged:
            return dense.stage_tokens(model, analysis.outputs[index][None], index)[0]
        with torch.inference_mode():
            x = model.norm(analysis.hidden[index + 1][None].to(parameter.device, parameter.dtype))[0]  # (T, D)
        return x[analysis.num_prefix_tokens:].float().cpu()

    return analysis.cache.get_or_compute(("dense_tokens", index), compute)


def layer_grid(analysis: Analysis, layer: int | None = None) -> tuple[int, int]:
    """The grid layer ``layer``'s tokens lie on: the image's patch grid, or a stage layer's own."""
    return analysis.layer_grid(layer_index(analysis, layer))


def unit_tokens(checkpoint: Checkpoint, analysis: Analysis, layer: int | None = None) -> torch.Tensor:
    """``patch_tokens`` scaled to length 1, computed once per image and layer: a click is then one product."""
    index = layer_index(analysis, layer)
    return analysis.cache.get_or_compute(("dense_unit", index),
                                         lambda: dense.unit_tokens(patch_tokens(checkpoint, analysis, index)))


def query_vector(checkpoint: Checkpoint, analysis: Analysis, token: int, layer: int | None = None) -> torch.Tensor:
    """Token ``token`` (0 is CLS, patch ``p`` is ``p + num_prefix_tokens``) of layer ``layer`` after the final
    norm, ``(D,)``: a prefix token too."""
    T, prefix = analysis.num_tokens, analysis.num_prefix_tokens
    if not 0 <= token < T:
        raise ValueError(f"token {token} is out of range: this input has {T} tokens, numbered 0 to {T - 1}")
    if analysis.staged:  # the layer's token covering that patch of the image
        from vit.model.stages import covering_token

        return patch_tokens(checkpoint, analysis, layer)[covering_token(token, analysis.grid,
                                                                        layer_grid(analysis, layer))]
    if token >= prefix:
        return patch_tokens(checkpoint, analysis, layer)[token - prefix]
    if analysis.last_hidden_state is not None:  # a library model's prefix token: its last hidden state's row
        _library_layer(analysis, layer_index(analysis, layer))
        return analysis.last_hidden_state[token]
    model, index = checkpoint.model, layer_index(analysis, layer)
    parameter = next(model.parameters())
    with torch.inference_mode():
        row = analysis.hidden[index + 1][token][None, None].to(parameter.device, parameter.dtype)  # (1, 1, D)
        return model.norm(row)[0, 0].float().cpu()


def similarity_map(checkpoint: Checkpoint, analysis: Analysis, query: torch.Tensor, layer: int | None = None
                   ) -> np.ndarray:
    """The cosine similarity of ``query (D,)`` to every patch token of ``analysis`` at ``layer``: ``(gh, gw)`` on
    the image's patch grid (a stage layer's cells repeated over the patches they cover)."""
    unit = unit_tokens(checkpoint, analysis, layer)
    if query.shape[-1] != unit.shape[-1]:
        raise ValueError(f"a token of width {query.shape[-1]} cannot be compared with this layer's tokens of width "
                         f"{unit.shape[-1]}; compare within one model and one stage (the same place on its own grid)")
    return on_patch_grid(dense.similarity(unit, query).reshape(layer_grid(analysis, layer)).numpy(), analysis.grid)


def same_place(patch: int, grid: tuple[int, int], other: tuple[int, int]) -> int:
    """The patch of grid ``other`` whose centre lies under the centre of ``patch`` of ``grid`` (both row-major):
    the same click on a second model's own grid."""
    row, col = divmod(patch, grid[1])
    r = min(int((row + 0.5) * other[0] / grid[0]), other[0] - 1)
    c = min(int((col + 0.5) * other[1] / grid[1]), other[1] - 1)
    return r * other[1] + c


@dataclass
class PCAView:
    """PCA colours of one image: ``colours (gh, gw, 3)`` in [0, 1] and the foreground ``mask (gh, gw)`` (None
    without one), on the image's patch grid (a stage layer's cells repeated over the patches they cover)."""

    colours: np.ndarray
    mask: np.ndarray | None


def pca_views(checkpoints: list[Checkpoint], analyses: list[Analysis], layer: int | None = None,
              foreground: float | None = None, flip: bool = False) -> list[PCAView]:
    """PCA colours of several images (each with its checkpoint: one model, all of the same token width) fitted on
    all of them together, so a colour means the same across them; ``foreground``/``flip``: see
    ``dense.pca_images``."""
    tokens = [patch_tokens(c, a, layer) for c, a in zip(checkpoints, analyses, strict=True)]
    if len({t.shape[1] for t in tokens}) > 1:
        raise ValueError("a joint PCA needs tokens of one width; fit each model's images on their own")
    colours, masks = dense.pca_images(tokens, foreground, flip)
    grids = [layer_grid(a, layer) for a in analyses]
    return [PCAView(np.moveaxis(on_patch_grid(np.moveaxis(c.reshape(*g, 3).numpy(), -1, 0), a.grid), 0, -1),
                    None if m is None else on_patch_grid(m.reshape(g).numpy(), a.grid))
            for c, m, a, g in zip(colours, masks, analyses, grids, strict=True)]


@dataclass
class MatchView:
    """Matched patches of two images, best first: ``a``, ``b`` ``(M,)`` row-major indices on ``grid_a`` /
    ``grid_b`` (each image's patch grid, or a stage layer's own), ``score (M,)`` their cosine similarity."""

    a: np.ndarray
    b: np.ndarray
    score: np.ndarray
    grid_a: tuple[int, int] = (0, 0)
    grid_b: tuple[int, int] = (0, 0)


def match_view(checkpoint_a: Checkpoint, analysis_a: Analysis, checkpoint_b: Checkpoint, analysis_b: Analysis,
               top: int | None = 50, layer: int | None = None, layer_b: int | None = None, mutual: bool = True
               ) -> MatchView:
    """Mutual nearest neighbours of two images' patch tokens (``layer`` of A, ``layer_b`` of B: default the same
    as ``layer``), the ``top`` most similar first."""
    layer_b = layer if layer_b is None else layer_b
    unit_a = unit_tokens(checkpoint_a, analysis_a, layer)
    unit_b = unit_tokens(checkpoint_b, analysis_b, layer_b)
    if unit_a.shape[1] != unit_b.shape[1]:
        raise ValueError(f"correspondences need tokens of one width, and these models' are {unit_a.shape[1]} and "
                         f"{unit_b.shape[1]}; match images of one model, or of two models of one width")
    matches = dense.correspondences(unit_a, unit_b, top, mutual)
    return MatchView(matches.a.numpy(), matches.b.numpy(), matches.score.numpy(), layer_grid(analysis_a, layer),
                     layer_grid(analysis_b, layer_b))


def patch_centres(patches: np.ndarray, grid: tuple[int, int], size: tuple[int, int],
                  image_grid: tuple[int, int] | None = None) -> np.ndarray:
    """``(M, 2)`` pixel ``(x, y)`` centres of row-major ``patches`` of ``grid`` on an image of ``size = (width,
    height)``. ``image_grid``: the image's patch grid when ``grid`` is a stage layer's coarser one; each cell covers
    ``2**stage`` patches a side and its centre is that of the part over the image (a padded cell's is cropped)."""
    rows, cols = np.divmod(np.asarray(patches, dtype=np.int64), grid[1])
    gh, gw = image_grid or grid
    fy, fx = -(-gh // grid[0]), -(-gw // grid[1])  # patches per cell
    x = (cols * fx + np.minimum((cols + 1) * fx, gw)) / 2  # in patches
    y = (rows * fy + np.minimum((rows + 1) * fy, gh)) / 2
    return np.stack([x * size[0] / gw, y * size[1] / gh], axis=-1)


def match_colours(count: int) -> np.ndarray:
    """``(count, 3)`` uint8 colours, one per match, from a cyclic colour map."""
    return (matplotlib.colormaps["hsv"](np.linspace(0, 1, count, endpoint=False))[:, :3] * 255).astype(np.uint8)


def matches_picture(seen_a: Image.Image, seen_b: Image.Image, grid_a: tuple[int, int], grid_b: tuple[int, int],
                    a: np.ndarray, b: np.ndarray, height: int = 320,
                    image_grids: tuple[tuple[int, int] | None, tuple[int, int] | None] = (None, None)) -> Image.Image:
    """The two images side by side at ``height`` px, each match a line from its patch in A to its patch in B
    (``image_grids``: each image's patch grid where ``grid_a`` / ``grid_b`` is a stage layer's, ``patch_centres``)."""
    shown = [to_mode(s, 3).resize((max(1, round(s.width * height / s.height)), height)) for s in (seen_a, seen_b)]
    gap = 8
    picture = Image.new("RGB", (shown[0].width + gap + shown[1].width, height), (255, 255, 255))
    picture.paste(shown[0], (0, 0))
    picture.paste(shown[1], (shown[0].width + gap, 0))
    points_a = patch_centres(a, grid_a, shown[0].size, image_grids[0])
    points_b = patch_centres(b, grid_b, shown[1].size, image_grids[1]) + [shown[0].width + gap, 0]
    draw = ImageDraw.Draw(picture)
    radius = max(2, height // 100)
    for (xa, ya), (xb, yb), colour in zip(points_a, points_b, match_colours(len(a)), strict=True):
        fill = tuple(int(v) for v in colour)
        draw.line([(xa, ya), (xb, yb)], fill=fill, width=max(1, height // 240))
        for x, y in ((xa, ya), (xb, yb)):
            draw.ellipse([x - radius, y - radius, x + radius, y + radius], fill=fill, outline=(0, 0, 0))
    return picture
