"""InternVL 2.5 / 3 / 3.5's vision tower (InternViT) and projector, opened from the VLM's own ``-hf`` folder (HF
``internvl``: ``InternVLForConditionalGeneration``, ``InternVLModel``) without importing transformers and without
reading its language model.

InternViT (HF ``InternVLVisionModel``) is BEiT-shaped: a CLS token, a learned position table resized bicubically to
other grids, pre-norm blocks whose two branches carry layer scale (``lambda_1``, ``lambda_2``), separate q, k and v
projections (joined here into one qkv); the 6B tower adds RMSNorm blocks (``norm_type: rms_norm``) and an RMSNorm on
q and on k over all heads' channels (``use_qk_norm``, ``ViTConfig.qk_norm``).

The tower opened here ends where the language model reads it (HF ``get_image_features``): the hidden state of
``vision_feature_layer`` (-1: the last layer's output after the tower's final LayerNorm, an identity with
``use_mean_pooling``; another index: that layer's output with no norm), the CLS left out (strategy ``"default"``),
then ``pixel_shuffle``: each ``1 / downsample_ratio`` square unit of patch tokens concatenated (row-major inside the
unit, units row-major, as Qwen-VL's merge units), and ``InternVLMultiModalProjector`` (LayerNorm, linear,
activation, linear): ``ViTConfig.projector="internvl"``, ``ViT.project``. Only the tensors these need are read
(``wanted``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import torch

from vit.model import ViTConfig
from vit.sources.ports.families.import_dinov3 import _linear, _Taker, activation, joined
from vit.sources.vlm.import_vlm import PROJECTOR_PREFIXES, Reading, _projector_prefix

ARCHITECTURES = {"internvl": ("InternVLForConditionalGeneration", "InternVLModel")}
NAME = "InternVL"
# Where the tower lives: the Hub's layout (and what transformers 5 saves), then transformers 5's in memory
TOWER_PREFIXES = ("model.vision_tower.", "vision_tower.")
# InternVLVisionConfig's fields this program reads, and those that change nothing it computes (dropouts and
# initialisation act in training only; the mask token is masked image modelling's, never read here). Other keys are
# ignored, as transformers ignores them: the Hub's InternVL configs carry the original InternViT's "dropout" and
# "initializer_factor". tests/test_internvl_tower.py fails when a transformers release adds a field to neither.
HONOURED = {"hidden_size", "num_hidden_layers", "num_attention_heads", "attention_bias", "use_qk_norm",
            "intermediate_size", "hidden_act", "norm_type", "layer_norm_eps", "image_size", "patch_size",
            "num_channels", "use_absolute_position_embeddings", "use_mean_pooling"}
INERT = {"hidden_dropout_prob", "attention_dropout", "projection_dropout", "initializer_range", "use_mask_token",
         "layer_scale_init_value", "model_type"}
NORM_TYPES = {"layer_norm": "layer", "rms_norm": "rms"}


def _whole(value, name: str, least: int = 1, most: int = 1 << 16) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise ValueError(f"InternVL vision_config.{name} must be a whole number from {least} to {most}, got "
                         f"{str(value)[:40]}")
    return value


def _pair(value, name: str) -> int | tuple[int, int]:
    """An int, or HF's [height, width] (a square pair stays a pair; ViTConfig stores it as its side)."""
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ValueError(f"InternVL vision_config.{name} {str(value)[:40]} is neither a side nor [height, width]")
        return _whole(value[0], name), _whole(value[1], name)
    return _whole(value, name)


def _vision(config_json: Mapping) -> dict:
    vision = config_json.get("vision_config")
    if not isinstance(vision, Mapping):
        raise ValueError("InternVL config.json has no vision_config")
    if vision.get("model_type", "internvl_vision") != "internvl_vision":
        raise ValueError(f"InternVL's vision tower {str(vision.get('model_type'))[:40]!r} is not supported; "
                         "supported: internvl_vision")
    return dict(vision)


def unit_side(config_json: Mapping) -> int:
    """The pixel shuffle's unit side in patches: ``1 / downsample_ratio`` (2 for InternVL's 0.5)."""
    ratio = config_json.get("downsample_ratio", 0.5)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise ValueError(f"InternVL downsample_ratio must be a number in (0, 1], got {str(ratio)[:40]}")
    side = round(1 / ratio)
    if abs(side * ratio - 1) > 1e-9 or side > 16:
        raise ValueError(f"InternVL downsample_ratio {ratio} is not 1 / n for a whole n up to 16; its pixel shuffle "
                         "needs whole units")
    return side


