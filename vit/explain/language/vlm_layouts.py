"""Where a vision-language model's image tokens sit on the image (issue 80; split from ``vlm_answer``): the layout of
each image, tile or temporal slice in the processor's inputs, read from what the processor gives
(``image_grid_thw``, ``aspect_ratios``, ``image_sizes``, the pixel tensors' sides) and the tower's patch and merge
unit, each placed the way the model's projector hands its tokens to the language model: one view's units row-major
(``visual_lens.on_patch_grid``), or tiles on their canvas (InternVL's crops, Idefics3's and Llama 4's split image,
LLaVA-NeXT's and OneVision's unpadded crops with their newline tokens, Gemma 3's pan-and-scan crops), the view of the
whole image beside them as the overview; and the pixels each was read as, the processor's normalisation undone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from PIL import Image

from vit.explain.language.vlm_attention import image_token_id


@dataclass(frozen=True)
class ImageLayout:
    """Where the image's tokens sit in the prompt and on the map's patch grid: one view's units row-major after
    ``lead`` tokens, or, where the processor cut the image into tiles, ``index``: the token over each patch of the
    tiles' canvas (InternVL's crops, LLaVA-NeXT's unpadded crops), the model's view of the whole image beside them
    (InternVL's thumbnail, NeXT's base image) as ``overview``."""

    positions: torch.Tensor  # (K,) the image tokens' places in the prompt, every view's
    grid: tuple[int, int]  # the map's patch grid: the tower's of the one view, or the tiles' canvas
    unit: int  # patches per image token along each side
    lead: int  # leading image tokens that cover no patch (CLIP's CLS under LLaVA's "full" strategy)
    index: torch.Tensor | None = None  # (gh, gw) long: the image token (into positions) over each patch; None: units
    views: int = 1  # the tower's passes over the image: one, or each tile and the overview
    view_grid: tuple[int, int] | None = None  # one pass's patch grid (None: ``grid``)
    overview: ImageLayout | None = None  # the whole image's one view beside the tiles, on its own patch grid
    # A tiled layout's pixels as the model read them (H, W, 3) uint8, the processor's normalisation undone: the tiles'
    # canvas (``grid`` x the tower's patch), or the overview's one view; None for a one-view layout (its pixels are
    # the tower's preprocessing of the image).
    pixels: np.ndarray | None = field(default=None, compare=False, repr=False)
    # How the tower runs over this image where it differs from the views placed: (passes, each one's patch grid);
    # Llama 3.2 Vision's tower attends over every tile slot of the image at once (the padding's too), one pass
    tower_passes: tuple[int, tuple[int, int]] | None = None
    # Why the tokens are not placed on the image (``vlm_read_layout``: what the processor and config do not state);
    # then ``positions`` are every image token's, ``grid`` (1, K) a list of them, and a map on the image refused
    unplaced: str | None = None

    def place(self, values: torch.Tensor) -> torch.Tensor:
        """(W, K) values of the image tokens -> (W, gh, gw) on the patch grid. ValueError (one line) for tokens not
        placed on the image (``unplaced``)."""
        from vit.explain.methods.visual_lens import on_patch_grid

        if self.unplaced:
            raise ValueError(f"{self.unplaced}; their values come as a list over the image tokens (image_rows)")
        if self.index is not None:
            return values[:, self.index]
        return on_patch_grid(values, self.grid, self.unit, self.lead)

    @property
    def counted(self) -> tuple[int, tuple[int, int] | None]:
        """``(views, view_grid)`` as the cost model counts the tower's work on this image (``vit.costs.plan``): its
        ``tower_passes`` where set, else its views and their grid (None: ``grid``)."""
        return self.tower_passes or (self.views, self.view_grid)

    @property
    def patches(self) -> int:
        """The patches the tower reads: the one view's, or every tile's and the overview's."""
        gh, gw = self.view_grid or self.grid
        return self.views * gh * gw

    def view(self, overview: bool) -> ImageLayout:
        """This layout, or its ``overview`` (ValueError in one line for a model that reads one view)."""
        if not overview:
            return self
        if self.overview is None:
            raise ValueError("this image was read in one view, not as tiles beside an overview; ask without overview")
        return self.overview


def tower_lead(vlm) -> int:
    """Image tokens before the patches' units that cover no patch (``visual_lens.leading_rows``: LLaVA's "full"
    strategy keeps CLIP's CLS); a declared tower's (``declared.DeclaredTower.lead``: Florence-2's grid mean, else 0:
    its merger reads patches only)."""
    from vit.checkpoint import Checkpoint
    from vit.explain.methods.visual_lens import leading_rows

    return leading_rows(vlm.tower.model) if isinstance(vlm.tower, Checkpoint) else vlm.tower.lead


def _check_count(positions: torch.Tensor, expected: int, where: str) -> None:
    if len(positions) != expected:
        raise ValueError(f"the prompt holds {len(positions)} image tokens, not the {expected} of {where}; its image "
                         "tokens are laid out otherwise, which is not placed yet")


