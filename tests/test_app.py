"""The app driven through Streamlit's AppTest: checkpoints, uploads, settings, caching and errors.

Each test points the app at its own checkpoints and runs folders (VIT_CHECKPOINTS_DIR,
VIT_RUNS_DIR) holding tiny random models, and counts ``ViT.forward`` calls to check that only
a new checkpoint, image or class runs the model.
"""

import base64
import io
import json
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import streamlit as st
import torch
from helpers import displayed
from markdown_it import MarkdownIt
from PIL import Image
from streamlit.testing.v1 import AppTest

from vit import explorer
from vit.catalog import DEFAULT_CHECKPOINT, default_checkpoints_dir
from vit.checkpoint import save_checkpoint
from vit.model import ViT, ViTConfig

APP = str(Path(__file__).resolve().parent.parent / "app.py")
TIMEOUT = 180  # the first run imports torch, plotly and matplotlib on a busy machine
CLASSES = ["airplane", "cat", "dog"]
TINY = ViTConfig(image_size=16, patch_size=4, num_channels=3, num_classes=3, hidden_size=16, num_layers=3,
                 num_heads=2, mlp_size=32)


def png_bytes(width: int = 24, height: int = 16, mode: str = "RGB", seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    channels = 3 if mode == "RGB" else 1
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels if channels == 3 else pixels[:, :, 0]).save(buffer, format="PNG")
    return buffer.getvalue()


def write_checkpoint(path: Path, config: ViTConfig = TINY, classes=CLASSES, seed: int = 0, **metadata) -> Path:
    torch.manual_seed(seed)
    return save_checkpoint(path, ViT(config), list(classes), metadata={"dataset": "folder:data/tiny", "val_acc": 0.5,
                                                                       **metadata})


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """An empty world for the app: its own checkpoints and runs folders, and no cached models or results."""
    checkpoints, runs = tmp_path / "checkpoints", tmp_path / "runs"
    checkpoints.mkdir()
    runs.mkdir()
    monkeypatch.setenv("VIT_CHECKPOINTS_DIR", str(checkpoints))
    monkeypatch.setenv("VIT_RUNS_DIR", str(runs))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))  # never list the machine's own HF cache
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    st.cache_data.clear()
    st.cache_resource.clear()
    yield checkpoints, runs
    st.cache_data.clear()
    st.cache_resource.clear()


@pytest.fixture
def default_world(dirs):
    """A tiny random model shipped under the default name, with two sample images."""
    checkpoints, runs = dirs
    write_checkpoint(checkpoints / DEFAULT_CHECKPOINT)
    samples = checkpoints / "samples" / Path(DEFAULT_CHECKPOINT).stem
    samples.mkdir(parents=True)
    (samples / "cat_1.png").write_bytes(png_bytes(seed=1))
    (samples / "dog_1.png").write_bytes(png_bytes(seed=2))
    return checkpoints, runs


@pytest.fixture
def forwards():
    """Counts ViT.forward calls (the real forward still runs)."""
    original = ViT.forward
    with mock.patch.object(ViT, "forward", autospec=True, side_effect=original) as counted:
        yield counted


def run_app(**state) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def sidebar_widget(at: AppTest, kind: str, label: str):
    matches = [w for w in getattr(at.sidebar, kind) if w.label == label]
    assert matches, f"no sidebar {kind} labelled {label!r}"
    return matches[0]


def charts(at: AppTest) -> list[dict]:
    """The Plotly figures on the page, as JSON."""
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def array_shape(value) -> tuple[int, ...]:
    """The shape of an array in a figure's JSON: a nested list, or Plotly 6's base64 {"bdata", "shape"}."""
    if isinstance(value, dict):
        return tuple(int(n) for n in str(value["shape"]).split(","))
    return np.array(value).shape


def predicted_labels(at: AppTest) -> list[str]:
    bars = [trace for fig in charts(at) for trace in fig["data"] if trace.get("type") == "bar"]
    assert len(bars) == 1, "expected one prediction bar chart"
    return list(bars[0]["y"])


