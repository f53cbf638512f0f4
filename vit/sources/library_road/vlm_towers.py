"""A vision-language model's class in one of transformers' vision auto-mappings (issue 117, item 6), whose patch size
sits in its ``vision_config`` beside a language model (``text_config``): Cohere 2 Vision's ``Cohere2VisionModel``
(feature extraction), ShieldGemma 2's ``ShieldGemma2ForImageClassification``. Its vision tower is what ``vit.load``
opens, as a whole VLM folder's tower opens (the port's VLM towers, ``vision_parts``' image part): the tower's own
class for its ``vision_config`` (transformers' ``AutoModel`` mapping: SigLIP's ``SiglipVisionModel``) built alone,
its weights read from the folder's files under the one prefix that holds every tensor of it (``vision_tower.``,
``model.model.vision_tower.``), the language model never built nor read. Its attention runs through transformers'
attention interface, recorded and placed as any library-road model's (``transformers_models.library_checkpoint``),
at the one input its image processor's size names (Cohere 2 Vision's processor also cuts an image into tiles of that
size: the tower is shown the image as one tile). The model's answers are ``vit.ask_vlm``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from vit.checkpoint import Checkpoint
from vit.core import recording_attention
from vit.sources.files import SourceError
from vit.sources.library_road import transformers_models as tm
from vit.sources.library_road.class_reading import read_part

# transformers' auto-mappings of vision models (``MODEL_FOR_<name>_MAPPING_NAMES``): a VLM listed in one is opened
# as its tower; any other VLM (GLM-4.1V's) keeps its refusal and answers through ``vit.ask_vlm``
VISION_MAPPINGS = ("IMAGE_CLASSIFICATION", "IMAGE", "BACKBONE", "DEPTH_ESTIMATION", "SEMANTIC_SEGMENTATION",
                   "INSTANCE_SEGMENTATION", "UNIVERSAL_SEGMENTATION", "ZERO_SHOT_IMAGE_CLASSIFICATION")


def takes(config_json: Mapping) -> bool:
    """Whether the folder's class (``architectures[0]``) is the one a vision auto-mapping of transformers lists for
    its model_type (``VISION_MAPPINGS``) and config.json names a vision tower with a patch size (``vision_config``,
    of a model_type transformers knows) beside a language model (``text_config``): read from the JSON and
    transformers' registries, nothing built."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto import modeling_auto

    named = config_json.get("architectures")
    name = str(named[0]) if isinstance(named, list) and named else None
    listed = {modeling_auto.__dict__.get(f"MODEL_FOR_{m}_MAPPING_NAMES", {}).get(config_json.get("model_type"))
              for m in VISION_MAPPINGS} if isinstance(config_json.get("model_type"), str) else set()
    vision, text = config_json.get("vision_config"), config_json.get("text_config")
    return (name is not None and name in listed and isinstance(vision, Mapping) and "patch_size" in vision
            and isinstance(text, Mapping) and isinstance(vision.get("model_type"), str)
            and vision["model_type"] in CONFIG_MAPPING)


def open_tower(folder: Path, config_json: Mapping, image_processor: Mapping | None,
               map_location: str | torch.device = "cpu") -> Checkpoint:
    """The folder's vision tower (``takes``) alone, as transformers builds it, in a ``Checkpoint`` of the library road.
    SourceError (one line) for what it cannot build, read or place."""
    import transformers

    model_type = str(config_json.get("model_type"))
    origin = f"{folder} ({model_type}'s vision tower, opened as transformers builds it)"
    config, whole = tm.folder_class(folder, config_json, origin)
    vision = getattr(config, "vision_config", None)
    try:
        cls = transformers.AutoModel._model_mapping[type(vision)]
    except (KeyError, TypeError, ValueError) as e:
        raise SourceError(f"{origin}: transformers has no model for its vision_config ({type(e).__name__})") from None
    flagged = bool(getattr(cls, "_supports_attention_backend", False))
    name = {"attn_implementation": recording_attention.recording_name("sdpa")} if flagged else {}
    tower, prefix = read_part(cls, vision, folder, origin, map_location, **name)
    meta = torch.device(map_location).type == "meta"
    checkpoint = tm.library_checkpoint(tower.eval(), image_processor, folder, origin, meta)
    architecture = f"hf:{whole.__name__}"
    checkpoint.metadata["source"]["architecture"] = checkpoint.metadata["architecture"] = architecture
    checkpoint.metadata["vision_part"] = prefix.rstrip(".")
    return checkpoint
