"""Whole folders as the Hub ships them whose image part the library road reads but whose folder it could not place
(issue 117, item 6): each opened as transformers builds the folder's own class, its image part's attention recorded
through transformers' attention interface (``transformers_models``), its layout checked against the tokens a traced
forward forms, as every library-road folder's is.

- ``tipsv2`` (``Tipsv2Model``: an image and a text tower, the patch size in its ``vision_config``): the whole model
  built and its weights checked as the folder holds them, its image tower (``vision_model``, a ``Tipsv2VisionModel``:
  a CLS token and registers before the patches) the model the maps read.
- ``pixtral`` (``PixtralVisionModel``) and ``molmo2_vision`` (``Molmo2VisionModel``): patches alone, no module named
  ``embeddings`` and no token parameter before them. Pixtral packs a batch into one sequence (a block-diagonal mask),
  so it takes one image at a time; its processor keeps each image's aspect (a longest edge), here images are resized
  to its config's ``image_size`` (any input of whole patches runs: its positions are rotary). Molmo 2's vision model
  takes its image as patches: flattened from the pixels by transformers' own ``batch_pixels_to_patches`` (what its
  processor does to each crop), at its config's one image size (its position table has a row per patch).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from vit.checkpoint import Checkpoint, preprocessing_problem
from vit.core import recording_attention
from vit.model import ViTConfig
from vit.sources.files import (
    SourceError,
    _one_line,
)
from vit.sources.hf_preprocessing import hf_preprocessing
from vit.sources.library_road import transformers_models as tm

VISION_PARTS = {"tipsv2": "vision_model"}  # model_type -> the attribute its image tower sits in
PATCHES_ALONE = ("pixtral", "molmo2_vision")  # model_types whose tokens are the patches alone
MODEL_TYPES = (*VISION_PARTS, *PATCHES_ALONE)


class _OneImage(torch.nn.Module):
    """Pixtral's forward for the library road: one image at a time (it packs a batch into one sequence, whose
    attention the layout of one image does not place)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.__dict__["model"] = model  # the library's model, registered in the LibraryModel once

    def forward(self, pixel_values: torch.Tensor):
        if pixel_values.shape[0] != 1:
            raise ValueError(f"Pixtral's vision model packs a batch into one sequence; give it one image at a time, "
                             f"not {pixel_values.shape[0]}")
        return self.model(pixel_values=pixel_values)


class _Patches(torch.nn.Module):
    """Molmo 2's vision model fed images ``(B, C, H, W)``: each flattened to ``(B, patches, p * p * C)`` by
    transformers' own ``batch_pixels_to_patches`` (channels last, as its processor hands it the crops), at the one
    ``image_hw`` its position table holds."""

    def __init__(self, model: torch.nn.Module, patch: int, image_hw: tuple[int, int]):
        super().__init__()
        self.__dict__["model"] = model
        self.patch, self.image_hw = patch, tuple(image_hw)

    def forward(self, pixel_values: torch.Tensor):
        from transformers.models.molmo2.image_processing_molmo2 import batch_pixels_to_patches

        if tuple(pixel_values.shape[-2:]) != self.image_hw:
            h, w = self.image_hw
            raise ValueError(f"Molmo 2's vision model takes {h}x{w}-px images only (its position table has a row "
                             f"per patch), not {pixel_values.shape[-2]}x{pixel_values.shape[-1]}")
        patches = batch_pixels_to_patches(pixel_values.permute(0, 2, 3, 1), self.patch)  # (B, gh * gw, p * p * C)
        return self.model(pixel_values=patches)


def open_library(folder: Path, config_json: Mapping, image_processor: Mapping | None,
                 map_location: str | torch.device = "cpu") -> Checkpoint:
    """The folder's model as transformers builds it, its image part in a ``Checkpoint`` of the library road
    (``transformers_models.open_library``'s answer for the model_types ``MODEL_TYPES`` names). SourceError (one
    line) where it cannot be built or placed."""
    model_type = str(config_json.get("model_type"))
    meta = torch.device(map_location).type == "meta"
    model, origin = built_tower(folder, config_json, map_location)
    if model_type in VISION_PARTS:
        checkpoint = tm.library_checkpoint(getattr(model, VISION_PARTS[model_type]), image_processor, folder, origin,
                                           meta)
        whole = f"hf:{type(model).__name__}"
        checkpoint.metadata["source"]["architecture"] = checkpoint.metadata["architecture"] = whole
        return checkpoint
    return _patches_alone(model, model_type, image_processor, folder, origin, meta)


