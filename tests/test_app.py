"""The app driven through Streamlit's AppTest: checkpoints, uploads, settings, caching and errors.

Each test points the app at its own checkpoints and runs folders (VIT_CHECKPOINTS_DIR,
VIT_RUNS_DIR) holding tiny random models, and counts passes through the model (``ViT.embed``, where
every pass starts: ``forward`` and the explorer's layer-by-layer walk alike) to check that only a
new checkpoint, image or class runs the model.
"""

import base64
import io
import json
import os
import re
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

from vit.app import drawing
from vit.app import explorer_page as explorer
from vit.checkpoint import save_checkpoint
from vit.core.images import ImageError
from vit.core.inference import preprocess
from vit.core.runfiles import DEFAULT_CHECKPOINT, default_checkpoints_dir
from vit.costs import fits
from vit.costs.bounds import TooManyTokens
from vit.explain.views import attention_maps, image_analysis, map_captions, method_maps
from vit.explain.views.map_captions import token_label
from vit.explain.views.overlay import display_image, display_size, jpeg_data_uri
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
    monkeypatch.setenv("VIT_DATA_ROOTS", str(tmp_path))  # the Analyse page reads image folders from here only
    monkeypatch.delenv("VIT_TRAIN_TOKEN", raising=False)  # a developer's token would lock what reads by path
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
    """Counts passes through the model: ViT.embed calls, which every pass starts with (the real one still runs)."""
    original = ViT.embed
    with mock.patch.object(ViT, "embed", autospec=True, side_effect=original) as counted:
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
    """The labels of the clickable head thumbnails in the Heads tab ('layer 3, head 1', …)."""
    grids = [json.loads(chart.proto.spec) for chart in at.tabs[0].get("plotly_chart")]
    return [text for fig in grids for trace in fig["data"] for text in trace.get("text", [])]


def open_by_path(at: AppTest, folder: Path) -> AppTest:
    """Type ``folder`` into the sidebar's "Open a path", upload a photo, and check that the model it names is shown."""
    sidebar_widget(at, "text_input", "Open a path").set_value(str(folder))
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    upload(at, "photo.png", png_bytes(40, 30))
    assert sidebar_widget(at, "selectbox", "Checkpoint").value == str(folder)
    return at


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
    data = (default_world[0] / "samples" / Path(DEFAULT_CHECKPOINT).stem / "cat_1.png").read_bytes()
    upload(at, "same-pixels.png", data)  # identical bytes: the cached forward pass is reused
    assert forwards.call_count == 1


