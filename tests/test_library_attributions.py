"""captum's attributions and RISE on the library road (issue 91): a classifier opened as its library builds it gets
the port's seven (Integrated Gradients, SmoothGrad, Input x Gradient on the input pixels; occlusion, feature ablation,
KernelSHAP and RISE per patch), each equal to captum's own call (or the RISE authors' code) on the library's own model,
loaded by transformers (or built by timm) directly, over the same preprocessed pixels; their forwards and batches are
counted from what the model declares before any work. Tiny random models, built and saved by their own library."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lazy_modules import lazy

import vit
from vit.core.inference import preprocess
from vit.costs import plan
from vit.costs.bounds import TooManyTokens
from vit.explain.methods import captum_maps

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
captum_attr = lazy("captum.attr")  # imported by the first test that reads it (tests/lazy_modules.py)
from test_captum_methods import TARGET, _Logits, captums_own, captums_pixels, image, patch_grid_by_hand  # noqa: E402
from test_library_path import reference, save_family  # noqa: E402
from test_library_timm import build  # noqa: E402

TIMM = "flexivit_small"
PATCH_METHODS = ("occlusion", "feature_ablation", "kernel_shap")


def transformers_logits(folder):
    """transformers' own classifier, loaded by transformers (SDPA): pixels in, logits out."""
    model = reference(folder, "sdpa")
    return lambda x: model(pixel_values=x).logits


def test_the_pixel_methods_equal_captums_own_call_on_transformers_model_summed_over_the_channels(msn):
    checkpoint = vit.load(msn, device="cpu")
    x = preprocess([image()], checkpoint.preprocessing)  # (1, 3, 32, 32), as vit.load prepares it
    forward = transformers_logits(msn)
    for method in captum_maps.PIXEL_METHODS:
        expected = captums_pixels(method, forward, x).numpy()  # captum's defaults, seed 0, one batch
        assert (expected < 0).any() and (expected > 0).any()
        options = {} if method == "input_x_gradient" else {"batch": 3}  # other batches than captum's: the same map
        ours = vit.explain(checkpoint, image(), method, target=TARGET, **options)
        assert ours.map.shape == (32, 32) and ours.pixels and ours.grid == (4, 4)
        np.testing.assert_allclose(ours.map, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max(), err_msg=method)
        assert ours.target == checkpoint.class_names[TARGET] and ours.prediction is not None


