"""Segmenting with SAM's and SAM 2's prompts, and the maps of one mask: what the mask decoder attended to, and which
pixels made the mask.

The image encoder is this project's model; the neck, the prompt encoder and the mask decoder are transformers' own
modules with the folder's weights (``vit.sources.sam_prompts``), fed our image embedding: the masks and IoU scores
are the library's by construction (``tests/test_sam_prompts.py`` checks them against its whole model).

- ``decoder_attention``: each two-way block's token-to-image and image-to-token cross-attention and the final
  token-to-image attention, per head, of one output token (a mask token or the IoU token): its row over the image
  embedding's grid (token-to-image), or every image position's weight on it (image-to-token). The weights are
  those the library's eager attention returns.
- ``gradient_x_input``: the input's gradient times the input, summed over the channels, of the chosen mask's
  logits (summed where the mask is, logit > 0, or at one pixel), back through the decoder, the neck and the image
  encoder: plain autograd through the same modules, so equal to autograd on the library's whole model.

A ``Segmenter`` keeps the image embeddings of the last images it saw (as SAM's predictor keeps its image's), so a new
prompt on the same image costs the decoder alone.
"""

from __future__ import annotations

import hashlib
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from vit.costs import plan
from vit.images import resized_size
from vit.sources.sam_prompts import (
    FINAL_ATTENTION,
    Prompt,
    PromptError,
    PromptHalf,
    attention_modules,
    decode,
    decoder_attentions,
    image_embedding,
    open_prompt_half,
    prompt_scale,
    prompt_tensors,
)

# The maps of a mask, by name (what a registry of methods lists): each one's one-line description.
SEGMENT_METHODS = {
    "decoder_attention": "the mask decoder's cross-attention of one output token, per head, on the image embedding's "
                         "grid (each two-way block's token-to-image and image-to-token, and the final token-to-image)",
    "gradient_x_input": "gradient x input of the mask's logits (summed over the mask, or at one pixel) through the "
                        "mask decoder and the image encoder, summed over the channels",
}
TOKENS = ("mask", "iou")  # the output tokens whose attention is drawn
CROSS_ATTENTIONS = ("cross_attn_token_to_image", "cross_attn_image_to_token", FINAL_ATTENTION)
KEPT_EMBEDDINGS = 4  # images whose embedding a Segmenter keeps (SAM ViT-H's: 4 MB each)


def output_token(half: PromptHalf, token: str, mask: int) -> int:
    """The place among the decoder's tokens of ``token``: ``"mask"`` (multimask output ``mask``, from 0) or
    ``"iou"``."""
    if token not in TOKENS:
        raise PromptError(f"token must be one of {', '.join(TOKENS)}, got {token!r}")
    # SAM's multimask outputs are mask tokens 1..3 (token 0 is the single-mask output)
    return half.iou_token if token == "iou" else half.first_mask_token + 1 + mask


def attention_views(recorded: Mapping[str, Tensor], half: PromptHalf, position: int) -> dict[str, Tensor]:
    """Each cross-attention of the decoder's token ``position`` on the image embedding's grid: ``{name: (heads, gh,
    gw)}`` for ``layers.{i}.cross_attn_token_to_image`` (the token's row), ``layers.{i}.cross_attn_image_to_token``
    (each image position's weight on the token) and ``final_attn_token_to_image``; of the first image and mask."""
    gh, gw = half.embedding_grid
    views = {}
    for name in attention_modules(half):
        if not name.endswith(CROSS_ATTENTIONS):
            continue
        weights = recorded[name][0]  # (heads, queries, keys)
        rows = weights[:, :, position] if name.endswith("image_to_token") else weights[:, position, :]  # (heads, N)
        views[name] = rows.reshape(-1, gh, gw)
    return views


