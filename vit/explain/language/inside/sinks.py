"""Visual attention sinks in a VLM's answer maps (issue 115, item 3): the image tokens that draw a language model's
attention whatever is asked, found as Kang et al. find them ("See What You Are Told: Visual Attention Sink in Large
Multimodal Models", ICLR 2025; the authors' ``DimProspector`` in seilk/VisAttnSink, ``src/logic/logic.py``).

A token is a sink at layer ``l`` when its hidden state entering decoder layer ``l``, RMS-normalised without the
norm's weight (``x / sqrt(mean(x²) + 1e-6)``, float32), has an absolute value over ``tau`` (the authors' 20) in any
of the model's sink dimensions: the fixed dimensions where massive activations appear (Sun et al. 2024). The authors
list them for LLaMA-2 7B and 13B (LLaVA-1.5's language models: 2533 and 1415, 2100 and 4743); for another model give
``dims``, or they are found here (this project's rule, not the authors'): the ``DIMENSIONS`` dimensions whose largest
RMS-normalised magnitude over the prompt's tokens and the layers is largest. The hidden states are the prompt's (the
authors test the prefill's), from one forward of the model (two where the dimensions are found), each layer's
reduced as it runs: per token the largest value in the sink dimensions, never a layer's ``T x D`` kept.

``Sinks.removed`` gives the map "without the sinks": each head's attention over an image's tokens with the sinks'
share set to 0 and the other image tokens' scaled up to the image's whole share again (the authors' redistribution,
VAR, with ``p = 0`` and the image's own sinks' budget).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vit.core.threads import this_thread_only

TAU = 20.0  # the authors' threshold on the RMS-normalised hidden state (``LogicEngine.activate(tau=20)``)
EPS = 1e-6  # the authors' ``DimProspector.rmsnorm``
DIMENSIONS = 2  # sink dimensions found when none are given: the authors list two per model
MOST = 0.5  # a row whose image share sits more than this on sinks gets a caption note


def normalised(hidden: torch.Tensor) -> torch.Tensor:
    """(T, D) -> (T, D) float32: ``|x / sqrt(mean(x²) + eps)|``, the authors' RMS norm without its weight."""
    hidden = hidden.float()
    return (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + EPS)).abs()


@dataclass(frozen=True)
class Sinks:
    """The sink tokens of an answer's prompt: ``tokens[l]`` the positions whose hidden state entering the answer's
    layer ``l`` is over ``tau`` in a dimension of ``dims``."""

    dims: tuple[int, ...]
    tau: float
    tokens: tuple[tuple[int, ...], ...]

    def at(self, layer: int, positions: torch.Tensor) -> torch.Tensor:
        """(N,) bool: which of ``positions`` (an image's tokens) are sinks at ``layer``."""
        return torch.isin(positions, torch.tensor(self.tokens[layer], dtype=positions.dtype))

    def share(self, rows: torch.Tensor, layer: int, positions: torch.Tensor) -> float:
        """The share of the image's attention ``rows`` (H, N) over ``positions`` on its sinks at ``layer``, mean over
        the heads (0 where a head gives the image nothing)."""
        total = rows.sum(-1)
        sunk = rows[:, self.at(layer, positions)].sum(-1)
        return float(torch.where(total > 0, sunk / total.clamp(min=1e-30), 0).mean())

    def removed(self, rows: torch.Tensor, layer: int, positions: torch.Tensor) -> torch.Tensor:
        """(H, N): ``rows`` over ``positions`` without the sinks at ``layer``: their share 0, the other tokens' scaled
        to each head's whole share of the image. ValueError (one line) where every image token is a sink."""
        sink = self.at(layer, positions)
        if bool(sink.all()):
            raise ValueError(f"every image token is a sink at layer {layer}: there is no map without them")
        kept = rows.masked_fill(sink, 0)
        rest = kept.sum(-1, keepdim=True)
        return torch.where(rest > 0, kept * rows.sum(-1, keepdim=True) / rest.clamp(min=1e-30), kept)


def _prompt_states(answer, reduce) -> list:
    """``reduce(hidden (T, D))`` of the hidden state entering each of the answer's attention layers' decoder layers,
    over the prompt, from one forward of the model (counted first)."""
    from vit.explain.language.vlm_attention import attention_layers
    from vit.explain.language.vlm_lens import check

    vlm, prepared = answer._model()
    check(vlm, prepared, 0, lens=False)
    decoders = [n for n, _ in attention_layers(vlm.language_model)]
    kept: dict[int, object] = {}

    def keep(k: int):
        def hook(module, args, kwargs):
            stream = args[0] if args else kwargs["hidden_states"]
            if stream.dim() != 3:  # Gemma 3n's AltUp streams: (streams, B, T, D)
                raise ValueError(f"this model's decoder layers receive {stream.dim() - 1}-D streams, not one hidden "
                                 "state per token: its sinks are not found here")
            kept[k] = reduce(stream[0].detach())
        return hook

    handles = [vlm.language_model.layers[n].register_forward_pre_hook(this_thread_only(keep(k)), with_kwargs=True)
               for k, n in enumerate(decoders)]
    inputs = {k: v.to(vlm.device) if hasattr(v, "to") else v for k, v in prepared.inputs.items()}
    try:
        with torch.inference_mode():
            vlm.model(**inputs, use_cache=False, logits_to_keep=1)
    finally:
        for handle in handles:
            handle.remove()
    return [kept[k] for k in range(len(decoders))]


def find_sinks(answer, dims=None, tau: float = TAU) -> Sinks:
    """The sink tokens of ``answer``'s prompt at each of its layers (see the module's docstring); ``dims``: the sink
    dimensions (None: found), ``tau``: the threshold."""
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not tau > 0:
        raise ValueError(f"tau must be a positive number, got {tau!r}")
    width = answer._model()[0].model.config.get_text_config().hidden_size
    if dims is None:
        peaks = _prompt_states(answer, lambda hidden: normalised(hidden).amax(0).cpu())  # [layer] (D,)
        dims = tuple(sorted(torch.stack(peaks).amax(0).topk(min(DIMENSIONS, width)).indices.tolist()))
    else:
        dims = (dims,) if isinstance(dims, int) and not isinstance(dims, bool) else dims
        if not isinstance(dims, (list, tuple, range)) or not dims or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 <= d < width for d in dims):
            raise ValueError(f"dims must be the language model's hidden dimensions, ints from 0 to {width - 1}, got "
                             f"{str(dims)[:60]}")
        dims = tuple(dims)
    index = torch.tensor(dims)
    tokens = _prompt_states(answer, lambda hidden: tuple(
        torch.nonzero(normalised(hidden)[:, index.to(hidden.device)].amax(-1) > tau)[:, 0].tolist()))
    return Sinks(dims, float(tau), tuple(tokens))


def sink_note(answer, sinks: Sinks, i: int, layer: int = -1, image: int = 0) -> str | None:
    """A caption's line when most of answer token ``i``'s attention to ``image`` at ``layer`` (mean over heads) sits
    on its sink tokens there, else None."""
    layer = answer._layer(layer)
    positions = answer._image(image).positions
    share = sinks.share(answer.image_rows(i, layer, image), layer, positions)
    if share <= MOST:
        return None
    count = int(sinks.at(layer, positions).sum())
    return (f"{share:.0%} of this row's attention to the image sits on {count} visual sink token"
            f"{'s' if count != 1 else ''} (massive activations in dimensions {', '.join(map(str, sinks.dims))}): "
            "the map without the sinks shows where the rest went.")
