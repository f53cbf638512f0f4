"""The mechanism heatmaps say which row is which layer and which column the MLP (issue 33, item 6): Plotly thinned
the crowded category ticks and the axes had no titles."""

import numpy as np
import pytest

from vit.explain.views.figures import layer_head_figure, layer_token_figure


def test_a_layers_by_heads_heatmap_labels_every_row_and_column_and_titles_its_axes():
    fig = layer_head_figure(np.zeros((13, 12)), "Logit change", "Δ logit", extra=np.zeros(13))
    x, y = fig.layout.xaxis, fig.layout.yaxis
    assert list(y.tickvals) == [f"layer {i}" for i in range(1, 14)] and y.tickmode == "array"
    assert list(x.tickvals) == [f"head {h}" for h in range(1, 13)] + ["MLP"] and x.tickmode == "array"
    assert "layer" in y.title.text and "MLP" in x.title.text
    assert x.automargin and y.automargin  # room for the labels: the margins are 0 otherwise


def test_a_layers_by_tokens_heatmap_labels_every_layer_and_titles_its_axes():
    fig = layer_token_figure(np.zeros((13, 5)), ["CLS", "p1", "p2", "p3", "p4"], "Recovered", "share")
    assert list(fig.layout.yaxis.tickvals) == [f"layer {i}" for i in range(1, 14)]
    assert fig.layout.yaxis.title.text.startswith("layer") and fig.layout.xaxis.title.text == "token"


def test_the_heads_grid_keeps_its_row_labels_next_to_the_thumbnails():
    """Issue 33, item 10: a tall sheet in a wide column grew the x range, so the sheet sat mid-plot, far from its
    row labels at the plot's left edge; both axes now shrink their domain toward the top left."""
    from vit.app.drawing import heads_grid_figure

    fig = heads_grid_figure("data:image/png;base64,", (400, 1200), list(range(12)), 4)
    assert (fig.layout.xaxis.constrain, fig.layout.xaxis.constraintoward) == ("domain", "left")
    assert (fig.layout.yaxis.constrain, fig.layout.yaxis.constraintoward) == ("domain", "top")
    assert list(fig.layout.xaxis.range) == [0, 400]


TITLE_AND_LABELS = """() => { const title = document.querySelector('.g-ytitle text').getBoundingClientRect();
  const labels = [...document.querySelectorAll('.ytick text')].map(e => e.getBoundingClientRect().left);
  return [title.right, Math.min(...labels)]; }"""


@pytest.mark.browser
def test_the_direct_logit_attributions_y_title_stands_clear_of_its_layer_labels():
    # Issue 45, item 10: "layer 10" … "layer 12", wider than "layer 1", ran into the rotated title beside them.
    import streamlit  # noqa: F401  (the Plotly template the page's figures are built with)
    from helpers import chromium

    fig = layer_head_figure(np.ones((12, 12)), "Direct logit attribution", "logit", extra=np.ones(12))
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 760, "height": 600})
        page.set_content(fig.update_layout(width=700).to_html(include_plotlyjs=True, full_html=True))
        page.wait_for_selector(".main-svg .ytick text")
        title_right, labels_left = page.evaluate(TITLE_AND_LABELS)
    assert labels_left - title_right >= 4, (title_right, labels_left)


def test_a_labelled_sheet_writes_each_label_under_its_own_thumbnail():
    from PIL import Image

    from vit.app.drawing import heads_grid_image

    colours = [(200, 0, 0), (0, 200, 0), (0, 0, 200), (200, 200, 0)]
    cells = [Image.new("RGB", (72, 40), c) for c in colours]
    plain = np.asarray(heads_grid_image(cells, columns=3))
    sheet = np.asarray(heads_grid_image(cells, columns=3, labels=["embedding", "layer 1", "layer 2", "layer 3"]))
    assert plain.shape == (40 + 2 + 40, 3 * 72 + 2 * 2, 3)
    strip = (sheet.shape[0] - plain.shape[0]) // 2  # under each of the 2 rows
    assert strip > 0 and sheet.shape[1] == plain.shape[1]
    for i, colour in enumerate(colours):
        r, c = divmod(i, 3)
        x, y = c * (72 + 2), r * (40 + strip + 2)
        assert (sheet[y:y + 40, x:x + 72] == colour).all()  # the thumbnail as it was
        ink = (sheet[y + 40:y + 40 + strip] < 128).any(axis=(0, 2))  # dark ink on white, per column
        assert ink[x:x + 72].any()  # its label
        assert not ink[x - 2:x].any() and not ink[x + 72:x + 74].any()  # inside its own column: none in the gaps
    assert (sheet[2 * 40 + strip + 2:, 2 * 74:] == 255).all()  # no label under the empty place
