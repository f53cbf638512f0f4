"""timm ``VisionTransformer`` / ``VisionTransformerDistilled`` weights in our ``ViT``.

timm's key names are nearly ours (``blocks.{i}.attn.qkv`` is already fused, q then k then v),
so the mapping renames the patch embedding and the layer-scale gains (``ls1.gamma``) and
checks every key. The config is read from the weights (width, depth, MLP size, qkv bias,
register / distillation tokens, layer scale, ``fc_norm``, the position table's length), from
timm's ``config.json`` ``model_args``, and for what neither says -- what timm's model function
fixes inside itself, such as the SigLIP 2 ports' ``act_layer='gelu_tanh'`` or the CLIP towers'
LayerNorm eps -- from timm's own registry: the named model is built on the meta device (no
memory, no download) and its first block read (``registry_facts``); a name timm does not know, or
a block this model cannot express, is refused. Supported: ``vit_*`` with a class token (optional
``reg_token``, ``no_embed_class``, layer scale, ``fc_norm`` / average pooling, with or without
qkv bias), ``deit_*`` including the distilled ones, and the DINOv2 ports (``vit_*_dinov2``,
``vit_*_reg4_dinov2``), the SigLIP towers (``vit_*_siglip_*``: no class token, ``global_pool='map'``,
``attn_pool.{latent,q,kv,proj,norm,mlp}``), the CLIP towers (``vit_*_clip_*``: ``norm_pre``, LayerNorm eps
1e-5, QuickGELU for ``*_quickgelu_*``) and MAE encoders (``vit_*.mae``). Positions are resampled as timm
does (bicubic, ``antialias=True``).

Every ``model_args`` key of timm's ``VisionTransformer`` is either honoured (``MODEL_ARGS_HONOURED``),
without effect on an eval forward (``MODEL_ARGS_INERT``), or must keep timm's default
(``MODEL_ARGS_FIXED``); anything else is refused with one line rather than silently ignored.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from vit.checkpoint import IMAGENET_MEAN, IMAGENET_STD, Preprocessing
from vit.model import CONFIG_BOUNDS, ViTConfig

SUPPORTED = "timm vit_* (reg_token, no_embed_class, layer scale, fc_norm/avg/map pooling), deit_* " \
            "(also distilled), the DINOv2 ports vit_*_dinov2 / vit_*_reg4_dinov2, vit_*_siglip_*, vit_*_clip_*, *.mae"
INCEPTION_MEAN = INCEPTION_STD = (0.5, 0.5, 0.5)
_OURS_BY_TIMM = {"patch_embed.proj.weight": "patch_embed.weight", "patch_embed.proj.bias": "patch_embed.bias"}
_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.(.+)$")
_BLOCK_PARTS = {"norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                "attn.proj.bias", "norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias",
                "mlp.fc2.weight", "mlp.fc2.bias", "ls1.gamma", "ls2.gamma"}
_TOP_KEYS = {"cls_token", "dist_token", "reg_token", "pos_embed", "norm.weight", "norm.bias", "fc_norm.weight",
             "fc_norm.bias", "head.weight", "head.bias", "head_dist.weight", "head_dist.bias", "norm_pre.weight",
             "norm_pre.bias", "attn_pool.latent"}
_TOP_KEYS |= {f"attn_pool.{m}.{p}" for m in ("q", "kv", "proj", "norm", "mlp.fc1", "mlp.fc2")
              for p in ("weight", "bias")}
_ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu", "silu", "swish")  # the act_layer names model_args may give
# timm VisionTransformer.__init__ arguments as a config.json's model_args may carry them.
MODEL_ARGS_HONOURED = {"img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depth",
                       "num_heads", "mlp_ratio", "qkv_bias", "init_values", "class_token", "no_embed_class",
                       "reg_tokens", "pre_norm", "fc_norm", "dynamic_img_size", "act_layer", "pos_embed",
                       "pool_include_prefix"}
MODEL_ARGS_INERT = {"drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate",
                    "drop_path_rate", "weight_init", "fix_init", "device", "dtype"}
MODEL_ARGS_FIXED = {"qk_norm": False, "scale_attn_norm": False, "scale_mlp_norm": False, "proj_bias": True,
                    "final_norm": True, "dynamic_img_pad": False, "embed_layer": None,
                    "embed_norm_layer": None, "norm_layer": None, "block_fn": None, "mlp_layer": None,
                    "attn_layer": None}


def is_timm_state_dict(state: Mapping[str, torch.Tensor]) -> bool:
    """Whether these keys look like a timm ViT's (fused ``blocks.0.attn.qkv`` and ``patch_embed.proj``)."""
    return "patch_embed.proj.weight" in state and "blocks.0.attn.qkv.weight" in state


