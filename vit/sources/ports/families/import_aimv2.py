"""AIMv2 (Fini et al. 2025) image towers in our ``ViT``: HF ``Aimv2VisionModel`` / ``Aimv2Model`` folders and timm
``aimv2_*`` weights, without importing either library.

AIMv2 has no class token and no biases but the patch embedding's: RMSNorm everywhere (``ViTConfig.norm="rms"``),
one on the patch embeddings before the learned position table (``embed_norm``), a bias-free SwiGLU MLP and
attention (``gated_mlp``, ``qkv_bias=False``, ``proj_bias=False``), then a final RMSNorm. timm pools by the mean of
the tokens (``pooling="avg"``); HF's towers with ``use_head`` read them through ``Aimv2AttentionPoolingHead``, a
learned query (no q projection) over bias-free keys and values, then an output projection (``pooling="map"``,
``pool_head="aimv2"``), and ``Aimv2Model`` projects that to the joint embedding (``visual_projection``). The
native-resolution towers (``is_native``) have no table: 2D sine-cosine positions computed for each grid
(``sincos_pos``), so they take any size.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from vit.model import ViTConfig
from vit.sources.ports.families.import_clip import _one, _vision_prefix, vision_config
from vit.sources.ports.families.import_dinov3 import _Taker, activation, timm_shape

SUPPORTED = "AIMv2: HF Aimv2VisionModel / Aimv2Model folders (also native-resolution), timm aimv2_* weights"
HF_HONOURED = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_channels",
               "image_size", "patch_size", "hidden_act", "rms_norm_eps", "attention_dropout", "qkv_bias", "mlp_bias",
               "use_head", "is_native"}
HEADS_BY_WIDTH = {1024: 8, 1536: 12, 2048: 16, 3072: 24}  # timm's aimv2_large / huge / 1b / 3b
TIMM_ARGS_HONOURED = {"img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depth",
                      "num_heads", "mlp_ratio", "dynamic_img_size"}
TIMM_ARGS_INERT = {"drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate",
                   "drop_path_rate", "weight_init", "fix_init", "device", "dtype"}


def is_aimv2_name(name: str) -> bool:
    return name.startswith("aimv2_")


def _weights(take: _Taker, ours: str, theirs: str, bias: bool) -> dict[str, torch.Tensor]:
    """``ours.weight`` (and ``ours.bias`` when ours has one: a zero where theirs has none) from ``theirs``."""
    weight = take(f"{theirs}.weight")
    out = {f"{ours}.weight": weight}
    theirs_bias = take.get(f"{theirs}.bias")
    if bias:
        out[f"{ours}.bias"] = theirs_bias if theirs_bias is not None else torch.zeros_like(weight[:, 0])
    elif theirs_bias is not None:
        raise ValueError(f"{theirs} has a bias where this AIMv2 config has none")
    return out


# -- HF --------------------------------------------------------------------------------------------------------------

def config_from_hf(config_json: Mapping) -> ViTConfig:
    """Our config for an HF AIMv2 config.json (``aimv2`` or ``aimv2_vision_model``)."""
    vision, projection = vision_config(config_json)
    native = bool(vision.get("is_native", False))
    use_head = vision.get("use_head", True) is not False
    qkv_bias, mlp_bias = bool(vision.get("qkv_bias", False)), bool(vision.get("mlp_bias", False))
    return ViTConfig(
        image_size=_one(vision.get("image_size", 224), "image_size"),
        patch_size=_one(vision.get("patch_size", 14), "patch_size"), num_channels=vision.get("num_channels", 3),
        num_classes=0, hidden_size=vision.get("hidden_size", 1024), num_layers=vision.get("num_hidden_layers", 24),
        num_heads=vision.get("num_attention_heads", 8), mlp_size=vision.get("intermediate_size", 2816),
        attention_dropout=float(vision.get("attention_dropout", 0.0)),
        layer_norm_eps=vision.get("rms_norm_eps", 1e-5), class_token=False, pooling="map" if use_head else "avg",
        pool_head="aimv2", norm="rms", embed_norm=True, qkv_bias=qkv_bias, proj_bias=qkv_bias or mlp_bias,
        gated_mlp=True, activation=activation(vision.get("hidden_act", "silu")), pos_embed=not native,
        sincos_pos=native, projection_dim=projection if config_json.get("model_type") == "aimv2" else 0)


def state_dict_from_hf(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from an HF AIMv2 one (the vision tower and ``visual_projection``; the text side is left out)."""
    take = _Taker(state, "HF AIMv2 state dict")
    take.skip(*(k for k in state if k.startswith(("text_model.", "text_projection.", "logit_scale"))))
    base = _vision_prefix(state, "embeddings.patch_embed.weight")
    emb, bias = f"{base}embeddings", config.proj_bias
    ours = {"patch_embed.weight": take(f"{emb}.patch_embed.weight"),
            "patch_embed.bias": take(f"{emb}.patch_embed.bias"),
            "embed_norm.weight": take(f"{emb}.rms_norm.weight"),
            "norm.weight": take(f"{base}rms_norm.weight")}
    if config.pos_embed:
        ours["pos_embed"] = take(f"{emb}.position_embedding.weight").unsqueeze(0)
    take.skip(f"{emb}.position_ids")
    if config.pooling == "map":
        head = f"{base}head"
        k, v = take(f"{head}.k_proj.weight"), take(f"{head}.v_proj.weight")
        k_bias, v_bias = take.get(f"{head}.k_proj.bias"), take.get(f"{head}.v_proj.bias")
        zeros = torch.zeros_like(k[:, 0])
        ours.update({"attn_pool.latent": take(f"{head}.cls_token"), "attn_pool.kv.weight": torch.cat([k, v]),
                     "attn_pool.kv.bias": torch.cat([zeros if k_bias is None else k_bias,
                                                     zeros if v_bias is None else v_bias]),
                     **_weights(take, "attn_pool.proj", f"{head}.output_proj", True)})
    if config.projection_dim:
        ours["projection.weight"] = take("visual_projection.weight")
    for i in range(config.num_layers):
        layer, b = f"{base}encoder.layers.{i}", f"blocks.{i}"
        ours[f"{b}.attn.qkv.weight"] = torch.cat([take(f"{layer}.attention.{n}_proj.weight") for n in "qkv"])
        if config.qkv_bias:
            ours[f"{b}.attn.qkv.bias"] = torch.cat([take(f"{layer}.attention.{n}_proj.bias") for n in "qkv"])
        for mine, name in (("attn.proj", "attention.out_proj"), ("mlp.fc1_g", "ffn.gate_proj"),
                           ("mlp.fc1", "ffn.up_proj"), ("mlp.fc2", "ffn.down_proj")):
            ours.update(_weights(take, f"{b}.{mine}", f"{layer}.{name}", bias))
        ours[f"{b}.norm1.weight"] = take(f"{layer}.rms_norm1.weight")
        ours[f"{b}.norm2.weight"] = take(f"{layer}.rms_norm2.weight")
    take.check_all_used()
    return ours


