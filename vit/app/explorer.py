"""The data behind the explorer page, as plain functions: one forward pass per image, the chosen map, its
settings and limits, the ``.npz`` download. How it is drawn (figures, images, captions) is ``vit.app.drawing``.

The page caches ``analyse`` per (checkpoint, image) and ``class_relevance`` per (checkpoint,
image, class); everything else here is cheap and redone on every interaction. Layers, heads
and patches are 0-based here (as in the arrays and the ``.npz`` download); the UI shows
layers and heads from 1, like the ViT paper. Tokens keep their indices: 0 is CLS, patch
``p`` (row-major) is token ``p + num_prefix_tokens``, as in the attention matrix.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import chain, islice
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps

from vit import bounds
from vit.app import work
from vit.bounds import MAX_TOKENS, TooManyTokens  # noqa: F401 (the pages and tests read them here)
from vit.cache import ByteCache
from vit.checkpoint import Checkpoint, Preprocessing
from vit.explain import mechanism
from vit.explain.attention import (
    class_gradients,
    fuse_heads,
    layer_stats,
    mass_mask,
    positive_gradient_attention,
    relevance_rollout_row,
    rollout_factor,
    rollout_rows,
    rollout_vector,
    token_map,
)
from vit.explain.chunked import LayerInputs, gradient_bytes, largest_tokens
from vit.explain.hidden import LayerAttentions, forward_with_hidden_states, placed_attentions, query_key_hooks
from vit.explain.overlay import attentions_npz_bytes
from vit.images import ImageError, to_mode, to_uint8
from vit.inference import (
    TRAINING_SIZE,
    InputSize,
    Prediction,
    input_shape,
    largest_square_side,
    predictions_from_logits,
    preprocess,
    preprocess_at,
)
from vit.model import ViT, blocks
from vit.model.stages import LayerLayout
from vit.runfiles import lies_inside

MAP_KINDS = {
    "attention": "Attention of one layer",
    "rollout": "Attention rollout",
    "class": "Class-specific (gradient rollout)",
    "legrad": "LeGrad (class-specific)",
    "lrp": "LRP transformer attribution (class-specific)",
    "attnlrp": "AttnLRP (class-specific, signed)",
    "gradcam": "Grad-CAM (class-specific)",
    "gradcam++": "Grad-CAM++ (class-specific)",
    "xgradcam": "XGrad-CAM (class-specific)",
    "eigencam": "EigenCAM (first principal component)",
    "layercam": "LayerCAM (class-specific)",
    "scorecam": "Score-CAM (class-specific, one forward per channel)",
    "flow": "Attention flow (max-flow, slow)",
    "norms": "Token norms (one layer's output)",
    "probe": "Pooling probe (what the embedding reads)",
    "probe_rollout": "Attention rollout from the pooling probe",
}
# Map kinds of models with an attention-pooling head (SigLIP): its learned probe's attention replaces the CLS row.
PROBE_MAP_KINDS = ("probe", "probe_rollout")
# The controls each map kind reads; the page shows only these (a control that does nothing misleads).
MAP_CONTROLS = {
    "attention": ("query", "layer", "head", "fusion"),
    "rollout": ("query", "end_layer", "fusion", "discard_ratio"),
    "class": ("class", "end_layer", "query"),
    "norms": ("layer",),
    "legrad": ("class", "start_layer"),  # the classifier's read-out (CLS, or a Swin's / Hiera's pooling) at each layer
    "lrp": ("class", "end_layer", "query"),
    "attnlrp": ("class",),
    # The CAMs (vit.explain.cam) read one block's first norm: the layer slider's, default the last block
    **{kind: ("class", "end_layer") for kind in ("gradcam", "gradcam++", "xgradcam", "layercam", "scorecam")},
    "eigencam": ("end_layer",),
    "flow": ("query", "end_layer", "fusion"),
    "probe": ("head", "fusion"),
    "probe_rollout": ("end_layer", "fusion", "discard_ratio"),
}
TOP_K = 5
MAX_REFERENCE_IMAGES = 32  # mean ablation's reference set: ViT-B/16 at 224 on 2 cores, 1.8 s per 8 (bench_mechanism)
REFERENCE_CHUNK = 8  # reference images run at once: one chunk's activations are held, not the whole set's
# Memory per analysed image: hidden states + cache + one layer's queries and keys + one chunk of attention stays
# under this (env VIT_ANALYSIS_MEMORY_MB), and inputs with more patches than VIT_MAX_TOKENS are refused
# (vit.bounds: the gate vit.predict shares).
ANALYSIS_MEMORY_LIMIT = bounds.ANALYSIS_MEMORY_LIMIT
CHUNK_BYTES = 64 * 2**20  # one chunk of attention scores (vit.explain.chunked): every map is built from such chunks
LAYER_CACHE_BYTES = 320 * 2**20  # computed layers, queries and keys, rollout factors kept per image
HALF_PRECISION_TOKENS = 1024  # rollout factors above this many tokens are kept in float16


def analysis_limits(max_tokens: int | None = None) -> tuple[int, int]:
    """``(max patches, memory limit in bytes)``: ``max_tokens``, else VIT_MAX_TOKENS (``bounds.max_tokens``), and
    VIT_ANALYSIS_MEMORY_MB, else the defaults."""
    tokens = bounds.max_tokens(max_tokens)
    return tokens, bounds.memory_limit()


def analysis_memory(num_layers: int, num_heads: int, hidden_size: int, tokens: int,
                    cache_bytes: int = LAYER_CACHE_BYTES, logit_bias: bool = False) -> int:
    """Bytes one analysed image can hold at most: hidden states, the cache, one layer's queries and keys and
    one chunk of attention (``CHUNK_BYTES``): every view is built from chunks, so no ``heads x T²`` term. With
    ``logit_bias`` (BEiT's relative positions, SAM's decomposed ones: ``has_logit_bias``), also the query chunk of
    that bias a forward forms at once (``bias_chunk_bytes``)."""
    hidden = (num_layers + 1) * tokens * hidden_size * 4
    bias = bias_chunk_bytes(num_heads, tokens) if logit_bias else 0
    return hidden + cache_bytes + 2 * tokens * hidden_size * 4 + CHUNK_BYTES + bias


def has_logit_bias(config) -> bool:
    """Whether a model adds a bias over a whole layer's tokens to its attention logits (BEiT's relative position
    table, per layer or shared; SAM's decomposed relative positions in its global layers)."""
    return getattr(config, "rel_pos", "none") in ("beit", "beit_shared", "sam")


