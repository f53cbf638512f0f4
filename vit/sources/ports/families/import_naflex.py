"""timm's NaFlex ViTs (``naflexvit_*``, ``timm/models/naflexvit.py``) in our ``ViT``, without importing timm.

A NaFlex ViT is a plain pre-norm ViT whose patches go through a linear layer (``embeds.proj``: columns in
``(py, px, c)`` order, here a convolution kernel ``(c, py, px)``), whose learned table ``embeds.pos_embed`` is a
``(1, gh, gw, D)`` grid resized to each image's grid (bicubic with antialias; bilinear for ``*_siglip``) and added
to the patches only (registers and CLS get none: ``prefix_positions="none"``), with layer scale and either average
pooling with ``fc_norm`` (``*_gap``) or a MAP head (``*_map``, ``*_siglip``); the MAP probe of a model with a CLS or
registers (``naflexvit_base_patch16_map``, ``*_reg1_map``) skips them unless ``pool_include_prefix``
(``ViTConfig.pool_prefix``). Each image keeps its aspect ratio on a grid of at most as many patches as the table has
(``vit.core.images.naflex_size``).

Refused in one line: the aspect-preserving (``*_par_*``) and factorized (``*_parfac_*``) position tables, which
resize a square and crop it, or keep one table per axis: ops this engine does not have.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from vit.model import ViTConfig
from vit.sources.ports.families.import_dinov3 import _linear, _Taker
from vit.sources.ports.families.import_pe import timm_probe

SUPPORTED = "timm naflexvit_* (a learned grid table; gap or map pooling: *_gap, *_map, *_reg1_map, *_siglip)"
HEADS_BY_WIDTH = {768: 12, 832: 13}  # naflexvit_base_*, naflexvit_so150m2_*
TIMM_ARGS_HONOURED = {"patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads", "mlp_ratio",
                      "global_pool", "reg_tokens", "class_token", "qkv_bias", "init_values", "fc_norm",
                      "pool_include_prefix"}
TIMM_ARGS_INERT = {"drop_rate", "pos_drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate",
                   "weight_init", "fix_init", "device", "dtype", "img_size", "pos_embed_grid_size"}  # the table says


def is_naflex_name(name: str) -> bool:
    return name.startswith("naflexvit_")


def config_from_timm(name: str, state: Mapping[str, torch.Tensor], model_args: Mapping | None = None) -> ViTConfig:
    """Our config for timm ``naflexvit_*`` weights; ``model_args`` are timm's overrides from its config.json."""
    if "_par_" in name or "_parfac_" in name or "embeds.pos_embed_y" in state:
        raise ValueError(f"timm {name}: its aspect-preserving or factorized position table is not supported (only "
                         "naflexvit_* with a learned grid table: *_gap, *_map, *_siglip)")
    args = dict(model_args or {})
    for key in args:
        if key not in TIMM_ARGS_HONOURED | TIMM_ARGS_INERT:
            raise ValueError(f"timm model_args.{key} of {name} is not supported by this program's NaFlex ViT")
    if "embeds.pos_embed" not in state or state["embeds.pos_embed"].dim() != 4:
        raise ValueError(f"timm {name}: no learned (1, gh, gw, D) position table embeds.pos_embed")
    width, patch_dim = state["embeds.proj.weight"].shape
    patch = int(args.get("patch_size") or int(re.search(r"patch(\d+)", name).group(1)))
    channels = patch_dim // (patch * patch)
    if channels * patch * patch != patch_dim:
        raise ValueError(f"timm {name}: a {patch_dim}-wide patch projection is no {patch}x{patch} patch")
    _, gh, gw, _ = state["embeds.pos_embed"].shape
    depth = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"^blocks\.(\d+)\.", k)))
    heads = args.get("num_heads") or HEADS_BY_WIDTH.get(width)
    if not heads:
        raise ValueError(f"timm {name}: the number of heads of a {width}-wide model is unknown; give num_heads in "
                         "config.json's model_args")
    registers = state["embeds.reg_token"].shape[1] if "embeds.reg_token" in state else 0
    pooled = "map" if "attn_pool.latent" in state else "avg"
    return ViTConfig(
        image_size=(gh * patch, gw * patch), patch_size=patch, num_channels=channels,
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0, hidden_size=width,
        num_layers=depth, num_heads=heads, mlp_size=state["blocks.0.mlp.fc1.weight"].shape[0],
        qkv_bias="blocks.0.attn.qkv.bias" in state, layer_norm_eps=1e-6, class_token="embeds.cls_token" in state,
        num_register_tokens=registers, layer_scale=1e-5 if "blocks.0.ls1.gamma" in state else None,
        pooling=pooled, fc_norm="fc_norm.weight" in state, prefix_positions="none",
        pool_prefix=bool(args.get("pool_include_prefix", False)),  # timm's default: the probe skips them
        pos_embed_antialias=True, pos_resize="bilinear" if "siglip" in name else "bicubic",
        activation="gelu_tanh" if "siglip" in name else "gelu", max_num_patches=gh * gw)


def state_dict_from_timm(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from timm's NaFlex ViT one; ValueError on any key it cannot place."""
    take = _Taker(state, "timm NaFlex ViT state dict")
    d, p = config.hidden_size, config.patch_hw[0]
    ours = {"patch_embed.weight": take("embeds.proj.weight").reshape(d, p, p, -1).permute(0, 3, 1, 2),
            "patch_embed.bias": take("embeds.proj.bias"), "pos_embed": take("embeds.pos_embed").flatten(1, 2)}
    for mine, theirs in (("cls_token", "embeds.cls_token"), ("reg_token", "embeds.reg_token")):
        if theirs in state:
            ours[mine] = take(theirs)
    for norm in ("norm", "fc_norm"):
        if f"{norm}.weight" in state:
            ours.update(_linear(take, norm, norm))
    if config.num_classes:
        ours.update(_linear(take, "head", "head"))
    if config.pooling == "map":
        ours.update(timm_probe(take))
    for i in range(config.num_layers):
        b = f"blocks.{i}"
        ours[f"{b}.attn.qkv.weight"] = take(f"{b}.attn.qkv.weight")
        if config.qkv_bias:
            ours[f"{b}.attn.qkv.bias"] = take(f"{b}.attn.qkv.bias")
        for part in ("attn.proj", "norm1", "norm2", "mlp.fc1", "mlp.fc2"):
            ours.update(_linear(take, f"{b}.{part}", f"{b}.{part}"))
        if config.layer_scale is not None:
            ours[f"{b}.ls1"], ours[f"{b}.ls2"] = take(f"{b}.ls1.gamma"), take(f"{b}.ls2.gamma")
    take.check_all_used()
    return ours
