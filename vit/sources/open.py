"""Open any ViT a user already has as our ``Checkpoint``: our ``.pt`` files, HF folders, timm and torchvision weights.

``open_source(path, arch=None)`` decides what ``path`` is:

- one of our checkpoints (``vit.checkpoint``), or a ``vit.train`` run folder (its ``best.pt``, else ``last.pt``);
- a Hugging Face ``save_pretrained`` folder (``config.json`` with ``architectures`` +
  ``model.safetensors`` or ``pytorch_model.bin``), e.g. a snapshot in the HF cache;
- a timm folder (``config.json`` with ``architecture``, ``pretrained_cfg``, ``label_names``)
  or a timm state dict file (``.safetensors``, ``.pth``) with ``arch="timm:NAME"``;
- a torchvision ``vit_*`` state dict file (recognised from its keys, or ``arch="torchvision:NAME"``);
- CLIP (``vit.sources.ports.families.import_clip``): open_clip state dicts and folders (``open_clip_config.json``),
  OpenAI's layout, HF ``clip`` / ``clip_vision_model`` folders; SigLIP (``vit.sources.ports.families.import_siglip``):
  HF ``siglip`` folders and SigLIP 2 NaFlex's ``siglip2`` ones;
- the vision tower (and projector) of a vision-language model (``vit.sources.vlm.import_vlm``): LLaVA 1.5 / NeXT /
  OneVision, PaliGemma and Gemma 3 folders, and InternVL 2.5 / 3 / 3.5 ``-hf`` ones
  (``vit.sources.vlm.import_internvl``),
  whose language model is never read;
- DINOv3 (``vit.sources.ports.families.import_dinov3``): HF ``dinov3_vit`` folders, timm ``vit_*_dinov3*`` weights,
  original ``facebookresearch/dinov3`` backbones (recognised from ``storage_tokens``, or ``arch="dinov3:NAME"``),
  with dino.txt's vision head and text tower (``import_dinotxt``: its head and text file, or a folder of the two);
- from-scratch ViTs (``vit.sources.ports.libraries.import_scratch``,
  ``vit.sources.ports.libraries.import_vit_pytorch``): the tutorials' models (tintn's ``experiments/NAME/`` folders, the
  MNIST tutorial's, the CIFAR-10 notebook's) and vit-pytorch's ``ViT`` / ``SimpleViT``, recognised from their keys, with
  the constructor arguments the weights cannot tell from a ``config.json`` beside them or ``arch="scratch:num_heads=8"``
  / ``"vit_pytorch:heads=8,..."``; any other state dict is refused with what it looks like and the ``vit.convert
  --inspect`` command that maps it (``open_mapped``);
- a Hub id (``ORG/NAME[@REVISION]``, ``hf-hub:ORG/NAME``, a timm or open_clip model name) that is no path here:
  its snapshot in the Hugging Face cache, downloaded first when needed (``vit.sources.hub``).

Nothing from a model folder is executed: safetensors files are read with the ``safetensors``
package, pickles only with ``torch.load(weights_only=True)``, ``config.json`` as JSON, and a
config asking for custom code (``auto_map``) is refused. The declared config is checked
against every tensor's shape on the ``meta`` device before any memory is allocated for the
model, so an absurd config fails with one line instead of exhausting memory.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch

from vit import registry
from vit.checkpoint import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Checkpoint,
    CheckpointError,
    ForeignCheckpointError,
    Preprocessing,
    load_checkpoint,
    preprocessing_problem,
    read_checkpoint_payload,
    weights_problem,
)
from vit.core.runfiles import BEST_CHECKPOINT, LAST_CHECKPOINT, STATUS_FILE
from vit.model import ViT, ViTConfig
from vit.sources import hub
from vit.sources.build_bounds import bounded_build
from vit.sources.files import SourceError, _one_line, read_json
from vit.sources.hf_preprocessing import channel_numbers, hf_preprocessing
from vit.sources.library_road import recorded_folder, transformers_models
from vit.sources.ports.families import (
    hf,
    import_aimv2,
    import_beit,
    import_clip,
    import_dinotxt,
    import_dinov3,
    import_eva,
    import_hiera,
    import_naflex,
    import_pe,
    import_sam,
    import_siglip,
    import_swin,
)
from vit.sources.ports.families.video_ports import import_timesformer, import_videomae, import_vivit, import_vjepa2
from vit.sources.ports.libraries import import_scratch, import_timm, import_torchvision, import_vit_pytorch, mapping
from vit.sources.vlm import import_internvl, import_qwen, import_vlm
from vit.sources.weights_files import HF_WEIGHTS, read_hf_weights, read_shapes, read_weights

# Where a refusal sends the user: every family's own list of what opens is longer than a line (together 2,200
# characters); the README's table links the docs' page of each kind, which lists them.
README_FAMILIES = "the README's table \"What it opens\" links a page listing every model this program opens"
OPEN_CLIP_CONFIG = "open_clip_config.json"
OPEN_CLIP_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")
MAX_INPUT_SIZE = 2048  # the largest published ViTs take 518 px (DINOv2) to 1024 px


def timm_model_args(config_json: Mapping) -> dict:
    """timm's constructor overrides from its config.json: ``model_args``, plus the top-level ``global_pool``
    that timm's Hub configs carry."""
    args = dict(config_json["model_args"]) if isinstance(config_json.get("model_args"), Mapping) else {}
    if isinstance(config_json.get("global_pool"), str):
        args.setdefault("global_pool", config_json["global_pool"])
    return args


