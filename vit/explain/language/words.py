"""Typed labels asked of an image: a CLIP's, SigLIP's or dino.txt's zero-shot scores and a map per label
(``vit.explain.language.prompts``)
on exactly the pixels the model saw, with their captions; the explorer's "Ask in words" box and ``vit.ask`` both
call these (the box's figures are ``vit.app.word_figures``').

Typed text is data: it goes to the text tower as written and is shown as plain text (captions escape it as Markdown,
the page's figures through ``escape_plotly``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from vit.checkpoint import Checkpoint
from vit.core.inference import TRAINING_SIZE, InputSize, NonFiniteOutput, non_finite_message, preprocess
from vit.core.progress import Progress
from vit.core.text import escape_markdown
from vit.explain.language import prompts
from vit.model import ViT

ENSEMBLE = "imagenet"  # the template choice that averages open_clip's 80 ImageNet templates
METHODS = prompts.PROMPT_METHODS


@dataclass
class Answer:
    """The zero-shot scores of one image for typed labels."""

    prompts: prompts.Prompts
    logits: np.ndarray  # (n,) scale * cos (+ bias)
    probabilities: np.ndarray  # (n,) softmax (CLIP) or a sigmoid per label (SigLIP)

    @property
    def labels(self) -> list[str]:
        return self.prompts.labels

    def ranked(self) -> list[tuple[str, float]]:
        """(label, probability), most probable first."""
        order = np.argsort(-self.probabilities, kind="stable")
        return [(self.labels[i], float(self.probabilities[i])) for i in order]


def templates_for(template: str, ensemble: bool) -> list[str]:
    """The templates a label is filled into: the one typed (checked: one ``{}``) or the ImageNet ensemble."""
    return prompts.imagenet_templates() if ensemble else [prompts.check_template(template)]


def model_input(checkpoint: Checkpoint, image: Image.Image, size: InputSize = TRAINING_SIZE) -> torch.Tensor:
    """``(1, C, H, W)`` on the model's device: the image exactly as the model sees it."""
    model = checkpoint.model
    layout = getattr(model, "layout", None)  # a library-road tower's: its patch as the library places it
    x = preprocess([image], checkpoint.preprocessing, size, layout.patch_hw if layout is not None else
                   model.config.patch_size)
    return x.to(next(model.parameters()).device)


def answer(checkpoint: Checkpoint, tower, image: Image.Image, labels: list[str], templates: list[str],
           size: InputSize = TRAINING_SIZE, progress: Progress | None = None) -> Answer:
    """``labels`` (checked by ``text_tower.split_labels``) asked of ``image`` through ``tower``; ``progress`` follows
    the texts encoded (80 templates a label for the ensemble)."""
    asked = prompts.ask(tower, labels, templates, progress)
    logits, probabilities = prompts.zero_shot(checkpoint.model, model_input(checkpoint, image, size),
                                              asked.embeddings, asked.scale, asked.bias, asked.kind)
    if not bool(torch.isfinite(logits).all()):  # NaN scores would look like an answer: say which side broke
        if bool(torch.isfinite(asked.embeddings).all()):
            raise NonFiniteOutput(non_finite_message(checkpoint.model))
        raise NonFiniteOutput("the text model's embeddings of these labels are not finite (NaN or infinite): its "
                              "weights hold NaN or infinite values, or the numbers overflowed; use another checkpoint")
    return Answer(asked, logits[0].cpu().numpy(), probabilities[0].cpu().numpy())


def word_map(checkpoint: Checkpoint, asked: Answer, image: Image.Image, index: int, method: str,
             size: InputSize = TRAINING_SIZE) -> np.ndarray:
    """``(gh, gw)``: label ``index``'s map by ``method`` (a key of ``methods``), float32."""
    if is_library(checkpoint.model):  # a tower on the library road: the road's class map of the label's logit
        from vit.explain.views.library.road_prompts import library_word_map

        return library_word_map(checkpoint, asked.prompts, image, index, method)
    x = model_input(checkpoint, image, size)
    return prompts.prompt_map(checkpoint.model, x, asked.prompts, index, method)[0].float().cpu().numpy()


def is_library(model) -> bool:
    """Whether ``model`` is a tower opened on the library road (its maps of a label are the road's own)."""
    return not isinstance(model, ViT)


def methods(model) -> dict[str, str]:
    """The maps of a label for ``model``, by key, with their titles: the port's prompt maps
    (``prompts.methods_for``), or the library road's classifier maps of a tower opened there."""
    if is_library(model):
        from vit.explain.views.library.road_prompts import library_methods

        return library_methods(model)
    return prompts.methods_for(model)


def difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two labels' maps, each scaled to [0, 1], subtracted: positive where the first is the stronger."""
    return prompts.map_difference(torch.from_numpy(a), torch.from_numpy(b)).numpy()


