"""lucidrains' ``vit-pytorch`` ``ViT`` and ``SimpleViT`` state dicts in our ``ViT``, without importing vit-pytorch.

vit-pytorch's models are pre-norm ViTs with a few choices of their own, each a ``ViTConfig`` field here:
the patch embedding is ``Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)')``, ``LayerNorm(patch_dim)``,
``Linear``, ``LayerNorm(dim)`` (``patch_norm``; the linear layer is our convolution with its weight permuted);
``to_qkv`` has no bias; each head is ``dim_head`` wide (64 by default), independent of ``dim`` (``head_dim``);
a final ``LayerNorm`` closes the transformer. ``pool='mean'`` builds no class token and averages the patches.
Releases around 1.0 wrap each layer's attention and MLP in ``PreNorm`` and end with ``mlp_head = LayerNorm +
Linear`` instead of the transformer's final norm (the same computation on the class token); their class token
is there with either pooling, and their ``pool='mean'`` (the class token averaged with the patches) is not
supported.
``SimpleViT`` adds fixed 2D sin-cos positions (stored here as the position table of its grid, where they are
exact: vit-pytorch runs it at that size only), a bias-free ``to_out`` and mean pooling.

The constructor's arguments the weights cannot tell (``heads``, and ``image_size`` for ``SimpleViT``, which
stores no positions) come from a ``config.json`` beside the weights (the constructor's keyword arguments) or
``--arch vit_pytorch:heads=8,...``; a missing one is asked for in one line naming it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import torch

from vit.model import ViTConfig
from vit.sources.import_scratch import required_argument

SUPPORTED = "vit-pytorch ViT and SimpleViT state dicts (vit_pytorch:heads=N,... or their config.json)"
ARGUMENTS = {"image_size", "patch_size", "num_classes", "dim", "depth", "heads", "mlp_dim", "pool", "channels",
             "dim_head", "dropout", "emb_dropout"}
_EPS = 1e-5  # nn.LayerNorm's default, which vit-pytorch keeps
_LAYER = re.compile(r"^transformer\.layers\.(\d+)\.([01])\.(.+)$")


def is_vit_pytorch_state_dict(state: Mapping[str, torch.Tensor]) -> bool:
    """Whether these keys look like vit-pytorch's ``ViT`` or ``SimpleViT`` (the norms inside the layers, or the
    ``PreNorm`` wrappers of releases around 1.0)."""
    return "to_patch_embedding.2.weight" in state and (
        "transformer.layers.0.0.to_qkv.weight" in state or "transformer.layers.0.0.fn.to_qkv.weight" in state)


def _prenorm(state: Mapping[str, torch.Tensor]) -> bool:
    """Releases around 1.0: ``PreNorm(dim, fn)`` wrappers (``layers.i.0.fn.to_qkv``) and a ``mlp_head`` of
    ``LayerNorm`` + ``Linear``, which on the class token is our final norm and head."""
    return "transformer.layers.0.0.fn.to_qkv.weight" in state


def kind_of(state: Mapping[str, torch.Tensor]) -> str:
    """``SimpleViT`` (``linear_head``, no stored positions) or ``ViT``."""
    return "SimpleViT" if "pos_embedding" not in state else "ViT"


def config_from_vit_pytorch(state: Mapping[str, torch.Tensor], arguments: Mapping) -> ViTConfig:
    """Our config for a vit-pytorch ``ViT`` / ``SimpleViT`` from its weights and constructor ``arguments``."""
    unknown = sorted(set(arguments) - ARGUMENTS - {"mean", "std", "class_names"})
    if unknown:
        raise ValueError(f"vit-pytorch's ViT has no argument {', '.join(unknown)}; its arguments: "
                         f"{', '.join(sorted(ARGUMENTS))}")
    for name in ("image_size", "patch_size"):
        if isinstance(arguments.get(name), (list, tuple)):
            raise ValueError(f"vit-pytorch's {name} {arguments[name]} is not square; only square images are supported")
    dim, patch_dim = state["to_patch_embedding.2.weight"].shape
    channels = arguments.get("channels", 3)
    if not isinstance(channels, int) or isinstance(channels, bool) or channels <= 0 or patch_dim % channels:
        raise ValueError(f"channels={channels!r} does not divide the patch embedding's {patch_dim} inputs")
    patch = arguments.get("patch_size", math.isqrt(patch_dim // channels))
    if not isinstance(patch, int) or channels * patch * patch != patch_dim:
        raise ValueError(f"the patch embedding takes {patch_dim} values, not {channels} channels of square patches "
                         f"(patch_size={patch!r}); pass channels=C and patch_size=P")
    prenorm = _prenorm(state)
    inner = state[f"transformer.layers.0.0.{'fn.' if prenorm else ''}to_qkv.weight"].shape[0] // 3
    guess = f" (vit-pytorch's default dim_head=64 would make it {inner // 64})" if inner % 64 == 0 else ""
    heads = required_argument(arguments, "heads", "how many heads to_qkv splits into" + guess, "vit_pytorch")
    if inner % heads:
        raise ValueError(f"heads={heads} does not divide to_qkv's {inner} channels per q, k and v")
    if arguments.get("dim_head") not in (None, inner // heads):
        raise ValueError(f"heads={heads} and dim_head={arguments['dim_head']} do not make to_qkv's {inner} channels")
    simple = kind_of(state) == "SimpleViT"
    if simple:
        size = required_argument(arguments, "image_size", "the image size (SimpleViT stores no positions)",
                                 "vit_pytorch")
        if size % patch:
            raise ValueError(f"image_size={size} is not a multiple of the {patch}-px patches")
        side = size // patch
        with_cls = False
    elif state["cls_token"].dim() == 3:  # older releases: a (1, 1, dim) class token even with pool='mean'
        pool = arguments.get("pool")
        if pool != "cls":
            raise ValueError("this vit-pytorch release keeps a class token with either pooling: pass pool=cls (its "
                             "pool='mean', which averages the class token with the patches, is not supported)"
                             if pool is None else f"pool={pool!r} of this vit-pytorch release (the class token "
                             "averaged with the patches) is not supported; only pool=cls")
        with_cls = True
    else:
        with_cls = state["cls_token"].shape[0] == 1
    if not simple:
        positions = state["pos_embedding"].shape[-2] - int(with_cls)
        side = math.isqrt(positions)
        if side * side != positions:
            raise ValueError(f"vit-pytorch's pos_embedding has {positions} patch positions, not a square grid")
    if arguments.get("pool", "cls" if with_cls else "mean") != ("cls" if with_cls else "mean"):
        raise ValueError(f"pool={arguments['pool']!r} does not fit the weights ("
                         f"{'a' if with_cls else 'no'} class token)")
    head = state.get("linear_head.weight" if simple else "mlp_head.1.weight" if prenorm else "mlp_head.weight")
    mlp = state[f"transformer.layers.0.1.{'fn.net.0' if prenorm else 'net.1'}.weight"]
    dropout = float(arguments.get("dropout", 0.0))
    return ViTConfig(image_size=side * patch, patch_size=patch, num_channels=channels,
                     num_classes=head.shape[0] if head is not None else 0, hidden_size=dim,
                     num_layers=1 + max(int(m.group(1)) for k in state if (m := _LAYER.match(k))),
                     num_heads=heads, mlp_size=mlp.shape[0],
                     dropout=dropout, attention_dropout=dropout, qkv_bias=False, layer_norm_eps=_EPS,
                     class_token=with_cls, pooling="cls" if with_cls else "avg",
                     head_dim=inner // heads if inner != dim else 0, patch_norm=True)


def posemb_sincos_2d(grid: tuple[int, int], dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """The fixed 2D sin-cos positions of "Better plain ViT baselines" as vit-pytorch's SimpleViT lays them out:
    ``(gh*gw, dim)``, rows [sin x, cos x, sin y, cos y], each over ``dim/4`` frequencies spanning 1 to 1/temperature."""
    if dim % 4 or dim < 8:
        raise ValueError(f"SimpleViT's sin-cos positions need a width divisible by 4 (and at least 8), got {dim}")
    y, x = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")  # (gh, gw) each
    omega = 1.0 / temperature ** (torch.arange(dim // 4) / (dim // 4 - 1))  # (dim/4,)
    y = y.flatten()[:, None] * omega[None, :]  # (gh*gw, dim/4)
    x = x.flatten()[:, None] * omega[None, :]
    return torch.cat((x.sin(), x.cos(), y.sin(), y.cos()), dim=1).float()  # (gh*gw, dim)


def _patch_order(value: torch.Tensor, config: ViTConfig) -> torch.Tensor:
    """A patch vector's last axis from vit-pytorch's (row, column, channel) order to our (channel, row, column)."""
    p, c = config.patch_size, config.num_channels
    return value.reshape(*value.shape[:-1], p, p, c).movedim(-1, -3).flatten(-3)


def state_dict_from_vit_pytorch(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our key names for vit-pytorch's; a key with no counterpart raises ValueError. A missing ``to_out`` (one head
    as wide as the model: vit-pytorch's identity) becomes an identity projection, a bias-free one a zero bias."""
    p, c, d = config.patch_size, config.num_channels, config.hidden_size
    ours: dict[str, torch.Tensor] = {}
    simple = kind_of(state) == "SimpleViT"
    fc2 = "net.3" if simple else "net.4"
    parts = {"0.norm": "norm1", "0.to_qkv": "attn.qkv", "0.to_out.0": "attn.proj", "0.to_out": "attn.proj",
             "1.net.0": "norm2", "1.net.1": "mlp.fc1", f"1.{fc2}": "mlp.fc2"}
    if _prenorm(state):
        parts = {"0.norm": "norm1", "0.fn.to_qkv": "attn.qkv", "0.fn.to_out.0": "attn.proj", "1.norm": "norm2",
                 "1.fn.net.0": "mlp.fc1", "1.fn.net.3": "mlp.fc2"}
    for key, value in state.items():
        if key in ("to_patch_embedding.1.weight", "to_patch_embedding.1.bias"):
            ours[f"patch_norm.{key.rsplit('.', 1)[1]}"] = _patch_order(value, config)
        elif key == "to_patch_embedding.2.weight":
            ours["patch_embed.weight"] = _patch_order(value, config).reshape(d, c, p, p)
        elif key == "to_patch_embedding.2.bias":
            ours["patch_embed.bias"] = value
        elif key.startswith("to_patch_embedding.3."):
            ours[f"embed_norm.{key.rsplit('.', 1)[1]}"] = value
        elif key == "cls_token":
            if value.shape[0]:
                ours["cls_token"] = value.reshape(1, 1, -1)
        elif key == "pos_embedding":
            ours["pos_embed"] = value.reshape(1, *value.shape[-2:])
        elif key.startswith("transformer.norm."):
            ours[f"norm.{key.rsplit('.', 1)[1]}"] = value
        elif key.startswith(("mlp_head.", "linear_head.")) and key.count(".") == 1:
            ours[f"head.{key.rsplit('.', 1)[1]}"] = value
        elif _prenorm(state) and key.startswith(("mlp_head.0.", "mlp_head.1.")):  # LayerNorm, then Linear
            ours[f"{'norm' if key[9] == '0' else 'head'}.{key.rsplit('.', 1)[1]}"] = value
        elif (m := _LAYER.match(key)) and (part := f"{m.group(2)}.{m.group(3).rpartition('.')[0]}") in parts:
            ours[f"blocks.{m.group(1)}.{parts[part]}.{key.rsplit('.', 1)[1]}"] = value
        else:
            raise ValueError(f"vit-pytorch's state dict has a key this model has no place for: {key}")
    like = state["to_patch_embedding.2.bias"]  # new tensors on the weights' device (meta while checking)
    identity = config.num_heads == 1 and not config.head_dim  # vit-pytorch's project_out=False: no to_out at all
    for layer in range(config.num_layers):
        proj = f"blocks.{layer}.attn.proj"
        if identity and f"{proj}.weight" not in ours:
            ours[f"{proj}.weight"] = torch.eye(d, dtype=like.dtype).to(like.device)
        if (identity or simple) and f"{proj}.bias" not in ours:
            ours[f"{proj}.bias"] = torch.zeros(d, dtype=like.dtype).to(like.device)
    if simple:
        ours["pos_embed"] = posemb_sincos_2d(config.grid_size, d)[None].to(like.device)  # (1, gh*gw, D)
    return ours