def timm_family(name: str):
    """The module that reads timm architecture ``name``: DINOv3, EVA-02 and PE (timm's Eva class), BEiT, SAM, AIMv2
    or the ViTs."""
    if import_beit.is_beit_name(name):
        return import_beit
    if import_sam.is_sam_name(name):
        return import_sam
    if import_swin.is_swin_name(name):
        return import_swin
    if import_hiera.is_hiera_name(name):
        return import_hiera
    if import_aimv2.is_aimv2_name(name):
        return import_aimv2
    if import_pe.is_pe_name(name):
        return import_pe
    if import_naflex.is_naflex_name(name):
        return import_naflex
    return import_dinov3 if "dinov3" in name else import_eva if import_eva.is_eva_name(name) else import_timm


def describe_timm_folder(folder: Path, config_json: Mapping) -> tuple[ViTConfig, list[str]]:
    """The config and class names of a timm folder from its config.json and safetensors header alone."""
    name = str(config_json.get("architecture"))
    model_args = timm_model_args(config_json)
    state = read_shapes(folder / "model.safetensors")
    family = timm_family(name)
    config = _config(f"{folder} (timm {name})", lambda: family.config_from_timm(name, state, model_args))
    labels = config_json.get("label_names")
    names = [str(x) for x in labels] if isinstance(labels, list) and len(labels) == config.num_classes \
        else default_class_names(config.num_classes)
    return config, names


def build_model(config: ViTConfig, state: Mapping[str, torch.Tensor], origin: str,
                map_location: str | torch.device = "cpu") -> ViT:
    """Our ``ViT`` holding ``state``, after checking every key and shape against ``config`` on the meta device."""
    problem = weights_problem(config, dict(state))  # the same check our own checkpoints get, before any allocation
    if problem:
        raise SourceError(f"the weights of {origin} do not fit its config: {problem}")
    with torch.device("meta"):
        skeleton = ViT(config)  # no memory: shapes only; the weights are assigned below
    skeleton.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=True, assign=True)
    return skeleton.to(map_location).eval()


def _config(origin: str, make) -> ViTConfig:
    try:
        return make()
    except (ValueError, TypeError, KeyError, AttributeError, ArithmeticError) as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None


# -- class names --------------------------------------------------------------------------------------------------

def default_class_names(num_classes: int) -> list[str]:
    """ImageNet's names (torchvision's metadata) for 1000 classes, else 'class 0', 'class 1', ..."""
    if num_classes == 1000:
        return import_torchvision.imagenet_class_names()
    return [f"class {i}" for i in range(num_classes)]


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


# -- the sources ------------------------------------------------------------------------------------------------------

def _finish(model: ViT, class_names: list[str], preprocessing: Preprocessing, path: Path, kind: str,
            architecture: str, guessed_from: str | None = None) -> Checkpoint:
    problem = preprocessing_problem(preprocessing, model.config)
    if max(preprocessing.image_hw) > MAX_INPUT_SIZE:  # every image would be resized to this: bound the memory
        problem = f"an input of {preprocessing.size_label} px (at most {MAX_INPUT_SIZE} px are supported)"
    if problem:
        raise SourceError(f"{path} has unusable preprocessing settings: {problem}")
    metadata = {"source": {"kind": kind, "path": str(path), "architecture": architecture},
                "architecture": architecture, "parameters": sum(p.numel() for p in model.parameters())}
    if guessed_from:  # no preprocessing config came with the weights: say what was assumed, and from what
        p = preprocessing
        how = (f"the longer side resized to {p.resize_size} px ({p.resample}), padded to {p.size_label} px"
               if p.resize_mode == "longest_edge_pad" else
               f"resize to {_size_text(p.resize_size) or p.size_label} px ({p.resize_mode}, {p.resample}), "
               f"centre {p.size_label} px")
        metadata["preprocessing_guessed"] = (
            f"No {guessed_from} came with these weights, so the images are prepared with assumed defaults: {how}, "
            f"mean {tuple(round(v, 4) for v in p.mean)}, std {tuple(round(v, 4) for v in p.std)}. If the model was "
            "trained otherwise, its predictions and maps are off.")
    return Checkpoint(model=model, class_names=class_names, preprocessing=preprocessing, metadata=metadata, path=path)


