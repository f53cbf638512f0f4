"""Llama 3.2 Vision's tower (``MllamaVisionModel``, ``mllama_vision_model``) opened alone from its own folder, as
transformers builds it (issue 117, item 6).

It takes an image as tiles in ``max_num_tiles`` slots with their canvas (``aspect_ratio_ids``, from 1 in transformers'
``get_all_supported_aspect_ratios`` order) and which slots hold one (``aspect_ratio_mask``), as its processor hands
them. Here each image is one tile of the processor's size (the ``1 x 1`` canvas, id 1), resized to it whole (the
processor keeps an image's aspect and pads the tile; a square image is fed as it feeds it): slot 0 holds it, the other
slots are zeros and masked, as the processor pads them. Each
slot's tokens are its CLS then its patches row-major, padded with zeros to a multiple of 8; its local layers
(``transformer``) and then its global, gated ones (``global_transformer``) all attend over every slot's tokens at
once, so each of the ``num_hidden_layers + num_global_layers`` attention modules is a layer, in that order. The
layout places slot 0's CLS and patches; its padding and the empty slots' tokens are tokens after the patches (their
mask blocks only a padding query's padding keys: an image token's row keeps the mass it gives them, as transformers
computes it). The tower's features are slot 0's CLS and patches (``last_hidden_state`` ``(B, 1 + P, D)``, its
intermediate layers' concatenated as transformers concatenates them).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from vit.checkpoint import Checkpoint
from vit.model import ViTConfig
from vit.sources.files import SourceError, _one_line
from vit.sources.hf_preprocessing import hf_preprocessing
from vit.sources.library_road import transformers_models as tm
from vit.sources.library_road.library_model import LibraryLayout, LibraryModel
from vit.sources.library_road.whole_folders import built_tower, layer_attentions

MODEL_TYPES = ("mllama_vision_model",)
PAD_TO = 8  # each slot's tokens padded to a multiple of it (MllamaVisionModel.forward)


class _OneTile(torch.nn.Module):
    """Llama 3.2 Vision's tower fed images ``(B, C, H, W)``: each the one tile of a ``1 x 1`` canvas in slot 0 of its
    ``tiles`` slots, the others zeros and masked; out, its output with ``last_hidden_state`` slot 0's ``(B, 1 + P,
    D)``."""

    def __init__(self, model: torch.nn.Module, tiles: int, image_hw: tuple[int, int]):
        super().__init__()
        self.__dict__["model"] = model  # the library's model, registered in the LibraryModel once
        self.tiles, self.image_hw = tiles, tuple(image_hw)

    def forward(self, pixel_values: torch.Tensor):
        b, c, h, w = pixel_values.shape
        if (h, w) != self.image_hw:
            th, tw = self.image_hw
            raise ValueError(f"Llama 3.2 Vision's tower takes {th}x{tw}-px tiles only (its position table has a row "
                             f"per patch), not {h}x{w}")
        slots = pixel_values.new_zeros(b, 1, self.tiles, c, h, w)  # (B, images, tile slots, C, H, W)
        slots[:, 0, 0] = pixel_values
        ids = torch.ones(b, 1, dtype=torch.long, device=pixel_values.device)  # the 1 x 1 canvas
        mask = torch.zeros(b, 1, self.tiles, dtype=torch.long, device=pixel_values.device)
        mask[:, :, 0] = 1
        out = self.model(pixel_values=slots, aspect_ratio_ids=ids, aspect_ratio_mask=mask)
        out.last_hidden_state = out.last_hidden_state[:, 0, 0]  # (B, 1 + P, D): slot 0's, padding dropped
        return out


def open_library(folder: Path, config_json: Mapping, image_processor: Mapping | None,
                 map_location: str | torch.device = "cpu") -> Checkpoint:
    """The folder's tower as transformers builds it, in a ``Checkpoint`` of the library road (``_OneTile``);
    SourceError (one line) for what it cannot build or place."""
    model, origin = built_tower(folder, config_json, map_location)
    config = model.config
    try:
        patch = tm._pair(tm.config_patch(config), "patch_size")
        own = tm._pair(tm.config_size(config), "image_size")
        tiles, channels = int(config.max_num_tiles), int(getattr(config, "num_channels", 3))
        if not 1 <= tiles <= 64:
            raise ValueError(f"max_num_tiles {tiles} is not a number of tile slots from 1 to 64")
        stand_in = ViTConfig(image_size=own if own[0] != own[1] else own[0],
                             patch_size=patch if patch[0] != patch[1] else patch[0], num_channels=channels,
                             num_classes=0)
        processor = dict(image_processor or {})
        if processor.get("max_image_tiles", tiles) != tiles:
            raise ValueError(f"its image processor's max_image_tiles {str(processor['max_image_tiles'])[:20]} is not "
                             f"its config's max_num_tiles {tiles}; fix one of them")
        preprocessing = hf_preprocessing(processor or None, stand_in, type(model).__name__)
        if tuple(preprocessing.image_hw) != own:
            raise ValueError(f"its image processor asks for {preprocessing.size_label}-px tiles, but its position "
                             f"table holds {own[0]}x{own[1]} px")
    except (ValueError, TypeError, AttributeError) as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None
    layers = int(config.num_hidden_layers) + int(config.num_global_layers)
    modules = layer_attentions(model, preprocessing, stand_in, folder, layers,
                               f"its {layers} local and global layers")
    patches = (own[0] // patch[0]) * (own[1] // patch[1])
    per_slot = -(-(1 + patches) // PAD_TO) * PAD_TO  # CLS and patches, padded
    layout = LibraryLayout(1, patch, own, num_suffix_tokens=tiles * per_slot - 1 - patches)
    wrapped = LibraryModel(model, layout, modules, model, _OneTile(model, tiles, own))
    return tm._finish_library(wrapped, [], preprocessing, folder, type(model).__name__, image_processor is None)
