"""The recording attention: one more attention function registered with transformers' ``AttentionInterface``
(``ROWS`` + the implementation it wraps), through which a transformers model's own attention modules run, unchanged.
The model's own implementation (sdpa, or the eager function of its modelling file) computes the output, so the
numbers are the library's; beside it, while a recorder is current in this context (``recording``), each call of a
module the recorder lists (``recorder.layers``: module -> layer) is handed to it, ``keep`` before and ``output``
after (and, where it has one, its ``edit_mask`` gives the mask the call runs with: a knockout's blocked edges);
while relevance rules are current (``RULES``) their ``attention_inputs`` apply to every call it runs.

Both roads' library parts read it: a VLM's answer (``vit.explain.language.vlm_attention``) and a vision model opened
as transformers builds it (``vit.sources.library_road.transformers_models``). The recorder is a ContextVar's, so two
threads (or two views) recording over one model never see each other's calls.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import sys

import torch
from torch.overrides import TorchFunctionMode

from vit.core import attention_recorder

ROWS = "vit_answer_rows"  # the recording attention, one name per implementation it wraps: ROWS + "_sdpa"
# What the recording attention hands each listed module's call to: ``keep`` before it, ``output`` after (a VLM
# answer's ``_Recorder``, the relevance's tape, a library model's attention probabilities)
_RECORDING: contextvars.ContextVar[object | None] = contextvars.ContextVar("vit_answer_rows", default=None)
# The relevance rules current in this context (``vit.explain.language.vlm_attnlrp``): the recording attention applies
# their ``attention_inputs`` to every call it runs, the tower's and the language model's; None: the plain attention
RULES: contextvars.ContextVar[object | None] = contextvars.ContextVar("vit_answer_rules", default=None)


def _recording(delegate):
    """The attention function that computes with ``delegate`` and, while a recorder is current, hands it each call
    of a module it lists."""
    def attention(module, query, key, value, attention_mask, **kwargs):
        rules = RULES.get()
        if rules is not None:
            query, key, value = rules.attention_inputs(query, key, value)
        recorder = _RECORDING.get()
        layer = None if recorder is None else recorder.layers.get(module)
        if layer is None:
            return delegate(module, query, key, value, attention_mask, **kwargs)
        edit = getattr(recorder, "edit_mask", None)  # an intervention on the edges, before the softmax
        if edit is not None:
            attention_mask = edit(layer, query, key, attention_mask)
        if hasattr(recorder, "keep_probabilities"):  # a vision road's recorder: the layer computed once
            out = _once(recorder, layer, delegate, module, query, key, value, attention_mask, kwargs)
            recorder.output(layer, out[0])
            return out
        recorder.keep(layer, query, key, value, attention_mask, kwargs)
        out = delegate(module, query, key, value, attention_mask, **kwargs)
        recorder.output(layer, out[0])
        return out
    return attention


class _OneSDPA(TorchFunctionMode):
    """Within it, the SDPA call the delegate makes is computed once with its probabilities
    (``attention_recorder.sdpa_once``, the module road's piece): the asked ``rows`` alone formed, or every row and the
    output from them."""

    def __init__(self, rows: list[int] | None, name: str):
        super().__init__()
        self.rows, self.name, self.probabilities = rows, name, None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not attention_recorder.SDPA or self.probabilities is not None:
            return func(*args, **kwargs)
        out, self.probabilities = attention_recorder.sdpa_once(attention_recorder._sdpa_arguments(args, kwargs),
                                                                self.rows, self.name)
        return out


def _once(recorder, layer: int, delegate, module, query, key, value, attention_mask, kwargs):
    """An asked layer's call computed once: over sdpa, its SDPA call with the probabilities formed beside it (the asked
    query rows alone where the recorder asks some, ``rows x keys`` a head; every row, and the output from them,
    where it asks all or a gradient); over the eager function, that function once, its own probabilities kept. Each
    handed to ``recorder.keep_probabilities``; the call's own ``(output, weights)`` returned."""
    if delegate is _delegated_eager:
        out = delegate(module, query, key, value, attention_mask, **kwargs)
        recorder.keep_probabilities(layer, out[1])
        return out
    windowed = layer in getattr(recorder, "windows", {})  # a window's rows are not the grid's: every row formed
    rows = None if recorder.gradient or windowed else (
        recorder.rows_of.get(layer, recorder.rows) if recorder.rows_of else recorder.rows)
    with _OneSDPA(rows, type(module).__name__) as once:
        out = delegate(module, query, key, value, attention_mask, **kwargs)
    if once.probabilities is None:
        raise ValueError(f"{type(module).__name__}'s attention made no SDPA call to record")
    recorder.keep_probabilities(layer, once.probabilities, rows is not None)
    return out


