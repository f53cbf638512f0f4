"""The families the census counts, read from the libraries' own registries rather than a hand-kept list (issue 117):

- transformers: every model type in its vision auto-mappings (image classification, image feature extraction,
  backbone, depth, semantic / instance / universal segmentation, mask generation, zero-shot image classification,
  keypoint detection, video classification), built by the first class those mappings name for it;
- timm: every architecture family (``timm.list_modules()``), built as the smallest-named architecture of it;
- open_clip: every model config (``open_clip.list_models()``), its image tower made tiny where it is open_clip's own
  ViT, a ResNet tower narrow and small (its stages' depths kept); a timm trunk keeps its own config.

A family the hand list in ``census_families`` tunes (a config that builds, a smaller size) keeps that entry; every
other one gets a default built the same way, so no registry entry goes uncounted. Nothing here builds a model.
"""

from __future__ import annotations

import dataclasses

# The auto-mappings whose model types are vision models, in the order a type's class is taken from
TRANSFORMERS_MAPPINGS = ("IMAGE_CLASSIFICATION", "IMAGE", "BACKBONE", "DEPTH_ESTIMATION", "SEMANTIC_SEGMENTATION",
                         "INSTANCE_SEGMENTATION", "UNIVERSAL_SEGMENTATION", "MASK_GENERATION",
                         "ZERO_SHOT_IMAGE_CLASSIFICATION", "KEYPOINT_DETECTION", "VIDEO_CLASSIFICATION")
# A timm family's architecture: the first name with the smallest of these words (cheap to build on a CPU)
SMALL_WORDS = ("atto", "femto", "pico", "nano", "xxs", "tiny", "xs", "small", "s", "t")
# open_clip's own ViT tower, made tiny: what its config's sizes become
OPEN_CLIP_TINY = dict(image_size=32, patch_size=8, width=32, layers=2, head_width=16)
# open_clip's ResNet tower (RN50 ... RN50x64), its stages' depths kept: a 64-px input, 16 channels in its stem
OPEN_CLIP_RESNET_TINY = dict(image_size=64, width=16, head_width=8)


def transformers_types() -> dict[str, tuple[str, str]]:
    """Each vision model type of transformers' auto-mappings -> (its class name, the mapping it was read from)."""
    from transformers.models.auto import modeling_auto

    types: dict[str, tuple[str, str]] = {}
    for mapping in TRANSFORMERS_MAPPINGS:
        names = getattr(modeling_auto, f"MODEL_FOR_{mapping}_MAPPING_NAMES", {})
        for model_type, cls in names.items():
            cls = cls[0] if isinstance(cls, (list, tuple)) else cls
            types.setdefault(model_type, (cls, mapping.lower().replace("_", " ")))
    return types


def timm_families() -> dict[str, str]:
    """Each timm architecture family (module) -> the architecture the census builds for it."""
    import timm

    out = {}
    for module in timm.list_modules():
        names = timm.list_models(module=module)
        if not names:
            continue

        def size(name: str) -> int:
            parts = name.replace("-", "_").split("_")
            return next((i for i, word in enumerate(SMALL_WORDS) if word in parts), len(SMALL_WORDS))
        out[module] = min(names, key=lambda n: (size(n), len(n), n))
    return out


def open_clip_configs() -> list[str]:
    import open_clip

    return list(open_clip.list_models())


def registry_families(hand: list, family_cls, hf, tm) -> list:
    """Every registry entry as a census family: ``hand``'s entry where it tunes that entry, else a default one.
    ``family_cls``, ``hf`` and ``tm`` are ``census_families``' constructors (passed in, so this module stays below
    it). The hand list's other entries (vision towers of composite models, timm wrappers) follow."""
    import transformers

    by_class: dict = {}
    for f in hand:
        if f.library == "transformers":
            by_class.setdefault(f.build, f)  # the first entry of a class stands for its type
    by_arch = {f.build: f for f in hand if f.library == "timm"}
    out, used = [], set()
    for model_type, (cls, mapping) in sorted(transformers_types().items()):
        tuned = by_class.get(cls) or next((f for f in hand if f.library == "transformers" and getattr(
            getattr(transformers, f.build, None), "config_class", None) is not None and getattr(
            getattr(transformers, f.build).config_class, "model_type", None) == model_type), None)
        if tuned is not None and id(tuned) in used:  # one entry stands for one type; another type of the same
            tuned = dataclasses.replace(tuned, name=f"{model_type} ({cls})", named=False) if tuned.build == cls \
                else None  # class (SAM 2's video type) is built as that entry tunes it, under its own name
        family = tuned or hf(f"{model_type} ({cls})", cls, note=f"transformers {mapping}")
        family.registry = f"transformers:{model_type}"
        used.add(id(family))
        out.append(family)
    modules = timm_families()
    for module, arch in sorted(modules.items()):
        import timm

        tuned = next((f for f in hand if f.library == "timm" and f.build in by_arch
                      and f.build in timm.list_models(module=module)), None)
        tuned = tuned if tuned is not None and id(tuned) not in used else None
        family = tuned or tm(f"timm {module} ({arch})", arch, note="timm architecture family")
        family.registry = f"timm:{module}"
        used.add(id(family))
        out.append(family)
    for name in open_clip_configs():
        family = family_cls(f"open_clip {name}", "open_clip", f"config:{name}")
        family.registry = f"open_clip:{name}"
        out.append(family)
    out += [f for f in hand if id(f) not in used and f.library != "open_clip"]
    return out


def open_clip_model_cfg(name: str) -> dict:
    """open_clip's config ``name``, its own ViT tower and its text tower made tiny, a ResNet tower narrow and small
    (its stages' depths kept; a timm trunk kept as the config says)."""
    import copy

    import open_clip

    cfg = copy.deepcopy(open_clip.get_model_config(name))
    vision = cfg.get("vision_cfg", {})
    if not vision.get("timm_model_name") and not isinstance(vision.get("layers"), (list, tuple)):
        vision.update(OPEN_CLIP_TINY)
    elif isinstance(vision.get("layers"), (list, tuple)):  # a ResNet tower: its stages kept, narrow and small
        vision.update(OPEN_CLIP_RESNET_TINY)
    text = cfg.get("text_cfg", {})
    if not text.get("hf_model_name"):
        text.update(context_length=8, vocab_size=64, width=32, heads=1, layers=1)
    cfg["embed_dim"] = 16
    return cfg
