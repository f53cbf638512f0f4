"""A transformers model's backbone fed pixels alone (``backbone_parts``' folders, ``module_road``'s models in hand):
the wrapper the recorder's road runs, which backbone it is, and which of the library road's refusals the backbone
alone answers; apart from both so that neither imports the other."""

from __future__ import annotations

import torch


class _Backbone(torch.nn.Module):
    """The backbone alone, fed ``pixel_values``: its own output (feature maps), its attention the layers."""

    def __init__(self, backbone: torch.nn.Module):
        super().__init__()
        self.backbone = backbone

    def forward(self, pixel_values: torch.Tensor):
        return self.backbone(pixel_values=pixel_values)


# The library road's refusals this module answers: where its layers are not one attention a layer over one grid
# (the decoders' attention beside the backbone's; the backbone's stages and windows, its windows taken for pieces).
# Any other (its preprocessing, its weights) stands: the backbone alone is no way around it.
LAYOUT_REFUSALS = ("attention modules for", "patches the library road places", "pieces of one image at once")


def answers(refused: Exception) -> bool:
    """Whether ``refused`` (the library road's line for the whole model) is one of ``LAYOUT_REFUSALS``."""
    return any(words in str(refused) for words in LAYOUT_REFUSALS)


def answering(model: torch.nn.Module, refused: Exception) -> torch.nn.Module | None:
    """The backbone of ``model`` that answers ``refused`` (the library road's line for the whole model, one of
    ``LAYOUT_REFUSALS``): the one transformers backbone inside it (``backbone_of``), else ``model`` itself where it is
    one (``own_backbone``); None where the refusal is another (its preprocessing, its weights) or there is none."""
    if not answers(refused):
        return None
    return backbone_of(model) or own_backbone(model)


def _is_backbone(cls: type) -> bool:
    """Whether ``cls`` is a transformers backbone's class (``BackboneMixin``)."""
    from transformers.backbone_utils import BackboneMixin

    return isinstance(cls, type) and issubclass(cls, BackboneMixin)


def backbone_of(model: torch.nn.Module) -> torch.nn.Module | None:
    """The one module of ``model`` (not itself) that is a transformers backbone (``BackboneMixin``), or None."""
    found = [m for m in model.modules() if m is not model and _is_backbone(type(m))]
    return found[0] if len(found) == 1 else None


def own_backbone(model: torch.nn.Module) -> torch.nn.Module | None:
    """``model`` where it is a transformers backbone itself (LW-DETR's ViT, RF-DETR's DINOv2: windows its layers'
    token counts do not show, placed by the recorder's road), else None."""
    return model if _is_backbone(type(model)) else None
