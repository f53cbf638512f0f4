"""SigLIP and SigLIP 2 (fixed resolution) image towers in our ``ViT``: HF ``SiglipVisionModel`` / ``SiglipModel``
folders, without importing transformers. (timm's ``vit_*_siglip_*`` are read by ``vit.import_timm``.)

SigLIP has no class token: after the final norm (``post_layernorm``) a multi-head attention
pooling head (``head``: a learned ``probe`` attends to every patch through an
``nn.MultiheadAttention``, then ``x + mlp(layernorm(x))``) gives the embedding. It is our
``pooling="map"`` with ``AttentionPool``, whose attention over the patches is the model's
"what it reads" map. The MLPs use tanh-approximated GELU (``gelu_pytorch_tanh``). SigLIP 2's
fixed-resolution checkpoints are ``SiglipModel`` folders; its NaFlex variable-resolution
``Siglip2Model`` is refused with one line.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from vit.model import ViTConfig
from vit.sources.import_clip import _one, _vision_prefix, vision_config
from vit.sources.import_dinov3 import _linear, _Taker, activation

SUPPORTED = "SigLIP / SigLIP 2 (fixed resolution): HF SiglipVisionModel / SiglipModel folders"
HF_HONOURED = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_channels",
               "image_size", "patch_size", "hidden_act", "layer_norm_eps", "attention_dropout", "vision_use_head"}
HF_INERT = {"initializer_range", "initializer_factor"}


def config_from_hf(config_json: Mapping) -> ViTConfig:
    """Our config for an HF SigLIP config.json (``siglip`` or ``siglip_vision_model``)."""
    vision, _ = vision_config(config_json)
    if vision.get("vision_use_head", True) is False:
        raise ValueError("a SigLIP tower without its attention-pooling head has no pooled output to explain")
    return ViTConfig(
        image_size=_one(vision.get("image_size", 224), "image_size"),
        patch_size=_one(vision.get("patch_size", 16), "patch_size"), num_channels=vision.get("num_channels", 3),
        num_classes=0, hidden_size=vision.get("hidden_size", 768), num_layers=vision.get("num_hidden_layers", 12),
        num_heads=vision.get("num_attention_heads", 12), mlp_size=vision.get("intermediate_size", 3072),
        attention_dropout=float(vision.get("attention_dropout", 0.0)),
        layer_norm_eps=vision.get("layer_norm_eps", 1e-6), class_token=False, pooling="map", prefix_positions="all",
        activation=activation(vision.get("hidden_act", "gelu_pytorch_tanh")))


def state_dict_from_hf(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from an HF SigLIP one (the vision tower; the text side is left out by name)."""
    take = _Taker(state, "HF SigLIP state dict")
    take.skip(*(k for k in state if k.startswith(("text_model.", "logit_scale", "logit_bias"))))
    base = _vision_prefix(state, "embeddings.patch_embedding.weight")
    emb, d = f"{base}embeddings", config.hidden_size
    ours = {**_linear(take, "patch_embed", f"{emb}.patch_embedding"),
            "pos_embed": take(f"{emb}.position_embedding.weight").unsqueeze(0),
            **_linear(take, "norm", f"{base}post_layernorm")}
    take.skip(f"{emb}.position_ids")
    head = f"{base}head"
    in_proj, in_bias = take(f"{head}.attention.in_proj_weight"), take(f"{head}.attention.in_proj_bias")
    ours.update({"attn_pool.latent": take(f"{head}.probe"),
                 "attn_pool.q.weight": in_proj[:d], "attn_pool.q.bias": in_bias[:d],
                 "attn_pool.kv.weight": in_proj[d:], "attn_pool.kv.bias": in_bias[d:],
                 **_linear(take, "attn_pool.proj", f"{head}.attention.out_proj"),
                 **_linear(take, "attn_pool.norm", f"{head}.layernorm"),
                 **_linear(take, "attn_pool.mlp.fc1", f"{head}.mlp.fc1"),
                 **_linear(take, "attn_pool.mlp.fc2", f"{head}.mlp.fc2")})
    for i in range(config.num_layers):
        layer, b = f"{base}encoder.layers.{i}", f"blocks.{i}"
        ours[f"{b}.attn.qkv.weight"] = torch.cat([take(f"{layer}.self_attn.{n}_proj.weight") for n in "qkv"])
        ours[f"{b}.attn.qkv.bias"] = torch.cat([take(f"{layer}.self_attn.{n}_proj.bias") for n in "qkv"])
        for mine, name in (("attn.proj", "self_attn.out_proj"), ("norm1", "layer_norm1"), ("norm2", "layer_norm2"),
                           ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")):
            ours.update(_linear(take, f"{b}.{mine}", f"{layer}.{name}"))
    take.check_all_used()
    return ours
