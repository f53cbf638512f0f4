"""The optimizer's parameter groups (weight decay, layer-wise learning-rate decay) and the learning rate's schedule
(a warmup, then a cosine or a constant rate; a time budget's corrections of the cosine), as the trainer applies them.
"""

from __future__ import annotations

import math

from vit.model import ViT

WARMUP_START = 1e-3  # the warmup's first step trains at this share of the peak


def schedule_factor(step: int, warmup: int, total: int, schedule: str, floor: float,
                    segments: tuple[tuple[int, float, int], ...] = ()) -> float:
    """The learning rate after ``step`` optimizer steps as a share of the peak: linear from ``WARMUP_START`` over
    ``warmup`` steps, then constant or a half cosine down to ``floor`` (--min-lr / --lr) at step ``total``.

    ``segments`` (a time budget's corrections, in order): from each ``(start, share, end)`` on, a half cosine from
    ``share`` (the rate the schedule had reached at ``start``) down to ``floor`` at step ``end``."""
    if step < warmup:
        return WARMUP_START + (1.0 - WARMUP_START) * step / warmup
    if schedule == "constant":
        return 1.0
    start, share, total = next(((a, f, b) for a, f, b in reversed(segments) if step >= a), (warmup, 1.0, total))
    progress = min((step - start) / max(total - start, 1), 1.0)
    return floor + (share - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


# The prefix tokens and the position table: never weight-decayed (timm's rule, with every parameter of one
# dimension: biases, norms, layer scales), and at depth 0 for layer-wise lr decay, with the patch embedding.
TOKEN_TABLES = ("cls_token", "pos_embed", "dist_token", "reg_token")


def layer_id(name: str, num_layers: int) -> int:
    """A parameter's depth for layer-wise lr decay, as MAE's ``util/lr_decay.get_layer_id_for_vit`` (after BEiT):
    0 for the embeddings (patches and vit-pytorch's norms around them, positions, CLS / distillation / register
    tokens, and ``norm_pre``, which normalises them), i + 1 for block i, ``num_layers`` + 1 for everything after
    the blocks (final norm, pooling, classifier). timm's ``param_groups_layer_decay`` differs in one place: it
    puts the final norm with the last block."""
    if name in TOKEN_TABLES or name.split(".")[0] in ("patch_embed", "norm_pre", "patch_norm", "embed_norm"):
        return 0
    if name.startswith("blocks."):
        return int(name.split(".")[1]) + 1
    return num_layers + 1


def param_groups(model: ViT, weight_decay: float, decay_everything: bool = False,
                 layer_decay: float = 1.0) -> list[dict]:
    """AdamW parameter groups of the parameters that train (``requires_grad``), each with its ``lr_scale``.

    No weight decay on biases, norms, the CLS token and position embeddings (timm's rule), except with
    ``decay_everything`` (the seed recipe: the blog's AdamW decays every parameter). With ``layer_decay`` < 1
    the groups are split by depth (``layer_id``) and scaled ``layer_decay ** (L + 1 - layer)`` for L blocks, as
    MAE's ``param_groups_lrd``; otherwise there are two groups, decayed first, so that a checkpoint's optimizer
    state always fits.
    """
    num_layers = len(model.blocks)
    no_decay_wd = weight_decay if decay_everything else 0.0
    groups: dict[tuple[int, bool], dict] = {}
    if layer_decay == 1.0:
        groups = {(0, True): {"params": [], "weight_decay": weight_decay, "lr_scale": 1.0},
                  (0, False): {"params": [], "weight_decay": no_decay_wd, "lr_scale": 1.0}}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        decays = not (param.ndim <= 1 or name in TOKEN_TABLES)
        layer = layer_id(name, num_layers) if layer_decay != 1.0 else 0
        group = groups.setdefault((layer, decays), {
            "params": [], "weight_decay": weight_decay if decays else no_decay_wd,
            "lr_scale": layer_decay ** (num_layers + 1 - layer)})
        group["params"].append(param)
    return list(groups.values())
