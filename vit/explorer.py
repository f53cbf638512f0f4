"""What the explorer page shows, as plain functions: one forward pass per image, the chosen map, captions, figures.

The page caches ``analyse`` per (checkpoint, image) and ``class_relevance`` per (checkpoint,
image, class); everything else here is cheap and redone on every interaction. Layers, heads
and patches are 0-based here (as in the arrays and the ``.npz`` download); the UI shows
layers and heads from 1, like the ViT paper. Tokens keep their indices: 0 is CLS, patch
``p`` (row-major) is token ``p + num_prefix_tokens``, as in the attention matrix.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import torch
from PIL import Image

from vit.attention import class_gradients, fuse_heads, gradient_rollout, layer_stats, rollout, token_map
from vit.checkpoint import Checkpoint
from vit.images import to_mode, to_uint8
from vit.inference import Prediction, predict, preprocess
from vit.overlay import attentions_npz_bytes, overlay, to_png_bytes
from vit.text import escape_markdown, escape_plotly

MAP_KINDS = {
    "attention": "Attention of one layer",
    "rollout": "Attention rollout",
    "class": "Class-specific (gradient rollout)",
    "legrad": "LeGrad (class-specific)",
    "lrp": "LRP transformer attribution (class-specific)",
    "attnlrp": "AttnLRP (class-specific, signed)",
    "flow": "Attention flow (max-flow, slow)",
}
# Colour maps that matplotlib (overlays) and Plotly (heatmaps) both know by the same name.
COLORMAPS = ("inferno", "viridis", "magma", "plasma", "cividis", "turbo", "jet")
TOP_K = 5


def image_digest(data: bytes) -> str:
    """A short content hash: the cache key of an uploaded or sample image."""
    return hashlib.sha256(data).hexdigest()[:20]


def sample_label(path: Path) -> str:
    """'cat_1.png' -> 'cat 1'."""
    return Path(path).stem.replace("_", " ")


@dataclass
class Analysis:
    """One image through one checkpoint: the prediction, every layer's attention and per-head statistics."""

    prediction: Prediction
    attentions: tuple[torch.Tensor, ...]  # per layer (1, H, T, T) float32, sharing the prediction's arrays
    grid: tuple[int, int]  # patch grid of the model input (the image is resized to a square)
    patch_size: int
    image_size: int  # side of the square model input, in pixels
    num_prefix_tokens: int
    distance: np.ndarray  # (L, H) mean attention distance in model-input pixels
    entropy: np.ndarray  # (L, H) mean attention entropy in nats
    prefix_names: tuple[str, ...] = ()  # ('CLS', 'DIST', 'REG 1', ...); empty: CLS then numbered prefix tokens

    @property
    def num_layers(self) -> int:
        return len(self.attentions)

    @property
    def num_heads(self) -> int:
        return self.attentions[0].shape[1]

    @property
    def num_tokens(self) -> int:
        return self.attentions[0].shape[-1]


def analyse(checkpoint: Checkpoint, image: Image.Image, top_k: int = TOP_K) -> Analysis:
    """Run the model once on ``image`` and gather everything the explorer draws from that pass."""
    [prediction] = predict(checkpoint, [image], top_k=top_k, output_attentions=True)
    attentions = tuple(torch.from_numpy(a)[None] for a in prediction.attentions)  # per layer (1, H, T, T)
    model, size = checkpoint.model, checkpoint.preprocessing.image_size  # the input preprocess() makes
    grid, prefix, patch_size = model.patch_grid(size, size), model.num_prefix_tokens, model.config.patch_size
    stats = layer_stats(attentions, grid, patch_size, prefix)  # each (L, 1, H)
    return Analysis(prediction=prediction, attentions=attentions, grid=grid, patch_size=patch_size,
                    image_size=size, num_prefix_tokens=prefix, prefix_names=model.config.prefix_token_names,
                    distance=stats["distance"][:, 0].float().numpy(), entropy=stats["entropy"][:, 0].float().numpy())


