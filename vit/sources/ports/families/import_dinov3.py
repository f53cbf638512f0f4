"""DINOv3 (Siméoni et al. 2025) in our ``ViT``: HF ``DINOv3ViTModel`` folders, timm ``vit_*_dinov3*`` weights and
the original ``facebookresearch/dinov3`` backbones, without importing any of those libraries.

DINOv3 is a ViT with a CLS token, 4 storage (register) tokens and no position table: axial
rotary embeddings on the patch tokens' queries and keys (``ViTConfig.rope="dinov3"``),
layer scale, and a qkv bias whose key third is held at zero (``bias_mask`` in the original,
``key_bias=False`` in HF, a zero ``k_bias`` buffer in timm: our ``key_bias=False``). The large
models use a SwiGLU MLP. The three layouts name the same tensors differently:

==================  ===========================  ==========================  ===============================
ours                HF (``DINOv3ViTModel``)      timm (``Eva``)              original
==================  ===========================  ==========================  ===============================
reg_token           embeddings.register_tokens   reg_token                   storage_tokens
blocks.i.attn.qkv   layer.i.attention.{q,k,v}    attn.qkv + q_bias, v_bias   attn.qkv (+ bias_mask)
blocks.i.ls1        layer.i.layer_scale1.lambda1 blocks.i.gamma_1            blocks.i.ls1.gamma
mlp.fc1_g/fc1/fc2   mlp.gate/up/down_proj        mlp.fc1_g/fc1_x/fc2         mlp.w1/w2/w3
==================  ===========================  ==========================  ===============================

The rotary periods are recomputed in float32 from ``rope_theta`` as HF and timm do; the
original checkpoints store them (``rope_embed.periods``, bfloat16 in Meta's release), which
are checked to follow that schedule and otherwise refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import torch

from vit.model import ViTConfig
from vit.sources.ports.families.hf import check_number

SUPPORTED = ("DINOv3: HF DINOv3ViTModel folders, timm vit_*_patch16_dinov3* weights, original facebookresearch/dinov3 "
             "backbones (.pth)")
# The original architectures by name (dinov3/hub/backbones.py): width, heads.
ORIGINAL_ARCHS = {"vits16": (384, 6), "vits16plus": (384, 6), "vitb16": (768, 12), "vitl16": (1024, 16),
                  "vith16plus": (1280, 20), "vit7b16": (4096, 32)}
HEADS_BY_WIDTH = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 20, 4096: 32}
_ACTIVATIONS = {"gelu": "gelu", "silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_new": "gelu_tanh", "quick_gelu": "quick_gelu"}

# HF DINOv3ViTConfig fields: what each does to the forward pass of an image.
HF_HONOURED = {"patch_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "hidden_act", "attention_dropout", "layer_norm_eps", "rope_theta", "image_size", "num_channels",
               "query_bias", "key_bias", "value_bias", "proj_bias", "mlp_bias", "layerscale_value",
               "use_gated_mlp", "num_register_tokens"}
HF_INERT = {"initializer_range", "drop_path_rate",  # initialisation; stochastic depth is off in eval
            "pos_embed_shift", "pos_embed_jitter", "pos_embed_rescale",  # RoPE augmentation, training mode only
            "apply_layernorm", "reshape_hidden_states", "out_features", "out_indices", "stage_names",
            "_out_features", "_out_indices", "return_class_token"}  # DINOv3ViTBackbone's outputs, not the model's

def timm_shape(name: str, state: Mapping[str, torch.Tensor]) -> tuple[int, int, int, int]:
    """``(width, channels, patch, depth)`` of timm ViT weights (``patch_embed.proj``, ``blocks.N``), which every
    timm family's importer reads the same way; ValueError for non-square patches."""
    width, channels, patch, patch_w = state["patch_embed.proj.weight"].shape
    if patch != patch_w:
        raise ValueError(f"timm weights of {name} have non-square {patch}x{patch_w} patches")
    depth = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"^blocks\.(\d+)\.", k)))
    return width, channels, patch, depth



