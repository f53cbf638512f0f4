"""The explorer shows a clip for a video model (issue 65): a tiny random VideoMAE opened by path, an animated GIF
uploaded, its predicted classes, the sampling said in the caption, a time slider whose frame shows the map
``vit.explain`` gives for that frame (its values ride on the frame picker's points), a query typed as (frame, row,
col), the strip of every frame and the GIF export; a zip of frames reads as the GIF does, and an MP4 (PyAV) shows
``vit.explain``'s maps of the same file; a broken or oversized clip answers in one line. ``vit.explain``'s maps are
checked against transformers in tests/test_videomae.py."""

import base64
import io
import json
import zipfile

import numpy as np
import pytest
from PIL import Image
from streamlit.testing.v1 import AppTest
from test_app import APP, TIMEOUT, charts, dirs, run_app, sidebar_widget  # noqa: F401 (a fixture)
from test_videomae import videomae_folder, write_gif

import vit
from vit.app import clip_view as clips

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dirs")]  # transformers builds the model

FRAMES, HEIGHT, WIDTH = 4, 24, 32  # 2 tubelets of 3 x 4 patches of 8 px


@pytest.fixture
def video_page(tmp_path):
    """The explorer on a tiny random VideoMAE opened by path, before any clip."""
    videomae_folder(tmp_path / "videomae", FRAMES, HEIGHT, WIDTH)
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(tmp_path / "videomae"))
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def upload_clip(at, name: str, data: bytes, mime: str = "image/gif"):
    [uploader] = [u for u in at.sidebar.file_uploader if u.label == "Upload a clip"]
    uploader.set_value((name, data, mime))
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def shown_map(at) -> np.ndarray:
    """The shown frame's map, as the frame picker's points carry it: (rows, cols)."""
    [spec] = [json.loads(c.proto.spec) for c in at.get("plotly_chart") if "customdata" in c.proto.spec]
    values = spec["data"][0]["customdata"]
    if isinstance(values, dict):  # Plotly 6's base64 arrays
        values = np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"])
    return np.asarray(values, dtype=np.float64).reshape(HEIGHT // 8, WIDTH // 8)


def test_the_time_slider_shows_vit_explains_map_of_that_frame(video_page, tmp_path):
    at = upload_clip(video_page, "clip.gif", write_gif(tmp_path / "clip.gif", 9).read_bytes())
    assert not at.error
    assert any("Uniform sampling of 4 frames over 9: frames 0, 2, 4, 6" in c.value.replace("\\", "")
               for c in at.caption)
    assert [b.label for b in at.get("download_button")] == ["Export this view (HTML)", "Export as animated GIF"]
    [strip] = at.get("image")
    assert len(strip.proto.imgs) == FRAMES  # every sampled frame with its map
    model = vit.load(str(tmp_path / "videomae"))
    default = vit.explain(model, str(tmp_path / "clip.gif"), "attention", query=(0, 0, 0))
    np.testing.assert_allclose(shown_map(at), default.map[0], rtol=1e-6, atol=1e-9)
    at.slider(key="clip_frame").set_value(3).run()  # the third sampled frame: the second tubelet
    np.testing.assert_allclose(shown_map(at), default.map[2], rtol=1e-6, atol=1e-9)
    assert not np.allclose(default.map[0], default.map[2])  # the slider did change what is shown

    # a query typed in another frame, one head, the first layer: its attention over every frame
    sidebar_widget(at, "selectbox", "Head").set_value(2)
    for label, value in (("Frame", 4), ("Row", 3), ("Col", 2)):
        sidebar_widget(at, "number_input", label).set_value(value)
    sidebar_widget(at, "slider", "Layer").set_value(1)
    at.run()
    assert not at.exception and not at.error
    queried = vit.explain(model, str(tmp_path / "clip.gif"), "attention", layer=0, head=2, query=(3, 2, 1))
    for position in (1, 4):
        at.slider(key="clip_frame").set_value(position).run()
        np.testing.assert_allclose(shown_map(at), queried.map[position - 1], rtol=1e-6, atol=1e-9)

    sidebar_widget(at, "radio", "Map").set_value("rollout").run()
    rollout = vit.explain(model, str(tmp_path / "clip.gif"), "rollout", layer=0, query=(3, 2, 1))  # up to layer 1
    np.testing.assert_allclose(shown_map(at), rollout.map[3], rtol=1e-6, atol=1e-9)


def test_a_zip_of_frames_reads_as_its_gif_does(video_page, tmp_path):
    gif = write_gif(tmp_path / "clip.gif", 9)
    buffer = io.BytesIO()
    with Image.open(gif) as image, zipfile.ZipFile(buffer, "w") as archive:
        for i in range(image.n_frames):
            image.seek(i)
            png = io.BytesIO()
            image.convert("RGB").save(png, format="PNG")
            archive.writestr(f"clip/frame{i}.png", png.getvalue())  # frame10 would sort after frame9
    at = upload_clip(video_page, "frames.zip", buffer.getvalue(), "application/zip")
    assert not at.error
    expected = vit.explain(vit.load(str(tmp_path / "videomae")), str(gif), "norms")
    sidebar_widget(at, "radio", "Map").set_value("norms").run()
    np.testing.assert_allclose(shown_map(at), expected.map[0], rtol=1e-6, atol=1e-9)


def test_an_uploaded_mp4_shows_vit_explains_maps_of_the_same_file(video_page, tmp_path):
    from test_video_files import write_video

    path = write_video(tmp_path / "clip.mp4", 9, size=(40, 30))
    at = upload_clip(video_page, "clip.mp4", path.read_bytes(), "video/mp4")
    assert not at.error, [e.value for e in at.error]
    assert any("Uniform sampling of 4 frames over 9: frames 0, 2, 4, 6" in c.value.replace("\\", "")
               for c in at.caption)
    [strip] = at.get("image")
    assert len(strip.proto.imgs) == FRAMES
    expected = vit.explain(vit.load(str(tmp_path / "videomae")), str(path), "attention", query=(0, 0, 0))
    at.slider(key="clip_frame").set_value(3).run()
    np.testing.assert_allclose(shown_map(at), expected.map[2], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name, data, message", [
    ("broken.gif", b"GIF89a not really", "is not an image"),
    ("notes.zip", b"PK\x03\x04 not really", "is not a zip file"),
    ("notes.mp4", b"not a video at all", "is not a video"),
    ("big.gif", None, "MB"),
], ids=["broken", "not-a-zip", "not-a-video", "oversized"])
def test_a_bad_clip_answers_in_one_line(video_page, tmp_path, monkeypatch, name, data, message):
    if data is None:
        monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "1")  # 4 frames of 400 x 300 px: refused before decoding
        data = write_gif(tmp_path / name, 4, size=(400, 300)).read_bytes()
    at = upload_clip(video_page, name, data)
    [error] = at.error
    assert message in error.value and "\n" not in error.value and name in error.value.replace("\\", "")
    assert not at.get("plotly_chart") or not any("customdata" in c.proto.spec for c in at.get("plotly_chart"))


