"""What one view of one input costs, and whether it may run: ``estimate`` counts it, ``decide`` answers.

``estimate(view, model, grid)`` gives a ``Cost``: the tokens, the working memory the view holds at once (its parts
named: hidden states, caches, attention chunks, every layout's windows, biases and indices, gradients) and the
forward's FLOPs; where the view has a path in chunks as well as a whole one (the class-specific map), the bytes of
each. ``decide(cost)`` is the one answer every entry point asks before the work (the explorer's views, the notebook
API, ``vit.predict``, ``vit.analyze``, the SAE commands and their Ray runs): ``"run"``, ``"chunks"``, or the view's
one-line refusal raised (``TooManyTokens``: what it would hold, the limit, what to do).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from vit.costs import bounds, memory
from vit.costs.bounds import ANALYSIS_MEMORY_ENV, MAX_TOKENS_ENV, TooManyTokens

MB = 2**20


@dataclass(frozen=True)
class Cost:
    """One view of one input: ``tokens`` (the prefix tokens included), ``memory`` bytes its whole path holds at
    once (``parts``: what holds them), ``chunked`` bytes of its path in chunks (None: it has none), ``flops`` of the
    model's forward at these tokens; ``refuse(need, limit)`` is its refusal, ``limit`` the bound it is held to."""

    view: str
    tokens: int
    memory: int
    flops: int
    limit: int
    refuse: Callable[[int, int], Exception] = field(repr=False)
    parts: tuple[tuple[str, int], ...] = ()
    chunked: int | None = None
    every: int = 1  # the analysis's path in chunks keeps the residual stream at every ``every``-th layer


