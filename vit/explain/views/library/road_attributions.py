"""Library-road maps of captum's attributions and RISE (``vit.explain.views.library.road_maps``' wing), for classifiers:
Integrated Gradients, SmoothGrad and Input x Gradient on the model's input pixels, occlusion, feature ablation,
KernelSHAP and RISE on its patch grid. They are the port's own (``vit.explain.methods.captum_maps``: the same
options, names, defaults, seeds and reductions), run on the library's own model through its logits
(``LibraryModel.logits``). The forwards and each batch's memory are counted before any work by the port's own plan
(``captum_maps.planned_batch``), from what the library model declares (``cost_shape``: its layers, heads and widths)."""

from __future__ import annotations

import numpy as np
import torch

from vit.explain.methods import captum_maps
from vit.explain.methods.captum_maps import (
    ATTRIBUTION_METHODS,
    GRADIENT_METHODS,
    OPTIONS,
    PIXEL_METHODS,
    Options,
    attribution,
    black_input,
    patch_map,
    pixel_map,
    planned_batch,
)
from vit.explain.views.library.road_maps import LibraryMap, LibraryMethod, gradient_problem, prediction_of


def _draw(method: str):
    """``method``'s ``LibraryMethod.draw``: its options checked, its forwards and batch counted, then captum's (or
    RISE's) attribution of the class (None: the predicted one) reduced as the port's: a pixel method's summed over
    the channels ``(H, W)``, any other's per patch ``(gh, gw)``."""
    def draw(checkpoint, pixels, layer, head, query, class_index, options) -> LibraryMap:
        model = checkpoint.model
        chosen = Options.of(method, options)
        layout = model.layout
        shape = (int(pixels.shape[-2]), int(pixels.shape[-1]))
        grid = (shape[0] // layout.patch_hw[0], shape[1] // layout.patch_hw[1])
        _, batch = planned_batch(model.cost_shape(), method, chosen, grid, shape, layout.patch_hw,
                                 int(pixels.shape[1]))
        with torch.inference_mode(False):
            x = pixels.detach().clone()  # (1, C, H, W), usable by autograd whatever mode the caller is in
            with torch.no_grad():
                logits = model.logits(x)  # (1, classes)
            explained = int(logits[0].argmax()) if class_index is None else int(class_index)
            baselines = black_input(x, checkpoint.preprocessing) if chosen.baseline == "black" else None
            with torch.enable_grad():
                attributions = attribution(model.logits, x, method, explained, grid, chosen, batch,
                                           baselines=baselines)  # (1, C, H, W); RISE's (1, H, W)
        on_pixels = method in PIXEL_METHODS
        value = pixel_map(attributions) if on_pixels else patch_map(method, attributions, grid)
        return LibraryMap(value[0].cpu().numpy().astype(np.float32), None, None, grid, layout.num_prefix_tokens,
                          prediction_of(checkpoint, logits), checkpoint.class_names[explained], pixels=on_pixels)
    return draw


def _describe(method: str):
    """``method``'s ``LibraryMethod.describe``: the main page's caption of the map (``captum_maps.caption``: its name,
    what it shows with the settings it ran with, its baseline named), the class, and a patch method's reduction."""
    def describe(layer, head, query, target, **options) -> str:
        title, shows = captum_maps.caption(method, captum_maps.Options.of(method, options),
                                           pixels=method in PIXEL_METHODS)
        where = ", the mean over each patch's pixels and channels" if method in captum_maps.PATCH_METHODS else ""
        return f"{title} of {target!r}: {shows}{where}."
    return describe


METHODS = tuple(LibraryMethod(method, ("target", *OPTIONS[method]), True, _draw(method), _describe(method),
                              gradient_problem if method in GRADIENT_METHODS else None)
                for method in ATTRIBUTION_METHODS)
