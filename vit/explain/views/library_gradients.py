"""Library-road maps of a class's gradients (``vit.explain.views.library_maps``' wing), over the library's own
forward and backward, each computed by the port's own functions, so the two roads draw the same map of the same
numbers:

- ``class``: Chefer, Gur & Wolf's gradient rollout ("Generic attention-model explainability", 2021) from each
  layer's post-softmax attention and the class logit's gradient with respect to it
  (``LibraryModel.class_gradients``; ``positive_gradient_attention``, ``relevance_rollout_row``);
- the CAMs (Grad-CAM, Grad-CAM++, XGrad-CAM, EigenCAM, LayerCAM, Score-CAM, as pytorch-grad-cam defines them:
  ``vit.explain.methods.cam``) of the tokens a layer's attention reads, a pre-norm block's first norm's output
  (pytorch-grad-cam's ViT tutorial's ``norm1``; ``LibraryModel.attention_inputs``), the prefix tokens dropped and
  the patches row-major on the grid."""

from __future__ import annotations

import numpy as np
import torch

from vit.explain.methods import cam
from vit.explain.methods.attention import positive_gradient_attention, relevance_rollout_row
from vit.explain.views.library_maps import LibraryMap, LibraryMethod, prediction_of


def _class_map(checkpoint, pixels, layer, head, query, class_index, options) -> LibraryMap:
    """Row ``query`` of the gradient rollout up to ``layer`` for class ``class_index`` (None: the predicted one)."""
    model = checkpoint.model
    grid, prefix = model.layout.grid, model.layout.num_prefix_tokens
    logits, attentions, gradients = model.class_gradients(pixels, class_index, range(layer + 1))
    terms = [positive_gradient_attention(attentions[i], gradients[i]) for i in range(layer + 1)]  # (1, T, T) each
    row = relevance_rollout_row(terms, query)[0]  # (T,)
    explained = int(logits[0].argmax()) if class_index is None else class_index
    return LibraryMap(row[prefix:].reshape(grid).float().cpu().numpy().astype(np.float32), None, None, grid, prefix,
                      prediction_of(checkpoint, logits), checkpoint.class_names[explained])


def _cam(method: str):
    def draw(checkpoint, pixels, layer, head, query, class_index, options) -> LibraryMap:
        """The ``method`` CAM of layer ``layer``'s attention input for class ``class_index`` (None: the predicted
        one; EigenCAM reads no class)."""
        model = checkpoint.model
        grid, prefix = model.layout.grid, model.layout.num_prefix_tokens
        gradients = method not in cam.GRADIENT_FREE
        tokens, grads, logits = model.attention_inputs(pixels, layer, class_index, gradients)
        acts = cam._on_grid(tokens, grid)  # (1, D, gh, gw)
        if method == "eigencam":
            result = cam.eigen_projection(acts)
        elif method == "layercam":
            result = (cam._on_grid(grads, grid).clamp(min=0) * acts).sum(dim=1)
        else:
            if method == "scorecam":
                if logits is None:
                    raise ValueError("Score-CAM scores a class; this model has no classifier")
                index = logits.argmax(-1) if class_index is None else torch.tensor([class_index])
                weights = cam.score_weights(lambda images: (model(images),), pixels, acts, index)
            else:
                weights = cam.cam_weights(method, acts, cam._on_grid(grads, grid))
            result = (weights[:, :, None, None] * acts).sum(dim=1)  # (1, gh, gw)
        explained = None
        if method != "eigencam" and logits is not None:
            explained = checkpoint.class_names[int(logits[0].argmax()) if class_index is None else class_index]
        return LibraryMap(result.clamp(min=0)[0].float().cpu().numpy().astype(np.float32), None, None, grid, prefix,
                          prediction_of(checkpoint, logits), explained)
    return draw


def _cam_caption(method: str):
    title = cam.CAM_METHODS[method]
    if method == "eigencam":
        return lambda layer, head, query, target: f"{title} of the tokens layer {layer + 1}'s attention reads."
    return lambda layer, head, query, target: (f"{title} of {target!r} on the tokens layer {layer + 1}'s attention "
                                               "reads.")


METHODS = (
    LibraryMethod("class", ("target", "layer", "query"), True, _class_map,
                  lambda layer, head, query, target: f"Class-specific map of {target!r} (gradient rollout up to layer "
                                                     f"{layer + 1}): what token {query} draws on for that class."),
) + tuple(LibraryMethod(name, ("layer",) if name == "eigencam" else ("target", "layer"), name != "eigencam",
                        _cam(name), _cam_caption(name)) for name in cam.CAM_METHODS)