@dataclass
class ClassRelevance:
    """Attentions and d(class logit)/d(attention) per layer, for the class-specific map of one class."""

    class_index: int
    attentions: tuple[torch.Tensor, ...]  # per layer (1, H, T, T)
    gradients: tuple[torch.Tensor, ...]  # per layer (1, H, T, T)


def class_relevance(checkpoint: Checkpoint, image: Image.Image, class_index: int) -> ClassRelevance:
    """One forward and backward pass for ``class_index`` (the page caches it per checkpoint, image and class)."""
    device = next(checkpoint.model.parameters()).device
    x = preprocess([image], checkpoint.preprocessing).to(device)  # (1, C, S, S)
    _, attentions, gradients = class_gradients(checkpoint.model, x, class_index)
    return ClassRelevance(class_index, tuple(a.float().cpu() for a in attentions),
                          tuple(g.float().cpu() for g in gradients))


@dataclass(frozen=True)
class MapSettings:
    """Which attention map to draw. Defaults: the seed blog's figure (last layer, CLS query, mean over heads)."""

    kind: str = "attention"  # a key of MAP_KINDS
    layer: int = -1  # 0-based, negative from the end; for kind "attention"
    head: int | None = None  # 0-based; None fuses the heads with ``fusion``
    fusion: str = "mean"  # mean, max or min over heads (kind "attention" with head None, and "rollout")
    query: int = 0  # the token whose attention is shown; 0 is CLS
    discard_ratio: float = 0.0  # rollout: share of each row's lowest patch attentions dropped
    end_layer: int = -1  # rollout and class maps: last layer included, 0-based, negative from the end
    class_index: int | None = None  # class map: None means the predicted class


def resolved_class(settings: MapSettings, analysis: Analysis) -> int:
    """The class of the class-specific map: the chosen one, else the predicted one."""
    return analysis.prediction.class_index if settings.class_index is None else settings.class_index


def layer_attention(analysis: Analysis, layer: int, head: int | None, fusion: str = "mean") -> torch.Tensor:
    """One layer's ``(1, T, T)`` attention: one head's, or the heads fused by mean, max or min."""
    attn = analysis.attentions[layer]  # (1, H, T, T)
    if head is None:
        return fuse_heads(attn, fusion)
    if not 0 <= head < attn.shape[1]:
        raise ValueError(f"head {head} is out of range for {attn.shape[1]} heads")
    return attn[:, head]  # (1, T, T)


def attention_map(analysis: Analysis, settings: MapSettings, relevance: ClassRelevance | None = None,
                  method_map: np.ndarray | None = None) -> np.ndarray:
    """The ``(gh, gw)`` map to draw: row ``settings.query`` of the chosen token-by-token matrix, patch keys only.

    The class-specific map needs ``relevance`` for ``resolved_class(settings, analysis)``; the kinds
    of ``METHOD_MAP_KINDS`` need ``method_map``, from ``model_method_map`` (which the page caches).
    """
    s, prefix = settings, analysis.num_prefix_tokens
    if s.kind in METHOD_MAP_KINDS:
        if method_map is None:
            raise ValueError(f"the {MAP_KINDS[s.kind]} map must be computed with model_method_map first")
        return method_map
    if s.kind == "attention":
        matrix = layer_attention(analysis, s.layer, s.head, s.fusion)
    elif s.kind == "rollout":
        matrix = rollout(analysis.attentions, s.fusion, s.discard_ratio, s.end_layer, prefix)
    elif s.kind == "class":
        wanted = resolved_class(s, analysis)
        if relevance is None or relevance.class_index != wanted:
            raise ValueError(f"the class-specific map needs the gradients of class {wanted}")
        matrix = gradient_rollout(relevance.attentions, relevance.gradients, s.end_layer)
    else:
        raise ValueError(f"unknown map kind {s.kind!r}; choose one of: {', '.join(MAP_KINDS)}")
    return token_map(matrix, s.query, analysis.grid, prefix)[0].float().numpy()  # (gh, gw)


