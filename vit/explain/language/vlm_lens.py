"""The language model's side of a VLM's answer (issue 92, item 3): at which layer the answer's word is first read off
the residual stream (the logit lens), and what the image tokens of a region do to it (ablation), on transformers'
own model.

Both read answer token ``i`` at the query that predicted it (the prompt's last position for ``i = 0``, else answer
token ``i - 1``), from one forward of the whole model over the prompt and the answer's first ``i`` tokens
(``vlm_relevance.answer_run``: generate's inputs, extended as generate extends them):

- **logit lens** (nostalgebraist 2020; TransformerLens' ``accumulated_resid`` + ``apply_ln``): the residual stream
  the first decoder layer receives and each decoder layer's output, at the query, read through the model's own final
  norm and head (and its final soft cap, Gemma 2's and 3's), softmax over the vocabulary: the probability of the
  answer's token. The last entry is the model's own prediction. Only the query's row of each layer is kept
  (``L + 1`` rows of the hidden width), never a layer's ``T`` rows.
- **region ablation**: the language model's input embeddings at the image tokens that cover a box of patches (its
  units, tiles or crops, through the answer's layout) replaced by zeros (``how="zero"``) or by the mean over every
  image token of the view (``how="mean"``), at the decoder stack's input, after the projector has put the image's
  features there; the token's logit and probability with and without. Two forwards, no graph. A language model
  that reads the image through cross-attention layers (Llama 3.2 Vision) has the projected tower states those
  layers read ablated instead: the states of the box's patches, the mean over the canvas's patch states.
- **region patching** (activation patching, as TransformerLens' and nnsight's, here on the image): the same image
  tokens replaced by those a source image gives at the same places (the processor's run over the source, laid out
  as the asked image is, read up to the language model's input), the token's logit with and without. Three forwards
  (the source's stops at the language model), no graph.

What each holds is counted before it runs (``vit.costs.plan.vlm_lens``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vit.core.threads import this_thread_only

ABLATIONS = ("zero", "mean")


@dataclass(frozen=True)
class Ablation:
    """Answer token ``token``'s logit and probability at its query, with the image tokens of a region ablated and
    without; ``image_tokens`` of the prompt's were ablated."""

    token: int
    logit: float
    ablated_logit: float
    probability: float
    ablated_probability: float
    image_tokens: int

    @property
    def effect(self) -> float:
        """How much the ablation moved the token's logit (ablated - whole)."""
        return self.ablated_logit - self.logit


def final_norm(stack: torch.nn.Module, width: int | None = None) -> torch.nn.Module | None:
    """The norm the decoder stack's own forward applies after its last layer, found by what it is, not by its name
    (Llama's ``norm``, OPT's ``final_layer_norm``, Nemotron-H's ``norm_f``): the last of the stack's own children
    that is a norm (its class named ``...Norm``: a ``LayerNorm``, an RMS norm) over the stream's ``width`` (where
    given and the norm says its own) and not inside a layer (a layer's norms, Nemotron-H's gated norm in its Mamba
    mixer, are the layer's; Gemma 3n's ``per_layer_projection_norm``, declared after its ``norm``, is over its narrow
    per-layer inputs); None where it has none. A stack with a norm before its layers too (BLOOM's
    ``word_embeddings_layernorm``) keeps it first in its children, the final one last."""
    layers = getattr(stack, "layers", None)
    norms = [module for module in stack.children() if module is not layers
             and type(module).__name__.lower().endswith("norm")  # LayerNorm, RMSNorm, LlamaRMSNorm, ...
             and (width is None or _norm_width(module) in (None, width))]
    return norms[-1] if norms else None


def _norm_width(norm: torch.nn.Module) -> int | None:
    """The width a norm normalises (its weight's, else its ``normalized_shape``'s last), or None where it says none."""
    weight = getattr(norm, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() >= 1:
        return int(weight.shape[-1])
    shape = getattr(norm, "normalized_shape", None)
    return int(shape[-1]) if isinstance(shape, tuple | list) and shape else None


def _head(vlm):
    """The read-out of a hidden state as the model reads its last layer's: the language model's final norm
    (``final_norm``), then its projection out where it has one (OPT's ``project_out``). ValueError (one line)
    for a stack without one (``logit_lens`` checks the read-out against the model's own logits)."""
    text, stack = vlm.model.config.get_text_config(), vlm.language_model
    norm = final_norm(stack, getattr(text, "hidden_size", None))
    if norm is None:
        raise ValueError(f"the logit lens reads each layer's stream through the final norm and head, and this model's "
                         f"{type(stack).__name__} has no norm of its own after its layers: not drawn for it")
    out = getattr(stack, "project_out", None)
    read = norm if out is None else torch.nn.Sequential(norm, out)
    return read, output_head(vlm.model), getattr(text, "final_logit_softcapping", None)


def output_head(model: torch.nn.Module) -> torch.nn.Module:
    """The projection from the last hidden state to the logits: the model's own output embeddings, else its language
    model's, where the whole model holds the head inside it (Nemotron-H Omni's generating language model). ValueError
    (one line) for a model that names none."""
    head = model.get_output_embeddings()
    inner = getattr(model, "language_model", None) or getattr(getattr(model, "model", None), "language_model", None)
    if head is None and inner is not None and hasattr(inner, "get_output_embeddings"):
        head = inner.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} names no output head (get_output_embeddings): the hidden states "
                         "cannot be read as logits")
    return head


