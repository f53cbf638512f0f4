"""TAM, the Token Activation Map of a VLM's answer token (Li et al., "Token Activation Map to Visually Explain
Multimodal LLMs", ICCV 2025; ``TAM`` in xmed-lab/TAM, commit 7c7df1d, ``tam.py``, MIT licence), as the authors'
function computes it for one generation round.

The activation of class ``c`` at a position is the language-model head's logit of ``c`` on that position's last
hidden state, its positive part (a logit lens over every position): the map of answer token ``i`` is its own class's
activation over the image tokens. Estimated causal inference removes what the context explains: each earlier text
token ``j`` (the question's words, then the answer's; a token of the same id as ``i`` left out) has its own map
(class ``c_j`` over the image tokens), and their sum weighted by the activation of ``c_i`` at each ``j``'s position
(normalised to sum 1) is subtracted, scaled by the least-squares factor, positive part kept. The image tokens'
values and the text tokens' (the current token's own position left out) are min-max normalised together, then the
rank Gaussian filter smooths each image token's 3 x 3 neighbourhood (``rank_gaussian_filter``).

The authors' choices are kept as they are, as their ``TAM(tokens, ..., i, ...)`` returns them when called for each
round in turn (their ``demo.py`` and ``eval.py``): the question's first word's map uses the class the head predicts
there (argmax), not its own; the map at the prompt's last position (the context entry of answer token 0) uses the
class of the prompt's last token; and answer token 0's map is that first question word's (their round 0 returns
it). Differences, none reached by a map with a spread: a window of one positive value everywhere takes that value
(theirs: NaN, from a zero width), no context token leaves the map as it is (theirs: an error), a map and text of one
value are all zero (theirs: NaN); the least-squares factor is solved in closed form (theirs: Brent's search, to its
tolerance); tokens are compared by id (theirs: by the tokenizer's pieces of the decoded text, the same where decoding
round-trips); an image read as tiles is filtered on the tiles' canvas (the authors': "map crops to raw size"; their
form for several images filters each view alone), its values before the filter theirs, and a canvas whose tokens
were shrunk (LLaVA-OneVision past ``anyres_max``) on the shrunk tokens' grid; leading image tokens that cover no patch
(CLIP's CLS) hold 0 and take no part (the authors' grid never holds them); a prompt that ends on the question
(PaliGemma's) counts its last word once, as the prompt's last position (a one-word question: answer token 0's map is
that position's own class's, as the authors' round 0 gives it over an empty question span).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from vit.core.threads import this_thread_only

KERNEL = 3  # the rank Gaussian filter's window side, the authors' (``multimodal_process``)


def rank_gaussian_filter(values: np.ndarray, size: int = KERNEL) -> np.ndarray:
    """(h, w) -> (h, w) float32: each value replaced by the Gaussian-weighted mean of its ``size x size`` window's
    values sorted, the Gaussian centred on the middle rank with a width of the window's coefficient of variation
    (std / mean); 0 where the window's mean is not positive. The border reflected (``np.pad(mode="reflect")``)."""
    pad = size // 2
    padded = np.pad(values.astype(np.float64), pad, mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, (size, size))  # (h, w, size, size)
    ranked = np.sort(windows.reshape(*values.shape, size * size), axis=-1)  # (h, w, size²)
    mean = ranked.mean(-1, keepdims=True)
    positive = mean > 0
    sigma = np.where(positive, ranked.std(-1, keepdims=True) / np.where(positive, mean, 1.0), 0.0)
    rank = np.arange(size * size) - size * size // 2  # (size²,) distance from the middle rank
    flat = sigma == 0  # one value in the window: the Gaussian's limit, the middle rank alone
    kernel = np.where(flat, (rank == 0).astype(np.float64),
                      np.exp(-rank ** 2 / (2 * np.where(flat, 1.0, sigma) ** 2)))
    kernel = kernel / kernel.sum(-1, keepdims=True)
    return np.where(positive[..., 0], (ranked * kernel).sum(-1), 0.0).astype(np.float32)


def question_span(tokenizer, ids: list[int], after: int, words: str) -> tuple[int, int]:
    """``(start, count)``: where the tokens of ``words`` (the question) sit in the prompt's ``ids``, their last
    occurrence after position ``after`` (the image's last token). ValueError (one line) when they are not there."""
    for text in (words, " " + words):  # a tokenizer that marks a word's leading space spells it with one
        q = tokenizer(text, add_special_tokens=False)["input_ids"]
        for start in range(len(ids) - len(q), after, -1):
            if q and ids[start:start + len(q)] == q:
                return start, len(q)
    raise ValueError("TAM needs the question's words in the prompt after the image, and the prompt's tokens do not "
                     "hold them as the tokenizer spells them alone; ask through the chat template (question=)")


