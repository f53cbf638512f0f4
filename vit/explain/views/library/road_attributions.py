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
    OPTIONS,
    PIXEL_METHODS,
    Options,
    attribution,
    black_input,
    patch_map,
    pixel_map,
    planned_batch,
)
from vit.explain.views.library.road_maps import LibraryMap, LibraryMethod, prediction_of

# What each caption says the map shows. ``describe`` is not given the options, so none names a setting's value:
# vit.explain's settings list those it ran with.
_SHOWS = {
    "integrated_gradients": "the gradient of the class score along the straight path from the baseline to the "
                            "image, times the input's difference (Sundararajan et al., 2017; captum's)",
    "smoothgrad": "the gradient of the class score averaged over noisy copies of the input (Smilkov et al., 2017; "
                  "captum's NoiseTunnel)",
    "input_x_gradient": "the input times the gradient of the class score (captum's InputXGradient)",
    "occlusion": "how much the class score drops when a window there is set to the baseline (Zeiler & Fergus, "
                 "2014; captum's Occlusion)",
    "feature_ablation": "how much the class score drops when the patch is set to the baseline (captum's "
                        "FeatureAblation)",
    "kernel_shap": "each patch's Shapley value for the class score, estimated from random coalitions of patches, "
                   "the others set to the baseline (Lundberg & Lee, 2017; captum's KernelShap)",
    "rise": "the mean of random masks, each weighted by the class's probability of the image masked by it "
            "(Petsiuk et al., 2018)",
}


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
    """``method``'s ``LibraryMethod.describe``: its name, the class, what the map shows and how it is reduced."""
    title = captum_maps.caption(method)[0]
    where = "summed over the colour channels at each of the model's input pixels" if method in PIXEL_METHODS else \
        ("summed per patch" if method == "rise" else "the mean over each patch's pixels and channels")
    return lambda layer, head, query, target: f"{title} of {target!r}: {_SHOWS[method]}, {where}."


METHODS = tuple(LibraryMethod(method, ("target", *OPTIONS[method]), True, _draw(method), _describe(method))
                for method in ATTRIBUTION_METHODS)