def head_maps(analysis: Analysis, query: int, layer: int | None = None) -> np.ndarray:
    """Every head's map for ``query``: ``(H, gh, gw)`` for one layer, ``(L, H, gh, gw)`` when ``layer`` is None."""
    layers = analysis.attentions if layer is None else [analysis.attentions[layer]]
    maps = np.stack([token_map(a, query, analysis.grid, analysis.num_prefix_tokens)[0].float().numpy()
                     for a in layers])  # (L, H, gh, gw)
    return maps if layer is None else maps[0]


def small_multiples(image: Image.Image, maps: np.ndarray, opacity: float, colormap: str, mode: str,
                    outline_patch: int | None = None) -> list[Image.Image]:
    """One overlay per ``(gh, gw)`` map of ``maps (N, gh, gw)``, each on its own colour scale."""
    return [overlay(image, m, opacity, colormap, mode, outline_patch=outline_patch) for m in maps]


def token_label(token: int, grid: tuple[int, int], num_prefix_tokens: int = 1,
                prefix_names: Sequence[str] = ()) -> str:
    """'CLS' for token 0, 'DIST' / 'REG 2' for other prefix tokens named in ``prefix_names``
    (``ViTConfig.prefix_token_names``), 'patch row 2, col 3' (counted from 1, top left) for a patch token."""
    if token < 0 or token >= num_prefix_tokens + grid[0] * grid[1]:
        raise ValueError(f"token {token} is out of range for a {grid[0]}x{grid[1]} grid")
    if token < num_prefix_tokens:
        if token < len(prefix_names):
            return prefix_names[token]
        return "CLS" if token == 0 else f"prefix token {token}"
    row, col = divmod(token - num_prefix_tokens, grid[1])
    return f"patch row {row + 1}, col {col + 1}"


def token_option(token: int, grid: tuple[int, int], num_prefix_tokens: int = 1,
                 prefix_names: Sequence[str] = ()) -> str:
    """The query picker's text for a token: '0 · CLS', '2 · REG 1', '10 · patch row 2, col 2'."""
    return f"{token} · {token_label(token, grid, num_prefix_tokens, prefix_names)}"


def tokens_caption(grid: tuple[int, int], num_prefix_tokens: int = 1, prefix_names: Sequence[str] = ()) -> str:
    """Which token is which, for the matrix caption: 'token 0 is CLS, 1 is REG 1, …; tokens 3–18 the patches'."""
    names = [f"{t} is {token_label(t, grid, num_prefix_tokens, prefix_names)}" for t in range(num_prefix_tokens)]
    first, last = num_prefix_tokens, num_prefix_tokens + grid[0] * grid[1] - 1
    return f"token {', '.join(names)}; tokens {first}–{last} the patches row by row"


def patch_of(token: int, num_prefix_tokens: int = 1) -> int | None:
    """The row-major patch index of a token, None for a prefix (CLS) token."""
    return token - num_prefix_tokens if token >= num_prefix_tokens else None


def token_from_selection(selection, num_prefix_tokens: int = 1) -> int | None:
    """The token a click on the patch picker chose (its points are the patches in row-major order), or None."""
    if not selection:
        return None
    indices = selection.get("point_indices") or []
    if not indices:
        return None
    return int(indices[-1]) + num_prefix_tokens


