"""The ViTs that learners write from scratch, from their state dicts: the tutorials this project grew from.

Each layout is recognised from its keys and mapped strictly onto our ``ViT``; what its weights cannot tell
(the number of heads, mostly) comes from the constructor arguments the user passes: a ``config.json``
beside the weights or ``--arch scratch:key=value,...``.

- ``tintn``: tintn/vision-transformer-from-scratch (``ViTForClassfication``; its ``save_experiment`` writes
  ``experiments/NAME/config.json`` + ``model_final.pt``): pre-norm, tanh-approximate GELU, no final norm,
  either one ``query``/``key``/``value`` layer per head or (``use_faster_attention``) one ``qkv_projection``.
- ``torch_encoder``: the MNIST tutorial's ``ViT`` on ``nn.TransformerEncoder``: post-norm blocks with ReLU,
  ``nn.MultiheadAttention``'s ``in_proj`` (q, k, v stacked as our ``qkv``), a linear patch embedding over
  patches flattened (row, column, channel), which is our convolution with its weight permuted, no final norm.
- ``notebook``: the CIFAR-10 notebook's ``VisionTransformer``: pre-norm, exact GELU, a final LayerNorm on CLS.
- ``annotated``: the "Annotated Vision Transformer" post's ``ViT`` is refused: its code does not compute a ViT.

All of them use ``nn.LayerNorm``'s default eps (1e-5).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import torch

from vit.model import ViTConfig

SUPPORTED = ("from-scratch ViTs: tintn/vision-transformer-from-scratch experiments (config.json + model_*.pt), "
             "nn.TransformerEncoder ViTs (the MNIST tutorial's), the CIFAR-10 notebook's VisionTransformer "
             "(scratch:num_heads=N)")
LAYOUTS = ("tintn", "torch_encoder", "notebook")
ANNOTATED_REFUSAL = (
    "holds the 'Annotated Vision Transformer' tutorial's model, whose code does not compute a ViT: its "
    "nn.MultiheadAttention lacks batch_first=True, so it attends across the images of a batch instead of across "
    "the tokens, and its blocks' LayerNorms are bypassed; there is no attention of its tokens to show")
_EPS = 1e-5  # nn.LayerNorm's default, which every one of these tutorials keeps


def layout_of(state: Mapping[str, torch.Tensor]) -> str | None:
    """Which tutorial's layout these keys are (``tintn``, ``torch_encoder``, ``notebook``, ``annotated``), or None."""
    if "embedding.patch_embeddings.projection.weight" in state and "classifier.weight" in state:
        return "tintn"
    if "transformer_encoder.layers.0.self_attn.in_proj_weight" in state and "patch_embedding.weight" in state:
        return "torch_encoder"
    if "patch_embedding.projection.weight" in state and "encoder.0.attn.qkv.weight" in state:
        return "notebook"
    if "patch_embedding.positions" in state and "encoder_blocks.0.self_attn.in_proj_weight" in state:
        return "annotated"
    return None


def parse_arguments(text: str) -> dict:
    """``'num_heads=8,dim_head=32,pool=mean'`` -> ``{'num_heads': 8, 'dim_head': 32, 'pool': 'mean'}`` (ints, floats,
    true/false, else text); ValueError naming a malformed pair."""
    values: dict = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()):
            raise ValueError(f"{pair!r} is not key=value (e.g. num_heads=8)")
        value = value.strip()
        if re.fullmatch(r"[+-]?\d+", value):
            values[key.strip()] = int(value)
        elif value.lower() in ("true", "false"):
            values[key.strip()] = value.lower() == "true"
        else:
            try:
                values[key.strip()] = float(value)
            except ValueError:
                values[key.strip()] = value
    return values


def _count(state: Mapping[str, torch.Tensor], pattern: str) -> int:
    """1 + the largest index ``(\\d+)`` in ``pattern`` among the keys (0 when none matches)."""
    regex = re.compile(pattern)
    return 1 + max((int(m.group(1)) for k in state if (m := regex.match(k))), default=-1)


def required_argument(arguments: Mapping, name: str, why: str, arch: str = "scratch") -> int:
    """The positive whole number ``arguments[name]``; ValueError naming the argument and where to give it when the
    user gave none (``why``: what the weights cannot tell) or something else."""
    value = arguments.get(name)
    if value is None:
        raise ValueError(f"the weights do not say {why}: pass {name}=N (--arch {arch}:{name}=N, or "
                         f'{{"{name}": N}} in a config.json beside the weights)')
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive whole number, got {str(value)[:40]}")
    return value


