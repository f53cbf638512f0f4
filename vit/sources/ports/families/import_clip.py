"""CLIP image towers in our ``ViT``: open_clip state dicts (``visual.*``, OpenAI's layout too) and HF
``CLIPVisionModel`` / ``CLIPVisionModelWithProjection`` / ``CLIPModel`` folders, without importing their libraries.

CLIP's tower is a ViT with a bias-free patch convolution, a CLS token and a learned table,
a LayerNorm before the first block (``ln_pre`` / HF's ``pre_layrnorm``: our ``pre_norm``),
QuickGELU in OpenAI's weights and exact GELU in most open_clip ones, a final norm
(``ln_post`` / ``post_layernorm``) on the pooled token and a bias-free projection to the
joint image-text embedding (``proj`` / ``visual_projection``: our ``projection``). Our
``ViT.encode(images).embedding`` is open_clip's ``encode_image`` and HF's ``image_embeds``
(unnormalised). The text tower's weights are recognised by name and left for the text
side (``vit.sources.ports.families.import_clip`` reads only the image tower).

A state dict cannot tell QuickGELU from GELU: the activation comes from ``open_clip_config.json``
(``model_cfg.quick_gelu``, false when absent, as open_clip builds it) beside the weights, or from
``--arch open_clip:quickgelu`` / ``open_clip:gelu`` (OpenAI's released weights are QuickGELU).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from vit.model import ViTConfig
from vit.sources.ports.families.import_dinov3 import _linear, _Taker, activation, joined

SUPPORTED = ("CLIP: open_clip state dicts (visual.*, OpenAI layout) with open_clip_config.json or "
             "--arch open_clip:quickgelu|gelu, HF CLIPVisionModel / CLIPVisionModelWithProjection / CLIPModel folders")
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
# Keys of a CLIP checkpoint's text side (open_clip's old flat layout and its ``text.`` one), read by the text tower.
TEXT_PREFIXES = ("token_embedding.", "positional_embedding", "transformer.", "ln_final.", "text_projection",
                 "logit_scale", "logit_bias", "text.", "attn_mask",
                 "input_resolution", "context_length", "vocab_size")  # the last three: OpenAI's metadata

# open_clip's CLIPVisionCfg: honoured, without effect on an eval forward, or fixed at the value our model has.
VISION_HONOURED = {"layers", "width", "head_width", "mlp_ratio", "patch_size", "image_size", "ls_init_value",
                   "no_ln_pre", "pool_type", "final_ln_after_pool", "pos_embed_type"}
VISION_INERT = {"patch_dropout", "output_tokens", "attn_pooler_queries", "attn_pooler_heads", "timm_model_pretrained",
                "timm_pool", "timm_proj", "timm_proj_bias", "timm_drop", "timm_drop_path"}
VISION_FIXED = {"attentional_pool": False, "act_kwargs": None, "norm_kwargs": None, "qk_norm": False,
                "scaled_cosine_attn": False, "scale_heads": False, "scale_attn_inner": False, "scale_attn": False,
                "scale_fc": False, "timm_model_name": None, "block_type": None}
# HF CLIPVisionConfig fields.
HF_HONOURED = {"hidden_size", "intermediate_size", "projection_dim", "num_hidden_layers", "num_attention_heads",
               "num_channels", "image_size", "patch_size", "hidden_act", "layer_norm_eps", "attention_dropout"}
HF_INERT = {"initializer_range", "initializer_factor", "dropout"}


def is_open_clip_state_dict(state: Mapping[str, torch.Tensor]) -> bool:
    """open_clip's (and OpenAI's) image tower keys."""
    return "visual.conv1.weight" in state and "visual.class_embedding" in state


def _one(value, name: str) -> int:
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(f"CLIP {name} {value!r} is not square; this model needs square images and patches")
        value = value[0]
    return int(value)


def config_from_open_clip(state: Mapping[str, torch.Tensor], model_cfg: Mapping | None,
                          quick_gelu: bool | None) -> ViTConfig:
    """Our config for open_clip weights; ``model_cfg`` is ``open_clip_config.json``'s ``model_cfg`` (or None), and
    ``quick_gelu`` the activation when no config says it (None: refuse, a state dict cannot tell)."""
    cfg = dict(model_cfg or {})
    vision = dict(cfg.get("vision_cfg") or {})
    for key, value in vision.items():
        if key in VISION_FIXED:
            if value not in (VISION_FIXED[key], None) and not (key == "block_type" and value == "default"):
                raise ValueError(f"open_clip vision_cfg.{key}={value!r} is not supported")
        elif key not in VISION_HONOURED | VISION_INERT:
            raise ValueError(f"open_clip vision_cfg.{key} is not supported by this program's CLIP")
    if model_cfg is not None and quick_gelu is None:
        quick_gelu = bool(cfg.get("quick_gelu", False))  # what open_clip builds from this config
    if quick_gelu is None:
        raise ValueError("an open_clip state dict does not say its activation; put its open_clip_config.json beside "
                         "it, or pass --arch open_clip:quickgelu (OpenAI's weights) or open_clip:gelu")
    if "visual.trunk.patch_embed.proj.weight" in state or "visual.attn_pool.attn.in_proj_weight" in state:
        raise ValueError("open_clip towers built on timm or with an attentional pooler are not supported")
    width, channels, patch, patch_w = state["visual.conv1.weight"].shape
    if patch != patch_w:
        raise ValueError(f"open_clip weights have non-square {patch}x{patch_w} patches")
    positions = state["visual.positional_embedding"].shape[0] - 1
    size = vision.get("image_size")
    if isinstance(size, (list, tuple)) and len(size) == 2 and size[0] != size[1]:
        # open_clip builds a rectangle's table for image_size's (height // patch, width // patch) grid
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 and v % patch == 0 for v in size):
            raise ValueError(f"open_clip vision_cfg.image_size {size!r} is not a (height, width) pair of whole "
                             f"{patch}-px patches")
        grid = (size[0] // patch, size[1] // patch)
        if grid[0] * grid[1] != positions:
            raise ValueError(f"open_clip position table of {positions + 1} entries is not 1 + the {grid[0]}x{grid[1]} "
                             f"patch grid of its image_size {size[0]}x{size[1]} (height x width)")
    else:
        side = math.isqrt(positions)
        if side * side != positions:
            raise ValueError(f"open_clip position table of {positions + 1} entries is not 1 + a square grid; for a "
                             "rectangular input its open_clip_config.json must give vision_cfg.image_size as "
                             "[height, width]")
        grid = (side, side)
    depth = 1 + max(int(k.split(".")[3]) for k in state if k.startswith("visual.transformer.resblocks."))
    head_width = int(vision.get("head_width", 64))
    if width % head_width:
        raise ValueError(f"open_clip width {width} is not a multiple of head_width {head_width}")
    pool = vision.get("pool_type", "tok")
    if pool not in ("tok", "avg"):
        raise ValueError(f"open_clip pool_type {pool!r} is not supported; supported: tok, avg")
    after_pool = bool(vision.get("final_ln_after_pool", False)) and pool == "avg"  # per-token LN: the same for tok
    proj = state.get("visual.proj")
    return ViTConfig(
        image_size=grid[0] * patch if grid[0] == grid[1] else (grid[0] * patch, grid[1] * patch), patch_size=patch,
        num_channels=channels, num_classes=0, hidden_size=width,
        num_layers=depth, num_heads=width // head_width,
        mlp_size=state["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0], layer_norm_eps=1e-5,
        layer_scale=float(vision.get("ls_init_value") or 1.0)
        if "visual.transformer.resblocks.0.ls_1.gamma" in state else None,
        pooling="avg" if pool == "avg" else "cls", fc_norm=after_pool,
        pre_norm="visual.ln_pre.weight" in state, activation="quick_gelu" if quick_gelu else "gelu",
        projection_dim=proj.shape[1] if proj is not None else 0)


def state_dict_from_open_clip(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from open_clip's image tower; the text tower's keys are left out by name."""
    take = _Taker(state, "open_clip state dict")
    take.skip(*(k for k in state if k.startswith(TEXT_PREFIXES)))
    d = config.hidden_size
    conv = take("visual.conv1.weight")
    ours = {"patch_embed.weight": conv, "patch_embed.bias": torch.zeros(d, dtype=conv.dtype, device=conv.device),
            "cls_token": take("visual.class_embedding").reshape(1, 1, d),
            "pos_embed": take("visual.positional_embedding").unsqueeze(0)}
    norm = "fc_norm" if config.fc_norm else "norm"
    ours.update(_linear(take, norm, "visual.ln_post"))
    if config.pre_norm:
        ours.update(_linear(take, "norm_pre", "visual.ln_pre"))
    if config.projection_dim:
        ours["projection.weight"] = take("visual.proj").t()  # open_clip computes pooled @ proj
    for i in range(config.num_layers):
        theirs, b = f"visual.transformer.resblocks.{i}", f"blocks.{i}"
        ours[f"{b}.attn.qkv.weight"] = take(f"{theirs}.attn.in_proj_weight")
        ours[f"{b}.attn.qkv.bias"] = take(f"{theirs}.attn.in_proj_bias")
        for mine, name in (("attn.proj", "attn.out_proj"), ("norm1", "ln_1"), ("norm2", "ln_2"),
                           ("mlp.fc1", "mlp.c_fc"), ("mlp.fc2", "mlp.c_proj")):
            ours.update(_linear(take, f"{b}.{mine}", f"{theirs}.{name}"))
        if config.layer_scale is not None:
            ours[f"{b}.ls1"], ours[f"{b}.ls2"] = take(f"{theirs}.ls_1.gamma"), take(f"{theirs}.ls_2.gamma")
    take.check_all_used()
    return ours


