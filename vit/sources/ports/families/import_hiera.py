"""Hiera in our ``ViT`` (as stages with query pooling: ``vit.model.stages``): HF ``hiera`` folders and timm ``hiera_*``
weights, without importing either library.

Hiera has no class token: an overlapping patch stem (a 7x7 convolution at stride 4, padding 3), a learned position
table, stages whose width and heads double, mask-unit attention (each query attends within its mask unit, an 8x8
patch square on the stage-0 grid that halves with the grid) in the early stages and global attention later, a stage
opened by query pooling (its first block max-pools its queries and its projected residual 2x2, attending in the
previous stage's mask units or globally), mean pooling, a norm and the classifier. Both libraries hold the tokens in
an "unrolled" order; ours stay row-major on each stage's grid (the same attention, another token order).

Refused in one line: timm's ``abswin`` models (a window-tiled position table, layer scale and, in small, pooling
without the expanding projection), query pooling that stops before the last stage, strides other than 2x2,
non-square mask units, and mask-unit flags that turn back on after a global stage.

SAM 2's Hiera (HieraDet: windows per stage, a few global blocks, a background position table resized to the grid
plus a window table tiled over it) comes from timm's ``sam2_hiera_*`` (with its head norm) and from HF's ``sam2``
folders: ``Sam2HieraDetModel``, the backbone of ``Sam2VisionModel`` (``backbone_config``) and of ``Sam2Model``
(``vision_config.backbone_config``). The FPN neck, the prompt encoder and the mask decoder are dropped by name, as
SAM 1's are: the embedding is the mean of the last stage's tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from vit.model import ViTConfig
from vit.sources.ports.families.hf import check_number
from vit.sources.ports.families.import_dinov3 import _linear, _Taker

SUPPORTED = ("Hiera: HF HieraModel / HieraForImageClassification folders and timm hiera_* weights; SAM 2's Hiera "
             "image encoder: HF Sam2VisionModel / Sam2Model / Sam2HieraDetModel folders and timm sam2_hiera_* weights")
ARCHITECTURES = {"HieraModel": False, "HieraForImageClassification": True}
MODEL_ARGS_HONOURED = {"img_size", "in_chans", "num_classes", "global_pool", "embed_dim", "num_heads", "stages",
                       "q_pool", "q_stride", "mask_unit_size", "mask_unit_attn", "dim_mul", "head_mul",
                       "patch_kernel", "patch_stride", "patch_padding", "mlp_ratio", "use_expand_proj"}
MODEL_ARGS_INERT = {"drop_rate", "drop_path_rate", "patch_drop_rate", "head_init_scale", "fix_init", "weight_init"}


def is_hiera_name(name: str) -> bool:
    """timm's Hiera (``hiera_*``) and SAM 2's Hiera image encoder (``sam2_hiera_*``)."""
    return name.startswith(("hiera_", "sam2_hiera"))


def _pair(value, what: str) -> int:
    """A square (int or [a, a]) side."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == value[1] and isinstance(value[0], int):
        return int(value[0])
    raise ValueError(f"Hiera {what} {str(value)[:40]} is not supported here (square sides only)")