def describe_map(settings: MapSettings, analysis: Analysis, class_names: list[str]) -> str:
    """A caption that says what the drawn map means."""
    s, L, H = settings, analysis.num_layers, analysis.num_heads
    query = token_label(s.query, analysis.grid, analysis.num_prefix_tokens, analysis.prefix_names)
    if s.query == 0:
        who = "the CLS token"
    elif s.query < analysis.num_prefix_tokens:
        who = f"the {query} token"
    else:
        who = f"the query {query} (outlined)"
    if s.kind == "attention":
        layer = s.layer % L
        heads = f"head {s.head + 1}" if s.head is not None else f"the {s.fusion} over its {H} heads"
        text = (f"**Layer {layer + 1} of {L}, {heads}**: how much {who} attends to each patch in this layer "
                "(one row of the attention matrix, the CLS key left out).")
        if s.query == 0 and layer == L - 1:
            text += " The classifier reads the CLS token after this layer, so bright patches fed the prediction."
        return text
    if s.kind in METHOD_MAP_KINDS:
        return describe_method_map(settings, analysis, class_names)
    end = s.end_layer % L
    if s.kind == "rollout":
        dropped = f", the lowest {s.discard_ratio:.0%} of each row dropped" if s.discard_ratio > 0 else ""
        return (f"**Attention rollout through layers 1–{end + 1}** (heads fused by {s.fusion}{dropped}): "
                f"how much of {who}'s representation after layer {end + 1} flows from each input patch, "
                "following attention and the residual connections (Abnar & Zuidema, 2020).")
    name = escape_markdown(class_names[resolved_class(s, analysis)])  # the caption is Markdown; names are data
    which = "the predicted class" if s.class_index is None else "the chosen class"
    return (f"**Relevance for “{name}”** ({which}) through layers 1–{end + 1}: attention weighted by its gradient "
            f"for the “{name}” score, positive parts only, rolled out (Chefer et al., 2021). Bright patches "
            f"are evidence for “{name}” as read by {who}.")


def describe_range(map2d: np.ndarray) -> str:
    """'Colours span 0.0012 (dark) to 0.083 (bright).'"""
    return f"Colours span {float(np.min(map2d)):.3g} (dark) to {float(np.max(map2d)):.3g} (bright) on this map."


def display_size(size: tuple[int, int], min_side: int = 320, max_side: int = 640) -> tuple[int, int]:
    """(width, height) to show an image at: small images grow by a whole factor (crisp pixels), large ones shrink."""
    width, height = size
    longest = max(width, height)
    if longest < min_side:
        factor = math.ceil(min_side / longest)
        return width * factor, height * factor
    if longest > max_side:
        scale = max_side / longest
        return max(1, round(width * scale)), max(1, round(height * scale))
    return width, height


def display_image(image: Image.Image, min_side: int = 320, max_side: int = 640) -> Image.Image:
    """The image in RGB at ``display_size``: nearest-neighbour when enlarged, Lanczos when reduced."""
    image = to_mode(image, 3)
    size = display_size(image.size, min_side, max_side)
    if size == image.size:
        return image
    method = Image.Resampling.NEAREST if size[0] > image.size[0] else Image.Resampling.LANCZOS
    return image.resize(size, method)


def model_input_image(image: Image.Image, checkpoint: Checkpoint) -> Image.Image:
    """The image as the model sees it (resized to its square input, greyscale for greyscale models)."""
    p = checkpoint.preprocessing
    array = to_uint8(image, p.image_size, p.num_channels, p.resize_size, p.resize_mode,
                     p.resample).permute(1, 2, 0).numpy()  # (S, S, C)
    return Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)


def png_data_uri(image: Image.Image) -> str:
    """The image as a ``data:`` URI for a Plotly layout image (encode it once per image, not per redraw)."""
    return "data:image/png;base64," + base64.b64encode(to_png_bytes(image)).decode("ascii")