def overlay_caption(at: AppTest) -> str:
    texts = [c.value for c in at.main.caption if "Colours span" in c.value]
    assert len(texts) == 1
    return texts[0]


def head_captions(at: AppTest) -> list[str]:
    """The labels of the small multiples in the Heads tab."""
    return [caption for image in at.tabs[0].get("image") for caption in image.captions]


def upload(at: AppTest, name: str, data: bytes, mime: str = "image/png") -> AppTest:
    at.sidebar.file_uploader[0].set_value((name, data, mime))
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


# -- opening the app ---------------------------------------------------------------------------------------------

def test_opens_on_the_default_checkpoint_with_a_sample_prediction_and_the_default_map(default_world, forwards):
    checkpoints, _ = default_world
    write_checkpoint(checkpoints / "another.pt", seed=1)
    at = run_app()
    assert sidebar_widget(at, "selectbox", "Checkpoint").value == str(checkpoints / DEFAULT_CHECKPOINT)
    assert sorted(predicted_labels(at)) == sorted(CLASSES)
    # The seed blog's figure: last layer, CLS query, mean over heads.
    assert "Layer 3 of 3, the mean over its 2 heads" in overlay_caption(at)
    assert "the CLS token" in overlay_caption(at)
    assert not at.error
    assert forwards.call_count == 1


def test_empty_checkpoints_folder_explains_what_to_do(dirs):
    at = run_app()
    assert "No checkpoints yet" in at.info[0].value
    assert not at.error


def test_checkpoint_without_samples_asks_for_an_upload(dirs):
    checkpoints, _ = dirs
    write_checkpoint(checkpoints / "lonely.pt")
    at = run_app()
    assert "Upload an image" in at.info[0].value


# -- uploads -----------------------------------------------------------------------------------------------------

def test_uploaded_image_replaces_the_sample_and_is_predicted(default_world, forwards):
    at = run_app()
    upload(at, "wide.png", png_bytes(width=90, height=30, seed=9))
    assert sorted(predicted_labels(at)) == sorted(CLASSES)
    assert any("wide.png, 90×30 px" in displayed(c.value) for c in at.main.caption)
    assert forwards.call_count == 2  # the sample, then the upload


def test_same_image_again_does_not_rerun_the_model(default_world, forwards):
    at = run_app()
    data = (default_world[0] / "samples" / "cifar10-cifar-s" / "cat_1.png").read_bytes()
    upload(at, "same-pixels.png", data)  # identical bytes: the cached forward pass is reused
    assert forwards.call_count == 1


@pytest.mark.parametrize(("name", "data", "message"), [
    ("notes.png", b"this is not an image", "not an image"),
    ("empty.png", b"", "empty"),
    ("cut.png", png_bytes(64, 64)[:200], "truncated or corrupt"),
    ("bomb.png", (10_000, 10_000), "too large to decode safely"),
    # Under PIL's limit (89 M pixels) but over the app's for uploads: one such PNG is 126 MB decoded in RGB.
    ("poster.png", (7_000, 6_000), "poster.png is too large (7,000×6,000 px; at most 40,000,000 pixels)"),
])
def test_bad_upload_shows_one_error_and_the_page_recovers(default_world, name, data, message):
    if isinstance(data, tuple):  # that many pixels of zeros: a few kB on disk, up to gigabytes decoded
        buffer = io.BytesIO()
        Image.new("1", data).save(buffer, format="PNG")
        data = buffer.getvalue()
    at = run_app()
    upload(at, name, data)
    assert len(at.error) == 1
    assert name in displayed(at.error[0].value) and message in displayed(at.error[0].value)
    assert "Traceback" not in at.error[0].value
    at.sidebar.file_uploader[0].clear()
    at.run()
    assert not at.exception and not at.error
    assert sorted(predicted_labels(at)) == sorted(CLASSES)