def _size_text(size: int | tuple[int, int] | None) -> str | None:
    """``256`` for a side, ``320×224`` (width × height, as images are described) for a ``(height, width)``."""
    return f"{size[1]}×{size[0]}" if isinstance(size, tuple) else None if size is None else str(size)


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


def unsupported(what: str, name: str, supported: Iterable[str], family: Callable[[str], str] = str) -> str:
    """'``what`` is not supported', in one line: the supported names of the family closest to ``name``'s (each
    name's ``family``, compared by difflib, case ignored), when one is close, then where the README lists every
    family."""
    families: dict[str, list[str]] = {}
    for known in supported:
        families.setdefault(family(known).lower(), []).append(known)
    closest = difflib.get_close_matches(family(name).lower(), families, n=1, cutoff=0.6)
    near = f"the closest supported: {', '.join(families[closest[0]])}; " if closest else ""
    return f"{what} is not supported; {near}{README_FAMILIES}"


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
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        weight_map = read_json(folder / index).get("weight_map") if (folder / index).is_file() else None
        if wanted is not None and isinstance(weight_map, Mapping):
            return {str(shard) for key, shard in weight_map.items() if wanted(str(key))}
    return None


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
    checkpoint = _finish(model, hf_class_names(config_json, config.num_classes),
                         hf_preprocessing(processor, config, architecture), folder, "hf", f"hf:{architecture}")
    note = tower_note(config_json, config, checkpoint.preprocessing)
    if note:
        checkpoint.metadata["tower"] = note
    return checkpoint


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
    preprocessing = hf_preprocessing(processor, config, module.tower_architecture(config_json))
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
        if transformers_models.opens(config_json) and library_road:
            return transformers_models.open_library(folder, config_json, hf_image_processor(folder), map_location)
        missing = transformers_models.missing_piece(config_json) if library_road else None
        if missing:  # transformers knows it, no port reads it, and the library road cannot take it: say why
            answers = ("; it answers questions about an image as transformers builds it: vit.ask_vlm(folder, image, "
                       "question), vit-predict --ask" if registry.vlm_architecture(str(config_json.get("model_type")))
                       else "")
            return recorded_folder.open_recorded_folder(folder, config_json, hf_image_processor(folder), (  # the
                f"{folder}: {config_json['model_type']} has no port here, and as transformers builds it {missing}"
                f"{answers}"), map_location)  # recorder at the attention function's road, or why not
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


def open_timm(path: Path, state: Mapping[str, torch.Tensor], name: str | None, config_json: Mapping | None,
              map_location: str | torch.device = "cpu", library_road: bool = False) -> Checkpoint:
    """timm weights with the architecture ``name`` (from timm's config.json or the user). With ``library_road``
    (``vit.load``), an architecture the ports refuse opens as timm builds it (``vit.sources.library_road.timm_models``)
    where its attention can be recorded; where it cannot either, the port's refusal says both."""
    try:
        return _open_timm_port(path, state, name, config_json, map_location)
    except SourceError as refused:
        if not library_road or not name:
            raise
        from vit.sources.library_road import timm_models

        config_json = dict(config_json or {})
        model_args = timm_model_args(config_json)
        pretrained_cfg = config_json.get("pretrained_cfg")
        pretrained_cfg = pretrained_cfg if isinstance(pretrained_cfg, Mapping) else {}
        try:
            return timm_models.open_timm_library(
                path, state, name, config_json, model_args,
                lambda stand_in: import_timm.preprocessing_from_timm(name, stand_in, pretrained_cfg, model_args),
                map_location)
        except SourceError as also:
            raise SourceError(f"{refused}; as timm builds it: {str(also).partition('): ')[2] or also}") from None