def _activation(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: torch.Tensor,
                classes: list[int]) -> torch.Tensor:
    """(len(rows), len(classes)) float32: the head's logits of ``classes`` at positions ``rows``, positive part."""
    head = weight[classes].float()  # (C, D): only the classes' rows, never the vocabulary
    logits = hidden[rows].float() @ head.T
    if bias is not None:
        logits = logits + bias[classes].float()
    return logits.clamp(min=0)


def tam_values(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, ids: list[int],
               prompt_tokens: int, image: torch.Tensor, question: tuple[int, int], i: int) -> np.ndarray:
    """(K,) float32: answer token ``i``'s TAM over the ``K`` image tokens (positions ``image``), causal inference
    applied and normalised with the text, before the filter. ``hidden`` (T, D): the last hidden states (after the
    final norm) of the prompt and the answer's first ``i`` tokens; ``weight`` (V, D) and ``bias``: the head;
    ``ids``: the prompt's ids and the whole answer's; ``question``: its ``(start, count)`` in the prompt."""
    start, count = question
    answer = ids[prompt_tokens:]
    # The context: the question's words, then the prompt's last position and the answer's first i (index count + k
    # is the position that predicted answer token k, whose id it is compared by)
    text_rows = torch.tensor([*range(start, start + count), *range(prompt_tokens - 1, prompt_tokens + i)],
                             device=hidden.device)
    # The authors' class of the question's first word: the head's prediction there, in the head's own precision;
    # with no word before the prompt's last position (a one-word question that ends the prompt) their first map is
    # that position's, of its own token's class
    greedy = int(torch.nn.functional.linear(hidden[start], weight, bias).argmax()) if count else ids[prompt_tokens - 1]

    def context_class(j: int) -> int:
        if j == 0:
            return greedy
        if j < count:
            return ids[start + j]
        return ids[prompt_tokens - 1] if j == count else answer[j - count]

    if i == 0:  # the authors' round 0 returns the question's first word's map, no context removed
        current, context = greedy, []
        text_rows = text_rows[:count + 1]
    else:
        words = [*ids[start:start + count], *answer]  # compared by id at the same indices
        current = answer[i]
        context = [j for j in range(count + i) if words[j] != words[count + i]]
    own = _activation(hidden, weight, bias, image, [current])[:, 0]  # (K,)
    text = _activation(hidden, weight, bias, text_rows, [current])[:, 0]  # (count + 1 + i,)
    if context:
        maps = _activation(hidden, weight, bias, image, [context_class(j) for j in context])  # (K, n)
        w = text[context] / (text[context].sum() + 1e-8)
        interference = maps @ w  # (K,)
        norm = float(interference @ interference)
        scale = float(own @ interference) / norm if norm > 0 else 0.0  # least squares: min |own - s * interference|²
        own = (own - interference * scale).clamp(min=0)
    joint = torch.cat([own, text[:-1]])  # the current token's own position left out
    low, high = joint.min(), joint.max()
    return ((own - low) / (high - low) if high > low else torch.zeros_like(own)).cpu().numpy().astype(np.float32)


