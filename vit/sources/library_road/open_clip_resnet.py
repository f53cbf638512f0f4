"""open_clip's ResNet image towers (``ModifiedResNet``: RN50, RN101, RN50x4 ...) as open_clip builds them, through
the recorder at the attention function (``recorded_road``). Their one attention layer is the ``AttentionPool2d``
head: ``nn.MultiheadAttention``'s function over the ``1 + H*W`` tokens of the last feature map, the mean token first
and then the map's cells row-major (``x.reshape(N, C, H*W)``), a grid its ``positional_embedding`` declares
(``(1 + side**2, C)``: ``image_size // 32`` a side). The tower's output is open_clip's image embedding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import torch

from vit.checkpoint import Checkpoint
from vit.model import ViTConfig
from vit.sources.files import SourceError, _one_line


def open_clip_resnet(path: Path, state: Mapping[str, torch.Tensor], config_json: Mapping, preprocessing_of,
                     map_location: str | torch.device = "cpu") -> Checkpoint:
    """An open_clip ResNet tower (``vision_cfg.layers`` a list) from its ``visual.*`` weights, loaded strictly, its
    attention-pooling head recorded; ``preprocessing_of(stand_in)`` is open_clip's transform for a ``ViTConfig``.
    SourceError (one line) for weights that do not fit or a head the recorder cannot place."""
    import open_clip

    from vit.sources.library_road import recorded_road, timm_models

    origin = f"{path} (open_clip ResNet, opened as open_clip builds it)"
    model_cfg = config_json.get("model_cfg") if isinstance(config_json.get("model_cfg"), Mapping) else {}
    vision = model_cfg.get("vision_cfg") if isinstance(model_cfg.get("vision_cfg"), Mapping) else {}
    problem = timm_models._declared_problem({"depths": list(vision.get("layers") or []),
                                             **{k: v for k, v in vision.items() if k in ("width", "image_size")},
                                             "embed_dim": model_cfg.get("embed_dim", 0)})
    if problem:
        raise SourceError(f"{origin}: {problem}")
    visual = {k.removeprefix("visual."): v for k, v in state.items() if k.startswith("visual.")}
    meta = torch.device(map_location).type == "meta"
    try:
        with torch.device("meta" if meta else "cpu"):
            tower = open_clip.model._build_vision_tower(int(model_cfg.get("embed_dim", 0)), dict(vision))
        tower.load_state_dict(visual, strict=True, assign=meta)
        tower = tower.to(map_location).eval()
        tokens = int(tower.attnpool.positional_embedding.shape[0])
        side = math.isqrt(tokens - 1)
        if side * side != tokens - 1:
            raise ValueError(f"its positional_embedding's {tokens} rows are no mean token and a square grid")
        size = tower.image_size if isinstance(tower.image_size, int) else int(tower.image_size[0])
        said = preprocessing_of(ViTConfig(image_size=size, patch_size=size // side, num_classes=0))
        # the mean token first (prefix 1), then the last map's side x side cells row-major
        checkpoint = recorded_road._open_recorded(tower, origin, said.image_hw, said.mean, said.std, (side, side), 1)
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError, AssertionError, SourceError) as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None
    checkpoint.path = path
    checkpoint.metadata["source"].update(kind="open_clip", path=str(path), architecture="open_clip:resnet")
    checkpoint.metadata["architecture"] = "open_clip:resnet"
    return checkpoint
