"""A transformers folder whose attention runs off transformers' attention interface (ViTDet, BLIP's vision, ...), or
on it but with no patch size in its config for the library road to place its tokens by (SigLIP's classifier, whose
patch size sits in its ``vision_config``; a dual encoder; DETR's encoder over a CNN's map): built as transformers
builds it and opened through the recorder at the attention function itself (``module_road``,
``vit.core.attention_recorder``), which sees the softmax (or ``F.scaled_dot_product_attention``) its attention modules
compute and reads the patch embedding from the traced forward. A model that also reads text (a dual encoder) runs
its image features (``get_image_features``); a classifier's output is its logits.

The folder's image processor says the input size and the normalisation (the module carries neither); where the
recorder cannot place the model's tokens either (windows, pooled stages, group tokens), the folder is refused in one
line naming what is missing.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path

import torch

from vit.checkpoint import Checkpoint
from vit.sources.files import (
    SourceError,
    library_error_line,
    library_errors,
    loading_problem,
    quiet_transformers,
)
from vit.sources.library_road.placing.image_part import ImagePart, no_patch_size  # noqa: F401 - its names


def off_interface(config_json: Mapping) -> bool:
    """Whether the folder's model class (and no backbone of it) runs its attention off transformers' attention
    interface: what the library road cannot record and the recorder at the attention function may."""
    from transformers import CONFIG_MAPPING

    from vit.sources.library_road import transformers_models as tm

    try:
        cls = tm._model_class(config_json, CONFIG_MAPPING[config_json["model_type"]])
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    return not (getattr(cls, "_supports_attention_backend", False) or tm.calls_interface(cls)
                or tm._backbone_class(config_json) is not None)


def open_recorded_folder(folder: Path, config_json: Mapping, image_processor: Mapping | None, refusal: str,
                         map_location: str | torch.device = "cpu") -> Checkpoint:
    """The folder's model as transformers builds it, through the recorder at the attention function, its input size
    and ``image_mean`` / ``image_std`` from ``image_processor``. SourceError (one line): ``refusal`` (what the library
    road says of it) where its attention is not off the interface, else what the recorder cannot place."""
    import transformers

    from vit.sources.library_road import module_road
    from vit.sources.library_road import transformers_models as tm

    patchless = not off_interface(config_json)
    if patchless and not no_patch_size(config_json):
        raise SourceError(refusal)
    model_type = config_json["model_type"]
    processor = dict(image_processor or {})
    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        cls = tm._model_class(config_json, type(config))
        if torch.device(map_location).type == "meta":
            with torch.device("meta"):
                model = cls._from_config(config)
        else:
            with quiet_transformers():
                model, loaded = cls.from_pretrained(folder, local_files_only=True, trust_remote_code=False,
                                                    dtype=torch.float32, output_loading_info=True)
            wrong = loading_problem(loaded)
            if wrong:
                raise SourceError(f"{folder} is refused: {wrong}")
            model = model.to(map_location)
        size = tm.input_hw(config, processor)
    except library_errors() as e:  # a config's strict validation too (TimmBackbone's from_pretrained takes the
        # folder for a timm name): one line
        if patchless:  # the library road's refusal first: it names what is missing
            raise SourceError(f"{refusal}; nor can the recorder at the attention function open it: "
                              f"{library_error_line(e)}") from None
        raise SourceError(f"{folder} ({model_type}, opened as transformers builds it): "
                          f"{library_error_line(e)}") from None
    takes = inspect.signature(type(model).forward).parameters
    if "input_ids" in takes and not any(name.startswith("pixel_values") for name in takes):  # ImageGPT: its
        # processor quantises the pixels (a video model's pixel_values_videos beside its text's input_ids is not it)
        return _colour_tokens(folder, model, processor, size, refusal)
    mean, std = processor.get("image_mean"), processor.get("image_std")
    if image_processor is not None and (processor.get("do_normalize") is False or not processor.get("do_normalize")
                                        and (mean is None or std is None)):
        # a processor that does not normalise (GLPN's, SuperPoint's: a rescale to [0, 1] only): as it feeds the model
        mean, std = (0.0,) * int(getattr(config, "num_channels", 3)), (1.0,) * int(getattr(config, "num_channels", 3))
    if mean is None or std is None:
        raise SourceError(f"{refusal}; nor can the recorder at the attention function open it, as the folder has no "
                          "image processor declaring its image_mean and image_std")
    try:
        checkpoint = module_road.open_module(ImagePart(model) if patchless else model, image_size=size, mean=mean,
                                             std=std)
    except SourceError as e:
        reason = str(e).partition(": ")[2] or str(e)
        if patchless:
            raise SourceError(f"{refusal}; nor can the recorder at the attention function place it: {reason}") from None
        raise SourceError(f"{folder}: {model_type} has no port here, its attention runs off transformers' attention "
                          f"interface, and the recorder at the attention function cannot place it: {reason}") from None
    checkpoint.path = folder
    checkpoint.metadata["source"].update(kind="library", path=str(folder))
    return checkpoint


def _colour_tokens(folder: Path, model: torch.nn.Module, processor: Mapping, size: tuple[int, int],
                   refusal: str) -> Checkpoint:
    """ImageGPT's folder: its pixels quantised to its processor's colour clusters (``placing.colour_tokens``), each
    pixel a token on the image's grid; SourceError (one line) where the processor declares no clusters."""
    from vit.sources.library_road import module_road
    from vit.sources.library_road.placing.colour_tokens import ColourTokens, clusters_of

    clusters = clusters_of(processor)
    if clusters is None:
        raise SourceError(f"{refusal}; nor can the recorder at the attention function feed it: its forward reads token "
                          "ids (input_ids: each pixel's nearest colour cluster), and its image processor declares no "
                          "clusters to quantise an image by")
    mean, std = processor.get("image_mean") or (0.5,) * 3, processor.get("image_std") or (0.5,) * 3
    try:
        checkpoint = module_road.open_module(ColourTokens(model, clusters), image_size=size, mean=mean, std=std,
                                             grid=size)  # one pixel a token
    except SourceError as e:
        reason = str(e).partition(": ")[2] or str(e)
        raise SourceError(f"{refusal}; nor can the recorder at the attention function place it: {reason}") from None
    checkpoint.path = folder
    checkpoint.metadata["source"].update(kind="library", path=str(folder))
    return checkpoint


