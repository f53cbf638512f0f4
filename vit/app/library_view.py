"""What the explorer draws for a model opened by the library road (issue 91: the library's own model, its attention
recorded, ``Checkpoint.road == "library"``): the map over the pixels the model saw as a patch picker whose points
carry the map's values, the heads' sheet of an attention map, and the sidebar's labels. The maps themselves are
``vit.explain``'s (``vit.explain.views.library.road_maps``); nothing here computes one."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from PIL import Image

from vit import registry
from vit.app import drawing
from vit.core.text import escape_markdown
from vit.explain.views.map_captions import token_label
from vit.explain.views.overlay import display_image, is_signed, jpeg_data_uri, map_colours

HEADS_COLUMNS = 8  # heads per row of the sheet


def method_label(name: str) -> str:
    """The map picker's text for a library-road method: the registry's title where it knows the name ('Attention
    rollout (Abnar & Zuidema 2020)'), else the name."""
    method = registry.find_method(name)
    return method.title if method is not None else name


def map_picker_figure(explanation, opacity: float = 0.6, colormap: str = "inferno", fit_width: int = 320
                      ) -> go.Figure:
    """``explanation``'s overlay over the pixels the model saw (``Explanation.overlay``, at display size) as a
    patch picker (``drawing.patch_picker_figure``): a click on a patch picks its token. Point ``i`` is patch ``i``
    (row-major) and carries the map's value there (``customdata``; a pixel map's patch sums), named on hover; the
    query's patch is outlined where the map reads a query."""
    shown = display_image(explanation.overlay(alpha=opacity, colormap=colormap))
    grid, prefix = explanation.grid, explanation.num_prefix_tokens
    query = explanation.settings.get("query", -1)
    values = np.asarray(explanation.patch_sums(), dtype=np.float64).reshape(-1)  # (gh * gw,)
    figure = drawing.patch_picker_figure(shown.size, jpeg_data_uri(shown), grid, query, prefix, show_grid=False,
                                         fit_width=fit_width)
    text = [f"{token_label(p + prefix, grid, prefix)}: {v:.4g}" for p, v in enumerate(values.tolist())]
    figure.data[0].update(text=text, customdata=values)
    return figure


def heads_sheet(explanation, opacity: float = 0.6, colormap: str = "inferno") -> Image.Image | None:
    """Every head's map of an attention map (``Explanation.heads`` ``(H, gh, gw)``) over the seen pixels at
    thumbnail size, tiled ``HEADS_COLUMNS`` to a row and labelled 'head 1', ...; each head on its own colour
    range. None for a map without heads."""
    heads = explanation.heads
    if heads is None:
        return None
    small = display_image(explanation.seen, min_side=72, max_side=112)
    cmap, _, _ = map_colours(explanation.method, heads[0], colormap)
    cells = drawing.small_multiples(small, np.asarray(heads), opacity, cmap, "bilinear")
    columns = min(len(cells), HEADS_COLUMNS)
    return drawing.heads_grid_image(cells, columns, labels=[f"head {h + 1}" for h in range(len(cells))])


def heads_caption(explanation) -> str:
    """The sheet's caption: 'Layer 3: each head's attention of token 0 (CLS).'"""
    label = token_label(explanation.query, explanation.grid, explanation.num_prefix_tokens)
    return f"Layer {explanation.heads_layer + 1}: each head's attention of token {explanation.query} ({label})."


# The query picker's first entry for a model without CLS: vit.explain's default (library_maps.default_query)
DEFAULT_QUERY = "the centre patch; rollout and class maps: the mean of the patch tokens"


def query_options(grid: tuple[int, int], num_prefix_tokens: int) -> list[int]:
    """Every token a map may be asked of: the prefix tokens, then the patches row-major."""
    return list(range(num_prefix_tokens + math.prod(grid)))


def colour_key(explanation, colormap: str = "inferno") -> tuple[str, float, float, str]:
    """The colour bar and the sentence under the map, as the main page draws them (``drawing.colorbar_html``,
    ``drawing.describe_range``): ``(colour map, low, high, sentence)``; a signed map (AttnLRP) on its diverging
    scale around 0 says which colour is for the explained class and which against it."""
    cmap, vmin, vmax = map_colours(explanation.method, explanation.map, colormap)
    low, high = drawing.map_range(explanation.map, vmin, vmax)
    text = drawing.describe_range(explanation.map, vmin, vmax)
    if is_signed(explanation.method):
        what = f"“{explanation.target}”" if explanation.target is not None else "the explained output"
        text += f" Red is evidence for {what}, blue against it, white 0."
    return cmap, low, high, text


def view_html(explanation, opacity: float, model_name: str, image_name: str, colormap: str = "inferno",
              prompts=None) -> str:
    """The view as one offline ``.html``, through the main page's export (``vit.app.export.view_html``): titled with
    the image and the model, its caption the page's (with the colour key), the query's patch outlined where the map
    reads a query, and the model and the image first among the settings; ``prompts`` (a ``PromptView``: SAM 3
    tracker's prompt, its masks and its decoder's attention) below, as the main page exports a SAM's."""
    from vit.app.export import View, shown_settings
    from vit.app.export import view_html as page_html

    cmap, vmin, vmax = map_colours(explanation.method, explanation.map, colormap)
    method = registry.find_method(explanation.method)
    query = explanation.settings.get("query")
    heads = explanation.heads
    return page_html(View(
        title=f"{image_name} — {model_name}: {method.title if method is not None else explanation.method}",
        seen=explanation.seen, map2d=np.asarray(explanation.map), grid=explanation.grid if explanation.pixels else None,
        caption=escape_markdown(f"{explanation.description} {colour_key(explanation, colormap)[3]}"), colormap=cmap,
        vmin=vmin, vmax=vmax, opacity=opacity, query=-1 if query is None else query,  # -1: no patch outlined
        num_prefix_tokens=explanation.num_prefix_tokens, heads=heads,
        heads_caption=heads_caption(explanation) if heads is not None else "", heads_layer=explanation.heads_layer,
        prediction=explanation.prediction,
        settings={"Model": model_name, "Image": image_name, **shown_settings(explanation.settings)}, prompts=prompts))
