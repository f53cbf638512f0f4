"""EVA-02 (Fang et al. 2023) in our ``ViT``: timm ``eva02_*`` weights (timm's ``Eva`` class), without importing timm.

EVA-02 is a ViT with a CLS token and a learned position table *and* rotary positions on the
patch tokens' queries and keys (``ViTConfig.rope="eva"``: patch-index coordinates rescaled to
the 16 x 16 pre-training grid, interleaved channel pairs, base 10000), no key bias
(``key_bias=False``), and a SwiGLU MLP: packed (``mlp.fc1`` holds gate then value) in the
tiny/small models, separate with a LayerNorm before ``fc2`` (``mlp.fc1_g``, ``mlp.fc1_x``,
``mlp.norm``) in base/large, whose attention also keeps separate ``q_proj``/``k_proj``/``v_proj``.
timm's default pooling is the mean of the patches with ``fc_norm``. The EVA-CLIP towers
(``attn.norm``, scale_attn_inner) are refused.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from vit.model import ViTConfig
from vit.sources.ports.families.import_beit import _timm_grid
from vit.sources.ports.families.import_dinov3 import _linear, _Taker, timm_shape

SUPPORTED = "EVA-02: timm eva02_* weights (not the EVA-CLIP towers)"
HEADS_BY_WIDTH = {192: 3, 384: 6, 768: 12, 1024: 16}
MODEL_ARGS_HONOURED = {"img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depth",
                       "num_heads", "mlp_ratio", "qkv_bias", "qkv_fused", "swiglu_mlp", "scale_mlp", "init_values",
                       "use_rot_pos_emb", "ref_feat_shape", "rope_temperature", "use_fc_norm", "dynamic_img_size",
                       "class_token", "use_abs_pos_emb"}
MODEL_ARGS_INERT = {"drop_rate", "pos_drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate",
                    "head_init_scale", "patch_drop_rate"}


def is_eva_name(name: str) -> bool:
    return name.startswith("eva02_")


def config_from_timm(name: str, state: Mapping[str, torch.Tensor], model_args: Mapping | None = None) -> ViTConfig:
    """Our config for timm's ``eva02_*`` weights; ``model_args`` are timm's overrides from its config.json."""
    args = dict(model_args or {})
    for key in args:
        if key not in MODEL_ARGS_HONOURED | MODEL_ARGS_INERT:
            raise ValueError(f"timm model_args.{key} of {name} is not supported by this program's EVA-02")
    if "blocks.0.attn.norm.weight" in state:
        raise ValueError(f"timm {name}: the EVA-CLIP attention norm (scale_attn_inner) is not supported")
    if args.get("use_rot_pos_emb", True) is not True or "pos_embed" not in state or "cls_token" not in state:
        raise ValueError(f"timm {name}: only EVA-02's layout (CLS token, position table and RoPE) is supported")
    width, channels, patch, depth = timm_shape(name, state)
    heads = args.get("num_heads") or HEADS_BY_WIDTH.get(width)
    if not heads:
        raise ValueError(f"cannot tell the number of heads of {name} (width {width}); give model_args.num_heads")
    grid = _timm_grid(name, args.get("img_size"), patch, None, state["pos_embed"])  # timm's (H, W) img_size too
    ref = args.get("ref_feat_shape", 16)
    if isinstance(ref, (list, tuple)):
        if len(ref) != 2 or ref[0] != ref[1]:
            raise ValueError(f"timm {name}: ref_feat_shape {ref!r} is not square")
        ref = ref[0]
    pool = args.get("global_pool", "avg")
    if pool not in ("avg", "token"):
        raise ValueError(f"timm global_pool {pool!r} of {name} is not supported; supported: avg, token")
    if "fc_norm.weight" in state and "norm.weight" in state:
        raise ValueError(f"timm {name}: a final norm and an fc_norm together are not supported")
    separate = "blocks.0.mlp.fc1_g.weight" in state
    hidden = state["blocks.0.mlp.fc1_x.weight" if separate else "blocks.0.mlp.fc1.weight"].shape[0]
    return ViTConfig(
        image_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, num_channels=channels,
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0, hidden_size=width,
        num_layers=depth, num_heads=int(heads), mlp_size=hidden if separate else hidden // 2,
        qkv_bias="blocks.0.attn.q_bias" in state or "blocks.0.attn.q_proj.bias" in state, key_bias=False,
        layer_norm_eps=1e-6, layer_scale=float(args.get("init_values") or 1.0) if "blocks.0.gamma_1" in state else None,
        pooling="avg" if pool == "avg" else "cls", fc_norm="fc_norm.weight" in state, pos_embed_antialias=True,
        rope="eva", rope_theta=float(args.get("rope_temperature", 10000.0)), rope_ref_grid=int(ref or 0),
        activation="silu", gated_mlp=True, mlp_norm="blocks.0.mlp.norm.weight" in state)


def state_dict_from_timm(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from timm's EVA-02 one; ValueError on any key it cannot place."""
    take = _Taker(state, "timm EVA-02 state dict")
    ours = {"cls_token": take("cls_token"), "pos_embed": take("pos_embed"),
            **_linear(take, "patch_embed", "patch_embed.proj")}
    for norm in ("norm", "fc_norm", "head"):
        if f"{norm}.weight" in state:
            ours.update(_linear(take, norm, norm))
    for i in range(config.num_layers):
        b = f"blocks.{i}"
        if f"{b}.attn.qkv.weight" in state:
            ours[f"{b}.attn.qkv.weight"] = take(f"{b}.attn.qkv.weight")
            q_bias, v_bias = take.get(f"{b}.attn.q_bias"), take.get(f"{b}.attn.v_bias")
        else:
            ours[f"{b}.attn.qkv.weight"] = torch.cat([take(f"{b}.attn.{n}_proj.weight") for n in "qkv"])
            q_bias, v_bias = take.get(f"{b}.attn.q_proj.bias"), take.get(f"{b}.attn.v_proj.bias")
        if config.qkv_bias:
            ours[f"{b}.attn.qkv.bias"] = torch.cat([q_bias, torch.zeros_like(q_bias), v_bias])
        ours.update(_linear(take, f"{b}.attn.proj", f"{b}.attn.proj"))
        for piece in ("norm1", "norm2", "mlp.fc2"):
            ours.update(_linear(take, f"{b}.{piece}", f"{b}.{piece}"))
        if config.layer_scale is not None:
            ours[f"{b}.ls1"], ours[f"{b}.ls2"] = take(f"{b}.gamma_1"), take(f"{b}.gamma_2")
        if f"{b}.mlp.fc1_g.weight" in state:
            ours.update(_linear(take, f"{b}.mlp.fc1_g", f"{b}.mlp.fc1_g"))
            ours.update(_linear(take, f"{b}.mlp.fc1", f"{b}.mlp.fc1_x"))
        else:  # timm's GluMlp packs the gate's rows first, then the value's
            weight, bias = take(f"{b}.mlp.fc1.weight"), take(f"{b}.mlp.fc1.bias")
            h = config.mlp_size
            ours.update({f"{b}.mlp.fc1_g.weight": weight[:h], f"{b}.mlp.fc1_g.bias": bias[:h],
                         f"{b}.mlp.fc1.weight": weight[h:], f"{b}.mlp.fc1.bias": bias[h:]})
        if config.mlp_norm:
            ours.update(_linear(take, f"{b}.mlp.norm", f"{b}.mlp.norm"))
    take.check_all_used()
    return ours
