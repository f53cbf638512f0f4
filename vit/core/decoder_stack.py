"""Where a generating transformers model's answer is written and what its decoder reads the image through, found by
what the model has, not by its name (issue 113): its decoder's layers (``decoder_layers``: a ``ModuleList`` whose
layers attend) and, where the decoder reads another sequence (an encoder's image tokens, a tower's states, a
perceiver's latents), each layer's cross-attention module (``cross_module``: the one that asks transformers'
attention interface for its function, so the recording attention sees its calls). BART's and mBART's
``encoder_attn``, BERT's and GPT-2's ``crossattention``, T5's ``EncDecAttention``, Pix2Struct's
``encoder_decoder_attention``, Llama 3.2 Vision's and Idefics' ``cross_attn`` are all one reading: a submodule of the
layer under one of ``CROSS``'s names, down to the module that calls the interface.
"""

from __future__ import annotations

import inspect

import torch

# The names a decoder layer gives its attention to another sequence (the encoder's, the tower's, latents')
CROSS = ("cross_attn", "encoder_attn", "crossattention", "encoder_decoder_attention", "EncDecAttention")
# The names transformers gives a decoder stack's list of layers, in the order tried
LAYER_LISTS = ("layers", "layer", "block", "h")


def calls_interface(module: torch.nn.Module) -> bool:
    """Whether ``module``'s forward asks transformers' ``AttentionInterface`` for its attention function
    (``ALL_ATTENTION_FUNCTIONS`` in its code): the recording attention then sees its calls."""
    try:
        code = inspect.getsource(inspect.unwrap(type(module).forward))
    except (OSError, TypeError):
        return False
    return "ALL_ATTENTION_FUNCTIONS" in code


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
    return next((m for m in stack.modules() if isinstance(m, torch.nn.ModuleList) and len(m)
                 and all(cross_named(layer) is not None for layer in m)), None)


def cross_layers(stack: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The list of ``stack``'s layers that hold its cross-attention modules: its decoder layers where they hold them
    (Llama 3.2 Vision's, an encoder-decoder's), else another list of its own whose layers do (Idefics'
    ``gated_cross_attn_layers``, beside its self-attention layers); None where the stack reads no other sequence."""
    layers = decoder_layers(stack)
    if layers is not None and any(cross_named(layer) is not None for layer in layers):
        return layers
    return next((m for m in stack.modules() if isinstance(m, torch.nn.ModuleList) and len(m)
                 and all(cross_named(layer) is not None for layer in m)), None)


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
