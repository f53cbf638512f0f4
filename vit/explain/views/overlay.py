"""Rendering attention maps over images: upsampling, colour maps (a signed map's diverging one), blending, patch
geometry, downloads, and the size an image is shown at.

Geometry: the model sees the image resized to a square, so its ``gh x gw`` patch grid
stretches over the whole original image whatever its aspect ratio. Patch column ``c``
covers ``[c * W / gw, (c + 1) * W / gw)`` in continuous pixel coordinates, and pixel ``x``
(its centre at ``x + 0.5``) belongs to the cell holding its centre. ``upsample``,
``patch_at`` and ``patch_box`` all use this rule, so clicks, outlines and heat maps agree.

Sizes follow each library's habit and are named in the signatures: ``upsample`` takes
``(height, width)`` like torch; ``patch_at`` and ``patch_box`` take ``(width, height)`` like PIL.
"""

from __future__ import annotations

import base64
import io
import math
import os
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

from vit import registry
from vit.core.images import to_mode
from vit.core.runfiles import atomic_write_bytes

UPSAMPLE_MODES = ("nearest", "bilinear")


def _as_map(map2d) -> np.ndarray:
    if isinstance(map2d, torch.Tensor):
        map2d = map2d.detach().cpu().float().numpy()
    array = np.asarray(map2d, dtype=np.float32)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"expected a 2-D (grid height, grid width) map, got shape {array.shape}")
    return array


def _cell_of_pixels(pixels: int, cells: int) -> np.ndarray:
    """The cell of every pixel centre along one axis, in exact integer arithmetic: ``(pixels,)``."""
    return ((2 * np.arange(pixels) + 1) * cells) // (2 * pixels)