def check_name(name: str) -> None:
    """Raise ValueError unless ``name`` is a timm ViT architecture this project can express."""
    if not re.match(r"^(vit|deit|deit3)(_|$)", name):
        raise ValueError(f"timm architecture {name!r} is not supported; supported: {SUPPORTED}, eva02_* and "
                         "vit_*_dinov3*")


@dataclass(frozen=True)
class RegistryFacts:
    """What timm's model function builds for a name and its model_args, read from the built (meta) model."""

    width: int  # embed_dim of the built model: its heads only hold for weights of this width
    num_heads: int
    activation: str  # our ViTConfig.activation
    layer_norm_eps: float
    img_size: tuple[int, int]  # the (height, width) timm builds its position table for (model_args.img_size)


def _activation(module: torch.nn.Module) -> str | None:
    """Our name for an MLP activation module of torch or timm, None for one this model does not have."""
    from timm.layers import activations

    if type(module) is torch.nn.GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(module.approximate)
    return {activations.GELU: "gelu", activations.GELUTanh: "gelu_tanh", activations.QuickGELU: "quick_gelu",
            activations.Swish: "silu", torch.nn.SiLU: "silu"}.get(type(module))


@functools.lru_cache(maxsize=64)
def _registry_facts(name: str, args_json: str) -> RegistryFacts:
    try:
        import timm
        from timm.layers import AttentionPoolLatent
        from timm.models.vision_transformer import Attention, Block, Mlp
    except ImportError:
        raise ValueError(f"reading timm architecture {name} needs timm (pip install timm)") from None
    if not timm.is_model(name):
        raise ValueError(f"timm does not know the architecture {name!r} (timm {timm.__version__}); "
                         f"supported: {SUPPORTED}")
    args = json.loads(args_json)
    try:
        with torch.device("meta"):  # shapes only: no memory, whatever img_size or width model_args declare
            model = timm.create_model(name, pretrained=False, **{**args, "depth": 1})  # one block tells them all
    except Exception as e:  # timm raises many types on arguments its model function rejects
        raise ValueError(f"timm cannot build {name} with model_args {args_json[:80]} ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:80] if str(e) else ''})") from None
    block = getattr(model, "blocks", [None])[0]
    attn, mlp = getattr(block, "attn", None), getattr(block, "mlp", None)
    problem = None
    if type(block) is not Block or type(attn) is not Attention or type(mlp) is not Mlp:
        problem = f"its blocks are timm {type(block).__name__} / {type(attn).__name__} / {type(mlp).__name__}"
    elif not all(isinstance(m, torch.nn.Identity) for m in (attn.q_norm, attn.k_norm, attn.norm, mlp.norm)):
        problem = "it normalises inside attention or the MLP (qk_norm / scale_attn_norm / scale_mlp_norm)"
    elif not all(type(m) in (torch.nn.LayerNorm, timm.layers.LayerNorm) for m in (block.norm1, block.norm2)):
        problem = f"its blocks normalise with {type(block.norm1).__name__}"
    elif _activation(mlp.act) is None:
        problem = f"its MLP activation is {type(mlp.act).__name__}"
    elif isinstance(getattr(model, "attn_pool", None), AttentionPoolLatent) and (
            model.attn_pool.num_heads != attn.num_heads or model.attn_pool.latent_len != 1):
        problem = "its attention-pooling probe has its own heads or several latents"
    if problem:
        raise ValueError(f"timm {name} cannot be expressed by this program's model: {problem}")
    img_size = tuple(int(v) for v in getattr(model.patch_embed, "img_size", None) or (224, 224))
    return RegistryFacts(width=block.norm1.normalized_shape[0], num_heads=attn.num_heads,
                         activation=_activation(mlp.act), layer_norm_eps=float(block.norm1.eps),
                         img_size=(img_size[0], img_size[-1]))


