"""The mechanism (the explorer's Mechanism and Features sections): logit lens and head attribution, ablation,
activation patching, test-time registers, attention sinks, TextSpan, SAE features.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vit.api.arguments import (
    ImageLike,
    checked_index,
    input_size,
    needs_classifier,
    needs_port,
    pil_image,
    target_class,
)
from vit.checkpoint import Checkpoint
from vit.core.inference import InputSize
from vit.costs import fits
from vit.explain.mechanism import sink_diagnostics
from vit.explain.mechanism.components import check_ablation
from vit.explain.views import (
    image_analysis,
    mechanism_views,
)


def mechanism(checkpoint: Checkpoint, image: ImageLike, target: int | str | None = None,
              size: int | InputSize | None = None) -> mechanism_views.MechanismView:
    """Logit lens (each layer's patches read through the classifier), direct logit attribution of every head and
    MLP to ``target`` (default the predicted class), token norms, massive activations and attention sinks. Needs a
    classifier."""
    needs_port(checkpoint, "vit.mechanism")
    needs_classifier(checkpoint, "vit.mechanism")
    return mechanism_views.mechanism_view(checkpoint, pil_image(image), target_class(checkpoint, target),
                                          input_size(size))


def reference_means(checkpoint: Checkpoint, references: Sequence[ImageLike], image: ImageLike,
                    size: int | InputSize | None = None) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Each head's output averaged over ``references`` at every token position of ``image``'s input at ``size``,
    ``(layers, tokens, heads, head_dim)`` (a model with stages, Swin or Hiera: one ``(tokens, heads, head_dim)`` per
    layer, on its own grid with its stage's heads): what ``mode="mean"`` of ``ablate`` and ``head_effects`` puts in
    place of an ablated head (the references are resized to ``image``'s input shape)."""
    needs_port(checkpoint, "vit.reference_means")
    return mechanism_views.reference_means(checkpoint, (pil_image(r) for r in references), pil_image(image),
                                           input_size(size))


def head_effects(checkpoint: Checkpoint, image: ImageLike, target: int | str | None = None, mode: str = "zero",
                 size: int | InputSize | None = None, *, means: torch.Tensor | None = None) -> np.ndarray:
    """``(layers, heads)``: how much ``target``'s logit (default the predicted class) changes when each head alone
    is ablated (one pass per layer): ``mode`` "zero", or "mean" with ``means`` from ``reference_means`` for this
    image at this ``size``. With stages ``heads`` is the most of any layer, NaN where a layer has fewer."""
    needs_port(checkpoint, "vit.head_effects")
    needs_classifier(checkpoint, "vit.head_effects")
    check_ablation(checkpoint.model, mode, means)
    index = target_class(checkpoint, target)
    image, size = pil_image(image), input_size(size)
    if index is None:
        index = image_analysis.analyse(checkpoint, image, size).prediction.class_index
    return mechanism_views.ablation_effects(checkpoint, image, index, mode, means, size)


def _heads(checkpoint: Checkpoint, heads: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(layer, head)`` pairs checked and counted from 0 (negative ones from the end); each layer has its own
    heads (a stage's, in a model with stages)."""
    blocks = checkpoint.model.blocks
    L, pairs = len(blocks), []
    for pair in heads:
        if not isinstance(pair, Sequence) or len(pair) != 2:
            raise ValueError(f"heads must be (layer, head) pairs, e.g. [(0, 1)]; got {pair!r} among them")
        layer = checked_index(pair[0], L, "layer", f"this model has {L} layers")
        H = blocks[layer].attn.num_heads
        has = (f"layer {layer} has {H} heads (its stage's)" if checkpoint.model.config.stage_depths
               else f"this model has {H} heads per layer")
        pairs.append((layer, checked_index(pair[1], H, "head", has)))
    return pairs


def ablate(checkpoint: Checkpoint, heads: Sequence[tuple[int, int]], mode: str = "zero", *,
           means: torch.Tensor | None = None) -> Checkpoint:
    """A copy of ``checkpoint`` whose ``heads`` ((layer, head) pairs) are ablated in the weights: zeroed, or with
    ``mode="mean"`` replaced by their mean output ``means`` from ``reference_means`` (per token position, so the
    copy runs at that input size only). Everything above (``explain``, ``predict``) then runs without them."""
    needs_port(checkpoint, "vit.ablate")
    pairs = _heads(checkpoint, heads)
    check_ablation(checkpoint.model, mode, means)
    return mechanism_views.ablated_checkpoint(checkpoint, pairs, mode, means)


def patching(checkpoint: Checkpoint, clean: ImageLike, corrupted: ImageLike, residual: bool = False,
             size: int | InputSize | None = None) -> mechanism_views.PatchingView:
    """Activation patching of ``clean``'s head outputs (and with ``residual`` each layer's input at each token)
    into ``corrupted``: the share of the logit difference between their predicted classes each recovers."""
    needs_port(checkpoint, "vit.patching")
    needs_classifier(checkpoint, "vit.patching")
    return mechanism_views.patching_view(checkpoint, pil_image(clean), pil_image(corrupted), input_size(size), residual)


def registers(checkpoint: Checkpoint, image: ImageLike, references: Sequence[ImageLike], threshold: float,
              top_k: int = 10, size: int | InputSize | None = None) -> mechanism_views.RegisterView:
    """Test-time registers (Jiang et al. 2025): the register neurons found on ``references`` and ``image`` (tokens
    whose last-layer norm is over ``threshold``), and the last layer's CLS attention and patch norms before and
    after one register is added to ``image``."""
    needs_port(checkpoint, "vit.registers")
    return mechanism_views.registers_view(checkpoint, pil_image(image), [pil_image(r) for r in references], threshold,
                                          top_k, input_size(size))



def sinks(checkpoint: Checkpoint, image: ImageLike, size: int | InputSize | None = None
          ) -> sink_diagnostics.SinkTable:
    """Sink diagnostics (Kempner Institute 2026) of every layer and head: the key all queries attend to, its value
    norm after the output projection, the stable rank of the head's update, and the verdict (not a sink, NOP sink,
    broadcast sink, other sink); ``.rows()`` gives one row per layer and head. Any model but one with stages."""
    needs_port(checkpoint, "vit.sinks")
    return sink_diagnostics.sink_table(checkpoint, pil_image(image), input_size(size))

# -- TextSpan (the explorer's Mechanism section) ---------------------------------------------------------------------

@dataclass
class TextSpan:
    """A CLIP's late heads described by texts (Gandelsman et al. 2024): ``heads``, one ``HeadSpan`` per head
    (``layer``, ``head``, ``texts`` best first, ``variance_explained`` after each), over ``images`` images;
    ``map(image, layer, head)`` the head's map of an image along one of its texts."""

    checkpoint: Checkpoint
    heads: list
    features: dict[str, torch.Tensor]  # each chosen text's embedding
    images: int

    def head(self, layer: int | str, head: int):
        """The ``HeadSpan`` of ``head`` of ``layer`` (counted from 0; negative from the end); a SigLIP's: ``layer``
        ``"probe"``, its attention-pooling probe."""
        if self.heads[0].probe or layer == "probe":
            if layer != "probe":
                raise ValueError("this model's described heads are its pooling probe's: ask for layer='probe'")
            H = len(self.heads)
            return self.heads[checked_index(head, H, "head", f"the probe has {H} heads")]
        layer, head = _heads(self.checkpoint, [(layer, head)])[0]
        for span in self.heads:
            if (span.layer, span.head) == (layer, head):
                return span
        described = sorted({s.layer for s in self.heads})
        raise ValueError(f"layer {layer} was not described; these were: {', '.join(map(str, described))}")

    def map(self, image: ImageLike, layer: int | str, head: int, text: str | None = None,
            size: int | InputSize | None = None) -> np.ndarray:
        """``(gh, gw)``: what the head writes into ``image``'s embedding from each patch along ``text``'s embedding
        (one of its texts; default its first)."""
        from vit.explain.mechanism import textspan_run as spans

        span = self.head(layer, head)
        text = span.texts[0] if text is None else text
        if text not in span.texts:
            raise ValueError(f"{text!r} is not one of head {span.label}'s texts (layer.head from 1): "
                             f"{'; '.join(span.texts)}")
        return spans.head_map(self.checkpoint, pil_image(image), span.layer, span.head, self.features[text],
                              input_size(size))

    def __str__(self) -> str:
        return "\n".join(f"{s.label} ({s.variance_explained[-1]:.0%}): {'; '.join(s.texts)}" for s in self.heads)


def textspan(checkpoint: Checkpoint, images: Sequence[ImageLike] | str | os.PathLike, texts: Sequence[str] | str |
             os.PathLike | None = None, layers: int = 8, texts_per_head: int = 10, rank: int | None = None
             ) -> TextSpan:
    """TextSpan (Gandelsman, Efros & Steinhardt 2024; yossigandelsman/clip_text_span): each head of a CLIP's last
    ``layers`` layers described by the ``texts_per_head`` texts (of ``texts``: a list, a file with one a line, or by
    default the authors' 3,497 general image descriptions; each no longer than a text tower reads, 2,464 characters)
    that best span its outputs over ``images`` (a list or a folder; the authors use ImageNet's validation set), each
    at the model's own size. ``rank``: the span the texts
    are projected on (their ``--w_ov_rank``; default theirs, 80). A SigLIP's (any model read by an attention-pooling
    probe): the probe's heads, as the authors' compute_siglip.py (``layer="probe"``; rank default the width). Raises
    ``MechanismError`` / ``TextTowerError`` in one line where it does not apply (a classifier, no text tower)."""
    from vit.explain.mechanism import textspan_run as spans
    from vit.explain.mechanism.textspan import read_texts
    from vit.sources.vlm.text_tower import open_text_tower

    needs_port(checkpoint, "vit.textspan")
    spans.check_model(checkpoint)
    tower = open_text_tower(checkpoint)
    if isinstance(images, (str, os.PathLike)):
        from vit.training.specs import image_files

        files = image_files(Path(images)) if Path(images).is_dir() else []
        if not files:
            raise ValueError(f"{images} is not a folder of images; give one, or a list of images")
        images = files
    images = list(images)
    bank = read_texts(texts) if texts is None or isinstance(texts, (str, os.PathLike)) else [
        t.strip() for t in texts if t.strip()]
    if not bank:
        raise ValueError("no texts to describe the heads with; give a list, a file with one text a line, or None")
    described, kept = spans.run(checkpoint, tower.encode, (pil_image(i) for i in images), len(images), bank, layers,
                                texts_per_head, rank)
    return TextSpan(checkpoint, described, kept, len(images))


# -- SAE features (the explorer's Features section) ------------------------------------------------------------------

def feature_attribution(checkpoint: Checkpoint, image: ImageLike, sae, target: int | str | None = None,
                        size: int | InputSize | None = None):
    """Which of an SAE's features drive ``target``'s logit (default the predicted class) on ``image``: with the SAE
    spliced in at its layer as reconstruction plus error, each latent's share ``f_i · (∂y/∂x · W_dec[i])`` per token
    (``.attributions (T, d_sae)``, ``.patch_map(i)``, ``.per_image()``, ``.top(k)``), the decoder bias's and the
    error's, which sum to ``∂y/∂x · x`` there (``vit.features.attribution``). ``sae``: a ``SparseAutoencoder`` or
    what ``vit.features.formats.open_sae`` opens (a SAELens or ViT-Prisma folder, a saev file, a Hub id). Needs a
    classifier; SAEError in one line for an SAE of another model or layer."""
    from vit.core.inference import input_shape, preprocess
    from vit.features.attribution import feature_attribution as attribute
    from vit.features.autoencoder import SparseAutoencoder
    from vit.features.formats import open_sae

    needs_port(checkpoint, "vit.feature_attribution")
    needs_classifier(checkpoint, "vit.feature_attribution")
    index = target_class(checkpoint, target)
    model, p = checkpoint.model, checkpoint.preprocessing
    device = next(model.parameters()).device
    sae = (sae if isinstance(sae, SparseAutoencoder) else open_sae(sae)).to(device)
    image, size = pil_image(image), input_size(size)
    shape = input_shape(image, p, model.config.patch_size, size)
    fits.check_input_fits(checkpoint, model.patch_grid(*shape), f"A {shape[1]}×{shape[0]} px input")
    x = preprocess([image], p, size, model.config.patch_size).to(device)  # (1, C, H, W)
    return attribute(model, sae, x, index)
