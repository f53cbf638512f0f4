"""The explorer on the library road (issue 91): a model no port reads, opened by path in the explorer, opens as its
library builds it; the sidebar says so, the maps offered are the road's list, and the map drawn (the values its
patch picker's points carry) is the library's own eager attention row for the chosen layer, head and query; a
classifier shows its prediction, the library's softmax. Each model is built tiny with random weights in its
library and saved natively, never downloaded; the page runs with its own HOME and Hugging Face folders."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
import torch
from PIL import Image
from test_app import charts, dirs, predicted_labels, run_app, sidebar_widget, upload  # noqa: F401 (a fixture)
from test_library_path import reference, save_family

from vit.app import catalog
from vit.app import library_view as view
from vit.explain.views.library import road_maps as library_maps

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dirs", "home")]  # the page imports torch, transformers

SIDE, PATCH = 32, 8  # a 4 x 4 grid of 8-px patches (test_library_path's SMALL)
ROAD = "opened as transformers builds it (the library road)"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def photo(side: int = SIDE) -> tuple[bytes, Image.Image]:
    """A random RGB photo at the model's own size (its processor's resize then changes nothing), as a PNG."""
    image = Image.fromarray(np.random.default_rng(3).integers(0, 256, (side, side, 3), dtype=np.uint8))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue(), image


def opened(folder, side: int = SIDE) -> object:
    """The explorer with ``folder`` typed into "Open a path" and a photo uploaded."""
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(folder))
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return upload(at, "photo.png", photo(side)[0])


def choose_attention(at, layer: int, head: int, query: int):
    """The attention map of ``layer``, ``head`` and ``query`` (from 0) chosen in the sidebar."""
    at.sidebar.selectbox(key="library_method").set_value("attention")
    sidebar_widget(at, "slider", "Layer").set_value(layer + 1)
    sidebar_widget(at, "selectbox", "Head").set_value(head)
    sidebar_widget(at, "selectbox", "Query token").set_value(query)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    return at


def shown_map(at, grid: tuple[int, int] = (SIDE // PATCH, SIDE // PATCH)) -> np.ndarray:
    """The drawn map, as the points of its patch picker carry it: (rows, cols)."""
    [spec] = [c for c in charts(at) if "customdata" in json.dumps(c)]
    values = spec["data"][0]["customdata"]
    if isinstance(values, dict):  # Plotly 6's base64 arrays
        values = np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"])
    return np.asarray(values, dtype=np.float64).reshape(grid)


def eager_attentions(folder, image: Image.Image):
    """transformers' own: the folder's processor's pixels, its eager attention with ``output_attentions`` (one
    ``(1, H, T, T)`` per layer), and its output."""
    pixels = transformers.AutoImageProcessor.from_pretrained(folder)(image, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = reference(folder, "eager")(pixel_values=pixels, output_attentions=True)
    return out.attentions, out


def test_a_model_no_port_reads_opens_in_the_explorer_with_its_road_in_the_sidebar(tmp_path):
    at = opened(save_family(tmp_path / "ijepa", "ijepa"))
    assert not at.error, [e.value for e in at.error]
    assert sidebar_widget(at, "selectbox", "Checkpoint").value == str(tmp_path / "ijepa")
    assert any(ROAD in c.value for c in at.sidebar.caption)
    # the maps offered are the road's own list, read from it (its wings' maps join it there)
    shown = sidebar_widget(at, "selectbox", "Map")
    assert [o for o in shown.options] == [view.method_label(n) for n in library_maps.method_names(False)]


@pytest.mark.parametrize(("model_type", "prefix"), [("ijepa", 0), ("vit_msn", 1)])
def test_the_drawn_attention_is_transformers_eager_row_for_the_layer_head_and_query(tmp_path, model_type, prefix):
    folder = save_family(tmp_path / model_type, model_type)
    layer, head, query = 1, 2, prefix + 6  # the patch at row 2, col 3
    at = choose_attention(opened(folder), layer, head, query)
    attentions, _ = eager_attentions(folder, photo()[1])
    row = attentions[layer][0, head, query, prefix:].reshape(SIDE // PATCH, SIDE // PATCH).numpy()
    np.testing.assert_allclose(shown_map(at), row, atol=1e-6, rtol=1e-5)
    assert not np.allclose(row, row.mean())  # a uniform row would pass with any place
    assert any(f"Layer {layer + 1}: each head's attention of token {query}" in c.value for c in at.main.caption)


def test_a_classifier_shows_the_librarys_prediction(tmp_path):
    folder = save_family(tmp_path / "vit_msn", "vit_msn")
    at = opened(folder)
    _, out = eager_attentions(folder, photo()[1])
    order = out.logits[0].softmax(-1).argsort(descending=True).tolist()
    assert predicted_labels(at) == [["cat", "dog", "fox"][i] for i in order]
    assert sidebar_widget(at, "selectbox", "Map").options == [view.method_label(n)
                                                              for n in library_maps.method_names(True)]


def test_a_refusal_is_one_line_and_the_page_recovers(tmp_path, monkeypatch):
    from vit.costs.bounds import TooManyTokens

    def refuse(*args, **kwargs):
        raise TooManyTokens("this map keeps 9 GB of attention, over the limit; ask fewer layers")

    at = opened(save_family(tmp_path / "ijepa", "ijepa"))
    monkeypatch.setattr(library_maps, "library_map", refuse)
    at.sidebar.selectbox(key="library_method").set_value("rollout").run()
    assert [e.value.replace("\\", "") for e in at.error] == [
        "this map keeps 9 GB of attention, over the limit; ask fewer layers"]
    assert not at.exception
    at.sidebar.selectbox(key="library_method").set_value("attention").run()  # drawn from its cache
    assert not at.error and not at.exception and len(shown_map(at)) == SIDE // PATCH


def test_the_catalog_describes_it_from_the_librarys_model_and_the_other_pages_keep_the_ports_refusal(tmp_path):
    folder = save_family(tmp_path / "vit_msn", "vit_msn")
    candidate = catalog.Candidate(folder, "file", "vit_msn")
    entry = catalog.describe(candidate, library_road=True)
    assert entry.ok, entry.error
    assert (entry.num_layers, entry.num_heads, entry.patch_size, entry.image_size) == (3, 4, PATCH, SIDE)
    assert entry.class_names == ("cat", "dog", "fox") and entry.metadata["road"] == "library"
    assert "**Road** " + ROAD in entry.description
    assert "has no port" in catalog.describe(candidate).error  # the Analyse and Train pages read ports only


def test_the_explorer_lists_such_a_model_from_the_hf_cache(tmp_path):
    snapshot = tmp_path / "hf-cache" / "models--someone--tiny-ijepa" / "snapshots" / "abc"
    save_family(snapshot, "ijepa")
    found = catalog.hf_cache_listing([tmp_path / "hf-cache"], library_road=True).candidates
    assert [c.path for c in found] == [snapshot]
    assert catalog.hf_cache_listing([tmp_path / "hf-cache"]).candidates == ()


def test_a_timm_architecture_the_ports_refuse_draws_timms_own_attention(tmp_path):
    timm = pytest.importorskip("timm")
    from test_library_timm import FAMILIES, build, eager_attention
    from timm.models import _hub

    name, side, grid = "flexivit_small", 48, (6, 6)  # 8-px patches, one CLS token
    folder = tmp_path / name
    _hub.save_for_hf(build(name), folder, model_args=FAMILIES[name][0])
    layer, head, query = 0, 1, 1 + 9  # the patch at row 2, col 4
    at = choose_attention(opened(folder, side), layer, head, query)
    assert any("opened as timm builds it (the library road)" in c.value for c in at.sidebar.caption)
    # timm's own: its transform of the folder's pretrained_cfg, its explicit attention path's probabilities
    config = timm.data.resolve_data_config(pretrained_cfg=json.loads((folder / "config.json").read_text())[
        "pretrained_cfg"])
    pixels = timm.data.create_transform(**config)(photo(side)[1])[None]
    _, attentions = eager_attention(build(name), pixels)
    row = attentions[layer][0, head, query, 1:].reshape(grid).numpy()
    np.testing.assert_allclose(shown_map(at, grid), row, atol=1e-6, rtol=1e-5)
    assert not np.allclose(row, row.mean())


def test_an_open_clip_tower_with_a_timm_trunk_opens_as_open_clip_builds_it(tmp_path):
    from test_library_timm import TRUNKS, open_clip_folder

    trunk = "vit_tiny_patch16_224"
    side = TRUNKS[trunk][0]["image_size"]
    folder = tmp_path / "siglip"
    folder.mkdir()
    at = opened(open_clip_folder(folder, trunk), side)
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("opened as open_clip builds it (the library road)" in c.value for c in at.sidebar.caption)
    assert not [c for c in charts(at) if any(t.get("type") == "bar" for t in c["data"])]  # no classifier
    grid = (side // 16, side // 16)
    assert shown_map(at, grid).shape == grid


def test_every_map_the_road_lists_draws_on_the_page_or_says_why_in_one_line(tmp_path):
    """The page reads the road's list (its wings' maps join there): each map of it, chosen in the sidebar, is drawn
    with the controls it reads, or refused in one line; none raises."""
    at = opened(save_family(tmp_path / "vit_msn", "vit_msn"))
    for name in library_maps.method_names(True):
        at.sidebar.selectbox(key="library_method").set_value(name).run()
        assert not at.exception, (name, [e.message for e in at.exception])
        if at.error:  # a refusal: one line
            assert len(at.error) == 1 and "\n" not in at.error[0].value, name
        else:
            assert shown_map(at).shape == (4, 4), name


def test_rise_on_the_page_is_a_first_look_of_a_thousand_masks(tmp_path):
    """As the port's page opens RISE: ``rise.FIRST_LOOK_MASKS`` masks, not vit.explain's default of the authors'
    6,000; the drawn map is vit.explain's with that count."""
    import vit
    from vit.explain.methods.rise import FIRST_LOOK_MASKS

    folder = save_family(tmp_path / "vit_msn", "vit_msn")
    at = opened(folder)
    at.sidebar.selectbox(key="library_method").set_value("rise").run()
    assert not at.exception and not at.error
    expected = vit.explain(vit.load(folder, device="cpu"), photo()[1], "rise", n_masks=FIRST_LOOK_MASKS).map
    np.testing.assert_allclose(shown_map(at), expected, atol=1e-6, rtol=1e-5)
    assert any("1,000 masks" in c.value for c in at.sidebar.caption)


