"""Any vision-language model transformers ships, by what it is, not by a name on a list (issue 113): a model type of
transformers' image-text-to-text auto-mapping (``registry.vlm_architecture``) answers through ``vit.ask_vlm`` as the
families this project names do (``registry.VLM_ARCHITECTURES``): transformers' model and processor run unchanged,
the language model's attention through the recording attention function. Its tower is read from its config as
transformers builds it (``read_tower``: the sizes the cost model counts, the patch and the merge unit where the config
declares them); where its image tokens sit is read from the processor's outputs
(``vit.explain.language.vlm_read_layout``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import SimpleNamespace

from vit.sources.vlm.declared import DeclaredTower

# The names transformers' vision configs give each size the cost model reads, in the order tried
LAYERS = ("num_hidden_layers", "depth", "num_layers", "encoder_layers", "vision_layers")
HEADS = ("num_attention_heads", "num_heads", "attention_heads", "encoder_attention_heads")
WIDTH = ("hidden_size", "embed_dim", "width", "d_model")
MLP = ("intermediate_size", "encoder_ffn_dim")
CHANNELS = ("num_channels", "in_channels", "in_chans")
# Where a config says how many patches along each side one image token covers: a whole number of patches (a merger's
# spatial_merge_size, a pixel shuffle's scale or downsample factor), or the share of each side kept (a ratio r:
# 1 / r patches a token). Read on the vision config first, then on the whole model's.
MERGE_SIDES = ("spatial_merge_size", "merge_size", "downsample_factor", "scale_factor")
MERGE_RATIOS = ("pixel_shuffle_ratio", "downsample_ratio")


def _whole(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 2**20 else None


def _first(config, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, (list, tuple)) and value and all(_whole(v) for v in value):
            value = max(value)  # per-stage sizes (a hierarchical tower's): its widest
        if _whole(value):
            return value
    return None


def _side(value) -> int | None:
    """A patch or merge side: a whole number, or a square pair of one."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == value[1]:
        value = value[0]
    return _whole(value)


def merge_unit(config, vision) -> int | None:
    """Patches per image token along each side as ``config`` (the whole model's) or its ``vision`` config declares
    it (``MERGE_SIDES``, ``MERGE_RATIOS``); None where neither says."""
    for part in (vision, config):
        for name in MERGE_SIDES:
            unit = _side(getattr(part, name, None))
            if unit:
                return unit
        for name in MERGE_RATIOS:
            ratio = getattr(part, name, None)
            if isinstance(ratio, float) and 0 < ratio <= 1 and math.isclose(1 / ratio, round(1 / ratio)):
                return round(1 / ratio)
    return None


