"""What every mechanism analysis (``vit.explain.mechanism.components``, ``interventions``, ``phenomena``) stands on:
the model's forward read at its hook points (``hidden_states``: block inputs and the last output of one pass), a
hook that replaces a layer's per-head contexts, one class per image, and the refusals they share (``MechanismError``;
our eval-mode ``ViT`` only, one grid of one width where the layers are stacked, at most ``MAX_ELEMENTS`` floats a
step).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from vit.explain.methods.hidden import forward_with_hidden_states
from vit.model import ViT

Progress = Callable[[int, int], None]  # progress(passes done, total), called between chunks; it may raise to stop

MAX_ELEMENTS = 2**29  # floats one step may hold (2 GiB of float32); past it a function refuses


class MechanismError(ValueError):
    """The model, the input or the request is one these analyses cannot handle; the message says what to do."""


def check_supported(model: nn.Module, needs_head: bool = False) -> None:
    """Raise ``MechanismError`` unless ``model`` is our ``ViT`` in eval mode (with a classifier if ``needs_head``)."""
    if not isinstance(model, ViT):
        raise MechanismError(f"mechanism analyses need this project's ViT, got {type(model).__name__}")
    if model.training:
        raise MechanismError("the model is in training mode (dropout makes results random); call model.eval()")
    if needs_head and model.head is None:
        raise MechanismError("the model has no classifier head, so there are no class logits to analyse; "
                             "pick a classification model")


def check_budget(elements: int, what: str) -> None:
    """Refuse a step that would hold more than ``MAX_ELEMENTS`` floats, saying how to make it smaller."""
    if elements > MAX_ELEMENTS:
        raise MechanismError(f"{what} needs {elements * 4 / 2**30:.1f} GiB (over the "
                             f"{MAX_ELEMENTS * 4 / 2**30:.0f} GiB bound); use fewer images or a smaller input size")


def check_one_grid(model: ViT, what: str) -> None:
    """MechanismError for a model with stages (Swin, Hiera) where ``what`` stacks every layer's tokens or splits the
    last residual into what each block wrote: its layers' grids and widths change at each merge, which is not a
    sum."""
    if getattr(model.config, "stage_depths", ()):
        raise MechanismError(f"{what} reads every layer's tokens on one grid of one width, and this model's stages "
                             "(Swin, Hiera) change both at each patch merging or query pooling; the logit lens and "
                             "direct logit attribution on the last stage, head ablation (zero and mean), each "
                             "head's effect, activation patching, token norms and the maps of vit.explain "
                             "(attention, rollout, norms, AttnLRP) apply")


def _dims(model: ViT) -> tuple[int, int, int]:
    attn = model.blocks[0].attn
    return len(model.blocks), attn.num_heads, attn.head_dim


# --- the forward, read at its hook points ----------------------------------------------------------

def grid_of(model: ViT, images: Tensor) -> tuple[int, int]:
    """The patch grid of ``images`` ``(B, C, H, W)`` (what ``ViT.run_blocks`` needs for rotary positions), or of a
    video model's clips ``(B, frames, C, H, W)`` their folded grid ``(t*gh, gw)``."""
    return model.input_grid(images)


def _keep(cache: dict[str, Tensor]):
    """A hook that stores its tensor in ``cache`` under the hook point's name."""
    def keep(x: Tensor, hook) -> None:
        cache[hook.name] = x
    return keep


def hidden_states(model: ViT, images: Tensor) -> Tensor:
    """Block inputs, then the last block's output: ``(B, L + 1, T, D)``, read at the hook points of one pass."""
    check_supported(model)
    check_one_grid(model, "stacking the hidden states (head effects, patching, the phenomena)")
    B, L = images.shape[0], len(model.blocks)
    T = model.num_prefix_tokens + math.prod(grid_of(model, images))
    check_budget(B * (L + 1) * T * model.config.hidden_size, "keeping every layer's tokens")
    return forward_with_hidden_states(model, images)[1]


def _heads_replaced(layer: int, replace: Callable[[Tensor], Tensor]) -> list[tuple[str, Callable]]:
    """A hook on layer ``layer``'s per-head contexts ``(B, T, H, hd)``: ``replace(context)`` takes their place."""
    return [(f"blocks.{layer}.attn.hook_z", lambda z, hook: replace(z))]


def class_indices(logits: Tensor, classes: Tensor | int | None) -> Tensor:
    """One class per image: the predicted one (None), one for all, or a ``(B,)`` tensor; checked."""
    B, num_classes = logits.shape
    if classes is None:
        return logits.argmax(dim=-1)
    index = torch.as_tensor(classes, device=logits.device).long()
    if index.dim() == 0:
        index = index.expand(B)
    if index.shape != (B,):
        raise MechanismError(f"give one class or one per image ({B}), got shape {tuple(index.shape)}")
    if bool(((index < 0) | (index >= num_classes)).any()):
        raise MechanismError(f"class {index.tolist()} is out of range for {num_classes} classes")
    return index
