"""open_clip image towers its port refuses, as open_clip builds them, through the recorder at the attention function
(``recorded_road``): CoCa's (``attentional_pool``: 256 learnt queries pooling the tokens after the blocks, which the
recorder names and leaves out), and any other option the port does not express. The tower's output is open_clip's
image embedding; where the tokens sit is the recorder's road's reading of one meta forward.

The ResNet towers (``ModifiedResNet``: RN50, RN101, RN50x4 ...) are given their layout: their one attention layer is
the ``AttentionPool2d`` head, ``nn.MultiheadAttention``'s function over the ``1 + H*W`` tokens of the last feature map,
the mean token first and then the map's cells row-major (``x.reshape(N, C, H*W)``), a grid its
``positional_embedding`` declares (``(1 + side**2, C)``: ``image_size // 32`` a side).

A tower whose trunk is a timm model goes timm's explicit road instead (``timm_models.open_clip_library``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import torch

from vit.checkpoint import Checkpoint
from vit.model import ViTConfig
from vit.sources.files import SourceError, _one_line


def open_clip_recorded(path: Path, state: Mapping[str, torch.Tensor], config_json: Mapping, preprocessing_of,
                       map_location: str | torch.device = "cpu") -> Checkpoint:
    """An open_clip image tower (not a timm trunk's) from its ``visual.*`` weights, loaded strictly into the tower
    open_clip builds from ``open_clip_config.json``, its attention recorded; ``preprocessing_of(stand_in)`` is
    open_clip's transform for a ``ViTConfig``. SourceError (one line) for weights that do not fit or attention the
    recorder cannot place."""
    from vit.sources.library_road import recorded_road, timm_models

    model_cfg = config_json.get("model_cfg") if isinstance(config_json.get("model_cfg"), Mapping) else {}
    vision = model_cfg.get("vision_cfg") if isinstance(model_cfg.get("vision_cfg"), Mapping) else {}
    resnet = isinstance(vision.get("layers"), (list, tuple))
    kind = "ResNet" if resnet else "tower"
    origin = f"{path} (open_clip {kind}, opened as open_clip builds it)"
    declared = {k: v for k, v in vision.items() if k in ("width", "image_size", "patch_size", "head_width",
                                                         "attn_pooler_queries", "attn_pooler_heads")}
    declared.update(depths=list(vision.get("layers") or []) if resnet else [vision.get("layers", 0)],
                    embed_dim=model_cfg.get("embed_dim", 0))
    problem = timm_models._declared_problem(declared)
    if problem:
        raise SourceError(f"{origin}: {problem}")
    try:
        tower = timm_models.tower_fitting(int(model_cfg.get("embed_dim", 0)), vision, state, map_location)
        size = tower.image_size if isinstance(tower.image_size, int) else int(tower.image_size[0])
        if resnet:
            tokens = int(tower.attnpool.positional_embedding.shape[0])
            side = math.isqrt(tokens - 1)
            if side * side != tokens - 1:
                raise ValueError(f"its positional_embedding's {tokens} rows are no mean token and a square grid")
            said = preprocessing_of(ViTConfig(image_size=size, patch_size=size // side, num_classes=0))
            # the mean token first (prefix 1), then the last map's side x side cells row-major
            checkpoint = recorded_road._open_recorded(tower, origin, said.image_hw, said.mean, said.std, (side, side),
                                                      1)
        else:
            patch = tower.patch_size if isinstance(tower.patch_size, int) else int(tower.patch_size[0])
            said = preprocessing_of(ViTConfig(image_size=size, patch_size=patch, num_classes=0))
            checkpoint = recorded_road._open_recorded(tower, origin, said.image_hw, said.mean, said.std, None, None)
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError, AssertionError, SourceError) as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None
    architecture = "open_clip:resnet" if resnet else "open_clip:recorded"
    checkpoint.path = path
    checkpoint.metadata["source"].update(kind="open_clip", path=str(path), architecture=architecture)
    checkpoint.metadata["architecture"] = architecture
    return checkpoint