def tile_index(rows: int, cols: int, grid: tuple[int, int], unit: int, start: int = 0) -> torch.Tensor:
    """(rows x gh, cols x gw) long: the image token over each patch of a canvas of ``rows x cols`` tiles, each on
    patch grid ``grid``, whose tokens come tile after tile (row-major), each tile's units row-major, from
    ``start``. ``rows = cols = 1``: one view's units."""
    gh, gw = grid
    per_tile = (gh // unit) * (gw // unit)
    r = torch.arange(rows * gh)[:, None]  # (H, 1) canvas rows
    c = torch.arange(cols * gw)[None, :]  # (1, W) canvas columns
    tile = (r // gh) * cols + c // gw
    return start + tile * per_tile + (r % gh // unit) * (gw // unit) + (c % gw // unit)  # (H, W)


def seen_pixels(vlm, tiles: torch.Tensor, images=None) -> np.ndarray:
    """(n, C, h, w) tiles of the processor's ``pixel_values`` -> (n, h, w, 3) uint8: its rescale and normalisation
    undone, the pixels the tower read. ``images``: the processor part that made them (its image processor)."""
    images = vlm.processor.image_processor if images is None else images
    x = tiles.detach().float().cpu()
    if getattr(images, "do_normalize", True):
        mean = torch.as_tensor(images.image_mean, dtype=torch.float32).view(1, -1, 1, 1)
        std = torch.as_tensor(images.image_std, dtype=torch.float32).view(1, -1, 1, 1)
        x = x * std + mean
    if getattr(images, "do_rescale", True):
        x = x / float(images.rescale_factor)
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


def _canvas(tiles: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """(rows x cols, h, w, 3) row-major tiles -> (rows x h, cols x w, 3)."""
    n, h, w, c = tiles.shape
    return tiles[:rows * cols].reshape(rows, cols, h, w, c).transpose(0, 2, 1, 3, 4).reshape(rows * h, cols * w, c)


def _internvl_canvas(vlm, image: Image.Image) -> tuple[int, int]:
    """The rows and columns of tiles InternVL's processor cuts ``image`` into: the canvas transformers'
    ``get_optimal_tiled_canvas`` chooses (1 x 1: the image read whole, no thumbnail)."""
    from transformers.models.got_ocr2.image_processing_got_ocr2 import get_optimal_tiled_canvas

    images = vlm.processor.image_processor
    size = images.size
    cols, rows = get_optimal_tiled_canvas((image.height, image.width), (size["height"], size["width"]),
                                          images.min_patches, images.max_patches)
    return rows, cols


def _idefics3_canvas(vlm, image: Image.Image) -> tuple[int, int]:
    """The rows and columns of tiles Idefics3's (SmolVLM's) image processor splits ``image`` into, as it counts them
    (``return_row_col_info``; 0 x 0: not split, the image read whole)."""
    counted = vlm.processor.image_processor(images=[[image]], return_row_col_info=True, return_tensors="pt")
    return int(counted["rows"][0][0]), int(counted["cols"][0][0])


def _llama4_canvas(vlm, image: Image.Image) -> tuple[int, int]:
    """The rows and columns of the canvas of tiles Llama 4's image processor resizes ``image`` into
    (``aspect_ratios``; 1 x 1: one tile, no global image)."""
    counted = vlm.processor.image_processor(images=[image], return_tensors="pt")
    rows, cols = (int(v) for v in counted["aspect_ratios"][0])
    return rows, cols


def _mllama_tiles(vlm, inputs) -> tuple[ImageLayout, ...]:
    """Llama 3.2 Vision's tiles (``MllamaImageProcessor``), each image's: the image resized into the canvas of tiles
    its ``aspect_ratio_ids`` name (transformers' ``get_all_supported_aspect_ratios`` order, from 1) and padded to
    fill it, cut row-major, no overview. The language model reads them through its cross-attention layers
    (``vlm_attention.cross_attending``): a row is over the tower's states, image after image, each image's tile
    slots (``max_image_tiles`` of them, the slots past its canvas masked), each tile's CLS then its patches
    row-major (``MllamaVisionModel``: its padding dropped). Each image's ``positions`` are its states' places in the
    row."""
    from transformers.models.mllama.image_processing_mllama import get_all_supported_aspect_ratios

    pixels = inputs["pixel_values"]  # (1, images, tile slots, C, h, w)
    shapes = get_all_supported_aspect_ratios(int(vlm.processor.image_processor.max_image_tiles))
    ph, pw = vlm.patch_hw
    grid = (pixels.shape[-2] // ph, pixels.shape[-1] // pw)
    per = grid[0] * grid[1] + 1  # a tile's states: its CLS, then its patches
    slots = pixels.shape[2] * per  # an image's states: every tile slot's
    layouts = []
    for k in range(pixels.shape[1]):
        rows, cols = shapes[int(inputs["aspect_ratio_ids"][0, k]) - 1]
        r = torch.arange(rows * grid[0])[:, None]
        c = torch.arange(cols * grid[1])[None, :]
        tile = (r // grid[0]) * cols + c // grid[1]
        index = tile * per + 1 + (r % grid[0]) * grid[1] + c % grid[1]
        seen = seen_pixels(vlm, pixels[0, k, :rows * cols])
        layouts.append(ImageLayout(torch.arange(k * slots, (k + 1) * slots), (rows * grid[0], cols * grid[1]), 1, 0,
                                   index, rows * cols, grid, None, _canvas(seen, rows, cols),
                                   (1, (pixels.shape[2] * grid[0], grid[1]))))
    return tuple(layouts)


def _molmo2_layouts(vlm, inputs, images: Sequence[Image.Image]) -> tuple[ImageLayout, ...]:
    """Each of Molmo 2's ``images`` (``_molmo2_tiles``): the processor writes them image after image, each its
    ``image_num_crops`` crops in ``pixel_values``, its tokens' rows of ``image_token_pooling`` (its ``image_grids``:
    the overview's pooled rows x columns, then the canvas's) naming patches counted from the first image's first
    crop, its image tokens in the prompt in that order."""
    grids = [[int(v) for v in grid] for grid in inputs["image_grids"]]
    counts = [a * b + c * d for a, b, c, d in grids]
    crops = [int(n) for n in inputs["image_num_crops"]]
    pooling, pixels = inputs["image_token_pooling"].long(), inputs["pixel_values"]
    positions = (inputs["input_ids"][0] == image_token_id(vlm.model.config)).nonzero()[:, 0]
    if not len(grids) == len(crops) == len(images) or len(pooling) != sum(counts):
        raise ValueError(f"the processor gave {len(grids)} images' grids and {len(pooling)} pooled tokens for the "
                         f"{len(images)} asked about; ask about one image")
    _check_count(positions, sum(counts), f"the pooled tokens of {len(images)} image(s)")
    per_crop = pixels.shape[1]  # patches a crop
    layouts, token, crop = [], 0, 0
    for image, grid, count, n in zip(images, grids, counts, crops, strict=True):
        mine = pooling[token:token + count]
        mine = torch.where(mine >= 0, mine - crop * per_crop, -1)  # this image's patches, from its first crop
        layouts.append(_molmo2_tiles(vlm, mine, pixels[crop:crop + n], grid, image, positions[token:token + count]))
        token, crop = token + count, crop + n
    return tuple(layouts)


def _molmo2_tiles(vlm, pooling: torch.Tensor, crops_pixels: torch.Tensor, image_grid: list[int], image: Image.Image,
                  positions: torch.Tensor) -> ImageLayout:
    """Molmo 2's image (``Molmo2ImageProcessor``): the whole image resized to one crop (the overview, its pooled tokens
    first in the prompt), then the image resized to a canvas (transformers' ``compute_crop_geometry``) cut into
    overlapping crops, one every ``crop - margins`` patches, each canvas patch read from one crop; the adapter pools
    each token from the patches ``image_token_pooling`` names (-1: none). Each patch of the canvas (or the
    overview's crop) is placed under the token that pools it, and drawn over the crops' patches as the processor
    prepared them."""
    from transformers.models.molmo2.image_processing_molmo2 import compute_crop_geometry

    images = vlm.processor.image_processor
    patch, crop = int(images.patch_size), int(images.size["height"])
    side = crop // patch
    per_crop, window = side * side, side - sum(images.overlap_margins)
    # pooling: (tokens, pooled) crop-major patch indices into ``crops_pixels`` (crops, patches, pixels), crop 0 the
    # overview; ``image_grid``: the overview's pooled rows and columns, then the canvas's
    low = image_grid[0] * image_grid[1]
    _, wide, height, width = compute_crop_geometry(image.height, image.width, images.max_crops,
                                                   images.overlap_margins, crop, patch)
    token = torch.arange(len(pooling))[:, None].expand_as(pooling)
    taken = pooling >= 0
    patches, owners = pooling[taken], token[taken]
    crops, within = patches // per_crop, patches % per_crop
    canvas = torch.full((height // patch, width // patch), -1)
    first = crops >= 1  # the canvas's crops; crop 0 is the overview
    rows = (crops[first] - 1) // wide * window + within[first] // side
    cols = (crops[first] - 1) % wide * window + within[first] % side
    canvas[rows, cols], source = owners[first], torch.full_like(canvas, -1)
    source[rows, cols] = patches[first]
    overview = torch.full((side, side), -1)
    overview[within[~first] // side, within[~first] % side] = owners[~first]
    if (canvas < 0).any() or (overview < 0).any() or (canvas < low).any() or (overview >= low).any():
        raise ValueError("Molmo 2's pooled tokens do not cover its canvas and its overview one patch each; ask about "
                         "one image")
    _check_count(positions, len(pooling), f"{low} overview tokens and {len(pooling) - low} canvas tokens")
    pixels = crops_pixels.reshape(-1, patch, patch, crops_pixels.shape[-1] // patch ** 2)

    def drawn(chosen: torch.Tensor) -> np.ndarray:  # (h, w) patch indices -> (h x p, w x p, 3) uint8
        h, w = chosen.shape
        tiles = pixels[chosen.flatten()].reshape(h, w, patch, patch, -1).permute(4, 0, 2, 1, 3)
        return seen_pixels(vlm, tiles.reshape(1, -1, h * patch, w * patch))[0]

    whole = ImageLayout(positions, (side, side), 1, 0, overview,
                        pixels=drawn(torch.arange(per_crop).reshape(side, side)))
    return ImageLayout(positions, tuple(canvas.shape), 1, 0, canvas, 1 + int(crops.max()), (side, side), whole,
                       drawn(source))


def _tiles_then_overview(vlm, pixels: torch.Tensor, positions: torch.Tensor, rows: int, cols: int,
                         unit: int | None = None) -> ImageLayout:
    """``rows x cols`` tiles in ``pixels`` row-major, the whole image resized to one tile after them (InternVL's
    thumbnail, Idefics3's global image), each view's units row-major in the prompt in that order; ``unit``: the
    patches a token covers along a side (None: the model's declared one)."""
    ph, pw = vlm.patch_hw
    grid, unit = (pixels.shape[-2] // ph, pixels.shape[-1] // pw), unit or vlm.unit
    per_tile = (grid[0] // unit) * (grid[1] // unit)
    _check_count(positions, (rows * cols + 1) * per_tile, f"{rows}x{cols} tiles and a thumbnail of "
                 f"{grid[0]}x{grid[1]} patches in {unit}x{unit} units")
    seen = seen_pixels(vlm, pixels)
    overview = ImageLayout(positions, grid, unit, 0, tile_index(1, 1, grid, unit, rows * cols * per_tile),
                           pixels=seen[-1])
    return ImageLayout(positions, (rows * grid[0], cols * grid[1]), unit, 0, tile_index(rows, cols, grid, unit),
                       rows * cols + 1, grid, overview, _canvas(seen, rows, cols))


def _pan_and_scan(vlm, image: Image.Image, pixels: torch.Tensor, positions: torch.Tensor) -> ImageLayout:
    """Gemma 3's pan-and-scan (``Gemma3ImageProcessor.pan_and_scan_batched``, ``do_pan_and_scan``): the whole image
    resized to one view first (the overview, "the original image" of the prompt), then its crops, cut side by side
    along the image's longer side (a wide image's in one row, a tall one's in one column, row-major) and each resized
    to one view: each its own image of pooled tokens (``mm_tokens_per_image``), placed on the crops' canvas where
    the processor cut it."""
    crops = pixels.shape[0] - 1
    rows, cols = (1, crops) if image.width >= image.height else (crops, 1)  # as pan_and_scan_batched cuts them
    ph, pw = vlm.patch_hw
    grid, unit = (pixels.shape[-2] // ph, pixels.shape[-1] // pw), vlm.unit
    per_view = (grid[0] // unit) * (grid[1] // unit)
    _check_count(positions, (crops + 1) * per_view, f"the original image and {crops} pan-and-scan crops of "
                 f"{grid[0]}x{grid[1]} patches in {unit}x{unit} units")
    seen = seen_pixels(vlm, pixels)
    overview = ImageLayout(positions, grid, unit, 0, tile_index(1, 1, grid, unit), pixels=seen[0])
    return ImageLayout(positions, (rows * grid[0], cols * grid[1]), unit, 0,
                       tile_index(rows, cols, grid, unit, per_view), crops + 1, grid, overview,
                       _canvas(seen[1:], rows, cols))


def _pan_and_scan_layouts(vlm, inputs, images: Sequence[Image.Image],
                          positions: torch.Tensor) -> tuple[ImageLayout, ...]:
    """Several images Gemma 3's pan-and-scan cuts: the pixel tensor's views and the prompt's image tokens split
    image after image, each image's original view then its crops (``num_crops``, as its image processor cuts that
    image alone), each image placed as it is when asked about alone (``_pan_and_scan``, or its one view)."""
    pixels, processor = inputs["pixel_values"], vlm.processor.image_processor
    crops = [int(processor(images=[image], return_tensors="pt")["num_crops"][0]) for image in images]
    if sum(crops) + len(images) != pixels.shape[0]:
        raise ValueError(f"the processor gave {pixels.shape[0]} views of these {len(images)} images, not the "
                         f"{sum(crops) + len(images)} of their pan-and-scan crops; ask about one image")
    ph, pw = vlm.patch_hw
    grid, unit = (pixels.shape[-2] // ph, pixels.shape[-1] // pw), vlm.unit
    per_view = (grid[0] // unit) * (grid[1] // unit)
    _check_count(positions, pixels.shape[0] * per_view, f"{pixels.shape[0]} views of {len(images)} images, each "
                 f"{grid[0]}x{grid[1]} patches in {unit}x{unit} units")
    layouts, first = [], 0
    for image, n in zip(images, crops, strict=True):
        mine, at = pixels[first:first + n + 1], positions[first * per_view:(first + n + 1) * per_view]
        layouts.append(_pan_and_scan(vlm, image, mine, at) if n else
                       ImageLayout(at, grid, unit, 0, pixels=seen_pixels(vlm, mine)[0]))
        first += n + 1
    return tuple(layouts)


NEXT_TILES = ("llava_next", "llava_next_video", "llava_onevision")  # anyres canvases packed as LLaVA-NeXT packs them


def _next_canvas(vlm, size: torch.Tensor) -> tuple:
    """LLaVA-NeXT's canvas for an image of ``size`` (height, width): its rows and columns of crops, the canvas's
    patch rows and columns ``unpad_image`` keeps, and the token row (column) over each kept patch row (column)."""
    from transformers.models.llava_next.modeling_llava_next import get_anyres_image_grid_shape, unpad_image

    config = vlm.model.config
    if tower_lead(vlm):  # "full" over a tower with a CLS; SigLIP's (Granite Vision's) has none
        raise ValueError("this LLaVA-NeXT keeps CLIP's CLS in every crop (the \"full\" strategy), whose crops "
                         "transformers does not lay out on the canvas either; ask a model of the \"default\" one")
    side = config.vision_config.image_size // config.vision_config.patch_size  # one crop's patches along a side
    rows, cols = get_anyres_image_grid_shape(size, config.image_grid_pinpoints, config.vision_config.image_size)
    # The canvas's patches that unpad_image keeps: which rows and columns, found by unpadding their own indices.
    kept_rows = unpad_image(torch.arange(rows * side).view(1, -1, 1).expand(1, -1, cols * side), size)[0, :, 0]
    kept_cols = unpad_image(torch.arange(cols * side).view(1, 1, -1).expand(1, rows * side, -1), size)[0, 0, :]
    token_rows, token_cols = torch.arange(len(kept_rows)), torch.arange(len(kept_cols))
    if vlm.model_type == "llava_onevision":
        token_rows, token_cols = _downsampled(len(kept_rows), len(kept_cols), side, config.vision_aspect_ratio)
    return rows, cols, kept_rows, kept_cols, token_rows, token_cols


def _next_count(side: int, token_rows: torch.Tensor, token_cols: torch.Tensor) -> int:
    """An anyres image's tokens: its ``side x side``-patch base image's, then its canvas's rows of tokens, each row
    followed by its newline."""
    return side * side + (int(token_rows[-1]) + 1) * (int(token_cols[-1]) + 2)


def _next_layouts(vlm, inputs, positions: torch.Tensor) -> tuple[ImageLayout, ...]:
    """Several images LLaVA-NeXT (OneVision) packs each on its own canvas: the prompt's image tokens split image
    after image by each one's count (its base image's, then its canvas's rows of tokens with their newlines), each
    image placed by ``_next_tiles``."""
    config = vlm.model.config
    side = config.vision_config.image_size // config.vision_config.patch_size
    canvases = [_next_canvas(vlm, size) for size in inputs["image_sizes"]]  # each image's, counted once
    counts = [_next_count(side, *canvas[-2:]) for canvas in canvases]
    _check_count(positions, sum(counts), f"{len(counts)} images' base images and canvases with a newline per row")
    starts = np.cumsum([0, *counts])
    return tuple(_next_tiles(vlm, inputs, positions[starts[k]:starts[k + 1]], k, canvases[k])
                 for k in range(len(counts)))


def _next_tiles(vlm, inputs, positions: torch.Tensor, k: int = 0, canvas: tuple | None = None) -> ImageLayout:
    """LLaVA-NeXT's and LLaVA-OneVision's anyres image (``pack_image_features`` of ``LlavaNextModel`` and
    ``LlavaOnevisionModel``): the base image's patches first (the overview), then the crops of the canvas
    ``select_best_resolution`` chose, each on the tower's grid, laid out row-major on the canvas, its padding rows or
    columns dropped (``unpad_image``: the canvas kept the image's aspect) and a newline token after each row of it,
    which covers no patch. OneVision shrinks a canvas of more than ``anyres_max_N`` base images' patches (ratio over
    1.1) by bilinear interpolation (``_downsampled``): each patch then holds the token sampled nearest its centre.
    ``k``: which of the processor's images (``positions``: its tokens alone; ``canvas``: its ``_next_canvas``,
    where the caller has it)."""
    config = vlm.model.config
    rows, cols, kept_rows, kept_cols, token_rows, token_cols = canvas or _next_canvas(vlm, inputs["image_sizes"][k])
    side = config.vision_config.image_size // config.vision_config.patch_size  # one crop's patches along a side
    height, width = len(kept_rows), len(kept_cols)  # the canvas unpadded
    tokens_high, tokens_wide = int(token_rows[-1]) + 1, int(token_cols[-1]) + 1
    # after the base image, each row of tokens followed by its newline
    index = side * side + token_rows[:, None] * (tokens_wide + 1) + token_cols[None, :]
    seen = seen_pixels(vlm, inputs["pixel_values"][k, :rows * cols + 1])
    patch = config.vision_config.patch_size
    top, left = int(kept_rows[0]) * patch, int(kept_cols[0]) * patch
    canvas = _canvas(seen[1:], rows, cols)[top:top + height * patch, left:left + width * patch]
    overview = ImageLayout(positions, (side, side), 1, 0, tile_index(1, 1, (side, side), 1), pixels=seen[0])
    _check_count(positions, _next_count(side, token_rows, token_cols), f"a {side}x{side}-patch base image and "
                 f"a {tokens_high}x{tokens_wide}-token canvas of {rows}x{cols} crops with a newline per row")
    return ImageLayout(positions, (height, width), 1, 0, index, rows * cols + 1, (side, side), overview, canvas)


def _downsampled(height: int, width: int, side: int, aspect: str) -> tuple[torch.Tensor, torch.Tensor]:
    """LLaVA-OneVision's ``anyres_max_N`` (``LlavaOnevisionModel.pack_image_features``): an unpadded canvas of
    ``height x width`` patches over ``N`` base images' (``side x side`` each) by a ratio over 1.1 is resized to
    ``int(height // ratio) x int(width // ratio)`` tokens by bilinear interpolation (align_corners False): token ``j``
    samples the canvas at ``(j + 0.5) * scale - 0.5``, ``scale = height / tokens``, so patch ``r`` is nearest token
    ``floor((r + 0.5) / scale)``. ``(token row of each patch row, token column of each patch column)``."""
    import math

    # transformers reads N with str.strip("anyres_max_"), which strips those characters from both ends
    most = int(str(aspect).strip("anyres_max_"))  # noqa: B005
    ratio = math.sqrt(height * width / (most * side ** 2))
    if ratio <= 1.1:
        return torch.arange(height), torch.arange(width)
    high, wide = int(height // ratio), int(width // ratio)
    rows = ((torch.arange(height) + 0.5) * high / height).floor().long().clamp(max=high - 1)
    cols = ((torch.arange(width) + 0.5) * wide / width).floor().long().clamp(max=wide - 1)
    return rows, cols


def _gemma3n_layouts(vlm, inputs, n: int) -> tuple[ImageLayout, ...]:
    """Gemma 3n's ``n`` images, each a fixed grid of tokens (``vision_soft_tokens_per_image``) from MobileNetV5's
    multi-scale fusion, row-major, whatever the input's size; image after image in the prompt."""
    positions = (inputs["input_ids"][0] == image_token_id(vlm.model.config)).nonzero()[:, 0]
    side = round(int(vlm.model.config.vision_soft_tokens_per_image) ** 0.5)
    _check_count(positions, n * side * side, f"{n} image(s) of Gemma 3n's {side}x{side} grid of image tokens")
    per = side * side
    return tuple(ImageLayout(positions[k * per:(k + 1) * per], (side, side), 1, 0) for k in range(n))


MAX_IMAGES = 16  # images in one question: each a tower's forward and its tokens in the prompt
ONE_IMAGE = ("florence2",)  # families whose processor takes one image per question (Florence-2's task prompts)
MAX_CLIP_FRAMES = 64  # frames of a clip in one question (Qwen2.5-VL's demos sample 2 fps of a short clip)
# The video placeholder's id, for the families whose clip's tokens are another id than their image's
VIDEO_TOKEN = ("video_token_id", "video_token_index")
CLIP_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "glm4v", "glm4v_moe", "glm46v",
                 "llava_next_video", "internvl", "qwen3_5", "qwen3_5_moe", "llava_onevision", "smolvlm",
                 "molmo2")
# The families that write a clip's frames with their image token (GLM's; InternVL's "FrameN: <img>...</img>";
# SmolVLM's "Frame from 00:00: <global-img>..."; Molmo 2's "<frame_start>...<frame_end>" of its patch token)
FRAMES_AS_IMAGES = ("glm4v", "glm4v_moe", "glm46v", "internvl", "smolvlm", "molmo2")


def clip_layouts(vlm, inputs) -> tuple[ImageLayout, ...]:
    """The layout of each of a clip's temporal slices in the processor's ``inputs``, in order: Qwen-VL's and GLM's
    ``video_grid_thw`` (each slice ``temporal_patch_size`` frames deep, its merge units row-major; GLM writes its
    frames' tokens with its image token), LLaVA-NeXT-Video's frames (each frame's patches pooled
    ``spatial_pool_stride`` x ``spatial_pool_stride`` by its average pooling, row-major), InternVL's frames (each
    one view, "FrameN: <img>...</img>" with its image token, its pixel-shuffle units row-major; SmolVLM's, each
    resized to one view), LLaVA-OneVision's frames (``_onevision_frames``), Molmo 2's (``_molmo2_frames``).
    ValueError (one line) for a model that does not answer about a clip here."""
    config = vlm.model.config
    if vlm.model_type not in CLIP_FAMILIES:
        raise ValueError(f"a {vlm.model_type} model does not answer about a clip here; ask "
                         f"{', '.join(CLIP_FAMILIES)}, or ask about its frames as images")
    if vlm.model_type in FRAMES_AS_IMAGES:
        token = image_token_id(config)
    else:
        token = next(getattr(config, name) for name in VIDEO_TOKEN if getattr(config, name, None) is not None)
    positions = (inputs["input_ids"][0] == token).nonzero()[:, 0]
    if "video_grid_thw" in inputs:
        t, gh, gw = (int(v) for v in inputs["video_grid_thw"][0])
        unit = vlm.unit
    elif "pixel_values_videos" not in inputs:  # InternVL's frames (frames, C, H, W), SmolVLM's (1, frames, C, H, W)
        pixels = _frames(inputs)  # as pixel_values, a view each
        t, gh, gw = pixels.shape[0], pixels.shape[-2] // vlm.patch_hw[0], pixels.shape[-1] // vlm.patch_hw[1]
        unit = vlm.unit
    elif vlm.model_type == "llava_onevision":
        return _onevision_frames(vlm, inputs, positions)
    elif vlm.model_type == "molmo2":
        return _molmo2_frames(vlm, inputs, positions)
    else:  # LLaVA-NeXT-Video: (1, frames, C, H, W)
        pixels = inputs["pixel_values_videos"]
        t, gh, gw = pixels.shape[1], pixels.shape[-2] // vlm.patch_hw[0], pixels.shape[-1] // vlm.patch_hw[1]
        unit = int(config.spatial_pool_stride)
    per = (gh // unit) * (gw // unit)
    _check_count(positions, t * per, f"{t} slices of a clip of {gh}x{gw} patches in {unit}x{unit} units")
    firsts = seen_pixels(vlm, _slice_firsts(vlm, inputs, t, gh, gw), vlm.processor.video_processor)
    return tuple(ImageLayout(positions[k * per:(k + 1) * per], (gh, gw), unit, 0, pixels=firsts[k]) for k in range(t))


def _onevision_frames(vlm, inputs, positions: torch.Tensor) -> tuple[ImageLayout, ...]:
    """LLaVA-OneVision's frames (``LlavaOnevisionModel.apply_pooling``): each frame's ``gh x gw`` patches resized to
    ``ceil(gh / 2) x ceil(gw / 2)`` tokens by bilinear interpolation (align_corners False), row-major, frame after
    frame, then one newline token for the whole clip (it covers no patch). Each patch is placed under the token
    that samples it nearest, as ``_downsampled`` places a shrunk canvas's: patch ``r`` under token
    ``floor((r + 0.5) * tokens / gh)``."""
    import math

    pixels = inputs["pixel_values_videos"]  # (1, frames, C, H, W)
    t, gh, gw = pixels.shape[1], pixels.shape[-2] // vlm.patch_hw[0], pixels.shape[-1] // vlm.patch_hw[1]
    high, wide = math.ceil(gh / 2), math.ceil(gw / 2)
    per = high * wide
    _check_count(positions, t * per + 1, f"{t} frames of {gh}x{gw} patches resized to {high}x{wide} tokens, and a "
                 "newline")
    rows = ((torch.arange(gh) + 0.5) * high / gh).floor().long().clamp(max=high - 1)
    cols = ((torch.arange(gw) + 0.5) * wide / gw).floor().long().clamp(max=wide - 1)
    index = rows[:, None] * wide + cols[None, :]
    firsts = seen_pixels(vlm, pixels[0], vlm.processor.video_processor)
    return tuple(ImageLayout(positions[k * per:(k + 1) * per], (gh, gw), 1, 0, index, pixels=firsts[k])
                 for k in range(t))


def _molmo2_frames(vlm, inputs, positions: torch.Tensor) -> tuple[ImageLayout, ...]:
    """Molmo 2's frames (``Molmo2VideoProcessor``): each frame resized to one crop of ``gh x gw`` patches (no
    overview, no overlapping crops), its tokens each pooled from the patches ``video_token_pooling`` names (frame
    after frame; -1: none), ``video_grids``' rows x columns of them a frame. Each patch is placed under the token that
    pools it, and each frame drawn over its crop's patches as the processor prepared them."""
    frames, rows, cols = (int(v) for v in inputs["video_grids"][0])
    patches = inputs["pixel_values_videos"]  # (frames, patches a frame, pixels a patch)
    videos = vlm.processor.video_processor
    patch = int(videos.patch_size)
    gh, gw = int(videos.size["height"]) // patch, int(videos.size["width"]) // patch
    per, pooling = rows * cols, inputs["video_token_pooling"].long()
    if patches.shape[:2] != (frames, gh * gw) or pooling.shape[0] != frames * per:
        raise ValueError(f"Molmo 2's processor gave {patches.shape[0]} frames of {patches.shape[1]} patches and "
                         f"{pooling.shape[0]} pooled tokens, not {frames} frames of {gh}x{gw} patches and "
                         f"{rows}x{cols} tokens; ask about its frames as images")
    _check_count(positions, frames * per, f"{frames} frames of {rows}x{cols} pooled tokens")
    pixels = patches.reshape(frames, gh, gw, patch, patch, -1).permute(0, 5, 1, 3, 2, 4)
    seen = seen_pixels(vlm, pixels.reshape(frames, -1, gh * patch, gw * patch), videos)
    layouts = []
    for k in range(frames):
        mine = pooling[k * per:(k + 1) * per]
        index = torch.full((gh * gw,), -1)
        token = torch.arange(per)[:, None].expand_as(mine)
        taken = mine >= 0
        index[mine[taken] - k * gh * gw] = token[taken]
        if (index < 0).any():
            raise ValueError("Molmo 2's pooled tokens do not cover each frame's patches; ask about its frames as "
                             "images")
        layouts.append(ImageLayout(positions[k * per:(k + 1) * per], (gh, gw), 1, 0, index.reshape(gh, gw),
                                   pixels=seen[k]))
    return tuple(layouts)


def _frames(inputs) -> torch.Tensor:
    """(frames, C, H, W): a clip's frames its processor hands as ``pixel_values``, one view each: InternVL's
    (frames, C, H, W), SmolVLM's (1, frames, C, H, W)."""
    pixels = inputs["pixel_values"]
    return pixels[0] if pixels.dim() == 5 else pixels


def _slice_firsts(vlm, inputs, t: int, gh: int, gw: int) -> torch.Tensor:
    """(t, C, H, W): the first frame of each of a clip's ``t`` temporal slices as the processor prepared it (resized,
    normalised): LLaVA-NeXT-Video's frames as they are; Qwen-VL's and GLM's flat patches (their video processors'
    ``patchify``: rows (slice, merge row, merge column, unit row, unit column), columns (channel, frame of the
    slice, patch row, patch column)) put back on the frame."""
    if "pixel_values_videos" not in inputs:  # InternVL's and SmolVLM's frames, handed as pixel_values
        return _frames(inputs)
    pixels = inputs["pixel_values_videos"]
    if "video_grid_thw" not in inputs:
        return pixels[0]
    return _unpatchified(pixels, t, gh, gw, vlm.processor.video_processor)


def _unpatchified(patches: torch.Tensor, t: int, gh: int, gw: int, part) -> torch.Tensor:
    """(t, C, H, W): Qwen-VL's and GLM's flat patches (their processors' ``patchify``: rows (slice, merge row, merge
    column, unit row, unit column), columns (channel, frame of the slice, patch row, patch column)) put back on the
    first frame of each of ``t`` slices; ``part``: the image or video processor that made them."""
    m, depth, side = int(part.merge_size), int(part.temporal_patch_size), int(part.patch_size)
    patches = patches.reshape(t, gh // m, gw // m, m, m, -1, depth, side, side)
    return patches.permute(0, 6, 5, 1, 3, 7, 2, 4, 8).reshape(t, depth, -1, gh * side, gw * side)[:, 0]


def _one_view_pixels(vlm, inputs, layouts: tuple[ImageLayout, ...]) -> tuple[ImageLayout, ...]:
    """``layouts`` with the pixels each image read in one view was read as (the processor's normalisation undone), for a
    tower no port reads (``declared.DeclaredTower``), whose preprocessing is not ours to redo: Qwen-VL's and GLM's
    flat patches put back on the image, Nemotron-H Omni's flattened patches put back on its resized image, Pixtral's
    image cut from its padded batch at its ``image_sizes``, else the one view's pixel tensor (none where the
    processor flattened its patches otherwise: the tower's preprocessing of the image is drawn). A port's tower, and
    a tiled layout, keep theirs."""
    from vit.checkpoint import Checkpoint

    if isinstance(vlm.tower, Checkpoint):
        return layouts
    pixels, images = inputs["pixel_values"], vlm.processor.image_processor
    (ph, pw), done, start = vlm.patch_hw, [], 0
    # (patches, C x ph x pw): every image's patches flattened row-major, each channel-major (C, ph, pw), one view an
    # image on the grid its processor names (Nemotron-H Omni's ``image_grid_hw``: the image resized to it)
    flat = (pixels.dim() == 2 and "image_grid_thw" not in inputs and pixels.shape[1] == 3 * ph * pw
            and sum(layout.grid[0] * layout.grid[1] for layout in layouts) == pixels.shape[0])
    for k, layout in enumerate(layouts):
        if layout.pixels is not None or layout.views > 1:  # a tiled layout keeps its canvas
            done.append(layout)
            start += layout.grid[0] * layout.grid[1] if flat else 0
            continue
        if flat:
            (gh, gw), start = layout.grid, start + layout.grid[0] * layout.grid[1]
            view = pixels[start - gh * gw:start].reshape(1, gh, gw, 3, ph, pw)
            view = view.permute(0, 3, 1, 4, 2, 5).reshape(1, 3, gh * ph, gw * pw)  # (1, C, H, W)
        elif "image_grid_thw" in inputs:
            t, gh, gw = (int(v) for v in inputs["image_grid_thw"][k])
            if getattr(images, "temporal_patch_size", None) is None:  # patches not laid as Qwen-VL's (Kimi K2.5's
                done.append(layout)  # row-major (N, C, p, p)): not redrawn, the tower's preprocessing is drawn
                start += t * gh * gw
                continue
            view = _unpatchified(pixels[start:start + t * gh * gw], t, gh, gw, images)[:1]
            start += t * gh * gw
        else:  # (images, C, H, W); Idefics3's (1, images, C, H, W)
            view = pixels[0, k:k + 1] if pixels.dim() == 5 else pixels[k:k + 1] if pixels.dim() == 4 else None
            if view is None or view.shape[-2] < layout.grid[0] * ph or view.shape[-1] < layout.grid[1] * pw:
                done.append(layout)  # flattened patches (LFM2-VL's, Gemma 4's, MiniCPM-V's strip): not redrawn
                continue
        seen = seen_pixels(vlm, view)[0]
        if "image_sizes" in inputs and pixels.dim() == 4:  # Pixtral pads each image to the batch's largest
            h, w = (int(v) for v in inputs["image_sizes"][k])
            seen = seen[:h, :w]
        done.append(replace(layout, pixels=seen))
    return tuple(done)



# The families whose processor cuts an image into tiles, the views of several images in the pixel tensor image
# after image: how many rows and columns of tiles it cuts one image into (each placed by ``_tiles_then_overview``)
TILED = {"internvl": _internvl_canvas, "llama4": _llama4_canvas, "idefics3": _idefics3_canvas,
         "smolvlm": _idefics3_canvas}


def _tiled_layouts(vlm, inputs, images: Sequence[Image.Image], positions: torch.Tensor) -> tuple[ImageLayout, ...]:
    """Several images a model cuts into tiles (``TILED``): the pixel tensor's views and the prompt's image tokens
    split image after image by each image's count of views (its tiles as the processor cuts that image, the whole
    image resized to one tile after them where there are several; one view where not), each image then placed as
    it is when asked about alone (``_tiles_then_overview``, or its one view's grid), its canvas counted once."""
    pixels = inputs["pixel_values"]
    views = pixels[0] if pixels.dim() == 5 else pixels  # Idefics3's (1, views, C, H, W)
    canvases = [TILED[vlm.model_type](vlm, image) for image in images]  # each image's processor run once here
    counts = [rows * cols + 1 if rows * cols > 1 else 1 for rows, cols in canvases]
    if sum(counts) != views.shape[0]:
        raise ValueError(f"the processor gave {views.shape[0]} views of these {len(images)} images, not the "
                         f"{sum(counts)} of their tiles; ask about one image")
    ph, pw = vlm.patch_hw
    grid, unit = (views.shape[-2] // ph, views.shape[-1] // pw), vlm.unit
    per_view = (grid[0] // unit) * (grid[1] // unit)
    _check_count(positions, sum(counts) * per_view, f"{sum(counts)} views of {len(images)} images, each "
                 f"{grid[0]}x{grid[1]} patches in {unit}x{unit} units")
    layouts, first = [], 0
    for (rows, cols), n in zip(canvases, counts, strict=True):
        mine, at = views[first:first + n], positions[first * per_view:(first + n) * per_view]
        layouts.append(_tiles_then_overview(vlm, mine, at, rows, cols) if n > 1 else
                       ImageLayout(at, grid, unit, 0, pixels=seen_pixels(vlm, mine)[0]))
        first += n
    return tuple(layouts)


def one_view_grids(vlm, inputs, n: int) -> list[tuple[int, int]] | None:
    """Each of ``n`` images' patch grid where the processor gave each image one view, as its outputs state it:
    ``image_grid_thw``'s rows (Qwen-VL's, GLM's), ``image_sizes`` beside one pixel tensor (Pixtral's, each image at
    its own size), or the pixel tensor's one view per image over the tower's patch; None where it gave other views
    (tiles, crops). ValueError (one line) for an image several frames deep."""
    if "image_grid_thw" in inputs:
        if any(int(t) != 1 for t, _, _ in inputs["image_grid_thw"].tolist()):
            raise ValueError("the processor gave an image several frames deep; ask about still images")
        return [(int(gh), int(gw)) for _, gh, gw in inputs["image_grid_thw"].tolist()]
    pixels, (ph, pw) = inputs.get("pixel_values"), vlm.patch_hw
    if not isinstance(pixels, torch.Tensor) or pixels.dim() != 4:
        return None
    if "image_sizes" in inputs and len(inputs["image_sizes"]) == n:
        return [(int(h) // ph, int(w) // pw) for h, w in inputs["image_sizes"].tolist()]
    return [(pixels.shape[-2] // ph, pixels.shape[-1] // pw)] * n if pixels.shape[0] == n else None


def _cross_attention_slots(vlm, inputs, images, positions) -> tuple[ImageLayout, ...]:
    """Llama 3.2 Vision: each image's tile slots' states, read through cross-attention (``_mllama_tiles``)."""
    layouts = _mllama_tiles(vlm, inputs)
    if len(layouts) != len(images):
        raise ValueError(f"the processor gave {len(layouts)} images for the {len(images)} asked about; ask about "
                         "one image")
    return layouts


def _fixed_grid(vlm, inputs, images, positions) -> tuple[ImageLayout, ...]:
    """Gemma 3n: each image its fixed grid of tokens from MobileNetV5's multi-scale fusion (``_gemma3n_layouts``)."""
    return _one_view_pixels(vlm, inputs, _gemma3n_layouts(vlm, inputs, len(images)))


def _tiles(vlm, inputs, images, positions) -> tuple[ImageLayout, ...] | None:
    """InternVL, Llama 4, Idefics3, SmolVLM: tiles of a canvas the processor chose and does not state, read as it
    cuts each image (``TILED``, ``_tiled_layouts``); None where each image is one view."""
    return None if one_view_grids(vlm, inputs, len(images)) else _tiled_layouts(vlm, inputs, images, positions)


def _crops(vlm, inputs, images, positions) -> tuple[ImageLayout, ...] | None:
    """Gemma 3's pan-and-scan crops beside each image (``_pan_and_scan_layouts``); None where each is one view."""
    return None if one_view_grids(vlm, inputs, len(images)) else _pan_and_scan_layouts(vlm, inputs, images,
                                                                                        positions)


def _anyres(vlm, inputs, images, positions) -> tuple[ImageLayout, ...] | None:
    """LLaVA-NeXT's and OneVision's anyres canvases (``_next_layouts``, their ``image_sizes`` beside tiles of 5
    dimensions); None where each image is one view."""
    return _next_layouts(vlm, inputs, positions) if inputs["pixel_values"].dim() == 5 else None


# The layouts a processor's outputs and the config do not state (``one_view_grids`` reads the rest): each family's
# function of (vlm, inputs, images, the image token's positions) -> each image's layout, or None where the processor
# gave each image one view. One table, keyed by what a family needs read beside the processor's outputs: tiles'
# canvases (its image processor's cut), crops, cross-attention slots, a fixed grid, pooled crops.
FAMILY_LAYOUTS = {
    **dict.fromkeys(TILED, _tiles),
    "gemma3": _crops,
    **dict.fromkeys(NEXT_TILES, _anyres),
    "mllama": _cross_attention_slots,
    "gemma3n": _fixed_grid,
    "molmo2": lambda vlm, inputs, images, positions: _molmo2_layouts(vlm, inputs, images),
}


def image_layouts(vlm, inputs, images: Sequence[Image.Image]) -> tuple[ImageLayout, ...]:
    """The layout of each of ``images`` in the processor's ``inputs``, in the prompt's order: a family's that
    ``FAMILY_LAYOUTS`` names where its processor cut the images otherwise than one view each, else each image's one
    view on the grid its outputs state (``one_view_grids``), its image tokens in the prompt image after image in
    units of the tower's merge unit after its leading tokens. ValueError (one line) for images cut into views no
    layout places, or image tokens that do not tile the grids."""
    positions = (inputs["input_ids"][0] == image_token_id(vlm.model.config)).nonzero()[:, 0]
    family = FAMILY_LAYOUTS.get(vlm.model_type)
    layouts = family(vlm, inputs, images, positions) if family is not None else None
    if layouts is not None:
        return layouts
    grids = one_view_grids(vlm, inputs, len(images))
    if grids is None:
        which = f"these {len(images)} images" if len(images) > 1 else "the image"
        raise ValueError(f"the processor cut {which} into tiles, whose tokens are not placed per image yet; ask a "
                         "model that reads each image in one view")
    lead, unit = tower_lead(vlm), vlm.unit
    counts = [lead + (gh // unit) * (gw // unit) for gh, gw in grids]
    _check_count(positions, sum(counts), f"{len(images)} image(s) of " + ", ".join(f"{gh}x{gw}" for gh, gw in grids)
                 + f" patches in {unit}x{unit} units")
    starts = np.cumsum([0, *counts])
    return _one_view_pixels(vlm, inputs, tuple(ImageLayout(positions[starts[k]:starts[k + 1]], grid, unit, lead)
                                               for k, grid in enumerate(grids)))