def registry_facts(name: str, model_args: Mapping | None = None) -> RegistryFacts:
    """What timm's model function for ``name`` fixes inside itself (heads, MLP activation, LayerNorm eps), read by
    building that model with ``model_args`` on the meta device; ValueError for a name timm does not know or a
    block this program's model cannot express."""
    check_name(name)
    args = {k: v for k, v in (model_args or {}).items() if k not in MODEL_ARGS_INERT}
    for key in ("embed_dim", "num_heads"):  # the only sizes that make the one meta block cost time
        bound = CONFIG_BOUNDS["hidden_size" if key == "embed_dim" else key]
        if key in args and not (isinstance(args[key], int) and 0 < args[key] <= bound):
            raise ValueError(f"timm model_args.{key}={args[key]!r} of {name} is not a size up to {bound:,}")
    return _registry_facts(name, json.dumps(args, sort_keys=True, default=str))


def _shape(state: Mapping[str, torch.Tensor], key: str) -> tuple[int, ...]:
    return tuple(state[key].shape)


def config_from_timm(name: str, state: Mapping[str, torch.Tensor], model_args: Mapping | None = None) -> ViTConfig:
    """Our config for timm architecture ``name`` with these weights; ``model_args`` are timm's overrides
    (``num_heads``, ``global_pool``, ``no_embed_class``, ...) as its ``config.json`` stores them."""
    check_name(name)
    args = dict(model_args or {})
    for key, value in args.items():
        if key in MODEL_ARGS_FIXED:
            if value is not None and value != MODEL_ARGS_FIXED[key]:
                raise ValueError(f"timm model_args.{key}={value!r} of {name} is not supported (this program's model "
                                 f"has {MODEL_ARGS_FIXED[key]!r})")
        elif key not in MODEL_ARGS_HONOURED | MODEL_ARGS_INERT:
            raise ValueError(f"timm model_args.{key} of {name} is not supported; it would change the model")
    unknown = sorted(k for k in state if k not in _TOP_KEYS and k not in _OURS_BY_TIMM
                     and not (_BLOCK_KEY.match(k) and _BLOCK_KEY.match(k).group(2) in _BLOCK_PARTS))
    if unknown:
        shown = ", ".join(unknown[:4]) + (" ..." if len(unknown) > 4 else "")
        raise ValueError(f"timm weights of {name} have parts this model does not have ({shown}); "
                         f"supported: {SUPPORTED}")
    class_token = "cls_token" in state
    if args.get("class_token") is False and class_token or args.get("class_token") is True and not class_token:
        raise ValueError(f"timm model_args.class_token of {name} does not match its weights")
    if "patch_embed.proj.weight" not in state:
        raise ValueError(f"timm weights of {name} lack a patch embedding; supported: {SUPPORTED}")
    width, channels, patch, patch_w = _shape(state, "patch_embed.proj.weight")
    if patch != patch_w:
        raise ValueError(f"timm weights of {name} have non-square {patch}x{patch_w} patches")
    depth = 1 + max((int(_BLOCK_KEY.match(k).group(1)) for k in state if _BLOCK_KEY.match(k)), default=-1)
    if depth == 0:
        raise ValueError(f"timm weights of {name} have no transformer blocks")
    act = args.get("act_layer")
    if act is not None and act not in _ACTIVATIONS:
        raise ValueError(f"timm model_args.act_layer={act!r} of {name} is not supported; supported: "
                         f"{', '.join(_ACTIVATIONS)}")
    facts = registry_facts(name, args)
    heads = args.get("num_heads") or (facts.num_heads if facts.width == width else None)
    if not heads:
        raise ValueError(f"cannot tell the number of heads of {name}: timm builds it {facts.width} wide, these weights "
                         f"are {width}; give it as model_args.num_heads in the folder's config.json")
    registers = _shape(state, "reg_token")[1] if "reg_token" in state else 0
    distilled = "dist_token" in state
    prefix = int(class_token) + int(distilled) + registers
    if args.get("pos_embed", "learn") not in ("learn", "none", ""):
        raise ValueError(f"timm model_args.pos_embed={args['pos_embed']!r} of {name} is not supported")
    has_table = "pos_embed" in state
    no_embed_class = bool(args.get("no_embed_class")) or prefix == 0
    built_h, built_w = facts.img_size
    grid = (built_h // patch or 1, built_w // patch or 1)
    if has_table and built_h != built_w:
        # timm builds a rectangle's table for img_size's grid: it must hold that grid, and tells no_embed_class
        positions = _shape(state, "pos_embed")[1]
        patches = grid[0] * grid[1]
        if args.get("no_embed_class") is None and prefix:
            no_embed_class = positions == patches
        if positions != patches + (0 if no_embed_class else prefix):
            raise ValueError(f"timm weights of {name} have a position table of {positions} entries, not the "
                             f"{grid[0]}x{grid[1]} patch grid of its img_size {built_h}x{built_w} (height x width)"
                             f"{'' if no_embed_class else f' plus {prefix} prefix token(s)'}")
    elif has_table:
        positions = _shape(state, "pos_embed")[1]
        if args.get("no_embed_class") is None and prefix:
            # The table has one entry per patch of a square grid, plus one per prefix token unless no_embed_class.
            no_embed_class = not _is_square(positions - prefix) and _is_square(positions)
        side = math.isqrt(positions - (0 if no_embed_class else prefix))
        if side * side != positions - (0 if no_embed_class else prefix) or side == 0:
            raise ValueError(f"timm weights of {name} have a position table of {positions} entries, not a square "
                             "grid; for a rectangular input give model_args.img_size as [height, width] in its "
                             "config.json")
        grid = (side, side)
    fc_norm = "fc_norm.weight" in state
    attn_pool = "attn_pool.latent" in state
    pool = args.get("global_pool") or ("map" if attn_pool else "avg" if fc_norm or "_gap" in name or not class_token
                                       else "token")
    if pool not in ("token", "avg", "map"):
        raise ValueError(f"timm global_pool {pool!r} of {name} is not supported; supported: token, avg, map")
    if (pool == "map") != attn_pool:
        raise ValueError(f"timm weights of {name} {'lack' if pool == 'map' else 'have'} an attn_pool for "
                         f"global_pool {pool!r}")
    if pool == "token" and not class_token:
        raise ValueError(f"timm model {name} has no class token to pool; use global_pool avg or map")
    return ViTConfig(
        image_size=grid[0] * patch if grid[0] == grid[1] else (grid[0] * patch, grid[1] * patch), patch_size=patch,
        num_channels=channels,
        num_classes=_shape(state, "head.weight")[0] if "head.weight" in state else 0,
        hidden_size=width, num_layers=depth, num_heads=int(heads),
        mlp_size=_shape(state, "blocks.0.mlp.fc1.weight")[0],
        qkv_bias="blocks.0.attn.qkv.bias" in state, layer_norm_eps=facts.layer_norm_eps,
        distillation_token=distilled, distillation_head="head_dist.weight" in state,
        num_register_tokens=registers,
        layer_scale=float(args.get("init_values") or 1e-5) if "blocks.0.ls1.gamma" in state else None,
        pooling={"avg": "avg", "map": "map"}.get(pool, "cls"), fc_norm=fc_norm,
        prefix_positions="none" if no_embed_class else "all", pos_embed_antialias=True,
        class_token=class_token, pos_embed=has_table, pre_norm="norm_pre.weight" in state,
        activation=facts.activation,
        pool_prefix=bool(args.get("pool_include_prefix", False)),  # timm's probe skips CLS and registers by default
    )


def _is_square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n


def state_dict_from_timm(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our key names for timm's: the patch embedding and the layer-scale gains differ, the rest is the same
    (a CLIP tower's bias-free patch embedding gets a zero bias)."""
    ours = {}
    if "patch_embed.proj.bias" not in state and "patch_embed.proj.weight" in state:
        ours["patch_embed.bias"] = torch.zeros(state["patch_embed.proj.weight"].shape[0],
                                               device=state["patch_embed.proj.weight"].device)
    for key, value in state.items():
        key = _OURS_BY_TIMM.get(key, key)
        if key.endswith(".gamma"):
            key = key[: -len(".gamma")]  # blocks.{i}.ls1.gamma -> blocks.{i}.ls1
        ours[key] = value
    return ours


def _size_pair(value) -> tuple[int, int] | None:
    """``(height, width)`` of a timm ``img_size`` (a side or a pair) or ``input_size[-2:]``; None when it is neither."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if isinstance(value, (list, tuple)) and len(value) == 2 \
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        return int(value[0]), int(value[1])
    return None


def preprocessing_from_timm(name: str, config: ViTConfig, pretrained_cfg: Mapping | None,
                            model_args: Mapping | None = None) -> Preprocessing:
    """timm's evaluation transform (``resolve_data_config`` + ``transforms_imagenet_eval``): each side of the input
    ``(h, w)`` over ``crop_pct``, floored, is the resize target. crop_mode "center" (timm's default, and what it does
    for any other name): the shorter side resized to it for a square input (torchvision's ``Resize(int)``), the
    aspect kept until the image covers ``(h, w) / crop_pct`` for a rectangle (timm's ``ResizeKeepRatio``); "squash":
    both sides stretched to it; then the centre ``(h, w)`` is cropped. "border": the aspect kept until the image fits
    inside it (``ResizeKeepRatio(longest=1)``), then each side cropped or padded to ``(h, w)`` in the mean's colour
    (``CenterCropOrPad``). Family defaults (DeiT and DINOv2: ImageNet statistics; other ViTs: 0.5) when the
    pretrained config is missing."""
    cfg = dict(pretrained_cfg or {})
    args = dict(model_args or {})
    hw = _size_pair(args.get("img_size")) or _size_pair(list(cfg.get("input_size") or [])[-2:]) or config.image_hw
    if any(side % patch for side, patch in zip(hw, config.patch_hw, strict=True)):
        hw = config.image_hw
    imagenet = name.startswith("deit") or "dinov2" in name or "dinov3" in name
    mean = tuple(cfg.get("mean") or (IMAGENET_MEAN if imagenet else INCEPTION_MEAN))
    std = tuple(cfg.get("std") or (IMAGENET_STD if imagenet else INCEPTION_STD))
    crop_pct = float(cfg.get("crop_pct") or (1.0 if "dinov2" in name or "dinov3" in name else 0.875))
    interpolation = cfg.get("interpolation") or "bicubic"
    if interpolation not in ("bicubic", "bilinear", "nearest", "lanczos"):
        interpolation = "bicubic"
    if config.num_channels == 1:
        mean, std = mean[:1], std[:1]
    height, width = hw
    scale = (math.floor(height / crop_pct), math.floor(width / crop_pct))
    if cfg.get("crop_mode") in ("squash", "border"):
        resize, mode = (scale[0] if height == width else scale), "square" if cfg["crop_mode"] == "squash" else "border"
    elif height == width:
        resize, mode = scale[0], "shortest_edge"
    else:  # the rounding of ResizeKeepRatio, not Resize(int)'s truncation: timm uses it for rectangles alone
        resize, mode = scale, "keep_ratio"
    return Preprocessing(height if height == width else hw, config.num_channels, mean, std, resize_size=resize,
                         resize_mode=mode, resample=interpolation)