def _get(config: Mapping, name: str, default=None):
    return config.get(name, default) if isinstance(config, Mapping) else getattr(config, name, default)


def _square(value, name: str) -> int:
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(f"DINOv3 config {name} {value!r} is not square; this model needs square patches")
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"DINOv3 config {name} must be a whole number, got {value!r}")
    return value


def activation(name) -> str:
    """Our activation for an HF ``hidden_act`` name; ValueError for one we do not have."""
    if name not in _ACTIVATIONS:
        raise ValueError(f"activation {name!r} is not supported; supported: {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


def config_from_hf(hf_config: Mapping) -> ViTConfig:
    """Our config for an HF ``DINOv3ViTConfig`` (object or config.json dict): a feature model pooling CLS."""
    get = lambda name, default=None: _get(hf_config, name, default)  # noqa: E731
    _check_rope_numbers({name: get(name) for name in ("pos_embed_shift", "pos_embed_jitter", "pos_embed_rescale")})
    check_number(get("rope_theta", 100.0), "rope_theta", 1e-6, 1e9)
    check_number(get("layerscale_value", 1.0), "layerscale_value", 0, 1e3)
    image = _square(get("image_size", 224), "image_size")
    patch = _square(get("patch_size", 16), "patch_size")
    q, k, v = (bool(get(f"{n}_bias", d)) for n, d in (("query", True), ("key", False), ("value", True)))
    return ViTConfig(
        image_size=image - image % patch or patch, patch_size=patch, num_channels=get("num_channels", 3),
        num_classes=0, hidden_size=get("hidden_size"), num_layers=get("num_hidden_layers"),
        num_heads=get("num_attention_heads"), mlp_size=get("intermediate_size"),
        attention_dropout=float(get("attention_dropout", 0.0)), qkv_bias=q or k or v, key_bias=k,
        layer_norm_eps=get("layer_norm_eps", 1e-5), num_register_tokens=get("num_register_tokens", 0),
        layer_scale=float(get("layerscale_value", 1.0)), pooling="cls", pos_embed=False, rope="dinov3",
        rope_theta=float(get("rope_theta", 100.0)), activation=activation(get("hidden_act", "gelu")),
        gated_mlp=bool(get("use_gated_mlp", False)))


def _check_rope_numbers(values: Mapping[str, object]) -> None:
    """RoPE's training-time augmentation (shift, jitter, rescale of the coordinates): inert in eval, but null or a
    finite number in [0, 100] (DINOv3 trains with null, null and 2), never NaN or 1e308."""
    for name, value in values.items():
        if value is not None:
            check_number(value, name, 0, 100)


def _zeros_for(weight: torch.Tensor) -> torch.Tensor:
    return torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)


class _Taker:
    """Reads keys from a state dict and remembers which; ``leftover`` names what was never read."""

    def __init__(self, state: Mapping[str, torch.Tensor], what: str) -> None:
        self.state, self.used, self.what = dict(state), set(), what

    def __call__(self, key: str) -> torch.Tensor:
        if key not in self.state:
            raise ValueError(f"{self.what} lacks {key!r}")
        self.used.add(key)
        return self.state[key]

    def get(self, key: str) -> torch.Tensor | None:
        return self(key) if key in self.state else None

    def skip(self, *keys: str) -> None:
        self.used.update(keys)

    def check_all_used(self) -> None:
        unused = sorted(set(self.state) - self.used)
        if unused:
            shown = ", ".join(unused[:5]) + (" ..." if len(unused) > 5 else "")
            raise ValueError(f"{self.what} has {len(unused)} key(s) this model has no place for: {shown}")


def _linear(take: _Taker, ours: str, theirs: str) -> dict[str, torch.Tensor]:
    """``ours.weight`` and ``ours.bias`` from ``theirs``, a zero bias where theirs has none (same function)."""
    weight = take(f"{theirs}.weight")
    bias = take.get(f"{theirs}.bias")
    return {f"{ours}.weight": weight, f"{ours}.bias": bias if bias is not None else _zeros_for(weight)}


