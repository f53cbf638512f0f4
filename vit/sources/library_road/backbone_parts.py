"""A head around a backbone whose layers the library road cannot read as one attention a layer (issue 117, item 6):
Mask2Former, MaskFormer, OneFormer and UperNet over a Swin backbone, whose pixel decoder and transformer decoder
attend too (deformable attention, object queries over the image's features) besides the backbone's windowed stages.
The folder's own class is built whole, as transformers builds it (its weights checked as the folder holds them), and
its backbone (the one module of it with transformers' ``BackboneMixin``) is what the maps read: its attention calls
over the image's tokens are the layers, recorded by the recorder at the attention function and placed stage by stage
and window by window (``recorded_road``, ``layer_places``); the others are named in the checkpoint's metadata
(``other_attention``), never drawn. The backbone's features are the last block's tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from vit.checkpoint import Checkpoint
from vit.sources.files import SourceError, _one_line
from vit.sources.library_road.placing.backbone_alone import (  # noqa: F401 - its names, as before
    LAYOUT_REFUSALS,
    _Backbone,
    _is_backbone,
    answering,
    answers,
    backbone_of,
    own_backbone,
)


def open_library(folder: Path, config_json: Mapping, image_processor: Mapping | None,
                 map_location: str | torch.device = "cpu") -> Checkpoint:
    """``transformers_models.open_library``'s answer for the folder, or where it refuses the layout of a head around
    a backbone (``answers``), the folder's class built again and its backbone opened alone (``open_backbone``).
    SourceError (one line) as ``open_library``."""

    from vit.sources.library_road import transformers_models as tm

    try:
        return tm.open_library(folder, config_json, image_processor, map_location)
    except SourceError as refused:
        if not answers(refused):
            raise
        origin = f"{folder} ({config_json.get('model_type')}, opened as transformers builds it)"
        config, cls = tm.folder_class(folder, config_json, origin)
        if not isinstance(config_json.get("backbone_config"), Mapping) and not _is_backbone(cls):
            raise
        model = tm.read_class(cls, config, folder, origin, map_location).eval()
        backbone = answering(model, refused)
        if backbone is None:
            raise
        return open_backbone(model, backbone, image_processor, folder, refused)


def open_backbone(model: torch.nn.Module, backbone: torch.nn.Module, image_processor: Mapping | None, folder: Path,
                  refused: SourceError) -> Checkpoint:
    """``model``'s ``backbone`` in a ``Checkpoint`` of the library road, through the recorder at the attention
    function. SourceError: ``refused`` (the library road's line) and what the recorder could not place."""
    from vit.sources.library_road import module_road
    from vit.sources.library_road import transformers_models as tm

    processor = dict(image_processor or {})
    mean, std = processor.get("image_mean"), processor.get("image_std")
    try:
        if mean is None or std is None:
            raise ValueError("the folder has no image processor declaring its image_mean and image_std")
        size = tm.input_hw(model.config, processor)
        checkpoint = module_road.open_module(_Backbone(backbone), image_size=size, mean=mean, std=std)
    except (ValueError, TypeError, AttributeError, SourceError) as e:
        reason = str(e).partition(": ")[2] if isinstance(e, SourceError) else _one_line(e)
        raise SourceError(f"{refused}; nor its backbone alone: {reason or e}") from None
    names = {m: name for name, m in model.named_modules()}
    own = {id(m) for m in backbone.modules()}
    others = [names[m] for m in tm.attention_modules(model) if id(m) not in own]
    others += [name for m, name in names.items() if id(m) not in own and type(m).__name__.endswith(
        ("Attention", "MultiscaleDeformableAttention")) and name not in others and "." in name]
    prefix = f"{names[backbone]}."
    checkpoint.model.names = [prefix + n.removeprefix("backbone.") for n in checkpoint.model.names]
    whole = f"hf:{type(model).__name__}"
    checkpoint.path = folder
    checkpoint.metadata.update(architecture=whole, layers=checkpoint.model.names, other_attention=sorted(others))
    checkpoint.metadata["source"].update(kind="library", path=str(folder), architecture=whole)
    return checkpoint
