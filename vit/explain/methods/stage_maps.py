"""Attention maps of hierarchical models (Swin, Hiera, SAM 2's Hiera; ``vit.model.stages``): every layer on its own
grid over the image.

Pure functions of a forward's ``attentions`` (per layer, a windowed one's ``(B * nw, H, nq, nk)``) and the model's
``layer_layouts(patch_grid)``. A layer's row is placed on its keys' grid (the layer's own; the previous stage's in a
pooled-query layer, Hiera / SAM 2), un-shifted and zero outside its window; the rollout runs from a token of layer
``end``'s grid down to the image's patch grid, each layer's step from its queries' grid to its keys'
(``vit.explain.methods.attention.layer_step``: the residual is the pooling where the layer pools), each merge between
stages passing the row to the tokens each merged token is built from (``vit.model.merge_matrix``). LeGrad's per-layer
map (``legrad_layer``) and its sum over layers on the image's patch grid (``legrad_on_patches``) are formed here from
the gradients ``vit.explain.methods.relevance.legrad`` takes. """

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from vit.explain.methods.attention import fuse_heads, layer_columns, layer_rows, layer_step, patch_centres
from vit.model.stages import LayerLayout, covering_token, shift_mask, through_merge


def _check(attentions: Sequence[Tensor], layouts: Sequence[LayerLayout], layer: int) -> int:
    if len(attentions) != len(layouts):
        raise ValueError(f"{len(attentions)} attentions for {len(layouts)} layers; give one per layer")
    if not -len(layouts) <= layer < len(layouts):
        raise ValueError(f"layer {layer} is out of range for {len(layouts)} layers")
    return layer % len(layouts)


def layer_row(attentions: Sequence[Tensor], layouts: Sequence[LayerLayout], layer: int, query: int) -> Tensor:
    """What token ``query`` of layer ``layer``'s grid (row-major) attends to, ``(B, H, kh, kw)`` on the layer's keys'
    grid: its own, or in a pooled-query layer (Hiera, SAM 2) the previous stage's, which it reads."""
    layer = _check(attentions, layouts, layer)
    lay = layouts[layer]
    if not 0 <= query < lay.num_tokens:
        raise ValueError(f"query {query} is out of range for layer {layer}'s {lay.grid[0]}x{lay.grid[1]} grid")
    rows = layer_rows(attentions[layer], lay, [query])[:, :, 0]  # (B, H, Tk)
    return rows.reshape(*rows.shape[:2], *lay.key_grid)


def clicked_row(attentions: Sequence[Tensor], layouts: Sequence[LayerLayout], layer: int, patch: int) -> Tensor:
    """``layer_row`` for the token of layer ``layer``'s grid that covers ``patch`` of the image's patch grid (the
    first layer's): what the explorer draws for a clicked patch."""
    layer = _check(attentions, layouts, layer)
    return layer_row(attentions, layouts, layer, covering_token(patch, layouts[0].grid, layouts[layer].grid))


def _roll(blocks: Sequence[Tensor], layouts: Sequence[LayerLayout], end: int, query: int | None,
          normalise: bool) -> Tensor:
    """``e_query`` (None: every token alike) of layer ``end``'s grid through ``layer_step`` of each layer's
    ``blocks`` down to layer 0, ``@ merge_matrix`` wherever a stage opened with a merge (``through_merge``):
    ``(B, gh_0, gw_0)``."""
    lay = layouts[end]
    if query is not None and not 0 <= query < lay.num_tokens:
        raise ValueError(f"query {query} is out of range for layer {end}'s {lay.grid[0]}x{lay.grid[1]} grid")
    B = blocks[end].shape[0] // lay.window_tokens().shape[0]
    v = torch.zeros(B, lay.num_tokens, dtype=torch.float64)
    if query is None:
        v[:] = 1.0 / lay.num_tokens
    else:
        v[:, query] = 1.0
    for i in range(end, -1, -1):
        lay = layouts[i]
        v = layer_step(v, blocks[i].double(), lay, normalise)  # onto the layer's keys' grid
        if i and layouts[i - 1].grid != lay.key_grid:  # this layer's stage opened with a merge (Swin)
            v = through_merge(v, layouts[i - 1].grid)  # v @ merge_matrix, never the T_out x T_in matrix
    return v.reshape(B, *layouts[0].grid).float()