# -- Hugging Face -----------------------------------------------------------------------------------------------------

def vision_config(config_json: Mapping) -> tuple[dict, int]:
    """The vision part of a CLIP / SigLIP config.json (nested in the dual models) and the projection size."""
    if isinstance(config_json.get("vision_config"), Mapping):
        return dict(config_json["vision_config"]), int(config_json.get("projection_dim") or 0)
    return dict(config_json), int(config_json.get("projection_dim") or 0)


def config_from_hf(config_json: Mapping) -> ViTConfig:
    """Our config for an HF CLIP config.json (``clip``, MetaCLIP 2's ``metaclip_2`` or ``clip_vision_model``); the
    projection size counts only for the architectures that have one (``projection`` below)."""
    vision, projection = vision_config(config_json)
    architectures = config_json.get("architectures") or []
    with_projection = config_json.get("model_type") in ("clip", "metaclip_2") \
        or "CLIPVisionModelWithProjection" in architectures
    patch = _one(vision.get("patch_size", 32), "patch_size")
    return ViTConfig(
        image_size=_one(vision.get("image_size", 224), "image_size"), patch_size=patch,
        num_channels=vision.get("num_channels", 3), num_classes=0, hidden_size=vision.get("hidden_size", 768),
        num_layers=vision.get("num_hidden_layers", 12), num_heads=vision.get("num_attention_heads", 12),
        mlp_size=vision.get("intermediate_size", 3072), attention_dropout=float(vision.get("attention_dropout", 0.0)),
        layer_norm_eps=vision.get("layer_norm_eps", 1e-5), pre_norm=True,
        activation=activation(vision.get("hidden_act", "quick_gelu")),
        projection_dim=(projection or 512) if with_projection else 0)