def test_the_export_is_an_animated_gif_of_every_frame_within_its_bound():
    frames = [Image.new("RGB", (640, 480), (i * 60, 0, 0)) for i in range(4)]
    with Image.open(io.BytesIO(clips.animated_gif(frames))) as gif:
        assert gif.n_frames == 4 and max(gif.size) == clips.GIF_MAX_SIDE


def test_the_sampling_caption_names_every_sampled_frame():
    caption = clips.sampling_caption([0, 2, 5, 7], 10)
    assert caption.startswith("Uniform sampling of 4 frames over 10: frames 0, 2, 5, 7")


def test_a_zips_declared_sizes_are_checked_before_its_frames_are_inflated(monkeypatch):
    from vit.core.clips import ClipError, read_clip_bytes

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for i in range(4):
            archive.writestr(f"frame{i}.png", b"\0" * 2**20)  # 1 MB each as declared, a few KB deflated
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "1")
    with pytest.raises(ClipError, match="declare 4 MB") as error:
        read_clip_bytes(buffer.getvalue(), "bomb.zip", 4)
    assert "\n" not in str(error.value) and len(buffer.getvalue()) < 2**16


def test_a_timesformer_offers_its_temporal_attention_and_shows_vit_explains_map(tmp_path):
    """TimeSformer's clip: the map choice is its own (spatial, temporal, norms, similarity, AttnLRP: no rollout), and
    the temporal map of a typed query patch on the shown frame is ``vit.explain``'s (checked against transformers in
    test_timesformer)."""
    from test_timesformer import timesformer_folder

    timesformer_folder(tmp_path / "timesformer", FRAMES, HEIGHT, WIDTH)
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(tmp_path / "timesformer"))
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    at = upload_clip(at, "clip.gif", write_gif(tmp_path / "clip.gif", FRAMES).read_bytes())
    [choice] = [r for r in at.sidebar.radio if r.label == "Map"]
    assert list(choice.options) == ["Attention of one layer", "Temporal attention (a patch over the frames, "
                                    "TimeSformer)", "Token norms (one layer's output)",
                                    "Similarity to the query (cosine, one layer's tokens, every frame)",
                                    "Logit lens (the class's probability read from each token at one layer)",
                                    "AttnLRP (class-specific, signed)"]  # no rollout, class map or LeGrad
    choice.set_value("temporal")
    for label, value in (("Frame", 2), ("Row", 2), ("Col", 3)):
        sidebar_widget(at, "number_input", label).set_value(value)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    expected = vit.explain(vit.load(str(tmp_path / "timesformer")), str(tmp_path / "clip.gif"), "temporal",
                           query=(1, 1, 2))
    for position in (1, FRAMES):
        at.slider(key="clip_frame").set_value(position).run()
        np.testing.assert_allclose(shown_map(at), expected.map[position - 1], rtol=1e-6, atol=1e-9)


