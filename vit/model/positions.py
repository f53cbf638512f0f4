"""Positions: the learned table's resampling (timm's ``resample_abs_pos_embed``), rotary embeddings
(DINOv3's, EVA's, Perception Encoder's) and fixed sine-cosine tables."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def resample_pos_embed(pos_embed: torch.Tensor, new_grid: tuple[int, int],
                       old_grid: tuple[int, int], num_prefix_tokens: int = 1, antialias: bool = False,
                       mode: str = "bicubic") -> torch.Tensor:
    """Bicubically (or with ``mode="bilinear"``) resize position embeddings ``(1, prefix + gh*gw, D)`` to another
    patch grid.

    Prefix (CLS) embeddings are kept as they are; the interpolation runs in float32 and
    matches HF ``transformers``' ``interpolate_pos_encoding`` (align_corners=False), or with
    ``antialias`` timm's ``resample_abs_pos_embed`` and HF DINOv2-with-registers (PyTorch's
    antialiased bicubic uses another kernel, so it differs even when upsampling). Bilinear with antialias is
    SigLIP 2 NaFlex's ``resize_positional_embeddings``; ``mode="bilinear_corners"`` is bilinear with
    ``align_corners=True``, Qwen3-VL's (``get_vision_interpolation_indices_and_weights``).
    """
    if tuple(new_grid) == tuple(old_grid):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    dim, dtype = pos_embed.shape[-1], pos_embed.dtype
    grid = grid.reshape(1, old_grid[0], old_grid[1], dim).permute(0, 3, 1, 2).float()  # (1, D, gh, gw)
    corners = mode == "bilinear_corners"
    if mode == "nearest":  # takes no align_corners
        grid = F.interpolate(grid, size=tuple(new_grid), mode="nearest")
    else:
        grid = F.interpolate(grid, size=tuple(new_grid), mode="bilinear" if corners else mode,
                             align_corners=corners, antialias=antialias)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], dim).to(dtype)
    return torch.cat([prefix, grid], dim=1)


def dinov3_rope(grid: tuple[int, int], head_dim: int, theta: float, device: torch.device | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """DINOv3's axial rotary embedding for a patch grid: ``(cos, sin)``, each ``(gh*gw, head_dim)``.

    Patch centres are normalised per axis to [-1, 1], so any H x W is covered without
    interpolation; a quarter of the head's channels rotate with y, a quarter with x, at
    periods ``theta ** (4i / head_dim)``, laid out for ``rotate_half`` (HF ``DINOv3ViTRopePositionEmbedding``).
    """
    gh, gw = grid
    inv_freq = 1 / theta ** torch.arange(0, 1, 4 / head_dim, dtype=torch.float32, device=device)  # (hd/4,)
    ys = torch.arange(0.5, gh, dtype=torch.float32, device=device) / gh
    xs = torch.arange(0.5, gw, dtype=torch.float32, device=device) / gw
    coords = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).flatten(0, 1)  # (gh*gw, 2), row-major
    coords = 2.0 * coords - 1.0
    angles = (2 * math.pi * coords[:, :, None] * inv_freq[None, None, :]).flatten(1, 2)  # (gh*gw, hd/2)
    angles = angles.tile(2)  # (gh*gw, hd)
    return torch.cos(angles), torch.sin(angles)


def eva_rope(grid: tuple[int, int], head_dim: int, theta: float, ref_grid: int = 0,
             device: torch.device | None = None, pe: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """EVA-02's axial rotary embedding (timm ``RotaryEmbeddingCat``, ``in_pixels=False``): ``(cos, sin)``, each
    ``(gh*gw, head_dim)``, for interleaved channel pairs. Coordinates are patch indices, rescaled to ``ref_grid``
    patches per side when given (timm's ``ref_feat_shape``); frequencies ``theta ** -(i / (head_dim / 4))``.
    ``pe``: Perception Encoder's variant (timm ``rope_grid_offset=1``, ``rope_grid_indexing='xy'``): indices
    counted from 1, and the x bands before the y bands."""
    gh, gw = grid
    n = head_dim // 4
    bands = 1.0 / (theta ** (torch.arange(0, n, 1, dtype=torch.int64).to(torch.float32) / n))  # (hd/4,)
    offset = 1.0 if pe else 0.0
    ys = torch.arange(gh, dtype=torch.int64).to(torch.float32) + offset
    xs = torch.arange(gw, dtype=torch.int64).to(torch.float32) + offset
    if ref_grid:
        ys, xs = ys / gh * ref_grid, xs / gw * ref_grid
    coords = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1)  # (gh, gw, 2): (y, x)
    if pe:
        coords = coords.flip(-1)  # (gh, gw, 2): (x, y), still row-major over the grid
    angles = (coords.unsqueeze(-1) * bands).flatten(-2).flatten(0, -2)  # (gh*gw, hd/2): y bands, then x bands
    angles = angles.repeat_interleave(2, -1).to(device)  # (gh*gw, hd): each angle for a channel pair
    return torch.cos(angles), torch.sin(angles)


def qwen_rope(grid: tuple[int, int], head_dim: int, theta: float, device: torch.device | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen-VL's vision rotary embedding (HF ``Qwen2_5_VLVisionRotaryEmbedding``): ``(cos, sin)``, each
    ``(gh*gw, head_dim)`` row-major over the grid. Coordinates are patch indices; a quarter of the channels turn with
    y, a quarter with x, at frequencies ``theta ** -(4i / head_dim)``, laid out ``[y | x | y | x]`` for
    ``rotate_half``."""
    gh, gw = grid
    half = head_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, half, 2, dtype=torch.float) / half))  # (hd/4,), as HF forms it
    ys = torch.arange(gh).repeat_interleave(gw).float()  # (gh*gw,): each patch's row, row-major
    xs = torch.arange(gw).repeat(gh).float()
    angles = torch.cat([ys[:, None] * inv_freq, xs[:, None] * inv_freq], dim=-1).tile(2).to(device)  # (gh*gw, hd)
    return torch.cos(angles), torch.sin(angles)


