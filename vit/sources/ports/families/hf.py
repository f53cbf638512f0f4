"""HF ``transformers`` ViT, DeiT, DINOv2 and DINOv2-with-registers weights in our ``ViT``, without transformers.

The architectures are ours with options (``ViTConfig``): conv patch embedding, CLS first
(then DeiT's distillation token, then DINOv2's registers), learned positions, pre-norm
blocks (HF ``layernorm_before`` / ``norm1``), exact GELU, DINOv2's layer scale, a final norm
and a linear classifier: on CLS (ViT, DeiT), the mean of CLS and DIST heads (DeiT with
teacher), or on ``[CLS, mean of patches]`` (DINOv2). HF keeps separate query, key and value
projections, which are stacked here into our fused ``qkv`` (rows: all of q, then k, then v;
heads contiguous in each, as both models split them). Both key layouts are read:
transformers 5 in memory (``vit.layers.{i}.attention.q_proj``) and 4, which is also what
``save_pretrained`` and the Hub store (``vit.encoder.layer.{i}.attention.attention.query``).
The mapping is strict: a key it does not use, or one it misses, is an error, never skipped.
Only the pieces no forward pass of ours needs are dropped, by name: DINOv2's ``mask_token``
(masked pre-training), the tanh ``pooler`` of head-less ``ViTModel`` / ``DeiTModel`` and the pixel
``decoder`` of ``ViTMAEForPreTraining`` (whose encoder opens as ``ViTMAEModel`` does).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from vit.model import ViTConfig

# HF architecture -> (our config options, the classifier's keys: (CLS head, DIST head)). Position resampling
# follows the installed transformers (5.x): ViT, DeiT and DINOv2 interpolate bicubically to the new grid
# (size=, no antialias; DINOv2's older +0.1 scale-factor offset is gone), DINOv2-with-registers with antialias=True.
ARCHITECTURES: dict[str, tuple[dict, tuple[str, str] | None]] = {
    "ViTForImageClassification": ({}, ("classifier", "")),
    "ViTModel": ({}, None),
    "DeiTForImageClassification": (dict(distillation_token=True), ("classifier", "")),
    "DeiTForImageClassificationWithTeacher": (dict(distillation_token=True, distillation_head=True),
                                              ("cls_classifier", "distillation_classifier")),
    "DeiTModel": (dict(distillation_token=True), None),
    "Dinov2ForImageClassification": (dict(pooling="cls+avg"), ("classifier", "")),
    "Dinov2Model": ({}, None),
    "Dinov2WithRegistersForImageClassification": (dict(pooling="cls+avg", prefix_positions="cls",
                                                       pos_embed_antialias=True), ("classifier", "")),
    "Dinov2WithRegistersModel": (dict(prefix_positions="cls", pos_embed_antialias=True), None),
    # MAE's encoder is a ViT; its pre-training masking (mask_ratio, a random shuffle even at 0) is left out: the
    # explorer shows every patch, in order, which is ViTMAEModel with mask_ratio=0 and noise=arange(patches).
    "ViTMAEModel": ({}, None),
    # The layout MAE's checkpoints are published in: the same encoder under "vit.", plus the pixel decoder (dropped).
    "ViTMAEForPreTraining": ({}, None),
}
SUPPORTED = ", ".join(ARCHITECTURES)
# HF ViTConfig / ViTMAEConfig fields (DINOv2's read the same way): what config_from_hf honours (or refuses, such as
# another hidden_act), and what has no effect on an image's forward pass through the encoder.
HF_HONOURED = {"image_size", "patch_size", "num_channels", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "intermediate_size", "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "qkv_bias",
               "layer_norm_eps"}
HF_INERT = {"initializer_range", "encoder_stride",  # ViTForMaskedImageModeling's decoder
            "pooler_act", "pooler_output_size",  # the tanh pooler, which is dropped
            "mask_ratio", "norm_pix_loss", "decoder_hidden_size", "decoder_intermediate_size",  # MAE pre-training:
            "decoder_num_attention_heads", "decoder_num_hidden_layers"}  # masking and the pixel decoder


def _square(value, name: str) -> int:
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(f"HF config {name} {value!r} is not square; this model needs square images and patches")
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"HF config {name} must be a whole number, got {value!r}")
    return value


def check_number(value, name: str, low: float, high: float, high_open: bool = False) -> None:
    """ValueError naming config field ``name`` unless ``value`` is a finite number in [low, high] (or [low, high)):
    fields the forward pass never reads are checked too, so a file that declares NaN or 1e308 is refused whole."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) \
        and low <= value and (value < high if high_open else value <= high)
    if not ok:
        raise ValueError(f"config {name} must be a finite number in [{low:g}, {high:g}{')' if high_open else ']'}, "
                         f"got {str(value)[:40]}")


