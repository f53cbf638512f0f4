"""The model in the user's hands: a live ``torch.nn.Module`` opened as it is (``vit.load(module, ...)``).

Nothing is written to disk, nothing pickled, no weight copied: the module runs its own forward. A timm model goes the
road timm's folders go when no port reads them (``timm_models``: timm's explicit path for the asked layers, its
``pretrained_cfg`` read from the object), a transformers model the library road of its folder
(``transformers_models.library_checkpoint``, its config read from the object); an open_clip model opens its image
tower (``visual``). Any other module (the authors' DINOv2 and DINOv3, OpenAI's CLIP, a fine-tune wrapping a backbone
and a head in a class of the user's own) and an open_clip tower run under the recorder at the attention function
itself (``vit.core.attention_recorder``): its attention calls in order are the layers.

Where the tokens sit, and what a module that cannot be placed lacks, is the recorder's road's
(``recorded_road``): one forward traced on the meta device, its patch embedding, its input size and its calls' token
counts; ``grid=`` / ``prefix=`` override what inference cannot decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from vit.checkpoint import Checkpoint
from vit.sources.files import SourceError, _one_line
from vit.sources.library_road import transformers_models
from vit.sources.library_road.placing.patch_codes import one_reading
from vit.sources.library_road.recorded_road import _open_recorded, _pair, _statistics


def open_module(module: torch.nn.Module, image_size=None, mean: Sequence[float] | None = None,
                std: Sequence[float] | None = None, grid: tuple[int, int] | None = None,
                prefix: int | None = None) -> Checkpoint:
    """``module`` (a live ``torch.nn.Module``, put in eval mode) in a ``Checkpoint`` with ``road="library"``, as it
    is: a timm model through timm's road, an open_clip model's image tower and any other module through the
    recorder at the attention function. ``image_size`` the input it takes (a side or (height, width); default: what
    the module declares), ``mean`` / ``std`` its normalisation (default: what it declares), ``grid`` / ``prefix``
    the layout where inference cannot decide. SourceError (one line) for what cannot be placed or is not given."""
    origin = f"{type(module).__name__} (a module in hand)"
    if not isinstance(module, torch.nn.Module):
        raise SourceError(f"vit.load takes a path, a Hub id or a torch.nn.Module, not a {type(module).__name__}")
    module.eval()
    visual = getattr(module, "visual", None)
    if isinstance(visual, torch.nn.Module) and type(module).__module__.startswith("open_clip"):
        module = visual  # an open_clip model: its image tower, whose output is the image embedding
    try:
        with one_reading():  # the library road's reading of its patches' order, shared with the recorder's road
            return _open_in_hand(module, origin, image_size, mean, std, grid, prefix)
    except (ValueError, TypeError) as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None


def _open_in_hand(module: torch.nn.Module, origin: str, image_size, mean, std, grid, prefix) -> Checkpoint:
    """``open_module``'s road for ``module``: ValueError or TypeError for what it cannot place."""
    if grid is None and prefix is None:
        if type(module).__module__.startswith("timm."):
            return _open_timm(module, origin, image_size, mean, std)
        if type(module).__module__.startswith("transformers.") and hasattr(module, "config") and \
                transformers_models.attention_modules(module) and not _several_parts(module):  # else its
            # attention runs off the interface, or through it in several parts (Depth Pro's encoders)
            if _patchless(module):  # DETR's encoder over a CNN's map: as its folder goes (recorded_folder)
                from vit.sources.library_road.placing.image_part import ImagePart

                return _open_recorded(ImagePart(module), origin, image_size, mean, std, grid, prefix)
            try:
                return _open_transformers(module, origin, image_size, mean, std)
            except ValueError as refused:  # a backbone's windows or a head's decoders: as its folder goes
                # (backbone_parts), its backbone fed pixels alone: its own where it is one (LW-DETR's ViT)
                from vit.sources.library_road.placing import backbone_alone

                backbone = backbone_alone.answering(module, refused)
                if backbone is None:
                    raise
                size = image_size if image_size is not None else transformers_models.config_size(module.config)
                return _open_recorded(backbone_alone._Backbone(backbone), origin, size, mean, std, None, None)
    return _open_recorded(module, origin, image_size, mean, std, grid, prefix)