@pytest.mark.parametrize(("name", "data", "message"), [
    ("notes.png", b"this is not an image", "not an image"),
    ("empty.png", b"", "empty"),
    ("cut.png", png_bytes(64, 64)[:200], "truncated or corrupt"),
    ("bomb.png", (10_000, 10_000), "too large to decode safely"),
    # Under PIL's limit (89 M pixels) but over the app's for uploads: one such PNG is 126 MB decoded in RGB.
    ("poster.png", (7_000, 6_000), "poster.png is too large (7,000×6,000 px; at most 40,000,000 pixels)"),
    # 197 bytes that cost +550 MB per upload once resized to a 256-px short side; and Plotly cannot draw 1 px.
    ("line.png", (40_000, 1), "line.png is 40,000×1 px, more than 64 times as long as it is wide"),
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


def test_a_checkpoint_with_nan_weights_says_so_in_one_line_instead_of_nan_probabilities(dirs):
    """Issue 20, item 9: NaN weights gave NaN probabilities, shown silently as a prediction."""
    checkpoints, _ = dirs
    torch.manual_seed(0)
    model = ViT(TINY)
    with torch.no_grad():
        model.head.bias[1] = float("nan")
    save_checkpoint(checkpoints / DEFAULT_CHECKPOINT, model, CLASSES)
    at = run_app()
    upload(at, "photo.png", png_bytes())
    assert [displayed(e.value) for e in at.error] == [
        "the model's output is not finite: its weights hold NaN or infinite values (1 tensor, e.g. head.bias), as "
        "after a training run that diverged; use another checkpoint"]
    # The map settings and the image, drawn before the model ran (the browser lays them out meanwhile); no
    # prediction chart, no maps.
    assert [chart.key for chart in at.get("plotly_chart")] == ["patch_picker"]
    assert [w.label for w in at.sidebar.select_slider] == ["Layer"] and at.sidebar.slider[0].label == "Opacity"


# -- settings only redraw ------------------------------------------------------------------------------------------

def test_layer_head_query_fusion_rollout_and_overlay_changes_never_rerun_the_model(default_world, forwards):
    at = run_app()
    assert forwards.call_count == 1
    steps = [
        ("select_slider", "Layer", 1, "Layer 1 of 3"),
        ("selectbox", "Head", 1, "head 2"),
        ("selectbox", "Query token", 6, "patch row 2, col 2"),
        ("selectbox", "Head", -1, "the mean over its 2 heads"),
        ("radio", "Head fusion", "max", "the max over its 2 heads"),
    ]
    for kind, label, value, expected in steps:
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
    assert head_captions(at) == ["layer 3, head 1", "layer 3, head 2"]
    at.toggle(key="every_layer").set_value(True)
    at.run()
    assert head_captions(at) == [f"layer {layer}, head {head}" for layer in (1, 2, 3) for head in (1, 2)]
    at.session_state["analysis_tab"] = "Attention matrix"
    at.run()
    heatmaps = [t for fig in charts(at) for t in fig["data"]
                if t["type"] == "heatmap" and "query" in t["hovertemplate"]]
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
    sidebar_widget(at, "selectbox", "Class").set_value(-1)
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
    assert any("the model sees it as 28×28 px in 4 rows × 4 columns of 7-px patches" in c.value
               for c in at.main.caption)
    sidebar_widget(at, "selectbox", "Head", ).set_value(7)
    at.run()
    assert "Layer 1 of 1, head 8" in overlay_caption(at)
    assert forwards.call_count == 1


@pytest.mark.slow  # still ~1.6 s of CPU: the page draws 12 heads' maps at 197 tokens
def test_vit_base_with_144_heads_shows_one_layers_heads_by_default(dirs, forwards):
    checkpoints, _ = dirs
    # ViT-Base's layout (224 px, 16-px patches, 12 layers x 12 heads, 1000 classes) at a hidden size of 24, not 768:
    # what the page shows depends on the heads, layers and tokens, and the real width wrote ~350 MB for it.
    base = ViTConfig.from_preset("vit-base-16", hidden_size=24, mlp_size=48)
    assert (base.image_size, base.patch_size, base.num_layers, base.num_heads) == (224, 16, 12, 12)
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

def hand_analysis() -> image_analysis.Analysis:
    """Two layers, two heads, a 1x2 patch grid (T = 3 tokens: CLS, left, right), values chosen by hand."""
    from vit.core.inference import Prediction

    layer0 = torch.tensor([[[0.2, 0.3, 0.5], [0.1, 0.6, 0.3], [0.4, 0.4, 0.2]],
                           [[0.6, 0.1, 0.3], [0.3, 0.3, 0.4], [0.2, 0.2, 0.6]]])  # (H, T, T)
    layer1 = torch.tensor([[[0.5, 0.4, 0.1], [0.2, 0.2, 0.6], [0.3, 0.3, 0.4]],
                           [[0.1, 0.1, 0.8], [0.5, 0.25, 0.25], [0.1, 0.8, 0.1]]])
    attentions = (layer0[None], layer1[None])
    prediction = Prediction(top_k=[("b", 0.7), ("a", 0.3)], probabilities=np.array([0.3, 0.7]),
                            logits=np.array([0.0, 0.85]), attentions=tuple(a[0].numpy() for a in attentions),
                            class_index=1)
    return image_analysis.Analysis(prediction=prediction, attentions=attentions, grid=(1, 2), patch_size=4,
                                   input_size=(4, 8), num_prefix_tokens=1)


def test_a_class_maps_download_is_named_after_the_class_not_its_index():
    a = hand_analysis()
    legrad = attention_maps.MapSettings(kind="legrad", class_index=1)
    assert drawing.map_file_name("photo", legrad, a, class_names=["cat", "golden retriever"]) \
        == "photo-legrad-golden_retriever-overlay.png"
    assert drawing.map_file_name("photo", legrad, a, class_names=["cat", "tench, Tinca/tinca"]) \
        == "photo-legrad-tench_Tinca_tinca-overlay.png"
    assert drawing.map_file_name("photo", legrad, a) == "photo-legrad-class1-overlay.png"  # no names: the index
    assert drawing.map_file_name("photo", legrad, a, class_names=["cat", "???"]) == "photo-legrad-class1-overlay.png"


def test_the_npz_popovers_layer_names_the_array_the_file_holds():
    a = hand_analysis()
    with np.load(io.BytesIO(attention_maps.attentions_npz(a, ["a", "b"], [2 - 1]))) as f:  # the page's layer 2
        [key] = [k for k in f.files if k.startswith("layer_")]
    assert drawing.npz_layer_label(2) == f"layer 2 only ({key} in the file)"


def test_one_layer_map_is_the_query_row_without_the_cls_key():
    a = hand_analysis()
    head = attention_maps.attention_map(a, attention_maps.MapSettings(layer=0, head=1, query=0))
    np.testing.assert_allclose(head, [[0.1, 0.3]])
    mean = attention_maps.attention_map(a, attention_maps.MapSettings(layer=-1, head=None, fusion="mean", query=2))
    np.testing.assert_allclose(mean, [[(0.3 + 0.8) / 2, (0.4 + 0.1) / 2]])
    low = attention_maps.attention_map(a, attention_maps.MapSettings(layer=1, fusion="min", query=1))
    np.testing.assert_allclose(low, [[0.2, 0.25]])


def test_rollout_map_multiplies_the_residual_corrected_layers():
    a = hand_analysis()
    eye = torch.eye(3)
    fused = [(layer[0].mean(0) + eye) / 2 for layer in a.attentions]  # rows of (A + I) sum to 2
    expected = (fused[1] @ fused[0])[0, 1:]
    got = attention_maps.attention_map(a, attention_maps.MapSettings(kind="rollout", query=0))
    np.testing.assert_allclose(got, expected[None].numpy(), rtol=1e-6)
    first_only = attention_maps.attention_map(a, attention_maps.MapSettings(kind="rollout", end_layer=0, query=0))
    np.testing.assert_allclose(first_only, fused[0][0, 1:][None].numpy(), rtol=1e-6)


def test_class_map_needs_the_gradients_of_the_class_it_shows():
    a = hand_analysis()
    relevance = attention_maps.ClassRelevance(1, tuple(t.mean(dim=1) for t in a.attentions))  # gradient 1 everywhere
    settings = attention_maps.MapSettings(kind="class", end_layer=0)  # predicted class 1
    # One layer, gradient 1: R = I + mean_heads(A).
    expected = (torch.eye(3) + a.attentions[0][0].mean(0))[0, 1:]
    np.testing.assert_allclose(attention_maps.attention_map(a, settings, relevance), expected[None].numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="gradients of class 0"):
        attention_maps.attention_map(a, attention_maps.MapSettings(kind="class", class_index=0), relevance)


def test_head_maps_give_every_heads_query_row():
    a = hand_analysis()
    np.testing.assert_allclose(attention_maps.head_maps(a, query=0, layer=0), [[[0.3, 0.5]], [[0.1, 0.3]]])
    assert attention_maps.head_maps(a, query=2).shape == (2, 2, 1, 2)


def test_tokens_are_named_by_their_place_in_the_grid():
    grid = (3, 4)
    assert token_label(0, grid) == "CLS"
    assert token_label(1, grid) == "patch row 1, col 1"
    assert token_label(5, grid) == "patch row 2, col 1"
    assert drawing.token_option(12, grid) == "12 · patch row 3, col 4"
    assert (explorer.patch_of(0), explorer.patch_of(6)) == (None, 5)
    with pytest.raises(ValueError):
        token_label(13, grid)


def test_a_click_on_the_picker_becomes_the_token_of_that_patch():
    assert drawing.token_from_selection({"points": [{}], "point_indices": [5]}) == 6
    assert drawing.token_from_selection({"point_indices": [2, 7]}, num_prefix_tokens=2) == 9
    assert drawing.token_from_selection({"points": [], "point_indices": []}) is None
    assert drawing.token_from_selection(None) is None


def test_patch_picker_puts_patch_i_at_the_centre_of_its_cell_and_outlines_the_query():
    fig = drawing.patch_picker_figure((300, 100), "data:image/png;base64,AAAA", grid=(2, 3), query=5)
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
    cls_fig = drawing.patch_picker_figure((300, 100), "x", grid=(2, 3), query=0, show_grid=False)
    assert not cls_fig.layout.shapes


def test_each_explorer_section_keeps_only_its_own_settings():
    """Issue 35: the page writes back what each section names (its widgets' keys); no key is named by two sections,
    so a section's settings are changed in one place. The sections are found, not listed: one that names its settings
    (``KEPT``) and is not in the page's ``keep_settings`` call would lose them in a run that does not draw it."""
    import ast
    import importlib
    import pkgutil

    import app_pages.explorer_sections as package

    modules = (importlib.import_module(f"{package.__name__}.{m.name}") for m in pkgutil.iter_modules(package.__path__))
    sections = {m.__name__.rsplit(".", 1)[-1]: m.KEPT for m in modules if hasattr(m, "KEPT")}
    assert {"image_picker", "map_settings", "dense_features"} <= set(sections)  # found where they are
    for name, kept in sections.items():
        for other, other_kept in sections.items():
            clashes = [(a, b) for a in kept for b in other_kept if other != name and a.startswith(b)]
            assert not clashes, f"{name} and {other} both keep {clashes}"
    page = ast.parse((Path(APP).parent / "app_pages" / "explorer.py").read_text())
    aliases = {alias.asname: node.module.rsplit(".", 1)[-1] for node in page.body if isinstance(node, ast.ImportFrom)
               for alias in node.names if alias.name == "KEPT" and alias.asname}  # from ... import KEPT as X_KEPT
    call = next(node for node in ast.walk(page) if isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "keep_settings")
    written_back = {node.value.id for node in ast.walk(call.args[0]) if isinstance(node, ast.Attribute)
                    and node.attr == "KEPT"} | {aliases[node.id] for node in ast.walk(call.args[0])
                                                if isinstance(node, ast.Name) and node.id in aliases}
    assert set(sections) <= written_back, f"not written back by the page: {set(sections) - written_back}"


def test_the_linked_pickers_zoom_the_image_and_the_overlay_together():
    """Issue 33, item 6: one figure, the overlay on axes that match the image's, so a zoom or pan of either is the
    other's; each side's point i is patch i, outlined on both."""
    image = drawing.patch_picker_figure((300, 100), "image-uri", grid=(2, 3), query=5, zoomable=True)
    drawn = drawing.patch_picker_figure((300, 100), "overlay-uri", grid=(2, 3), query=5, show_grid=False,
                                        zoomable=True)
    fig = drawing.linked_pickers_figure(image, drawn)
    assert fig.layout.xaxis2.matches == "x" and fig.layout.yaxis2.matches == "y"
    assert [(i.source, i.xref, i.yref) for i in fig.layout.images] == [("image-uri", "x", "y"),
                                                                       ("overlay-uri", "x2", "y2")]
    left, right = fig.data
    assert (left.xaxis or "x", right.xaxis, right.yaxis) == ("x", "x2", "y2")
    np.testing.assert_allclose(right.x, left.x)
    np.testing.assert_allclose(right.y, left.y)
    outlines = [(s.xref or "x", s.x0, s.y0) for s in fig.layout.shapes if s.type == "rect"]
    assert outlines == [("x", 100, 50), ("x2", 100, 50)]
    assert fig.layout.xaxis.domain[1] < fig.layout.xaxis2.domain[0]  # side by side, not overlapping


def test_jpeg_data_uri_round_trips_in_rgb():
    image = Image.new("L", (3, 2), 200)  # greyscale in: the picker's layout image is always RGB
    uri = jpeg_data_uri(image)
    assert uri.startswith("data:image/jpeg;base64,")
    decoded = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))
    assert decoded.size == (3, 2) and decoded.mode == "RGB"
    assert all(abs(c - 200) <= 2 for c in decoded.getpixel((0, 0)))  # JPEG is lossy, a flat image nearly exact


