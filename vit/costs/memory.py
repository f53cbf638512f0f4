"""What each view holds at once, in bytes: the terms of the cost model (``vit.costs.plan`` adds them up per view).

Counted for one image in float32, from the model's config and the input's patch grid; each formula names the
tensors it counts, in copies of the stream (``T x D``), of the MLP's hidden width (``T x M``) or of a layer's
attention (``H x T²``). The constants were measured (the peak RSS over the baseline, tests/test_costs.py): a term
that is a guess says so.
"""

from __future__ import annotations

import math
from dataclasses import replace

from vit.costs.bounds import BIAS_CHUNK_BYTES

# one chunk of attention scores (vit.explain.methods.chunked): every map is built from such chunks
CHUNK_BYTES = 64 * 2**20
LAYER_CACHE_BYTES = 320 * 2**20  # computed layers, queries and keys, rollout factors kept per image
# vit.explain.methods.chunked's chunk on a CPU (a core's L2 cache), where the budget is not used
FAST_CHUNK_BYTES = 2**20
CHUNK_COPIES = 3  # a chunk's scores, probabilities and the softmax's temporary
HALF_PRECISION_TOKENS = 1024  # rollout factors above this many tokens are kept in float16 (attention_maps)

# One block's forward under inference mode, in copies of the stream: its input, the normed input, q, k and v (and
# their per-head copies), the context, its projection and the residual; the MLP's hidden width once (its activation
# runs in place), twice where it is gated. Measured: ViT, DINOv2, SigLIP at 1,024 to 4,096 tokens.
BLOCK_COPIES = 8
# One block's forward graph and its backward over every token (``LayerInputs.context_gradients``: its input needs a
# gradient), in floats per token per hidden unit and per MLP unit: its norms, qkv, the fused attention's backward,
# projections and MLP. Measured (tests/test_costs.py's 64-wide ViT, the MLP 2 and 6 times as wide, 2 and 3 layers,
# 1,025 to 6,401 tokens, after a first gradient pass, which costs ~40 MB once a process): 20 and 2 besides the
# context gradients; one more of the stream for the measure's noise. ViT-B/16 at 1,024 px measured 340 MB (27.6).
GRAPH_PER_HIDDEN, GRAPH_PER_MLP = 21, 2
# The same through a model with stages, per explained layer: its windows' probabilities, their gradient and
# autograd's copy; its activations in the graph. Measured: Swin, Swin V2 and Hiera at 1,024 to 4,096 patches.
STAGE_PROBS_COPIES, STAGE_GRAPH_PER_HIDDEN = 4, 12
# LeGrad's explained blocks (``relevance.legrad``), in copies of the stream per token, over each explained block's
# input kept: one block run again over every token up to its heads' contexts, without a graph (``hook_z`` is the
# leaf: its norm, q, k and v, the context and what the hooks keep); a later layer's contexts, values, gradient and
# output still held while the next one runs (more where the read-out reads every token); where the classifier reads
# every token (average pooling, DINOv2's CLS and mean), the graph from the contexts on, its MLP's hidden width three
# times (fc1's output, the activation's, their gradient). Measured (tests/test_costs.py's 64-wide ViT and DINOv2
# with registers, the MLP 2 and 6 times as wide, 1 and 2 explained layers of 2 and 3, 2,305 to 6,405 tokens):
# 9 and 13 (CLS), 21 to 38 (every token) copies a token, where this counts 10 to 14 and 23 to 42.
LEGRAD_BLOCK_COPIES, LEGRAD_HELD_CLS, LEGRAD_HELD_ALL = 9, 3, 6
LEGRAD_GRAPH_PER_HIDDEN, LEGRAD_GRAPH_PER_MLP = 7, 3
# AttnLRP (``relevance.attnlrp``) through a model without stages, in floats per token per hidden unit and per MLP unit.
# A block's graph under its rules keeps its norms' centred and normed inputs (each LayerNorm's scale is a constant of
# the backward: ``AttnLRPRules.layer_norm``), qkv's input and output (q, k and v are views of it), the fused
# attention's output chunks, the context copied for the projection, the MLP's activation and its identity rule's
# ratio (``_IdentityRule``): 10 and 2 (measured 9.3 and 2, tests/test_costs.py's 64- and 128-wide ViTs, the MLP 2
# and 6 times as wide, 2 and 3 layers, 2,305 to 6,401 tokens). Then the backward's gradients of a block's stream and
# its MLP's width, the final norm's graph (3 and 2), and the input's pixels four times (the leaf, its gradient,
# their product, the patch embedding's backward). VideoMAE-B's clip (1,568 tokens, 12 layers, checkpointed):
# 212 MB measured, where this counts 230.
ATTNLRP_BLOCK_PER_HIDDEN, ATTNLRP_PER_MLP, ATTNLRP_REST_PER_HIDDEN, ATTNLRP_INPUT_COPIES = 10, 2, 4, 4
# A model with a logit bias (BEiT) in a block's graph over every token (the class map's path in chunks, which refuses
# such a model today): the bias whole in the graph, its scores, bias and probabilities, ``H x T²`` each. Measured
# when LeGrad's block re-run still had a graph before its contexts: 347 MB for a 2-head BEiT at 4,096 tokens.
BIAS_GRAPH_COPIES = 3
# The class map's whole path (``attention.class_gradients``: every layer's explicit attention in the graph) keeps every
# block's activations for the backward beside that attention (``whole_gradient_bytes``): its norms, qkv, context,
# projection, residuals and MLP, in floats per token per hidden unit and per MLP unit a layer, and four more streams
# (the patch embedding's output, the final norm's; where the backward stops at a layer's input, a CAM's, that leaf
# and its gradient). Measured (tests/test_layout_memory.py's 2-layer, 2-head BEiT, 512 and 2,048 wide, its MLP 256
# and 4,096 wide, 577 to 1,937 tokens): 10.6 and 1.7 a layer. Without them a 2,048-wide BEiT at 1,937 tokens counted
# 229 MB and grew 471.6, over a 300 MB bound that let it run (631 counted now). Every gradient method counts them
# (``plan.gradient``: its layers' only): the same BEiT's Grad-CAM of its last layer grew 74.9 MB at 577 tokens and
# 148.0 at 1,025 where 10.2 and 32.1 were counted (its attention alone), 14.2 widths a token beside its attention.
WHOLE_GRAPH_PER_HIDDEN, WHOLE_GRAPH_PER_MLP, WHOLE_GRAPH_STREAMS = 11, 2, 4


