"""Stages: hierarchical models (Swin, Swin V2, Hiera, SAM 2's Hiera) as one list of blocks whose grid shrinks.

**What a stage is.** A run of consecutive blocks with one patch grid, one width and one number of heads
(``ViTConfig.stage_depths`` / ``stage_widths`` / ``stage_heads``; empty tuples are one stage, the plain ViT). The
model is still one ``ViT`` with one flat ``blocks`` list: no stage module, no second model class.

**Hook points** keep the plain ViT's names and are numbered through all stages: Swin-T's 2 + 2 + 6 + 2 blocks are
``blocks.0`` to ``blocks.11``; ``blocks.2.attn.hook_pattern`` is the first layer of stage 1. Layer ``l`` everywhere
(``output_attentions``, ``vit.explain(..., layer=l)``, the explorer's layer slider) is block ``l``.

**The downsampling block** that opens a stage is a named child of that stage's first block, ``blocks.{i}.merge``
(Swin's ``PatchMerging``: 2x2 neighbours concatenated, a norm and a linear map). The block runs it first:
``hook_resid_pre`` is the stream as it arrives (the previous stage's grid and width), ``hook_merged`` the stream
after the merge (this stage's), then the block's own attention and MLP. So ``hook_resid_pre`` of block ``i`` is
always ``hook_resid_post`` of block ``i - 1``, and running blocks ``l..`` from a stored ``hook_resid_pre``
(``ViT.run_blocks``) repeats the merge exactly.

**Query pooling** (Hiera, SAM 2's Hiera: ``merge="pool"``, ``QueryPool``) opens a stage differently: the stage's first
block normalises the stream it receives (``hook_attn_in``, the previous stage's grid and width), its residual is that
normed stream projected and max-pooled 2x2 (``hook_merged``), and its attention reads the same normed stream with its
queries max-pooled 2x2 (``pool_queries``, before ``hook_q``): a non-square layer, (queries of the new grid) x (keys of
the old grid), in the previous stage's windows (Hiera's mask units, SAM 2's ``window_spec``), each window's queries
the pooled window. ``LayerLayout.stride`` says so (``key_grid``, ``key_window``). Hiera's libraries hold tokens in
an "unrolled" order (each pooling stride moved to the front, so a mask unit is a slice); ours stay row-major on the
grid (a window is cut as Swin's are, its slots row-major), which is the same attention in another token order, so
every map is placed on the image directly.

**Each block knows its grid** from its input's: ``Block.grid_after(grid)`` is the grid its merge makes (the input's
otherwise), and ``ViT.layer_layouts(patch_grid)`` lists, per layer, a ``LayerLayout``: its grid, its window, its
cyclic shift and how the shift meets the padding. Every caller passes the *image's* patch grid (stage 0) as before;
``run_blocks`` derives each block's input grid and layout from it. Where a Swin stage's grid is no larger than the
window on a side, the libraries part ways (``window_and_shift``, ``ViTConfig.window_rule``): HF Swin takes the short
side for both axes, HF Swin V2 the height of the grid it is built for, and timm each axis alone, so timm's windows
and shifts may differ between the axes (``LayerLayout.window_hw``, ``shift_hw``).

**A layer's attention on the image.** A windowed layer returns each window's attention ``(B * nw, nh, n, n)`` in
the order its (shifted) windows were cut. ``LayerLayout.window_tokens()`` says which token of the layer's grid each
window slot holds (the cyclic shift undone, padding marked ``T``), so ``vit.explain.methods.attention.windows_on_grid``
places a query's row on the layer's own grid, un-shifted and zero outside its window. A query patch clicked on the
image is, in layer ``l``, the token of layer ``l``'s grid that covers it (``covering_token``); its row is drawn on
that layer's grid, which covers the same image (each grid cell ``2**s`` patches wide in stage ``s``). A pooled-query
layer's row lies over its keys, the previous stage's grid (``LayerLayout.key_grid``), and is drawn there.

**Rollout through a merge.** A merged token is built from its 2x2 input tokens (a norm and a linear map of their
concatenation): as a map of tokens, ``merge_matrix`` ``(T_out, T_in)`` holds 1/k on the k real (not padding) inputs of
each output token. The rollout row of a stage-``s`` token passes through it (``row @ merge_matrix``) to the previous
stage's grid and on through that stage's layers, ending on the patch grid of the image.

**Rollout through query pooling.** Max-pooling is not linear: which input wins depends on the input, channel by
channel. The rollout takes the same convention as through a merge: a pooled token is built from its 2x2 stride window
uniformly (``merge_matrix``, 1/4 each), the residual of the pooling layer is that map, and its attention rows already
sit over the previous grid's keys, so the layer's rollout factor ``(T_new, T_old)`` is ``attention + merge_matrix``
(rows renormalised). Swin's windows, SAM's, Hiera's mask units and pooled queries are all one placement and one
rollout step (``layer_on_grid``, ``layer_rows`` here, ``vit.explain.methods.attention.layer_step``): each window's query
slots (``LayerLayout.window_tokens``) over its key slots (``LayerLayout.key_tokens``), its residual the identity or the
pooling (``merge_matrix`` of the key window); a global layer is one window of every token. """

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vit.model.config import WINDOW_RULES
from vit.model.hooks import HookPoint
from vit.model.layouts import resize_beit_table