def config_from_hf(hf_config, architecture: str = "ViTForImageClassification") -> ViTConfig:
    """Our ``ViTConfig`` for an HF config (a ``transformers`` config object, or its config.json as a dict).

    ``architecture`` is one of ``ARCHITECTURES``; it decides the tokens, pooling and head.
    Raises ValueError naming what our model cannot express (another activation, SwiGLU, ...).
    """
    def get(name: str, default=None):
        if isinstance(hf_config, Mapping):
            return hf_config.get(name, default)
        return getattr(hf_config, name, default)

    if architecture not in ARCHITECTURES:
        raise ValueError(f"HF architecture {architecture} is not supported; supported: {SUPPORTED}")
    options, head = ARCHITECTURES[architecture]
    if get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"HF config uses activation {get('hidden_act')!r}; this model only has exact GELU")
    dinov2 = architecture.startswith("Dinov2")
    if dinov2 and get("use_swiglu_ffn", False):
        raise ValueError("HF DINOv2 config uses a SwiGLU MLP (the giant models); this model has a GELU MLP only")
    if architecture.startswith("ViTMAE"):  # pre-training only, but a file declaring NaN is not MAE's
        check_number(get("mask_ratio", 0.75), "mask_ratio", 0, 1, high_open=True)
    if dinov2:
        check_number(get("layerscale_value", 1.0), "layerscale_value", 0, 1e3)
    hidden = get("hidden_size")
    if dinov2:
        ratio = get("mlp_ratio", 4)
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 64:
            raise ValueError(f"HF config mlp_ratio must be a number in (0, 64], got {str(ratio)[:40]}")
        mlp_size = int(hidden * ratio) if isinstance(hidden, int) else None
    else:
        mlp_size = get("intermediate_size")
    num_classes = 0
    if head is not None:
        labels = get("id2label")
        num_classes = len(labels) if isinstance(labels, Mapping) and labels else get("num_labels", 2)
    return ViTConfig(
        image_size=_square(get("image_size", 224), "image_size"),
        patch_size=_square(get("patch_size", 16), "patch_size"),
        num_channels=get("num_channels", 3),
        num_classes=num_classes,
        hidden_size=hidden,
        num_layers=get("num_hidden_layers"),
        num_heads=get("num_attention_heads"),
        mlp_size=mlp_size,
        dropout=float(get("hidden_dropout_prob", 0.0)),
        attention_dropout=float(get("attention_probs_dropout_prob", 0.0)),
        qkv_bias=bool(get("qkv_bias", True)),
        layer_norm_eps=get("layer_norm_eps", 1e-12),
        num_register_tokens=get("num_register_tokens", 0) if architecture.startswith("Dinov2WithRegisters") else 0,
        layer_scale=float(get("layerscale_value", 1.0)) if dinov2 else None,
        **options,
    )


def hf_config_kwargs(config: ViTConfig) -> dict:
    """Keyword arguments for ``transformers.ViTConfig`` describing the same model as ``config``."""
    if config.drop_path:
        raise ValueError("HF's ViT has no stochastic depth; use drop_path=0 for a comparable config")
    return dict(image_size=config.image_size, patch_size=config.patch_size, num_channels=config.num_channels,
                num_labels=config.num_classes, hidden_size=config.hidden_size,
                num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
                intermediate_size=config.mlp_size, hidden_act="gelu", hidden_dropout_prob=config.dropout,
                attention_probs_dropout_prob=config.attention_dropout, qkv_bias=config.qkv_bias,
                layer_norm_eps=config.layer_norm_eps)


# Where each piece of our block lives inside one HF layer: transformers 5 names first, then 4 (also the Hub's).
_BLOCK_NAMES = {
    "q": ("attention.q_proj", "attention.attention.query"),
    "k": ("attention.k_proj", "attention.attention.key"),
    "v": ("attention.v_proj", "attention.attention.value"),
    "attn.proj": ("attention.o_proj", "attention.output.dense"),
    "mlp.fc1": ("mlp.fc1", "intermediate.dense"),
    "mlp.fc2": ("mlp.fc2", "output.dense"),
    "norm1": ("layernorm_before", "norm1"),
    "norm2": ("layernorm_after", "norm2"),
}
_BASES = ("vit.", "deit.", "dinov2.", "dinov2_with_registers.", "")  # ViTMAEModel's keys have no base