def token_canvas(layout) -> tuple[torch.Tensor, int]:
    """``(index, unit)``: the image token (into ``layout.positions``) at each place of the image tokens' own grid
    (one per unit of patches): a view's units row-major after its leading tokens, or a tiled canvas's. ValueError
    (one line) for tokens not placed on the image."""
    if layout.unplaced:
        raise ValueError(f"{layout.unplaced}; TAM filters its values over their places on the image")
    unit = layout.unit
    if layout.index is not None:
        return layout.index[::unit, ::unit], unit
    gh, gw = layout.grid
    return layout.lead + torch.arange((gh // unit) * (gw // unit)).view(gh // unit, gw // unit), unit


def image_values(vlm, prepared, answer: tuple[int, ...], i: int) -> np.ndarray:
    """(K,) float32: answer token ``i``'s TAM over the prompt's ``K`` image tokens (every view's), before the filter:
    one forward, counted first (``vit.costs.plan.vlm_tam``). Leading tokens that cover no patch (CLIP's CLS under
    LLaVA's "full" strategy) hold 0 and take no part: the authors' function sees the grid's tokens alone."""
    from vit.costs.plan import decide, vlm_tam
    from vit.explain.language.vlm_lens import output_head
    from vit.explain.language.vlm_relevance import answer_run

    ids = [int(t) for t in prepared.inputs["input_ids"][0]] + list(answer)
    positions = prepared.layout.positions
    words = prepared.words
    if words is None:
        raise ValueError("TAM needs the question's words; this answer was asked without them")
    start, count = question_span(vlm.processor.tokenizer, ids[:prepared.prompt_tokens], int(positions.max()), words)
    if start + count == prepared.prompt_tokens:  # the prompt ends on the question (PaliGemma's, no turn after it):
        count -= 1  # its last word is the prompt's last position, one context entry, not two
    lead = prepared.layout.lead  # tokens that cover no patch (CLIP's CLS): outside the map, its ECI and its scale
    tokens = prepared.prompt_tokens + i
    implementation = vlm.language_model.config._attn_implementation
    views, view_grid = prepared.tower()
    decide(vlm_tam(vlm.tower_shape, prepared.layout.grid, prepared.text, tokens, i, len(positions), count + i + 1,
                   fused="eager" not in implementation, views=views, view_grid=view_grid))
    head = output_head(vlm.model)
    with torch.inference_mode(), answer_run(vlm, prepared, answer, i) as inputs:
        hidden = head_input(vlm.model, head, inputs)[0]  # (T, D), after the norm
    if hidden.shape[0] != tokens:
        raise RuntimeError(f"the head was handed {hidden.shape[0]} positions, not the run's {tokens}")
    with torch.inference_mode(), _weights_in(head):
        hidden = hidden.to(head.weight.device)
        values = tam_values(hidden, head.weight, head.bias, ids, prepared.prompt_tokens,
                            positions[lead:].to(hidden.device), (start, count), i)
    return np.concatenate([np.zeros(lead, dtype=np.float32), values])


def head_input(model: torch.nn.Module, head: torch.nn.Module, inputs: dict) -> torch.Tensor:
    """(B, T, D): what ``model``'s forward over ``inputs`` hands its ``head`` (the last hidden states after the final
    norm, every position's: ``logits_to_keep`` left at all), read by a hook on the head, which does not run (no
    ``T x V`` logits). The head's input, not an output field: Llama 4's output has logits and no
    ``last_hidden_state``, and its base model is the whole model."""
    from vit.explain.language.vlm_lens import _Stopped

    kept = {}

    def read(module, args, kwargs):
        kept["hidden"] = args[0] if args else next(iter(kwargs.values()))
        raise _Stopped

    handle = head.register_forward_pre_hook(this_thread_only(read), with_kwargs=True)
    try:
        model(**inputs, use_cache=False)
    except _Stopped:
        pass
    finally:
        handle.remove()
    if "hidden" not in kept:
        raise RuntimeError("the model's forward never reached its output head; TAM cannot read its hidden states")
    return kept["hidden"]


@contextlib.contextmanager
def _weights_in(module: torch.nn.Module):
    """Within it, ``module``'s weights are in place: a head accelerate offloaded (``device_map``) has them brought in
    by its own hook (``pre_forward``) and taken out after (``post_forward``), as its forward would; TAM reads the
    head's rows directly."""
    hook = getattr(module, "_hf_hook", None)
    if hook is None:
        yield module
        return
    hook.pre_forward(module)
    try:
        yield module
    finally:
        hook.post_forward(module, None)


def on_layout(values: np.ndarray, layout) -> np.ndarray:
    """(K,) TAM values of the image tokens -> (gh, gw) on ``layout``'s patch grid: the rank Gaussian filter over the
    image tokens' own grid (a tiled image's canvas, or its overview's view), each patch its image token's value. A
    token over several rows or columns of units (LLaVA-OneVision's canvas shrunk past ``anyres_max``) is one place of
    that grid: runs of equal rows and columns are filtered once."""
    index, unit = token_canvas(layout)
    # the first unit row (column) of each run of equal ones, and the run each row (column) falls in
    new_row = torch.ones(index.shape[0], dtype=torch.bool)
    new_row[1:] = (index[1:] != index[:-1]).any(1)
    new_col = torch.ones(index.shape[1], dtype=torch.bool)
    new_col[1:] = (index[:, 1:] != index[:, :-1]).any(0)
    own = index[new_row][:, new_col]  # (h, w) the image tokens' own grid
    grid = rank_gaussian_filter(values[own.numpy()])
    grid = grid[(new_row.cumsum(0) - 1).numpy()][:, (new_col.cumsum(0) - 1).numpy()]
    return np.repeat(np.repeat(grid, unit, axis=0), unit, axis=1)
