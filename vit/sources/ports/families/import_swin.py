"""Swin and Swin V2 in our ``ViT`` (as stages: ``vit.model.stages``): HF ``swin`` / ``swinv2`` folders and timm
``swin_*`` / ``swinv2_*`` weights, without importing either library.

Swin has no class token: a patch embedding with a LayerNorm, stages of blocks attending within windows (every second
block of a stage on windows cyclically shifted by half a window, with the shift's mask), each stage opened by a
patch merging (2x2 neighbours concatenated, a norm, a linear map), a final norm, mean pooling and the classifier.
V1 adds a learned table of relative position biases over a window's offsets; V2 a bias from a small MLP of
log-spaced offsets (``16 * sigmoid``), cosine attention with a learned per-head logit scale, no key bias, norms after
each branch instead of before (res-post-norm) and a merge that maps before it normalises. HF pads the grid before
the cyclic shift, timm after it (``ViTConfig.shift_padded``). Where a stage's grid is no larger than the windows on
a side, each library has its own rule (``ViTConfig.window_rule``, ``vit.model.stages.window_and_shift``): HF Swin
takes the grid's shorter side for both axes (unshifted windows of that side; a smaller one refuses in V1, whose
table has no other offsets), HF Swin V2 the height of the grid it is built for, for both axes, and timm each axis
on its own (a window of that axis's length, not shifted along it; V1's table resized as timm's checkpoint filter
resizes it). HF's masked-image-modelling decoder and ``SwinBackbone`` are not supported.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from vit.model import ViTConfig
from vit.sources.ports.families.hf import check_number
from vit.sources.ports.families.import_dinov3 import _linear, _qkv, _Taker

SUPPORTED = ("Swin / Swin V2: HF SwinModel, SwinForImageClassification, Swinv2Model, Swinv2ForImageClassification "
             "folders and timm swin_* / swinv2_* weights")
ARCHITECTURES = {"SwinModel": False, "SwinForImageClassification": True, "Swinv2Model": False,
                 "Swinv2ForImageClassification": True}
MODEL_ARGS_HONOURED = {"img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depths",
                       "num_heads", "window_size", "mlp_ratio", "qkv_bias", "pretrained_window_sizes",
                       "strict_img_size"}
MODEL_ARGS_INERT = {"drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate", "head_init_scale"}


def is_swin_name(name: str) -> bool:
    return name.startswith(("swin_", "swinv2_")) and not name.startswith("swinv2_cr")


def _config(v2: bool, image_size, patch: int, channels: int, classes: int, embed: int, depths, heads, window: int,
            mlp_ratio: float, qkv_bias: bool, abs_pos: bool, timm: bool, pretrained=()) -> ViTConfig:
    depths, heads = tuple(int(d) for d in depths), tuple(int(h) for h in heads)
    if len(heads) != len(depths):
        raise ValueError(f"Swin config has {len(depths)} stages but {len(heads)} head counts")
    widths = tuple(embed * 2 ** s for s in range(len(depths)))
    check_number(mlp_ratio, "mlp_ratio", 0.01, 64)
    return ViTConfig(image_size=image_size, patch_size=patch, num_channels=channels, num_classes=classes,
                     hidden_size=embed, num_layers=sum(depths), num_heads=heads[0], mlp_size=int(embed * mlp_ratio),
                     layer_norm_eps=1e-5, qkv_bias=qkv_bias, class_token=False, pos_embed=abs_pos, pooling="avg",
                     embed_norm=True, stage_depths=depths, stage_widths=widths, stage_heads=heads,
                     merge="swinv2" if v2 else "swin", window_size=window, window_shift=True,
                     shift_padded=not timm, window_rule="timm" if timm else "hf_v2" if v2 else "hf",
                     rel_pos="swinv2" if v2 else "swin",
                     attention="cosine" if v2 else "dot", res_post_norm=v2, key_bias=not v2,
                     pretrained_windows=tuple(pretrained) if any(pretrained) else ())


def config_from_hf(config_json: Mapping) -> ViTConfig:
    """Our config for an HF ``swin`` / ``swinv2`` config.json."""
    v2 = config_json.get("model_type") == "swinv2"
    architecture = (config_json.get("architectures") or ["Swinv2Model" if v2 else "SwinModel"])[0]
    if architecture not in ARCHITECTURES:
        raise ValueError(f"HF architecture {architecture} is not supported; supported: {', '.join(ARCHITECTURES)}")
    if config_json.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"HF Swin config uses activation {config_json.get('hidden_act')!r}; this model reads exact "
                         "GELU only here")
    eps = config_json.get("layer_norm_eps", 1e-5)
    if eps != 1e-5:  # HF's embedding and merge norms keep nn.LayerNorm's 1e-5 whatever the config says
        raise ValueError(f"HF Swin config has layer_norm_eps {eps}; this model reads 1e-5 (Swin's) only")
    labels = config_json.get("id2label")
    classes = (len(labels) if isinstance(labels, Mapping) and labels else config_json.get("num_labels", 2)) \
        if ARCHITECTURES[architecture] else 0
    depths = config_json.get("depths", [2, 2, 6, 2])
    pretrained = config_json.get("pretrained_window_sizes", [0] * len(depths)) if v2 else ()
    return _config(v2, config_json.get("image_size", 224), config_json.get("patch_size", 4),
                   config_json.get("num_channels", 3), classes, config_json.get("embed_dim", 96), depths,
                   config_json.get("num_heads", [3, 6, 12, 24]), config_json.get("window_size", 7),
                   config_json.get("mlp_ratio", 4.0), bool(config_json.get("qkv_bias", True)),
                   bool(config_json.get("use_absolute_embeddings", False)), False, pretrained)


def state_dict_from_hf(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from an HF Swin / Swin V2 one; ValueError on any key it cannot place."""
    take = _Taker(state, "HF Swin state dict")
    v2 = config.merge == "swinv2"
    base = "swinv2." if v2 else "swin."
    if not any(k.startswith(base) for k in state):
        base = ""
    take.skip(*(k for k in state if k.startswith(f"{base}embeddings.mask_token")))
    ours = _linear(take, "patch_embed", f"{base}embeddings.patch_embeddings.projection")
    ours.update(_linear(take, "embed_norm", f"{base}embeddings.norm"))
    if config.pos_embed:
        ours["pos_embed"] = take(f"{base}embeddings.position_embeddings")
    layer = 0
    for s, depth in enumerate(config.stage_depths):
        for j in range(depth):
            theirs, b = f"{base}encoder.layers.{s}.blocks.{j}", f"blocks.{layer}"
            attn = f"{theirs}.attention.self"
            qkv = [take(f"{attn}.{n}.weight") for n in ("query", "key", "value")]
            ours.update({f"{b}.attn.qkv.{k}": v for k, v in _qkv(
                qkv, [take.get(f"{attn}.{n}.bias") for n in ("query", "key", "value")], config).items()})
            ours.update(_linear(take, f"{b}.attn.proj", f"{theirs}.attention.output.dense"))
            ours.update(_linear(take, f"{b}.mlp.fc1", f"{theirs}.intermediate.dense"))
            ours.update(_linear(take, f"{b}.mlp.fc2", f"{theirs}.output.dense"))
            norms = ("res_norm1", "res_norm2") if v2 else ("norm1", "norm2")
            ours.update(_linear(take, f"{b}.{norms[0]}", f"{theirs}.layernorm_before"))
            ours.update(_linear(take, f"{b}.{norms[1]}", f"{theirs}.layernorm_after"))
            if v2:
                ours[f"{b}.attn.logit_scale"] = take(f"{attn}.logit_scale")
                for i in (0, 2):
                    ours.update(_cpb(take, b, attn, i))
            else:
                ours[f"{b}.attn.window_bias.table"] = take(f"{attn}.relative_position_bias_table")
            take.skip(f"{attn}.relative_position_index", f"{attn}.relative_coords_table")
            layer += 1
        if s + 1 < config.num_stages:
            first = f"blocks.{config.stage_start(s + 1)}.merge"
            ours[f"{first}.reduction.weight"] = take(f"{base}encoder.layers.{s}.downsample.reduction.weight")
            ours.update(_linear(take, f"{first}.norm", f"{base}encoder.layers.{s}.downsample.norm"))
    ours.update(_linear(take, "norm", f"{base}layernorm"))
    if config.num_classes:
        ours.update(_linear(take, "head", "classifier"))
    take.check_all_used()
    return ours


