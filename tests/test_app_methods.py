"""The explorer's newer map kinds (LeGrad, LRP, AttnLRP, attention flow) and the one-image faithfulness curves."""

import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

from tests.test_app import (  # noqa: F401  (default_world and dirs: fixtures the tests use)
    default_world,
    dirs,
    overlay_caption,
    run_app,
    sidebar_widget,
    write_checkpoint,
)
from vit.app import drawing
from vit.app import explorer_page as explorer
from vit.checkpoint import load_checkpoint
from vit.explain.views import attention_maps, image_analysis, method_maps
from vit.explain.views.overlay import DIVERGING_COLORMAP, map_colours

pytestmark = pytest.mark.slow  # each AppTest run imports the app


@pytest.mark.parametrize("kind, caption", [("legrad", "LeGrad for"), ("lrp", "LRP transformer attribution for"),
                                           ("attnlrp", "against it"), ("flow", "Attention flow through layers 1–3"),
                                           ("attn-gradcam", "GradCAM on the last attention for"),
                                           ("lrp-partial", "Partial LRP for"), ("lrp-full", "Full LRP for")])
@pytest.mark.usefixtures("default_world")
def test_each_new_map_kind_draws_with_its_caption(kind, caption):
    at = run_app()
    sidebar_widget(at, "radio", "Map").set_value(explorer.MORE_METHODS)
    at.run()
    sidebar_widget(at, "selectbox", "Method").set_value(kind)
    at.run()
    assert not at.exception and not at.error, [e.message for e in at.exception]
    assert caption in overlay_caption(at)
    assert any(w.label == "Class" for w in at.sidebar.selectbox) == (kind != "flow")


@pytest.mark.usefixtures("default_world")
def test_a_signed_map_offers_no_colour_map_it_would_not_change():
    """AttnLRP's map is drawn on the diverging scale around 0 whatever the colour map: the sidebar does not offer
    one; the colour map picked before is kept for the maps that read it."""
    at = run_app()
    sidebar_widget(at, "selectbox", "Colour map").set_value("viridis")
    at.run()
    sidebar_widget(at, "radio", "Map").set_value(explorer.MORE_METHODS)
    at.run()
    sidebar_widget(at, "selectbox", "Method").set_value("attnlrp")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert "Colour map" not in [w.label for w in at.sidebar.selectbox]
    sidebar_widget(at, "selectbox", "Method").set_value("legrad")
    at.run()
    assert sidebar_widget(at, "selectbox", "Colour map").value == "viridis"


@pytest.mark.usefixtures("default_world")
def test_faithfulness_curves_are_drawn_next_to_the_map():
    at = run_app()
    sidebar_widget(at, "radio", "Map").set_value(explorer.MORE_METHODS)
    at.run()  # LeGrad, the first of the methods
    [toggle] = [t for t in at.toggle if t.label == "Deletion and insertion curves"]
    toggle.set_value(True)
    at.run()
    assert not at.exception
    figures = [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]
    names = [trace.get("name", "") for fig in figures for trace in fig["data"]]
    assert any(n.startswith("deletion (AUC") for n in names) and any(n.startswith("insertion (AUC") for n in names)


# -- the plain functions behind them --------------------------------------------------------------------------

@pytest.fixture
def checkpoint(tmp_path):
    return load_checkpoint(write_checkpoint(tmp_path / "m.pt"))


def test_model_method_maps_have_the_grid_shape(checkpoint):
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8))
    for kind in attention_maps.METHOD_MAP_KINDS:
        m = method_maps.model_method_map(checkpoint, image, kind, class_index=1, query=0)
        assert m.shape == (4, 4) and np.isfinite(m).all(), kind


def test_model_method_maps_explain_the_class_and_query_they_are_given(checkpoint):
    from vit.core.inference import TRAINING_SIZE, preprocess
    from vit.explain.methods.attention import token_map
    from vit.explain.methods.relevance import attnlrp, legrad, patch_sums, transformer_attribution

    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8))
    model = checkpoint.model
    x = preprocess([image], checkpoint.preprocessing, TRAINING_SIZE, model.config.patch_size)
    grid = model.patch_grid(x.shape[2], x.shape[3])
    expected = {"legrad": legrad(model, x, 2), "attnlrp": patch_sums(attnlrp(model, x, 2), grid),
                "lrp": token_map(transformer_attribution(model, x, 2), 5, grid, model.num_prefix_tokens)}
    for kind, want in expected.items():
        got = method_maps.model_method_map(checkpoint, image, kind, class_index=2, query=5)
        np.testing.assert_allclose(got, want[0].numpy(), rtol=1e-5, atol=1e-7, err_msg=kind)