# -- settings only redraw ------------------------------------------------------------------------------------------

def test_layer_head_query_fusion_rollout_and_overlay_changes_never_rerun_the_model(default_world, forwards):
    at = run_app()
    assert forwards.call_count == 1
    steps = [
        ("select_slider", "Layer", 1, "Layer 1 of 3"),
        ("selectbox", "Head", 1, "head 2"),
        ("selectbox", "Query token", 6, "patch row 2, col 2"),
        ("selectbox", "Head", None, "the max over its 2 heads"),
    ]
    for kind, label, value, expected in steps:
        if label == "Head" and value is None:
            sidebar_widget(at, "radio", "Head fusion").set_value("max")
        sidebar_widget(at, kind, label).set_value(value)
        at.run()
        assert not at.exception
        assert expected in overlay_caption(at)
    sidebar_widget(at, "radio", "Map").set_value("rollout")
    at.run()
    assert "Attention rollout through layers 1–3" in overlay_caption(at)
    sidebar_widget(at, "slider", "Discard ratio").set_value(0.5)
    sidebar_widget(at, "select_slider", "Up to layer").set_value(2)
    at.run()
    assert "through layers 1–2" in overlay_caption(at) and "lowest 50%" in overlay_caption(at)
    sidebar_widget(at, "slider", "Opacity").set_value(0.3)
    sidebar_widget(at, "selectbox", "Colour map").set_value("viridis")
    sidebar_widget(at, "radio", "Upsampling").set_value("nearest")
    sidebar_widget(at, "checkbox", "Show the patch grid").check()
    at.run()
    assert not at.exception and not at.error
    assert forwards.call_count == 1


def test_every_tab_draws_from_the_cached_forward_pass(default_world, forwards):
    at = run_app()
    assert [t.label for t in at.tabs] == ["Heads", "Attention matrix", "Distance & entropy"]
    # Heads: the chosen layer's heads by default, every layer on request, labelled.
    assert head_captions(at) == ["L3 · head 1", "L3 · head 2"]
    at.toggle(key="every_layer").set_value(True)
    at.run()
    assert head_captions(at) == [f"L{layer} · head {head}" for layer in (1, 2, 3) for head in (1, 2)]
    at.session_state["analysis_tab"] = "Attention matrix"
    at.run()
    heatmaps = [t for fig in charts(at) for t in fig["data"] if t["type"] == "heatmap"]
    assert len(heatmaps) == 1 and array_shape(heatmaps[0]["z"]) == (17, 17)  # CLS + 4 x 4 patches
    at.session_state["analysis_tab"] = "Distance & entropy"
    at.run()
    titles = [fig["layout"]["title"]["text"] for fig in charts(at) if fig["layout"].get("title")]
    assert titles == ["Mean attention distance", "Attention entropy"]
    assert not at.exception
    assert forwards.call_count == 1


def test_class_specific_map_runs_one_backward_pass_per_class_and_caches_it(default_world, forwards):
    at = run_app()
    sidebar_widget(at, "radio", "Map").set_value("class")
    at.run()
    assert forwards.call_count == 2  # the prediction, then the predicted class's gradients
    assert "(the predicted class)" in overlay_caption(at)
    predicted = predicted_labels(at)[0]
    other = next(i for i, name in enumerate(CLASSES) if name != predicted)
    sidebar_widget(at, "selectbox", "Class").set_value(other)
    at.run()
    assert f"Relevance for “{CLASSES[other]}”" in overlay_caption(at)
    assert forwards.call_count == 3
    sidebar_widget(at, "selectbox", "Class").set_value(None)
    at.run()
    sidebar_widget(at, "selectbox", "Class").set_value(other)
    at.run()
    assert not at.exception
    assert forwards.call_count == 3


# -- checkpoints ---------------------------------------------------------------------------------------------------