def _open_timm_port(path: Path, state: Mapping[str, torch.Tensor], name: str | None, config_json: Mapping | None,
                    map_location: str | torch.device = "cpu") -> Checkpoint:
    """timm weights with the architecture ``name`` in a port (our ``ViT``)."""
    config_json = dict(config_json or {})
    model_args = timm_model_args(config_json)
    pretrained_cfg = config_json.get("pretrained_cfg") if isinstance(config_json.get("pretrained_cfg"), Mapping) else {}
    name = name or ("vit_dinov3" if import_dinov3.is_timm_state_dict(state) else "vit")  # a bare state dict
    origin = f"{path} (timm {name})"
    family = timm_family(name)
    if family is not import_timm:
        config = _config(origin, lambda: family.config_from_timm(name, state, model_args))
        try:
            ours = family.state_dict_from_timm(state, config)
        except (ValueError, KeyError) as e:
            raise SourceError(f"{origin}: {_one_line(e)}") from None
    else:
        config = _config(origin, lambda: import_timm.config_from_timm(name, state, model_args))
        ours = import_timm.state_dict_from_timm(state)
    model = build_model(config, ours, origin, map_location)
    labels = config_json.get("label_names") or pretrained_cfg.get("label_names")
    if isinstance(labels, list) and len(labels) == config.num_classes:
        class_names = [str(label) for label in labels]
    else:
        class_names = default_class_names(config.num_classes)
    preprocessing = import_timm.preprocessing_from_timm(name, config, pretrained_cfg, model_args)
    guessed = None if pretrained_cfg.get("mean") and pretrained_cfg.get("std") else "timm pretrained_cfg (mean, std)"
    if config.max_num_patches:  # NaFlex: each image at its aspect within the table's patch budget, no crop
        p = preprocessing
        preprocessing = Preprocessing(config.image_size, p.num_channels, p.mean, p.std, resample=p.resample,
                                      max_num_patches=config.max_num_patches, patch_size=config.patch_hw[0])
    return _finish(model, class_names, preprocessing, path, "timm", f"timm:{name}", guessed)


def open_torchvision(path: Path, state: Mapping[str, torch.Tensor], name: str | None,
                     map_location: str | torch.device = "cpu") -> Checkpoint:
    """torchvision ``vit_*`` weights; the architecture is recognised from them when not named."""
    try:
        name = name or import_torchvision.architecture_of(state)
        config = import_torchvision.config_from_torchvision(name, state)
        ours = import_torchvision.state_dict_from_torchvision(state)
    except (ValueError, KeyError) as e:
        raise SourceError(f"{path}: {_one_line(e)}") from None
    model = build_model(config, ours, f"{path} (torchvision {name})", map_location)
    names = default_class_names(config.num_classes)
    return _finish(model, names, import_torchvision.preprocessing_from_torchvision(name, config), path,
                   "torchvision", f"torchvision:{name}")


def open_dinov3_original(path: Path, state: Mapping[str, torch.Tensor], name: str | None,
                         map_location: str | torch.device = "cpu") -> Checkpoint:
    """An original ``facebookresearch/dinov3`` backbone (``dinov3_vitl16_pretrain_*.pth``)."""
    origin = f"{path} (DINOv3 {name or 'backbone'})"
    config = _config(origin, lambda: import_dinov3.config_from_original(state, name))
    try:
        ours = import_dinov3.state_dict_from_original(state, config)
    except (ValueError, KeyError) as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None
    model = build_model(config, ours, origin, map_location)
    preprocessing = Preprocessing(config.image_size, config.num_channels, IMAGENET_MEAN, IMAGENET_STD,
                                  resample="bilinear")  # dinov3's make_transform: 224 square, bilinear
    return _finish(model, default_class_names(0), preprocessing, path, "dinov3", f"dinov3:{name or 'backbone'}")


def open_dinotxt(path: Path, state: Mapping[str, torch.Tensor], map_location: str | torch.device = "cpu") -> Checkpoint:
    """DINOv3 with its dino.txt head (``import_dinotxt``): ``path`` the head and text file, the backbone inside it
    or the one original DINOv3 backbone file beside it; the text tower is ``vit.sources.vlm.text_tower``'s."""
    backbone = import_dinotxt.backbone_of(state)
    if backbone is None:
        found = [p for p in sorted(path.parent.iterdir()) if p != path and p.is_file() and p.suffix in WEIGHT_SUFFIXES
                 and import_dinov3.is_original_state_dict(read_weights(p, "meta"))]
        if len(found) != 1:
            raise SourceError(f"{path} is dino.txt's head and text tower; put its one DINOv3 backbone .pth (e.g. "
                              f"dinov3_vitl16_pretrain_lvd1689m-*.pth) beside it ({len(found)} found there)")
        backbone = read_weights(found[0], map_location)
    origin = f"{path} (dino.txt)"
    config = _config(origin, lambda: import_dinotxt.config_from_original(backbone, state))
    try:
        ours = import_dinotxt.state_dict_from_original(backbone, state, config)
    except (ValueError, KeyError) as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None
    model = build_model(config, ours, origin, map_location)
    preprocessing = Preprocessing(config.image_size, config.num_channels, IMAGENET_MEAN, IMAGENET_STD, resize_size=256,
                                  resize_mode="shortest_edge")  # dinov3's make_classification_eval_transform
    return _finish(model, default_class_names(0), preprocessing, path, "dinotxt", "dinotxt")