def _side(positions: int, what: str) -> int:
    side = math.isqrt(positions)
    if side * side != positions:
        raise ValueError(f"{what} has {positions} patch positions, not a square grid")
    return side


# -- tintn/vision-transformer-from-scratch ------------------------------------------------------------------------

TINTN_FIELDS = {"image_size": "image_size", "patch_size": "patch_size", "num_channels": "num_channels",
                "num_classes": "num_classes", "hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
                "num_attention_heads": "num_heads", "intermediate_size": "mlp_size", "qkv_bias": "qkv_bias",
                "hidden_dropout_prob": "dropout", "attention_probs_dropout_prob": "attention_dropout"}


def config_from_tintn(state: Mapping[str, torch.Tensor], tintn_config: Mapping | None, arguments: Mapping) -> ViTConfig:
    """Our config for tintn's ``ViTForClassfication``: from its ``config.json`` when it came with one, else from the
    shapes (the heads from the per-head layers, or ``num_heads`` for the fused layout)."""
    per_head = any(".attention.heads." in k for k in state)
    if tintn_config:
        missing = [k for k in TINTN_FIELDS if k not in tintn_config and k not in ("qkv_bias",)]
        if missing:
            raise ValueError(f"tintn's config.json lacks {', '.join(missing)}")
        values = {ours: tintn_config[theirs] for theirs, ours in TINTN_FIELDS.items() if theirs in tintn_config}
        size, patch = values["image_size"], values["patch_size"]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (size, patch)) and 0 < patch <= size:
            values["image_size"] = size // patch * patch  # its stride-P convolution drops the remainder past the grid
    else:
        patch = state["embedding.patch_embeddings.projection.weight"]
        side = _side(state["embedding.position_embeddings"].shape[1] - 1, "tintn's position table")
        if per_head:
            heads = _count(state, r"^encoder\.blocks\.0\.attention\.heads\.(\d+)\.query\.weight$")
        else:
            heads = required_argument(arguments, "num_heads", "how many heads the fused qkv_projection splits into")
        values = {"image_size": side * patch.shape[-1], "patch_size": patch.shape[-1], "num_channels": patch.shape[1],
                  "num_classes": state["classifier.weight"].shape[0], "hidden_size": patch.shape[0],
                  "num_layers": _count(state, r"^encoder\.blocks\.(\d+)\."), "num_heads": heads,
                  "mlp_size": state["encoder.blocks.0.mlp.dense_1.weight"].shape[0],
                  "qkv_bias": any(k.endswith(("query.bias", "qkv_projection.bias")) for k in state)}
    hidden, heads = values["hidden_size"], values["num_heads"]
    head_dim = hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 else 0
    return ViTConfig(**values, layer_norm_eps=_EPS, activation="gelu_tanh", final_norm=False,
                     head_dim=head_dim if head_dim * heads != hidden else 0)


_TINTN_BLOCK = re.compile(r"^encoder\.blocks\.(\d+)\.(.+)$")
_TINTN_PARTS = {"attention.qkv_projection": "attn.qkv", "attention.output_projection": "attn.proj",
                "layernorm_1": "norm1", "layernorm_2": "norm2", "mlp.dense_1": "mlp.fc1", "mlp.dense_2": "mlp.fc2"}
_TINTN_TOP = {"embedding.cls_token": "cls_token", "embedding.position_embeddings": "pos_embed",
              "embedding.patch_embeddings.projection.weight": "patch_embed.weight",
              "embedding.patch_embeddings.projection.bias": "patch_embed.bias",
              "classifier.weight": "head.weight", "classifier.bias": "head.bias"}