def _cpb(take: _Taker, ours: str, theirs: str, i: int, name: str = "continuous_position_bias_mlp"
         ) -> dict[str, torch.Tensor]:
    """Swin V2's position MLP layer ``i`` (0: with a bias, 2: without)."""
    out = {f"{ours}.attn.window_bias.cpb_mlp.{i}.weight": take(f"{theirs}.{name}.{i}.weight")}
    if i == 0:
        out[f"{ours}.attn.window_bias.cpb_mlp.0.bias"] = take(f"{theirs}.{name}.0.bias")
    return out


# --- timm ---------------------------------------------------------------------------------------------------------

_TIMM_WINDOWS = re.compile(r"window(\d+)(?:to(\d+))?")
_TIMM_SIZE = re.compile(r"_(\d+)(?:to(\d+))?(?:\.|$)")


def config_from_timm(name: str, state: Mapping[str, torch.Tensor], model_args: Mapping | None = None) -> ViTConfig:
    """Our config for timm's ``swin_*`` / ``swinv2_*`` weights: sizes from the weights, the window and input size
    from the name (``model_args`` override them)."""
    args = dict(model_args or {})
    for key in args:
        if key not in MODEL_ARGS_HONOURED | MODEL_ARGS_INERT:
            raise ValueError(f"timm model_args.{key} of {name} is not supported by this program's Swin")
    if args.get("global_pool", "avg") != "avg":
        raise ValueError(f"timm {name}: global_pool {args['global_pool']!r} is not supported (Swin's is avg)")
    v2 = name.startswith("swinv2_")
    width, channels, patch, patch_w = state["patch_embed.proj.weight"].shape
    if patch != patch_w:
        raise ValueError(f"timm weights of {name} have non-square {patch}x{patch_w} patches")
    stages = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"^layers\.(\d+)\.", k)))
    depths = [1 + max(int(m.group(1)) for k in state if (m := re.match(rf"^layers\.{s}\.blocks\.(\d+)\.", k)))
              for s in range(stages)]
    if v2:
        heads = [state[f"layers.{s}.blocks.0.attn.logit_scale"].shape[0] for s in range(stages)]
    else:
        heads = [state[f"layers.{s}.blocks.0.attn.relative_position_bias_table"].shape[1] for s in range(stages)]
    named = _TIMM_WINDOWS.search(name)
    window = int(args.get("window_size") or (named.group(2) or named.group(1) if named else 7))
    if not v2:
        table = state["layers.0.blocks.0.attn.relative_position_bias_table"].shape[0]
        side = (int(round(table ** 0.5)) + 1) // 2
        if (2 * side - 1) ** 2 != table:
            raise ValueError(f"timm {name}: a position table of {table} rows is no square window's")
        window = side
        for s in range(1, stages):
            rows = state[f"layers.{s}.blocks.0.attn.relative_position_bias_table"].shape[0]
            if rows != table:  # timm built at a size whose grid there is narrower than the windows
                raise ValueError(f"timm {name}: stage {s}'s position table has {rows} rows, not the {table} of its "
                                 f"{window}x{window} windows (timm resized it for an input narrower than them); open "
                                 "the weights as trained, which are resized here as timm does at any input size")
    sized = _TIMM_SIZE.search(name.split(".")[0] + ".")
    size = args.get("img_size") or (int(sized.group(2) or sized.group(1)) if sized else 224)
    if isinstance(size, (list, tuple)):
        size = size[0] if size[0] == size[1] else (int(size[0]), int(size[1]))
    pretrained = args.get("pretrained_window_sizes", ())
    if pretrained and not isinstance(pretrained, (list, tuple)):
        pretrained = (pretrained,) * stages
    mlp_ratio = state["layers.0.blocks.0.mlp.fc1.weight"].shape[0] / width
    classes = state["head.fc.weight"].shape[0] if "head.fc.weight" in state else 0
    qkv_bias = ("layers.0.blocks.0.attn.q_bias" in state) if v2 else ("layers.0.blocks.0.attn.qkv.bias" in state)
    return _config(v2, size, patch, channels, classes, width, depths, heads, window, mlp_ratio, qkv_bias,
                   "absolute_pos_embed" in state, True, pretrained)


