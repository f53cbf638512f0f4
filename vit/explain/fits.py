"""Will it fit? The memory and token checks each explorer view asks before its work (the pages, the notebook API).

Each ``check_*_fits`` raises ``TooManyTokens`` (``vit.bounds``) with one line that names the limit, what holds the
memory and what to do; ``analysis_memory`` and ``bias_chunk_bytes`` count what one analysed image holds.
"""

from __future__ import annotations

import math

from vit import bounds
from vit.bounds import TooManyTokens
from vit.checkpoint import Checkpoint
from vit.explain.chunked import gradient_bytes, largest_tokens
from vit.inference import largest_square_side

# Memory per analysed image: hidden states + cache + one layer's queries and keys + one chunk of attention stays
# under this (env VIT_ANALYSIS_MEMORY_MB), and inputs with more patches than VIT_MAX_TOKENS are refused
# (vit.bounds: the gate vit.predict shares).
ANALYSIS_MEMORY_LIMIT = bounds.ANALYSIS_MEMORY_LIMIT
CHUNK_BYTES = 64 * 2**20  # one chunk of attention scores (vit.explain.chunked): every map is built from such chunks
LAYER_CACHE_BYTES = 320 * 2**20  # computed layers, queries and keys, rollout factors kept per image


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
    rows x T`` float32, at most ``bounds.BIAS_CHUNK_BYTES``; the whole ``heads x T²`` is never formed,
    ``Attention.forward``) and their int32 BEiT index (``rows x T``)."""
    if tokens <= 0:
        return 0
    rows = min(tokens, max(1, bounds.BIAS_CHUNK_BYTES // (num_heads * tokens * 4)))
    return (num_heads + 1) * rows * tokens * 4


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
