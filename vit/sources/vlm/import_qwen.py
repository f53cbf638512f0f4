"""Qwen2.5-VL's and Qwen3-VL's vision towers in our ``ViT``, read from the VLM's own folder (HF
``Qwen2_5_VLForConditionalGeneration`` / ``Qwen3VLForConditionalGeneration`` ``save_pretrained``, a Hub snapshot),
without importing transformers and without reading the language model.

Both feed each still image as ``temporal_patch_size`` identical frames to a ``Conv3d``, which is a ``Conv2d`` whose
kernel is the sum of its temporal slices; both turn q and k by 2D rotary positions on the patch indices
(``ViTConfig.rope="qwen"``) and end in a patch merger to the language model's width, each 2x2 merge unit's tokens
concatenated (``ViTConfig.projector="qwen"``, ``ViT.project``).

- Qwen2.5-VL (HF ``Qwen2_5_VisionTransformerPretrainedModel``): 14-px patches, a bias-free stem, no position table,
  RMSNorm blocks with a SwiGLU MLP, attention in 112-px windows of whole merge units (``window_size`` /
  ``spatial_merge``: Qwen's window index is the layout's data, ``LayerLayout.unit``), global in
  ``fullatt_block_indexes``.
- Qwen3-VL (HF ``Qwen3VLVisionModel``): 16-px patches, a learned square position table resized to each grid
  (bilinear, ``align_corners=True``: ``pos_resize="bilinear_corners"``) beside the rotary positions, LayerNorm blocks
  with a tanh-GELU MLP, global attention everywhere, and DeepStack: mergers of the outputs of
  ``deepstack_visual_indexes`` too (``ViTConfig.deepstack_layers``, ``ViT.project(x, grid, tap=i)``).

Our tokens stay row-major on the grid. Each image keeps its aspect ratio: the processor's ``smart_resize`` brings it
to sides of whole merge units (28 or 32 px) with between ``min_pixels`` and ``max_pixels`` pixels
(``vit.core.images.smart_resize``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

from vit.checkpoint import Preprocessing
from vit.model import ViTConfig
from vit.sources.hf_preprocessing import qwen_nominal_size
from vit.sources.ports.families.import_dinov3 import _linear, _Taker, activation

SUPPORTED = ("Qwen2-VL, Qwen2.5-VL and Qwen3-VL vision towers: HF Qwen2VL / Qwen2_5_VL / Qwen3VL "
             "...ForConditionalGeneration, ...Model")
ARCHITECTURES = ("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLModel")
# Qwen2-VL: Qwen2.5-VL's rotary positions and merger without its windows, a LayerNorm tower with a QuickGELU MLP
QWEN2_ARCHITECTURES = ("Qwen2VLForConditionalGeneration", "Qwen2VLModel")
QWEN3_ARCHITECTURES = ("Qwen3VLForConditionalGeneration", "Qwen3VLModel")
# Qwen3-VL-MoE (Qwen3-VL-30B-A3B, 235B-A22B): Qwen3-VL's tower, module for module, beside a mixture-of-experts LM
QWEN3_MOE_ARCHITECTURES = ("Qwen3VLMoeForConditionalGeneration", "Qwen3VLMoeModel")
QWEN3_TYPES = ("qwen3_vl", "qwen3_vl_moe")
NAMES = {"qwen2_vl": "Qwen2-VL", "qwen2_5_vl": "Qwen2.5-VL", "qwen3_vl": "Qwen3-VL", "qwen3_vl_moe": "Qwen3-VL-MoE"}
# Where the tower's tensors live: the Hub's layout (what save_pretrained writes), or transformers' module path
TOWER_PREFIXES = ("visual.", "model.visual.")


def _whole(value, name: str, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"Qwen-VL vision_config.{name} must be a whole number of at least {least}, got "
                         f"{str(value)[:40]}")
    return value


def _layers(values, depth: int, name: str) -> tuple[int, ...]:
    if not isinstance(values, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                        and 0 <= i < depth for i in values):
        raise ValueError(f"Qwen-VL vision_config.{name} {str(values)[:60]} must be layer numbers from 0 to "
                         f"{depth - 1}")
    return tuple(values)


def config_from_hf(config_json: Mapping) -> ViTConfig:
    """Our config for a ``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl`` or ``qwen3_vl_moe`` config.json (its
    ``vision_config``)."""
    qwen3 = config_json.get("model_type") in QWEN3_TYPES
    name = NAMES[config_json.get("model_type") if qwen3 else "qwen2_5_vl"]
    vision = config_json.get("vision_config")
    if not isinstance(vision, Mapping):
        raise ValueError(f"{name} config.json has no vision_config")
    if config_json.get("model_type") == "qwen2_vl":
        return _qwen2_config(vision)
    act = vision.get("hidden_act", "gelu_pytorch_tanh" if qwen3 else "silu")
    if not qwen3 and act != "silu":
        raise ValueError(f"Qwen2.5-VL vision_config.hidden_act {act!r}: this tower reads SiLU only")
    rope = vision.get("rope_parameters") or {}
    if not isinstance(rope, Mapping) or rope.get("rope_type", "axial") != "axial":
        raise ValueError(f"{name} vision_config.rope_parameters {str(rope)[:60]}: only the axial rope is read")
    patch = _whole(vision.get("patch_size", 16 if qwen3 else 14), "patch_size")
    merge = _whole(vision.get("spatial_merge_size", 2), "spatial_merge_size")
    depth = _whole(vision.get("depth", 27 if qwen3 else 32), "depth")
    common = dict(
        patch_size=patch, num_channels=_whole(vision.get("in_channels", vision.get("in_chans", 3)), "in_channels"),
        num_classes=0, hidden_size=_whole(vision.get("hidden_size", 1152 if qwen3 else 1280), "hidden_size"),
        num_layers=depth, num_heads=_whole(vision.get("num_heads", 16), "num_heads"),
        mlp_size=_whole(vision.get("intermediate_size", 4304 if qwen3 else 3420), "intermediate_size"),
        layer_norm_eps=1e-6, class_token=False, pooling="avg", final_norm=False, rope="qwen",
        rope_theta=float(rope.get("rope_theta", vision.get("rope_theta", 10000.0))), spatial_merge=merge,
        projector="qwen", projector_dim=_whole(vision.get("out_hidden_size", 3584), "out_hidden_size"))
    if qwen3:
        positions = _whole(vision.get("num_position_embeddings", 2304), "num_position_embeddings")
        side = math.isqrt(positions)
        if side * side != positions:
            raise ValueError(f"Qwen3-VL vision_config.num_position_embeddings {positions} is no square table")
        return ViTConfig(image_size=side * patch, activation=activation(act), pos_resize="bilinear_corners",
                         deepstack_layers=_layers(vision.get("deepstack_visual_indexes", (8, 16, 24)), depth,
                                                  "deepstack_visual_indexes"), **common)
    window_px = _whole(vision.get("window_size", 112), "window_size")
    if window_px % (patch * merge):
        raise ValueError(f"Qwen2.5-VL vision_config.window_size {window_px} px is no whole number of "
                         f"{patch * merge} px merge units")
    return ViTConfig(  # its image_size named only, no table depends on it: config.json states no pixel bounds, so
        # the square rounded to whole units (the checkpoint's preprocessing names its processor's: hf_preprocessing)
        image_size=qwen_nominal_size(patch * merge)[0], pos_embed=False, norm="rms",
        activation="silu", gated_mlp=True, window_size=window_px // patch,
        global_layers=_layers(vision.get("fullatt_block_indexes", (7, 15, 23, 31)), depth, "fullatt_block_indexes"),
        **common)


def _qwen2_config(vision: Mapping) -> ViTConfig:
    """Qwen2-VL's tower (HF ``Qwen2VisionTransformerPretrainedModel``): ``embed_dim`` wide (its ``hidden_size`` is
    the language model's, the merger's output), LayerNorms, a ``mlp_ratio`` MLP with ``hidden_act`` (QuickGELU),
    every layer global, the rotary positions and merger of Qwen2.5-VL."""
    patch = _whole(vision.get("patch_size", 14), "patch_size")
    merge = _whole(vision.get("spatial_merge_size", 2), "spatial_merge_size")
    width = _whole(vision.get("embed_dim", 1280), "embed_dim")
    ratio = vision.get("mlp_ratio", 4)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 64 or (ratio * width) % 1:
        raise ValueError(f"Qwen2-VL vision_config.mlp_ratio {str(ratio)[:20]} gives no whole MLP width")
    return ViTConfig(
        image_size=qwen_nominal_size(patch * merge)[0], patch_size=patch,
        num_channels=_whole(vision.get("in_channels", vision.get("in_chans", 3)), "in_channels"), num_classes=0,
        hidden_size=width, num_layers=_whole(vision.get("depth", 32), "depth"),
        num_heads=_whole(vision.get("num_heads", 16), "num_heads"), mlp_size=int(ratio * width), layer_norm_eps=1e-6,
        class_token=False, pooling="avg", final_norm=False, rope="qwen", rope_theta=10000.0, spatial_merge=merge,
        projector="qwen", projector_dim=_whole(vision.get("hidden_size", 3584), "hidden_size"), pos_embed=False,
        activation=activation(vision.get("hidden_act", "quick_gelu")))


def tower_prefix(keys) -> str:
    """Which of ``TOWER_PREFIXES`` the tower's keys carry; ValueError when none does."""
    keys = list(keys)
    for prefix in TOWER_PREFIXES:
        if any(k.startswith(prefix) for k in keys):
            return prefix
    raise ValueError(f"no vision tower (keys starting {' or '.join(TOWER_PREFIXES)}) among the weights")


