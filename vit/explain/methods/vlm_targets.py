"""A target for the gradient maps of a vision-language model's tower, which has no classifier: a word's visual logit
lens score (``vit.explain.methods.visual_lens``) at one projected image token (the merge unit under a patch) or summed
over all of them. The tower becomes a classifier over the words whose logits are those scores, so LeGrad, gradient
rollout and AttnLRP run unchanged on it, as ``prompts.prompt_model`` makes a CLIP one over typed labels."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace

from torch import Tensor, nn

from vit.model import ViT


class LensHead(nn.Module):
    """The last block's tokens (B, T, D) -> one logit per word (B, W): each word's dot product with the projected
    tokens ``units`` (indices into the projector's row-major units; None: every one), summed."""

    def __init__(self, project: Callable[[Tensor, tuple[int, int]], Tensor], vectors: Tensor, grid: tuple[int, int],
                 units: Tensor | None = None) -> None:
        super().__init__()
        self.project = project  # the tower's own ViT.project (a bound method, not a child: no second copy)
        self.register_buffer("vectors", vectors.float())  # (W, E)
        self.register_buffer("units", units)
        self.grid = tuple(grid)

    def forward(self, tokens: Tensor) -> Tensor:
        projected = self.project(tokens, self.grid)  # (B, N, E)
        scores = projected @ self.vectors.to(projected.dtype).T  # (B, N, W)
        return (scores if self.units is None else scores[:, self.units]).sum(dim=1)  # (B, W)

def _every_token(x: Tensor, key_mask: Tensor | None = None) -> tuple[Tensor, None]:
    return x, None  # the lens head reads every token (the projector's input), not a pooled vector

def lens_model(model: ViT, vectors: Tensor, grid: tuple[int, int], units: Tensor | None = None) -> ViT:
    """``model`` (a VLM's tower, with its projector) as a classifier over words whose logits are ``LensHead``'s, for
    inputs on patch grid ``grid``. Shares every weight with ``model`` (not copied)."""
    if model.projector is None:
        raise ValueError("a word's lens score needs a vision-language model's projector, and this model has none")
    wrapped = copy.copy(model)
    wrapped._modules = dict(model._modules)  # a copy of the module table, so the original keeps its own head
    wrapped.config = replace(model.config, num_classes=vectors.shape[0])
    device = next(model.parameters()).device
    wrapped.head = LensHead(model.project, vectors.to(device), grid, None if units is None else units.to(device))
    wrapped.pool = _every_token
    return wrapped

def unit_of_patch(patch: int, grid: tuple[int, int], unit: int) -> int:
    """The projected token (row-major over ``unit`` x ``unit`` merge units) that covers patch ``patch`` (row-major
    on ``grid``)."""
    gh, gw = grid
    if not 0 <= patch < gh * gw:
        raise ValueError(f"patch {patch} is out of range: this input has {gh}x{gw} patches, numbered 0 to "
                         f"{gh * gw - 1} row-major")
    return (patch // gw // unit) * (gw // unit) + patch % gw // unit