def test_attention_map_of_a_method_kind_needs_the_precomputed_map(checkpoint):
    image = Image.new("RGB", (16, 16))
    analysis = image_analysis.analyse(checkpoint, image)
    settings = attention_maps.MapSettings(kind="legrad")
    with pytest.raises(ValueError, match="model_method_map"):
        attention_maps.attention_map(analysis, settings)
    given = np.ones((4, 4), dtype=np.float32)
    assert attention_maps.attention_map(analysis, settings, method_map=given) is given


def test_signed_maps_get_a_diverging_colour_scale_symmetric_around_zero():
    m = np.array([[-1.0, 0.5], [0.25, 0.0]])
    assert map_colours("attnlrp", m, "inferno") == (DIVERGING_COLORMAP, -1.0, 1.0)
    assert map_colours("legrad", m, "inferno") == ("inferno", None, None)


def test_faithfulness_figure_has_both_curves_from_one_to_the_baseline(checkpoint):
    image = Image.new("RGB", (16, 16), (200, 30, 30))
    torch.manual_seed(0)
    fig = drawing.faithfulness_figure(checkpoint, image, np.random.rand(4, 4), class_index=0)
    deletion, insertion = fig.data
    assert len(deletion.x) == 17 and deletion.x[0] == 0 and deletion.x[-1] == 1
    assert deletion.y[0] == pytest.approx(insertion.y[-1], abs=1e-6)  # both: the untouched image


def test_faithfulness_figure_keeps_room_for_its_x_axis_title(checkpoint):
    """Issue 33, item 6: with a bottom margin of 0 the x-axis title fell below the figure's edge."""
    torch.manual_seed(0)
    fig = drawing.faithfulness_figure(checkpoint, Image.new("RGB", (16, 16)), np.random.rand(4, 4), class_index=0)
    assert fig.layout.xaxis.title.text.startswith("patches removed")
    assert fig.layout.xaxis.automargin and fig.layout.margin.b >= 50


def test_the_curves_x_axis_ends_in_a_100_percent_tick_under_a_title_that_fits_a_column(checkpoint):
    # Issue 45, item 10: Plotly's own ticks stopped at 80 %, and the 60-character title was cut in the column.
    fig = drawing.faithfulness_figure(checkpoint, Image.new("RGB", (16, 16)), np.random.rand(4, 4), class_index=0)
    axis = fig.layout.xaxis
    assert axis.tickvals[-1] == 1 and axis.ticktext[-1] == "100%" and axis.range[1] >= 1
    assert [f"{v:.0%}" for v in axis.tickvals] == list(axis.ticktext)
    assert len(axis.title.text) <= 50


def test_colour_bar_ticks_on_a_narrow_range_are_all_different():
    # Issue 45, item 10: ".3g" labelled 0.0144, 0.0145, 0.0145.
    axis = drawing.colorbar_figure(0.0144, 0.0145).layout.xaxis
    assert list(axis.ticktext) == ["0.0144", "0.014425", "0.01445", "0.014475", "0.0145"]
    assert list(drawing.colorbar_figure(0.0, 1.0).layout.xaxis.ticktext) == ["0", "0.2", "0.4", "0.6", "0.8", "1"]
    assert list(drawing.colorbar_figure(12.5, 13812.0).layout.xaxis.ticktext) == ["3000", "6000", "9000", "12000"]