def bias_chunk_bytes(num_heads: int, tokens: int) -> int:
    """Bytes of the logit bias a forward forms at once over ``tokens`` keys: one query chunk of its rows (``heads x
    rows x T`` float32, at most ``blocks.BIAS_CHUNK_BYTES``; the whole ``heads x T²`` is never formed,
    ``Attention.forward``) and their int32 BEiT index (``rows x T``)."""
    if tokens <= 0:
        return 0
    rows = min(tokens, max(1, blocks.BIAS_CHUNK_BYTES // (num_heads * tokens * 4)))
    return (num_heads + 1) * rows * tokens * 4


def _inputs(analysis: Analysis) -> LayerInputs | None:
    """The analysis's layer inputs for chunked attention (None for attentions given whole)."""
    layers = analysis.attentions
    if not isinstance(layers, LayerAttentions):
        return None
    return LayerInputs(layers.model, layers.hidden[None], layers.grid, budget=CHUNK_BYTES)


def reported_blocks(model, progress: work.Progress | None, total: int):
    """A context in which every block's output (``hook_resid_post``) reports ``progress(blocks run, total)``:
    where a long map's work can be stopped (``progress`` raises ``work.Stopped``). ``total`` counts the blocks
    the method runs (a forward is ``L``; a block run again counts too)."""
    if progress is None or not isinstance(model, ViT):
        return contextlib.nullcontext()
    count = itertools.count(1)
    return model.hooks([(f"blocks.{i}.hook_resid_post", lambda t, hook: progress(min(next(count), total), total))
                        for i in range(len(model.blocks))])


def check_matrix_fits(analysis: Analysis, matrices: int, what: str) -> None:
    """``TooManyTokens`` when ``matrices`` float32 ``T x T`` matrices (a view that shows them whole) with the
    hidden states would be over the memory limit per image."""
    T = analysis.num_tokens
    _, limit = analysis_limits()
    need = matrices * T * T * 4 + (0 if analysis.hidden is None else analysis.hidden.numel() * 4)
    if need > limit:
        raise TooManyTokens(f"{what} at {T:,} tokens needs about {need / 2**20:,.0f} MB, over the "
                            f"{limit / 2**20:,.0f} MB limit per image (VIT_ANALYSIS_MEMORY_MB). Choose a smaller "
                            "input size, or use python -m vit.predict --save-maps, which writes it layer by layer.")


def check_gradient_fits(model, tokens: int, what: str, layers: int | None = None) -> None:
    """``TooManyTokens`` for a gradient method (LRP, AttnLRP, the class-specific map's whole path) whose backward
    pass keeps its layers' attention and gradient, ``4 x layers x H x T²`` floats (``layers``: default all), over
    the memory limit; the message names the largest square input that fits. Checked before any work."""
    need = whole_gradient_bytes(model, tokens, layers)
    _, limit = analysis_limits()
    if need > limit:
        per_token_squared = need // tokens ** 2
        side = largest_square_side(model.config.patch_size,
                                   max(math.isqrt(limit // per_token_squared) - model.num_prefix_tokens, 1))
        raise TooManyTokens(f"{what} keeps every layer's attention and gradient: about {need / 2**20:,.0f} MB at "
                            f"{tokens:,} tokens, over the {limit / 2**20:,.0f} MB limit (VIT_ANALYSIS_MEMORY_MB); "
                            f"the largest square input that fits is {side} px. Choose a smaller input size, or "
                            "another map.")


def whole_gradient_bytes(model, tokens: int, layers: int | None = None) -> int:
    """Bytes of a backward pass that keeps ``layers`` (default all) layers' whole attention and its gradient."""
    config = model.config
    layers = config.num_layers if layers is None else layers
    return 4 * layers * config.num_heads * 4 * tokens * tokens  # attentions, gradients, autograd copies


def check_chunked_gradient_fits(model, tokens: int, what: str, contexts: bool) -> None:
    """``TooManyTokens`` when a chunked gradient method (LeGrad; the class-specific map with ``contexts``, which
    keeps every layer's context gradient) would be over the memory limit (``chunked.gradient_bytes``); the
    message names the largest square input that fits. Checked before any work."""
    config = model.config
    need = gradient_bytes(config.num_layers, config.hidden_size, config.mlp_size, tokens, contexts, CHUNK_BYTES)
    _, limit = analysis_limits()
    if need > limit:
        per_token = gradient_bytes(config.num_layers, config.hidden_size, config.mlp_size, 1, contexts, 0)
        most = largest_tokens(max(limit - CHUNK_BYTES, 0), per_token, 0)
        side = largest_square_side(config.patch_size, max(most - model.num_prefix_tokens, 1))
        raise TooManyTokens(f"{what} keeps every layer's input{' and gradient' if contexts else ''}: about "
                            f"{need / 2**20:,.0f} MB at {tokens:,} tokens, over the {limit / 2**20:,.0f} MB limit "
                            f"(VIT_ANALYSIS_MEMORY_MB); the largest square input that fits is "
                            f"{side} px. Choose a smaller input size, or another map.")


def check_stage_legrad_fits(model, grid: tuple[int, int], start_layer: int = -2, what: str = "LeGrad") -> None:
    """``TooManyTokens`` when LeGrad (``what``; the class-specific map's gradient rollout with ``start_layer`` 0) on
    a model with stages (``relevance.stage_legrad_bytes``: the explained layers' windows and activations in the
    graph, beside what a layer's layout forms, ``bounds.layout_memory``) would be over the memory limit. Checked
    before any work."""
    from vit.explain.relevance import stage_legrad_bytes

    need = stage_legrad_bytes(model, grid, start_layer) + bounds.layout_memory(model, grid).peak
    _, limit = analysis_limits()
    if need > limit:
        raise TooManyTokens(f"{what} keeps the explained layers' attention and activations for the gradient: about "
                            f"{need / 2**20:,.0f} MB at a {grid[0]}x{grid[1]} patch grid, over the "
                            f"{limit / 2**20:,.0f} MB limit (VIT_ANALYSIS_MEMORY_MB). Choose a smaller input size, "
                            "or another map.")


def check_flow_fits(model, tokens: int) -> None:
    """``TooManyTokens`` when attention flow's max-flow problems (one per token, time ~T³) are over its token
    limit (``attention_flow.MAX_FLOW_TOKENS``); the message names the largest square input that fits. Checked
    before the forward that gives it every layer's attention."""
    from vit.explain.attention_flow import MAX_FLOW_TOKENS

    if tokens > MAX_FLOW_TOKENS:
        side = largest_square_side(model.config.patch_size, max(MAX_FLOW_TOKENS - model.num_prefix_tokens, 1))
        raise TooManyTokens(f"Attention flow solves one max-flow problem per token: {tokens:,} tokens is over its "
                            f"limit of {MAX_FLOW_TOKENS} (about 40 s there on 2 cores); the largest square input "
                            f"that fits is {side} px. Choose a smaller input size, or rollout.")


def check_input_fits(checkpoint: Checkpoint, grid: tuple[int, int], what: str = "This input",
                     max_tokens: int | None = None, allow: str = f"raise {bounds.MAX_TOKENS_ENV}") -> None:
    """Raise ``TooManyTokens`` when an input of ``grid`` patches is over the token gate (``max_tokens``, default
    VIT_MAX_TOKENS; ``allow`` says how to raise it) or the memory limit: the analysis (``analysis_memory``) and what
    its attention layouts hold (``bounds.layout_memory``: windows, position biases and indices, pooled queries; a
    model with stages keeps every layer's windows, which its maps, the rollout through the merges too, read)."""
    config, prefix = checkpoint.model.config, checkpoint.model.num_prefix_tokens
    tokens = prefix + grid[0] * grid[1]
    max_tokens, limit = analysis_limits(max_tokens)
    bounds.check_tokens(config, grid[0] * grid[1], f"{what} ({grid[0]}×{grid[1]} patches)", max_tokens, allow)
    layouts = bounds.layout_memory(checkpoint.model, grid, analysis=True)
    need = analysis_memory(config.num_layers, config.num_heads, config.hidden_size, tokens,
                           logit_bias=has_logit_bias(config)) + layouts.total
    if need > limit:
        held = []
        if layouts.kept:
            held.append(f"{(layouts.kept + layouts.maps) / 2**20:,.0f} MB for every layer's windows and the maps "
                        "read from them")
        if layouts.why:
            held.append(f"{layouts.peak / 2**20:,.0f} MB at once for layer {layouts.layer}'s {layouts.why}")
        held = f" ({'; '.join(held)})" if held else ""
        raise TooManyTokens(f"{what} gives {tokens:,} tokens, which needs about {need / 2**20:,.0f} MB for "
                            f"{config.num_layers} layers × {config.num_heads} heads{held}, over the "
                            f"{limit / 2**20:,.0f} MB limit per image (VIT_ANALYSIS_MEMORY_MB). "
                            "Choose a smaller input size.")


def image_digest(data: bytes) -> str:
    """A short content hash: the cache key of an uploaded or sample image."""
    return hashlib.sha256(data).hexdigest()[:20]


def read_image_file(path: str | os.PathLike, folder: str | os.PathLike, max_bytes: int) -> bytes:
    """The bytes of an image file another page names (the Analyse page's mistakes, from an ``analysis.json`` that
    may be written elsewhere): ImageError (one line) unless it is a regular file inside ``folder``, links resolved,
    of at most ``max_bytes`` (the uploads' bound); a device, a FIFO or a file elsewhere is never read."""
    name = Path(path).name
    if not lies_inside(path, folder):
        raise ImageError(f"{name} is not inside the analysed folder")
    try:
        fd = os.open(os.path.realpath(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO does not block
    except OSError as e:
        raise ImageError(f"cannot read {name}: {e.strerror or e}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ImageError(f"{name} is not a regular file")
    with os.fdopen(fd, "rb") as file:
        if info.st_size > max_bytes:
            raise ImageError(f"{name} is {info.st_size / 2**20:.1f} MB, over the {max_bytes / 2**20:.0f} MB uploads "
                             "may have")
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew while read
        raise ImageError(f"{name} is over the {max_bytes / 2**20:.0f} MB uploads may have")
    return data


def sample_label(path: Path) -> str:
    """'cat_1.png' -> 'cat 1'."""
    return Path(path).stem.replace("_", " ")


@dataclass
class Analysis:
    """One image through one checkpoint: the prediction, and every layer's attention when read.

    ``attentions`` reads like the model's ``output_attentions`` tuple (per layer ``(1, H, T, T)``);
    from ``analyse`` it computes each layer from the stored hidden states when first read and
    keeps it in ``cache`` within a byte budget, so memory stays bounded at thousands of tokens.
    """

    prediction: Prediction
    attentions: Sequence[torch.Tensor]  # per layer (1, H, T, T) float32
    grid: tuple[int, int]  # patch grid of the model input (gh, gw), non-square with keep-aspect sizes
    patch_size: int | tuple[int, int]  # the model's: (height, width) for rectangular patches
    input_size: tuple[int, int]  # (height, width) of the model input in pixels
    num_prefix_tokens: int
    hidden: torch.Tensor | None = None  # (L + 1, T, D): every block's input, then the last block's output
    training_size: int | tuple[int, int] | None = None  # the checkpoint's input: its side, or (height, width)
    cache: ByteCache = field(default_factory=lambda: ByteCache(LAYER_CACHE_BYTES), repr=False)
    prefix_names: tuple[str, ...] = ()  # ('CLS', 'DIST', 'REG 1', ...); empty: CLS then numbered prefix tokens
    probe: torch.Tensor | None = None  # (H, T): the attention-pooling probe's attention (SigLIP), else None
    embedding: torch.Tensor | None = None  # (E,): a feature model's pooled (CLIP: projected) embedding
    position_table: bool = True  # False for rotary-only models (DINOv3): nothing is interpolated at other sizes
    sincos_positions: bool = False  # AIMv2-native: sine-cosine positions computed for each grid, no table
    # A model with stages (Swin; vit.model.stages): each layer's grid, windows and shift. ``attentions`` then holds
    # each layer's windows as the layer forms them, ``(nw, H_l, w*w, w*w)``, and ``outputs`` each layer's output
    # ``(T_l, D_l)`` on its own grid; ``grid`` and ``num_tokens`` are the image's patch grid (the first layer's).
    layouts: tuple[LayerLayout, ...] = ()
    outputs: tuple[torch.Tensor, ...] = ()
    # SAM / ViTDet (a plain grid, some layers windowed): the windows' side in patches, tiling the grid from its top
    # left (``vit.model.layouts.window_partition``), and the layers that attend globally instead; 0: no windows.
    window: int = 0
    global_layers: tuple[int, ...] = ()
    # NaFlex at its own sizing: the patch budget its preprocessing fits the image's aspect into (0: another input).
    max_num_patches: int = 0
    max_pixels: int = 0  # Qwen-VL at its own sizing (smart_resize): the pixels it fits the image's aspect into

    @property
    def staged(self) -> bool:
        """Whether the layers have grids of their own (a hierarchical model: Swin)."""
        return bool(self.layouts)

    def heads_in(self, layer: int) -> int:
        """Layer ``layer``'s heads: a stage's own with stages, else every layer's."""
        return self.attentions[layer].shape[1] if self.layouts else self.num_heads

    def layer_grid(self, layer: int) -> tuple[int, int]:
        """Layer ``layer``'s own patch grid: a stage's with stages (halved at each merge), else the input's."""
        return self.layouts[layer].grid if self.layouts else self.grid

    @property
    def has_cls(self) -> bool:
        """Whether token 0 is a CLS token (a SigLIP tower has none: token 0 is its first patch)."""
        return self.num_prefix_tokens > 0 and (not self.prefix_names or self.prefix_names[0] == "CLS")

    @property
    def num_layers(self) -> int:
        return len(self.attentions)

    @property
    def num_heads(self) -> int:
        return getattr(self.attentions, "num_heads", None) or self.attentions[0].shape[1]

    @property
    def num_probe_heads(self) -> int:
        """The pooling probe's heads (PE's probe has 8 whatever its blocks have); 0 without a probe."""
        return self.probe.shape[0] if self.probe is not None else 0

    @property
    def num_tokens(self) -> int:
        return self.num_prefix_tokens + self.grid[0] * self.grid[1]

    @property
    def image_size(self) -> int:
        """The long side of the model input (its side when square)."""
        return max(self.input_size)

    @property
    def at_training_size(self) -> bool:
        """Whether the input is sized as in training: the checkpoint's size, or NaFlex's own rule (trained on each
        image's aspect within its patch budget, not at one size)."""
        return (self.training_size is None or bool(self.max_num_patches or self.max_pixels)
                or self.input_size == self.training_hw)

    def windowed(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) of a SAM / ViTDet attends in windows of ``window`` patches."""
        return bool(self.window) and layer not in self.global_layers

    @property
    def training_hw(self) -> tuple[int, int] | None:
        """The checkpoint's input ``(height, width)``, or None when not known."""
        size = self.training_size
        return (size, size) if isinstance(size, int) else size

    def stats(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-head mean attention distance (px) and entropy (nats), each ``(L, H)``; computed once, layer by layer.
        With stages (Swin, Hiera): each layer's on its own grids with its stage's heads, NaN past them
        (``vit.explain.stages.layer_stats``)."""
        if self.layouts:
            both = self.cache.get_or_compute(("stage_stats",), self._stage_stats)
            return both[0].numpy(), both[1].numpy()

        def compute() -> torch.Tensor:
            rows, inputs = [], _inputs(self)
            for i, attn in enumerate(self.attentions if inputs is None else range(self.num_layers)):
                if inputs is None:
                    st = layer_stats([attn], self.grid, self.patch_size, self.num_prefix_tokens)
                    distance, entropy = st["distance"][0], st["entropy"][0]  # (1, H) each
                else:  # chunk by chunk: never a whole layer
                    distance, entropy = inputs.stats(i, self.grid, self.patch_size, self.num_prefix_tokens)
                rows.append(torch.stack([distance[0], entropy[0]]).float())  # (2, H)
            return torch.stack(rows, dim=1)  # (2, L, H)
        both = self.cache.get_or_compute(("stats",), compute)
        return both[0].numpy(), both[1].numpy()

    def _stage_stats(self) -> torch.Tensor:
        from vit.explain.stages import layer_stats as stage_stats

        distances, entropies = stage_stats(self.attentions, self.layouts, self.patch_size)  # per layer (1, H_l)
        H = max(d.shape[1] for d in distances)
        both = np.full((2, self.num_layers, H), np.nan, dtype=np.float32)
        for i, (d, e) in enumerate(zip(distances, entropies, strict=True)):
            both[:, i, :d.shape[1]] = d[0].numpy(), e[0].numpy()
        return torch.from_numpy(both)  # (2, L, H)

    @property
    def distance(self) -> np.ndarray:
        return self.stats()[0]

    @property
    def entropy(self) -> np.ndarray:
        return self.stats()[1]


@dataclass(frozen=True)
class ViewShape:
    """What an analysis of an image will be shaped like, known before the forward: its input and patch grid, its
    layers' heads, its prefix tokens and pooling probe. The page draws its controls from it while the model runs
    (the browser lays them out meanwhile); it reads like the ``Analysis`` it foretells (``test_view_shape``)."""

    input_size: tuple[int, int]  # (height, width) of the model input in pixels
    grid: tuple[int, int]
    num_prefix_tokens: int
    prefix_names: tuple[str, ...]
    heads: tuple[int, ...]  # each layer's
    num_probe_heads: int  # the attention-pooling probe's (SigLIP, PE); 0 without one
    layouts: tuple[LayerLayout, ...] = ()  # a model with stages: each layer's grid, windows and shift

    @property
    def staged(self) -> bool:
        return bool(self.layouts)

    @property
    def num_layers(self) -> int:
        return len(self.heads)

    @property
    def num_heads(self) -> int:
        return self.heads[0]

    def heads_in(self, layer: int) -> int:
        return self.heads[layer]

    @property
    def num_tokens(self) -> int:
        return self.num_prefix_tokens + self.grid[0] * self.grid[1]

    @property
    def has_cls(self) -> bool:
        return self.num_prefix_tokens > 0 and (not self.prefix_names or self.prefix_names[0] == "CLS")


def view_shape(checkpoint: Checkpoint, image: Image.Image, size: InputSize = TRAINING_SIZE,
               max_tokens: int | None = None, allow: str = f"raise {bounds.MAX_TOKENS_ENV}") -> ViewShape:
    """The shape of ``analyse(checkpoint, image, size)``, without running the model; raises what it raises before
    the forward (``TooManyTokens`` over the limits, ValueError for a size a Swin's windows do not fit)."""
    model = checkpoint.model
    shape = input_shape(image, checkpoint.preprocessing, model.config.patch_size, size)  # (height, width)
    check_input_fits(checkpoint, model.patch_grid(*shape), f"A {shape[1]}×{shape[0]} px input", max_tokens, allow)
    return shape_of_input(checkpoint, shape)


def shape_of_input(checkpoint: Checkpoint, shape: tuple[int, int]) -> ViewShape:
    """The ``ViewShape`` of a model input of ``shape`` (height, width) pixels, its bounds unchecked (``view_shape``
    checks them first)."""
    model = checkpoint.model
    grid = model.patch_grid(*shape)
    heads = tuple(block.attn.num_heads for block in model.blocks)
    if getattr(model.config, "stage_depths", ()):
        return ViewShape(shape, grid, 0, (), heads, 0, model.layer_layouts(grid))
    probe = model.attn_pool.num_heads if isinstance(model, ViT) and model.attn_pool is not None else 0
    return ViewShape(shape, grid, model.num_prefix_tokens, tuple(model.config.prefix_token_names), heads, probe)


def analyse(checkpoint: Checkpoint, image: Image.Image, size: InputSize = TRAINING_SIZE,
            top_k: int = TOP_K, progress: work.Progress | None = None, max_tokens: int | None = None,
            allow: str = f"raise {bounds.MAX_TOKENS_ENV}") -> Analysis:
    """Run the model once on ``image`` at ``size``; layers' attentions are computed when first read.

    Raises ``TooManyTokens`` before running anything when the input is over the limits (``max_tokens``: the
    token gate, default VIT_MAX_TOKENS; ``allow``: how the message says to raise it). ``progress(layers done,
    L)`` after each block (read at its ``hook_resid_post``; it may raise to stop the forward there).
    """
    model, p = checkpoint.model, checkpoint.preprocessing
    patch_size = model.config.patch_size
    view = view_shape(checkpoint, image, size, max_tokens, allow)
    shape, grid = view.input_size, view.grid
    device = next(model.parameters()).device
    x = preprocess([image], p, size, patch_size).to(device)  # (1, C, H, W)
    if view.staged:
        return _analyse_stages(checkpoint, x, grid, shape, top_k, progress, view.layouts)
    L = len(model.blocks)
    reports = [(f"blocks.{i}.hook_resid_post", lambda t, hook, i=i: progress(i + 1, L)) for i in range(L)
               ] if progress is not None and isinstance(model, ViT) else []
    # The first map reads every layer's queries and keys (``query_rows``): kept from this forward, not computed
    # again (a quarter of a forward), while they are a small share of the layer cache.
    kept: dict[int, torch.Tensor] = {}
    tokens = model.num_prefix_tokens + grid[0] * grid[1]
    if isinstance(model, ViT) and 8 * L * tokens * model.config.hidden_size <= LAYER_CACHE_BYTES // 4:
        reports += query_key_hooks(model, kept)
    with torch.inference_mode(), model.hooks(reports) if reports else contextlib.nullcontext():
        logits, hidden = forward_with_hidden_states(model, x)  # (1, classes), (1, L + 1, T, D)
    if logits is None:  # a feature model without a classifier (e.g. DINO): maps, no prediction
        logits = x.new_zeros(x.shape[0], 0)
    [prediction] = predictions_from_logits(logits, checkpoint.class_names, top_k, model=model)
    hidden = hidden[0].float().cpu()
    cache = ByteCache(LAYER_CACHE_BYTES)
    layers = LayerAttentions(model, hidden, cache, grid, kept)
    probe = embedding = None
    if isinstance(model, ViT):
        with torch.inference_mode():
            pooled, probe = model.pool(hidden[-1][None].to(device, next(model.parameters()).dtype))  # (1, H, 1, T)
            if model.head is None:
                embedding = (model.projection(pooled) if model.projection is not None else pooled)[0].float().cpu()
        probe = probe[0, :, 0].float().cpu() if probe is not None else None  # (H, T)
    return Analysis(prediction=prediction, attentions=layers, grid=grid, patch_size=patch_size, input_size=shape,
                    num_prefix_tokens=model.num_prefix_tokens, hidden=hidden, training_size=p.image_size,
                    cache=cache, prefix_names=tuple(model.config.prefix_token_names), probe=probe,
                    embedding=embedding, position_table=getattr(model.config, "pos_embed", True),
                    sincos_positions=getattr(model.config, "sincos_pos", False),
                    window=model.config.window_size, global_layers=tuple(model.config.global_layers),
                    max_num_patches=p.max_num_patches if size == TRAINING_SIZE else 0,
                    max_pixels=p.max_pixels if size == TRAINING_SIZE else 0)


def _analyse_stages(checkpoint: Checkpoint, x: torch.Tensor, grid: tuple[int, int], shape: tuple[int, int],
                    top_k: int, progress: work.Progress | None, layouts: tuple[LayerLayout, ...]) -> Analysis:
    """``analyse`` for a model with stages (Swin, Hiera): one forward keeps each layer's windows as the layer forms them
    (``H x T_l x w*w`` values, never ``T_l²``) and its output (``layouts``: ``model.layer_layouts(grid)``)."""
    model, p = checkpoint.model, checkpoint.preprocessing
    L = len(model.blocks)
    outputs: list[torch.Tensor] = [torch.empty(0)] * L

    def keep(t: torch.Tensor, hook, i: int) -> None:
        outputs[i] = t[0].float().cpu()  # (T_l, D_l)
        if progress is not None:
            progress(i + 1, L)

    with torch.inference_mode(), model.hooks([(f"blocks.{i}.hook_resid_post", partial(keep, i=i))
                                               for i in range(L)]):
        encoding = model.encode(x, output_attentions=True)
    logits = encoding.logits if encoding.logits is not None else x.new_zeros(1, 0)
    [prediction] = predictions_from_logits(logits, checkpoint.class_names, top_k, model=model)
    embedding = encoding.embedding[0].float().cpu() if model.head is None else None
    return Analysis(prediction=prediction, attentions=tuple(a.float().cpu() for a in encoding.attentions),
                    grid=grid, patch_size=model.config.patch_size, input_size=shape, num_prefix_tokens=0,
                    training_size=p.image_size, embedding=embedding, layouts=layouts, outputs=tuple(outputs))


# The maps of a model with stages: each layer's on its own grid (``vit.explain.stages``), the rollout through the
# merges, the token norms, LeGrad (the average pooling's read-out applied at each of the last stage's layers,
# ``relevance.stage_legrad``) and AttnLRP (its rules run through the merges: a map of the input's pixels). The others
# are refused in one line (``stage_refusal``), each for its reason.
STAGE_MAP_KINDS = ("attention", "rollout", "norms", "class", "legrad", "attnlrp", "gradcam", "gradcam++", "xgradcam",
                   "eigencam", "layercam", "scorecam")


def _stage_layer(analysis: Analysis, layer: int) -> int:
    L = analysis.num_layers
    if not -L <= layer < L:
        raise ValueError(f"layer {layer} is out of range for {L} layers")
    return layer % L


def stage_rows(analysis: Analysis, layer: int, patch: int) -> torch.Tensor:
    """With stages: what the token of layer ``layer``'s grid covering ``patch`` (of the image's grid) attends to in
    each head there, ``(H_l, gh_l, gw_l)``, zero outside its window."""
    from vit.explain.stages import clicked_row

    if not 0 <= patch < analysis.num_tokens:
        raise ValueError(f"query patch {patch} is out of range for the {analysis.grid[0]}x{analysis.grid[1]} grid")
    layer = _stage_layer(analysis, layer)
    return analysis.cache.get_or_compute(("stage_rows", layer, patch), lambda: clicked_row(
        analysis.attentions, analysis.layouts, layer, patch)[0])


def stage_map(analysis: Analysis, settings: MapSettings, relevance: ClassRelevance | None = None) -> np.ndarray:
    """With stages: the map of ``settings`` (``query`` a patch of the image's grid): ``attention`` and ``norms`` on
    layer ``layer``'s own grid, ``rollout`` on the image's patch grid (``vit.explain.stages.rollout_row`` from the
    token of layer ``end_layer``'s grid that covers the query), ``class`` the gradient rollout of ``relevance``
    from what the average pooling reads (every token of layer ``end_layer`` alike) to the image's patches."""
    from vit.explain.stages import relevance_rollout_row, rollout_row
    from vit.model.stages import covering_token

    s = settings
    if s.kind == "class":
        wanted = resolved_class(s, analysis)
        if relevance is None or relevance.class_index != wanted or not relevance.layouts:
            raise ValueError(f"the class-specific map needs the gradients of class {wanted}")
        end = _stage_layer(analysis, s.end_layer)
        return relevance_rollout_row(relevance.terms, relevance.layouts, end, None)[0].numpy()
    if s.kind == "attention":
        rows = stage_rows(analysis, s.layer, s.query)  # (H, gh_l, gw_l)
        if s.head is not None:
            if not 0 <= s.head < rows.shape[0]:
                raise ValueError(f"head {s.head} is out of range for this layer's {rows.shape[0]} heads")
            return rows[s.head].numpy()
        return fuse_heads(rows.flatten(1)[None, :, None], s.fusion)[0, 0].reshape(rows.shape[1:]).numpy()
    if s.kind == "rollout":
        if s.discard_ratio:
            raise ValueError("the rollout through stages keeps every attention: set the discard ratio to 0")
        if not 0 <= s.query < analysis.num_tokens:
            raise ValueError(f"query patch {s.query} is out of range for the {analysis.grid[0]}x{analysis.grid[1]} "
                             "grid")
        end = _stage_layer(analysis, s.end_layer)
        token = covering_token(s.query, analysis.grid, analysis.layer_grid(end))
        return analysis.cache.get_or_compute(("stage_rollout", end, token, s.fusion), lambda: rollout_row(
            analysis.attentions, analysis.layouts, end, token, s.fusion)[0].numpy())
    if s.kind == "norms":
        layer = _stage_layer(analysis, s.layer)
        return analysis.outputs[layer].norm(dim=-1).reshape(analysis.layer_grid(layer)).numpy()
    raise ValueError(stage_refusal(s.kind))


def stage_refusal(kind: str) -> str:
    """Why map ``kind`` is not drawn for a model with stages, in one line that names the maps that are."""
    return (f"{MAP_KINDS.get(kind, kind).split(' (')[0]} is not drawn for a model with stages (Swin, Hiera): "
            f"{STAGE_REFUSALS.get(kind, 'its layers each have their own grid')}; choose {', '.join(STAGE_MAP_KINDS)}")


STAGE_REFUSALS = {  # why each map is not drawn for a model with stages
    "lrp": "the transformer attribution multiplies T x T relevance matrices of one grid",
    "flow": "the max-flow graph stacks layers of one grid",
    "probe": "it has no attention-pooling probe",
    "probe_rollout": "it has no attention-pooling probe",
}


def map_kinds(analysis: Analysis | ViewShape, has_classes: bool) -> list[str]:
    """The map kinds this analysis (or the one a view shape foretells) can draw, the default first: the pooling
    probe's for a model without CLS."""
    if analysis.staged:
        return [k for k in STAGE_MAP_KINDS if has_classes or k not in CLASS_MAP_KINDS]
    probe = analysis.num_probe_heads > 0
    kinds = [k for k in MAP_KINDS if (has_classes or k != "class") and (probe or k not in PROBE_MAP_KINDS)]
    if probe and not analysis.has_cls:
        kinds = list(PROBE_MAP_KINDS) + [k for k in kinds if k not in PROBE_MAP_KINDS]
    return kinds


def map_choice(chosen: str | None, previous_default: str | None, choices: list[str], model_changed: bool) -> str:
    """The map to show of ``choices`` (the model's default first): the one ``chosen`` while it fits; after a model
    change, the new model's default when ``chosen`` was only the previous model's default (a session starts on
    the default checkpoint's CLS attention; SigLIP then opens on its pooling probe, not on a patch's attention)."""
    if chosen not in choices or model_changed and chosen == previous_default:
        return choices[0]
    return chosen


@dataclass
class ClassRelevance:
    """One class's gradients for its map. Within the memory bound: per layer Chefer et al.'s positive
    gradient-weighted attention ``(1, T, T)`` (``terms``); above it, the gradient of every layer's heads'
    contexts ``(1, L, T, H, hd)`` and the layer inputs, from which each map's row is formed in chunks."""

    class_index: int
    terms: tuple[torch.Tensor, ...]  # per layer (1, T, T); empty when chunked; a Swin's: per layer its windows'
    layouts: tuple[LayerLayout, ...] = ()  # a model with stages (Swin, Hiera): each layer's grid and windows
    inputs: LayerInputs | None = None  # chunked: the layer inputs of the image
    contexts: torch.Tensor | None = None  # chunked: (1, L, T, H, hd)
    rows: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict, repr=False)  # chunked rows, per map

    def row(self, query: int, end_layer: int) -> torch.Tensor:
        """Row ``query`` of the gradient rollout up to ``end_layer``: ``(1, T)``."""
        if self.inputs is None:
            return relevance_rollout_row(self.terms, query, end_layer)
        if (query, end_layer) not in self.rows:
            self.rows[(query, end_layer)] = self.inputs.gradient_rollout_row(self.contexts, query, end_layer)
        return self.rows[(query, end_layer)]


def class_relevance(checkpoint: Checkpoint, image: Image.Image, class_index: int,
                    size: InputSize = TRAINING_SIZE, progress: work.Progress | None = None) -> ClassRelevance:
    """One forward and backward pass for ``class_index`` (the page caches it per checkpoint, image and class).

    While every layer's attention and its gradient fit the memory limit they are kept whole; above, one block's
    backward at a time keeps the gradient of its heads' contexts, and the map's row is formed in chunks
    (``LayerInputs.gradient_rollout_row``). ``TooManyTokens`` when even that would be over the limit.
    ``progress(blocks run, total)`` at each block's output (``reported_blocks``).
    """
    model, p = checkpoint.model, checkpoint.preprocessing
    shape = input_shape(image, p, model.config.patch_size, size)
    grid = model.patch_grid(*shape)
    tokens = model.num_prefix_tokens + grid[0] * grid[1]
    device = next(model.parameters()).device
    if model.config.stage_depths:  # a Swin's windows: H x T x w*w values per layer, never T x T
        check_stage_legrad_fits(model, grid, 0, "The class-specific map")  # every layer's windows and gradients
        layouts = model.layer_layouts(grid)
        x = preprocess([image], p, size, model.config.patch_size).to(device)
        with reported_blocks(model, progress, len(model.blocks)):
            _, attentions, gradients = class_gradients(model, x, class_index)
        return ClassRelevance(class_index, tuple(positive_gradient_attention(a, g).float().cpu()
                                                 for a, g in zip(attentions, gradients, strict=True)), layouts=layouts)
    whole = whole_gradient_bytes(model, tokens) <= analysis_limits()[1]
    if not whole:
        check_chunked_gradient_fits(model, tokens, "The class-specific map", contexts=True)
    x = preprocess([image], p, size, model.config.patch_size).to(device)  # (1, C, H, W)
    L = len(model.blocks)
    if whole:
        with reported_blocks(model, progress, L):
            _, attentions, gradients = class_gradients(model, x, class_index)
        terms = tuple(positive_gradient_attention(a, g).float().cpu()
                      for a, g in zip(attentions, gradients, strict=True))
        return ClassRelevance(class_index, terms)
    with reported_blocks(model, progress, 2 * L):  # a forward, then each block again
        with torch.inference_mode():
            _, hidden = forward_with_hidden_states(model, x)  # (1, L + 1, T, D)
        inputs = LayerInputs(model, hidden, grid, budget=CHUNK_BYTES)
        contexts = inputs.context_gradients(torch.tensor([class_index]))
    return ClassRelevance(class_index, (), inputs=inputs, contexts=contexts)


@dataclass(frozen=True)
class MapSettings:
    """Which attention map to draw. Defaults: the seed blog's figure (last layer, CLS query, mean over heads)."""

    kind: str = "attention"  # a key of MAP_KINDS
    layer: int = -1  # 0-based, negative from the end; for kind "attention"
    head: int | None = None  # 0-based; None fuses the heads with ``fusion``
    fusion: str = "mean"  # mean, max or min over heads (kind "attention" with head None, and "rollout")
    query: int = 0  # the token whose attention is shown; 0 is CLS
    discard_ratio: float = 0.0  # rollout: share of each row's lowest patch attentions dropped
    end_layer: int = -1  # rollout and class maps: last layer included, 0-based, negative from the end
    class_index: int | None = None  # class map: None means the predicted class
    start_layer: int = -2  # LeGrad: the first layer explained, 0-based, negative from the end (the authors' default)


def resolved_class(settings: MapSettings, analysis: Analysis) -> int:
    """The class of the class-specific map: the chosen one, else the predicted one."""
    return analysis.prediction.class_index if settings.class_index is None else settings.class_index


def query_rows(analysis: Analysis, query: int) -> torch.Tensor:
    """What ``query`` attends to in every layer and head: ``(L, H, T)`` (cached per query)."""
    if not 0 <= query < analysis.num_tokens:
        raise ValueError(f"query token {query} is out of range for {analysis.num_tokens} tokens")
    def compute() -> torch.Tensor:
        if isinstance(analysis.attentions, LayerAttentions):  # cheap: no full matrix needed
            return analysis.attentions.rows(query)
        return torch.stack([a[0, :, query].float() for a in analysis.attentions])

    return analysis.cache.get_or_compute(("rows", query), compute)


def layer_attention(analysis: Analysis, layer: int, head: int | None, fusion: str = "mean") -> torch.Tensor:
    """One layer's ``(1, T, T)`` attention: one head's, or the heads fused by mean, max or min (from chunks:
    ``TooManyTokens`` when even the one ``T x T`` matrix is over the memory limit)."""
    if analysis.layouts:
        raise ValueError("the token-by-token matrix is drawn for one patch grid; this model's layers each have "
                         "their own (stages): read one layer's map instead")
    H, inputs = analysis.num_heads, _inputs(analysis)
    if head is not None and not 0 <= head < H:
        raise ValueError(f"head {head} is out of range for {H} heads")
    if inputs is None:
        attn = analysis.attentions[layer]  # (1, H, T, T)
        return fuse_heads(attn, fusion) if head is None else attn[:, head]
    check_matrix_fits(analysis, 2, "The token-by-token matrix")
    if head is not None:
        return inputs.rows(layer, range(analysis.num_tokens), heads=[head])[:, 0]  # (1, T, T)
    return torch.cat([rows.cpu() for _, rows in inputs.fused_rows(layer, None, fusion)], dim=1)  # (1, T, T)


def _rollout_factors(analysis: Analysis, fusion: str, discard_ratio: float, end_layer: int) -> list[torch.Tensor]:
    """``rollout_factor`` of layers 0..end_layer, cached per image (float16 above HALF_PRECISION_TOKENS tokens),
    each built from chunks of its layer."""
    L = analysis.num_layers
    if not -L <= end_layer < L:
        raise ValueError(f"end_layer {end_layer} is out of range for {L} layers")
    dtype = torch.float16 if analysis.num_tokens > HALF_PRECISION_TOKENS else torch.float32
    inputs = _inputs(analysis)

    def factor(i: int) -> torch.Tensor:
        if inputs is not None:
            return inputs.factor(i, fusion, discard_ratio, analysis.num_prefix_tokens, dtype)  # (1, T, T)
        return rollout_factor(analysis.attentions[i], fusion, discard_ratio, analysis.num_prefix_tokens).to(dtype)

    return [analysis.cache.get_or_compute(("factor", i, fusion, discard_ratio), lambda i=i: factor(i))
            for i in range(end_layer % L + 1)]


def factors_fit(analysis: Analysis) -> bool:
    """Whether every layer's rollout factor fits in half the cache (then they are kept and a new query is one
    vector product per layer); above, each rollout row is a row vector through chunks (``LayerInputs``)."""
    itemsize = 2 if analysis.num_tokens > HALF_PRECISION_TOKENS else 4
    return _inputs(analysis) is None or analysis.num_layers * analysis.num_tokens ** 2 * itemsize <= \
        analysis.cache.max_bytes // 2


def rollout_row(analysis: Analysis, fusion: str, discard_ratio: float, end_layer: int, query: int | None = None,
                row: torch.Tensor | None = None, progress: work.Progress | None = None) -> torch.Tensor:
    """The rollout's row for ``query`` (or ``row (1, T) @`` the rollout), ``(1, T)``: from the cached factors
    while they fit, else by row vector from the last layer down, each layer recomputed in chunks (kept in the
    analysis's cache; ``progress(layers done, layers)`` after each chunk, where it may stop the work)."""
    if factors_fit(analysis):
        factors = _rollout_factors(analysis, fusion, discard_ratio, end_layer)
        return rollout_rows(factors, query) if row is None else rollout_vector(factors, row)
    inputs = _inputs(analysis)
    key = ("rollout_row", query if row is None else tuple(row.flatten().tolist()), fusion, discard_ratio, end_layer)
    return analysis.cache.get_or_compute(key, lambda: inputs.rollout_row(query, row, fusion, discard_ratio, end_layer,
                                                                         analysis.num_prefix_tokens, progress))


def rollout_map(analysis: Analysis, settings: MapSettings, progress: work.Progress | None = None) -> np.ndarray:
    """The ``(gh, gw)`` map of a ``rollout`` or ``probe_rollout`` setting (see ``rollout_row``): the page computes
    it as long work when it is built from chunks (``factors_fit`` False), seconds to minutes."""
    s = settings
    if s.kind == "rollout":
        if not 0 <= s.query < analysis.num_tokens:
            raise ValueError(f"query token {s.query} is out of range for {analysis.num_tokens} tokens")
        return _patch_map(rollout_row(analysis, s.fusion, s.discard_ratio, s.end_layer, s.query, progress=progress)[0],
                          analysis)
    if analysis.probe is None:
        raise ValueError("this model has no attention-pooling probe; choose another map")
    row = fuse_heads(analysis.probe[None, :, None], s.fusion)[:, 0]  # (1, T)
    return _patch_map(rollout_row(analysis, s.fusion, s.discard_ratio, s.end_layer, row=row, progress=progress)[0],
                      analysis)


def token_norms(analysis: Analysis, layer: int) -> torch.Tensor:
    """The L2 norm of every token after layer ``layer`` (0-based, negative from the end): ``(T,)``.

    High-norm patch tokens are the "artifacts" of Darcet et al. (2023), which register tokens remove.
    """
    if analysis.hidden is None:
        raise ValueError("this analysis has no hidden states; run explorer.analyse")
    L = analysis.num_layers
    if not -L <= layer < L:
        raise ValueError(f"layer {layer} is out of range for {L} layers")
    return analysis.hidden[layer % L + 1].float().norm(dim=-1)  # (T,)


def _patch_map(row: torch.Tensor, analysis: Analysis) -> np.ndarray:
    """A ``(T,)`` row -> the ``(gh, gw)`` map of its patch entries."""
    return row[analysis.num_prefix_tokens:].reshape(analysis.grid).float().numpy()


def attention_map(analysis: Analysis, settings: MapSettings, relevance: ClassRelevance | None = None,
                  method_map: np.ndarray | None = None) -> np.ndarray:
    """The ``(gh, gw)`` map to draw: row ``settings.query`` of the chosen token-by-token matrix, patch keys only
    (for the token-norm map: each patch token's norm after the layer).

    The class-specific map needs ``relevance`` for ``resolved_class(settings, analysis)``; the kinds
    of ``METHOD_MAP_KINDS`` need ``method_map``, from ``model_method_map`` (which the page caches).
    """
    s = settings
    if s.kind in METHOD_MAP_KINDS and (not analysis.layouts or s.kind in STAGE_MAP_KINDS):
        if method_map is None:
            raise ValueError(f"the {MAP_KINDS[s.kind]} map must be computed with model_method_map first")
        return method_map
    if analysis.layouts:
        return stage_map(analysis, s, relevance)
    if s.kind == "attention":
        rows = query_rows(analysis, s.query)[s.layer]  # (H, T)
        if s.head is not None:
            if not 0 <= s.head < rows.shape[0]:
                raise ValueError(f"head {s.head} is out of range for {rows.shape[0]} heads")
            return _patch_map(rows[s.head], analysis)
        return _patch_map(fuse_heads(rows[None, :, None], s.fusion)[0, 0], analysis)  # fusing rows = row of fusion
    if s.kind == "rollout":
        return rollout_map(analysis, s)
    if s.kind == "class":
        wanted = resolved_class(s, analysis)
        if relevance is None or relevance.class_index != wanted:
            raise ValueError(f"the class-specific map needs the gradients of class {wanted}")
        if not 0 <= s.query < analysis.num_tokens:
            raise ValueError(f"query token {s.query} is out of range for {analysis.num_tokens} tokens")
        return _patch_map(relevance.row(s.query, s.end_layer)[0], analysis)
    if s.kind == "norms":
        return _patch_map(token_norms(analysis, s.layer), analysis)
    if s.kind in PROBE_MAP_KINDS:
        if analysis.probe is None:
            raise ValueError("this model has no attention-pooling probe; choose another map")
        probe = analysis.probe  # (H, T)
        if s.kind == "probe":
            if s.head is not None:
                if not 0 <= s.head < probe.shape[0]:
                    raise ValueError(f"head {s.head} is out of range for {probe.shape[0]} heads")
                return _patch_map(probe[s.head], analysis)
            return _patch_map(fuse_heads(probe[None, :, None], s.fusion)[0, 0], analysis)
        return rollout_map(analysis, s)
    raise ValueError(f"unknown map kind {s.kind!r}; choose one of: {', '.join(MAP_KINDS)}")


def head_maps(analysis: Analysis, query: int, layer: int | None = None) -> np.ndarray:
    """Every head's map for ``query``: ``(H, gh, gw)`` for one layer, ``(L, H, gh, gw)`` when ``layer`` is None.
    With stages ``query`` is a patch of the image, and the maps ``(H_l, gh_l, gw_l)`` are on the layer's own grid."""
    if analysis.layouts:
        if layer is None:
            raise ValueError("this model's layers have their own grids and heads (stages): ask for one layer")
        return stage_rows(analysis, layer, query).numpy()
    rows = query_rows(analysis, query)[:, :, analysis.num_prefix_tokens:]  # (L, H, gh*gw)
    maps = rows.reshape(*rows.shape[:2], *analysis.grid).numpy()  # (L, H, gh, gw)
    return maps if layer is None else maps[layer]


def map_mask(map2d: np.ndarray, share: float) -> np.ndarray:
    """DINO's mask of a ``(gh, gw)`` map: the patches holding ``share`` of its mass (see ``mass_mask``)."""
    return mass_mask(torch.from_numpy(np.ascontiguousarray(map2d, dtype=np.float32)), share).numpy()


def patch_of(token: int, num_prefix_tokens: int = 1) -> int | None:
    """The row-major patch index of a token, None for a prefix (CLS) token."""
    return token - num_prefix_tokens if token >= num_prefix_tokens else None


def visible_tokens(num_tokens: int, num_prefix_tokens: int, hide_registers: bool) -> list[int]:
    """Token indices to offer and draw: all, or without the prefix tokens after CLS (registers, distillation)."""
    if not hide_registers:
        return list(range(num_tokens))
    return [0] + list(range(num_prefix_tokens, num_tokens))


def invert_image(image: Image.Image) -> Image.Image:
    """The greyscale image with black and white swapped (for digits written dark on light)."""
    return ImageOps.invert(to_mode(image, 1))


def looks_inverted(image: Image.Image, preprocessing: Preprocessing) -> bool:
    """Whether a 1-channel model's input is nearer the training data's mean brightness once inverted.

    Only meaningful when the training mean is far from mid-grey (MNIST's is 0.13); otherwise False.
    """
    if preprocessing.num_channels != 1 or abs(preprocessing.mean[0] - 0.5) < 0.15:
        return False
    brightness = float(to_uint8(image, preprocessing.image_size, 1).float().mean()) / 255.0
    mean = preprocessing.mean[0]
    return abs((1.0 - brightness) - mean) < abs(brightness - mean)


NPZ_PRECISIONS = ("float32", "float16")


def check_npz_fits(analysis: Analysis, layers: Sequence[int] | None = None, precision: str = "float32") -> None:
    """``TooManyTokens`` when ``attentions_npz`` of these layers would be over the memory limit per image: the page
    asks before it offers the download, whose data is built only when it is clicked."""
    if analysis.layouts:
        raise ValueError("the .npz holds token-by-token matrices of one grid; this model's layers each have "
                         "their own (stages): use vit.explain.stages on model(x, output_attentions=True)")
    if precision not in NPZ_PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of: {', '.join(NPZ_PRECISIONS)}")
    count = analysis.num_layers if layers is None else len(layers)
    check_matrix_fits(analysis, count * analysis.num_heads * (4 if precision == "float32" else 3) // 2,
                      "This .npz (every head of the chosen layers, held to be downloaded)")


def attentions_npz(analysis: Analysis, class_names: list[str], layers: Sequence[int] | None = None,
                   precision: str = "float32") -> bytes:
    """Attentions (``layer_i``: heads x tokens x tokens) of ``layers`` (default every layer) with the logits,
    classes and geometry; ``float16`` halves the file, for big inputs."""
    check_npz_fits(analysis, layers, precision)
    p = analysis.prediction
    chosen = range(analysis.num_layers) if layers is None else layers
    arrays = {f"layer_{i}": analysis.attentions[i][0].numpy().astype(precision) for i in chosen}
    distance, entropy = analysis.stats()
    return attentions_npz_bytes([], **arrays, logits=p.logits, probabilities=p.probabilities,
                                class_names=np.array(class_names), grid=np.array(analysis.grid),
                                patch_size=np.array(analysis.patch_size),
                                input_size=np.array(analysis.input_size),
                                num_prefix_tokens=np.array(analysis.num_prefix_tokens),
                                mean_attention_distance=distance, attention_entropy=entropy)


# -- maps that need the model (LeGrad, LRP, AttnLRP) or a max-flow (attention flow) ----------------------------------

CAM_KINDS = ("gradcam", "gradcam++", "xgradcam", "eigencam", "layercam", "scorecam")  # vit.explain.cam
METHOD_MAP_KINDS = ("legrad", "lrp", "attnlrp", "flow") + CAM_KINDS  # computed by model_method_map, cached by the page
MORE_METHODS = "methods"  # the page's one "Map" choice for all of METHOD_MAP_KINDS (a second picker names which)
MORE_METHODS_LABEL = "More: LeGrad, LRP, AttnLRP, flow, CAMs"
# explain one class: the page shows a class picker
CLASS_MAP_KINDS = ("class", "legrad", "lrp", "attnlrp") + tuple(k for k in CAM_KINDS if k != "eigencam")


def model_method_map(checkpoint: Checkpoint, image: Image.Image, kind: str, class_index: int, query: int = 0,
                     end_layer: int = -1, fusion: str = "mean", size: InputSize = TRAINING_SIZE,
                     progress: work.Progress | None = None, start_layer: int = -2) -> np.ndarray:
    """The ``(gh, gw)`` map of a ``METHOD_MAP_KINDS`` kind for one image (seconds for ``flow``).

    ``class_index`` is the explained class (LeGrad, LRP, AttnLRP); ``query`` the token whose
    relevance or flow is shown (LRP, flow; LeGrad and AttnLRP explain the classifier's CLS); ``start_layer``
    LeGrad's first explained layer (its authors' ``layer_index``).
    Raises ValueError (e.g. ``UnsupportedModelError``, ``TooManyTokens``) with a message to show, before any
    work. ``progress(done, total)``: flow's max-flow problems, one per token; the other methods' blocks run
    (``reported_blocks``).
    """
    from vit.explain.attention_flow import attention_flow
    from vit.explain.relevance import attnlrp, legrad, patch_sums, transformer_attribution

    model = checkpoint.model
    if model.config.stage_depths and kind not in STAGE_MAP_KINDS:
        raise ValueError(stage_refusal(kind))
    shape = input_shape(image, checkpoint.preprocessing, model.config.patch_size, size)  # (height, width)
    grid, prefix = model.patch_grid(*shape), model.num_prefix_tokens
    tokens = prefix + grid[0] * grid[1]
    # Every method's bound before the work it implies: flow's forward keeps every layer's whole attention (9 GB
    # for ViT-B/16 at 1,024 px) before attention_flow's own limit would refuse the input.
    if kind == "legrad" and model.config.stage_depths:  # the explained layers' windows, in the graph
        check_stage_legrad_fits(model, grid, start_layer)
    elif kind == "legrad":  # in chunks: never a whole layer's attention or gradient
        check_chunked_gradient_fits(model, tokens, "LeGrad", contexts=False)
    elif kind in ("lrp", "attnlrp"):
        check_gradient_fits(model, tokens, MAP_KINDS[kind].split(" (")[0])
    elif kind == "flow":
        check_flow_fits(model, tokens)
    elif kind in CAM_KINDS:  # the graph from the explained block on (Score-CAM: forwards without one)
        check_gradient_fits(model, tokens, MAP_KINDS[kind].split(" (")[0],
                            layers=len(range(len(model.blocks))[end_layer:]))
    device = next(model.parameters()).device
    x = preprocess([image], checkpoint.preprocessing, size, model.config.patch_size).to(device)  # (1, C, H, W)
    L = len(model.blocks)
    if kind == "legrad":
        with reported_blocks(model, progress, L - 1 + len(range(L)[start_layer:])):  # the explained ones again
            result = legrad(model, x, class_index, start_layer, budget=CHUNK_BYTES)
    elif kind == "lrp":
        with reported_blocks(model, progress, L):
            result = token_map(transformer_attribution(model, x, class_index, end_layer), query, grid, prefix)
    elif kind == "attnlrp":
        with reported_blocks(model, progress, L):
            result = patch_sums(attnlrp(model, x, class_index), grid)
    elif kind in CAM_KINDS:
        from vit.explain.cam import cam

        if kind == "scorecam":  # progress by masked image: one forward of the model per channel
            result = cam(model, x, kind, class_index, end_layer, progress=progress)
        else:
            with reported_blocks(model, progress, L):
                result = cam(model, x, kind, None if kind == "eigencam" else class_index, end_layer)
    elif kind == "flow":
        with torch.no_grad():
            _, attentions = model(x, output_attentions=True)
        attentions = placed_attentions(model, attentions, grid)
        result = attention_flow(attentions, query, fusion, end_layer, progress=progress)[:, prefix:].reshape(1, *grid)
    else:
        raise ValueError(f"{kind!r} is not one of {', '.join(METHOD_MAP_KINDS)}")
    return result[0].float().cpu().numpy()  # (gh, gw)




# -- the Mechanism view (issue 24): logit lens, head attribution, ablation, phenomena ---------------------------

@dataclass
class MechanismView:
    """What the Mechanism view shows for one image and class (layers and heads 0-based)."""

    class_index: int
    lens_maps: np.ndarray  # (L + 1, gh, gw): each patch's probability of the class, after the embedding, each layer
    lens_top: list[list[tuple[int, float]]]  # per row of lens_maps, the pooled read-out's top 3 (class, probability)
    dla_heads: np.ndarray  # (L, H) direct contribution of each head to the class logit
    dla_mlps: np.ndarray  # (L,)
    dla_rest: dict[str, float]  # embedding, attention biases, final biases
    logit: float
    norms: np.ndarray  # (L + 1, T) token norms
    massive: np.ndarray  # (L, 4) top 1-3 and median |block output|
    sink_token: np.ndarray  # (L, H)
    sink_mass: np.ndarray  # (L, H)
    sink_value_norm: np.ndarray  # (L, H)
    lens_labels: list[str] | None = None  # a feature model's lens reads these typed labels (no attribution then)
    # The block whose output each row of lens_maps reads (-1: the embedding): every layer, or with stages (Swin,
    # Hiera) the last stage's only, whose tokens the final norm and head read; dla_heads' rows start at dla_first.
    lens_layers: tuple[int, ...] = ()
    dla_first: int = 0
    norm_grids: tuple[tuple[int, int], ...] = ()  # with stages: the grid of each row of norms (a list then)
    sinks_refused: str = ""  # why the sink statistics are empty (a model with stages)


def _model_input(checkpoint: Checkpoint, image: Image.Image, size: InputSize) -> torch.Tensor:
    model, p = checkpoint.model, checkpoint.preprocessing
    shape = input_shape(image, p, model.config.patch_size, size)
    check_input_fits(checkpoint, model.patch_grid(*shape), f"A {shape[1]}×{shape[0]} px input")
    return preprocess([image], p, size, model.config.patch_size).to(next(model.parameters()).device)


def mechanism_view(checkpoint: Checkpoint, image: Image.Image, class_index: int | None,
                   size: InputSize = TRAINING_SIZE, asked=None) -> MechanismView:
    """Logit lens, direct logit attribution and the phenomena of one image (``class_index`` None: predicted).

    A model without a classifier gets the phenomena only (empty lens and attribution), or, given ``asked``
    (``prompts.Prompts`` of labels typed for a CLIP), the lens over those labels: each token read through the
    final norm, the projection and the cosine to each label, as the model reads its pooled vector. Raises
    ``mechanism.MechanismError`` for a model the analyses do not support and ``TooManyTokens`` for too big an input.
    """
    from vit.explain import prompts

    lens_labels = None
    if checkpoint.model.head is None and asked is not None:
        checkpoint, lens_labels = prompts.prompt_checkpoint(checkpoint, asked), list(asked.labels)
    model = checkpoint.model
    x = _model_input(checkpoint, image, size)
    L, H = len(model.blocks), model.blocks[0].attn.num_heads
    norm_grids, sinks_refused = (), ""
    with torch.inference_mode():
        if model.config.stage_depths:  # each layer's tokens on its own grid: norms and activations per layer
            image_grid = model.patch_grid(*x.shape[-2:])
            outputs = _stage_outputs(model, x)  # each (1, T_l, D_l)
            norms = [s[0].float().norm(dim=-1).cpu().numpy() for s in [model.embed(x), *outputs]]  # each (T_l,)
            norm_grids = (image_grid,) + tuple(lay.grid for lay in model.layer_layouts(image_grid))
            massive = mechanism.massive_activations(outputs)[0].float().cpu().numpy()  # (L, 4)
            sink_token = sink_mass = sink_value_norm = np.zeros((L, 0))
            sinks_refused = STAGE_SINKS
        else:
            states = mechanism.hidden_states(model, x)  # (1, L + 1, T, D)
            sinks = mechanism.sink_stats(model, states, model.patch_grid(*x.shape[-2:]))
            norms = mechanism.token_norms(states)[0].cpu().numpy()
            massive = mechanism.massive_activations(states)[0].float().cpu().numpy()
            sink_token, sink_mass, sink_value_norm = (sinks.token[0].cpu().numpy(), sinks.mass[0].float().cpu().numpy(),
                                                      sinks.value_norm[0].float().cpu().numpy())
    lens_maps, lens_top, lens_layers = np.zeros((0, 1, 1), np.float32), [], ()
    dla_heads, dla_mlps, rest, logit, chosen, dla_first = np.zeros((L, H)), np.zeros(L), {}, 0.0, -1, 0
    if model.head is not None:
        with torch.inference_mode():
            lens = mechanism.logit_lens(model, x, class_index)
            dla = None if lens_labels else mechanism.direct_logit_attribution(model, x, lens.classes)
        grid, prefix = model.layer_layouts(model.patch_grid(*x.shape[-2:]))[-1].grid, model.num_prefix_tokens
        lens_maps = lens.token_probs[0, :, prefix:].reshape(-1, *grid).float().cpu().numpy()
        lens_layers = lens.layers
        top = lens.pooled_logits[0].softmax(-1).topk(min(3, lens.pooled_logits.shape[-1]), dim=-1)
        lens_top = [[(int(i), float(p)) for p, i in zip(ps, idx, strict=True)]
                    for ps, idx in zip(top.values, top.indices, strict=True)]
        chosen = int(lens.classes[0])
        if dla is not None:
            dla_heads, dla_mlps = dla.heads[0].cpu().numpy(), dla.mlps[0].cpu().numpy()
            dla_first = dla.first_layer
            rest = {"embedding" if not dla_first else f"stream entering layer {dla_first + 1}": float(dla.embed[0]),
                    "attention biases": float(dla.attn_biases[0].sum()),
                    "final norm and head biases": float(dla.bias[0])}
            logit = float(dla.logit[0])
    return MechanismView(chosen, lens_maps, lens_top, dla_heads, dla_mlps, rest, logit, norms, massive,
                         sink_token, sink_mass, sink_value_norm, lens_labels, lens_layers, dla_first, norm_grids,
                         sinks_refused)


# Why a model with stages has no sink statistics, in one line.
STAGE_SINKS = ("Attention sinks are not measured for a model with stages (Swin, Hiera): their windowed layers let each "
               "key be read only by its own window's queries, so a key's share of attention averaged over all queries "
               "measures its window, not a sink")


def _stage_outputs(model: ViT, x: torch.Tensor) -> list[torch.Tensor]:
    """Each block's output ``(1, T_l, D_l)`` on its own grid, read at its hook point in one pass."""
    names = [f"blocks.{i}.hook_resid_post" for i in range(len(model.blocks))]
    _, cache = model.run_with_cache(x, names)
    return [cache[name] for name in names]


def parse_head_labels(labels: Sequence[str]) -> list[tuple[int, int]]:
    """``["2.3", ...]`` (layer.head from 1, as the page lists them) -> ``[(1, 2), ...]`` from 0."""
    return [(int(a) - 1, int(b) - 1) for a, _, b in (label.partition(".") for label in labels)]


def reference_means(checkpoint: Checkpoint, references: Iterable[Image.Image], image: Image.Image,
                    size: InputSize = TRAINING_SIZE, registers: dict[int, list[int]] | None = None,
                    progress: work.Progress | None = None, count: int = 0) -> mechanism.Means:
    """Per-head mean contexts ``(L, T, H, hd)`` over ``references`` (mean ablation) on ``image``'s token grid (with
    stages, one ``(T_l, H_l, hd)`` per layer on its own grid):
    each reference is prepared as the checkpoint prepares an image at ``size``, or, for another size, resized to
    exactly ``image``'s input shape (means are per position, whatever a reference's own aspect). With
    ``registers`` (layer -> register neurons) the references run with one test-time register, as the image will:
    ``(L, T + 1, H, hd)``. References are read ``REFERENCE_CHUNK`` at a time, so a lazy iterable holds no more
    decoded images than that; ValueError for none or more than ``MAX_REFERENCE_IMAGES``. ``progress(images
    done, count)`` after each chunk, ``count`` being how many references there are (for the progress only)."""
    p, model = checkpoint.preprocessing, checkpoint.model
    shape = input_shape(image, p, model.config.patch_size, size)
    check_input_fits(checkpoint, model.patch_grid(*shape), f"A {shape[1]}×{shape[0]} px input")
    device = next(model.parameters()).device
    references, total, expected, count = iter(references), None, count, 0
    with torch.inference_mode():
        while chunk := list(islice(references, REFERENCE_CHUNK)):
            count += len(chunk)
            if count > MAX_REFERENCE_IMAGES:
                break
            x = preprocess(chunk, p) if size == TRAINING_SIZE else preprocess_at(chunk, p, shape)
            if registers is None:
                part = mechanism.mean_contexts(model, x.to(device))  # (L, T, H, hd)
            else:
                contexts: list[torch.Tensor] = []  # per layer (B, T + 1, H, hd)
                mechanism.with_test_time_registers(model, x.to(device), registers, 1, contexts=contexts)
                part = torch.stack([c.mean(dim=0) for c in contexts])  # (L, T + 1, H, hd)
            part = [m * len(chunk) for m in part]  # summed over the chunk, per layer (a stage's own shape)
            total = part if total is None else [t + m for t, m in zip(total, part, strict=True)]
            if progress is not None:
                progress(count, max(expected, count))
    if not 1 <= count <= MAX_REFERENCE_IMAGES:
        raise ValueError(f"mean ablation averages over 1 to {MAX_REFERENCE_IMAGES} reference images; "
                         + ("add some" if not count else "remove some"))
    means = [t / count for t in total]
    return tuple(means) if model.config.stage_depths else torch.stack(means)


def ablation_effects(checkpoint: Checkpoint, image: Image.Image, class_index: int, mode: str = "zero",
                     means: torch.Tensor | None = None, size: InputSize = TRAINING_SIZE,
                     progress: work.Progress | None = None) -> np.ndarray:
    """``(L, H)``: the change of the class logit when each head alone is ablated (one pass per layer); with stages
    ``H`` is the most heads of any layer, NaN where a layer's stage has fewer."""
    x = _model_input(checkpoint, image, size)
    with torch.inference_mode():
        grid = mechanism.ablation_grid(checkpoint.model, x, class_index, mode, means, progress=progress)
    return grid[0].cpu().numpy()


@dataclass
class PatchingView:
    """Activation patching of the clean image's activations into the corrupted one (0-based layers, heads)."""

    clean_class: int  # a: the clean image's predicted class
    corrupted_class: int  # b: the corrupted image's
    clean_difference: float  # logit[a] - logit[b] on the clean image
    corrupted_difference: float
    heads: np.ndarray  # (L, H) share of the difference recovered by patching each head's output
    residual: np.ndarray | None  # (L, T) by patching each layer input at each token position
    # With stages: the grid each layer's input is on (its row of ``residual`` holds that many tokens, then NaN)
    residual_grids: tuple[tuple[int, int], ...] = ()

    def residual_maps(self) -> np.ndarray:
        """With stages: each layer's row of ``residual`` on its input's grid, placed on the image's patch grid
        ``(L, gh, gw)`` (each cell over the patches it covers)."""
        from vit.explain.stages import on_patch_grid

        grid = self.residual_grids[0]
        return np.stack([on_patch_grid(row[:g[0] * g[1]].reshape(g), grid)
                         for row, g in zip(self.residual, self.residual_grids, strict=True)])


def patching_view(checkpoint: Checkpoint, clean: Image.Image, corrupted: Image.Image,
                  size: InputSize = TRAINING_SIZE, residual: bool = False,
                  progress: work.Progress | None = None) -> PatchingView:
    """Patch each head output (and with ``residual`` each (layer, position) of the residual stream) of ``clean``
    into ``corrupted``; the logit difference between their predicted classes, as the share recovered.
    ``progress(passes done, total)``: the head grid's one pass a head of every layer, then the residual grid's
    ``L * T``."""
    x_clean, x_corrupted = _model_input(checkpoint, clean, size), _model_input(checkpoint, corrupted, size)
    model = checkpoint.model
    grid = model.patch_grid(*x_clean.shape[-2:])
    grids = (grid, *model.layer_grids(grid)[:-1]) if model.config.stage_depths else ()  # block l gets l - 1's grid
    T = model.num_prefix_tokens + math.prod(grid)
    tokens = sum(math.prod(g) for g in grids) if grids else len(model.blocks) * T  # the residual grid's passes
    H = sum(block.attn.num_heads for block in model.blocks)  # every layer's heads (a stage's own)
    heads_progress, tokens_progress = work.in_parts(progress, [H, tokens if residual else 0])
    with torch.inference_mode():
        heads = mechanism.patch_heads(model, x_clean, x_corrupted, progress=heads_progress)
        a, b = (int(model(x)[0].argmax(-1)[0]) for x in (x_clean, x_corrupted))
        tokens = (mechanism.patch_residuals(model, x_clean, x_corrupted, a, b, progress=tokens_progress) if residual
                  else None)
    return PatchingView(a, b, float(heads.clean[0]), float(heads.corrupted[0]), heads.recovered()[0].cpu().numpy(),
                        tokens.recovered()[0].cpu().numpy() if tokens is not None else None, grids)


@dataclass
class RegisterView:
    """Test-time registers on one image: the neurons found, and the last layer before and after (``(gh, gw)``)."""

    neurons: list[tuple[int, int, float]]  # (layer, neuron, score), 0-based, best first
    attention_before: np.ndarray  # the last layer's CLS attention to the patches, heads averaged
    attention_after: np.ndarray
    norms_before: np.ndarray  # the patch tokens' norms after the last layer
    norms_after: np.ndarray


def registers_view(checkpoint: Checkpoint, image: Image.Image, references: Iterable[Image.Image],
                   threshold: float, top_k: int = 10, size: InputSize = TRAINING_SIZE,
                   mean_ablated: tuple[Checkpoint, Sequence[tuple[int, int]]] | None = None) -> RegisterView:
    """Find the register neurons on ``references`` and this image (at the checkpoint's size; outliers: last-layer
    norms over ``threshold``), then add one test-time register to this image at ``size``.

    ``mean_ablated`` (the full checkpoint, the heads) says ``checkpoint`` is its copy with those heads mean-ablated:
    their means hold for the image's tokens only, so the register pass runs on a copy whose means are the
    references' with the register too (one more token)."""
    references = list(references)
    model = checkpoint.model
    found = torch.cat([_model_input(checkpoint, im, TRAINING_SIZE) for im in chain([image], references)])
    x = _model_input(checkpoint, image, size)
    grid, P = model.patch_grid(*x.shape[-2:]), model.num_prefix_tokens
    with torch.inference_mode():
        neurons = mechanism.find_register_neurons(model, found, threshold, top_k=top_k)
        chosen: dict[int, list[int]] = {}
        for layer, neuron, _ in neurons:
            chosen.setdefault(layer, []).append(neuron)
        logits, before = model(x, output_attentions=True)
        states = mechanism.hidden_states(model, x)
    registered = model
    if mean_ablated is not None:
        full, heads = mean_ablated
        means = reference_means(full, references, image, size, registers=chosen)  # (L, T + 1, H, hd)
        registered = ablated_checkpoint(full, heads, "mean", means, grid).model
    with torch.inference_mode():
        _, after, final = mechanism.with_test_time_registers(registered, x, chosen, 1, output_attentions=True)
    n = grid[0] * grid[1]

    def cls_map(attentions) -> np.ndarray:
        return attentions[-1][0].mean(0)[0, P:P + n].reshape(grid).float().cpu().numpy()

    return RegisterView(neurons, cls_map(before), cls_map(after),
                        states[0, -1, P:].norm(dim=-1).reshape(grid).float().cpu().numpy(),
                        final[0, P:P + n].norm(dim=-1).reshape(grid).float().cpu().numpy())


def ablated_checkpoint(checkpoint: Checkpoint, heads: Sequence[tuple[int, int]], mode: str = "zero",
                       means: torch.Tensor | None = None, grid: tuple[int, int] | None = None) -> Checkpoint:
    """``checkpoint`` with a copy of its model in which ``heads`` (layer, head from 0) are ablated in the weights
    (``mechanism.ablated_copy``; ``means`` from ``reference_means`` for ``mode="mean"``): the page draws every
    map and its prediction from it. ``grid``: the patch grid the means were taken on (the image's at its size),
    which windowed layers place them by (default: the model's input size's)."""
    return replace(checkpoint, model=mechanism.ablated_copy(checkpoint.model, heads, mode, means, grid))


@dataclass
class AblationView:
    """One image with some heads ablated, next to all heads on."""

    prediction: Prediction  # with the heads ablated
    rollout_on: np.ndarray | None  # (gh, gw) the CLS rollout (heads averaged) with all heads on; None with stages
    rollout_off: np.ndarray | None  # with the heads ablated: ablating a head changes every later layer's attention


def ablation_view(checkpoint: Checkpoint, image: Image.Image, heads: Sequence[tuple[int, int]], mode: str = "zero",
                  means: torch.Tensor | None = None, size: InputSize = TRAINING_SIZE, top_k: int = TOP_K
                  ) -> AblationView:
    """The prediction and the CLS rollout with ``heads`` (layer, head from 0) ablated, and the rollout with all
    heads on: two passes. A model with stages has no CLS token to roll out from: its prediction alone (one pass)."""
    from vit.explain.attention import rollout

    model = checkpoint.model
    x = _model_input(checkpoint, image, size)
    grid, P = model.patch_grid(*x.shape[-2:]), model.num_prefix_tokens
    if model.config.stage_depths:
        with torch.inference_mode():
            logits, _ = mechanism.ablate_heads(model, x, heads, mode, means)
        [prediction] = predictions_from_logits(logits, checkpoint.class_names, top_k, model=model)
        return AblationView(prediction, None, None)
    with torch.inference_mode():
        _, full = mechanism.ablate_heads(model, x, [], output_attentions=True)
        logits, ablated = mechanism.ablate_heads(model, x, heads, mode, means, output_attentions=True)
    [prediction] = predictions_from_logits(logits, checkpoint.class_names, top_k, model=model)
    on, off = (token_map(rollout(list(a), "mean", num_prefix_tokens=P), 0, grid, P)[0].float().cpu().numpy()
               for a in (full, ablated))
    return AblationView(prediction, on, off)


def remap_query(token: int, old_grid: tuple[int, int], new_grid: tuple[int, int], num_prefix_tokens: int) -> int:
    """The query token at the same place in the image when the patch grid changes (another input size or the
    aspect kept): a patch goes to the patch of the new grid that holds its centre; prefix tokens stay."""
    if token < num_prefix_tokens or tuple(old_grid) == tuple(new_grid):
        return token
    (gh, gw), (nh, nw) = old_grid, new_grid
    row, col = divmod(token - num_prefix_tokens, gw)
    if row >= gh:  # not a patch of the old grid: start again from CLS
        return 0
    new_row = min(nh - 1, int((row + 0.5) * nh / gh))
    new_col = min(nw - 1, int((col + 0.5) * nw / gw))
    return num_prefix_tokens + new_row * nw + new_col
