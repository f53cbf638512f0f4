"""VideoMAE in our ``ViT``: HF ``videomae`` folders (``VideoMAEModel``, ``VideoMAEForVideoClassification``, and the
encoder of ``VideoMAEForPreTraining``), without importing transformers.

VideoMAE is a plain pre-norm ViT on a clip ``(B, frames, C, H, W)``: a Conv3d embeds each tubelet of
``tubelet_size`` frames x one patch (``ViTConfig.tubelet_size``), its tokens time-major; the positions are the fixed
1D sine-cosine table over the token index (``sinusoid_pos``, computed, never stored); no CLS; the key has no bias
(``key_bias=False``); exact GELU; LayerNorm eps 1e-12. With mean pooling (every published classifier) the head reads
the mean of the tokens after ``fc_norm``, a plain ``nn.LayerNorm`` (eps 1e-5, ``fc_norm_eps``), with no final norm;
without it ``VideoMAEModel`` norms every token. ``VideoMAEForVideoClassification`` without mean pooling reads the
first *patch* token, which no published model does: refused. The pre-training decoder, ``encoder_to_decoder`` and
``mask_token`` are dropped by name (the explorer shows every tubelet, none masked).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from vit.model import ViTConfig
from vit.sources.ports.families.hf import check_number
from vit.sources.ports.families.import_dinov3 import _linear, _Taker

SUPPORTED = "VideoMAE: HF VideoMAEModel, VideoMAEForVideoClassification and VideoMAEForPreTraining folders"
ARCHITECTURES = {"VideoMAEModel": False, "VideoMAEForVideoClassification": True, "VideoMAEForPreTraining": False}
FC_NORM_EPS = 1e-5  # VideoMAEForVideoClassification's fc_norm is nn.LayerNorm(hidden_size): torch's default eps
# Where each piece of an HF layer lives: the Hub's (and save_pretrained's) names first, then transformers 5's in
# memory.
_HF_NAMES = {"q": ("attention.attention.query",), "k": ("attention.attention.key",),
             "v": ("attention.attention.value",), "attn.proj": ("attention.output.dense",),
             "mlp.fc1": ("intermediate.dense",), "mlp.fc2": ("output.dense",),
             "norm1": ("layernorm_before",), "norm2": ("layernorm_after",)}


def _pair(value, name: str) -> int | tuple[int, int]:
    """HF's ``image_size`` / ``patch_size``: a side, or ``(height, width)``."""
    sides = list(value) if isinstance(value, (list, tuple)) else [value, value]
    if len(sides) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sides):
        raise ValueError(f"VideoMAE {name} must be a side or (height, width) in pixels, got {str(value)[:40]}")
    return sides[0] if sides[0] == sides[1] else (sides[0], sides[1])


def config_from_hf(config_json: Mapping) -> ViTConfig:
    """Our config for an HF ``videomae`` config.json."""
    architecture = (config_json.get("architectures") or ["VideoMAEModel"])[0]
    if architecture not in ARCHITECTURES:
        raise ValueError(f"HF architecture {architecture} is not supported; supported: {', '.join(ARCHITECTURES)}")
    if config_json.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"HF VideoMAE config uses activation {str(config_json.get('hidden_act'))[:40]!r}; this "
                         "model reads exact GELU only here")
    mean_pooling = bool(config_json.get("use_mean_pooling", True))
    classifier = ARCHITECTURES[architecture]
    if classifier and not mean_pooling:
        raise ValueError("VideoMAEForVideoClassification without use_mean_pooling reads its first patch token; "
                         "not supported (every published one pools)")
    for name in ("layer_norm_eps",):
        check_number(config_json.get(name, 1e-12), name, 0, 1, high_open=True)
    labels = config_json.get("id2label")
    classes = (len(labels) if isinstance(labels, Mapping) and labels else config_json.get("num_labels", 2)) \
        if classifier else 0
    bias = config_json.get("qv_bias", config_json.get("qkv_bias", True))
    return ViTConfig(
        image_size=_pair(config_json.get("image_size", 224), "image_size"),
        patch_size=_pair(config_json.get("patch_size", 16), "patch_size"),
        num_channels=config_json.get("num_channels", 3), num_classes=classes,
        hidden_size=config_json.get("hidden_size", 768), num_layers=config_json.get("num_hidden_layers", 12),
        num_heads=config_json.get("num_attention_heads", 12), mlp_size=config_json.get("intermediate_size", 3072),
        attention_dropout=float(config_json.get("attention_probs_dropout_prob", 0.0)),
        layer_norm_eps=config_json.get("layer_norm_eps", 1e-12), qkv_bias=bool(bias), key_bias=False,
        num_frames=config_json.get("num_frames", 16), tubelet_size=config_json.get("tubelet_size", 2),
        class_token=False, pos_embed=False, sinusoid_pos=True, pooling="avg",
        final_norm=not mean_pooling, fc_norm=classifier, fc_norm_eps=FC_NORM_EPS if classifier else 0.0)


def state_dict_from_hf(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from an HF VideoMAE one; ValueError on any key it cannot place."""
    take = _Taker(state, "HF VideoMAE state dict")
    base = next((b for b in ("videomae.", "") if f"{b}embeddings.patch_embeddings.projection.weight" in state), None)
    if base is None:
        raise ValueError("HF VideoMAE state dict has no 'embeddings.patch_embeddings.projection.weight'")
    take.skip(*(k for k in state if k.startswith("decoder.")), "encoder_to_decoder.weight", "mask_token")
    ours = _linear(take, "patch_embed", f"{base}embeddings.patch_embeddings.projection")
    if config.final_norm:
        ours.update(_linear(take, "norm", f"{base}layernorm"))
    if config.fc_norm:
        ours.update(_linear(take, "fc_norm", "fc_norm"))
    if config.num_classes:
        ours.update(_linear(take, "head", "classifier"))
    for i in range(config.num_layers):
        layer, b = f"{base}encoder.layer.{i}", f"blocks.{i}"
        q, k, v = (take(f"{layer}.{_HF_NAMES[p][0]}.weight") for p in "qkv")
        ours[f"{b}.attn.qkv.weight"] = torch.cat([q, k, v])
        if config.qkv_bias:  # the Hub's q_bias / v_bias, or transformers 5's query.bias / value.bias in memory
            q_bias = take(next((n for n in (f"{layer}.attention.attention.q_bias",
                                            f"{layer}.attention.attention.query.bias") if n in state),
                               f"{layer}.attention.attention.q_bias"))
            v_bias = take(next((n for n in (f"{layer}.attention.attention.v_bias",
                                            f"{layer}.attention.attention.value.bias") if n in state),
                               f"{layer}.attention.attention.v_bias"))
            ours[f"{b}.attn.qkv.bias"] = torch.cat([q_bias, torch.zeros_like(q_bias), v_bias])
        for piece in ("attn.proj", "mlp.fc1", "mlp.fc2", "norm1", "norm2"):
            ours.update(_linear(take, f"{b}.{piece}", f"{layer}.{_HF_NAMES[piece][0]}"))
    take.check_all_used()
    return ours