def built_tower(folder: Path, config_json: Mapping, map_location) -> tuple[torch.nn.Module, str]:
    """The folder's class built as ``_built`` builds it, with the origin (the folder and its model_type) every
    one-line refusal about it names: how each library-road folder opened as transformers builds it starts."""
    origin = f"{folder} ({config_json.get('model_type')}, opened as transformers builds it)"
    return _built(folder, config_json, origin, map_location), origin


def layer_attentions(model: torch.nn.Module, preprocessing, stand_in: ViTConfig, folder: Path, layers: int,
                     named: str | None = None) -> list[torch.nn.Module]:
    """The model's attention modules (``transformers_models.attention_modules``), one a layer: SourceError (one line)
    where its preprocessing is unusable for ``stand_in`` or it holds other than ``layers`` of them (``named``: how
    the refusal names its layers, ``"<layers> layers"`` unless told)."""
    problem = preprocessing_problem(preprocessing, stand_in)
    if problem:
        raise SourceError(f"{folder} has unusable preprocessing settings: {problem}")
    modules = tm.attention_modules(model)
    if len(modules) != layers:
        raise SourceError(f"{folder}: {len(modules)} attention modules for {named or f'{layers} layers'}; the library "
                          "road reads one attention per layer")
    return modules


def _built(folder: Path, config_json: Mapping, origin: str, map_location) -> torch.nn.Module:
    """The folder's class (``architectures[0]``) built as ``transformers_models.open_library`` builds one: its
    declared sizes bounded, on the meta device first and every tensor looked up in the weights' headers, then read
    (not on ``map_location="meta"``), its attention routed through the recording function over SDPA."""

    config, cls = tm.folder_class(folder, config_json, origin)
    if not getattr(cls, "_supports_attention_backend", False):
        raise SourceError(f"{folder}: {cls.__name__}'s attention does not run through transformers' attention "
                          "interface; it cannot be recorded")
    name = {"attn_implementation": recording_attention.recording_name("sdpa")}
    return tm.read_class(cls, config, folder, origin, map_location, **name).eval()


def _patches_alone(model: torch.nn.Module, model_type: str, image_processor: Mapping | None, folder: Path,
                   origin: str, meta: bool) -> Checkpoint:
    """A vision model whose tokens are its patches alone (Pixtral's, Molmo 2's) in the library road's
    ``Checkpoint``: no prefix token, its input fed as its forward takes it (``_OneImage``, ``_Patches``)."""
    config = model.config
    try:
        patch = tm._pair(tm.config_patch(config), "patch_size")
        channels = int(getattr(config, "num_channels", 3))
        own = tm._pair(tm.config_size(config), "image_size")
        processor = dict(image_processor or {})
        if model_type == "pixtral":  # its longest-edge resize keeps the aspect: here its config's size
            processor.update(size={"height": own[0], "width": own[1]}, do_pad=False)
        stand_in = ViTConfig(image_size=own if own[0] != own[1] else own[0],
                             patch_size=patch if patch[0] != patch[1] else patch[0], num_channels=channels,
                             num_classes=0)
        preprocessing = hf_preprocessing(processor or None, stand_in, type(model).__name__)
        if model_type == "molmo2_vision" and tuple(preprocessing.image_hw) != own:
            raise ValueError(f"its image processor asks for {preprocessing.size_label}-px images, but its position "
                             f"table holds {own[0]}x{own[1]} px")
        if model_type == "molmo2_vision" and patch[0] != patch[1]:
            raise ValueError(f"patch_size {patch} is not square, as Molmo 2's patches are")
    except (ValueError, TypeError, AttributeError) as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None
    modules = layer_attentions(model, preprocessing, stand_in, folder, int(config.num_hidden_layers))
    entry = _OneImage(model) if model_type == "pixtral" else _Patches(model, patch[0], own)
    layout = tm.LibraryLayout(0, patch, tuple(preprocessing.image_hw))
    wrapped = tm.LibraryModel(model, layout, modules, model, entry)
    if meta:
        problem = tm._layout_problem(wrapped, channels, True)
        if problem:
            raise SourceError(f"{folder}: {problem}")
    return tm._finish_library(wrapped, [], preprocessing, folder, type(model).__name__, image_processor is None)
