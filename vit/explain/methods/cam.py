"""The CAM family on tokens: Grad-CAM, Grad-CAM++, XGrad-CAM, EigenCAM, LayerCAM and Score-CAM, as
jacobgil/pytorch-grad-cam defines them (``pytorch_grad_cam/base_cam.py`` and each ``*_cam.py``), for every family
without a ``reshape_transform`` to write.

The activations are a block's first norm's output (``hook_attn_in``; pytorch-grad-cam's ViT tutorial explains
``model.blocks[-1].norm1``, the last block's, whose patch tokens still reach the class through that block's
attention), read at its hook point in the model's one forward. The prefix tokens (CLS, distillation, registers)
are dropped and the patches, kept row-major on the layer's own grid by every family (a NaFlex image's, a Swin or
Hiera stage's), become ``(B, D, h, w)``: the tutorial's ``reshape_transform`` for any grid. A clip's tubelets
(``(B, frames, C, H, W)`` in) lie on its folded grid ``(t*gh, gw)``: Grad-CAM's mean gradient, LayerCAM's product
and EigenCAM's projection over it are pytorch-grad-cam's over the 3D feature map ``(B, D, t, gh, gw)`` (its
``base_cam``'s 5-D branch). Each method then
weighs the channels as pytorch-grad-cam does and sums them; the map is its ReLU, ``(B, h, w)``, not normalised
(pytorch-grad-cam min-max normalises and resizes to the input; the overlay does both).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from vit import registry
from vit.model import ViT

# name -> what it is (the registry's CAMs: vit.registry lists each, with the pytorch-grad-cam class it equals)
CAM_METHODS = {m.name: f"{m.title.split(' (')[0]} ({m.paper})" for m in registry.BUILTIN_METHODS if m.group == "cam"}
GRADIENT_FREE = ("eigencam", "scorecam")  # pytorch-grad-cam's uses_gradients=False
SCORECAM_BATCH = 16  # masked images per forward: pytorch-grad-cam's ScoreCAM BATCH_SIZE


class _Stop(Exception):
    """Raised by the hook once it has the layer's activations, where nothing after them is read (EigenCAM)."""


