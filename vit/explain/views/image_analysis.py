"""One image through one checkpoint: ``analyse`` runs the model once and keeps what every view reads
(``Analysis``); ``view_shape`` says what it will be shaped like before the forward. The maps drawn from it are
``vit.explain.views.attention_maps``.

The explorer page caches ``analyse`` per (checkpoint, image). Layers, heads and patches are 0-based here (as in the
arrays and the ``.npz`` download); the UI shows layers and heads from 1, like the ViT paper. Tokens keep their
indices: 0 is CLS, patch ``p`` (row-major) is token ``p + num_prefix_tokens``, as in the attention matrix.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from PIL import Image

from vit.checkpoint import Checkpoint
from vit.core.cache import ByteCache
from vit.core.inference import TRAINING_SIZE, InputSize, ModelInput, Prediction, predictions_from_logits
from vit.core.progress import Progress
from vit.costs import bounds, plan
from vit.costs.fits import CHUNK_BYTES, LAYER_CACHE_BYTES, check_input_fits
from vit.costs.memory import kept_layers
from vit.explain.methods.attention import layer_stats
from vit.explain.methods.chunked import LayerInputs
from vit.explain.methods.hidden import CheckpointedStates, LayerAttentions, forward_with_hidden_states, query_key_hooks
from vit.model import ViT
from vit.model.stages import LayerLayout

TOP_K = 5


def _inputs(analysis: Analysis) -> LayerInputs | None:
    """The analysis's layer inputs for chunked attention (None for attentions given whole)."""
    layers = analysis.attentions
    if not isinstance(layers, LayerAttentions):
        return None
    hidden = layers.hidden if isinstance(layers.hidden, CheckpointedStates) else layers.hidden[None]
    return LayerInputs(layers.model, hidden, layers.grid, budget=CHUNK_BYTES)


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
    # (L + 1, T, D): every block's input, then the last block's output; past the memory bound only every k-th layer's
    # kept, the rest recomputed when read (``hidden.CheckpointedStates``, indexed alike)
    hidden: torch.Tensor | CheckpointedStates | None = None
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
    # A model opened as its library builds it (Checkpoint.road == "library"): its last hidden state (T, D) as the
    # library gives it, the one layer its dense views read (``dense_views.library_analysis``); None for our ViT
    last_hidden_state: torch.Tensor | None = None

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

    def block_input(self, layer: int) -> torch.Tensor | None:
        """Block ``layer``'s input ``(T_l, D_l)`` as the forward gave it (float32, on the CPU), for a method that
        runs the blocks from there (a CAM): those before it need not run again. None where the analysis keeps none
        (a model with stages keeps each block's output, so not its first block's input)."""
        layer %= self.num_layers
        if self.layouts:
            return self.outputs[layer - 1] if layer else None
        return None if self.hidden is None else self.hidden[layer]

    @property
    def training_hw(self) -> tuple[int, int] | None:
        """The checkpoint's input ``(height, width)``, or None when not known."""
        size = self.training_size
        return (size, size) if isinstance(size, int) else size

    def stats(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-head mean attention distance (px) and entropy (nats), each ``(L, H)``; computed once, layer by layer.
        With stages (Swin, Hiera): each layer's on its own grids with its stage's heads, NaN past them
        (``vit.explain.methods.stage_maps.layer_stats``)."""
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
        from vit.explain.methods.stage_maps import layer_stats as stage_stats

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
    return _checked_view(checkpoint, ModelInput.of(checkpoint, image, size), max_tokens, allow)


def _checked_view(checkpoint: Checkpoint, given: ModelInput, max_tokens: int | None, allow: str) -> ViewShape:
    shape = given.shape  # (height, width)
    check_input_fits(checkpoint, checkpoint.model.patch_grid(*shape), f"A {shape[1]}×{shape[0]} px input", max_tokens,
                     allow, chunks=True)
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
            top_k: int = TOP_K, progress: Progress | None = None, max_tokens: int | None = None,
            allow: str = f"raise {bounds.MAX_TOKENS_ENV}",
            forward: Callable[[torch.Tensor, list], torch.Tensor | None] | None = None) -> Analysis:
    """Run the model once on ``image`` at ``size``; layers' attentions are computed when first read.

    Raises ``TooManyTokens`` before running anything when the input is over the limits (``max_tokens``: the
    token gate, default VIT_MAX_TOKENS; ``allow``: how the message says to raise it). ``progress(layers done,
    L)`` after each block (read at its ``hook_resid_post``; it may raise to stop the forward there).
    ``forward(x, hooks)``: the forward a method runs for itself on this image (a CAM's), which sets ``hooks`` and
    returns the logits: the analysis is read off it instead of running one of its own (not for a model with stages).
    """
    model, p, given = checkpoint.model, checkpoint.preprocessing, ModelInput.of(checkpoint, image, size)
    view = _checked_view(checkpoint, given, max_tokens, allow)
    shape, grid = view.input_size, view.grid
    device = next(model.parameters()).device
    x = given.pixels(device)  # (1, C, H, W)
    if view.staged:
        if forward is not None:
            raise ValueError("a model with stages is analysed by its own forward (its layers' windows kept)")
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
    # Past the memory bound, the hidden states of every k-th layer only (the cost model's path in chunks; its k)
    cost = plan.analysis(model, grid)
    every = cost.every if plan.decide(cost) == "chunks" else 1
    with torch.inference_mode(), model.hooks(reports) if reports else contextlib.nullcontext():
        # (1, classes), (1, L + 1, T, D) or the checkpoints' (1, len(kept_layers), T, D)
        logits, hidden = forward_with_hidden_states(model, x, None if every == 1 else kept_layers(L, every), forward)
    if logits is None:  # a feature model without a classifier (e.g. DINO): maps, no prediction
        logits = x.new_zeros(x.shape[0], 0)
    [prediction] = predictions_from_logits(logits, checkpoint.class_names, top_k, model=model)
    hidden = hidden[0].float().cpu()
    if every > 1:
        hidden = CheckpointedStates(model, hidden, every, grid)
    cache = ByteCache(LAYER_CACHE_BYTES)
    layers = LayerAttentions(model, hidden, cache, grid, kept)
    probe = embedding = None
    if isinstance(model, ViT):
        with torch.inference_mode():
            pooled, probe = model.pool(hidden[-1][None].to(device, next(model.parameters()).dtype))  # (1, H, 1, T)
            if model.head is None:
                embedding = (model.projection(pooled) if model.projection is not None else pooled)[0].float().cpu()
        probe = probe[0, :, 0].float().cpu() if probe is not None else None  # (H, T)
    return Analysis(prediction=prediction, attentions=layers, grid=grid, patch_size=model.config.patch_size,
                    input_size=shape, num_prefix_tokens=model.num_prefix_tokens, hidden=hidden,
                    training_size=p.image_size,
                    cache=cache, prefix_names=tuple(model.config.prefix_token_names), probe=probe,
                    embedding=embedding, position_table=getattr(model.config, "pos_embed", True),
                    sincos_positions=getattr(model.config, "sincos_pos", False),
                    window=model.config.window_size, global_layers=tuple(model.config.global_layers),
                    max_num_patches=p.max_num_patches if size == TRAINING_SIZE else 0,
                    max_pixels=p.max_pixels if size == TRAINING_SIZE else 0)


def _analyse_stages(checkpoint: Checkpoint, x: torch.Tensor, grid: tuple[int, int], shape: tuple[int, int],
                    top_k: int, progress: Progress | None, layouts: tuple[LayerLayout, ...]) -> Analysis:
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