def patch_picker_figure(image_size: tuple[int, int], image_source: str, grid: tuple[int, int], query: int,
                        num_prefix_tokens: int = 1, show_grid: bool = True) -> go.Figure:
    """The image (``image_source``, e.g. ``png_data_uri``, shown at ``image_size = (width, height)``) with its
    patch grid and the query outlined; a click near a patch centre selects that patch.

    The patch centres are invisible points in row-major order (point ``i`` is patch ``i``), and
    ``hoverdistance=-1`` lets a click anywhere pick the nearest one. The figure is built in one
    go: Plotly validates every ``add_shape`` against the whole layout, which costs seconds on big grids.
    """
    width, height = image_size
    gh, gw = grid
    rows, cols = np.divmod(np.arange(gh * gw), gw)
    xs, ys = (cols + 0.5) * width / gw, (rows + 0.5) * height / gh
    labels = [token_option(int(p) + num_prefix_tokens, grid, num_prefix_tokens) for p in range(gh * gw)]  # patches
    invisible = dict(marker=dict(opacity=0))
    points = go.Scatter(x=xs, y=ys, mode="markers", text=labels, hovertemplate="%{text}<extra></extra>",
                        marker=dict(size=max(4, min(width / gw, height / gh)), symbol="square", opacity=0),
                        selected=invisible, unselected=invisible, showlegend=False)
    shapes = []
    if show_grid:  # one path for all lines
        path = "".join(f"M{c * width / gw:.2f},0L{c * width / gw:.2f},{height}" for c in range(1, gw))
        path += "".join(f"M0,{r * height / gh:.2f}L{width},{r * height / gh:.2f}" for r in range(1, gh))
        if path:
            shapes.append(dict(type="path", path=path, line=dict(color="rgba(255,255,255,0.6)", width=1)))
    patch = patch_of(query, num_prefix_tokens)
    if patch is not None:
        r, c = divmod(patch, gw)
        shapes.append(dict(type="rect", x0=c * width / gw, x1=(c + 1) * width / gw, y0=r * height / gh,
                           y1=(r + 1) * height / gh, line=dict(color="cyan", width=3)))
    image = dict(source=image_source, xref="x", yref="y", x=0, y=0, sizex=width, sizey=height, xanchor="left",
                 yanchor="top", sizing="stretch", layer="below")
    layout = dict(width=width, height=height, margin=dict(l=0, r=0, t=0, b=0), hovermode="closest",
                  hoverdistance=-1, plot_bgcolor="rgba(0,0,0,0)", paper_bgcolor="rgba(0,0,0,0)",
                  images=[image], shapes=shapes,
                  xaxis=dict(range=[0, width], visible=False, fixedrange=True),
                  yaxis=dict(range=[height, 0], visible=False, fixedrange=True, scaleanchor="x"))
    return go.Figure(data=[points], layout=layout)


def predictions_figure(prediction: Prediction) -> go.Figure:
    """The top-k classes as horizontal bars with their probabilities, the most probable on top."""
    labels = [escape_plotly(label) for label, _ in prediction.top_k]  # Plotly reads HTML tags in labels
    probs = [p for _, p in prediction.top_k]
    colors = ["#ff4b4b"] + ["#8fa3bf"] * (len(probs) - 1)
    fig = go.Figure(go.Bar(x=probs, y=labels, orientation="h", marker_color=colors,
                           text=[f"{p:.1%}" for p in probs], textposition="auto",
                           hovertemplate="%{y}: %{x:.2%}<extra></extra>"))
    fig.update_xaxes(range=[0, 1], tickformat=".0%", title="probability")
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_layout(height=60 + 36 * len(probs), margin=dict(l=0, r=10, t=10, b=0))
    return fig


def attention_matrix_figure(matrix: np.ndarray, grid: tuple[int, int], num_prefix_tokens: int = 1,
                            colormap: str = "inferno", title: str = "", query: int | None = None,
                            prefix_names: Sequence[str] = ()) -> go.Figure:
    """A ``(T, T)`` attention matrix as a heatmap: row = query token, column = key token, token 0 = CLS.

    ``query`` outlines that row: the one the overlay shows (without its prefix columns).
    """
    T = matrix.shape[-1]
    fig = go.Figure(go.Heatmap(z=matrix, colorscale=colormap, colorbar=dict(title="attention"),
                               hovertemplate="query %{y} → key %{x}: %{z:.4f}<extra></extra>"))
    ticks = [0] + list(range(num_prefix_tokens + grid[1], T, grid[1]))  # CLS, then the first token of rows 2, 3, …
    text = [(prefix_names[0] if prefix_names else "CLS") if t == 0 else str(t) for t in ticks]
    fig.update_xaxes(title="key token (attended to)", tickvals=ticks, ticktext=text, constrain="domain")
    fig.update_yaxes(title="query token (attending)", tickvals=ticks, ticktext=text, autorange="reversed",
                     scaleanchor="x", constrain="domain")
    if query is not None:
        fig.add_shape(type="rect", x0=-0.5, x1=T - 0.5, y0=query - 0.5, y1=query + 0.5,
                      line=dict(color="cyan", width=2))
    fig.update_layout(title=title, height=560, margin=dict(l=0, r=0, t=40 if title else 10, b=0))
    return fig


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