def test_a_class_map_on_the_page_is_vit_explains_for_the_chosen_class(video_page, tmp_path):
    at = upload_clip(video_page, "clip.gif", write_gif(tmp_path / "clip.gif", 9).read_bytes())
    model = vit.load(str(tmp_path / "videomae"))
    sidebar_widget(at, "radio", "Map").set_value("legrad").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert not [n for n in at.sidebar.number_input if n.label == "Frame"]  # LeGrad reads no query
    sidebar_widget(at, "selectbox", "Class").set_value(3).run()
    at.slider(key="clip_frame").set_value(3).run()
    legrad = vit.explain(model, str(tmp_path / "clip.gif"), "legrad", target=3)  # from the last two layers
    np.testing.assert_allclose(shown_map(at), legrad.map[2], rtol=1e-5, atol=1e-7)
    sidebar_widget(at, "radio", "Map").set_value("attnlrp").run()
    assert not at.exception and not at.error
    attnlrp = vit.explain(model, str(tmp_path / "clip.gif"), "attnlrp", target=3)
    np.testing.assert_allclose(shown_map(at), attnlrp.map[2], rtol=1e-5, atol=1e-7)
    sidebar_widget(at, "radio", "Map").set_value("lens").run()
    sidebar_widget(at, "slider", "Layer").set_value(1).run()
    assert not at.exception and not at.error
    lens = vit.explain(model, str(tmp_path / "clip.gif"), "lens", layer=0, target=3)
    np.testing.assert_allclose(shown_map(at), lens.map[2], rtol=1e-5, atol=1e-7)
    sidebar_widget(at, "radio", "Map").set_value("gradcam").run()  # the layer (1) and the class (3) kept
    assert not at.exception and not at.error
    assert not [n for n in at.sidebar.number_input if n.label == "Frame"]  # Grad-CAM reads no query
    gradcam = vit.explain(model, str(tmp_path / "clip.gif"), "gradcam", layer=0, target=3)
    np.testing.assert_allclose(shown_map(at), gradcam.map[2], rtol=1e-5, atol=1e-7)
    assert np.ptp(gradcam.map) > 0