@pytest.mark.parametrize("colormap", [*drawing.COLORMAPS, DIVERGING_COLORMAP])
def test_the_pages_colour_bar_has_the_overlays_colours_and_the_figures_ticks(colormap):
    # Issue 51: the page draws its colour bar as HTML (a Plotly chart cost ~0.1 s of every upload in the browser).
    import html.parser

    import matplotlib

    class Bar(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.attrs, self.styles, self.labels = {}, [], []

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            self.attrs = self.attrs or attrs
            self.styles.append(attrs.get("style", ""))

        def handle_data(self, data):
            self.labels.append(data)

    for low, high in ((0.0144, 0.0145), (0.0, 1.0), (12.5, 13812.0), (-3.0, 2.0), (0.5, 0.5)):
        bar = Bar()
        bar.feed(drawing.colorbar_html(low, high, colormap))
        figure = drawing.colorbar_figure(low, high, colormap)
        assert bar.labels == list(figure.layout.xaxis.ticktext)  # the same ticks as the export's figure
        vmin, vmax = float(bar.attrs["data-vmin"]), float(bar.attrs["data-vmax"])
        assert [vmin, vmax] == list(figure.layout.xaxis.range) and bar.attrs["data-colormap"] == colormap
        places = [float(re.search(r"left:([0-9.]+)%", style)[1]) for style in bar.styles if "translateX" in style]
        assert places == pytest.approx([100 * (t - vmin) / (vmax - vmin) for t in figure.layout.xaxis.tickvals],
                                       abs=1e-3)
        gradient = next(style for style in bar.styles if "linear-gradient" in style)
        stops = [tuple(int(v) for v in m) for m in re.findall(r"rgb\((\d+),(\d+),(\d+)\)", gradient)]
        cmap = matplotlib.colormaps[colormap]  # what the overlay is coloured with
        assert stops[0] == tuple(cmap(0.0, bytes=True)[:3]) and stops[-1] == tuple(cmap(1.0, bytes=True)[:3])
        assert stops[len(stops) // 2] == tuple(cmap((len(stops) // 2) / (len(stops) - 1), bytes=True)[:3])


@pytest.mark.usefixtures("default_world")
def test_legrad_starts_from_the_layer_chosen_and_says_which():
    """The authors' ``layer_index``: LeGrad sums the maps of every layer from it on (default the last two)."""
    at = run_app()
    sidebar_widget(at, "radio", "Map").set_value(explorer.MORE_METHODS)
    at.run()  # LeGrad, the first of the methods
    start = sidebar_widget(at, "select_slider", "From layer")
    assert start.value == 2 and list(start.options) == ["1", "2", "3"]  # 3 layers: the last two by default
    assert "at each of the last two layers" in overlay_caption(at)
    start.set_value(1)
    at.run()
    assert not at.exception and "at each of layers 1–3" in overlay_caption(at)


def test_a_legrad_map_from_another_start_layer_is_legrads_from_it(checkpoint):
    from vit.core.inference import TRAINING_SIZE, preprocess
    from vit.explain.methods.relevance import legrad

    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (20, 30, 3), dtype=np.uint8))
    x = preprocess([image], checkpoint.preprocessing, TRAINING_SIZE, checkpoint.model.config.patch_size)
    got = method_maps.model_method_map(checkpoint, image, "legrad", class_index=2, start_layer=0)
    np.testing.assert_allclose(got, legrad(checkpoint.model, x, 2, start_layer=0)[0].numpy(), rtol=1e-5, atol=1e-7)
    assert not np.allclose(got, method_maps.model_method_map(checkpoint, image, "legrad", class_index=2))


def test_attnlrp_past_its_whole_paths_bound_runs_with_checkpointed_blocks_and_draws_the_same_map(checkpoint,
                                                                                                 monkeypatch):
    from vit.core.inference import InputSize
    from vit.costs import plan
    from vit.explain.methods import relevance

    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8))
    size = InputSize(96)  # 24 x 24 patches: every layer's attention outweighs one block's activations
    whole = method_maps.model_method_map(checkpoint, image, "attnlrp", class_index=2, size=size)
    cost = plan.attnlrp(checkpoint.model, whole.shape)
    assert cost.chunked < cost.memory
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str((cost.chunked + cost.memory) / 2 / 2**20))
    asked = []
    real = relevance.attnlrp
    monkeypatch.setattr(relevance, "attnlrp", lambda *a, **k: asked.append(k.get("checkpointed")) or real(*a, **k))
    drawn = method_maps.model_method_map(checkpoint, image, "attnlrp", class_index=2, size=size)
    np.testing.assert_allclose(drawn, whole, rtol=1e-6, atol=1e-12)
    assert asked == [True]
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str((cost.chunked - 1) / 2**20))
    with pytest.raises(ValueError, match="AttnLRP") as error:
        method_maps.model_method_map(checkpoint, image, "attnlrp", class_index=2, size=size)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("kind", ["gradcam", "eigencam"])
