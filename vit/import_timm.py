"""timm ``VisionTransformer`` / ``VisionTransformerDistilled`` weights in our ``ViT``, without importing timm.

timm's key names are nearly ours (``blocks.{i}.attn.qkv`` is already fused, q then k then v),
so the mapping renames the patch embedding and the layer-scale gains (``ls1.gamma``) and
checks every key. The config is read from the weights (width, depth, MLP size, qkv bias,
register / distillation tokens, layer scale, ``fc_norm``, the position table's length) and
from the architecture name or timm's ``config.json`` ``model_args`` for what weights cannot
say: the number of heads and the pooling. Supported: ``vit_*`` with a class token (optional
``reg_token``, ``no_embed_class``, layer scale, ``fc_norm`` / average pooling, with or without
qkv bias), ``deit_*`` including the distilled ones, and the DINOv2 ports (``vit_*_dinov2``,
``vit_*_reg4_dinov2``). Positions are resampled as timm does (bicubic, ``antialias=True``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import torch

from vit.checkpoint import IMAGENET_MEAN, IMAGENET_STD, Preprocessing
from vit.model import ViTConfig

SUPPORTED = "timm vit_* (class token; reg_token, no_embed_class, layer scale, fc_norm/avg pooling), deit_* " \
            "(also distilled) and the DINOv2 ports vit_*_dinov2 / vit_*_reg4_dinov2"
# timm's widths and their head counts (timm/models/vision_transformer.py model definitions).
HEADS_BY_WIDTH = {192: 3, 384: 6, 512: 8, 640: 10, 768: 12, 1024: 16, 1280: 16, 1408: 16, 1536: 24, 1664: 16}
INCEPTION_MEAN = INCEPTION_STD = (0.5, 0.5, 0.5)
_OURS_BY_TIMM = {"patch_embed.proj.weight": "patch_embed.weight", "patch_embed.proj.bias": "patch_embed.bias"}
_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.(.+)$")
_BLOCK_PARTS = {"norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                "attn.proj.bias", "norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias",
                "mlp.fc2.weight", "mlp.fc2.bias", "ls1.gamma", "ls2.gamma"}
_TOP_KEYS = {"cls_token", "dist_token", "reg_token", "pos_embed", "norm.weight", "norm.bias", "fc_norm.weight",
             "fc_norm.bias", "head.weight", "head.bias", "head_dist.weight", "head_dist.bias"}


def is_timm_state_dict(state: Mapping[str, torch.Tensor]) -> bool:
    """Whether these keys look like a timm ViT's (fused ``blocks.0.attn.qkv`` and ``patch_embed.proj``)."""
    return "patch_embed.proj.weight" in state and "blocks.0.attn.qkv.weight" in state


def check_name(name: str) -> None:
    """Raise ValueError unless ``name`` is a timm ViT architecture this project can express."""
    if not re.match(r"^(vit|deit|deit3)(_|$)", name):
        raise ValueError(f"timm architecture {name!r} is not supported; supported: {SUPPORTED}")


def _shape(state: Mapping[str, torch.Tensor], key: str) -> tuple[int, ...]:
    return tuple(state[key].shape)


