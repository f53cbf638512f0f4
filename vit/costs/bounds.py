"""How many tokens one image may have before the work it implies: the one gate of the explorer, the notebook API
and ``vit.predict`` (env VIT_MAX_TOKENS, else ``MAX_TOKENS``), and the estimate its refusal gives.

Attention's work grows with the square of the tokens: the shipped 4-px-patch model at 1,024 px (65,537 tokens) is
11 minutes of one forward on 2 cores, ViT-B/16 there an hour. Past the gate an input is refused at once, in one
line that says what it would cost and how to allow it. The gate counts an input's patches: a model's prefix tokens
(CLS, registers: a handful, whatever the input) come on top, so a side of 128 patches opens on every model.

What an input's attention layouts hold (``layout_memory``: windows, position biases and their indices, masks,
pooled queries; in an analysis the windows a model with stages keeps and the maps read from them) counts against the
memory bound per image: the explorer adds it to its estimate, and every forward checks it before its first block
(``check_layouts``), so a config whose windows alone are past the bound is refused whoever runs it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

MAX_TOKENS = 16384  # patches: ViT-B/16 at 2,048 px (128 x 128) runs, past it minutes of a forward on a laptop
MAX_TOKENS_ENV = "VIT_MAX_TOKENS"
# What one analysed image may hold (hidden states, caches, copies of its tokens): env VIT_ANALYSIS_MEMORY_MB.
ANALYSIS_MEMORY_LIMIT = 1024 * 2**20
ANALYSIS_MEMORY_ENV = "VIT_ANALYSIS_MEMORY_MB"
# A bias formed per query chunk (``vit.model.blocks.fused_attention``) holds at most this many bytes at once.
BIAS_CHUNK_BYTES = 2**26


class TooManyTokens(ValueError):
    """An input past a bound (tokens or memory); the message says what it would cost and how to make it fit."""


def max_tokens(given: int | None = None) -> int:
    """The token gate, in patches per image: ``given``, else env VIT_MAX_TOKENS, else ``MAX_TOKENS``; ValueError
    (one line) for a value that is not a whole number of at least 1."""
    value = given if given is not None else os.environ.get(MAX_TOKENS_ENV) or MAX_TOKENS
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if isinstance(value, bool) or number < 1:
        where = "max_tokens" if given is not None else MAX_TOKENS_ENV
        raise ValueError(f"{where} must be a whole number of at least 1, got {value!r}")
    return number


def memory_limit() -> int:
    """Bytes one analysed image may hold: env VIT_ANALYSIS_MEMORY_MB, else ``ANALYSIS_MEMORY_LIMIT`` (the explorer,
    the notebook API and ``vit.analyze --pca`` share it)."""
    return int(float(os.environ.get(ANALYSIS_MEMORY_ENV) or ANALYSIS_MEMORY_LIMIT / 2**20) * 2**20)


def forward_flops(config, tokens: int) -> int:
    """Floating-point operations of one image's forward at ``tokens`` tokens (``config``: a ``ViTConfig``): per
    layer the qkv and output projections, the MLP, and attention's scores and context, ``4 T² x inner``."""
    inner = config.num_heads * (getattr(config, "head_dim", None) or config.hidden_size // config.num_heads)
    D, M, T = config.hidden_size, config.mlp_size, tokens
    per_layer = 2 * T * D * 4 * inner + 2 * T * D * M * 2 + 4 * T * T * inner
    return config.num_layers * per_layer


def check_tokens(config, patches: int, what: str, limit: int, allow: str) -> None:
    """``TooManyTokens`` when ``patches`` (an input's, ``what`` naming it; ``config`` its model's ``ViTConfig``) are
    over ``limit``: one line with the forward's work (the prefix tokens included) against the model's own input
    size and ``allow``, how to run it anyway. The prefix tokens are not counted against ``limit``."""
    if patches <= limit:
        return
    prefix = config.num_prefix_tokens
    work = forward_flops(config, prefix + patches)
    own = forward_flops(config, prefix + math.prod(config.grid_size))
    counted = "" if not prefix else f", the model's {prefix} prefix token{'s' if prefix > 1 else ''} not counted"
    raise TooManyTokens(f"{what} gives {patches:,} patches; at most {limit:,} are run ({MAX_TOKENS_ENV}{counted}): "
                        f"its forward is about {work / 1e12:,.1f} TFLOP per image, {work / own:,.0f}x its work at "
                        "the model's own input size (attention grows with the square of the tokens). Choose a "
                        f"smaller input size, or {allow}.")


# --- what attention layouts hold at once: windows, position biases and their indices, pooled queries ------------

SWIN_MLP_WIDTH = 512  # Swin V2's position MLP (2 -> 512 -> heads), run over every offset of a window


@dataclass(frozen=True)
class LayoutMemory:
    """What one image's attention layouts hold (``layout_memory``): ``peak`` bytes at once in the costliest layer,
    ``layer``, for ``why``; with the attentions kept (a model with stages returns each layer's windows), ``kept``
    bytes of them and ``maps``, what the maps built from them form at once (the rollout's steps). A model without
    stages whose windowed layers are read whole (SAM, Qwen2.5-VL): ``pattern``, the most one such layer's pattern
    holds as formed (its layout, scores beside probabilities), ``probabilities`` that layer's as returned, and
    ``forward``, the costliest layer's layout as a forward forms it (``plan.analysis`` counts the pattern beside the
    rollout's kept factors, not the step over the windows, which only the path without them takes)."""

    peak: int = 0
    layer: int = 0
    why: str = ""
    kept: int = 0
    maps: int = 0
    pattern: int = 0
    probabilities: int = 0
    forward: int = 0

    @property
    def total(self) -> int:
        """The most held at once: the kept attentions beside the forward's costliest layer, or the maps' steps."""
        return self.kept + max(self.peak, self.maps)


def _layer_layout(layout, attn, rel_pos: str, bias_chunk: int) -> tuple[int, int, int, str]:
    """One layer's ``(peak bytes, bytes of its attention as returned, float64 bytes of one rollout step, why)`` for
    one image (float32; ``layout`` a ``LayerLayout``, ``attn`` the block's ``Attention``): beyond what a global layer
    over the real tokens forms, the windows padded to a multiple of their side, cut and placed back, with q, k and v
    over the padding; Hiera's / SAM 2's pooled queries; Swin's position bias over a window's pairs, whole, the rows a
    query chunk takes of it and its int64 index (and Swin V2's MLP over the window's offsets); the shifted windows'
    mask (kept, its comparison, its copy per window); SAM's per-axis tables; BEiT's resized table."""
    H, hd = attn.num_heads, attn.head_dim
    inner, width_in, width = H * hd, attn.qkv.in_features, attn.proj.out_features
    (kh, kw), s = layout.key_grid, layout.stride
    if layout.window:
        wh, ww = layout.window_hw  # on the layer's grid; its keys' window is ``s`` times wider
        nw = -(-kh // (wh * s)) * -(-kw // (ww * s))  # windows over the grid padded to a multiple
        nq, nk = wh * ww, wh * ww * s * s
    else:
        wh, ww = layout.grid
        nw, nq, nk = 1, layout.num_tokens, kh * kw
    pairs = nw * nq * nk  # what the layer's attention holds per head
    # A bias is formed a query chunk at a time, every window's rows at once: at most ``bias_chunk``, or one row
    chunk = min(4 * H * pairs, max(bias_chunk, 4 * H * nw * nk))
    parts = {}
    if layout.window:  # cut and placed back (two copies each way), and q, k, v and their context over the padding
        copies = 2 * (kh * kw * width_in + layout.num_tokens * width)
        padding = ((nw * nk - kh * kw) * (2 * width_in + 3 * inner)
                   + (nw * nq - layout.num_tokens) * (2 * inner + 2 * width))
        parts["windows (cut, padded and placed back)"] = 4 * (copies + padding)
    if s > 1:
        parts["pooled queries"] = 4 * 2 * nw * nq * inner
    if rel_pos in ("swin", "swinv2") and layout.window:
        why = f"position bias and index over its {wh}×{ww}-patch window ({nq:,} × {nq:,} pairs, {H} heads)"
        whole = 4 * H * nq * nq  # formed for each chunk, which takes its rows (a copy) and adds a shift's mask
        parts[why] = 8 * nq * nq + whole + min(whole, chunk) + (chunk if any(layout.shift_hw) else 0)
        if rel_pos == "swinv2":
            parts[why] += 4 * (2 * wh - 1) * (2 * ww - 1) * (2 * SWIN_MLP_WIDTH + 3 * H)
    if any(layout.shift_hw):
        parts[f"shifted-window mask ({nw:,} windows of {nq:,} × {nq:,} pairs)"] = 9 * pairs
    if rel_pos == "sam":  # the per-axis tables; a window's bias chunk where it is larger than a global layer's
        T = layout.num_tokens  # (which the analysis counts, ``analysis_memory``)
        whole = 4 * (H + 1) * T * min(T, max(1, bias_chunk // (4 * H * T)))
        parts["relative positions"] = 4 * 2 * (wh * wh + ww * ww) * hd + (max(0, chunk - whole) if layout.window else 0)
    if rel_pos in ("beit", "beit_shared"):
        parts["resized position table"] = 4 * 3 * (2 * wh - 1) * (2 * ww - 1) * H
    if not parts:
        return 0, 4 * H * pairs, 8 * pairs, ""
    why = max(parts, key=parts.get)
    return sum(parts.values()), 4 * H * pairs, 8 * pairs, why


def layout_memory(model, grid: tuple[int, int], analysis: bool = False) -> LayoutMemory:
    """What the attention layouts of ``model`` (a ``ViT``) form for one image on patch ``grid`` (``LayoutMemory``):
    the most any layer forms at once (``_layer_layout``). With ``analysis``, also what the explorer's analysis reads
    whole: a model with stages returns every layer's windows, kept (``kept``; the explicit path's scores beside the
    costliest layer's probabilities), and its maps are built from them (``maps``: a rollout step in float64 holds a
    layer's windows fused over the heads about four times, beside every layer's fused windows); another model's
    windowed layer (SAM, Qwen2.5-VL) is read one layer's windows at a time: as formed, its scores beside its
    probabilities; in the rollout's step (``attention.layer_step``), its probabilities beside their mean over the
    heads and two copies of that (padding keys dropped, the residual added, renormalised): ``(H + 3) / H`` times its
    probabilities, more than the pattern's twice for one or two heads. A model without layouts: zeros. ValueError
    (the layouts' own) where a layer's windows do not fit ``grid``."""
    layouts = getattr(model, "layer_layouts", None)
    config = getattr(model, "config", None)
    if layouts is None or not (config.window_size or config.stage_depths or config.rel_pos != "none"):
        return LayoutMemory()
    staged = bool(config.stage_depths)
    worst, kept, fused, step, pattern, probabilities, forward = LayoutMemory(), 0, 0, 0, 0, 0, 0
    for i, (layout, block) in enumerate(zip(layouts(tuple(grid)), model.blocks, strict=True)):
        peak, returned, rollout, why = _layer_layout(layout, block.attn, config.rel_pos, BIAS_CHUNK_BYTES)
        forward = max(forward, peak)
        if analysis and not staged and layout.window and peak + 2 * returned > pattern:
            pattern, probabilities = peak + 2 * returned, returned
        if analysis and staged:
            peak += returned  # the scores beside the probabilities they become
            kept, fused, step = kept + returned, fused + rollout // 2, max(step, rollout)
        elif analysis and layout.window:  # its pattern as formed, or the rollout's step over it, the larger
            rolled = returned + 3 * returned // block.attn.num_heads
            peak, why = ((peak + 2 * returned, why) if peak + 2 * returned >= rolled else
                         (rolled, "rollout step over its windows (their probabilities, head mean and its copies)"))
        if peak > worst.peak:
            worst = LayoutMemory(peak, i, why or "attention scores")
    return LayoutMemory(worst.peak, worst.layer, worst.why, kept, fused + 4 * step if kept else 0, pattern,
                        probabilities, forward)


def check_layouts(model, grid: tuple[int, int], what: str = "") -> None:
    """``TooManyTokens`` before a forward of ``model`` on patch ``grid`` whose attention layouts (``layout_memory``:
    windows, position biases and indices, masks, pooled queries) would form more than the memory limit per image
    (VIT_ANALYSIS_MEMORY_MB) at once: the bound of every forward, whichever command or view runs it."""
    memory, limit = layout_memory(model, grid), memory_limit()
    if memory.peak > limit:
        gh, gw = grid
        what = what or f"An input of {gh}×{gw} patches"
        raise TooManyTokens(f"{what} needs about {memory.peak / 2**20:,.0f} MB at once for layer {memory.layer}'s "
                            f"{memory.why}, over the {limit / 2**20:,.0f} MB limit per image "
                            f"({ANALYSIS_MEMORY_ENV}). Choose a smaller input size, or raise {ANALYSIS_MEMORY_ENV}.")
