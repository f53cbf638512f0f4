"""SAM's image encoder (ViTDet-style) in our ``ViT``: HF ``SamVisionModel`` / ``SamModel`` folders and timm
``samvit_*`` weights, without importing either library.

SAM's encoder has no class token and no classifier: most layers attend within non-overlapping
``window_size`` x ``window_size`` windows of the patch grid (padded to a multiple of the window), a few attend
globally (``global_attn_indexes``; ``ViTConfig.window_size`` / ``global_layers``), and every layer adds decomposed
relative positions to its logits (``ViTConfig.rel_pos="sam"``), with a learned absolute table (``(1, gh, gw, D)``)
on the patches. The convolutional neck that turns the last block's output into the mask decoder's image embedding,
and SamModel's prompt encoder and mask decoder, are dropped by name: the maps concern the encoder's attention, and
the embedding here is the mean of the last block's patch tokens.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from vit.model import ViTConfig
from vit.sources.ports.families.import_dinov3 import _linear, _Taker, timm_shape

SUPPORTED = "SAM image encoders: HF SamVisionModel / SamModel folders and timm samvit_* weights"
ARCHITECTURES = ("SamVisionModel", "SamModel")
HF_HONOURED = {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_channels", "image_size", "patch_size",
               "hidden_act", "layer_norm_eps", "attention_dropout", "qkv_bias", "mlp_ratio", "mlp_dim", "use_abs_pos",
               "use_rel_pos", "window_size", "global_attn_indexes"}
HF_INERT = {"initializer_range", "output_channels", "num_pos_feats", "scale"}  # the neck's and prompt encoder's
MODEL_ARGS_HONOURED = {"img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads",
                       "mlp_ratio", "qkv_bias", "use_abs_pos", "use_rel_pos", "window_size", "global_attn_indexes",
                       "pre_norm", "neck_chans", "global_pool", "dynamic_size"}
MODEL_ARGS_INERT = {"drop_rate", "pos_drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate",
                    "patch_drop_rate"}
_DROPPED = ("neck.", "prompt_encoder.", "mask_decoder.", "shared_image_embedding.")


def is_sam_name(name: str) -> bool:
    return name.startswith("samvit_")


def _layers(values, depth: int, what: str) -> tuple[int, ...]:
    if not isinstance(values, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                        for i in values):
        raise ValueError(f"SAM {what} must be a list of layer numbers, got {str(values)[:60]}")
    if any(not 0 <= i < depth for i in values):
        raise ValueError(f"SAM {what} {list(values)} names layers outside 0..{depth - 1}")
    return tuple(values)


def _config(image_size: int | tuple[int, int], patch: int, channels: int, width: int, depth: int, heads: int, mlp: int,
            window: int, global_layers: tuple[int, ...], rel_pos: bool, abs_pos: bool, eps: float,
            pre_norm: bool = False) -> ViTConfig:
    return ViTConfig(image_size=image_size, patch_size=patch, num_channels=channels, num_classes=0,
                     hidden_size=width, num_layers=depth, num_heads=heads, mlp_size=mlp, layer_norm_eps=eps,
                     class_token=False, pooling="avg", final_norm=False, pos_embed=abs_pos, pre_norm=pre_norm,
                     rel_pos="sam" if rel_pos else "none", window_size=window,
                     global_layers=global_layers if window else ())


def config_from_hf(config_json: Mapping) -> ViTConfig:
    """Our config for an HF ``sam`` / ``sam_vision_model`` config.json."""
    vision = config_json.get("vision_config") if isinstance(config_json.get("vision_config"), Mapping) \
        else config_json
    if vision.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"HF SAM config uses activation {vision.get('hidden_act')!r}; this model reads exact GELU "
                         "only here")
    width, depth = vision.get("hidden_size", 768), vision.get("num_hidden_layers", 12)
    mlp = vision.get("mlp_dim") or int(width * vision.get("mlp_ratio", 4.0))
    return _config(vision.get("image_size", 1024), vision.get("patch_size", 16), vision.get("num_channels", 3),
                   width, depth, vision.get("num_attention_heads", 12), mlp, vision.get("window_size", 14),
                   _layers(vision.get("global_attn_indexes", [2, 5, 8, 11]), depth, "global_attn_indexes"),
                   bool(vision.get("use_rel_pos", True)), bool(vision.get("use_abs_pos", True)),
                   vision.get("layer_norm_eps", 1e-6))


def _encoder(take: _Taker, state: Mapping[str, torch.Tensor], config: ViTConfig, base: str, names: Mapping[str, str]
             ) -> dict[str, torch.Tensor]:
    """The encoder's keys under ``base``, its pieces named by ``names`` (HF's or timm's)."""
    take.skip(*(k for k in state if k.removeprefix(base).startswith(_DROPPED)))
    ours = _linear(take, "patch_embed", f"{base}{names['patch_embed']}")
    if config.pos_embed:
        ours["pos_embed"] = take(f"{base}pos_embed").flatten(1, 2)  # (1, gh, gw, D) -> (1, gh*gw, D), row-major
    if config.pre_norm:
        ours.update(_linear(take, "norm_pre", f"{base}norm_pre"))
    for i in range(config.num_layers):
        layer, b = f"{base}{names['layers']}.{i}", f"blocks.{i}"
        for mine in ("attn.qkv", "attn.proj", "norm1", "norm2", "mlp.fc1", "mlp.fc2"):
            ours.update(_linear(take, f"{b}.{mine}", f"{layer}.{names.get(mine, mine)}"))
        if config.rel_pos == "sam":
            ours[f"{b}.attn.rel_pos_h"], ours[f"{b}.attn.rel_pos_w"] = take(f"{layer}.attn.rel_pos_h"), \
                take(f"{layer}.attn.rel_pos_w")
    take.check_all_used()
    return ours


