"""Attention layouts: what is added to a query's logits (BEiT's relative position bias, SAM's decomposed
relative positions, NACLIP's Gaussian neighbourhood) and which keys it may attend to (SAM / ViTDet's windows)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# --- attention layouts: relative position biases, windows and padding -----------------------------------------

def padding_bias(key_mask: torch.Tensor, dtype: torch.dtype, queries: int) -> torch.Tensor:
    """A key-padding mask ``(B, N)`` (True: a real token, False: padding) as what the logits add, ``(B, 1, queries,
    N)`` (an expanded view): 0 for real keys, the dtype's lowest value for padding, as HF's ``pixel_attention_mask``
    becomes (``create_bidirectional_mask``), so a padded key gets exactly zero probability."""
    low = torch.finfo(dtype).min
    bias = torch.zeros(key_mask.shape, dtype=dtype, device=key_mask.device).masked_fill(~key_mask.bool(), low)
    return bias[:, None, None, :].expand(-1, -1, queries, -1)  # (B, 1, n, N)


def diagonal_bias(rows: torch.Tensor, keys: int, dtype: torch.dtype) -> torch.Tensor:
    """Locality self-attention's mask (Lee et al. 2021) as what the logits add for the queries ``rows`` (token
    indices), ``(len(rows), keys)``: the dtype's lowest value at each query's own key, 0 elsewhere, so a token never
    attends to itself (the authors set those logits to -987654321, vit-pytorch to the dtype's lowest: both give a
    probability of exactly 0)."""
    own = rows[:, None] == torch.arange(keys, device=rows.device)[None, :]  # (n, keys): no data-dependent shape,
    # so a compiled model traces it
    return torch.zeros(own.shape, dtype=dtype, device=rows.device).masked_fill(own, torch.finfo(dtype).min)


def neighbourhood_bias(grid: tuple[int, int], prefix: int, std: float, rows: torch.Tensor | None = None,
                       device: torch.device | None = None) -> torch.Tensor:
    """NACLIP's neighbourhood (``get_attention_addition`` of a ``gaussian_window``): what a patch query adds to its
    logit for a patch key, ``exp(-d² / (2 std²))`` of their distance ``d`` on the ``grid`` in patches, and 0 for
    every pair with one of the ``prefix`` leading tokens; ``(n or T, T)`` float32, ``T = prefix + gh*gw``, the rows
    ``rows`` (token indices; None: all), so a query chunk forms its own rows and never ``T²``."""
    gh, gw = grid
    T = prefix + gh * gw
    rows = torch.arange(T, device=device) if rows is None else rows.to(device)
    patch = rows - prefix  # (n,): negative at the prefix tokens
    keys = torch.arange(gh * gw, device=device)
    dy = (patch.clamp(min=0) // gw)[:, None] - (keys // gw)[None, :]  # (n, gh*gw)
    dx = (patch.clamp(min=0) % gw)[:, None] - (keys % gw)[None, :]
    bias = torch.zeros(len(rows), T, device=device)
    bias[:, prefix:] = torch.exp(-(dy * dy + dx * dx).float() / (2.0 * std * std))
    bias[patch < 0] = 0.0
    return bias


INDEX_CACHE_TOKENS = 1025  # BEiT's whole index is kept up to 512 px at 16 px patches (8 MB), recomputed past it

def beit_relative_position_index(grid: tuple[int, int], rows: torch.Tensor | None = None) -> torch.Tensor:
    """BEiT's ``(1 + gh*gw, 1 + gw*gw)`` index into its table: patch pairs by their offset (row-major over
    ``(2gh-1, 2gw-1)``), then the three CLS entries (CLS to patch, patch to CLS, CLS to CLS) last. With ``rows``
    (token indices, CLS 0), those rows alone, ``(len(rows), 1 + gh*gw)``: a query chunk's, never ``T²``."""
    gh, gw = grid
    rows = torch.arange(gh * gw + 1) if rows is None else rows.cpu()
    # A pair's patch index (qy - ky + gh - 1) * (2gw - 1) + qx - kx + gw - 1 is a query's part minus a key's, one
    # subtraction into the index itself: int32 and no (n, T, 2) offsets, so a chunk's index costs 4 bytes a pair
    # (a tenth of its bias at 12 heads), not the 40 of int64 offsets and their sums.
    patch = (rows - 1).clamp(min=0).to(torch.int32)  # CLS's row is overwritten below
    query_part = (patch // gw + gh - 1) * (2 * gw - 1) + patch % gw + gw - 1  # (n,)
    keys = torch.arange(gh * gw, dtype=torch.int32)
    key_part = keys // gw * (2 * gw - 1) + keys % gw  # (T - 1,)
    distances = (2 * gh - 1) * (2 * gw - 1)
    index = torch.empty(len(rows), 1 + gh * gw, dtype=torch.int32)  # (n, 1 + T)
    torch.sub(query_part[:, None], key_part[None, :], out=index[:, 1:])
    index[:, 0] = distances + 1  # patch to CLS
    cls = rows == 0
    index[cls] = distances  # CLS to patch
    index[cls, 0] = distances + 2
    return index


def _geometric_offsets(src: int, dst: int) -> torch.Tensor:
    """unilm's BEiT resize (timm ``resize_rel_pos_bias_table``'s ``_calc``): where the ``src`` offsets of one axis
    sit among ``dst`` target ones, spread by the ratio ``q`` whose geometric series spans half the target."""
    left, right = 1.01, 1.5
    while right - left > 1e-6:
        q = (left + right) / 2.0
        if (1.0 - q ** (src // 2)) / (1.0 - q) > dst // 2:
            right = q
        else:
            left = q
    distances, current = [], 1
    for i in range(src // 2):
        distances.append(current)
        current += q ** (i + 1)
    return torch.tensor([-d for d in reversed(distances)] + [0] + distances)


def _linear_weights(points: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Along one axis, for each target ``x``, its two neighbours among the sorted ``points`` and their weights, as
    timm's ``RegularGridInterpolator`` (linear; an ``x`` past the ends takes the end value)."""
    right = torch.bucketize(x, points).clamp(max=len(points) - 1)
    left = (right - 1).clamp(0, len(points) - 1)
    to_left, to_right = (x - points[left]).clamp(min=0), (points[right] - x).clamp(min=0)
    both = (to_left == 0) & (to_right == 0)
    to_left, to_right = to_left.masked_fill(both, 1.0), to_right.masked_fill(both, 1.0)
    return left, right, to_right, to_left, to_left + to_right  # the left one weighs its distance to the right


def resize_beit_table(table: torch.Tensor, old: tuple[int, int], new: tuple[int, int], extra: int = 3
                      ) -> torch.Tensor:
    """timm's ``resize_rel_pos_bias_table`` (without scipy: its linear ``RegularGridInterpolator``) of a BEiT table
    ``((2gh-1)(2gw-1) + 3, nh)`` from grid ``old`` to ``new``: the offsets read row-major as ``(2gh-1, 2gw-1)``, each
    head linearly interpolated from unilm's geometrically spread source offsets, the ``extra`` rows after them (BEiT's
    three CLS rows; Swin's table has none) kept."""
    (sh, sw), (dh, dw) = (2 * old[0] - 1, 2 * old[1] - 1), (2 * new[0] - 1, 2 * new[1] - 1)
    kept = table[len(table) - extra:]
    values = table[:len(table) - extra].float().cpu().view(sh, sw, -1)  # (sh, sw, nh)
    ys = _linear_weights(_geometric_offsets(sh, dh), torch.arange(-(dh // 2.0), dh // 2.0 + 0.1, 1.0))
    xs = _linear_weights(_geometric_offsets(sw, dw), torch.arange(-(dw // 2.0), dw // 2.0 + 0.1, 1.0))
    out = 0.0
    for iy, wy in ((ys[0], ys[2]), (ys[1], ys[3])):
        for ix, wx in ((xs[0], xs[2]), (xs[1], xs[3])):
            out = out + values[iy][:, ix] * (wy[:, None] * wx[None, :])[..., None]  # (dh, dw, nh)
    out = out / (ys[4][:, None] * xs[4][None, :])[..., None]
    return torch.cat([out.reshape(dh * dw, -1).to(table), kept])


class RelativePositionBias(nn.Module):
    """BEiT's relative position bias (one per layer, or one shared by all): a learned ``(heads,)`` bias per 2D offset
    between two patches, plus three for the CLS pairs, added to the attention logits. On another grid the offset
    table is resized (``resize``): bilinearly, as HF ``BeitRelativePositionBias`` does on every call, or as timm's
    ``resize_rel_pos_bias_table`` does when its model is set to another input size (``resize_beit_table``)."""

    def __init__(self, grid: tuple[int, int], num_heads: int, resize: str = "bilinear") -> None:
        super().__init__()
        self.grid, self.resize = tuple(grid), resize
        self.table = nn.Parameter(torch.zeros((2 * grid[0] - 1) * (2 * grid[1] - 1) + 3, num_heads))
        self._index: tuple[tuple[int, int], torch.Tensor] | None = None  # (grid, its whole index), as HF caches it

    def index(self, grid: tuple[int, int], rows: torch.Tensor | None = None) -> torch.Tensor:
        """``beit_relative_position_index`` of ``grid`` (its ``rows``); the whole index of a grid of up to
        ``INDEX_CACHE_TOKENS`` tokens is kept for the next call (1.6 ms a layer at 197 tokens, 6 % of BEiT-B's
        forward with attentions)."""
        if rows is not None or (grid[0] * grid[1] + 1) > INDEX_CACHE_TOKENS:
            return beit_relative_position_index(grid, rows)
        cached = self._index
        if cached is None or cached[0] != grid:
            with torch.inference_mode(False):  # kept for gradient passes too: an inference tensor cannot be saved
                cached = self._index = (grid, beit_relative_position_index(grid))
        return cached[1]

    def forward(self, grid: tuple[int, int], rows: torch.Tensor | None = None) -> torch.Tensor:
        """The bias ``(nh, 1 + gh*gw, 1 + gh*gw)`` for a patch grid; its rows ``rows`` (token indices) alone,
        ``(nh, len(rows), 1 + gh*gw)``, when given (what a query chunk of the attention needs)."""
        table = self.table
        if self.resize == "timm":
            if tuple(grid) != self.grid:
                table = resize_beit_table(table, self.grid, tuple(grid))
        elif tuple(grid) != self.grid or self.grid[0] != self.grid[1]:
            # HF reads its table as (2ow-1, 2oh-1) and resizes it to (2gh-1, 2gw-1) on every call, so a non-square
            # model's own table is resized at its own size too
            (oh, ow), (gh, gw) = self.grid, grid
            offsets = table[:-3].reshape(1, 2 * ow - 1, 2 * oh - 1, -1).permute(0, 3, 1, 2)  # HF's (w, h) reading
            offsets = F.interpolate(offsets, size=(2 * gh - 1, 2 * gw - 1), mode="bilinear")
            table = torch.cat([offsets.permute(0, 2, 3, 1).reshape((2 * gh - 1) * (2 * gw - 1), -1), table[-3:]])
        index = self.index(tuple(grid), rows).to(table.device)  # (n or T, T)
        rows = table.index_select(0, index.reshape(-1))  # 4x faster than table[index] here (CPU, 197 tokens)
        return rows.view(*index.shape, -1).permute(2, 0, 1)  # (nh, n or T, T)


def sam_rel_pos(q_size: int, k_size: int, table: torch.Tensor) -> torch.Tensor:
    """SAM's ``get_rel_pos``: the ``(q_size, k_size, hd)`` embeddings of every query-key offset along one axis, from a
    ``(L, hd)`` table linearly resized to ``2 * max(q_size, k_size) - 1`` offsets when its length differs."""
    length = 2 * max(q_size, k_size) - 1
    if table.shape[0] != length:
        table = F.interpolate(table.T[None], size=length, mode="linear")[0].T  # (length, hd)
    q_coords = torch.arange(q_size, dtype=torch.float32)[:, None] * max(k_size / q_size, 1.0)
    k_coords = torch.arange(k_size, dtype=torch.float32)[None, :] * max(q_size / k_size, 1.0)
    offsets = (q_coords - k_coords) + (k_size - 1) * max(q_size / k_size, 1.0)
    return table[offsets.long().to(table.device)]


def decomposed_rel_pos(q: torch.Tensor, rel_pos_h: torch.Tensor, rel_pos_w: torch.Tensor, grid: tuple[int, int],
                       rows: torch.Tensor | None = None) -> torch.Tensor:
    """SAM / MViTv2's decomposed relative positions (``add_decomposed_rel_pos``): the bias ``(B, nh, n, N)`` that each
    query ``q`` (B, nh, n, hd; unscaled) adds to its logits, ``q . R_h[dy] + q . R_w[dx]``; the queries are the
    tokens ``rows`` of the ``N = gh*gw`` grid (None: all of them, in order)."""
    gh, gw = grid
    B, nh, n, hd = q.shape
    rows = torch.arange(gh * gw, device=q.device) if rows is None else rows.to(q.device)
    rel_h = torch.einsum("bnqc,qkc->bnqk", q, sam_rel_pos(gh, gh, rel_pos_h)[rows // gw])  # (B, nh, n, gh)
    rel_w = torch.einsum("bnqc,qkc->bnqk", q, sam_rel_pos(gw, gw, rel_pos_w)[rows % gw])  # (B, nh, n, gw)
    return (rel_h[..., :, None] + rel_w[..., None, :]).reshape(B, nh, n, gh * gw)


def window_partition(x: torch.Tensor, grid: tuple[int, int], window: int) -> torch.Tensor:
    """Patch tokens ``(B, gh*gw, D)`` -> non-overlapping windows ``(B * nw, window**2, D)``, the grid first padded
    with zeros at the bottom and right to a multiple of ``window``; windows row-major over the padded grid, each
    row-major inside (timm / SAM ``window_partition``)."""
    B, _, D = x.shape
    gh, gw = grid
    ph, pw = -gh % window, -gw % window
    x = F.pad(x.view(B, gh, gw, D), (0, 0, 0, pw, 0, ph))  # (B, Gh, Gw, D)
    Gh, Gw = gh + ph, gw + pw
    x = x.view(B, Gh // window, window, Gw // window, window, D).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window * window, D)  # (B * nw, window**2, D)


def window_unpartition(windows: torch.Tensor, grid: tuple[int, int], window: int) -> torch.Tensor:
    """``window_partition``'s inverse: windows ``(B * nw, window**2, D)`` -> ``(B, gh*gw, D)``, padding dropped."""
    gh, gw = grid
    nh_, nw_ = -(-gh // window), -(-gw // window)  # windows per column and per row
    D = windows.shape[-1]
    x = windows.view(-1, nh_, nw_, window, window, D).permute(0, 1, 3, 2, 4, 5)
    x = x.reshape(-1, nh_ * window, nw_ * window, D)[:, :gh, :gw]  # (B, gh, gw, D)
    return x.reshape(-1, gh * gw, D)




# --- a clip's tokens: (time, row, col) -------------------------------------------------------------------------------
# A video model's token is a tubelet: ``tubelet`` frames x one patch. VideoMAE's Conv3d output ``(B, D, t, gh, gw)``
# is flattened time-major, so token ``n`` is ``(n // (gh*gw), n // gw % gh, n % gw)``; row-major over the frames'
# grids stacked, ``(t*gh, gw)``, is the same order, which is the 2D grid the blocks and the image maps see (a clip's
# "folded" grid). The maps are unfolded here, in one place.

def clip_grid(frames: int, height: int, width: int, tubelet: int, patch: tuple[int, int]) -> tuple[int, int, int]:
    """The token grid ``(t, gh, gw)`` of a clip of ``frames`` frames of ``height x width`` px; ValueError (one line)
    when the frames do not make whole tubelets or the frame does not tile into patches."""
    ph, pw = patch
    if frames < tubelet or frames % tubelet:
        raise ValueError(f"a clip of {frames} frames does not make whole tubelets of {tubelet} frames")
    if height % ph or width % pw or height < ph or width < pw:
        raise ValueError(f"frames of {width}x{height} px do not tile into {pw}x{ph} px patches")
    return frames // tubelet, height // ph, width // pw


def folded_grid(grid: tuple[int, int, int]) -> tuple[int, int]:
    """A clip's ``(t, gh, gw)`` as the 2D grid ``(t*gh, gw)`` whose row-major order is its time-major token order."""
    t, gh, gw = grid
    return t * gh, gw


def clip_token(grid: tuple[int, int, int], time: int, row: int, col: int) -> int:
    """The index among the patch tokens of the tubelet at ``(time, row, col)`` (time in tubelets), time-major."""
    t, gh, gw = grid
    if not (0 <= time < t and 0 <= row < gh and 0 <= col < gw):
        raise ValueError(f"token ({time}, {row}, {col}) is outside the clip's {t} x {gh} x {gw} tubelets")
    return (time * gh + row) * gw + col


def frame_maps(values: torch.Tensor, grid: tuple[int, int, int], tubelet: int) -> torch.Tensor:
    """Per-token values ``(..., t*gh*gw)`` (time-major) -> per-frame maps ``(..., t*tubelet, gh, gw)``: each
    tubelet's value repeated over its ``tubelet`` frames."""
    t, gh, gw = grid
    if values.shape[-1] != t * gh * gw:
        raise ValueError(f"{values.shape[-1]} values do not fit a clip of {t} x {gh} x {gw} tubelets")
    maps = values.reshape(*values.shape[:-1], t, gh, gw)  # time-major: time, then rows, then columns
    return maps.repeat_interleave(tubelet, dim=-3)  # (..., t*tubelet, gh, gw)


# --- TimeSformer's divided space-time attention: two layouts of one block ------------------------------------------
# Each is a partition of a clip's patch tokens (time-major, the prefix left out) into groups that attend within
# themselves, held as an index tensor (groups, group length): the temporal attention's groups are the patch
# positions (each over its frames), the spatial attention's the frames (each over its patches, row-major).

def divided_partitions(grid: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The clip ``(t, gh, gw)``'s two partitions: ``by_position`` ``(gh*gw, t)`` (group ``p``: the tokens of patch
    position ``p`` in frame order) and ``by_frame`` ``(t, gh*gw)`` (group ``f``: frame ``f``'s tokens, row-major)."""
    t, gh, gw = grid
    by_frame = torch.arange(t * gh * gw).view(t, gh * gw)
    return by_frame.T, by_frame


def partition(x: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Tokens ``(B, N, D)`` -> the groups of a partition ``groups`` ``(G, L)``, ``(B * G, L, D)`` (batch-major)."""
    B, _, D = x.shape
    G, L = groups.shape
    return x[:, groups.reshape(-1).to(x.device)].reshape(B * G, L, D)


def unpartition(y: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """``partition``'s inverse: ``(B * G, L, D)`` -> ``(B, G*L, D)`` in token order (a partition is a permutation)."""
    G, L = groups.shape
    inverse = torch.argsort(groups.reshape(-1)).to(y.device)
    return y.reshape(-1, G * L, y.shape[-1])[:, inverse]
