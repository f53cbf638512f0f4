"""The door's road for a Hugging Face folder (``vit.sources.open``): which module reads a ``config.json``'s
model_type (HF ViT, DeiT, DINOv2; the 2025-26 families; a vision-language model's tower; a plugin's family), its
opening, and for a model_type no port reads, the library road (``vit.sources.library_road``) or the refusal that
says why not."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from vit import registry
from vit.checkpoint import Checkpoint, CheckpointError, Preprocessing
from vit.model import ViTConfig
from vit.sources.files import SourceError, _one_line, read_json
from vit.sources.hf_preprocessing import hf_preprocessing, whole_patches
from vit.sources.library_road import (
    backbone_parts,
    recorded_folder,
    transformers_models,
    vision_parts,
    vlm_towers,
)
from vit.sources.open_shared import _config, _finish, build_model, default_class_names, unsupported
from vit.sources.ports.families import (
    hf,
    import_aimv2,
    import_beit,
    import_clip,
    import_dinov3,
    import_hiera,
    import_sam,
    import_siglip,
    import_swin,
)
from vit.sources.ports.families.video_ports import import_timesformer, import_videomae, import_vivit, import_vjepa2
from vit.sources.vlm import import_internvl, import_qwen, import_vlm
from vit.sources.weights_files import read_hf_weights, shard_index

# model_type -> (the headless architecture, the classifier one, the one with a teacher head), for configs
# written without "architectures".
_HF_MODEL_TYPES = {"vit": ("ViTModel", "ViTForImageClassification", None),
                   "deit": ("DeiTModel", "DeiTForImageClassification", "DeiTForImageClassificationWithTeacher"),
                   "dinov2": ("Dinov2Model", "Dinov2ForImageClassification", None),
                   "dinov2_with_registers": ("Dinov2WithRegistersModel", "Dinov2WithRegistersForImageClassification",
                                             None),
                   "vit_mae": ("ViTMAEModel", "ViTMAEModel", None)}


def hf_family(architecture: str) -> str:
    """The model an HF architecture is of: 'Dinov2' of ``Dinov2ForImageClassification``, 'CLIP' of
    ``CLIPVisionModelWithProjection``, 'Swin' of ``SwinForMaskedImageModeling``."""
    return re.match(r"(.+?)(?:Vision)?(?:Model|For[A-Z])", architecture + "Model").group(1)


def hf_architecture(config_json: Mapping, state: Mapping[str, torch.Tensor] | None = None) -> str | None:
    """``architectures[0]``, or for a config without it the architecture its model_type and weights imply."""
    architectures = config_json.get("architectures")
    if isinstance(architectures, list) and architectures:
        return str(architectures[0])
    types = _HF_MODEL_TYPES.get(str(config_json.get("model_type")))
    if types is None or state is None:
        return None
    if types[2] and "distillation_classifier.weight" in state:
        return types[2]
    if types[0] == "ViTMAEModel" and any(k.startswith("decoder.") for k in state):
        return "ViTMAEForPreTraining"
    return types[1] if "classifier.weight" in state else types[0]


def hf_class_names(hf_config: Mapping, num_classes: int) -> list[str]:
    """From ``id2label`` (keys are strings of indices), else the defaults."""
    labels = hf_config.get("id2label")
    if isinstance(labels, Mapping) and len(labels) == num_classes:
        try:
            by_index = {int(k): str(v) for k, v in labels.items()}
        except ValueError:
            by_index = {}
        if sorted(by_index) == list(range(num_classes)):
            names = [by_index[i] for i in range(num_classes)]
            if num_classes == 1000 and names[0] == "LABEL_0":
                return default_class_names(num_classes)
            return names
    return default_class_names(num_classes)


# model_type -> (the module that reads it, the architectures it opens)
HF_FAMILIES = {"dinov3_vit": (import_dinov3, ("DINOv3ViTModel",)),
                "clip": (import_clip, ("CLIPModel",)),
                # MetaCLIP 2 is CLIP's architecture under another name, weight for weight (its tokenizer is its own)
                "metaclip_2": (import_clip, ("MetaClip2Model",)),
                "clip_vision_model": (import_clip, ("CLIPVisionModel", "CLIPVisionModelWithProjection")),
                "siglip": (import_siglip, ("SiglipModel",)),
                "siglip_vision_model": (import_siglip, ("SiglipVisionModel",)),
                "siglip2": (import_siglip, ("Siglip2Model",)),
                "siglip2_vision_model": (import_siglip, ("Siglip2VisionModel",)),
                "beit": (import_beit, ("BeitModel", "BeitForImageClassification")),
                "data2vec-vision": (import_beit, ("Data2VecVisionModel", "Data2VecVisionForImageClassification")),
                "sam": (import_sam, ("SamModel",)),
                "swin": (import_swin, ("SwinModel", "SwinForImageClassification")),
                "swinv2": (import_swin, ("Swinv2Model", "Swinv2ForImageClassification")),
                "hiera": (import_hiera, ("HieraModel", "HieraForImageClassification")),
                **{t: (import_hiera, (a,)) for t, a in import_hiera.SAM2_HF_ARCHITECTURES.items()},
                "sam_vision_model": (import_sam, ("SamVisionModel",)),
                # SAM-HQ's image encoder is SAM's, module for module and weight for weight (its HQ part is the decoder)
                "sam_hq_vision_model": (import_sam, ("SamHQVisionModel",)),
                "sam_hq": (import_sam, ("SamHQModel",)),  # the whole SAM-HQ: its image encoder, SAM's
                "aimv2": (import_aimv2, ("Aimv2Model",)),
                "aimv2_vision_model": (import_aimv2, ("Aimv2VisionModel",)),
                "qwen2_vl": (import_qwen, import_qwen.QWEN2_ARCHITECTURES),
                "qwen2_5_vl": (import_qwen, import_qwen.ARCHITECTURES),
                "qwen3_vl": (import_qwen, import_qwen.QWEN3_ARCHITECTURES),
                "qwen3_vl_moe": (import_qwen, import_qwen.QWEN3_MOE_ARCHITECTURES),
                "videomae": (import_videomae, tuple(import_videomae.ARCHITECTURES)),
                "vivit": (import_vivit, tuple(import_vivit.ARCHITECTURES)),
                "timesformer": (import_timesformer, tuple(import_timesformer.ARCHITECTURES)),
                "vjepa2": (import_vjepa2, import_vjepa2.ARCHITECTURES)}
HF_REFUSED: dict[str, str] = {}  # model_type -> one line on why it is not opened
HF_VLMS = {**import_vlm.ARCHITECTURES, **import_internvl.ARCHITECTURES}  # model_type -> the VLMs whose tower opens
# model_type -> the module that reads a VLM's tower and projector (reading, wanted, config_from_hf, ...)
VLM_MODULES = {**dict.fromkeys(import_vlm.ARCHITECTURES, import_vlm),
               **dict.fromkeys(import_internvl.ARCHITECTURES, import_internvl)}
# every config.json model_type the built-ins open: the registry's families' (tests/test_registry.py holds them equal;
# registry.hf_model_types() adds the plugins')
HF_MODEL_TYPES = (*_HF_MODEL_TYPES, *HF_FAMILIES, *HF_VLMS)
HF_ARCHITECTURES = (*hf.ARCHITECTURES, *(a for names in (*(n for _, n in HF_FAMILIES.values()), *HF_VLMS.values())
                                         for a in names))


def tower_tensors(config_json: Mapping) -> Callable[[str], bool] | None:
    """Which tensors of an HF folder opening reads when not all: a vision-language model's tower and projector, never
    its language model (``import_vlm.wanted``, a family module's own ``wanted``: Qwen2.5-VL); None for the rest."""
    model_type = config_json.get("model_type")
    if model_type in HF_VLMS:
        return VLM_MODULES[model_type].wanted(config_json)
    wanted = getattr(HF_FAMILIES.get(model_type, (None,))[0], "wanted", None)
    return None if wanted is None else wanted(config_json)


def needed_shards(folder: Path) -> set[str] | None:
    """The shards of a sharded HF folder that opening reads (those its index lists for ``tower_tensors``), from its
    config.json and index alone: what a Hub download of a vision-language model needs; None: every weights file."""
    if not (folder / "config.json").is_file():
        return None
    wanted = _config(str(folder), lambda: tower_tensors(read_json(folder / "config.json")))
    index = shard_index(folder) if wanted is not None else None
    return None if index is None else {shard for key, shard in index[1].items() if wanted(key)}


def hf_family_config(folder: Path, config_json: Mapping) -> tuple[ViTConfig, str]:
    """Our config and the architecture of an HF folder of a 2025-26 family (``HF_FAMILIES``), from config.json."""
    model_type = str(config_json.get("model_type"))
    module, architectures = HF_FAMILIES[model_type]
    architecture = hf_architecture(config_json) or architectures[0]
    refused = getattr(module, "REFUSED", {}).get(architecture)  # a family's architecture it names the reason for
    if refused:
        raise SourceError(f"{folder}: {refused}")
    if architecture not in architectures:
        raise SourceError(f"HF architecture {architecture} ({folder}) is not supported; supported: "
                          f"{', '.join(architectures)} for {model_type}")
    return _config(f"{folder} ({architecture})", lambda: module.config_from_hf(config_json)), architecture


def open_hf_family(folder: Path, config_json: dict, map_location: str | torch.device = "cpu") -> Checkpoint:
    """An HF folder of a 2025-26 family (``HF_FAMILIES``): its module maps config and weights."""
    config, architecture = hf_family_config(folder, config_json)
    module = HF_FAMILIES[str(config_json.get("model_type"))][0]
    origin = f"{folder} ({architecture})"
    state = read_hf_weights(folder, map_location, tower_tensors(config_json))
    try:
        ours = module.state_dict_from_hf(state, config)
    except (ValueError, KeyError) as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None
    model = build_model(config, ours, origin, map_location)
    processor = hf_image_processor(folder)
    preprocessing = whole_patches(hf_preprocessing(processor, config, architecture), config,
                                  declared_side(config_json))
    checkpoint = _finish(model, hf_class_names(config_json, config.num_classes), preprocessing, folder, "hf",
                         f"hf:{architecture}")
    note = tower_note(config_json, config, checkpoint.preprocessing)
    if note:
        checkpoint.metadata["tower"] = note
    return checkpoint


def declared_side(config_json: Mapping) -> int | None:
    """The input side a config.json declares (its vision config's ``image_size``, where it is one number), which
    ``whole_patches`` compares with the side our model is built at."""
    vision = config_json.get("vision_config") if isinstance(config_json.get("vision_config"), Mapping) else config_json
    side = vision.get("image_size")
    return side if isinstance(side, int) and not isinstance(side, bool) else None


def tower_note(config_json: Mapping, config: ViTConfig, preprocessing: Preprocessing) -> str | None:
    """``metadata["tower"]`` of a family's vision-language tower (Qwen2.5-VL, Qwen3-VL: where its language model reads
    it, what it is shown), as ``open_vlm`` writes a LLaVA's; None for a model of its own."""
    return import_qwen.tower_note(config_json, config, preprocessing) if config.projector == "qwen" else None


def hf_image_processor(folder: Path) -> dict | None:
    """A folder's image processor settings as transformers 5 finds them: ``processor_config.json``'s
    ``image_processor`` (what a processor's ``save_pretrained`` writes), else ``preprocessor_config.json``."""
    if (folder / "processor_config.json").is_file():
        nested = read_json(folder / "processor_config.json").get("image_processor")
        if isinstance(nested, Mapping):
            return dict(nested)
    path = folder / "preprocessor_config.json"
    return read_json(path) if path.is_file() else None


def open_vlm(folder: Path, config_json: dict, map_location: str | torch.device = "cpu") -> Checkpoint:
    """The vision tower and projector of an HF vision-language model folder (``HF_VLMS``,
    ``vit.sources.vlm.import_vlm``, ``vit.sources.vlm.import_internvl``): only their tensors are read, the language
    model's never (``map_location="meta"``: only the headers of the shards that hold them). The metadata's ``tower``
    says what the tower is."""
    model_type = str(config_json.get("model_type"))
    architecture = hf_architecture(config_json) or HF_VLMS[model_type][0]
    if architecture not in HF_VLMS[model_type]:
        raise SourceError(f"HF architecture {architecture} ({folder}) is not supported; supported: "
                          f"{', '.join(HF_VLMS[model_type])} for {model_type}")
    origin = f"{folder} ({architecture})"
    module = VLM_MODULES[model_type]
    wanted = _config(origin, lambda: module.wanted(config_json))
    state = read_hf_weights(folder, map_location, wanted)
    config = _config(origin, lambda: module.config_from_hf(config_json, state))
    try:
        ours = module.state_dict_from_hf(state, config)
    except (ValueError, KeyError) as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None
    state.clear()  # q, k and v apart, now in ours as one: not held twice while the model is built
    model = build_model(config, ours, origin, map_location)
    try:
        processor, shown = module.image_processor(hf_image_processor(folder), config_json)
    except (ValueError, TypeError, AttributeError) as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None
    preprocessing = whole_patches(hf_preprocessing(processor, config, module.tower_architecture(config_json)),
                                  config, declared_side(config_json))
    checkpoint = _finish(model, [], preprocessing, folder, "hf", f"hf:{architecture}",
                         None if processor is not None else "preprocessor_config.json")
    checkpoint.metadata["tower"] = " ".join(filter(None, (module.reading(config_json).note, shown)))
    return checkpoint


def open_plugin_family(family: registry.Family, folder: Path, config_json: dict,
                       map_location: str | torch.device = "cpu") -> Checkpoint:
    """A folder of a plugin's family (``vit.registry``, entry-point group ``vit.families``), opened by its ``open``;
    whatever it raises but a ``CheckpointError`` is one line naming the plugin, as is a result that is no
    ``Checkpoint``."""
    who = f"{folder} ({family.name}, plugin {family.plugin})"
    try:
        checkpoint = family.open(folder, config_json, map_location)
    except CheckpointError:
        raise
    except Exception as e:  # third-party code: one line naming it, never a traceback
        raise SourceError(f"{who}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    if not isinstance(checkpoint, Checkpoint):
        raise SourceError(f"{who}: its open gave a {type(checkpoint).__name__}, not a vit.checkpoint.Checkpoint")
    return checkpoint


def open_hf_folder(folder: Path, config_json: dict, map_location: str | torch.device = "cpu",
                   library_road: bool = False) -> Checkpoint:
    """An HF ``save_pretrained`` folder of a supported architecture (a plugin's family's model_type too); with
    ``library_road``, a transformers vision model no port reads, as transformers builds it
    (``vit.sources.library_road.transformers_models``)."""
    family = registry.plugin_family(config_json.get("model_type"))
    if family is not None:
        return open_plugin_family(family, folder, config_json, map_location)
    if config_json.get("model_type") in HF_VLMS:
        return open_vlm(folder, config_json, map_location)
    if config_json.get("model_type") in HF_FAMILIES:  # a class its port does not read: transformers' own, for vit.load
        return recorded_folder.other_class(folder, config_json, HF_FAMILIES[config_json["model_type"]], library_road,
            hf_image_processor, map_location) or open_hf_family(folder, config_json, map_location)
    if config_json.get("model_type") in HF_REFUSED:
        raise SourceError(f"{folder}: {HF_REFUSED[config_json['model_type']]}")
    if config_json.get("model_type") not in registry.hf_model_types():  # no port: the library road, where it runs
        if transformers_models.opens(config_json) and library_road:  # a head's backbone alone where its decoders
            # attend too (Mask2Former's)
            return backbone_parts.open_library(folder, config_json, hf_image_processor(folder), map_location)
        missing = transformers_models.missing_piece(config_json) if library_road else None
        if missing:  # transformers knows it, no port reads it, and the library road cannot take it: say why
            answers = ("; it answers questions about an image as transformers builds it: vit.ask_vlm(folder, image, "
                       "question), vit-predict --ask" if registry.vlm_architecture(str(config_json.get("model_type")))
                       else "")
            if answers and vision_parts.takes(config_json):  # a VLM family's dual encoder (BlipModel): its image part
                return vision_parts.open_vision_part(folder, config_json, hf_image_processor(folder), map_location)
            if answers and vlm_towers.takes(config_json):  # a VLM in a vision auto-mapping: its tower alone
                return vlm_towers.open_tower(folder, config_json, hf_image_processor(folder), map_location)
            refusal = f"{folder}: {config_json['model_type']} has no port here, and as transformers builds it {missing}"
            if answers:  # a whole VLM is not an image model for the recorder: it answers questions
                raise SourceError(refusal + answers)
            return recorded_folder.open_recorded_folder(folder, config_json, hf_image_processor(folder), refusal,
                                                        map_location)  # the recorder's road, or why not
        if transformers_models.opens(config_json):  # the callers that read our ViT: ports only, for now
            raise SourceError(f"{folder}: {config_json['model_type']} has no port; it opens as transformers builds it "
                              "in the notebook API (vit.load) and the explorer, which draw its attention and rollout, "
                              "and vit-predict and vit-evaluate classify with it; the rest reads ports only for now "
                              "(issue 91)")
    architecture = hf_architecture(config_json)
    if architecture is None and "model_type" not in config_json:  # a from-scratch config without its weights
        raise SourceError(f"{folder}: its config.json is no Hugging Face or timm config (no model_type, "
                          "architectures or architecture) and the folder holds no single weights file to open with "
                          "it; open the weights file itself")
    if architecture is None and config_json.get("model_type") not in _HF_MODEL_TYPES:
        model_type = str(config_json.get("model_type"))
        raise SourceError(unsupported(f"HF model type {model_type!r} ({folder})", model_type,
                                      registry.hf_model_types()))
    if architecture is not None and architecture not in hf.ARCHITECTURES:  # transformers' own class, for vit.load
        return recorded_folder.unported_class(unsupported(f"HF architecture {architecture} ({folder})", architecture,
            HF_ARCHITECTURES, hf_family), library_road, folder, config_json, hf_image_processor, map_location)
    state = read_hf_weights(folder, map_location)
    architecture = architecture or hf_architecture(config_json, state)
    origin = f"{folder} ({architecture})"
    try:
        config = _config(origin, lambda: hf.config_from_hf(config_json, architecture))
    except SourceError as refused:  # a config the port does not read (a non-square size): transformers' own instead
        return transformers_models.instead_of_port(refused, library_road, folder, config_json, hf_image_processor,
                                                   map_location)
    try:
        ours = hf.state_dict_from_hf(state, config.num_layers, architecture)
    except ValueError as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None
    model = build_model(config, ours, origin, map_location)
    processor_path = folder / "preprocessor_config.json"
    processor = read_json(processor_path) if processor_path.is_file() else None
    return _finish(model, hf_class_names(config_json, config.num_classes),
                   hf_preprocessing(processor, config, architecture), folder, "hf", f"hf:{architecture}",
                   None if processor is not None else "preprocessor_config.json")
