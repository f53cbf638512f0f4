"""PE video's clip view in the explorer (issue 116, item 12): opened by path, the library road's video model gets the
clip view a port's video model has (the clip upload, the shown frame as a patch picker, the time slider, the strip, the
link); each map on it is ``vit.explain``'s for the same frames, and the trunk's attention of a patch and the temporal
layer's row are transformers' (timm's explicit path and the eager attention, test_library_pe_video's ``eager``). The
model is test_library_pe_video's tiny random ``PeVideoEncoder`` (3 frames of 4 x 6 patches), the clip a zip of its 3
frames (lossless PNGs, as its video processor is given them)."""

import io
import zipfile

import numpy as np
import pytest
from helpers import displayed
from streamlit.testing.v1 import AppTest
from test_app import APP, TIMEOUT, dirs, run_app, sidebar_widget  # noqa: F401 (a fixture)
from test_app_video import upload_clip

transformers = pytest.importorskip("transformers")
pytest.importorskip("timm")

from test_library_pe_video import (  # noqa: E402, F401 (fixtures)
    FRAMES,
    GH,
    GW,
    checkpoint,
    eager,
    folder,
    frames,
    probe_by_hand,
    processed,
    reference,
)

import vit  # noqa: E402
from vit.app import library_clip_view as views  # noqa: E402


def zipped(images) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for i, image in enumerate(images):
            png = io.BytesIO()
            image.save(png, format="PNG")
            archive.writestr(f"clip/frame{i}.png", png.getvalue())
    return buffer.getvalue()


@pytest.fixture
def shown(monkeypatch) -> list[np.ndarray]:
    """The shown frame's map as the page hands it to the frame picker, each run."""
    from vit.app import clip_view

    maps, picker = [], clip_view.frame_picker_figure
    monkeypatch.setattr(clip_view, "frame_picker_figure", lambda overlay, values, *a, **k: maps.append(
        np.asarray(values)) or picker(overlay, values, *a, **k))
    return maps


def export(at: AppTest) -> str:
    """The page's "Export this view (HTML)", as its button's data gives it (the shown frame's view)."""
    import app_pages.explorer_sections.clip_view as page

    views_drawn = []
    original = page.frame_view_part
    page.frame_view_part = lambda view: views_drawn.append(view) or original(view)
    try:
        at.run()
    finally:
        page.frame_view_part = original
    [view] = views_drawn[-1:]
    return page._export(view, 2, None, "the caption", (0.0, 1.0)).decode("utf-8")


def url(at: AppTest) -> dict[str, str]:
    return {k: v[-1] if isinstance(v, list) else v for k, v in ((k, at.query_params[k]) for k in at.query_params)}