def read_tower(config_json: Mapping) -> DeclaredTower:
    """The tower of a model type no layout of this project names, as transformers builds its config from
    ``config_json`` (its defaults filled in): its sizes for the cost model, its patch and its merge unit where it
    declares them (``unit`` 0: not declared, read from the processor's counts; ``missing``: what placing its tokens
    lacks). ValueError (one line) for a config without a vision config or its sizes."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from vit.costs.plan import LibraryShape

    model_type = str(config_json.get("model_type"))
    try:
        config = CONFIG_MAPPING[model_type].from_dict(dict(config_json))
    except (KeyError, ValueError, TypeError, AttributeError) as e:
        raise ValueError(f"transformers cannot build its {model_type} config: {str(e).splitlines()[0][:120]}"
                         ) from None
    vision = getattr(config, "vision_config", None)
    encoder = getattr(config, "encoder", None)
    if vision is None and getattr(config, "is_encoder_decoder", False) and getattr(encoder, "vision_config",
                                                                                 None) is None:
        vision = encoder  # a VisionEncoderDecoder's: its encoder (not one holding a tower of its own: T5Gemma 2's)
    free = _encoder_free(config, vision, model_type)
    if free is not None:
        return free
    if vision is None:
        vq = _vq_tokenizer(config, model_type)
        if vq is not None:
            return vq
        from transformers import PretrainedConfig

        nested = next((name for name, sub in vars(config).items() if isinstance(sub, PretrainedConfig)
                       and getattr(sub, "vision_config", None) is not None), None)
        if nested:  # T5Gemma 2's: the image in its encoder's sequence, which its decoder's merged attention reads
            raise ValueError(f"its vision config is its {nested}'s ({nested}.vision_config): the image is read by its "
                             f"{nested}, and reaches the answer through the decoder's attention over the {nested}'s "
                             "states, which is read here only from a decoder's cross-attention layers (Florence-2's)")
        raise ValueError("its config declares no vision_config: no tower to count or place its tokens on")
    sizes = {what: _first(vision, names) for what, names in
             (("layers", LAYERS), ("heads", HEADS), ("hidden_size", WIDTH))}
    if all(value is None for value in sizes.values()) and isinstance(getattr(vision, "model_args", None), dict):
        vision = SimpleNamespace(**vision.model_args)  # a timm tower's sizes (Perception LM's PE ViT): its model_args
        sizes = {what: _first(vision, names) for what, names in
                 (("layers", LAYERS), ("heads", HEADS), ("hidden_size", WIDTH))}
    if all(value is None for value in sizes.values()):  # a tower of towers (DeepSeek-OCR 2's SAM then encoder)
        sizes, _ = _stacked(vision)  # the patch stays the vision config's own: neither tower's cuts the image tokens
    stride = None
    if sizes["layers"] is None and sizes["heads"] is None:  # a timm tower whose model_args state no sizes, its
        built, stride = _timm_sizes(config.vision_config)  # hidden_size its pooled features' (FastVLM's)
        sizes = built if built["layers"] else sizes
    lacking = [what for what, value in sizes.items() if value is None]
    if lacking:
        raise ValueError(f"its vision config declares no {' or '.join(lacking)} the cost model counts")
    width = sizes["hidden_size"]
    patch = _side(getattr(vision, "patch_size", None)) or stride
    queries = learned_queries(config)
    if queries:  # a count of image tokens that happens to tile the grid must not place them on it
        missing = f"they are {queries}, which cover no patch"
    else:
        missing = "" if patch else "a patch_size in its vision config"
    unit = merge_unit(config, vision) or 0
    shape = LibraryShape(sizes["layers"], sizes["heads"], width, _first(vision, MLP) or 4 * width, 0,
                         (patch or 1, patch or 1), _first(vision, CHANNELS) or 3)
    return DeclaredTower(str(getattr(vision, "model_type", "") or model_type), unit, shape, missing=missing)


def _stacked(vision) -> tuple[dict, object]:
    """``(sizes, part)`` of a vision config that declares no sizes of its own but towers of its own (its
    attributes that are configs: DeepSeek-OCR 2's ``sam_config`` and ``encoder_config``): their layers summed, the
    heads and width of the widest, which the cost model counts at least; ``part`` the first tower (the image's
    patches), whose patch size cuts the pixels."""
    from transformers import PretrainedConfig

    parts = [v for v in vars(vision).values() if isinstance(v, PretrainedConfig)]
    read = [(part, {what: _first(part, names) for what, names in
                    (("layers", LAYERS), ("heads", HEADS), ("hidden_size", WIDTH))}) for part in parts]
    read = [(part, sizes) for part, sizes in read if None not in sizes.values()]
    if not read:
        return dict(layers=None, heads=None, hidden_size=None), vision
    widest = max(read, key=lambda item: item[1]["hidden_size"])[1]
    return dict(widest, layers=sum(sizes["layers"] for _, sizes in read)), read[0][0]


def _timm_sizes(vision) -> tuple[dict, int | None]:
    """``(sizes, stride)`` of a timm tower (``timm_wrapper``: its ``architecture`` and ``model_args``) as timm builds
    it, on the meta device (no memory, no download): its attention modules counted as its layers, the most heads of
    one and that one's width (a hybrid's convolution stages have none: FastViT-MCi3's last two stages attend), and its
    total stride, each image token one cell of its last feature map; None sizes where timm builds no such model."""
    none = dict(layers=None, heads=None, hidden_size=None)
    architecture, args = getattr(vision, "architecture", None), getattr(vision, "model_args", None) or {}
    if getattr(vision, "model_type", None) != "timm_wrapper" or not isinstance(architecture, str) or not isinstance(
            args, dict):
        return none, None
    import inspect

    import timm
    import torch

    # only the model's own arguments: none of create_model's (a checkpoint_path it would read, a pretrained config)
    args = {k: v for k, v in args.items() if k not in inspect.signature(timm.create_model).parameters}
    try:
        with torch.device("meta"):
            model = timm.create_model(architecture, pretrained=False, **args)
    except (RuntimeError, ValueError, TypeError, KeyError):  # no such entry point, or arguments it does not take
        return none, None
    attending = [m for m in model.modules() if _whole(getattr(m, "num_heads", None))]
    if not attending:
        return none, None
    widest = max(attending, key=lambda m: m.num_heads * (_whole(getattr(m, "head_dim", None)) or 1))
    width = widest.num_heads * (_whole(getattr(widest, "head_dim", None)) or 1)
    info = getattr(model, "feature_info", None)
    stride = _whole(info[-1].get("reduction")) if isinstance(info, list) and info else None
    return dict(layers=len(attending), heads=widest.num_heads, hidden_size=width), stride


# The width an encoder-free embedder projects each patch to, in the order tried
FREE_WIDTH = ("mm_embed_dim", "hidden_size")


def _encoder_free(config, vision, model_type: str) -> DeclaredTower | None:
    """A tower without attention layers, the image's patches embedded straight into the language model, where its
    config says so: no vision config but a ``patch_size`` of the whole model's (Fuyu's linear over 30-px patches),
    or a vision config of no layers or heads but a patch (Gemma 4 Unified's encoder-free embedder over its
    ``model_patch_size``, the patch times its pooling kernel); else None. Each patch one image token; its sizes for
    the cost model: no layer, its projection's width."""
    part = config if vision is None else vision
    if vision is not None and (_first(vision, LAYERS) or _first(vision, HEADS)):
        return None
    patch = _side(getattr(part, "model_patch_size", None)) or _side(getattr(part, "patch_size", None))
    if not patch:
        return None
    from vit.costs.plan import LibraryShape

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    width = _first(part, FREE_WIDTH) or _first(text, ("hidden_size",)) or 1
    shape = LibraryShape(0, 1, width, 4 * width, 0, (patch, patch), _first(part, CHANNELS) or 3)
    return DeclaredTower(str(getattr(part, "model_type", "") or model_type), 1, shape)


