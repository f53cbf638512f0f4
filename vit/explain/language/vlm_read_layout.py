"""Where a model type no layout here names puts its image tokens (issue 113), read from what its processor gives and
its config declares, never from its name: the image token's positions in ``input_ids`` (its id from the config or
the processor), each image's patch grid (``image_grid_thw``; ``image_sizes`` of images kept at their own size; else
the one view's pixel tensor over the tower's patch), and the patches each token covers: the merge unit its config
declares (``any_vlm.merge_unit``), else the one whole number of patches (and the one count of leading tokens that
cover none, 0 or 1) that gives the prompt's count of image tokens; the tokens then laid row-major over each image's
units, as every projector here hands them (a merger's ``spatial_merge_size`` blocks, a pixel shuffle's).

An encoder-decoder whose encoder reads the image alone, and a decoder whose cross-attention reads a tower's states,
have their own reading at the end of the module (``reads_tower_states``, ``encoder_layout``).

What this cannot place (several views of one image with no canvas the processor or config states, no patch size, a
count no unit gives) is laid out as one list over the image tokens with ``unplaced`` naming the missing piece: the
answer and each token's attention over the image tokens still come (``VLMAnswer.image_rows``), and a map on the image
is refused in that one line (``ImageLayout.place``).

Tiles whose canvas the processor's own code chooses and its outputs do not state are placed by reading that code's
choice, not by the model's name: one table of layouts (``CANVASES``) keyed by what each needs, a setting of the image
processor, of the config, or a part of the model:

- ``vision_input_type`` (Perception LM's image processor, "thumb+tile"): the whole image resized to one tile first
  (the thumbnail, the overview), then the image resized to the canvas of tiles its ``_fit_image_to_canvas`` (else
  ``_find_closest_aspect_ratio``) chooses, cut row-major; each view's tokens pooled ``unit x unit`` row-major.
- ``image_grid_pinpoints`` (a LLaVA-NeXT-like anyres canvas whose model downsamples each tile: Granite 4 Vision's
  ``downsample_rate``): the base image's token grid, then the canvas of crops ``get_anyres_image_grid_shape`` chose,
  unpadded at the tokens' grid by ``unpad_image`` (the model module's own functions), a newline token after each row.
- ``view_separator`` (Unlimited-OCR's views): the local crops' canvas (``patches_grid``), then the global view, each
  row of tokens closed by a newline token, then one separator; a token is one step of the tower's strided patch
  embedding and the downsampling convolutions after it (``token_stride``).

Image tokens that are a tower's learned queries (``tower_queries``: DeepSeek-OCR 2's second tower reads its patches
through queries of its own) cover no patch, and are not placed.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Sequence
from dataclasses import replace
from fractions import Fraction

import torch
from PIL import Image

from vit.explain.language.vlm_attention import image_positions, image_token_id
from vit.explain.language.vlm_layouts import (
    ImageLayout,
    _canvas,
    _one_view_pixels,
    _tiles_then_overview,
    one_view_grids,
    seen_pixels,
    tile_index,
)

MAX_UNIT = 16  # patches per token along a side tried from the counts: published mergers use 2 to 4


def _token_positions(vlm, inputs) -> torch.Tensor:
    """(K,) the image's tokens' positions in the prompt (``vlm_attention.image_positions``: the processor's mask of
    them, else the image placeholder's, its id from the model's config, else the processor's)."""
    marked = isinstance(inputs.get("image_embeds_position_mask"), torch.Tensor)
    if not marked and image_token_id(vlm.model.config) is None and getattr(vlm.processor, "image_token_id",
                                                                           None) is None:
        raise ValueError("neither its config nor its processor names an image token id; its image tokens cannot be "
                         "found in the prompt")
    return image_positions(vlm, inputs)


def unplaced(positions: torch.Tensor, reason: str) -> tuple[ImageLayout, ...]:
    """One list over the image tokens, not placed on the image, ``reason`` saying what is missing."""
    return (ImageLayout(positions, (1, len(positions)), 1, 0, unplaced=f"its image tokens are not placed on the "
                                                                       f"image: {reason}"),)


def _grids(vlm, inputs, n: int) -> tuple[list[tuple[int, int]] | None, str]:
    """``(grids, reason)``: each image's patch grid as the processor's outputs state it (``vlm_layouts
    .one_view_grids``, or a pixel tensor of one view per image behind a leading batch of one), or None and what
    lacks."""
    if vlm.tower.missing and "image_grid_thw" not in inputs:
        return None, vlm.tower.missing
    named = _named_grids(inputs, n)  # before the pixel tensor's sides: MiniCPM-V's is a strip of its patches
    if named is not None:
        return named
    try:
        grids = one_view_grids(vlm, inputs, n)
    except ValueError as e:
        return None, str(e)
    if grids is not None:
        return grids, ""
    pixels = inputs.get("pixel_values")
    if not isinstance(pixels, torch.Tensor):
        return None, "the processor gives no pixel_values tensor and no image_grid_thw"
    if pixels.dim() == 5 and pixels.shape[:2] == (1, n):  # (1, images, C, H, W): one view each
        ph, pw = vlm.patch_hw
        return [(pixels.shape[-2] // ph, pixels.shape[-1] // pw)] * n, ""
    return None, (f"the processor gave pixel_values of shape {tuple(pixels.shape)} for {n} image(s): tiles or crops "
                  "whose canvas neither it nor the config states")


# The processor outputs that name each view's patch rows and columns, (views, 2): SigLIP 2's NaFlex patches
# (LFM2-VL's ``spatial_shapes``), MiniCPM-V's slices (``target_sizes``), Nemotron-H Omni's flattened patches
# (``image_grid_hw``, each image one view)
GRID_OUTPUTS = ("spatial_shapes", "target_sizes", "image_grid_hw")


def _named_grids(inputs, n: int) -> tuple[list[tuple[int, int]] | None, str] | None:
    """``(grids, reason)`` where the processor names each view's patch grid beside flattened patches: its
    ``GRID_OUTPUTS`` (rows, columns), or ``image_position_ids`` (Gemma 4's (column, row) of each patch, -1 for
    padding: the grid their largest spans); a grid per image where it gave one view each, else None and the views it
    gave. None where it names none."""
    for name in GRID_OUTPUTS:
        shapes = inputs.get(name)
        if isinstance(shapes, torch.Tensor) and shapes.dim() == 2 and shapes.shape[-1] == 2:
            if shapes.shape[0] != n:
                return None, (f"the processor gave {shapes.shape[0]} views' {name} for {n} image(s): tiles or "
                              "slices whose canvas neither it nor the config states")
            return [(int(h), int(w)) for h, w in shapes.tolist()], ""
    where = inputs.get("image_position_ids")
    if isinstance(where, torch.Tensor) and where.dim() == 3 and where.shape[-1] == 2:
        if where.shape[0] != n:
            return None, (f"the processor gave {where.shape[0]} views' image_position_ids for {n} image(s): tiles "
                          "or crops whose canvas neither it nor the config states")
        return [(int(view[:, 1].max()) + 1, int(view[:, 0].max()) + 1) for view in where], ""
    return None


def _units(declared: int, grids: list[tuple[int, int]]) -> list[int]:
    """The merge units tried over ``grids``: the ``declared`` one, else each whole number to ``MAX_UNIT``; those that
    divide every grid."""
    return [unit for unit in ([declared] if declared else range(1, MAX_UNIT + 1))
            if all(gh % unit == 0 and gw % unit == 0 for gh, gw in grids)]


def _unit_and_lead(declared: int, grids: list[tuple[int, int]], count: int,
                   leads: tuple[int, ...] = (0, 1)) -> tuple[int, int] | None:
    """The merge unit (``_units``) and leading tokens per image (each of ``leads`` in turn) whose units over ``grids``
    give ``count`` image tokens; None when none does."""
    for unit in _units(declared, grids):
        for lead in leads:
            if sum(lead + (gh // unit) * (gw // unit) for gh, gw in grids) == count:
                return unit, lead
    return None


def _covered(declared: int, grids: list[tuple[int, int]], count: int) -> list[tuple[int, int]] | None:
    """The patches the tokens cover where the ``declared`` merge unit does not divide ``grids`` and the merger drops
    the patches past its last whole unit (an ``unfold`` of stride the unit: Mistral 3's and LightOnOCR's patch
    mergers, whose processors count ``side // (patch x unit)`` tokens): each grid cut to its whole units, where
    their count is the prompt's; else None."""
    if not declared or all(gh % declared == 0 and gw % declared == 0 for gh, gw in grids):
        return None
    cut = [(gh // declared * declared, gw // declared * declared) for gh, gw in grids]
    return cut if sum((gh // declared) * (gw // declared) for gh, gw in cut) == count else None


def stated_canvas(vlm, image: Image.Image) -> tuple[int, int] | None:
    """The rows and columns of tiles the processor cuts ``image`` into, as it states them: its image processor's
    outputs for that image alone (``rows`` and ``cols``: Idefics3's when asked, Granite-Docling's;
    ``aspect_ratios``: Llama 4's), else the canvas its crop settings choose (``crop_to_patches``, ``min_patches``,
    ``max_patches`` and the tile ``size``, the processor's own ``images_kwargs`` over its image processor's: the
    GOT-OCR2 image processor's ``get_optimal_tiled_canvas``, which Aya Vision and Qianfan-OCR share); None where it
    states none."""
    images = vlm.processor.image_processor
    for asked in ({"return_row_col_info": True}, {}):
        try:
            out = images(images=[[image]], return_tensors="pt", **asked)
        except (TypeError, ValueError):
            continue
        if "rows" in out and "cols" in out:
            return int(torch.as_tensor(out["rows"]).flatten()[0]), int(torch.as_tensor(out["cols"]).flatten()[0])
        if "aspect_ratios" in out:
            rows, cols = (int(v) for v in out["aspect_ratios"][0])
            return rows, cols
        break
    settings = {name: getattr(images, name, None) for name in ("crop_to_patches", "min_patches", "max_patches")}
    settings.update({k: v for k, v in (getattr(vlm.processor, "images_kwargs", None) or {}).items() if k in settings})
    size = getattr(images, "size", None)
    height, width = getattr(size, "height", None), getattr(size, "width", None)
    if not (settings["crop_to_patches"] and isinstance(settings["max_patches"], int) and height and width):
        return None
    if settings["max_patches"] <= 1:
        return 1, 1
    from transformers.models.got_ocr2.image_processing_got_ocr2 import get_optimal_tiled_canvas

    cols, rows = get_optimal_tiled_canvas((image.height, image.width), (height, width),
                                          int(settings["min_patches"] or 1), int(settings["max_patches"]))
    return rows, cols


def _stated_tiles(vlm, inputs, images: Sequence[Image.Image], positions: torch.Tensor) -> tuple[
        tuple[ImageLayout, ...] | None, str]:
    """``(layouts, reason)``: ``images`` cut into tiles of a canvas the processor states (``stated_canvas``), its
    pixel tensor's views image after image (each image's ``rows x cols`` tiles row-major, then the whole image resized
    to one tile where there are several), each view's units row-major in the prompt in that order, the unit the one
    the config declares or the one whole number that gives the prompt's count; else None and what lacks."""
    pixels = inputs.get("pixel_values")
    views = pixels[0] if isinstance(pixels, torch.Tensor) and pixels.dim() == 5 and pixels.shape[0] == 1 else pixels
    shape = tuple(pixels.shape) if isinstance(pixels, torch.Tensor) else None
    lacking = (f"the processor gave pixel_values of shape {shape} for {len(images)} image(s): tiles or crops whose "
               "canvas neither it nor the config states")
    if not isinstance(views, torch.Tensor) or views.dim() != 4:
        return None, lacking
    canvases = [stated_canvas(vlm, image) for image in images]
    if None in canvases:
        return None, lacking
    counts = [rows * cols + 1 if rows * cols > 1 else 1 for rows, cols in canvases]
    if sum(counts) != views.shape[0]:
        return None, (f"the processor gave {views.shape[0]} views of {len(images)} image(s), not the {sum(counts)} "
                      "of the tiles it states")
    grid = (views.shape[-2] // vlm.patch_hw[0], views.shape[-1] // vlm.patch_hw[1])
    found = _unit_and_lead(vlm.unit, [grid] * sum(counts), len(positions))
    if found is None or found[1]:
        return None, (f"{len(positions)} image tokens are not whole merge units over {sum(counts)} tiles of "
                      f"{grid[0]}x{grid[1]} patches")
    unit, per_view = found[0], (grid[0] // found[0]) * (grid[1] // found[0])
    layouts, first = [], 0
    for (rows, cols), n in zip(canvases, counts, strict=True):
        mine, at = views[first:first + n], positions[first * per_view:(first + n) * per_view]
        layouts.append(_tiles_then_overview(vlm, mine, at, rows, cols, unit) if n > 1 else
                       ImageLayout(at, grid, unit, 0, pixels=seen_pixels(vlm, mine)[0]))
        first += n
    return tuple(layouts), ""


def _rows_closed(declared: int, grids: list[tuple[int, int]], count: int) -> tuple[int, int, int] | None:
    """``(unit, lead, trail)`` where each image's tokens are a begin token or none, its units' rows each closed by a
    newline token, then an end token or none (HunYuan-VL's merger: ``image_begin``, a row of units and
    ``image_newline`` for each row, ``image_end``, all written with its image token), with the ``declared`` merge unit
    (else each whole number tried), giving ``count``; None when none does."""
    for unit in _units(declared, grids):
        for lead, trail in ((1, 1), (0, 0), (1, 0), (0, 1)):
            if sum(lead + (gh // unit) * (gw // unit + 1) + trail for gh, gw in grids) == count:
                return unit, lead, trail
    return None


def _closed_layouts(positions: torch.Tensor, grids: list[tuple[int, int]], unit: int, lead: int,
                    trail: int) -> tuple[ImageLayout, ...]:
    """Each image's layout under ``_rows_closed``'s reading: the token over each patch, its newlines and begin and end
    tokens over none."""
    layouts, start = [], 0
    for gh, gw in grids:
        wide = gw // unit + 1  # a row's units and its newline
        r, c = torch.arange(gh)[:, None], torch.arange(gw)[None, :]
        index = lead + (r // unit) * wide + c // unit  # (gh, gw)
        count = lead + (gh // unit) * wide + trail
        layouts.append(ImageLayout(positions[start:start + count], (gh, gw), unit, lead, index))
        start += count
    return tuple(layouts)


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
    processor = getattr(vlm.processor, "image_processor", None)
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
    found = _unit_and_lead(vlm.unit or (pooling if isinstance(pooling, int) else 0), [grid] * (views * len(images)),
                           len(positions), leads=(0,))
    if found is None:
        return None, (f"{len(positions)} image tokens are not whole pooled units over {len(images)} x {views} views "
                      f"of {grid[0]}x{grid[1]} patches")
    unit = found[0]
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
    vision = getattr(config, "vision_config", None)
    if not all(isinstance(getattr(vision, name, None), int) for name in ("image_size", "patch_size")):
        return None, "its vision config states no image_size and patch_size of the crops"
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
    grids = inputs.get("patches_grid")
    grids = [[1, 1]] * len(images) if grids is None else grids
    local = inputs.get("pixel_values_local")
    side = (pixels.shape[-2] // stride, pixels.shape[-1] // stride)
    whole = side[0] * (side[1] + 1)  # the global view's rows, each closed by a newline
    patch = _first_patch(vlm)  # the first tower's patch, which its attention runs over
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
                                       _canvas(crops, rows, cols), (n + 1, (tile[0] * stride // patch,
                                                                            tile[1] * stride // patch))))
        else:
            tower = (side[0] * stride // patch, side[1] * stride // patch)
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
               for part in (getattr(vlm.processor, "image_processor", None), vlm.model.config, inner))


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


# The processor outputs that hold one image's patches flattened, (patches, p x p x C) each row-major in the patch
# (Fuyu's ``image_patches``, or its ``pixel_values`` where asked for the new output)
PATCH_OUTPUTS = ("image_patches", "pixel_values")


def _patch_rows(vlm, inputs, positions: torch.Tensor) -> tuple[ImageLayout, ...] | None:
    """One image's layout where the processor hands its patches flattened, one image token each, and the prompt lays
    them in rows, each closed by one other token (Fuyu's ``|NEWLINE|``): its runs of image tokens are the rows, the
    run's length the columns (patches past the image's edge, its padding, read too), the pixels put back together
    from the patches (each ``(p, p, C)`` row-major, the processor's normalisation undone); None where the outputs
    are not so."""
    patches = next((inputs[name] for name in PATCH_OUTPUTS if isinstance(inputs.get(name), torch.Tensor)), None)
    (ph, pw), k = vlm.patch_hw, len(positions)
    if patches is not None and patches.dim() == 3 and patches.shape[0] == 1:
        patches = patches[0]
    if patches is None or patches.dim() != 2 or patches.shape[0] != k or patches.shape[1] % (ph * pw) or k < 2:
        return None
    breaks = (torch.diff(positions) != 1).nonzero()[:, 0]  # the last token of each row but the last
    starts = torch.cat([torch.zeros(1, dtype=torch.long), breaks + 1])
    lengths = torch.diff(torch.cat([starts, torch.tensor([k])]))
    if len(set(lengths.tolist())) != 1 or any(int(positions[b + 1] - positions[b]) != 2 for b in breaks):
        return None
    rows, cols, channels = len(starts), int(lengths[0]), patches.shape[1] // (ph * pw)
    canvas = patches.reshape(rows, cols, ph, pw, channels).permute(4, 0, 2, 1, 3).reshape(1, channels, rows * ph,
                                                                                          cols * pw)
    return (ImageLayout(positions, (rows, cols), 1, 0, pixels=seen_pixels(vlm, canvas)[0]),)


def read_layouts(vlm, inputs, images: Sequence[Image.Image]) -> tuple[ImageLayout, ...]:
    """The layout of each of ``images`` in the processor's ``inputs`` (see the module's docstring), or one unplaced
    list over the image tokens naming what is missing. ValueError (one line) when the prompt holds no image token."""
    positions = _token_positions(vlm, inputs)
    if not len(positions):
        raise ValueError("the prompt holds no image token; the processor did not put the image in it")
    if "pixel_values" not in inputs and isinstance(inputs.get("pixel_values_images"), torch.Tensor):
        # the images' pixels under the name a processor of images and clips gives them (Video-LLaVA's)
        inputs = {**inputs, "pixel_values": inputs["pixel_values_images"]}
    queries = tower_queries(vlm)
    if queries:  # a count of them that happens to tile the grid must not place them on it
        return unplaced(positions, f"they are {queries}, which cover no patch")
    grids, reason = _grids(vlm, inputs, len(images))
    if grids is None and not vlm.tower.missing:
        tiled, reason = _stated_tiles(vlm, inputs, images, positions)
        if tiled is not None:
            return tiled
    if grids is None:  # a canvas the processor's own code chooses (``CANVASES``), else patches handed in rows
        canvased, why = canvas_layouts(vlm, inputs, images, positions)
        if canvased is not None:
            return canvased
        rows = _patch_rows(vlm, inputs, positions) if len(images) == 1 and not vlm.tower.missing else None
        return rows if rows is not None else unplaced(positions, why or reason)
    found = _unit_and_lead(vlm.unit, grids, len(positions))
    covered = _covered(vlm.unit, grids, len(positions)) if found is None else None
    if covered is not None:
        grids, found = covered, (vlm.unit, 0)
    closed = _rows_closed(vlm.unit, grids, len(positions)) if found is None else None
    if closed is not None:
        return _one_view_pixels(vlm, inputs, _closed_layouts(positions, grids, *closed))
    if found is None:
        units = f"its declared {vlm.unit}x{vlm.unit} merge unit" if vlm.unit else "any whole merge unit"
        return unplaced(positions, f"{len(positions)} image tokens are not {units} over "
                                   + ", ".join(f"{gh}x{gw}" for gh, gw in grids) + " patches")
    unit, lead = found
    layouts, start = [], 0
    for grid in grids:
        count = lead + (grid[0] // unit) * (grid[1] // unit)
        layouts.append(ImageLayout(positions[start:start + count], grid, unit, lead))
        start += count
    layouts = _one_view_pixels(vlm, inputs, tuple(layouts))  # the pixels each was read as, as a named family's
    if covered is not None:  # the pixels of the patches its tokens cover, past them dropped as the merger drops them
        (ph, pw) = vlm.patch_hw
        layouts = tuple(layout if layout.pixels is None else replace(
            layout, pixels=layout.pixels[:layout.grid[0] * ph, :layout.grid[1] * pw]) for layout in layouts)
    return layouts


# --- an encoder-decoder whose encoder reads the image alone, a decoder over a tower's states (issue 113) ------------
# An encoder-decoder whose encoder reads the image alone (issue 113): its question, and where its image tokens
# sit: Pix2Struct's, PP-FormulaNet's, a ``VisionEncoderDecoderModel``'s (Donut, TrOCR, a ViT under BERT); and a
# decoder whose cross-attention layers read a tower's states (Idefics'). Its decoder writes the answer
# and reads the image through its cross-attention over the encoder's states, which are the image's tokens and nothing
# else: answer token ``i``'s cross-attention row at a decoder layer is its attention over the image.
#
# Where each state sits on the image is read from what the processor gives, never from the model's name:
# Pix2Struct's ``flattened_patches`` carry each patch's row and column (its first two features, 1-based; 0 for the
# padding past the image's patches), so the patch grid and each state's place come from them; a pixel tensor of one
# view gives the patch grid over the tower's patch, and the count of the encoder's states (known once it has run: the
# keys its decoder's cross-attention reads) gives the patches each covers (a hierarchical tower's last stage, Swin's
# merges: a whole number of patches a side) and the tokens before them that cover none (a ViT's CLS, DeiT's
# distillation token). What no whole unit gives is laid out as one list over the states, ``unplaced`` naming why.
#
# An encoder that reads the prompt too (Florence-2's, the image's tokens among the prompt's, found by the image token)
# is laid out as a decoder-only model's prompt is; one that joins them otherwise (UDOP's patches merged with the
# words' boxes) is refused in one line (``reads_prompt_unmarked``).

MAX_STATE_UNIT = 32  # patches a side one encoder state covers: Donut-Swin's last stage is 8, deeper pyramids 32
LEADS = (0, 1, 2)  # states before the patches' that cover none: none, a CLS, a CLS and a distillation token
PENDING = "its encoder's states are counted when it runs"  # a layout settled once the encoder has run (``settle``)


def reads_image_alone(vlm) -> bool:
    """Whether ``vlm`` is an encoder-decoder whose encoder reads the image alone: the encoder its model names
    (``get_encoder``) takes no prompt (no ``input_ids``: Pix2Struct's reads ``flattened_patches``, PP-FormulaNet's and
    a VisionEncoderDecoder's ``pixel_values``); Florence-2's BART encoder reads the prompt, the image's tokens in
    it."""
    if not getattr(vlm.model.config, "is_encoder_decoder", False) or not hasattr(vlm.model, "get_encoder"):
        return False
    encoder = vlm.model.get_encoder()
    return encoder is not None and "input_ids" not in inspect.signature(encoder.forward).parameters


def reads_tower_states(vlm) -> bool:
    """Whether ``vlm``'s answer reads the image through cross-attention over states that are the image's alone: an
    encoder-decoder's encoder over the image (``reads_image_alone``), or the tower's states (or its resampler's
    latents) a decoder's cross-attention layers read (Idefics' gated layers), for a model no layout here names
    (Llama 3.2 Vision's tiles are ``vlm_layouts``')."""
    from vit.explain.language.vlm_attention import cross_attending
    from vit.registry import VLM_ARCHITECTURES

    return reads_image_alone(vlm) or (vlm.model_type not in VLM_ARCHITECTURES
                                      and cross_attending(vlm.language_model)) or prefixes_tower_states(vlm)


def prefixes_tower_states(vlm) -> bool:
    """Whether ``vlm``'s language model reads the tower's states joined before the prompt, no token of the prompt
    marking them (GIT's: neither its config nor its processor names an image token, and its text stack's attention
    computes its softmax itself, over the image's states and the text): their count is the first call's keys past
    the prompt's (``settled``)."""
    from vit.core.recording_attention import inline_stack
    from vit.explain.language.vlm_attention import cross_attending, image_token_id

    if image_token_id(vlm.model.config) is not None or getattr(vlm.processor, "image_token_id", None) is not None:
        return False
    stack = inline_stack(vlm.model)
    return stack is not None and stack is vlm.language_model and not cross_attending(stack)


def reads_prompt_unmarked(vlm) -> str | None:
    """Why an encoder-decoder whose encoder reads the prompt beside the image cannot be asked, or None: neither its
    config nor its processor names an image token, so nothing says where the image's states sit among the
    encoder's (UDOP's joins its patches with the words' boxes)."""
    from vit.explain.language.vlm_attention import image_token_id

    if not getattr(vlm.model.config, "is_encoder_decoder", False) or reads_image_alone(vlm):
        return None
    if image_token_id(vlm.model.config) is not None or getattr(vlm.processor, "image_token_id", None) is not None:
        return None
    return (f"its encoder ({type(vlm.model).__name__}) reads the prompt and the image together, and neither its "
            "config nor its processor names an image token that says where the image's states sit among the "
            "encoder's")


def encoder_layout(vlm, inputs) -> ImageLayout:
    """The layout of the image read by an encoder that reads it alone (``reads_image_alone``): Pix2Struct's flattened
    patches placed where their row and column say, else a pixel tensor's patch grid, its states counted once the
    encoder has run (``settle``). ValueError (one line) for a processor that gives neither."""
    patches = inputs.get("flattened_patches")
    if isinstance(patches, torch.Tensor) and patches.dim() == 3 and patches.shape[0] == 1:
        return flattened_layout(patches[0], inputs.get("attention_mask"))
    pixels = inputs.get("pixel_values")
    if isinstance(pixels, torch.Tensor) and pixels.dim() == 5 and pixels.shape[:2] == (1, 1):  # (1, images, C, H, W)
        pixels = pixels[0]
    if not isinstance(pixels, torch.Tensor) or pixels.dim() != 4 or pixels.shape[0] != 1:
        shape = tuple(pixels.shape) if isinstance(pixels, torch.Tensor) else None
        raise ValueError(f"its processor gave pixel_values of shape {shape}, not one view of the image; its "
                         "encoder's states cannot be placed")
    ph, pw = vlm.patch_hw
    # the patches the encoder reads: a side the patch does not divide is padded to a whole patch (Swin's)
    grid = (-(-pixels.shape[-2] // ph), -(-pixels.shape[-1] // pw))
    missing = getattr(vlm.tower, "missing", "")  # its states cover no patch (Idefics' perceiver latents)
    return ImageLayout(torch.zeros(0, dtype=torch.long), grid, 1, 0,
                       unplaced=PENDING + (f": {missing}" if missing else ""))


def flattened_layout(patches: torch.Tensor, mask: torch.Tensor | None = None) -> ImageLayout:
    """(P, 2 + d) flattened patches, each row's first two values its patch's row and column (1-based, 0 for padding)
    -> the layout of the encoder's states over them: state ``k`` over the patch its row names (``index``), the
    padding's states over none."""
    rows, cols = patches[:, 0].round().long(), patches[:, 1].round().long()
    real = (rows > 0) & (cols > 0)
    if mask is not None:
        real &= mask.reshape(-1)[:len(real)].bool()
    kept = real.nonzero()[:, 0]  # (N,) the states over the image's patches
    if not len(kept):
        raise ValueError("its processor's flattened patches hold no patch of the image")
    grid = (int(rows[kept].max()), int(cols[kept].max()))
    index = torch.full(grid, -1, dtype=torch.long)
    index[rows[kept] - 1, cols[kept] - 1] = torch.arange(len(kept))
    if (index < 0).any():
        raise ValueError(f"its processor's flattened patches leave places of their {grid[0]}x{grid[1]} grid "
                         "without a patch; its encoder's states cannot be placed")
    return ImageLayout(kept, grid, 1, 0, index=index)


def settle(layout: ImageLayout, states: int) -> ImageLayout:
    """A pending layout (``encoder_layout`` of a pixel tensor) once the encoder has run over ``states`` states: the
    whole unit of patches a side (1 to ``MAX_STATE_UNIT``) and the leading states (``LEADS``) that give their count over
    its grid, its states row-major (a ViT's, a Swin's last stage: a side its merges do not divide padded past the
    image's last patch, so its last units cover the patches left); else one list over the states, ``unplaced``
    naming the counts. A layout not pending is returned as it is."""
    if not (layout.unplaced or "").startswith(PENDING):
        return layout
    gh, gw = layout.grid
    positions = torch.arange(states)
    missing = layout.unplaced[len(PENDING) + 2:]
    if missing:
        return replace(layout, positions=positions, grid=(1, states),
                       unplaced=f"its image tokens are not placed on the image: {missing}")
    for unit in range(1, MAX_STATE_UNIT + 1):
        rows, cols = -(-gh // unit), -(-gw // unit)  # a merge pads an odd side (Swin's): its last unit part padding
        lead = states - rows * cols
        if lead not in LEADS:
            continue
        if gh % unit == 0 and gw % unit == 0:
            return replace(layout, positions=positions, unit=unit, lead=lead, unplaced=None)
        r, c = torch.arange(gh)[:, None], torch.arange(gw)[None, :]
        return replace(layout, positions=positions, unit=unit, lead=lead, unplaced=None,
                       index=lead + (r // unit) * cols + c // unit)  # (gh, gw) the state over each patch
    return replace(layout, positions=positions, grid=(1, states), unplaced=(
        f"its image tokens are not placed on the image: its encoder's {states} states are not whole units of "
        f"patches over its {gh}x{gw} patch grid"))


def settled(prepared, recorder):
    """``prepared`` (``vlm_answer.Prepared``) with its pending layout settled on the count of the encoder's states
    its decoder's cross-attention read (the keys of the first recorded call), or of the tower's states joined
    before the prompt (``prefixes_tower_states``: the first call's keys past the prompt's)."""
    if not (prepared.layout.unplaced or "").startswith(PENDING):
        return prepared
    prefix = 0 if recorder.cross else prepared.prompt_tokens  # the states before the prompt (GIT's): past it
    layout = settle(prepared.layout, recorder.seen[0][0] - prefix)
    return replace(prepared, layout=layout, layouts=(layout,))


def prompt_length(inputs, layout: ImageLayout) -> int:
    """The prompt's tokens as the answer's cost counts them: the prompt's ``input_ids``, or, for an encoder that
    reads the image alone, its states over the image (every patch and a few before them: a bound until it has run)
    and the decoder's prompt."""
    if "input_ids" in inputs:
        return int(inputs["input_ids"].shape[1])
    decoder = inputs.get("decoder_input_ids")
    return image_states(layout) + 1 + (int(decoder.shape[1]) if isinstance(decoder, torch.Tensor) else 0)


def image_states(layout: ImageLayout) -> int:
    """The states over the image an encoder's (or a tower's, joined before the prompt: GIT's) ``layout`` holds: every
    patch and the most leading states (``LEADS``) while it is pending (a bound until it has run), else its count."""
    pending = (layout.unplaced or "").startswith(PENDING)
    return layout.grid[0] * layout.grid[1] + max(LEADS) if pending else len(layout.positions)


def decoder_prompt(vlm, inputs) -> torch.Tensor:
    """(1, n) the decoder's prompt before the answer, as ``generate`` made it: the inputs' ``decoder_input_ids``
    (``with_decoder_prompt`` keeps generate's own there), else its start token alone (Florence-2's)."""
    given = inputs.get("decoder_input_ids") if hasattr(inputs, "get") else None
    if isinstance(given, torch.Tensor):
        return given
    return torch.tensor([[vlm.model.generation_config.decoder_start_token_id]], dtype=torch.long)


def with_decoder_prompt(prepared, sequence: torch.Tensor):
    """``prepared`` whose inputs hold the decoder's prompt as ``generate`` made it (``sequence``, (1, n): its start
    token put before the processor's ``decoder_input_ids`` where the model wants one), its mask ones over it: what a
    reading's forward over the prompt and the answer's first tokens appends them to."""
    inputs = type(prepared.inputs)({**prepared.inputs, "decoder_input_ids": sequence.cpu()})
    if "decoder_attention_mask" in inputs:
        inputs["decoder_attention_mask"] = torch.ones_like(inputs["decoder_input_ids"])
    return replace(prepared, inputs=inputs)