def _logits(vlm, rows: torch.Tensor) -> torch.Tensor:
    """(n, D) hidden states -> (n, V) float32 logits, as the model reads its last layer's."""
    norm, head, cap = _head(vlm)
    logits = head(norm(rows)).float()
    return torch.tanh(logits / cap) * cap if cap else logits


def check(vlm, prepared, i: int, lens: bool) -> None:
    """Refused in one line (``TooManyTokens``) over the memory limit (``vit.costs.plan.vlm_lens``)."""
    from vit.costs.plan import decide, vlm_lens

    rows = len(vlm.language_model.layers) + 1 if lens else 0
    views, view_grid = prepared.tower()
    decide(vlm_lens(vlm.tower_shape, prepared.layout.grid, prepared.text, prepared.prompt_tokens + i, rows,
                    views=views, view_grid=view_grid))


def logit_lens(vlm, prepared, answer: tuple[int, ...], i: int) -> torch.Tensor:
    """(L + 1,) float32: answer token ``i``'s probability read at its query from the stream the first decoder layer
    receives and from each of the ``L`` decoder layers' outputs (see the module's docstring)."""
    from vit.explain.language.vlm_relevance import answer_run

    check(vlm, prepared, i, lens=True)
    layers, rows = vlm.language_model.layers, {}

    def keep(n: int):
        def hook(module, args, kwargs, output=None):
            stream = output if output is not None else (args[0] if args else kwargs["hidden_states"])
            stream = stream[0] if isinstance(stream, tuple) else stream
            rows[n] = stream[0, -1].detach().clone()  # the query's row: the run ends at it
        return hook

    handles = [layers[0].register_forward_pre_hook(this_thread_only(keep(0)), with_kwargs=True)]
    handles += [layer.register_forward_hook(this_thread_only(keep(n + 1)), with_kwargs=True)
                for n, layer in enumerate(layers)]
    try:
        with torch.inference_mode(), answer_run(vlm, prepared, answer, i) as inputs:
            out = vlm.model(**inputs, use_cache=False, logits_to_keep=1)
            lens = _logits(vlm, torch.stack([rows[n] for n in range(len(layers) + 1)]))
    finally:
        for handle in handles:
            handle.remove()
    # the last layer read through the head is the model's own logits: a check that the read-out is the model's
    if not torch.allclose(lens[-1], out.logits[0, -1].float(), rtol=1e-4, atol=1e-4):
        raise ValueError("the logit lens reads each layer's stream through the final norm and head, and this "
                         "model's last layer read so is not its own logits (its stream is read out otherwise, as "
                         "Gemma 3n's AltUp streams are): not drawn for it")
    return lens.softmax(-1)[:, answer[i]].cpu()


def region_tokens(layout, box: tuple[int, int, int, int]) -> torch.Tensor:
    """The image tokens (indices into ``layout.positions``) that cover any patch of ``box`` = ``(top, left, bottom,
    right)`` on ``layout``'s patch grid (bottom and right excluded). ValueError (one line) for a box off the grid or
    empty."""
    gh, gw = layout.grid
    if (len(box) != 4 or any(isinstance(v, bool) or not isinstance(v, int) for v in box)
            or not (0 <= box[0] < box[2] <= gh and 0 <= box[1] < box[3] <= gw)):
        raise ValueError(f"box must be (top, left, bottom, right) whole patches with top < bottom <= {gh} and left < "
                         f"right <= {gw} on the {gh}x{gw} patch grid, got {tuple(box)}")
    index = layout.place(torch.arange(len(layout.positions), dtype=torch.float64)[None])[0]  # (gh, gw) token per patch
    top, left, bottom, right = box
    return torch.unique(index[top:bottom, left:right].round().long())


class _Stopped(Exception):
    """Raised by the hook that has read the language model's input: the rest of the model need not run."""


def _stream_input(vlm) -> str:
    """The language model's input the image reaches it through: its input embeddings, or (Llama 3.2 Vision) the
    projected tower states its cross-attention layers read."""
    from vit.explain.language.vlm_attention import cross_attending

    if not cross_attending(vlm.language_model):
        return "inputs_embeds"
    handed_states(vlm, "the image's tokens' ablation and patching")
    return "cross_attention_states"


def handed_states(vlm, what: str) -> None:
    """ValueError (one line) for ``what`` (a reading that changes the image's states before the language model
    reads them) asked of a model whose cross-attention layers read states its language model builds in its own
    forward, not handed to it (Idefics' ``IdeficsModel`` runs its tower itself): Llama 3.2 Vision's are handed as
    ``cross_attention_states``."""
    import inspect

    stack = vlm.language_model
    if "cross_attention_states" not in inspect.signature(stack.forward).parameters:
        raise ValueError(f"{what} changes the states a language model's cross-attention reads where they are handed "
                         f"to it, and this model's ({type(stack).__name__}) builds them in its own forward: ask its "
                         "attention or gradient x attention")