def reading(config_json: Mapping) -> Reading:
    """What InternVL's language model reads of its tower, from its config.json; ValueError (one line) for what
    this program cannot open."""
    vision = _vision(config_json)
    total = _whole(vision.get("num_hidden_layers", 24), "num_hidden_layers", 1, 256)
    layer = config_json.get("vision_feature_layer", -1)
    if isinstance(layer, bool) or not isinstance(layer, int):  # HF indexes hidden_states with it: one layer only
        raise ValueError(f"InternVL vision_feature_layer must be one layer index, got {str(layer)[:40]}")
    depth = layer if layer >= 0 else total + 1 + layer
    if not 1 <= depth <= total:
        raise ValueError(f"vision_feature_layer {layer} reads no layer of a {total}-layer tower")
    strategy = config_json.get("vision_feature_select_strategy", "default")
    if strategy != "default":  # "full" keeps the CLS, and HF's pixel shuffle then finds no square grid
        raise ValueError(f"InternVL vision_feature_select_strategy {str(strategy)[:40]!r} is not supported; "
                         "supported: default (its pixel shuffle reads the patch tokens alone)")
    final = layer == -1 and not vision.get("use_mean_pooling", True)  # get_image_features: last_hidden_state
    unit = unit_side(config_json)
    kept = (f"its first {depth} layers (of {total}; vision_feature_layer {layer})" if depth < total
            else f"all {total} layers (vision_feature_layer {layer})")
    norm = "its final LayerNorm" if final else "no final norm"
    note = (f"{NAME} reads this InternViT tower after {kept}, with {norm}, leaving out its first token (the CLS); "
            f"then a pixel shuffle of each {unit}x{unit} unit of patches and InternVLMultiModalProjector (LayerNorm, "
            "linear, activation, linear), the tower's ViT.project: one image token per unit.")
    return Reading(vision, depth, final, 1, "internvl", note)


def _tower_key(key: str) -> str | None:
    """A tower tensor's name inside the tower (``encoder.layer.3.mlp.fc1.weight``), None for another tensor."""
    return next((key[len(p):] for p in TOWER_PREFIXES if key.startswith(p)), None)


def wanted(config_json: Mapping) -> Callable[[str], bool]:
    """Which of the VLM's tensors opening its tower reads: the embeddings, the layers up to the one read, the final
    norm where it is read, and the projector; never the language model or a later layer."""
    read = reading(config_json)
    layers = tuple(f"encoder.layer.{i}." for i in range(read.depth))
    tower = ("embeddings.", *layers, *(("layernorm.",) if read.final_norm else ()))

    def wants(key: str) -> bool:
        inner = _tower_key(key)
        return inner.startswith(tower) if inner is not None else key.startswith(PROJECTOR_PREFIXES)

    return wants


def config_from_hf(config_json: Mapping, state: Mapping[str, torch.Tensor]) -> ViTConfig:
    """Our config for InternVL's tower and projector, the language model's width from the projector's weights in
    ``state`` (``wanted``'s tensors; meta tensors will do)."""
    read = reading(config_json)
    vision = read.vision
    norm = vision.get("norm_type", "layer_norm")
    if norm not in NORM_TYPES:
        raise ValueError(f"InternVL vision_config.norm_type {str(norm)[:40]!r} is not supported; supported: "
                         f"{', '.join(NORM_TYPES)}")
    if read.final_norm and norm != "layer_norm":
        raise ValueError("InternVL's final LayerNorm after RMSNorm blocks (use_mean_pooling false, norm_type "
                         "rms_norm) is not supported")
    eps = vision.get("layer_norm_eps", 1e-6)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise ValueError(f"InternVL vision_config.layer_norm_eps must be in (0, 1), got {str(eps)[:40]}")
    hidden = _whole(vision.get("hidden_size", 1024), "hidden_size")
    unit = unit_side(config_json)
    prefix = _projector_prefix(state)
    weight, norm_weight = state.get(prefix + "linear_1.weight"), state.get(prefix + "layer_norm.weight")
    if weight is None or weight.dim() != 2 or norm_weight is None:
        raise ValueError(f"the VLM's weights lack {prefix}layer_norm.weight or a two-dimensional "
                         f"{prefix}linear_1.weight")
    if weight.shape[1] != hidden * unit * unit:
        raise ValueError(f"{prefix}linear_1.weight reads {weight.shape[1]} channels, not the {hidden * unit * unit} "
                         f"of a {unit}x{unit} pixel shuffle of {hidden}")
    config = ViTConfig(
        image_size=_pair(vision.get("image_size", 448), "image_size"),
        patch_size=_pair(vision.get("patch_size", 14), "patch_size"),
        num_channels=_whole(vision.get("num_channels", 3), "num_channels", 1, 16), num_classes=0,
        hidden_size=hidden, num_layers=read.depth,
        num_heads=_whole(vision.get("num_attention_heads", 16), "num_attention_heads"),
        mlp_size=_whole(vision.get("intermediate_size", 4096), "intermediate_size"),
        qkv_bias=bool(vision.get("attention_bias", False)), qk_norm=bool(vision.get("use_qk_norm", False)),
        layer_norm_eps=float(eps), layer_scale=1.0,  # lambda_1 / lambda_2 are read: the value only initialises
        activation=activation(vision.get("hidden_act", "gelu")), norm=NORM_TYPES[norm],
        pos_embed=bool(vision.get("use_absolute_position_embeddings", True)), pooling="avg",
        final_norm=read.final_norm)
    return replace(config, projector="internvl", projector_dim=int(weight.shape[0]), projector_skip=1,
                   projector_unit=unit,
                   projector_activation=activation(config_json.get("projector_hidden_act", "gelu")))