def mask_score(pred_masks: Tensor, mask: int, cell: tuple[int, int] | None) -> Tensor:
    """The explained number: mask ``mask``'s low-resolution logits summed where it is (logit > 0), or its logit at
    ``cell = (row, col)``. PromptError for an empty mask without a cell."""
    logits = pred_masks[0, 0, mask]  # (4gh, 4gw)
    if cell is not None:
        return logits[cell]
    inside = logits.detach() > 0
    if not bool(inside.any()):
        raise PromptError(f"mask {mask} is empty (no logit above 0); give a pixel of the image to explain instead")
    return logits[inside].sum()


@dataclass
class Segmented:
    """One prompt's answer on one image, tensors on the CPU: ``scores (M,)`` (``iou_scores``), ``mask_logits (M,
    4gh, 4gw)`` (``pred_masks``), ``masks (M, H, W)`` on the image, ``attention`` by module (``(heads, gh, gw)``
    each) of output ``token`` of mask ``mask``, ``maps`` by method (``(H_in, W_in)`` over the input's pixels)."""

    scores: Tensor
    mask_logits: Tensor
    masks: Tensor
    mask: int
    token: str
    attention: dict[str, Tensor]
    maps: dict[str, Tensor] = field(default_factory=dict)
    embedding_reused: bool = False