def state_dict_from_tintn(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our key names for tintn's; the per-head query/key/value layers are stacked into our fused qkv (all queries,
    then all keys, then all values, head by head), as ``FasterMultiHeadAttention``'s chunk and view read it."""
    ours, per_head = {}, {}
    head = re.compile(r"^attention\.heads\.(\d+)\.(query|key|value)\.(weight|bias)$")
    for key, value in state.items():
        if key in _TINTN_TOP:
            ours[_TINTN_TOP[key]] = value
            continue
        match = _TINTN_BLOCK.match(key)
        if match:
            layer, rest = match.groups()
            part, _, kind = rest.rpartition(".")
            if part in _TINTN_PARTS and kind in ("weight", "bias"):
                ours[f"blocks.{layer}.{_TINTN_PARTS[part]}.{kind}"] = value
                continue
            if m := head.match(rest):
                per_head[(int(layer), m.group(3), m.group(2), int(m.group(1)))] = value
                continue
        raise ValueError(f"tintn's state dict has a key this model has no place for: {key}")
    for layer in range(config.num_layers):
        for kind in ("weight", "bias"):
            parts = [per_head.pop((layer, kind, role, h), None) for role in ("query", "key", "value")
                     for h in range(config.num_heads)]
            if all(p is None for p in parts):
                continue
            if any(p is None for p in parts):
                raise ValueError(f"tintn's block {layer} lacks some heads' query/key/value {kind}s for "
                                 f"{config.num_heads} heads")
            ours[f"blocks.{layer}.attn.qkv.{kind}"] = torch.cat(parts, dim=0)
    if per_head:
        layer, kind, role, h = sorted(per_head)[0]
        raise ValueError(f"tintn's state dict has head {h} in block {layer}, beyond the {config.num_heads} heads "
                         "its config declares")
    return ours


# -- the MNIST tutorial: nn.TransformerEncoder -------------------------------------------------------------------

