"""BEiT, BEiT v2 and Data2Vec-vision in our ``ViT``: HF ``beit`` / ``data2vec-vision`` folders and timm ``beit*``
weights, without importing either library.

BEiT is a ViT with a CLS token whose attention logits get a learned relative position bias (``ViTConfig.rel_pos``:
``"beit"``, a table per layer, or ``"beit_shared"``, one table all layers add), no key bias (``key_bias=False``),
layer scale, and usually no absolute positions. With mean pooling (the default) the classifier reads the mean of
the patch tokens after a LayerNorm (HF's pooler ``layernorm``, timm's ``fc_norm``) and there is no final norm;
without it, CLS after the final norm. HF's ``mask_token`` (masked image modelling) is dropped by name; the
segmentation heads (``BeitForSemanticSegmentation``) are refused.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from vit.model import ViTConfig
from vit.sources.ports.families.hf import check_number
from vit.sources.ports.families.import_dinov3 import _linear, _Taker, timm_shape

SUPPORTED = ("BEiT / Data2Vec-vision: HF BeitModel, BeitForImageClassification, Data2VecVisionModel, "
             "Data2VecVisionForImageClassification folders and timm beit* / beitv2* weights")
ARCHITECTURES = {"BeitModel": False, "BeitForImageClassification": True, "Data2VecVisionModel": False,
                 "Data2VecVisionForImageClassification": True}
HF_BASES = ("beit.", "data2vec_vision.", "")
# Where each piece of an HF layer lives: the Hub's (and save_pretrained's) names first, then transformers 5's in
# memory.
_HF_NAMES = {"q": ("attention.attention.query", "attention.q_proj"),
             "k": ("attention.attention.key", "attention.k_proj"),
             "v": ("attention.attention.value", "attention.v_proj"),
             "attn.proj": ("attention.output.dense", "attention.o_proj"),
             "mlp.fc1": ("intermediate.dense", "mlp.fc1"), "mlp.fc2": ("output.dense", "mlp.fc2"),
             "norm1": ("layernorm_before",), "norm2": ("layernorm_after",),
             "table": ("attention.attention.relative_position_bias.relative_position_bias_table",
                       "relative_position_bias.relative_position_bias_table")}
_SHARED_TABLE = ("encoder.relative_position_bias.relative_position_bias_table",
                 "shared_position_bias.relative_position_bias_table")
MODEL_ARGS_HONOURED = {"img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depth",
                       "num_heads", "mlp_ratio", "qkv_bias", "init_values", "use_abs_pos_emb", "use_rel_pos_bias",
                       "use_shared_rel_pos_bias", "use_fc_norm"}
MODEL_ARGS_INERT = {"drop_rate", "pos_drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate",
                    "head_init_scale"}


def is_beit_name(name: str) -> bool:
    return name.startswith(("beit_", "beitv2_"))


def _side(value, name: str) -> int:
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(f"BEiT {name} {value!r} is not square; this model needs square images and patches")
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"BEiT {name} must be a whole number, got {str(value)[:40]}")
    return value


def _image_size(value) -> int | tuple[int, int]:
    """HF's ``image_size``: a side, or (height, width), which its relative position tables follow."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return _side(value[0], "image_size"), _side(value[1], "image_size")
    return _side(value, "image_size")


def config_from_hf(config_json: Mapping) -> ViTConfig:
    """Our config for an HF ``beit`` / ``data2vec-vision`` config.json."""
    architecture = (config_json.get("architectures") or ["BeitModel"])[0]
    if architecture not in ARCHITECTURES:
        raise ValueError(f"HF architecture {architecture} is not supported; supported: {', '.join(ARCHITECTURES)}")
    if config_json.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"HF BEiT config uses activation {config_json.get('hidden_act')!r}; this model reads "
                         "exact GELU only here")
    per_layer = bool(config_json.get("use_relative_position_bias", False))
    shared = bool(config_json.get("use_shared_relative_position_bias", False))
    if per_layer and shared:
        raise ValueError("HF BEiT config has both a shared and per-layer relative position bias; not supported")
    scale = config_json.get("layer_scale_init_value", 0.1)
    check_number(scale, "layer_scale_init_value", -1e3, 1e3)
    mean_pooling = bool(config_json.get("use_mean_pooling", True))
    labels = config_json.get("id2label")
    classes = (len(labels) if isinstance(labels, Mapping) and labels else config_json.get("num_labels", 2)) \
        if ARCHITECTURES[architecture] else 0
    # Data2VecVisionModel has no pooler: with mean pooling its output is the last block's, un-normalised.
    pooler = mean_pooling and (ARCHITECTURES[architecture] or config_json.get("model_type") == "beit")
    return ViTConfig(
        image_size=_image_size(config_json.get("image_size", 224)),
        patch_size=_side(config_json.get("patch_size", 16), "patch_size"),
        num_channels=config_json.get("num_channels", 3), num_classes=classes,
        hidden_size=config_json.get("hidden_size", 768), num_layers=config_json.get("num_hidden_layers", 12),
        num_heads=config_json.get("num_attention_heads", 12), mlp_size=config_json.get("intermediate_size", 3072),
        attention_dropout=float(config_json.get("attention_probs_dropout_prob", 0.0)),
        layer_norm_eps=config_json.get("layer_norm_eps", 1e-12), key_bias=False,
        layer_scale=float(scale) if scale > 0 else None,
        pos_embed=bool(config_json.get("use_absolute_position_embeddings", False)),
        rel_pos="beit" if per_layer else "beit_shared" if shared else "none",
        pooling="avg" if mean_pooling else "cls", fc_norm=pooler, final_norm=not mean_pooling)