def rollout_row(attentions: Sequence[Tensor], layouts: Sequence[LayerLayout], end_layer: int, query: int | None,
                fusion: str = "mean") -> Tensor:
    """The attention rollout's row of token ``query`` of layer ``end_layer``'s grid, ``(B, gh_0, gw_0)`` on the
    first layer's (the image's) patch grid: ``onehot @ Â_end @ ... @ Â_0``, ``Â = (fused + R) / rowsum`` of each
    layer placed on its grids (``R`` the identity, or a pooled-query layer's pooling: each pooled token built from
    its 2x2 keys, 1/4 each), and ``@ merge_matrix`` wherever a stage opens with a merge. ``query`` None starts from
    every token alike: what the average pooling (Swin, Hiera) reads after the last layer."""
    end = _check(attentions, layouts, end_layer)
    return _roll([fuse_heads(a, fusion) for a in attentions[:end + 1]], layouts, end, query, True)


def relevance_rollout_row(terms: Sequence[Tensor], layouts: Sequence[LayerLayout], end_layer: int,
                          query: int | None) -> Tensor:
    """Chefer et al.'s gradient rollout through the stages, ``(B, gh_0, gw_0)`` on the image's patch grid: each
    layer's term ``Ā = mean_heads((grad * attn).clamp(min=0))`` (``attention.positive_gradient_attention`` of its
    windows, ``(B * nw, nq, nk)``, or ``(B, Tq, Tk)`` for a global layer) placed on its grids, ``v = e_query``
    (``query`` None: every token of layer ``end_layer`` alike, what the average pooling reads), then
    ``v = v @ (R + Ā_l)`` from layer ``end_layer`` down (``R`` the identity, or the pooling of a pooled-query
    layer), ``v @ merge_matrix`` wherever a stage opens with a merge."""
    end = _check(terms, layouts, end_layer)
    return _roll(terms, layouts, end, query, False)