def _vision_prefix(state: Mapping[str, torch.Tensor], probe: str) -> str:
    for prefix in ("vision_model.", ""):
        if f"{prefix}{probe}" in state:
            return prefix
    raise ValueError(f"HF state dict has no '{probe}'; is it an image tower?")


def state_dict_from_hf(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from an HF CLIP one (vision tower and ``visual_projection``; the text side is left out)."""
    take = _Taker(state, "HF CLIP state dict")
    take.skip(*(k for k in state if k.startswith(("text_model.", "text_projection.", "logit_scale"))))
    base = _vision_prefix(state, "embeddings.class_embedding")
    d, emb = config.hidden_size, f"{base}embeddings"
    conv = take(f"{emb}.patch_embedding.weight")
    ours = {"patch_embed.weight": conv, "patch_embed.bias": torch.zeros(d, dtype=conv.dtype, device=conv.device),
            "cls_token": take(f"{emb}.class_embedding").reshape(1, 1, d),
            "pos_embed": take(f"{emb}.position_embedding.weight").unsqueeze(0),
            **_linear(take, "norm_pre", f"{base}pre_layrnorm")}
    if config.final_norm:  # a VLM's tower read at an inner layer (LLaVA's) has none
        ours.update(_linear(take, "norm", f"{base}post_layernorm"))
    take.skip(f"{emb}.position_ids")  # a buffer older transformers saved: arange(positions)
    if config.projection_dim:
        ours["projection.weight"] = take("visual_projection.weight")
    for i in range(config.num_layers):
        layer, b = f"{base}encoder.layers.{i}", f"blocks.{i}"
        ours[f"{b}.attn.qkv.weight"] = joined([take(f"{layer}.self_attn.{n}_proj.weight") for n in "qkv"])
        ours[f"{b}.attn.qkv.bias"] = joined([take(f"{layer}.self_attn.{n}_proj.bias") for n in "qkv"])
        for mine, name in (("attn.proj", "self_attn.out_proj"), ("norm1", "layer_norm1"), ("norm2", "layer_norm2"),
                           ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")):
            ours.update(_linear(take, f"{b}.{mine}", f"{layer}.{name}"))
    take.check_all_used()
    return ours
