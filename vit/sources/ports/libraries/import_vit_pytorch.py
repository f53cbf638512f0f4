"""lucidrains' ``vit-pytorch`` ``ViT`` and ``SimpleViT`` state dicts in our ``ViT``, without importing vit-pytorch.

vit-pytorch's models are pre-norm ViTs with a few choices of their own, each a ``ViTConfig`` field here:
the patch embedding is ``Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)')``, ``LayerNorm(patch_dim)``,
``Linear``, ``LayerNorm(dim)`` (``patch_norm``; the linear layer is our convolution with its weight permuted);
``to_qkv`` has no bias; each head is ``dim_head`` wide (64 by default), independent of ``dim`` (``head_dim``);
a final ``LayerNorm`` closes the transformer. ``pool='mean'`` builds no class token and averages the patches.
Releases around 1.0 wrap each layer's attention and MLP in ``PreNorm`` and end with ``mlp_head = LayerNorm +
Linear`` instead of the transformer's final norm (the same computation on the class token); their class token
is there with either pooling, and their ``pool='mean'`` (the class token averaged with the patches) is not
supported. ``SimpleViT`` adds fixed 2D sin-cos positions (stored here as the position table of its grid, where they are
exact: vit-pytorch runs it at that size only), a bias-free ``to_out`` and mean pooling. ``vit_for_small_dataset.ViT``
(Lee et al. 2021's levers as vit-pytorch writes them) embeds shifted patch tokens (``patch_shift="cardinal"``: the
image and 4 copies shifted by a pixel, ``LayerNorm`` over the flattened patch, ``Linear``) and attends with
locality self-attention (``attention="lsa_temperature"``: its own key masked out, the logits times exp of a learned
temperature per layer); its ``mlp_head`` is ``LayerNorm`` + ``Linear``, as in the releases around 1.0.

The constructor's arguments the weights cannot tell (``heads``; ``patch_size`` and ``image_size``, since the patch
embedding's input ``channels x ph x pw`` and the position table's length fix only products of the sides) come from a
``config.json`` beside the weights (the constructor's keyword arguments; rectangular sides as ``[height, width]``)
or ``--arch vit_pytorch:heads=8,...``; a missing one is asked for in one line naming it, a given one the weights
contradict is refused, and so are vit-pytorch's other variants.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from vit.model import ViTConfig
from vit.sources.ports.libraries.import_scratch import required_argument

SUPPORTED = ("vit-pytorch ViT, SimpleViT and ViT for small datasets state dicts (vit_pytorch:heads=N,... or their "
             "config.json)")
SMALL_EMBED = "to_patch_embedding.to_patch_tokens.2"  # vit_for_small_dataset's SPT projection
ARGUMENTS = {"image_size", "patch_size", "num_classes", "dim", "depth", "heads", "mlp_dim", "pool", "channels",
             "dim_head", "dropout", "emb_dropout"}
_EPS = 1e-5  # nn.LayerNorm's default, which vit-pytorch keeps
_LAYER = re.compile(r"^transformer\.layers\.(\d+)\.([01])\.(.+)$")
VARIANTS = {"reattn_": "DeepViT (re-attention mixes the heads' maps)", "register_tokens": "a ViT with register tokens",
            "q_norm": "a ViT with query-key norms", "rel_pos_bias": "a ViT with a relative position bias",
            "patch_merger": "a ViT with a patch merger"}  # parts of other variants' keys, to name what the weights are


def is_vit_pytorch_state_dict(state: Mapping[str, torch.Tensor]) -> bool:
    """Whether these keys look like vit-pytorch's ``ViT`` or ``SimpleViT`` (the norms inside the layers, or the
    ``PreNorm`` wrappers of releases around 1.0)."""
    return ("to_patch_embedding.2.weight" in state or f"{SMALL_EMBED}.weight" in state) and (
        "transformer.layers.0.0.to_qkv.weight" in state or "transformer.layers.0.0.fn.to_qkv.weight" in state)


def _prenorm(state: Mapping[str, torch.Tensor]) -> bool:
    """Releases around 1.0: ``PreNorm(dim, fn)`` wrappers (``layers.i.0.fn.to_qkv``) and a ``mlp_head`` of
    ``LayerNorm`` + ``Linear``, which on the class token is our final norm and head."""
    return "transformer.layers.0.0.fn.to_qkv.weight" in state


def kind_of(state: Mapping[str, torch.Tensor]) -> str:
    """``SimpleViT`` (``linear_head``, no stored positions), ``small`` (``vit_for_small_dataset.ViT``: shifted patch
    tokens) or ``ViT``."""
    if f"{SMALL_EMBED}.weight" in state:
        return "small"
    return "SimpleViT" if "pos_embedding" not in state else "ViT"


def _sides(arguments: Mapping, name: str) -> tuple[int, int] | None:
    """``arguments[name]`` as ``(height, width)``: vit-pytorch's ``pair()`` of an int, or a pair (a JSON list);
    None when not given."""
    value = arguments.get(name)
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ValueError(f"{name} must be a whole number or a [height, width] pair, got {str(value)[:40]}")
        return required_argument({name: value[0]}, name, name, "vit_pytorch"), \
            required_argument({name: value[1]}, name, name, "vit_pytorch")
    side = required_argument(arguments, name, name, "vit_pytorch")
    return side, side


def _shown(sides: tuple[int, int]) -> str:
    """``32`` for a square, ``[16, 64]`` (as vit-pytorch's constructor takes it) otherwise."""
    return str(sides[0]) if sides[0] == sides[1] else str(list(sides))


def _agree(arguments: Mapping, name: str, value: int, what: str) -> None:
    """Refuse a given constructor argument that contradicts the weights (a config.json with depth 10**6 once
    opened silently, the weights deciding)."""
    given = arguments.get(name)
    if given is None:
        return
    if isinstance(given, bool) or not isinstance(given, int):
        raise ValueError(f"{name} must be a whole number, got {str(given)[:40]}")
    if given != value:
        raise ValueError(f"{name}={given} contradicts the weights ({what} {value}): correct or remove it")


def _stray_key(state: Mapping[str, torch.Tensor]) -> str | None:
    """The first key no ViT / SimpleViT of vit-pytorch has (another of its variants), or None."""
    return next((key for key in state if _our_name(key, state) is None), None)


def config_from_vit_pytorch(state: Mapping[str, torch.Tensor], arguments: Mapping) -> ViTConfig:
    """Our config for a vit-pytorch ``ViT`` / ``SimpleViT`` from its weights and constructor ``arguments``: what the
    weights fix is read from them, what they do not (heads, the patch and image sides) must be given, and a given
    value the weights contradict is refused."""
    unknown = sorted(set(arguments) - ARGUMENTS - {"mean", "std", "class_names"})
    if unknown:
        raise ValueError(f"vit-pytorch's ViT has no argument {', '.join(unknown)}; its arguments: "
                         f"{', '.join(sorted(ARGUMENTS))}")
    stray = _stray_key(state)
    if stray is not None:
        variant = next((name for part, name in VARIANTS.items() if part in stray), "another vit-pytorch model")
        raise ValueError(f"{stray} is in no vit-pytorch ViT or SimpleViT: these weights are {variant}, which this "
                         "program does not open (only vit_pytorch.ViT and SimpleViT)")
    missing = [name for name in ("heads", "patch_size", "image_size") if arguments.get(name) is None]
    if missing:
        # The patch embedding's input (channels x ph x pw) and the position table (gh x gw rows) fix only products.
        raise ValueError(f"the weights do not say {', '.join(missing)}: pass {', '.join(f'{n}=N' for n in missing)} "
                         f"(--arch vit_pytorch:{','.join(f'{n}=N' for n in missing)}, or a config.json beside them)")
    small = kind_of(state) == "small"
    dim, patch_dim = state[f"{SMALL_EMBED if small else 'to_patch_embedding.2'}.weight"].shape
    copies = 5 if small else 1  # shifted patch tokens: the image and 4 shifted copies
    channels = arguments.get("channels", 3)
    if not isinstance(channels, int) or isinstance(channels, bool) or channels <= 0 or patch_dim % (copies * channels):
        raise ValueError(f"channels={channels!r} does not divide the patch embedding's {patch_dim} inputs")
    (ph, pw), (height, width) = _sides(arguments, "patch_size"), _sides(arguments, "image_size")
    if copies * channels * ph * pw != patch_dim:
        raise ValueError(f"the patch embedding takes {patch_dim} values, not {channels} channels"
                         f"{' (x 5 shifted copies)' if small else ''} of {ph}x{pw} patches: correct channels or "
                         "patch_size")
    if small and ph != pw:
        raise ValueError(f"vit-pytorch's ViT for small datasets shifts square patches; patch_size={_shown((ph, pw))}")
    if height % ph or width % pw:
        raise ValueError(f"image_size={_shown((height, width))} is not a multiple of "
                         f"patch_size={_shown((ph, pw))}")
    patches = (height // ph) * (width // pw)
    prenorm = _prenorm(state)
    inner = state[f"transformer.layers.0.0.{'fn.' if prenorm else ''}to_qkv.weight"].shape[0] // 3
    heads = required_argument(arguments, "heads", "how many heads to_qkv splits into", "vit_pytorch")
    if inner % heads:
        raise ValueError(f"heads={heads} does not divide to_qkv's {inner} channels per q, k and v")
    if arguments.get("dim_head") not in (None, inner // heads):
        raise ValueError(f"heads={heads} and dim_head={arguments['dim_head']} do not make to_qkv's {inner} channels")
    simple = kind_of(state) == "SimpleViT"
    if simple:
        with_cls = False
    elif state["cls_token"].dim() == 3:  # older releases: a (1, 1, dim) class token even with pool='mean'
        pool = arguments.get("pool")
        if pool != "cls":
            which = "vit-pytorch's ViT for small datasets" if small else "this vit-pytorch release"
            raise ValueError(f"{which} keeps a class token with either pooling: pass pool=cls (its "
                             "pool='mean', which averages the class token with the patches, is not supported)"
                             if pool is None else f"pool={pool!r} of {which} (the class token "
                             "averaged with the patches) is not supported; only pool=cls")
        with_cls = True
    else:
        with_cls = state["cls_token"].shape[0] == 1
    if not simple:
        positions = state["pos_embedding"].shape[-2] - int(with_cls)
        if patches != positions:
            raise ValueError(f"image_size={_shown((height, width))} in {ph if ph == pw else f'{ph}x{pw}'}-px "
                             f"patches makes {patches} patches, but the position table has {positions}: correct "
                             "image_size or patch_size")
    if arguments.get("pool", "cls" if with_cls else "mean") != ("cls" if with_cls else "mean"):
        raise ValueError(f"pool={arguments['pool']!r} does not fit the weights ("
                         f"{'a' if with_cls else 'no'} class token)")
    head = state.get("linear_head.weight" if simple else "mlp_head.1.weight" if prenorm or small else
                     "mlp_head.weight")
    mlp = state[f"transformer.layers.0.1.{'fn.net.0' if prenorm else 'net.1'}.weight"]
    depth = 1 + max(int(m.group(1)) for k in state if (m := _LAYER.match(k)))
    num_classes = head.shape[0] if head is not None else 0
    for name, value, what in (("dim", dim, "the model's width is"), ("depth", depth, "its layers number"),
                              ("mlp_dim", mlp.shape[0], "its MLP's width is"),
                              ("num_classes", num_classes, "its head's classes number")):
        _agree(arguments, name, value, what)
    for name in ("dropout", "emb_dropout"):  # ours has one rate for both; only training reads it
        rate = arguments.get(name, 0.0)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
            raise ValueError(f"{name} must be a number in [0, 1), got {str(rate)[:40]}")
    dropout = float(arguments.get("dropout", 0.0))
    return ViTConfig(image_size=(height, width), patch_size=(ph, pw), num_channels=channels, num_classes=num_classes,
                     hidden_size=dim, num_layers=depth, num_heads=heads, mlp_size=mlp.shape[0],
                     dropout=dropout, attention_dropout=dropout, qkv_bias=False, layer_norm_eps=_EPS,
                     class_token=with_cls, pooling="cls" if with_cls else "avg",
                     head_dim=inner // heads if inner != dim else 0, patch_norm=not small,
                     patch_shift="cardinal" if small else "none", attention="lsa_temperature" if small else "dot")


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
    (ph, pw), c = config.patch_hw, config.patch_input_channels
    return value.reshape(*value.shape[:-1], ph, pw, c).movedim(-1, -3).flatten(-3)


def _our_name(key: str, state: Mapping[str, torch.Tensor]) -> str | None:
    """Our name for one of vit-pytorch's ``ViT`` / ``SimpleViT`` keys, or None when neither has it."""
    kind = key.rsplit(".", 1)[-1]
    small = kind_of(state) == "small"
    if small and key.startswith("to_patch_embedding.") and kind in ("weight", "bias"):
        return {f"{SMALL_EMBED[:-1]}1.{kind}": f"patch_norm.{kind}", f"{SMALL_EMBED}.{kind}": f"patch_embed.{kind}"
                }.get(key)
    if small and (m := _LAYER.match(key)) and m.group(2) == "0" and m.group(3) == "temperature":
        return f"blocks.{m.group(1)}.attn.lsa_temperature"
    if key in ("to_patch_embedding.1.weight", "to_patch_embedding.1.bias"):
        return f"patch_norm.{kind}"
    if key in ("to_patch_embedding.2.weight", "to_patch_embedding.2.bias"):
        return f"patch_embed.{kind}"
    if key in ("to_patch_embedding.3.weight", "to_patch_embedding.3.bias"):
        return f"embed_norm.{kind}"
    if key in ("cls_token", "pos_embedding"):
        return {"cls_token": "cls_token", "pos_embedding": "pos_embed"}[key]
    if key in ("transformer.norm.weight", "transformer.norm.bias"):
        return f"norm.{kind}"
    if kind not in ("weight", "bias"):
        return None
    if small and key.startswith(("mlp_head.0.", "mlp_head.1.")) and key.count(".") == 2:  # LayerNorm, then Linear
        return f"{'norm' if key[9] == '0' else 'head'}.{kind}"
    if _prenorm(state):
        if key.startswith(("mlp_head.0.", "mlp_head.1.")) and key.count(".") == 2:  # LayerNorm, then Linear
            return f"{'norm' if key[9] == '0' else 'head'}.{kind}"
        parts = {"0.norm": "norm1", "0.fn.to_qkv": "attn.qkv", "0.fn.to_out.0": "attn.proj", "1.norm": "norm2",
                 "1.fn.net.0": "mlp.fc1", "1.fn.net.3": "mlp.fc2"}
    else:
        if key.startswith("linear_head." if kind_of(state) == "SimpleViT" else "mlp_head.") and key.count(".") == 1:
            return f"head.{kind}"
        parts = {"0.norm": "norm1", "0.to_qkv": "attn.qkv", "0.to_out.0": "attn.proj", "0.to_out": "attn.proj",
                 "1.net.0": "norm2", "1.net.1": "mlp.fc1",
                 f"1.{'net.3' if kind_of(state) == 'SimpleViT' else 'net.4'}": "mlp.fc2"}
    if (m := _LAYER.match(key)) and (part := f"{m.group(2)}.{m.group(3).rpartition('.')[0]}") in parts:
        return f"blocks.{m.group(1)}.{parts[part]}.{kind}"
    return None


def state_dict_from_vit_pytorch(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our key names for vit-pytorch's; a key with no counterpart raises ValueError. A missing ``to_out`` (one head
    as wide as the model: vit-pytorch's identity) becomes an identity projection, a bias-free one a zero bias."""
    (ph, pw), c, d = config.patch_hw, config.patch_input_channels, config.hidden_size
    ours: dict[str, torch.Tensor] = {}
    simple = kind_of(state) == "SimpleViT"
    for key, value in state.items():
        name = _our_name(key, state)
        if name is None:
            raise ValueError(f"vit-pytorch's state dict has a key this model has no place for: {key}")
        if name.startswith("patch_norm."):
            value = _patch_order(value, config)
        elif name == "patch_embed.weight":
            value = _patch_order(value, config).reshape(d, c, ph, pw)
        elif name == "cls_token":
            if not value.shape[0]:  # pool='mean': an empty (0, dim) class token
                continue
            value = value.reshape(1, 1, -1)
        elif name == "pos_embed":
            value = value.reshape(1, *value.shape[-2:])
        ours[name] = value
    like = state[f"{SMALL_EMBED if kind_of(state) == 'small' else 'to_patch_embedding.2'}.bias"]  # new tensors on
    # the weights' device (meta while checking)
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
