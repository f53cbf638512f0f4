"""Every page's view in its link (issue 116, item 6): the library road's page writes its view (model, image, map,
layer, head, query, opacity) into the URL as the main page does, offers it to copy, and a fresh session opened on
that URL shows the same view, the same map value for value; a page that stops before its view (no image yet) holds
its own model in the URL, never the previous page's view; a model without "Ask the VLM" carries no question. The
models are built tiny with random weights by transformers itself (test_library_path's ``save_family``)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import displayed
from test_app import default_world, dirs, run_app, sidebar_widget, upload  # noqa: F401 (fixtures)
from test_app_share import notes, open_link, url
from test_library_explorer import choose_attention, opened, photo, shown_map
from test_library_path import save_family

from app_pages.explorer_sections import ask_vlm

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dirs", "home")]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_the_library_pages_link_reopens_the_same_view_in_a_fresh_session(tmp_path):
    folder = save_family(tmp_path / "vit_msn", "vit_msn")  # a CLS token: query 6 is patch row 2, col 2
    at = choose_attention(opened(folder), layer=0, head=1, query=6)
    at.sidebar.slider(key="opacity").set_value(0.35).run()
    drawn = shown_map(at)
    link = url(at)
    assert link["model"] == str(folder) and len(link["upload"]) == 64  # the upload, kept by the server for links
    assert {k: link[k] for k in ("map", "layer", "head", "query", "opacity")} == {
        "map": "attention", "layer": "1", "head": "2", "query": "6", "opacity": "0.35"}  # layer and head from 1
    assert any(f"upload={link['upload']}" in c.value for c in at.main.code)  # "Copy link to this view" offers it
    again = open_link(link)
    assert not again.error, [e.value for e in again.error]
    assert again.session_state["library_method"] == "attention"
    assert sidebar_widget(again, "slider", "Layer").value == 1
    assert sidebar_widget(again, "selectbox", "Head").value == 1
    assert sidebar_widget(again, "selectbox", "Query token").value == 6
    assert again.session_state["opacity"] == 0.35
    np.testing.assert_array_equal(shown_map(again), drawn)  # the same map, value for value
    assert url(again) == link  # and the reopened page's own link is the link it was opened with


def test_a_links_head_past_the_libraries_model_is_one_line_and_the_rest_applies(tmp_path):
    folder = save_family(tmp_path / "vit_msn", "vit_msn")
    at = choose_attention(opened(folder), layer=0, head=0, query=6)
    link = {**url(at), "head": "99"}
    again = open_link(link)
    assert notes(again) == ["The link's head=99 was not used: this model has 4 heads per layer."]
    assert sidebar_widget(again, "selectbox", "Query token").value == 6


@pytest.mark.usefixtures("default_world")
def test_a_library_model_waiting_for_its_image_holds_itself_in_the_url_not_the_previous_view(tmp_path):
    at = run_app()
    assert url(at)["model"] != str(tmp_path / "ijepa") and "map" in url(at)  # the main page's view
    folder = save_family(tmp_path / "ijepa", "ijepa")
    sidebar_widget(at, "text_input", "Open a path").set_value(str(folder))
    at.run()
    assert any("Upload an image" in i.value for i in at.info)  # the page waits for an image
    assert url(at) == {"model": str(folder)}  # a reload opens this model, not the shipped one with its settings
    upload(at, "photo.png", photo()[0])
    assert url(at)["model"] == str(folder) and "upload" in url(at)


@pytest.mark.usefixtures("default_world")
def test_a_model_without_ask_the_vlm_carries_no_question_in_its_link():
    at = run_app(**{ask_vlm.QUESTION_KEY: "What is in the picture?"})  # an earlier VLM's question in the session
    assert "question" not in url(at) and "model" in url(at)


def test_ask_in_words_link_keeps_the_picked_label_minus_and_method(tmp_path):
    """The map "Ask in words" draws (its label, the label subtracted, its method) is in the link, by the labels'
    text, and a fresh session opened on it draws the same map."""
    from test_app_words import ask, open_clip_app
    from test_prompts import save_open_clip

    _, folder = save_open_clip(tmp_path / "open_clip", layers=2)
    at = open_clip_app(folder, photo()[0])
    ask(at, "a dog, a cat, a ball")
    picks = {w.label: w for w in at.main.selectbox}
    picks["Map for"].set_value(1)
    picks["Minus (optional)"].set_value(2)
    picks["Method"].set_value("attnlrp")
    at.run()
    link = url(at)
    assert {k: link[k] for k in ("wlabel", "wminus", "wmethod")} == {"wlabel": "a cat", "wminus": "a ball",
                                                                     "wmethod": "attnlrp"}
    assert offered(at) == link  # "Copy link to this view", drawn above the section, offers this view too
    drawn = [c.value for c in at.main.caption if "minus" in c.value]
    again = open_link(link)
    assert offered(again) == link  # a reload's page offers the view it reopened, before and after its labels
    shown = {w.label: w.value for w in again.main.selectbox}
    assert (shown["Map for"], shown["Minus (optional)"], shown["Method"]) == (1, 2, "attnlrp")
    assert [c.value for c in again.main.caption if "minus" in c.value] == drawn and drawn
    assert {k: url(again)[k] for k in ("wlabel", "wminus", "wmethod")} == {k: link[k] for k in
                                                                           ("wlabel", "wminus", "wmethod")}


def offered(at) -> dict[str, str]:
    """The link "Copy link to this view" offers, as URL parameters (the page's popover, the first code block that
    holds a link)."""
    from urllib.parse import parse_qsl, urlsplit

    [link, *_] = [c.value for c in at.main.code if "?" in c.value]
    return dict(parse_qsl(urlsplit(link).query))


# -- item 7: the library page's reading aids are the main page's ------------------------------------------------------

def test_the_library_page_shows_a_colour_bar_its_range_and_which_colour_is_for(tmp_path):
    from vit.app import drawing

    folder = save_family(tmp_path / "vit_msn", "vit_msn")  # a classifier: cat, dog, fox
    at = choose_attention(opened(folder), layer=0, head=1, query=6)
    values = shown_map(at)  # the attention row the page draws (test_library_explorer: transformers' own)
    low, high = float(values.min()), float(values.max())
    assert any(h.proto.body == drawing.colorbar_html(low, high, "inferno") for h in at.main.get("html"))
    assert any(f"Colours span {low:.3g} (dark) to {high:.3g} (bright) on this map."
               in displayed(c.value) for c in at.main.caption)
    at.sidebar.selectbox(key="library_method").set_value("attnlrp").run()
    assert not at.error, [e.value for e in at.error]
    signed = shown_map(at)
    bound = float(np.abs(signed).max())
    assert any(h.proto.body == drawing.colorbar_html(-bound, bound, "RdBu_r") for h in at.main.get("html"))
    [caption] = [displayed(c.value) for c in at.main.caption if "Colours span" in displayed(c.value)]
    assert "Red is evidence for" in caption and "blue against it" in caption


def test_the_library_pages_export_names_the_model_and_the_image_and_outlines_the_query(tmp_path, monkeypatch):
    import vit
    from vit.app import drawing, library_view

    outlines = []
    drawn = drawing.overlay_image  # the export draws through it (vit.app.export reads drawing.overlay_image)
    monkeypatch.setattr(drawing, "overlay_image", lambda *a, **k: outlines.append(a[6]) or drawn(*a, **k))
    folder = save_family(tmp_path / "vit_msn", "vit_msn")  # one CLS token: query 6 is patch 5
    explanation = vit.explain(vit.load(folder, device="cpu"), photo()[1], "attention", layer=0, head=1, query=6)
    html = library_view.view_html(explanation, 0.6, "my-msn", "photo.png")
    assert "<h1>photo.png — my-msn: " in html  # the title names the image and the model
    assert "<tr><th>Model</th><td>my-msn</td></tr><tr><th>Image</th><td>photo.png</td></tr>" in html
    assert "Colours span" in html  # the page's caption, its colour key included
    assert outlines[0] == 5  # the query's patch outlined, as the page draws it
    library_view.view_html(vit.explain(vit.load(folder, device="cpu"), photo()[1], "rollout"), 0.6, "m", "p.png")
    assert outlines[-1] is None  # a map that reads no query outlines none


def test_an_attributions_caption_on_the_library_road_names_its_baseline_and_settings(tmp_path):
    """The library road's caption of an attribution is the main page's (``captum_maps.caption``): the baseline it
    ran from and its steps named, as given to vit.explain."""
    import vit

    folder = save_family(tmp_path / "vit_msn", "vit_msn")
    checkpoint = vit.load(folder, device="cpu")
    default = vit.explain(checkpoint, photo()[1], "integrated_gradients", n_steps=4).description
    assert "from a baseline of zeros in the model's normalised input (every pixel at the preprocessing's mean " \
           "colour) to the image" in default and "4 steps" in default
    black = vit.explain(checkpoint, photo()[1], "integrated_gradients", n_steps=4, baseline="black").description
    assert "from a black image (baseline=black) to the image" in black
    at = opened(folder)
    at.sidebar.selectbox(key="library_method").set_value("integrated_gradients").run()
    assert not at.error, [e.value for e in at.error]
    assert any("baseline of zeros" in displayed(c.value) and "50 steps" in displayed(c.value) for c in at.main.caption)


def test_sam3s_page_waiting_for_a_concept_holds_its_model_and_image_in_the_url(tmp_path_factory):
    """Before a concept is typed the SAM 3 page draws no instance, yet its URL is its own view (the model and the
    image), not the previous page's: a reload reopens SAM 3 on that image."""
    from test_app_concepts import opened as opened_sam3
    from test_sam3_concepts import build_sam3

    folder = build_sam3(tmp_path_factory.mktemp("sam3"))
    at = opened_sam3(folder)
    assert any("Type a concept" in c.value for c in at.main.caption)  # nothing asked yet
    link = url(at)
    assert link["model"] == str(folder) and len(link["upload"]) == 64 and "map" not in link
    again = open_link(link)
    assert any("Type a concept" in c.value for c in again.main.caption)
    assert url(again) == link