def _several_parts(model: torch.nn.Module) -> bool:
    """Whether the transformers ``model``'s own class runs its attention off transformers' interface and the one part
    of it the library road would record (``transformers_models._backbone_part``: a head's backbone) does not hold
    all of it: Depth Pro's patch, image and FOV encoders, three ViTs, each its own part. The recorder at the attention
    function sees them all."""
    cls = type(model)
    if getattr(cls, "_supports_attention_backend", False) or transformers_models.calls_interface(cls):
        return False
    part = transformers_models._backbone_part(model)
    if part is None:  # no part through the interface at all: the library road's refusal names it
        return False
    inside = {id(m) for m in part.modules()}
    return any(id(m) not in inside for m in transformers_models.attention_modules(model))


def _patchless(model: torch.nn.Module) -> bool:
    """Whether the library road would refuse the transformers ``model`` for want of a patch size in its config (DETR,
    Conditional DETR, Table Transformer: their encoder attends over a CNN's feature map), which the recorder at the
    attention function reads from the traced forward instead, as for its folder (``image_part.no_patch_size``)."""
    from vit.sources.library_road.placing.image_part import no_patch_size

    config = model.config.to_dict()
    return isinstance(config.get("model_type"), str) and bool(config["model_type"]) and no_patch_size(config)


def _open_timm(model: torch.nn.Module, origin: str, image_size, mean, std) -> Checkpoint:
    """A timm model object on timm's road (``timm_models._checkpoint``), its ``pretrained_cfg`` read from it; the
    keywords override its input size and statistics."""
    from vit.sources.library_road import timm_models
    from vit.sources.ports.libraries import import_timm

    cfg = dict(getattr(model, "pretrained_cfg", None) or {})
    if mean is not None or std is not None or cfg.get("mean") is None or cfg.get("std") is None:
        cfg["mean"], cfg["std"] = _statistics(model, mean, std)
    own = getattr(getattr(model, "patch_embed", None), "img_size", None)  # what the object was built for, over
    size = image_size if image_size is not None else own  # its pretrained_cfg's input_size (a default's)
    args = {}
    if size is not None:
        args["img_size"] = list(_pair(tuple(size) if isinstance(size, list) else size, "image_size"))
    name = str(cfg.get("architecture") or type(model).__name__)
    n = int(getattr(model, "num_classes", 0) or 0)
    try:
        return timm_models._checkpoint(
            Path(f"timm:{name}"), origin, model, model,
            lambda stand_in: import_timm.preprocessing_from_timm(name, stand_in, cfg, args),
            [f"class {i}" for i in range(n)], "module", f"timm:{name}", False)
    except SourceError as e:
        raise ValueError(str(e).partition(": ")[2] or str(e)) from None



def _open_transformers(model: torch.nn.Module, origin: str, image_size, mean, std) -> Checkpoint:
    """A transformers model object on transformers' library road (``transformers_models.library_checkpoint``), its
    config read from it, the keywords its image processor (a transformers model carries none): a resize straight to
    ``image_size`` (default its config's) and ``mean`` / ``std``, which it does not declare."""
    from vit.sources.library_road import transformers_models

    problem = transformers_models.declared_problem(model.config.to_dict())
    if problem:
        raise ValueError(problem)
    if mean is None or std is None:
        raise ValueError(f"{type(model).__name__} declares no normalisation (its image processor does): give mean= "
                         "and std= (its processor's image_mean and image_std)")
    size = image_size if image_size is not None else transformers_models.config_size(model.config)
    if size is None:
        raise ValueError(f"{type(model).__name__}'s config has no image_size: give image_size=(height, width)")
    h, w = _pair(tuple(size) if isinstance(size, list) else size, "image_size")
    processor = {"do_resize": True, "size": {"height": h, "width": w}, "do_center_crop": False,
                 "do_normalize": True, "image_mean": [float(v) for v in mean], "image_std": [float(v) for v in std]}
    try:
        checkpoint = transformers_models.library_checkpoint(model, processor, Path(type(model).__name__), origin)
    except SourceError as e:
        raise ValueError(str(e).partition(": ")[2] or str(e)) from None
    checkpoint.path = None
    checkpoint.metadata["source"]["kind"] = "module"
    checkpoint.metadata["source"]["path"] = None
    return checkpoint