def test_integrated_gradients_takes_captums_steps_and_baselines(msn):
    checkpoint = vit.load(msn, device="cpu")
    x = preprocess([image()], checkpoint.preprocessing).requires_grad_(True)
    expected = captum_attr.IntegratedGradients(transformers_logits(msn)).attribute(
        x, baselines=0.5, target=2, n_steps=7).detach().sum(dim=1)[0].numpy()
    ours = vit.explain(checkpoint, image(), "integrated_gradients", target=2, n_steps=7, baselines=0.5, batch=2)
    np.testing.assert_allclose(ours.map, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
    assert not np.allclose(ours.map, ours.map.T, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_the_patch_methods_equal_captums_own_call_with_the_patch_mask(msn):
    checkpoint = vit.load(msn, device="cpu")
    x = preprocess([image()], checkpoint.preprocessing)
    forward = transformers_logits(msn)
    for method in PATCH_METHODS:
        expected = captums_own(method, forward, x, (4, 4))  # the mean over each patch's pixels and channels
        ours = vit.explain(checkpoint, image(), method, target=TARGET, batch=3)
        assert ours.map.shape == (4, 4) and not ours.pixels
        np.testing.assert_allclose(ours.map, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max(), err_msg=method)


def test_rise_equals_the_authors_code_with_the_same_masks_on_transformers_model(msn):
    pytest.importorskip("skimage")  # the authors' generate_masks resizes with it
    from tests.reference.rise.explanations import RISE

    checkpoint = vit.load(msn, device="cpu")
    x = preprocess([image()], checkpoint.preprocessing)
    theirs = RISE(torch.nn.Sequential(_Logits(transformers_logits(msn)), torch.nn.Softmax(dim=1)), (32, 32),
                  gpu_batch=100)
    np.random.seed(5)  # their masks from numpy's global state, ours from RandomState(seed): the same draws
    theirs.generate_masks(N=40, s=3, p1=0.4, savepath=None)
    with torch.no_grad():
        saliency = theirs(x)[TARGET][None, None]  # (1, 1, H, W)
    ours = vit.explain(checkpoint, image(), "rise", target=TARGET, n_masks=40, s=3, p1=0.4, seed=5, batch=16)
    np.testing.assert_allclose(ours.map, patch_grid_by_hand(saliency, (4, 4), mean=False), rtol=1e-5, atol=1e-6)


def test_on_the_timm_road_they_equal_captums_own_call_on_timms_model(flexivit):
    checkpoint = vit.load(flexivit, device="cpu")
    x = preprocess([image()], checkpoint.preprocessing)  # (1, 3, 48, 48): 6 x 6 patches
    model = build(TIMM)
    expected = captums_own("feature_ablation", model, x, (6, 6))  # captum's one perturbation at a time
    ours = vit.explain(checkpoint, image(), "feature_ablation", target=TARGET)  # as many as fit at once
    # a score's drop is a difference of two logits, whose last float32 bits timm's fused attention rounds
    # differently in a batch of another size: 1e-7 of a logit near 1
    np.testing.assert_allclose(ours.map, expected, rtol=1e-5, atol=1e-4 * np.abs(expected).max())
    expected = captums_pixels("input_x_gradient", model, x).numpy()
    ours = vit.explain(checkpoint, image(), "input_x_gradient", target=TARGET)
    assert ours.map.shape == (48, 48)
    np.testing.assert_allclose(ours.map, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_without_a_target_they_explain_the_predicted_class(msn):
    checkpoint = vit.load(msn, device="cpu")
    x = preprocess([image()], checkpoint.preprocessing)
    with torch.no_grad():
        predicted = int(transformers_logits(msn)(x)[0].argmax())
    ours = vit.explain(checkpoint, image(), "occlusion")
    assert ours.target == checkpoint.class_names[predicted]
    np.testing.assert_array_equal(ours.map, vit.explain(checkpoint, image(), "occlusion", target=predicted).map)
    assert f"Occlusion of {checkpoint.class_names[predicted]!r}" in ours.description


def test_they_are_listed_for_a_classifier_and_refused_in_one_line_without_one(msn, tmp_path):
    assert set(captum_maps.ATTRIBUTION_METHODS) <= set(vit.methods(vit.load(msn, device="cpu")))
    ijepa = vit.load(save_family(tmp_path, "ijepa"), device="cpu")
    assert not set(captum_maps.ATTRIBUTION_METHODS) & set(vit.methods(ijepa))
    with pytest.raises(ValueError, match="^integrated_gradients explains a class: this model has no classifier$"):
        vit.explain(ijepa, image(), "integrated_gradients")
    with pytest.raises(ValueError, match="does not read n_masks; it reads target, n_steps, baseline, baselines, "
                                         "batch$"):
        vit.explain(vit.load(msn, device="cpu"), image(), "integrated_gradients", n_masks=3)


def test_past_the_memory_limit_they_are_refused_in_one_line_before_any_forward(msn, monkeypatch):
    checkpoint = vit.load(msn, device="cpu")
    ran = []
    checkpoint.model.model.register_forward_pre_hook(lambda *args: ran.append(1))
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.01")  # 10 kB: one image's graph is far more
    for method in ("integrated_gradients", "rise"):
        with pytest.raises(TooManyTokens, match="smaller batch") as refused:
            vit.explain(checkpoint, image(), method, target=0)
        assert "\n" not in str(refused.value)
    monkeypatch.delenv("VIT_ANALYSIS_MEMORY_MB")
    with pytest.raises(TooManyTokens, match="would run 100,001 forwards of the model, over the limit of 100,000"):
        vit.explain(checkpoint, image(), "kernel_shap", n_samples=100_000)
    assert not ran


def test_the_cost_model_reads_each_roads_declared_sizes(msn, flexivit):
    # vit_msn's SMALL config; flexivit's model_args (timm's MLP 4 x 64 wide, read from its fc1)
    assert vit.load(msn, device="cpu").model.cost_shape() == plan.LibraryShape(3, 4, 32, 64, 1, (8, 8), 3)
    assert vit.load(flexivit, device="cpu").model.cost_shape() == plan.LibraryShape(2, 2, 64, 256, 1, (8, 8), 3)
    shape = plan.LibraryShape(12, 12, 768, 3072, 1, (16, 16))  # ViT-B/16: a backward holds more than a forward,
    forward_only, backward = (plan.attribution_image_bytes(shape, (14, 14), g) for g in (False, True))
    assert forward_only < backward  # and more tokens more
    assert plan.attribution_image_bytes(shape, (28, 28), True) > backward
    assert plan.attribution(shape, (14, 14), "IG", 50, 5, True).flops == 50 * 3 * vit.costs.bounds.forward_flops(
        shape, 197)


def test_by_default_the_batch_is_the_most_that_fit_the_memory_limit(msn, monkeypatch):
    checkpoint = vit.load(msn, device="cpu")
    per = plan.attribution_image_bytes(checkpoint.model.cost_shape(), (4, 4), True)
    held = captum_maps.held_bytes("integrated_gradients", captum_maps.Options(n_steps=9), (32, 32), 3)[1]
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str((3.5 * per + held) / 2**20))  # three images' graphs fit
    sizes = []
    checkpoint.model.model.register_forward_pre_hook(
        lambda module, args, kwargs: sizes.append(kwargs["pixel_values"].shape[0]), with_kwargs=True)
    vit.explain(checkpoint, image(), "integrated_gradients", target=0, n_steps=9)
    assert sizes == [1, 3, 3, 3]  # the prediction's forward, then 9 steps 3 at a time
