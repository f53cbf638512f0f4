"""A video model fed an image as a clip of one frame (issue 117, item 6): transformers' VideoMT
(``VideomtForUniversalSegmentation``) and VideoPrism (``VideoPrismVisionModel``, ``VideoPrismClipModel``) take
``pixel_values_videos`` ``(B, frames, C, H, W)`` and no ``pixel_values``.

A clip of one frame is what their own code computes for one image:

- VideoMT runs every frame through its ViT layers alone (``flat_pixel_values``: frames folded into the batch) and
  gives the first frame its learnt queries (``self.query.weight``), as EoMT does an image;
- VideoPrism runs its spatial layers over each frame's patches before any temporal layer mixes the frames, so a
  frame's spatial attention is the same whatever frames follow it; its temporal layers then attend over one frame
  (each patch its own key), which ``layer_kinds`` names and leaves out of the layers. Its temporal position
  embeddings are for ``num_frames`` frames: the model's own ``interpolate_pos_encoding=True`` resamples them to
  one, as it does for any clip of another length (the spatial ones are unchanged at its own square size).

X-CLIP's vision layers are no such model: each takes clips of exactly its config's ``num_frames`` frames (its
``batch_time // self.num_frames``) and runs a message attention over the frames' class tokens before its
self-attention, whose tokens then hold the frame's message token after its patches; no clip of one frame is its
input, and the library road refuses it naming that (``fixed_clips``).
"""

from __future__ import annotations

import inspect

import torch


def takes_clips(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward reads a clip (``pixel_values_videos``) and no image (``pixel_values``)."""
    try:
        takes = inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        return False
    return "pixel_values_videos" in takes and "pixel_values" not in takes


def clip_arguments(model: torch.nn.Module, pixel_values: torch.Tensor, method=None) -> dict:
    """The keywords that feed ``model`` (or its ``method``) the images ``(B, C, H, W)`` as clips of one frame:
    ``pixel_values_videos`` ``(B, 1, C, H, W)``, and ``interpolate_pos_encoding=True`` where it takes that and
    its config's clips are longer (VideoPrism's temporal positions, resampled to one frame)."""
    arguments = {"pixel_values_videos": pixel_values[:, None]}
    takes = inspect.signature(method or type(model).forward).parameters
    config = getattr(model, "config", None)
    frames = getattr(config, "num_frames", None) or getattr(getattr(config, "vision_config", None), "num_frames", 1)
    if "interpolate_pos_encoding" in takes and frames != 1:
        arguments["interpolate_pos_encoding"] = True
    return arguments


class OneFrame(torch.nn.Module):
    """``model`` fed ``pixel_values`` as clips of one frame (``clip_arguments``); its own output."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor):
        return self.model(**clip_arguments(self.model, pixel_values))


# Layers (by class) that take clips of exactly their config's frames, mixing the frames inside every layer: in words
FIXED_CLIPS = {"XCLIPVisionEncoderLayer": "X-CLIP's vision layers take clips of exactly num_frames ({frames}) frames, "
                                          "each layer's message attention over the frames' class tokens running "
                                          "before its self-attention, so one image is no input for them"}


def fixed_clips(model: torch.nn.Module) -> str | None:
    """Why ``model``'s layers take no image as a clip of one frame (``FIXED_CLIPS``), or None."""
    for module in model.modules():
        words = FIXED_CLIPS.get(type(module).__name__)
        if words is not None:
            return words.format(frames=getattr(module, "num_frames", "?"))
    return None