def _config(image_size, stride: int, kernel: int, padding: int, channels: int, classes: int, embed: int, depths,
            heads, dim_mul: float, mlp_ratio: float, q_pool: int, q_stride: int, mask_unit: int, unit_attention,
            eps: float) -> ViTConfig:
    depths, heads = tuple(int(d) for d in depths), tuple(int(h) for h in heads)
    stages = len(depths)
    if len(heads) != stages or len(unit_attention) != stages:
        raise ValueError(f"Hiera config has {stages} stages but {len(heads)} head counts and "
                         f"{len(unit_attention)} mask-unit flags")
    if q_pool != stages - 1 or q_stride != 2:
        raise ValueError(f"Hiera with query pooling in {q_pool} of {stages - 1} stage changes, stride {q_stride}, is "
                         "not supported (every published Hiera pools 2x2 at each)")
    flags = [bool(f) for f in unit_attention]
    if flags != sorted(flags, reverse=True):
        raise ValueError(f"Hiera mask-unit flags {flags} turn back on after a global stage; not supported")
    if mask_unit % 2 ** (stages - 1):
        raise ValueError(f"Hiera mask unit {mask_unit} does not halve {stages - 1} times")
    check_number(dim_mul, "embed_dim_multiplier", 1, 16)
    check_number(mlp_ratio, "mlp_ratio", 0.01, 64)
    widths = tuple(int(embed * dim_mul ** s) for s in range(stages))
    windows = tuple(mask_unit // 2 ** s if flags[s] else 0 for s in range(stages))
    return ViTConfig(image_size=image_size, patch_size=stride, num_channels=channels, num_classes=classes,
                     hidden_size=embed, num_layers=sum(depths), num_heads=heads[0], mlp_size=int(embed * mlp_ratio),
                     layer_norm_eps=eps, class_token=False, pooling="avg", fc_norm=True, stage_depths=depths,
                     stage_widths=widths, stage_heads=heads, merge="pool", stage_windows=windows, mask_units=True,
                     patch_kernel=kernel, patch_padding=padding)


def config_from_hf(config_json: Mapping) -> ViTConfig:
    """Our config for an HF ``hiera`` config.json (or SAM 2's: ``sam2_config_from_hf``)."""
    if config_json.get("model_type") in SAM2_HF_ARCHITECTURES:
        return sam2_config_from_hf(config_json)
    architecture = (config_json.get("architectures") or ["HieraModel"])[0]
    if architecture not in ARCHITECTURES:
        raise ValueError(f"HF architecture {architecture} is not supported; supported: {', '.join(ARCHITECTURES)}")
    if config_json.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"HF Hiera config uses activation {config_json.get('hidden_act')!r}; this model reads exact "
                         "GELU only here")
    labels = config_json.get("id2label")
    classes = (len(labels) if isinstance(labels, Mapping) and labels else config_json.get("num_labels", 2)) \
        if ARCHITECTURES[architecture] else 0
    size = config_json.get("image_size", [224, 224])
    size = tuple(int(s) for s in size) if isinstance(size, (list, tuple)) else int(size)
    image_size = size[0] if isinstance(size, tuple) and size[0] == size[1] else size
    depths = config_json.get("depths", [2, 3, 16, 3])
    return _config(image_size, _pair(config_json.get("patch_stride", [4, 4]), "patch_stride"),
                   _pair(config_json.get("patch_size", [7, 7]), "patch_size"),
                   _pair(config_json.get("patch_padding", [3, 3]), "patch_padding"),
                   int(config_json.get("num_channels", 3)), classes, int(config_json.get("embed_dim", 96)), depths,
                   config_json.get("num_heads", [1, 2, 4, 8]), config_json.get("embed_dim_multiplier", 2.0),
                   config_json.get("mlp_ratio", 4.0), int(config_json.get("num_query_pool", 3)),
                   _pair(config_json.get("query_stride", [2, 2]), "query_stride"),
                   _pair(config_json.get("masked_unit_size", [8, 8]), "masked_unit_size"),
                   config_json.get("masked_unit_attention", [True, True, False, False]),
                   float(config_json.get("layer_norm_eps", 1e-6)))


def _blocks(take: _Taker, config: ViTConfig, theirs_of, names: Mapping[str, str]) -> dict[str, torch.Tensor]:
    """Every block's weights: ``theirs_of(layer, stage, j)`` is the library's prefix of block ``layer`` (block
    ``j`` of ``stage``); ``names`` maps our sub-module names to theirs."""
    ours, layer = {}, 0
    for s, depth in enumerate(config.stage_depths):
        for j in range(depth):
            theirs, b = theirs_of(layer, s, j), f"blocks.{layer}"
            for mine, their in names.items():
                ours.update(_linear(take, f"{b}.{mine}", f"{theirs}.{their}"))
            if s and j == 0:
                ours.update(_linear(take, f"{b}.merge.proj", f"{theirs}.proj"))
            layer += 1
    return ours


