"""Attention knockout inside a VLM's language model (issue 115, item 1): how the image reaches an answer token, layer
by layer (Geva et al. 2023, "Dissecting Recall of Factual Associations"; for VLMs Zhang et al., CVPR 2025,
"Cross-modal Information Flow in Multimodal Large Language Models").

The attention edges from ``source`` positions (by default the query that predicted answer token ``i``: the prompt's
last position for ``i = 0``, else answer token ``i - 1``) to ``target`` positions are blocked in chosen layers (and,
if given, heads only): ``-inf`` is added to those scores before the softmax, in the mask the model's own attention
(sdpa or eager) is handed, so each source row is renormalised over the keys it still reads exactly as the model's own
softmax renormalises it. The mask goes through the recording attention (``vit.core.recording_attention``: its
recorder's ``edit_mask``), the library's modules running unchanged. The answer token's probability at its query is
read from one forward of the whole model over the prompt and the answer's first ``i`` tokens
(``vlm_relevance.answer_run``), without a cache: query position = sequence position. ``windows=k``: one forward per
window of ``k`` consecutive layers (the papers' curve over the layers), and one for the baseline.

Positions (``positions``) are given as an image box ``(top, left, bottom, right)`` of patches on the map's grid (its
image tokens, as ``VLMAnswer.ablate``'s), ``"image"`` (every token of the image), ``"question"`` (the question's own
tokens in the prompt), ``"last"`` (the query), or token indices (an int, a list or a range) into that sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

KINDS = ("image", "question", "last")  # the named position sets


@dataclass(frozen=True)
class Knockout:
    """Answer token ``token``'s probability at its query with the attention edges ``sources`` -> ``targets`` blocked
    in ``windows`` (one tuple of layers per knockout; ``heads``: only those heads, None every head): ``probability``
    a float for one knockout, (len(windows),) float32 for ``windows=k``; ``baseline`` without any edge blocked."""

    token: int
    baseline: float
    probability: float | np.ndarray
    windows: tuple[tuple[int, ...], ...]
    sources: tuple[int, ...]
    targets: tuple[int, ...]
    heads: tuple[int, ...] | None

    @property
    def change(self) -> float | np.ndarray:
        """The relative change in the probability, ``(blocked - baseline) / baseline`` (the papers' y axis)."""
        return (self.probability - self.baseline) / self.baseline if self.baseline else self.probability * 0.0


class _Blocking:
    """A recorder for the recording attention that blocks ``sources`` -> ``targets`` at the layers it lists
    (``layers``: module -> layer), at ``heads`` (None: every head)."""

    def __init__(self, layers: dict[torch.nn.Module, int], sources: torch.Tensor, targets: torch.Tensor,
                 heads: torch.Tensor | None) -> None:
        self.layers, self.sources, self.targets, self.heads = layers, sources, targets, heads
        self.causal = {layer: getattr(module, "is_causal", True) for module, layer in layers.items()}

    def edit_mask(self, layer: int, query: torch.Tensor, key: torch.Tensor, attention_mask):
        """The additive mask (1, 1 or H, q, kv) the call runs with: the model's own (None: sdpa's causal attention;
        a boolean one's False as -inf) with -inf on the blocked edges."""
        q, kv = query.shape[-2], key.shape[-2]
        if q != kv:
            raise RuntimeError(f"a knockout runs without a cache; layer {layer} was called with {q} queries over "
                               f"{kv} keys")
        dtype, device = query.dtype, query.device
        if attention_mask is None:
            read = torch.ones(q, kv, dtype=torch.bool, device=device)
            read = read.tril() if self.causal[layer] else read
            mask = torch.zeros(1, 1, q, kv, dtype=dtype, device=device).masked_fill(~read, float("-inf"))
        elif attention_mask.dtype == torch.bool:
            mask = torch.zeros(attention_mask[..., :kv].shape, dtype=dtype, device=device)
            mask = mask.masked_fill(~attention_mask[..., :kv].to(device), float("-inf"))
        else:
            mask = attention_mask[..., :kv].to(device=device, dtype=dtype).clone()
        sources, targets = self.sources.to(device), self.targets.to(device)
        if self.heads is None:
            mask[:, :, sources[:, None], targets[None, :]] = float("-inf")
        else:
            mask = mask.expand(mask.shape[0], query.shape[1], q, kv).clone()  # (1, H, q, kv): a mask per head
            heads = self.heads.to(device)
            mask[:, heads[:, None, None], sources[None, :, None], targets[None, None, :]] = float("-inf")
        return mask

    def keep(self, layer, query, key, value, attention_mask, kwargs) -> None:
        """Nothing kept: the knockout reads the model's output alone."""

    def output(self, layer, output) -> None:
        """Nothing kept."""


def question_positions(vlm, prepared) -> torch.Tensor:
    """The positions of the question's own tokens in the prompt: the last run of the prompt's ids that is the
    question tokenized alone (with or without a leading space). ValueError (one line) where it is not one run."""
    words = prepared.words
    if not words:
        raise ValueError("this answer's prompt has no question after its image; give the question's token indices")
    ids = prepared.inputs["input_ids"][0, :prepared.prompt_tokens].tolist()
    tokenizer = vlm.processor.tokenizer
    for text in (words, " " + words):
        run = tokenizer(text, add_special_tokens=False)["input_ids"]
        starts = [s for s in range(len(ids) - len(run) + 1) if run and ids[s:s + len(run)] == run]
        if starts:
            return torch.arange(starts[-1], starts[-1] + len(run))
    raise ValueError(f"the question {words[:40]!r} is not one run of the prompt's tokens (its tokenizer joins it to "
                     "the template's); give its token indices instead")


def positions(answer, spec, i: int, what: str, overview: bool = False, image: int = 0) -> torch.Tensor:
    """The sequence positions ``spec`` names (see the module's docstring) in the run over the prompt and answer
    ``answer``'s first ``i`` tokens. ValueError (one line) for what names none or is not one of the forms."""
    from vit.explain.language.vlm_lens import region_tokens

    length = answer.prompt_tokens + i  # the run's positions; its last is the query
    if isinstance(spec, str):
        if spec == "last":
            return torch.tensor([length - 1])
        if spec == "image":
            return answer._image(image).positions.clone()
        if spec == "question":
            vlm, prepared = answer._model()
            return question_positions(vlm, prepared)
        raise ValueError(f"{what} must be an image box (top, left, bottom, right), one of {', '.join(KINDS)} or token "
                         f"indices, got {spec!r}")
    if isinstance(spec, tuple):
        layout = answer._image(image)
        return layout.positions[region_tokens(layout.view(overview), spec)].clone()
    if isinstance(spec, int) and not isinstance(spec, bool):
        spec = [spec]
    if isinstance(spec, (list, range)) and spec and all(isinstance(p, int) and not isinstance(p, bool)
                                                          for p in spec):
        if not all(-length <= p < length for p in spec):
            raise ValueError(f"{what}'s token indices must be positions 0 to {length - 1} of the prompt and the "
                             f"answer's first {i} tokens, got {list(spec)[:8]}")
        return torch.unique(torch.tensor([p % length for p in spec]))
    raise ValueError(f"{what} must be an image box (top, left, bottom, right) as a tuple, one of {', '.join(KINDS)} or "
                     f"token indices (a list or range of ints), got {str(spec)[:60]}")


def _indices(values, count: int, what: str) -> tuple[int, ...]:
    """``values`` (an int, a list, a range) as sorted distinct indices into ``count``; ValueError (one line)."""
    values = [values] if isinstance(values, int) and not isinstance(values, bool) else values
    if not isinstance(values, (list, tuple, range)) or not values or not all(
            isinstance(v, int) and not isinstance(v, bool) and -count <= v < count for v in values):
        raise ValueError(f"{what} must be an int or a list of ints from 0 to {count - 1} (or negative from the end), "
                         f"got {str(values)[:60]}")
    return tuple(sorted({v % count for v in values}))


def knockout(answer, i: int, source=None, target="image", layers=None, heads=None, windows: int | None = None,
             overview: bool = False, image: int = 0) -> Knockout:
    """Answer token ``i``'s probability with the attention edges ``source`` -> ``target`` blocked in ``layers`` (None:
    every layer; ``windows=k``: in each window of ``k`` consecutive ones of them), at ``heads`` (None: every head),
    and without (see the module's docstring). ``overview``, ``image``: a box's, as ``VLMAnswer.ablate``'s."""
    from vit.explain.language.vlm_attention import attention_layers, cross_attending, recording
    from vit.explain.language.vlm_lens import check
    from vit.explain.language.vlm_relevance import answer_run

    vlm, prepared = answer._model()
    answer._decoder_only(vlm, "a knockout")
    if cross_attending(vlm.language_model):
        raise ValueError("a knockout blocks the language model's self-attention edges to the image's tokens, and "
                         "this model reads the image through its cross-attention layers instead: not done for it")
    i = answer._token(i)
    sources = positions(answer, "last" if source is None else source, i, "source", overview, image)
    targets = positions(answer, target, i, "target", overview, image)
    blocked = set(targets.tolist())
    for s in sources.tolist():
        if blocked >= set(range(s + 1)):
            raise ValueError(f"the knockout blocks every key position {s} reads; its attention would read nothing")
    layers = _indices(list(range(answer.layers)) if layers is None else layers, answer.layers, "layers")
    heads = None if heads is None else _indices(heads, answer.heads, "heads")
    if windows is None:
        spans = (layers,)
    elif isinstance(windows, bool) or not isinstance(windows, int) or not 1 <= windows <= len(layers):
        raise ValueError(f"windows must be a whole number of layers from 1 to {len(layers)}, got {windows!r}")
    else:
        spans = tuple(layers[s:s + windows] for s in range(len(layers) - windows + 1))
    check(vlm, prepared, i, lens=False)
    modules = [module for _, module in attention_layers(vlm.language_model)]
    token = answer.tokens[i]
    head_index = None if heads is None else torch.tensor(heads)
    probabilities = []
    with torch.inference_mode(), answer_run(vlm, prepared, answer.tokens, i) as inputs:
        for span in (None, *spans):
            if span is None:  # the baseline: the recording attention with nothing blocked (the model's own)
                logits = vlm.model(**inputs, use_cache=False, logits_to_keep=1).logits[0, -1].float()
            else:
                blocking = _Blocking({modules[k]: k for k in span}, sources, targets, head_index)
                with recording(vlm, blocking):
                    logits = vlm.model(**inputs, use_cache=False, logits_to_keep=1).logits[0, -1].float()
            probabilities.append(float(logits.softmax(-1)[token]))
    probability = probabilities[1] if windows is None else np.array(probabilities[1:], dtype=np.float32)
    return Knockout(token, probabilities[0], probability, spans, tuple(sources.tolist()), tuple(targets.tolist()),
                    heads)
