"""The visual logit lens: where in the image a VLM's projected tokens point at a word, without running its LM.

Each image token the projector hands the language model (``ViT.project``, HF ``get_image_features``) is scored by its
dot product with a word's input embedding (the rows of the LM's ``embed_tokens.weight``; a word of several tokens: the
mean of their rows, so its map is the mean of its tokens' maps): the logit the word would get from that token through
a language model head tied to its input embedding, at the LM's input, before any norm. Cf. clemneo/llava-interp's
``create_logit_lens.py``, which reads every LM layer through the final norm and ``lm_head``. The raw rows are used, as
``get_input_embeddings().weight`` holds them: Gemma's ``sqrt(width)`` factor on its embeddings, one positive constant
per model, would scale every map of it alike.
"""

from __future__ import annotations

import torch


def leading_rows(model) -> int:
    """The rows ``ViT.project`` gives before its patch units: the prefix tokens the projector keeps (LLaVA's "full"
    strategy keeps CLIP's CLS, which the language model reads as one more image token); 0 for every other tower."""
    return max(0, model.num_prefix_tokens - model.config.projector_skip)


def on_patch_grid(values: torch.Tensor, grid: tuple[int, int], unit: int = 1, lead: int = 0) -> torch.Tensor:
    """``values`` (W, lead + N), one value per image token of an input on patch grid ``grid`` (``lead`` prefix
    tokens, then units row-major, each spanning ``unit`` x ``unit`` patches) -> (W, gh, gw): each patch holds the
    value of the token whose unit covers it; the prefix tokens cover no patch."""
    gh, gw = grid
    if gh % unit or gw % unit or values.shape[-1] != lead + (gh // unit) * (gw // unit):
        after = f" after {lead} prefix token(s)" if lead else ""
        raise ValueError(f"{values.shape[-1]} image tokens do not tile a {gh}x{gw} patch grid in "
                         f"{unit}x{unit} units{after}")
    units = values[:, lead:].reshape(-1, gh // unit, gw // unit)  # (W, gh/u, gw/u)
    return units.repeat_interleave(unit, 1).repeat_interleave(unit, 2)  # (W, gh, gw)


def lens_maps(projected: torch.Tensor, vectors: torch.Tensor, grid: tuple[int, int], unit: int = 1,
              lead: int = 0) -> torch.Tensor:
    """``projected`` (lead + N, E), the image tokens of an input on patch grid ``grid`` (``lead`` prefix tokens, then
    units row-major, each spanning ``unit`` x ``unit`` patches), and ``vectors`` (W, E), one per word -> (W, gh, gw):
    each patch holds the dot product of the token whose unit covers it with each word's vector; the prefix tokens
    cover no patch."""
    on_patch_grid(projected.new_zeros(1, projected.shape[0]), grid, unit, lead)  # its shape checked before the work
    scores = vectors.to(projected.dtype) @ projected.T  # (W, lead + N)
    return on_patch_grid(scores, grid, unit, lead)
