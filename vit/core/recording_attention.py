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
import functools
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
    query rows alone where the recorder asks some, ``rows x keys`` a head: ``attention_recorder.formed_rows``; every
    row, and the output from them, where it asks all or a gradient); over the eager function, that function once,
    its own probabilities kept. Each handed to ``recorder.keep_probabilities``; the call's own ``(output, weights)``
    returned."""
    if delegate is _delegated_eager:
        out = delegate(module, query, key, value, attention_mask, **kwargs)
        recorder.keep_probabilities(layer, out[1])
        return out
    rows = attention_recorder.formed_rows(recorder, layer, query.shape[-2])
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
    return mixer if isinstance(mixer, torch.nn.Module) and calls_interface(mixer) else None


# --- the decoder's layers and its cross-attention, found by what the model has (issue 113) -----------------------
# Where a generating transformers model's answer is written and what its decoder reads the image through, found by
# what the model has, not by its name (issue 113): its decoder's layers (``decoder_layers``: a ``ModuleList`` whose
# layers attend) and, where the decoder reads another sequence (an encoder's image tokens, a tower's states, a
# perceiver's latents), each layer's cross-attention module (``cross_module``: the one that asks transformers'
# attention interface for its function, so the recording attention sees its calls). BART's and mBART's
# ``encoder_attn``, BERT's and GPT-2's ``crossattention``, T5's ``EncDecAttention``, Pix2Struct's
# ``encoder_decoder_attention``, Llama 3.2 Vision's and Idefics' ``cross_attn`` are all one reading: a submodule of the
# layer under one of ``CROSS``'s names, down to the module that calls the interface.

# The names a decoder layer gives its attention to another sequence (the encoder's, the tower's, latents')
CROSS = ("cross_attn", "encoder_attn", "crossattention", "encoder_decoder_attention", "EncDecAttention")
# The names transformers gives a decoder stack's list of layers, in the order tried
LAYER_LISTS = ("layers", "layer", "block", "h")


@functools.lru_cache(maxsize=1024)
def _forward_source(cls: type) -> str:
    """The source of a module class's ``forward`` ("" where it cannot be read), read once per class: the scans below
    ask it of every module of a model, at every question."""
    try:
        return inspect.getsource(inspect.unwrap(cls.forward))
    except (OSError, TypeError):
        return ""


def calls_interface(module: torch.nn.Module) -> bool:
    """Whether ``module``'s forward asks transformers' ``AttentionInterface`` for its attention function
    (``ALL_ATTENTION_FUNCTIONS`` in its code): the recording attention then sees its calls."""
    return "ALL_ATTENTION_FUNCTIONS" in _forward_source(type(module))


def _interface_module(module: torch.nn.Module) -> torch.nn.Module | None:
    """``module`` or its first submodule whose forward calls the attention interface (BERT's ``crossattention``
    holds it as ``.self``, Pix2Struct's as ``.attention``); None where none does."""
    return next((m for m in module.modules() if calls_interface(m)), None)


def cross_named(layer: torch.nn.Module) -> torch.nn.Module | None:
    """The submodule of a decoder ``layer`` named as a cross-attention (``CROSS``), at any depth (T5's
    ``layer[1].EncDecAttention``), whatever it calls; None where it has none."""
    for name in CROSS:
        direct = getattr(layer, name, None)
        if isinstance(direct, torch.nn.Module):
            return direct
    return next((m for n, m in layer.named_modules() if n.rsplit(".", 1)[-1] in CROSS), None)


def cross_module(layer: torch.nn.Module) -> torch.nn.Module | None:
    """The module of a decoder ``layer``'s cross-attention that calls the attention interface (see the module's
    docstring); None where the layer has no cross-attention (or one that does not call the interface)."""
    named = cross_named(layer)
    return None if named is None else _interface_module(named)


def decoder_layers(stack: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The list of a decoder ``stack``'s layers: its ``layers`` (``layer``, T5's ``block``, GPT-2's ``h``), else the
    first ``ModuleList`` inside it whose every entry has a cross-attention (BERT's ``bert.encoder.layer`` under its
    language-model head); None where it has none."""
    for name in LAYER_LISTS:
        found = getattr(stack, name, None)
        if isinstance(found, torch.nn.ModuleList) and len(found):
            return found
    return _cross_list(stack)


def _cross_list(stack: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The first ``ModuleList`` inside ``stack`` whose every entry has a cross-attention (``cross_named``), or None."""
    return next((m for m in stack.modules() if isinstance(m, torch.nn.ModuleList) and len(m)
                 and all(cross_named(layer) is not None for layer in m)), None)


def cross_layers(stack: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The list of ``stack``'s layers that hold its cross-attention modules: its decoder layers where they hold them
    (Llama 3.2 Vision's, an encoder-decoder's), else another list of its own whose layers do (Idefics'
    ``gated_cross_attn_layers``, beside its self-attention layers); None where the stack reads no other sequence."""
    layers = decoder_layers(stack)
    if layers is not None and any(cross_named(layer) is not None for layer in layers):
        return layers
    return _cross_list(stack)


def computes_softmax(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an attention module (its class so named) whose forward computes its softmax itself, not
    through transformers' attention interface (GIT's ``GitSelfAttention``, BLIP's ``BlipTextSelfAttention``): the
    recorder at the attention function (``vit.core.attention_recorder.AttentionRecording``) sees its probabilities."""
    if "Attention" not in type(module).__name__:
        return False
    code = _forward_source(type(module))
    return "softmax" in code.lower() and "ALL_ATTENTION_FUNCTIONS" not in code


def inline_attention(module: torch.nn.Module | None, skip: torch.nn.Module | None = None) -> torch.nn.Module | None:
    """``module`` or its first submodule (outside ``skip``: a layer's cross-attention, when its self-attention is
    asked) that computes its softmax itself (``computes_softmax``); None where none does."""
    if module is None:
        return None
    skipped = set() if skip is None else set(skip.modules())
    return next((m for m in module.modules() if m not in skipped and computes_softmax(m)), None)


# The parts of a VLM that are its tower, not its language model
TOWER_PARTS = ("vision", "image", "visual")


def inline_stack(model: torch.nn.Module) -> torch.nn.Module | None:
    """The text stack of ``model`` (outside its tower's parts) whose every layer holds an attention that computes its
    softmax itself (``inline_attention``): GIT's ``git.encoder``, BLIP's ``text_decoder.bert.encoder``; None where
    there is none."""
    for name, module in model.named_modules():
        if any(part in name for part in TOWER_PARTS):
            continue
        layers = next((getattr(module, n) for n in LAYER_LISTS
                       if isinstance(getattr(module, n, None), torch.nn.ModuleList)), None)
        if layers is not None and len(layers) and all(inline_attention(layer) is not None for layer in layers):
            return module
    return None


def decoder_of(model: torch.nn.Module) -> torch.nn.Module | None:
    """The decoder stack of an encoder-decoder ``model`` (``config.is_encoder_decoder``: an encoder reads the image,
    or the image and the prompt, a decoder writes the answer over the encoder's states): the model ``get_decoder``
    names, its own base model where that holds the layers (BERT's under its language-model head), as long as its
    layers cross-attend; None otherwise."""
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False) or not hasattr(model, "get_decoder"):
        return None
    decoder = model.get_decoder()
    seen = set()
    while isinstance(decoder, torch.nn.Module) and id(decoder) not in seen:
        seen.add(id(decoder))
        if cross_layers(decoder) is not None and hasattr(decoder, "config"):
            return decoder
        inner = getattr(decoder, "get_decoder", None)
        decoder = inner() if callable(inner) else None
    return None