def open_open_clip(path: Path, state: Mapping[str, torch.Tensor], name: str | None, config_json: Mapping | None,
                   map_location: str | torch.device = "cpu", library_road: bool = False) -> Checkpoint:
    """open_clip weights (``visual.*``), with ``open_clip_config.json`` when there is one; ``name`` is
    ``quickgelu`` or ``gelu`` (or an open_clip model name, QuickGELU when it ends in ``-quickgelu``). With
    ``library_road`` (``vit.load``), a tower whose trunk is a timm model (SigLIP 2, PE-Core) opens as open_clip
    builds it (``vit.sources.library_road.timm_models.open_clip_library``) where the port refuses it."""
    config_json = dict(config_json or {})
    model_cfg = config_json.get("model_cfg") if isinstance(config_json.get("model_cfg"), Mapping) else None
    quick = None if name is None else (name == "quickgelu" or name.endswith("-quickgelu"))
    origin = f"{path} (open_clip)"
    try:
        config = _config(origin, lambda: import_clip.config_from_open_clip(state, model_cfg, quick))
        ours = import_clip.state_dict_from_open_clip(state, config)
    except (ValueError, KeyError, SourceError) as e:
        refused = e if isinstance(e, SourceError) else SourceError(f"{origin}: {_one_line(e)}")
        vision = (model_cfg or {}).get("vision_cfg")
        if not library_road or not isinstance(vision, Mapping) or not vision.get("timm_model_name"):
            raise refused from None
        from vit.sources.library_road import timm_models

        try:
            return timm_models.open_clip_library(path, state, config_json,
                                                  lambda stand_in: open_clip_preprocessing(config_json, stand_in,
                                                                                           origin), map_location)
        except SourceError as also:
            raise SourceError(f"{refused}; as open_clip builds it: {str(also).partition('): ')[2] or also}"
                              ) from None
    model = build_model(config, ours, origin, map_location)
    preprocessing = open_clip_preprocessing(config_json, config, origin)
    activation = "quickgelu" if config.activation == "quick_gelu" else "gelu"
    return _finish(model, default_class_names(0), preprocessing, path, "open_clip", f"open_clip:{activation}")


def open_clip_preprocessing(config_json: Mapping, config: ViTConfig, origin: str) -> Preprocessing:
    """open_clip's image transform for a tower of ``config``'s input size, from ``open_clip_config.json``'s
    ``preprocess_cfg``."""
    pre = config_json.get("preprocess_cfg") if isinstance(config_json.get("preprocess_cfg"), Mapping) else {}
    channels = config.num_channels
    mean, std = tuple(pre.get("mean") or import_clip.OPENAI_MEAN), tuple(pre.get("std") or import_clip.OPENAI_STD)
    resample = pre.get("interpolation") if pre.get("interpolation") in ("bicubic", "bilinear") else "bicubic"
    # open_clip's image_transform: resize, centre crop; "squash" stretches; "longest" fits the image inside
    # (ResizeKeepRatio(longest=1), with the interpolation asked) and pads in fill_color (CenterCropOrPad: timm's
    # crop_mode "border" in another colour). A rectangle's shortest-edge resize is its ResizeKeepRatio, which
    # open_clip builds without the interpolation asked for: bicubic, its default.
    fill = pre.get("fill_color", 0)
    if isinstance(fill, bool) or not isinstance(fill, int) or not 0 <= fill <= 255:
        raise SourceError(f"{origin}: preprocess_cfg.fill_color {fill!r} is not a whole number from 0 to 255")
    mode = {"squash": "square", "longest": "border"}.get(pre.get("resize_mode"), "shortest_edge") \
        if config.image_hw[0] == config.image_hw[1] or pre.get("resize_mode") in ("squash", "longest") else "keep_ratio"
    preprocessing = Preprocessing(config.image_size, channels, mean[:channels], std[:channels],
                                  resize_size=config.image_size, resize_mode=mode,
                                  resample="bicubic" if mode == "keep_ratio" else resample,
                                  pad_fill=(fill,) if mode == "border" else ())
    return preprocessing