def wanted(config_json: Mapping) -> Callable[[str], bool]:
    """Which tensors of the VLM's weights to read: the tower's and its mergers', never the language model's."""
    return lambda key: key.startswith(TOWER_PREFIXES)


def state_dict_from_hf(state: Mapping[str, torch.Tensor], config: ViTConfig) -> dict[str, torch.Tensor]:
    """Our state dict from the tower's keys of a Qwen2.5-VL or Qwen3-VL one (the language model's keys are not
    expected: the reader leaves them unread); ValueError on any tower key it cannot place."""
    base = tower_prefix(state)
    state = {k: v for k, v in state.items() if k.startswith(base)}
    qwen3 = config.pos_embed  # of the three, only Qwen3-VL has a position table
    qwen2 = not qwen3 and config.norm != "rms"  # Qwen2-VL: LayerNorms, Qwen2.5-VL: RMSNorms
    take = _Taker(state, f"{'Qwen3-VL' if qwen3 else 'Qwen2-VL' if qwen2 else 'Qwen2.5-VL'} vision tower")
    kernel = take(f"{base}patch_embed.proj.weight")  # (D, C, T, P, P): T identical frames of a still image
    if kernel.dim() != 5:
        raise ValueError(f"Qwen-VL patch_embed.proj.weight has shape {tuple(kernel.shape)}, not (D, C, T, P, P)")
    bias = take.get(f"{base}patch_embed.proj.bias")  # Qwen3-VL's; Qwen2.5-VL's stem has none
    ours = {"patch_embed.weight": kernel.sum(dim=2),
            "patch_embed.bias": kernel.new_zeros(kernel.shape[0]) if bias is None else bias}
    if qwen3:
        ours["pos_embed"] = take(f"{base}pos_embed.weight")[None]  # (1, side², D), row-major over the square table
    mlp = (("mlp.fc1", "mlp.linear_fc1"), ("mlp.fc2", "mlp.linear_fc2")) if qwen3 else (
        ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")) if qwen2 else (
        ("mlp.fc1_g", "mlp.gate_proj"), ("mlp.fc1", "mlp.up_proj"), ("mlp.fc2", "mlp.down_proj"))
    for i in range(config.num_layers):
        layer, b = f"{base}blocks.{i}", f"blocks.{i}"
        for mine, theirs in (("attn.qkv", "attn.qkv"), ("attn.proj", "attn.proj"), *mlp):
            ours.update(_linear(take, f"{b}.{mine}", f"{layer}.{theirs}"))
        for norm in ("norm1", "norm2"):
            ours.update(_norm(take, f"{b}.{norm}", f"{layer}.{norm}", qwen3 or qwen2))
    if qwen3:
        mergers = [("projector", f"{base}merger")] + [(f"deepstack.{i}", f"{base}deepstack_merger_list.{i}")
                                                     for i in range(len(config.deepstack_layers))]
        for mine, theirs in mergers:
            ours.update(_norm(take, f"{mine}.norm", f"{theirs}.norm", True))
            ours.update(_linear(take, f"{mine}.fc1", f"{theirs}.linear_fc1"))
            ours.update(_linear(take, f"{mine}.fc2", f"{theirs}.linear_fc2"))
    else:
        ours.update(_norm(take, "projector.norm", f"{base}merger.ln_q", qwen2))
        ours.update(_linear(take, "projector.fc1", f"{base}merger.mlp.0"))
        ours.update(_linear(take, "projector.fc2", f"{base}merger.mlp.2"))
    take.check_all_used()
    return ours


