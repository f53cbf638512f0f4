"""The recording attention of a VLM's answer: one more attention function registered with transformers'
``AttentionInterface`` (``ROWS`` + the implementation it wraps), through which the language model's attention (and,
for the relevance rules, the tower's) runs. The model's own implementation (sdpa, or the eager function of its
modelling file) computes the output; beside it, while an answer is recorded (``recording``), each call is handed to
a recorder (``vit.explain.language.vlm_answer``'s rows, ``vit.explain.language.vlm_relevance``'s tape), and while
relevance rules are current (``RULES``: ``vit.explain.language.vlm_attnlrp``) their ``attention_inputs`` apply to
every call it runs."""

from __future__ import annotations

import contextlib
import contextvars
import sys

import torch

ROWS = "vit_answer_rows"  # the recording attention, one name per implementation it wraps: ROWS + "_sdpa"
# What the recording attention hands each language-model layer's call to: ``keep`` before it, ``output`` after (the
# answer's ``_Recorder``; the relevance's tape, ``vit.explain.language.vlm_relevance``)
_RECORDING: contextvars.ContextVar[object | None] = contextvars.ContextVar("vit_answer_rows", default=None)
# The relevance rules current in this context (``vit.explain.language.vlm_attnlrp``): the recording attention applies
# their ``attention_inputs`` to every call it runs, the tower's and the language model's; None: the plain attention
RULES: contextvars.ContextVar[object | None] = contextvars.ContextVar("vit_answer_rules", default=None)


def _recording(delegate):
    """The attention function that computes with ``delegate`` and, while an answer is recorded, keeps each language
    model layer's last query row."""
    def attention(module, query, key, value, attention_mask, **kwargs):
        rules = RULES.get()
        if rules is not None:
            query, key, value = rules.attention_inputs(query, key, value)
        recorder = _RECORDING.get()
        layer = None if recorder is None else recorder.layers.get(module)
        if layer is None:
            return delegate(module, query, key, value, attention_mask, **kwargs)
        recorder.keep(layer, query, key, value, attention_mask, kwargs)
        out = delegate(module, query, key, value, attention_mask, **kwargs)
        recorder.output(layer, out[0])
        return out
    return attention


def _eager_of(module: torch.nn.Module):
    """The eager attention function of ``module``'s own modelling file (Gemma's soft cap lives there)."""
    function = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if function is None:
        raise ValueError(f"{type(module).__name__}'s modelling file has no eager_attention_forward")
    return function


def _delegated_eager(module, *args, **kwargs):
    return _eager_of(module)(module, *args, **kwargs)


def route_attention(part: torch.nn.Module) -> None:
    """Point ``part``'s attention (a transformers model: the language model, or the tower for the relevance rules) at
    the recording function that wraps its own implementation (sdpa or eager). Registered once per implementation,
    under ``ROWS`` + its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    current = part.config._attn_implementation
    if current.startswith(ROWS):
        return
    if current not in ("sdpa", "eager"):
        raise ValueError(f"the model's attention is {current!r}; answers are recorded over sdpa or eager")
    name = f"{ROWS}_{current}"
    if name not in ALL_ATTENTION_FUNCTIONS:
        delegate = _delegated_eager if current == "eager" else ALL_ATTENTION_FUNCTIONS[current]
        AttentionInterface.register(name, _recording(delegate))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[current])
    part.set_attn_implementation(name)


def use_recording_attention(vlm) -> None:
    """Point the language model's attention at the recording function (``route_attention``); the tower's is left as
    it is."""
    route_attention(vlm.language_model)


@contextlib.contextmanager
def recording(vlm, recorder):
    """Within it, each language-model layer's attention call is handed to ``recorder`` (``keep`` before, ``output``
    after)."""
    use_recording_attention(vlm)
    token = _RECORDING.set(recorder)
    try:
        yield recorder
    finally:
        _RECORDING.reset(token)