@pytest.mark.usefixtures("default_world")
def test_a_cam_on_the_page_starts_from_the_analysis_and_embeds_no_image_again(kind, monkeypatch):
    """Issue 83: the page's analysis (its heads grid, its prediction) keeps every block's input; a CAM chosen then
    starts from the explained block's there instead of running the model again from the pixels."""
    from vit.model import ViT

    at = run_app()
    sidebar_widget(at, "radio", "Map").set_value(explorer.MORE_METHODS)
    at.run()  # the image analysed, LeGrad (the first method) drawn
    embedded = []
    embed = ViT.embed
    monkeypatch.setattr(ViT, "embed", lambda self, images: embedded.append(images.shape) or embed(self, images))
    sidebar_widget(at, "selectbox", "Method").set_value(kind)
    at.run()
    assert not at.exception and not at.error, [e.message for e in at.exception]
    assert attention_maps.MAP_KINDS[kind].split(" (")[0] in overlay_caption(at)
    assert embedded == []


@pytest.mark.usefixtures("default_world")
def integrated_gradients_page(monkeypatch):
    """The explorer with Integrated Gradients chosen, and the (method, options) each map was asked with."""
    return method_page(monkeypatch, "integrated_gradients")


def method_page(monkeypatch, method: str):
    """The explorer with ``method`` chosen among the other maps, and the (method, options) each map was asked
    with."""
    given = []
    real = method_maps.model_method_map

    def recorded(checkpoint, image, kind, *args, options=None, **kwargs):
        given.append((kind, dict(options or {})))
        return real(checkpoint, image, kind, *args, options=options, **kwargs)

    monkeypatch.setattr(method_maps, "model_method_map", recorded)
    at = run_app()
    sidebar_widget(at, "radio", "Map").set_value(explorer.MORE_METHODS)
    at.run()
    sidebar_widget(at, "selectbox", "Method").set_value(method)
    at.run()
    return at, given


def test_an_attributions_settings_are_in_the_sidebar_the_map_the_caption_and_the_link(monkeypatch):
    """captum's parameters on the page (issue 82): the sidebar's inputs reach the map (the dispatcher is given
    them), its caption names them, the link keeps those that differ from the defaults and a fresh page opened from
    it draws the same; the map runs as long work (progress and Stop), whatever the input's size."""
    from tests.test_app_share import url

    at, given = integrated_gradients_page(monkeypatch)
    steps = next(w for w in at.sidebar.number_input if w.label == "Steps")
    assert steps.value == 50 and "captum's, 50 steps" in overlay_caption(at)
    assert given[-1] == ("integrated_gradients", {}) and "attr" not in url(at)  # defaults: nothing in the link
    steps.set_value(7)
    next(w for w in at.sidebar.number_input if w.label == "Baseline").set_value(0.25)
    at.run()
    assert not at.exception and not at.error, [e.message for e in at.exception]
    assert given[-1] == ("integrated_gradients", {"n_steps": 7, "baselines": 0.25})
    caption = overlay_caption(at)
    assert "captum's, 7 steps" in caption and "a baseline of 0.25" in caption, caption
    link = url(at)
    assert link["attr"] == "n_steps=7,baselines=0.25" and link["map"] == "integrated_gradients"
    given.clear()
    from streamlit.testing.v1 import AppTest

    from app_pages.explorer_sections import long_work
    from tests.test_app import APP, TIMEOUT

    long_work.results.clear()  # the map was kept for every visitor: the linked page must compute its own

    linked = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in link.items():
        linked.query_params[key] = value
    linked.run()
    assert not linked.exception, [e.message for e in linked.exception]
    assert given and given[-1] == ("integrated_gradients", {"n_steps": 7, "baselines": 0.25})
    assert next(w for w in linked.sidebar.number_input if w.label == "Steps").value == 7
    assert overlay_caption(linked) == caption