@pytest.mark.parametrize(("size", "shown"), [((32, 32), (320, 320)), ((28, 28), (336, 336)), ((30, 10), (330, 110)),
                                             ((500, 400), (500, 400)), ((4000, 3000), (640, 480))])
def test_display_size_enlarges_small_images_by_a_whole_factor_and_shrinks_large_ones(size, shown):
    assert display_size(size) == shown
    assert display_image(Image.new("L", size)).size == shown


def test_display_images_are_the_picker_image_its_jpeg_and_the_heads_grid_thumbnail():
    shown, uri, small = drawing.display_images(Image.new("RGB", (4000, 3000), (10, 20, 30)))
    assert shown.size == (480, 360) and small.size == (112, 84)
    assert uri.startswith("data:image/jpeg;base64,")
    assert Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).size == shown.size


def test_captions_say_what_the_map_is():
    a = hand_analysis()
    cls_last = map_captions.describe_map(attention_maps.MapSettings(), a, ["a", "b"])
    assert "Layer 2 of 2, the mean over its 2 heads" in cls_last and "classifier reads the CLS token" in cls_last
    patch = map_captions.describe_map(attention_maps.MapSettings(layer=0, head=0, query=2), a, ["a", "b"])
    assert "Layer 1 of 2, head 1" in patch and "patch row 1, col 2 (outlined)" in patch
    rollout = attention_maps.MapSettings(kind="rollout", discard_ratio=0.9, fusion="max")
    roll = map_captions.describe_map(rollout, a, ["a", "b"])
    assert "rollout through layers 1–2" in roll and "max" in roll and "lowest 90%" in roll
    cls = map_captions.describe_map(attention_maps.MapSettings(kind="class"), a, ["a", "b"])
    assert "“b”" in cls and "predicted class" in cls
    assert drawing.describe_range(np.array([[0.001, 0.5]])) == "Colours span 0.001 (dark) to 0.5 (bright) on this map."


def test_npz_download_holds_every_layer_and_the_context():
    a = hand_analysis()
    archive = np.load(io.BytesIO(attention_maps.attentions_npz(a, ["a", "b"])))
    assert archive["layer_0"].shape == (2, 3, 3) and archive["layer_1"].shape == (2, 3, 3)
    np.testing.assert_allclose(archive["layer_1"], a.attentions[1][0].numpy())
    assert list(archive["class_names"]) == ["a", "b"] and list(archive["grid"]) == [1, 2]
    np.testing.assert_allclose(archive["probabilities"], [0.3, 0.7])


def test_overlay_png_is_at_the_images_own_size():
    png = drawing.overlay_png(Image.new("RGB", (90, 30)), np.array([[0.0, 1.0]]), 0.5, "inferno", "nearest",
                               show_grid=True, outline_patch=1)
    assert Image.open(io.BytesIO(png)).size == (90, 30)


def test_analyse_runs_the_model_once_and_keeps_every_layer(tmp_path, forwards):
    from vit.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(write_checkpoint(tmp_path / "t.pt"))
    image = Image.open(io.BytesIO(png_bytes(40, 20)))
    a = image_analysis.analyse(checkpoint, image)
    assert forwards.call_count == 1
    assert (a.num_layers, a.num_heads, a.num_tokens, a.grid) == (3, 2, 17, (4, 4))
    assert a.distance.shape == a.entropy.shape == (3, 2)
    assert len(a.prediction.top_k) == 3 and drawing.model_input_image(image, checkpoint).size == (16, 16)
    relevance = method_maps.class_relevance(checkpoint, image, 2)
    assert relevance.class_index == 2 and len(relevance.terms) == 3
    # Every layer computed from the stored hidden states equals the model's own output_attentions.
    with torch.inference_mode():
        _, expected = checkpoint.model(preprocess([image], checkpoint.preprocessing), output_attentions=True)
    for ours, theirs in zip(a.attentions, expected, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_attention_matrix_rows_are_queries_and_ticks_mark_cls_and_grid_rows():
    matrix = np.arange(17 * 17, dtype=float).reshape(17, 17)
    fig = drawing.attention_matrix_figure(matrix, (4, 4), query=6)
    # 4x4 grid after CLS: rows start at tokens 1, 5, 9, 13; token 1 sits next to CLS and gets no tick.
    assert list(fig.layout.xaxis.tickvals) == ["0 · CLS", "5 · r2 c1", "9 · r3 c1", "13 · r4 c1"]
    assert list(fig.layout.xaxis.ticktext) == ["CLS", "5", "9", "13"]
    assert fig.layout.yaxis.autorange == "reversed"  # query 0 (CLS) on top, like the matrix is written
    [row] = fig.layout.shapes
    assert (row.y0, row.y1, row.x0, row.x1) == (5.5, 6.5, -0.5, 16.5)


# -- input sizes, memory bounds and the rough edges of issue 10 ------------------------------------------------------

def figure_with(at: AppTest, key: str) -> dict:
    """The Plotly figure of the chart with widget key ``key`` (its proto id ends with the key)."""
    matches = [json.loads(c.proto.spec) for c in at.get("plotly_chart") if c.proto.id.endswith(key)]
    assert len(matches) == 1, f"expected one chart with key {key!r}"
    return matches[0]


def test_keep_aspect_input_size_gives_a_non_square_grid_everywhere(default_world, forwards):
    at = run_app()
    upload(at, "wide.png", png_bytes(width=24, height=16, seed=4))
    sidebar_widget(at, "selectbox", "Input size").set_value(32)
    sidebar_widget(at, "checkbox", "Keep the aspect ratio (long side at that size)").check()
    at.run()
    assert not at.exception and not at.error
    # 24 x 16 px with the long side at 32 px: 32 x 21.3 -> 32 x 20 px, 5 rows and 8 columns of 4-px patches: pixels
    # width × height, patches rows × columns, each labelled (they were '32×20 px in 5×8 patches').
    assert any("sees it as 32×20 px in 5 rows × 8 columns of 4-px patches (41 tokens), not its training size of "
               "16×16 px"
               in c.value for c in at.main.caption)
    assert any("not the 16×16 px the model was trained at" in c.value for c in at.main.caption)
    assert len(sidebar_widget(at, "selectbox", "Query token").options) == 41
    sidebar_widget(at, "selectbox", "Query token").set_value(40)  # the last patch: row 5, col 8
    at.run()
    assert "patch row 5, col 8" in overlay_caption(at)
    for kind in ("rollout", "class", "norms"):
        sidebar_widget(at, "radio", "Map").set_value(kind)
        at.run()
        assert not at.exception and not at.error, kind
    at.session_state["analysis_tab"] = "Attention matrix"
    at.run()
    heatmaps = [t for fig in charts(at) for t in fig["data"]
                if t["type"] == "heatmap" and "query" in t["hovertemplate"]]
    assert array_shape(heatmaps[0]["z"]) == (41, 41)
    at.session_state["analysis_tab"] = "Distance & entropy"
    at.run()
    assert not at.exception and not at.error


def test_an_input_over_the_token_limit_is_refused_with_one_line_and_settings_kept(default_world, monkeypatch):
    monkeypatch.setenv("VIT_MAX_TOKENS", "40")
    at = run_app()
    sidebar_widget(at, "slider", "Opacity").set_value(0.3)
    sidebar_widget(at, "selectbox", "Input size").set_value(32)  # 8 x 8 patches (+ CLS, not counted)
    at.run()
    assert len(at.error) == 1 and "64 patches" in at.error[0].value and "at most 40" in at.error[0].value
    sidebar_widget(at, "selectbox", "Input size").set_value(0)
    at.run()
    assert not at.error and sidebar_widget(at, "slider", "Opacity").value == 0.3


def test_the_file_watcher_is_off_so_an_idle_app_does_not_watch_venv_runs_or_data():
    # Issue 10, rough edge 1: the effective config streamlit reads from the repository's .streamlit/.
    root = Path(APP).parent
    code = ("from streamlit import config; config.get_config_options(); "
            "print(config.get_option('server.fileWatcherType'))")
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "none", done.stderr

def test_a_page_waiting_for_an_upload_does_the_figures_one_time_work_meanwhile(dirs, monkeypatch):
    # Issue 51: a model without sample images stops the page until an upload; the first upload then finds Plotly's
    # and PIL's one-time work done (what warm_up covers is checked in the next test).
    checkpoints, _ = dirs
    write_checkpoint(checkpoints / "lonely.pt")
    warm_up = mock.Mock()
    monkeypatch.setattr(drawing, "warm_up", warm_up)
    at = run_app()
    assert "Upload an image" in at.info[0].value and not at.exception
    warm_up.assert_called_once_with()


# The first upload's path in a fresh interpreter, as it is and after warm_up: the interpreter imports what the page
# has imported before an upload and builds the model, then forks once for each (one interpreter start for the two,
# not two: issue 112); each child prints, on its line, the modules that path imported.
FIRST_UPLOAD = """
import io, os, sys, traceback
import numpy as np, plotly.io
from PIL import Image
from vit.app import drawing
from vit.explain.views import attention_maps, image_analysis
from vit.checkpoint import Checkpoint, Preprocessing
from vit.explain.views.overlay import jpeg_data_uri, overlay
from vit.core.images import open_image
from vit.core.inference import TRAINING_SIZE
from vit.model import ViT, ViTConfig

config = ViTConfig(image_size=16, patch_size=4, num_channels=3, num_classes=3, hidden_size=16, num_layers=2,
                   num_heads=2, mlp_size=32)
checkpoint = Checkpoint(model=ViT(config).eval(), class_names=["a", "b", "c"],
                        preprocessing=Preprocessing.default_for(config))
pixels = np.arange(16 * 24 * 3, dtype=np.uint8).reshape(16, 24, 3)


def first_upload():
    before = set(sys.modules)
    png = io.BytesIO()
    Image.fromarray(pixels).save(png, format="PNG")
    image = open_image(png.getvalue(), name="upload.png")
    analysis = image_analysis.analyse(checkpoint, image, TRAINING_SIZE)
    shown, shown_uri, small = drawing.display_images(image)
    map2d = attention_maps.attention_map(analysis, attention_maps.MapSettings())
    drawn = overlay(shown, map2d, 0.6, "magma", "nearest", outline_patch=0)
    cells = drawing.small_multiples(small, attention_maps.head_maps(analysis, 0)[1], 0.6, "magma", "nearest", 0)
    sheet = drawing.heads_grid_image(cells, columns=2)
    for figure in (drawing.patch_picker_figure(shown.size, shown_uri, analysis.grid, 0),
                   drawing.patch_picker_figure(shown.size, jpeg_data_uri(drawn), analysis.grid, 0, show_grid=False),
                   drawing.predictions_figure(analysis.prediction),
                   drawing.heads_grid_figure(jpeg_data_uri(sheet, quality=85), sheet.size, [1], 2, (1, 0))):
        plotly.io.to_json(figure, validate=False)
    drawing.colorbar_html(*drawing.map_range(map2d, None, None), "magma")
    return " ".join(sorted(set(sys.modules) - before))


for warm in ("cold", "warm"):
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # this interpreter as it is now, the upload its first
        try:
            os.close(read)
            if warm == "warm":
                drawing.warm_up()
            with os.fdopen(write, "w") as out:
                out.write(first_upload())
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as got:
        print(warm, got.read())
    if os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) != 0:
        sys.exit(f"the {warm} upload failed")
"""


def test_after_the_warm_up_the_first_upload_imports_nothing_more():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FIRST_UPLOAD], cwd=Path(APP).parent, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    cold, warm = (line.split() for line in done.stdout.splitlines())
    assert cold[0] == "cold" and warm[0] == "warm", done.stdout
    assert "_plotly_utils.basevalidators" in cold[1:]  # without it, the first upload imports Plotly's validators
    assert warm[1:] == []