def test_the_view_downloads_as_an_overlay_and_an_offline_html_as_vit_explains_it(tmp_path):
    """Every view a file too: the overlay (PNG) and the view as one offline HTML, the notebook API's own export
    (``Explanation.html``, what ``to_html`` writes)."""
    import vit

    folder = save_family(tmp_path / "vit_msn", "vit_msn")
    at = opened(folder)
    labels = [b.label for b in at.get("download_button")]
    assert "Overlay (PNG)" in labels and "This view, offline (HTML)" in labels
    explanation = vit.explain(vit.load(folder, device="cpu"), photo()[1], "attention")
    written = explanation.to_html(tmp_path / "view.html")
    assert written.read_text(encoding="utf-8") == explanation.html()
    assert "<script src=" not in explanation.html()  # self-contained: nothing fetched when it opens


def test_ijepas_page_opens_its_rollout_on_what_its_classifier_reads_and_its_attention_on_the_centre_patch(tmp_path):
    """I-JEPA has no CLS token (issue 116, item 1): the query picker's first entry is vit.explain's default, which
    the captions name: the centre patch for one token's attention, the mean of the patch tokens for rollout."""
    at = opened(save_family(tmp_path / "ijepa", "ijepa"))
    at.sidebar.selectbox(key="library_method").set_value("attention").run()
    query = sidebar_widget(at, "selectbox", "Query token")
    assert query.value is None and query.options[0] == view.DEFAULT_QUERY
    assert any("each head's attention of token 10 (patch row 3, col 3)" in c.value for c in at.main.caption)
    at.sidebar.selectbox(key="library_method").set_value("rollout").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("what the mean of the patch tokens \\(what the classifier reads\\) draws on" in c.value
               for c in at.main.caption), [c.value for c in at.main.caption]  # Markdown-escaped