class Segmenter:
    """A checkpoint's prompt half and the embeddings of the last ``KEPT_EMBEDDINGS`` inputs it encoded."""

    def __init__(self, checkpoint) -> None:
        self.checkpoint = checkpoint
        self.half = open_prompt_half(checkpoint)
        self.embeddings: OrderedDict[str, object] = OrderedDict()
        self.encoded = 0  # how many times the image encoder ran without a graph (a test reads it)

    @property
    def device(self) -> torch.device:
        return next(self.checkpoint.model.parameters()).device

    def embedding(self, pixels: Tensor) -> tuple[object, bool]:
        """The image embedding of ``pixels (1, C, H, W)`` and whether it was kept from before."""
        key = hashlib.sha256(pixels.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
        if key in self.embeddings:
            self.embeddings.move_to_end(key)
            return self.embeddings[key], True
        with torch.inference_mode():
            embedding = image_embedding(self.half, self.checkpoint.model, pixels.to(self.device))
        self.encoded += 1
        self.embeddings[key] = embedding
        while len(self.embeddings) > KEPT_EMBEDDINGS:
            self.embeddings.popitem(last=False)
        return embedding, False

    def check_gradient_fits(self, grid: tuple[int, int]) -> None:
        """The cost model's answer for a gradient through the encoder and the decoder at ``grid``, asked first."""
        decoder = self.half.decoder
        plan.decide(plan.mask_gradient(self.checkpoint.model, grid, decoder.hidden_size,
                                       len(decoder.transformer.layers), self.half.embedding_grid))

    def segment(self, pixels: Tensor, prompt: Prompt, image_size: tuple[int, int], mask: int | None = None,
                token: str = "mask", methods: tuple[str, ...] = (), at: tuple[float, float] | None = None
                ) -> Segmented:
        """The masks of ``prompt`` (in the image's pixels; the image is ``image_size = (width, height)``) on
        ``pixels (1, C, H, W)``, the decoder attention of ``token`` of mask ``mask`` (default: the best scored) and
        the ``methods`` maps of that mask (at image pixel ``at``, or summed over the mask)."""
        unknown = [m for m in methods if m not in SEGMENT_METHODS or m == "decoder_attention"]
        if unknown:
            raise PromptError(f"unknown map {unknown[0]!r}; choose from {', '.join(m for m in SEGMENT_METHODS)}")
        p = self.checkpoint.preprocessing
        inputs = prompt_tensors(self.half, prompt, prompt_scale(image_size, p), self.device)
        embedding, reused = self.embedding(pixels)
        with torch.inference_mode(), decoder_attentions(self.half) as recorded:
            scores, logits = decode(self.half, embedding, inputs)
        count = scores.shape[-1]
        if mask is None:
            mask = int(scores[0, 0].argmax())
        elif isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask < count:
            raise PromptError(f"mask must be a whole number from 0 to {count - 1} (SAM's {count} masks), "
                              f"got {mask!r}")
        position = output_token(self.half, token, mask)
        attention = {k: v.float().cpu() for k, v in attention_views(recorded, self.half, position).items()}
        cell = None if at is None else low_res_cell(at, image_size, p, tuple(pixels.shape[-2:]),
                                                    tuple(logits.shape[-2:]))
        maps = {}
        if methods:
            self.check_gradient_fits(self.checkpoint.model.patch_grid(*pixels.shape[-2:]))
        for method in methods:
            maps[method] = gradient_x_input(self.half, self.checkpoint.model, pixels.to(self.device), inputs, mask,
                                            cell).cpu()
        logits = logits[0, 0].float().cpu()
        return Segmented(scores[0, 0].float().cpu(), logits, masks_on_image(self.half, logits, image_size, p), mask,
                         token, attention, maps, reused)


_SEGMENTERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a model -> its Segmenter, while it lives


def segmenter(checkpoint) -> Segmenter:
    """``checkpoint``'s ``Segmenter``, made once per model (its prompt half read from the folder once)."""
    found = _SEGMENTERS.get(checkpoint.model)
    if found is None:
        found = _SEGMENTERS[checkpoint.model] = Segmenter(checkpoint)
    return found


def low_res_cell(at: tuple[float, float], image_size: tuple[int, int], preprocessing, input_hw: tuple[int, int],
                 mask_hw: tuple[int, int]) -> tuple[int, int]:
    """``(row, col)`` of the low-resolution mask logit over image pixel ``at = (x, y)``: the low-resolution masks
    cover the whole input (SAM's padding included)."""
    x, y = at
    width, height = image_size
    if not (0 <= x <= width and 0 <= y <= height):
        raise PromptError(f"the pixel to explain ({x:g}, {y:g}) is outside the {width}x{height} image")
    sx, sy = prompt_scale(image_size, preprocessing)
    rows, cols = mask_hw
    return (min(int(y * sy * rows / input_hw[0]), rows - 1), min(int(x * sx * cols / input_hw[1]), cols - 1))


def masks_on_image(half: PromptHalf, logits: Tensor, image_size: tuple[int, int], preprocessing) -> Tensor:
    """``(M, H, W)`` bool: the low-resolution ``logits (M, h, w)`` on the image, as the processor's
    ``post_process_masks`` makes them (SAM: up to the padded input, its padding cut, then to the image; SAM 2:
    straight to the image; bilinear, logit > 0)."""
    width, height = image_size
    masks = logits[None].float()  # (1, M, h, w)
    if half.family == "sam":
        masks = F.interpolate(masks, preprocessing.image_hw, mode="bilinear", align_corners=False)
        new_w, new_h = resized_size(image_size, preprocessing.resize_size, preprocessing.resize_mode)
        masks = masks[..., :new_h, :new_w]
    masks = F.interpolate(masks, (height, width), mode="bilinear", align_corners=False)
    return masks[0] > 0


def gradient_x_input(half: PromptHalf, model, pixels: Tensor, inputs: Mapping[str, Tensor], mask: int,
                     cell: tuple[int, int] | None = None) -> Tensor:
    """``(H, W)``: the gradient of ``mask_score`` with respect to ``pixels (1, C, H, W)`` times the pixels, summed
    over the channels, back through the decoder, the neck and our image encoder."""
    with torch.inference_mode(False), torch.enable_grad():
        x = pixels.detach().clone().requires_grad_(True)
        _, logits = decode(half, image_embedding(half, model, x), inputs)
        [grad] = torch.autograd.grad(mask_score(logits, mask, cell), x)
    return (x.detach() * grad).sum(dim=1)[0]  # (H, W)
