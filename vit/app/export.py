"""One explorer view as a self-contained HTML file (issue 50): the image, the main map with its colour bar and
caption, the heads grid, the prediction and the settings, with Plotly's JavaScript inlined and every image a
``data:`` URI, so that it opens offline and makes no network request. Hovering a patch shows its value."""

from __future__ import annotations

import base64
import functools
import html
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from markdown_it import MarkdownIt
from PIL import Image
from plotly.offline import get_plotlyjs

from vit.app import drawing
from vit.app.clip_view import fit, frame_picker_figure
from vit.app.explorer_page import patch_of
from vit.core.inference import Prediction

CONFIG = {"displaylogo": False, "modeBarButtonsToRemove": ["select2d", "lasso2d"], "responsive": True}


@dataclass(frozen=True, eq=False)
class PromptView:
    """A SAM's prompt as the explorer's Prompts section shows it: each mask over the pixels the model saw with its
    caption (plain text), the prompt in words, the mask decoder's attention drawn with its caption, and "Which pixels
    made the mask" when one was chosen: ``pixel_map`` drawn as the page draws it, its title and caption naming the
    method, ``pixel_map_colours`` its colour bar ``(colour map, low, high)``; one that could not be drawn (over the
    memory limit, an empty mask) has its title and the reason as its caption, and no ``pixel_map``."""

    masks: Sequence[Image.Image]
    mask_captions: Sequence[str]
    prompt: str
    attention: Image.Image
    attention_caption: str
    pixel_map: Image.Image | None = None
    pixel_map_title: str = ""
    pixel_map_caption: str = ""
    pixel_map_colours: tuple[str, float, float] | None = None


@dataclass(frozen=True, eq=False)
class View:
    """What an exported view shows, as the explorer's page draws it. ``seen``: the pixels the model saw; ``map2d
    (gh, gw)`` drawn with ``colormap`` from ``vmin`` to ``vmax`` (None: the map's own range), the patch of token
    ``query`` outlined (none for a prefix token), the patch grid when ``show_grid``, the contour of ``mask (gh, gw)``;
    ``heads (H, gh, gw)`` the heads grid of layer ``heads_layer`` (from 0; None: unnamed) on colour ``scale``
    (``drawing.COLOUR_SCALES``), ``selected_head`` outlined, each head's ``mask_share`` contour, or None.
    ``settings``: what the sidebar shows, its label -> its option (``share.describe``). ``grid``: the patch grid
    ``(gh, gw)`` when ``map2d`` is a pixel method's ``(H, W)`` map on the model's input pixels (drawn at pixel
    resolution; hovering a patch gives its sum); None when ``map2d`` is the patch grid."""

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
    prompts: PromptView | None = None  # a whole SAM's prompt, its masks and its decoder's attention
    grid: tuple[int, int] | None = None


