"""Weights from HF ``transformers``' ``ViTForImageClassification`` in our ``ViT``, without importing transformers.

The architectures are the same: conv patch embedding, CLS token first, learned positions,
pre-norm blocks (HF ``layernorm_before`` / ``layernorm_after``), exact GELU, a final norm
and a linear classifier on CLS. HF keeps separate query, key and value projections, which
are stacked here into our fused ``qkv`` (rows: all of q, then k, then v; heads contiguous
in each, as both models split them). Both key layouts are read: transformers 5
(``vit.layers.{i}.attention.q_proj``) and 4 (``vit.encoder.layer.{i}.attention.attention.query``,
also what checkpoints on the Hub store). The mapping is strict: a key it does not use, or
one it misses, is an error, never skipped.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from vit.model import ViTConfig


def _square(value, name: str) -> int:
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(f"HF config {name} {value!r} is not square; this model needs square images and patches")
        value = value[0]
    return int(value)


def config_from_hf(hf_config) -> ViTConfig:
    """Our ``ViTConfig`` for an HF ``transformers.ViTConfig`` (read by attribute; eps is carried over)."""
    if hf_config.hidden_act != "gelu":
        raise ValueError(f"HF config uses activation {hf_config.hidden_act!r}; this model only has exact GELU")
    return ViTConfig(
        image_size=_square(hf_config.image_size, "image_size"),
        patch_size=_square(hf_config.patch_size, "patch_size"),
        num_channels=hf_config.num_channels,
        num_classes=hf_config.num_labels,
        hidden_size=hf_config.hidden_size,
        num_layers=hf_config.num_hidden_layers,
        num_heads=hf_config.num_attention_heads,
        mlp_size=hf_config.intermediate_size,
        dropout=hf_config.hidden_dropout_prob,
        attention_dropout=hf_config.attention_probs_dropout_prob,
        qkv_bias=bool(hf_config.qkv_bias),
        layer_norm_eps=hf_config.layer_norm_eps,
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


# Where each of our block's linear layers lives inside one HF layer, per transformers major version.
_LAYOUTS = {
    5: dict(layer="vit.layers.{i}", q="attention.q_proj", k="attention.k_proj", v="attention.v_proj",
            proj="attention.o_proj", fc1="mlp.fc1", fc2="mlp.fc2"),
    4: dict(layer="vit.encoder.layer.{i}", q="attention.attention.query", k="attention.attention.key",
            v="attention.attention.value", proj="attention.output.dense", fc1="intermediate.dense",
            fc2="output.dense"),
}


def state_dict_from_hf(hf_state_dict: Mapping[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """Our ``ViT`` state dict from a ``ViTForImageClassification`` one; raises ValueError on any mismatch."""
    source = dict(hf_state_dict)
    used: set[str] = set()

    def take(key: str) -> torch.Tensor:
        if key not in source:
            raise ValueError(f"HF state dict lacks {key!r}; is it a ViTForImageClassification?")
        used.add(key)
        return source[key]

    def linear(ours: str, theirs: str, bias: bool = True) -> dict[str, torch.Tensor]:
        out = {f"{ours}.weight": take(f"{theirs}.weight")}
        if bias:
            out[f"{ours}.bias"] = take(f"{theirs}.bias")
        return out

    emb = "vit.embeddings"
    ours = {
        "cls_token": take(f"{emb}.cls_token"),
        "pos_embed": take(f"{emb}.position_embeddings"),
        **linear("patch_embed", f"{emb}.patch_embeddings.projection"),
        **linear("norm", "vit.layernorm"),
        **linear("head", "classifier"),
    }
    names = _LAYOUTS[4 if any(k.startswith("vit.encoder.layer.") for k in source) else 5]
    for i in range(num_layers):
        layer, block = names["layer"].format(i=i), f"blocks.{i}"
        q, k, v = (f"{layer}.{names[n]}" for n in "qkv")
        ours[f"{block}.attn.qkv.weight"] = torch.cat([take(f"{n}.weight") for n in (q, k, v)], dim=0)
        if f"{q}.bias" in source:
            ours[f"{block}.attn.qkv.bias"] = torch.cat([take(f"{n}.bias") for n in (q, k, v)], dim=0)
        ours.update(linear(f"{block}.attn.proj", f"{layer}.{names['proj']}"))
        ours.update(linear(f"{block}.norm1", f"{layer}.layernorm_before"))
        ours.update(linear(f"{block}.norm2", f"{layer}.layernorm_after"))
        ours.update(linear(f"{block}.mlp.fc1", f"{layer}.{names['fc1']}"))
        ours.update(linear(f"{block}.mlp.fc2", f"{layer}.{names['fc2']}"))
    unused = sorted(set(source) - used)
    if unused:
        shown = ", ".join(unused[:5]) + (" ..." if len(unused) > 5 else "")
        raise ValueError(f"HF state dict has {len(unused)} key(s) this model has no place for: {shown}")
    return ours