def open_scratch(path: Path, state: Mapping[str, torch.Tensor], layout: str, arguments: Mapping,
                 map_location: str | torch.device = "cpu") -> Checkpoint:
    """A from-scratch ViT of a known ``layout`` (``vit.sources.ports.libraries.import_scratch``). ``arguments`` are the
    constructor arguments given with ``--arch scratch:key=value,...`` over those of a ``config.json`` beside the weights
    (for tintn's experiments, its own config); that file's ``mean``, ``std`` and ``class_names`` say how images were
    prepared and what the classes are."""
    sidecar = scratch_sidecar(path)
    origin = f"{path} (from-scratch {layout})"
    try:
        config, ours = import_scratch.convert(layout, state, sidecar if layout == "tintn" else None,
                                              {**(sidecar or {}), **arguments})
    except (ValueError, KeyError, TypeError) as e:
        raise SourceError(f"{path}: {_one_line(e)}" if layout == "annotated" else f"{origin}: {_one_line(e)}") from None
    model = build_model(config, ours, origin, map_location)
    size = (sidecar or {}).get("image_size") if layout == "tintn" else None
    return _finish_scratch(model, sidecar, path, f"scratch:{layout}",
                           size if isinstance(size, int) and size != config.image_size else None)


def open_vit_pytorch(path: Path, state: Mapping[str, torch.Tensor], arguments: Mapping,
                     map_location: str | torch.device = "cpu") -> Checkpoint:
    """A vit-pytorch ``ViT`` / ``SimpleViT`` state dict; its constructor arguments from ``--arch vit_pytorch:...``
    over those of a ``config.json`` beside the weights."""
    sidecar = scratch_sidecar(path)
    kind = import_vit_pytorch.kind_of(state)
    origin = f"{path} (vit-pytorch {kind})"
    try:
        config = import_vit_pytorch.config_from_vit_pytorch(state, {**(sidecar or {}), **arguments})
        ours = import_vit_pytorch.state_dict_from_vit_pytorch(state, config)
    except (ValueError, KeyError, TypeError) as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None
    model = build_model(config, ours, origin, map_location)
    return _finish_scratch(model, sidecar, path, f"vit_pytorch:{kind}")


def scratch_sidecar(path: Path) -> dict | None:
    """The ``config.json`` beside a from-scratch model's weights (its constructor arguments), or None."""
    sidecar = path.parent / "config.json"
    return read_json(sidecar) if sidecar.is_file() else None


def _finish_scratch(model: ViT, sidecar: Mapping | None, path: Path, architecture: str,
                    trained_size: int | None = None) -> Checkpoint:
    """A from-scratch model's checkpoint: mean and std from the config.json beside it, else the tutorials' own
    ``Normalize(0.5, 0.5)`` with the note that it was assumed; class names from its ``class_names``. A
    ``trained_size`` that is no multiple of the patch: images are resized to it and the grid's top-left part read,
    as a stride-P convolution reads them."""
    sidecar = sidecar or {}
    config, channels = model.config, model.config.num_channels
    try:
        mean = channel_numbers(sidecar["mean"], "mean", channels) if "mean" in sidecar else (0.5,) * channels
        std = channel_numbers(sidecar["std"], "std", channels) if "std" in sidecar else (0.5,) * channels
    except ValueError as e:
        raise SourceError(f"{path.parent / 'config.json'}: {_one_line(e)}") from None
    names = sidecar.get("class_names")
    class_names = [str(n) for n in names] if isinstance(names, list) and len(names) == config.num_classes \
        else default_class_names(config.num_classes)
    preprocessing = Preprocessing(config.image_size, channels, mean, std, resize_size=trained_size,
                                  resample="bilinear", crop_rule="top_left" if trained_size else "torchvision")
    guessed = None if "mean" in sidecar and "std" in sidecar else "mean and std (in a config.json beside them)"
    checkpoint = _finish(model, class_names, preprocessing, path, "scratch", architecture, guessed)
    if names is None and config.num_classes:  # said where the names are shown, so a user knows how to give them
        checkpoint.metadata["class_names_note"] = (
            f"Its weights hold no class names, so they read class 0, class 1, …: give them as \"class_names\": "
            f"[…] in {path.parent / 'config.json'}, one per class in the order the model was trained on.")
    return checkpoint