def state_dict_from_timm(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from timm's Swin / Swin V2 one."""
    take = _Taker(state, "timm Swin state dict")
    v2 = config.merge == "swinv2"
    ours = _linear(take, "patch_embed", "patch_embed.proj")
    ours.update(_linear(take, "embed_norm", "patch_embed.norm"))
    if config.pos_embed:
        ours["pos_embed"] = take("absolute_pos_embed").reshape(1, -1, config.hidden_size)
    layer = 0
    for s, depth in enumerate(config.stage_depths):
        if s:
            merge = f"blocks.{layer}.merge"
            ours[f"{merge}.reduction.weight"] = take(f"layers.{s}.downsample.reduction.weight")
            ours.update(_linear(take, f"{merge}.norm", f"layers.{s}.downsample.norm"))
        for j in range(depth):
            theirs, b = f"layers.{s}.blocks.{j}", f"blocks.{layer}"
            attn = f"{theirs}.attn"
            if v2:
                weight = take(f"{attn}.qkv.weight")
                q_bias, v_bias = take.get(f"{attn}.q_bias"), take.get(f"{attn}.v_bias")
                ours[f"{b}.attn.qkv.weight"] = weight
                if config.qkv_bias:
                    ours[f"{b}.attn.qkv.bias"] = torch.cat([q_bias, torch.zeros_like(q_bias), v_bias])
                ours[f"{b}.attn.logit_scale"] = take(f"{attn}.logit_scale")
                for i in (0, 2):
                    ours.update(_cpb(take, b, attn, i, "cpb_mlp"))
            else:
                ours.update(_linear(take, f"{b}.attn.qkv", f"{attn}.qkv"))
                ours[f"{b}.attn.window_bias.table"] = take(f"{attn}.relative_position_bias_table")
            take.skip(f"{attn}.relative_position_index", f"{attn}.relative_coords_table", f"{theirs}.attn_mask")
            ours.update(_linear(take, f"{b}.attn.proj", f"{attn}.proj"))
            ours.update(_linear(take, f"{b}.mlp.fc1", f"{theirs}.mlp.fc1"))
            ours.update(_linear(take, f"{b}.mlp.fc2", f"{theirs}.mlp.fc2"))
            norms = ("res_norm1", "res_norm2") if v2 else ("norm1", "norm2")
            ours.update(_linear(take, f"{b}.{norms[0]}", f"{theirs}.norm1"))
            ours.update(_linear(take, f"{b}.{norms[1]}", f"{theirs}.norm2"))
            layer += 1
    ours.update(_linear(take, "norm", "norm"))
    if config.num_classes:
        ours.update(_linear(take, "head", "head.fc"))
    take.check_all_used()
    return ours