_HF_NAMES = {"patch_embed": "patch_embed.projection", "layers": "layers", "norm1": "layer_norm1",
             "norm2": "layer_norm2", "mlp.fc1": "mlp.lin1", "mlp.fc2": "mlp.lin2"}
_TIMM_NAMES = {"patch_embed": "patch_embed.proj", "layers": "blocks"}


def state_dict_from_hf(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from an HF SAM one (the image encoder; the rest is dropped by name)."""
    return _encoder(_Taker(state, "HF SAM state dict"), state, config, "vision_encoder.", _HF_NAMES)


def config_from_timm(name: str, state: Mapping[str, torch.Tensor], model_args: Mapping | None = None) -> ViTConfig:
    """Our config for timm's ``samvit_*`` weights; the windows and global layers come from timm's model function
    (``model_args`` override them), the sizes from the weights."""
    args = dict(model_args or {})
    for key in args:
        if key not in MODEL_ARGS_HONOURED | MODEL_ARGS_INERT:
            raise ValueError(f"timm model_args.{key} of {name} is not supported by this program's SAM")
    if any(k.startswith("head.") and k.endswith("weight") for k in state):
        raise ValueError(f"timm {name}: a classifier on SAM's neck is not supported (the neck is not part of "
                         "this model)")
    width, channels, patch, depth = timm_shape(name, state)
    defaults = {768: (12, (2, 5, 8, 11)), 1024: (16, (5, 11, 17, 23)), 1280: (16, (7, 15, 23, 31))}.get(width)
    heads = args.get("num_heads") or (defaults[0] if defaults else None)
    global_layers = args.get("global_attn_indexes", defaults[1] if defaults else None)
    if not heads or global_layers is None:
        raise ValueError(f"cannot tell the heads and global layers of {name} (width {width}); give model_args "
                         "num_heads and global_attn_indexes")
    rel_pos = "blocks.0.attn.rel_pos_h" in state
    window = int(args.get("window_size", 14))
    if "pos_embed" in state:
        grid = tuple(state["pos_embed"].shape[1:3])  # (1, gh, gw, D)
    else:
        size = args.get("img_size", 1024)
        grid = tuple(int(s) // patch for s in (size if isinstance(size, (list, tuple)) else (size, size)))
    image_size = grid[0] * patch if grid[0] == grid[1] else (grid[0] * patch, grid[1] * patch)
    return _config(image_size, patch, channels, width, depth, int(heads), state["blocks.0.mlp.fc1.weight"].shape[0],
                   window, _layers(list(global_layers), depth, "global_attn_indexes"), rel_pos, "pos_embed" in state,
                   1e-5, "norm_pre.weight" in state)  # timm's samvit norms are nn.LayerNorm's default; HF's 1e-6


def state_dict_from_timm(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from timm's SAM one (the neck is dropped by name)."""
    return _encoder(_Taker(state, "timm SAM state dict"), state, config, "", _TIMM_NAMES)