def test_heads_switched_off_on_the_page_give_the_ablated_models_prediction_and_maps(video_page, tmp_path):
    """The sidebar's "Heads off": the prediction and every map are ``vit.explain``'s on ``vit.ablate``'s copy
    (zero ablation, checked against transformers in tests/test_videomae.py and tests/test_video_relevance.py)."""
    at = upload_clip(video_page, "clip.gif", write_gif(tmp_path / "clip.gif", 9).read_bytes())
    model = vit.load(str(tmp_path / "videomae"))
    clip = str(tmp_path / "clip.gif")
    sidebar_widget(at, "slider", "Layer").set_value(2).run()  # the layer after the one ablated
    intact = vit.explain(model, clip, "attention", layer=1, query=(0, 0, 0))
    np.testing.assert_allclose(shown_map(at), intact.map[0], rtol=1e-6, atol=1e-9)
    sidebar_widget(at, "multiselect", "Heads off (zero ablation)").set_value(["1.2", "1.4"]).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("Heads 1.2, 1.4 are switched off" in i.value.replace("\\", "") for i in at.info)
    ablated = vit.ablate(model, [(0, 1), (0, 3)])
    off = vit.explain(ablated, clip, "attention", layer=1, query=(0, 0, 0))
    np.testing.assert_allclose(shown_map(at), off.map[0], rtol=1e-6, atol=1e-9)
    assert not np.allclose(off.map[0], intact.map[0])  # switching them off changed the later layer's attention
    [bars] = [c for c in charts(at) if c["data"][0].get("type") == "bar"]
    shown = dict(zip(bars["data"][0]["y"], bars["data"][0]["x"], strict=True))
    top = off.prediction.top_k
    assert top != intact.prediction.top_k and all(abs(shown[label] - p) < 1e-6 for label, p in top)