def joined(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts)`` (along rows), or without a copy the one buffer ``parts`` already fill in order: the
    reader's q, k and v (``vit.sources.weights_files.joined_slots``), consecutive views of one tensor's rows."""
    base = parts[0]._base
    follows = all(a.storage_offset() + a.numel() == b.storage_offset() for a, b in zip(parts, parts[1:], strict=False))
    if base is not None and base.is_contiguous() and all(p._base is base and p.is_contiguous() for p in parts) \
            and parts[0].storage_offset() == base.storage_offset() and follows \
            and sum(p.shape[0] for p in parts) == base.shape[0]:
        return base
    return torch.cat(list(parts))


def _qkv(weights: list[torch.Tensor], biases: list[torch.Tensor | None], config: ViTConfig) -> dict:
    out = {"weight": torch.cat(weights, dim=0)}
    if config.qkv_bias:
        out["bias"] = torch.cat([b if b is not None else _zeros_for(w) for w, b in zip(weights, biases, strict=True)])
    return out


def state_dict_from_hf(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from an HF ``DINOv3ViTModel`` one; ValueError on any key it cannot place."""
    take = _Taker(state, "HF DINOv3 state dict")
    ours = {"cls_token": take("embeddings.cls_token"), **_linear(take, "patch_embed", "embeddings.patch_embeddings"),
            **_linear(take, "norm", "norm")}
    take.skip("embeddings.mask_token")  # masked pre-training only
    registers = take("embeddings.register_tokens")
    if config.num_register_tokens:
        ours["reg_token"] = registers
    layers = "model.layer" if any(k.startswith("model.layer.") for k in state) else "layer"  # in memory / on disk
    for i in range(config.num_layers):
        layer, block = f"{layers}.{i}", f"blocks.{i}"
        names = [f"{layer}.attention.{n}_proj" for n in "qkv"]
        qkv = _qkv([take(f"{n}.weight") for n in names], [take.get(f"{n}.bias") for n in names], config)
        ours.update({f"{block}.attn.qkv.{k}": v for k, v in qkv.items()})
        ours.update(_linear(take, f"{block}.attn.proj", f"{layer}.attention.o_proj"))
        for piece in ("norm1", "norm2"):
            ours.update(_linear(take, f"{block}.{piece}", f"{layer}.{piece}"))
        ours[f"{block}.ls1"] = take(f"{layer}.layer_scale1.lambda1")
        ours[f"{block}.ls2"] = take(f"{layer}.layer_scale2.lambda1")
        ours.update(_linear(take, f"{block}.mlp.fc1", f"{layer}.mlp.up_proj"))
        ours.update(_linear(take, f"{block}.mlp.fc2", f"{layer}.mlp.down_proj"))
        if config.gated_mlp:
            ours.update(_linear(take, f"{block}.mlp.fc1_g", f"{layer}.mlp.gate_proj"))
    take.check_all_used()
    return ours


# -- timm (Eva) -------------------------------------------------------------------------------------------------------

def is_timm_state_dict(state: Mapping[str, torch.Tensor]) -> bool:
    """timm's DINOv3 port: Eva's layer-scale names and no position table."""
    return "blocks.0.gamma_1" in state and "pos_embed" not in state and "patch_embed.proj.weight" in state


TIMM_HONOURED = {"global_pool", "num_heads", "embed_dim", "depth", "qkv_bias", "mlp_ratio", "swiglu_mlp",
                 "scale_mlp", "init_values", "num_reg_tokens", "use_fc_norm", "patch_size", "img_size",
                 "in_chans", "num_classes", "rope_temperature", "rope_type", "use_rot_pos_emb", "use_abs_pos_emb",
                 "rope_rotate_half", "dynamic_img_size", "norm_layer"}