def vjepa2_rope(tokens: int, side: int, head_dim: int, theta: float, device: torch.device | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """V-JEPA 2's rotary embedding (HF ``VJEPA2RopeAttention``) for ``tokens`` time-major tubelets: ``(cos, sin)``,
    each ``(tokens, head_dim)``, for interleaved channel pairs (``apply_rope(..., interleaved=True)``).

    A token's (time, row, col) is read off its index on the model's own square grid of ``side`` patches (HF's
    ``crop_size // patch_size``), whatever the frames' real grid: HF numbers them so, and so do we. The head's
    channels are three segments of ``2 * (head_dim // 3 // 2)`` (time, rows, columns), each turned as HF's
    ``rotate_queries_or_keys`` does: frequencies ``theta ** -(i / (seg / 2))`` *tiled* over the segment (not
    repeated per pair), so a pair's two channels may turn at two rates; channels past the three stay as they are
    (cos 1, sin 0). Computed in float32 as HF does for float32 q and k."""
    seg = 2 * (head_dim // 3 // 2)
    ids = torch.arange(tokens, device=device)  # int64, as HF's
    per_frame = side * side
    frame = ids // per_frame
    row = (ids - per_frame * frame) // side
    col = ids - per_frame * frame - side * row
    omega = torch.arange(seg // 2, dtype=torch.float32, device=device)
    omega /= seg / 2.0
    omega = 1.0 / theta ** omega  # (seg/2,)
    cos, sin = [], []
    for pos in (frame, row, col):
        freq = (pos[:, None] * omega).repeat(1, 2)  # (tokens, seg): [f | f], HF's .repeat(1, 1, 1, 2)
        cos.append(freq.cos())
        sin.append(freq.sin())
    rest = head_dim - 3 * seg
    cos.append(torch.ones(tokens, rest, device=device))
    sin.append(torch.zeros(tokens, rest, device=device))
    return torch.cat(cos, dim=1), torch.cat(sin, dim=1)


def sincos_positions(grid: tuple[int, int], dim: int, device: torch.device | None = None) -> torch.Tensor:
    """AIMv2-native's 2D sine-cosine positions ``(gh*gw, dim)``, laid out ``[sin x | cos x | sin y | cos y]`` at
    periods ``10000 ** (i / (dim / 4))`` (HF ``build_2d_sinusoidal_position_embedding`` with its halves swapped, as
    AIMv2 was trained), computed in float64 as HF does."""
    gh, gw = grid
    n = dim // 4
    omega = 1.0 / 10000.0 ** (torch.arange(n, dtype=torch.float64) / n)  # (dim/4,)
    ys, xs = torch.meshgrid(torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64),
                            indexing="ij")  # (gh, gw) each, row-major
    y, x = ys.flatten().outer(omega), xs.flatten().outer(omega)  # (gh*gw, dim/4) each
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1).to(device=device, dtype=torch.float32)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """[x0, x1, x2, x3, ...] -> [-x1, x0, -x3, x2, ...] (interleaved rotation, EVA-02)."""
    return torch.stack([-x[..., 1::2], x[..., ::2]], -1).reshape(x.shape)


def apply_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], interleaved: bool = False) -> torch.Tensor:
    """Rotate the last ``n`` tokens of ``x`` (B, nh, T, hd) by ``rope``'s ``(n, hd)`` tables, or by ``(B, n, hd)``
    ones, each batch row its own (the windows of a windowed layer, each with its tokens' positions); the prefix
    tokens (CLS, registers) stay as they are."""
    cos, sin = rope
    n = cos.shape[-2]
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, n, hd)
    prefix, patches = x[:, :, :-n], x[:, :, -n:]  # (B, nh, P, hd), (B, nh, gh*gw, hd)
    turned = rotate_pairs(patches) if interleaved else rotate_half(patches)
    patches = patches * cos.to(x.dtype) + turned * sin.to(x.dtype)
    return torch.cat([prefix, patches], dim=2)




def sinusoid_table(tokens: int, dim: int, device: torch.device | None = None) -> torch.Tensor:
    """VideoMAE's fixed positions (HF ``get_sinusoid_encoding_table``, from "Attention is all you need"): ``(tokens,
    dim)`` over the token index, ``pos / 10000 ** (2 * (j // 2) / dim)``, sine on even channels, cosine on odd ones;
    computed in float64 as HF does with numpy, then float32."""
    j = torch.arange(dim, dtype=torch.float64)
    angles = torch.arange(tokens, dtype=torch.float64)[:, None] / torch.pow(10000.0, 2 * (j // 2) / dim)  # (N, dim)
    table = torch.where(j.long() % 2 == 0, angles.sin(), angles.cos())
    return table.to(device=device, dtype=torch.float32)
