"""Tiles whose canvas a processor's own code chooses and its outputs do not state (issue 113), placed by reading that
code's choice, not by the model's name: one table of layouts (``CANVASES``) keyed by what each needs, a setting of
the image processor, of the config, or a part of the model:

- ``vision_input_type`` (Perception LM's image processor, "thumb+tile"): the whole image resized to one tile first
  (the thumbnail, the overview), then the image resized to the canvas of tiles its ``_fit_image_to_canvas`` (else
  ``_find_closest_aspect_ratio``) chooses, cut row-major; each view's tokens pooled ``unit x unit`` row-major.
- ``image_grid_pinpoints`` (a LLaVA-NeXT-like anyres canvas whose model downsamples each tile: Granite 4 Vision's
  ``downsample_rate``): the base image's token grid, then the canvas of crops ``get_anyres_image_grid_shape`` chose,
  unpadded at the tokens' grid by ``unpad_image`` (the model module's own functions), a newline token after each row.
- ``view_separator`` (Unlimited-OCR's views): the local crops' canvas (``patches_grid``), then the global view, each
  row of tokens closed by a newline token, then one separator; a token is one step of the tower's strided patch
  embedding and the downsampling convolutions after it (``token_stride``).

And what no layout can place: image tokens that are a tower's learned queries (``tower_queries``: DeepSeek-OCR 2's
second tower reads its patches through queries of its own, which cover no patch).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from fractions import Fraction

import torch
from PIL import Image

from vit.explain.language.vlm_layouts import ImageLayout, _canvas, seen_pixels, tile_index


def _whole_unit(declared: int, grid: tuple[int, int], views: int, count: int) -> int | None:
    """The patches per token along a side (``declared``, else each whole number to 16) whose units over ``views``
    views of ``grid`` give ``count`` tokens; None when none does."""
    for unit in ([declared] if declared else range(1, 17)):
        if grid[0] % unit == 0 and grid[1] % unit == 0 and views * (grid[0] // unit) * (grid[1] // unit) == count:
            return unit
    return None


def _perception_canvas(images, image: Image.Image) -> tuple[int, int] | None:
    """The rows and columns of tiles a "thumb+tile" image processor cuts ``image`` into, as its own code chooses them
    (``_fit_image_to_canvas``, else ``_find_closest_aspect_ratio``: (columns, rows)); None where it has no such code."""
    fit, closest = (getattr(images, name, None) for name in ("_fit_image_to_canvas", "_find_closest_aspect_ratio"))
    tile = getattr(images, "tile_size", None)
    if not (callable(fit) and callable(closest) and isinstance(tile, int)):
        return None
    if int(getattr(images, "max_num_tiles", 1) or 1) <= 1:
        return 1, 1
    chosen = fit(img_width=image.width, img_height=image.height, tile_size=tile)
    cols, rows = chosen if chosen is not None else closest(img_width=image.width, img_height=image.height,
                                                           tile_size=tile)
    return int(rows), int(cols)


def _thumbnail_then_tiles(vlm, inputs, images: Sequence[Image.Image], positions: torch.Tensor):
    """Perception LM's "thumb+tile" (``PerceptionLMImageProcessor``): each image's views in ``pixel_values`` (images,
    views, C, h, w), the thumbnail (the whole image resized to one tile) first, then the tiles of its canvas
    row-major (``_split``); the projector pools each view's patches ``unit x unit`` (``projector_pooling_ratio``,
    an adaptive average pool over whole units), the views' tokens one after another. ``(layouts, reason)``."""
    processor = vlm.processor.image_processor
    if getattr(processor, "vision_input_type", None) != "thumb+tile":
        return None, "its image processor reads each image in one view"
    pixels = inputs.get("pixel_values")
    if not isinstance(pixels, torch.Tensor) or pixels.dim() != 5 or pixels.shape[0] != len(images):
        return None, f"the processor gave no (images, views, C, H, W) pixel_values for {len(images)} image(s)"
    canvases = [_perception_canvas(processor, image) for image in images]
    if None in canvases or any(rows * cols + 1 != pixels.shape[1] for rows, cols in canvases):
        return None, (f"the processor gave {pixels.shape[1]} views an image, not a thumbnail and the tiles its "
                      "image processor's canvas holds")
    ph, pw = vlm.patch_hw
    grid = (pixels.shape[-2] // ph, pixels.shape[-1] // pw)
    views = pixels.shape[1]
    pooling = getattr(vlm.model.config, "projector_pooling_ratio", None)
    unit = _whole_unit(vlm.unit or (pooling if isinstance(pooling, int) else 0), grid, views * len(images),
                       len(positions))
    if unit is None:
        return None, (f"{len(positions)} image tokens are not whole pooled units over {len(images)} x {views} views "
                      f"of {grid[0]}x{grid[1]} patches")
    per_view = (grid[0] // unit) * (grid[1] // unit)
    layouts = []
    for k, (rows, cols) in enumerate(canvases):
        at = positions[k * views * per_view:(k + 1) * views * per_view]
        seen = seen_pixels(vlm, pixels[k])
        overview = ImageLayout(at, grid, unit, 0, tile_index(1, 1, grid, unit), pixels=seen[0])
        layouts.append(ImageLayout(at, (rows * grid[0], cols * grid[1]), unit, 0,
                                   tile_index(rows, cols, grid, unit, per_view), views, grid, overview,
                                   _canvas(seen[1:], rows, cols)))
    return tuple(layouts), ""


def _pinpoint_canvas(vlm, inputs, images: Sequence[Image.Image], positions: torch.Tensor):
    """An anyres image (``pack_image_features`` of LLaVA-NeXT's kin, here Granite 4 Vision's): the base image first,
    its ``side x side`` patches downsampled to ``t x t`` tokens (``downsample_rate``: Granite's window Q-Former's
    queries each start from the area mean of its ``unit x unit`` patches and read its window; its spatial groups
    take one patch of each unit), then the canvas of crops ``get_anyres_image_grid_shape`` chose, each crop's
    ``t x t`` tokens laid on the canvas, the rows and columns ``unpad_image`` keeps at the tokens' grid, each kept
    row followed by a newline token. The model module's own functions choose the canvas. ``(layouts, reason)``."""
    config = vlm.model.config
    module = importlib.import_module(type(vlm.model).__module__)
    shape_of, unpad = (getattr(module, name, None) for name in ("get_anyres_image_grid_shape", "unpad_image"))
    pixels, sizes = inputs.get("pixel_values"), inputs.get("image_sizes")
    if not (callable(shape_of) and callable(unpad)) or not isinstance(sizes, torch.Tensor):
        return None, "its model's code has no anyres canvas (get_anyres_image_grid_shape, unpad_image) to read"
    if not isinstance(pixels, torch.Tensor) or pixels.dim() != 5 or not pixels.shape[0] == len(sizes) == len(images):
        return None, f"the processor gave no (images, views, C, H, W) pixel_values for {len(images)} image(s)"
    if getattr(config, "vision_feature_select_strategy", "default") != "default":
        return None, "its tower's CLS stays in every crop (the \"full\" strategy), whose place no canvas states"
    vision = config.vision_config
    side = int(vision.image_size) // int(vision.patch_size)  # a crop's patches along a side
    rate = Fraction(str(getattr(config, "downsample_rate", None) or 1))
    if rate <= 0 or (1 / rate).denominator != 1 or side % int(1 / rate):
        return None, f"its downsample_rate {rate} keeps no whole number of patches a token"
    unit = int(1 / rate)
    t = side // unit  # a crop's tokens along a side
    layouts, start = [], 0
    for k in range(len(images)):
        rows, cols = (int(v) for v in shape_of(sizes[k], config.image_grid_pinpoints, int(vision.image_size)))
        kept_rows = unpad(torch.arange(rows * t).view(1, -1, 1).expand(1, -1, cols * t), sizes[k])[0, :, 0]
        kept_cols = unpad(torch.arange(cols * t).view(1, 1, -1).expand(1, rows * t, -1), sizes[k])[0, 0, :]
        high, wide = len(kept_rows), len(kept_cols)
        count = t * t + high * (wide + 1)
        at = positions[start:start + count]
        if len(at) != count or rows * cols + 1 > pixels.shape[1]:
            return None, (f"{len(positions)} image tokens are not a {t}x{t}-token base image and a "
                          f"{high}x{wide}-token canvas of {rows}x{cols} crops with a newline per row, image after "
                          "image")
        r = torch.arange(high * unit)[:, None] // unit  # (H, 1) the kept canvas's patch rows' token rows
        c = torch.arange(wide * unit)[None, :] // unit
        index = t * t + r * (wide + 1) + c  # (H, W) past the base image, each row's newline after it
        seen = seen_pixels(vlm, pixels[k, :rows * cols + 1])
        ph, pw = vlm.patch_hw
        top, left = int(kept_rows[0]) * unit * ph, int(kept_cols[0]) * unit * pw
        drawn = _canvas(seen[1:], rows, cols)[top:top + high * unit * ph, left:left + wide * unit * pw]
        overview = ImageLayout(at, (side, side), unit, 0, tile_index(1, 1, (side, side), unit), pixels=seen[0])
        layouts.append(ImageLayout(at, (high * unit, wide * unit), unit, 0, index, rows * cols + 1, (side, side),
                                   overview, drawn))
        start += count
    if start != len(positions):
        return None, f"{len(positions)} image tokens, not the {start} of these images' base images and canvases"
    return tuple(layouts), ""


def _vision_tower(vlm) -> torch.nn.Module | None:
    """The module transformers built from the vision config (its ``config`` is the model's ``vision_config``)."""
    vision = getattr(vlm.model.config, "vision_config", None)
    return next((m for m in vlm.model.modules() if vision is not None and getattr(m, "config", None) is vision), None)


def token_stride(vlm) -> int | None:
    """Pixels one step of a tower of towers' image tokens spans: its first tower's strided patch embedding (a
    convolution whose kernel is its stride) times the strides of the convolutions after it in that tower (SAM's
    neck and its two stride-2 downsampling convolutions in Unlimited-OCR), where the second tower keeps one token per
    step (its patch embedding takes those features as they are); None where the tower holds no such embedding."""
    tower = _vision_tower(vlm)
    if tower is None:
        return None
    for part in tower.children():
        convolutions = [m for m in part.modules() if isinstance(m, torch.nn.Conv2d)]
        if not convolutions:
            continue
        first = convolutions[0]
        if tuple(first.kernel_size) != tuple(first.stride) or first.stride[0] != first.stride[1]:
            return None
        stride = 1
        for convolution in convolutions:
            if convolution.stride[0] != convolution.stride[1]:
                return None
            stride *= int(convolution.stride[0])
        return stride
    return None


def tower_queries(vlm) -> str | None:
    """What the image tokens are where the vision tower reads its patches through learned queries of its own (its
    ``query...`` embeddings: DeepSeek-OCR 2's second tower appends them after the patches and keeps only them), in
    words; None otherwise."""
    tower = _vision_tower(vlm)
    if tower is None:
        return None
    named = [(name, m.num_embeddings) for name, m in tower.named_children()
             if name.startswith("query") and isinstance(m, torch.nn.Embedding)]
    if not named:
        return None
    return ("its vision tower's learned queries over the patches (" + ", ".join(f"{name}: {n}" for name, n in named)
            + ")")


def _rows_then_separator(vlm, inputs, images: Sequence[Image.Image], positions: torch.Tensor):
    """Unlimited-OCR's views (``get_image_features``): each image's local crops' canvas (``patches_grid`` (columns,
    rows) of ``num_local_patches`` crops, ``pixel_values_local`` row-major, the canvas's rows of tokens each closed by
    the newline token), then its global view (``pixel_values``, its rows closed the same way, the overview where
    there are crops), then the view separator; a token is one step of ``token_stride`` pixels. ``(layouts,
    reason)``."""
    stride = token_stride(vlm)
    if not stride:
        return None, "no strided patch embedding in its vision tower to place its tokens by"
    pixels = inputs.get("pixel_values")
    if not isinstance(pixels, torch.Tensor) or pixels.dim() != 4 or pixels.shape[0] != len(images):
        return None, f"the processor gave no (images, C, H, W) pixel_values for {len(images)} image(s)"
    counts = [int(n) for n in torch.as_tensor(inputs.get("num_local_patches", [0] * len(images))).flatten()]
    grids = inputs.get("patches_grid") or [[1, 1]] * len(images)
    local = inputs.get("pixel_values_local")
    side = (pixels.shape[-2] // stride, pixels.shape[-1] // stride)
    whole = side[0] * (side[1] + 1)  # the global view's rows, each closed by a newline
    layouts, start, crop = [], 0, 0
    for k in range(len(images)):
        n = counts[k] if k < len(counts) else 0
        cols, rows = (int(v) for v in grids[k])
        if n and (not isinstance(local, torch.Tensor) or rows * cols != n):
            return None, f"the processor gave {n} local crops beside a {rows}x{cols} patches_grid"
        tile = (local.shape[-2] // stride, local.shape[-1] // stride) if n else (0, 0)
        high, wide = rows * tile[0], cols * tile[1]
        canvas = high * (wide + 1) if n else 0
        at = positions[start:start + canvas + whole + 1]
        if len(at) != canvas + whole + 1:
            return None, (f"{len(positions)} image tokens are not {'a canvas of crops and ' if n else ''}a "
                          f"{side[0]}x{side[1]}-token view of {stride}-px steps with a newline per row and a separator")
        r, c = torch.arange(side[0])[:, None], torch.arange(side[1])[None, :]
        global_index = canvas + r * (side[1] + 1) + c
        seen = seen_pixels(vlm, pixels[k:k + 1])[0]
        overview = ImageLayout(at, side, 1, 0, global_index, pixels=seen)
        if n:
            r, c = torch.arange(high)[:, None], torch.arange(wide)[None, :]
            crops = seen_pixels(vlm, local[crop:crop + n])
            layouts.append(ImageLayout(at, (high, wide), 1, 0, r * (wide + 1) + c, n + 1, tile, overview,
                                       _canvas(crops, rows, cols), (n + 1, (tile[0] * stride // _first_patch(vlm),
                                                                            tile[1] * stride // _first_patch(vlm)))))
        else:
            tower = (side[0] * stride // _first_patch(vlm), side[1] * stride // _first_patch(vlm))
            layouts.append(ImageLayout(at, side, 1, 0, global_index, pixels=seen, tower_passes=(1, tower)))
        start, crop = start + len(at), crop + n
    if start != len(positions):
        return None, f"{len(positions)} image tokens, not the {start} of these images' views"
    return tuple(layouts), ""


def _first_patch(vlm) -> int:
    """The first tower's patch in pixels (its patch embedding's stride), which its attention runs over."""
    tower = _vision_tower(vlm)
    first = next(m for m in tower.modules() if isinstance(m, torch.nn.Conv2d))
    return int(first.stride[0])


def _stated(vlm, name: str) -> bool:
    """Whether the image processor, the config or the model (its inner model) holds ``name``."""
    inner = getattr(vlm.model, "model", vlm.model)
    return any(getattr(part, name, None) is not None
               for part in (vlm.processor.image_processor, vlm.model.config, inner))


# The canvases a processor's code chooses and its outputs do not state: the layout that reads each, keyed by what it
# needs (a setting of the image processor or the config, a part of the model), tried in this order
CANVASES = {
    "vision_input_type": _thumbnail_then_tiles,
    "image_grid_pinpoints": _pinpoint_canvas,
    "view_separator": _rows_then_separator,
}


def canvas_layouts(vlm, inputs, images: Sequence[Image.Image],
                   positions: torch.Tensor) -> tuple[tuple[ImageLayout, ...] | None, str]:
    """``(layouts, reason)``: ``images`` placed by the first of ``CANVASES`` whose key the model states, or None and
    why not (empty where none applies)."""
    for name, layout in CANVASES.items():
        if _stated(vlm, name):
            return layout(vlm, inputs, images, positions)
    return None, ""