def layer_activations(model: ViT, images: Tensor, layer: int = -1, class_index: int | Tensor | None = None,
                      gradients: bool = True, residual: Tensor | None = None, classes: bool = True,
                      hooks: Sequence[tuple[str, Callable]] = ()) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Layer ``layer``'s first-norm output on its grid ``(B, D, h, w)``, the gradient of each image's class logit
    (``class_index``, default the predicted one) with respect to it (None without ``gradients``) and the classes
    ``(B,)`` (None without a classifier, or without ``classes`` and ``gradients``: then the forward stops at the
    layer). ``residual``: block ``layer``'s input ``(B, T, D)`` where a forward of ``images`` already gave it (an
    analysis's hidden states): the blocks before the layer are not run again. ``hooks``: set on the forward too
    (an analysis read off it: ``vit.explain.methods.hidden.forward_with_hidden_states``'s ``run``)."""
    L = len(model.blocks)
    if not -L <= layer < L:
        raise ValueError(f"layer {layer} is out of range for {L} layers")
    name = f"blocks.{layer % L}.hook_attn_in"
    kept: dict[str, Tensor] = {}
    stop = not (gradients or classes)

    def keep(x: Tensor, hook) -> Tensor:  # a leaf here: the gradient stops at this layer
        kept["x"] = x.detach().requires_grad_(gradients)
        if stop:
            raise _Stop
        return kept["x"]

    if gradients and model.head is None:
        raise ValueError("a class-specific CAM needs a classifier; this model has no head")
    with torch.inference_mode(False):
        if residual is not None:  # a copy: an inference tensor (an analysis's) cannot be saved for the backward
            residual = residual.to(images.device, next(model.parameters()).dtype, copy=True)
        try:
            with torch.set_grad_enabled(gradients):
                logits = model.logits_recorded_from(images, layer, [(name, keep), *hooks], residual)
        except _Stop:
            logits = None
        index = None
        if logits is not None:
            index = _classes(logits, class_index)
        grad = None
        if gradients:
            score = logits.gather(1, index[:, None]).sum()  # pytorch-grad-cam: the targets' sum
            [grad] = torch.autograd.grad(score, kept["x"])
    acts = kept["x"].detach()
    grid = _layer_grid(model, model.input_grid(images), layer % L, acts.shape[1])
    return _on_grid(acts, grid), None if grad is None else _on_grid(grad, grid), index


def _classes(logits: Tensor, class_index: int | Tensor | None) -> Tensor:
    B = logits.shape[0]
    if class_index is None:
        return logits.argmax(dim=-1)
    index = torch.as_tensor(class_index, device=logits.device).long().reshape(-1).expand(B)
    if ((index < 0) | (index >= logits.shape[1])).any():
        raise ValueError(f"class {class_index} is out of range for {logits.shape[1]} classes")
    return index


def _layer_grid(model: ViT, grid: tuple[int, int], layer: int, tokens: int) -> tuple[int, int]:
    """The grid of layer ``layer``'s norm1 tokens on an input whose patch grid is ``grid`` (a clip's folded
    ``(t*gh, gw)``: its tokens time-major, row-major there): the stage's after a Swin merge (before norm1), the finer
    one before a Hiera query pooling (after norm1)."""
    grids = (grid,) + model.layer_grids(grid)  # grids[l]: block l's input, grids[l + 1]: its output
    patches = tokens - model.num_prefix_tokens
    for candidate in (grids[layer + 1], grids[layer]):
        if candidate[0] * candidate[1] == patches:
            return candidate
    raise ValueError(f"layer {layer}'s {patches} patch tokens fit neither its input grid {grids[layer]} nor its "
                     f"output grid {grids[layer + 1]}")


def _on_grid(x: Tensor, grid: tuple[int, int]) -> Tensor:
    """``(B, T, D)`` tokens -> ``(B, D, h, w)``: the prefix tokens dropped, the patches row-major on ``grid``."""
    B, T, D = x.shape
    h, w = grid
    return x[:, T - h * w:].reshape(B, h, w, D).permute(0, 3, 1, 2)  # (B, D, h, w)


def cam_weights(method: str, acts: Tensor, grads: Tensor) -> Tensor:
    """Each channel's weight ``(B, D)`` (pytorch-grad-cam's ``get_cam_weights``) from ``acts`` and ``grads``
    ``(B, D, h, w)``: Grad-CAM's mean gradient, Grad-CAM++'s equation 19, XGrad-CAM's activation-weighted
    gradient."""
    if method == "gradcam":
        return grads.mean(dim=(2, 3))
    sum_acts = acts.sum(dim=(2, 3), keepdim=True)  # (B, D, 1, 1)
    if method == "gradcam++":
        g2 = grads ** 2
        aij = g2 / (2 * g2 + sum_acts * g2 * grads + 0.000001)
        aij = torch.where(grads != 0, aij, torch.zeros_like(aij))
        return (grads.clamp(min=0) * aij).sum(dim=(2, 3))
    if method == "xgradcam":
        return (grads * acts / (sum_acts + 1e-7)).sum(dim=(2, 3))
    raise ValueError(f"{method!r} has no channel weights; choose gradcam, gradcam++ or xgradcam")


def eigen_projection(acts: Tensor) -> Tensor:
    """EigenCAM's map (pytorch-grad-cam's ``get_2d_projection``): each image's centred ``(h*w, D)`` activations
    projected on their first right-singular vector, ``(B, h, w)``. numpy's SVD, as the reference's: the singular
    vector's sign is the solver's choice, and this one is pytorch-grad-cam's."""
    out = []
    for a in acts.float().cpu().numpy():  # (D, h, w)
        flat = a.reshape(a.shape[0], -1).transpose()  # (h*w, D)
        flat = flat - flat.mean(axis=0)
        _, _, vt = np.linalg.svd(flat, full_matrices=True)
        out.append((flat @ vt[0, :]).reshape(a.shape[1:]))
    return torch.from_numpy(np.float32(out)).to(acts.device)


def score_weights(model: ViT, images: Tensor, acts: Tensor, class_index: Tensor, batch: int = SCORECAM_BATCH,
                  progress: Callable[[int, int], None] | None = None) -> Tensor:
    """Score-CAM's channel weights ``(B, D)``: each channel's activation upsampled to the input (bilinear, corners
    aligned: ``nn.UpsamplingBilinear2d``), min-max scaled, multiplied into the image, and the softmax over channels
    of the class logit of each masked image. ``D`` forwards per image, ``batch`` at a time; only one batch of
    masks is ever held. ``progress(done, total)`` after each batch."""
    B, D = acts.shape[:2]
    total, done = B * D, 0
    weights = torch.empty(B, D, dtype=torch.float32)
    with torch.no_grad():
        for b in range(B):
            scores = []
            for start in range(0, D, batch):
                up = F.interpolate(acts[b:b + 1, start:start + batch], size=images.shape[-2:], mode="bilinear",
                                   align_corners=True)[0]  # (n, H, W)
                flat = up.reshape(up.shape[0], -1)
                lo, hi = flat.min(dim=-1)[0][:, None, None], flat.max(dim=-1)[0][:, None, None]
                up = (up - lo) / (hi - lo + 1e-8)
                logits = model(images[b][None] * up[:, None])[0]  # (n, classes)
                scores.append(logits[:, int(class_index[b])].float().cpu())
                done += up.shape[0]
                if progress is not None:
                    progress(done, total)
            weights[b] = torch.softmax(torch.cat(scores), dim=-1)
    return weights.to(acts.device)


def cam(model: ViT, images: Tensor, method: str = "gradcam", class_index: int | Tensor | None = None,
        layer: int = -1, batch: int = SCORECAM_BATCH, progress: Callable[[int, int], None] | None = None,
        residual: Tensor | None = None, hooks: Sequence[tuple[str, Callable]] = ()) -> Tensor:
    """The ``method`` CAM (a key of ``CAM_METHODS``) of layer ``layer``'s first norm (default the last block's)
    for each image's class (default the predicted one): ``(B, h, w)`` on that layer's grid, ReLU applied, not
    normalised. ``batch`` and ``progress``: Score-CAM's masked forwards (see ``score_weights``). ``residual``:
    block ``layer``'s input where a forward of ``images`` already gave it, ``hooks`` set on its forward
    (``layer_activations``)."""
    if method not in CAM_METHODS:
        raise ValueError(f"unknown CAM {method!r}; choose one of: {', '.join(CAM_METHODS)}")
    # EigenCAM reads no class: its forward stops at the layer, unless hooks read the rest
    acts, grads, index = layer_activations(model, images, layer, class_index, method not in GRADIENT_FREE, residual,
                                           method != "eigencam" or bool(hooks), hooks)
    if method == "eigencam":
        result = eigen_projection(acts)
    elif method == "layercam":
        result = (grads.clamp(min=0) * acts).sum(dim=1)
    else:
        if method == "scorecam":
            if model.head is None:
                raise ValueError("Score-CAM scores a class; this model has no head")
            weights = score_weights(model, images, acts, index, batch, progress)
        else:
            weights = cam_weights(method, acts, grads)
        result = (weights[:, :, None, None] * acts).sum(dim=1)  # (B, h, w)
    return result.clamp(min=0)


def attention_gradcam(model: ViT, images: Tensor, class_index: int | Tensor | None = None) -> Tensor:
    """Chefer et al.'s GradCAM baseline on the last attention (``ViT_explanation_generator.py``'s
    ``Baselines.generate_cam_attn``): the last layer's attention from CLS to the patches, each head weighted by the
    mean of its gradient there for each image's class (default: the predicted one), averaged over heads, ReLU:
    ``(B, gh, gw)``, not normalised (theirs min-max normalises; the overlay does)."""
    if model.head is None:
        raise ValueError("GradCAM on attention explains a class; this model has no head")
    if model.cls_token is None or model.config.stage_depths:
        raise ValueError("GradCAM on attention reads the last layer's CLS row over one grid of patches; this model "
                         "has no CLS token or has stages (Swin, Hiera): use Grad-CAM on its tokens (gradcam)")
    L = len(model.blocks)
    kept: dict[str, Tensor] = {}

    def leaf(x: Tensor, hook) -> Tensor:  # the gradient stops at the last block
        return x.detach().requires_grad_(True)

    def keep(x: Tensor, hook) -> None:
        kept["probs"] = x

    with torch.inference_mode(False), torch.enable_grad():
        logits = model.logits_recorded_from(images, L - 1, [(f"blocks.{L - 1}.hook_attn_in", leaf),
                                                            (f"blocks.{L - 1}.attn.hook_pattern", keep)])
        index = _classes(logits, class_index)
        score = logits.gather(1, index[:, None]).sum()  # the images are independent
        [grad] = torch.autograd.grad(score, kept["probs"])
    probs = kept["probs"].detach()
    B, H, Tq, T = probs.shape
    grid = model.patch_grid(images.shape[2], images.shape[3])
    if Tq != T or T != model.num_prefix_tokens + grid[0] * grid[1]:
        raise ValueError(f"GradCAM on attention reads the last layer's whole T x T attention; this model's is "
                         f"{Tq} x {T} (windows or a layout): use Grad-CAM on its tokens (gradcam)")
    P = model.num_prefix_tokens
    cam, grad = probs[:, :, 0, P:], grad[:, :, 0, P:]  # (B, H, gh*gw): CLS's row over the patches
    weights = grad.mean(dim=-1, keepdim=True)  # (B, H, 1): their grad.mean over the 14 x 14 grid
    return (cam * weights).mean(dim=1).clamp(min=0).reshape(B, *grid)  # (B, gh, gw)
