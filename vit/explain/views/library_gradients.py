"""Library-road maps of a class's gradients (``vit.explain.views.library_maps``' wing): the class-specific map,
Chefer, Gur & Wolf's gradient rollout ("Generic attention-model explainability", 2021), over the library's own
forward and backward (``LibraryModel.class_gradients``): each layer's post-softmax attention and the class logit's
gradient with respect to it, weighed and rolled out by the port's own functions (``positive_gradient_attention``,
``relevance_rollout_row``), so the two roads draw the same map of the same numbers."""

from __future__ import annotations

import numpy as np

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


METHODS = (
    LibraryMethod("class", ("target", "layer", "query"), True, _class_map,
                  lambda layer, head, query, target: f"Class-specific map of {target!r} (gradient rollout up to layer "
                                                     f"{layer + 1}): what token {query} draws on for that class."),
)
