"""The explorer for SAM 3 (issue 94, item 3): a SAM 3 folder opened by path gets the concept page; a typed concept
(and an exemplar box) gives ``vit.segment``'s instances, each scored in a table, and the picked instance's decoder
attention at the picked layer and head drawn over the input SAM 3 saw (``vit.segment``'s own, held to transformers
in test_sam3_concepts); the view is the page's link, and a fresh session opened from it draws the same map; a
concept that cannot be asked is one line."""

import io

import numpy as np
import pytest
from helpers import displayed
from test_app import dirs, run_app, sidebar_widget, upload  # noqa: F401 (fixtures)
from test_app_share import notes, open_link, url

pytest.importorskip("transformers")
from test_sam3_concepts import BOX, TEXT, build_sam3, picture  # noqa: E402

import vit  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dirs")]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_sam3(tmp_path_factory.mktemp("sam3"))


@pytest.fixture
def drawn(monkeypatch):
    """The maps the page draws over the input, in order."""
    from vit.app import drawing

    maps, original = [], drawing.overlay_image
    monkeypatch.setattr(drawing, "overlay_image",
                        lambda image, map2d, *a, **k: maps.append(np.asarray(map2d)) or original(image, map2d, *a, **k))
    return maps


def png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def opened(folder):
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(folder))
    at.run()
    return upload(at, "photo.png", png(picture()))


def typed(at, **values):
    for label, value in values.items():
        [box] = [w for w in at.main.text_input if w.label == label]
        box.set_value(value)
    at.run()
    assert not at.exception, [e.stack_trace for e in at.exception]
    return at


def main_select(at, label: str):
    [found] = [w for w in at.main.selectbox if w.label == label]
    return found


def test_a_concept_draws_its_instances_and_the_picked_ones_decoder_attention(folder, drawn):
    at = opened(folder)
    assert any("Find a concept (SAM 3)" in h.value for h in at.main.subheader)
    assert not at.main.error, [e.value for e in at.main.error]
    [slider] = [w for w in at.main.slider if w.label == "Score threshold"]
    slider.set_value(0.0)
    typed(at, Concept=TEXT)
    sam3 = vit.open_sam3(folder)
    want = vit.segment(sam3, picture(), text=TEXT, threshold=0.0)
    [table] = [d for d in at.main.dataframe if "score" in d.value.columns]
    np.testing.assert_allclose(table.value["score"].to_numpy(), want.scores, rtol=0, atol=1e-6)
    last = f"decoder layer {len(want.attention)}"
    np.testing.assert_allclose(drawn[-1], want.attention[last].mean(0), rtol=0, atol=1e-6)
    others = {i: vit.segment(sam3, picture(), text=TEXT, threshold=0.0, instance=i).attention[last]
              for i in range(len(want.scores)) if i != want.instance}  # each other instance's maps, per head
    picked, head = max(((i, h) for i in others for h in range(len(want.attention[last]))),
                       key=lambda ih: np.abs(others[ih[0]][ih[1]] - want.attention[last][ih[1]]).max())
    main_select(at, "Instance").set_value(picked)
    at.run()
    main_select(at, "Head").set_value(head)
    at.run()
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    np.testing.assert_allclose(drawn[-1], others[picked][head], rtol=0, atol=1e-6)
    assert not np.allclose(others[picked][head], want.attention[last][head], rtol=0, atol=1e-3)  # another query's
    assert any(f"**Instance {picked + 1}**" in c.value and f"head {head + 1}" in c.value for c in at.main.caption), \
        [c.value for c in at.main.caption]
    link = url(at)
    assert link["concept"] == TEXT and link["instance"] == str(picked + 1) and link["chead"] == str(head + 1)
    assert "upload" in link and link["cthreshold"] == "0"
    linked = open_link(link)  # a fresh session: the upload is the server's, named in the link
    assert not linked.main.error and notes(linked) == [], [e.value for e in linked.main.error]
    np.testing.assert_allclose(drawn[-1], others[picked][head], rtol=0, atol=1e-6)

    typed(at, **{"Exemplar box (optional)": ",".join(f"{v:g}" for v in BOX)})  # an exemplar beside the text
    boxed = vit.segment(sam3, picture(), text=TEXT, box=BOX, threshold=0.0)
    [table] = [d for d in at.main.dataframe if "score" in d.value.columns]
    np.testing.assert_allclose(table.value["score"].to_numpy(), boxed.scores, rtol=0, atol=1e-6)
    assert url(at)["cbox"] == ",".join(f"{v:g}" for v in BOX)

    [method] = [w for w in at.main.radio if w.label == "Map"]  # which pixels made the instance's mask
    method.set_value("attnlrp")
    at.run()
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    shown = int(url(at)["instance"]) - 1
    pixels = vit.segment(sam3, picture(), text=TEXT, box=BOX, threshold=0.0, instance=shown, methods=["attnlrp"])
    np.testing.assert_allclose(drawn[-1], pixels.maps["attnlrp"], rtol=0, atol=1e-6)
    assert drawn[-1].shape == (64, 64) and any("AttnLRP (signed)" in c.value for c in at.main.caption)
    link = url(at)
    assert link["cmethod"] == "attnlrp" and "clayer" not in link and "chead" not in link
    open_link(link)
    np.testing.assert_allclose(drawn[-1], pixels.maps["attnlrp"], rtol=0, atol=1e-6)