def attentions_npz(analysis: Analysis, class_names: list[str]) -> bytes:
    """Every layer's attention (``layer_i``: heads x tokens x tokens) with the logits, classes and geometry."""
    p = analysis.prediction
    return attentions_npz_bytes(p.attentions, logits=p.logits, probabilities=p.probabilities,
                                class_names=np.array(class_names), grid=np.array(analysis.grid),
                                patch_size=np.array(analysis.patch_size),
                                num_prefix_tokens=np.array(analysis.num_prefix_tokens),
                                mean_attention_distance=analysis.distance, attention_entropy=analysis.entropy)


def overlay_png(image: Image.Image, map2d: np.ndarray, opacity: float, colormap: str, mode: str, show_grid: bool,
                outline_patch: int | None) -> bytes:
    """The overlay at the image's own resolution, as PNG (for the download)."""
    return to_png_bytes(overlay(image, map2d, opacity, colormap, mode, show_grid=show_grid,
                                outline_patch=outline_patch))


# -- maps that need the model (LeGrad, LRP, AttnLRP) or a max-flow (attention flow) ----------------------------------

METHOD_MAP_KINDS = ("legrad", "lrp", "attnlrp", "flow")  # computed by model_method_map, cached by the page
MORE_METHODS = "methods"  # the page's one "Map" choice for all of METHOD_MAP_KINDS (a second picker names which)
MORE_METHODS_LABEL = "More: LeGrad, LRP, AttnLRP, flow"
CLASS_MAP_KINDS = ("class", "legrad", "lrp", "attnlrp")  # explain one class: the page shows a class picker
SIGNED_MAP_KINDS = ("attnlrp",)  # negative = evidence against the class: a diverging colour map around 0
DIVERGING_COLORMAP = "RdBu_r"  # blue negative, white 0, red positive; matplotlib and Plotly both know it


def model_method_map(checkpoint: Checkpoint, image: Image.Image, kind: str, class_index: int, query: int = 0,
                     end_layer: int = -1, fusion: str = "mean") -> np.ndarray:
    """The ``(gh, gw)`` map of a ``METHOD_MAP_KINDS`` kind for one image (seconds for ``flow``).

    ``class_index`` is the explained class (LeGrad, LRP, AttnLRP); ``query`` the token whose
    relevance or flow is shown (LRP, flow; LeGrad and AttnLRP explain the classifier's CLS).
    Raises ValueError (e.g. ``UnsupportedModelError``, ``TooManyTokensError``) with a message to show.
    """
    from vit.attention_flow import attention_flow
    from vit.relevance import attnlrp, legrad, patch_sums, transformer_attribution

    model = checkpoint.model
    device = next(model.parameters()).device
    x = preprocess([image], checkpoint.preprocessing).to(device)  # (1, C, S, S)
    grid, prefix = model.patch_grid(x.shape[2], x.shape[3]), model.num_prefix_tokens
    if kind == "legrad":
        result = legrad(model, x, class_index)
    elif kind == "lrp":
        result = token_map(transformer_attribution(model, x, class_index, end_layer), query, grid, prefix)
    elif kind == "attnlrp":
        result = patch_sums(attnlrp(model, x, class_index), grid)
    elif kind == "flow":
        with torch.no_grad():
            _, attentions = model(x, output_attentions=True)
        result = attention_flow(attentions, query, fusion, end_layer)[:, prefix:].reshape(1, *grid)
    else:
        raise ValueError(f"{kind!r} is not one of {', '.join(METHOD_MAP_KINDS)}")
    return result[0].float().cpu().numpy()  # (gh, gw)