def settled_upload_script():
    """An AppTest script: ``settled_upload`` of the session state's "value" (a file or None) with a 0.3 s wait;
    what it returned in "got", how long it took in "waited"."""
    import time

    import streamlit as st

    from app_pages.explorer_sections.uploader import settled_upload

    start = time.monotonic()
    st.session_state["got"] = settled_upload(st.session_state.get("value"), "value", seconds=0.3)
    st.session_state["ended"] = time.monotonic()
    st.session_state["waited"] = st.session_state["ended"] - start


def test_a_run_that_finds_an_upload_gone_waits_once_for_a_replacing_file():
    # Issue 51: Streamlit's uploader asks for a run without any file before the one with a replacing file; such a
    # run waits at a yield point for that request (the browser test sees the page never empty in between). Here no
    # request comes: the run waits its time once, then goes on with no file, and a run without a file before it
    # does not wait. ``settled_upload`` alone is what a fragment's rerun (the Patching tab's uploader) passes.
    at = AppTest.from_function(settled_upload_script, default_timeout=TIMEOUT)
    for value, waits in (("a file", False), (None, True), (None, False), ("another", False), ("a third", False)):
        at.session_state["value"] = value
        at.run()
        assert not at.exception and at.session_state["got"] == value
        assert (at.session_state["waited"] >= 0.3) == waits, (value, at.session_state["waited"])


def test_a_full_run_waits_for_a_replacing_file_before_it_draws_anything():
    # Issue 51: the page's own script (app.py) waits at its start, before anything is sent to the browser, so that
    # the run without a file stops having drawn nothing (the browser test counts what it sends). The uploader's own
    # wait is not spent again; an uploader gone from the page (its section closed) only loses its flag.
    def script():
        import time

        import streamlit as st

        from app_pages.explorer_sections.uploader import settle_replacements, settled_upload

        start = time.monotonic()
        settle_replacements(seconds=0.3)
        st.session_state["waited_at_start"] = time.monotonic() - start
        if "value" in st.session_state:
            start = time.monotonic()
            st.session_state["got"] = settled_upload(st.session_state["value"], "value", seconds=0.3)
            st.session_state["waited_at_uploader"] = time.monotonic() - start

    at = AppTest.from_function(script, default_timeout=TIMEOUT)
    for value, waits in (("a file", False), (None, True), (None, False), ("another", False)):
        at.session_state["value"] = value
        at.run()
        assert not at.exception and at.session_state["got"] == value
        assert (at.session_state["waited_at_start"] >= 0.3) == waits, (value, at.session_state["waited_at_start"])
        assert at.session_state["waited_at_uploader"] < 0.3
    del at.session_state["value"]  # its section closed: no file, and nothing to wait for
    at.run()
    assert not at.exception and at.session_state["waited_at_start"] < 0.3
    at.session_state["value"] = None
    at.run()
    assert not at.exception and at.session_state["waited_at_start"] < 0.3 and at.session_state["got"] is None


def test_uploads_in_flight_are_the_files_a_session_asked_to_upload_that_have_not_arrived(monkeypatch):
    # Issue 51: the browser asks for a file's upload URL before it removes the file it replaces; the run that finds
    # the old one gone waits while the new one is on its way (the browser test slows the upload down).
    from types import SimpleNamespace

    from app_pages.explorer_sections import uploader

    class Manager:  # the uploaded-file manager's two methods the watch wraps, as Streamlit's own does them
        def __init__(self):
            self.stored, self.count = {}, 0

        def get_upload_urls(self, session_id, file_names):
            self.count += len(file_names)
            return [SimpleNamespace(file_id=f"{session_id}-{self.count - i}") for i in range(len(file_names))]

        def add_file(self, session_id, file):
            self.stored.setdefault(session_id, {})[file.file_id] = file

    manager = Manager()
    uploads = uploader.UploadsInFlight(manager)
    assert not uploads.uploading("a")
    urls = manager.get_upload_urls("a", ["photo.png"])  # the wrapped method answers what the manager answers
    assert [url.file_id for url in urls] == ["a-1"]
    assert uploads.uploading("a") and not uploads.uploading("b")  # another session's upload is not awaited
    manager.add_file(session_id="a", file=SimpleNamespace(file_id="a-1"))  # as Streamlit's upload route calls it
    assert manager.stored["a"]["a-1"].file_id == "a-1"  # the wrapped method stores it as the manager does
    del manager.stored["a"]["a-1"]  # removed before any run looked (a replacement deletes it): it arrived all the same,
    assert not uploads.uploading("a")  # so removing the next file does not wait for it
    manager.get_upload_urls("a", ["lost.png"])  # never arrives (cancelled in the browser): awaited for a while only
    assert uploads.uploading("a")
    monkeypatch.setattr(uploader, "UPLOAD_WAIT_S", 0.0)
    assert not uploads.uploading("a")


