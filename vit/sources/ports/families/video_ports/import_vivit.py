"""ViViT in our ``ViT``: HF ``vivit`` folders (``VivitModel``, ``VivitForVideoClassification``), without importing
transformers.

HF's ViViT is the spatio-temporal model of Arnab et al. 2021 (model 1, joint attention over every tubelet): a pre-norm
ViT on a clip ``(B, frames, C, H, W)`` whose Conv3d embeds each tubelet of ``tubelet_size[0]`` frames x one
``tubelet_size[1:]`` patch (``ViTConfig.tubelet_size`` and ``patch_size``), its tokens time-major, after a CLS token;
learned positions over the CLS and every tubelet; queries, keys and values with biases; FastGELU (the tanh
approximation of GELU, ``gelu_tanh``: the same function); LayerNorm eps 1e-6; a final norm; the classifier reads the
CLS token. ``VivitModel``'s pooler (a dense layer and tanh over the CLS) is left out.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from vit.model import ViTConfig
from vit.sources.ports.families.hf import check_number
from vit.sources.ports.families.import_dinov3 import _linear, _Taker
from vit.sources.ports.families.video_ports.import_videomae import _pair

SUPPORTED = "ViViT: HF VivitModel and VivitForVideoClassification folders"
ARCHITECTURES = {"VivitModel": False, "VivitForVideoClassification": True}
ACTIVATIONS = {"gelu_fast": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu"}
_HF_NAMES = {"q": "attention.attention.query", "k": "attention.attention.key", "v": "attention.attention.value",
             "attn.proj": "attention.output.dense", "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense",
             "norm1": "layernorm_before", "norm2": "layernorm_after"}


def config_from_hf(config_json: Mapping) -> ViTConfig:
    """Our config for an HF ``vivit`` config.json."""
    architecture = (config_json.get("architectures") or ["VivitModel"])[0]
    if architecture not in ARCHITECTURES:
        raise ValueError(f"HF architecture {architecture} is not supported; supported: {', '.join(ARCHITECTURES)}")
    act = config_json.get("hidden_act", "gelu_fast")
    if act not in ACTIVATIONS:
        raise ValueError(f"HF ViViT config uses activation {str(act)[:40]!r}; this model reads "
                         f"{', '.join(ACTIVATIONS)} only here")
    tubelet = config_json.get("tubelet_size", [2, 16, 16])
    if not (isinstance(tubelet, (list, tuple)) and len(tubelet) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in tubelet)):
        raise ValueError(f"HF ViViT tubelet_size must be [frames, height, width], got {str(tubelet)[:40]}")
    check_number(config_json.get("layer_norm_eps", 1e-6), "layer_norm_eps", 0, 1, high_open=True)
    classifier = ARCHITECTURES[architecture]
    labels = config_json.get("id2label")
    classes = (len(labels) if isinstance(labels, Mapping) and labels else config_json.get("num_labels", 2)) \
        if classifier else 0
    return ViTConfig(
        image_size=_pair(config_json.get("image_size", 224), "image_size"),
        patch_size=_pair(list(tubelet[1:]), "tubelet_size[1:]"),
        num_channels=config_json.get("num_channels", 3), num_classes=classes,
        hidden_size=config_json.get("hidden_size", 768), num_layers=config_json.get("num_hidden_layers", 12),
        num_heads=config_json.get("num_attention_heads", 12), mlp_size=config_json.get("intermediate_size", 3072),
        attention_dropout=float(config_json.get("attention_probs_dropout_prob", 0.0)),
        layer_norm_eps=config_json.get("layer_norm_eps", 1e-6), qkv_bias=bool(config_json.get("qkv_bias", True)),
        activation=ACTIVATIONS[act], num_frames=config_json.get("num_frames", 32), tubelet_size=tubelet[0],
        class_token=True, pos_embed=True, pooling="cls", final_norm=True)


def state_dict_from_hf(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from an HF ViViT one; ValueError on any key it cannot place."""
    take = _Taker(state, "HF ViViT state dict")
    base = next((b for b in ("vivit.", "") if f"{b}embeddings.patch_embeddings.projection.weight" in state), None)
    if base is None:
        raise ValueError("HF ViViT state dict has no 'embeddings.patch_embeddings.projection.weight'")
    take.skip(*(k for k in state if k.startswith(f"{base}pooler.")))
    ours = _linear(take, "patch_embed", f"{base}embeddings.patch_embeddings.projection")
    ours["cls_token"] = take(f"{base}embeddings.cls_token")
    ours["pos_embed"] = take(f"{base}embeddings.position_embeddings")
    ours.update(_linear(take, "norm", f"{base}layernorm"))
    if config.num_classes:
        ours.update(_linear(take, "head", "classifier"))
    for i in range(config.num_layers):
        layer, b = f"{base}encoder.layer.{i}", f"blocks.{i}"
        ours[f"{b}.attn.qkv.weight"] = torch.cat([take(f"{layer}.{_HF_NAMES[p]}.weight") for p in "qkv"])
        if config.qkv_bias:
            ours[f"{b}.attn.qkv.bias"] = torch.cat([take(f"{layer}.{_HF_NAMES[p]}.bias") for p in "qkv"])
        for piece in ("attn.proj", "mlp.fc1", "mlp.fc2", "norm1", "norm2"):
            ours.update(_linear(take, f"{b}.{piece}", f"{layer}.{_HF_NAMES[piece]}"))
    take.check_all_used()
    return ours