def _vq_tokenizer(config, model_type: str) -> DeclaredTower | None:
    """A VQ image tokenizer in place of a tower, where the config declares one (``vq_config``: Chameleon's, Emu3's):
    its encoder halves the image's side at each level of its ``channel_multiplier`` but the last, and each cell of
    that latent grid is one code, one image token (Emu3's processor closes each row with a token over none); so the
    patch is ``2 ** (levels - 1)`` pixels, one token each. Its sizes for the cost model: no attention layer (its
    convolutions' one attention block over the latent cells aside), its widest level's channels. None where the
    config declares none."""
    vq = getattr(config, "vq_config", None)
    levels = getattr(vq, "channel_multiplier", None)
    if not (isinstance(levels, (list, tuple)) and levels and all(_whole(v) for v in levels) and len(levels) <= 12):
        return None
    from vit.costs.plan import LibraryShape

    patch = 2 ** (len(levels) - 1)
    width = (_first(vq, ("base_channels",)) or 1) * max(levels)
    shape = LibraryShape(0, 1, width, 4 * width, 0, (patch, patch), _first(vq, CHANNELS) or 3)
    return DeclaredTower(str(getattr(vq, "model_type", "") or model_type), 1, shape)


def learned_queries(config) -> str | None:
    """What a config declares its image tokens to be when they are learned queries over the tower's states, not
    patches or their merge units (BLIP-2's and InstructBLIP's Q-Former, Kosmos-2's and 2.5's latent queries,
    Idefics2's perceiver resampler), in words; None otherwise."""
    count = getattr(config, "num_query_tokens", None)
    if _whole(count):
        return f"a Q-Former's {count} learned queries (num_query_tokens)"
    count = getattr(config, "latent_query_num", None)
    if _whole(count):
        return f"{count} learned latent queries over the tower's states (latent_query_num)"
    latents = getattr(getattr(config, "perceiver_config", None), "resampler_n_latents", None)
    if _whole(latents) and getattr(config, "use_resampler", True) is not False:  # Idefics' may read the tower's own
        return f"a perceiver resampler's {latents} latents (perceiver_config.resampler_n_latents)"
    by_patches = getattr(config, "projector_patch_to_query_dict", None)  # Aria's projector: cross-attention
    if isinstance(by_patches, Mapping) and by_patches:
        counts = ", ".join(f"{queries} for {patches} patches" for patches, queries in sorted(by_patches.items()))
        return (f"its projector's learned queries, read by cross-attention over the patches ({counts}: "
                "projector_patch_to_query_dict)")
    return None