# -- timm ------------------------------------------------------------------------------------------------------------

def config_from_timm(name: str, state: Mapping[str, torch.Tensor], model_args: Mapping | None = None) -> ViTConfig:
    """Our config for timm's ``aimv2_*`` weights; ``model_args`` are timm's overrides from its config.json."""
    args = dict(model_args or {})
    for key in args:
        if key not in TIMM_ARGS_HONOURED | TIMM_ARGS_INERT:
            raise ValueError(f"timm model_args.{key} of {name} is not supported by this program's AIMv2")
    if args.get("global_pool", "avg") != "avg":
        raise ValueError(f"timm global_pool {args['global_pool']!r} of {name} is not supported; AIMv2 pools by avg")
    if "cls_token" in state or "patch_embed.norm.weight" not in state or "pos_embed" not in state:
        raise ValueError(f"timm {name}: only AIMv2's layout (no class token, a normed patch embedding, a position "
                         "table) is supported")
    width, channels, patch, depth = timm_shape(name, state)
    heads = args.get("num_heads") or HEADS_BY_WIDTH.get(width)
    if not heads:
        raise ValueError(f"cannot tell the number of heads of {name} (width {width}); give model_args.num_heads")
    positions = state["pos_embed"].shape[1]
    grid = int(round(positions ** 0.5))
    if grid * grid != positions:
        raise ValueError(f"timm {name}: a position table of {positions} entries is not a square grid")
    return ViTConfig(
        image_size=grid * patch, patch_size=patch, num_channels=channels,
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0, hidden_size=width,
        num_layers=depth, num_heads=int(heads), mlp_size=state["blocks.0.mlp.fc1_x.weight"].shape[0],
        layer_norm_eps=1e-5, class_token=False, pooling="avg", pos_embed_antialias=True, norm="rms",
        embed_norm=True, qkv_bias="blocks.0.attn.qkv.bias" in state, proj_bias="blocks.0.attn.proj.bias" in state,
        gated_mlp=True, activation="silu")


def state_dict_from_timm(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from timm's AIMv2 one; ValueError on any key it cannot place."""
    take = _Taker(state, "timm AIMv2 state dict")
    ours = {"pos_embed": take("pos_embed"), "patch_embed.weight": take("patch_embed.proj.weight"),
            "patch_embed.bias": take("patch_embed.proj.bias"), "embed_norm.weight": take("patch_embed.norm.weight"),
            "norm.weight": take("norm.weight")}
    if config.num_classes:
        ours.update(_weights(take, "head", "head", True))
    for i in range(config.num_layers):
        b = f"blocks.{i}"
        ours[f"{b}.attn.qkv.weight"] = take(f"{b}.attn.qkv.weight")
        if config.qkv_bias:
            ours[f"{b}.attn.qkv.bias"] = take(f"{b}.attn.qkv.bias")
        for mine, theirs in (("attn.proj", "attn.proj"), ("mlp.fc1_g", "mlp.fc1_g"), ("mlp.fc1", "mlp.fc1_x"),
                             ("mlp.fc2", "mlp.fc2")):
            ours.update(_weights(take, f"{b}.{mine}", f"{b}.{theirs}", config.proj_bias))
        ours[f"{b}.norm1.weight"], ours[f"{b}.norm2.weight"] = take(f"{b}.norm1.weight"), take(f"{b}.norm2.weight")
    take.check_all_used()
    return ours