_HF_NAMES = {"norm1": "layernorm_before", "attn.qkv": "attn.qkv", "attn.proj": "attn.proj",
             "norm2": "layernorm_after", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
_TIMM_NAMES = {"norm1": "norm1", "attn.qkv": "attn.qkv", "attn.proj": "attn.proj", "norm2": "norm2",
               "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}


def state_dict_from_hf(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from an HF Hiera (or SAM 2) one; ValueError on any key it cannot place."""
    if config.pos_embed_window:
        return sam2_state_dict_from_hf(state, config)
    take = _Taker(state, "HF Hiera state dict")
    base = "hiera." if any(k.startswith("hiera.") for k in state) else ""
    ours = _linear(take, "patch_embed", f"{base}embeddings.patch_embeddings.projection")
    ours["pos_embed"] = take(f"{base}embeddings.position_embeddings")
    ours.update(_blocks(take, config, lambda i, s, j: f"{base}encoder.stages.{s}.layers.{j}", _HF_NAMES))
    ours.update(_linear(take, "fc_norm", f"{base}pooler.layernorm"))
    if config.num_classes:
        ours.update(_linear(take, "head", "classifier"))
    take.check_all_used()
    return ours


def config_from_timm(name: str, state: Mapping[str, torch.Tensor], model_args: Mapping | None = None) -> ViTConfig:
    """Our config for timm's ``hiera_*`` weights: widths, depths, heads and kernel from the weights, the rest from
    timm's defaults (``model_args`` override them)."""
    if is_sam2_name(name):
        return sam2_config_from_timm(name, state, model_args)
    args = dict(model_args or {})
    if "abswin" in name or "pos_embed_win" in state:
        raise ValueError(f"timm {name}: the abswin Hiera (window-tiled positions, layer scale) is not supported; "
                         "timm hiera_*_224 and HF hiera folders are")
    for key in args:
        if key not in MODEL_ARGS_HONOURED | MODEL_ARGS_INERT:
            raise ValueError(f"timm model_args.{key} of {name} is not supported by this program's Hiera")
    if args.get("global_pool", "avg") != "avg" or not args.get("use_expand_proj", True):
        raise ValueError(f"timm {name}: only average pooling and the expanding projection are supported")
    if "pos_embed" not in state:
        raise ValueError(f"timm {name}: separate spatial / temporal positions (video Hiera) are not supported")
    embed, channels, kernel, kernel_w = state["patch_embed.proj.weight"].shape
    if kernel != kernel_w:
        raise ValueError(f"timm weights of {name} have a non-square {kernel}x{kernel_w} patch kernel")
    depth = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("blocks."))
    ends = [i - 1 for i in range(1, depth) if f"blocks.{i}.proj.weight" in state] + [depth - 1]
    depths = [b - a for a, b in zip([-1] + ends[:-1], ends, strict=True)]
    if args.get("stages") is not None and tuple(args["stages"]) != tuple(depths):
        raise ValueError(f"timm {name}: model_args.stages {list(args['stages'])} disagree with the weights {depths}")
    heads = [int(args.get("num_heads", 1) * args.get("head_mul", 2.0) ** s) for s in range(len(depths))]
    if "num_heads" not in args:  # the weights do not say; timm's model functions do
        heads = [h * {96: 1, 112: 2, 144: 2, 256: 4}.get(int(embed), 1) for h in heads]
    stride = _pair(args.get("patch_stride", (4, 4)), "patch_stride")
    tokens = state["pos_embed"].shape[1]
    size = args.get("img_size")
    if size is None:
        side = math.isqrt(tokens)
        if side * side != tokens:
            raise ValueError(f"timm {name}: a position table of {tokens} rows is no square grid; give model_args "
                             "img_size")
        size = side * stride
    elif isinstance(size, (list, tuple)):
        size = int(size[0]) if size[0] == size[1] else (int(size[0]), int(size[1]))
    unit_attention = args.get("mask_unit_attn", (True, True, False, False)[:len(depths)] if len(depths) == 4
                              else None)
    if unit_attention is None:
        raise ValueError(f"timm {name}: give model_args mask_unit_attn for its {len(depths)} stages")
    return _config(size, stride, int(kernel), _pair(args.get("patch_padding", (3, 3)), "patch_padding"),
                   int(channels), state["head.fc.weight"].shape[0] if "head.fc.weight" in state else 0, int(embed),
                   depths, heads, args.get("dim_mul", 2.0), state["blocks.0.mlp.fc1.weight"].shape[0] / embed,
                   int(args.get("q_pool", 3)), _pair(args.get("q_stride", (2, 2)), "q_stride"),
                   _pair(args.get("mask_unit_size", (8, 8)), "mask_unit_size"), unit_attention, 1e-6)


def state_dict_from_timm(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from timm's Hiera (or SAM 2 Hiera) one."""
    if config.pos_embed_window:
        return sam2_state_dict_from_timm(state, config)
    take = _Taker(state, "timm Hiera state dict")
    ours = _linear(take, "patch_embed", "patch_embed.proj")
    ours["pos_embed"] = take("pos_embed")
    return _timm_blocks_and_head(take, config, ours)


# --- SAM 2's Hiera image encoder (timm HieraDet) ------------------------------------------------------------------

SAM2_MODEL_ARGS = {"in_chans", "num_classes", "global_pool", "embed_dim", "num_heads", "stages", "q_pool", "q_stride",
                   "dim_mul", "head_mul", "global_pos_size", "window_spec", "global_att_blocks", "mlp_ratio",
                   "patch_kernel", "patch_stride", "patch_padding", "img_size"}
_SAM2_DEFAULTS = {  # timm's sam2_hiera_* model functions: stages, global blocks, window_spec, background side
    "tiny": ((1, 2, 7, 2), (5, 7, 9), (8, 4, 14, 7), 7), "small": ((1, 2, 11, 2), (7, 10, 13), (8, 4, 14, 7), 7),
    "base_plus": ((2, 3, 16, 3), (12, 16, 20), (8, 4, 14, 7), 14),
    "large": ((2, 6, 36, 4), (23, 33, 43), (8, 4, 16, 8), 7)}


def is_sam2_name(name: str) -> bool:
    return name.startswith("sam2_hiera")


def sam2_config(image_size, stride: int, kernel: int, padding: int, channels: int, classes: int, widths, depths,
                heads, mlp_ratio: float, q_pool: int, q_stride: int, windows, global_blocks, background: int,
                eps: float = 1e-6, head_norm: bool = True) -> ViTConfig:
    """Our config for SAM 2's Hiera: ``widths`` per stage, windows per stage (a stage's first block in the previous
    stage's, pooled), global blocks, the background position table resized to the grid plus a window table tiled
    over it. ``head_norm``: timm's HieraDet normalises the pooled vector; HF's backbone ends at the last block."""
    depths, heads, windows = tuple(int(d) for d in depths), tuple(int(h) for h in heads), tuple(int(w) for w in windows)
    widths = tuple(int(w) for w in widths)
    if len(heads) != len(depths) or len(windows) != len(depths) or len(widths) != len(depths):
        raise ValueError(f"SAM 2 Hiera config has {len(depths)} stages, {len(widths)} widths, {len(heads)} head "
                         f"counts and {len(windows)} window sides")
    if q_pool != len(depths) - 1 or q_stride != 2:
        raise ValueError(f"SAM 2 Hiera with query pooling in {q_pool} of {len(depths) - 1} stage changes, stride "
                         f"{q_stride}, is not supported")
    check_number(mlp_ratio, "mlp_ratio", 0.01, 64)
    return ViTConfig(image_size=image_size, patch_size=stride, num_channels=channels, num_classes=classes,
                     hidden_size=widths[0], num_layers=sum(depths), num_heads=heads[0],
                     mlp_size=int(widths[0] * mlp_ratio), layer_norm_eps=eps, class_token=False, pooling="avg",
                     fc_norm=head_norm, final_norm=head_norm, stage_depths=depths, stage_widths=widths,
                     stage_heads=heads, merge="pool", stage_windows=windows,
                     global_layers=tuple(int(b) for b in global_blocks), patch_kernel=kernel, patch_padding=padding,
                     pos_embed_grid=background, pos_embed_window=windows[0])


def sam2_config_from_timm(name: str, state: Mapping[str, torch.Tensor], model_args: Mapping | None = None
                          ) -> ViTConfig:
    """Our config for timm's ``sam2_hiera_*`` weights: widths from the weights, the rest from timm's model function
    (``model_args`` override it)."""
    args = dict(model_args or {})
    for key in args:
        if key not in SAM2_MODEL_ARGS | MODEL_ARGS_INERT:
            raise ValueError(f"timm model_args.{key} of {name} is not supported by this program's SAM 2 Hiera")
    if args.get("global_pool", "avg") != "avg" or any(".ls1." in k for k in state):
        raise ValueError(f"timm {name}: only average pooling and no layer scale are supported")
    embed, channels, kernel, _ = state["patch_embed.proj.weight"].shape
    variant = name.removeprefix("sam2_hiera_").split(".")[0]
    stages, global_blocks, windows, background = _SAM2_DEFAULTS.get(variant, _SAM2_DEFAULTS["tiny"])
    stages = tuple(args.get("stages", stages))
    heads = [int(args.get("num_heads", 2 if variant == "base_plus" else 1) * args.get("head_mul", 2.0) ** s)
             for s in range(len(stages))]
    background = int(state["pos_embed"].shape[-1])
    size = args.get("img_size", 1024)
    dim_mul = args.get("dim_mul", 2.0)
    check_number(dim_mul, "dim_mul", 1, 16)
    return sam2_config(size, _pair(args.get("patch_stride", (4, 4)), "patch_stride"), int(kernel),
                       _pair(args.get("patch_padding", (3, 3)), "patch_padding"), int(channels),
                       state["head.fc.weight"].shape[0] if "head.fc.weight" in state else 0,
                       [int(embed * dim_mul ** s) for s in range(len(stages))], stages,
                       heads, state["blocks.0.mlp.fc1.weight"].shape[0] / embed,
                       int(args.get("q_pool", 3)), _pair(args.get("q_stride", (2, 2)), "q_stride"),
                       args.get("window_spec", windows), args.get("global_att_blocks", global_blocks), background)


def sam2_state_dict_from_timm(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from timm's SAM 2 Hiera one: the background table and the window table flattened row-major."""
    take = _Taker(state, "timm SAM 2 Hiera state dict")
    ours = _linear(take, "patch_embed", "patch_embed.proj")
    ours["pos_embed"] = take("pos_embed").flatten(2).transpose(1, 2)  # (1, D, h, w) -> (1, h*w, D)
    ours["pos_embed_window"] = take("pos_embed_window").flatten(2).transpose(1, 2)
    return _timm_blocks_and_head(take, config, ours)



def _timm_blocks_and_head(take: _Taker, config: ViTConfig, ours: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The rest of a timm Hiera / SAM 2 Hiera state dict after its stem and positions: the blocks, the head's norm
    and (with classes) its linear layer; every key used."""
    ours.update(_blocks(take, config, lambda i, s, j: f"blocks.{i}", _TIMM_NAMES))
    ours.update(_linear(take, "fc_norm", "head.norm"))
    if config.num_classes:
        ours.update(_linear(take, "head", "head.fc"))
    take.check_all_used()
    return ours

# --- SAM 2's Hiera image encoder in HF (Sam2HieraDetModel, the backbone of Sam2VisionModel and Sam2Model) ---------

SAM2_HF_ARCHITECTURES = {"sam2": "Sam2Model", "sam2_vision_model": "Sam2VisionModel",
                         "sam2_hiera_det_model": "Sam2HieraDetModel"}  # model_type -> the architecture it saves
# What is not the backbone, dropped by name: the FPN neck (as SAM 1's neck is), Sam2Model's prompt encoder, mask
# decoder and its empty-memory embedding.
_SAM2_HF_DROPPED = ("neck.", "vision_encoder.neck.", "prompt_encoder.", "mask_decoder.", "shared_image_embedding.",
                    "no_memory_embedding")
_SAM2_HF_NAMES = {"norm1": "layer_norm1", "attn.qkv": "attn.qkv", "attn.proj": "attn.proj", "norm2": "layer_norm2",
                  "mlp.fc1": "mlp.proj_in", "mlp.fc2": "mlp.proj_out"}


def _nested(config_json: Mapping, key: str) -> Mapping:
    """A sub-config (``vision_config``, ``backbone_config``); absent or empty: HF's defaults throughout."""
    value = config_json.get(key) or {}
    if not isinstance(value, Mapping):
        raise ValueError(f"HF SAM 2 config {key} must be an object, got {str(value)[:40]}")
    return value


def sam2_config_from_hf(config_json: Mapping) -> ViTConfig:
    """Our config for an HF ``sam2`` / ``sam2_vision_model`` / ``sam2_hiera_det_model`` config.json: the backbone
    (``backbone_config``, nested in ``vision_config`` for Sam2Model), HF's defaults (SAM 2 Hiera-T) where a field is
    absent. No classifier and no head norm: the embedding is the mean of the last stage's tokens."""
    backbone = config_json
    if config_json.get("model_type") == "sam2":
        backbone = _nested(backbone, "vision_config")
    if config_json.get("model_type") in ("sam2", "sam2_vision_model"):
        backbone = _nested(backbone, "backbone_config")
    if backbone.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"HF SAM 2 config uses activation {backbone.get('hidden_act')!r}; this model reads exact "
                         "GELU only here")
    widths = backbone.get("embed_dim_per_stage", [96, 192, 384, 768])
    if not isinstance(widths, list) or not widths:
        raise ValueError(f"HF SAM 2 config embed_dim_per_stage must be a list of widths, got {str(widths)[:40]}")
    if backbone.get("hidden_size", 96) != widths[0]:
        raise ValueError(f"HF SAM 2 config hidden_size {str(backbone.get('hidden_size'))[:20]} differs from its "
                         f"first stage's width {widths[0]}")
    background = backbone.get("window_positional_embedding_background_size", [7, 7])
    size = backbone.get("image_size", [1024, 1024])
    size = tuple(int(s) for s in size) if isinstance(size, (list, tuple)) else int(size)
    image_size = size[0] if isinstance(size, tuple) and size[0] == size[1] else size
    return sam2_config(image_size, _pair(backbone.get("patch_stride", [4, 4]), "patch_stride"),
                       _pair(backbone.get("patch_kernel_size", [7, 7]), "patch_kernel_size"),
                       _pair(backbone.get("patch_padding", [3, 3]), "patch_padding"),
                       int(backbone.get("num_channels", 3)), 0, widths,
                       backbone.get("blocks_per_stage", [1, 2, 7, 2]),
                       backbone.get("num_attention_heads_per_stage", [1, 2, 4, 8]),
                       backbone.get("mlp_ratio", 4.0), int(backbone.get("num_query_pool_stages", 3)),
                       _pair(backbone.get("query_stride", [2, 2]), "query_stride"),
                       backbone.get("window_size_per_stage", [8, 4, 14, 7]),
                       backbone.get("global_attention_blocks", [5, 7, 9]),
                       _pair(background, "window_positional_embedding_background_size"),
                       float(backbone.get("layer_norm_eps", 1e-6)), head_norm=False)


def sam2_state_dict_from_hf(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from an HF SAM 2 one: the backbone's keys (under ``vision_encoder.backbone.``,
    ``backbone.`` or none); the neck, prompt encoder and mask decoder are dropped by name."""
    take = _Taker(state, "HF SAM 2 state dict")
    base = next((p for p in ("vision_encoder.backbone.", "backbone.") if any(k.startswith(p) for k in state)), "")
    take.skip(*(k for k in state if k.startswith(_SAM2_HF_DROPPED)))
    ours = _linear(take, "patch_embed", f"{base}patch_embed.projection")
    ours["pos_embed"] = take(f"{base}pos_embed").flatten(2).transpose(1, 2)  # (1, D, h, w) -> (1, h*w, D)
    ours["pos_embed_window"] = take(f"{base}pos_embed_window").flatten(2).transpose(1, 2)
    ours.update(_blocks(take, config, lambda i, s, j: f"{base}blocks.{i}", _SAM2_HF_NAMES))
    take.check_all_used()
    return ours
