"""Plotly figures of attention statistics, shared by the explorer page and the dataset report."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go


def layer_stats_figure(values: np.ndarray, y_title: str, title: str = "") -> go.Figure:
    """Per-head values ``(L, H)`` as in the ViT paper's Fig. 7: x = layer, one point per head, plus the mean."""
    L, H = values.shape
    layers = np.arange(1, L + 1)
    fig = go.Figure()
    for h in range(H):
        fig.add_trace(go.Scatter(x=layers, y=values[:, h], mode="markers", name=f"head {h + 1}",
                                 marker=dict(size=8, opacity=0.85),
                                 hovertemplate=f"layer %{{x}}, head {h + 1}: %{{y:.3g}}<extra></extra>"))
    fig.add_trace(go.Scatter(x=layers, y=values.mean(axis=1), mode="lines", name="mean over heads",
                             line=dict(color="grey", dash="dash"),
                             hovertemplate="layer %{x}, mean: %{y:.3g}<extra></extra>"))
    fig.update_xaxes(title="layer (network depth)", tickvals=list(layers), range=[0.5, L + 0.5])
    fig.update_yaxes(title=y_title, rangemode="tozero")
    fig.update_layout(title=title, height=420, margin=dict(l=0, r=0, t=40 if title else 10, b=0),
                      showlegend=H <= 16)
    return fig