def _eager_of(module: torch.nn.Module):
    """The eager attention function ``module``'s own class falls back to (Gemma's soft cap lives there): the one its
    ``forward`` names (``get_interface(..., simple_eager_attention_forward)``: Phi-4 multimodal's vision attention,
    whose file's ``eager_attention_forward`` is its text attention's and reads ``num_key_value_groups``), else its
    modelling file's ``eager_attention_forward``."""
    forward = inspect.unwrap(type(module).forward)  # a decorated forward: the function its class wrote
    scope = getattr(forward, "__globals__", None) or vars(sys.modules[type(module).__module__])
    named = [scope[name] for name in getattr(getattr(forward, "__code__", None), "co_names", ())
             if name.endswith("eager_attention_forward") and callable(scope.get(name))]
    function = named[0] if len(named) == 1 else scope.get("eager_attention_forward")
    if function is None:
        raise ValueError(f"{type(module).__name__}'s modelling file has no eager_attention_forward")
    return function


def _delegated_eager(module, *args, **kwargs):
    return _eager_of(module)(module, *args, **kwargs)


def recording_name(implementation: str) -> str:
    """The name the recording attention over ``implementation`` ("sdpa" or "eager") is registered under, registering
    it (and the implementation's mask function) the first time."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if implementation not in ("sdpa", "eager"):
        raise ValueError(f"the model's attention is {implementation!r}; it is recorded over sdpa or eager")
    name = f"{ROWS}_{implementation}"
    if name not in ALL_ATTENTION_FUNCTIONS:
        delegate = _delegated_eager if implementation == "eager" else ALL_ATTENTION_FUNCTIONS[implementation]
        AttentionInterface.register(name, _recording(delegate))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[implementation])
    return name


class SameBranch(str):
    """The recording attention's name that is also equal to the name of the implementation it wraps: a model whose
    attention code tests the name (MiniMax-M3's and Mistral Large 4's ``_attn_implementation in ("eager", "sdpa")``,
    their sparse top-k block mask built there alone) takes the branch it takes under that implementation, while
    transformers' registries (looked up by hash) still find the recording function and its mask function."""

    def __new__(cls, name: str, wrapped: str):
        named = super().__new__(cls, name)
        named.wrapped = wrapped
        return named

    def __eq__(self, other) -> bool:
        return str.__eq__(self, other) or other == self.wrapped

    def __ne__(self, other) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__


def route_attention(part: torch.nn.Module, same_branch: bool = False) -> None:
    """Point ``part``'s attention (a transformers model) at the recording function that wraps its own implementation
    (sdpa or eager). Registered once per implementation, under ``ROWS`` + its name; ``same_branch``: under a
    ``SameBranch`` name, for a model whose attention code tests the name."""
    current = part.config._attn_implementation
    if current.startswith(ROWS):
        return
    name = recording_name(current)
    part.set_attn_implementation(name)
    if same_branch:
        for config in {id(m.config): m.config for m in part.modules() if hasattr(m, "config")}.values():
            if getattr(config, "_attn_implementation_internal", None) == name:
                config._attn_implementation_internal = SameBranch(name, current)


@contextlib.contextmanager
def recording(part: torch.nn.Module, recorder, same_branch: bool = False):
    """Within it, each call of a module ``recorder.layers`` lists, in ``part`` (its attention routed through the
    recording function first: ``route_attention``), is handed to ``recorder`` (``keep`` before, ``output`` after), in
    this context only."""
    route_attention(part, same_branch)
    token = _RECORDING.set(recorder)
    try:
        yield recorder
    finally:
        _RECORDING.reset(token)


LAYER_KINDS = ("layer_type", "block_type")  # where a decoder layer states its kind (Qwen 3.5's, GLM-5 Next's)


def attention_of(layer: torch.nn.Module) -> torch.nn.Module | None:
    """A decoder layer's self-attention module: its ``self_attn``, else its token ``mixer`` where that module's
    forward asks transformers' attention interface for its function (Nemotron-H's hybrid blocks: a ``mixer`` that is
    attention in some layers, Mamba or an MLP in others); None for a layer that does not attend (one whose stated
    kind is linear attention, ``LAYER_KINDS``, though it names its mixer ``self_attn``)."""
    if any(getattr(layer, name, None) == "linear_attention" for name in LAYER_KINDS):
        return None  # its self_attn a recurrent state over the tokens (GLM-5 Next's linear layers), no attention
    attention = getattr(layer, "self_attn", None)
    if attention is not None:
        return attention
    mixer = getattr(layer, "mixer", None)
    if not isinstance(mixer, torch.nn.Module):
        return None
    import inspect

    try:
        code = inspect.getsource(type(mixer).forward)
    except (OSError, TypeError):
        return None
    return mixer if "ALL_ATTENTION_FUNCTIONS" in code else None