def scratch_weights(folder: Path) -> Path | None:
    """The weights a from-scratch experiment folder holds: ``model_final.pt`` (tintn's ``save_experiment``), else its
    only weights file, else the ``model_N.pt`` of the latest epoch; None when it holds none."""
    files = [p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix in WEIGHT_SUFFIXES]
    if (folder / "model_final.pt").is_file():
        return folder / "model_final.pt"
    if len(files) == 1:
        return files[0]
    epochs = {int(m.group(1)): p for p in files if (m := re.fullmatch(r"model_(\d+)\.pt", p.name))}
    return epochs[max(epochs)] if epochs else None


def open_mapped(path: str | os.PathLike, mapping_path: str | os.PathLike) -> Checkpoint:
    """Weights of any layout mapped onto ours by a mapping file (``vit.sources.ports.libraries.mapping``;
    ``vit.convert --map``)."""
    path, mapping_path = Path(path).expanduser(), Path(mapping_path).expanduser()
    rules = read_json(mapping_path)
    for map_location in ("meta", "cpu"):  # every key and shape checked from the header before any data is read
        state = read_weights(path, map_location)
        try:
            config, ours = mapping.apply_mapping(state, rules)
        except (ValueError, TypeError) as e:
            raise SourceError(f"{mapping_path}: {_one_line(e)}") from None
        model = build_model(config, ours, f"{path} (mapped by {mapping_path.name})", map_location)
    sidecar = rules.get("preprocessing") if isinstance(rules.get("preprocessing"), Mapping) else None
    return _finish_scratch(model, sidecar, path, f"mapped:{mapping_path.name}")


ARCH_LIBRARIES = ("timm", "torchvision", "dinov3", "open_clip", "scratch", "vit_pytorch")


def parse_arch(arch: str | None) -> tuple[str | None, str | None]:
    """'timm:vit_small_patch14_dinov2' -> ('timm', 'vit_small_patch14_dinov2'); None -> (None, None)."""
    if not arch:
        return None, None
    library, _, name = arch.partition(":")
    if library not in ARCH_LIBRARIES or not name:
        raise SourceError(f"--arch {arch!r} must be timm:NAME, torchvision:NAME, dinov3:NAME, "
                          "open_clip:quickgelu|gelu, scratch:key=value,... or vit_pytorch:key=value,... (e.g. "
                          "timm:vit_base_patch16_224, dinov3:vitl16, scratch:num_heads=8, vit_pytorch:heads=8)")
    return library, name


def open_source(path: str | os.PathLike, arch: str | None = None, map_location: str | torch.device = "cpu",
                library_road: bool = False) -> Checkpoint:
    """Open ``path`` (a file or folder, see the module docstring) as an eval-mode ``Checkpoint``.

    ``arch`` names the architecture of a bare state dict: ``timm:NAME`` or ``torchvision:NAME``. With
    ``library_road`` (``vit.load``), a transformers vision model no port reads opens as transformers builds it
    (``vit.sources.library_road.transformers_models``, ``Checkpoint.road == "library"``); without, it is refused in one
    line. Raises ``CheckpointError`` (``SourceError``) with a one-line message for anything it cannot open. The whole
    opening runs first on the ``meta`` device, from the files' headers alone, so weights whose names, shapes or counts
    do not fit are refused before any tensor data is read; both build under ``bounded_build``. A Hub id is downloaded
    first (its size on stderr, then huggingface_hub's progress bars) unless the HF cache has it.
    """
    path = hub.resolve(path, needed=needed_shards)
    with bounded_build(str(path)):  # whatever road builds it, at most MAX_MODULES modules and MAX_BUILD_SECONDS
        _open(path, arch, "meta", library_road)
    with bounded_build(str(path), seconds=None):
        return _open(path, arch, map_location, library_road)