def test_one_session_asking_for_upload_urls_without_end_holds_a_few_ids_and_every_check_stays_cheap():
    """Issue 62, item 8: every upload URL a session asked for was kept for 30 s and each check swept them all, so a
    tokenless visitor's 2 M requests held +72 MB and made each waiting run's check take 218 ms. Here 100,000 ids
    from one session, asked for as the browser does (the URL request is a websocket message any visitor sends)."""
    import itertools
    import time
    import tracemalloc
    from types import SimpleNamespace

    from app_pages.explorer_sections import uploader

    fresh = itertools.count()

    class Manager:  # Streamlit's: a fresh file id per URL (a uuid4's 36 characters), nothing stored until one arrives
        def get_upload_urls(self, session_id, file_names):  # counted, not drawn: 100,000 uuid4s took 3 s of CPU
            return [SimpleNamespace(file_id=f"{next(fresh):036x}") for _ in file_names]

        def add_file(self, session_id, file):
            pass

    manager = Manager()
    uploads = uploader.UploadsInFlight(manager)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(100):
        manager.get_upload_urls("visitor", ["x.png"] * 1000)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert held < 200_000, f"{held:,} bytes held for one session's requests"
    assert uploads.uploading("visitor")  # its latest are still awaited
    start = time.perf_counter()
    for _ in range(100):
        uploads.uploading("someone else")  # what each waiting run asks every 10 ms
    assert time.perf_counter() - start < 0.05


def test_upload_ids_expire_with_or_without_their_session_asking_again(monkeypatch):
    from types import SimpleNamespace

    from app_pages.explorer_sections import uploader

    class Manager:
        def get_upload_urls(self, session_id, file_names):
            return [SimpleNamespace(file_id=f"{session_id}-{name}") for name in file_names]

        def add_file(self, session_id, file):
            pass

    clock = [1000.0]
    monkeypatch.setattr(uploader.time, "monotonic", lambda: clock[0])
    manager = Manager()
    uploads = uploader.UploadsInFlight(manager)
    manager.get_upload_urls("gone", ["a.png", "b.png"])  # a session that never asks again
    assert uploads.uploading("gone")
    clock[0] += uploader.UPLOAD_WAIT_S
    manager.get_upload_urls("other", ["c.png"])
    assert uploads.sessions() == {"other"}, "another session's call forgets the ids that expired"
    assert not uploads.uploading("gone") and uploads.uploading("other")


def test_the_watch_on_uploads_stands_aside_for_a_manager_without_the_two_methods_it_wraps(monkeypatch):
    # Streamlit's protocol for uploaded-file managers has get_upload_urls but not add_file (its memory manager's,
    # which its upload route calls): with another manager the page waits its plain time instead of failing.
    from types import SimpleNamespace

    from app_pages.explorer_sections import uploader

    class Manager:
        def get_upload_urls(self, session_id, file_names):
            return []

    manager = Manager()
    monkeypatch.setattr(uploader.Runtime, "exists", staticmethod(lambda: True))
    monkeypatch.setattr(uploader.Runtime, "instance", staticmethod(lambda: SimpleNamespace(uploaded_file_mgr=manager)))
    assert uploader.uploads_in_flight() is None
    assert not hasattr(manager, "vit_uploads_in_flight") and "get_upload_urls" not in vars(manager)  # left alone
    manager.add_file = lambda session_id, file: None
    assert isinstance(uploader.uploads_in_flight(), uploader.UploadsInFlight)  # with both, watched
    assert uploader.uploads_in_flight() is manager.vit_uploads_in_flight  # once


def test_a_run_that_finds_an_upload_gone_waits_while_a_new_file_is_on_its_way(monkeypatch):
    # The wait for the replacing run lasts as long as the upload, then its own time: a photo over a real network
    # takes longer than the 0.3 s here. The run looks every 10 ms: its own time counts from the last look that saw
    # the file on its way (a look can come late on a busy machine: 0.895 s in all once, under the 0.9 once asked).
    import time

    from app_pages.explorer_sections import uploader

    seen = {"until": None, "last": None}

    class Uploads:
        def uploading(self, session_id):
            now = time.monotonic()
            seen["until"] = seen["until"] or now + 0.6  # asked for as the run started, arrives 0.6 s later
            if now < seen["until"]:
                seen["last"] = now
            return now < seen["until"]

    monkeypatch.setattr(uploader, "uploads_in_flight", Uploads)

    at = AppTest.from_function(settled_upload_script, default_timeout=TIMEOUT)
    at.session_state["value"] = "a file"
    at.run()
    at.session_state["value"] = None
    at.run()
    assert not at.exception and at.session_state["got"] is None
    ended = at.session_state["ended"]
    assert ended >= seen["until"] and ended - seen["last"] >= 0.3, (ended, seen)  # the upload's time, then its own


def test_a_sessions_first_run_sends_a_blank_chart_first_and_clears_it_before_the_page_draws_its_own(default_world):
    # Issue 51: the browser loads Plotly's bundle at the first chart it gets; the blank one comes before the page
    # imports torch and opens the model, so the bundle loads meanwhile. The page's charts keep their places.
    from streamlit.delta_generator import DeltaGenerator

    from app_pages.explorer_sections import plotly_preload

    original = DeltaGenerator.plotly_chart  # st.plotly_chart is bound at import: this sees the slot's chart
    with mock.patch.object(DeltaGenerator, "plotly_chart", autospec=True, side_effect=original) as charts:
        at = run_app()
        assert charts.call_args_list[0].args[1] is plotly_preload.BLANK
        drawn = [c.proto.id for c in at.get("plotly_chart")]
        assert drawn[0].endswith("patch_picker")  # cleared before the picker, the first of the page's charts
        charts.reset_mock()
        at.run()
        assert not at.exception and plotly_preload.BLANK not in [c.args[1] for c in charts.call_args_list]
        assert [c.proto.id for c in at.get("plotly_chart")] == drawn  # once per session; the same places



def test_the_clickable_image_and_the_overlay_share_one_layout(default_world):
    # Rough edge 2: same size and top (the browser test measures them too).
    at = run_app()
    picker, drawn = figure_with(at, "patch_picker"), figure_with(at, "overlay_picker")
    for key in ("width", "height", "margin", "xaxis", "yaxis"):
        assert picker["layout"][key] == drawn["layout"][key], key
    assert drawn["layout"]["images"][0]["source"].startswith("data:image/jpeg;base64,")


def colour_bar(at: AppTest) -> tuple[float, float]:
    """The range of the page's colour bar (``drawing.colorbar_html``): its ``data-vmin`` and ``data-vmax``."""
    bars = [e.proto.body for e in at.get("html") if 'class="vit-colorbar"' in e.proto.body]
    assert len(bars) == 1, bars
    return (float(re.search(r'data-vmin="([^"]+)"', bars[0])[1]), float(re.search(r'data-vmax="([^"]+)"', bars[0])[1]))


def test_a_colour_bar_shows_the_real_values_and_a_shared_scale_starts_at_zero(default_world):
    # Rough edge 3.
    at = run_app()
    low, high = colour_bar(at)
    assert f"Colours span {low:.3g} (dark) to {high:.3g} (bright) on this map" in overlay_caption(at)
    sidebar_widget(at, "radio", "Colour scale").set_value("zero")
    at.run()
    assert colour_bar(at)[0] == 0
    assert "Colours span 0 (dark)" in overlay_caption(at)
    sidebar_widget(at, "radio", "Colour scale").set_value("shared")
    sidebar_widget(at, "selectbox", "Head").set_value(0)
    at.run()
    assert not at.exception and "the map's values" in overlay_caption(at)