def test_a_checkpoint_that_fails_to_load_is_reported_and_the_others_still_work(default_world):
    checkpoints, _ = default_world
    (checkpoints / "broken.pt").write_bytes(b"definitely not a checkpoint")
    at = run_app()
    picker = sidebar_widget(at, "selectbox", "Checkpoint")
    assert "broken.pt · cannot be loaded" in picker.options
    picker.set_value(str(checkpoints / "broken.pt"))
    at.run()
    assert not at.exception
    assert len(at.error) == 1 and "broken.pt" in displayed(at.error[0].value)
    sidebar_widget(at, "selectbox", "Checkpoint").set_value(str(checkpoints / DEFAULT_CHECKPOINT))
    at.run()
    assert not at.error and sorted(predicted_labels(at)) == sorted(CLASSES)


def test_completed_runs_are_listed_by_name_and_get_samples_of_the_same_classes(default_world):
    _, runs = default_world
    run = runs / "my-run"
    run.mkdir()
    (run / "status.json").write_text(json.dumps({"state": "completed"}))
    write_checkpoint(run / "best.pt", seed=3)
    at = run_app()
    picker = sidebar_widget(at, "selectbox", "Checkpoint")
    assert any(option.startswith("run my-run · tiny · 3 classes") for option in picker.options)
    picker.set_value(str(run / "best.pt"))
    at.run()
    assert not at.exception and not at.error
    assert sorted(predicted_labels(at)) == sorted(CLASSES)


def test_training_page_hands_over_a_checkpoint_through_session_state(default_world):
    _, runs = default_world
    run = runs / "fresh"
    run.mkdir()
    (run / "status.json").write_text(json.dumps({"state": "completed"}))
    write_checkpoint(run / "best.pt", seed=4)
    write_checkpoint(run / "last.pt", seed=5)
    at = run_app(explorer_checkpoint=str(run / "best.pt"))
    assert sidebar_widget(at, "selectbox", "Checkpoint").value == str(run / "best.pt")
    # A file the catalog does not list (a run's last.pt) is added to the list and opened.
    at.session_state["explorer_checkpoint"] = str(run / "last.pt")
    at.run()
    picker = sidebar_widget(at, "selectbox", "Checkpoint")
    assert picker.value == str(run / "last.pt")
    assert not at.exception and not at.error


def test_switching_checkpoints_resets_model_dependent_settings(default_world):
    checkpoints, _ = default_world
    deeper = ViTConfig(image_size=16, patch_size=8, num_channels=3, num_classes=3, hidden_size=16, num_layers=5,
                       num_heads=4, mlp_size=32)
    write_checkpoint(checkpoints / "deeper.pt", config=deeper)
    at = run_app()
    sidebar_widget(at, "select_slider", "Layer").set_value(1)
    sidebar_widget(at, "selectbox", "Query token").set_value(16)
    at.run()
    sidebar_widget(at, "selectbox", "Checkpoint").set_value(str(checkpoints / "deeper.pt"))
    at.run()
    assert not at.exception and not at.error
    assert sidebar_widget(at, "select_slider", "Layer").value == 5
    assert sidebar_widget(at, "selectbox", "Query token").value == 0
    assert len(sidebar_widget(at, "selectbox", "Query token").options) == 1 + 2 * 2


def test_greyscale_28px_model_takes_a_colour_non_square_upload(dirs, forwards):
    checkpoints, _ = dirs
    mnist = ViTConfig(image_size=28, patch_size=7, num_channels=1, num_classes=10, hidden_size=16, num_layers=1,
                      num_heads=8, mlp_size=32)
    write_checkpoint(checkpoints / "mnist-p7.pt", config=mnist, classes=[str(d) for d in range(10)])
    at = run_app()
    upload(at, "photo.jpg", png_bytes(width=40, height=100, seed=3), mime="image/jpeg")
    assert len(predicted_labels(at)) == 5
    assert any("the model sees it as 28×28 px in 4×4 patches of 7 px" in c.value for c in at.main.caption)
    sidebar_widget(at, "selectbox", "Head", ).set_value(7)
    at.run()
    assert "Layer 1 of 1, head 8" in overlay_caption(at)
    assert forwards.call_count == 1


