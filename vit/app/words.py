"""The explorer's "Ask in words" box, without Streamlit: a CLIP's or SigLIP's zero-shot scores for typed
labels and a map per label (``vit.explain.prompts``), drawn over exactly the pixels the model saw.

Typed text is data: it goes to the text tower as written and is shown as plain text (the page passes labels
through ``escape_plotly`` into figures and never into Markdown).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import torch
from PIL import Image

from vit.app import work
from vit.app.drawing import CURVE_BATCH, CURVES_X_AXIS
from vit.checkpoint import Checkpoint
from vit.explain import prompts
from vit.explain.faithfulness import auc
from vit.inference import TRAINING_SIZE, InputSize, NonFiniteOutput, non_finite_message, preprocess
from vit.text import escape_markdown, escape_plotly

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
    x = preprocess([image], checkpoint.preprocessing, size, model.config.patch_size)
    return x.to(next(model.parameters()).device)


def answer(checkpoint: Checkpoint, tower, image: Image.Image, labels: list[str], templates: list[str],
           size: InputSize = TRAINING_SIZE, progress: work.Progress | None = None) -> Answer:
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
    """``(gh, gw)``: label ``index``'s map by ``method`` (a key of ``METHODS``), float32."""
    x = model_input(checkpoint, image, size)
    return prompts.prompt_map(checkpoint.model, x, asked.prompts, index, method)[0].float().cpu().numpy()


def difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two labels' maps, each scaled to [0, 1], subtracted: positive where the first is the stronger."""
    return prompts.map_difference(torch.from_numpy(a), torch.from_numpy(b)).numpy()


def describe_scores(asked: Answer, ensemble: bool) -> str:
    """How the probabilities were read, as Markdown (the template is escaped: it is typed text)."""
    p = asked.prompts
    template = ("the average of open_clip's 80 ImageNet templates" if ensemble
                else f"the template “{escape_markdown(p.templates[0])}”")
    if p.kind == "softmax":
        how = (f"CLIP: a **softmax** over the labels of {p.scale:.4g} × cosine(image, text), so the "
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
        "clipsurgery": "CLIP Surgery, training-free: value-value attention on a second path through the last six "
                       "layers, then feature surgery, each label against the mean of all asked (one label: against "
                       "the empty text) (Li et al. 2025)",
    }[method]
    if other is None:
        return f"**{METHODS[method]} for “{label}”**: {what}."
    return (f"**“{label}” minus “{escape_markdown(other)}”** ({METHODS[method]}): each map scaled to 0–1, then "
            "subtracted; red where the first label's map is the stronger, blue where the second's is.")


def scores_figure(asked: Answer) -> go.Figure:
    """The labels as horizontal bars with their probabilities, the most probable on top."""
    ranked = asked.ranked()
    labels = [escape_plotly(label) for label, _ in ranked]  # Plotly reads HTML tags in labels
    probs = [p for _, p in ranked]
    colors = ["#ff4b4b"] + ["#8fa3bf"] * (len(probs) - 1)
    fig = go.Figure(go.Bar(x=probs, y=labels, orientation="h", marker_color=colors,
                           text=[f"{p:.1%}" for p in probs], textposition="auto",
                           hovertemplate="%{y}: %{x:.2%}<extra></extra>"))
    title = "probability (softmax over the labels)" if asked.prompts.kind == "softmax" else "probability (sigmoid)"
    fig.update_xaxes(range=[0, 1], tickformat=".0%", title=title)
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_layout(height=80 + 30 * len(probs), margin=dict(l=0, r=10, t=10, b=0))
    return fig


def curves_figure(checkpoint: Checkpoint, asked: Answer, image: Image.Image, map2d: np.ndarray, index: int,
                  size: InputSize = TRAINING_SIZE, progress: work.Progress | None = None) -> go.Figure:
    """Deletion and insertion curves of label ``index``'s cosine similarity ranked by ``map2d``; ``progress``
    follows the images scored (``CURVE_BATCH`` at a time)."""
    x = model_input(checkpoint, image, size)
    maps = torch.as_tensor(np.asarray(map2d, dtype=np.float32))[None].to(x.device)
    fractions, deletion, insertion = prompts.prompt_curves(checkpoint.model, x, asked.prompts, maps, index,
                                                           batch_size=CURVE_BATCH, progress=progress)
    fig = go.Figure()
    for name, curve, colour in (("deletion", deletion[0], "#d62728"), ("insertion", insertion[0], "#1f77b4")):
        fig.add_trace(go.Scatter(x=fractions, y=curve, mode="lines", line=dict(color=colour),
                                 name=f"{name} (AUC {float(auc(fractions, curve)):.3f})",
                                 hovertemplate=f"{name}: %{{x:.0%}} of patches → cos = %{{y:.3f}}<extra></extra>"))
    fig.update_xaxes(**CURVES_X_AXIS, automargin=True)
    fig.update_yaxes(title=f"cos(image, “{escape_plotly(asked.labels[index])}”)")
    fig.update_layout(height=320, margin=dict(l=0, r=0, t=30, b=56), autosize=True,
                      legend=dict(orientation="h", x=0, y=1.02, xanchor="left", yanchor="bottom"))
    return fig