def config_from_timm(name: str, state: Mapping[str, torch.Tensor], model_args: Mapping | None = None) -> ViTConfig:
    """Our config for timm architecture ``name`` with these weights; ``model_args`` are timm's overrides
    (``num_heads``, ``global_pool``, ``no_embed_class``, ...) as its ``config.json`` stores them."""
    check_name(name)
    args = dict(model_args or {})
    unknown = sorted(k for k in state if k not in _TOP_KEYS and k not in _OURS_BY_TIMM
                     and not (_BLOCK_KEY.match(k) and _BLOCK_KEY.match(k).group(2) in _BLOCK_PARTS))
    if unknown:
        shown = ", ".join(unknown[:4]) + (" ..." if len(unknown) > 4 else "")
        raise ValueError(f"timm weights of {name} have parts this model does not have ({shown}); "
                         f"supported: {SUPPORTED}")
    if "patch_embed.proj.weight" not in state or "cls_token" not in state:
        raise ValueError(f"timm weights of {name} lack a patch embedding or class token; supported: {SUPPORTED}")
    width, channels, patch, patch_w = _shape(state, "patch_embed.proj.weight")
    if patch != patch_w:
        raise ValueError(f"timm weights of {name} have non-square {patch}x{patch_w} patches")
    depth = 1 + max((int(_BLOCK_KEY.match(k).group(1)) for k in state if _BLOCK_KEY.match(k)), default=-1)
    if depth == 0:
        raise ValueError(f"timm weights of {name} have no transformer blocks")
    heads = args.get("num_heads") or HEADS_BY_WIDTH.get(width)
    if not heads:
        raise ValueError(f"cannot tell the number of heads of {name} (width {width}); give it as model_args.num_heads "
                         "in the folder's config.json")
    registers = _shape(state, "reg_token")[1] if "reg_token" in state else 0
    distilled = "dist_token" in state
    prefix = 1 + int(distilled) + registers
    positions = _shape(state, "pos_embed")[1]
    no_embed_class = args.get("no_embed_class")
    if no_embed_class is None:
        # The table has one entry per patch of a square grid, plus one per prefix token unless no_embed_class.
        no_embed_class = not _is_square(positions - prefix) and _is_square(positions)
    grid = math.isqrt(positions - (0 if no_embed_class else prefix))
    if grid * grid != positions - (0 if no_embed_class else prefix) or grid == 0:
        raise ValueError(f"timm weights of {name} have a position table of {positions} entries, not a square grid")
    fc_norm = "fc_norm.weight" in state
    pool = args.get("global_pool") or ("avg" if fc_norm or "_gap" in name else "token")
    if pool not in ("token", "avg"):
        raise ValueError(f"timm global_pool {pool!r} of {name} is not supported; supported: token, avg")
    if args.get("class_token") is False:
        raise ValueError(f"timm model {name} has no class token; supported: {SUPPORTED}")
    return ViTConfig(
        image_size=grid * patch, patch_size=patch, num_channels=channels,
        num_classes=_shape(state, "head.weight")[0] if "head.weight" in state else 0,
        hidden_size=width, num_layers=depth, num_heads=int(heads),
        mlp_size=_shape(state, "blocks.0.mlp.fc1.weight")[0],
        qkv_bias="blocks.0.attn.qkv.bias" in state, layer_norm_eps=1e-6,
        distillation_token=distilled, distillation_head="head_dist.weight" in state,
        num_register_tokens=registers,
        layer_scale=float(args.get("init_values") or 1e-5) if "blocks.0.ls1.gamma" in state else None,
        pooling="avg" if pool == "avg" else "cls", fc_norm=fc_norm,
        prefix_positions="none" if no_embed_class else "all", pos_embed_antialias=True,
    )


def _is_square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n


def state_dict_from_timm(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our key names for timm's: the patch embedding and the layer-scale gains differ, the rest is the same."""
    ours = {}
    for key, value in state.items():
        key = _OURS_BY_TIMM.get(key, key)
        if key.endswith(".gamma"):
            key = key[: -len(".gamma")]  # blocks.{i}.ls1.gamma -> blocks.{i}.ls1
        ours[key] = value
    return ours


def preprocessing_from_timm(name: str, config: ViTConfig, pretrained_cfg: Mapping | None,
                            model_args: Mapping | None = None) -> Preprocessing:
    """timm's evaluation transform (``resolve_data_config`` + ``transforms_factory``): resize the shorter side
    to ``floor(size / crop_pct)`` (both sides for crop_mode "squash"), crop the centre ``size``; family defaults
    (DeiT and DINOv2: ImageNet statistics; other ViTs: 0.5) when the pretrained config is missing."""
    cfg = dict(pretrained_cfg or {})
    args = dict(model_args or {})
    image_size = args.get("img_size") or (cfg.get("input_size") or [None, None, None])[-1] or config.image_size
    if isinstance(image_size, (list, tuple)):
        image_size = image_size[0]
    image_size = int(image_size)
    if image_size % config.patch_size:
        image_size = config.image_size
    imagenet = name.startswith("deit") or "dinov2" in name or "dinov3" in name
    mean = tuple(cfg.get("mean") or (IMAGENET_MEAN if imagenet else INCEPTION_MEAN))
    std = tuple(cfg.get("std") or (IMAGENET_STD if imagenet else INCEPTION_STD))
    crop_pct = float(cfg.get("crop_pct") or (1.0 if "dinov2" in name or "dinov3" in name else 0.875))
    interpolation = cfg.get("interpolation") or "bicubic"
    if interpolation not in ("bicubic", "bilinear", "nearest", "lanczos"):
        interpolation = "bicubic"
    resize = math.floor(image_size / crop_pct)
    mode = "square" if cfg.get("crop_mode") == "squash" else "shortest_edge"
    if config.num_channels == 1:
        mean, std = mean[:1], std[:1]
    return Preprocessing(image_size, config.num_channels, mean, std, resize_size=resize, resize_mode=mode,
                         resample=interpolation)
