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

import torch
from PIL import Image

from vit.explain.language.vlm_attention import image_token_id
from vit.explain.language.vlm_layouts import ImageLayout, _one_view_pixels, one_view_grids

MAX_UNIT = 16  # patches per token along a side tried from the counts: published mergers use 2 to 4


def _token_positions(vlm, inputs) -> torch.Tensor:
    """(K,) the image placeholder's positions in the prompt: its id from the model's config, else the processor's."""
    token = image_token_id(vlm.model.config)
    if token is None:
        token = getattr(vlm.processor, "image_token_id", None)
    if token is None:
        raise ValueError("neither its config nor its processor names an image token id; its image tokens cannot be "
                         "found in the prompt")
    return (inputs["input_ids"][0] == token).nonzero()[:, 0]


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


def read_layouts(vlm, inputs, images: Sequence[Image.Image]) -> tuple[ImageLayout, ...]:
    """The layout of each of ``images`` in the processor's ``inputs`` (see the module's docstring), or one unplaced
    list over the image tokens naming what is missing. ValueError (one line) when the prompt holds no image token."""
    positions = _token_positions(vlm, inputs)
    if not len(positions):
        raise ValueError("the prompt holds no image token; the processor did not put the image in it")
    grids, reason = _grids(vlm, inputs, len(images))
    if grids is None:
        return unplaced(positions, reason)
    found = _unit_and_lead(vlm.unit, grids, len(positions))
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
    return _one_view_pixels(vlm, inputs, tuple(layouts))  # the pixels each was read as, as a named family's
