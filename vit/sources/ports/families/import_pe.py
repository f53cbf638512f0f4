"""Perception Encoder (Bolya et al. 2025) in our ``ViT``: timm ``vit_pe_*`` weights (timm's ``Eva`` class).

PE is a ViT with a CLS token, a learned position table *and* EVA's rotary positions on the patch tokens' queries and
keys, but counted from 1 with the x bands first (timm ``rope_grid_offset=1``, ``rope_grid_indexing='xy'``:
``ViTConfig.rope="pe"``), a bias-free patch embedding followed by ``norm_pre``, and plain GELU MLPs. PE-core reads
its tokens through an attention-pooling probe of its own 8 heads (``pooling="map"``, ``pool_heads``) and projects
the result to the joint embedding (timm's ``head``, with the zero bias timm gives the original's bias-free ``proj``:
our ``projection``; a head with a bias there is refused in one line); PE-spatial and PE-lang average the patches
without a final norm (a head there is a classifier). What timm's model function fixes inside itself (the rotary
grid, the probe's heads, the norms' eps) is read from timm's own registry, building the named model on the meta
device, as ``vit.sources.ports.libraries.import_timm`` does.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping

import torch

from vit.model import CONFIG_BOUNDS, ViTConfig
from vit.sources.ports.families.import_dinov3 import _linear, _Taker, timm_shape

SUPPORTED = "Perception Encoder: timm vit_pe_* weights (core, spatial, lang)"
MODEL_ARGS_HONOURED = {"img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depth",
                       "num_heads", "mlp_ratio", "init_values", "ref_feat_shape", "dynamic_img_size",
                       "attn_pool_num_heads", "attn_pool_mlp_ratio"}
MODEL_ARGS_INERT = {"drop_rate", "pos_drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate",
                    "head_init_scale", "patch_drop_rate", "device", "dtype"}


def is_pe_name(name: str) -> bool:
    return name.startswith("vit_pe_")


@functools.lru_cache(maxsize=32)
def _registry_facts(name: str, args_json: str) -> tuple[int, int, int, float]:
    """(heads, probe heads or 0, the rotary reference grid, the norms' eps) of timm's ``name`` built with these
    model_args on the meta device; ValueError for what our model cannot express."""
    try:
        import timm
        from timm.layers import Mlp, RotaryEmbeddingCat
        from timm.layers.attention import AttentionRope
    except ImportError:
        raise ValueError(f"reading timm architecture {name} needs timm (pip install timm)") from None
    if not timm.is_model(name):
        raise ValueError(f"timm does not know the architecture {name!r} (timm {timm.__version__})")
    try:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False, **{**json.loads(args_json), "depth": 1})
    except Exception as e:  # timm raises many types on arguments its model function rejects
        raise ValueError(f"timm cannot build {name} with model_args {args_json[:80]} ({type(e).__name__})") from None
    block, rope = model.blocks[0], model.rope
    if type(rope) is not RotaryEmbeddingCat or rope.in_pixels or rope.rotate_half or rope.grid_offset != 1 \
            or rope.grid_indexing != "xy" or rope.ref_feat_shape is None \
            or rope.ref_feat_shape[0] != rope.ref_feat_shape[1]:
        raise ValueError(f"timm {name}: only PE's rotary positions (from 1, x first, a square reference grid) are "
                         "supported")
    if type(block.attn) is not AttentionRope or type(block.mlp) is not Mlp or type(block.mlp.act) is not torch.nn.GELU \
            or not isinstance(block.attn.q_norm, torch.nn.Identity):
        raise ValueError(f"timm {name} cannot be expressed by this program's model (its blocks are "
                         f"{type(block.attn).__name__} / {type(block.mlp).__name__})")
    pool = getattr(model, "attn_pool", None)
    if pool is not None and (pool.latent_len != 1 or type(pool.mlp.act) is not torch.nn.GELU):
        raise ValueError(f"timm {name}: an attention-pooling probe with several latents is not supported")
    return (block.attn.num_heads, pool.num_heads if pool is not None else 0, int(rope.ref_feat_shape[0]),
            float(block.norm1.eps))


def config_from_timm(name: str, state: Mapping[str, torch.Tensor], model_args: Mapping | None = None) -> ViTConfig:
    """Our config for timm's ``vit_pe_*`` weights; ``model_args`` are timm's overrides from its config.json."""
    args = dict(model_args or {})
    for key in args:
        if key not in MODEL_ARGS_HONOURED | MODEL_ARGS_INERT:
            raise ValueError(f"timm model_args.{key} of {name} is not supported by this program's Perception Encoder")
    for key in ("embed_dim", "num_heads", "attn_pool_num_heads"):  # the sizes that make the one meta block cost time
        bound = CONFIG_BOUNDS["hidden_size" if key == "embed_dim" else "num_heads"]
        if key in args and not (isinstance(args[key], int) and 0 < args[key] <= bound):
            raise ValueError(f"timm model_args.{key}={args[key]!r} of {name} is not a size up to {bound:,}")
    if "cls_token" not in state or "pos_embed" not in state or "norm_pre.weight" not in state:
        raise ValueError(f"timm {name}: only PE's layout (CLS token, position table, norm_pre) is supported")
    inert = {k: v for k, v in args.items() if k not in MODEL_ARGS_INERT}
    heads, pool_heads, ref, eps = _registry_facts(name, json.dumps(inert, sort_keys=True, default=str))
    width, channels, patch, depth = timm_shape(name, state)
    positions = state["pos_embed"].shape[1] - 1
    grid = int(round(positions ** 0.5))
    if grid * grid != positions:
        raise ValueError(f"timm {name}: a position table of {positions + 1} entries is not 1 + a square grid")
    probe = "attn_pool.latent" in state
    if args.get("global_pool", "map" if probe else "avg") != ("map" if probe else "avg"):
        raise ValueError(f"timm global_pool {args['global_pool']!r} of {name} is not supported with these weights")
    head = state["head.weight"].shape[0] if "head.weight" in state else 0
    return ViTConfig(  # behind a probe the head is PE-core's projection; behind the mean, a fine-tuned classifier
        image_size=grid * patch, patch_size=patch, num_channels=channels, num_classes=0 if probe else head,
        projection_dim=head if probe else 0,
        hidden_size=width, num_layers=depth,
        num_heads=int(heads), mlp_size=state["blocks.0.mlp.fc1.weight"].shape[0],
        qkv_bias="blocks.0.attn.qkv.bias" in state, layer_norm_eps=eps, pre_norm=True,
        layer_scale=float(args.get("init_values") or 1.0) if "blocks.0.gamma_1" in state else None,
        pooling="map" if probe else "avg", final_norm="norm.weight" in state, pos_embed_antialias=True,
        rope="pe", rope_theta=10000.0, rope_ref_grid=ref, pool_heads=pool_heads if probe else 0,
        pool_mlp_size=state["attn_pool.mlp.fc1.weight"].shape[0] if probe else 0)


def state_dict_from_timm(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from timm's PE one; ValueError on any key it cannot place."""
    take = _Taker(state, "timm Perception Encoder state dict")
    weight = take("patch_embed.proj.weight")
    ours = {"cls_token": take("cls_token"), "pos_embed": take("pos_embed"), "patch_embed.weight": weight,
            "patch_embed.bias": take.get("patch_embed.proj.bias"), **_linear(take, "norm_pre", "norm_pre")}
    if ours["patch_embed.bias"] is None:  # PE's patch embedding has no bias (its norm_pre follows)
        ours["patch_embed.bias"] = torch.zeros_like(weight[:, 0, 0, 0])
    if config.final_norm:
        ours.update(_linear(take, "norm", "norm"))
    if config.projection_dim:
        ours["projection.weight"] = take("head.weight")
        bias = take.get("head.bias")
        if bias is not None and bias.device.type != "meta" and bool(bias.count_nonzero()):
            raise ValueError("timm head.bias is not zero, so the head behind PE-core's probe is no projection (a "
                             "classifier there is not supported yet)")
    elif config.num_classes:
        ours.update(_linear(take, "head", "head"))
    if config.pooling == "map":
        ours.update(timm_probe(take))
    for i in range(config.num_layers):
        b = f"blocks.{i}"
        for part in ("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2"):
            ours.update(_linear(take, f"{b}.{part}", f"{b}.{part}"))
        if config.layer_scale is not None:
            ours[f"{b}.ls1"], ours[f"{b}.ls2"] = take(f"{b}.gamma_1"), take(f"{b}.gamma_2")
    take.check_all_used()
    return ours


def timm_probe(take: _Taker) -> dict[str, torch.Tensor]:
    """timm's attention-pooling probe (``AttentionPoolLatent``, named as ours): latent, q, kv, proj, norm, MLP."""
    ours = {"attn_pool.latent": take("attn_pool.latent")}
    for part in ("q", "kv", "proj", "norm", "mlp.fc1", "mlp.fc2"):
        ours.update(_linear(take, f"attn_pool.{part}", f"attn_pool.{part}"))
    return ours