@pytest.mark.usefixtures("default_world")
def test_a_linked_occlusion_whose_strides_pass_its_window_is_one_line_not_captums_assertion():
    """Issue 95, item 6: captum asserts a stride is at most its window; a link asking for more showed Streamlit's
    error box (a traceback). The page says in one line what to choose instead."""
    from streamlit.testing.v1 import AppTest

    from tests.test_app import APP, TIMEOUT

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["map"] = "occlusion"
    at.query_params["attr"] = "sliding_window_shapes=2,strides=8"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    [error] = [e.value for e in at.error]
    assert "strides 8 px are larger than its 2x2 px window" in error and "choose strides of at most 2 px" in error
    assert "\n" not in error


@pytest.mark.usefixtures("default_world")
def test_a_black_baseline_is_chosen_in_the_sidebar_named_in_the_caption_and_kept_by_the_link(monkeypatch):
    """Issue 90, item 6: "Baseline is: a black image" reaches the map as ``baseline="black"`` (its value input is
    then not drawn), the caption says the black image ran, and a page opened from the link draws the same."""
    from streamlit.testing.v1 import AppTest

    from app_pages.explorer_sections import long_work
    from tests.test_app import APP, TIMEOUT
    from tests.test_app_share import url

    at, given = integrated_gradients_page(monkeypatch)
    assert "mean colour" in overlay_caption(at) and "Baseline" in [w.label for w in at.sidebar.number_input]
    sidebar_widget(at, "radio", "Baseline is").set_value("black")
    at.run()
    assert not at.exception and not at.error, [e.message for e in at.exception]
    assert given[-1] == ("integrated_gradients", {"baseline": "black"})
    assert "Baseline" not in [w.label for w in at.sidebar.number_input]
    caption = overlay_caption(at)
    assert "from a black image (baseline=black) to the image" in caption, caption
    link = url(at)
    assert link["attr"] == "baseline=black"
    long_work.results.clear()
    linked = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in link.items():
        linked.query_params[key] = value
    linked.run()
    assert not linked.exception, [e.message for e in linked.exception]
    assert sidebar_widget(linked, "radio", "Baseline is").value == "black"
    assert overlay_caption(linked) == caption


@pytest.mark.usefixtures("default_world")
def test_rise_opens_at_a_first_look_count_the_authors_one_click_away_and_each_link_reopens_its_count(monkeypatch):
    """Issue 90, item 8: RISE's 6,000 masks took ~14 minutes on a ViT-S, so the page opens it at 1,000 masks, says
    so in the caption, and one button gives the authors' 6,000 (the map asked with the defaults); the link of each
    reopens that count, a link without ``n_masks`` meaning the authors' (not the page's first look)."""
    from streamlit.testing.v1 import AppTest

    from app_pages.explorer_sections import long_work
    from tests.test_app import APP, TIMEOUT
    from tests.test_app_share import url

    at, given = method_page(monkeypatch, "rise")
    assert not at.exception and not at.error, [e.message for e in at.exception]
    masks = next(w for w in at.sidebar.number_input if w.label == "Masks")
    assert masks.value == 1000 and given[-1] == ("rise", {"n_masks": 1000})
    assert "the mean of 1,000 random masks" in overlay_caption(at)
    first_look = url(at)
    assert first_look["map"] == "rise" and first_look["attr"] == "n_masks=1000"
    next(b for b in at.sidebar.button if b.label == "Use the authors' 6,000 masks").click()
    at.run()
    assert not at.exception and not at.error, [e.message for e in at.exception]
    assert next(w for w in at.sidebar.number_input if w.label == "Masks").value == 6000
    assert given[-1] == ("rise", {}) and "the mean of 6,000 random masks" in overlay_caption(at)
    assert "Use the authors' 6,000 masks" not in [b.label for b in at.sidebar.button]
    authors = url(at)
    assert "attr" not in authors  # the defaults: nothing in the link
    for link, count in ((first_look, 1000), (authors, 6000)):
        long_work.results.clear()  # the map was kept for every visitor: the linked page must compute its own
        given.clear()
        linked = AppTest.from_file(APP, default_timeout=TIMEOUT)
        for key, value in link.items():
            linked.query_params[key] = value
        linked.run()
        assert not linked.exception, [e.message for e in linked.exception]
        assert next(w for w in linked.sidebar.number_input if w.label == "Masks").value == count
        assert given and given[-1] == ("rise", {} if count == 6000 else {"n_masks": count})
        assert f"the mean of {count:,} random masks" in overlay_caption(linked)