def describe_scores(asked: Answer, ensemble: bool) -> str:
    """How the probabilities were read, as Markdown (the template is escaped: it is typed text)."""
    p = asked.prompts
    template = ("the average of open_clip's 80 ImageNet templates" if ensemble
                else f"the template “{escape_markdown(p.templates[0])}”")
    if p.kind == "softmax":
        who = "dino.txt" if p.patch is not None else "CLIP"  # dino.txt's image side: its CLS beside its patch mean
        how = (f"{who}: a **softmax** over the labels of {p.scale:.4g} × cosine(image, text), so the "
               "probabilities sum to 1 and depend on which labels are asked")
    else:
        how = (f"SigLIP: each label's own **sigmoid** of {p.scale:.4g} × cosine {p.bias:+.4g}, so the labels do "
               "not compete and need not sum to 1")
    doubled = None if ensemble else prompts.doubled_article(p.templates[0], p.labels)
    note = "" if doubled is None else (f" Note: “{escape_markdown(doubled[0])}” is read as "
                                       f"“{escape_markdown(doubled[1])}” (the template has an article already): "
                                       f"type the label without it, or use the template “{escape_markdown('{}')}”.")
    return f"Each label is read through {template}. {how}.{note}"


def describe_prediction(asked: Answer, shown: int = 3) -> str:
    """The Prediction box of a model without a classifier once labels were asked in words, as Markdown (the labels
    escaped: typed text): the most probable label and the next ones."""
    ranked = asked.ranked()
    kind = "softmax over the labels" if asked.prompts.kind == "softmax" else "each label's own sigmoid"
    rest = ", ".join(f"“{escape_markdown(label)}” {p:.1%}" for label, p in ranked[1:shown])
    more = f" ({len(ranked) - shown} more below)" if len(ranked) > shown else ""
    return (f"Of the {len(ranked)} label(s) asked in words below, most probable: **“{escape_markdown(ranked[0][0])}”** "
            f"{ranked[0][1]:.1%} ({kind})" + (f"; then {rest}{more}." if rest else "."))


def describe_method(method: str, label: str, other: str | None = None, *, kind: str) -> str:
    """The map's caption, as Markdown (labels escaped); ``kind`` the prompts' (``"softmax"``: a CLIP, ``"sigmoid"``:
    a SigLIP), whose readout LeGrad follows."""
    label = escape_markdown(label)
    if method not in prompts.PROMPT_METHODS:  # a library-road map: the road's class map of the label's logit
        from vit.explain.views.attention_maps import MAP_KINDS

        title = escape_markdown(MAP_KINDS.get(method, method))
        score = "the sigmoid's logit" if kind == "sigmoid" else "the logit (scale × cosine)"
        head = (f"**{title} of “{label}”**: the map this model's classifier maps draw for a class, of the label's "
                f"image-text score, {score}")
        return head + ("." if other is None else f", minus that of “{escape_markdown(other)}” (each scaled to "
                                                 "[0, 1]; red where the first is the stronger).")
    what = {
        "rollout": "gradient rollout of the image-text similarity from the last layer, as in Chefer et al.'s CLIP "
                   "notebook (Transformer-MM-Explainability)",
        "legrad": "LeGrad with its authors' CLIP readout (ln_post of the mean over tokens)" if kind == "softmax" else
                  "LeGrad with its authors' SigLIP readout (the attention-pooling head on each layer; patches bright "
                  "for the empty prompt “a photo of a” removed)",
        "attnlrp": "AttnLRP relevance of the similarity, summed per patch (red for, blue against)",
        "grad_eclip": "Grad-ECLIP: the last layer's value channels weighted by the similarity's gradient and the "
                      "query-key cosine (Zhao et al. 2024)",
        "sclip": "SCLIP, training-free: each patch's cosine with the label once the last layer's attention is "
                 "correlative, softmax(q qᵀ) + softmax(k kᵀ) (Wang et al. 2024)",
        "naclip": "NACLIP, training-free: each patch's cosine with the label once the last layer attends by key "
                  "similarity plus a Gaussian over neighbouring patches, without its residual or MLP (Hajimiri et "
                  "al. 2025)",
        "clearclip": "ClearCLIP, training-free: each patch's cosine with the label once the last layer's output is "
                     "its query-query attention alone, no residual, no MLP (Lan et al. 2024)",
        "maskclip": "MaskCLIP, training-free: each patch's cosine with the label once the last layer's attention is "
                    "skipped, each token its own value embedding through the output projection, residual and MLP "
                    "kept (Zhou et al. 2022)",
        "dinotxt": "dino.txt, as its authors' zero-shot segmentation: each patch token of the backbone's last layer "
                   "(after its final norm, as their notebook reads it) against the half of the label's text "
                   "embedding aligned with the patches, by cosine",
        "clipsurgery": "CLIP Surgery, training-free: value-value attention on a second path through the last six "
                       "layers, then feature surgery, each label against the mean of all asked (one label: against "
                       "the empty text) (Li et al. 2025)",
    }[method]
    if other is None:
        return f"**{METHODS[method]} for “{label}”**: {what}."
    return (f"**“{label}” minus “{escape_markdown(other)}”** ({METHODS[method]}): each map scaled to 0–1, then "
            "subtracted; red where the first label's map is the stronger, blue where the second's is.")
