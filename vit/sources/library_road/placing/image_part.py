"""A transformers model as the recorder at the attention function runs it (``recorded_folder``'s folders and
``module_road``'s models in hand whose config has no patch size: DETR's encoder over a CNN's map), apart from both so
that neither imports the other."""

from __future__ import annotations

import inspect
from collections.abc import Mapping

import torch

from vit.sources.library_road.placing import one_frame


def no_patch_size(config_json: Mapping) -> bool:
    """Whether the library road refuses the folder for want of a patch size in its config (the recorder reads it
    from the patch embedding instead): its config class declares none where the library road reads one."""
    from transformers import CONFIG_MAPPING

    from vit.sources.library_road import transformers_models as tm

    try:
        return not (tm.declares_patch(config_json) or hasattr(CONFIG_MAPPING[config_json["model_type"]](),
                                                               "patch_size"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


class ImagePart(torch.nn.Module):
    """A transformers model as the recorder's road runs it: one batch of pixels in; out, a classifier's logits (the
    classifier's own linear layer's output), a model that reads text too its image features
    (``get_image_features``), else the model's own output. Nothing of the model is copied."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.clips = one_frame.takes_clips(model)  # a video model (VideoPrism's): an image is a clip of one frame
        features = getattr(model, "get_video_features" if self.clips else "get_image_features", None)
        self.features = callable(features) and "input_ids" in inspect.signature(type(model).forward).parameters
        self.embeds = self.features  # its output an embedding (a projection's), not a classifier's logits

    def forward(self, pixel_values: torch.Tensor):
        if self.clips:
            method = self.model.get_video_features if self.features else None
            arguments = one_frame.clip_arguments(self.model, pixel_values, method)
            out = method(**arguments) if method is not None else self.model(**arguments)
        else:
            out = (self.model.get_image_features(pixel_values=pixel_values) if self.features
                   else self.model(pixel_values=pixel_values))
        logits = getattr(out, "logits", None)
        if isinstance(logits, torch.Tensor):
            return logits
        pooled = getattr(out, "pooler_output", None)
        return pooled if self.features and isinstance(pooled, torch.Tensor) else out
