"""Where each layer's tokens sit when a model's layers do not all run over one set of tokens: pooled stages (PiT,
LeViT, MViT v2), pooled keys (Twins, MViT v2), class-attention layers (CaiT, VOLO), two branches (CrossViT), windows
(Swin, Twins, MaxViT), dilated windows (MaxViT's grid attention, MobileViT's unfolding) and windows of a finer grid
(TNT's pixels). Read from one traced forward (``vit.core.attention_recorder.AttentionRecording``): each attention
call's queries, keys and pieces, and the spatial sizes of the feature maps the forward made, never guessed.

A layer's ``LayerPlace`` says what its queries and keys are: prefix tokens (a CLS token, each branch's own) and the
patches of a grid, row-major, that covers the whole image. A grid is one of the forward's own feature maps whose
tokens are the call's less its prefix, with the image's aspect; where several fit, or none, the layer is refused in
one line. Windows (a call over several pieces of one image) are placed by ``PIECES``, one table keyed by what an
ancestor of the attention module declares (Swin's ``shift_size``, MaxViT's ``partition_block``, Twins' ``ws``,
MobileViT's ``patch_width``, timm's MobileViT's ``patch_area``), or, where the pieces are a grid's own tokens, as
windows of the grid that many times finer (TNT's pixels within each patch); the placement is ``vit.model.stages``'
(``layer_on_grid``), zero outside a query's window.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vit.core.attention_recorder import AttentionCall
from vit.model.stages import LayerLayout
from vit.sources.library_road.placing import layer_kinds
from vit.sources.library_road.transformers_models import LibraryLayout

ASPECT_SLACK = 0.35  # how far a grid's rows / cols may be from the image's (PiT's overlapping 7x11 of 64x96 px)


class DilatedLayout(LayerLayout):
    """Dilated windows: ``window`` slots a side (MaxViT's ``grid_size``, MobileViT's patches a side), each window
    the tokens one ``grid / window`` step apart: window ``(i, j)``'s slot ``(a, b)`` holds token ``(a * gh // wh + i,
    b * gw // ww + j)`` (``timm.models.maxxvit.grid_partition``, MobileViT's ``unfolding``)."""

    def window_tokens(self) -> torch.Tensor:
        (gh, gw), (wh, ww) = self.grid, self.window_hw
        ph, pw = gh // wh, gw // ww  # windows a side: the step between a window's slots
        rows = torch.arange(wh)[None, :] * ph + torch.arange(ph)[:, None]  # (ph, wh): window i, slot a
        cols = torch.arange(ww)[None, :] * pw + torch.arange(pw)[:, None]  # (pw, ww)
        token = rows[:, None, :, None] * gw + cols[None, :, None, :]  # (ph, pw, wh, ww)
        return token.reshape(ph * pw, wh * ww)