TIMM_INERT = {"drop_rate", "pos_drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate", "head_init_scale",
              "rope_shift_coords", "rope_jitter_coords", "rope_rescale_coords", "patch_drop_rate"}
# model_args that must keep the value DINOv3 has, since our model has no other.
TIMM_FIXED = {"class_token": True, "qkv_fused": True, "qk_norm": False, "scale_attn_inner": False,
              "attn_type": "eva", "use_post_norm": False, "use_pre_transformer_norm": False, "no_embed_class": False,
              "rope_grid_offset": 0.0, "rope_grid_indexing": "ij", "num_kv_heads": None, "gated_attn": False,
              "attn_only_layer_scale": False, "dynamic_img_pad": False, "swiglu_align_to": 0}


def config_from_timm(name: str, state: Mapping[str, torch.Tensor], model_args: Mapping | None = None) -> ViTConfig:
    """Our config for timm's ``vit_*_dinov3*`` weights; timm's default pooling is the mean of the patches after the
    final norm (upstream DINOv3 reads CLS: pass ``global_pool='token'`` in model_args for that)."""
    args = dict(model_args or {})
    for key, value in args.items():
        if key in TIMM_FIXED and value != TIMM_FIXED[key]:
            raise ValueError(f"timm model_args.{key}={value!r} of {name} is not supported (DINOv3 has "
                             f"{TIMM_FIXED[key]!r})")
        if key not in TIMM_HONOURED | TIMM_INERT | set(TIMM_FIXED):
            raise ValueError(f"timm model_args.{key} of {name} is not supported by this program's DINOv3")
    _check_rope_numbers({f"model_args.{name}": args.get(name)
                         for name in ("rope_shift_coords", "rope_jitter_coords", "rope_rescale_coords")})
    check_number(args.get("rope_temperature", 100.0), "model_args.rope_temperature", 1e-6, 1e9)
    if args.get("rope_type", "dinov3") != "dinov3" or args.get("rope_rotate_half", True) is not True \
            or args.get("use_abs_pos_emb", False) or args.get("use_rot_pos_emb", True) is not True:
        raise ValueError(f"timm {name}: only DINOv3's rotary embedding (rope_type='dinov3', rotate_half) is supported")
    if "norm_layer" in args:
        raise ValueError(f"timm model_args.norm_layer of {name} cannot be read from a config; DINOv3 uses "
                         "LayerNorm(eps=1e-5)")
    width, channels, patch, depth = timm_shape(name, state)
    heads = args.get("num_heads") or HEADS_BY_WIDTH.get(width)
    if not heads:
        raise ValueError(f"cannot tell the number of heads of {name} (width {width}); give model_args.num_heads")
    gated = "blocks.0.mlp.fc1_g.weight" in state
    mlp_size = state["blocks.0.mlp.fc1_x.weight" if gated else "blocks.0.mlp.fc1.weight"].shape[0]
    if "blocks.0.mlp.fc1.weight" in state and gated is False and args.get("swiglu_mlp"):
        raise ValueError(f"timm {name}: packed SwiGLU weights (swiglu_mlp without scale_mlp) are not supported")
    pool = args.get("global_pool", "avg")
    if pool not in ("avg", "token"):
        raise ValueError(f"timm global_pool {pool!r} of {name} is not supported; supported: avg, token")
    fc_norm = "fc_norm.weight" in state
    img = args.get("img_size") or 256
    img = img[0] if isinstance(img, (list, tuple)) else int(img)
    return ViTConfig(
        image_size=img - img % patch or patch, patch_size=patch, num_channels=channels,
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0,
        hidden_size=width, num_layers=depth, num_heads=int(heads), mlp_size=mlp_size,
        qkv_bias="blocks.0.attn.q_bias" in state, key_bias=False, layer_norm_eps=1e-5,
        num_register_tokens=state["reg_token"].shape[1] if "reg_token" in state else 0,
        layer_scale=float(args.get("init_values") or 1e-5), pooling="cls" if pool == "token" else "avg",
        fc_norm=fc_norm, pos_embed=False, rope="dinov3", rope_theta=float(args.get("rope_temperature", 100.0)),
        activation="silu" if gated else "gelu", gated_mlp=gated, mlp_norm="blocks.0.mlp.norm.weight" in state)


