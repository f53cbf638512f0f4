"""torchvision ``VisionTransformer`` weights (``vit_b_16`` ... ``vit_h_14``) in our ``ViT``.

torchvision's blocks are ours under other names: ``ln_1`` / ``ln_2``, an ``nn.MultiheadAttention``
whose ``in_proj_weight`` already stacks q, k and v as our ``qkv`` does, and an MLP at
``mlp.0`` / ``mlp.3`` (``mlp.linear_1`` / ``linear_2`` in files from torchvision < 0.13). The
architecture is recognised from the weights (width, depth, patch) or given by name; its
evaluation transform and ImageNet class names come from torchvision's own weights metadata,
which ships in the package. torchvision's model only runs at its native size, so no
resampling reference exists; ours interpolates positions as HF does when asked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from vit.checkpoint import Preprocessing
from vit.model import ViTConfig

# name -> (patch, width, depth, heads, mlp), as torchvision/models/vision_transformer.py builds them.
ARCHITECTURES = {
    "vit_b_16": (16, 768, 12, 12, 3072),
    "vit_b_32": (32, 768, 12, 12, 3072),
    "vit_l_16": (16, 1024, 24, 16, 4096),
    "vit_l_32": (32, 1024, 24, 16, 4096),
    "vit_h_14": (14, 1280, 32, 16, 5120),
}
SUPPORTED = "torchvision " + ", ".join(ARCHITECTURES)
_LAYER = re.compile(r"^encoder\.layers\.encoder_layer_(\d+)\.(.+)$")
_PARTS = {"ln_1": "norm1", "ln_2": "norm2", "self_attention.in_proj": "attn.qkv",
          "self_attention.out_proj": "attn.proj",
          "mlp.0": "mlp.fc1", "mlp.3": "mlp.fc2", "mlp.linear_1": "mlp.fc1", "mlp.linear_2": "mlp.fc2"}


def is_torchvision_state_dict(state: Mapping[str, torch.Tensor]) -> bool:
    """Whether these keys look like a torchvision ``VisionTransformer``'s."""
    return "conv_proj.weight" in state and "encoder.pos_embedding" in state


def architecture_of(state: Mapping[str, torch.Tensor]) -> str:
    """The torchvision name whose patch, width and depth these weights have; ValueError when none does."""
    patch, width = state["conv_proj.weight"].shape[-1], state["conv_proj.weight"].shape[0]
    depth = 1 + max((int(m.group(1)) for k in state if (m := _LAYER.match(k))), default=-1)
    for name, (p, w, d, _, _) in ARCHITECTURES.items():
        if (p, w, d) == (patch, width, depth):
            return name
    raise ValueError(f"torchvision weights with {patch}-px patches, width {width} and {depth} layers are none of: "
                     f"{', '.join(ARCHITECTURES)}")


def config_from_torchvision(name: str, state: Mapping[str, torch.Tensor]) -> ViTConfig:
    """Our config for torchvision architecture ``name``; the image size is read from the position table."""
    if name not in ARCHITECTURES:
        raise ValueError(f"torchvision architecture {name!r} is not supported; supported: {SUPPORTED}")
    if any(k.startswith("heads.pre_logits") for k in state):
        raise ValueError(f"torchvision {name} with a pre-logits layer (representation_size) is not supported")
    patch, width, depth, heads, mlp = ARCHITECTURES[name]
    positions = state["encoder.pos_embedding"].shape[1] - 1
    side = int(round(positions ** 0.5))
    if side * side != positions:
        raise ValueError(f"torchvision weights have {positions} patch positions, not a square grid")
    return ViTConfig(image_size=side * patch, patch_size=patch, num_channels=3,
                     num_classes=state["heads.head.weight"].shape[0] if "heads.head.weight" in state else 0,
                     hidden_size=width, num_layers=depth, num_heads=heads, mlp_size=mlp, qkv_bias=True,
                     layer_norm_eps=1e-6)


def state_dict_from_torchvision(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our key names for torchvision's; a key with no counterpart raises ValueError."""
    top = {"class_token": "cls_token", "conv_proj.weight": "patch_embed.weight", "conv_proj.bias": "patch_embed.bias",
           "encoder.pos_embedding": "pos_embed", "encoder.ln.weight": "norm.weight", "encoder.ln.bias": "norm.bias",
           "heads.head.weight": "head.weight", "heads.head.bias": "head.bias"}
    ours = {}
    for key, value in state.items():
        if key in top:
            ours[top[key]] = value
            continue
        match = _LAYER.match(key)
        if match:
            part, _, kind = match.group(2).rpartition(".")
            kind = {"in_proj_weight": "weight", "in_proj_bias": "bias"}.get(kind, kind)
            if match.group(2) in ("self_attention.in_proj_weight", "self_attention.in_proj_bias"):
                part = "self_attention.in_proj"
            if part in _PARTS and kind in ("weight", "bias"):
                ours[f"blocks.{match.group(1)}.{_PARTS[part]}.{kind}"] = value
                continue
        raise ValueError(f"torchvision state dict has a key this model has no place for: {key}")
    return ours


def _weights_enum(name: str):
    from torchvision import models  # torchvision is a dependency of training already

    return getattr(models, f"ViT_{name[4:].upper()}_Weights")


def preprocessing_from_torchvision(name: str, config: ViTConfig) -> Preprocessing:
    """torchvision's ``weights.transforms()`` for the weights of this size (e.g. IMAGENET1K_V1: resize the
    shorter side to 256 bilinearly, crop 224), else its default weights' statistics at the model's size."""
    weights = list(_weights_enum(name))
    fitting = [w for w in weights if w.transforms().crop_size[0] == config.image_size] or weights[:1]
    transform = fitting[0].transforms()
    crop, resize = transform.crop_size[0], transform.resize_size[0]
    if crop != config.image_size:
        crop, resize = config.image_size, config.image_size
    return Preprocessing(crop, 3, tuple(transform.mean), tuple(transform.std), resize_size=resize,
                         resize_mode="shortest_edge", resample=transform.interpolation.value)


def imagenet_class_names() -> list[str]:
    """The 1000 ImageNet class names as torchvision's weights metadata lists them (shipped in the package)."""
    return list(_weights_enum("vit_b_16").IMAGENET1K_V1.meta["categories"])
