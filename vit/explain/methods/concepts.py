"""SAM 3's concept prompts (issue 94): the instances of a concept, typed as a noun phrase and / or shown by an
exemplar box, as transformers' ``Sam3Model`` and its processor find them, and what made one of them.

The masks, boxes and scores are the library's: its processor prepares the image, the text and the box, its model
runs (the vision encoder once per image, kept; the DETR encoder, decoder and mask decoder once per concept), and its
processor's ``post_process_instance_segmentation`` keeps the instances over the threshold. Beside them, for the
explained instance (the best scored unless chosen) and only when asked:

- ``attention``: which image tokens its object query attended to in each layer of the DETR decoder's vision
  cross-attention, per head (the recording attention hands the call to the module's own eager function, which
  forms the probabilities ``output_attentions`` returns: the box's relative position bias included), placed
  row-major on the encoder's grid (``spatial_shapes``: the flattening of the vision features), over the input;
- ``gradient_x_input``: the gradient of its mask's logits, summed over its mask at the model's mask resolution,
  with respect to the input pixels, times the pixels, summed over the colour channels (one forward and backward);
- ``attnlrp``: the same under lxt's AttnLRP rules on the library's modules (``attnlrp_rules``), signed.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from vit.core import recording_attention
from vit.core.threads import this_thread_only
from vit.costs import plan
from vit.explain.methods.relevance import AttnLRPRules, divide_gradient
from vit.explain.methods.segment import (
    PromptError,
    _activation_rule,
    _is_activation,
    _norm_rule,
    distinct_methods,
    make_prompt,
)

MAX_CONCEPT_CHARS = 200  # a noun phrase; the processor pads the text to 32 tokens and reads no more
TEXT_TOKENS = 32  # Sam3Processor's padding length: the CLIP text encoder's positions
MASK_BYTES = 512 * 2**20  # the kept instances' masks on the image (bool): past it, a higher threshold is asked
CONCEPT_METHODS = ("gradient_x_input", "attnlrp")


@dataclass(frozen=True)
class Concept:
    """What to find: ``text`` (a noun phrase, or None) and / or an exemplar ``box`` (x0, y0, x1, y1) in the image's
    own pixels."""

    text: str | None
    box: tuple[float, float, float, float] | None = None


def make_concept(text: str | None, box: Sequence[float] | None, image_size: tuple[int, int]) -> Concept:
    """The concept, checked: text of 1 to ``MAX_CONCEPT_CHARS`` characters, a box within the image (``make_prompt``'s
    check), at least one of the two. PromptError (one line) otherwise."""
    if text is not None:
        if not isinstance(text, str) or not text.strip() or len(text) > MAX_CONCEPT_CHARS:
            raise PromptError(f"a concept is a noun phrase of 1 to {MAX_CONCEPT_CHARS} characters, got "
                              f"{str(text)[:40]!r}")
    if box is None and text is None:
        raise PromptError("give SAM 3 a concept: text= (a noun phrase such as \"a red dog\") and / or an exemplar "
                          "box= (x0, y0, x1, y1)")
    return Concept(text, None if box is None else make_prompt(None, box, image_size).box)


@dataclass
class ConceptResult:
    """The instances of a concept on one image, in the decoder's query order (transformers' own): ``scores (N,)``
    (each query's score times the concept's presence score), ``boxes (N, 4)`` (x0, y0, x1, y1 on the image),
    ``masks (N, H, W)`` bool on the image, ``queries (N,)`` the decoder query each came from; ``presence`` the
    concept's presence score; ``instance`` the explained one (index into N, None when none is kept) and its
    ``attention`` ``{"decoder layer k": (heads, gh, gw)}`` and ``maps`` ``{method: (h, w)}`` over ``seen`` (the
    pixels the model saw, the processor's resize and normalisation undone)."""

    scores: Tensor
    boxes: Tensor
    masks: Tensor
    queries: Tensor
    presence: float
    instance: int | None
    attention: dict[str, Tensor] = field(default_factory=dict)
    maps: dict[str, Tensor] = field(default_factory=dict)
    seen: np.ndarray | None = None


class _QueryRows:
    """A recorder for the recording attention: each DETR decoder layer's vision cross-attention call kept (its query,
    key, value, mask and arguments, the tensors the forward formed, not copies: 64 MB at the published sizes, 6
    layers' keys and values over 5,184 vision tokens, 89 MB with float masks), so that any query's rows of the
    post-softmax probabilities ``(B, H, K)`` are formed afterwards by the module's own eager function (``rows``) from
    the one forward that found the instances, not from a second run of the DETR encoder, decoder and mask decoder."""

    def __init__(self, modules: Sequence[torch.nn.Module]):
        self.modules = list(modules)
        self.layers = {module: k for k, module in enumerate(self.modules)}
        self.calls: dict[int, tuple] = {}

    def keep(self, layer, query, key, value, attention_mask, kwargs) -> None:
        self.calls[layer] = (query, key, value, attention_mask, dict(kwargs))

    def output(self, layer, out) -> None:
        pass

    def rows(self, row: int) -> dict[int, Tensor]:
        """``{layer: (B, H, K)}``: row ``row`` of each kept layer's probabilities, formed whole by the module's eager
        function (as its ``output_attentions`` are) on the call's own inputs, one layer at a time."""
        kept = {}
        for layer, (query, key, value, attention_mask, kwargs) in sorted(self.calls.items()):
            module = self.modules[layer]
            with torch.no_grad():
                _, probabilities = recording_attention._eager_of(module)(module, query, key, value, attention_mask,
                                                                         **kwargs)
            kept[layer] = probabilities[:, :, row].detach()
            del probabilities
        return kept


def vision_cross_attentions(model) -> list[torch.nn.Module]:
    """Each DETR decoder layer's vision cross-attention module, in order."""
    return [layer.vision_cross_attn for layer in model.detr_decoder.layers]


def concept_inputs(sam3, image: Image.Image, concept: Concept):
    """The processor's inputs for ``image`` and ``concept`` (its text padded to ``TEXT_TOKENS``; a box alone: the
    processor's own text for a visual prompt). PromptError (one line) for a text of more tokens than the encoder
    reads."""
    processor = sam3.processor
    if concept.text is not None:
        count = len(processor.tokenizer(concept.text)["input_ids"])
        if count > TEXT_TOKENS:
            raise PromptError(f"the concept is {count} tokens, more than the {TEXT_TOKENS} SAM 3's text encoder "
                              "reads; give a shorter noun phrase")
    boxes = None if concept.box is None else dict(input_boxes=[[list(concept.box)]], input_boxes_labels=[[1]])
    return processor(images=image, text=concept.text, return_tensors="pt", **(boxes or {}))


def _run(model, vision, inputs, recorder=None):
    """The model's forward past its vision encoder (``vision``, kept) on ``inputs``, recording into ``recorder``."""
    kwargs = {k: v for k, v in inputs.items() if k not in ("pixel_values", "original_sizes")}
    if recorder is None:
        return model(vision_embeds=vision, **kwargs)
    with recording_attention.recording(model, recorder):
        return model(vision_embeds=vision, **kwargs)


def seen_pixels(sam3, pixel_values: Tensor) -> np.ndarray:
    """(h, w, 3) uint8: the input the model saw, its processor's rescale and normalisation undone."""
    images = sam3.processor.image_processor
    x = pixel_values[0].detach().float().cpu()
    if getattr(images, "do_normalize", True):
        x = x * torch.as_tensor(images.image_std).view(-1, 1, 1) + torch.as_tensor(images.image_mean).view(-1, 1, 1)
    if getattr(images, "do_rescale", True):
        x = x / float(images.rescale_factor)
    return x.round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()


def segment_concept(sam3, image: Image.Image, concept: Concept, threshold: float = 0.5, mask_threshold: float = 0.5,
                    instance: int | None = None, attention: bool = True, methods: Sequence[str] = ()
                    ) -> ConceptResult:
    """The concept's instances on ``image`` (``ConceptResult``): transformers' forward and post-processing with
    ``threshold`` (instances kept) and ``mask_threshold`` (mask pixels kept); for ``instance`` (default the best
    scored), its decoder attention when ``attention`` and each of ``methods`` (``CONCEPT_METHODS``). PromptError
    (one line) for thresholds outside [0, 1), an instance not kept, a method not known, or masks past
    ``MASK_BYTES``."""
    for name, value in (("threshold", threshold), ("mask_threshold", mask_threshold)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise PromptError(f"{name} must be a number from 0 to below 1, got {str(value)[:40]}")
    methods = distinct_methods(methods)
    unknown = [m for m in methods if m not in CONCEPT_METHODS]
    if unknown:
        raise PromptError(f"no method {unknown[0]!r} for SAM 3's concepts; choose from {', '.join(CONCEPT_METHODS)}")
    model = sam3.model
    inputs = concept_inputs(sam3, image, concept).to(sam3.device)
    recorder = _QueryRows(vision_cross_attentions(model)) if attention else None  # every query's, in this one forward
    with torch.no_grad():
        vision = model.get_vision_features(pixel_values=inputs["pixel_values"])
        out = _run(model, vision, inputs, recorder)
    scores = out.pred_logits.sigmoid() * out.presence_logits.sigmoid()  # as the post-processing forms them
    queries = (scores[0] > threshold).nonzero()[:, 0]
    height, width = image.size[1], image.size[0]
    if len(queries) * height * width > MASK_BYTES:
        raise PromptError(f"{len(queries)} instances over the threshold {threshold:g} make "
                          f"{len(queries) * height * width / 2**20:,.0f} MB of masks on this image, over the "
                          f"{MASK_BYTES // 2**20} MB kept; raise the threshold")
    [kept] = sam3.processor.post_process_instance_segmentation(out, threshold=threshold, mask_threshold=mask_threshold,
                                                               target_sizes=[(height, width)])
    if len(queries) != len(kept["scores"]):
        raise RuntimeError("the kept instances differ from the processor's")  # one formula: cannot happen
    if instance is None:
        instance = int(kept["scores"].argmax()) if len(queries) else None
    elif isinstance(instance, bool) or not isinstance(instance, int) or not 0 <= instance < len(queries):
        raise PromptError(f"instance {str(instance)[:20]} is not one of the {len(queries)} kept (over the threshold "
                          f"{threshold:g}), numbered from 0")
    result = ConceptResult(kept["scores"].cpu(), kept["boxes"].cpu(), kept["masks"].bool().cpu(), queries.cpu(),
                           float(out.presence_logits.sigmoid()[0, 0]), instance,
                           seen=seen_pixels(sam3, inputs["pixel_values"]))
    if instance is None:
        return result
    query = int(queries[instance])
    if attention:
        result.attention = decoder_attention(recorder, vision, query)
    del recorder  # the decoder's kept calls
    for method in methods:
        result.maps[method] = gradient_x_input(model, inputs, query, mask_threshold, rules=method == "attnlrp")
    return result


def decoder_attention(recorder: _QueryRows, vision, query: int) -> dict[str, Tensor]:
    """``{"decoder layer k": (heads, gh, gw)}``: decoder query ``query``'s row of each vision cross-attention the
    forward's ``recorder`` kept (row 0 is the presence token), on the DETR encoder's grid, row-major as the vision
    features were flattened."""
    gh, gw = _grid(vision)
    return {f"decoder layer {k + 1}": rows[0].reshape(-1, gh, gw).cpu()
            for k, rows in sorted(recorder.rows(1 + query).items())}


def _grid(vision) -> tuple[int, int]:
    """The DETR encoder's grid: the last of the feature levels it reads (the model drops the neck's last)."""
    level = vision.fpn_hidden_states[:-1][-1]
    return int(level.shape[-2]), int(level.shape[-1])


def mask_logit_score(pred_masks: Tensor, query: int, mask_threshold: float) -> Tensor:
    """Query ``query``'s mask logits summed over its mask (the pixels of the model's mask resolution whose
    probability passes ``mask_threshold``; every pixel where none does)."""
    logits = pred_masks[0, query]
    inside = logits.detach() > math.log(mask_threshold / (1 - mask_threshold)) if mask_threshold > 0 else \
        torch.ones_like(logits, dtype=torch.bool)
    return logits[inside].sum() if inside.any() else logits.sum()


def gradient_x_input(model, inputs, query: int, mask_threshold: float, rules: bool = False) -> Tensor:
    """``(h, w)``: the gradient of ``mask_logit_score`` with respect to the input pixels times the pixels, summed
    over the colour channels: one forward of the whole model and one backward; with ``rules``, AttnLRP's modified
    gradient (``attnlrp_rules``)."""
    check_gradient_fits(model, tuple(inputs["pixel_values"].shape[-2:]))
    kwargs = {k: v for k, v in inputs.items() if k not in ("pixel_values", "original_sizes")}
    with torch.inference_mode(False), torch.enable_grad(), attnlrp_rules(model) if rules else contextlib.nullcontext():
        x = inputs["pixel_values"].detach().clone().requires_grad_(True)
        out = model(pixel_values=x, **kwargs)
        [grad] = torch.autograd.grad(mask_logit_score(out.pred_masks, query, mask_threshold), x)
    return (x.detach() * grad).sum(dim=1)[0].cpu()


def check_gradient_fits(model, input_hw: tuple[int, int]) -> None:
    """The cost model's answer for a backward through SAM 3's vision encoder at ``input_hw``, asked first: its ViT
    counted as a library model's whole pass (``plan.library_gradient``; every layer as a global one, an upper bound
    for its windowed layers); the DETR and mask decoders beside it are a few layers of a few hundred tokens."""
    config = model.config.vision_config.backbone_config
    side = int(config.patch_size)
    shape = plan.LibraryShape(int(config.num_hidden_layers), int(config.num_attention_heads), int(config.hidden_size),
                              int(config.intermediate_size), 0, (side, side))
    plan.decide(plan.library_gradient(shape, (input_hw[0] // side, input_hw[1] // side),
                                      "Gradient × input of SAM 3's mask"))


def _halved(module, args, output) -> Tensor:
    """One factor of the masks' product, its gradient halved: the uniform rule on a product of two inputs."""
    return divide_gradient(output, 2.0)


@contextlib.contextmanager
def attnlrp_rules(model) -> Iterator[None]:
    """For the ``with`` block, lxt's AttnLRP rules on transformers' whole ``Sam3Model``, as forward hooks giving the
    same values with the rule's backward, and the recording attention's ``RULES``: every LayerNorm holds its scale
    (``_norm_rule``, lxt's ``layer_norm_forward``), every activation module takes the identity rule
    (``_activation_rule``, lxt's ``non_linear_forward``), every attention call divides its q and k gradients by 4 and
    its v gradient by 2 at the attention function (lxt's ``wrap_attention_forward``: the vision encoder's, the DETR
    encoder's and decoder's, the geometry encoder's, the mask decoder's), and the masks, the product of the mask
    embedder's and the instance projection's outputs, take the uniform rule (each factor's gradient halved). The
    rest keeps its plain gradient: RoPE, the GroupNorms of the pixel decoder (lxt has no rule for them), the
    functional ReLUs (whose identity rule is their gradient). The hooks sit on modules every session shares, each
    acting in this thread only (``this_thread_only``): a concurrent forward's values and gradients are its own."""
    handles = []
    token = recording_attention.RULES.set(AttnLRPRules())
    try:
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                handles.append(module.register_forward_hook(this_thread_only(_norm_rule)))
            elif _is_activation(module):
                handles.append(module.register_forward_hook(this_thread_only(_activation_rule)))
        decoder = model.mask_decoder
        for factor in (decoder.mask_embedder, decoder.instance_projection):
            handles.append(factor.register_forward_hook(this_thread_only(_halved)))
        yield
    finally:
        recording_attention.RULES.reset(token)
        for handle in handles:
            handle.remove()
