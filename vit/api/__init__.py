"""The engine from a notebook: what ``import vit`` exposes (``vit/__init__.py`` forwards to this package lazily).

    checkpoint = vit.load("google/vit-base-patch16-224")      # a path, a folder, an HF-cache name or a Hub id
    e = vit.explain(checkpoint, "photo.jpg", "legrad")        # any map the explorer draws (vit.methods())
    e.map, e.overlay(), e.figure()                            # the patch grid, over the pixels the model saw
    vit.ask(clip, "photo.jpg", ["a dog", "a cat"])            # CLIP / SigLIP zero-shot scores and maps
    vit.mechanism(checkpoint, "photo.jpg")                    # logit lens, head attribution, phenomena

Every function calls the explorer's own (``vit.explain.views.image_analysis``, ``attention_maps``, ``method_maps``,
``mechanism_views``, ``words``), so a map here is the map the explorer draws for the same settings. Layers,
heads, tokens and classes count from 0 and a negative one from the end, as Python indexes the arrays (``layer=-1``
is the last layer, ``head=-1`` the last head); token 0 is CLS, patch ``p`` (row-major) is token
``p + num_prefix_tokens``. An image is a PIL image, a file, an ``(H, W, 3)`` uint8 array or a ``(3, H, W)`` /
``(1, 3, H, W)`` tensor in [0, 1] (unnormalised: the checkpoint's own preprocessing resizes and normalises every
image, as it does a file's).

The functions live by concern: ``loading`` (open a model, list its maps), ``maps`` (``explain``), ``patch_tokens``
(PCA, similarity, correspondences), ``vision_language`` (typed labels, words and VLMs), ``internals`` (the
mechanism, TextSpan, SAE features), ``sam`` (prompts in, masks out) and ``explore_page`` (the explorer's page on a
model in hand); ``arguments`` reads what they all take.
"""

from vit.api.explore_page import explore
from vit.api.internals import (
    TextSpan,
    ablate,
    feature_attribution,
    head_effects,
    mechanism,
    patching,
    reference_means,
    registers,
    sinks,
    textspan,
)
from vit.api.loading import load, methods, samples, shipped
from vit.api.maps import Explanation, explain
from vit.api.patch_tokens import PCA, Correspondences, Similarity, correspondences, pca, similarity
from vit.api.sam import ConceptSegmentation, Segmentation, open_sam3, segment
from vit.api.vision_language import (
    Answer,
    WordMap,
    ask,
    ask_methods,
    ask_vlm,
    explain_word,
    open_vlm,
    visual_logit_lens,
)
from vit.explain.language.vlm_answer import VLMAnswer

__all__ = ["load", "explain", "methods", "shipped", "samples", "ask", "ask_methods", "mechanism", "head_effects",
           "ablate", "reference_means", "patching", "registers", "sinks", "Explanation", "feature_attribution",
           "Answer", "pca", "similarity", "correspondences", "PCA", "Similarity", "Correspondences",
           "visual_logit_lens", "explain_word", "WordMap", "textspan", "TextSpan", "open_vlm", "ask_vlm", "VLMAnswer",
           "segment", "Segmentation", "open_sam3", "ConceptSegmentation", "explore"]  # vit.API