def _norm(take: _Taker, ours: str, theirs: str, layer_norm: bool) -> dict[str, torch.Tensor]:
    """A LayerNorm's weight and bias (Qwen2-VL, Qwen3-VL), or an RMSNorm's weight (Qwen2.5-VL)."""
    out = {f"{ours}.weight": take(f"{theirs}.weight")}
    if layer_norm:
        out[f"{ours}.bias"] = take(f"{theirs}.bias")
    return out


def tower_note(config_json: Mapping, config: ViTConfig, preprocessing: Preprocessing) -> str:
    """``metadata["tower"]``, as a LLaVA's says it (``import_vlm.reading``): where the language model reads the tower,
    and that each image is shown at its own size, not at the ``image_size`` the config is built at."""
    name = NAMES.get(str(config_json.get("model_type")), "Qwen-VL")
    unit = config.spatial_merge
    note = (f"{name} reads this tower after all its {config.num_layers} layers, through its patch merger (a norm, "
            f"each {unit}×{unit} merge unit's {unit * unit} tokens concatenated, linear, GELU, linear), the tower's "
            "ViT.project")
    taps = config.deepstack_layers
    if taps:  # Qwen3-VL: the language model's first layers read these too
        layers = ", ".join(str(i + 1) for i in taps[:-1]) + (" and " if len(taps) > 1 else "") + str(taps[-1] + 1)
        note += (f", and the output{'s' if len(taps) > 1 else ''} of its layer{'s' if len(taps) > 1 else ''} {layers} "
                 f"(deepstack_visual_indexes {list(taps)}) through {'their' if len(taps) > 1 else 'its'} DeepStack "
                 f"merger{'s' if len(taps) > 1 else ''} (ViT.project with tap)")
    return (f"{note}. It is shown each image at its own size ({preprocessing.own_size_rule}), its aspect ratio kept: "
            "the image's caption gives its grid.")
