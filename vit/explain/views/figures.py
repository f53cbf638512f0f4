"""Plotly figures of attention statistics, shared by the explorer page and the dataset report."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

TITLE_STANDOFF = 12  # px between an axis title and its tick labels


def layer_stats_figure(values: np.ndarray, y_title: str, title: str = "") -> go.Figure:
    """Per-head values ``(L, H)`` as in the ViT paper's Fig. 7: x = layer, one point per head, plus the mean (NaN:
    a head the layer does not have, in a model whose stages have their own heads)."""
    L, H = values.shape
    layers = np.arange(1, L + 1)
    fig = go.Figure()
    for h in range(H):
        fig.add_trace(go.Scatter(x=layers, y=values[:, h], mode="markers", name=f"head {h + 1}",
                                 marker=dict(size=8, opacity=0.85),
                                 hovertemplate=f"layer %{{x}}, head {h + 1}: %{{y:.3g}}<extra></extra>"))
    fig.add_trace(go.Scatter(x=layers, y=np.nanmean(values, axis=1), mode="lines", name="mean over heads",
                             line=dict(color="grey", dash="dash"),
                             hovertemplate="layer %{x}, mean: %{y:.3g}<extra></extra>"))
    # automargin: with the margins at 0 the axis numbers and titles were drawn outside the figure.
    fig.update_xaxes(title="layer (network depth)", tickvals=list(layers), range=[0.5, L + 0.5], automargin=True)
    fig.update_yaxes(title=y_title, rangemode="tozero", automargin=True)
    fig.update_layout(title=title, height=420, margin=dict(l=0, r=0, t=40 if title else 10, b=0),
                      showlegend=H <= 16)
    return fig


def _label_every_cell(fig: go.Figure, x: list[str], y: list[str], x_title: str) -> None:
    """Axis titles, and every row's and column's label (Plotly thins crowded category ticks, so a reader could not
    tell which row is which layer, or find the MLP column), with the room the labels need."""
    # A standoff: by default Plotly sets the y title against the widest label and a wider one ("layer 10") ran into
    # it.
    fig.update_yaxes(title=dict(text="layer (1 = first block, on top)", standoff=TITLE_STANDOFF), tickmode="array",
                     tickvals=y, ticktext=y, automargin=True)
    fig.update_xaxes(title=dict(text=x_title, standoff=TITLE_STANDOFF), tickmode="array", tickvals=x, ticktext=x,
                     automargin=True, side="bottom")


def layer_head_figure(values: np.ndarray, title: str, value_title: str, extra: np.ndarray | None = None,
                      extra_name: str = "MLP", signed: bool = True, hover: np.ndarray | None = None,
                      first_layer: int = 0) -> go.Figure:
    """A layers x heads heatmap ``(L, H)`` (layer 1, or ``first_layer + 1``, on top), with an optional extra column
    ``(L,)`` such as the MLPs; ``signed`` centres a diverging scale on 0; NaN cells (heads a layer lacks) are blank.
    ``hover`` ``(L, H + extra)`` adds a line per cell. Every row and column is labelled, the axes titled."""
    L, H = values.shape
    z = values if extra is None else np.concatenate([values, extra[:, None]], axis=1)
    x = [f"head {h + 1}" for h in range(H)] + ([extra_name] if extra is not None else [])
    y = [f"layer {first_layer + i + 1}" for i in range(L)]
    bound = float(np.nanmax(np.abs(z))) if np.isfinite(z).any() else 1.0
    scale = dict(colorscale="RdBu", reversescale=True, zmid=0, zmin=-bound, zmax=bound) if signed else \
        dict(colorscale=[[0, "rgb(255, 255, 255)"], [1, "rgb(180, 30, 30)"]])
    customdata = hover if hover is not None else np.full(z.shape, "")
    fig = go.Figure(go.Heatmap(z=z, x=x, y=y, **scale, customdata=customdata, colorbar=dict(title=value_title),
                               hovertemplate="%{y}, %{x}: %{z:.4g}%{customdata}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(type="category")
    _label_every_cell(fig, x, y, "attention head" + (f" (last column: the {extra_name})" if extra is not None
                                                       else ""))
    fig.update_layout(title=title, height=max(260, 110 + 26 * L), margin=dict(l=0, r=0, t=40, b=0))
    return fig


def massive_activations_figure(stats: np.ndarray, title: str = "") -> go.Figure:
    """Per layer ``(L, 4)``: the top 1, 2, 3 |activation| and the median, as locuslab/massive-activations plots."""
    layers = np.arange(1, stats.shape[0] + 1)
    fig = go.Figure()
    for i, name in enumerate(("top 1", "top 2", "top 3", "median")):
        fig.add_trace(go.Scatter(x=layers, y=stats[:, i], mode="lines+markers", name=name,
                                 hovertemplate=f"layer %{{x}}, {name}: %{{y:.4g}}<extra></extra>"))
    fig.update_xaxes(title="layer", tickvals=list(layers), automargin=True)
    fig.update_yaxes(title="|activation| of the block output", rangemode="tozero", automargin=True)
    fig.update_layout(title=title, height=360, margin=dict(l=0, r=0, t=40 if title else 10, b=0))
    return fig


def norm_histogram_figure(norms: np.ndarray, threshold: float, title: str = "") -> go.Figure:
    """A histogram of token norms ``(N,)`` with the high-norm threshold as a vertical line."""
    fig = go.Figure(go.Histogram(x=norms, nbinsx=60, marker_color="#8fa3bf",
                                 hovertemplate="norm %{x}: %{y} tokens<extra></extra>"))
    fig.add_vline(x=threshold, line=dict(color="#d62728", dash="dash"))
    fig.update_xaxes(title="token norm", automargin=True)
    fig.update_yaxes(title="tokens", automargin=True)
    fig.update_layout(title=title, height=300, margin=dict(l=0, r=0, t=40 if title else 10, b=0), bargap=0.05)
    return fig


def layer_token_figure(values: np.ndarray, token_labels: list[str], title: str, value_title: str) -> go.Figure:
    """A layers x tokens heatmap ``(L, T)`` on a diverging scale around 0 (layer 1 on top), the axes titled; every
    layer labelled, and every token while there are at most 40."""
    bound = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 1.0
    fig = go.Figure(go.Heatmap(z=values, x=token_labels, y=[f"layer {i + 1}" for i in range(values.shape[0])],
                               colorscale="RdBu", reversescale=True, zmid=0, zmin=-bound, zmax=bound,
                               colorbar=dict(title=value_title),
                               hovertemplate="%{y} input, %{x}: %{z:.3g}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(type="category")
    _label_every_cell(fig, list(token_labels), [f"layer {i + 1}" for i in range(values.shape[0])], "token")
    fig.update_xaxes(showticklabels=len(token_labels) <= 40)
    fig.update_layout(title=title, height=max(260, 110 + 26 * values.shape[0]), margin=dict(l=0, r=0, t=40, b=0))
    return fig
