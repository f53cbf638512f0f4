"""Where the tokens of a tower fed its processor's flattened patches sit on the image (issue 117, item 6): Qwen
2.5-VL's and Qwen3-VL's vision towers take each image as ``Qwen2VLImageProcessor.patchify`` flattens it, its patches
in ``merge x merge`` merge order (each merge unit's patches together, the units row-major), and Qwen 2.5-VL's
reorders those units again into its attention windows (transformers' ``get_vision_window_index``). The order is read
from the library's own pieces, never written again here: the processor's ``patchify`` of an image whose every pixel
holds its patch's index on the grid, then the model's window index.

- ``tower_order``: ``(N,)`` long, the grid index (row-major on the ``gh x gw`` patch grid) of each position of the
  tower's sequence for one image.
- ``to_grid``: a tower's ``(B * N, ...)`` tokens in its own order made ``(B, N, ...)`` row-major on the grid.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def processor_order(patchify: Callable, grid: tuple[int, int], patch: int, merge: int, temporal: int) -> torch.Tensor:
    """``(gh * gw,)`` long: the grid index of each flattened patch ``patchify`` (the processor's own method, called as
    ``patchify(images, patch_size=, merge_size=, temporal_patch_size=)``) writes for one image of ``grid`` patches:
    an image whose pixels hold their patch's index, flattened by it, each patch's first value read back."""
    gh, gw = grid
    index = torch.arange(gh * gw, dtype=torch.float64).reshape(gh, gw)  # exact as floats up to 2**53
    pixels = index.repeat_interleave(patch, 0).repeat_interleave(patch, 1)[None, None]  # (1, 1, H, W)
    flat, fh, fw = patchify(pixels, patch_size=patch, merge_size=merge, temporal_patch_size=temporal)
    if (fh, fw) != (gh, gw) or flat.shape[:2] != (1, gh * gw):
        raise ValueError(f"its processor flattens a {gh}x{gw}-patch image into {tuple(flat.shape)} patches")
    return flat[0, :, 0].round().long()


def window_units(grid: tuple[int, int], merge: int, window_px: int, patch: int) -> torch.Tensor:
    """``(units,)`` long: the merge unit (its index in the processor's order) at each unit slot of Qwen 2.5-VL's
    windowed sequence for one image of ``grid`` patches, as transformers' ``get_vision_window_index`` orders them."""
    from transformers.vision_utils import get_vision_window_index

    index, _ = get_vision_window_index(torch.tensor([[1, *grid]]), spatial_merge_size=merge, window_size=window_px,
                                       patch_size=patch)
    return index.long()


def tower_order(patchify: Callable, grid: tuple[int, int], patch: int, merge: int, temporal: int,
                window_px: int | None = None) -> torch.Tensor:
    """``(N,)`` long: the grid index of each position of the tower's sequence for one image of ``grid`` patches:
    the processor's merge order (``processor_order``), its units reordered into windows where the tower attends in
    them (``window_px``: Qwen 2.5-VL's ``window_size``; None: Qwen3-VL's, in merge order)."""
    order = processor_order(patchify, grid, patch, merge, temporal)
    if window_px is None:
        return order
    unit = merge * merge
    units = window_units(grid, merge, window_px, patch)  # (N / unit,)
    return order[(units[:, None] * unit + torch.arange(unit)[None, :]).flatten()]


def to_grid(tokens: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``(B * N, ...)`` tokens in the tower's order (``order``: ``tower_order``'s ``(N,)``) -> ``(B, N, ...)``, each
    image's tokens row-major on its grid."""
    n = len(order)
    if tokens.shape[0] % n:
        raise ValueError(f"{tokens.shape[0]} tokens are no whole number of images of {n} patches")
    by_image = tokens.reshape(tokens.shape[0] // n, n, *tokens.shape[1:])  # (B, N, ...)
    out = torch.empty_like(by_image)
    out[:, order.to(tokens.device)] = by_image
    return out

