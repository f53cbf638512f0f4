"""ImageGPT fed an image (issue 117, item 6): its forward reads token ids, one a pixel, each the index of the colour
cluster nearest that pixel, in row-major order (``ImageGPTImageProcessor``: the pixels scaled to [-1, 1], flattened
``(H * W, 3)``, quantised by ``color_quantize_torch`` against its ``clusters``). ``ColourTokens`` quantises the
road's pixels (normalised by the processor's mean and std of 0.5, so in [-1, 1]) with transformers' own
``color_quantize_torch`` and the folder's clusters, and runs the model on the ids: each token is one pixel, placed on a
grid of the image's own height and width (patches of one pixel), no prefix. Its attention is causal: a pixel's row
is over the pixels before it. The quantisation is a lookup, so no gradient reaches the pixels (the maps that need
one say so); attention, rollout and the maps of its tokens draw.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def clusters_of(image_processor: Mapping | None) -> torch.Tensor | None:
    """The processor's colour clusters ``(n, 3)``, or None where it declares none (or no quantisation)."""
    processor = dict(image_processor or {})
    clusters = processor.get("clusters")
    if clusters is None or processor.get("do_color_quantize") is False:
        return None
    try:
        clusters = torch.as_tensor(clusters, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        return None
    if clusters.dim() != 2 or clusters.shape[1] != 3 or not 1 <= clusters.shape[0] <= 65536:
        return None
    return clusters


class ColourTokens(torch.nn.Module):
    """``model`` (ImageGPT) fed ``pixel_values`` ``(B, 3, H, W)`` in [-1, 1] as the ids of their nearest
    ``clusters`` row-major; a classifier's logits, else its own output."""

    # why no gradient passes from its output to the pixels (``LibraryModel.no_gradient``): the maps that read one
    no_gradient = "its pixels are read as the ids of their nearest colour clusters, a lookup"

    def __init__(self, model: torch.nn.Module, clusters: torch.Tensor):
        super().__init__()
        self.model = model
        self.register_buffer("clusters", clusters, persistent=False)

    def forward(self, pixel_values: torch.Tensor):
        from transformers.models.imagegpt.image_processing_imagegpt import color_quantize_torch

        B, C, H, W = pixel_values.shape
        pixels = pixel_values.permute(0, 2, 3, 1).reshape(B, H * W, C)  # (B, H*W, 3) row-major, as its processor
        ids = color_quantize_torch(pixels.reshape(B * H * W, C), self.clusters.to(pixels)).view(B, H * W)
        out = self.model(input_ids=ids)
        logits = getattr(out, "logits", None)
        return logits if isinstance(logits, torch.Tensor) else out