def unported_class(refusal: str, library_road: bool, folder: Path, config_json: Mapping, processor,
                   map_location: str | torch.device = "cpu") -> Checkpoint:
    """A folder of a model_type a port reads but of a class it does not (SigLIP's classifier beside its ported dual
    encoder), where ``vit.load`` asks (``library_road``): as transformers builds that class, on the library road where
    it takes it, else through the recorder at the attention function; else ``refusal`` (the port's one line).
    ``processor(folder)``: its image processor's settings."""
    import transformers

    from vit.sources.library_road import transformers_models as tm

    named = config_json.get("architectures")
    if not library_road or not (isinstance(named, list) and named and isinstance(
            getattr(transformers, str(named[0]), None), type)):
        raise SourceError(refusal)
    if tm.opens(config_json):
        return tm.open_library(folder, config_json, processor(folder), map_location)
    from vit.sources.library_road import vision_parts

    if vision_parts.takes(config_json) and named[0] in vision_parts.NAFLEX:  # SigLIP 2's classifier: its patches
        return vision_parts.open_vision_part(folder, config_json, processor(folder), map_location)
    missing = tm.missing_piece(config_json)
    return open_recorded_folder(folder, config_json, processor(folder), f"{refusal}; as transformers builds it "
                                f"{missing or 'the library road does not take it'}", map_location)


def other_class(folder: Path, config_json: Mapping, family: tuple, library_road: bool, processor,
                map_location: str | torch.device = "cpu") -> Checkpoint | None:
    """``unported_class`` for a folder of a 2025-26 family (``family``: its port's module and the classes it reads)
    whose config names another of transformers' classes (SigLIP's classifier), where ``vit.load`` asks; None where
    the port reads the class, or refuses it by name (its module's ``REFUSED``)."""
    module, ported = family
    named = config_json.get("architectures")
    name = str(named[0]) if isinstance(named, list) and named else None
    if not library_road or name is None or name in ported or name in getattr(module, "REFUSED", {}):
        return None
    refusal = (f"HF architecture {name} ({folder}) is not supported; supported: {', '.join(ported)} for "
               f"{config_json.get('model_type')}")
    return unported_class(refusal, library_road, folder, config_json, processor, map_location)
