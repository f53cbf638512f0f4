"""A view exported as one self-contained HTML file (issue 50): nothing to fetch, every value hoverable, every text
shown as written; ``Explanation.to_html`` writes the same from a notebook."""

import base64
import copy
import dataclasses
import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import pytest
import torch
from PIL import Image
from plotly.offline import get_plotlyjs

import vit
from vit.app import drawing, share
from vit.app.export import View, valued_points, view_html
from vit.checkpoint import save_checkpoint
from vit.core.inference import Prediction, preprocess
from vit.model import ViT, ViTConfig

TINY = ViTConfig(image_size=16, patch_size=4, num_channels=3, num_classes=3, hidden_size=16, num_layers=2,
                 num_heads=2, mlp_size=32)
CLASSES = ["cat", "<b>dog</b>", "fox"]


def photo(width: int = 40, height: int = 30) -> Image.Image:
    return Image.fromarray(np.random.default_rng(3).integers(0, 256, (height, width, 3), dtype=np.uint8))


def figures(page: str) -> dict[str, dict]:
    """Each Plotly figure of the page by its div id: its data and layout as the page hands them to Plotly."""
    found = {}
    for div, body in re.findall(r'Plotly\.newPlot\(\s*"([^"]+)",\s*(\[.*?\]),\s*\{', page, flags=re.S):
        found[div] = json.loads(body)
    return found


def layouts(page: str) -> dict[str, dict]:
    """Each Plotly figure's layout by its div id, as the page hands it to Plotly (after the figure's data)."""
    decoder, found = json.JSONDecoder(), {}
    for match in re.finditer(r'Plotly\.newPlot\(\s*"([^"]+)",\s*', page):
        _, end = decoder.raw_decode(page, match.end())
        found[match.group(1)], _ = decoder.raw_decode(page, page.index("{", end))
    return found


def array(value) -> np.ndarray:
    """A figure's array as Plotly's JSON writes it: a list, or ``{"dtype", "bdata"}`` (base64 of its bytes)."""
    if isinstance(value, dict):
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
    return np.asarray(value)


def prediction_of(top_k: list[tuple[str, float]]) -> Prediction:
    probabilities = np.array([p for _, p in top_k])
    return Prediction(top_k, probabilities, np.log(probabilities), None, 0)


def test_every_patch_hovers_its_own_value_at_its_centre():
    map2d = np.arange(6, dtype=np.float32).reshape(2, 3) / 10  # 2 rows, 3 columns over a 300 x 200 image
    points = valued_points(map2d[None], (300, 200), 1, 0, [""])
    np.testing.assert_allclose(points.x, [50, 150, 250, 50, 150, 250])
    np.testing.assert_allclose(points.y, [50, 50, 50, 150, 150, 150])
    np.testing.assert_allclose(points.customdata, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5], atol=1e-7)
    assert points.text[4] == "row 2, column 2"


def test_the_heads_grid_hovers_each_heads_values_in_its_own_tile():
    heads = np.stack([np.zeros((2, 2)), np.ones((2, 2))]).astype(np.float32)  # two heads, tiled side by side
    points = valued_points(heads, (100, 100), 2, 2, ["head 1, ", "head 2, "])
    np.testing.assert_allclose(points.x, [25, 75, 25, 75, 127, 177, 127, 177])
    assert points.text[5] == "head 2, row 1, column 2" and points.customdata[5] == 1.0


def test_the_page_fetches_nothing_and_inlines_plotly():
    page = view_html(View("t", photo(), np.random.default_rng(0).random((3, 4)), "caption",
                          heads=np.random.default_rng(1).random((2, 3, 4))))
    assert get_plotlyjs() in page  # the library itself; what it may link to (its logo's page) is no fetch
    ours = page.replace(get_plotlyjs(), "")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", ours), "a resource the browser would fetch"
    assert "<link" not in ours and not re.search(r"<script[^>]*\ssrc=", ours) and "Plotly.newPlot" in ours


