"""The tokens beside the patches of a transformers vision tower with no module named ``embeddings`` (issue 117,
item 6), where the library road counts them from: each tower's own token parameters, placed where its modelling file's
forward puts them, or a one-line refusal.

- Llama 4's vision model (``Llama4VisionModel``) appends its ``class_embedding`` after the patches
  (``torch.cat([hidden_state, class_embedding], dim=1)``): no token before them, one after.

(Qwen 2.5-VL's and Qwen3-VL's towers, fed their processor's flattened patches, and Llama 3.2 Vision's, fed its tile
slots, open through ``library_road.merged_towers`` and ``library_road.tiled_towers`` and never come here.)
"""

from __future__ import annotations

import torch

# class -> (its token parameters before the patches, those after them), as its forward concatenates them
TOKENS = {"Llama4VisionModel": ((), ("class_embedding",))}


def count(model: torch.nn.Module, after: bool) -> int:
    """The tokens ``model`` (a tower with no ``embeddings`` module) has before its patches (``after`` False) or after
    them; ValueError (one line) for a tower this module does not place."""
    name = type(model).__name__
    if name not in TOKENS:
        raise ValueError("it has no embeddings module to count its prefix tokens from")
    own = dict(model.named_parameters(recurse=False))
    return sum(1 if own[p].dim() == 1 else int(own[p].shape[-2]) for p in TOKENS[name][after])