def state_dict_from_hf(hf_state_dict: Mapping[str, torch.Tensor], num_layers: int,
                       architecture: str = "ViTForImageClassification") -> dict[str, torch.Tensor]:
    """Our ``ViT`` state dict from an HF one of ``architecture``; raises ValueError on any key it cannot place."""
    source = dict(hf_state_dict)
    used: set[str] = set()
    if architecture not in ARCHITECTURES:
        raise ValueError(f"HF architecture {architecture} is not supported; supported: {SUPPORTED}")
    _, head = ARCHITECTURES[architecture]

    def take(key: str) -> torch.Tensor:
        if key not in source:
            raise ValueError(f"HF state dict lacks {key!r}; is it a {architecture}?")
        used.add(key)
        return source[key]

    def linear(ours: str, theirs: str, bias: bool = True) -> dict[str, torch.Tensor]:
        out = {f"{ours}.weight": take(f"{theirs}.weight")}
        if bias:
            out[f"{ours}.bias"] = take(f"{theirs}.bias")
        return out

    base = next((b for b in _BASES if f"{b}embeddings.cls_token" in source), None)
    if base is None:
        raise ValueError(f"HF state dict has no 'embeddings.cls_token'; is it a {architecture}?")
    emb = f"{base}embeddings"
    ours = {
        "cls_token": take(f"{emb}.cls_token"),
        "pos_embed": take(f"{emb}.position_embeddings"),
        **linear("patch_embed", f"{emb}.patch_embeddings.projection"),
        **linear("norm", f"{base}layernorm"),
    }
    if f"{emb}.distillation_token" in source:
        ours["dist_token"] = take(f"{emb}.distillation_token")
    if f"{emb}.register_tokens" in source:
        ours["reg_token"] = take(f"{emb}.register_tokens")
    used.add(f"{emb}.mask_token")  # masked pre-training only; never part of a forward pass on images
    if architecture == "ViTMAEForPreTraining":  # MAE's pixel decoder: pre-training only, never part of the encoder
        used.update(k for k in source if k.startswith("decoder."))
    if head is None:
        used.update({f"{base}pooler.dense.weight", f"{base}pooler.dense.bias"})  # HF's tanh pooler: no maps, no logits
    else:
        ours.update(linear("head", head[0]))
        if head[1]:
            ours.update(linear("head_dist", head[1]))
    v4 = any(k.startswith(f"{base}encoder.layer.") for k in source)
    layer_prefix = f"{base}encoder.layer.{{i}}" if v4 else f"{base}layers.{{i}}"
    if not v4 and any(k.startswith(f"{base}encoder.layers.") for k in source):
        layer_prefix = f"{base}encoder.layers.{{i}}"
    for i in range(num_layers):
        layer, block = layer_prefix.format(i=i), f"blocks.{i}"

        def name(piece: str, layer: str = layer) -> str:
            candidates = [f"{layer}.{n}" for n in _BLOCK_NAMES[piece]]
            return next((c for c in candidates if f"{c}.weight" in source), candidates[0])

        q, k, v = name("q"), name("k"), name("v")
        ours[f"{block}.attn.qkv.weight"] = torch.cat([take(f"{n}.weight") for n in (q, k, v)], dim=0)
        if f"{q}.bias" in source:
            ours[f"{block}.attn.qkv.bias"] = torch.cat([take(f"{n}.bias") for n in (q, k, v)], dim=0)
        for piece in ("attn.proj", "mlp.fc1", "mlp.fc2", "norm1", "norm2"):
            ours.update(linear(f"{block}.{piece}", name(piece)))
        for ls in ("1", "2"):
            if f"{layer}.layer_scale{ls}.lambda1" in source:
                ours[f"{block}.ls{ls}"] = take(f"{layer}.layer_scale{ls}.lambda1")
    unused = sorted(set(source) - used)
    if unused:
        shown = ", ".join(unused[:5]) + (" ..." if len(unused) > 5 else "")
        raise ValueError(f"HF state dict has {len(unused)} key(s) this model has no place for: {shown}")
    return ours