def _open(path: str | os.PathLike, arch: str | None, map_location: str | torch.device, library_road: bool = False
          ) -> Checkpoint:
    path = Path(path).expanduser()
    library, name = parse_arch(arch)
    if not path.exists():
        raise SourceError(f"checkpoint not found: {path}")
    if path.is_dir():
        run_checkpoint = next((path / n for n in (BEST_CHECKPOINT, LAST_CHECKPOINT) if (path / n).is_file()), None)
        if run_checkpoint is not None and (path / STATUS_FILE).is_file():  # a vit.train run: its best epoch's model
            return _open(run_checkpoint, arch, map_location)
        config_path = path / "config.json"
        if not config_path.is_file() and (path / OPEN_CLIP_CONFIG).is_file():
            weights = next((path / f for f in OPEN_CLIP_WEIGHTS if (path / f).is_file()), None)
            if weights is None:
                raise SourceError(f"{path} has an open_clip_config.json but no {' or '.join(OPEN_CLIP_WEIGHTS)}")
            return open_open_clip(weights, read_weights(weights, map_location), name,
                                  read_json(path / OPEN_CLIP_CONFIG), map_location, library_road)
        if not config_path.is_file():
            files = [p for p in sorted(path.iterdir()) if p.is_file() and p.suffix in WEIGHT_SUFFIXES]
            heads = [p for p in files if len(files) > 1 and import_dinotxt.is_head_state_dict(read_weights(p, "meta"))]
            files = heads if len(heads) == 1 else files  # dino.txt's head and text file, its backbone beside it
            if len(files) != 1:
                raise SourceError(f"{path} has no config.json; open a Hugging Face or timm model folder, or a weights "
                                  f"file ({README_FAMILIES})")
            return _open(files[0], arch, map_location)
        config_json = read_json(config_path)
        if not {"model_type", "architectures", "architecture"} & set(config_json) \
                and (weights := scratch_weights(path)) is not None:  # a from-scratch model's constructor arguments
            return _open(weights, arch, map_location)
        if "auto_map" in config_json or config_json.get("trust_remote_code"):
            raise SourceError(f"{path} asks for custom model code (auto_map / trust_remote_code), which this program "
                              f"never runs; {README_FAMILIES}")
        if "architecture" in config_json or library == "timm":  # timm's push_to_hub / save_for_hf layout
            name = name or str(config_json.get("architecture"))
            weights = next((path / f for f in HF_WEIGHTS + ("open_clip_model.safetensors",) if (path / f).is_file()),
                           None)
            if weights is None:
                raise SourceError(f"{path} has a timm config.json but no model.safetensors or pytorch_model.bin")
            state = read_weights(weights, map_location)
            if config_json.get("model_type") == "timm_wrapper":  # transformers' TimmWrapper: timm's keys, prefixed
                state = {k.removeprefix("timm_model."): v for k, v in state.items()}
            return open_timm(path, state, name, config_json, map_location, library_road)
        return open_hf_folder(path, config_json, map_location, library_road)
    if path.suffix != ".safetensors":
        try:
            read_checkpoint_payload(path, mmap=True)  # which kind of torch file: the pickle only, tensors mapped
        except ForeignCheckpointError:
            pass  # a plain state dict: read once, below
        else:
            return load_checkpoint(path, map_location)
    state = read_weights(path, map_location)
    layout = import_scratch.layout_of(state)
    if library in ("scratch", "vit_pytorch") or (library is None and layout is not None) \
            or (library is None and import_vit_pytorch.is_vit_pytorch_state_dict(state)):
        try:
            arguments = import_scratch.parse_arguments(name or "")
        except ValueError as e:
            raise SourceError(f"--arch {arch}: {_one_line(e)}") from None
        if library == "vit_pytorch" or (library is None and layout is None):
            if not import_vit_pytorch.is_vit_pytorch_state_dict(state):
                raise SourceError(f"{path} is not a vit-pytorch ViT or SimpleViT state dict (no "
                                  "to_patch_embedding.2 / transformer.layers.0.0.to_qkv)")
            return open_vit_pytorch(path, state, arguments, map_location)
        if layout is None:
            raise SourceError(f"{path} is none of the from-scratch layouts this program knows; supported: "
                              f"{import_scratch.SUPPORTED}")
        return open_scratch(path, state, layout, arguments, map_location)
    if library == "open_clip" or (library is None and import_clip.is_open_clip_state_dict(state)):
        sidecar = path.parent / OPEN_CLIP_CONFIG
        return open_open_clip(path, state, name, read_json(sidecar) if sidecar.is_file() else None, map_location)
    if library == "dinov3" or (library is None and import_dinov3.is_original_state_dict(state)):
        return open_dinov3_original(path, state, name, map_location)
    if library is None and import_dinotxt.is_head_state_dict(state):
        return open_dinotxt(path, state, map_location)
    if library == "torchvision" or (library is None and import_torchvision.is_torchvision_state_dict(state)):
        return open_torchvision(path, state, name, map_location)
    if library == "timm" or import_timm.is_timm_state_dict(state):
        sidecar = path.parent / "config.json"
        config_json = read_json(sidecar) if sidecar.is_file() else None
        if config_json and "architecture" in config_json:
            name = name or str(config_json["architecture"])
        else:
            config_json = None
        return open_timm(path, state, name, config_json, map_location, library_road)
    if any(k.endswith("embeddings.cls_token") for k in state):
        raise SourceError(f"{path} looks like Hugging Face weights; open the folder that holds it with its config.json")
    raise SourceError(f"{path} holds {mapping.describe(state)}, which this program does not recognise; to map it "
                      f"onto ours: python -m vit.convert {path} --inspect")