def test_a_long_class_map_shows_its_progress_and_a_stop_button_and_stops(video_page, tmp_path, monkeypatch):
    import threading

    from app_pages.explorer_sections import clip_view, long_work
    from vit.explain.views import video

    monkeypatch.setattr(long_work, "QUICK_S", 0.5)
    monkeypatch.setattr(clip_view, "PROGRESS_TOKENS", 0)  # every clip's class map is long work here
    at = upload_clip(video_page, "clip.gif", write_gif(tmp_path / "clip.gif", 9).read_bytes())
    blocks, started = [], threading.Event()

    def slow(checkpoint, clip, kind, class_index=None, layer=None, query=0, progress=None):
        for i in range(200):
            progress(i, 200)
            started.set()
            threading.Event().wait(0.05)
            blocks.append(i)
        return np.zeros((FRAMES, HEIGHT // 8, WIDTH // 8))

    monkeypatch.setattr(video, "clip_class_map", slow)
    sidebar_widget(at, "radio", "Map").set_value("class").run()
    assert not at.exception, [e.message for e in at.exception]
    [bar] = at.get("progress")
    assert "Computing Class" in bar.proto.text and "of 200 blocks" in bar.proto.text
    [stop] = [b for b in at.button if b.key == "long_work_stop-clip map"]
    assert started.wait(30)
    current = at.session_state[long_work.SESSION_KEY]
    stop.click()
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert current.wait(10) and current.state == "stopped"
    assert any("stopped after" in i.value and "stopped by you" in i.value for i in at.info)
    ran = len(blocks)
    threading.Event().wait(0.3)
    assert len(blocks) == ran  # nothing runs after the stop


def test_similarity_over_frames_and_the_pca_strip_are_vit_explains(video_page, tmp_path):

    at = upload_clip(video_page, "clip.gif", write_gif(tmp_path / "clip.gif", 9).read_bytes())
    sidebar_widget(at, "radio", "Map").set_value("similarity").run()
    for label, value in (("Frame", 3), ("Row", 2), ("Col", 4)):
        sidebar_widget(at, "number_input", label).set_value(value)
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    model = vit.load(str(tmp_path / "videomae"))
    expected = vit.explain(model, str(tmp_path / "clip.gif"), "similarity", query=(2, 1, 3))
    at.slider(key="clip_frame").set_value(1).run()
    np.testing.assert_allclose(shown_map(at), expected.map[0], rtol=1e-5, atol=1e-7)
    at.toggle(key="clip_pca").set_value(True).run()
    assert not at.exception and not at.error
    strip, pca = at.get("image")
    assert len(pca.proto.imgs) == FRAMES  # every frame's PCA colours (clip_pca: checked in test_video_relevance)


def test_a_frames_pca_colours_are_one_block_a_patch():
    colours = np.array([[[1.0, 0, 0], [0, 1, 0]], [[0, 0, 1], [0.5, 0.5, 0.5]]])  # (gh, gw, 3)
    picture = np.asarray(clips.colour_frame(colours, (4, 4)))  # (height, width, 3)
    assert picture.shape == (4, 4, 3)
    assert picture[0, 0].tolist() == [255, 0, 0] and picture[1, 3].tolist() == [0, 255, 0]
    assert picture[3, 0].tolist() == [0, 0, 255] and picture[2, 2].tolist() == [128, 128, 128]


def caption_text(at) -> str:
    return " ".join(c.value.replace("\\", "") for c in at.caption)


def test_play_steps_the_time_slider_through_the_sampled_frames(video_page, tmp_path):
    """Issue 76, item 8: the clip had a time slider but no Play; it steps as the snapshot viewer's does."""
    at = upload_clip(video_page, "clip.gif", write_gif(tmp_path / "clip.gif", 9).read_bytes())
    assert at.slider(key="clip_frame").value == 1
    at = at.toggle(key="clip_play").set_value(True).run()  # each run of the frame's fragment: the next frame
    assert not at.exception, [e.message for e in at.exception]
    first = at.slider(key="clip_frame").value
    assert f"Sampled frame {first} of {FRAMES}" in caption_text(at)
    at = at.run()
    assert at.slider(key="clip_frame").value == first % FRAMES + 1
    for _ in range(FRAMES - 1):
        at = at.run()
    assert at.slider(key="clip_frame").value == first  # round and round
    at = at.toggle(key="clip_play").set_value(False).run()
    stopped = at.slider(key="clip_frame").value
    assert at.run().slider(key="clip_frame").value == stopped


def test_a_clip_views_link_opens_the_same_view_in_a_fresh_session(video_page, tmp_path):
    """Issue 76, item 8: the clip view's URL follows it (model, the upload by its hash, map, layer, head, query patch,
    frame) and a fresh session opened on it shows the same frame's map."""
    at = upload_clip(video_page, "clip.gif", write_gif(tmp_path / "clip.gif", 9).read_bytes())
    sidebar_widget(at, "selectbox", "Head").set_value(2)
    for label, value in (("Frame", 4), ("Row", 3), ("Col", 2)):
        sidebar_widget(at, "number_input", label).set_value(value)
    sidebar_widget(at, "slider", "Layer").set_value(1)
    at.run()
    at.slider(key="clip_frame").set_value(3).run()
    assert not at.exception, [e.message for e in at.exception]
    params = at.query_params
    flat = {k: v[0] if isinstance(v, list) else v for k, v in params.items()}
    assert {k: flat[k] for k in ("map", "layer", "head", "patch", "frame")} == \
        {"map": "attention", "layer": "1", "head": "3", "patch": "4.3.2", "frame": "3"}
    assert flat["model"] == str(tmp_path / "videomae") and len(flat["upload"]) == 64
    shown, caption = shown_map(at), caption_text(at)

    fresh = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in flat.items():
        fresh.query_params[key] = value
    fresh.run()
    assert not fresh.exception, [e.message for e in fresh.exception]
    assert not fresh.warning, [w.value for w in fresh.warning]  # nothing of the link was dropped
    np.testing.assert_allclose(shown_map(fresh), shown, rtol=1e-6)
    assert "head 3, query frame 4, row 3, col 2" in caption_text(fresh)
    assert "Sampled frame 3 of 4 (frame 4 of clip.gif)" in caption_text(fresh) and caption_text(fresh) == caption


def test_a_link_to_a_clip_the_server_no_longer_holds_asks_for_it_again(video_page, tmp_path):
    fresh = AppTest.from_file(APP, default_timeout=TIMEOUT)
    fresh.query_params["model"] = str(tmp_path / "videomae")
    fresh.query_params["upload"] = "0" * 64
    fresh.run()
    assert not fresh.exception, [e.message for e in fresh.exception]
    assert any("The clip this link shows was an upload the server no longer holds" in i.value for i in fresh.info)