def pair(value: int | Sequence[int]) -> tuple[int, int]:
    """A window or shift as ``(height, width)``: an int is the same on both axes (timm's ``to_2tuple``)."""
    if isinstance(value, int):
        return value, value
    h, w = value
    return int(h), int(w)


def _compact(value: int | Sequence[int]) -> int | tuple[int, int]:
    h, w = pair(value)
    return h if h == w else (h, w)


@dataclass(frozen=True)
class LayerLayout:
    """Where one layer's attention sits: its patch ``grid`` (gh, gw), its ``window`` in patches (0: global), its
    cyclic ``shift`` (Swin's shifted windows) and whether the shift rolls the padded grid (HF: pad, then roll) or
    the grid before it is padded (timm: roll, then pad). ``window`` and ``shift`` are ``(height, width)`` where the
    two differ (timm's Swin on a grid narrower than its window on one side), an int otherwise (``window_hw`` and
    ``shift_hw`` always give the pair)."""

    grid: tuple[int, int]
    window: int | tuple[int, int] = 0
    shift: int | tuple[int, int] = 0
    shift_padded: bool = True
    stride: int = 1  # query pooling (Hiera, SAM 2): queries on ``grid``, keys on the grid ``stride`` times finer
    # Qwen2.5-VL (unit > 1): windows of whole unit x unit merge units, their slots unit by unit (its window index);
    # a padding slot holds no token and is masked as a key (its edge windows are ragged), where SAM's zeros attend
    unit: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "window", _compact(self.window))  # (7, 7) and 7 are one layout
        object.__setattr__(self, "shift", _compact(self.shift))

    @property
    def window_hw(self) -> tuple[int, int]:
        return pair(self.window)

    @property
    def shift_hw(self) -> tuple[int, int]:
        return pair(self.shift)

    @property
    def num_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def key_grid(self) -> tuple[int, int]:
        """The grid of the keys: the layer's own, or the previous stage's in a pooled-query layer."""
        return self.grid[0] * self.stride, self.grid[1] * self.stride

    @property
    def num_key_tokens(self) -> int:
        """The keys a row of this layer has on the image: the key grid's tokens (a layout whose windows hold
        prefix tokens too counts those: ``placing.partitions``)."""
        kh, kw = self.key_grid
        return kh * kw

    @property
    def key_window(self) -> int | tuple[int, int]:
        """A window on the key grid (0: global), as ``window`` gives it."""
        wh, ww = self.window_hw
        return _compact((wh * self.stride, ww * self.stride))

    def window_tokens(self) -> torch.Tensor:
        """``(nw, wh*ww)``: the token of this layer's grid (row-major) that each window slot holds, in the order the
        (shifted) windows are cut (``window_partition``), ``gh * gw`` for padding; a global layer is one window of
        every token."""
        if not self.window:
            return torch.arange(self.num_tokens)[None]
        return window_tokens(self.grid, self.window, self.shift, self.shift_padded, self.unit)

    def cut(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens ``(B, gh*gw, D)`` row-major on the grid -> this layer's windows ``(B * nw, wh*ww, D)``, in
        ``window_tokens``' order (padding slots zeros): the one place a windowed layer's token order is made."""
        if self.unit == 1:  # rolls and views: no index
            return shift_windows(x, self.grid, self.window, self.shift, self.shift_padded)
        B, T, D = x.shape
        tokens = self.window_tokens().to(x.device)  # (nw, n)
        x = torch.cat([x, x.new_zeros(B, 1, D)], dim=1)  # (B, T + 1, D): T is the padding slot's zero
        return x[:, tokens.flatten()].reshape(-1, tokens.shape[1], D)  # (B * nw, n, D)

    def join(self, windows: torch.Tensor) -> torch.Tensor:
        """``cut``'s inverse: ``(B * nw, wh*ww, D)`` -> ``(B, gh*gw, D)`` row-major, padding slots dropped."""
        if self.unit == 1:
            return unshift_windows(windows, self.grid, self.window, self.shift, self.shift_padded)
        tokens = self.window_tokens().flatten()
        slot = torch.empty(self.num_tokens + 1, dtype=torch.long)
        slot[tokens] = torch.arange(len(tokens))  # each token's slot (padding's entry unused)
        D = windows.shape[-1]
        return windows.reshape(-1, len(tokens), D)[:, slot[:-1].to(windows.device)]  # (B, gh*gw, D)

    def key_mask(self) -> torch.Tensor | None:
        """``(nw, wh*ww)``: False at the padding slots of a layer whose padding holds no token (Qwen's windows),
        masked as keys; None where the padding attends as zeros (SAM's) or there is none."""
        if self.unit == 1 or not self.window:
            return None
        return self.window_tokens() < self.num_tokens

    def key_tokens(self) -> torch.Tensor:
        """``(nw, kh*kw)``: the token of the key grid each window's key slot holds (``window_tokens`` of
        ``key_grid`` in windows of ``key_window``; the query windows' own in a layer that pools nothing), padding
        ``key_grid[0] * key_grid[1]``."""
        if self.stride == 1:
            return self.window_tokens()
        kh, kw = self.key_grid
        if not self.window:
            return torch.arange(kh * kw)[None]
        return window_tokens(self.key_grid, self.key_window)


def window_tokens(grid: tuple[int, int], window: int | tuple[int, int], shift: int | tuple[int, int] = 0,
                  shift_padded: bool = True, unit: int = 1) -> torch.Tensor:
    """``(nw, wh*ww)``: which token each window slot holds when the grid is padded to a multiple of ``window``
    (``(wh, ww)``, or an int for both) and cyclically shifted by ``shift`` (``torch.roll`` by ``-shift`` per axis)
    — the padded grid's (``shift_padded``, HF) or the grid's before padding (timm) — then cut into windows
    row-major, slots row-major inside; ``gh * gw`` marks padding. ``unit`` > 1 (Qwen2.5-VL's window index,
    ``get_vision_window_index``): the slots of a window run over its ``unit`` x ``unit`` merge units row-major,
    each unit's tokens row-major, as Qwen keeps them."""
    gh, gw = grid
    (wh, ww), (sh, sw) = pair(window), pair(shift)
    if unit > 1 and (gh % unit or gw % unit or wh % unit or ww % unit):
        raise ValueError(f"a {gh}x{gw} patch grid in {wh}x{ww} windows is not made of whole {unit}x{unit} units")
    Gh, Gw = -(-gh // wh) * wh, -(-gw // ww) * ww  # the padded grid
    if shift_padded:
        r = (torch.arange(Gh) + sh) % Gh  # the padded row each rolled row holds
        c = (torch.arange(Gw) + sw) % Gw
    else:
        r = torch.cat([(torch.arange(gh) + sh) % gh, torch.arange(gh, Gh)])
        c = torch.cat([(torch.arange(gw) + sw) % gw, torch.arange(gw, Gw)])
    token = torch.where((r[:, None] < gh) & (c[None, :] < gw), r[:, None] * gw + c[None, :], gh * gw)  # (Gh, Gw)
    u = unit
    token = token.view(Gh // wh, wh // u, u, Gw // ww, ww // u, u).permute(0, 3, 1, 4, 2, 5)  # windows, units, slots
    return token.reshape(-1, wh * ww)


def layer_windows(attn: Tensor, layout: LayerLayout) -> tuple[int, Tensor, Tensor]:
    """The batch size of a layer's attention as it returns it, ``(B * nw, H, nq, nk)`` (a global layer's
    ``(B, H, Tq, Tk)``: one window), and each window's query and key tokens (``LayerLayout.window_tokens``,
    ``key_tokens``); ValueError for another shape."""
    queries, keys = layout.window_tokens(), layout.key_tokens()  # (nw, nq), (nw, nk): padding -> Tq, Tk
    (nw, nq), nk = queries.shape, keys.shape[1]
    if attn.dim() != 4 or attn.shape[0] % nw or attn.shape[2:] != (nq, nk):
        (gh, gw), (kh, kw) = layout.grid, layout.key_grid
        wh, ww = layout.window_hw
        where = (f"a {gh}x{gw} grid" + (f" pooling a {kh}x{kw} one" if layout.stride > 1 else "")
                 + (f" in {wh}x{ww} windows" if layout.window else ""))
        raise ValueError(f"expected attention (B * {nw}, H, {nq}, {nk}) for {where}, got {tuple(attn.shape)}")
    return attn.shape[0] // nw, queries, keys


def layer_on_grid(attn: Tensor, layout: LayerLayout) -> Tensor:
    """One layer's attention as it returns it -> ``(B, H, Tq, Tk)`` on the image's grids: queries on the layer's
    own grid (``layout.grid``), keys on ``layout.key_grid`` (the previous stage's in a pooled-query layer, Hiera /
    SAM 2), each row placed on its window's keys and zero outside. A windowed layer's attention is
    ``(B * nw, H, nq, nk)`` (SAM / ViTDet windows, Swin's shifted windows placed un-shifted, Hiera's mask units);
    padding keys are dropped, so a row of a window that covers padding sums to the share its real keys got. A
    global layer's is returned as it is."""
    if not layout.window:
        layer_windows(attn, layout)
        return attn
    B, queries, keys = layer_windows(attn, layout)
    (nw, nq), nk = queries.shape, keys.shape[1]
    Tq, Tk, H = layout.num_tokens, layout.num_key_tokens, attn.shape[1]
    dense = attn.new_zeros(B, H, Tq + 1, Tk + 1)
    dense[:, :, queries[:, :, None], keys[:, None, :]] = attn.view(B, nw, H, nq, nk).transpose(1, 2)
    return dense[:, :, :Tq, :Tk]


def layer_rows(attn: Tensor, layout: LayerLayout, queries: Sequence[int]) -> Tensor:
    """Rows ``queries`` (tokens of the layer's grid) of ``layer_on_grid(attn, layout)``, ``(B, H, q, Tk)``, read
    from each query's own window only: ``q x Tk`` values formed, never ``Tq x Tk``."""
    B, tokens, keys = layer_windows(attn, layout)
    (nw, nq), nk = tokens.shape, keys.shape[1]
    Tq, Tk, H = layout.num_tokens, layout.num_key_tokens, attn.shape[1]
    queries = torch.as_tensor(list(queries), dtype=torch.long)
    if queries.numel() and not (0 <= int(queries.min()) and int(queries.max()) < Tq):
        raise ValueError(f"query tokens out of range for {Tq} tokens")
    slot_of = torch.empty(Tq + 1, dtype=torch.long)
    slot_of[tokens.flatten()] = torch.arange(nw * nq)  # each token's window * nq + slot (padding's entry unused)
    slot = slot_of[queries]  # (q,)
    rows = attn.view(B, nw, H, nq, nk).permute(1, 3, 0, 2, 4)[slot // nq, slot % nq]  # (q, B, H, nk)
    out = attn.new_zeros(B, H, len(queries), Tk + 1)
    where = keys[slot // nq].to(attn.device)  # (q, nk): each query's window's keys
    out.scatter_(-1, where.expand(B, H, -1, -1), rows.permute(1, 2, 0, 3))  # (B, H, q, nk) -> (B, H, q, Tk + 1)
    return out[..., :Tk]


def shift_windows(x: torch.Tensor, grid: tuple[int, int], window: int | tuple[int, int],
                  shift: int | tuple[int, int], shift_padded: bool) -> torch.Tensor:
    """Patch tokens ``(B, gh*gw, D)`` -> windows ``(B * nw, wh*ww, D)``: padded with zeros to a multiple of
    ``window`` and rolled by ``-shift`` (each ``(height, width)`` or an int for both; in the order
    ``shift_padded`` says), then cut row-major (``window_tokens``' order)."""
    B, _, D = x.shape
    gh, gw = grid
    (wh, ww), (sh, sw) = pair(window), pair(shift)
    x = x.view(B, gh, gw, D)
    ph, pw = -gh % wh, -gw % ww
    if (sh or sw) and not shift_padded:
        x = torch.roll(x, (-sh, -sw), (1, 2))
    if ph or pw:  # (F.pad copies even when it adds nothing)
        x = F.pad(x, (0, 0, 0, pw, 0, ph))  # (B, Gh, Gw, D)
    if (sh or sw) and shift_padded:
        x = torch.roll(x, (-sh, -sw), (1, 2))
    Gh, Gw = gh + ph, gw + pw
    x = x.view(B, Gh // wh, wh, Gw // ww, ww, D).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, wh * ww, D)  # (B * nw, wh*ww, D)


def unshift_windows(windows: torch.Tensor, grid: tuple[int, int], window: int | tuple[int, int],
                    shift: int | tuple[int, int], shift_padded: bool) -> torch.Tensor:
    """``shift_windows``' inverse: ``(B * nw, wh*ww, D)`` -> ``(B, gh*gw, D)``, the shift undone, padding dropped."""
    gh, gw = grid
    (wh, ww), (sh, sw) = pair(window), pair(shift)
    Gh, Gw = -(-gh // wh) * wh, -(-gw // ww) * ww
    D = windows.shape[-1]
    x = windows.view(-1, Gh // wh, Gw // ww, wh, ww, D).permute(0, 1, 3, 2, 4, 5)
    x = x.reshape(-1, Gh, Gw, D)
    if (sh or sw) and shift_padded:
        x = torch.roll(x, (sh, sw), (1, 2))
    x = x[:, :gh, :gw]
    if (sh or sw) and not shift_padded:
        x = torch.roll(x, (sh, sw), (1, 2))
    return x.reshape(-1, gh * gw, D)


# The shift masks and relative indices kept for the next forward are at most this large each (Swin V2-B's 24x24
# windows on a 96x96 grid: a 21 MB mask, formed again in each shifted block): a hostile window's (16,384 tokens: a 2
# GB index) is formed per call and freed, never held by the caches past its forward.
KEPT_LAYOUT_BYTES = 2**25


def shift_mask(grid: tuple[int, int], window: int | tuple[int, int], shift: int | tuple[int, int]) -> torch.Tensor:
    """Swin's shifted-window attention mask ``(nw, wh*ww, wh*ww)``: -100 between tokens that the cyclic shift
    brought together from different regions of the (padded) grid, 0 elsewhere (HF / timm ``get_attn_mask``; both
    libraries cut the regions on the padded grid; an axis not shifted has one region in each window). Kept per
    grid up to ``KEPT_LAYOUT_BYTES``, as timm keeps it in a buffer (forming it in every shifted block was ~2 % of
    Swin-T's forward at one thread); read it, never write to it."""
    (gh, gw), (wh, ww) = grid, pair(window)
    if -(-gh // wh) * -(-gw // ww) * (wh * ww) ** 2 * 4 > KEPT_LAYOUT_BYTES:
        return _shift_mask(tuple(grid), window, shift)
    return _kept_shift_mask(tuple(grid), window, shift)


def _shift_mask(grid: tuple[int, int], window: int | tuple[int, int], shift: int | tuple[int, int]) -> torch.Tensor:
    with torch.inference_mode(False):  # kept for gradient passes too: an inference tensor cannot be saved for them
        gh, gw = grid
        (wh, ww), (sh, sw) = pair(window), pair(shift)
        Gh, Gw = -(-gh // wh) * wh, -(-gw // ww) * ww
        rows, cols = torch.arange(Gh), torch.arange(Gw)
        region_r = (rows >= Gh - wh).long() + (rows >= Gh - sh).long()
        region_c = (cols >= Gw - ww).long() + (cols >= Gw - sw).long()
        region = (region_r[:, None] * 3 + region_c[None, :]).view(Gh // wh, wh, Gw // ww, ww)
        region = region.permute(0, 2, 1, 3).reshape(-1, wh * ww)  # (nw, n)
        return torch.where(region[:, None, :] == region[:, :, None], 0.0, -100.0)


_kept_shift_mask = lru_cache(maxsize=32)(_shift_mask)
shift_mask.cache_clear = _kept_shift_mask.cache_clear  # as before, when the whole function was the cache


def window_and_shift(grid: tuple[int, int], window: int, shift: bool, shrink: bool = False, rule: str = "hf",
                     built: tuple[int, int] | None = None) -> tuple[tuple[int, int], tuple[int, int]]:
    """A Swin layer's window and shift on ``grid``, each ``(height, width)``: the configured ``window``, shifted by
    half of it in shifting layers, except where the grid is no larger than the window, as each library decides
    (``rule``):

    - ``"hf"`` (HF Swin's ``set_shift_and_window_size``, on the grid it runs on): a grid no larger than the window
      in its shorter side has unshifted windows of that side, on both axes;
    - ``"hf_v2"`` (HF Swin V2's ``_compute_window_shift``, fixed when built, on ``built``: the grid HF builds the
      layer for, the image's grid halved per stage rounding down; ``grid`` if not given): its height decides for
      both axes, so a grid wider than the window but no taller is not shifted, and one taller but no wider is,
      its width padded;
    - ``"timm"`` (timm's ``_calc_window_shift``): each axis on its own, an axis no longer than the window has a
      window of its length and no shift.

    ValueError where a window would shrink and cannot (``shrink``: Swin's table has that window's offsets only,
    unless timm's checkpoint filter resizes it; Swin V2's MLP reads any offsets)."""
    if rule not in WINDOW_RULES:
        raise ValueError(f"unknown window rule {rule!r}; choose one of {', '.join(WINDOW_RULES)}")
    half = window // 2 if shift else 0
    if rule == "timm":
        windows = tuple(min(g, window) for g in grid)
        shifts = tuple(0 if g <= window else half for g in grid)
    else:
        side = (built or grid)[0] if rule == "hf_v2" else min(grid)
        windows, shifts = (min(side, window),) * 2, (0 if side <= window else half,) * 2
    if min(windows) < 1 or (min(windows) < window and not shrink):
        raise ValueError(f"a {grid[0]}x{grid[1]} patch grid is smaller than the {window}x{window} windows")
    return windows, shifts


def covering_token(token: int, grid: tuple[int, int], layer_grid: tuple[int, int]) -> int:
    """The token of ``layer_grid`` (row-major) whose cell covers patch ``token`` of the image's ``grid``: each stage
    halves the grid, padding the odd side (Swin's merge), so the cell is the patch's coordinates scaled down."""
    gh, gw = grid
    lh, lw = layer_grid
    if not 0 <= token < gh * gw:
        raise ValueError(f"patch {token} is out of range for a {gh}x{gw} grid")
    fy, fx = -(-gh // lh), -(-gw // lw)  # patches per cell: 2**stage
    return (token // gw) // fy * lw + (token % gw) // fx


def merge_matrix(grid: tuple[int, int], device: torch.device | None = None, stride: int = 2) -> torch.Tensor:
    """``(T_out, T_in)``: which input tokens of ``grid`` each output token of a ``stride`` x ``stride`` merge (or
    query pooling) is built from, 1/k on its k real inputs (padding of an odd side holds none): how a rollout row
    passes through ``PatchMerging``, and the residual of a pooled-query layer."""
    gh, gw = grid
    oh, ow = -(-gh // stride), -(-gw // stride)
    rows = torch.arange(gh * gw, device=device)
    out = (rows // gw) // stride * ow + (rows % gw) // stride  # each input token's output token
    m = torch.zeros(oh * ow, gh * gw, device=device)
    m[out, rows] = 1.0
    return m / m.sum(dim=1, keepdim=True)


def through_merge(row: torch.Tensor, grid: tuple[int, int], stride: int = 2) -> torch.Tensor:
    """``row (B, T_out) @ merge_matrix(grid)``, ``(B, T_in)``, without forming the ``T_out x T_in`` matrix (1 GB at
    a 128 x 128 grid; the rollout through Swin's merges grew as its square): each input token takes its output
    token's entry over the k real inputs that output is built from."""
    gh, gw = grid
    ow = -(-gw // stride)
    rows = torch.arange(gh * gw, device=row.device)
    out = (rows // gw) // stride * ow + (rows % gw) // stride  # each input token's output token
    counts = torch.bincount(out, minlength=row.shape[1]).to(row.dtype)  # (T_out,): its real inputs
    return (row / counts)[:, out]


class PatchMerging(nn.Module):
    """Swin's downsampling block: each 2x2 neighbourhood's tokens concatenated (the grid padded with zeros to even
    sides), then a norm and a bias-free linear map to ``out`` channels; Swin V2 (``post``) maps first, then
    normalises. HF ``SwinPatchMerging`` / timm ``PatchMerging`` (the same channel order: (0,0), (1,0), (0,1),
    (1,1) as (row, column))."""

    def __init__(self, dim: int, out: int, norm: nn.Module, post: bool = False) -> None:
        super().__init__()
        self.post = post
        self.norm = norm  # over 4 * dim, or over out when post
        self.reduction = nn.Linear(4 * dim, out, bias=False)
        self.hook_out = HookPoint()  # (B, T_out, out): the merged stream, the stage's first residual

    @staticmethod
    def grid_after(grid: tuple[int, int]) -> tuple[int, int]:
        return -(-grid[0] // 2), -(-grid[1] // 2)

    def forward(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """``x`` (B, gh*gw, D) -> (B, ceil(gh/2)*ceil(gw/2), out)."""
        B, _, D = x.shape
        gh, gw = grid
        x = F.pad(x.view(B, gh, gw, D), (0, 0, 0, gw % 2, 0, gh % 2))  # (B, even, even, D)
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1)
        x = x.reshape(B, -1, 4 * D)  # (B, T_out, 4D)
        x = self.reduction(x) if self.post else self.reduction(self.norm(x))
        return self.hook_out(self.norm(x) if self.post else x)


def pool_queries(q: torch.Tensor, grid: tuple[int, int], stride: int) -> torch.Tensor:
    """Queries ``(B, nh, gh*gw, hd)`` laid out row-major on ``grid`` (a window's, or the whole grid) -> max-pooled
    ``stride`` x ``stride`` per channel, ``(B, nh, gh/s * gw/s, hd)`` (Hiera's ``amax`` over the unrolled stride,
    SAM 2's ``MaxPool2d``)."""
    B, nh, _, hd = q.shape
    gh, gw = grid
    q = q.reshape(B, nh, gh, gw, hd)
    # The elementwise maximum of the stride's strided slices: the same values as one ``amax`` over a
    # (gh/s, s, gw/s, s) view, which reduces over two strided axes at once and ran 6-10x slower on a CPU (0.45 s
    # against 0.05 s per pooling at SAM 2's 1024 px).
    pooled = q[:, :, ::stride, ::stride]
    for i in range(stride):
        for j in range(stride):
            if i or j:
                pooled = torch.maximum(pooled, q[:, :, i::stride, j::stride])
    return pooled.reshape(B, nh, -1, hd)  # (B, nh, gh/s * gw/s, hd)


class QueryPool(nn.Module):
    """Hiera's / SAM 2's stage opening on the residual: the normed stream (the block's ``norm1``) projected to the
    stage's width and max-pooled ``stride`` x ``stride`` on the grid (HF ``HieraLayer.proj`` + max, timm
    ``MultiScaleBlock.proj`` + ``MaxPool2d``). The block pools its attention's queries alike (``pool_queries``)."""

    def __init__(self, dim: int, out: int, stride: int = 2) -> None:
        super().__init__()
        self.stride = stride
        self.proj = nn.Linear(dim, out)
        self.hook_out = HookPoint()  # (B, T_out, out): the pooled residual

    def grid_after(self, grid: tuple[int, int]) -> tuple[int, int]:
        if grid[0] % self.stride or grid[1] % self.stride:
            raise ValueError(f"a {grid[0]}x{grid[1]} patch grid does not pool by {self.stride}")
        return grid[0] // self.stride, grid[1] // self.stride

    def forward(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """``x`` (B, gh*gw, D), normed -> (B, gh/s * gw/s, out)."""
        x = self.proj(x)  # (B, gh*gw, out)
        if self.stride > 1:
            x = pool_queries(x[:, None], grid, self.stride)[:, 0]  # the same max over each stride window
        return self.hook_out(x)


# --- Swin's relative position biases over a window's offsets ----------------------------------------------------

def swin_relative_index(window: int | tuple[int, int]) -> torch.Tensor:
    """``(wh*ww, wh*ww)``: each pair of a window's tokens' offset, row-major over ``(2wh-1, 2ww-1)`` (HF / timm
    ``relative_position_index``, timm's ``get_relative_position_index(wh, ww)``); kept per window up to
    ``KEPT_LAYOUT_BYTES``, as the libraries keep it in a buffer (read it, never write to it)."""
    wh, ww = pair(window)
    if (wh * ww) ** 2 * 8 > KEPT_LAYOUT_BYTES:
        return _relative_index((wh, ww))
    return _kept_relative_index((wh, ww))


def _relative_index(window: tuple[int, int]) -> torch.Tensor:
    with torch.inference_mode(False):  # kept for gradient passes too: an inference tensor cannot be saved for them
        wh, ww = window
        y, x = torch.arange(wh).repeat_interleave(ww), torch.arange(ww).repeat(wh)  # each token's (row, column)
        # A pair's (qy - ky + wh - 1) * (2ww - 1) + qx - kx + ww - 1 is a query's part less a key's: one (n, n)
        # subtraction, not the (n, n, 2) offsets and their sums (40 bytes a pair at its peak, where this is 8)
        query_part = (y + wh - 1) * (2 * ww - 1) + x + ww - 1  # (n,)
        key_part = y * (2 * ww - 1) + x
        return query_part[:, None] - key_part[None, :]  # (n, n)


_kept_relative_index = lru_cache(maxsize=8)(_relative_index)
swin_relative_index.cache_clear = _kept_relative_index.cache_clear


class SwinPositionBias(nn.Module):
    """Swin's learned relative position bias: a ``(heads,)`` entry per offset between two tokens of a window."""

    def __init__(self, window: int, num_heads: int) -> None:
        super().__init__()
        self.window = window
        self.table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, num_heads))

    def forward(self, window: int | tuple[int, int] | None = None) -> torch.Tensor:
        """The bias ``(nh, wh*ww, wh*ww)`` for windows ``window`` (``(wh, ww)``; None: the table's own). A window
        narrower than the table's (timm's Swin on a grid narrower than its window on a side) reads the table
        resized as timm's checkpoint filter resizes it for that layer (``resize_rel_pos_bias_table``)."""
        wh, ww = pair(window or self.window)
        table = self.table
        if (wh, ww) != (self.window, self.window):
            if wh > self.window or ww > self.window:
                raise ValueError(f"Swin's position table covers {self.window}x{self.window} windows, not {wh}x{ww}")
            table = resize_beit_table(table, (self.window, self.window), (wh, ww), extra=0)
        index = swin_relative_index((wh, ww)).to(table.device)  # made here: a buffer would stay on meta
        return table.index_select(0, index.reshape(-1)).view(wh * ww, wh * ww, -1).permute(2, 0, 1)


@lru_cache(maxsize=32)
def swinv2_coords(window: tuple[int, int], pretrained_window: int = 0) -> torch.Tensor:
    """``SwinV2PositionBias.coords``, formed once per window rather than in each block's forward (28 us each, a dozen
    small operations: 0.2 % of Swin V2-T's forward at one thread)."""
    with torch.inference_mode(False):  # kept for gradient passes too: an inference tensor cannot be saved for them
        axes = []
        for side in window:
            offsets = torch.arange(-(side - 1), side, dtype=torch.float32)
            norm = pretrained_window - 1 if pretrained_window > 0 else side - 1
            axes.append(offsets / norm if norm > 0 else offsets)
        coords = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1)  # (2wh-1, 2ww-1, 2)
        coords = coords * 8
        coords = torch.sign(coords) * torch.log2(coords.abs() + 1.0) / 3.0  # log2(8) = 3
        return coords.reshape(-1, 2)


class SwinV2PositionBias(nn.Module):
    """Swin V2's continuous position bias: a small MLP (2 -> 512 -> heads, ReLU) of each offset's log-spaced
    coordinates (normalised by the pretrained window, scaled to [-8, 8], ``sign * log2(1 + |x|) / 3``), squashed to
    ``16 * sigmoid``."""

    def __init__(self, window: int, num_heads: int, pretrained_window: int = 0) -> None:
        super().__init__()
        self.window, self.pretrained_window = window, pretrained_window
        self.cpb_mlp = nn.Sequential(nn.Linear(2, 512), nn.ReLU(), nn.Linear(512, num_heads, bias=False))

    def coords(self, window: int | tuple[int, int]) -> torch.Tensor:
        """``((2wh-1)*(2ww-1), 2)``: each offset's log-spaced coordinates, as the MLP reads them, each axis
        normalised by its own window side less one (or the pretrained window's); kept per window, as HF and timm
        keep them in a buffer (read them, never write to them)."""
        return swinv2_coords(pair(window), self.pretrained_window)

    def forward(self, window: int | tuple[int, int] | None = None) -> torch.Tensor:
        """The bias ``(nh, wh*ww, wh*ww)`` for windows ``window`` (``(wh, ww)``: the layer's, which a small grid
        shrinks)."""
        wh, ww = pair(window or self.window)
        weight = self.cpb_mlp[0].weight
        table = self.cpb_mlp(self.coords((wh, ww)).to(weight.device, weight.dtype))  # ((2wh-1)*(2ww-1), nh)
        index = swin_relative_index((wh, ww)).to(weight.device)
        table = 16 * torch.sigmoid(table)  # per offset, before it is spread over the pairs (the same values)
        return table.index_select(0, index.reshape(-1)).view(wh * ww, wh * ww, -1).permute(2, 0, 1)