def state_dict_from_timm(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from timm's DINOv3 (Eva) one; ValueError on any key it cannot place."""
    take = _Taker(state, "timm DINOv3 state dict")
    ours = {"cls_token": take("cls_token"), **_linear(take, "patch_embed", "patch_embed.proj")}
    if config.num_register_tokens:
        ours["reg_token"] = take("reg_token")
    for norm in ("norm", "fc_norm"):
        if f"{norm}.weight" in state:
            ours.update(_linear(take, norm, norm))
    if "head.weight" in state:
        ours.update(_linear(take, "head", "head"))
    for i in range(config.num_layers):
        b = f"blocks.{i}"
        weight = take(f"{b}.attn.qkv.weight")
        ours[f"{b}.attn.qkv.weight"] = weight
        if config.qkv_bias:
            q_bias = take(f"{b}.attn.q_bias")
            ours[f"{b}.attn.qkv.bias"] = torch.cat([q_bias, torch.zeros_like(q_bias), take(f"{b}.attn.v_bias")])
        ours.update(_linear(take, f"{b}.attn.proj", f"{b}.attn.proj"))
        ours[f"{b}.ls1"], ours[f"{b}.ls2"] = take(f"{b}.gamma_1"), take(f"{b}.gamma_2")
        for piece in ("norm1", "norm2", "mlp.fc2"):
            ours.update(_linear(take, f"{b}.{piece}", f"{b}.{piece}"))
        if config.gated_mlp:
            ours.update(_linear(take, f"{b}.mlp.fc1_g", f"{b}.mlp.fc1_g"))
            ours.update(_linear(take, f"{b}.mlp.fc1", f"{b}.mlp.fc1_x"))
        else:
            ours.update(_linear(take, f"{b}.mlp.fc1", f"{b}.mlp.fc1"))
        if config.mlp_norm:
            ours.update(_linear(take, f"{b}.mlp.norm", f"{b}.mlp.norm"))
    take.check_all_used()
    return ours


# -- the original facebookresearch/dinov3 layout ----------------------------------------------------------------------

def is_original_state_dict(state: Mapping[str, torch.Tensor]) -> bool:
    """The original backbones: ``storage_tokens`` and ``rope_embed.periods``."""
    return "storage_tokens" in state and "rope_embed.periods" in state


def config_from_original(state: Mapping[str, torch.Tensor], name: str | None = None) -> ViTConfig:
    """Our config for an original DINOv3 backbone; ``name`` (``vitl16``, ...) is optional: the head size comes from
    the stored rotary periods (one per quarter of a head's channels)."""
    if "cls_norm.weight" in state:
        raise ValueError("DINOv3 backbone with untied CLS and patch norms (cls_norm) is not supported")
    width, channels, patch, patch_w = state["patch_embed.proj.weight"].shape
    if patch != patch_w:
        raise ValueError(f"DINOv3 weights have non-square {patch}x{patch_w} patches")
    periods = state["rope_embed.periods"].float()
    head_dim = 4 * periods.numel()
    if name is not None:
        if name not in ORIGINAL_ARCHS:
            raise ValueError(f"unknown DINOv3 architecture {name!r}; known: {', '.join(ORIGINAL_ARCHS)}")
        if ORIGINAL_ARCHS[name][0] != width:
            raise ValueError(f"DINOv3 {name} has width {ORIGINAL_ARCHS[name][0]}, these weights {width}")
    if width % head_dim:
        raise ValueError(f"DINOv3 rotary periods ({periods.numel()}) do not fit the width {width}")
    # Shapes only (vit.sources.open checks names and shapes from the headers first): the values are checked when read.
    theta = float(periods[1]) ** (head_dim / 4) if periods.numel() > 1 and not periods.is_meta else 100.0
    expected = theta ** (4 * torch.arange(periods.numel(), dtype=torch.float32) / head_dim)
    if not periods.is_meta and not torch.allclose(periods, expected, rtol=1e-2):  # Meta stores them in bfloat16
        raise ValueError("DINOv3 rotary periods do not follow a base-period schedule (min/max periods are not "
                         "supported)")
    theta = 100.0 if math.isclose(theta, 100.0, rel_tol=1e-2) else theta
    mask = state.get("blocks.0.attn.qkv.bias_mask")
    if mask is not None and not mask.is_meta:
        d = mask.numel() // 3
        if not (torch.all(mask[:d] == 1) and torch.all(mask[d:2 * d] == 0) and torch.all(mask[2 * d:] == 1)):
            raise ValueError("DINOv3 qkv.bias_mask is not the key-only mask this model has")
    depth = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"^blocks\.(\d+)\.", k)))
    gated = "blocks.0.mlp.w1.weight" in state
    return ViTConfig(
        image_size=224 - 224 % patch, patch_size=patch, num_channels=channels, num_classes=0, hidden_size=width,
        num_layers=depth, num_heads=width // head_dim,
        mlp_size=state["blocks.0.mlp.w2.weight" if gated else "blocks.0.mlp.fc1.weight"].shape[0],
        qkv_bias="blocks.0.attn.qkv.bias" in state, key_bias="blocks.0.attn.qkv.bias" not in state or mask is None,
        layer_norm_eps=1e-5, num_register_tokens=state["storage_tokens"].shape[1],
        layer_scale=1e-5 if "blocks.0.ls1.gamma" in state else None, pooling="cls", pos_embed=False,
        rope="dinov3", rope_theta=theta, activation="silu" if gated else "gelu", gated_mlp=gated)


