"""What each view holds at once, in bytes: the terms of the cost model (``vit.costs.plan`` adds them up per view).

Counted for one image in float32, from the model's config and the input's patch grid; each formula names the
tensors it counts, in copies of the stream (``T x D``), of the MLP's hidden width (``T x M``) or of a layer's
attention (``H x T²``). The constants were measured (the peak RSS over the baseline, tests/test_costs.py): a term
that is a guess says so.
"""

from __future__ import annotations

import math

CHUNK_BYTES = 64 * 2**20  # one chunk of attention scores (vit.explain.chunked): every map is built from such chunks
LAYER_CACHE_BYTES = 320 * 2**20  # computed layers, queries and keys, rollout factors kept per image
FAST_CHUNK_BYTES = 2**20  # vit.explain.chunked's chunk on a CPU (a core's L2 cache), where the budget is not used
CHUNK_COPIES = 3  # a chunk's scores, probabilities and the softmax's temporary
HALF_PRECISION_TOKENS = 1024  # rollout factors above this many tokens are kept in float16 (attention_maps)

# One block's forward under inference mode, in copies of the stream: its input, the normed input, q, k and v (and
# their per-head copies), the context, its projection and the residual; the MLP's hidden width once (its activation
# runs in place), twice where it is gated. Measured: ViT, DINOv2, SigLIP at 1,024 to 4,096 tokens.
BLOCK_COPIES = 8
# One block's forward graph and its backward, in floats per token per hidden unit and per MLP unit: its norms,
# qkv, contexts, projections and MLP. ViT-B/16 at 1,024 px measured 260 MB (LeGrad) and 340 MB (context
# gradients) of working memory besides the hidden states, context gradients and chunks; this model says 352 MB.
GRAPH_PER_HIDDEN, GRAPH_PER_MLP = 16, 3


def has_logit_bias(config) -> bool:
    """Whether a model adds a bias over a whole layer's tokens to its attention logits (BEiT's relative position
    table, per layer or shared; SAM's decomposed relative positions in its global layers)."""
    return getattr(config, "rel_pos", "none") in ("beit", "beit_shared", "sam")


def bias_chunk_bytes(num_heads: int, tokens: int) -> int:
    """Bytes of the logit bias a forward forms at once over ``tokens`` keys: one query chunk of its rows (``heads x
    rows x T`` float32, at most ``blocks.BIAS_CHUNK_BYTES``; the whole ``heads x T²`` is never formed,
    ``Attention.forward``) and their int32 BEiT index (``rows x T``)."""
    from vit.model.blocks import BIAS_CHUNK_BYTES  # here: the model imports vit.bounds, which imports this module

    if tokens <= 0:
        return 0
    rows = min(tokens, max(1, BIAS_CHUNK_BYTES // (num_heads * tokens * 4)))
    return (num_heads + 1) * rows * tokens * 4


def analysis_memory(num_layers: int, num_heads: int, hidden_size: int, tokens: int,
                    cache_bytes: int = LAYER_CACHE_BYTES, logit_bias: bool = False) -> int:
    """Bytes one analysed image can hold at most: hidden states, the cache, one layer's queries and keys and
    one chunk of attention (``CHUNK_BYTES``): every view is built from chunks, so no ``heads x T²`` term. With
    ``logit_bias`` (BEiT's relative positions, SAM's decomposed ones: ``has_logit_bias``), also the query chunk of
    that bias a forward forms at once (``bias_chunk_bytes``)."""
    hidden = (num_layers + 1) * tokens * hidden_size * 4
    bias = bias_chunk_bytes(num_heads, tokens) if logit_bias else 0
    return hidden + cache_bytes + 2 * tokens * hidden_size * 4 + CHUNK_BYTES + bias


def whole_gradient_bytes(config, tokens: int, layers: int | None = None) -> int:
    """Bytes of a backward pass that keeps ``layers`` (default all) layers' whole attention and its gradient:
    attentions, gradients and autograd's copies, ``4 x layers x H x T²`` floats."""
    layers = config.num_layers if layers is None else layers
    return 4 * layers * config.num_heads * 4 * tokens * tokens


def gradient_bytes(num_layers: int, hidden_size: int, mlp_size: int, tokens: int, contexts: bool,
                   budget: int = CHUNK_BYTES) -> int:
    """The memory model of a chunked gradient method (``relevance.legrad``, ``context_gradients``): hidden
    states ``(L + 1) x T x D``, with ``contexts`` every layer's context gradient (``L x T x D``), one block's graph
    forward and backward, and one chunk (of an attention and its gradient: ``budget``)."""
    per_token = (num_layers + 1 + (num_layers if contexts else 0) + GRAPH_PER_HIDDEN) * hidden_size
    return 4 * tokens * (per_token + GRAPH_PER_MLP * mlp_size) + budget


def largest_tokens(limit: int, per_token: int, per_token_squared: int) -> int:
    """The most tokens ``T`` with ``per_token x T + per_token_squared x T² <= limit`` (for refusals that name
    the largest input that fits)."""
    if per_token_squared == 0:
        return limit // max(per_token, 1)
    a, b = per_token_squared, per_token
    return int((-b + math.sqrt(b * b + 4 * a * limit)) / (2 * a))


def stage_gradient_bytes(model, grid: tuple[int, int], start_layer: int = -2) -> int:
    """About the bytes a gradient through a model with stages keeps for one image on patch grid ``grid`` (LeGrad
    from ``start_layer``; the class-specific map from 0): each explained layer's windows' probabilities, their
    gradient and autograd's copies (``4 x H x Tq x nk`` floats) and the layer's activations in the graph (about
    ``32 x T x D`` floats: the MLP's four widths, norms, residuals)."""
    layouts = model.layer_layouts(grid)
    total = 0
    for layer in range(start_layer % len(model.blocks), len(model.blocks)):
        lay, attn = layouts[layer], model.blocks[layer].attn
        keys = lay.key_tokens().shape[1]  # a window's keys (a global layer's: every key)
        windows = lay.window_tokens().shape[0]
        total += 4 * (4 * attn.num_heads * windows * lay.window_tokens().shape[1] * keys
                      + 32 * lay.num_tokens * attn.num_heads * attn.head_dim)
    return total


def dense_bytes(config, tokens: int, copies: int) -> int:
    """Bytes one image's dense view can hold at most: the analysis (hidden states, cache, a chunk) and ``copies``
    copies of the patch tokens (and the query chunk of a relative position bias, BEiT's or SAM's, that a forward
    forms)."""
    return (analysis_memory(config.num_layers, config.num_heads, config.hidden_size, tokens,
                            logit_bias=has_logit_bias(config))
            + copies * tokens * config.hidden_size)


def pass_bytes(config, tokens: int, copies: int) -> int:
    """Bytes one image's pass to a layer holds at most (``vit.analyze --pca``): one block's working set
    (``BLOCK_COPIES`` streams, the MLP's hidden twice, a relative-position bias ``heads x T x T`` where the model
    has one: the forward stops at the layer, so no layer's states are kept) and ``copies`` copies of the patch
    tokens."""
    T, D = tokens, config.hidden_size
    bias = config.num_heads * T * T * 4 if config.rel_pos != "none" else 0
    return T * (BLOCK_COPIES * D + 2 * config.mlp_size) * 4 + bias + copies * T * D


def sae_bytes(d_in: int, d_sae: int) -> int:
    """Bytes of an SAE's float32 weights: encoder, decoder and their biases."""
    return 4 * (2 * d_in * d_sae + d_in + d_sae)
