"""The maps the explorer draws from an ``Analysis``: the kinds there are and the controls each reads
(``MAP_KINDS``, ``MapSettings``), the chosen map (``attention_map``), every head's (``head_maps``), the rollout,
the token norms, a model with stages' maps on each layer's own grid, and the ``.npz`` download. The maps that run
the model again (the class-specific map's gradients, LeGrad, LRP, the CAMs, flow) are ``vit.explain.views.method_maps``.

Everything here is cheap or cached in the analysis (``Analysis.cache``), so the page redoes it on every interaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from vit import registry
from vit.core.progress import Progress
from vit.costs.bounds import TooManyTokens
from vit.costs.fits import analysis_limits
from vit.explain.methods.attention import (
    fuse_heads,
    mass_mask,
    pooled_readout,
    relevance_rollout_row,
    relevance_rollout_vector,
    rollout_factor,
    rollout_rows,
    rollout_vector,
)
from vit.explain.methods.chunked import LayerInputs
from vit.explain.methods.hidden import LayerAttentions
from vit.explain.views.image_analysis import Analysis, ViewShape, _inputs
from vit.explain.views.overlay import attentions_npz_bytes
from vit.model.stages import LayerLayout

# The maps of an image the explorer draws, as the registry lists them (vit.registry: each method once); these names
# are the built-ins', kept for their callers. A plugin's methods are the registry's too: ``method_of`` finds any.
_MAPS = tuple(m for m in registry.BUILTIN_METHODS if m.group != "words")
MAP_KINDS = {m.name: m.title for m in _MAPS}
# Map kinds of models with an attention-pooling head (SigLIP): its learned probe's attention replaces the CLS row.
PROBE_MAP_KINDS = tuple(m.name for m in _MAPS if m.group == "probe")
# The controls each map kind reads; the page shows only these (a control that does nothing misleads). The CAMs
# (vit.explain.methods.cam) read one block's first norm: the layer slider's, default the last block; Chefer's baselines
# the last layer's CLS, as theirs; LeGrad the classifier's read-out (CLS, or a Swin's / Hiera's pooling) at each layer.
MAP_CONTROLS = {m.name: m.reads for m in _MAPS}
CAM_KINDS = tuple(m.name for m in _MAPS if m.group == "cam")  # vit.explain.methods.cam
CHEFER_BASELINES = tuple(m.name for m in _MAPS if m.group == "chefer baseline")  # their ViT_explanation_generator's
# model_method_map's (a pass of their own: the page's "More" picker), in that picker's order: by group
MORE_GROUPS = ("gradient", "relevance", "attention", "cam", "model-agnostic", "chefer baseline", "probe")
METHOD_MAP_KINDS = tuple(m.name for g in MORE_GROUPS for m in _MAPS if m.own_pass and m.group == g)
# explain one class: the page shows a class picker
CLASS_MAP_KINDS = tuple(m.name for m in _MAPS if m.class_specific)


def method_of(kind: str) -> registry.Method:
    """The registry's method ``kind`` of an image's map (a built-in or a plugin's); ValueError naming the maps
    there are for any other."""
    method = registry.find_method(kind)
    if method is None or method.group == "words":
        names = [m.name for m in registry.methods() if m.group != "words"]
        raise ValueError(f"unknown method {kind!r}; choose one of: {', '.join(names)}")
    return method


def is_method_map(kind: str) -> bool:
    """Whether map ``kind`` is drawn by ``model_method_map`` (a pass of its own; every plugin's)."""
    method = registry.find_method(kind)
    return method is not None and method.own_pass


def method_map_kinds() -> tuple[str, ...]:
    """The kinds ``model_method_map`` draws: ``METHOD_MAP_KINDS``, then the plugins' methods (the page's "More")."""
    return METHOD_MAP_KINDS + tuple(m.name for m in registry.plugin_methods())


def is_class_map(kind: str) -> bool:
    """Whether map ``kind`` explains one class (the page shows a class picker)."""
    method = registry.find_method(kind)
    return method is not None and method.class_specific and method.group != "words"


HALF_PRECISION_TOKENS = 1024  # rollout factors above this many tokens are kept in float16


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


# The maps of a model with stages: each layer's on its own grid (``vit.explain.methods.stage_maps``), the rollout
# through the merges, the token norms, LeGrad (the average pooling's read-out applied at each of the last stage's
# layers, ``relevance.stage_legrad``) and AttnLRP (its rules run through the merges: a map of the input's pixels). The
# others are refused in one line (``stage_refusal``), each for its reason.
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
    from vit.explain.methods.stage_maps import clicked_row

    if not 0 <= patch < analysis.num_tokens:
        raise ValueError(f"query patch {patch} is out of range for the {analysis.grid[0]}x{analysis.grid[1]} grid")
    layer = _stage_layer(analysis, layer)
    return analysis.cache.get_or_compute(("stage_rows", layer, patch), lambda: clicked_row(
        analysis.attentions, analysis.layouts, layer, patch)[0])


def stage_map(analysis: Analysis, settings: MapSettings, relevance: ClassRelevance | None = None) -> np.ndarray:
    """With stages: the map of ``settings`` (``query`` a patch of the image's grid): ``attention`` and ``norms`` on
    layer ``layer``'s own grid, ``rollout`` on the image's patch grid (``vit.explain.methods.stage_maps.rollout_row``
    from the
    token of layer ``end_layer``'s grid that covers the query), ``class`` the gradient rollout of ``relevance``
    from what the average pooling reads (every token of layer ``end_layer`` alike) to the image's patches."""
    from vit.explain.methods.stage_maps import relevance_rollout_row, rollout_row
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
    method = registry.find_method(kind)
    return (f"{(method.title if method else kind).split(' (')[0]} is not drawn for a model with stages (Swin, Hiera): "
            f"{STAGE_REFUSALS.get(kind, 'its layers each have their own grid')}; choose {', '.join(STAGE_MAP_KINDS)}")


STAGE_REFUSALS = {  # why each map is not drawn for a model with stages
    "lrp": "the transformer attribution multiplies T x T relevance matrices of one grid",
    "attn-gradcam": "it reads the CLS row of the last layer's attention over one grid",
    "lrp-partial": "it reads the CLS row of the last layer's relevance over one grid",
    "lrp-full": "Chefer et al.'s LRP runs one grid of tokens from the pixels to the class",
    "flow": "the max-flow graph stacks layers of one grid",
    "probe": "it has no attention-pooling probe",
    "probe_rollout": "it has no attention-pooling probe",
}


def map_kinds(analysis: Analysis | ViewShape, has_classes: bool) -> list[str]:
    """The map kinds this analysis (or the one a view shape foretells) can draw, the default first: the pooling
    probe's for a model without CLS; the plugins' methods last (not for a model with stages)."""
    if analysis.staged:
        return [k for k in STAGE_MAP_KINDS if has_classes or k not in CLASS_MAP_KINDS]
    probe = analysis.num_probe_heads > 0
    kinds = [k for k in MAP_KINDS if (has_classes or k != "class") and (probe or k not in PROBE_MAP_KINDS)]
    if probe and not analysis.has_cls:
        kinds = list(PROBE_MAP_KINDS) + [k for k in kinds if k not in PROBE_MAP_KINDS]
    return kinds + [m.name for m in registry.plugin_methods()]  # a plugin's draw takes the image's one grid


@dataclass
class ClassRelevance:
    """One class's gradients for its map. Within the memory bound: per layer Chefer et al.'s positive
    gradient-weighted attention ``(1, T, T)`` (``terms``); above it, the gradient of every layer's heads'
    contexts ``(1, L, T, H, hd)`` and the layer inputs, from which each map's row is formed in chunks."""

    class_index: int
    terms: tuple[torch.Tensor, ...]  # per layer (1, T, T); empty when chunked; a Swin's: per layer its windows'
    layouts: tuple[LayerLayout, ...] = ()  # with stages (Swin, Hiera) or windows (Qwen2.5-VL): each layer's
    inputs: LayerInputs | None = None  # chunked: the layer inputs of the image
    contexts: torch.Tensor | None = None  # chunked: (1, L, T, H, hd)
    rows: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict, repr=False)  # chunked rows, per map

    def row(self, query: int | None, end_layer: int, readout: torch.Tensor | None = None) -> torch.Tensor:
        """Row ``query`` of the gradient rollout up to ``end_layer`` (or ``readout (1, T) @`` it, query None):
        ``(1, T)``."""
        if readout is not None:
            if self.layouts:
                raise ValueError("a model whose layers attend in windows starts its class map from one token")
            if self.inputs is None:
                return relevance_rollout_vector(self.terms, readout, end_layer)
            return self.inputs.gradient_rollout_row(self.contexts, None, end_layer, row=readout)
        if self.layouts:  # a plain grid whose layers attend in windows (Qwen2.5-VL, SAM): the row through them
            from vit.explain.methods.stage_maps import relevance_rollout_row as through_windows

            return through_windows(self.terms, self.layouts, end_layer, query).flatten(1)
        if self.inputs is None:
            return relevance_rollout_row(self.terms, query, end_layer)
        if (query, end_layer) not in self.rows:
            self.rows[(query, end_layer)] = self.inputs.gradient_rollout_row(self.contexts, query, end_layer)
        return self.rows[(query, end_layer)]


@dataclass(frozen=True)
class MapSettings:
    """Which attention map to draw. Defaults: the seed blog's figure (last layer, CLS query, mean over heads)."""

    kind: str = "attention"  # a method of the registry (a key of MAP_KINDS, or a plugin's)
    layer: int = -1  # 0-based, negative from the end; for kind "attention"
    head: int | None = None  # 0-based; None fuses the heads with ``fusion``
    fusion: str = "mean"  # mean, max or min over heads (kind "attention" with head None, and "rollout")
    query: int = 0  # the token whose attention is shown; 0 is CLS
    # rollout and class maps: start from what a mean-pooling classifier reads (the mean of the patch tokens' rows,
    # ``attention.pooled_readout``) instead of ``query``: the default for a model without CLS that pools
    readout: bool = False
    discard_ratio: float = 0.0  # rollout: share of each row's lowest patch attentions dropped
    end_layer: int = -1  # rollout and class maps: last layer included, 0-based, negative from the end
    class_index: int | None = None  # class map: None means the predicted class
    start_layer: int = -2  # LeGrad: the first layer explained, 0-based, negative from the end (the authors' default)
    # captum's and RISE's parameters that differ from their defaults (vit.explain.methods.captum_maps.chosen_options)
    options: tuple[tuple[str, float | int], ...] = ()


def resolved_class(settings: MapSettings, analysis: Analysis) -> int:
    """The class of the class-specific map: the chosen one, else the predicted one."""
    return analysis.prediction.class_index if settings.class_index is None else settings.class_index


def readout_row(analysis: Analysis) -> torch.Tensor:
    """``(1, T)``: what a mean-pooling classifier reads of the last layer, the mean of the patch tokens
    (``attention.pooled_readout``: 1 / patches on each, 0 on the prefix tokens)."""
    return pooled_readout(analysis.num_tokens, analysis.num_prefix_tokens, analysis.grid[0] * analysis.grid[1])


def default_query(analysis: Analysis | ViewShape, kind: str, pools: bool) -> tuple[int, bool]:
    """``(query, readout)``: where a map of ``kind`` starts when no query is given. CLS (token 0) where the model has
    one; without one (token 0 is a register or the corner patch), rollout and the class map of a model whose
    classifier mean-pools (``pools``) start from that mean (``readout``), and any other map from the centre patch."""
    if analysis.has_cls or analysis.staged:
        return 0, False
    if pools and kind in ("rollout", "class"):
        return 0, True
    (gh, gw), prefix = analysis.grid, analysis.num_prefix_tokens
    return prefix + (gh // 2) * gw + gw // 2, False


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
                row: torch.Tensor | None = None, progress: Progress | None = None) -> torch.Tensor:
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


def rollout_map(analysis: Analysis, settings: MapSettings, progress: Progress | None = None) -> np.ndarray:
    """The ``(gh, gw)`` map of a ``rollout`` or ``probe_rollout`` setting (see ``rollout_row``): the page computes
    it as long work when it is built from chunks (``factors_fit`` False), seconds to minutes."""
    s = settings
    if s.kind == "rollout" and s.readout:
        return _patch_map(rollout_row(analysis, s.fusion, s.discard_ratio, s.end_layer, row=readout_row(analysis),
                                      progress=progress)[0], analysis)
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
        raise ValueError("this analysis has no hidden states; run image_analysis.analyse")
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
    if is_method_map(s.kind) and (not analysis.layouts or s.kind in STAGE_MAP_KINDS):
        if method_map is None:
            raise ValueError(f"the {method_of(s.kind).title} map must be computed with model_method_map first")
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
        if s.readout:
            return _patch_map(relevance.row(None, s.end_layer, readout_row(analysis))[0], analysis)
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
    method_of(s.kind)  # an unknown kind: ValueError naming every map
    raise ValueError(f"{s.kind} is drawn by model_method_map; pass its map as method_map")


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


NPZ_PRECISIONS = ("float32", "float16")


def check_npz_fits(analysis: Analysis, layers: Sequence[int] | None = None, precision: str = "float32") -> None:
    """``TooManyTokens`` when ``attentions_npz`` of these layers would be over the memory limit per image: the page
    asks before it offers the download, whose data is built only when it is clicked."""
    if analysis.layouts:
        raise ValueError("the .npz holds token-by-token matrices of one grid; this model's layers each have "
                         "their own (stages): use vit.explain.methods.stage_maps on model(x, output_attentions=True)")
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
