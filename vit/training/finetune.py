"""Starting a training run from a model the user has (``vit.train --init FILE_OR_FOLDER``).

The source is opened with ``vit.sources.open`` (our checkpoints, HF / timm folders, timm /
torchvision weights). Training runs at the source's own input size unless another is asked
for; the position table is then resampled once, the way the model itself resamples it (as
timm does when fine-tuning at a new resolution). The classifier is kept when the dataset has
the source's classes, and replaced by a freshly initialised one otherwise (also for feature
models, which have none). Images are normalised with the source's own mean and std: the
statistics its weights were trained with.

``--finetune linear-probe`` trains the classifier alone on the frozen model's features (MAE's
``main_linprobe``, DINO's ``eval_linear``); ``--layer-decay`` is the trainer's (``param_groups``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from vit.checkpoint import Checkpoint, Preprocessing
from vit.model import ViT, ViTConfig, resample_pos_embed
from vit.sources.open import open_source

HEAD_KEYS = ("head.weight", "head.bias", "head_dist.weight", "head_dist.bias")


@dataclass
class Init:
    """What a run starts from: the adapted config, the source's normalisation and the weights to load."""

    config: ViTConfig
    mean: tuple[float, ...]
    std: tuple[float, ...]
    state_dict: dict[str, torch.Tensor]  # without the classifier when it was replaced
    head_replaced: bool


def keeps_head(checkpoint: Checkpoint, class_names: list[str] | None, num_classes: int) -> bool:
    """Whether the source's classifier fits the dataset: the same class names (or count, when names are unknown)."""
    if not checkpoint.class_names:
        return False
    if class_names is not None:
        return list(checkpoint.class_names) == list(class_names)
    return len(checkpoint.class_names) == num_classes


def prepare_init(source: str, num_classes: int, class_names: list[str] | None = None,
                 image_size: int | None = None) -> Init:
    """The config and weights to fine-tune ``source`` on a dataset of ``num_classes`` classes at ``image_size``
    (default: the size the source's preprocessing feeds it). Raises ``CheckpointError`` / ValueError."""
    checkpoint = open_source(source)
    config, state = checkpoint.config, dict(checkpoint.model.state_dict())
    if isinstance(config.image_size, tuple) or isinstance(config.patch_size, tuple):
        # The trainer's data pipeline, --image-size and its snapshots are written for square inputs.
        raise ValueError(f"{source} has rectangular patches or images (image_size {config.image_size}, patch_size "
                         f"{config.patch_size}); training starts only from square ones")
    size = image_size or checkpoint.preprocessing.image_size
    if size % config.patch_size:
        raise ValueError(f"--image-size {size} is not a multiple of the model's {config.patch_size}-px patches")
    if size != config.image_size:
        new_grid = (size // config.patch_size,) * 2
        state["pos_embed"] = resample_pos_embed(state["pos_embed"], new_grid, config.grid_size,
                                                config.num_positioned_prefix_tokens, config.pos_embed_antialias)
        config = replace(config, image_size=size)
    keep = keeps_head(checkpoint, class_names, num_classes)
    if not keep:
        state = {k: v for k, v in state.items() if k not in HEAD_KEYS}
        config = replace(config, num_classes=num_classes, distillation_head=False)
    p: Preprocessing = checkpoint.preprocessing
    return Init(config=config, mean=tuple(p.mean), std=tuple(p.std), state_dict=state, head_replaced=not keep)


def load_init(model: ViT, init: Init) -> None:
    """Load ``init``'s weights into a freshly built ``model``; only a replaced classifier may stay as initialised."""
    missing, unexpected = model.load_state_dict(init.state_dict, strict=False)
    allowed = set(HEAD_KEYS) if init.head_replaced else set()
    if unexpected or set(missing) - allowed:
        raise ValueError(f"the --init weights do not fit the run's model: missing {sorted(set(missing) - allowed)}, "
                         f"unexpected {sorted(unexpected)}")


def freeze_all_but_head(model: ViT) -> None:
    """A linear probe: every parameter but the classifier's stops training (``requires_grad`` False, so the
    optimizer never holds it and weight decay never touches it); the frozen weights stay bit-identical."""
    for name, param in model.named_parameters():
        param.requires_grad_(name in HEAD_KEYS)
