"""The recording attention of a VLM's answer: the language model's attention (and, for the relevance rules, the
tower's) runs through the recording attention function (``vit.core.recording_attention``: registered with
transformers' ``AttentionInterface`` as ``ROWS`` + the implementation it wraps). The model's own implementation
(sdpa, or the eager function of its modelling file) computes the output; beside it, while an answer is recorded
(``recording``), each call is handed to a recorder (``vit.explain.language.vlm_answer``'s rows,
``vit.explain.language.vlm_relevance``'s tape), and while relevance rules are current (``RULES``:
``vit.explain.language.vlm_attnlrp``) their ``attention_inputs`` apply to every call it runs. A language model whose
attention computes its softmax itself (GIT's, BLIP's text decoder's) is recorded by the recorder at the attention
function instead (``inline``: ``vit.core.attention_recorder.AttentionRecording``, the module road's), one whose
attention hands its function what only its own eager function reads (Inkling's sinks) over that function; both keep
each step's last row of the module's own probabilities (``_LastRows``)."""

from __future__ import annotations

import contextlib

import torch

from vit.core import recording_attention
from vit.core.recording_attention import (
    _RECORDING,
    ROWS,
    RULES,
    attention_of,
    cross_layers,
    cross_module,
    cross_named,
    decoder_layers,
    inline_attention,
    route_attention,
)
from vit.core.threads import this_thread_only

__all__ = ["ROWS", "RULES", "_RECORDING", "route_attention", "use_recording_attention", "recording",
           "attention_layers", "cross_attending", "linear_layers"]


def use_recording_attention(vlm) -> None:
    """Point the language model's attention at the recording function (``route_attention``); the tower's is left as
    it is."""
    route_attention(vlm.language_model, getattr(vlm, "same_branch", False))


@contextlib.contextmanager
def recording(vlm, recorder):
    """Within it, each language-model layer's attention call is handed to ``recorder`` (``keep`` before, ``output``
    after); where the layers' attention computes its softmax itself (GIT's, BLIP's text decoder's: ``inline``), or
    hands its function what only its own eager function reads (``VLM.own_probabilities``: Inkling's sinks), their
    probabilities instead, as that module computed them (``_LastRows``)."""
    if any(recording_attention.computes_softmax(module) for module in recorder.layers):
        with inline(vlm, recorder):
            yield recorder
        return
    if getattr(vlm, "own_probabilities", False):  # over its own eager function: the probabilities it returns
        if vlm.language_model.config._attn_implementation not in ("eager", f"{ROWS}_eager"):
            vlm.language_model.set_attn_implementation("eager")
        with recording_attention.recording(vlm.language_model, _LastRows(recorder, (
                "its attention hands its eager function what only that function reads (per-query sinks, a position "
                "bias)"))):
            yield recorder
        return
    with recording_attention.recording(vlm.language_model, recorder, getattr(vlm, "same_branch", False)):
        yield recorder


class _LastRows:
    """A recorder of the module's own probabilities for the answer's ``recorder``, as both recorders at the attention
    function hand them (``vit.core.attention_recorder.AttentionRecording``'s ``keep_probabilities``, the recording
    attention's over a module's own eager function): each call's last query row kept (with a KV cache each step's
    query is one token; the prompt's last at step 0) as the answer's row of that step, ``(H, positions read)``, the
    positions before the keys a sliding cache handed over 0 as in the eager attention (``rows_kept``:
    ``VLMAnswer.row`` reads it as it is). No gradient."""

    rows, rows_of, gradient = None, None, False  # every row handed on as the module formed it: the last one kept

    def __init__(self, recorder, why: str):
        self.recorder, self.layers = recorder, recorder.layers
        self.modules = {layer: module for module, layer in recorder.layers.items()}
        recorder.rows_kept = why  # what the readings that run the model again through the interface are told

    def keep_probabilities(self, layer: int, probabilities: torch.Tensor, rows_formed: bool = False) -> None:
        r = self.recorder
        queries, keys = probabilities.shape[-2:]
        seen = keys if r.cross else (r.seen[layer][-1] if r.seen[layer] else 0) + queries
        row = torch.zeros(probabilities.shape[1], seen)  # (H, seen)
        row[:, seen - keys:] = probabilities[0, :, -1].detach().float().cpu()  # the module's own, unchanged
        r.queries[layer].append(row)
        r.seen[layer].append(seen)
        r.starts[layer].append(seen - keys)
        r.masks[layer].append(None)

    def output(self, layer: int, output: torch.Tensor) -> None:
        """Not needed (the recording attention hands each call's output)."""