@pytest.mark.slow
def test_vit_base_with_144_heads_shows_one_layers_heads_by_default(dirs, forwards):
    checkpoints, _ = dirs
    base = ViTConfig.from_preset("vit-base-16")
    write_checkpoint(checkpoints / "vit-base-16.pt", config=base, classes=[f"class {i}" for i in range(1000)])
    at = run_app()
    upload(at, "photo.png", png_bytes(width=300, height=200))
    assert len(predicted_labels(at)) == 5
    assert len(sidebar_widget(at, "selectbox", "Query token").options) == 197
    assert len(head_captions(at)) == 12
    sidebar_widget(at, "selectbox", "Query token").set_value(100)
    sidebar_widget(at, "select_slider", "Layer").set_value(4)
    at.run()
    # Token 100 is patch 99 = 7 * 14 + 1: row 8, column 2 counted from 1.
    assert "Layer 4 of 12" in overlay_caption(at) and "patch row 8, col 2" in overlay_caption(at)
    assert forwards.call_count == 1


def test_the_shipped_default_checkpoint_opens_with_its_samples(monkeypatch, forwards):
    shipped = default_checkpoints_dir() / DEFAULT_CHECKPOINT
    if not shipped.is_file():
        pytest.skip(f"{shipped} is not there yet")
    monkeypatch.delenv("VIT_CHECKPOINTS_DIR", raising=False)
    st.cache_data.clear()
    st.cache_resource.clear()
    at = run_app()
    assert sidebar_widget(at, "selectbox", "Checkpoint").value == str(shipped)
    assert not at.error
    assert len(predicted_labels(at)) == 5
    assert forwards.call_count == 1


# -- the page's view-model functions (vit.explorer) ------------------------------------------------------------------

def hand_analysis() -> explorer.Analysis:
    """Two layers, two heads, a 1x2 patch grid (T = 3 tokens: CLS, left, right), values chosen by hand."""
    from vit.inference import Prediction

    layer0 = torch.tensor([[[0.2, 0.3, 0.5], [0.1, 0.6, 0.3], [0.4, 0.4, 0.2]],
                           [[0.6, 0.1, 0.3], [0.3, 0.3, 0.4], [0.2, 0.2, 0.6]]])  # (H, T, T)
    layer1 = torch.tensor([[[0.5, 0.4, 0.1], [0.2, 0.2, 0.6], [0.3, 0.3, 0.4]],
                           [[0.1, 0.1, 0.8], [0.5, 0.25, 0.25], [0.1, 0.8, 0.1]]])
    attentions = (layer0[None], layer1[None])
    prediction = Prediction(top_k=[("b", 0.7), ("a", 0.3)], probabilities=np.array([0.3, 0.7]),
                            logits=np.array([0.0, 0.85]), attentions=tuple(a[0].numpy() for a in attentions),
                            class_index=1)
    return explorer.Analysis(prediction=prediction, attentions=attentions, grid=(1, 2), patch_size=4, image_size=8,
                             num_prefix_tokens=1, distance=np.zeros((2, 2)), entropy=np.zeros((2, 2)))


def test_one_layer_map_is_the_query_row_without_the_cls_key():
    a = hand_analysis()
    head = explorer.attention_map(a, explorer.MapSettings(layer=0, head=1, query=0))
    np.testing.assert_allclose(head, [[0.1, 0.3]])
    mean = explorer.attention_map(a, explorer.MapSettings(layer=-1, head=None, fusion="mean", query=2))
    np.testing.assert_allclose(mean, [[(0.3 + 0.8) / 2, (0.4 + 0.1) / 2]])
    low = explorer.attention_map(a, explorer.MapSettings(layer=1, fusion="min", query=1))
    np.testing.assert_allclose(low, [[0.2, 0.25]])


