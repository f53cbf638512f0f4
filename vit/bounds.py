"""How many tokens one image may have before the work it implies: the one gate of the explorer, the notebook API
and ``vit.predict`` (env VIT_MAX_TOKENS, else ``MAX_TOKENS``), and the estimate its refusal gives.

Attention's work grows with the square of the tokens: the shipped 4-px-patch model at 1,024 px (65,537 tokens) is
11 minutes of one forward on 2 cores, ViT-B/16 there an hour. Past the gate an input is refused at once, in one
line that says what it would cost and how to allow it. The gate counts an input's patches: a model's prefix tokens
(CLS, registers: a handful, whatever the input) come on top, so a side of 128 patches opens on every model.
"""

from __future__ import annotations

import math
import os

MAX_TOKENS = 16384  # patches: ViT-B/16 at 2,048 px (128 x 128) runs, past it minutes of a forward on a laptop
MAX_TOKENS_ENV = "VIT_MAX_TOKENS"
# What one analysed image may hold (hidden states, caches, copies of its tokens): env VIT_ANALYSIS_MEMORY_MB.
ANALYSIS_MEMORY_LIMIT = 1024 * 2**20
ANALYSIS_MEMORY_ENV = "VIT_ANALYSIS_MEMORY_MB"


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