def test_what_cannot_be_asked_is_one_line(folder):
    at = opened(folder)
    typed(at, **{"Concept": TEXT, "Exemplar box (optional)": "1,2,3"})
    assert [displayed(e.value) for e in at.main.error] == ["give a box as x0,y0,x1,y1 in the image's pixels"]
    typed(at, **{"Concept": "dog " * 40, "Exemplar box (optional)": ""})
    [error] = [displayed(e.value) for e in at.main.error]
    assert "more than the 32 SAM 3's text encoder reads" in error
    typed(at, **{"Concept": "<b>dog</b>"})
    [slider] = [w for w in at.main.slider if w.label == "Score threshold"]
    slider.set_value(0.95)
    at.run()
    assert any("No instance scored over the threshold" in i.value for i in at.main.info), \
        [i.value for i in at.main.info]


def test_the_image_is_shown_before_a_concept_and_the_presence_score_is_told_from_the_instances(folder):
    """The page shows the image while no concept is typed; beside the instances one sentence says what the presence
    score is and which score the threshold reads (a presence of 0.587 over a 0.50 threshold beside "0 kept" read as
    a contradiction)."""
    at = opened(folder)
    assert at.main.get("image"), "the image, before any concept is typed"
    typed(at, Concept=TEXT)
    want = vit.segment(vit.open_sam3(folder), picture(), text=TEXT, threshold=0.5)
    [said] = [c.value for c in at.main.caption if "presence score" in c.value]
    assert said == (f"The concept's presence score, {want.presence:.3f}, is how sure SAM 3 is that the concept is in "
                    "the image at all; each instance's score, which the threshold keeps or drops, is its object "
                    "query's own score times that presence score."), said


def test_the_export_names_the_model_and_holds_no_path_of_the_server(folder, monkeypatch, tmp_path_factory):
    """A model opened by its path on the server: the exported view names it by its name, never by that path."""
    import functools

    from app_pages.explorer_sections import concept_view

    exports = []
    monkeypatch.setattr(concept_view, "partial", lambda f, *a, **k: exports.append(functools.partial(f, *a, **k))
                        or exports[-1])
    at = opened(folder)
    [slider] = [w for w in at.main.slider if w.label == "Score threshold"]
    slider.set_value(0.0)
    typed(at, Concept=TEXT)
    [page] = [f().decode() for f in exports if getattr(f.func, "__name__", "") == "_export"][-1:]
    assert f"Model</th><td>{folder.name}</td>" in page
    assert str(folder) not in page and str(tmp_path_factory.getbasetemp()) not in page
