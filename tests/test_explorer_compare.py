"""The explorer's compare mode and its epoch selector for runs with attention snapshots (issue 12), through AppTest."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import streamlit as st
import torch
from PIL import Image
from test_app import TINY, run_app, write_checkpoint
from test_training_attention_page import fake_run, shown_text

from vit.app.drawing import display_images
from vit.app.explorer_page import MORE_METHODS
from vit.core.inference import preprocess
from vit.core.runfiles import DEFAULT_CHECKPOINT
from vit.explain.methods.attention import token_map
from vit.explain.views.compare import difference
from vit.model import ViT


@pytest.fixture
def two_checkpoints(tmp_path, monkeypatch):
    checkpoints, runs = tmp_path / "checkpoints", tmp_path / "runs"
    runs.mkdir()
    monkeypatch.setenv("VIT_CHECKPOINTS_DIR", str(checkpoints))
    monkeypatch.setenv("VIT_RUNS_DIR", str(runs))
    st.cache_data.clear()
    st.cache_resource.clear()
    a = write_checkpoint(checkpoints / DEFAULT_CHECKPOINT, seed=0)
    b = write_checkpoint(checkpoints / "other.pt", seed=1)
    shallow = write_checkpoint(checkpoints / "shallow.pt", config=replace(TINY, num_layers=1), seed=2)
    samples = checkpoints / "samples" / a.stem
    samples.mkdir(parents=True)
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(samples / "cat_1.png")
    return a, b, shallow, samples / "cat_1.png", runs


def last_layer_cls_map(path, image: Image.Image) -> np.ndarray:
    """The reference: CLS row of the last layer, mean over heads, straight from the model."""
    payload = torch.load(path, weights_only=True)
    model = ViT(TINY)
    model.load_state_dict(payload["state_dict"])
    model.eval()
    from vit.checkpoint import Preprocessing

    x = preprocess([image], Preprocessing.from_dict(payload["preprocessing"]))
    with torch.no_grad():
        _, attentions = model(x, output_attentions=True)
    return token_map(attentions[-1].mean(dim=1), 0, (4, 4))[0].numpy()


def test_compare_mode_shows_both_maps_and_their_difference(two_checkpoints):
    a, b, _, sample, _ = two_checkpoints
    at = run_app()
    picker = at.selectbox(key="compare_with")  # its first choice shown, not the placeholder "Choose an option"
    assert picker.index == 0 and picker.options[0] == "nothing: one checkpoint"
    at = at.selectbox(key="compare_with").set_value(str(b)).run()
    assert not at.exception, [e.message for e in at.exception]
    assert any(s.value == "Compare" for s in at.subheader)
    captions = [shown_text(c.value) for c in at.caption]
    assert any(c.startswith(f"A: {DEFAULT_CHECKPOINT}") for c in captions)
    assert any(c.startswith("B: other.pt") for c in captions)
    # The difference caption's range is that of the two models' own maps, computed here independently.
    image = Image.open(sample).convert("RGB")
    shown, _, _ = display_images(image)  # the size the page shows the maps at
    expected = difference(last_layer_cls_map(a, image), last_layer_cls_map(b, image), (shown.height, shown.width))
    line = next(c for c in captions if c.startswith("Difference A − B"))
    low, high = float(line.split("from ")[1].split(" ")[0]), float(line.split("to ")[1].split(" ")[0])
    np.testing.assert_allclose([low, high], [expected.min(), expected.max()], rtol=1e-3)


@pytest.mark.parametrize("method", ["legrad", "attnlrp", "flow"])
def test_compare_mode_draws_the_newer_methods_for_b_too(two_checkpoints, method):
    # B's map is computed with B's own model: the difference caption appears instead of a warning.
    _, b, _, _, _ = two_checkpoints
    at = run_app()
    at = at.radio(key="map_kind").set_value(MORE_METHODS).run()
    at = at.selectbox(key="method_kind").set_value(method).run()
    at = at.selectbox(key="compare_with").set_value(str(b)).run()
    assert not at.exception, [e.message for e in at.exception]
    assert not [w.value for w in at.warning if "cannot show" in w.value]
    assert any(shown_text(c.value).startswith("Difference A − B") for c in at.caption)


def test_compare_mode_draws_a_pixel_methods_maps_on_each_models_input_pixels(two_checkpoints, monkeypatch):
    """Issue 90, item 3: with Input x Gradient, A and B are drawn as the page draws A (vit.explain's map on the
    model's input pixels, with the patch grid's lines), not summed over each patch."""
    import vit
    from app_pages.explorer_sections import compare_checkpoints

    a, b, _, sample, _ = two_checkpoints
    drawn, original = [], compare_checkpoints.overlay  # (map, grid) of A's and B's overlays
    monkeypatch.setattr(compare_checkpoints, "overlay", lambda image, map2d, *args, **kwargs: drawn.append(
        (np.asarray(map2d), kwargs.get("grid"))) or original(image, map2d, *args, **kwargs))
    at = run_app()
    at = at.radio(key="map_kind").set_value(MORE_METHODS).run()
    at = at.selectbox(key="method_kind").set_value("input_x_gradient").run()
    at = at.selectbox(key="compare_with").set_value(str(b)).run()
    assert not at.exception, [e.message for e in at.exception]
    assert not [w.value for w in at.warning if "cannot show" in w.value]
    for (shown_map, grid), path in zip(drawn[-2:], (a, b), strict=True):
        want = vit.explain(vit.load(path, device="cpu"), sample, "input_x_gradient")
        assert shown_map.shape == (TINY.image_size, TINY.image_size) and tuple(grid) == tuple(want.grid) == (4, 4)
        np.testing.assert_allclose(shown_map, want.map, rtol=1e-5, atol=1e-7)


def test_compare_mode_draws_b_with_the_sidebars_attribution_options_as_a(two_checkpoints, monkeypatch):
    """B's map is asked with the options the sidebar set for A (Integrated Gradients' steps and baseline), not
    captum's defaults."""
    from vit.explain.views import method_maps

    _, b, _, _, _ = two_checkpoints
    given = []
    real = method_maps.model_method_map

    def recorded(checkpoint, image, kind, *args, options=None, **kwargs):
        given.append((str(checkpoint.path), kind, dict(options or {})))
        return real(checkpoint, image, kind, *args, options=options, **kwargs)

    monkeypatch.setattr(method_maps, "model_method_map", recorded)
    at = run_app()
    at = at.radio(key="map_kind").set_value(MORE_METHODS).run()
    at = at.selectbox(key="method_kind").set_value("integrated_gradients").run()
    next(w for w in at.sidebar.number_input if w.label == "Steps").set_value(3)
    at = at.run()
    at = at.selectbox(key="compare_with").set_value(str(b)).run()
    assert not at.exception, [e.message for e in at.exception]
    asked_b = [options for path, kind, options in given if path == str(b) and kind == "integrated_gradients"]
    assert asked_b and asked_b[-1].get("n_steps") == 3, given