def test_only_the_controls_a_map_uses_are_shown(default_world):
    # Rough edge 4.
    at = run_app()
    labels = {w.label for kind in ("selectbox", "select_slider", "radio", "slider") for w in getattr(at.sidebar, kind)}
    assert {"Layer", "Head", "Query token", "Head fusion"} <= labels and "Up to layer" not in labels
    sidebar_widget(at, "selectbox", "Head").set_value(1)
    at.run()
    assert not [w for w in at.sidebar.radio if w.label == "Head fusion"]  # one head: nothing to fuse
    sidebar_widget(at, "radio", "Map").set_value("rollout")
    at.run()
    labels = {w.label for kind in ("selectbox", "select_slider") for w in getattr(at.sidebar, kind)}
    assert "Layer" not in labels and "Head" not in labels and "Up to layer" in labels
    sidebar_widget(at, "radio", "Map").set_value("norms")
    at.run()
    labels = {w.label for kind in ("selectbox", "select_slider", "radio") for w in getattr(at.sidebar, kind)}
    assert "Layer" in labels and "Query token" not in labels and "Head fusion" not in labels


def test_the_class_map_reads_from_cls_even_after_a_patch_was_picked_for_another_map(default_world):
    # Rough edge 4: a query picked for the attention map made the class map a self-blob.
    at = run_app()
    sidebar_widget(at, "selectbox", "Query token").set_value(6)
    at.run()
    sidebar_widget(at, "radio", "Map").set_value("class")
    at.run()
    assert "as read by the CLS token" in overlay_caption(at)
    sidebar_widget(at, "selectbox", "Query token (for the class map)").set_value(9)
    at.run()
    assert "as read by the query patch row 3, col 1" in overlay_caption(at)
    sidebar_widget(at, "radio", "Map").set_value("attention")
    at.run()
    assert "patch row 2, col 2" in overlay_caption(at)  # each map kind keeps its own query


def test_a_rejected_upload_keeps_the_sidebar_settings(default_world):
    # Rough edge 5.
    at = run_app()
    sidebar_widget(at, "slider", "Opacity").set_value(0.3)
    sidebar_widget(at, "radio", "Head fusion").set_value("max")
    sidebar_widget(at, "checkbox", "Show the patch grid").check()
    sidebar_widget(at, "select_slider", "Layer").set_value(2)
    at.run()
    upload(at, "notes.png", b"this is not an image")
    assert len(at.error) == 1
    at.sidebar.file_uploader[0].clear()
    at.run()
    assert not at.error
    assert sidebar_widget(at, "slider", "Opacity").value == 0.3
    assert sidebar_widget(at, "radio", "Head fusion").value == "max"
    assert sidebar_widget(at, "checkbox", "Show the patch grid").value is True
    assert sidebar_widget(at, "select_slider", "Layer").value == 2


def test_every_layer_stays_on_after_visiting_another_tab(default_world):
    # Rough edge 6.
    at = run_app()
    at.toggle(key="every_layer").set_value(True)
    at.run()
    at.session_state["analysis_tab"] = "Attention matrix"
    at.run()
    at.session_state["analysis_tab"] = "Heads"
    at.run()
    assert at.toggle(key="every_layer").value is True
    assert len(head_captions(at)) == 3 * 2


def test_matrix_tick_labels_and_axis_title_have_room_below_the_rows():
    # Rough edge 7: with no bottom margin the x tick labels were clipped and the title sat on the last rows.
    fig = drawing.attention_matrix_figure(np.eye(17), (4, 4))
    assert fig.layout.margin.b >= 60 and fig.layout.xaxis.automargin is True
    assert fig.layout.xaxis.showticklabels is not False and list(fig.layout.xaxis.ticktext)[0] == "CLS"
    assert fig.layout.xaxis.title.standoff is not None


def test_big_matrices_are_drawn_as_block_averages_with_token_ranges():
    matrix = np.random.default_rng(0).random((1 + 40 * 30, 1 + 40 * 30)).astype(np.float32)
    fig = drawing.attention_matrix_figure(matrix, (40, 30), max_cells=401)
    z = np.asarray(fig.data[0].z)
    assert z.shape == (401, 401)  # bins of 3 tokens
    assert fig.data[0].x[1] == "3–5" and "mean" in fig.data[0].hovertemplate
    np.testing.assert_allclose(z[1, 2], matrix[3:6, 6:9].mean(), rtol=1e-6)


def test_pool_matrix_averages_blocks_by_hand():
    m = np.arange(25, dtype=np.float32).reshape(5, 5)
    pooled, size = drawing.pool_matrix(m, max_cells=3)
    assert size == 2 and pooled.shape == (3, 3)
    assert pooled[0, 0] == (0 + 1 + 5 + 6) / 4 and pooled[2, 2] == 24 and pooled[0, 2] == (4 + 9) / 2


def test_clicking_a_head_thumbnail_selects_that_layer_and_head_and_outlines_it(default_world):
    # Rough edge 8: the grid is one clickable figure; a point per head, row-major.
    assert drawing.cell_from_selection({"point_indices": [5]}, layers=[0, 1, 2], num_heads=2) == (2, 1)
    assert drawing.cell_from_selection({"point_indices": []}, layers=[0], num_heads=2) is None
    at = run_app()
    sidebar_widget(at, "selectbox", "Head").set_value(1)
    at.run()
    [outline] = figure_with(at, "heads_grid")["layout"]["shapes"]
    assert outline["type"] == "rect" and outline["x0"] > 0  # the second head of the only row shown


def test_downloads_are_named_after_the_map_and_the_uploader_takes_every_format_it_names():
    # Rough edge 9.
    a = hand_analysis()
    settings = attention_maps.MapSettings(layer=0, head=1, query=2)
    assert drawing.map_file_name("photo", settings, a) == "photo-attention-L1-h2-q2-overlay.png"
    rollout = attention_maps.MapSettings(kind="rollout", fusion="max", discard_ratio=0.5)
    assert drawing.map_file_name("photo", rollout, a) == "photo-rollout-L1-2-max-discard50-cls-overlay.png"
    from vit.core.images import ImageError, open_image

    with pytest.raises(ImageError) as error:
        open_image(b"not an image", name="x")
    named = error.value.args[0].split("(")[-1].rstrip(")").split(", ")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    from app_pages.explorer_sections.caches import UPLOAD_TYPES

    uploader_types = set(UPLOAD_TYPES)
    assert set(named) <= uploader_types
    del at


def test_a_greyscale_model_offers_invert_and_says_when_an_image_looks_inverted(dirs):
    # Rough edge 10: MNIST-like training data is dark (mean 0.13); a dark digit on white looks inverted.
    from vit.checkpoint import Preprocessing

    checkpoints, _ = dirs
    config = ViTConfig(image_size=16, patch_size=4, num_channels=1, num_classes=3, hidden_size=16, num_layers=2,
                       num_heads=2, mlp_size=32)
    torch.manual_seed(0)
    save_checkpoint(checkpoints / "digits.pt", ViT(config), CLASSES,
                    preprocessing=Preprocessing(16, 1, (0.1307,), (0.3081,)))
    at = run_app()
    paper = np.full((28, 28), 250, dtype=np.uint8)
    paper[6:22, 12:16] = 10  # a dark stroke
    buffer = io.BytesIO()
    Image.fromarray(paper, "L").save(buffer, format="PNG")
    upload(at, "digit.png", buffer.getvalue())
    assert any("try Invert" in w.value for w in at.sidebar.warning)
    sidebar_widget(at, "checkbox", "Invert (for dark strokes on a light background)").check()
    at.run()
    assert not at.exception and not at.sidebar.warning
    assert any("inverted" in c.value for c in at.main.caption)


def test_token_norms_are_the_norms_of_each_layers_output(tmp_path):
    from vit.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(write_checkpoint(tmp_path / "t.pt"))
    image = Image.open(io.BytesIO(png_bytes(40, 20)))
    a = image_analysis.analyse(checkpoint, image)
    model, x = checkpoint.model, preprocess([image], checkpoint.preprocessing)
    with torch.no_grad():  # the last block's output, by running the blocks on the embedding by hand
        h = a.hidden[0][None]
        for block in model.blocks:
            h, _ = block(h)
    np.testing.assert_allclose(attention_maps.token_norms(a, -1).numpy(), h[0].norm(dim=-1).numpy(), rtol=1e-5)
    norms = attention_maps.attention_map(a, attention_maps.MapSettings(kind="norms", layer=-1))
    np.testing.assert_allclose(norms, h[0, 1:].norm(dim=-1).reshape(4, 4).numpy(), rtol=1e-5)
    del x


