"""Activation patching inside a VLM's language model at a layer (issue 115, item 1), as TransformerLens's
``run_with_hooks`` does it: a source image's run caches an activation at chosen positions, and the asked image's run
has it replaced there by the cached one; answer token ``i``'s logit and probability at its query with and without.

Where (``at``):

- ``"residual"``: the residual stream after decoder layer ``layer`` (TransformerLens's
  ``blocks.{layer}.hook_resid_post``): the decoder layer's output hidden states.
- ``"attention"``: the layer's attention output per head before its output projection (``blocks.{layer}.attn.hook_z``),
  ``head`` alone or every head (then the same as patching the projected attention output, ``hook_attn_out``): the
  input of the attention module's ``o_proj``.

``layer`` numbers the language model's attention layers as the answer's maps do (``vlm_attention.attention_layers``).
Each run is one forward of the whole model over the prompt and the answer's first ``i`` tokens
(``vlm_relevance.answer_run``), the source's with the source image through the processor and the same question and
answer tokens, laid out as the asked image is (``vlm_lens.same_layout``). Three forwards, no graph, counted first.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from vit.core.threads import this_thread_only

SITES = ("residual", "attention")


def _site(vlm, layer: int, at: str) -> tuple[torch.nn.Module, bool]:
    """``(module, pre)``: the module whose output (``pre``: whose first input) is the activation ``at`` ``layer``."""
    from vit.explain.language.vlm_attention import attention_layers

    decoder, attention = attention_layers(vlm.language_model)[layer]
    if at == "residual":
        return vlm.language_model.layers[decoder], False
    projection = getattr(attention, "o_proj", None)
    if not isinstance(projection, torch.nn.Module):
        raise ValueError(f"layer {layer}'s attention ({type(attention).__name__}) has no o_proj to read its heads' "
                         "outputs at; patch the residual stream instead")
    return projection, True


def _stream(value):
    """The hidden states (1, T, D) a site's output (or input) holds; ValueError (one line) for several streams."""
    stream = value[0] if isinstance(value, tuple) else value
    if stream.dim() != 3:  # Gemma 3n's AltUp: (streams, B, T, D)
        raise ValueError(f"this model's decoder layers hand on {stream.dim() - 1}-D streams, not one residual "
                         "stream: patch at='attention' instead")
    return stream


def patch_layer(answer, i: int, positions: torch.Tensor, source_inputs, layer: int, head: int | None = None,
                at: str = "residual"):
    """``vit.explain.language.vlm_lens.Ablation``: answer token ``i``'s logit and probability at its query with the
    activation ``at`` ``layer`` (``head``'s slice of it) at ``positions`` (sequence positions) replaced by the run of
    ``source_inputs``' (its ``ablated_*``), and without (see the module's docstring); ``image_tokens``: how many
    positions were patched."""
    from vit.explain.language.vlm_lens import Ablation, check, same_layout
    from vit.explain.language.vlm_relevance import answer_run

    vlm, prepared = answer._model()
    if at not in SITES:
        raise ValueError(f"at must be one of {', '.join(SITES)}, got {at!r}")
    if head is not None:
        if at != "attention":
            raise ValueError("a head is patched in its attention output: give at='attention' with head=")
        if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < answer.heads:
            raise ValueError(f"head {head} does not exist: the language model has {answer.heads} heads, numbered 0 "
                             f"to {answer.heads - 1}")
    layer = answer._layer(layer)
    module, pre = _site(vlm, layer, at)
    same_layout(prepared, source_inputs)
    check(vlm, prepared, i, lens=False)
    token, where = answer.tokens[i], positions.to(vlm.device)
    width = None if head is None else module.in_features // answer.heads  # each head's slice of the o_proj input
    columns = slice(None) if head is None else slice(head * width, (head + 1) * width)
    cached: dict[str, torch.Tensor] = {}

    def reading(value):
        cached["source"] = _stream(value)[0][where][:, columns].clone()  # (positions, D or d)

    def patched(value):
        stream = _stream(value).clone()
        stream[0, where, columns] = cached["source"].to(stream)
        return (stream, *value[1:]) if isinstance(value, tuple) else stream

    def hooked(run_inputs, edit) -> torch.Tensor:
        """The model's logits at the query over ``run_inputs`` with ``edit`` (None: none) at the site."""
        handle = None
        if edit is not None and pre:
            def before(module, args):
                edited = edit(args[0])
                return None if edited is None else (edited, *args[1:])
            handle = module.register_forward_pre_hook(this_thread_only(before))
        elif edit is not None:
            handle = module.register_forward_hook(this_thread_only(lambda m, args, output: edit(output)))
        try:
            return vlm.model(**run_inputs, use_cache=False, logits_to_keep=1).logits[0, -1].float()
        finally:
            if handle is not None:
                handle.remove()

    with torch.inference_mode():
        with answer_run(vlm, replace(prepared, inputs=source_inputs), answer.tokens, i) as inputs:
            hooked(inputs, reading)
        with answer_run(vlm, prepared, answer.tokens, i) as inputs:
            clean, patched_logits = hooked(inputs, None), hooked(inputs, patched)
    return Ablation(token, float(clean[token]), float(patched_logits[token]), float(clean.softmax(-1)[token]),
                    float(patched_logits.softmax(-1)[token]), len(positions))
