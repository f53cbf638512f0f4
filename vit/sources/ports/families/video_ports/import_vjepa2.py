"""V-JEPA 2 in our ``ViT``: the encoder of HF ``vjepa2`` folders (``VJEPA2Model``), without importing transformers.

V-JEPA 2's encoder is a plain pre-norm ViT on a clip ``(B, frames, C, H, W)``: a Conv3d embeds each tubelet of
``tubelet_size`` frames x one patch (``ViTConfig.tubelet_size``), its tokens time-major; no CLS and no position
table: q and k are turned by its 3D rotary embedding (``ViTConfig.rope="vjepa2"``, ``positions.vjepa2_rope``),
whose (time, row, col) HF reads off a token's index on the *configured* square grid (``crop_size // patch_size``,
our ``rope_ref_grid``) whatever the frames' real size, as we do; a final LayerNorm norms every token. The JEPA
predictor is dropped by name (the explorer shows the encoder).

``VJEPA2ForVideoClassification`` opens with its attentive probe (HF ``VJEPA2AttentivePooler``): its
``num_pooler_layers`` self-attention layers over the encoder's normed tokens (our ``ViT.pool_blocks``: pre-norm
blocks without RoPE), then a learned query's cross-attention whose keys and values are read from a LayerNorm of the
tokens, with no output projection and the query as its residual, then ``x + mlp(norm(x))``
(``AttentionPool`` with ``pool_head="vjepa2"``), and the linear classifier on it. The pooler's MLPs are four times
the width whatever the encoder's ``mlp_ratio`` (HF ``VJEPA2MLP``'s default ratio): ``pool_mlp_size``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from vit.model import ViTConfig
from vit.sources.ports.families.hf import check_number
from vit.sources.ports.families.import_dinov3 import _linear, _Taker

SUPPORTED = "V-JEPA 2: HF VJEPA2Model (the encoder) and VJEPA2ForVideoClassification folders"
ARCHITECTURES = ("VJEPA2Model", "VJEPA2ForVideoClassification")
ROPE_THETA = 10000.0  # HF rotate_queries_or_keys: 1 / 10000 ** omega, fixed
_HF_NAMES = {"attn.proj": "attention.proj", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2", "norm1": "norm1",
             "norm2": "norm2"}


def _side(value, name: str) -> int:
    """HF V-JEPA 2's ``crop_size`` / ``patch_size``: one side (its Conv3d and rotary grid read them as squares)."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == value[1]:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"V-JEPA 2 {name} must be one side in pixels, got {str(value)[:40]}")
    return value


def config_from_hf(config_json: Mapping) -> ViTConfig:
    """Our config for an HF ``vjepa2`` config.json (the encoder's)."""
    architecture = (config_json.get("architectures") or ["VJEPA2Model"])[0]
    if architecture not in ARCHITECTURES:
        raise ValueError(f"HF architecture {architecture} is not supported; supported: {', '.join(ARCHITECTURES)}")
    classifier = architecture == "VJEPA2ForVideoClassification"
    labels = config_json.get("id2label")
    classes = (len(labels) if isinstance(labels, Mapping) and labels else config_json.get("num_labels", 2)) \
        if classifier else 0
    pool_layers = config_json.get("num_pooler_layers", 3) if classifier else 0
    if config_json.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"HF V-JEPA 2 config uses activation {str(config_json.get('hidden_act'))[:40]!r}; this "
                         "model reads exact GELU only here")
    check_number(config_json.get("layer_norm_eps", 1e-6), "layer_norm_eps", 0, 1, high_open=True)
    ratio = config_json.get("mlp_ratio", 4.0)
    check_number(ratio, "mlp_ratio", 0, 64)
    crop, patch = _side(config_json.get("crop_size", 256), "crop_size"), _side(config_json.get("patch_size", 16),
                                                                                 "patch_size")
    if crop < patch:
        raise ValueError(f"V-JEPA 2 crop_size {crop} is smaller than its patch_size {patch}")
    hidden = config_json.get("hidden_size", 1024)
    return ViTConfig(
        image_size=crop - crop % patch, patch_size=patch, num_channels=config_json.get("in_chans", 3),
        num_classes=classes,
        hidden_size=hidden, num_layers=config_json.get("num_hidden_layers", 24),
        num_heads=config_json.get("num_attention_heads", 16),
        mlp_size=int(hidden * ratio) if isinstance(hidden, int) else hidden,  # HF's int(hidden_size * mlp_ratio)
        attention_dropout=float(config_json.get("attention_probs_dropout_prob", 0.0)),
        layer_norm_eps=config_json.get("layer_norm_eps", 1e-6), qkv_bias=bool(config_json.get("qkv_bias", True)),
        num_frames=config_json.get("frames_per_clip", 64), tubelet_size=config_json.get("tubelet_size", 2),
        class_token=False, pos_embed=False, rope="vjepa2", rope_theta=ROPE_THETA, rope_ref_grid=crop // patch,
        final_norm=True, **(dict(pooling="map", pool_head="vjepa2", pool_layers=pool_layers,
                                                   pool_mlp_size=int(hidden * 4.0)) if classifier
                            else dict(pooling="avg")))


