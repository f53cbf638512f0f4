"""One explorer view as a self-contained HTML file (issue 50): the image, the main map with its colour bar and
caption, the heads grid, the prediction and the settings, with Plotly's JavaScript inlined and every image a
``data:`` URI, so that it opens offline and makes no network request. Hovering a patch shows its value."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import plotly.graph_objects as go
from markdown_it import MarkdownIt
from PIL import Image
from plotly.offline import get_plotlyjs

from vit.app import drawing
from vit.app.explorer import patch_of
from vit.inference import Prediction

CONFIG = {"displaylogo": False, "modeBarButtonsToRemove": ["select2d", "lasso2d"], "responsive": True}


@dataclass(frozen=True, eq=False)
class View:
    """What an exported view shows, as the explorer's page draws it. ``seen``: the pixels the model saw; ``map2d
    (gh, gw)`` drawn with ``colormap`` from ``vmin`` to ``vmax`` (None: the map's own range), the patch of token
    ``query`` outlined (none for a prefix token), the patch grid when ``show_grid``, the contour of ``mask (gh, gw)``;
    ``heads (H, gh, gw)`` the heads grid of layer ``heads_layer`` (from 0; None: unnamed) on colour ``scale``
    (``drawing.COLOUR_SCALES``), ``selected_head`` outlined, each head's ``mask_share`` contour, or None.
    ``settings``: what the sidebar shows, its label -> its option (``share.describe``)."""

    title: str
    seen: Image.Image
    map2d: np.ndarray
    caption: str  # Markdown, as the page's caption (``map_captions.describe_map``)
    colormap: str = "inferno"
    vmin: float | None = None
    vmax: float | None = None
    opacity: float = 0.6
    mode: str = "bilinear"
    query: int = 0
    num_prefix_tokens: int = 1
    show_grid: bool = False
    mask: np.ndarray | None = None
    heads: np.ndarray | None = None
    heads_caption: str = ""
    heads_layer: int | None = None
    selected_head: int | None = None
    scale: str = "own"
    mask_share: float | None = None
    prediction: Prediction | None = None
    settings: Mapping[str, object] = field(default_factory=dict)


def _png_uri(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def valued_points(maps: np.ndarray, cell: tuple[int, int], columns: int, gap: int, names: list[str]) -> go.Scatter:
    """Invisible points at every patch centre of each ``(gh, gw)`` map of ``maps (N, gh, gw)`` tiled ``columns``
    wide (as ``drawing.heads_grid_image`` tiles them), each hovering its map's name, row, column and value."""
    count, gh, gw = maps.shape
    width, height = cell
    n, r, c = np.meshgrid(np.arange(count), np.arange(gh), np.arange(gw), indexing="ij")
    tile_r, tile_c = np.divmod(n, columns)
    xs = tile_c * (width + gap) + (c + 0.5) * width / gw
    ys = tile_r * (height + gap) + (r + 0.5) * height / gh
    text = [f"{names[i]}row {row + 1}, column {col + 1}" for i, row, col in zip(n.ravel(), r.ravel(), c.ravel(),
                                                                                 strict=True)]
    return go.Scatter(x=xs.ravel(), y=ys.ravel(), mode="markers", text=text, customdata=maps.ravel(),
                      hovertemplate="%{text}: %{customdata:.4~g}<extra></extra>", showlegend=False,
                      marker=dict(size=max(4, min(width / gw, height / gh)), symbol="square", opacity=0))


def _hovering(figure: go.Figure, points: go.Scatter) -> go.Figure:
    """``figure`` (a page's figure: its image, outlines and ticks) with ``points`` as its only trace: the page's
    points pick a patch or a head, the export's hover their values."""
    return go.Figure(data=[points], layout=figure.layout)


def caption_html(markdown: str) -> str:
    """A caption as the page shows it (our Markdown, its names escaped for Markdown) in HTML; raw HTML in it is
    written as text, never interpreted."""
    return MarkdownIt("commonmark", {"html": False}).renderInline(markdown)


def _figure_html(figure: go.Figure, div_id: str) -> str:
    # Plotly's own template, whatever the process's default: inside the app that is Streamlit's, whose placeholder
    # colours and margins its page fills in (exported as they are, the prediction lost its axis's ticks).
    figure = go.Figure(figure).update_layout(template="plotly")
    return figure.to_html(full_html=False, include_plotlyjs=False, config=CONFIG, div_id=div_id)


PREDICTION_WIDTH = 480  # px: room for long class names beside the bars; unset, the figure shrank to the bars alone


def view_html(view: View) -> str:
    """The whole page: one HTML document with nothing to fetch (Plotly inlined, images as ``data:`` URIs); every
    text is escaped, so a class name or a file name shows as written. The figures are the page's own (``drawing``):
    the image and the map at the page's size, the query's patch outlined, the heads grid with its head numbers."""
    shown, _, small = drawing.display_images(view.seen)
    gh, gw = view.map2d.shape
    outline = patch_of(view.query, view.num_prefix_tokens)
    drawn = drawing.overlay_image(shown, view.map2d, view.opacity, view.colormap, view.mode, view.show_grid, outline,
                                  view.vmin, view.vmax, view.mask)
    low, high = drawing.map_range(view.map2d, view.vmin, view.vmax)
    main = _hovering(drawing.patch_picker_figure(drawn.size, _png_uri(drawn), (gh, gw), view.query,
                                                 view.num_prefix_tokens, show_grid=False, fit_width=drawn.width),
                     valued_points(view.map2d[None], drawn.size, 1, 0, [""]))
    parts = [f"<h1>{html.escape(view.title)}</h1>", '<div class="row">',
             f'<figure><figcaption>Image</figcaption><img id="image" src="{_png_uri(shown)}" '
             f'width="{shown.width}" height="{shown.height}" alt="the image the model saw"></figure>',
             f'<figure><figcaption>Map (hover a patch for its value)</figcaption>{_figure_html(main, "map")}'
             f'{_figure_html(drawing.colorbar_figure(low, high, view.colormap), "colorbar")}'
             f'<p class="caption">{caption_html(view.caption)}</p></figure>',
             '<figure><figcaption>Prediction</figcaption>']
    if view.prediction is not None:
        prediction = drawing.predictions_figure(view.prediction).update_layout(width=PREDICTION_WIDTH)
        parts.append(_figure_html(prediction, "prediction"))
    else:
        parts.append("<p>No prediction: this model has no classifier.</p>")
    parts.append("</figure></div>")
    if view.heads is not None and len(view.heads):
        count = len(view.heads)
        cells = drawing.small_multiples(small, view.heads, view.opacity, view.colormap, view.mode, outline,
                                        scale=view.scale, mask_share=view.mask_share)
        sheet = drawing.heads_grid_image(cells, columns=count)  # one row, as the page shows a layer's heads
        layer = 0 if view.heads_layer is None else view.heads_layer
        selected = None if view.selected_head is None else (layer, view.selected_head)
        grid = drawing.heads_grid_figure(_png_uri(sheet), sheet.size, [layer], count, selected)
        if view.heads_layer is None:
            grid.update_yaxes(showticklabels=False)
        names = [f"head {h + 1}, " for h in range(count)]
        grid = _hovering(grid, valued_points(view.heads, small.size, count, 2, names))
        parts.append(f'<h2>Heads</h2><p class="caption">{caption_html(view.heads_caption)}</p>'
                     f'{_figure_html(grid, "heads")}')
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                   for k, v in view.settings.items())
    parts.append(f"<h2>Settings</h2><table id='settings'>{rows}</table>")
    style = ("body{font-family:sans-serif;margin:1.5em;color:#222}.row{display:flex;flex-wrap:wrap;gap:1.5em}"
             "figure{margin:0}figcaption{font-weight:bold;margin-bottom:.4em}.caption{max-width:640px;color:#555}"
             "th{text-align:left;padding-right:1em;font-weight:normal;color:#555}")
    return ("<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
            f"<title>{html.escape(view.title)}</title><style>{style}</style>"
            f"<script>{get_plotlyjs()}</script></head><body>{''.join(parts)}</body></html>")
