"""A transformers folder whose attention runs off transformers' attention interface (ViTDet, BLIP's vision, ...):
built as transformers builds it and opened through the recorder at the attention function itself
(``module_road``, ``vit.core.attention_recorder``), which sees the softmax its attention modules compute.

The folder's image processor says the input size and the normalisation (the module carries neither); where the
recorder cannot place the model's tokens either (windows, pooled stages, group tokens), the folder is refused in one
line naming what is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from vit.checkpoint import Checkpoint
from vit.sources.files import SourceError, _one_line, loading_problem, quiet_transformers


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

    if not off_interface(config_json):
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
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError) as e:
        raise SourceError(f"{folder} ({model_type}, opened as transformers builds it): {_one_line(e)}") from None
    mean, std = processor.get("image_mean"), processor.get("image_std")
    if mean is None or std is None:
        raise SourceError(f"{refusal}; nor can the recorder at the attention function open it, as the folder has no "
                          "image processor declaring its image_mean and image_std")
    try:
        checkpoint = module_road.open_module(model, image_size=size, mean=mean, std=std)
    except SourceError as e:
        reason = str(e).partition(": ")[2] or str(e)
        raise SourceError(f"{folder}: {model_type} has no port here, its attention runs off transformers' attention "
                          f"interface, and the recorder at the attention function cannot place it: {reason}") from None
    checkpoint.path = folder
    checkpoint.metadata["source"].update(kind="library", path=str(folder))
    return checkpoint
