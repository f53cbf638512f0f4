"""Where a model type no layout here names puts its image tokens (issue 113), read from what its processor gives and
its config declares, never from its name: the image token's positions in ``input_ids`` (its id from the config or
the processor), each image's patch grid (``image_grid_thw``; ``image_sizes`` of images kept at their own size; else
the one view's pixel tensor over the tower's patch), and the patches each token covers: the merge unit its config
declares (``any_vlm.merge_unit``), else the one whole number of patches (and the one count of leading tokens that
cover none, 0 or 1) that gives the prompt's count of image tokens; the tokens then laid row-major over each image's
units, as every projector here hands them (a merger's ``spatial_merge_size`` blocks, a pixel shuffle's).

What this cannot place (several views of one image with no canvas the processor or config states, no patch size, a
count no unit gives) is laid out as one list over the image tokens with ``unplaced`` naming the missing piece: the
answer and each token's attention over the image tokens still come (``VLMAnswer.image_rows``), and a map on the image
is refused in that one line (``ImageLayout.place``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from PIL import Image

from vit.explain.language.vlm_attention import image_positions, image_token_id
from vit.explain.language.vlm_layouts import (
    ImageLayout,
    _one_view_pixels,
    _tiles_then_overview,
    one_view_grids,
    seen_pixels,
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
# (LFM2-VL's ``spatial_shapes``), MiniCPM-V's slices (``target_sizes``)
GRID_OUTPUTS = ("spatial_shapes", "target_sizes")


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


def _unit_and_lead(declared: int, grids: list[tuple[int, int]], count: int) -> tuple[int, int] | None:
    """The merge unit (the ``declared`` one, else each whole number tried) and leading tokens per image (0, then 1)
    whose units over ``grids`` give ``count`` image tokens; None when none does."""
    for unit in ([declared] if declared else range(1, MAX_UNIT + 1)):
        if any(gh % unit or gw % unit for gh, gw in grids):
            continue
        for lead in (0, 1):
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
    for unit in ([declared] if declared else range(1, MAX_UNIT + 1)):
        if any(gh % unit or gw % unit for gh, gw in grids):
            continue
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
    grids, reason = _grids(vlm, inputs, len(images))
    if grids is None and not vlm.tower.missing:
        tiled, reason = _stated_tiles(vlm, inputs, images, positions)
        if tiled is not None:
            return tiled
    if grids is None:
        rows = _patch_rows(vlm, inputs, positions) if len(images) == 1 and not vlm.tower.missing else None
        return rows if rows is not None else unplaced(positions, reason)
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