def largest_square_side(patch_size: int | tuple[int, int], patches: int) -> int:
    """The side in px of the largest square input (``InputSize(side)``) whose grid has at most ``patches`` patches:
    a whole number of patches both ways, so ``isqrt(patches) * patch_size`` for square patches."""
    ph, pw = (patch_size, patch_size) if isinstance(patch_size, int) else patch_size
    step = math.lcm(ph, pw)
    return step * max(1, math.isqrt(patches * ph * pw) // step)


def decide(cost: Cost) -> str:
    """``"run"`` when the view's whole path fits its limit, ``"chunks"`` when only its path in chunks does; else its
    refusal is raised (one line: what it would hold, the limit, what to do). Asked before any work."""
    if cost.memory <= cost.limit:
        return "run"
    if cost.chunked is not None and cost.chunked <= cost.limit:
        return "chunks"
    raise cost.refuse(cost.memory if cost.chunked is None else cost.chunked, cost.limit)


def _device(model) -> str:
    """The type of the device ``model`` runs on (a model given by its config alone: a CPU's)."""
    parameters = getattr(model, "parameters", None)
    return next(parameters()).device.type if parameters is not None else "cpu"


def _tokens(model, grid: tuple[int, int]) -> int:
    return model.num_prefix_tokens + grid[0] * grid[1]


def _cost(view: str, model, grid, parts: dict[str, int], refuse, chunked: int | None = None,
          limit: int | None = None) -> Cost:
    tokens = _tokens(model, grid)
    return Cost(view, tokens, sum(parts.values()), bounds.forward_flops(model.config, tokens),
                bounds.memory_limit() if limit is None else limit, refuse, tuple(parts.items()), chunked)


def _over(what: str) -> Callable[[int, int], TooManyTokens]:
    """The refusal of a view whose message needs only the bytes and the limit: ``what`` holds ``{need}`` and
    ``{limit}`` (MB)."""
    return lambda need, limit: TooManyTokens(what.format(need=f"{need / MB:,.0f}", limit=f"{limit / MB:,.0f}"))


def _clip_frames(model, grid: tuple[int, int]) -> dict[str, int]:
    """A video model's clip, preprocessed again for a class's forward and backward beside the analysis that holds it
    (``vit.explain.views.video``): its every frame (VideoMAE-B's 16 frames of 224 px: 9.6 MB); nothing for an image."""
    if not getattr(model.config, "tubelet_size", 0):
        return {}
    return {"the clip's frames, preprocessed again": memory.input_bytes(model, grid)}


def _advice(model, side: Callable[[], int], other: str = "another map") -> str:
    """What a refusal says to do: for an image, the largest square input that fits (``side()`` px) and a smaller input
    size; a video model's clip is the model's own size (its frames and crop), so a higher limit instead."""
    if getattr(model.config, "tubelet_size", 0):
        return f"a clip's size is the model's own: raise {ANALYSIS_MEMORY_ENV}, or choose {other}."
    return f"the largest square input that fits is {side()} px. Choose a smaller input size, or {other}."


def _smaller(model) -> str:
    """What a refusal of the analysis or the forward says to do: a smaller input, or for a clip a higher limit."""
    if getattr(model.config, "tubelet_size", 0):
        return f"A clip's size is the model's own: raise {ANALYSIS_MEMORY_ENV}."
    return "Choose a smaller input size."


# --- the views ---------------------------------------------------------------------------------------------------

def _largest_square(high: int, fits: Callable[[tuple[int, int]], bool], unit: int = 1) -> int:
    """The most patches of the largest square grid, ``side x side`` with ``side`` a multiple of ``unit`` up to
    ``high x unit``, that ``fits`` (a binary search: the bytes grow with the tokens); ``unit²`` when none does."""
    low = 1
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits((middle * unit,) * 2) else (low, middle - 1)
    return (low * unit) ** 2


def analysis(model, grid: tuple[int, int], what: str = "This input") -> Cost:
    """The explorer's analysis of one image (``image_analysis.analyse``) and every map drawn from what it keeps
    (``memory.analysis_parts``: hidden states, the forward, queries and keys, the rollout's factors or a chunk of
    attention), and what its attention layouts hold (``bounds.layout_memory``: windows, position biases and
    indices, pooled queries; a model with stages keeps every layer's windows, which its maps, the rollout through
    the merges too, read)."""
    config, tokens = model.config, _tokens(model, grid)
    layouts = bounds.layout_memory(model, grid, analysis=True)
    # The maps' steps beside the costliest layer's layout, not either: the layout's freed scores are not always
    # reused by the maps' float64 steps (Swin-T at 1,624 px, measured: 610-683 MB where the larger of the two
    # counted 576 MB)
    maps = max(layouts.peak, layouts.maps)
    # With the rollout's factors kept, a windowed layer's pattern is read whole beside them (``analysis_parts``),
    # never stepped over window by window: beside the rest only the layout as the forward forms it
    kept = bool(layouts.pattern) and memory.factors_kept(config.num_layers, tokens)
    pattern = (layouts.pattern, layouts.probabilities) if kept else (0, 0)

    def parts_of(every: int) -> dict[str, int]:
        return {**memory.analysis_parts(model, grid, _device(model), maps=maps, every=every, pattern=pattern),
                "every layer's windows, kept": layouts.kept,
                **({"the costliest layer's layout": layouts.forward} if kept else
                   {"the costliest layer's layout and the maps' steps": maps})}

    parts, limit = parts_of(1), bounds.memory_limit()
    # Past the limit, the path in chunks: the residual stream kept every k-th layer, the rest recomputed from it
    # (``hidden.CheckpointedStates``); the smallest k that fits (the fewest blocks run again per map), else the k
    # that holds the least, whose need the refusal names. A model with stages keeps its windows, not its states.
    chunked, every, L = None, 1, config.num_layers
    if sum(parts.values()) > limit and not getattr(config, "stage_depths", ()) and L > 1:
        needs = {k: sum(parts_of(k).values()) for k in range(2, L + 1)}
        every = next((k for k, need in needs.items() if need <= limit), min(needs, key=needs.get))
        chunked = needs[every]

    def refuse(need: int, limit: int) -> TooManyTokens:
        if chunked is not None and need == chunked:
            return TooManyTokens(f"{what} gives {tokens:,} tokens, which needs about {need / MB:,.0f} MB for "
                                 f"{config.num_layers} layers × {config.num_heads} heads even with the hidden states "
                                 f"kept every {every} layers only, over the {limit / MB:,.0f} MB limit per image "
                                 f"({ANALYSIS_MEMORY_ENV}). {_smaller(model)}")
        held = []
        if layouts.kept:
            held.append(f"{(layouts.kept + layouts.maps) / MB:,.0f} MB for every layer's windows and the maps "
                        "read from them")
        if layouts.why:
            held.append(f"{layouts.peak / MB:,.0f} MB at once for layer {layouts.layer}'s {layouts.why}")
        held = f" ({'; '.join(held)})" if held else ""
        return TooManyTokens(f"{what} gives {tokens:,} tokens, which needs about {need / MB:,.0f} MB for "
                             f"{config.num_layers} layers × {config.num_heads} heads{held}, over the "
                             f"{limit / MB:,.0f} MB limit per image ({ANALYSIS_MEMORY_ENV}). {_smaller(model)}")
    return replace(_cost("analysis", model, grid, parts, refuse, chunked, limit), every=every)


def gradient(model, grid: tuple[int, int], what: str, layers: int | None = None, other: str = "another map") -> Cost:
    """A gradient method that keeps its layers' whole attention and gradient (LRP, AttnLRP, the CAMs from their
    layer on, the class-specific map's whole path): ``4 x layers x H x T²`` floats (``layers``: default all); a
    layer that attends in windows (Qwen2.5-VL's, SAM's) keeps its windows' ``H x windows x slots²`` instead. Beside
    it, those layers' activations in the graph (``memory.whole_graph_bytes``, linear in T)."""
    config, tokens = model.config, _tokens(model, grid)
    windowed = bool(config.window_size) and not config.stage_depths

    def attention_at(g: tuple[int, int]) -> int:
        if windowed:
            return memory.windowed_gradient_bytes(model, g, layers)
        return memory.whole_gradient_bytes(config, _tokens(model, g), layers)

    def bytes_at(g: tuple[int, int]) -> int:
        return attention_at(g) + memory.whole_graph_bytes(config, _tokens(model, g), layers)

    attention, graph = attention_at(grid), memory.whole_graph_bytes(config, tokens, layers)

    def refuse(need: int, limit: int) -> TooManyTokens:
        def side() -> int:  # a share linear in T beside one in T²: the largest square searched
            unit = (config.spatial_merge or 1) if windowed else 1  # Qwen's grids are whole merge units
            patches = _largest_square(max(max(grid) // unit, 1), lambda g: bytes_at(g) <= limit, unit)
            return largest_square_side(config.patch_size, patches)
        kept = ("every layer's" if layers in (None, config.num_layers) else "its last layer's" if layers == 1
                else f"its last {layers} layers'")
        return TooManyTokens(f"{what} keeps {kept} attention and gradient: about {need / MB:,.0f} MB at "
                             f"{tokens:,} tokens, over the {limit / MB:,.0f} MB limit ({ANALYSIS_MEMORY_ENV}); "
                             f"{_advice(model, side, other)}")
    part = ("every layer's attention (a windowed layer's windows), its gradient and autograd's copies" if windowed
            else "every layer's attention, its gradient and autograd's copies")
    return _cost("gradient", model, grid, {part: attention, "its layers' activations in the graph": graph,
                                           **_clip_frames(model, grid)}, refuse)


def attnlrp(model, grid: tuple[int, int], what: str = "AttnLRP", other: str = "another map") -> Cost:
    """AttnLRP (``relevance.attnlrp``): a model without stages keeps every block's graph under the rules while it
    fits (``memory.attnlrp_bytes``: its attention fused, no ``H x T²`` but where a bias or windows are added), past
    that checkpoints its blocks (each block's input kept, one block's graph at a time: ``checkpointed``), its path
    in chunks; a model with stages keeps its layers' attention and gradient (``gradient``)."""
    if model.config.stage_depths:
        return gradient(model, grid, what, other=other)
    config, tokens = model.config, _tokens(model, grid)

    def refuse(need: int, limit: int) -> TooManyTokens:
        def side() -> int:
            return largest_square_side(config.patch_size, _largest_square(
                max(grid), lambda g: memory.attnlrp_bytes(model, g, checkpointed=True) <= limit))
        return TooManyTokens(f"{what} keeps each block's input and one block's graph: about {need / MB:,.0f} MB at "
                             f"{tokens:,} tokens, over the {limit / MB:,.0f} MB limit ({ANALYSIS_MEMORY_ENV}); "
                             f"{_advice(model, side, other)}")
    parts = {"every block's graph under the rules, the input, the gradients": memory.attnlrp_bytes(model, grid)}
    return _cost("attnlrp", model, grid, parts, refuse, memory.checkpointed_gradient_bytes(model, grid))


def mask_gradient(model, grid: tuple[int, int], hidden: int, layers: int, embedding_grid: tuple[int, int],
                  what: str = "Gradient x input of the mask") -> Cost:
    """A gradient of SAM's mask (``vit.explain.methods.segment``): the image encoder's, as any gradient method's through
    it (``gradient``; a model with stages, ``stage_gradient`` from its first layer), beside the mask decoder's graph
    (``memory.mask_decoder_bytes`` of its ``hidden`` width and ``layers`` two-way blocks on ``embedding_grid``). A
    model of the library road (SAM 3 tracker's encoder) counts as its gradient maps do (``library_gradient``)."""
    if getattr(model, "road", None) == "library":
        encoder = library_gradient(model.cost_shape(), grid, what)
    else:
        encoder = stage_gradient(model, grid, 0, what) if model.config.stage_depths else gradient(model, grid, what)
    return _with_mask_decoder(encoder, "mask gradient", hidden, layers, embedding_grid, what)


def mask_legrad(model, grid: tuple[int, int], hidden: int, layers: int, embedding_grid: tuple[int, int],
                start_layer: int = -2) -> Cost:
    """LeGrad of SAM's mask (``vit.explain.methods.segment.legrad``): LeGrad's own (``legrad``: the explained layers'
    inputs, one block's work, a chunk) beside the mask decoder's graph, which reads each explained layer."""
    return _with_mask_decoder(legrad(model, grid, start_layer), "mask legrad", hidden, layers, embedding_grid,
                              "LeGrad of the mask")


def _with_mask_decoder(encoder: Cost, view: str, hidden: int, layers: int, embedding_grid: tuple[int, int],
                       what: str) -> Cost:
    """``encoder``'s cost with the mask decoder's graph (``memory.mask_decoder_bytes``) beside it. Its refusal
    advises what ``vit.segment`` takes: it encodes the image at the model's own input size, so no smaller one."""
    decoder = memory.mask_decoder_bytes(hidden, layers, embedding_grid)
    parts = (*encoder.parts, ("the mask decoder's graph", decoder))

    def refuse(need: int, limit: int) -> TooManyTokens:
        return TooManyTokens(f"{what} keeps the image encoder's graph and the mask decoder's: about {need / MB:,.0f} "
                             f"MB at {encoder.tokens:,} tokens, over the {limit / MB:,.0f} MB limit "
                             f"({ANALYSIS_MEMORY_ENV}). vit.segment encodes the image at the model's own input size, "
                             f"never a smaller one: raise {ANALYSIS_MEMORY_ENV} to {math.ceil(need / MB):,} or more, "
                             "or ask for the masks and the decoder's attention alone (no gradient).")
    return replace(encoder, view=view, memory=encoder.memory + decoder, parts=parts, refuse=refuse)


def chunked_gradient(model, grid: tuple[int, int], what: str) -> Cost:
    """The class-specific map's path in chunks (``LayerInputs.context_gradients``, then ``gradient_rollout_row``):
    every layer's input and context gradient, one block's graph, and the rollout row's chunks
    (``memory.gradient_bytes``). LeGrad's is ``legrad``."""
    config, tokens = model.config, _tokens(model, grid)
    # The rollout row forms an attention chunk and its gradient's: half the budget each on a GPU, a core's
    # cache-sized ones on a CPU
    budget = memory.CHUNK_BYTES if _device(model) != "cpu" else 2 * memory.FAST_CHUNK_BYTES * memory.CHUNK_COPIES
    bias = config.num_heads if memory.has_logit_bias(config) else 0
    need = memory.gradient_bytes(config.num_layers, config.hidden_size, config.mlp_size, tokens, True, budget, bias)

    def refuse(need: int, limit: int) -> TooManyTokens:
        per_token = memory.gradient_bytes(config.num_layers, config.hidden_size, config.mlp_size, 1, True, 0)
        most = memory.largest_tokens(max(limit - budget, 0), per_token,
                                     4 * memory.BIAS_GRAPH_COPIES * bias)
        return TooManyTokens(f"{what} keeps every layer's input and gradient: about "
                             f"{need / MB:,.0f} MB at {tokens:,} tokens, over the {limit / MB:,.0f} MB limit "
                             f"({ANALYSIS_MEMORY_ENV}); "
                             + _advice(model, lambda: largest_square_side(config.patch_size,
                                                                          max(most - model.num_prefix_tokens, 1))))
    return _cost("chunked gradient", model, grid, {"hidden states, a block's graph, a chunk": need,
                                                   **_clip_frames(model, grid)}, refuse)


def class_map(model, grid: tuple[int, int], what: str = "The class-specific map") -> Cost:
    """The class-specific map (``method_maps.class_relevance``): every layer's attention and gradient kept whole
    beside every block's activations (``memory.whole_graph_bytes``) while they fit, else one block's backward at a
    time in chunks (``chunked``), keeping every layer's context gradient. A model with stages keeps its windows
    (``stage_gradient``), never ``T²``."""
    if model.config.stage_depths:
        return stage_gradient(model, grid, 0, what)
    problem = None if model.config.window_size else memory.layout_problem(model.config)  # windows: their own path
    if problem:  # the path in chunks forms its rows from queries and keys alone: the whole path or nothing
        return replace(gradient(model, grid, f"{what} of a model that {problem}"), view="class")
    whole, chunks = gradient(model, grid, what), chunked_gradient(model, grid, what)  # whole: with every block's graph
    return Cost("class", whole.tokens, whole.memory, whole.flops, whole.limit, chunks.refuse, whole.parts,
                chunks.memory)


def stage_gradient(model, grid: tuple[int, int], start_layer: int = -2, what: str = "LeGrad") -> Cost:
    """A gradient through a model with stages (LeGrad from ``start_layer``; the class-specific map's gradient
    rollout from 0): the explained layers' windows and activations in the graph (``memory.stage_gradient_bytes``)
    beside what a layer's layout forms (``bounds.layout_memory``)."""
    parts = {"the explained layers' windows and activations": memory.stage_gradient_bytes(model, grid, start_layer),
             "the costliest layer's layout": bounds.layout_memory(model, grid).peak}
    refuse = _over(f"{what} keeps the explained layers' attention and activations for the gradient: about {{need}} "
                   f"MB at a {grid[0]}x{grid[1]} patch grid, over the {{limit}} MB limit ({ANALYSIS_MEMORY_ENV}). "
                   "Choose a smaller input size, or another map.")
    return _cost("stage gradient", model, grid, parts, refuse)


def legrad(model, grid: tuple[int, int], start_layer: int = -2) -> Cost:
    """LeGrad: in chunks (never a whole layer's attention or gradient), or through a model's stages."""
    if model.config.stage_depths:
        return stage_gradient(model, grid, start_layer)
    config, device = model.config, _device(model)
    need = memory.legrad_bytes(model, grid, start_layer, device)

    def refuse(need: int, limit: int) -> TooManyTokens:
        def side() -> int:
            return largest_square_side(config.patch_size, _largest_square(
                max(grid), lambda g: memory.legrad_bytes(model, g, start_layer, device)
                + bounds.layout_memory(model, g).peak <= limit))
        return TooManyTokens(f"LeGrad keeps its explained layers' inputs and one block's work: about "
                             f"{need / MB:,.0f} MB at {_tokens(model, grid):,} tokens, over the {limit / MB:,.0f} MB "
                             f"limit ({ANALYSIS_MEMORY_ENV}); {_advice(model, side)}")
    # beside what a layer's layout forms (a BEiT's bias rows and their index), as a forward's
    return _cost("legrad", model, grid, {"the explained layers' inputs, a block's work, a chunk": need,
                                         "the costliest layer's layout": bounds.layout_memory(model, grid).peak,
                                         **_clip_frames(model, grid)}, refuse)


def flow(model, grid: tuple[int, int], max_flow_tokens: int) -> Cost:
    """Attention flow: one max-flow problem per token (time ~T³), held to its token limit (``max_flow_tokens``,
    ``attention_flow.MAX_FLOW_TOKENS``) rather than to bytes; its forward keeps every layer's whole attention."""
    tokens = _tokens(model, grid)

    def refuse(need: int, limit: int) -> TooManyTokens:
        side = largest_square_side(model.config.patch_size, max(max_flow_tokens - model.num_prefix_tokens, 1))
        return TooManyTokens(f"Attention flow solves one max-flow problem per token: {tokens:,} tokens is over its "
                             f"limit of {max_flow_tokens} (about 40 s there on 2 cores); the largest square input "
                             f"that fits is {side} px. Choose a smaller input size, or rollout.")
    return _cost("flow", model, grid, {"tokens (max-flow problems)": tokens}, refuse, limit=max_flow_tokens)


def forward(model, grid: tuple[int, int], what: str = "This input", attentions: bool = False) -> Cost:
    """One image's forward without a graph (``vit.predict``, ``vit.analyze``, an SAE's harvest): its costliest
    block (``memory.forward_bytes``) and what its attention layouts form at once (``bounds.layout_memory``); with
    ``attentions``, every layer's attention it returns (``memory.attentions_bytes``: the dataset analysis's). A
    library-built model (``LibraryShape``: a VLM's declared tower) is counted from its sizes alone
    (``memory.library_pass_bytes``)."""
    if isinstance(model, LibraryShape) and not attentions:
        return _cost("forward", model, grid, {"the library's forward": memory.library_pass_bytes(model, grid, False)},
                     _over(f"{what} ({grid[0]}×{grid[1]} patches) needs about {{need}} MB at once for one image's "
                           f"forward, over the {{limit}} MB limit per image ({ANALYSIS_MEMORY_ENV}). Choose a smaller "
                           "input size."))
    layouts = bounds.layout_memory(model, grid)
    parts = {"the costliest block and the input": memory.forward_bytes(model, grid),
             f"layer {layouts.layer}'s {layouts.why or 'layout'}": layouts.peak}
    if attentions:
        parts["every layer's attention, returned"] = memory.attentions_bytes(model, grid)

    def refuse(need: int, limit: int) -> TooManyTokens:
        gh, gw = grid
        returned = " with every layer's attention" if attentions else ""
        return TooManyTokens(f"{what} ({gh}×{gw} patches) needs about {need / MB:,.0f} MB at once for one image's "
                             f"forward{returned}, {layouts.peak / MB:,.0f} MB of it for layer {layouts.layer}'s "
                             f"{layouts.why or 'attention'}, over the {limit / MB:,.0f} MB limit per image "
                             f"({ANALYSIS_MEMORY_ENV}). "
                             + (_smaller(model) if getattr(model.config, "tubelet_size", 0)
                                else f"Choose a smaller input size, or raise {ANALYSIS_MEMORY_ENV}."))
    return _cost("forward", model, grid, parts, refuse)


def sink_diagnostics(model, grid: tuple[int, int], what: str = "This input") -> Cost:
    """The sink diagnostics of one image (``vit.explain.mechanism.sink_diagnostics``): every layer's hidden states
    beside the forward's costliest block, then one layer at a time its values and contexts (``H x T x hd`` each), the
    attention each key receives and its sink column, one head's output-projected values and update (``T x D`` each,
    float32) and its QR factor (float64), and a chunk of attention (``memory.attention_chunk``)."""
    config, T = model.config, _tokens(model, grid)
    L, H, D = config.num_layers, config.num_heads, config.hidden_size
    hd = getattr(config, "head_dim", None) or D // H
    chunk = memory.attention_chunk(config, H, T, _device(model))
    parts = {"hidden states": memory.states_bytes(L, T, D),
             "the forward's costliest block": memory.forward_bytes(model, grid),
             "one layer's values, contexts and sink columns": 4 * (2 * H * T * hd + 3 * H * T),
             "one head's projected values and update, and its QR factor": 4 * 2 * T * D + 8 * (T * hd + 2 * hd * D),
             "a chunk of attention": chunk}

    def refuse(need: int, limit: int) -> TooManyTokens:
        return TooManyTokens(f"{what} gives {T:,} tokens, whose sink diagnostics need about {need / MB:,.0f} MB for "
                             f"{L} layers × {H} heads, over the {limit / MB:,.0f} MB limit per image "
                             f"({ANALYSIS_MEMORY_ENV}). {_smaller(model)}")
    return _cost("sink diagnostics", model, grid, parts, refuse)


def tokens_gate(model, grid: tuple[int, int], what: str, limit: int | None = None,
                allow: str = f"raise {MAX_TOKENS_ENV}") -> None:
    """``TooManyTokens`` when the input's patches are over the token gate (``limit``, default VIT_MAX_TOKENS;
    ``allow``: how the message says to raise it): ``bounds.check_tokens``, whose work grows with T²."""
    bounds.check_tokens(model.config, grid[0] * grid[1], what, bounds.max_tokens(limit), allow)


@dataclass(frozen=True)
class TextShape:
    """A language model's sizes, as ``vlm_answer`` counts them."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    mlp: int
    vocab: int
    itemsize: int  # bytes per value of its weights and cache
    windows: tuple[int | None, ...] = ()  # each layer's sliding window (None: global); (): every layer global
    state_bytes: int = 0  # a hybrid's linear-attention layers' recurrent and convolution states (``layers``: the rest)


def vlm_answer(tower, grid: tuple[int, int], text: TextShape, prompt_tokens: int, new_tokens: int, views: int = 1,
               view_grid: tuple[int, int] | None = None) -> Cost:
    """A VLM's greedy answer of ``new_tokens`` to a prompt of ``prompt_tokens`` (its image tokens included) about an
    image on the tower's patch ``grid`` (``vit.explain.language.vlm_answer``), or cut into ``views`` tiles of
    ``view_grid`` patches each (the tiles' canvas ``grid``): the tower's forward over each (``forward``), the KV cache
    of every layer, the prompt's forward through one decoder layer (its activations, its MLP and, where the attention
    cannot fuse, one layer's ``H x T²`` scores), the last position's logits, and each answer token's query row at every
    layer, kept for its maps (``L x H x d``), with the keys of each sliding-window layer the answer may outgrow; a
    map's row is ``H x T``. Never every layer's ``T x T``."""
    t = prompt_tokens + new_tokens
    parts = {
        "the tower's forward": views * forward(tower, view_grid or grid).memory,
        "the KV cache, every layer's keys and values": 2 * text.layers * text.kv_heads * t * text.head_dim
        * text.itemsize,
        "the prompt's forward through one layer": prompt_tokens * (4 * text.hidden + 3 * text.mlp) * text.itemsize
        + text.heads * prompt_tokens ** 2 * 4 + text.vocab * 4,
        "each answer token's query rows and one map's row": text.layers * text.heads * text.head_dim * new_tokens * 4
        + 3 * text.heads * t * 4,
    }
    if text.state_bytes:
        parts["the linear-attention layers' states"] = text.state_bytes
    sliding = sum(1 for window in text.windows if window is not None and window < t)
    if sliding:  # the keys a sliding layer's cache drops, kept for the maps (``vlm_answer._Recorder``)
        parts["the sliding-window layers' keys, kept past the window"] = sliding * text.kv_heads * t * text.head_dim \
            * text.itemsize
    refuse = _over(f"Answering {new_tokens} tokens to a prompt of {prompt_tokens:,} tokens (a "
                   f"{grid[0]}x{grid[1]}-patch image) needs about {{need}} MB (the KV cache of {text.layers} layers, "
                   f"the prompt's forward), over the {{limit}} MB limit ({ANALYSIS_MEMORY_ENV}); ask for fewer "
                   "tokens or a smaller image.")
    cost = _cost("vlm answer", tower, grid, parts, refuse)
    return replace(cost, tokens=t, flops=2 * t * (text.layers * (4 * text.hidden * text.heads * text.head_dim
                                                                 + 3 * text.hidden * text.mlp)))


ROW_CHUNK_BYTES = 2**25  # gradient x attention's chunk of attention rows, per tensor formed (scores, gradient)


def vlm_relevance(tower, grid: tuple[int, int], text: TextShape, tokens: int, answer_token: int,
                  fused: bool = True, views: int = 1, view_grid: tuple[int, int] | None = None) -> Cost:
    """Gradient x attention of answer token ``answer_token`` (``vit.explain.language.vlm_relevance``): one forward of
    the VLM over ``tokens`` (the prompt and the answer's tokens before it) with the language model's graph, and its
    backward. Held at once: the tower's forward (no graph), every language-model layer's activations in the graph
    (norms, projections, attention output, the MLP's four), where the attention cannot fuse (eager) every layer's ``H x
    T²`` scores and probabilities, each layer's queries, keys, values and ``dy/dO`` kept in float32, the masks (one per
    kind of layer, ``T²``), and one chunk of attention rows formed again (scores, probabilities, gradient). Never a ``T
    x T`` of the rollout: it runs as a row vector. An image cut into ``views`` tiles of ``view_grid`` patches: the
    tower's forward over each."""
    q, kv = text.heads * text.head_dim, text.kv_heads * text.head_dim
    parts = {
        "the tower's forward": views * forward(tower, view_grid or grid).memory,
        "the language model's graph, every layer's activations": text.layers * tokens
        * (6 * text.hidden + 2 * q + 2 * kv + 4 * text.mlp) * text.itemsize,
        "each layer's queries, keys, values and dy/dO (float32)": text.layers * tokens * (2 * q + 2 * kv) * 4,
        "the attention masks": 2 * tokens ** 2 * 4,
        "one chunk of attention rows formed again": 3 * min(ROW_CHUNK_BYTES, text.heads * tokens ** 2 * 4),
        "the last position's logits": text.vocab * 4,
    }
    if not fused:
        parts["every layer's scores and probabilities (eager attention)"] = 2 * text.layers * text.heads \
            * tokens ** 2 * 4
    refuse = _over(f"Gradient x attention of answer token {answer_token} runs the model over {tokens:,} tokens (a "
                   f"{grid[0]}x{grid[1]}-patch image) with the language model's graph: about {{need}} MB, over the "
                   f"{{limit}} MB limit ({ANALYSIS_MEMORY_ENV}); choose an earlier token or a smaller image.")
    cost = _cost("vlm relevance", tower, grid, parts, refuse)
    return replace(cost, tokens=tokens, flops=6 * tokens * (text.layers * (4 * text.hidden * q
                                                                           + 3 * text.hidden * text.mlp)))


def vlm_lens(tower, grid: tuple[int, int], text: TextShape, tokens: int, lens_rows: int = 0, views: int = 1,
             view_grid: tuple[int, int] | None = None) -> Cost:
    """A forward of the VLM over ``tokens`` without a graph (``vit.explain.language.vlm_lens``: the logit lens of an
    answer token, or one run of a region's ablation): the tower's forward over each of its ``views``, one decoder
    layer's activations and its attention's ``H x T²`` scores (an unfused attention's; counted whatever runs), the
    input embeddings (the ablation's copy too), the last position's logits and, for the lens, its ``lens_rows`` (every
    decoder layer's query row and the first layer's input) read through the head, a row of the vocabulary each."""
    parts = {
        "the tower's forward": views * forward(tower, view_grid or grid).memory,
        "one layer's forward over the tokens": tokens * (4 * text.hidden + 3 * text.mlp) * text.itemsize
        + text.heads * tokens ** 2 * 4,
        "the input embeddings, and a copy": 2 * tokens * text.hidden * text.itemsize,
        "the last position's logits": text.vocab * 4,
    }
    if lens_rows:
        parts["every layer's row read through the head"] = lens_rows * (text.vocab + text.hidden) * 4
    refuse = _over(f"Reading answer token's layers at {tokens:,} tokens (a {grid[0]}x{grid[1]}-patch image) needs "
                   f"about {{need}} MB, over the {{limit}} MB limit ({ANALYSIS_MEMORY_ENV}); choose an earlier token "
                   "or a smaller image.")
    return replace(_cost("vlm lens", tower, grid, parts, refuse), tokens=tokens)


def vlm_attnlrp(tower, grid: tuple[int, int], text: TextShape, tokens: int, answer_token: int,
                fused: bool = True, views: int = 1, view_grid: tuple[int, int] | None = None) -> Cost:
    """AttnLRP of answer token ``answer_token`` to the pixels (``vit.explain.language.vlm_attnlrp``): one forward of the
    VLM over ``tokens`` (the prompt and the answer's tokens before it) with the whole graph under the rules, from the
    pixels through the tower, the projector and the language model, and its backward. Held at once: the tower's graph
    under the rules for each of its ``views`` (``memory.attnlrp_bytes``, as ``attnlrp`` counts this project's tower),
    every language-model layer's activations in the graph (norms, projections, attention output, the MLP's four and the
    ratios its identity rule keeps), where the attention cannot fuse (eager) every layer's ``H x T²`` scores and
    probabilities, and the last position's logits. Never a ``T x T`` held beside the graph."""
    q, kv = text.heads * text.head_dim, text.kv_heads * text.head_dim
    parts = {
        "the tower's graph under the rules": views * (
            memory.library_pass_bytes(tower, view_grid or grid, True) if isinstance(tower, LibraryShape)
            else memory.attnlrp_bytes(tower, view_grid or grid)),
        "the language model's graph under the rules, every layer's activations": text.layers * tokens
        * (6 * text.hidden + 2 * q + 2 * kv + 6 * text.mlp) * text.itemsize,
        "the last position's logits": text.vocab * 4,
    }
    if not fused:
        parts["every layer's scores and probabilities (eager attention)"] = 2 * text.layers * text.heads \
            * tokens ** 2 * text.itemsize
    refuse = _over(f"AttnLRP of answer token {answer_token} runs the model over {tokens:,} tokens (a "
                   f"{grid[0]}x{grid[1]}-patch image) with the whole graph, from the pixels to the logit: about "
                   f"{{need}} MB, over the {{limit}} MB limit ({ANALYSIS_MEMORY_ENV}); choose an earlier token or a "
                   "smaller image.")
    cost = _cost("vlm attnlrp", tower, grid, parts, refuse)
    return replace(cost, tokens=tokens, flops=views * cost.flops * 3 + 6 * tokens * (
        text.layers * (4 * text.hidden * q + 3 * text.hidden * text.mlp)))


def vlm_tam(tower, grid: tuple[int, int], text: TextShape, tokens: int, answer_token: int, image_tokens: int,
            classes: int, fused: bool = True, views: int = 1, view_grid: tuple[int, int] | None = None) -> Cost:
    """TAM of answer token ``answer_token`` (``vit.explain.language.vlm_tam``): one forward of the VLM over ``tokens``
    (the prompt and the answer's tokens before it) without a graph or a cache, its last hidden states kept (float32),
    and the language-model head's rows of ``classes`` token ids over the ``image_tokens`` (and the current class over
    the text), one whole-vocabulary row (the first question word's greedy class). Never the vocabulary over every
    position. An image cut into ``views`` tiles of ``view_grid`` patches: the tower's forward over each."""
    q, kv = text.heads * text.head_dim, text.kv_heads * text.head_dim
    parts = {
        "the tower's forward": views * forward(tower, view_grid or grid).memory,
        "the language model's forward through one layer": tokens * (4 * text.hidden + 2 * q + 2 * kv
                                                                    + 3 * text.mlp) * text.itemsize,
        "the last hidden states (float32)": tokens * text.hidden * (text.itemsize + 4),
        "the head's rows of the classes and their activations": classes * (text.hidden + image_tokens + tokens) * 4
        + text.vocab * 4,
    }
    if not fused:
        parts["one layer's scores and probabilities (eager attention)"] = 2 * text.heads * tokens ** 2 * 4
    refuse = _over(f"TAM of answer token {answer_token} runs the model over {tokens:,} tokens (a "
                   f"{grid[0]}x{grid[1]}-patch image): about {{need}} MB, over the {{limit}} MB limit "
                   f"({ANALYSIS_MEMORY_ENV}); choose an earlier token or a smaller image.")
    cost = _cost("vlm tam", tower, grid, parts, refuse)
    return replace(cost, tokens=tokens, flops=2 * tokens * (text.layers * (4 * text.hidden * q
                                                                           + 3 * text.hidden * text.mlp)))


MAX_PASSES = 100_000  # the forwards one attribution map may run (RISE's 6,000 and captum's defaults far below)
# an attribution's forwards at once: past this a CPU's throughput is flat, and each adds its whole activations
MAX_BATCH = 64


def attribution_passes(model, grid: tuple[int, int], what: str, passes: int) -> Cost:
    """An attribution's forwards (captum's, RISE's: ``vit.explain.methods.captum_maps.passes``), held to ``MAX_PASSES``
    rather than to bytes, as flow's tokens are."""
    def refuse(need: int, limit: int) -> TooManyTokens:
        return TooManyTokens(f"{what} would run {need:,} forwards of the model, over the limit of {limit:,} per map; "
                             "choose fewer steps, samples or masks, or a larger occlusion window or stride.")
    return _cost("attribution passes", model, grid, {"forwards": passes}, refuse, limit=MAX_PASSES)


# The names a text config gives its MLP's hidden width besides intermediate_size: BART's (Florence-2's), OPT's
# (BLIP-2's), T5's
MLP_WIDTHS = ("decoder_ffn_dim", "ffn_dim", "d_ff", "moe_intermediate_size")  # the last: an MoE-only stack's experts


def mlp_width(text) -> int | None:
    """A text config's MLP width under another name than ``intermediate_size`` (``MLP_WIDTHS``), or None."""
    return next((getattr(text, name) for name in MLP_WIDTHS if getattr(text, name, None) is not None), None)


@dataclass(frozen=True)
class LibraryShape:
    """What the cost model reads of a model opened as its library builds it (``LibraryModel.cost_shape``: its
    config's sizes, or timm's modules'), named as our ``ViTConfig`` names them, so the views that count our ViT
    (``attribution_passes``, ``attribution_batch``, ``attribution``) take it in its place; ``config`` is itself."""

    num_layers: int
    num_heads: int
    hidden_size: int
    mlp_size: int  # the MLP's hidden width (transformers' intermediate_size)
    num_prefix_tokens: int
    patch_hw: tuple[int, int]
    num_channels: int = 3

    @property
    def config(self) -> LibraryShape:
        return self


def attribution_image_bytes(model, grid: tuple[int, int], gradient: bool) -> int:
    """One input's share of an attribution's batch: a forward's (``forward``), or with ``gradient`` the graph of a
    whole backward to the pixels (``attnlrp``'s whole path: every block's graph, the attention fused); a library
    model's (``LibraryShape``) from its sizes alone (``memory.library_pass_bytes``)."""
    if isinstance(model, LibraryShape):
        return memory.library_pass_bytes(model, grid, gradient)
    return attnlrp(model, grid).memory if gradient else forward(model, grid).memory


def attribution_batch(model, grid: tuple[int, int], passes: int, gradient: bool, extra: int = 0,
                      held: int = 0) -> int:
    """The forwards an attribution runs at once (``model``: our ViT, or a library model's ``LibraryShape``): as many
    as fit the memory limit, at most ``passes`` and ``MAX_BATCH``, evened out over the batches that takes (at least
    one: ``attribution`` then refuses it). ``extra``: bytes each pass holds beside its forward (a RISE mask
    formed); ``held``: bytes held throughout (RISE's grids)."""
    per = attribution_image_bytes(model, grid, gradient) + extra
    fits = max(1, min(passes, MAX_BATCH, (bounds.memory_limit() - held) // max(per, 1)))
    return math.ceil(passes / math.ceil(passes / fits))  # batches of equal size: 50 as 25 + 25, not 29 + 21


def attribution(model, grid: tuple[int, int], what: str, passes: int, batch: int, gradient: bool,
                extra: int = 0, held: int = 0, hint: str = "") -> Cost:
    """An attribution (captum's, RISE's) of ``passes`` forwards, ``batch`` at once, each with its backward to the
    pixels where ``gradient`` (``model``: our ViT, or a library model's ``LibraryShape``): the batch's forwards
    (``attribution_image_bytes`` each) at once; FLOPs of every
    forward (a backward counted as two). What the method holds besides (``captum_maps.held_bytes``): ``extra`` bytes
    for each pass of a batch (RISE's masks formed, captum's perturbed inputs), ``held`` throughout (RISE's grids,
    IG's quadrature); ``hint``: the method's own way down, for the refusal."""
    per = attribution_image_bytes(model, grid, gradient)
    tokens = _tokens(model, grid)
    kind = "forward and backward" if gradient else "forward"
    masks = f" ({hint})" if hint else ""

    def refuse(need: int, limit: int) -> TooManyTokens:
        return TooManyTokens(f"{what} runs {passes:,} {kind}s of {tokens:,} tokens, {batch} at once: about "
                             f"{need / MB:,.0f} MB, over the {limit / MB:,.0f} MB limit ({ANALYSIS_MEMORY_ENV}); "
                             f"choose a smaller batch, a smaller input size{masks}, or another map.")
    parts = {f"{batch} inputs' {kind} at once": batch * per}
    if extra:
        parts[f"what {batch} passes form beside their forwards"] = batch * extra
    if held:
        parts["what the method holds throughout"] = held
    cost = _cost("attribution", model, grid, parts, refuse)
    return replace(cost, flops=cost.flops * passes * (3 if gradient else 1))


def library_attention(batch: int, heads: int, tokens: int, layers: int, rows: int | None = None,
                      heads_mean: bool = False, rows_formed: bool = False) -> Cost:
    """What a library model's recording keeps (``vit.sources.library_road.transformers_models``: the library's own
    forward, its attention through our recording function) for ``layers`` asked layers of ``batch`` images of ``tokens``
    tokens: each asked layer's post-softmax attention of ``heads`` heads over ``rows`` query rows (every token's when
    None), float32, and the one layer's eager scores formed at a time to compute them (``batch x H x T²``, scores and
    probabilities). ``heads_mean``: each layer's heads kept as their mean (the rollout's factor), one head's worth.
    ``rows_formed``: the recorder forms the asked rows' scores alone (``vit.core.attention_recorder``), ``H x rows x
    T``. Counted before the forward; its refusal says what to ask instead."""
    kept_rows = tokens if rows is None else rows
    kept_heads = 1 if heads_mean else heads
    parts = {f"{layers} asked layers' attention, kept": 4 * batch * kept_heads * kept_rows * tokens * layers,
             "one layer's eager scores and probabilities": 2 * 4 * batch * heads * (kept_rows if rows_formed
                                                                                     else tokens) * tokens}
    refuse = _over(f"Recording {layers} layers' attention of {tokens:,} tokens ({heads} heads) needs about "
                   f"{{need}} MB, over the {{limit}} MB limit ({ANALYSIS_MEMORY_ENV}); ask for fewer layers, one "
                   "query's row, or a smaller input.")
    memory_bytes = sum(parts.values())
    return Cost("library attention", tokens, memory_bytes, 0, bounds.memory_limit(), refuse, tuple(parts.items()))


def library_gradient(shape: LibraryShape, grid: tuple[int, int], what: str, kept_layers: int = 0) -> Cost:
    """A gradient map of a model opened as its library builds it (``shape``: ``LibraryModel.cost_shape``) on patch
    ``grid``, one image: the graph of a whole backward to the pixels (``memory.library_pass_bytes``, as captum's
    gradient methods count one input) and, for ``kept_layers`` layers, their post-softmax attention and its gradient
    kept beside it (the class-specific map: ``2 x H x T²`` floats a layer). Counted before the forward; its refusal
    says what to ask instead."""
    tokens = shape.num_prefix_tokens + grid[0] * grid[1]
    parts = {"the forward's graph and the backward to the pixels": memory.library_pass_bytes(shape, grid, True)}
    if kept_layers:
        parts[f"{kept_layers} layers' attention and its gradient, kept"] = (2 * 4 * shape.num_heads * tokens * tokens
                                                                            * kept_layers)
    refuse = _over(f"{what} of {tokens:,} tokens ({shape.num_layers} layers, {shape.num_heads} heads) needs about "
                   f"{{need}} MB for its forward and backward, over the {{limit}} MB limit ({ANALYSIS_MEMORY_ENV}); "
                   "choose a smaller input or a map without gradients (attention, rollout).")
    return Cost("library gradient", tokens, sum(parts.values()), 0, bounds.memory_limit(), refuse,
                tuple(parts.items()))