def test_register_tokens_can_be_hidden_from_the_query_list_and_the_matrix():
    assert explorer.visible_tokens(7, 3, hide_registers=True) == [0, 3, 4, 5, 6]
    assert explorer.visible_tokens(7, 3, hide_registers=False) == list(range(7))
    fig = drawing.attention_matrix_figure(np.eye(7), (2, 2), num_prefix_tokens=3, tokens=[0, 3, 4, 5, 6])
    assert np.asarray(fig.data[0].z).shape == (5, 5)
    assert list(fig.data[0].x) == ["0 · CLS", "3 · r1 c1", "4 · r1 c2", "5 · r2 c1", "6 · r2 c2"]


def test_matrix_names_every_prefix_token_in_its_ticks_and_hover_text():
    # CLS, DIST and two registers before a 2x2 grid: the hover text reads the category names.
    names = ("CLS", "DIST", "REG 1", "REG 2")
    fig = drawing.attention_matrix_figure(np.eye(8), (2, 2), num_prefix_tokens=4, prefix_names=names)
    assert list(fig.data[0].y) == ["0 · CLS", "1 · DIST", "2 · REG 1", "3 · REG 2", "4 · r1 c1", "5 · r1 c2",
                                   "6 · r2 c1", "7 · r2 c2"]
    assert list(fig.layout.xaxis.ticktext) == ["CLS", "DIST", "REG 1", "REG 2", "6"]
    assert "%{y}" in fig.data[0].hovertemplate and "%{x}" in fig.data[0].hovertemplate


def test_memory_per_image_follows_the_chunked_model_and_the_token_gate(monkeypatch):
    from types import SimpleNamespace

    def vit(hidden_size: int, num_layers: int, num_heads: int):  # the geometry is all the gate reads
        config = ViTConfig(image_size=224, patch_size=16, hidden_size=hidden_size, num_layers=num_layers,
                           num_heads=num_heads, mlp_size=4 * hidden_size)
        return SimpleNamespace(model=SimpleNamespace(config=config, num_prefix_tokens=1))

    base, large = vit(768, 12, 12), vit(1024, 24, 16)
    # 1,024 px: 64 x 64 patches, 4,097 tokens. The whole attentions were 9 GB (ViT-B) and 19 GB (ViT-L); the
    # hidden states, the cache, one layer's queries and keys and one chunk fit 1 GB.
    fits.check_input_fits(base, (64, 64))
    fits.check_input_fits(large, (64, 64))
    assert fits.analysis_memory(24, 16, 1024, 4097) < fits.ANALYSIS_MEMORY_LIMIT
    with pytest.raises(TooManyTokens, match="16,641 patches; at most 16,384"):
        fits.check_input_fits(base, (129, 129))  # 2,064 px
    # 2,048 px: 16,384 patches + CLS pass the token gate (it counts patches), and its hidden states alone are 654 MB
    with pytest.raises(TooManyTokens, match="over the 1,024 MB limit"):
        fits.check_input_fits(base, (128, 128))
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "2048")
    fits.check_input_fits(base, (128, 128))


@pytest.mark.parametrize("colormap", drawing.COLORMAPS)
def test_heatmap_colours_avoid_the_hex_strings_streamlit_replaces(colormap):
    # Streamlit swaps "#000001".."#000020" for theme colours in any chart: inferno's black became purple.
    for fig in (drawing.attention_matrix_figure(np.eye(5), (2, 2), colormap=colormap),
                drawing.colorbar_figure(0.0, 1.0, colormap)):
        colours = [color.lower() for _, color in fig.data[0].colorscale]  # (the template's placeholders are meant)
        assert not {f"#0000{i:02d}" for i in range(1, 21)} & set(colours), colormap


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
    from vit.app import catalog

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
        at = run_app(explorer_open_path=str(other))  # the field is not drawn: its key, as a crafted message sets it
    finally:
        config.set_option("server.address", before)
    assert not at.exception
    picker = sidebar_widget(at, "selectbox", "Checkpoint")
    assert picker.value != str(other) and not any("secret" in option for option in picker.options)
    assert not at.error  # nothing was read, so nothing says whether the path exists
    assert not [t for t in at.sidebar.text_input if t.label == "Open a path"]


@pytest.mark.parametrize("kind", ["attention", "rollout", "lrp", "flow"])
def test_captions_name_a_register_query_as_a_prefix_token_not_an_outlined_patch(kind):
    a = hand_analysis()
    a.num_prefix_tokens, a.grid, a.prefix_names = 2, (1, 1), ("CLS", "REG 1")  # still T = 3 tokens
    caption = map_captions.describe_map(attention_maps.MapSettings(kind=kind, query=1), a, ["a", "b"])
    assert "the REG 1 token" in caption and "outlined" not in caption


@pytest.mark.parametrize("kind", ["class", "legrad", "lrp", "attnlrp"])
def test_captions_show_a_class_name_as_written(kind):
    a = hand_analysis()
    names = ["a", "![x](http://example.invalid/x.png) <b>b</b>"]
    describe = map_captions.describe_map if kind == "class" else map_captions.describe_method_map
    caption = describe(attention_maps.MapSettings(kind=kind), a, names)
    rendered = MarkdownIt("commonmark").render(caption)
    assert "<img" not in rendered and "<b>" not in rendered
    assert f"“{names[1]}”" in displayed(caption)


@pytest.mark.parametrize("size", [(1, 1), (64, 1), (1, 64), (3, 2)])
def test_images_with_one_pixel_sides_show_every_view(default_world, size):
    at = run_app()
    upload(at, "tiny.png", png_bytes(*size))
    assert not at.exception and not at.error, [e.message for e in at.exception]
    assert sorted(predicted_labels(at)) == sorted(CLASSES)


def test_the_query_keeps_its_place_in_the_image_when_the_grid_changes(default_world):
    """Issue 19, item 2: row 2, col 4 of a 4x4 grid is the same place as row 3-4, col 7-8 of an 8x8 one."""
    at = run_app()
    upload(at, "photo.png", png_bytes(width=16, height=16, seed=4))
    sidebar_widget(at, "selectbox", "Query token").set_value(1 + 1 * 4 + 3)  # row 2, col 4 of 4x4
    at.run()
    assert "patch row 2, col 4" in overlay_caption(at)
    sidebar_widget(at, "selectbox", "Input size").set_value(32)  # 8x8 patches
    at.run()
    assert not at.exception and not at.error
    # The centre of patch (2, 4) of 4x4, (1.5/4, 3.5/4) of the image, lies in patch (4, 8) of 8x8 (from 1).
    assert sidebar_widget(at, "selectbox", "Query token").value == 1 + 3 * 8 + 7
    assert "patch row 4, col 8" in overlay_caption(at)
    sidebar_widget(at, "selectbox", "Input size").set_value(0)  # back to the model's 4x4
    at.run()
    assert "patch row 2, col 4" in overlay_caption(at)


def test_remap_query_by_hand():
    assert explorer.remap_query(0, (4, 4), (8, 8), 1) == 0  # CLS stays
    assert explorer.remap_query(1 + 4 * 0 + 0, (4, 4), (2, 2), 1) == 1  # top-left stays top-left
    assert explorer.remap_query(1 + 15, (4, 4), (5, 8), 1) == 1 + 4 * 8 + 7  # bottom-right stays bottom-right
    assert explorer.remap_query(5 + 6, (4, 4), (4, 4), 5) == 11  # same grid: unchanged (registers counted)