@pytest.mark.slow  # transformers builds the model; the page runs it
@pytest.mark.usefixtures("dirs")
def test_pe_videos_clip_view_draws_vit_explains_maps_and_its_link_reopens_them(  # noqa: F811
        folder, frames, checkpoint, reference, processed, shown):  # noqa: F811
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(folder))
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("Upload a clip in the sidebar" in i.value for i in at.info)
    at = upload_clip(at, "clip.zip", zipped(frames), "application/zip")
    assert not at.error, [e.value for e in at.error]
    _, temporal, spatial = eager(reference, processed)  # (F, H, T, T) each trunk layer; (1, H, 1+F, 1+F) temporal

    # the default: the trunk's last layer, the heads' mean, each frame's CLS row over its own patches
    default = vit.explain(checkpoint, frames, "attention")
    np.testing.assert_allclose(shown[-1], default.map[0], rtol=0, atol=0)
    np.testing.assert_allclose(shown[-1], spatial[-1][0, :, 0, 1:].mean(0).reshape(GH, GW).numpy(), atol=1e-5,
                               rtol=0)

    # a patch of the third frame, head 2, the first layer: its row on its own frame, the other frames 0
    sidebar_widget(at, "radio", "Query").set_value("patch").run()
    for label, value in (("Frame", 3), ("Row", 2), ("Col", 5)):
        sidebar_widget(at, "number_input", label).set_value(value)
    sidebar_widget(at, "selectbox", "Head").set_value(1)
    sidebar_widget(at, "slider", "Layer").set_value(1)
    at.run()
    at.slider(key="clip_frame").set_value(3).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    patch = vit.explain(checkpoint, frames, "attention", layer=0, head=1, query=(2, 1, 4))
    np.testing.assert_allclose(shown[-1], patch.map[2], rtol=0, atol=0)
    expected = spatial[0][2, 1, 1 + 1 * GW + 4, 1:].reshape(GH, GW).numpy()
    np.testing.assert_allclose(shown[-1], expected, atol=1e-5, rtol=0)
    link = url(at)
    assert {k: link[k] for k in ("map", "layer", "head", "patch", "frame")} == {
        "map": "attention", "layer": "1", "head": "2", "patch": "3.2.5", "frame": "3"}
    caption = [c.value for c in at.main.caption if "Sampled frame" in c.value]
    exported = export(at)
    assert "frame 3, row 2, col 5" in exported and "clip.zip" in exported and "Query patch" in exported

    fresh = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in link.items():
        fresh.query_params[key] = value
    fresh.run()
    assert not fresh.exception and not fresh.warning, [w.value for w in fresh.warning]
    np.testing.assert_allclose(shown[-1], patch.map[2], rtol=0, atol=0)
    assert [c.value for c in fresh.main.caption if "Sampled frame" in c.value] == caption
    assert url(fresh) == link

    # the temporal layer 1's row of frame 2's token over the frames, each frame's weight over its whole grid
    sidebar_widget(at, "radio", "Map").set_value("temporal").run()
    sidebar_widget(at, "selectbox", "Query token").set_value(2)
    sidebar_widget(at, "slider", "Temporal layer").set_value(1)
    sidebar_widget(at, "selectbox", "Head").set_value(-1)  # the heads' mean (head 2 was kept from the trunk's map)
    at.run()
    at.slider(key="clip_frame").set_value(1).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    row = temporal[0][0, :, 2, 1:].mean(0).numpy()  # the heads' mean, the CLS key left out: (F,)
    np.testing.assert_allclose(shown[-1], np.full((GH, GW), row[0]), atol=1e-5, rtol=0)
    np.testing.assert_allclose(shown[-1], vit.explain(checkpoint, frames, "temporal", layer=0, query=2).map[0],
                               rtol=0, atol=0)
    temporal_link = url(at)
    assert temporal_link["query"] == "2" and "the row of frame 2 over the frames" in " ".join(
        c.value for c in at.main.caption)
    # each frame's pooling probe (head 1) and the CLS rollout up to layer 2, each vit.explain's
    sidebar_widget(at, "radio", "Map").set_value("probe").run()
    sidebar_widget(at, "selectbox", "Head").set_value(0).run()
    probe = probe_by_hand(reference, processed)[:, 0, 0, 1:].reshape(FRAMES, GH, GW).numpy()  # timm's, by hand
    np.testing.assert_allclose(shown[-1], probe[0], atol=1e-6, rtol=0)
    np.testing.assert_allclose(shown[-1], vit.explain(checkpoint, frames, "probe", head=0).map[0], rtol=0, atol=0)
    sidebar_widget(at, "radio", "Map").set_value("rollout").run()
    sidebar_widget(at, "radio", "Query").set_value("cls")
    sidebar_widget(at, "slider", "Up to layer").set_value(2)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    np.testing.assert_allclose(shown[-1], vit.explain(checkpoint, frames, "rollout", layer=1).map[0], rtol=0, atol=0)
    at.run()
    assert "patch" not in url(at) and url(at)["map"] == "rollout"

    over = AppTest.from_file(APP, default_timeout=TIMEOUT)  # a token past the clip's: dropped in one line
    for key, value in {**temporal_link, "query": str(FRAMES + 1)}.items():
        over.query_params[key] = value
    over.run()
    assert not over.exception and [displayed(w.value) for w in over.warning] == [
        f"The link's query={FRAMES + 1} was not used: the temporal layers read the CLS and 3 frames, 0 to 3."]


def test_the_clip_views_words_and_arguments_are_those_vit_explain_reads():
    """Each map's layers and heads are the part of the model it reads (the trunk's, the temporal encoder's, the
    pooling head's), the page's choice is handed to vit.explain with what the map does not read left out, and the
    page's widgets are the port's clip page's where they mean the same (a link and the patch picker set them)."""
    from types import SimpleNamespace

    from app_pages.explorer_sections import clip_view, library_clip_view

    model = SimpleNamespace(num_layers=2, num_heads=4, num_frame_layers=3, frames=SimpleNamespace(num_heads=5),
                            pool=SimpleNamespace(num_heads=6))
    assert views.map_kinds(model) == ("attention", "rollout", "temporal", "probe")
    assert views.map_kinds(SimpleNamespace(pool=None)) == ("attention", "rollout", "temporal")
    assert [views.layer_count(model, k) for k in views.map_kinds(model)] == [3, 3, 2, 0]
    assert [views.head_count(model, k) for k in views.map_kinds(model)] == [5, 0, 4, 6]
    assert views.explain_arguments("attention", 2, None, None) == {"layer": 1}
    assert views.explain_arguments("rollout", 1, 0, (0, 1, 2)) == {"layer": 0, "query": (0, 1, 2)}
    assert views.explain_arguments("probe", 2, 1, 3) == {"head": 1}
    assert views.explain_arguments("temporal", 1, 3, 2) == {"layer": 0, "head": 3, "query": 2}
    assert views.describe("temporal", 1, 2, None, 0) == ("Temporal attention (the CLS and one token a frame), layer 1 "
                                                         "of 2, the mean over its heads, the row of the CLS over the "
                                                         "frames")
    assert views.describe("rollout", 2, 3, None, (1, 0, 4)).endswith(", layers 1–2, query frame 2, row 1, col 5 "
                                                                       "(its own frame's patches)")
    keys = library_clip_view._keys("m")
    assert (keys["frame"], keys["row"], keys["col"]) == clip_view.query_keys("m")
    assert all(key.startswith(clip_view.KEPT) for key in keys.values())  # kept while the page stops early
