"""Which of a model's attention calls run among its image tokens, where some attend among learnt queries instead.

DETR and its kin (Conditional DETR, DAB-DETR, Table Transformer) run a transformer encoder over a CNN's feature map,
flattened row-major into tokens (``H / stride x W / stride``), then a decoder whose queries are learnt object queries
(``query_position_embeddings``: a parameter's rows, nowhere on the image): its self-attention is among the queries,
its cross-attention from the queries over the encoder's tokens. Perceiver's learnt latents cross-attend the pixels
and then attend among themselves. Only a call whose queries and keys are the image's tokens is a layer the maps read
(a query token's row over the image); the others are named, never placed, and a model with none is refused in one
line saying what its attention is over instead.

The split is read from the traced forward (``vit.core.attention_recorder.AttentionRecording``), never guessed: the
image's tokens are the patch embedding's grid, or the feature map flattened into tokens before the first attention
call, plus the prefix its token parameters count; a call over another number of queries is set aside only where
those queries are the rows of a learnt parameter of the model (``(queries, D)``: object queries, latents), so a pooled
stage of image tokens is never set aside as "not image tokens".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vit.core.attention_recorder import AttentionCall

NO_IMAGE_ATTENTION = "it has no attention over image tokens"  # the census's words for such a refusal


@dataclass(frozen=True)
class ImageTokenCalls:
    """The calls among ``tokens`` image tokens (``grid`` patches after the prefix), in the forward's order, and the
    others: attention among or from the learnt queries ``query_parameter`` names."""

    tokens: int
    grid: tuple[int, int]
    kept: tuple[AttentionCall, ...]
    others: tuple[AttentionCall, ...]
    query_parameter: str

    def describe_others(self) -> str:
        """The calls set aside, in words (the first few by name)."""
        shown = ", ".join(f"{c.name} ({c.queries} queries over {c.keys} keys)" for c in self.others[:3])
        more = f" and {len(self.others) - 3} more" if len(self.others) > 3 else ""
        return (f"{len(self.others)} attention call(s) of learnt queries ({self.query_parameter}), not over image "
                f"tokens: {shown}{more}")


# Modules whose 2-D weights are maps between widths, never rows of tokens (a linear layer's (out, in) weight)
MAPS = (torch.nn.Linear, torch.nn.MultiheadAttention, torch.nn.modules.conv._ConvNd,
        torch.nn.modules.batchnorm._NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm)


def learnt_queries(model: torch.nn.Module, rows: int) -> str | None:
    """The name of a parameter of ``model`` whose rows are ``rows`` learnt queries, or None: a ``(rows, D)``
    embedding's weight (DETR's ``query_position_embeddings``) or a module's own parameter (Perceiver's ``latents``),
    never a linear layer's or a convolution's weight."""
    if rows < 1:
        return None
    for owner_name, owner in model.named_modules():
        if isinstance(owner, MAPS):
            continue
        for name, p in owner.named_parameters(recurse=False):
            if p.dim() == 2 and p.shape[0] == rows:
                return f"{owner_name}.{name}" if owner_name else name
    return None


def image_grids(mode, image_hw: tuple[int, int]) -> list[tuple[int, int]]:
    """The grids the traced forward says its image tokens may be on: the patch embedding's, then the feature map it
    flattened into tokens before its first attention call."""
    grids = []
    if mode.patch is not None:
        grids.append((image_hw[0] // mode.patch[0], image_hw[1] // mode.patch[1]))
    if mode.flat_grid is not None and mode.flat_grid not in grids:
        grids.append(tuple(mode.flat_grid))
    return grids


def split_calls(model: torch.nn.Module, calls: list[AttentionCall], mode, image_hw: tuple[int, int],
                prefix: int) -> ImageTokenCalls | None:
    """The calls among the image's tokens (``prefix`` tokens then a grid of ``image_grids``) and the others, where
    every other call's queries are a learnt parameter's rows; None where no such split accounts for every call.
    ValueError (one line) where the image's tokens are only ever keys: cross-attention from learnt queries, with no
    layer among the image's tokens."""
    for grid in image_grids(mode, image_hw):
        tokens = prefix + grid[0] * grid[1]
        kept = [c for c in calls if c.queries == c.keys == tokens and c.batch == 1]
        others = [c for c in calls if c not in kept]
        if not others or any(c.queries == tokens or c.batch != 1 for c in others):
            continue
        names = {c.queries: learnt_queries(model, c.queries) for c in others}
        if not all(names.values()):
            continue
        named = names[others[0].queries]
        if not kept:
            over = next((c for c in others if c.keys == tokens), None)
            if over is not None:
                raise ValueError(f"its attention over the image is cross-attention from {over.queries} learnt queries "
                                 f"({named}) that sit nowhere on it (layer {over.index}, {over.name}), and no layer "
                                 "attends among the image's tokens, whose rows every map here reads")
            first = others[0]
            raise ValueError(f"{NO_IMAGE_ATTENTION}: every attention call it makes is among {first.queries} learnt "
                             f"queries ({named}; layer {first.index}, {first.name}), none over the image's "
                             f"{grid[0]}x{grid[1]} tokens (a deformable attention's weights over sampled points are "
                             "no rows of queries over tokens)")
        return ImageTokenCalls(tokens, grid, tuple(kept), tuple(others), named)
    return None