def test_rollout_map_multiplies_the_residual_corrected_layers():
    a = hand_analysis()
    eye = torch.eye(3)
    fused = [(layer[0].mean(0) + eye) / 2 for layer in a.attentions]  # rows of (A + I) sum to 2
    expected = (fused[1] @ fused[0])[0, 1:]
    got = explorer.attention_map(a, explorer.MapSettings(kind="rollout", query=0))
    np.testing.assert_allclose(got, expected[None].numpy(), rtol=1e-6)
    first_only = explorer.attention_map(a, explorer.MapSettings(kind="rollout", end_layer=0, query=0))
    np.testing.assert_allclose(first_only, fused[0][0, 1:][None].numpy(), rtol=1e-6)


def test_class_map_needs_the_gradients_of_the_class_it_shows():
    a = hand_analysis()
    gradients = tuple(torch.ones_like(t) for t in a.attentions)
    relevance = explorer.ClassRelevance(1, a.attentions, gradients)
    settings = explorer.MapSettings(kind="class", end_layer=0)  # predicted class 1
    # One layer, gradient 1: R = I + mean_heads(A).
    expected = (torch.eye(3) + a.attentions[0][0].mean(0))[0, 1:]
    np.testing.assert_allclose(explorer.attention_map(a, settings, relevance), expected[None].numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="gradients of class 0"):
        explorer.attention_map(a, explorer.MapSettings(kind="class", class_index=0), relevance)


def test_head_maps_give_every_heads_query_row():
    a = hand_analysis()
    np.testing.assert_allclose(explorer.head_maps(a, query=0, layer=0), [[[0.3, 0.5]], [[0.1, 0.3]]])
    assert explorer.head_maps(a, query=2).shape == (2, 2, 1, 2)


def test_tokens_are_named_by_their_place_in_the_grid():
    grid = (3, 4)
    assert explorer.token_label(0, grid) == "CLS"
    assert explorer.token_label(1, grid) == "patch row 1, col 1"
    assert explorer.token_label(5, grid) == "patch row 2, col 1"
    assert explorer.token_option(12, grid) == "12 · patch row 3, col 4"
    assert (explorer.patch_of(0), explorer.patch_of(6)) == (None, 5)
    with pytest.raises(ValueError):
        explorer.token_label(13, grid)


def test_a_click_on_the_picker_becomes_the_token_of_that_patch():
    assert explorer.token_from_selection({"points": [{}], "point_indices": [5]}) == 6
    assert explorer.token_from_selection({"point_indices": [2, 7]}, num_prefix_tokens=2) == 9
    assert explorer.token_from_selection({"points": [], "point_indices": []}) is None
    assert explorer.token_from_selection(None) is None


def test_patch_picker_puts_patch_i_at_the_centre_of_its_cell_and_outlines_the_query():
    fig = explorer.patch_picker_figure((300, 100), "data:image/png;base64,AAAA", grid=(2, 3), query=5)
    points = fig.data[0]
    np.testing.assert_allclose(points.x, [50, 150, 250, 50, 150, 250])
    np.testing.assert_allclose(points.y, [25, 25, 25, 75, 75, 75])
    assert points.text[4] == "5 · patch row 2, col 2"
    outline = [s for s in fig.layout.shapes if s.type == "rect"]
    assert [(s.x0, s.x1, s.y0, s.y1) for s in outline] == [(100, 200, 50, 100)]
    [grid] = [s for s in fig.layout.shapes if s.type == "path"]
    assert grid.path == "M100.00,0L100.00,100M200.00,0L200.00,100M0,50.00L300,50.00"
    assert fig.layout.images[0].source == "data:image/png;base64,AAAA"
    assert fig.layout.yaxis.range == (100, 0) and fig.layout.hoverdistance == -1
    cls_fig = explorer.patch_picker_figure((300, 100), "x", grid=(2, 3), query=0, show_grid=False)
    assert not cls_fig.layout.shapes


