"""Will it fit? The checks each explorer view asks before its work (the pages, the notebook API), each one call to
the cost model (``vit.costs``): its estimate of the view, then ``decide``.

Each ``check_*_fits`` raises ``TooManyTokens`` (``vit.bounds``) with one line that names the limit, what holds the
memory and what to do.
"""

from __future__ import annotations

from vit import bounds
from vit.bounds import TooManyTokens  # noqa: F401  (the checks' exception, imported from here by the pages)
from vit.checkpoint import Checkpoint
from vit.costs import plan
from vit.costs.memory import (  # noqa: F401  (the terms, read from here by the explorer and the tests)
    CHUNK_BYTES,
    LAYER_CACHE_BYTES,
    analysis_memory,
    bias_chunk_bytes,
    has_logit_bias,
)

# Memory per analysed image: hidden states + cache + one layer's queries and keys + one chunk of attention stays
# under this (env VIT_ANALYSIS_MEMORY_MB), and inputs with more patches than VIT_MAX_TOKENS are refused
# (vit.bounds: the gate vit.predict shares).
ANALYSIS_MEMORY_LIMIT = bounds.ANALYSIS_MEMORY_LIMIT


def analysis_limits(max_tokens: int | None = None) -> tuple[int, int]:
    """``(max patches, memory limit in bytes)``: ``max_tokens``, else VIT_MAX_TOKENS (``bounds.max_tokens``), and
    VIT_ANALYSIS_MEMORY_MB, else the defaults."""
    tokens = bounds.max_tokens(max_tokens)
    return tokens, bounds.memory_limit()


def whole_gradient_bytes(model, tokens: int, layers: int | None = None) -> int:
    """Bytes of a backward pass that keeps ``layers`` (default all) layers' whole attention and its gradient."""
    from vit.costs.memory import whole_gradient_bytes as whole

    return whole(model.config, tokens, layers)


def _grid(model, tokens: int) -> tuple[int, int]:
    """A patch grid of ``tokens`` tokens (the prefix tokens included) for the views counted by tokens alone."""
    return 1, max(tokens - model.num_prefix_tokens, 0)


def check_gradient_fits(model, tokens: int, what: str, layers: int | None = None) -> None:
    """``TooManyTokens`` for a gradient method (LRP, AttnLRP, the class-specific map's whole path) whose backward
    pass keeps its layers' attention and gradient, ``4 x layers x H x T²`` floats (``layers``: default all), over
    the memory limit; the message names the largest square input that fits. Checked before any work."""
    plan.decide(plan.gradient(model, _grid(model, tokens), what, layers))


def check_chunked_gradient_fits(model, tokens: int, what: str, contexts: bool) -> None:
    """``TooManyTokens`` when a chunked gradient method (LeGrad; the class-specific map with ``contexts``, which
    keeps every layer's context gradient) would be over the memory limit (``memory.gradient_bytes``); the
    message names the largest square input that fits. Checked before any work."""
    plan.decide(plan.chunked_gradient(model, _grid(model, tokens), what, contexts))


def check_stage_legrad_fits(model, grid: tuple[int, int], start_layer: int = -2, what: str = "LeGrad") -> None:
    """``TooManyTokens`` when LeGrad (``what``; the class-specific map's gradient rollout with ``start_layer`` 0) on
    a model with stages would be over the memory limit (``plan.stage_gradient``). Checked before any work."""
    plan.decide(plan.stage_gradient(model, grid, start_layer, what))


def check_flow_fits(model, tokens: int) -> None:
    """``TooManyTokens`` when attention flow's max-flow problems (one per token, time ~T³) are over its token
    limit (``attention_flow.MAX_FLOW_TOKENS``); the message names the largest square input that fits. Checked
    before the forward that gives it every layer's attention."""
    from vit.explain.attention_flow import MAX_FLOW_TOKENS

    plan.decide(plan.flow(model, _grid(model, tokens), MAX_FLOW_TOKENS))


def check_input_fits(checkpoint: Checkpoint, grid: tuple[int, int], what: str = "This input",
                     max_tokens: int | None = None, allow: str = f"raise {bounds.MAX_TOKENS_ENV}",
                     chunks: bool = False) -> str:
    """Raise ``TooManyTokens`` when an input of ``grid`` patches is over the token gate (``max_tokens``, default
    VIT_MAX_TOKENS; ``allow`` says how to raise it) or the analysis's memory limit (``plan.analysis``), else return
    ``decide``'s verdict. With ``chunks`` the analysis may keep its hidden states every k-th layer (its path in
    chunks, ``"chunks"``: ``image_analysis.analyse``); without, a view that keeps every layer's states whole (the
    mechanism views) is refused where only that path fits."""
    model = checkpoint.model
    plan.tokens_gate(model, grid, f"{what} ({grid[0]}×{grid[1]} patches)", max_tokens, allow)
    cost = plan.analysis(model, grid, what)
    verdict = plan.decide(cost)
    if verdict == "chunks" and not chunks:
        raise cost.refuse(cost.memory, cost.limit)
    return verdict
