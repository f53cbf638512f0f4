"""Asking in words of a CLIP or SigLIP tower opened on the library road (an open_clip tower as open_clip builds it:
SigLIP 2's and PE-Core's timm trunks, CoCa's, a ResNet's): the labels' maps are the library road's own class maps
(``road_maps``: the class map, LeGrad, the CAMs, captum's attributions, RISE) of the tower made a classifier over the
labels. ``vit.explain.language.words`` asks here for a tower on the library road.

``prompted_tower`` puts ``prompts.PromptHead`` (``scale * cos(embedding, text) + bias``, CLIP's and SigLIP's
logits) on the tower's own image embedding: every module is the tower's, its recording and gradients the road's own,
so a label's map is the map of that label's logit as the road draws a classifier's class.
"""

from __future__ import annotations

import dataclasses
import functools
from types import SimpleNamespace

import numpy as np
from PIL import Image
from torch import Tensor, nn

from vit.checkpoint import Checkpoint
from vit.core.inference import input_shape
from vit.explain.language.prompts import PromptError, PromptHead, embedding_of, fitting


def library_methods(model: nn.Module) -> dict[str, str]:
    """The maps of a label the library road draws for the tower ``model``, by key, with their titles: its
    classifier maps that reach it (``road_maps.method_names``)."""
    from vit.explain.views.attention_maps import MAP_KINDS
    from vit.explain.views.library import road_maps

    every = road_maps.methods()
    return {name: MAP_KINDS.get(name, name) for name in road_maps.method_names(True, model) if every[name].classifier}


@functools.cache
def _prompted_class(base: type) -> type:
    """``base`` (a library-road model class) whose forward's logits are its ``_head`` on its ``_tower``'s image
    embedding (the tower being an instance of ``base`` sharing every module)."""

    class Prompted(base):
        @property
        def is_classifier(self) -> bool:
            return True

        def _recorded_forward(self, pixels: Tensor, recorder) -> SimpleNamespace:
            out = base._recorded_forward(self._tower, pixels, recorder)  # the tower's forward, recorded as asked
            return SimpleNamespace(logits=self._head(fitting(embedding_of(out), self._head.prompts)))

    Prompted.__name__ = Prompted.__qualname__ = f"Prompted{base.__name__}"
    return Prompted


def prompted_tower(model: nn.Module, prompts: Tensor, scale: float, bias: float = 0.0) -> nn.Module:
    """The library-road tower ``model`` as a classifier over ``prompts`` ``(n, E)`` (normalised text embeddings):
    its logits are the image-text logits CLIP (``bias=0``) or SigLIP reads. Shares every module with ``model``
    (nothing copied); ``model`` itself is unchanged."""
    wrapped = _prompted_class(type(model)).__new__(_prompted_class(type(model)))
    wrapped.__dict__.update(model.__dict__)  # the module tables themselves: the same layers, recorded the same way
    device = next(model.parameters()).device
    wrapped.__dict__["_tower"] = model  # plain attributes, not submodules: the tower's modules are its own
    wrapped.__dict__["_head"] = PromptHead(None, prompts.to(device), scale, bias)
    return wrapped


def library_word_map(checkpoint: Checkpoint, prompts, image: Image.Image, index: int, method: str) -> np.ndarray:
    """``(gh, gw)``: label ``index``'s map by the library road's classifier map ``method`` (a key of
    ``library_methods``), at the tower's own input size, from the default layer and query ``vit.explain`` reads
    for a classifier; ``prompts`` the answer's (``prompts.Prompts``)."""
    from vit.explain.views.library import road_maps

    model = checkpoint.model
    methods = library_methods(model)
    if method not in methods:
        why = road_maps.refusal(method, True, model) or f"{method} is not drawn for this model's labels"
        raise PromptError(f"{why}; use one of {', '.join(methods) or 'none'}")
    prompted = dataclasses.replace(checkpoint, model=prompted_tower(model, prompts.embeddings, prompts.scale,
                                                                    prompts.bias), class_names=list(prompts.labels))
    layout = model.layout
    shape = input_shape(image, checkpoint.preprocessing, layout.patch_hw)
    grid = (shape[0] // layout.patch_hw[0], shape[1] // layout.patch_hw[1])
    layer = max(road_maps.methods()[method].default_layer, -model.num_layers) % model.num_layers
    query = road_maps.default_query(method, None, grid, layout.num_prefix_tokens)
    drawn = road_maps.library_map(prompted, image, method, layer, None, query, index, {})
    return np.asarray(drawn.map, dtype=np.float32)
