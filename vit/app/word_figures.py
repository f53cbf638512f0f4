"""The figures of the explorer's "Ask in words" box: the labels' probabilities as bars and a label's deletion and
insertion curves. The answers and maps they draw are ``vit.explain.language.words``'.

Typed labels reach a figure only through ``escape_plotly`` (Plotly reads HTML tags in text).
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import torch
from PIL import Image

from vit.app.drawing import CURVE_BATCH, CURVES_X_AXIS
from vit.checkpoint import Checkpoint
from vit.core.inference import TRAINING_SIZE, InputSize
from vit.core.progress import Progress
from vit.core.text import escape_plotly
from vit.explain.benchmarks.metrics import auc
from vit.explain.language import prompts
from vit.explain.language.words import Answer, model_input


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
                  size: InputSize = TRAINING_SIZE, progress: Progress | None = None) -> go.Figure:
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
