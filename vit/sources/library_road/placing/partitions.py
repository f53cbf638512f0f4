"""Windows a model's own code folds into the batch, interleaved with layers that join them again (issue 117, item 6):
LW-DETR's ViT backbone (``LwDetrViTBackbone.forward`` cuts the patch grid into ``num_windows`` windows before its
encoder; a global layer's ``reshape(batch // num_windows, num_windows * seq_len, ...)`` joins them) and RF-DETR's
DINOv2 (``RfDetrDinov2Embeddings.window_partition`` cuts the grid and gives each window its own copy of the CLS
token; a global layer's ``window_unpartition_before_attention`` joins them). No module declares the windows as a
layout would (Swin's ``window_size``): they are reshapes in a forward, so where each slot's token comes from is read
by running that forward, never re-typed from the modelling file.

``read_pieces`` runs the model's own forward up to its first attention block on two images at once, the patch
embedding's output (the convolution the trace found) replaced by token codes ``c`` in one and ``2 c`` in the other
(patch ``p``'s code is ``p + 1`` on every channel): what the code between adds (a position embedding, a CLS token)
cancels in the difference, and each slot of the block's input ``(pieces, slots, D)`` holds its patch's code, or 0 for a
token of the model's own (a window's CLS copy). A difference that is not one code a slot on every channel (a convolution
mixing the patches, a norm) or that does not hold every patch once is no partition: the model is left to the other
layouts. Each copy of a token of its own is a prefix token of the layout, in the order the pieces hold them (RF-DETR:
window ``k``'s CLS is prefix token ``k``), the patches after them row-major.

A call over ``pieces`` pieces of ``slots`` tokens is placed on those slots; a call over fewer, longer pieces on
whole consecutive pieces joined (what a reshape of ``(B * pieces, slots, D)`` into ``(B * pieces / k, k * slots,
D)`` makes: a global layer, ``k = pieces``); any other call is refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vit.core.attention_recorder import AttentionCall
from vit.model.stages import LayerLayout
from vit.sources.library_road.placing.layer_places import LayerPlace, StagedLayout
from vit.sources.library_road.placing.patch_codes import first_block, read_pieces


@dataclass(frozen=True)
class PieceLayout(LayerLayout):
    """One layer's pieces: ``slots[i][s]`` the token of the layout (``prefix`` tokens, then ``grid``'s patches
    row-major) that slot ``s`` of piece ``i`` holds; its keys are its queries (``window`` is 1: it attends in
    pieces)."""

    slots: tuple[tuple[int, ...], ...] = ()
    prefix: int = 0

    @property
    def num_tokens(self) -> int:
        return self.prefix + self.grid[0] * self.grid[1]

    @property
    def num_key_tokens(self) -> int:
        return self.num_tokens

    def window_tokens(self) -> torch.Tensor:
        return torch.tensor(self.slots, dtype=torch.long)  # (pieces, slots)

    def key_tokens(self) -> torch.Tensor:
        return self.window_tokens()

    def key_mask(self) -> None:
        return None

    def join(self, pieces: torch.Tensor) -> torch.Tensor:
        """``(B * pieces, slots, D)`` as the model keeps them -> ``(B, tokens, D)`` in the layout's order."""
        tokens = self.window_tokens()
        D = pieces.shape[-1]
        out = pieces.new_zeros(pieces.shape[0] // tokens.shape[0], self.num_tokens, D)
        out[:, tokens.flatten().to(pieces.device)] = pieces.reshape(out.shape[0], -1, D)
        return out


@dataclass(frozen=True)
class PartitionedLayout(StagedLayout):
    """A ``StagedLayout`` whose blocks keep their tokens in the pieces of ``pieces`` (the first block's input):
    ``join_tokens`` puts a block's output back in the layout's order."""

    pieces: PieceLayout | None = None

    def join_tokens(self, tokens: torch.Tensor, batch: int) -> torch.Tensor:
        """A block's output ``(batch * pieces, slots, D)`` -> ``(batch, tokens, D)``; other shapes as they are."""
        shape = self.pieces.window_tokens().shape
        if tokens.dim() == 3 and tuple(tokens.shape[:2]) == (batch * shape[0], shape[1]):
            return self.pieces.join(tokens)
        return tokens


def _tokens(codes: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Codes -> the layout's tokens: each 0 a prefix token in the order the pieces hold them, patch ``c`` after
    them (``prefix + c - 1``); and the prefix's length."""
    own = codes == 0
    prefix = int(own.sum())
    tokens = codes + prefix - 1
    tokens[own] = torch.arange(prefix)
    return tokens, prefix


def first_pieces(model: torch.nn.Module, calls: list[AttentionCall], image_hw: tuple[int, int], channels: int,
                 grid: tuple[int, int]) -> torch.Tensor | None:
    """The codes of the first block's input (``read_pieces``, the block of the first call), where they are a
    partition of the ``grid``'s patches; else None."""
    block = first_block(calls[0].name, dict(model.named_modules()))
    codes = None if block is None else read_pieces(model, block, image_hw, channels)
    return None if codes is None or int(codes.max()) != grid[0] * grid[1] else codes


def partition_places(model: torch.nn.Module, calls: list[AttentionCall], image_hw: tuple[int, int], channels: int,
                     grid: tuple[int, int], codes: torch.Tensor | None = None
                     ) -> tuple[PieceLayout, tuple[LayerPlace, ...]] | None:
    """The first block's pieces and each call's place on them, where its first block's input is a partition of the
    ``grid``'s patches (``codes``, ``first_pieces``' where not given); None where it is not. ValueError (one line) for
    a call that is neither the pieces nor whole pieces joined."""
    codes = first_pieces(model, calls, image_hw, channels, grid) if codes is None else codes
    if codes is None:
        return None
    tokens, prefix = _tokens(codes)
    pieces, slots = tokens.shape
    places = []
    for call in calls:
        joined = pieces // call.batch if call.batch and pieces % call.batch == 0 else 0
        if not joined or call.queries != call.keys or call.queries != joined * slots:
            raise ValueError(f"its layer {call.index} ({call.name}) attends over {call.batch} pieces of "
                             f"{call.queries} tokens, which are not the {pieces} windows of {slots} tokens its "
                             "first block's input is cut into, nor whole windows of it joined")
        layout = PieceLayout(tuple(grid), 1, slots=tuple(map(tuple, tokens.reshape(call.batch, -1).tolist())),
                             prefix=prefix)
        places.append(LayerPlace(tuple(grid), prefix, tuple(grid), prefix, layout))
    first = PieceLayout(tuple(grid), 1, slots=tuple(map(tuple, tokens.tolist())), prefix=prefix)
    return first, tuple(places)


def partitioned_layout(pieces: PieceLayout, places: tuple[LayerPlace, ...], image_hw: tuple[int, int]
                       ) -> PartitionedLayout:
    """The layout of ``places`` over ``pieces``' prefix and grid, each patch ``image // grid`` pixels."""
    gh, gw = pieces.grid
    return PartitionedLayout(pieces.prefix, (image_hw[0] // gh, image_hw[1] // gw), tuple(image_hw),
                             places=places, pieces=pieces)