def source_states(vlm, prepared, source_inputs) -> torch.Tensor:
    """(1, T, D): the language model's input (``_stream_input``) that ``source_inputs`` (the processor's for a
    source image, laid out as ``prepared``'s) give, read from one run of the model up to the language model, which
    does not run. ValueError (one line) when the source's inputs are laid out otherwise than ``prepared``'s
    (``same_layout``)."""
    same_layout(prepared, source_inputs)
    name, kept = _stream_input(vlm), {}

    def read(module, args, kwargs):
        kept["states"] = kwargs.get(name)
        raise _Stopped

    handle = vlm.language_model.register_forward_pre_hook(this_thread_only(read), with_kwargs=True)
    try:
        with torch.inference_mode():
            vlm.model(**{k: v.to(vlm.device) if hasattr(v, "to") else v for k, v in source_inputs.items()},
                      use_cache=False)
    except _Stopped:
        pass
    finally:
        handle.remove()
    if kept.get("states") is None:
        raise ValueError(f"the language model is not handed its {name} (it embeds the prompt and the image's codes "
                         "itself: Chameleon's); the image's tokens cannot be patched there")
    return kept["states"].reshape(1, -1, kept["states"].shape[-1])


def same_layout(prepared, source_inputs) -> None:
    """ValueError (one line) when ``source_inputs`` (the processor's for a source image) are laid out otherwise than
    ``prepared``'s (another count of image tokens, another grid, tile canvas or mask): its tokens would not sit where
    the asked image's do."""
    base = prepared.inputs
    for key, value in base.items():
        other = source_inputs.get(key)
        if isinstance(value, torch.Tensor):  # the pixels differ; every other input is the layout and must not
            same = (isinstance(other, torch.Tensor) and other.shape == value.shape
                    and (key.startswith("pixel_values") or torch.equal(other, value)))
        else:
            same = other == value
        if not same:
            raise ValueError(f"the source image is laid out otherwise than the image asked about ({key} differs: "
                             "another count of image tokens, grid or tiles); give a source image of its size")


def ablate(vlm, prepared, answer: tuple[int, ...], i: int, tokens: torch.Tensor, how: str = "zero",
           layout=None, source: torch.Tensor | None = None) -> Ablation:
    """Answer token ``i``'s logit and probability with the image tokens ``tokens`` (indices into ``layout``'s
    positions: an image's, the prepared question's first by default) ablated at the decoder stack's input (``how``:
    "zero", or "mean" of that image's tokens), or patched (``source``: the language model's input a source image
    gives, ``source_states``: those tokens' states replaced by the source's), and without (see the module's
    docstring)."""
    from vit.explain.language.vlm_relevance import answer_run

    if source is None and how not in ABLATIONS:
        raise ValueError(f"how must be one of {', '.join(ABLATIONS)}, got {how!r}")
    check(vlm, prepared, i, lens=False)
    layout, token = layout or prepared.layout, answer[i]
    positions = layout.positions.to(vlm.device)
    chosen = positions[tokens.to(vlm.device)]
    # Llama 3.2 Vision's language model reads the tower's states through its cross-attention layers: those states are
    # its image's tokens, and their mean is over the canvas's patches (not the tiles' CLS, nor the masked padding)
    name = _stream_input(vlm)
    cross = name == "cross_attention_states"
    pool = positions[region_tokens(layout, (0, 0, *layout.grid)).to(vlm.device)] if cross else positions

    def ablated(module, args, kwargs):
        states = kwargs.get(name)
        if states is None:
            raise ValueError(f"the language model is not handed its {name} (it embeds the prompt and the image's "
                             "codes itself: Chameleon's); the image's tokens cannot be ablated there")
        # (one question: batch 1) Llama 3.2 Vision hands its states as (tiles, states a tile, D), read as one row
        flat = states.reshape(1, -1, states.shape[-1]).clone()
        if source is not None:
            flat[0, chosen] = source[0, chosen].to(flat)  # the prompt's image tokens: the same places in both runs
        else:
            flat[0, chosen] = 0 if how == "zero" else flat[0, pool].mean(0)
        return args, {**kwargs, name: flat.reshape(states.shape)}

    results = []
    with torch.inference_mode(), answer_run(vlm, prepared, answer, i) as inputs:
        for intervene in (False, True):
            handle = (vlm.language_model.register_forward_pre_hook(this_thread_only(ablated), with_kwargs=True)
                      if intervene else None)
            try:
                logits = vlm.model(**inputs, use_cache=False, logits_to_keep=1).logits[0, -1].float()
            finally:
                if handle is not None:
                    handle.remove()
            results.append((float(logits[token]), float(logits.softmax(-1)[token])))
    (logit, probability), (ablated_logit, ablated_probability) = results
    return Ablation(token, logit, ablated_logit, probability, ablated_probability, len(chosen))