def test_png_data_uri_round_trips():
    image = Image.new("RGB", (3, 2), (10, 20, 30))
    uri = explorer.png_data_uri(image)
    assert uri.startswith("data:image/png;base64,")
    decoded = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))
    assert decoded.size == (3, 2) and decoded.getpixel((0, 0)) == (10, 20, 30)


@pytest.mark.parametrize(("size", "shown"), [((32, 32), (320, 320)), ((28, 28), (336, 336)), ((30, 10), (330, 110)),
                                             ((500, 400), (500, 400)), ((4000, 3000), (640, 480))])
def test_display_size_enlarges_small_images_by_a_whole_factor_and_shrinks_large_ones(size, shown):
    assert explorer.display_size(size) == shown
    assert explorer.display_image(Image.new("L", size)).size == shown


def test_captions_say_what_the_map_is():
    a = hand_analysis()
    cls_last = explorer.describe_map(explorer.MapSettings(), a, ["a", "b"])
    assert "Layer 2 of 2, the mean over its 2 heads" in cls_last and "classifier reads the CLS token" in cls_last
    patch = explorer.describe_map(explorer.MapSettings(layer=0, head=0, query=2), a, ["a", "b"])
    assert "Layer 1 of 2, head 1" in patch and "patch row 1, col 2 (outlined)" in patch
    roll = explorer.describe_map(explorer.MapSettings(kind="rollout", discard_ratio=0.9, fusion="max"), a, ["a", "b"])
    assert "rollout through layers 1–2" in roll and "max" in roll and "lowest 90%" in roll
    cls = explorer.describe_map(explorer.MapSettings(kind="class"), a, ["a", "b"])
    assert "“b”" in cls and "predicted class" in cls
    assert explorer.describe_range(np.array([[0.001, 0.5]])) == "Colours span 0.001 (dark) to 0.5 (bright) on this map."


def test_npz_download_holds_every_layer_and_the_context():
    a = hand_analysis()
    archive = np.load(io.BytesIO(explorer.attentions_npz(a, ["a", "b"])))
    assert archive["layer_0"].shape == (2, 3, 3) and archive["layer_1"].shape == (2, 3, 3)
    np.testing.assert_allclose(archive["layer_1"], a.attentions[1][0].numpy())
    assert list(archive["class_names"]) == ["a", "b"] and list(archive["grid"]) == [1, 2]
    np.testing.assert_allclose(archive["probabilities"], [0.3, 0.7])


def test_overlay_png_is_at_the_images_own_size():
    png = explorer.overlay_png(Image.new("RGB", (90, 30)), np.array([[0.0, 1.0]]), 0.5, "inferno", "nearest",
                               show_grid=True, outline_patch=1)
    assert Image.open(io.BytesIO(png)).size == (90, 30)


def test_analyse_runs_the_model_once_and_keeps_every_layer(tmp_path, forwards):
    from vit.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(write_checkpoint(tmp_path / "t.pt"))
    image = Image.open(io.BytesIO(png_bytes(40, 20)))
    a = explorer.analyse(checkpoint, image)
    assert forwards.call_count == 1
    assert (a.num_layers, a.num_heads, a.num_tokens, a.grid) == (3, 2, 17, (4, 4))
    assert a.distance.shape == a.entropy.shape == (3, 2)
    assert len(a.prediction.top_k) == 3 and explorer.model_input_image(image, checkpoint).size == (16, 16)
    relevance = explorer.class_relevance(checkpoint, image, 2)
    assert relevance.class_index == 2 and len(relevance.gradients) == 3
    for ours, forward in zip(relevance.attentions, a.attentions, strict=True):
        torch.testing.assert_close(ours, forward)


