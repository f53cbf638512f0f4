"""Gradient x attention of a VLM's answer token over the image tokens, through the language model (Chefer et al.
2021b, "Generic Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder Transformers", ICCV; the
rule of ``interpret`` in hila-chefer/Transformer-MM-Explainability, commit 58eaea8, ``CLIP_explainability.ipynb``).

The target is ``y``, the logit of answer token ``i`` at the query that predicted it (the prompt's last token for
``i = 0``, else answer token ``i - 1``), from one forward of the model over the prompt and the answer's first ``i``
tokens. For layer ``l`` with attention ``A_l`` (H, T, T) the rule's map is ``Ā_l = mean_h (dy/dA_l ⊙ A_l)^+``.
``layer=l`` gives ``Ā_l``'s query row; ``layer=None`` the rule's rollout ``R = I; R ← R + Ā_l R`` over the layers in
order, whose query row is ``e_q^T (I + Ā_{L-1}) ... (I + Ā_0)``: computed from the last layer down as a row vector
``v ← v + v Ā_l``, ``Ā_l`` a chunk of rows at a time, so no ``T x T`` matrix is ever held. The image tokens' entries
are placed on the tower's patch grid through the answer's layout (``VLMAnswer.attention``'s).

``dy/dA`` is not asked of autograd through the attention probabilities (that needs the eager attention, every layer's
``H x T x T`` kept for the backward): the attention output is ``O_h = A_h V_h`` and ``A`` reaches ``y`` through it
alone, so ``dy/dA_h[r, k] = dy/dO_h[r] · V_h[k]``. The model runs on its own attention (sdpa); each layer's queries,
keys and values and its output are kept by the recording attention (``vlm_attention.ROWS``), ``dy/dO_l`` comes from one
backward, and ``A_l``'s rows are formed again from the queries and keys as the eager attention forms them. The graph
starts at the first language-model layer's attention output: the tower, the projector and the embeddings run without
one. What it holds is counted first (``vit.costs.plan.vlm_relevance``).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from vit.core.threads import this_thread_only
from vit.costs.plan import ROW_CHUNK_BYTES


class _Tape:
    """What the recording attention keeps of the relevance's forward, per layer: the queries (H, T, d), the keys and
    values (Hkv, T, d), the mask (the model's own tensor, shared by the layers of a kind), the scaling and soft cap,
    and the attention output in the graph (B, T, H, d)."""

    def __init__(self, layers: dict[torch.nn.Module, int], cross: bool = False) -> None:
        self.layers, self.cross = layers, cross  # cross: the layers attend to another sequence (no causal mask)
        n = len(layers)
        self.queries, self.keys, self.values = [None] * n, [None] * n, [None] * n
        self.masks, self.scaling, self.softcap, self.outputs = [None] * n, [1.0] * n, [None] * n, [None] * n

    def keep(self, layer: int, query, key, value, attention_mask, kwargs: dict) -> None:
        self.queries[layer] = query[0].detach().float()
        self.keys[layer], self.values[layer] = key[0].detach().float(), value[0].detach().float()
        self.masks[layer] = None if attention_mask is None else attention_mask[0]  # (1 or H, q, keys)
        scaling = kwargs.get("scaling")
        self.scaling[layer] = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
        self.softcap[layer] = kwargs.get("softcap")
        # The graph starts here: the tower, the projector and the layers' inputs before it ran without one
        torch.set_grad_enabled(True)

    def output(self, layer: int, output: torch.Tensor) -> None:
        if not output.requires_grad:  # the first layer's: nothing before it is in the graph
            output.requires_grad_(True)
        self.outputs[layer] = output

    def rows(self, layer: int, gradient: torch.Tensor, rows: slice) -> torch.Tensor:
        """(r, T): ``mean_h (dy/dA ⊙ A)^+`` of ``rows`` at ``layer``; ``gradient`` is dy/dO (T, H, d)."""
        q, k, v = self.queries[layer][:, rows], self.keys[layer], self.values[layer]  # (H, r, d), (Hkv, T, d)
        groups = q.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)  # (H, T, d)
        scores = torch.einsum("hrd,htd->hrt", q, k) * self.scaling[layer]  # (H, r, T)
        if self.softcap[layer] is not None:
            scores = torch.tanh(scores / self.softcap[layer]) * self.softcap[layer]
        mask = self.masks[layer]
        t = k.shape[1]
        if mask is None and self.cross:  # a cross-attention over every key (the encoder's, unmasked)
            mask = torch.zeros(1, t)
        elif mask is None:  # sdpa's causal attention, no mask tensor
            index = torch.arange(t)
            mask = index[None, :] <= index[rows, None]  # (r, T)
        else:  # a mask of one row (a cross-attention's, for every query) serves them all; of one head, every head
            mask = (mask[:, rows, :t] if mask.shape[1] > 1 else mask[:, :, :t]).cpu()  # (1 or H, r, T)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.float()
        attention = scores.softmax(dim=-1)  # (H, r, T)
        grad = torch.einsum("rhd,htd->hrt", gradient[rows].float(), v)  # dy/dA = dy/dO · V
        return (grad * attention).clamp(min=0).mean(0)


def _inputs(vlm, prepared, tokens: tuple[int, ...], i: int) -> dict:
    """The processor's inputs with the answer's first ``i`` tokens appended, the rest extended as ``generate`` extends
    them, one step at a time by the model's own rule (``_update_model_kwargs_for_generation``): the attention mask
    with ones, ``token_type_ids`` with its last value (Gemma 3's text) or PaliGemma's 1 (the answer is the causal
    suffix of its prefix-LM, not part of the bidirectional prefix), ``mm_token_type_ids`` with zeros."""
    inputs = dict(prepared.inputs)  # without PaliGemma's processor's labels (``vlm_answer.prompt_inputs``)
    if getattr(vlm.model.config, "is_encoder_decoder", False):  # Florence-2: the answer is the decoder's input
        from vit.explain.language.vlm_read_layout import decoder_prompt

        prompt = decoder_prompt(vlm, inputs)  # its start token, and the question where it is the decoder's prompt
        inputs["decoder_input_ids"] = torch.cat([prompt, torch.tensor([tokens[:i]], dtype=prompt.dtype)], dim=-1)
        if "decoder_attention_mask" in inputs:
            inputs["decoder_attention_mask"] = torch.ones_like(inputs["decoder_input_ids"])
        return inputs
    inputs = extended(vlm, inputs, i)
    if i:
        new = torch.tensor([tokens[:i]], dtype=inputs["input_ids"].dtype)
        inputs["input_ids"] = torch.cat([inputs["input_ids"], new], dim=-1)
    return inputs


def extended(vlm, inputs: dict, n: int) -> dict:
    """``inputs`` (a decoder-only model's) with every per-token input but ``input_ids`` extended by ``n`` answer
    tokens as ``generate`` extends them, one step at a time by the model's own rule
    (``_update_model_kwargs_for_generation``): the attention mask, the token types, Llama 3.2 Vision's
    cross-attention mask (its last row repeated)."""
    for _ in range(n):
        inputs = vlm.model._update_model_kwargs_for_generation({}, inputs, is_encoder_decoder=False,
                                                               num_new_tokens=1)  # Mllama's asks it by name
    return inputs


def _stand_in(config) -> int:
    """A token id the model's forward reads as no marker: none of its config's ``*_token_id`` / ``*_token_index``
    (image, video, vision start, ...)."""
    marked = {value for c in (config, config.get_text_config()) for name, value in vars(c).items()
              if name.endswith(("token_id", "token_index")) and isinstance(value, int)}
    return min(set(range(len(marked) + 1)) - marked)


@contextmanager
def answer_run(vlm, prepared, answer: tuple[int, ...], i: int):
    """The inputs of the model's run over the prompt and the ``answer``'s first ``i`` tokens (``_inputs``, on the
    model's device), in a context where an answer token of the image placeholder's id is read as ``generate`` read
    it: a word, its row of the embedding table. The image's tokens are the prompt's alone; transformers' model takes
    every placeholder id in ``input_ids`` for one (and refuses the count), so there the answer's hold a stand-in id
    that marks nothing (``_stand_in``), and the embedding's output at those positions is the placeholder's row again."""
    from vit.explain.language.vlm_attention import image_token_id

    inputs = {k: v.to(vlm.device) if hasattr(v, "to") else v for k, v in _inputs(vlm, prepared, answer, i).items()}
    if "input_ids" not in inputs:  # an encoder that reads the image alone: the answer is the decoder's
        yield inputs
        return
    ids, image = inputs["input_ids"], image_token_id(vlm.model.config)
    said = torch.zeros_like(ids, dtype=torch.bool)  # (1, T) the answer's placeholder ids
    said[:, prepared.prompt_tokens:] = ids[:, prepared.prompt_tokens:] == image
    if not said.any():
        yield inputs
        return
    inputs["input_ids"] = ids.masked_fill(said, _stand_in(vlm.model.config))

    def as_generated(module, args, output):  # the embedding's own forward (Gemma's scale too) of the answer's ids
        if not args or args[0].shape != said.shape:
            return None
        return module.forward(args[0].masked_fill(said, image))

    handle = vlm.model.get_input_embeddings().register_forward_hook(this_thread_only(as_generated))
    try:
        yield inputs
    finally:
        handle.remove()


def check(vlm, prepared, i: int) -> None:
    """Refused in one line (``TooManyTokens``) when answer token ``i``'s relevance would hold more than the memory
    limit (``vit.costs.plan.vlm_relevance``); the last answer token's is the largest."""
    from vit.costs.plan import decide, vlm_relevance

    implementation = vlm.language_model.config._attn_implementation
    views, view_grid = prepared.tower()
    decide(vlm_relevance(vlm.tower_shape, prepared.layout.grid, prepared.text, prepared.prompt_tokens + i, i,
                         fused="eager" not in implementation, views=views, view_grid=view_grid))


def relevances(vlm, prepared, answer: tuple[int, ...], i: int, layers, recording) -> torch.Tensor:
    """(len(layers), T) float32 over the ``T`` positions of the prompt and the ``answer``'s first ``i`` tokens: answer
    token ``i``'s gradient x attention row for each of ``layers`` (an int: that layer's; None: rolled out over every
    layer; see the module's docstring), from one forward and backward of the model, counted first (``check``).
    ``recording(vlm, tape)``: the context in which the model's attention hands each layer's call to the tape
    (``vlm_attention.recording``)."""
    check(vlm, prepared, i)
    tokens = prepared.prompt_tokens + i
    from vit.explain.language.vlm_attention import attention_layers

    if None in layers:
        check_rollout(vlm)
    from vit.explain.language.vlm_attention import cross_attending

    tape = _Tape({module: k for k, (_, module) in enumerate(attention_layers(vlm.language_model))},
                 cross_attending(vlm.language_model))
    with recording(vlm, tape), torch.no_grad(), answer_run(vlm, prepared, answer, i) as inputs:
        # the tape switches the graph on at the first language-model layer
        out = vlm.model(**inputs, use_cache=False, logits_to_keep=1)
        target = out.logits[0, -1, answer[i]]
        wanted = list(range(len(tape.outputs))) if None in layers else sorted(set(layers))
        gradients = torch.autograd.grad(target, [tape.outputs[n] for n in wanted])
    gradients = dict(zip(wanted, (g[0].detach().cpu() for g in gradients), strict=True))  # (T, H, d) each
    for n in range(len(tape.queries)):
        tape.outputs[n] = None  # the graph goes with them
        for kept in (tape.queries, tape.keys, tape.values):
            kept[n] = kept[n].cpu()
    # the query that predicted token i: the sequence's, or an encoder-decoder's decoder row after its start token
    q = tokens - 1 if not getattr(vlm.model.config, "is_encoder_decoder", False) else \
        inputs["decoder_input_ids"].shape[-1] - 1
    return torch.stack([_rollout(tape, gradients, q, tokens) if layer is None
                        else tape.rows(layer, gradients[layer], slice(q, q + 1))[0] for layer in layers])  # (n, T)


def check_rollout(vlm) -> None:
    """ValueError (one line) for a hybrid language model (``vlm_attention.linear_layers``): the rollout multiplies
    every layer's attention, and its linear-attention layers have none."""
    from vit.explain.language.vlm_attention import linear_layers

    linear = linear_layers(vlm.language_model)
    if linear:
        raise ValueError(f"the rollout multiplies every layer's attention, and this language model's "
                         f"{', '.join(linear)} layers mix the tokens by a recurrent state, not an attention; ask one "
                         "layer's gradient x attention")


def _rollout(tape: _Tape, gradients: dict, q: int, tokens: int) -> torch.Tensor:
    """(T,): query ``q``'s row of the rule's rollout over every layer, ``v <- v (I + Ā_n)`` the last layer first, in
    chunks of rows."""
    heads = tape.queries[0].shape[0]
    chunk = max(1, ROW_CHUNK_BYTES // (4 * heads * tokens))
    values = torch.zeros(tokens)
    values[q] = 1.0
    for n in reversed(range(len(tape.queries))):
        spread = torch.zeros(tokens)
        for start in range(0, tokens, chunk):
            rows = slice(start, min(tokens, start + chunk))
            if values[rows].any():
                spread += values[rows] @ tape.rows(n, gradients[n], rows)
        values = values + spread
    return values