def has_logit_bias(config) -> bool:
    """Whether a model adds a bias over a whole layer's tokens to its attention logits (BEiT's relative position
    table, per layer or shared; SAM's decomposed relative positions in its global layers)."""
    return getattr(config, "rel_pos", "none") in ("beit", "beit_shared", "sam")


def layout_problem(config) -> str | None:
    """What keeps a layer's attention from being ``softmax(q . k)`` of its queries and keys alone (the chunked
    paths' assumption, ``vit.explain.methods.hidden``; the class map's path in chunks, ``plan.class_map``): windows,
    a bias on the logits, locality self-attention's masked, scaled logits; None for plain global attention."""
    if getattr(config, "window_size", 0):
        return "attends within windows (SAM / ViTDet)"
    if getattr(config, "rel_pos", "none") != "none":
        return "adds a relative position bias to its attention logits"
    if str(getattr(config, "attention", "dot")).startswith("lsa"):
        return "masks each token's own key and learns its logits' scale (locality self-attention)"
    return None


def bias_chunk_bytes(num_heads: int, tokens: int, index_bytes: int = 8) -> int:
    """Bytes of the logit bias a forward forms at once over ``tokens`` keys (``blocks.add_bias_rows``,
    ``fused_attention``): one query chunk of its rows (``heads x rows x T`` float32, at most
    ``bounds.BIAS_CHUNK_BYTES``; the whole ``heads x T²`` is never formed) beside ``index_bytes`` a query-key pair
    for gathering them from a table (BEiT's int32 index and what the gather through it holds: 8 measured, 137 MB
    for a 2-head BEiT at 4,096 tokens, a 64 MB chunk and 64 MB beside it, not split further; SAM's decomposed
    positions have no index, 0)."""
    if tokens <= 0:
        return 0
    rows = min(tokens, max(1, BIAS_CHUNK_BYTES // (num_heads * tokens * 4)))
    return (4 * num_heads + index_bytes) * rows * tokens


def bias_chunk_most(num_heads: int, index_bytes: int = 8) -> int:
    """The most ``bias_chunk_bytes`` holds beyond a row a token, at any number of tokens: ``BIAS_CHUNK_BYTES`` of
    rows and the index beside them (for refusals that name the largest input that fits)."""
    return BIAS_CHUNK_BYTES * (4 * num_heads + index_bytes) // (4 * num_heads)


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


def whole_graph_bytes(config, tokens: int, layers: int | None = None) -> int:
    """Bytes of every block's activations a backward through ``layers`` (default all) layers keeps over ``tokens``
    tokens (any gradient method's, beside its layers' attention: ``plan.gradient``; ``WHOLE_GRAPH_*``)."""
    layers = config.num_layers if layers is None else layers
    per_layer = WHOLE_GRAPH_PER_HIDDEN * config.hidden_size + WHOLE_GRAPH_PER_MLP * config.mlp_size
    return 4 * tokens * (layers * per_layer + WHOLE_GRAPH_STREAMS * config.hidden_size)


def windowed_gradient_bytes(model, grid: tuple[int, int], layers: int | None = None) -> int:
    """``whole_gradient_bytes`` of a model without stages whose layers attend in windows (Qwen2.5-VL's, SAM's) on
    patch grid ``grid``: a global layer's ``H x T²`` probabilities, a windowed layer's ``H x windows x slots²``
    (its windows' padding slots counted, as they are formed), each four times, for the last ``layers`` layers."""
    tokens = model.num_prefix_tokens + grid[0] * grid[1]
    blocks = list(model.blocks)
    values = 0
    for block in blocks[len(blocks) - (len(blocks) if layers is None else layers):]:
        slots = block.layout(tuple(grid)).window_tokens() if block.window else None  # (windows, slots)
        values += tokens * tokens if slots is None else slots.shape[0] * slots.shape[1] ** 2
    return 4 * model.config.num_heads * 4 * values


def mask_decoder_bytes(hidden: int, layers: int, grid: tuple[int, int], tokens: int = 16) -> int:
    """Bytes of SAM's mask decoder's graph for a gradient (``vit.explain.methods.segment``): each two-way block's image
    side (``BLOCK_COPIES`` ``(N, C)`` tensors: keys, their positions, the attention's projections, the norm) and
    its cross-attentions (``tokens x N`` a head, a few copies), then the upscaling's two maps (``C/4`` at twice the
    grid, ``C/8`` at four times), each kept ``BLOCK_COPIES`` times; float32. SAM ViT-B's at 64 x 64: about 210 MB."""
    n = grid[0] * grid[1]
    blocks = (layers + 1) * (BLOCK_COPIES * n * hidden + 3 * 8 * tokens * n)  # 8 heads at most (SAM's)
    upscaling = BLOCK_COPIES * (hidden // 4 * 4 * n + hidden // 8 * 16 * n)
    return 4 * (blocks + upscaling)


def attnlrp_attention_bytes(model, grid: tuple[int, int]) -> list[int]:
    """Each layer's attention as AttnLRP's graph keeps it (``relevance.attnlrp``), a model without stages: nothing
    in a plain global layer, whose attention runs fused (``blocks.fused_attention``: the backward recomputes the
    probabilities from q, k and the softmax's row sums, ``T`` floats a head); where a layer adds a bias to its logits
    (BEiT's, SAM's relative positions, whose gradient the fused kernels do not give: the explicit softmax's
    ``H x T²`` kept) or attends in windows (their masks kept beside), ``whole_gradient_bytes`` /
    ``windowed_gradient_bytes`` of the layer, as before (BEiT's measured 1.5 to 2.3 times over: safe, not fitted;
    windows not measured)."""
    c = model.config
    if not (has_logit_bias(c) or c.window_size):
        return [0] * c.num_layers
    if c.window_size:
        return [windowed_gradient_bytes(model, grid, k) - windowed_gradient_bytes(model, grid, k - 1)
                for k in range(1, c.num_layers + 1)]
    return [whole_gradient_bytes(c, model.num_prefix_tokens + grid[0] * grid[1], 1)] * c.num_layers


def attnlrp_block_bytes(config, tokens: int) -> int:
    """One block's forward graph under AttnLRP's rules (``ATTNLRP_BLOCK_PER_*``), over ``tokens`` tokens, without its
    attention (``attnlrp_attention_bytes``): two more streams where layer scale keeps its products, two where rotary
    positions copy q and k; a gated MLP's (two branches and their product) and an MLP norm's widths counted twice
    more, q and k norms four more streams (guesses, not measured)."""
    streams = (ATTNLRP_BLOCK_PER_HIDDEN + (2 if config.layer_scale is not None else 0)
               + (2 if getattr(config, "rope", "none") != "none" else 0) + (4 if config.qk_norm else 0))
    widths = ATTNLRP_PER_MLP + (2 if config.gated_mlp else 0) + (2 if config.mlp_norm else 0)
    return 4 * tokens * (streams * config.hidden_size + widths * config.mlp_size)


def attnlrp_bytes(model, grid: tuple[int, int], checkpointed: bool = False) -> int:
    """Bytes AttnLRP holds for one image (or clip) on patch ``grid`` through a model without stages
    (``relevance.attnlrp``): the input pixels' copies (``ATTNLRP_INPUT_COPIES``), then every block's graph under the
    rules and its attention as kept (``attnlrp_block_bytes``, ``attnlrp_attention_bytes``); with ``checkpointed``
    (``vit.model.checkpointed_blocks``: past the whole path's bound) every block's input and the last one's output
    instead, and one block's graph at a time, the costliest; then the backward's gradients (``ATTNLRP_REST_*``)."""
    c = model.config
    tokens = model.num_prefix_tokens + grid[0] * grid[1]
    pixels = ATTNLRP_INPUT_COPIES * input_bytes(model, grid)  # a clip's every frame
    block = attnlrp_block_bytes(c, tokens)
    attention = attnlrp_attention_bytes(model, grid)
    # A logit bias's layer run again in the backward: its gradient's query chunk beside what the forward kept
    # (BEiT, 2 heads: 180 MB at 2,305 tokens where the kept attention alone counted 179)
    graph = (4 * (c.num_layers + 1) * tokens * c.hidden_size + block + max(attention)
             + logit_bias_chunk(c, c.num_heads, tokens) if checkpointed
             else c.num_layers * block + sum(attention))
    # An attentive pooler's own blocks (V-JEPA 2's classifier) run after the checkpointed ones, their graphs whole
    pooler = c.pool_layers * attnlrp_block_bytes(replace(c, mlp_size=c.pool_mlp_size or c.mlp_size), tokens)
    return (pixels + graph + pooler
            + 4 * tokens * (ATTNLRP_REST_PER_HIDDEN * c.hidden_size + ATTNLRP_PER_MLP * c.mlp_size))


def checkpointed_gradient_bytes(model, grid: tuple[int, int]) -> int:
    """AttnLRP through a model without stages whose blocks are checkpointed (``vit.model.checkpointed_blocks``:
    past its whole path's bound): ``attnlrp_bytes`` with ``checkpointed``."""
    return attnlrp_bytes(model, grid, checkpointed=True)


def gradient_bytes(num_layers: int, hidden_size: int, mlp_size: int, tokens: int, contexts: bool,
                   budget: int = CHUNK_BYTES, bias_heads: int = 0) -> int:
    """The class map's gradient in chunks (``context_gradients``; LeGrad's is ``legrad_bytes``): hidden
    states ``(L + 1) x T x D``, with ``contexts`` every layer's context gradient (``L x T x D``), one block's graph
    forward and backward, and one chunk (of an attention and its gradient: ``budget``); with ``bias_heads`` (a
    logit bias's heads) a block's explicit attention and its bias in the graph (``BIAS_GRAPH_COPIES``)."""
    per_token = (num_layers + 1 + (num_layers if contexts else 0) + GRAPH_PER_HIDDEN) * hidden_size
    bias = 4 * BIAS_GRAPH_COPIES * bias_heads * tokens * tokens
    return 4 * tokens * (per_token + GRAPH_PER_MLP * mlp_size) + budget + bias


def legrad_bytes(model, grid: tuple[int, int], start_layer: int = -2, device_type: str = "cpu") -> int:
    """Bytes LeGrad holds at once for one image on patch ``grid`` (``relevance.legrad``, a model without stages),
    the larger of its two phases: the forward without a graph up to its last block (``forward_bytes``) beside the
    explained blocks' inputs it has kept so far; then each explained block run again from its input, the last first
    (``LEGRAD_*``), then a chunk of its attention's gradient rows (the read-out's queries against every key)."""
    config = model.config
    L, T, D, M = config.num_layers, model.num_prefix_tokens + grid[0] * grid[1], config.hidden_size, config.mlp_size
    explained = len(range(L)[start_layer:])
    reads = model.readout_tokens() if hasattr(model, "readout_tokens") else 1
    queries = T if reads is None else reads
    forward = forward_bytes(model, grid) + 4 * (explained - 1) * T * D
    held = (LEGRAD_HELD_ALL if reads is None else LEGRAD_HELD_CLS) if explained > 1 else 0
    # A gated MLP (SwiGLU) keeps two branches and their product: counted twice (a guess, not measured)
    mlp = LEGRAD_GRAPH_PER_MLP * M * (2 if getattr(config, "gated_mlp", False) else 1)
    graph = LEGRAD_GRAPH_PER_HIDDEN * D + mlp if reads is None else 0
    chunk = min(attention_chunk(config, config.num_heads, T, device_type),
                4 * CHUNK_COPIES * config.num_heads * queries * T)
    # The block's run up to its contexts, with rotary positions' copies of q and k and a logit bias's query chunk as
    # a forward's (``block_bytes``); the chunks of the gradient's rows are formed after it, in its freed work
    streams = LEGRAD_BLOCK_COPIES + (2 if getattr(config, "rope", "none") != "none" else 0)
    block = 4 * T * streams * D + logit_bias_chunk(config, config.num_heads, T)
    backward = 4 * T * ((explained + held) * D + graph) + max(block, chunk)
    return max(forward, backward)


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
    ``12 x T x D`` floats: the MLP's four widths, norms, residuals, on the layer's input tokens)."""
    layouts = model.layer_layouts(grid)
    total = 0
    for layer in range(start_layer % len(model.blocks), len(model.blocks)):
        lay, attn = layouts[layer], model.blocks[layer].attn
        keys = lay.key_tokens().shape[1]  # a window's keys (a global layer's: every key)
        windows = lay.window_tokens().shape[0]
        inputs = max(lay.num_tokens, windows * keys)  # the layer's input tokens (before pooling, with padding)
        total += 4 * (STAGE_PROBS_COPIES * attn.num_heads * windows * lay.window_tokens().shape[1] * keys
                      + STAGE_GRAPH_PER_HIDDEN * inputs * attn.num_heads * attn.head_dim)
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


def logit_bias_chunk(config, num_heads: int, tokens: int) -> int:
    """``bias_chunk_bytes`` of a model with a logit bias (``has_logit_bias``; BEiT's with its index), else 0."""
    if not has_logit_bias(config):
        return 0
    return bias_chunk_bytes(num_heads, tokens, 8 if config.rel_pos in ("beit", "beit_shared") else 0)


def block_bytes(model, layer: int, tokens: int) -> int:
    """Bytes block ``layer`` of ``model`` holds at once in a forward without a graph over ``tokens`` tokens:
    ``BLOCK_COPIES`` streams of its width (two more where rotary positions copy q and k), its MLP's hidden width
    (three times where it is gated: the gate, the linear branch, their product) and a logit bias's query chunk
    (``logit_bias_chunk``). Attention itself runs fused, in query chunks on a CPU: no ``H x T²``."""
    config = model.config
    streams = BLOCK_COPIES + (2 if getattr(config, "rope", "none") != "none" else 0)
    hidden = 3 if getattr(config, "gated_mlp", False) else 1
    if not hasattr(model, "blocks"):  # a config alone (the gate's geometry): every block as the config says
        width, mlp, heads = config.hidden_size, config.mlp_size, config.num_heads
    else:
        block = model.blocks[layer]
        width, mlp, heads = block.attn.qkv.in_features, block.mlp.fc1.out_features, block.attn.num_heads
    return 4 * tokens * (streams * width + hidden * mlp) + logit_bias_chunk(config, heads, tokens)


def forward_bytes(model, grid: tuple[int, int]) -> int:
    """Bytes one image's forward without a graph holds at once on patch ``grid`` (``vit.predict``, the harvest of
    an SAE's activations): the costliest block (``block_bytes``, each on its own layer's tokens where the model has
    stages) beside the preprocessed input. What its attention layouts form (windows, Swin's biases and masks) is
    ``bounds.layout_memory``."""
    tokens = model.num_prefix_tokens + grid[0] * grid[1]
    layouts = model.layer_layouts(grid) if getattr(model.config, "stage_depths", ()) else None
    return input_bytes(model, grid) + max(block_bytes(model, i, tokens if layouts is None else layouts[i].num_tokens)
                        for i in range(model.config.num_layers))


def library_pass_bytes(shape, grid: tuple[int, int], gradient: bool) -> int:
    """One input's share of a batch through a model opened as its library builds it (``plan.LibraryShape``: its
    declared sizes; its modules are the library's, so the port's terms are read at those sizes), on patch ``grid``:
    without ``gradient``, the input beside one block's forward (``BLOCK_COPIES`` streams, the MLP's width) and one
    layer's ``H x T²`` scores and probabilities; with it, AttnLRP's whole path as ``attnlrp_bytes`` counts a plain
    block's (the pixels' copies, every block's graph, the backward's gradients), each layer's probabilities kept in
    the graph too. The library's SDPA forms no ``H x T²`` where it runs a fused kernel; where it falls back to its
    math path it does: counted as formed (safe, not fitted)."""
    H, L, D, M = shape.num_heads, shape.num_layers, shape.hidden_size, shape.mlp_size
    tokens = shape.num_prefix_tokens + grid[0] * grid[1]
    pixels, attention = input_bytes(shape, grid), 4 * H * tokens * tokens
    if not gradient:
        return pixels + 4 * tokens * (BLOCK_COPIES * D + M) + 2 * attention
    block = 4 * tokens * (ATTNLRP_BLOCK_PER_HIDDEN * D + ATTNLRP_PER_MLP * M) + attention
    return (ATTNLRP_INPUT_COPIES * pixels + L * block + attention
            + 4 * tokens * (ATTNLRP_REST_PER_HIDDEN * D + ATTNLRP_PER_MLP * M))


def attentions_bytes(model, grid: tuple[int, int]) -> int:
    """Bytes of every layer's attention a forward returns for one image on patch ``grid`` (``output_attentions``:
    ``vit.explain.views.dataset.image_summaries`` reads them all after the forward), float32: each layer's ``H x T²``,
    or its windows' ``H x windows x queries x keys``, beside the costliest layer's scores as its probabilities are
    formed (the explicit path)."""
    prefix, layers = model.num_prefix_tokens, []
    for lay, block in zip(model.layer_layouts(grid), model.blocks, strict=True):
        windows, queries = lay.window_tokens().shape
        keys = lay.key_tokens().shape[1]
        if windows == 1:  # a global layer: the prefix tokens too
            queries, keys = queries + prefix, keys + prefix
        layers.append(4 * block.attn.num_heads * windows * queries * keys)
    return sum(layers) + max(layers)


def input_bytes(model, grid: tuple[int, int], resized: bool = False) -> int:
    """Bytes of one image's preprocessed input on patch ``grid`` (float32), and with ``resized`` the resized image
    it was made from (uint8), which an analysis keeps to draw its maps over. A video model's clip on its folded grid
    ``(tubelets x rows, cols)``: each tubelet's frames (``tubelet_size``)."""
    (ph, pw), channels = model.config.patch_hw, model.config.num_channels
    pixels = channels * grid[0] * ph * grid[1] * pw * max(getattr(model.config, "tubelet_size", 0) or 1, 1)
    return 4 * pixels + (pixels if resized else 0)


def chunk_bytes(config, device_type: str = "cpu") -> int:
    """Bytes of the attention chunk a map forms at once (``vit.explain.methods.chunked``): on a CPU a core's cache-sized
    chunk, held ``CHUNK_COPIES`` times; a model with a bias or windows (SAM, BEiT, Qwen-VL) takes chunks of the
    whole ``CHUNK_BYTES`` there, as a GPU does."""
    plain = getattr(config, "rel_pos", "none") == "none" and not getattr(config, "window_size", 0)
    return FAST_CHUNK_BYTES * CHUNK_COPIES if device_type == "cpu" and plain else CHUNK_BYTES


def attention_chunk(config, num_heads: int, tokens: int, device_type: str) -> int:
    """``chunk_bytes``, or less where a layer's whole attention (its scores, probabilities, the softmax's temporary
    and a bias's rows) is smaller than a chunk."""
    return min(chunk_bytes(config, device_type), (CHUNK_COPIES + 1) * 4 * num_heads * tokens * tokens)


def kept_layers(num_layers: int, every: int) -> tuple[int, ...]:
    """The hidden states an analysis keeps when it keeps the residual stream at every ``every``-th layer: states
    0, every, 2 x every, ... and the last block's output ``num_layers`` (``every`` 1: all ``num_layers + 1``)."""
    if every < 1:
        raise ValueError(f"checkpoints every {every} layers: give at least 1")
    return tuple(sorted({*range(0, num_layers + 1, every), num_layers}))


def states_bytes(num_layers: int, tokens: int, hidden_size: int, every: int = 1) -> int:
    """Bytes of the hidden states an analysis holds (float32): every ``(L + 1) x T x D`` with ``every`` 1, else the
    checkpoints (``kept_layers``) and the one segment between two of them recomputed from the lower
    (``hidden.CheckpointedStates``: ``every - 1`` states)."""
    states = len(kept_layers(num_layers, every)) + (every - 1 if every > 1 else 0)
    return 4 * states * tokens * hidden_size


def factors_kept(num_layers: int, tokens: int, cache_bytes: int = LAYER_CACHE_BYTES) -> bool:
    """Whether the rollout's factors (``T²`` each, float16 past ``HALF_PRECISION_TOKENS``) are kept, half the cache
    holding every layer's (``attention_maps.factors_fit``), or a row is read through each layer's chunks."""
    return num_layers * (2 if tokens > HALF_PRECISION_TOKENS else 4) * tokens * tokens <= cache_bytes // 2


def analysis_parts(model, grid: tuple[int, int], device_type: str = "cpu",
                   cache_bytes: int = LAYER_CACHE_BYTES, maps: int = 0, every: int = 1,
                   pattern: tuple[int, int] = (0, 0)) -> dict[str, int]:
    """What one analysed image (``image_analysis.analyse``) and the maps drawn from it hold at once, by part:
    the hidden states beside the forward's costliest block; the queries and keys the forward keeps for the first
    map (while a quarter of the cache holds them); every layer's rollout factor (``T²``, float16 past
    ``HALF_PRECISION_TOKENS``) while half the cache holds them, and one in float32 as a row is read through them,
    else a chunk of attention; with ``every`` past 1 the hidden states are checkpoints every ``every`` layers and a
    segment recomputed from them (``states_bytes``). A model with stages keeps its layers' windows and outputs instead
    (``bounds.layout_memory``, the caller's, whose ``maps`` bytes come after the forward: the larger counts).
    ``pattern``: a windowed layer's pattern as formed and its probabilities (``LayoutMemory.pattern`` and
    ``probabilities``), read whole beside the kept factors (its own factor built from its rows, or a map of it with
    the factors cached), not beside the float32 one a row is read through."""
    config, L = model.config, model.config.num_layers
    T, D = model.num_prefix_tokens + grid[0] * grid[1], config.hidden_size
    chunk = attention_chunk(config, config.num_heads, T, device_type)
    if getattr(config, "stage_depths", ()):
        layouts = model.layer_layouts(grid)
        outputs = sum(4 * lay.num_tokens * b.attn.proj.out_features for lay, b in zip(layouts, model.blocks,
                                                                                        strict=True))
        pixels = input_bytes(model, grid, resized=True)
        return {"every layer's output": outputs, "the input and the resized image": pixels,
                "the forward's costliest block (before the maps)":
                    max(0, forward_bytes(model, grid) - input_bytes(model, grid) - maps)}
    hidden = states_bytes(L, T, D, every)
    kept = 8 * L * T * D if 8 * L * T * D <= cache_bytes // 4 else 0
    factor = (2 if T > HALF_PRECISION_TOKENS else 4) * T * T
    rollout = L * factor + 4 * T * T if factors_kept(L, T, cache_bytes) else 0
    # the windowed layer's pattern with the factors kept: scores beside probabilities, then probabilities beside a
    # chunk of rows placed on the grid (SAM, 40 x 40 windows at 256 px, measured: 168 MB, where the pattern beside
    # the float32 factor and a chunk counted 389)
    formed, probabilities = pattern
    read = L * factor + max(formed, probabilities + chunk) if rollout and formed else 0
    if chunk == CHUNK_BYTES and getattr(config, "window_size", 0) and getattr(config, "rope", "none") != "none":
        # Qwen2.5-VL's global layers are read in chunks of the whole budget (``LayerInputs._layer_chunks``) beside
        # their q, k and v as the hook points hold them (the projection, rotated q and k, the scaled q: 6 T x D) and
        # the rollout's factor rows (a quarter more). Measured: a 32-layer tower 320 wide at 3,136 tokens, 96 MB
        # over its states while its rollout ran, where the chunk alone counted 64 (SAM's, without rotary copies,
        # stays within its chunk: tests/test_costs.py).
        # While the factors are kept (``factors_fit``), each is formed from such chunks (their scores' three copies
        # in three quarters of the budget), then read back one at a time in float32: the larger of the two, not
        # both. Measured: tests/test_costs.py's 64-wide tower, 38 MB over its three factors at 2,304 tokens (the
        # chunk), 64 at 4,096 (the float32 factor), where chunk and factor together counted 101 and 145.
        if rollout:
            rollout, chunk = L * factor + max(4 * T * T, chunk * 3 // 4), 0
        else:
            chunk = chunk + chunk // 4 + 4 * 6 * T * D
    states = "hidden states" if every == 1 else f"hidden states every {every} layers and one segment between them"
    return {states: hidden, "queries and keys kept": kept,
            "the forward's costliest block, or the rollout's factors and a chunk":
                max(forward_bytes(model, grid), rollout + chunk, read)}