@dataclass(frozen=True)
class LayerPlace:
    """One layer's queries and keys: ``query_prefix`` prefix tokens then the patches of ``query_grid`` (None: its
    queries are its prefix tokens alone, a class-attention layer's), its keys ``key_prefix`` tokens then the patches of
    ``key_grid``; ``windows`` the pieces it attends in, placed on the grid (then no prefix tokens)."""

    query_grid: tuple[int, int] | None
    query_prefix: int
    key_grid: tuple[int, int]
    key_prefix: int
    windows: LayerLayout | None = None

    @property
    def queries(self) -> int:
        return self.query_prefix + (self.query_grid[0] * self.query_grid[1] if self.query_grid else 0)

    @property
    def keys(self) -> int:
        return self.key_prefix + self.key_grid[0] * self.key_grid[1]

    def describe(self) -> str:
        grid = "x".join(map(str, self.query_grid)) if self.query_grid else "no"
        keys = "x".join(map(str, self.key_grid))
        return f"{self.query_prefix} prefix + {grid} patches over {self.key_prefix} prefix + {keys}"

    def row(self, query: int, prefix: int, grid: tuple[int, int], layer: int) -> int:
        """The row of this layer that token ``query`` of the layout (``prefix`` tokens, then ``grid``'s patches)
        is: a prefix token's own, or the patch of this layer's grid that covers the same part of the image.
        ValueError (one line) where this layer has no such token."""
        if query < prefix:
            if query >= self.query_prefix:
                raise ValueError(f"layer {layer + 1} has no token {query} among its queries (its queries are "
                                 f"{self.describe()}): ask a patch")
            return query
        if self.query_grid is None:
            raise ValueError(f"layer {layer + 1} is a class-attention layer (its queries are its {self.query_prefix} "
                             f"prefix token(s) alone): ask token 0")
        r, c = divmod(query - prefix, grid[1])
        qh, qw = self.query_grid
        return self.query_prefix + (r * qh // grid[0]) * qw + c * qw // grid[1]


@dataclass(frozen=True)
class StagedLayout(LibraryLayout):
    """A ``LibraryLayout`` whose layers each have their own ``LayerPlace``: ``num_prefix_tokens`` and the grid of
    ``patch_hw`` are the tokens a query is asked by (the finest grid's), each layer's row the token covering it."""

    places: tuple[LayerPlace, ...] = ()

    def keys_of(self, layer: int) -> int:
        return self.places[layer].keys

    def layer_layout(self, layer: int, grid: tuple[int, int]) -> LayerLayout | None:
        return self.places[layer].windows


def staged_layout(places: tuple[LayerPlace, ...], image_hw: tuple[int, int]) -> StagedLayout:
    """The layout of ``places``: the prefix the most of its layers' queries have, the finest grid a query is asked
    on (each patch ``image // grid`` pixels)."""
    prefix = max(p.query_prefix for p in places)
    grids = [g for p in places for g in (p.query_grid, p.key_grid) if g is not None]
    grid = max(grids, key=lambda g: g[0] * g[1])
    # a patch that divides the input (PiT's overlapping 7x11 of 64x96 px: 8x8 px, a query asked on 8x12)
    patch = tuple(max([d for d in range(1, side // n + 1) if side % d == 0] or [1])
                  for side, n in zip(image_hw, grid, strict=True))
    return StagedLayout(prefix, patch, tuple(image_hw), places=tuple(places))


def _ancestors(name: str, modules: dict[str, torch.nn.Module]):
    parts = name.split(".")
    for i in range(len(parts), -1, -1):
        module = modules.get(".".join(parts[:i]))
        if module is not None:
            yield module


def _declared(name: str, modules: dict[str, torch.nn.Module], attribute: str):
    """The nearest ancestor of module ``name`` (itself included) that declares ``attribute``, and its value."""
    for module in _ancestors(name, modules):
        if attribute in vars(module) or hasattr(type(module), attribute) and not callable(
                getattr(type(module), attribute)):
            return module, getattr(module, attribute)
    return None, None


def _pair(value) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    return int(value[0]), int(value[1])


def _swin(module, grid):  # HF Swin's blocks: pad the grid to whole windows, then roll by the shift
    return LayerLayout(grid, _pair(module.window_size), _pair(module.shift_size), shift_padded=True)


def _maxvit(module, grid):  # timm's MaxViT: windows of partition_size, or its dilated grid of that many slots
    size = _pair(module.partition_size)
    return LayerLayout(grid, size) if module.partition_block else DilatedLayout(grid, size)


def _twins(module, grid):  # timm's Twins: locally-grouped windows of ws, the grid padded to whole windows
    return LayerLayout(grid, _pair(module.ws))


def _mobilevit(module, grid):  # MobileViT's unfolding: piece (i, j) of each patch, over the patches' grid
    return DilatedLayout(grid, (grid[0] // module.patch_height, grid[1] // module.patch_width))


def _timm_mobilevit(module, grid):  # timm's MobileViT block: the same unfolding, its patch_size (rows, cols)
    rows, cols = _pair(module.patch_size)
    return DilatedLayout(grid, (grid[0] // rows, grid[1] // cols))


# What an ancestor of the attention module declares -> the windows it attends in, on a grid of the forward's
PIECES = (("shift_size", _swin), ("partition_block", _maxvit), ("ws", _twins), ("patch_width", _mobilevit),
          ("patch_area", _timm_mobilevit), *layer_kinds.PIECES)


# Attention no layout places, by the class of a module at or above the call, in words: what the layer attends over
NO_LAYOUT = (
    ("GroupViTTokenAssign", "group tokens that take the patches' place between stages (GroupViT's grouping: its "
                            "later layers attend over groups, which sit nowhere on the image's grid)"),
    ("MobileViTV2LinearSelfAttention", "separable linear attention (MobileViT V2's: a softmax over the tokens of one "
                                       "learnt query a patch position, not rows of queries over keys)"),
    *layer_kinds.NO_LAYOUT,
)


def no_layout(calls: list[AttentionCall], modules: dict[str, torch.nn.Module]) -> str | None:
    """What a call attends over that no layout places (``NO_LAYOUT``), naming the call, or None."""
    classes = dict(NO_LAYOUT)
    for call in calls:
        parts = call.name.split(".")
        for i in range(len(parts), 0, -1):
            words = classes.get(type(modules.get(".".join(parts[:i]))).__name__)
            if words is not None:
                return f"{words} (layer {call.index}, {call.name})"
    return None


def _aspect_error(grid: tuple[int, int], image_hw: tuple[int, int]) -> float:
    return abs(grid[0] * image_hw[1] / (grid[1] * image_hw[0]) - 1)


def _grid_of(tokens: int, maps: list[tuple[int, int]], image_hw: tuple[int, int]) -> tuple[int, int] | None:
    """The feature map of the forward's (rows, cols) with ``tokens`` cells and the image's aspect, the nearest where
    a map and its transpose both were seen; None where none has."""
    fits = sorted({m for m in maps if m[0] * m[1] == tokens and _aspect_error(m, image_hw) <= ASPECT_SLACK},
                  key=lambda m: _aspect_error(m, image_hw))
    if tokens == 1:
        return 1, 1
    return fits[0] if fits else None


def _windows(call: AttentionCall, modules, maps, image_hw, patches_of_others: bool) -> LayerLayout:
    for attribute, layout_of in PIECES:
        module, _ = _declared(call.name, modules, attribute)
        if module is None:
            continue
        for grid in sorted(set(maps), key=lambda m: _aspect_error(m, image_hw)):
            if _aspect_error(grid, image_hw) > ASPECT_SLACK:
                continue
            try:
                layout = layout_of(module, grid)
                if tuple(layout.window_tokens().shape) == (call.batch, call.queries) == (call.batch, call.keys):
                    return layout
            except (ValueError, RuntimeError, ZeroDivisionError, AttributeError, TypeError):
                continue
    side = int(round(call.queries ** 0.5))
    coarse = _grid_of(call.batch, maps, image_hw)
    if patches_of_others and side * side == call.queries == call.keys and coarse is not None:  # each piece a
        # patch another layer attends over, its tokens the patch's own s x s pixels
        return LayerLayout((coarse[0] * side, coarse[1] * side), side)
    raise ValueError(f"its layer {call.index} ({call.name}) attends over {call.batch} pieces of one image at once "
                     f"(crops or tiles), {call.queries} tokens each, in an arrangement none of its modules declares "
                     "(windows, a dilated grid): no layout on this road")


def _side(tokens: int, prefixes: tuple[int, ...], maps, image_hw) -> tuple[int, tuple[int, int]] | None:
    """The prefix and grid ``tokens`` tokens are: the first of ``prefixes`` that leaves a grid of the forward's."""
    for prefix in prefixes:
        grid = _grid_of(tokens - prefix, maps, image_hw) if tokens > prefix else None
        if grid is not None:
            return prefix, grid
    return None


def infer_places(calls: list[AttentionCall], maps: list[tuple[int, int]], image_hw: tuple[int, int],
                 modules: dict[str, torch.nn.Module], prefixes: tuple[int, ...]) -> tuple[LayerPlace, ...]:
    """Each call's ``LayerPlace``: its pieces placed by ``PIECES``, else its keys and queries each a prefix (one of
    ``prefixes``, the module's token parameters' counts) and a grid of the forward's ``maps`` (feature maps' (rows,
    cols)); a class-attention layer's queries its prefix alone. ValueError (one line) for a call that cannot be
    placed."""
    places = []
    for call in calls:
        declares = any(_declared(call.name, modules, attribute)[0] is not None for attribute, _ in PIECES)
        if call.batch != 1 or declares:  # windows (one window, where a stage's grid is no larger than it)
            try:
                window = _windows(call, modules, maps, image_hw, pieces_of_patches(calls, call))
            except ValueError:
                if call.batch != 1:
                    raise
            else:
                places.append(LayerPlace(window.grid, 0, window.key_grid, 0, window))
                continue
        keys = _side(call.keys, prefixes, maps, image_hw)
        if keys is None:
            raise ValueError(f"its layer {call.index} ({call.name}) attends over {call.keys} keys, which no feature "
                             "map of its forward with the image's aspect (and its prefix tokens) accounts for")
        if call.queries == call.keys:
            places.append(LayerPlace(keys[1], keys[0], keys[1], keys[0]))
            continue
        if call.queries <= keys[0]:  # its prefix tokens alone ask: a class-attention layer
            places.append(LayerPlace(None, call.queries, keys[1], keys[0]))
            continue
        queries = _side(call.queries, (keys[0], *prefixes), maps, image_hw)
        if queries is None:
            raise ValueError(f"its layer {call.index} ({call.name}) has {call.queries} queries, which no feature "
                             "map of its forward with the image's aspect (and its prefix tokens) accounts for")
        places.append(LayerPlace(queries[1], queries[0], keys[1], keys[0]))
    return tuple(places)


def pieces_of_patches(calls: list[AttentionCall], call: AttentionCall) -> bool:
    """Whether ``call``'s pieces are the patches another layer attends over, each with its own pixels as tokens
    (TNT's inner attention beside its outer): a piece count some single-image layer has as tokens, less a prefix."""
    return any(c.batch == 1 and 0 <= c.keys - call.batch <= 2 for c in calls)