@pytest.mark.parametrize("kind, steps", [("integrated_gradients", 4), ("input_x_gradient", None)])
@pytest.mark.usefixtures("dirs")
def test_a_pixel_methods_map_is_drawn_on_the_input_pixels_as_vit_explain_gives_it(monkeypatch, kind, steps):
    """Issue 90, item 3: on the shipped checkpoint the page drew Integrated Gradients and Input x Gradient summed
    over each patch. It draws vit.explain's map (captum's attribution summed over the colour channels, held equal
    to captum's own call in test_captum_methods) on the model's input pixels, with the patch grid's lines, and says
    so; the exported view draws the same map."""
    import functools

    import vit
    from app_pages.explorer_sections import share_view
    from tests.test_app import DEFAULT_CHECKPOINT, charts, default_checkpoints_dir

    monkeypatch.delenv("VIT_CHECKPOINTS_DIR")
    shipped = default_checkpoints_dir() / DEFAULT_CHECKPOINT
    if not shipped.is_file():
        pytest.skip(f"{shipped} is not there yet")
    drawn, original = [], drawing.overlay_image  # (map, grid, mask) of each overlay the page and its export draw
    monkeypatch.setattr(drawing, "overlay_image", lambda image, map2d, *a, **k: drawn.append(
        (np.asarray(map2d), a[8] if len(a) > 8 else k.get("grid"), a[7] if len(a) > 7 else k.get("mask")))
        or original(image, map2d, *a, **k))
    curves, real_curves = [], drawing.faithfulness_figure  # the map the deletion and insertion curves read
    monkeypatch.setattr(drawing, "faithfulness_figure", lambda checkpoint, image, map2d, *a, **k: curves.append(
        np.asarray(map2d)) or real_curves(checkpoint, image, map2d, *a, **k))
    exports = []  # the page's "Export this view" data, built as its button would on a click
    monkeypatch.setattr(share_view, "partial", lambda f, *a, **k: exports.append(functools.partial(f, *a, **k))
                        or exports[-1])
    at = run_app()
    sidebar_widget(at, "radio", "Map").set_value(explorer.MORE_METHODS)
    at.run()
    sidebar_widget(at, "selectbox", "Method").set_value(kind)
    at.run()
    if steps is not None:
        next(w for w in at.sidebar.number_input if w.label == "Steps").set_value(steps)
        at.run()
    assert not at.exception and not at.error, [e.message for e in at.exception]
    sample = sidebar_widget(at, "selectbox", "…or a sample image").value
    checkpoint = vit.load(shipped, device="cpu")
    want = vit.explain(checkpoint, sample, kind, **({} if steps is None else {"n_steps": steps}))
    side = checkpoint.model.config.image_size
    assert want.map.shape == (side, side) and want.pixels  # the model's input pixels, not the patch grid
    page_map, page_grid, _ = drawn[-1]
    assert page_map.shape == (side, side) and tuple(page_grid) == tuple(want.grid)
    np.testing.assert_allclose(page_map, want.map, rtol=1e-5, atol=1e-7)
    assert "at each of the model's input pixels" in overlay_caption(at)
    [export] = [f for f in exports if getattr(f.func, "__name__", "") == "_export"][-1:]
    drawn.clear()
    page = export().decode()
    [(exported_map, exported_grid, _)] = drawn
    np.testing.assert_array_equal(exported_map, page_map)
    assert tuple(exported_grid) == tuple(want.grid)
    assert "input pixels" in page  # the exported caption, as the page's
    # What reads patches reads the map's patch sums: the deletion and insertion curves, the mass contour
    next(c for c in at.sidebar.checkbox if c.label == "Attention-mass contour (DINO)").check()
    next(t for t in at.toggle if t.label == "Deletion and insertion curves").set_value(True)
    at.run()
    assert not at.exception and not at.error, [e.message for e in at.exception]
    sums = want.patch_sums()
    np.testing.assert_allclose(curves[-1], sums, rtol=1e-5, atol=1e-6 * float(np.abs(sums).max()))
    assert drawn[-1][2].shape == tuple(want.grid)
    assert any(trace.get("name", "").startswith("deletion (AUC") for fig in charts(at) for trace in fig["data"])