def test_compare_mode_matches_a_shallower_checkpoint_by_relative_depth_and_says_both_layers(two_checkpoints):
    _, _, shallow, _, _ = two_checkpoints
    at = run_app()
    at = at.selectbox(key="compare_with").set_value(str(shallow)).run()
    assert not at.exception and not [w.value for w in at.warning if "cannot show" in w.value]
    assert any("is compared with B's layer 1 of 1 (the same relative depth)" in shown_text(c.value)
               for c in at.caption)


def test_per_epoch_checkpoints_of_a_run_can_be_compared(two_checkpoints):
    *_, runs = two_checkpoints
    run = fake_run(runs, "grow", lr=0.001)
    for epoch in (1, 2):
        write_checkpoint(run / "checkpoints" / f"epoch_{epoch:04d}.pt", seed=epoch)
    at = run_app()
    options = at.selectbox(key="compare_with").options
    assert any(o.startswith("run grow epoch 1 ·") for o in options)
    assert any(o.startswith("run grow epoch 2 ·") for o in options)


def test_the_epoch_selector_shows_a_runs_probe_images_without_a_checkpoint_of_that_epoch(two_checkpoints):
    *_, runs = two_checkpoints
    run = fake_run(runs, "grow", lr=0.001)  # snapshots of epochs 0..3
    best = write_checkpoint(run / "best.pt", config=replace(TINY, num_layers=2, hidden_size=12, num_heads=3), seed=4)
    at = run_app(explorer_checkpoint=str(best))
    assert not at.exception
    slider = at.select_slider(key="explorer_snap_epoch")
    assert slider.options == ["0", "1", "2", "3"] and slider.value == 3
    images = at.get("image")[-1].proto.imgs
    assert [shown_text(i.caption) for i in images] == ["cat → dog 88% ✗", "dog → dog 88% ✓"] * 2
    at = at.select_slider(key="explorer_snap_epoch").set_value(0).run()
    captions = [shown_text(i.caption) for i in at.get("image")[-1].proto.imgs]
    assert captions == ["cat → cat 88% ✓", "dog → cat 88% ✗"] * 2


def test_compare_with_a_feature_model_shows_its_maps_and_says_why_class_maps_are_not_available(two_checkpoints):
    """B without a classifier crashed compare with an IndexError (its top-k is empty)."""
    a, *_ = two_checkpoints
    features = write_checkpoint(a.parent / "features.pt", config=replace(TINY, num_classes=0), classes=[], seed=4)
    at = run_app()
    at = at.selectbox(key="compare_with").set_value(str(features)).run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("No classifier (a feature model)" in shown_text(c.value) for c in at.caption)
    assert any(shown_text(c.value).startswith("Difference A − B") for c in at.caption)
    at = at.radio(key="map_kind").set_value("class").run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("no classifier (a feature model), so it has no class-specific map" in shown_text(w.value)
               for w in at.warning)
