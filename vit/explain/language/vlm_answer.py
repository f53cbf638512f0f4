"""Where a vision-language model looked when it said each word: each answer token's attention to the image tokens,
through the language model, in bounded memory.

The model answers with transformers' own greedy ``generate`` (``vit.sources.vlm.whole_vlm``). Its language model's
attention runs through one more attention function (``vit.explain.language.vlm_attention``, registered with
transformers' ``AttentionInterface``): the model's own implementation (sdpa, or the eager function of its modelling
file) computes the output, and beside it the last query row of each call is kept, after RoPE (M-RoPE for Qwen), as
the attention gets it: ``(H, d)`` per layer per answer token. Answer token ``i`` was predicted by the last query of
generation step ``i`` (the prompt's last token at step 0), the row ``generate(output_attentions=True)`` returns at
step ``i``. Each token is handed on as soon as ``generate`` chooses it (a stopping criterion, ``_Steps``: the answer
streamed), and a ``vit.core.progress.Stop`` raised by the progress there ends the generation with the tokens so far,
their rows and cache kept.

No layer's ``T x T`` attention is ever held. A row is computed when asked, from the keys the KV cache already holds:
``softmax(q_i K[:t_i]^T * scaling + mask)`` over the ``t_i`` keys that step saw (Gemma's soft cap where the model
has one), ``H x T`` per row, as the eager attention forms it. Its image tokens' share is placed on the tower's patch
grid through the model's own token layout (``visual_lens.on_patch_grid``: LLaVA's patches with or without CLIP's CLS,
Qwen-VL's 2 x 2 merge units, InternVL's pixel-shuffle units, Gemma 3's pooled 4 x 4), the order the projector hands
them to the language model; an image cut into tiles on the tiles' canvas (InternVL's crops, LLaVA-NeXT's and
OneVision's unpadded crops and newline tokens, OneVision's shrunk past ``anyres_max``, Gemma 3's pan-and-scan
crops), its one view of the whole image (InternVL's thumbnail, NeXT's and OneVision's base image, Gemma 3's
original image) as the overview. What this holds is counted before the work (``vit.costs.plan.vlm_answer``).

A sliding-window layer (Gemma 2's and 3's, beside their global ones) has a cache that keeps only its last keys: once
an answer may outgrow the window, its keys are kept beside the cache as each call hands them over (``_Recorder``), and
its row is the eager attention's, the keys inside the window read and the others 0, for every token and any cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from vit.core.progress import Progress, Stop
from vit.explain.language.vlm_attention import attention_layers, image_token_id, recording

MAX_NEW_TOKENS = 512  # an answer, not an essay: each token's query rows are kept, and each step is a forward
MAX_QUESTION_CHARS = 2000
FUSIONS = ("mean", "max")  # how ``VLMAnswer.attention`` fuses the heads when no head is chosen
# An answer token's maps: its attention row at a layer and head, gradient x attention at a layer, or rolled out over
# every layer, AttnLRP to the pixels (``VLMAnswer.relevance``), or its Token Activation Map (``VLMAnswer.tam``)
MAP_METHODS = ("attention", "gradxattn", "gradxattn_rollout", "tam", "attnlrp")
RELEVANCE_METHODS = ("gradxattn", "attnlrp")  # ``VLMAnswer.relevance``'s



@dataclass
class _Recorder:
    """What the recording attention keeps of each call, per layer: the last query row, where the keys it read begin
    and end in the sequence, its mask row over them (None: causal alone) and the scaling and soft cap it was given.

    A sliding-window layer's cache keeps only its last keys (transformers' ``DynamicSlidingWindowLayer``,
    ``StaticSlidingWindowLayer``): where the answer may outgrow the window (``tokens``: the prompt's and the answer's
    most), that layer's keys are kept here as each call hands them over, from the first the prompt's last query reads
    (PaliGemma's prefix reads all of it), so that every answer token's row is formed from the keys it read."""

    layers: dict[torch.nn.Module, int]  # the language model's attention modules -> layer
    tokens: int = 0  # the most positions an answer's calls reach (prompt + new tokens); 0: no window is outgrown
    queries: list[list[torch.Tensor]] = field(default_factory=list)  # [layer][step] (H, d) float32
    seen: list[list[int]] = field(default_factory=list)  # [layer][step] positions read: the query's own and before
    starts: list[list[int]] = field(default_factory=list)  # [layer][step] the position of the call's first key
    masks: list[list[torch.Tensor | None]] = field(default_factory=list)  # [layer][step] (seen - start,) additive
    scaling: list[float] = field(default_factory=list)
    softcap: list[float | None] = field(default_factory=list)
    # [layer] a sliding layer's keys kept here, (Hkv, n, d) chunks in the model's dtype, from position ``kept_from``;
    # None: the layer's cache holds every key its rows read
    keys: list[list[torch.Tensor] | None] = field(default_factory=list)
    kept_from: list[int] = field(default_factory=list)
    # [layer] the decoder layer whose cache holds its keys (a hybrid model's attention layers are not every decoder
    # layer: ``vlm_attention.attention_layers``); None: layer k is decoder layer k
    cache_layers: list[int] | None = None
    # [layer] the window its cache keeps (``cache_windows``), for a model whose attention is not told of it (Llama 4's
    # chunked layers); None: every layer's attention is told (``sliding_window``) or keeps every key
    windows: list[int | None] | None = None

    def __post_init__(self) -> None:
        n = len(self.layers)
        self.queries, self.seen, self.starts = [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)]
        self.masks, self.keys, self.kept_from = [[] for _ in range(n)], [None] * n, [0] * n
        self.scaling, self.softcap = [1.0] * n, [None] * n

    def keep(self, layer: int, query, key, value, attention_mask, kwargs: dict) -> None:
        """Keep ``layer``'s last query row of this call, before the attention runs. (B, H, q, d), B = 1.

        The call's keys (B, Hkv, kv, d) are the cache's as its ``update`` returned them, key ``j`` at position
        ``start + j``: a growing cache's every key (``start`` 0), a sliding one's last ``kv`` (``start`` = positions
        read - kv), a static one's whole buffer, whose places past the query are the future, masked."""
        seen = (self.seen[layer][-1] if self.seen[layer] else 0) + query.shape[-2]
        start = max(seen - key.shape[-2], 0)
        self.queries[layer].append(query[0, :, -1].detach().float().cpu())
        self.seen[layer].append(seen)
        self.starts[layer].append(start)
        mask = None if attention_mask is None else _additive(attention_mask[0, 0, -1, :seen - start])
        self.masks[layer].append(mask)
        scaling = kwargs.get("scaling")
        self.scaling[layer] = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
        self.softcap[layer] = kwargs.get("softcap")
        read = start if mask is None else start + int((mask > _UNREAD).nonzero()[0])  # the first key it reads
        window = kwargs.get("sliding_window")
        if window is None and self.windows is not None:
            window = self.windows[layer]
        if len(self.seen[layer]) == 1 and window is not None and window < self.tokens:
            self.keys[layer], self.kept_from[layer] = [], read
        if self.keys[layer] is not None:  # the positions not kept yet, up to the query's own
            if read < self.kept_from[layer]:  # a window moves forward: no later query reads an earlier key
                raise RuntimeError(f"layer {layer}'s query at position {seen - 1} reads position {read}, before the "
                                   f"kept keys' first ({self.kept_from[layer]})")
            have = self.kept_from[layer] + sum(chunk.shape[-2] for chunk in self.keys[layer])
            # a copy: a static cache rolls its buffer in place, and a view would hold a sliding call's every key
            self.keys[layer].append(key[0, :, have - start:seen - start].detach().clone())

    def keys_read(self, layer: int, step: int, cache) -> tuple[torch.Tensor, int]:
        """``(keys, first)``: the keys (Hkv, n, d) of positions ``first`` to the query's own that ``step``'s call read
        at ``layer``, from what this recorder kept of a sliding layer, else from the layer's ``cache``."""
        seen, start = self.seen[layer][step], self.starts[layer][step]
        kept = self.keys[layer]
        if kept is None:
            decoder = layer if self.cache_layers is None else self.cache_layers[layer]
            keys = cache.layers[decoder].keys[0]  # (Hkv, keys, d)
            if start or keys.shape[-2] < seen:  # a window the attention was not told of (no sliding_window)
                raise ValueError(f"layer {layer}'s cache keeps {keys.shape[-2]} keys from a sliding window, not the "
                                 f"{seen} answer token {step} read; choose another layer")
            return keys[:, :seen], 0
        if len(kept) > 1:
            kept[:] = [torch.cat(kept, dim=-2)]
        first = max(start, self.kept_from[layer])
        return kept[0][:, first - self.kept_from[layer]:seen - self.kept_from[layer]], first

    def output(self, layer: int, output: torch.Tensor) -> None:
        """``layer``'s attention output (B, q, H, d), as the model's attention returns it: not needed here
        (``vit.explain.language.vlm_relevance`` reads it)."""


# Below it a mask's value masks its key, whatever the mask's dtype (an eager mask holds its dtype's lowest, -65504 in
# float16; sdpa's boolean mask becomes -inf here)
_UNREAD = torch.finfo(torch.float16).min / 2


def _additive(mask_row: torch.Tensor) -> torch.Tensor:
    """A mask row as the eager attention adds it: 0 where a key is read, -inf where not (a boolean mask's False)."""
    if mask_row.dtype == torch.bool:
        return torch.zeros(mask_row.shape, dtype=torch.float32).masked_fill(~mask_row.cpu(), float("-inf"))
    return mask_row.detach().float().cpu()


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

    def place(self, values: torch.Tensor) -> torch.Tensor:
        """(W, K) values of the image tokens -> (W, gh, gw) on the patch grid."""
        from vit.explain.methods.visual_lens import on_patch_grid

        if self.index is not None:
            return values[:, self.index]
        return on_patch_grid(values, self.grid, self.unit, self.lead)

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
    strategy keeps CLIP's CLS); 0 for a declared tower (``declared.DeclaredTower``: its merger reads patches only)."""
    from vit.checkpoint import Checkpoint
    from vit.explain.methods.visual_lens import leading_rows

    return leading_rows(vlm.tower.model) if isinstance(vlm.tower, Checkpoint) else 0


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


def _internvl_tiles(vlm, image: Image.Image, pixels: torch.Tensor, positions: torch.Tensor) -> ImageLayout:
    """InternVL's crops (``GotOcr2ImageProcessor.crop_image_to_patches``): the image resized to ``cols x rows``
    tiles, the canvas transformers' ``get_optimal_tiled_canvas`` chooses, cut row-major, the thumbnail (the whole
    image resized to one tile) after them; each tile's pixel-shuffle units row-major."""
    from transformers.models.got_ocr2.image_processing_got_ocr2 import get_optimal_tiled_canvas

    images = vlm.processor.image_processor
    size = images.size
    cols, rows = get_optimal_tiled_canvas((image.height, image.width), (size["height"], size["width"]),
                                          images.min_patches, images.max_patches)
    if pixels.shape[0] != rows * cols + 1:
        raise ValueError(f"the processor gave {pixels.shape[0]} tiles, not the {rows}x{cols} crops and thumbnail "
                         "of InternVL's canvas; ask about one image")
    return _tiles_then_overview(vlm, pixels, positions, rows, cols)


def _idefics3_tiles(vlm, image: Image.Image, pixels: torch.Tensor, positions: torch.Tensor) -> ImageLayout:
    """Idefics3's and SmolVLM's split image (``Idefics3ImageProcessor.split_image``): the image resized to whole
    tiles, cut row-major (its rows and columns as the image processor counts them, ``return_row_col_info``), the
    whole image resized to one tile after them (the global image); each tile's pixel-shuffle units row-major
    (``Idefics3Connector.pixel_shuffle``). An image no larger than one tile is read whole, in one view."""
    counted = vlm.processor.image_processor(images=[[image]], return_row_col_info=True, return_tensors="pt")
    rows, cols = int(counted["rows"][0][0]), int(counted["cols"][0][0])
    if pixels.shape[0] != rows * cols + 1:
        raise ValueError(f"the processor gave {pixels.shape[0]} tiles, not the {rows}x{cols} tiles and global image "
                         "of its split; ask about one image")
    return _tiles_then_overview(vlm, pixels, positions, rows, cols)


def _llama4_tiles(vlm, image: Image.Image, pixels: torch.Tensor, positions: torch.Tensor) -> ImageLayout:
    """Llama 4's chunks (``Llama4ImageProcessor``): the image resized into the canvas of ``aspect_ratios`` tiles it
    chose and padded to fill it, cut row-major, the whole image resized to one tile after them (the global image,
    ``<|image|>`` in the prompt); each tile's pixel-shuffle units row-major, the tile separators no image tokens."""
    counted = vlm.processor.image_processor(images=[image], return_tensors="pt")
    rows, cols = (int(v) for v in counted["aspect_ratios"][0])
    if pixels.shape[0] != rows * cols + 1:
        raise ValueError(f"the processor gave {pixels.shape[0]} tiles, not the {rows}x{cols} tiles and global image "
                         "of its canvas; ask about one image")
    return _tiles_then_overview(vlm, pixels, positions, rows, cols)


def _tiles_then_overview(vlm, pixels: torch.Tensor, positions: torch.Tensor, rows: int, cols: int) -> ImageLayout:
    """``rows x cols`` tiles in ``pixels`` row-major, the whole image resized to one tile after them (InternVL's
    thumbnail, Idefics3's global image), each view's units row-major in the prompt in that order."""
    ph, pw = vlm.patch_hw
    grid, unit = (pixels.shape[-2] // ph, pixels.shape[-1] // pw), vlm.unit
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


NEXT_TILES = ("llava_next", "llava_next_video", "llava_onevision")  # anyres canvases packed as LLaVA-NeXT packs them


def _next_tiles(vlm, inputs, positions: torch.Tensor) -> ImageLayout:
    """LLaVA-NeXT's and LLaVA-OneVision's anyres image (``pack_image_features`` of ``LlavaNextModel`` and
    ``LlavaOnevisionModel``): the base image's patches first (the overview), then the crops of the canvas
    ``select_best_resolution`` chose, each on the tower's grid, laid out row-major on the canvas, its padding rows or
    columns dropped (``unpad_image``: the canvas kept the image's aspect) and a newline token after each row of it,
    which covers no patch. OneVision shrinks a canvas of more than ``anyres_max_N`` base images' patches (ratio over
    1.1) by bilinear interpolation (``_downsampled``): each patch then holds the token sampled nearest its centre."""
    from transformers.models.llava_next.modeling_llava_next import get_anyres_image_grid_shape, unpad_image

    config = vlm.model.config
    if tower_lead(vlm):  # "full" over a tower with a CLS; SigLIP's (Granite Vision's) has none
        raise ValueError("this LLaVA-NeXT keeps CLIP's CLS in every crop (the \"full\" strategy), whose crops "
                         "transformers does not lay out on the canvas either; ask a model of the \"default\" one")
    side = config.vision_config.image_size // config.vision_config.patch_size  # one crop's patches along a side
    size = inputs["image_sizes"][0]  # (height, width) of the image
    rows, cols = get_anyres_image_grid_shape(size, config.image_grid_pinpoints, config.vision_config.image_size)
    # The canvas's patches that unpad_image keeps: which rows and columns, found by unpadding their own indices.
    kept_rows = unpad_image(torch.arange(rows * side).view(1, -1, 1).expand(1, -1, cols * side), size)[0, :, 0]
    kept_cols = unpad_image(torch.arange(cols * side).view(1, 1, -1).expand(1, rows * side, -1), size)[0, 0, :]
    height, width = len(kept_rows), len(kept_cols)  # the canvas unpadded
    token_rows, token_cols = torch.arange(height), torch.arange(width)  # the token row (column) over each patch's
    if vlm.model_type == "llava_onevision":
        token_rows, token_cols = _downsampled(height, width, side, config.vision_aspect_ratio)
    tokens_high, tokens_wide = int(token_rows[-1]) + 1, int(token_cols[-1]) + 1
    # after the base image, each row of tokens followed by its newline
    index = side * side + token_rows[:, None] * (tokens_wide + 1) + token_cols[None, :]
    seen = seen_pixels(vlm, inputs["pixel_values"][0, :rows * cols + 1])
    patch = config.vision_config.patch_size
    top, left = int(kept_rows[0]) * patch, int(kept_cols[0]) * patch
    canvas = _canvas(seen[1:], rows, cols)[top:top + height * patch, left:left + width * patch]
    overview = ImageLayout(positions, (side, side), 1, 0, tile_index(1, 1, (side, side), 1), pixels=seen[0])
    _check_count(positions, side * side + tokens_high * (tokens_wide + 1), f"a {side}x{side}-patch base image and "
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


def image_layout(vlm, inputs, image: Image.Image) -> ImageLayout:
    """The layout of the one ``image`` in the processor's ``inputs``: its patch grid from the pixels the model reads
    (Qwen-VL's ``image_grid_thw``; else the pixel tensor's side over the tower's patch), the unit and prefix tokens
    from our tower (``vlm.unit``, ``visual_lens.leading_rows``); InternVL's and LLaVA-NeXT's tiles on their canvas
    (``_internvl_tiles``, ``_next_tiles``). ValueError (one line) when the image tokens do not tile that grid
    (several images, another family's tiles)."""
    positions = (inputs["input_ids"][0] == image_token_id(vlm.model.config)).nonzero()[:, 0]
    if "image_grid_thw" in inputs:
        t, gh, gw = (int(v) for v in inputs["image_grid_thw"][0])
        if t != 1 or inputs["image_grid_thw"].shape[0] != 1:
            raise ValueError("the processor gave several images or frames; ask about one image")
        layout = ImageLayout(positions, (gh, gw), vlm.unit, tower_lead(vlm))
    else:
        pixels = inputs["pixel_values"]
        if pixels.dim() == 5 and vlm.model_type in ("idefics3", "smolvlm"):  # (1, views, C, H, W)
            layout = (_idefics3_tiles(vlm, image, pixels[0], positions) if pixels.shape[1] > 1 else
                      ImageLayout(positions, (pixels.shape[-2] // vlm.patch_hw[0], pixels.shape[-1] // vlm.patch_hw[1]),
                                  vlm.unit, 0))
        elif pixels.dim() == 4 and pixels.shape[0] > 1 and vlm.model_type == "internvl":
            layout = _internvl_tiles(vlm, image, pixels, positions)
        elif pixels.dim() == 4 and pixels.shape[0] > 1 and vlm.model_type == "llama4":
            layout = _llama4_tiles(vlm, image, pixels, positions)
        elif pixels.dim() == 4 and pixels.shape[0] > 1 and vlm.model_type == "gemma3":
            layout = _pan_and_scan(vlm, image, pixels, positions)
        elif pixels.dim() == 5 and pixels.shape[0] == 1 and vlm.model_type in NEXT_TILES:
            layout = _next_tiles(vlm, inputs, positions)
        elif pixels.dim() != 4 or pixels.shape[0] != 1:
            raise ValueError(f"the processor cut the image into {pixels.shape[0]} tiles, whose tokens are not placed "
                             "on one patch grid yet; ask a model that reads one view of the image")
        else:
            ph, pw = vlm.patch_hw
            layout = ImageLayout(positions, (pixels.shape[-2] // ph, pixels.shape[-1] // pw), vlm.unit, tower_lead(vlm))
    if layout.index is None:
        (gh, gw), unit = layout.grid, layout.unit
        _check_count(positions, layout.lead + (gh // unit) * (gw // unit),
                     f"one {gh}x{gw} patch grid in {unit}x{unit} units")
    return layout


MAX_IMAGES = 16  # images in one question: each a tower's forward and its tokens in the prompt
MAX_CLIP_FRAMES = 64  # frames of a clip in one question (Qwen2.5-VL's demos sample 2 fps of a short clip)
# The video placeholder's id, for the families whose clip's tokens are another id than their image's
VIDEO_TOKEN = ("video_token_id", "video_token_index")
CLIP_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "glm4v", "glm4v_moe", "glm46v",
                 "llava_next_video")


def clip_layouts(vlm, inputs) -> tuple[ImageLayout, ...]:
    """The layout of each of a clip's temporal slices in the processor's ``inputs``, in order: Qwen-VL's and GLM's
    ``video_grid_thw`` (each slice ``temporal_patch_size`` frames deep, its merge units row-major; GLM writes its
    frames' tokens with its image token), LLaVA-NeXT-Video's frames (each frame's patches pooled
    ``spatial_pool_stride`` x ``spatial_pool_stride`` by its average pooling, row-major). ValueError (one line) for
    a model that does not answer about a clip here."""
    config = vlm.model.config
    if vlm.model_type not in CLIP_FAMILIES:
        raise ValueError(f"a {vlm.model_type} model does not answer about a clip here; ask "
                         f"{', '.join(CLIP_FAMILIES)}, or ask about its frames as images")
    if vlm.model_type.startswith("glm4"):
        token = image_token_id(config)
    else:
        token = next(getattr(config, name) for name in VIDEO_TOKEN if getattr(config, name, None) is not None)
    positions = (inputs["input_ids"][0] == token).nonzero()[:, 0]
    if "video_grid_thw" in inputs:
        t, gh, gw = (int(v) for v in inputs["video_grid_thw"][0])
        unit = vlm.unit
    else:  # LLaVA-NeXT-Video: (1, frames, C, H, W)
        pixels = inputs["pixel_values_videos"]
        t, gh, gw = pixels.shape[1], pixels.shape[-2] // vlm.patch_hw[0], pixels.shape[-1] // vlm.patch_hw[1]
        unit = int(config.spatial_pool_stride)
    per = (gh // unit) * (gw // unit)
    _check_count(positions, t * per, f"{t} slices of a clip of {gh}x{gw} patches in {unit}x{unit} units")
    firsts = seen_pixels(vlm, _slice_firsts(vlm, inputs, t, gh, gw), vlm.processor.video_processor)
    return tuple(ImageLayout(positions[k * per:(k + 1) * per], (gh, gw), unit, 0, pixels=firsts[k]) for k in range(t))


def _slice_firsts(vlm, inputs, t: int, gh: int, gw: int) -> torch.Tensor:
    """(t, C, H, W): the first frame of each of a clip's ``t`` temporal slices as the processor prepared it (resized,
    normalised): LLaVA-NeXT-Video's frames as they are; Qwen-VL's and GLM's flat patches (their video processors'
    ``patchify``: rows (slice, merge row, merge column, unit row, unit column), columns (channel, frame of the
    slice, patch row, patch column)) put back on the frame."""
    pixels = inputs["pixel_values_videos"]
    if "video_grid_thw" not in inputs:
        return pixels[0]
    video = vlm.processor.video_processor
    m, depth, side = int(video.merge_size), int(video.temporal_patch_size), int(video.patch_size)
    patches = pixels.reshape(t, gh // m, gw // m, m, m, -1, depth, side, side)
    return patches.permute(0, 6, 5, 1, 3, 7, 2, 4, 8).reshape(t, depth, -1, gh * side, gw * side)[:, 0]




def image_layouts(vlm, inputs, images: Sequence[Image.Image]) -> tuple[ImageLayout, ...]:
    """The layout of each of ``images`` in the processor's ``inputs``, in the prompt's order: one image's
    (``image_layout``), or several that each read in one view, their image tokens in the prompt image after image:
    Qwen-VL's and GLM's ``image_grid_thw`` row by row, Pixtral's ``image_sizes``, else the pixel tensor's one view
    per image. ValueError (one line) for several images a model cuts into tiles."""
    if len(images) == 1:
        return (image_layout(vlm, inputs, images[0]),)
    positions = (inputs["input_ids"][0] == image_token_id(vlm.model.config)).nonzero()[:, 0]
    ph, pw = vlm.patch_hw
    lead, unit = tower_lead(vlm), vlm.unit
    if "image_grid_thw" in inputs:
        grids = []
        for t, gh, gw in inputs["image_grid_thw"].tolist():
            if t != 1:
                raise ValueError("the processor gave an image several frames deep; ask about still images")
            grids.append((int(gh), int(gw)))
    elif "image_sizes" in inputs and inputs["pixel_values"].dim() == 4:  # Pixtral's: each image at its own size
        grids = [(int(h) // ph, int(w) // pw) for h, w in inputs["image_sizes"].tolist()]
    elif inputs["pixel_values"].dim() == 4 and inputs["pixel_values"].shape[0] == len(images):
        grids = [(inputs["pixel_values"].shape[-2] // ph, inputs["pixel_values"].shape[-1] // pw)] * len(images)
    else:
        raise ValueError(f"the processor cut these {len(images)} images into tiles, whose tokens are not placed per "
                         "image yet; ask about one image, or ask a model that reads each image in one view")
    counts = [lead + (gh // unit) * (gw // unit) for gh, gw in grids]
    _check_count(positions, sum(counts), f"{len(images)} images of " + ", ".join(f"{gh}x{gw}" for gh, gw in grids)
                 + f" patches in {unit}x{unit} units")
    starts = np.cumsum([0, *counts])
    return tuple(ImageLayout(positions[starts[k]:starts[k + 1]], grid, unit, lead) for k, grid in enumerate(grids))


# model_type of the families whose checkpoints carry no chat template because their processor lays the prompt out
# itself: PaliGemma's puts its image tokens, bos, the question and a newline (big_vision's prefix)
PROCESSOR_PROMPTS = frozenset({"paligemma"})


def prompt_inputs(vlm, image: Image.Image | Sequence[Image.Image], question: str | None, prompt: str | None,
                  clip: Sequence[Image.Image] | None = None):
    """The processor's inputs for ``image`` (one, or several in order) and ``question`` through the model's chat
    template (or, for a family without one, ``PROCESSOR_PROMPTS``, the processor's own prompt layout), or ``prompt``
    as raw text holding the processor's image placeholder once per image (the template bypassed); ``clip``: its
    frames instead of images, one video entry, the frames as given (no sampling)."""
    if clip is not None:
        if prompt is not None:
            raise ValueError("a clip is asked about through the model's chat template; give question=, not prompt=")
        return _clip_inputs(vlm, clip, question)
    images = list(image) if isinstance(image, (list, tuple)) else [image]
    processor = vlm.processor
    if (question is None) == (prompt is None):
        raise ValueError("give a question (through the model's chat template) or prompt= (raw text), not both")
    text = question if prompt is None else prompt
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_QUESTION_CHARS:
        raise ValueError(f"a question must be text of 1 to {MAX_QUESTION_CHARS} characters, got {str(text)[:40]!r}")
    if prompt is None and not getattr(processor, "chat_template", None) and vlm.model_type in PROCESSOR_PROMPTS:
        text = processor.image_token * len(images) + question  # the processor adds the rest of its prompt
    elif prompt is None:
        if not getattr(processor, "chat_template", None):
            raise ValueError(f"{vlm.folder}'s processor has no chat template; give prompt= with the model's image "
                             f"placeholder instead")
        from vit.explain.language.chat_template import render

        messages = [{"role": "user", "content": [*({"type": "image"} for _ in images),
                                                 {"type": "text", "text": question}]}]
        text = render(processor, messages)  # the folder's own code: rendered under a time and size bound
    else:
        placeholder = getattr(processor, "image_token", None)
        if placeholder and text.count(placeholder) != len(images):
            times = "once" if len(images) == 1 else f"{len(images)} times (once per image)"
            raise ValueError(f"prompt= must hold the model's image placeholder {placeholder!r} {times}, got "
                             f"{text.count(placeholder)}")
    return _in_model_dtype(vlm, processor(images=images, text=text, return_tensors="pt"))


def _in_model_dtype(vlm, inputs):
    """``inputs`` with their floating tensors in the model's dtype, as transformers' examples pass them: Llama 4's
    processor gives bfloat16 pixels (its authors' rescaling), which a float32 model cannot multiply."""
    dtype = getattr(vlm.model, "dtype", None)
    return inputs.to(dtype=dtype) if isinstance(dtype, torch.dtype) and dtype.is_floating_point else inputs


def _clip_inputs(vlm, frames: Sequence[Image.Image], question: str | None):
    """The processor's inputs for a clip of ``frames`` and ``question`` through the chat template's video entry."""
    from vit.explain.language.chat_template import render

    if not isinstance(question, str) or not question.strip() or len(question) > MAX_QUESTION_CHARS:
        raise ValueError(f"a question must be text of 1 to {MAX_QUESTION_CHARS} characters, got {str(question)[:40]!r}")
    if not getattr(vlm.processor, "chat_template", None):
        raise ValueError(f"{vlm.folder}'s processor has no chat template to ask about a clip with")
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": question}]}]
    text = render(vlm.processor, messages)
    video = np.stack([np.asarray(frame.convert("RGB")) for frame in frames])  # (T, H, W, 3)
    return _in_model_dtype(vlm, vlm.processor(videos=[video], text=text, return_tensors="pt", do_sample_frames=False))


def text_shape(vlm):
    """The language model's sizes, as the cost model reads them."""
    from vit.costs.plan import TextShape

    config = vlm.model.config.get_text_config()
    heads = config.num_attention_heads
    kinds, window = getattr(config, "layer_types", None) or (), getattr(config, "sliding_window", None)
    linear = sum(1 for kind in kinds if kind == "linear_attention")  # a hybrid's: a recurrent state, no KV cache
    windows = tuple(window if kind == "sliding_attention" else None for kind in kinds
                    if kind != "linear_attention") if window else ()
    state = 0
    if linear:  # each linear layer's state: its recurrent (value heads x key dim x value dim) and convolution's
        key_dim, value_dim = config.linear_key_head_dim, config.linear_value_head_dim
        value_heads, key_heads = config.linear_num_value_heads, config.linear_num_key_heads
        conv = (2 * key_heads * key_dim + value_heads * value_dim) * config.linear_conv_kernel_dim
        state = linear * (value_heads * key_dim * value_dim * 4 + conv * next(vlm.model.parameters()).dtype.itemsize)
    return TextShape(layers=config.num_hidden_layers - linear, heads=heads, state_bytes=state,
                     kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                     head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
                     hidden=config.hidden_size, mlp=config.intermediate_size, vocab=config.vocab_size,
                     itemsize=next(vlm.model.parameters()).dtype.itemsize, windows=windows)


class VLMAnswer:
    """A VLM's answer to a question about an image: ``tokens`` (the generated ids, as ``generate`` returns them),
    ``text``, ``pieces`` (each token's text) and, for each answer token, its attention to the image
    (``attention``), computed when asked from the kept query rows and the KV cache. ``stopped``: why the generation
    was stopped before its end (its tokens are the first ones of the whole answer), or None."""

    def __init__(self, tokens: tuple[int, ...], text: str, pieces: tuple[str, ...],
                 layout: ImageLayout | tuple[ImageLayout, ...], recorder: _Recorder, cache, prompt_tokens: int,
                 source: tuple | None = None, stopped: str | None = None) -> None:
        self.tokens, self.text, self.pieces = tokens, text, pieces
        self.stopped = stopped  # why the generation was stopped before its end (None: it ended by itself)
        # every image's layout in the prompt's order (a question about several images); ``layout``: the first's
        self.layouts = tuple(layout) if isinstance(layout, tuple) else (layout,)
        self.clip = False  # a question about a clip: ``layouts`` (``image=``) are its temporal slices
        self.layout, self.prompt_tokens = self.layouts[0], prompt_tokens
        self._recorder, self._cache = recorder, cache
        self._source = source  # (vlm, Prepared): what the relevance runs the model on again
        self._lens: dict[int, np.ndarray] = {}  # each token's logit lens once read ((L + 1,) floats each)
        self.layers = len(recorder.queries)
        self.heads = recorder.queries[0][0].shape[0] if self.layers and recorder.queries[0] else 0

    @property
    def grid(self) -> tuple[int, int]:
        """The tower's patch grid the maps are on."""
        return self.layout.grid

    def _token(self, i: int) -> int:
        if isinstance(i, bool) or not isinstance(i, int) or not -len(self.tokens) <= i < len(self.tokens):
            raise ValueError(f"answer token {i} does not exist: the answer has {len(self.tokens)} tokens, numbered 0 "
                             f"to {len(self.tokens) - 1}")
        return i % len(self.tokens)

    def _layer(self, layer: int) -> int:
        if isinstance(layer, bool) or not isinstance(layer, int) or not -self.layers <= layer < self.layers:
            raise ValueError(f"layer {layer} does not exist: the language model has {self.layers} layers, numbered 0 "
                             f"to {self.layers - 1} (or -1 for the last)")
        return layer % self.layers

    def row(self, i: int, layer: int) -> torch.Tensor:
        """Answer token ``i``'s whole attention row at ``layer``: (H, t_i) over every position up to the query that
        predicted it, as the eager attention forms it (float32); at a sliding-window layer the keys outside its
        window hold 0, as in transformers' eager attention."""
        i, layer = self._token(i), self._layer(layer)
        r = self._recorder
        q, seen, start, mask = r.queries[layer][i], r.seen[layer][i], r.starts[layer][i], r.masks[layer][i]  # (H, d)
        keys, first = r.keys_read(layer, i, self._cache)  # (Hkv, seen - first, d)
        keys = keys.float().cpu().repeat_interleave(q.shape[0] // keys.shape[0], dim=0)  # (H, t, d): per query head
        logits = torch.einsum("hd,htd->ht", q, keys) * r.scaling[layer]  # (H, t)
        if r.softcap[layer] is not None:
            logits = torch.tanh(logits / r.softcap[layer]) * r.softcap[layer]
        if mask is not None:
            logits = logits + mask[first - start:]
        row = torch.full((q.shape[0], seen), float("-inf"))  # the keys before the call's (or its kept) first: unread
        row[:, first:] = logits
        return row.softmax(dim=-1)

    def _image(self, image: int) -> ImageLayout:
        """The layout of the question's ``image``-th image; ValueError (one line) for one it does not have."""
        if isinstance(image, bool) or not isinstance(image, int) or not 0 <= image < len(self.layouts):
            raise ValueError(f"image {image} does not exist: the question has {len(self.layouts)} image"
                             f"{'s' if len(self.layouts) > 1 else ''}, numbered 0 to {len(self.layouts) - 1}")
        return self.layouts[image]

    def _one_image(self, what: str) -> None:
        if self.clip:
            raise ValueError(f"{what} is drawn for a question about one image; this one is about a clip: use "
                             "attention or gradxattn, per slice")
        if len(self.layouts) > 1:
            raise ValueError(f"{what} is drawn for a question about one image; this one has {len(self.layouts)}: "
                             "use attention or gradxattn, per image")

    def image_rows(self, i: int, layer: int, image: int = 0) -> torch.Tensor:
        """(H, lead + N): answer token ``i``'s attention to each image token of ``image`` at ``layer``, per head."""
        return self.row(i, layer)[:, self._image(image).positions]

    def attention(self, i: int, layer: int = -1, head: int | None = None, fusion: str = "mean",
                  overview: bool = False, image: int = 0) -> np.ndarray:
        """(gh, gw) float32: answer token ``i``'s attention to the image tokens at ``layer``, each patch holding the
        attention to the image token whose unit covers it; ``head`` None: the heads fused by ``fusion`` ("mean" or
        "max", each image token's own). An image read as tiles: on the tiles' canvas, or, ``overview``, on the
        model's one view of the whole image beside them (InternVL's thumbnail). ``image``: which of the question's
        images (each on its own patch grid, ``layouts[image].grid``)."""
        layout = self._image(image).view(overview)
        if fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {', '.join(FUSIONS)}, got {fusion!r}")
        rows = self.image_rows(i, layer, image)  # (H, lead + N)
        if head is None:
            rows = rows.mean(0, keepdim=True) if fusion == "mean" else rows.amax(0, keepdim=True)
        else:
            if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < rows.shape[0]:
                raise ValueError(f"head {head} does not exist: the language model has {rows.shape[0]} heads, "
                                 f"numbered 0 to {rows.shape[0] - 1}")
            rows = rows[head:head + 1]
        return layout.place(rows)[0].numpy()

    def image_share(self, i: int, layer: int = -1, image: int | None = None) -> float:
        """The share of answer token ``i``'s attention at ``layer`` on the image tokens, mean over heads: how much it
        looked at the image (``image`` None: at every image of the question; an int: at that one)."""
        if image is not None:
            return float(self.image_rows(i, layer, image).sum(-1).mean())
        positions = torch.cat([layout.positions for layout in self.layouts])
        return float(self.row(i, layer)[:, positions].sum(-1).mean())

    def relevance(self, i: int, layer: int | None = None, overview: bool = False,
                  method: str = "gradxattn", image: int = 0) -> np.ndarray:
        """(gh, gw) float32: answer token ``i``'s relevance over the image for the logit of token ``i`` at the query
        that predicted it, on the tower's patch grid. ``method`` "gradxattn": gradient x attention over the image
        tokens (Chefer et al. 2021b), ``layer`` an int: that language-model layer's ``mean_h (dy/dA * A)^+`` row of
        the query; None: the rule's rollout over every layer, ``R = prod_l (I + mean_h (dy/dA_l * A_l)^+)``, its
        query row (``vit.explain.language.vlm_relevance``, counted first by ``vit.costs.plan.vlm_relevance``).
        "attnlrp":
        AttnLRP (Achtibat et al. 2024, lxt's rules) from the logit through every language-model layer, the projector
        and the tower to the pixels, signed, each patch holding its pixels' input x gradient summed over the
        channels (``layer`` None: the rules run through every layer; ``vit.explain.language.vlm_attnlrp``, counted first
        by ``vit.costs.plan.vlm_attnlrp``). One forward and backward of the model over the prompt and the answer's first
        ``i`` tokens. ``overview``: as ``attention``'s."""
        if method not in RELEVANCE_METHODS:
            raise ValueError(f"method must be one of {', '.join(RELEVANCE_METHODS)}, got {method!r}")
        if method == "attnlrp":
            from vit.explain.language.vlm_attnlrp import attnlrp

            if layer is not None:
                raise ValueError("AttnLRP runs from the logit through every layer to the pixels; ask it without a "
                                 "layer")
            self._one_image("AttnLRP")
            vlm, prepared = self._model()
            return attnlrp(vlm, prepared, self.tokens, self._token(i), overview).numpy()
        layout = self._image(image).view(overview)
        return layout.place(self.image_relevance(i, (layer,), image))[0].numpy()

    def image_relevance(self, i: int, layers, image: int = 0) -> torch.Tensor:
        """(len(layers), lead + N): answer token ``i``'s gradient x attention over ``image``'s tokens for each of
        ``layers`` (an int: that layer's row; None: the rollout), all from one forward and backward (``relevance``'s,
        counted first)."""
        from vit.explain.language.vlm_relevance import relevances

        positions = self._image(image).positions
        vlm, prepared = self._model()
        i, layers = self._token(i), tuple(None if layer is None else self._layer(layer) for layer in layers)
        return relevances(vlm, prepared, self.tokens, i, layers, recording)[:, positions]

    def logit_lens(self, i: int) -> np.ndarray:
        """(L + 1,) float32: answer token ``i``'s probability read at the query that predicted it from the stream the
        first decoder layer receives and from each of the language model's ``L`` decoder layers, through its final
        norm and head (the logit lens; the last entry is the model's own prediction): the first layer that "knows"
        the word (``vit.explain.language.vlm_lens``, counted first by ``vit.costs.plan.vlm_lens``)."""
        from vit.explain.language.vlm_lens import logit_lens

        i = self._token(i)
        if i not in self._lens:  # kept: the explorer asks again on every rerun while its table is shown
            vlm, prepared = self._model()
            self._lens[i] = logit_lens(vlm, prepared, self.tokens, i).numpy()
        return self._lens[i].copy()

    def ablate(self, i: int, box: tuple[int, int, int, int], overview: bool = False, how: str = "zero",
               image: int = 0):
        """``vit.explain.language.vlm_lens.Ablation``: answer token ``i``'s logit and probability at the query that
        predicted it, with the image tokens that cover ``box`` = ``(top, left, bottom, right)`` patches of the map's
        grid (``overview``: the overview's; ``image``: of the question's ``image``-th image) ablated (``how``: "zero",
        or "mean" of the image's tokens) and without; two forwards of transformers' model (counted first)."""
        from vit.explain.language.vlm_lens import ablate, region_tokens

        vlm, prepared = self._model()
        layout = self._image(image)
        return ablate(vlm, prepared, self.tokens, self._token(i), region_tokens(layout.view(overview), box), how,
                      layout)

    def segments(self, grid: tuple[int, int] | None = None, masks=None, method: str = "ablation", samples: int = 8,
                 baseline: tuple[int, int, int] = (255, 255, 255)):
        """``vit.explain.language.vlm_segments.SegmentAttribution``: captum 0.9's own ``LLMAttribution`` of this
        answer to segments of the image (a ``grid`` of ``(rows, cols)`` cells, or ``masks``: segment ids or
        ``vit.segment``'s boolean masks), by feature ablation or Shapley value sampling (``method``), each segment
        made absent in the baseline colour and the image through the processor again; its forwards counted and
        bounded first."""
        from vit.explain.language.vlm_segments import segments

        self._one_image("captum's segment attribution")
        vlm, prepared = self._model()
        question, prompt = prepared.asked
        return segments(vlm, prepared, self.tokens, prepared.images[0],
                        lambda shown: prompt_inputs(vlm, shown, question, prompt), grid=grid, masks=masks,
                        method=method, samples=samples, baseline=baseline)

    def ablate_image(self, i: int, image: int, how: str = "zero"):
        """``ablate`` of every image token of the question's ``image``-th image: what that image does to answer token
        ``i`` (a question about several images)."""
        from vit.explain.language.vlm_lens import ablate

        layout = self._image(image)
        vlm, prepared = self._model()
        return ablate(vlm, prepared, self.tokens, self._token(i), torch.arange(len(layout.positions)), how, layout)

    def _model(self) -> tuple:
        if self._source is None:
            raise ValueError("this answer keeps no model to run again; ask it with vit.ask_vlm")
        return self._source

    def tam(self, i: int, overview: bool = False) -> np.ndarray:
        """(gh, gw) float32 in [0, 1]: answer token ``i``'s Token Activation Map (Li et al., ICCV 2025; the authors'
        ``TAM`` in xmed-lab/TAM): its class's logit-lens activation over the image tokens, the earlier text tokens'
        maps removed by estimated causal inference, normalised with the text's activations and smoothed by the rank
        Gaussian filter, each patch holding its image token's value. One forward of the model over the prompt and
        the answer's first ``i`` tokens, counted first (``vit.costs.plan.vlm_tam``; ``vit.explain.language.vlm_tam``,
        where the authors' choices for token 0 are told). ``overview``: as ``attention``'s."""
        from vit.explain.language.vlm_tam import on_layout

        self._one_image("TAM")
        layout = self.layout.view(overview)
        return on_layout(self.image_tam(i), layout)

    def image_tam(self, i: int) -> np.ndarray:
        """(lead + N,) float32: answer token ``i``'s TAM over the image tokens before the rank Gaussian filter (which
        ``tam`` applies on a view's grid): one forward, counted first
        (``vit.explain.language.vlm_tam.image_values``)."""
        from vit.explain.language.vlm_tam import image_values

        vlm, prepared = self._model()
        return image_values(vlm, prepared, self.tokens, self._token(i))

    def held(self) -> tuple[torch.Tensor, ...]:
        """The tensors the answer holds (its query rows and masks, a sliding layer's kept keys, the KV cache), as
        ``vit.core.cache.nbytes`` counts them."""
        r = self._recorder
        rows = [t for layer in (*r.queries, *r.masks, *(k for k in r.keys if k is not None)) for t in layer
                if t is not None]
        cached = [t for layer in self._cache.layers for t in (getattr(layer, "keys", None),
                                                              getattr(layer, "values", None)) if t is not None]
        return (*rows, *cached)

    def __repr__(self) -> str:
        stopped = "" if self.stopped is None else ", stopped"
        return f"VLMAnswer({self.text!r}, {len(self.tokens)} tokens{stopped}, {self.grid[0]}x{self.grid[1]} patches)"


@dataclass(frozen=True)
class Prepared:
    """A question about an image, through the processor, counted and allowed to run: what ``generate_answer``
    reads."""

    inputs: object  # the processor's BatchFeature
    layout: ImageLayout
    prompt_tokens: int
    max_new_tokens: int
    text: object  # TextShape: the language model's sizes
    words: str | None = None  # the question's words (a raw prompt's text after the image placeholder), for TAM
    layouts: tuple[ImageLayout, ...] = ()  # every image's layout, in the prompt's order (``layout``: the first's)
    clip: bool = False  # a question about a clip: ``layouts`` are its temporal slices
    images: tuple = field(default=(), compare=False, repr=False)  # the images asked about (PIL), for captum's segments
    asked: tuple = (None, None)  # (question, prompt) as given: the processor's run again for another image

    def __post_init__(self) -> None:
        if not self.layouts:
            self.layouts = (self.layout,)

    def maps_per_token(self, method: str) -> int:
        """How many maps each answer token has by ``method`` (one of ``MAP_METHODS``): attention one per layer and
        head, gradient x attention one per layer, its rollout, TAM and AttnLRP one."""
        layers, heads = self.text.layers, self.text.heads
        per_token = {"attention": layers * heads, "gradxattn": layers, "gradxattn_rollout": 1, "tam": 1, "attnlrp": 1}
        return per_token[method]

    def maps_bytes(self, itemsize: int = 4, methods: tuple[str, ...] = ("attention",)) -> int:
        """Bytes of every answer token's maps by ``methods`` at most (``new x maps_per_token x gh x gw``), and as
        many on the overview's grid for an image read as tiles."""
        patches = sum(layout.grid[0] * layout.grid[1] + (layout.overview.grid[0] * layout.overview.grid[1]
                                                         if layout.overview is not None else 0)
                      for layout in self.layouts)
        maps = sum(self.maps_per_token(method) for method in set(methods))
        return self.max_new_tokens * maps * patches * itemsize


def prepare(vlm, image: Image.Image | Sequence[Image.Image] | None, question: str | None = None, *,
            prompt: str | None = None, max_new_tokens: int = 32,
            clip: Sequence[Image.Image] | None = None) -> Prepared:
    """``question`` (or ``prompt``) about ``image`` (one, or several in order: at most ``MAX_IMAGES``) through the
    model's processor, its image tokens' layout found (each image's) and what the answer holds counted
    (``vit.costs.plan.vlm_answer``: every image's tower forward): refused in one line over the limit, before any
    forward."""
    from vit.costs.plan import decide, vlm_answer

    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
            or not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"max_new_tokens must be a whole number from 1 to {MAX_NEW_TOKENS}, got {max_new_tokens!r}")
    if clip is not None:
        if image is not None:
            raise ValueError("ask about images or a clip, not both")
        if not 1 <= len(clip) <= MAX_CLIP_FRAMES:
            raise ValueError(f"a clip is asked about in 1 to {MAX_CLIP_FRAMES} frames, got {len(clip)}")
        if vlm.model_type not in CLIP_FAMILIES:
            clip_layouts(vlm, None)  # its one-line refusal, before the processor runs
        inputs = prompt_inputs(vlm, None, question, prompt, clip)
        layouts = clip_layouts(vlm, inputs)
    else:
        images = list(image) if isinstance(image, (list, tuple)) else [image]
        if not 1 <= len(images) <= MAX_IMAGES:
            raise ValueError(f"ask about 1 to {MAX_IMAGES} images at once, got {len(images)}")
        inputs = prompt_inputs(vlm, images, question, prompt)
        layouts = image_layouts(vlm, inputs, images)
    layout = layouts[0]
    prompt_tokens, text = int(inputs["input_ids"].shape[1]), text_shape(vlm)
    # every image's tower forward, each counted at the largest one's grid (a bound for images of other sizes)
    largest = max((lay.view_grid or lay.grid for lay in layouts), key=lambda g: g[0] * g[1])
    decide(vlm_answer(vlm.tower_shape, layout.grid, text, prompt_tokens, max_new_tokens,
                      sum(lay.views for lay in layouts), largest if len(layouts) > 1 else layout.view_grid))
    words = question if prompt is None else prompt.split(getattr(vlm.processor, "image_token", None) or "\0")[-1]
    return Prepared(inputs, layout, prompt_tokens, max_new_tokens, text, words.strip() or None, layouts,
                    clip is not None, tuple(images) if clip is None else (), (question, prompt))


class _Steps:
    """A ``generate`` stopping criterion that hands each answer token, as soon as it is chosen, to ``on_token`` (the
    answer so far: its ids and text) and reports it to ``progress(done, total)``. A ``Stop`` that ``progress`` raises
    ends the generation at once, the token just chosen kept: stopped after ``k`` tokens, the answer has ``k``."""

    def __init__(self, prompt_tokens: int, total: int, tokenizer, progress: Progress | None,
                 on_token: Callable[[tuple[int, ...], str], None] | None) -> None:
        self.prompt_tokens, self.total, self.tokenizer = prompt_tokens, total, tokenizer
        self.progress, self.on_token = progress, on_token
        self.stopped: Stop | None = None

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        """(B, T) the prompt and the answer so far -> (B,) bool: whether to stop now."""
        tokens = tuple(input_ids[0, self.prompt_tokens:].tolist())  # one copy from the device per step
        if self.on_token is not None:
            self.on_token(tokens, self.tokenizer.decode(list(tokens), skip_special_tokens=True))
        if self.progress is not None and self.stopped is None:
            try:
                self.progress(len(tokens), self.total)
            except Stop as e:  # the tokens so far are kept: generate ends after this step
                self.stopped = e
        return torch.full((input_ids.shape[0],), self.stopped is not None, dtype=torch.bool, device=input_ids.device)


def generate_answer(vlm, prepared: Prepared, progress: Progress | None = None,
                    on_token: Callable[[tuple[int, ...], str], None] | None = None) -> VLMAnswer:
    """transformers' greedy ``generate`` on ``prepared``, each language-model layer's last query row recorded.
    Streamed: ``on_token(tokens, text)`` is given the answer so far (its ids, its text) as soon as each token is
    chosen, and ``progress(done, total)`` told each token done; a ``vit.core.progress.Stop`` it raises ends the
    generation there, the answer (``stopped``: why) keeping the tokens so far and every map of theirs. A ``Stop`` before
    the first token propagates: there is nothing to keep."""
    from transformers import StoppingCriteriaList

    tokenizer = vlm.processor.tokenizer
    if progress is not None:
        progress(0, prepared.max_new_tokens)
    steps = _Steps(prepared.prompt_tokens, prepared.max_new_tokens, tokenizer, progress, on_token)
    attending = attention_layers(vlm.language_model)
    decoder_layers = [n for n, _ in attending]
    recorder = _Recorder({module: k for k, (_, module) in enumerate(attending)},
                         prepared.prompt_tokens + prepared.max_new_tokens, cache_layers=decoder_layers,
                         windows=cache_windows(vlm, decoder_layers))
    with recording(vlm, recorder), torch.inference_mode():
        out = vlm.model.generate(**prepared.inputs.to(vlm.device), max_new_tokens=prepared.max_new_tokens,
                                 do_sample=False, num_beams=1, return_dict_in_generate=True,
                                 stopping_criteria=StoppingCriteriaList([steps] if progress or on_token else []))
    tokens = tuple(int(t) for t in out.sequences[0, prepared.prompt_tokens:])
    steps_kept = {len(q) for q in recorder.queries}
    if steps_kept != {len(tokens)}:  # one query row per layer per generated token, or the rows do not match the tokens
        raise RuntimeError(f"recorded {sorted(steps_kept)} steps per layer for {len(tokens)} answer tokens")
    text = tokenizer.decode(list(tokens), skip_special_tokens=True)
    pieces = tuple(tokenizer.decode([t]) for t in tokens)
    answered = VLMAnswer(tokens, text, pieces, prepared.layouts, recorder, out.past_key_values,
                         prepared.prompt_tokens, (vlm, prepared), None if steps.stopped is None else str(steps.stopped))
    answered.clip = prepared.clip
    return answered


def cache_windows(vlm, decoder_layers: list[int]) -> list[int | None]:
    """The keys each of ``decoder_layers``' cache keeps, as transformers builds generate's cache from the text config
    (``cache_utils.get_layer_types_and_kwargs``): a sliding or a chunked layer's window (Llama 4's
    ``attention_chunk_size``), None for a layer whose cache keeps every key."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    try:
        _, per_layer = get_layer_types_and_kwargs(vlm.model.config.get_text_config(decoder=True))
    except (AttributeError, TypeError, ValueError, IndexError):  # a config transformers' cache does not read so
        return [None] * len(decoder_layers)
    return [per_layer[n].get("sliding_window") if n < len(per_layer) else None for n in decoder_layers]


def answer(vlm, image: Image.Image | Sequence[Image.Image] | None, question: str | None = None, *,
           prompt: str | None = None, max_new_tokens: int = 32,
           on_token: Callable[[tuple[int, ...], str], None] | None = None,
           clip: Sequence[Image.Image] | None = None) -> VLMAnswer:
    """``vlm``'s greedy answer to ``question`` about ``image`` (``generate``'s tokens), its query rows recorded:
    ``prepare`` (counted first, refused in one line over the limit), then ``generate_answer`` (``on_token``: given
    the answer so far as each token is chosen)."""
    return generate_answer(vlm, prepare(vlm, image, question, prompt=prompt, max_new_tokens=max_new_tokens,
                                        clip=clip), on_token=on_token)