def _png_uri(image: Image.Image) -> str:
    buffer = io.BytesIO()
    # zlib's fastest level: the same pixels (PNG is lossless) in a fifth of the CPU of Pillow's default (6), for
    # ~10 % more image bytes beside Plotly's 4.6 MB of JavaScript.
    image.convert("RGB").save(buffer, format="PNG", compress_level=1)
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
    points pick a patch or a head, the export's hover their values. ``figure`` is changed in place: a new figure
    over its layout would validate and copy the layout and its template again."""
    figure.data = ()
    return figure.add_trace(points)


def caption_html(markdown: str) -> str:
    """A caption as the page shows it (our Markdown, its names escaped for Markdown) in HTML; raw HTML in it is
    written as text, never interpreted."""
    return MarkdownIt("commonmark", {"html": False}).renderInline(markdown)


_plotlyjs = functools.cache(get_plotlyjs)  # Plotly's 4.6 MB of JavaScript, read once per process, not per export


@functools.cache
def _plotly_template() -> dict:
    """Plotly's own template as the JSON a figure writes, once per process: set on a figure (``update_layout``) it
    is validated and copied, property by property, every time (~40 % of an export's CPU). Validated once here, so
    that it writes its keys in the order a figure's does."""
    return go.Layout(template="plotly").to_plotly_json()["template"]


def _figure_html(figure: go.Figure, div_id: str) -> str:
    # Plotly's own template, whatever the process's default: inside the app that is Streamlit's, whose placeholder
    # colours and margins its page fills in (exported as they are, the prediction lost its axis's ticks).
    # The figure is written as its dict, once, with the template's JSON put in: the same page as a copied figure
    # with ``update_layout(template="plotly")``, without validating and copying the template and the figure again.
    # ``figure`` is the export's own: its template (the process's default) is dropped in place, not copied.
    figure.layout.template = None
    spec = figure.to_dict()
    spec["layout"]["template"] = _plotly_template()
    return pio.to_html(spec, config=CONFIG, full_html=False, include_plotlyjs=False, div_id=div_id, validate=False)


PREDICTION_WIDTH = 480  # px: room for long class names beside the bars; unset, the figure shrank to the bars alone


def _prediction_html(prediction) -> str:
    """The prediction's bars, or the line saying the model has none (an exported image's view and a clip's)."""
    if prediction is None:
        return "<p>No prediction: this model has no classifier.</p>"
    return _figure_html(drawing.predictions_figure(prediction).update_layout(width=PREDICTION_WIDTH), "prediction")


def view_html(view: View) -> str:
    """The whole page: one HTML document with nothing to fetch (Plotly inlined, images as ``data:`` URIs); every
    text is escaped, so a class name or a file name shows as written. The figures are the page's own (``drawing``):
    the image and the map at the page's size, the query's patch outlined, the heads grid with its head numbers."""
    shown, _, small = drawing.display_images(view.seen)
    hovered = view.map2d  # (gh, gw); a pixel map's patch sums
    if view.grid is not None:
        (gh, gw), (H, W) = view.grid, view.map2d.shape
        hovered = view.map2d.reshape(gh, H // gh, gw, W // gw).sum(axis=(1, 3), dtype=np.float64)
    gh, gw = hovered.shape
    outline = patch_of(view.query, view.num_prefix_tokens)
    drawn = drawing.overlay_image(shown, view.map2d, view.opacity, view.colormap, view.mode, view.show_grid, outline,
                                  view.vmin, view.vmax, view.mask, (gh, gw))
    low, high = drawing.map_range(view.map2d, view.vmin, view.vmax)
    main = _hovering(drawing.patch_picker_figure(drawn.size, _png_uri(drawn), (gh, gw), view.query,
                                                 view.num_prefix_tokens, show_grid=False, fit_width=drawn.width),
                     valued_points(hovered[None], drawn.size, 1, 0, [""]))
    parts = [f"<h1>{html.escape(view.title)}</h1>", '<div class="row">',
             f'<figure><figcaption>Image</figcaption><img id="image" src="{_png_uri(shown)}" '
             f'width="{shown.width}" height="{shown.height}" alt="the image the model saw"></figure>',
             f'<figure><figcaption>Map (hover a patch for its value)</figcaption>{_figure_html(main, "map")}'
             f'{_figure_html(drawing.colorbar_figure(low, high, view.colormap), "colorbar")}'
             f'<p class="caption">{caption_html(view.caption)}</p></figure>',
             '<figure><figcaption>Prediction</figcaption>']
    parts.append(_prediction_html(view.prediction))
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
    if view.prompts is not None:
        parts.append(_prompts_html(view.prompts))
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                   for k, v in view.settings.items())
    parts.append(f"<h2>Settings</h2><table id='settings'>{rows}</table>")
    style = ("body{font-family:sans-serif;margin:1.5em;color:#222}.row{display:flex;flex-wrap:wrap;gap:1.5em}"
             "figure{margin:0}figcaption{font-weight:bold;margin-bottom:.4em}.caption{max-width:640px;color:#555}"
             "th{text-align:left;padding-right:1em;font-weight:normal;color:#555}")
    return ("<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
            f"<title>{html.escape(view.title)}</title><style>{style}</style>"
            f"<script>{_plotlyjs()}</script></head><body>{''.join(parts)}</body></html>")


def _prompts_html(prompts: PromptView) -> str:
    """The Prompts section: the three masks with their captions, the prompt, the decoder's attention; plain text."""
    masks = "".join(f'<figure><img src="{_png_uri(image)}" width="{image.width}" height="{image.height}" '
                    f'alt="{html.escape(caption)}"><figcaption class="caption">{html.escape(caption)}</figcaption>'
                    "</figure>" for image, caption in zip(prompts.masks, prompts.mask_captions, strict=True))
    attention = prompts.attention
    parts = (f'<h2>Prompts</h2><p class="caption" id="prompt">{html.escape(prompts.prompt)}</p>'
             f'<div class="row" id="masks">{masks}</div><h2>What the decoder looked at</h2>'
             f'<figure><img id="decoder-attention" src="{_png_uri(attention)}" width="{attention.width}" '
             f'height="{attention.height}" alt="the mask decoder\'s attention">'
             f'<figcaption class="caption">{html.escape(prompts.attention_caption)}</figcaption></figure>')
    picture = prompts.pixel_map
    if picture is None:  # none chosen, or one the export could not draw: its title and why
        return parts if not prompts.pixel_map_title else (
            f'{parts}<h2 id="pixel-map-title">{html.escape(prompts.pixel_map_title)}</h2>'
            f'<p class="caption" id="pixel-map-refused">{html.escape(prompts.pixel_map_caption)}</p>')
    colour_bar = ("" if prompts.pixel_map_colours is None else _figure_html(
        drawing.colorbar_figure(prompts.pixel_map_colours[1], prompts.pixel_map_colours[2],
                                prompts.pixel_map_colours[0]), "pixel-map-colorbar"))
    return (f'{parts}<h2 id="pixel-map-title">{html.escape(prompts.pixel_map_title)}</h2>'
            f'<figure><img id="pixel-map" src="{_png_uri(picture)}" width="{picture.width}" '
            f'height="{picture.height}" alt="{html.escape(prompts.pixel_map_title)}">{colour_bar}'
            f'<figcaption class="caption">{html.escape(prompts.pixel_map_caption)}</figcaption></figure>')


@dataclass(frozen=True, eq=False)
class ClipView:
    """What an exported clip view shows, as the explorer's clip page draws it: ``overlays`` each sampled frame with
    its map over it (one colour scale for the clip, ``colormap`` from ``vmin`` to ``vmax``), ``maps (frames, gh, gw)``
    the values they show, ``labels`` each frame's caption ('2 · frame 5'), ``shown`` the frame the page shows (from
    0, hoverable here too), ``query_patch`` its outlined patch (row-major, or None), ``caption`` the page's caption
    as plain text, the prediction and the settings (label -> option)."""

    title: str
    overlays: Sequence[Image.Image]
    maps: np.ndarray
    labels: Sequence[str]
    caption: str
    shown: int = 0
    query_patch: int | None = None
    colormap: str = "inferno"
    vmin: float = 0.0
    vmax: float = 1.0
    prediction: Prediction | None = None
    settings: Mapping[str, object] = field(default_factory=dict)


# The clip's player: a slider over the frames and a Play button, in plain JavaScript over the frames' data: URIs.
PLAYER_SCRIPT = """(function () {
  var frames = JSON.parse(document.getElementById('frames').textContent);
  var labels = JSON.parse(document.getElementById('labels').textContent);
  var image = document.getElementById('player'), slider = document.getElementById('slider');
  var label = document.getElementById('frame-label'), play = document.getElementById('play'), timer = null;
  function show(i) { image.src = frames[i]; slider.value = i; label.textContent = labels[i]; }
  slider.addEventListener('input', function () { show(+slider.value); });
  play.addEventListener('click', function () {
    if (timer) { clearInterval(timer); timer = null; play.textContent = 'Play'; return; }
    play.textContent = 'Pause';
    timer = setInterval(function () { show((+slider.value + 1) % frames.length); }, FRAME_MS);
  });
})();"""


def clip_html(view: ClipView, frame_ms: int = 500) -> str:
    """A clip's view as one HTML document with nothing to fetch: a player (a frame slider and Play) over every
    sampled frame with its map, the shown frame with each patch's value on hover, the colour bar, the strip of every
    frame, the prediction and the settings. Every text is escaped."""
    shown = view.overlays[view.shown]
    picker = frame_picker_figure(shown, view.maps[view.shown], view.shown, view.query_patch, fit_width=shown.width)
    uris = [_png_uri(frame) for frame in view.overlays]
    labels = [str(label) for label in view.labels]
    # JSON inside <script>: "</script" would end the element, so every "<" is written as JSON's "\u003c".
    data = {"frames": json.dumps(uris), "labels": json.dumps(labels).replace("<", "\\u003c")}
    parts = [f"<h1>{html.escape(view.title)}</h1>", '<div class="row">',
             f'<figure><figcaption>Play the clip</figcaption><img id="player" src="{uris[view.shown]}" '
             f'width="{shown.width}" height="{shown.height}" alt="a sampled frame with its map"><br>'
             f'<button id="play" type="button">Play</button> '
             f'<input id="slider" type="range" min="0" max="{len(uris) - 1}" value="{view.shown}" '
             f'aria-label="Frame"> <span id="frame-label">{html.escape(labels[view.shown])}</span></figure>',
             f'<figure><figcaption>{html.escape(labels[view.shown])} (hover a patch for its value)</figcaption>'
             f'{_figure_html(picker, "map")}'
             f'{_figure_html(drawing.colorbar_figure(view.vmin, view.vmax, view.colormap), "colorbar")}'
             f'<p class="caption">{html.escape(view.caption)}</p></figure>',
             '<figure><figcaption>Prediction</figcaption>']
    parts.append(_prediction_html(view.prediction))
    parts.append("</figure></div><h2>Every sampled frame</h2><div class='row' id='strip'>")
    parts += [f'<figure><img src="{_png_uri(fit(frame, 160))}" alt="{html.escape(label)}">'
              f'<figcaption>{html.escape(label)}</figcaption></figure>' for frame, label in zip(
                  view.overlays, labels, strict=True)]
    parts.append("</div>")
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                   for k, v in view.settings.items())
    parts.append(f"<h2>Settings</h2><table id='settings'>{rows}</table>")
    parts.append(f"<script type='application/json' id='frames'>{data['frames']}</script>"
                 f"<script type='application/json' id='labels'>{data['labels']}</script>"
                 f"<script>{PLAYER_SCRIPT.replace('FRAME_MS', str(int(frame_ms)))}</script>")
    style = ("body{font-family:sans-serif;margin:1.5em;color:#222}.row{display:flex;flex-wrap:wrap;gap:1.5em}"
             "figure{margin:0}figcaption{font-weight:bold;margin-bottom:.4em}.caption{max-width:640px;color:#555}"
             "#strip figcaption{font-weight:normal}th{text-align:left;padding-right:1em;font-weight:normal;color:#555}")
    return ("<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
            f"<title>{html.escape(view.title)}</title><style>{style}</style>"
            f"<script>{_plotlyjs()}</script></head><body>{''.join(parts)}</body></html>")


def shown_settings(settings: dict) -> dict:
    """An explanation's ``settings`` (``explain``'s arguments, counted from 0) as its export shows them beside its
    caption, which counts layers and heads from 1 as the explorer does: layers and heads from 1, the key saying so
    (a token keeps its index: 0 is CLS)."""
    return {f"{k} (from 1)" if k in ("layer", "head") and isinstance(v, int) else k:
            v + 1 if k in ("layer", "head") and isinstance(v, int) else v for k, v in settings.items()}