def test_a_tiny_upload_is_said_and_a_feature_models_caption_names_no_classifier(default_world):
    """Issue 19, item 8: a 1x1 image is accepted with a word; the CLS caption of a model without a head says
    'embedding', not 'classifier'."""
    at = run_app()
    upload(at, "dot.png", png_bytes(width=1, height=1))
    assert not at.exception and any("1×1 px, less than one 4-px patch" in w.value for w in at.sidebar.warning)
    assert "The classifier reads the CLS token" in overlay_caption(at)
    from vit.checkpoint import load_checkpoint

    settings = attention_maps.MapSettings(kind="attention", layer=-1, head=None, fusion="mean", query=0)
    checkpoint = load_checkpoint(default_world[0] / DEFAULT_CHECKPOINT)
    analysis = image_analysis.analyse(checkpoint, Image.new("RGB", (16, 16)))
    caption = map_captions.describe_map(settings, analysis, [])
    assert "image embedding" in caption and "classifier" not in caption


def test_the_entry_script_imports_pandas_whole_before_any_page_runs():
    """plotly reads pandas from sys.modules without importing it; a page whose figure was built while another
    script thread was still importing pandas crashed (seen in the browser test of the Mechanism view). The entry
    script imports it first, so every thread waits for the whole module before its page runs."""
    import ast

    tree = ast.parse((Path(__file__).resolve().parent.parent / "app.py").read_text())
    statements = tree.body
    imports = [i for i, node in enumerate(statements) if isinstance(node, ast.Import)
               and any(alias.name == "pandas" for alias in node.names)]
    runs = [i for i, node in enumerate(statements) if "navigation.run" in ast.unparse(node)]
    assert imports and runs and imports[0] < runs[0]


def test_matrix_ticks_of_a_register_model_keep_a_labels_height_apart():
    """Issue 19, item 8: a DINOv2 with 4 registers at 224 px (261 tokens) printed CLS, REG 1-4 on top of each
    other (~2 px apart); ticks now keep a label's height apart and the first names the prefix tokens it covers."""
    names = ("CLS", "REG 1", "REG 2", "REG 3", "REG 4")
    fig = drawing.attention_matrix_figure(np.eye(261), (16, 16), num_prefix_tokens=5, prefix_names=names)
    rows = [list(fig.data[0].y).index(t) for t in fig.layout.yaxis.tickvals]
    pitch = drawing.MATRIX_PLOT_PX / 261
    assert all((b - a) * pitch >= drawing.MATRIX_LABEL_PX for a, b in zip(rows, rows[1:], strict=False)), rows
    assert list(fig.layout.xaxis.ticktext)[0] == "CLS…REG 4"
    # A small matrix keeps every prefix token's own tick.
    small = drawing.attention_matrix_figure(np.eye(9), (2, 2), num_prefix_tokens=5, prefix_names=names)
    assert list(small.layout.xaxis.ticktext)[:5] == list(names)


def test_an_hf_folder_without_its_preprocessor_config_says_what_the_images_are_prepared_with(tmp_path, dirs):
    from test_sources import hf_folder

    folder = hf_folder(tmp_path / "vit")
    (folder / "preprocessor_config.json").unlink(missing_ok=True)
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(folder))
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert any(w.value.startswith("No preprocessor") and "assumed defaults" in w.value for w in at.sidebar.warning)


def test_the_image_and_map_can_be_enlarged_and_zoomed_to_pick_a_fine_grids_patch(default_world):
    """Issue 19, item 9: a 34 x 46 grid left ~6 px patches in a 300-px column; enlarged, the image and the map share
    the page's width, the wheel zooms and a drag pans, and a click still picks the patch under it."""
    at = run_app()
    small = figure_with(at, "patch_picker")
    assert small["layout"]["xaxis"]["fixedrange"] is True
    at.toggle(key="enlarge_view").set_value(True)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    fig = figure_with(at, "linked_pickers")  # the image and the overlay, one figure (issue 33, item 6)
    for axis in ("xaxis", "yaxis", "xaxis2", "yaxis2"):
        assert fig["layout"][axis]["fixedrange"] is False
    assert fig["layout"]["dragmode"] == "pan"
    assert fig["layout"]["height"] > small["layout"]["height"]
    [chart] = [c for c in at.get("plotly_chart") if c.proto.id.endswith("linked_pickers")]
    config = json.loads(chart.proto.config)
    assert config["scrollZoom"] is True and config["doubleClick"] == "reset"


def test_class_names_from_the_file_show_their_control_characters(dirs):
    """A checkpoint's class names are the file's: U+202E in one turned every label and caption showing it around
    (the run names' fix, issue 20 item 9, had left them raw)."""
    checkpoints, _ = dirs
    write_checkpoint(checkpoints / DEFAULT_CHECKPOINT, classes=["air\u202eplane", "c\u2066at", "dog\u2066"])
    at = upload(run_app(map_kind="class"), "x.png", png_bytes())  # a class map: the class picker and its caption
    bars = [t for fig in charts(at) for t in fig["data"] if t.get("type") == "bar"]
    assert set(bars[0]["y"]) == {"air\\u202eplane", "c\\u2066at", "dog\\u2066"}
    [picker] = [s for s in at.sidebar.selectbox if s.label == "Class"]
    assert picker.options[1:] == ["air\\u202eplane", "c\\u2066at", "dog\\u2066"]
    shown = ([e.value for e in [*at.caption, *at.markdown, *at.info, *at.sidebar.selectbox]] + picker.options
             + [json.dumps(f) for f in charts(at)])
    assert not any(c in str(text) for text in shown for c in "\u202e\u2066")


def test_an_image_another_page_names_is_read_only_inside_its_folder_as_a_regular_file_within_the_upload_bound(
        tmp_path):
    """Issue 39, item 4: 'Open in the explorer' read /dev/zero (3 GB in 10 s) and a PNG outside every data root."""
    folder = tmp_path / "data"
    (folder / "cat").mkdir(parents=True)
    image = folder / "cat" / "0.png"
    image.write_bytes(png_bytes())
    (tmp_path / "outside.png").write_bytes(png_bytes(seed=1))
    (folder / "cat" / "link.png").symlink_to(tmp_path / "outside.png")
    os.mkfifo(folder / "cat" / "fifo.png")
    assert explorer.read_image_file(image, folder, 2**20) == image.read_bytes()
    refused = {"/dev/zero": "not inside", str(tmp_path / "outside.png"): "not inside",
               str(folder / "cat" / "link.png"): "not inside", str(folder / "cat" / "fifo.png"): "not a regular file",
               str(folder / "cat"): "not a regular file"}
    for path, reason in refused.items():
        with pytest.raises(ImageError, match=reason):
            explorer.read_image_file(path, folder, 2**20)
    with pytest.raises(ImageError, match="over the 0 MB"):
        explorer.read_image_file(image, folder, 100)


def test_the_explorer_refuses_an_image_named_outside_the_folder_it_was_analysed_in(default_world, tmp_path):
    at = run_app(explorer_image="/dev/zero", explorer_image_folder=str(tmp_path))
    assert any("Cannot open this image: zero is not inside the analysed folder" in e.value for e in at.error)
    at = run_app(explorer_image=str(tmp_path / "x.png"))  # no folder handed over: not an analysed image
    assert any("not an image of a folder this visit analysed" in e.value for e in at.error)


def test_the_matrix_and_the_npz_past_the_memory_bound_are_refused_on_the_page_not_raised(default_world, monkeypatch):
    # At high resolution the gate lets inputs through whose whole T x T matrices do not fit (maps come in chunks):
    # the matrix tab and the .npz download must say so, not raise.
    def too_big(analysis, matrices, what):
        raise TooManyTokens(f"{what} is over the limit (VIT_ANALYSIS_MEMORY_MB)")

    monkeypatch.setattr(attention_maps, "check_matrix_fits", too_big)
    at = run_app()
    assert not at.exception
    assert any("every head of the chosen layers" in c.value for c in at.caption)  # shown escaped, as plain text
    assert not [b for b in at.get("download_button") if "Attentions" in b.label or "raw" in b.label]
    at.session_state["analysis_tab"] = "Attention matrix"
    at.run()
    assert not at.exception
    assert any("over the limit" in w.value for w in at.warning)


def test_the_sidebar_shows_the_projects_version(default_world):
    import vit

    at = run_app()
    assert any(c.value == f"ViT Attention Explorer {vit.__version__}" for c in at.sidebar.caption)