@contextlib.contextmanager
def inline(vlm, recorder):
    """Within it, the language model's layers whose attention computes its softmax itself are recorded by the
    recorder at the attention function (``vit.core.attention_recorder.AttentionRecording``, the module road's): each
    forward of the language model counts its listed modules' calls from 0 (call ``k``: layer ``k``), every other
    module's passed over, and each call's last query row is kept (``_LastRows``)."""
    from vit.core.attention_recorder import AttentionRecording

    rows = _LastRows(recorder, "its attention computes its softmax itself")
    listed = set(recorder.layers)
    mode = AttentionRecording(vlm.model, rows, skip=frozenset(set(vlm.model.modules()) - listed) | {None})
    hook = vlm.language_model.register_forward_pre_hook(this_thread_only(lambda *_: setattr(mode, "calls", 0)))
    try:
        with mode:
            yield recorder
    finally:
        hook.remove()


def image_token_id(config) -> int | None:
    """The id of the image placeholder token in the VLM's ``config`` (``image_token_id``, or LLaVA's older
    ``image_token_index``)."""
    image_token = getattr(config, "image_token_id", None)
    return getattr(config, "image_token_index", None) if image_token is None else image_token


def image_positions(vlm, inputs) -> torch.Tensor:
    """(K,) where the image's tokens sit in the prompt the processor gave: the positions its own mask of them marks
    (``image_embeds_position_mask``: Kosmos-2's, whose config names no image token), else the image placeholder's
    (its id from the model's config, else the processor's); empty where neither names one."""
    marked = inputs.get("image_embeds_position_mask") if hasattr(inputs, "get") else None
    if isinstance(marked, torch.Tensor) and marked.dim() == 2 and marked.shape == inputs["input_ids"].shape:
        return marked[0].nonzero()[:, 0]
    token = image_token_id(vlm.model.config)
    if token is None:
        token = getattr(vlm.processor, "image_token_id", None)
    if token is None:
        return torch.zeros(0, dtype=torch.long)
    return (inputs["input_ids"][0] == token).nonzero()[:, 0]


def attention_layers(language_model) -> list[tuple[int, object]]:
    """``(decoder layer, its attention module)`` of each decoder layer that attends to the image, in order: the
    answer's layer ``k`` is the ``k``-th of them. Where the image's tokens are in the sequence, every layer that
    attends (``self_attn``), as transformers' ``output_attentions`` numbers them; a hybrid model's linear-attention
    layers (Qwen3.5's gated delta rule) hold a recurrent state, not an attention over the tokens, and are not among
    them. Where the language model reads the image through cross-attention layers (Llama 3.2 Vision's ``cross_attn``
    over the tower's states, ``cross_attending``), those layers alone: its self-attention sees one placeholder
    token of the image."""
    crossing = cross_layers(language_model)
    if crossing is not None:
        modules = ((n, cross_module(layer) or inline_attention(cross_named(layer))) for n, layer in enumerate(crossing))
        return [(n, module) for n, module in modules if module is not None]
    layers = decoder_layers(language_model)
    attending = [(n, attention_of(layer)) for n, layer in enumerate(layers)]
    if all(attention is None for _, attention in attending):  # an attention that computes its softmax itself (GIT's)
        attending = [(n, inline_attention(layer, cross_named(layer))) for n, layer in enumerate(layers)]
    return [(n, attention) for n, attention in attending if attention is not None]


def cross_attending(language_model) -> bool:
    """Whether the language model reads the image through cross-attention layers (``CROSS``: Llama 3.2 Vision's,
    Idefics' gated layers, the decoder's of an encoder-decoder such as Florence-2's BART, Pix2Struct's T5 or a
    VisionEncoderDecoder's), not through image tokens in its sequence (``recording_attention.cross_layers``)."""
    return cross_layers(language_model) is not None


def linear_layers(language_model) -> list[str]:
    """The class names of the decoder layers' token mixers that are not attention (a hybrid model's linear attention,
    ``linear_attn``)."""
    return sorted({type(getattr(layer, "linear_attn", None) or layer.self_attn).__name__
                   for layer in decoder_layers(language_model) if attention_of(layer) is None
                   and (hasattr(layer, "linear_attn") or hasattr(layer, "self_attn"))})
