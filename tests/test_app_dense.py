"""The explorer's "What the patches represent" section (issue 48) through AppTest: PCA colours, a patch's
similarity on this image and on the "Compare with" model's own grid, and the correspondences of the two."""

from __future__ import annotations

import io

import numpy as np
import pytest
import streamlit as st
import torch
import torch.nn.functional as F
from helpers import displayed
from PIL import Image
from test_app import png_bytes, run_app, sidebar_widget, write_checkpoint

from vit.app.drawing import describe_range
from vit.checkpoint import load_checkpoint
from vit.core.inference import preprocess
from vit.core.runfiles import DEFAULT_CHECKPOINT


@pytest.fixture
def two_models(tmp_path, monkeypatch):
    checkpoints, runs = tmp_path / "checkpoints", tmp_path / "runs"
    runs.mkdir()
    monkeypatch.setenv("VIT_CHECKPOINTS_DIR", str(checkpoints))
    monkeypatch.setenv("VIT_RUNS_DIR", str(runs))
    st.cache_data.clear()
    st.cache_resource.clear()
    a = write_checkpoint(checkpoints / DEFAULT_CHECKPOINT, seed=0)
    b = write_checkpoint(checkpoints / "other.pt", seed=1)
    samples = checkpoints / "samples" / a.stem
    samples.mkdir(parents=True)
    image = Image.fromarray(np.random.default_rng(3).integers(0, 256, (16, 16, 3), dtype=np.uint8))
    image.save(samples / "cat_1.png")
    return a, b, image


def similarity_reference(path, image, patch: int) -> np.ndarray:
    """The last block's output after the final norm, straight from the model: cosine of ``patch`` to every patch."""
    checkpoint = load_checkpoint(path)
    model = checkpoint.model
    with torch.no_grad():
        tokens = model.norm(model.tokens(preprocess([image], checkpoint.preprocessing))[0])[0, 1:]  # (16, D)
    unit = F.normalize(tokens, dim=-1)
    return (unit @ unit[patch]).reshape(4, 4).numpy()


def captions(at) -> list[str]:
    return [c.value for c in at.caption]


def test_the_section_draws_pca_similarity_and_the_compared_models_correspondences(two_models):
    a, b, image = two_models
    at = run_app(dense_open=True)
    assert not at.exception, [e.message for e in at.exception]
    at = at.selectbox(key="dense_query").set_value(1 + 6).run()  # patch 6: row 1, column 2
    assert not at.exception, [e.message for e in at.exception]
    expected = describe_range(similarity_reference(a, image, 6))
    assert any(c.startswith("Cosine similarity to") and c.endswith(expected) for c in captions(at)), captions(at)
    assert any("Upload a second image" in c for c in captions(at))
    at = at.selectbox(key="compare_with").set_value(str(b)).run()
    assert not at.exception, [e.message for e in at.exception]
    expected_b = describe_range(similarity_reference(b, image, 6))  # one 4 x 4 grid: the same place is patch 6
    assert any(c.startswith("The compared model") and c.endswith(expected_b) for c in captions(at)), captions(at)
    assert any("mutual matches shown" in c or c == "No mutual matches." for c in captions(at)), captions(at)


def test_a_foreground_threshold_that_leaves_no_patch_is_a_one_line_warning(two_models):
    at = run_app(dense_open=True, dense_fg=True, dense_threshold=1e6)
    assert not at.exception, [e.message for e in at.exception]
    assert any("on the foreground side of threshold" in w.value and "\n" not in w.value for w in at.warning)



def test_a_rerun_with_unchanged_inputs_fits_no_pca_and_matches_nothing_again(two_models, monkeypatch):
    from vit.explain.views import dense_views

    calls = []

    def counted(name: str, compute):
        return lambda *args: calls.append(name) or compute(*args)

    for name in ("pca_views", "match_view"):
        monkeypatch.setattr(dense_views, name, counted(name, getattr(dense_views, name)))
    at = run_app(dense_open=True, compare_with=str(two_models[1]))
    assert calls == ["pca_views", "match_view"]
    at = at.selectbox(key="dense_query").set_value(1 + 6).run()  # a click on a patch: only the similarity is new
    assert not at.exception, [e.message for e in at.exception]
    assert calls == ["pca_views", "match_view"]
    at = at.selectbox(key="dense_layer").set_value(0).run()  # another layer: one fit and one match again
    assert not at.exception, [e.message for e in at.exception]
    assert calls == ["pca_views", "match_view"] * 2


def test_another_model_starts_the_section_at_its_own_last_layer_and_middle_patch(two_models, tmp_path):
    """Issue 69, item 9: switching models kept the last model's layer and patch (a layer and token number that exist
    on both, re-read on the new model's grid); the main map already reset."""
    from dataclasses import replace

    from test_app import TINY

    a, _, _ = two_models
    wide = write_checkpoint(a.parent / "wide.pt", replace(TINY, image_size=32, num_layers=2), seed=2)  # 8 x 8 grid
    at = run_app(dense_open=True, dense_layer=0, dense_query=3)
    assert (at.session_state["dense_layer"], at.session_state["dense_query"]) == (0, 3)
    at = sidebar_widget(at, "selectbox", "Checkpoint").set_value(str(wide)).run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.session_state["dense_layer"] == 1  # its last of two
    assert at.session_state["dense_query"] == 1 + 64 // 2  # its middle patch, after the CLS token


def zeros_png(width: int, height: int) -> bytes:
    """That many pixels of zeros: a few kB on disk, up to gigabytes decoded."""
    buffer = io.BytesIO()
    Image.new("1", (width, height)).save(buffer, format="PNG")
    return buffer.getvalue()


# Each upload's bytes made when its test runs, not when the module is collected: the 30,000-px square is 112 MB of
# pixels to encode (~1.7 s of CPU), which every xdist worker paid at collection, the three that never run it too.
@pytest.mark.parametrize(("name", "made", "message"), [
    ("notes.png", lambda: b"this is not an image", "not an image"),
    ("empty.png", lambda: b"", "empty"),
    ("cut.png", lambda: png_bytes(64, 64)[:200], "truncated or corrupt"),
    ("bomb.png", lambda: zeros_png(30_000, 30_000), "too large to decode safely"),
    ("line.png", lambda: zeros_png(1, 3_000), "more than 64 times as long as it is wide"),
], ids=["text", "empty", "truncated", "30000-squared", "1x3000"])
def test_an_undecodable_second_image_is_one_warning_and_the_section_goes_on(two_models, name, made, message):
    """Issue 62, item 3: the second upload raised ImageError past the page (Streamlit's error box and a traceback in
    the server log), where the main upload and the patching upload answer in one line."""
    at = run_app(dense_open=True)
    second, = [u for u in at.get("file_uploader") if u.key == "dense_second"]
    second.set_value((name, made(), "image/png")).run()
    assert not at.exception, [e.message for e in at.exception]
    warnings = [displayed(w.value) for w in at.warning if "second image" in w.value]
    assert len(warnings) == 1 and name in warnings[0] and message in warnings[0] and "\n" not in warnings[0], warnings
    assert any("Upload a second image" in c for c in captions(at))  # the section is drawn on without it