def cell_patch(token: int, grid: tuple[int, int], layer_grid: tuple[int, int]) -> int:
    """The first patch (top left) of the image's ``grid`` that token ``token`` of ``layer_grid`` covers:
    ``covering_token``'s inverse, so a query given on a layer's own grid is a patch clicked on the image."""
    gh, gw = grid
    lh, lw = layer_grid
    if not 0 <= token < lh * lw:
        raise ValueError(f"token {token} is out of range for a {lh}x{lw} grid")
    fy, fx = -(-gh // lh), -(-gw // lw)  # patches per cell: 2**stage
    return (token // lw) * fy * gw + (token % lw) * fx


def on_patch_grid(map2d: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """A map ``(..., lh, lw)`` on a layer's grid -> ``(..., gh, gw)`` on the image's patch grid: each cell repeated
    over the ``2**stage`` patches it covers, the padding's part cropped (how it sits over the image's pixels)."""
    gh, gw = grid
    lh, lw = map2d.shape[-2:]
    if (lh, lw) == (gh, gw):
        return map2d
    fy, fx = -(-gh // lh), -(-gw // lw)
    return np.repeat(np.repeat(map2d, fy, axis=-2), fx, axis=-1)[..., :gh, :gw]


def legrad_layer(grad: Tensor, layout: LayerLayout) -> Tensor:
    """LeGrad's map of one layer (WalBouss/LeGrad ``compute_legrad_clip``'s ``grad.clamp(min=0).mean(dim=1)
    .mean(dim=1)``) from ``grad``, the gradient of the score read at this layer with respect to its attention as the
    layer forms it (``(B * nw, H, nq, nk)``; a global layer's ``(B, H, Tq, Tk)``): ``(B, kh, kw)`` on the layer's
    keys' grid (``layout.key_grid``). Positive parts, mean over heads and over the layer's ``Tq`` queries, each key
    summing the queries of its window (``layer_columns``: the ``Tq x Tk`` matrix zero outside the windows, padding
    dropped). The pairs Swin's shift mask separates (tokens the cyclic shift brought together from opposite edges,
    probability ``e^-100``) are not attention the layer can give, so their gradient is dropped with the rest of
    what lies outside a window."""
    positive = grad.clamp(min=0)
    if layout.shift:
        allowed = shift_mask(layout.grid, layout.window, layout.shift).to(grad.device) == 0  # (nw, n, n)
        positive = (positive.view(-1, allowed.shape[0], *positive.shape[1:]) * allowed[None, :, None]
                    ).view(positive.shape)
    columns = layer_columns(positive, layout)  # (B, H, Tk)
    relevance = columns.mean(dim=1) / layout.num_tokens  # heads, then every query row (the authors' two means)
    return relevance.view(-1, *layout.key_grid)


def legrad_on_patches(maps: Sequence[Tensor], grid: tuple[int, int]) -> Tensor:
    """LeGrad's sum over layers on the image's patch grid ``grid``: each layer's map ``(B, kh, kw)`` upsampled
    bilinearly by its cell's side in patches (``2**stage``; the authors upsample each layer's map by the patch
    size, ``F.interpolate(scale_factor=..., mode="bilinear")``, before summing), the padding's part cropped, then
    summed: ``(B, gh, gw)``, not normalised (the overlay min-max normalises, as the authors do)."""
    if not maps:
        raise ValueError("no layers given to LeGrad")
    gh, gw = grid
    total = None
    for m in maps:
        kh, kw = m.shape[-2:]
        fy, fx = -(-gh // kh), -(-gw // kw)  # patches per cell, as ``on_patch_grid``
        if (fy, fx) != (1, 1):
            m = F.interpolate(m[:, None], scale_factor=(fy, fx), mode="bilinear", align_corners=False)[:, 0]
        m = m[:, :gh, :gw]
        total = m if total is None else total + m
    return total


def cell_centres(grid: tuple[int, int], image_grid: tuple[int, int], patch_size: int | tuple[int, int]) -> Tensor:
    """Pixel coordinates (row, column) of the cells of a layer's ``grid`` over an image of ``image_grid`` patches:
    ``(gh*gw, 2)``, each cell ``2**stage`` patches a side (``covering_token``'s cells), float64."""
    ph, pw = (patch_size, patch_size) if isinstance(patch_size, int) else patch_size
    fy, fx = -(-image_grid[0] // grid[0]), -(-image_grid[1] // grid[1])
    return patch_centres(grid, (ph * fy, pw * fx))


def layer_stats(attentions: Sequence[Tensor], layouts: Sequence[LayerLayout], patch_size: int | tuple[int, int]
                ) -> tuple[list[Tensor], list[Tensor]]:
    """The ViT paper's mean attention distance (px) and entropy (nats) of every head of every layer of a model with
    stages, each layer on its own grids: ``(distances, entropies)``, per layer ``(B, H_l)`` (a stage's own heads).

    Each query's row over its window's keys (``LayerLayout.window_tokens`` / ``key_tokens``; a pooled-query layer's
    keys on the previous stage's grid), renormalised over the real keys (a padding key has no place on the image:
    as the plain ViT's distance drops prefix keys); distance between cell centres in input pixels
    (``cell_centres``), both averaged over the real queries. Computed window by window: never ``T_l x T_l``."""
    image_grid = layouts[0].grid
    distances, entropies = [], []
    for attn, lay in zip(attentions, layouts, strict=True):
        queries, keys = lay.window_tokens(), lay.key_tokens()  # (nw, nq), (nw, nk): padding -> Tq, Tk
        nw, nq, nk = queries.shape[0], queries.shape[1], keys.shape[1]
        Tq, Tk = lay.num_tokens, lay.key_grid[0] * lay.key_grid[1]
        B, H = attn.shape[0] // nw, attn.shape[1]
        p = attn.double().reshape(B, nw, H, nq, nk) * (keys < Tk)[None, :, None, None, :]
        p = p / p.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
        q_xy = cell_centres(lay.grid, image_grid, patch_size)[queries.clamp(max=Tq - 1)]  # (nw, nq, 2)
        k_xy = cell_centres(lay.key_grid, image_grid, patch_size)[keys.clamp(max=Tk - 1)]  # (nw, nk, 2)
        distance = torch.cdist(q_xy, k_xy)  # (nw, nq, nk)
        real = (queries < Tq).double()[None, :, None, :]  # (1, nw, 1, nq)
        per_row = [(p * distance[None, :, None]).sum(dim=-1), -torch.special.xlogy(p, p).sum(dim=-1)]
        distance, entropy = ((row * real).sum(dim=(1, 3)) / real.sum() for row in per_row)  # (B, H) each
        distances.append(distance.float())
        entropies.append(entropy.float())
    return distances, entropies
