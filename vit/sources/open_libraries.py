"""The door's roads for weights a library or a repository wrote (``vit.sources.open``): timm's folders and state
dicts, torchvision's, DINOv3's original backbones and dino.txt's head, open_clip's, the tutorials' from-scratch ViTs,
vit-pytorch's, and any other layout mapped by a mapping file. Each maps its weights onto our ``ViT`` through its port
(``vit.sources.ports``); timm's and open_clip's fall back to the library road where the port refuses them."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from vit.checkpoint import IMAGENET_MEAN, IMAGENET_STD, Checkpoint, Preprocessing
from vit.model import ViT, ViTConfig
from vit.sources.files import SourceError, _one_line, read_json
from vit.sources.hf_preprocessing import channel_numbers
from vit.sources.open_shared import WEIGHT_SUFFIXES, _config, _finish, build_model, default_class_names
from vit.sources.ports.families import (
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
    import_swin,
)
from vit.sources.ports.libraries import import_scratch, import_timm, import_torchvision, import_vit_pytorch, mapping
from vit.sources.weights_files import read_shapes, read_weights


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
    for family, names_it in ((import_beit, import_beit.is_beit_name), (import_sam, import_sam.is_sam_name),
                             (import_swin, import_swin.is_swin_name), (import_hiera, import_hiera.is_hiera_name),
                             (import_aimv2, import_aimv2.is_aimv2_name), (import_pe, import_pe.is_pe_name),
                             (import_naflex, import_naflex.is_naflex_name)):
        if names_it(name):
            return family
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
        if not library_road or not isinstance(vision, Mapping):  # no config: nothing to build the tower from
            raise refused from None
        from vit.sources.library_road import timm_models
        from vit.sources.library_road.open_clip_towers import open_clip_recorded

        def said(stand_in: ViTConfig) -> Preprocessing:
            return open_clip_preprocessing(config_json, stand_in, origin)

        try:
            if vision.get("timm_model_name"):  # timm's explicit path for the asked layers
                return timm_models.open_clip_library(path, state, config_json, said, map_location)
            return open_clip_recorded(path, state, config_json, said, map_location)  # CoCa's, a ResNet, ...
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
