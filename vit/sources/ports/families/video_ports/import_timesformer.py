"""TimeSformer in our ``ViT``: HF ``timesformer`` folders (``TimesformerModel``, ``TimesformerForVideoClassification``),
without importing transformers.

TimeSformer is a pre-norm ViT on a clip ``(B, frames, C, H, W)`` with divided space-time attention
(``ViTConfig.divided_attention``): each frame is cut into patches by one Conv2d (here a Conv3d of one-frame
tubelets, the same weights); a CLS token and the learned spatial table (resized by nearest neighbour on another
frame size, as ``TimesformerEmbeddings`` does), then a learned entry per frame added to its patches. Each block
adds a temporal attention (a patch over its position in every frame: ``temporal_layernorm``,
``temporal_attention``, ``temporal_dense``) and then a spatial one (each frame with the CLS copied in front, the CLS's
outputs averaged), then its MLP. The final LayerNorm norms every token; the classifier reads the CLS.

HF keeps the patch tokens position-major (row, col, frame); ours are time-major (frame, row, col), VideoMAE's order,
so that every clip's map unfolds in one place (``vit.model.layouts.frame_maps``): the weights do not depend on the
order, only the hidden states' rows are permuted (``hf_token_order``). Only ``attention_type="divided_space_time"``
(every published checkpoint) opens; ``space_only`` and ``joint_space_time`` are refused in one line.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from vit.model import ViTConfig
from vit.sources.ports.families.hf import check_number
from vit.sources.ports.families.import_dinov3 import _linear, _Taker

SUPPORTED = "TimeSformer: HF TimesformerModel and TimesformerForVideoClassification folders (divided space-time)"
ARCHITECTURES = {"TimesformerModel": False, "TimesformerForVideoClassification": True}
_HF_NAMES = {"attn.proj": "attention.output.dense", "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense",
             "norm1": "layernorm_before", "norm2": "layernorm_after", "temporal_norm": "temporal_layernorm",
             "temporal_attn.proj": "temporal_attention.output.dense", "temporal_dense": "temporal_dense"}


def _side(value, name: str) -> int:
    """HF TimeSformer's ``image_size`` / ``patch_size``: one side (its layers read ``image_size // patch_size`` as
    the patch grid's width, so a pair is refused)."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == value[1]:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"TimeSformer {name} must be one side in pixels (its layers read it as the frame's width), "
                         f"got {str(value)[:40]}")
    return value


def config_from_hf(config_json: Mapping) -> ViTConfig:
    """Our config for an HF ``timesformer`` config.json."""
    architecture = (config_json.get("architectures") or ["TimesformerModel"])[0]
    if architecture not in ARCHITECTURES:
        raise ValueError(f"HF architecture {architecture} is not supported; supported: {', '.join(ARCHITECTURES)}")
    kind = config_json.get("attention_type", "divided_space_time")
    if kind != "divided_space_time":
        raise ValueError(f"TimeSformer attention_type {str(kind)[:40]!r} is not supported; only divided_space_time "
                         "(every published checkpoint)")
    if config_json.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"HF TimeSformer config uses activation {str(config_json.get('hidden_act'))[:40]!r}; this "
                         "model reads exact GELU only here")
    check_number(config_json.get("layer_norm_eps", 1e-6), "layer_norm_eps", 0, 1, high_open=True)
    classifier = ARCHITECTURES[architecture]
    labels = config_json.get("id2label")
    classes = (len(labels) if isinstance(labels, Mapping) and labels else config_json.get("num_labels", 2)) \
        if classifier else 0
    return ViTConfig(
        image_size=_side(config_json.get("image_size", 224), "image_size"),
        patch_size=_side(config_json.get("patch_size", 16), "patch_size"),
        num_channels=config_json.get("num_channels", 3), num_classes=classes,
        hidden_size=config_json.get("hidden_size", 768), num_layers=config_json.get("num_hidden_layers", 12),
        num_heads=config_json.get("num_attention_heads", 12), mlp_size=config_json.get("intermediate_size", 3072),
        attention_dropout=float(config_json.get("attention_probs_dropout_prob", 0.0)),
        layer_norm_eps=config_json.get("layer_norm_eps", 1e-6), qkv_bias=bool(config_json.get("qkv_bias", True)),
        num_frames=config_json.get("num_frames", 8), tubelet_size=1, divided_attention=True, pos_resize="nearest",
        pooling="cls")


def state_dict_from_hf(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from an HF TimeSformer one; ValueError on any key it cannot place."""
    take = _Taker(state, "HF TimeSformer state dict")
    base = next((b for b in ("timesformer.", "") if f"{b}embeddings.cls_token" in state), None)
    if base is None:
        raise ValueError("HF TimeSformer state dict has no 'embeddings.cls_token'")
    ours = _linear(take, "patch_embed", f"{base}embeddings.patch_embeddings.projection")
    ours["patch_embed.weight"] = ours["patch_embed.weight"][:, :, None]  # Conv2d (D, C, ph, pw) -> (D, C, 1, ph, pw)
    ours["cls_token"] = take(f"{base}embeddings.cls_token")
    ours["pos_embed"] = take(f"{base}embeddings.position_embeddings")
    ours["time_embed"] = take(f"{base}embeddings.time_embeddings")
    ours.update(_linear(take, "norm", f"{base}layernorm"))
    if config.num_classes:
        ours.update(_linear(take, "head", "classifier"))
    for i in range(config.num_layers):
        layer, b = f"{base}encoder.layer.{i}", f"blocks.{i}"
        for ours_qkv, theirs in (("attn", "attention"), ("temporal_attn", "temporal_attention")):
            ours[f"{b}.{ours_qkv}.qkv.weight"] = take(f"{layer}.{theirs}.attention.qkv.weight")
            if config.qkv_bias:
                ours[f"{b}.{ours_qkv}.qkv.bias"] = take(f"{layer}.{theirs}.attention.qkv.bias")
        for piece, theirs in _HF_NAMES.items():
            ours.update(_linear(take, f"{b}.{piece}", f"{layer}.{theirs}"))
    take.check_all_used()
    return ours


def hf_token_order(grid: tuple[int, int, int]) -> torch.Tensor:
    """Where each of HF TimeSformer's tokens sits among ours: ``ours[:, hf_token_order(grid)]`` is HF's order (the
    CLS, then the patches position-major: row, col, frame), for a clip of ``grid`` ``(frames, gh, gw)``."""
    t, gh, gw = grid
    patches = torch.arange(t * gh * gw).view(t, gh * gw).T.reshape(-1)  # HF's p*t + f holds our f*P + p
    return torch.cat([torch.zeros(1, dtype=torch.long), 1 + patches])