def test_attention_matrix_rows_are_queries_and_ticks_mark_cls_and_grid_rows():
    matrix = np.arange(17 * 17, dtype=float).reshape(17, 17)
    fig = explorer.attention_matrix_figure(matrix, (4, 4), query=6)
    assert list(fig.layout.xaxis.tickvals) == [0, 5, 9, 13] and fig.layout.xaxis.ticktext[0] == "CLS"
    assert fig.layout.yaxis.autorange == "reversed"  # query 0 (CLS) on top, like the matrix is written
    [row] = fig.layout.shapes
    assert (row.y0, row.y1, row.x0, row.x1) == (5.5, 6.5, -0.5, 16.5)


# -- user-provided text is shown as written ----------------------------------------------------------------------

HOSTILE_CLASSES = ["![x](http://example.invalid/x.png)", "<b>x</b>", "[click](http://example.invalid)"]


def markdown_bodies(at: AppTest) -> list[str]:
    """Every element body Streamlit renders as Markdown."""
    return [e.value for kind in ("markdown", "caption", "error", "warning", "info", "success") for e in at.get(kind)]


def test_class_names_dataset_and_file_names_are_shown_as_plain_text(dirs):
    from markdown_it import MarkdownIt

    checkpoints, _ = dirs
    write_checkpoint(checkpoints / DEFAULT_CHECKPOINT, classes=HOSTILE_CLASSES, dataset="cifar <i>10</i>")
    at = run_app()
    upload(at, "![y](http://example.invalid/y.png).png", png_bytes())
    at.radio(key="map_kind").set_value("class").run()  # its caption names the class
    assert not at.exception
    bodies = markdown_bodies(at)
    for body in bodies:
        rendered = MarkdownIt("commonmark").render(body)
        assert "<img" not in rendered and "<a " not in rendered, body
        assert "<b>" not in rendered and "<i>" not in rendered, body
    shown = "\n".join(displayed(body) for body in bodies)
    for name in HOSTILE_CLASSES:
        assert name in shown  # in the checkpoint's description, literally
    assert "cifar <i>10</i>" in shown
    assert "![y](http://example.invalid/y.png).png, 24×16 px" in shown
    # Plotly reads <b>, <a href> and <br> in labels: the bars carry the names with < and & escaped.
    labels = predicted_labels(at)
    assert "&lt;b&gt;x&lt;/b&gt;" in labels and not any("<" in label for label in labels)


def test_page_loads_describe_each_checkpoint_file_once(default_world):
    checkpoints, _ = default_world
    write_checkpoint(checkpoints / "another.pt", seed=1)
    from vit import catalog

    with mock.patch.object(catalog, "describe", autospec=True, side_effect=catalog.describe) as described:
        run_app()
        run_app()  # a second visitor, or a reload
    assert described.call_count == 2, "each file is read once, then described from the cache by its fingerprint"


def test_on_a_network_no_server_path_can_be_opened(default_world, tmp_path):
    from streamlit import config

    other = write_checkpoint(tmp_path / "elsewhere" / "secret.pt", seed=3)
    before = config.get_option("server.address")
    config.set_option("server.address", "0.0.0.0")
    try:
        at = run_app()
        sidebar_widget(at, "text_input", "Open a path").set_value(str(other))
        at.run()
    finally:
        config.set_option("server.address", before)
    assert not at.exception
    picker = sidebar_widget(at, "selectbox", "Checkpoint")
    assert picker.value != str(other) and not any("secret" in option for option in picker.options)
    assert not at.error  # nothing was read, so nothing says whether the path exists


@pytest.mark.parametrize("kind", ["class", "legrad", "lrp", "attnlrp"])
def test_captions_show_a_class_name_as_written(kind):
    a = hand_analysis()
    names = ["a", "![x](http://example.invalid/x.png) <b>b</b>"]
    describe = explorer.describe_map if kind == "class" else explorer.describe_method_map
    caption = describe(explorer.MapSettings(kind=kind), a, names)
    rendered = MarkdownIt("commonmark").render(caption)
    assert "<img" not in rendered and "<b>" not in rendered
    assert f"“{names[1]}”" in displayed(caption)
