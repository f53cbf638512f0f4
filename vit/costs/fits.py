"""Will it fit? The checks each explorer view asks before its work (the pages, the notebook API), each one call to
the cost model (``vit.costs``): its estimate of the view, then ``decide``.

Each ``check_*_fits`` raises ``TooManyTokens`` (``vit.costs.bounds``) with one line that names the limit, what holds the
memory and what to do.
"""

from __future__ import annotations

from vit.costs import bounds, plan
from vit.costs.bounds import TooManyTokens  # noqa: F401  (the checks' exception, imported from here by the pages)
from vit.costs.memory import (  # noqa: F401  (the terms, read from here by the explorer and the tests)
    CHUNK_BYTES,
    LAYER_CACHE_BYTES,
    analysis_memory,
    bias_chunk_bytes,
    has_logit_bias,
)

# Memory per analysed image: hidden states + cache + one layer's queries and keys + one chunk of attention stays
# under this (env VIT_ANALYSIS_MEMORY_MB), and inputs with more patches than VIT_MAX_TOKENS are refused
# (vit.costs.bounds: the gate vit.predict shares).
ANALYSIS_MEMORY_LIMIT = bounds.ANALYSIS_MEMORY_LIMIT


def analysis_limits(max_tokens: int | None = None) -> tuple[int, int]:
    """``(max patches, memory limit in bytes)``: ``max_tokens``, else VIT_MAX_TOKENS (``bounds.max_tokens``), and
    VIT_ANALYSIS_MEMORY_MB, else the defaults."""
    tokens = bounds.max_tokens(max_tokens)
    return tokens, bounds.memory_limit()


def check_input_fits(checkpoint, grid: tuple[int, int], what: str = "This input",
                     max_tokens: int | None = None, allow: str = f"raise {bounds.MAX_TOKENS_ENV}",
                     chunks: bool = False) -> str:
    """Raise ``TooManyTokens`` when an input of ``grid`` patches to ``checkpoint`` (a ``Checkpoint``: the cost model
    sits below ``vit.core``, so it reads the checkpoint's model without importing the class) is over the token gate
    (``max_tokens``, default VIT_MAX_TOKENS; ``allow`` says how to raise it) or the analysis's memory limit
    (``plan.analysis``), else return ``decide``'s verdict. With ``chunks`` the analysis may keep its hidden states
    every k-th layer (its path in chunks, ``"chunks"``: ``image_analysis.analyse``); without, a view that keeps every
    layer's states whole (the mechanism views) is refused where only that path fits."""
    model = checkpoint.model
    plan.tokens_gate(model, grid, f"{what} ({grid[0]}×{grid[1]} patches)", max_tokens, allow)
    cost = plan.analysis(model, grid, what)
    verdict = plan.decide(cost)
    if verdict == "chunks" and not chunks:
        raise cost.refuse(cost.memory, cost.limit)
    return verdict