def map_colours(kind: str, map2d: np.ndarray, colormap: str) -> tuple[str, float | None, float | None]:
    """``(colour map, vmin, vmax)`` for the overlay: signed maps get a diverging map symmetric around 0."""
    if kind in SIGNED_MAP_KINDS:
        bound = float(np.abs(map2d).max()) or 1.0
        return DIVERGING_COLORMAP, -bound, bound
    return colormap, None, None


def describe_method_map(settings: MapSettings, analysis: Analysis, class_names: list[str]) -> str:
    """The caption of a ``METHOD_MAP_KINDS`` map."""
    s = settings
    query = token_label(s.query, analysis.grid, analysis.num_prefix_tokens)
    who = "the CLS token" if s.query == 0 else f"the query {query} (outlined)"
    if s.kind == "flow":
        return (f"**Attention flow through layers 1–{s.end_layer % analysis.num_layers + 1}** (heads fused by "
                f"{s.fusion}): the maximum flow from {who} down to each input patch, when every layer's attention "
                "plus the residual is a capacity (Abnar & Zuidema, 2020). Unlike rollout, a path counts only "
                "as much as its narrowest layer.")
    name = escape_markdown(class_names[resolved_class(s, analysis)])  # the caption is Markdown; names are data
    which = "the predicted class" if s.class_index is None else "the chosen class"
    if s.kind == "legrad":
        return (f"**LeGrad for “{name}”** ({which}): at each of the last two layers, the gradient of the "
                f"“{name}” score read at that layer with respect to that layer's attention, positive parts "
                "averaged over heads and queries, summed (Bousselham et al., 2024).")
    if s.kind == "lrp":
        return (f"**LRP transformer attribution for “{name}”** ({which}): each layer's attention relevance "
                f"(layer-wise relevance propagation) times its gradient, positive parts, rolled out, read by {who} "
                "(Chefer, Gur & Wolf, 2021).")
    return (f"**AttnLRP for “{name}”** ({which}): relevance propagated back to the pixels, summed per patch "
            f"(Achtibat et al., 2024). Red patches are evidence for “{name}”, blue ones against it; white is "
            "neutral.")


def faithfulness_figure(checkpoint: Checkpoint, image: Image.Image, map2d: np.ndarray, class_index: int,
                        replacement: str = "blur") -> go.Figure:
    """Deletion and insertion curves of ``map2d`` for one image, with their areas in the legend."""
    from vit.faithfulness import auc, perturbation_curves

    model = checkpoint.model
    device = next(model.parameters()).device
    x = preprocess([image], checkpoint.preprocessing).to(device)
    maps = torch.as_tensor(np.asarray(map2d, dtype=np.float32))[None].to(device)  # (1, gh, gw)
    fractions, deletion, insertion = perturbation_curves(model, x, maps, torch.tensor([class_index], device=device),
                                                         replacement)
    fig = go.Figure()
    for name, curve, colour in (("deletion", deletion[0], "#d62728"), ("insertion", insertion[0], "#1f77b4")):
        fig.add_trace(go.Scatter(x=fractions, y=curve, mode="lines", line=dict(color=colour),
                                 name=f"{name} (AUC {float(auc(fractions, curve)):.3f})",
                                 hovertemplate=f"{name}: %{{x:.0%}} of patches → p = %{{y:.3f}}<extra></extra>"))
    fig.update_xaxes(title="fraction of patches removed / inserted, most relevant first", tickformat=".0%",
                     range=[0, 1])
    fig.update_yaxes(title=f"p({escape_plotly(checkpoint.class_names[class_index])})", range=[0, 1])
    fig.update_layout(height=300, margin=dict(l=0, r=0, t=10, b=0), legend=dict(x=0.45, y=0.98))
    return fig