def state_dict_from_original(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from an original DINOv3 backbone's; the pre-training-only pieces (``mask_token``, the 7B's
    ``local_cls_norm``) and the stored rotary periods (recomputed) are dropped by name."""
    take = _Taker(state, "DINOv3 backbone state dict")
    ours = {"cls_token": take("cls_token"), **_linear(take, "patch_embed", "patch_embed.proj"),
            **_linear(take, "norm", "norm")}
    if config.num_register_tokens:
        ours["reg_token"] = take("storage_tokens")
    else:
        take.skip("storage_tokens")
    take.skip("mask_token", "rope_embed.periods", "local_cls_norm.weight", "local_cls_norm.bias")
    for i in range(config.num_layers):
        b = f"blocks.{i}"
        ours[f"{b}.attn.qkv.weight"] = take(f"{b}.attn.qkv.weight")
        if config.qkv_bias:
            ours[f"{b}.attn.qkv.bias"] = take(f"{b}.attn.qkv.bias")
        take.skip(f"{b}.attn.qkv.bias_mask")
        ours.update(_linear(take, f"{b}.attn.proj", f"{b}.attn.proj"))
        if config.layer_scale is not None:
            ours[f"{b}.ls1"], ours[f"{b}.ls2"] = take(f"{b}.ls1.gamma"), take(f"{b}.ls2.gamma")
        for piece in ("norm1", "norm2"):
            ours.update(_linear(take, f"{b}.{piece}", f"{b}.{piece}"))
        if config.gated_mlp:
            for mine, theirs in (("fc1_g", "w1"), ("fc1", "w2"), ("fc2", "w3")):
                ours.update(_linear(take, f"{b}.mlp.{mine}", f"{b}.mlp.{theirs}"))
        else:
            for piece in ("fc1", "fc2"):
                ours.update(_linear(take, f"{b}.mlp.{piece}", f"{b}.mlp.{piece}"))
    take.check_all_used()
    return ours
