"""Whole folders as the Hub ships them whose patch size sits in a part's config (issue 117, item 6): a dual encoder or
a retrieval model (BLIP's ``BlipModel``, BLIP-2's ``Blip2ForImageTextRetrieval``) and SigLIP 2's classifier
(``Siglip2ForImageClassification``) are built whole, as transformers builds the folder's own class (its weights
checked as the folder holds them), and their image part (``vision_model``) is what the maps read: the part's
attention recorded on the road its own folder would take (``module_road.open_module``: transformers' attention
interface where it runs through it, else the recorder at the attention function).

- Only where the recorder's road (``recorded_folder``, the whole model run for its image features) does not take the
  folder: a family that also answers questions (BLIP's, BLIP-2's: refused there with ``vit.ask_vlm``'s pointer) and
  NaFlex input; a dual encoder of another family (Chinese-CLIP's, SigLIP's classifier) keeps that road.
- A model that answers in text (a ``language_model`` beside its vision tower: Cohere 2 Vision, ShieldGemma 2) is not
  taken here: it answers questions about an image (``vit.ask_vlm``).
- SigLIP 2's classifier takes NaFlex input, its image as flattened patches with their grid (``spatial_shapes``) and
  a mask: here each image is cut by transformers' own ``convert_image_to_patches`` (what its processor does) at the
  processor's one size, every patch real (no padding, no mask), and the classifier's logits are its output; the
  patches are row-major on that grid, no token before them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from vit.checkpoint import Checkpoint
from vit.sources.files import SourceError, _one_line
from vit.sources.library_road import transformers_models as tm

PART = "vision_model"  # the attribute the image part sits in
NAFLEX = ("Siglip2ForImageClassification",)  # classes whose part takes flattened patches and spatial_shapes


def takes(config_json: Mapping) -> bool:
    """Whether the folder's class (``architectures[0]``, one of transformers') is a model this module opens: a
    ``vision_model`` part with a patch size in its ``vision_config``, and no language model beside it. Read from
    transformers' class and config.json, nothing built."""
    import transformers

    named = config_json.get("architectures")
    name = str(named[0]) if isinstance(named, list) and named else None
    cls = getattr(transformers, name, None) if name else None
    vision = config_json.get("vision_config")
    if not isinstance(cls, type) or not isinstance(vision, Mapping) or "patch_size" not in vision:
        return False
    names = getattr(getattr(cls, "__init__", None), "__code__", None)
    names = names.co_names if names is not None else ()
    return PART in names and "language_model" not in names and not cls.can_generate()


class _NaFlexPart(torch.nn.Module):
    """SigLIP 2's classifier fed images ``(B, C, H, W)``: each cut into ``(gh * gw, p * p * C)`` patches by
    transformers' own ``convert_image_to_patches``, with its grid (``spatial_shapes``), every patch real (no padding,
    so no mask); out, its logits."""

    def __init__(self, model: torch.nn.Module, patch: int):
        super().__init__()
        self.model, self.patch = model, patch

    def forward(self, pixel_values: torch.Tensor):
        from transformers.models.siglip2.image_processing_siglip2 import convert_image_to_patches

        b, _, h, w = pixel_values.shape
        p = self.patch
        if h % p or w % p:
            raise ValueError(f"a {h}x{w}-px image is no whole number of its {p}-px patches")
        patches = torch.stack([convert_image_to_patches(image, p) for image in pixel_values])
        shapes = torch.tensor([[h // p, w // p]] * b)  # on the CPU, as its processor hands them: the sizes its
        # position table is resized to are read from them (on any device the pixels are on, the meta one too)
        # every patch real: no mask (what a mask of ones computes: its pooling the tokens' mean, no key masked)
        return self.model(pixel_values=patches, spatial_shapes=shapes).logits


def open_vision_part(folder: Path, config_json: Mapping, image_processor: Mapping | None,
                     map_location: str | torch.device = "cpu") -> Checkpoint:
    """The folder's class as transformers builds it, its ``vision_model`` in a ``Checkpoint`` of the library road
    (``takes`` is True). SourceError (one line) where it cannot be built or placed."""

    from vit.sources.library_road import module_road

    model_type = str(config_json.get("model_type"))
    origin = f"{folder} ({model_type}, opened as transformers builds it)"
    config, cls = tm.folder_class(folder, config_json, origin)
    model = tm.read_class(cls, config, folder, origin, map_location).eval()
    part = getattr(model, PART, None)
    processor = dict(image_processor or {})
    mean, std = processor.get("image_mean"), processor.get("image_std")
    if not isinstance(part, torch.nn.Module) or mean is None or std is None:
        raise SourceError(f"{origin}: " + ("it has no vision_model part" if not isinstance(part, torch.nn.Module)
                                           else "the folder has no image processor declaring its image_mean and "
                                           "image_std"))
    try:
        patch = tm._pair(tm.config_patch(part.config), "patch_size")
        if type(model).__name__ in NAFLEX:
            size = _naflex_size(processor, patch) if "max_num_patches" in processor else tm.input_hw(part.config,
                                                                                                       processor)
            checkpoint = module_road.open_module(_NaFlexPart(model, patch[0]), image_size=size, mean=mean, std=std)
            checkpoint.class_names = tm.class_names(config, len(checkpoint.class_names))
        else:
            checkpoint = module_road.open_module(part, image_size=tm.input_hw(part.config, processor), mean=mean,
                                                 std=std)
    except (ValueError, TypeError, AttributeError) as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None
    except SourceError as e:
        raise SourceError(f"{origin}: its {PART}: {str(e).partition(': ')[2] or e}") from None
    whole = f"hf:{type(model).__name__}"
    checkpoint.path = folder
    checkpoint.metadata["source"].update(kind="library", path=str(folder), architecture=whole)
    checkpoint.metadata["architecture"] = whole
    return checkpoint


def _naflex_size(processor: Mapping, patch: tuple[int, int]) -> tuple[int, int]:
    """The one input SigLIP 2's classifier is fed here: a square of ``max_num_patches`` whole patches (its processor
    resizes each image to that patch budget at its own aspect; here one square grid within it). A processor of
    another kind (a plain resize) is read as the library road reads it (``input_hw``)."""
    budget = processor.get("max_num_patches")
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= 4096:
        raise ValueError(f"its image processor's max_num_patches {str(budget)[:20]} is not a patch count from 1 to "
                         "4096")
    side = int(budget ** 0.5)
    while side * side > budget:
        side -= 1
    return tm._pair((side * patch[0], side * patch[1]), "image_size")