def state_dict_from_hf(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from ``wanted``'s tensors of an InternVL folder; a tensor with no place is an error."""
    tower = {inner: v for k, v in state.items() if (inner := _tower_key(k)) is not None}
    take = _Taker(tower, "InternVL vision tower")
    take.skip("embeddings.mask_token")
    ours = {"cls_token": take("embeddings.cls_token"),
            **_linear(take, "patch_embed", "embeddings.patch_embeddings.projection")}
    if config.pos_embed:
        ours["pos_embed"] = take("embeddings.position_embeddings")
    if config.final_norm:
        ours.update(_linear(take, "norm", "layernorm"))
    for i in range(config.num_layers):
        layer, b = f"encoder.layer.{i}", f"blocks.{i}"
        attention = f"{layer}.attention"
        ours[f"{b}.attn.qkv.weight"] = joined([take(f"{attention}.{n}_proj.weight") for n in "qkv"])
        if config.qkv_bias:
            ours[f"{b}.attn.qkv.bias"] = joined([take(f"{attention}.{n}_proj.bias") for n in "qkv"])
        if config.qk_norm:
            ours[f"{b}.attn.q_norm.weight"] = take(f"{attention}.q_norm.weight")
            ours[f"{b}.attn.k_norm.weight"] = take(f"{attention}.k_norm.weight")
        ours.update(_linear(take, f"{b}.attn.proj", f"{attention}.projection_layer"))
        ours.update(_linear(take, f"{b}.mlp.fc1", f"{layer}.mlp.fc1"))
        ours.update(_linear(take, f"{b}.mlp.fc2", f"{layer}.mlp.fc2"))
        for mine, theirs in (("norm1", "layernorm_before"), ("norm2", "layernorm_after")):
            ours[f"{b}.{mine}.weight"] = take(f"{layer}.{theirs}.weight")
            if config.norm == "layer":
                ours[f"{b}.{mine}.bias"] = take(f"{layer}.{theirs}.bias")
        ours[f"{b}.ls1"], ours[f"{b}.ls2"] = take(f"{layer}.lambda_1"), take(f"{layer}.lambda_2")
    take.check_all_used()
    rest = {k: v for k, v in state.items() if _tower_key(k) is None}
    prefix = _projector_prefix(rest)
    take = _Taker({k[len(prefix):]: v for k, v in rest.items() if k.startswith(prefix)}, "the VLM's projector")
    if len(take.state) != len(rest):
        raise ValueError(f"the VLM's weights hold tensors outside {prefix} this tower has no place for")
    ours.update(_linear(take, "projector.norm", "layer_norm"))
    ours.update(_linear(take, "projector.fc1", "linear_1"))
    ours.update(_linear(take, "projector.fc2", "linear_2"))
    take.check_all_used()
    return ours


def tower_architecture(config_json: Mapping) -> str:
    """The HF architecture of the tower alone: whose image processor defaults a folder without one gets."""
    return "InternVLVisionModel"


def image_processor(processor: Mapping | None, config_json: Mapping) -> tuple[Mapping | None, str | None]:
    """The image processor settings for the one image the tower is shown, and a sentence on what is not shown.
    InternVL's processor (``GotOcr2ImageProcessor``, ``crop_to_patches`` on by ``InternVLProcessor``'s default) shows
    the language model an image as square tiles at the aspect ratio closest to the image's plus a thumbnail, the
    whole image resized to one tile: the thumbnail is the image shown here. ValueError for a tile that is not
    square."""
    vision = _vision(config_json)
    side = vision.get("image_size", 448)
    side = side[0] if isinstance(side, (list, tuple)) and side else side
    if processor is None:  # vit.sources.open's defaults for InternVLVisionModel: InternVL's own transform
        return None, _shown({"height": side}, 12)
    size = processor.get("size") or {"height": 384, "width": 384}  # GotOcr2ImageProcessor's default
    if not isinstance(size, Mapping) or size.get("height") != size.get("width") or not isinstance(
            size.get("height"), int) or isinstance(size.get("height"), bool) or size["height"] <= 0:
        raise ValueError(f"InternVL's image processor size {str(size)[:60]} names no square tile (its pixel shuffle "
                         "reads a square grid); set size to {\"height\": N, \"width\": N}")
    if "shortest_edge" in size or "longest_edge" in size:
        raise ValueError(f"InternVL's image processor size {str(size)[:60]} must be a tile's height and width")
    return processor, _shown(size, processor.get("max_patches", 12))


def _shown(size: Mapping, max_patches) -> str:
    side = size["height"]
    most = max_patches if isinstance(max_patches, int) and not isinstance(max_patches, bool) else 12
    return (f"InternVL shows its language model an image as up to {most} tiles of {side}x{side} plus a thumbnail "
            f"(crop_to_patches): here the thumbnail alone, the whole image resized to {side}x{side} (the image's one "
            "tile when it fits one).")
