"""Attention maps of hierarchical models (Swin; ``vit.model.stages``): every layer on its own grid over the image.

Pure functions of a forward's ``attentions`` (per layer, a windowed one's ``(B * nw, H, w*w, w*w)``) and the model's
``layer_layouts(patch_grid)``. A layer's row is placed on that layer's grid, un-shifted and zero outside its window;
the rollout runs from a token of layer ``end``'s grid down to the image's patch grid, each merge between stages
passing the row to the tokens each merged token is built from (``vit.model.merge_matrix``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from vit.explain.attention import fuse_heads, window_rollout_step, window_rows, windows_on_grid
from vit.model.stages import LayerLayout, covering_token, merge_matrix


def _check(attentions: Sequence[Tensor], layouts: Sequence[LayerLayout], layer: int) -> int:
    if len(attentions) != len(layouts):
        raise ValueError(f"{len(attentions)} attentions for {len(layouts)} layers; give one per layer")
    if not -len(layouts) <= layer < len(layouts):
        raise ValueError(f"layer {layer} is out of range for {len(layouts)} layers")
    return layer % len(layouts)


def placed_layer(attn: Tensor, layout: LayerLayout) -> Tensor:
    """One layer's attention ``(B, H, T_l, T_l)`` on its own grid (a windowed one's windows placed, un-shifted)."""
    if not layout.window:
        return attn
    return windows_on_grid(attn, layout.grid, layout.window, layout.shift, layout.shift_padded)


def layer_row(attentions: Sequence[Tensor], layouts: Sequence[LayerLayout], layer: int, query: int) -> Tensor:
    """What token ``query`` of layer ``layer``'s grid (row-major) attends to there: ``(B, H, gh_l, gw_l)``."""
    layer = _check(attentions, layouts, layer)
    lay = layouts[layer]
    if not 0 <= query < lay.num_tokens:
        raise ValueError(f"query {query} is out of range for layer {layer}'s {lay.grid[0]}x{lay.grid[1]} grid")
    attn = attentions[layer]
    if lay.window:
        rows = window_rows(attn, lay.grid, lay.window, [query], lay.shift, lay.shift_padded)[:, :, 0]  # (B, H, T)
    else:
        rows = attn[:, :, query]
    return rows.reshape(*rows.shape[:2], *lay.grid)


def clicked_row(attentions: Sequence[Tensor], layouts: Sequence[LayerLayout], layer: int, patch: int) -> Tensor:
    """``layer_row`` for the token of layer ``layer``'s grid that covers ``patch`` of the image's patch grid (the
    first layer's): what the explorer draws for a clicked patch."""
    layer = _check(attentions, layouts, layer)
    return layer_row(attentions, layouts, layer, covering_token(patch, layouts[0].grid, layouts[layer].grid))


def rollout_row(attentions: Sequence[Tensor], layouts: Sequence[LayerLayout], end_layer: int, query: int | None,
                fusion: str = "mean") -> Tensor:
    """The attention rollout's row of token ``query`` of layer ``end_layer``'s grid, ``(B, gh_0, gw_0)`` on the
    first layer's (the image's) patch grid: ``onehot @ Â_end @ ... @ Â_0``, ``Â = (fused + I) / rowsum`` of each
    layer placed on its grid, and ``@ merge_matrix`` wherever a stage begins. ``query`` None starts from every
    token alike: what Swin's average pooling reads after the last layer."""
    end = _check(attentions, layouts, end_layer)
    lay = layouts[end]
    if query is not None and not 0 <= query < lay.num_tokens:
        raise ValueError(f"query {query} is out of range for layer {end}'s {lay.grid[0]}x{lay.grid[1]} grid")
    B = attentions[end].shape[0] // max(1, _windows(lay))
    row = torch.zeros(B, lay.num_tokens, dtype=torch.float64)
    if query is None:
        row[:] = 1.0 / lay.num_tokens
    else:
        row[:, query] = 1.0
    for i in range(end, -1, -1):
        lay = layouts[i]
        fused = fuse_heads(attentions[i].double(), fusion)  # (B or B * nw, n, n)
        if lay.window:
            row = window_rollout_step(row, fused, lay.grid, lay.window, lay.shift, lay.shift_padded)
        else:
            a = fused + torch.eye(fused.shape[-1], dtype=fused.dtype)
            row = (row[:, None] @ (a / a.sum(dim=-1, keepdim=True)))[:, 0]
        if i and layouts[i - 1].grid != lay.grid:  # this layer's stage opened with a merge
            row = row @ merge_matrix(layouts[i - 1].grid).double()
    return row.reshape(B, *layouts[0].grid).float()


def relevance_rollout_row(terms: Sequence[Tensor], layouts: Sequence[LayerLayout], end_layer: int,
                          query: int | None) -> Tensor:
    """Chefer et al.'s gradient rollout through the stages, ``(B, gh_0, gw_0)`` on the image's patch grid: each
    layer's term ``Ā = mean_heads((grad * attn).clamp(min=0))`` (``attention.positive_gradient_attention`` of its
    windows, ``(B * nw, n, n)``, or ``(B, T, T)`` for a global layer) placed on its grid, ``v = e_query`` (``query``
    None: every token of layer ``end_layer`` alike, what the average pooling reads), then ``v = v + v @ Ā_l`` from
    layer ``end_layer`` down, ``v @ merge_matrix`` wherever a stage begins."""
    end = _check(terms, layouts, end_layer)
    lay = layouts[end]
    if query is not None and not 0 <= query < lay.num_tokens:
        raise ValueError(f"query {query} is out of range for layer {end}'s {lay.grid[0]}x{lay.grid[1]} grid")
    B = terms[end].shape[0] // max(1, _windows(lay))
    v = torch.zeros(B, lay.num_tokens, dtype=torch.float64)
    if query is None:
        v[:] = 1.0 / lay.num_tokens
    else:
        v[:, query] = 1.0
    for i in range(end, -1, -1):
        lay, term = layouts[i], terms[i].double()
        if lay.window:
            token = lay.window_tokens()  # (nw, n): each window slot's token, padding T
            (nw, n), T = token.shape, lay.num_tokens
            blocks = term.view(B, nw, n, n) * (token < T)[None, :, None, :]  # padding keys dropped
            rows = torch.cat([v, v.new_zeros(B, 1)], dim=1)[:, token]  # (B, nw, n), padding 0
            out = v.new_zeros(B, T + 1)
            out[:, token.flatten()] = (rows[:, :, None, :] @ blocks)[:, :, 0].flatten(1)  # padding lands on T
            v = v + out[:, :T]
        else:
            v = v + (v[:, None] @ term)[:, 0]
        if i and layouts[i - 1].grid != lay.grid:  # this layer's stage opened with a merge
            v = v @ merge_matrix(layouts[i - 1].grid).double()
    return v.reshape(B, *layouts[0].grid).float()


def _windows(layout: LayerLayout) -> int:
    gh, gw = layout.grid
    return -(-gh // layout.window) * -(-gw // layout.window) if layout.window else 1


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