def test_a_class_name_or_caption_with_markup_shows_as_written():
    prediction = prediction_of([("<b>dog</b>", 0.9), ("<img src=x onerror=alert(1)>", 0.1)])
    page = view_html(View("<script>alert(1)</script>", photo(), np.ones((2, 2)), "**Layer 1**: <i>x</i> \\*",
                          prediction=prediction, settings={"image": "<svg onload=alert(1)>.png"}))
    assert "<script>alert(1)" not in page and "<svg onload" not in page and "<img src=x" not in page
    assert "<strong>Layer 1</strong>: &lt;i&gt;x&lt;/i&gt; *" in page  # our Markdown rendered, raw HTML as text
    assert "&lt;svg onload=alert(1)&gt;.png" in page


def test_a_vit_b16_view_at_224_px_is_a_few_megabytes_at_most():
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8))  # noise: the worst case for PNG
    page = view_html(View("ViT-B/16", image, rng.random((14, 14)), "caption", heads=rng.random((12, 14, 14)),
                          prediction=prediction_of([(f"class {i}", 0.2) for i in range(5)])))
    assert len(page.encode()) < 8 * 2**20


def test_every_figure_carries_plotlys_own_template_whatever_the_process_default(monkeypatch):
    # Inside the app Streamlit's template is the default; the export writes Plotly's own (the library's template,
    # as Plotly's JSON writes it) on every figure, whatever the process's default.
    import plotly.io as pio
    import streamlit.elements.lib.streamlit_plotly_theme  # noqa: F401  (registers Streamlit's template)

    monkeypatch.setattr(pio.templates, "default", "streamlit")
    page = view_html(View("t", photo(), np.ones((2, 2)), "caption", heads=np.ones((2, 2, 2)),
                          prediction=prediction_of([("cat", 0.7), ("fox", 0.3)])))
    plotly_own = json.loads(pio.to_json(go.Figure(layout=dict(template="plotly")), validate=False))["layout"]
    shown = layouts(page)
    assert sorted(shown) == ["colorbar", "heads", "map", "prediction"]
    assert all(layout["template"] == plotly_own["template"] for layout in shown.values())


def test_an_export_does_not_validate_and_copy_its_figures_and_template_again():
    # Issue 112: re-validating each figure with Plotly's template (``go.Figure(figure).update_layout(template=...)``)
    # deep-copied ~45,000 objects for this small view, the most of an export's CPU; written as the figures' dicts
    # it is ~6,000 (each figure's own copy of the default template when built). A warm export, so the template's
    # one validation is not counted.
    view = View("t", photo(), np.ones((3, 4)), "caption", heads=np.ones((2, 3, 4)))
    view_html(view)
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "call" and frame.f_code is copy.deepcopy.__code__

    previous = sys.getprofile()
    sys.setprofile(count)
    try:
        view_html(view)
    finally:
        sys.setprofile(previous)
    assert calls < 15_000, calls


def test_the_exported_image_is_the_shown_image_pixel_for_pixel():
    # The images are written at zlib's fastest level: PNG is lossless, so the page shows the very pixels.
    seen = photo(40, 30)
    page = view_html(View("t", seen, np.ones((3, 4)), "caption"))
    [source] = re.findall(r'<img id="image" src="data:image/png;base64,([^"]+)"', page)
    shown = Image.open(io.BytesIO(base64.b64decode(source)))
    np.testing.assert_array_equal(np.asarray(shown), np.asarray(drawing.display_images(seen)[0].convert("RGB")))


def test_the_map_outlines_the_query_patch_as_the_page_does():
    # A 40 px image is shown at 320 px: each patch of the 4 x 4 grid is 80 px. Token 7 (one prefix token) is patch
    # 6: row 1, column 2 from 0.
    page = view_html(View("t", photo(40, 40), np.random.default_rng(0).random((4, 4)), "caption", query=7))
    [outline] = [s for s in layouts(page)["map"]["shapes"] if s["type"] == "rect"]
    assert (outline["x0"], outline["x1"], outline["y0"], outline["y1"]) == (160, 240, 80, 160)
    cls = view_html(View("t", photo(40, 40), np.random.default_rng(0).random((4, 4)), "caption", query=0))
    assert not layouts(cls)["map"].get("shapes")