def state_dict_from_hf(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from an HF BEiT / Data2Vec-vision one; ValueError on any key it cannot place."""
    take = _Taker(state, "HF BEiT state dict")
    base = next((b for b in HF_BASES if f"{b}embeddings.cls_token" in state), None)
    if base is None:
        raise ValueError("HF BEiT state dict has no 'embeddings.cls_token'")
    emb = f"{base}embeddings"
    take.skip(f"{emb}.mask_token")
    ours = {"cls_token": take(f"{emb}.cls_token"), **_linear(take, "patch_embed", f"{emb}.patch_embeddings.projection")}
    if config.pos_embed:
        ours["pos_embed"] = take(f"{emb}.position_embeddings")
    if config.final_norm:
        ours.update(_linear(take, "norm", f"{base}layernorm"))
    if config.fc_norm:
        ours.update(_linear(take, "fc_norm", f"{base}pooler.layernorm"))
    if config.num_classes:
        ours.update(_linear(take, "head", "classifier"))
    if config.rel_pos == "beit_shared":
        ours["rel_pos_bias.table"] = take(next((f"{base}{n}" for n in _SHARED_TABLE if f"{base}{n}" in state),
                                               f"{base}{_SHARED_TABLE[0]}"))
    layers = f"{base}encoder.layer" if any(k.startswith(f"{base}encoder.layer.") for k in state) else f"{base}layers"
    for i in range(config.num_layers):
        layer, b = f"{layers}.{i}", f"blocks.{i}"

        def name(piece: str, layer: str = layer) -> str:
            candidates = [f"{layer}.{n}" for n in _HF_NAMES[piece]]
            return next((c for c in candidates if f"{c}.weight" in state or c in state), candidates[0])

        q, k, v = take(f"{name('q')}.weight"), take(f"{name('k')}.weight"), take(f"{name('v')}.weight")
        ours[f"{b}.attn.qkv.weight"] = torch.cat([q, k, v])
        q_bias, v_bias = take(f"{name('q')}.bias"), take(f"{name('v')}.bias")
        ours[f"{b}.attn.qkv.bias"] = torch.cat([q_bias, torch.zeros_like(q_bias), v_bias])
        for piece in ("attn.proj", "mlp.fc1", "mlp.fc2", "norm1", "norm2"):
            ours.update(_linear(take, f"{b}.{piece}", name(piece)))
        if config.layer_scale is not None:
            ours[f"{b}.ls1"], ours[f"{b}.ls2"] = take(f"{layer}.lambda_1"), take(f"{layer}.lambda_2")
        if config.rel_pos == "beit":
            ours[f"{b}.attn.rel_pos_bias.table"] = take(name("table"))
    take.check_all_used()
    return ours


def config_from_timm(name: str, state: Mapping[str, torch.Tensor], model_args: Mapping | None = None) -> ViTConfig:
    """Our config for timm's ``beit*`` weights; ``model_args`` are timm's overrides from its config.json."""
    args = dict(model_args or {})
    for key in args:
        if key not in MODEL_ARGS_HONOURED | MODEL_ARGS_INERT:
            raise ValueError(f"timm model_args.{key} of {name} is not supported by this program's BEiT")
    if "blocks.0.mlp.norm.weight" in state or "blocks.0.mlp.fc1_g.weight" in state:
        raise ValueError(f"timm {name}: BEiT's scale_mlp / SwiGLU MLPs are not supported")
    width, channels, patch, depth = timm_shape(name, state)
    heads = args.get("num_heads") or {768: 12, 1024: 16}.get(width)
    if not heads:
        raise ValueError(f"cannot tell the number of heads of {name} (width {width}); give model_args.num_heads")
    shared = "rel_pos_bias.relative_position_bias_table" in state
    per_layer = "blocks.0.attn.relative_position_bias_table" in state
    if shared and per_layer:
        raise ValueError(f"timm {name}: a shared and a per-layer relative position bias together are not supported")
    table = state["rel_pos_bias.relative_position_bias_table" if shared
                  else "blocks.0.attn.relative_position_bias_table"] if shared or per_layer else None
    grid = _timm_grid(name, args.get("img_size"), patch, table, state.get("pos_embed"))
    pool = args.get("global_pool", "avg")
    if pool not in ("avg", "token"):
        raise ValueError(f"timm global_pool {pool!r} of {name} is not supported; supported: avg, token")
    return ViTConfig(
        image_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, num_channels=channels,
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0, hidden_size=width,
        num_layers=depth, num_heads=int(heads), mlp_size=state["blocks.0.mlp.fc1.weight"].shape[0],
        qkv_bias="blocks.0.attn.q_bias" in state, key_bias=False, layer_norm_eps=1e-6,
        layer_scale=float(args.get("init_values") or 0.1) if "blocks.0.gamma_1" in state else None,
        pos_embed="pos_embed" in state, rel_pos="beit" if per_layer else "beit_shared" if shared else "none",
        rel_pos_resize="timm", pos_embed_antialias=True, pooling="avg" if pool == "avg" else "cls",
        fc_norm="fc_norm.weight" in state, final_norm="norm.weight" in state)


def _timm_grid(name: str, img_size, patch: int, table: torch.Tensor | None, pos_embed: torch.Tensor | None
               ) -> tuple[int, int]:
    """The patch grid timm built ``name`` for: its ``img_size`` (an int or timm's (height, width)) when given, else
    the square its relative position table (``(2gh-1)(2gw-1) + 3`` rows) or position table fixes; ValueError when the
    tables do not fit that grid."""
    if img_size is not None:
        sides = img_size if isinstance(img_size, (list, tuple)) else (img_size, img_size)
        if len(sides) != 2:
            raise ValueError(f"timm {name}: img_size {str(img_size)[:40]} is neither a side nor (height, width)")
        gh, gw = (_side(v, "img_size") // patch for v in sides)
    elif table is not None:
        gh = gw = (int(round((table.shape[0] - 3) ** 0.5)) + 1) // 2
    elif pos_embed is not None:
        gh = gw = int(round((pos_embed.shape[1] - 1) ** 0.5))
    else:
        gh = gw = 224 // patch
    if table is not None and (2 * gh - 1) * (2 * gw - 1) + 3 != table.shape[0]:
        raise ValueError(f"timm {name}: a relative position table of {table.shape[0]} rows is not a {gh} x {gw} "
                         "grid's; give model_args.img_size as timm built it, (height, width)")
    if pos_embed is not None and pos_embed.shape[1] != 1 + gh * gw:
        raise ValueError(f"timm {name}: a position table of {pos_embed.shape[1]} entries is not 1 + a {gh} x {gw} "
                         "grid's; give model_args.img_size as timm built it, (height, width)")
    return gh, gw


def state_dict_from_timm(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from timm's BEiT one; ValueError on any key it cannot place."""
    take = _Taker(state, "timm BEiT state dict")
    ours = {"cls_token": take("cls_token"), **_linear(take, "patch_embed", "patch_embed.proj")}
    if config.pos_embed:
        ours["pos_embed"] = take("pos_embed")
    for piece in ("norm", "fc_norm", "head"):
        if f"{piece}.weight" in state:
            ours.update(_linear(take, piece, piece))
    if config.rel_pos == "beit_shared":
        ours["rel_pos_bias.table"] = take("rel_pos_bias.relative_position_bias_table")
    for i in range(config.num_layers):
        b = f"blocks.{i}"
        ours[f"{b}.attn.qkv.weight"] = take(f"{b}.attn.qkv.weight")
        if config.qkv_bias:
            q_bias, v_bias = take(f"{b}.attn.q_bias"), take(f"{b}.attn.v_bias")
            ours[f"{b}.attn.qkv.bias"] = torch.cat([q_bias, torch.zeros_like(q_bias), v_bias])
        for piece in ("attn.proj", "norm1", "norm2", "mlp.fc1", "mlp.fc2"):
            ours.update(_linear(take, f"{b}.{piece}", f"{b}.{piece}"))
        if config.layer_scale is not None:
            ours[f"{b}.ls1"], ours[f"{b}.ls2"] = take(f"{b}.gamma_1"), take(f"{b}.gamma_2")
        if config.rel_pos == "beit":
            ours[f"{b}.attn.rel_pos_bias.table"] = take(f"{b}.attn.relative_position_bias_table")
    take.check_all_used()
    return ours