def wanted(config_json: Mapping) -> Callable[[str], bool]:
    """Which tensors to read: the encoder's, never the JEPA predictor's."""
    return lambda key: not key.startswith(("predictor.", "vjepa2.predictor."))


def state_dict_from_hf(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from an HF V-JEPA 2 one's encoder; ValueError on any encoder key it cannot place."""
    state = {k: v for k, v in state.items() if not k.startswith(("predictor.", "vjepa2.predictor."))}
    take = _Taker(state, "HF V-JEPA 2 state dict")
    base = next((b for b in ("encoder.", "vjepa2.encoder.") if f"{b}embeddings.patch_embeddings.proj.weight" in state),
                None)
    if base is None:
        raise ValueError("HF V-JEPA 2 state dict has no 'encoder.embeddings.patch_embeddings.proj.weight'")
    ours = _linear(take, "patch_embed", f"{base}embeddings.patch_embeddings.proj")
    ours.update(_linear(take, "norm", f"{base}layernorm"))
    for i in range(config.num_layers):
        layer, b = f"{base}layer.{i}", f"blocks.{i}"
        ours[f"{b}.attn.qkv.weight"] = torch.cat([take(f"{layer}.attention.{p}.weight")
                                                  for p in ("query", "key", "value")])
        if config.qkv_bias:
            ours[f"{b}.attn.qkv.bias"] = torch.cat([take(f"{layer}.attention.{p}.bias")
                                                    for p in ("query", "key", "value")])
        for piece, theirs in _HF_NAMES.items():
            ours.update(_linear(take, f"{b}.{piece}", f"{layer}.{theirs}"))
    if config.pool_layers or config.pooling == "map":  # VJEPA2ForVideoClassification's attentive probe
        ours.update(_probe(take, config))
    take.check_all_used()
    return ours


def _probe(take: _Taker, config: ViTConfig) -> dict[str, torch.Tensor]:
    """The pooler's and classifier's tensors (HF ``pooler.*``, ``classifier.*``) under our names."""
    ours = {"attn_pool.latent": take("pooler.query_tokens")}
    for i in range(config.pool_layers):
        layer, b = f"pooler.self_attention_layers.{i}", f"pool_blocks.{i}"
        for kind in ("weight", "bias"):
            ours[f"{b}.attn.qkv.{kind}"] = torch.cat([take(f"{layer}.self_attn.{p}_proj.{kind}") for p in "qkv"])
        for piece, theirs in (("attn.proj", "self_attn.out_proj"), ("norm1", "layer_norm1"), ("norm2", "layer_norm2"),
                              ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")):
            ours.update(_linear(take, f"{b}.{piece}", f"{layer}.{theirs}"))
    cross = "pooler.cross_attention_layer"
    ours.update(_linear(take, "attn_pool.q", f"{cross}.cross_attn.q_proj"))
    for kind in ("weight", "bias"):
        ours[f"attn_pool.kv.{kind}"] = torch.cat([take(f"{cross}.cross_attn.{p}_proj.{kind}") for p in "kv"])
    for piece, theirs in (("kv_norm", "layer_norm1"), ("norm", "layer_norm2"), ("mlp.fc1", "mlp.fc1"),
                          ("mlp.fc2", "mlp.fc2")):
        ours.update(_linear(take, f"attn_pool.{piece}", f"{cross}.{theirs}"))
    ours.update(_linear(take, "head", "classifier"))
    return ours
