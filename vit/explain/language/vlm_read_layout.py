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


    if grids is None:  # a canvas the processor's own code chooses (``CANVASES``), else patches handed in rows
        canvased, why = canvas_layouts(vlm, inputs, images, positions)
        if canvased is not None:
            return canvased
        rows = _patch_rows(vlm, inputs, positions) if len(images) == 1 and not vlm.tower.missing else None
        return rows if rows is not None else unplaced(positions, why or reason)


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
                                      and cross_attending(vlm.language_model))


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
    its decoder's cross-attention read (the keys of the first recorded call)."""
    if not (prepared.layout.unplaced or "").startswith(PENDING):
        return prepared
    layout = settle(prepared.layout, recorder.seen[0][0])
    return replace(prepared, layout=layout, layouts=(layout,))


def prompt_length(inputs, layout: ImageLayout) -> int:
    """The prompt's tokens as the answer's cost counts them: the prompt's ``input_ids``, or, for an encoder that
    reads the image alone, its states over the image (every patch and a few before them: a bound until it has run)
    and the decoder's prompt."""
    if "input_ids" in inputs:
        return int(inputs["input_ids"].shape[1])
    decoder = inputs.get("decoder_input_ids")
    pending = (layout.unplaced or "").startswith(PENDING)
    states = layout.grid[0] * layout.grid[1] + max(LEADS) if pending else len(layout.positions)
    return states + 1 + (int(decoder.shape[1]) if isinstance(decoder, torch.Tensor) else 0)


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
