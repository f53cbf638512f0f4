"""GroupViT's vision tower (issue 117, item 6): its first stage attends over the image's patches with learnt group
tokens appended after them (``GroupViTStage.concat_x``: ``torch.cat([x, group_token], dim=1)``); a token-assign step
then merges the patches into those groups, and every later stage attends over groups, which sit nowhere on the image.

The first stage's calls are the layers, over the patch grid and the group tokens as tokens after it (named by their
parameter); the assign steps' cross-attention and the later stages' calls are run, never layers, and named. Read from
the traced forward: a call is a layer only where its queries and keys are the grid's patches plus the first stage's
``group_token`` rows, made inside that stage's layers.
"""

from __future__ import annotations

import torch

from vit.core.attention_recorder import AttentionCall
from vit.sources.library_road.placing.image_tokens import ImageTokenCalls

STAGE = "GroupViTStage"  # the module class whose layers run over its input tokens plus its own group tokens


def first_stage(model: torch.nn.Module) -> tuple[str, str, int] | None:
    """The first grouping stage in ``model``: its name, its ``group_token`` parameter's name and that parameter's
    token count; None where the model has none."""
    for name, module in model.named_modules():
        if type(module).__name__ == STAGE:
            group = getattr(module, "group_token", None)
            if not isinstance(group, torch.nn.Parameter) or group.dim() != 3:
                return None
            return name, f"{name}.group_token", int(group.shape[1])
    return None


def split_groups(model: torch.nn.Module, calls: list[AttentionCall], grid: tuple[int, int] | None
                 ) -> tuple[ImageTokenCalls, int] | None:
    """The first stage's calls over ``grid``'s patches then its group tokens (the layers), the others set aside,
    and the number of group tokens; None where ``model`` has no grouping stage or no call fits."""
    stage = first_stage(model)
    if stage is None or grid is None:
        return None
    name, parameter, groups = stage
    tokens = grid[0] * grid[1] + groups
    kept = [c for c in calls if c.queries == c.keys == tokens and c.batch == 1 and c.name.startswith(f"{name}.layers.")]
    if not kept:
        return None
    others = [c for c in calls if c not in kept]
    if any(c.index < kept[-1].index for c in others):  # a call among the first stage's layers that is none of them
        return None
    return ImageTokenCalls(tokens, tuple(grid), tuple(kept), tuple(others), f"group tokens, {parameter}"), groups
