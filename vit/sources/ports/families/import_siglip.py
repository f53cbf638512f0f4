"""SigLIP and SigLIP 2 image towers in our ``ViT``: HF ``SiglipVisionModel`` / ``SiglipModel`` folders (SigLIP 2's
fixed-resolution ones too) and SigLIP 2 NaFlex's ``Siglip2VisionModel`` / ``Siglip2Model``, without importing
transformers. (timm's ``vit_*_siglip_*`` are read by ``vit.import_timm``.)

SigLIP has no class token: after the final norm (``post_layernorm``) a multi-head attention
pooling head (``head``: a learned ``probe`` attends to every patch through an
``nn.MultiheadAttention``, then ``x + mlp(layernorm(x))``) gives the embedding. It is our
``pooling="map"`` with ``AttentionPool``, whose attention over the patches is the model's
"what it reads" map. The MLPs use tanh-approximated GELU (``gelu_pytorch_tanh``).

NaFlex (``siglip2``): each image keeps its aspect ratio on a grid of at most ``max_num_patches`` patches
(``vit.core.images.naflex_size``, the processor's rule); its patches go through a linear layer (a convolution of stride
the patch, here: the weight's ``(py, px, c)`` columns become a ``(c, py, px)`` kernel) and the square learned table
is resized bilinearly with antialias to the image's grid (``pos_resize="bilinear"``). HF pads every image's tokens
to ``max_num_patches`` and masks the padding; one image here runs on its real tokens alone, which is the same
computation, and mixed batches go through ``ViT.encode_padded`` (the same mask).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from vit.model import ViTConfig
from vit.sources.ports.families.import_clip import _one, _vision_prefix, vision_config
from vit.sources.ports.families.import_dinov3 import _linear, _Taker, activation, joined

SUPPORTED = ("SigLIP / SigLIP 2 (fixed resolution): HF SiglipVisionModel / SiglipModel folders; SigLIP 2 NaFlex: HF "
             "Siglip2VisionModel / Siglip2Model folders")
NAFLEX_TYPES = ("siglip2", "siglip2_vision_model")
HF_HONOURED = {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_channels",
               "image_size", "patch_size", "hidden_act", "layer_norm_eps", "attention_dropout", "vision_use_head"}
HF_INERT = {"initializer_range", "initializer_factor"}


def whole_patches_side(side: int, patch: int) -> int:
    """The input side a SigLIP tower's patches cover: ``side`` less the pixels past its last whole patch. Its patch
    embedding convolves with stride = kernel = ``patch`` and no padding, so those pixels are never read, and its
    position table holds ``(side // patch) ** 2`` entries (so400m at 384 px in 14-px patches: 27 x 27 patches over
    378 px); the input is then the processor's resize cropped at the top left (``hf_preprocessing.whole_patches``)."""
    if patch < 1 or side < patch:
        raise ValueError(f"SigLIP image_size {side} holds no whole patch of {patch} px")
    return side - side % patch


def config_from_hf(config_json: Mapping) -> ViTConfig:
    """Our config for an HF SigLIP config.json (``siglip`` or ``siglip_vision_model``), or SigLIP 2 NaFlex's
    (``siglip2`` / ``siglip2_vision_model``: its square table of ``num_patches`` entries is the training grid)."""
    vision, _ = vision_config(config_json)
    if vision.get("vision_use_head", True) is False:
        raise ValueError("a SigLIP tower without its attention-pooling head has no pooled output to explain")
    patch = _one(vision.get("patch_size", 16), "patch_size")
    naflex = {}
    if config_json.get("model_type") in NAFLEX_TYPES:
        patches = vision.get("num_patches", 256)
        side = math.isqrt(patches) if isinstance(patches, int) and not isinstance(patches, bool) and patches > 0 else 0
        if side * side != patches:
            raise ValueError(f"SigLIP 2 num_patches {str(patches)[:20]} is not a square number of table entries")
        naflex = dict(image_size=side * patch, max_num_patches=patches, pos_resize="bilinear",
                      pos_embed_antialias=True)
    side = naflex.pop("image_size", None) or whole_patches_side(_one(vision.get("image_size", 224), "image_size"),
                                                                  patch)
    return ViTConfig(
        image_size=side,
        patch_size=patch, num_channels=vision.get("num_channels", 3),
        num_classes=0, hidden_size=vision.get("hidden_size", 768), num_layers=vision.get("num_hidden_layers", 12),
        num_heads=vision.get("num_attention_heads", 12), mlp_size=vision.get("intermediate_size", 3072),
        attention_dropout=float(vision.get("attention_dropout", 0.0)),
        layer_norm_eps=vision.get("layer_norm_eps", 1e-6), class_token=False, pooling="map", prefix_positions="all",
        activation=activation(vision.get("hidden_act", "gelu_pytorch_tanh")), **naflex)


def state_dict_from_hf(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from an HF SigLIP one (the vision tower; the text side is left out by name)."""
    take = _Taker(state, "HF SigLIP state dict")
    take.skip(*(k for k in state if k.startswith(("text_model.", "logit_scale", "logit_bias"))))
    base = _vision_prefix(state, "embeddings.patch_embedding.weight")
    emb, d = f"{base}embeddings", config.hidden_size
    patch = _linear(take, "patch_embed", f"{emb}.patch_embedding")
    if patch["patch_embed.weight"].dim() == 2:  # NaFlex's linear layer on (py, px, c)-flattened patches
        p = config.patch_hw[0]
        patch["patch_embed.weight"] = patch["patch_embed.weight"].reshape(d, p, p, -1).permute(0, 3, 1, 2)
    ours = {**patch, "pos_embed": take(f"{emb}.position_embedding.weight").unsqueeze(0)}
    if config.final_norm:  # a VLM's tower read before post_layernorm (LLaVA-OneVision's) has none
        ours.update(_linear(take, "norm", f"{base}post_layernorm"))
    take.skip(f"{emb}.position_ids")
    head = f"{base}head"
    if config.pooling == "map":  # the VLMs' towers are read without it (vision_use_head false)
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
        ours[f"{b}.attn.qkv.weight"] = joined([take(f"{layer}.self_attn.{n}_proj.weight") for n in "qkv"])
        ours[f"{b}.attn.qkv.bias"] = joined([take(f"{layer}.self_attn.{n}_proj.bias") for n in "qkv"])
        for mine, name in (("attn.proj", "self_attn.out_proj"), ("norm1", "layer_norm1"), ("norm2", "layer_norm2"),
                           ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")):
            ours.update(_linear(take, f"{b}.{mine}", f"{layer}.{name}"))
    take.check_all_used()
    return ours