def test_the_heads_grid_numbers_each_head_over_its_thumbnail():
    # 40 px thumbnails are drawn at 80 px, two of them 2 px apart: head 2's spans x 82 to 162.
    page = view_html(View("t", photo(40, 40), np.ones((2, 2)), "caption", heads=np.ones((2, 2, 2)), heads_layer=4))
    axes = layouts(page)["heads"]
    assert axes["xaxis"]["ticktext"] == ["head 1", "head 2"] and axes["yaxis"]["ticktext"] == ["L5"]
    tiles = [(0, 80), (82, 162)]
    assert all(low < at < high for at, (low, high) in zip(axes["xaxis"]["tickvals"], tiles, strict=True))


def test_the_settings_read_as_the_sidebar_shows_them():
    values = {"model": "m", "sample": "cat.png", "size": 0, "aspect": False, "map": "attention", "query": 6,  # patch 5
              "layer": 2, "head": 2, "opacity": 0.6, "cmap": "viridis", "scale": "own", "grid": False, "class": 1,
              "ablate": ("1.2", "2.1")}
    described = share.describe(values, size_label="16", grid=(4, 4), num_prefix_tokens=1, prefix_names=["CLS"],
                               class_names=CLASSES)
    assert described == {
        "Input size": "the model's size (16 px)", "Keep the aspect ratio (long side at that size)": "no",
        "Map": "Attention of one layer", "Class": "<b>dog</b>", "Query token": "6 · patch row 2, col 2",
        "Layer": "2", "Head": "head 2", "Opacity": "0.6", "Colour map": "viridis",
        "Colour scale": "each map's min–max", "Show the patch grid": "no",
        "Heads switched off in every map": "1.2, 2.1"}
    fused = share.describe({"head": 0, "class": -1, "size": 224}, size_label="16", grid=(4, 4),
                           num_prefix_tokens=1, prefix_names=["CLS"], class_names=CLASSES, predicted=2)
    assert fused == {"Input size": "224 px", "Head": "all heads, fused", "Class": "predicted: fox"}


def test_a_cams_one_block_is_its_layer_and_a_rollouts_end_is_up_to_layer():
    # Issue 76, item 6: a CAM reads one block, which its slider calls "Layer" (it has no other layer slider); the
    # maps that run through layers 1 to the end call it "Up to layer".
    common = dict(size_label="16", grid=(4, 4), num_prefix_tokens=1, prefix_names=["CLS"], class_names=CLASSES)
    cam = share.describe({"map": "gradcam", "layer": 1, "end": 2}, **common)
    assert cam == {"Map": "Grad-CAM (class-specific)", "Layer": "2"}
    rollout = share.describe({"map": "rollout", "layer": 1, "end": 2}, **common)
    assert rollout == {"Map": "Attention rollout", "Layer": "1", "Up to layer": "2"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("export") / "tiny.pt"
    save_checkpoint(path, ViT(TINY), CLASSES)
    return vit.load(path, device="cpu")


def test_an_explanation_writes_its_view_with_the_models_own_heads(tiny, tmp_path):
    image = photo(16, 16)
    e = vit.explain(tiny, image, "attention", layer=1, query=5)
    written = e.to_html(tmp_path / "view.html")
    page = written.read_text(encoding="utf-8")
    with torch.no_grad():
        _, attentions = tiny.model(preprocess([image], tiny.preprocessing), output_attentions=True)
    reference = attentions[1][0, :, 5, 1:].reshape(2, 4, 4).numpy()  # the forward contract: every head's row
    shown = figures(page)
    np.testing.assert_allclose(array(shown["heads"][0]["customdata"]), reference.ravel(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(array(shown["map"][0]["customdata"]), reference.mean(0).ravel(), rtol=0, atol=1e-6)
    assert "&lt;b&gt;dog&lt;/b&gt;" in page or "cat" in page  # the prediction's names, as text
    # layer=1 (from 0) shown as the caption counts, from 1, and saying so (issue 116, item 5)
    assert "<th>query</th><td>5</td>" in page and "<th>layer (from 1)</th><td>2</td>" in page


def test_an_explanation_of_a_model_without_heads_still_exports(tiny, tmp_path):
    e = dataclasses.replace(vit.explain(tiny, photo(), "rollout"), heads=None, heads_layer=None)
    page = Path(e.to_html(tmp_path / "rollout.html")).read_text(encoding="utf-8")
    assert "Heads</h2>" not in page and "Plotly.newPlot" in page