def _channels_and_patch(patch_dim: int, arguments: Mapping) -> tuple[int, int]:
    """The (channels, patch size) of a linear patch embedding over ``patch_dim`` inputs: as given, else the one
    split of 1 or 3 channels with a whole patch side."""
    channels, patch = arguments.get("img_channels"), arguments.get("patch_size")
    if channels is None:
        fits = [c for c in (1, 3) if math.isqrt(patch_dim // c) ** 2 * c == patch_dim]
        if len(fits) != 1:
            raise ValueError(f"the patch embedding takes {patch_dim} values, which does not say the channels and the "
                             "patch size: pass img_channels=C and patch_size=P")
        channels = fits[0]
    if patch is None:
        patch = math.isqrt(patch_dim // channels)
    if not isinstance(channels, int) or not isinstance(patch, int) or channels * patch * patch != patch_dim:
        raise ValueError(f"img_channels={channels!r} and patch_size={patch!r} do not make the patch embedding's "
                         f"{patch_dim} inputs")
    return channels, patch


def config_from_torch_encoder(state: Mapping[str, torch.Tensor], arguments: Mapping) -> ViTConfig:
    """Our config for the MNIST tutorial's ``ViT``: post-norm, ReLU, no final norm; ``num_heads`` is asked for."""
    d_model, patch_dim = state["patch_embedding.weight"].shape
    channels, patch = _channels_and_patch(patch_dim, arguments)
    side = _side(state["position_embedding"].shape[1] - 1, "the position table")
    heads = required_argument(arguments, "num_heads", "how many heads nn.TransformerEncoderLayer splits attention into")
    return ViTConfig(image_size=side * patch, patch_size=patch, num_channels=channels,
                     num_classes=state["fc.weight"].shape[0], hidden_size=d_model,
                     num_layers=_count(state, r"^transformer_encoder\.layers\.(\d+)\."), num_heads=heads,
                     mlp_size=state["transformer_encoder.layers.0.linear1.weight"].shape[0], layer_norm_eps=_EPS,
                     post_norm=True, activation="relu", final_norm=False)


_ENCODER_LAYER = re.compile(r"^transformer_encoder\.layers\.(\d+)\.(.+)$")
_ENCODER_PARTS = {"self_attn.in_proj_weight": "attn.qkv.weight", "self_attn.in_proj_bias": "attn.qkv.bias",
                  "self_attn.out_proj.weight": "attn.proj.weight", "self_attn.out_proj.bias": "attn.proj.bias",
                  "linear1.weight": "mlp.fc1.weight", "linear1.bias": "mlp.fc1.bias",
                  "linear2.weight": "mlp.fc2.weight", "linear2.bias": "mlp.fc2.bias",
                  "norm1.weight": "post_norm1.weight", "norm1.bias": "post_norm1.bias",
                  "norm2.weight": "post_norm2.weight", "norm2.bias": "post_norm2.bias"}


def state_dict_from_torch_encoder(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our key names for the MNIST tutorial's; its linear patch embedding over (row, column, channel)-ordered patch
    vectors becomes our convolution's (channel, row, column) weight."""
    ours = {}
    for key, value in state.items():
        if key == "patch_embedding.weight":
            p, c = config.patch_size, config.num_channels
            ours["patch_embed.weight"] = value.reshape(-1, p, p, c).permute(0, 3, 1, 2)  # (D, C, P, P)
        elif key in ("patch_embedding.bias", "cls_token", "position_embedding", "fc.weight", "fc.bias"):
            ours[{"patch_embedding.bias": "patch_embed.bias", "cls_token": "cls_token",
                  "position_embedding": "pos_embed", "fc.weight": "head.weight", "fc.bias": "head.bias"}[key]] = value
        elif (match := _ENCODER_LAYER.match(key)) and match.group(2) in _ENCODER_PARTS:
            ours[f"blocks.{match.group(1)}.{_ENCODER_PARTS[match.group(2)]}"] = value
        else:
            raise ValueError(f"the nn.TransformerEncoder ViT's state dict has a key this model has no place for: {key}")
    return ours


# -- the CIFAR-10 notebook ---------------------------------------------------------------------------------------

def config_from_notebook(state: Mapping[str, torch.Tensor], arguments: Mapping) -> ViTConfig:
    """Our config for the CIFAR-10 notebook's ``VisionTransformer``: pre-norm, exact GELU, final LayerNorm on CLS,
    dropout 0.1 throughout; ``num_heads`` is asked for."""
    patch = state["patch_embedding.projection.weight"]
    side = _side(state["pos_embedding"].shape[1] - 1, "the position table")
    heads = required_argument(arguments, "num_heads", "how many heads the attention splits into")
    return ViTConfig(image_size=side * patch.shape[-1], patch_size=patch.shape[-1], num_channels=patch.shape[1],
                     num_classes=state["mlp_head.0.weight"].shape[0], hidden_size=patch.shape[0],
                     num_layers=_count(state, r"^encoder\.(\d+)\."), num_heads=heads,
                     mlp_size=state["encoder.0.mlp.0.weight"].shape[0], dropout=0.1, attention_dropout=0.1,
                     layer_norm_eps=_EPS)


_NOTEBOOK_LAYER = re.compile(r"^encoder\.(\d+)\.(.+)$")
_NOTEBOOK_PARTS = {"mlp.0": "mlp.fc1", "mlp.3": "mlp.fc2", "norm1": "norm1", "norm2": "norm2", "attn.qkv": "attn.qkv",
                   "attn.proj": "attn.proj"}
_NOTEBOOK_TOP = {"cls_token": "cls_token", "pos_embedding": "pos_embed",
                 "patch_embedding.projection.weight": "patch_embed.weight",
                 "patch_embedding.projection.bias": "patch_embed.bias", "norm.weight": "norm.weight",
                 "norm.bias": "norm.bias", "mlp_head.0.weight": "head.weight", "mlp_head.0.bias": "head.bias"}


def state_dict_from_notebook(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our key names for the CIFAR-10 notebook's (its qkv already stacks q, k, v head by head as ours does)."""
    ours = {}
    for key, value in state.items():
        if key in _NOTEBOOK_TOP:
            ours[_NOTEBOOK_TOP[key]] = value
            continue
        match = _NOTEBOOK_LAYER.match(key)
        if match:
            part, _, kind = match.group(2).rpartition(".")
            if part in _NOTEBOOK_PARTS and kind in ("weight", "bias"):
                ours[f"blocks.{match.group(1)}.{_NOTEBOOK_PARTS[part]}.{kind}"] = value
                continue
        raise ValueError(f"the notebook ViT's state dict has a key this model has no place for: {key}")
    return ours


def convert(layout: str, state: Mapping[str, torch.Tensor], tintn_config: Mapping | None, arguments: Mapping
            ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """Our config and state dict for weights of ``layout`` (``layout_of``); ValueError with one line otherwise."""
    if layout == "annotated":
        raise ValueError(ANNOTATED_REFUSAL)
    if layout == "tintn":
        config = config_from_tintn(state, tintn_config, arguments)
        return config, state_dict_from_tintn(state, config)
    if layout == "torch_encoder":
        config = config_from_torch_encoder(state, arguments)
        return config, state_dict_from_torch_encoder(state, config)
    if layout == "notebook":
        config = config_from_notebook(state, arguments)
        return config, state_dict_from_notebook(state, config)
    raise ValueError(f"unknown from-scratch layout {layout!r}; known: {', '.join(LAYOUTS)}")