def _first_pixel(cell: int, pixels: int, cells: int) -> int:
    """The first pixel whose centre lies in ``cell``: ceil(cell * pixels / cells - 0.5)."""
    return -((cells - 2 * cell * pixels) // (2 * cells))


def upsample(map2d, size: tuple[int, int], mode: str = "bilinear") -> np.ndarray:
    """A ``(gh, gw)`` map (array or tensor) stretched to ``size = (height, width)``: float32 ``(H, W)``.

    ``nearest`` gives flat blocks, one per patch, with borders where ``patch_box`` puts them;
    ``bilinear`` interpolates between patch centres (``align_corners=False``), so each patch's
    value sits at the centre of its cell for any aspect ratio.
    """
    array = _as_map(map2d)
    height, width = size
    if height <= 0 or width <= 0:
        raise ValueError(f"size must be a positive (height, width), got {tuple(size)}")
    if mode == "nearest":
        rows = _cell_of_pixels(height, array.shape[0])  # (H,)
        cols = _cell_of_pixels(width, array.shape[1])  # (W,)
        return np.ascontiguousarray(array[rows[:, None], cols[None, :]])  # (H, W)
    if mode == "bilinear":
        grid = torch.from_numpy(array)[None, None]  # (1, 1, gh, gw)
        resized = F.interpolate(grid, size=(height, width), mode="bilinear", align_corners=False)
        return resized[0, 0].numpy()  # (H, W)
    raise ValueError(f"unknown upsampling mode {mode!r}; choose one of: {', '.join(UPSAMPLE_MODES)}")


def colorize(values: np.ndarray, colormap: str = "inferno", vmin: float | None = None,
             vmax: float | None = None) -> np.ndarray:
    """Values ``(H, W)`` -> uint8 RGB ``(H, W, 3)`` through a matplotlib colour map.

    Values are scaled to [0, 1] between ``vmin`` and ``vmax`` (default: their own min and
    max, ignoring NaN) and clipped; a constant map gets the colour map's low end.
    """
    try:
        cmap = matplotlib.colormaps[colormap]
    except KeyError:
        raise ValueError(f"unknown colour map {colormap!r}; use a matplotlib name such as inferno, "
                         "viridis, magma, jet or Reds") from None
    values = np.asarray(values, dtype=np.float64)
    finite = values[np.isfinite(values)]
    low = float(vmin) if vmin is not None else (float(finite.min()) if finite.size else 0.0)
    high = float(vmax) if vmax is not None else (float(finite.max()) if finite.size else 1.0)
    span = high - low
    scaled = np.clip((values - low) / span, 0.0, 1.0) if span > 0 else np.zeros_like(values)
    return cmap(scaled, bytes=True)[..., :3]  # (H, W, 3); drop alpha


def patch_at(x: float, y: float, image_size: tuple[int, int], grid: tuple[int, int]) -> int:
    """The row-major patch index under pixel ``(x, y)`` of an image of ``image_size = (width, height)``.

    Positions outside the image are clamped to its border.
    """
    width, height = image_size
    gh, gw = grid
    col_px = min(max(int(np.floor(x)), 0), width - 1)
    row_px = min(max(int(np.floor(y)), 0), height - 1)
    col = ((2 * col_px + 1) * gw) // (2 * width)
    row = ((2 * row_px + 1) * gh) // (2 * height)
    return row * gw + col


def patch_box(patch: int, image_size: tuple[int, int], grid: tuple[int, int]) -> tuple[int, int, int, int]:
    """Pixel rectangle ``(left, top, right, bottom)`` of a patch, right and bottom exclusive (PIL's crop box)."""
    width, height = image_size
    gh, gw = grid
    if not 0 <= patch < gh * gw:
        raise ValueError(f"patch {patch} is out of range for a {gh}x{gw} grid ({gh * gw} patches)")
    row, col = divmod(patch, gw)
    return (_first_pixel(col, width, gw), _first_pixel(row, height, gh),
            _first_pixel(col + 1, width, gw), _first_pixel(row + 1, height, gh))


def overlay(image: Image.Image, map2d, opacity: float = 0.5, colormap: str = "inferno", mode: str = "bilinear",
            show_grid: bool = False, grid_color: tuple[int, int, int] = (255, 255, 255),
            outline_patch: int | None = None, outline_color: tuple[int, int, int] = (0, 255, 255),
            vmin: float | None = None, vmax: float | None = None, grid: tuple[int, int] | None = None
            ) -> Image.Image:
    """Blend a coloured ``(gh, gw)`` map over ``image`` at the image's own size; RGB result.

    ``opacity`` 0 gives the image back, 1 the colour map alone. Colours span ``vmin`` to
    ``vmax`` (default the map's own min and max). ``show_grid`` draws the patch borders;
    ``outline_patch`` (a row-major patch index, not a token index) outlines one patch. ``grid``: the patch grid
    when ``map2d`` is finer (a pixel method's ``(H, W)`` map on the model's input pixels, drawn at its own
    resolution); default the map's shape.
    """
    if not 0.0 <= opacity <= 1.0:
        raise ValueError(f"opacity must be in [0, 1], got {opacity}")
    values = _as_map(map2d)
    image = to_mode(image, 3)
    width, height = image.size
    grid = values.shape if grid is None else tuple(grid)
    base = np.asarray(image, dtype=np.float32)  # (H, W, 3)
    heat = colorize(upsample(values, (height, width), mode), colormap, vmin, vmax).astype(np.float32)  # (H, W, 3)
    blended = np.clip(np.rint((1.0 - opacity) * base + opacity * heat), 0, 255).astype(np.uint8)
    result = Image.fromarray(blended, "RGB")
    if show_grid or outline_patch is not None:
        draw = ImageDraw.Draw(result)
        if show_grid:
            for col in range(1, grid[1]):
                x = _first_pixel(col, width, grid[1])
                draw.line([(x, 0), (x, height - 1)], fill=tuple(grid_color), width=1)
            for row in range(1, grid[0]):
                y = _first_pixel(row, height, grid[0])
                draw.line([(0, y), (width - 1, y)], fill=tuple(grid_color), width=1)
        if outline_patch is not None:
            left, top, right, bottom = patch_box(outline_patch, (width, height), grid)
            line = max(1, min(width, height) // 150)  # visible on large photos, thin on 32 px ones
            # max(): a grid finer than the image leaves some patches without a pixel of their own.
            draw.rectangle([left, top, max(left, right - 1), max(top, bottom - 1)], outline=tuple(outline_color),
                           width=line)
    return result


def draw_mask_contours(image: Image.Image, mask: np.ndarray, color: tuple[int, int, int] = (255, 255, 255),
                       width: int | None = None) -> Image.Image:
    """Outline the region of a boolean ``(gh, gw)`` patch mask over ``image`` (a copy): a line wherever a
    kept patch borders a dropped one or the image edge, on the patch borders ``patch_box`` uses."""
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim != 2:
        raise ValueError(f"expected a 2-D (grid height, grid width) mask, got shape {mask.shape}")
    result = to_mode(image, 3).copy()
    W, H = result.size
    gh, gw = mask.shape
    line = width or max(1, min(W, H) // 160)
    xs = [_first_pixel(c, W, gw) for c in range(gw + 1)]
    ys = [_first_pixel(r, H, gh) for r in range(gh + 1)]
    padded = np.pad(mask, 1)  # (gh + 2, gw + 2), False outside
    vertical = padded[1:-1, 1:] != padded[1:-1, :-1]  # (gh, gw + 1): a border left of column c
    horizontal = padded[1:, 1:-1] != padded[:-1, 1:-1]  # (gh + 1, gw): a border above row r
    draw = ImageDraw.Draw(result)
    for r, c in zip(*np.nonzero(vertical), strict=True):
        x = min(xs[c], W - 1)
        draw.line([(x, ys[r]), (x, max(ys[r], ys[r + 1] - 1))], fill=tuple(color), width=line)
    for r, c in zip(*np.nonzero(horizontal), strict=True):
        y = min(ys[r], H - 1)
        draw.line([(xs[c], y), (max(xs[c], xs[c + 1] - 1), y)], fill=tuple(color), width=line)
    return result


def to_png_bytes(image: Image.Image) -> bytes:
    """The image encoded as PNG, for downloads."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def write_png(path: str | os.PathLike, image: Image.Image) -> Path:
    """``image`` as a PNG file at ``path``, written atomically: a kill mid-write leaves the earlier file whole."""
    path = Path(path)
    atomic_write_bytes(path, to_png_bytes(image))
    return path


def attentions_npz_bytes(attentions: Sequence[torch.Tensor | np.ndarray], **extra_arrays) -> bytes:
    """An ``.npz`` archive with ``layer_0`` .. ``layer_{L-1}`` (float32, ``(H, T, T)`` or ``(B, H, T, T)``) and extras.

    Extras (e.g. ``image=...``, ``logits=...``) are stored under their keyword names.
    """
    arrays: dict[str, np.ndarray] = {}
    for i, attn in enumerate(attentions):
        if isinstance(attn, torch.Tensor):
            attn = attn.detach().cpu().float().numpy()
        attn = np.asarray(attn, dtype=np.float32)
        if attn.ndim not in (3, 4) or attn.shape[-1] != attn.shape[-2]:
            raise ValueError(f"layer {i}: expected attention of shape ([batch,] heads, tokens, tokens), "
                             f"got {attn.shape}")
        arrays[f"layer_{i}"] = attn
    clashes = sorted(set(arrays) & set(extra_arrays))
    if clashes:
        raise ValueError(f"extra array name(s) {', '.join(clashes)} clash with the layer arrays; rename them")
    for name, value in extra_arrays.items():
        arrays[name] = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def npz_array_bytes(shape: Sequence[int], dtype: np.dtype | str) -> int:
    """Bytes one array takes in an uncompressed ``.npz`` (its data; the header and zip entry add under 200)."""
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def write_npz_streamed(path: str | os.PathLike, streamed: Iterable[tuple[str, tuple[int, ...], np.dtype,
                                                                        Iterable[np.ndarray]]],
                       **arrays: np.ndarray) -> None:
    """Write an uncompressed ``.npz`` that ``np.load`` reads, one array at a time: each of ``streamed`` is
    ``(name, shape, dtype, pieces)`` whose pieces, concatenated in C order, are the array, so no whole array is
    ever held; ``arrays`` are written whole after them. The file appears only once complete
    (``vit.core.runfiles.unnamed_until_done``), so a crash, ^C or kill leaves no half file."""
    from vit.core.runfiles import unnamed_until_done

    path = Path(path)
    with unnamed_until_done(path) as file, \
            zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, shape, dtype, pieces in streamed:
            dtype = np.dtype(dtype)
            with archive.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array_header_2_0(
                    f, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                        "shape": tuple(shape)})
                written = 0
                for piece in pieces:
                    piece = np.ascontiguousarray(piece, dtype=dtype)
                    f.write(piece.data)
                    written += piece.size
                if written != int(np.prod(shape, dtype=np.int64)):
                    raise ValueError(f"{name}: {written} values written for shape {tuple(shape)}")
        for name, value in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(value), allow_pickle=False)


def pca_picture(seen: Image.Image, colours: np.ndarray, opacity: float = 1.0) -> Image.Image:
    """The ``(gh, gw, 3)`` colours as flat patches over ``seen`` (the pixels the model saw) at its size; ``opacity``
    1 shows the colours alone."""
    if not 0.0 <= opacity <= 1.0:
        raise ValueError(f"opacity must be in [0, 1], got {opacity}")
    base = np.asarray(to_mode(seen, 3), dtype=np.float32)  # (H, W, 3)
    size = base.shape[:2]
    heat = np.stack([upsample(colours[..., c], size, "nearest") for c in range(3)], axis=-1) * 255.0  # (H, W, 3)
    return Image.fromarray(np.clip(np.rint((1 - opacity) * base + opacity * heat), 0, 255).astype(np.uint8), "RGB")


# negative = evidence against the class: a diverging colour map around 0 (the registry's signed maps; a plugin's too)
SIGNED_MAP_KINDS = tuple(m.name for m in registry.BUILTIN_METHODS if m.signed)


DIVERGING_COLORMAP = "RdBu_r"  # blue negative, white 0, red positive; matplotlib and Plotly both know it


def is_signed(kind: str) -> bool:
    """Whether map ``kind`` is signed (``SIGNED_MAP_KINDS``, or a plugin's signed method)."""
    method = registry.find_method(kind) if kind else None
    return method is not None and method.signed


def map_colours(kind: str, map2d: np.ndarray, colormap: str) -> tuple[str, float | None, float | None]:
    """``(colour map, vmin, vmax)`` for the overlay: signed maps get a diverging map symmetric around 0."""
    if is_signed(kind):
        bound = float(np.abs(map2d).max()) or 1.0
        return DIVERGING_COLORMAP, -bound, bound
    return colormap, None, None


def display_size(size: tuple[int, int], min_side: int = 320, max_side: int = 640) -> tuple[int, int]:
    """(width, height) to show an image at: small images grow by a whole factor (crisp pixels), large ones shrink."""
    width, height = size
    longest = max(width, height)
    if longest < min_side:
        factor = math.ceil(min_side / longest)
        return width * factor, height * factor
    if longest > max_side:
        scale = max_side / longest
        return max(1, round(width * scale)), max(1, round(height * scale))
    return width, height


def display_image(image: Image.Image, min_side: int = 320, max_side: int = 640) -> Image.Image:
    """The image in RGB at ``display_size``: nearest-neighbour when enlarged, Lanczos when reduced."""
    image = to_mode(image, 3)
    size = display_size(image.size, min_side, max_side)
    if size == image.size:
        return image
    method = Image.Resampling.NEAREST if size[0] > image.size[0] else Image.Resampling.LANCZOS
    return image.resize(size, method)


def jpeg_data_uri(image: Image.Image, quality: int = 90) -> str:
    """A ``data:`` URI in JPEG: ~30x faster to encode than PNG at its default level, for images redrawn often."""
    buffer = io.BytesIO()
    to_mode(image, 3).save(buffer, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
