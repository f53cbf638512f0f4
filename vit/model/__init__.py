"""A from-scratch Vision Transformer (Dosovitskiy et al. 2020) that returns its own attention.

Building blocks first, the model last. ``ViT.forward`` follows the seed contract
``logits, attentions = model(images, output_attentions=False)``: ``attentions`` is ``None``
unless asked for, else a tuple with one ``(batch, heads, tokens, tokens)`` tensor per layer
holding the post-softmax probabilities (the meaning HF ``transformers`` gives the flag).
``logits`` is ``None`` for a model without a classifier (``num_classes=0``: feature models
such as DINO, whose attention is what one studies).

The defaults are the original ViT that this project trains; the other fields express the
published variants imported from HF ``transformers``, timm, torchvision and open_clip (``vit.sources.open``):
DeiT's distillation token, DINOv2's layer scale and register tokens, timm's average pooling
with ``fc_norm`` and position tables without prefix entries; DINOv3's rotary positions (on the
patch tokens' queries and keys only), storage tokens and masked key bias; CLIP's ``ln_pre``,
QuickGELU and projection to the joint embedding; SigLIP's missing class token and
attention-pooling ("MAP") head; SwiGLU MLPs; AIMv2's RMSNorm, bias-free projections and query-only pooling
head; Perception Encoder's rotary grid (EVA's, counted from 1, x first) and its probe's own heads. Tokens are
always ordered ``[CLS?, DIST?, REG 1..R, patches row by row]``.

``ViT.encode`` returns everything one pass computes (logits, the pooled or projected
embedding, every layer's attention and the pooling probe's); ``forward`` is its seed-contract view.

The package, by concern (the forward still written once): ``config`` (``ViTConfig``, its bounds, ``PRESETS``),
``positions`` (position tables, rotary and sine-cosine embeddings), ``layouts`` (what a query attends to and what is
added to its logits: relative position biases, windows), ``hooks`` (hook points and relevance rules), ``blocks``
(norms, attention, the MLP, the pooling probe, the block), ``stages`` (hierarchical models: Swin's shifted windows,
its position biases and patch merging, each layer's grid; its docstring holds the stage design) and
``vision_transformer`` (``ViT``). Every public name is importable from ``vit.model``: ``config``'s at once (it
needs no torch, so a command checks its arguments and lists the presets without loading torch), the others' when
first used.
"""

import importlib

from vit.model.config import (
    ACTIVATIONS,
    CONFIG_BOUNDS,
    MAX_LAYER_SCALE,
    MAX_ROPE_THETA,
    MIMETIC_DEFAULTS,
    NORMS,
    POOL_HEADS,
    POOLINGS,
    POS_RESIZES,
    PREFIX_POSITIONS,
    PRESETS,
    PROJECTORS,
    REL_POS,
    ROPES,
    ViTConfig,
)

# The torch modules' names, each imported from its module when first used (PEP 562), so that reading a
# configuration or PRESETS (the commands' argument checks) does not load torch.
_LAZY = {
    "blocks": (
        "MLP", "MODEL_ATTENTION", "Attention", "AttentionPool", "AttentionVariant", "Block", "LayerNorm",
        "Parent", "Projector", "RMSNorm", "drop_path", "fused_attention", "make_norm",
    ),
    "hooks": (
        "PLAIN_RULES", "Hook", "HookPoint", "Rules", "activate", "checkpointed_blocks", "current_rules",
        "use_rules",
    ),
    "layouts": (
        "RelativePositionBias", "beit_relative_position_index", "decomposed_rel_pos", "padding_bias",
        "sam_rel_pos", "window_partition", "window_unpartition",
    ),
    "positions": (
        "apply_rope", "dinov3_rope", "eva_rope", "resample_pos_embed", "rotate_half", "rotate_pairs",
        "sincos_positions",
    ),
    "stages": (
        "LayerLayout", "PatchMerging", "SwinPositionBias", "SwinV2PositionBias", "covering_token",
        "merge_matrix", "shift_mask", "shift_windows", "unshift_windows", "window_and_shift",
        "window_tokens",
    ),
    "vision_transformer": (
        "Encoding", "ViT", "count_parameters", "mimetic_init_",
    ),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}
_SUBMODULES = frozenset(_LAZY)

def __getattr__(name: str):
    """A torch module's name (or a submodule), imported when first asked for and kept."""
    module = _MODULE_OF.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF) | _SUBMODULES)


__all__ = [
    "ACTIVATIONS", "Attention", "AttentionVariant", "MODEL_ATTENTION",
    "LayerLayout", "PatchMerging", "SwinPositionBias", "SwinV2PositionBias",
    "covering_token", "merge_matrix", "shift_mask", "shift_windows", "unshift_windows", "window_and_shift",
    "window_tokens", "AttentionPool", "Block", "CONFIG_BOUNDS", "Encoding",
    "Hook", "HookPoint", "LayerNorm", "MAX_LAYER_SCALE", "MAX_ROPE_THETA", "MIMETIC_DEFAULTS", "MLP", "NORMS",
    "PLAIN_RULES",
    "POOLINGS", "POOL_HEADS", "POS_RESIZES", "PREFIX_POSITIONS", "PRESETS", "PROJECTORS", "Parent", "Projector",
    "REL_POS", "RMSNorm", "ROPES",
    "RelativePositionBias", "Rules", "ViT", "ViTConfig", "activate", "apply_rope", "beit_relative_position_index",
    "checkpointed_blocks", "count_parameters", "current_rules", "decomposed_rel_pos", "dinov3_rope", "drop_path",
    "eva_rope",
    "fused_attention", "make_norm", "mimetic_init_", "padding_bias", "resample_pos_embed", "rotate_half",
    "rotate_pairs", "sam_rel_pos",
    "sincos_positions", "use_rules", "window_partition", "window_unpartition",
]
