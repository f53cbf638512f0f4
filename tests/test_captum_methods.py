"""captum's attributions and RISE as map methods (``vit.explain.methods.captum_maps``, ``vit.explain.methods.rise``).

Each captum method's map equals captum's own call on the library's own model (tiny random HF ViT, DINOv2 with
registers, a SigLIP tower with a linear head on its pooled output), its attribution reduced here by hand to the patch
grid; the image is not symmetric, so a patch mask placed transposed gives other numbers. RISE equals the authors'
``explanations.py`` (tests/reference/rise) with the same masks, and its seeded masks are theirs after
``np.random.seed``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from lazy_modules import lazy
from parity_helpers import HF_VISION, hf_random
from peak_memory import can_reset_the_peak, run_measured
from PIL import Image

import vit
from vit.core.inference import InputSize, preprocess
from vit.costs.bounds import TooManyTokens
from vit.explain.methods import captum_maps
from vit.explain.views.method_maps import model_method_map

transformers = pytest.importorskip("transformers")
captum_attr = lazy("captum.attr")  # imported by the first test that reads it (tests/lazy_modules.py)
pytestmark = pytest.mark.slow  # importing transformers and captum takes seconds

CLASSES = 3
SIZE = InputSize(32)  # the models' own 4 x 4 grid of 8 px patches (a DINOv2 folder's preprocessing says 224)
TARGET = 1


def image() -> Image.Image:
    """Noise with a bright top-left corner: no symmetry a transposed patch mask would keep."""
    pixels = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    pixels[:8, :16] = 255
    return Image.fromarray(pixels)


def hf_vit(folder):
    config = transformers.ViTConfig(**HF_VISION, num_labels=CLASSES)
    model = hf_random(transformers.ViTForImageClassification, config).eval()
    model.save_pretrained(folder)
    return vit.load(folder, device="cpu"), lambda x: model(pixel_values=x).logits


def hf_dinov2_registers(folder):
    config = transformers.Dinov2WithRegistersConfig(**HF_VISION, num_register_tokens=4, num_labels=CLASSES)
    model = hf_random(transformers.Dinov2WithRegistersForImageClassification, config).eval()
    model.save_pretrained(folder)
    return vit.load(folder, device="cpu"), lambda x: model(pixel_values=x).logits


def hf_siglip_tower(folder):
    """A SigLIP tower has no classes: the same linear head on its pooled output, ours and the library's."""
    model = hf_random(transformers.SiglipVisionModel, transformers.SiglipVisionConfig(**HF_VISION)).eval()
    model.save_pretrained(folder)
    checkpoint = vit.load(folder, device="cpu")
    torch.manual_seed(1)
    head = torch.nn.Linear(HF_VISION["hidden_size"], CLASSES)
    checkpoint.model.head = head
    return checkpoint, lambda x: head(model(pixel_values=x).pooler_output)


FAMILIES = {"hf_vit": hf_vit, "dinov2_registers": hf_dinov2_registers, "siglip_tower": hf_siglip_tower}


def patch_grid_by_hand(attribution: torch.Tensor, grid: tuple[int, int], mean: bool) -> np.ndarray:
    """``(1, C, H, W)`` -> ``(gh, gw)``: summed over the channels and each patch's pixels (or their mean)."""
    _, C, H, W = attribution.shape
    gh, gw = grid
    cells = attribution[0].reshape(C, gh, H // gh, gw, W // gw)
    reduced = cells.mean(dim=(0, 2, 4)) if mean else cells.sum(dim=(0, 2, 4))
    return reduced.detach().numpy()


def captums_own(method: str, forward, x: torch.Tensor, grid: tuple[int, int]) -> np.ndarray:
    """captum's call with its defaults (one batch: its own), the patch mask written out here."""
    gh, gw = grid
    p = x.shape[2] // gh
    mask = torch.tensor([[(r // p) * gw + c // p for c in range(x.shape[3])] for r in range(x.shape[2])])[None, None]
    x = x.clone().requires_grad_(True)
    torch.manual_seed(0)
    if method in ("integrated_gradients", "smoothgrad", "input_x_gradient"):
        result = captums_gradient(method, forward, x)
    elif method == "occlusion":
        result = captum_attr.Occlusion(forward).attribute(x, sliding_window_shapes=(3, p, p), strides=(3, p, p),
                                                          target=TARGET)
    elif method == "feature_ablation":
        result = captum_attr.FeatureAblation(forward).attribute(x, target=TARGET, feature_mask=mask)
    else:
        result = captum_attr.KernelShap(forward).attribute(x, target=TARGET, feature_mask=mask)
    return patch_grid_by_hand(result, grid, mean=method in captum_maps.PATCH_METHODS)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_captum_method_equals_captums_own_call_on(tmp_path, family):
    checkpoint, forward = FAMILIES[family](tmp_path / family)
    x = preprocess([image()], checkpoint.preprocessing, SIZE, checkpoint.model.config.patch_size)
    with torch.no_grad():
        assert torch.allclose(checkpoint.model(x)[0], forward(x), atol=1e-4)  # the same model
    grid = checkpoint.model.patch_grid(*x.shape[2:])
    for method in captum_maps.CAPTUM_METHODS:
        expected = captums_own(method, forward, x, grid)
        # in batches other than captum's one: the same numbers
        options = {} if method == "input_x_gradient" else {"batch": 3}
        ours = model_method_map(checkpoint, image(), method, TARGET, size=SIZE, options=options)
        assert ours.shape == grid
        np.testing.assert_allclose(ours, expected, rtol=1e-3, atol=1e-5 * np.abs(expected).max(),
                                   err_msg=f"{family} {method}")


def test_smoothgrad_never_seeds_the_generator_every_thread_shares(monkeypatch):
    """The threads test below cannot hit SmoothGrad's old window (between its seed of torch's global generator and
    its one draw) reliably: this one says the window is gone. The map is drawn from a generator of its own, whatever
    the global one holds, and the global one is neither seeded nor drawn from."""
    torch.manual_seed(0)
    head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, CLASSES))
    x = torch.randn(1, 3, 16, 16)
    options = captum_maps.Options.of("smoothgrad", {"nt_samples": 4, "seed": 3})
    first = captum_maps.attribution(head, x, "smoothgrad", TARGET, (4, 4), options, 2)

    def seeded(*args, **kwargs):
        raise AssertionError("torch's global generator was seeded")

    for name in ("manual_seed", "seed"):
        monkeypatch.setattr(torch, name, seeded)
        monkeypatch.setattr(torch.random, name, seeded)
    state = torch.get_rng_state()
    again = captum_maps.attribution(head, x, "smoothgrad", TARGET, (4, 4), options, 2)
    assert torch.equal(torch.get_rng_state(), state), "nothing drawn from the global generator"
    torch.testing.assert_close(again, first, rtol=0, atol=0)


@pytest.mark.parametrize("method", ["kernel_shap", "smoothgrad"])
def test_seeded_maps_computed_at_once_are_each_the_one_computed_alone(method):
    """The server computes visitors' maps at once, in threads, and torch's global generator is every thread's:
    KernelSHAP's coalitions and SmoothGrad's noise, drawn from it after each map's seed, took the others' draws (and
    ``fork_rng``'s restore rewound them), so a map was neither the one its link reproduces nor captum's call's."""
    import threading
    import time

    torch.manual_seed(0)  # not linear: a linear model's KernelSHAP and gradients are the same whatever is drawn
    head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, CLASSES))

    def forward(images):  # each forward lets the other threads run
        time.sleep(0.002)
        return head(images)

    x = torch.randn(1, 3, 16, 16)
    count = {"n_samples": 40} if method == "kernel_shap" else {"nt_samples": 40}

    def computed(seed):
        options = captum_maps.Options.of(method, {**count, "seed": seed})
        return captum_maps.attribution(forward, x, method, TARGET, (4, 4), options, 1)

    seeds = range(4)
    alone = [computed(seed) for seed in seeds]
    together = [None] * len(seeds)
    threads = [threading.Thread(target=lambda s=s: together.__setitem__(s, computed(s))) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for seed in seeds:  # the same draws; the sums' order may differ with the threads torch's kernels use
        torch.testing.assert_close(together[seed], alone[seed], rtol=1e-5, atol=1e-6, msg=f"seed {seed}")


def test_occlusion_with_its_own_window_and_stride_equals_captums(tmp_path):
    checkpoint, forward = hf_vit(tmp_path / "vit")
    x = preprocess([image()], checkpoint.preprocessing, SIZE, 8)
    expected = captum_attr.Occlusion(forward).attribute(x, sliding_window_shapes=(3, 12, 12), strides=(3, 4, 4),
                                                        baselines=0.5, target=TARGET)
    ours = model_method_map(checkpoint, image(), "occlusion", TARGET,
                            options={"sliding_window_shapes": 12, "strides": 4, "baselines": 0.5})
    np.testing.assert_allclose(ours, patch_grid_by_hand(expected, (4, 4), mean=True), rtol=1e-3, atol=1e-7)


def test_the_patch_mask_numbers_the_patches_row_major_on_a_non_square_grid():
    mask = captum_maps.feature_mask((2, 3), (4, 6))  # patches of 2 x 2 px
    assert mask.shape == (1, 1, 4, 6) and mask.dtype == torch.long
    assert mask[0, 0].tolist() == [[0, 0, 1, 1, 2, 2], [0, 0, 1, 1, 2, 2],
                                   [3, 3, 4, 4, 5, 5], [3, 3, 4, 4, 5, 5]]


def test_rise_equals_the_authors_code_with_the_same_masks(tmp_path):
    pytest.importorskip("skimage")  # the authors' generate_masks resizes with it
    from tests.reference.rise.explanations import RISE

    checkpoint, forward = hf_vit(tmp_path / "vit")
    x = preprocess([image()], checkpoint.preprocessing, SIZE, 8)
    options = {"n_masks": 40, "s": 3, "p1": 0.4, "seed": 5, "batch": 16}
    theirs = RISE(torch.nn.Sequential(_Logits(forward), torch.nn.Softmax(dim=1)), (32, 32), gpu_batch=100)
    np.random.seed(5)  # their masks from numpy's global state, ours from RandomState(seed): the same draws
    theirs.generate_masks(N=40, s=3, p1=0.4, savepath=None)
    ours_masks = captum_maps.rise_module.Masks(40, 3, 0.4, (32, 32), seed=5)
    torch.testing.assert_close(ours_masks.batch(0, 40), theirs.masks[:, 0], rtol=0, atol=1e-6)
    with torch.no_grad():
        saliency = theirs(x)[TARGET][None, None]  # (1, 1, H, W)
    ours = model_method_map(checkpoint, image(), "rise", TARGET, size=SIZE, options=options)
    np.testing.assert_allclose(ours, patch_grid_by_hand(saliency, (4, 4), mean=False), rtol=1e-4, atol=1e-6)


def test_vit_explain_runs_rise_with_the_masks_it_is_given_and_says_how_many(tmp_path):
    # Issue 90, item 8: the explorer's first look runs fewer masks than the authors' 6,000; vit.explain's n_masks is
    # that count: the authors' code with the same N gives the map, the caption names it, and left out it is theirs.
    pytest.importorskip("skimage")
    from tests.reference.rise.explanations import RISE

    checkpoint, forward = hf_vit(tmp_path / "vit")
    x = preprocess([image()], checkpoint.preprocessing, SIZE, 8)
    theirs = RISE(torch.nn.Sequential(_Logits(forward), torch.nn.Softmax(dim=1)), (32, 32), gpu_batch=100)
    np.random.seed(3)
    theirs.generate_masks(N=120, s=4, p1=0.3, savepath=None)
    with torch.no_grad():
        saliency = theirs(x)[TARGET][None, None]  # (1, 1, H, W)
    shown = vit.explain(checkpoint, image(), "rise", target=TARGET, size=32, n_masks=120, s=4, p1=0.3, seed=3)
    np.testing.assert_allclose(shown.map, patch_grid_by_hand(saliency, (4, 4), mean=False), rtol=1e-4, atol=1e-6)
    assert "the mean of 120 random masks (4x4 cells" in shown.description
    assert captum_maps.Options().n_masks == 6000 and captum_maps.rise_module.FIRST_LOOK_MASKS == 1000
    assert "the mean of 6,000 random masks" in captum_maps.caption("rise")[1]


def test_rise_draws_its_grids_a_few_at_a_time_and_still_gives_the_authors_masks(monkeypatch):
    # Issue 95: the N x s x s float64 draw is gone; grids drawn in pieces of one stream are the authors' grids.
    pytest.importorskip("skimage")
    from tests.reference.rise.explanations import RISE

    rise = captum_maps.rise_module
    monkeypatch.setattr(rise, "DRAW_BYTES", 8 * 5 * 5 * 3)  # three 5 x 5 grids a draw: 7 draws for 20 masks
    assert rise.draw_masks(5) == 3
    theirs = RISE(torch.nn.Identity(), (32, 32))
    np.random.seed(7)
    theirs.generate_masks(N=20, s=5, p1=0.3, savepath=None)
    ours = rise.Masks(20, 5, 0.3, (32, 32), seed=7)
    assert ours.bits.nbytes == 20 * 4  # 25 bits a grid, in 4 bytes
    torch.testing.assert_close(torch.cat([ours.batch(0, 7), ours.batch(7, 20)]), theirs.masks[:, 0], rtol=0,
                               atol=1e-6)


RISE_PEAK = """
import sys
sys.path.insert(0, sys.argv[1])
from peak_memory import peak, start
from vit.explain.views.method_maps import model_method_map
from vit.model import ViT, ViTConfig
from vit.checkpoint import Checkpoint, Preprocessing
from PIL import Image
model = ViT(ViTConfig(image_size=32, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_size=32)).eval()
checkpoint = Checkpoint(model, [str(i) for i in range(10)], Preprocessing(32, 3, (0.5,) * 3, (0.25,) * 3), {})
image = Image.new("RGB", (32, 32), (90, 120, 30))
model_method_map(checkpoint, image, "rise", 1, options={"n_masks": 4, "s": 8})  # everything imported and warm
before = start()
model_method_map(checkpoint, image, "rise", 1, options={"n_masks": 60, "s": 1024, "batch": 4})
print(peak() - before)
"""


@pytest.fixture(scope="module")
def measured():
    """``run_measured``, for the tests that measure a peak: a fixture built once per module keeps them on one xdist
    worker (tests/conftest.py's ``_item_group``), so one measuring server (``peak_memory.PRELOAD``'s imports, ~3 s of
    CPU) forks all five; spread over the four workers, each started a server of its own (issue 112: the measuring
    server's 12.7 s of CPU in a whole run)."""
    return run_measured


@pytest.mark.scenario  # a measured peak, in a process of its own (forked from the measuring server)
@pytest.mark.skipif(not can_reset_the_peak(), reason="the peak RSS cannot be reset here (/proc/self/clear_refs)")
def test_rise_with_a_fine_grid_holds_what_is_counted_not_every_grid_at_once(measured):
    # Issue 95: /?map=rise&attr=n_masks=300,s=1024 grew the server by 3 GB (every grid drawn in float64 at once).
    # 60 grids of 1024 x 1024 cells: ~1.3 GB that way; as bits 7.5 MB, formed 4 at a time ~37 MB more.
    rise = captum_maps.rise_module
    counted = rise.held_bytes(60, 1024) + 4 * rise.batch_bytes(1024, (32, 32))
    assert counted < 100 * 2**20
    done = measured(RISE_PEAK, [str(Path(__file__).parent)], timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    grown = int(done.stdout.split()[-1])
    assert grown < counted + 150 * 2**20, (grown, counted)  # the slack: allocator pages, the forwards, 8x below 1.3 GB


ATTRIBUTION_PEAK = """
import json, sys
sys.path.insert(0, sys.argv[1])
from peak_memory import peak, start
from PIL import Image
from vit.checkpoint import Checkpoint, Preprocessing
from vit.core.inference import InputSize
from vit.costs import plan
from vit.explain.views.method_maps import model_method_map
from vit.model import ViT, ViTConfig
method, size, options = json.loads(sys.argv[2])
model = ViT(ViTConfig(image_size=224, patch_size=16, hidden_size=32, num_layers=2, num_heads=2, mlp_size=64)).eval()
checkpoint = Checkpoint(model, [str(i) for i in range(10)], Preprocessing(224, 3, (0.5,) * 3, (0.25,) * 3), {})
warm = {k: v for k, v in options.items() if k != "n_steps"}
model_method_map(checkpoint, Image.new("RGB", (64, 64)), method, 1, size=InputSize(64), options=warm)
counted, decide = [], plan.decide
plan.decide = lambda cost: (counted.append(cost.memory if cost.view == "attribution" else 0), decide(cost))[1]
before = start()
model_method_map(checkpoint, Image.new("RGB", (size, size), (90, 120, 30)), method, 1, size=InputSize(size),
                 options=options)
print(json.dumps([peak() - before, max(counted)]))
"""


@pytest.mark.scenario  # a measured peak, in a process of its own (forked from the measuring server)
@pytest.mark.skipif(not can_reset_the_peak(), reason="the peak RSS cannot be reset here (/proc/self/clear_refs)")
@pytest.mark.parametrize(("method", "size", "options"), [
    ("occlusion", 192, {"batch": 32}), ("feature_ablation", 192, {"batch": 32}),
    ("integrated_gradients", 64, {"n_steps": 2000}), ("smoothgrad", 160, {"nt_samples": 500})])
def test_an_attribution_holds_no_more_than_it_counted(measured, method, size, options):
    # Issue 95: captum's perturbations form each pass's input beside its forward (occlusion at 1,024 px counted at
    # 1,020 MB, killed at 3 GB), and IG's Gauss-Legendre weights cost n_steps² before any forward (10,000 steps:
    # 2.1 GB). At 384 px: 509, 303 and 60 MB measured; counted before, 77, 77 and 16; counted now, 554, 338 and 77.
    # SmoothGrad draws all its noise first (issue 90): at 256 px 555 MB measured, 636 counted (260 without the
    # noise). The sizes here are the smallest where what was missed still dominates, a quarter of the pixels (an
    # occlusion's time grows with their square): 124, 74 and 196 MB measured, 139, 85 and 249 counted (idle machine).
    done = measured(ATTRIBUTION_PEAK, [str(Path(__file__).parent), json.dumps([method, size, options])],
                    timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    grown, counted = json.loads(done.stdout.split("\n")[-2])
    assert grown <= counted * 1.15 + 20 * 2**20, (grown / 2**20, counted / 2**20)


def test_integrated_gradients_steps_are_bounded_where_the_quadrature_costs_more_than_the_forwards(tmp_path):
    with pytest.raises(ValueError, match="n_steps must be between 1 and 2,000; got 10000"):
        captum_maps.Options.of("integrated_gradients", {"n_steps": 10_000})
    with pytest.raises(ValueError, match="n_steps must be between 1 and 2,000"):
        captum_maps.parse_options("n_steps=10000")


def test_rises_masks_are_counted_before_the_work(tmp_path, monkeypatch):
    checkpoint, _ = hf_vit(tmp_path / "vit")
    monkeypatch.setattr(captum_maps.rise_module, "Masks", lambda *a, **k: pytest.fail("drew the masks"))
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "64")
    with pytest.raises(TooManyTokens, match="fewer masks or a smaller s"):  # 100,000 x 1024² bits: 13 GB
        model_method_map(checkpoint, image(), "rise", TARGET, size=SIZE, options={"n_masks": 100_000, "s": 1024})


class _Logits(torch.nn.Module):
    def __init__(self, forward):
        super().__init__()
        self.forward_logits = forward

    def forward(self, x):
        return self.forward_logits(x)


def test_rise_and_smoothgrad_are_seeded(tmp_path):
    checkpoint, _ = hf_vit(tmp_path / "vit")
    for method, options in (("rise", {"n_masks": 20}), ("smoothgrad", {})):
        first = model_method_map(checkpoint, image(), method, TARGET, options={**options, "seed": 1})
        again = model_method_map(checkpoint, image(), method, TARGET, options={**options, "seed": 1})
        other = model_method_map(checkpoint, image(), method, TARGET, options={**options, "seed": 2})
        np.testing.assert_array_equal(first, again)
        assert not np.allclose(first, other)


def test_seeded_smoothgrad_is_captums_one_batch_call_whatever_the_batch(tmp_path):
    # Issue 90: captum draws each batch's noise with one torch.normal, whose draws depend on the size when C x H x W is
    # not a multiple of 16 (DINOv2-S/14 at 518 px moved 4.5-30 % with the batch). 7-px patches, 21 px: 3 x 441 = 1,323.
    config = transformers.ViTConfig(**{**HF_VISION, "image_size": 21, "patch_size": 7}, num_labels=CLASSES)
    model = hf_random(transformers.ViTForImageClassification, config).eval()
    model.save_pretrained(tmp_path / "vit")
    checkpoint = vit.load(tmp_path / "vit", device="cpu")
    size = InputSize(21)
    x = preprocess([image()], checkpoint.preprocessing, size, 7)
    assert x.shape[1:].numel() % 16  # the sizes where captum's draws depend on the batch
    grid = checkpoint.model.patch_grid(*x.shape[2:])
    torch.manual_seed(3)
    result = captum_attr.NoiseTunnel(captum_attr.Saliency(lambda images: model(pixel_values=images).logits)).attribute(
        x.clone().requires_grad_(True), nt_type="smoothgrad", nt_samples=7, nt_samples_batch_size=7, stdevs=0.5,
        target=TARGET, abs=False)
    expected = patch_grid_by_hand(result, grid, mean=False)
    for batch in (1, 3, None):  # None: the default, the most that fit the memory limit
        options = {"nt_samples": 7, "stdevs": 0.5, "seed": 3, "batch": batch}
        ours = model_method_map(checkpoint, image(), "smoothgrad", TARGET, size=size, options=options)
        np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max(),
                                   err_msg=f"batch {batch}")


def test_an_attribution_over_its_limits_is_refused_before_the_work(tmp_path, monkeypatch):
    checkpoint, _ = hf_vit(tmp_path / "vit")
    ran = []
    monkeypatch.setattr(captum_maps, "attribution", lambda *a, **k: ran.append(1))
    from vit.costs import plan

    monkeypatch.setattr(plan, "MAX_PASSES", 1000)
    with pytest.raises(TooManyTokens, match="Occlusion would run 1,025 forwards of the model, over the limit of 1,000"):
        model_method_map(checkpoint, image(), "occlusion", TARGET, options={"sliding_window_shapes": 1, "strides": 1})
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.01")
    with pytest.raises(TooManyTokens, match=r"Integrated gradients runs 50 forward and backwards .* 8 at once"):
        model_method_map(checkpoint, image(), "integrated_gradients", TARGET, options={"batch": 8})
    with pytest.raises(ValueError, match="n_steps must be between 1 and 2,000; got 0"):
        model_method_map(checkpoint, image(), "integrated_gradients", TARGET, options={"n_steps": 0})
    with pytest.raises(ValueError, match="occlusion does not take n_steps; it takes sliding_window_shapes"):
        model_method_map(checkpoint, image(), "occlusion", TARGET, options={"n_steps": 5})
    with pytest.raises(ValueError, match="larger than the 32x32 px input"):
        model_method_map(checkpoint, image(), "occlusion", TARGET, options={"sliding_window_shapes": 40})
    assert not ran


def test_occlusion_strides_past_its_window_are_refused_in_one_line_before_captums_assertion(tmp_path, monkeypatch):
    """captum asserts that a stride is at most the window wherever the window does not cover the input (issue 95,
    item 6: its AssertionError reached the page as a traceback): refused before the work, saying what to choose."""
    checkpoint, _ = hf_vit(tmp_path / "vit")
    ran = []
    monkeypatch.setattr(captum_maps, "attribution", lambda *a, **k: ran.append(1))
    with pytest.raises(ValueError, match=r"^occlusion's strides 12 px are larger than its 4x4 px window, so the pixels "
                                         r"between two windows would never be occluded; choose strides of at most 4 "
                                         r"px") as refused:
        vit.explain(checkpoint, image(), "occlusion", target=TARGET, sliding_window_shapes=4, strides=12)
    assert "\n" not in str(refused.value) and not ran
    monkeypatch.undo()
    whole = vit.explain(checkpoint, image(), "occlusion", target=TARGET, sliding_window_shapes=32, strides=40)
    assert whole.map.shape == (4, 4)  # a window as large as the input: one position, any stride (captum's too)


def test_vit_explain_takes_captums_parameters_as_keywords_and_refuses_them_elsewhere(tmp_path):
    checkpoint, forward = hf_vit(tmp_path / "vit")
    x = preprocess([image()], checkpoint.preprocessing, SIZE, 8)
    expected = captum_attr.IntegratedGradients(forward).attribute(x, baselines=0.25, target=TARGET, n_steps=7)
    shown = vit.explain(checkpoint, image(), "integrated_gradients", target=TARGET, size=32, n_steps=7,
                        baselines=0.25)
    np.testing.assert_allclose(shown.map, expected.sum(dim=1)[0].detach().numpy(), rtol=1e-3,
                               atol=1e-5 * float(expected.abs().max()))
    assert shown.description.startswith("Integrated Gradients for")  # plain text
    # the caption names the settings it ran with, not captum's defaults
    assert "from a baseline of 0.25 in the model's normalised input" in shown.description, shown.description
    assert "captum's, 7 steps" in shown.description and "50 steps" not in shown.description, shown.description
    defaults = vit.explain(checkpoint, image(), "kernel_shap", target=TARGET, size=32, n_samples=4)
    assert "from 4 random coalitions" in defaults.description, defaults.description
    with pytest.raises(ValueError, match="rollout takes no options"):
        vit.explain(checkpoint, image(), "rollout", n_steps=7)
    with pytest.raises(ValueError, match="smoothgrad's nt_samples must be an integer; got 2.5"):
        vit.explain(checkpoint, image(), "smoothgrad", nt_samples=2.5)


def test_the_benchmark_cli_scores_them_with_their_options(tmp_path, capsys):
    import json

    from tests.test_faithfulness_chefer import tiny_model_and_images
    from vit import faithfulness

    checkpoint = tiny_model_and_images(tmp_path, labelled=True)
    argv = [str(checkpoint), "--benchmark", "road", "--data", str(tmp_path / "data"), "--batch-size", "4"]
    code = faithfulness.main([*argv, "--methods", "random,kernel_shap,rise", "--option", "n_samples=8,n_masks=16",
                              "seed=3"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert list(json.loads(out.out)["methods"]) == ["random", "kernel_shap", "rise"]
    assert faithfulness.main([*argv, "--methods", "rise", "--option", "n_steps=8"]) != 0
    assert "--option n_steps: none of the methods scored takes it (captum's attributions and RISE do: " \
           "integrated_gradients)" in capsys.readouterr().err


def test_a_zero_baseline_is_said_to_be_the_mean_colour_it_is_not_black(tmp_path):
    # Issue 90: IG's caption said "a black baseline"; zeros in the normalised input are the preprocessing's mean.
    checkpoint, _ = hf_vit(tmp_path / "vit")
    p = checkpoint.preprocessing
    zeros_as_pixels = torch.tensor(p.mean) + 0 * torch.tensor(p.std)  # x = (pixel - mean) / std = 0
    assert not torch.allclose(zeros_as_pixels, torch.zeros(3))  # this model's zeros are not black
    for method in ("integrated_gradients", "occlusion", "feature_ablation", "kernel_shap"):
        _, said = captum_maps.caption(method)
        assert "black" not in said and "mean colour" in said and "normalised input" in said, said
    _, said = captum_maps.caption("integrated_gradients", captum_maps.Options(baselines=0.5))
    assert "a baseline of 0.5 in the model's normalised input" in said


# Issue 90, item 3: a pixel method's map is captum's attribution summed over the colour channels, on the model's
# input pixels, signed; its patch sums only on request (the benchmarks'), and it is drawn at pixel resolution.
PIXEL_METHODS = ("integrated_gradients", "smoothgrad", "input_x_gradient")


def captums_gradient(method: str, forward, x: torch.Tensor) -> torch.Tensor:
    """captum's own call of a gradient method with its defaults (seed 0, one batch): ``(1, C, H, W)``."""
    x = x.clone().requires_grad_(True)
    torch.manual_seed(0)
    if method == "integrated_gradients":
        return captum_attr.IntegratedGradients(forward).attribute(x, target=TARGET)
    if method == "smoothgrad":
        return captum_attr.NoiseTunnel(captum_attr.Saliency(forward)).attribute(x, nt_type="smoothgrad",
                                                                                target=TARGET, abs=False)
    return captum_attr.InputXGradient(forward).attribute(x, target=TARGET)


def captums_pixels(method: str, forward, x: torch.Tensor) -> torch.Tensor:
    """captum's own call summed over the colour channels: ``(H, W)``."""
    return captums_gradient(method, forward, x).detach().sum(dim=1)[0]


def test_the_pixel_methods_are_the_registrys(tmp_path):
    from vit import registry

    assert tuple(m.name for m in registry.methods() if m.pixels) == captum_maps.PIXEL_METHODS == PIXEL_METHODS


@pytest.mark.parametrize("family", FAMILIES)
def test_a_pixel_methods_map_is_captums_attribution_summed_over_the_channels_on_the_input_pixels(tmp_path, family):
    checkpoint, forward = FAMILIES[family](tmp_path / family)
    x = preprocess([image()], checkpoint.preprocessing, SIZE, checkpoint.model.config.patch_size)
    for method in PIXEL_METHODS:
        expected = captums_pixels(method, forward, x).numpy()  # (32, 32), signed
        assert (expected < 0).any() and (expected > 0).any()
        ours = model_method_map(checkpoint, image(), method, TARGET, size=SIZE, pixels=True)
        assert ours.shape == x.shape[2:]
        np.testing.assert_allclose(ours, expected, rtol=1e-3, atol=1e-5 * np.abs(expected).max(),
                                   err_msg=f"{family} {method}")
    with pytest.raises(ValueError, match="occlusion's map is on the patch grid"):
        model_method_map(checkpoint, image(), "occlusion", TARGET, size=SIZE, pixels=True)


@pytest.mark.parametrize("method", PIXEL_METHODS)
def test_vit_explain_gives_a_pixel_methods_map_on_the_input_pixels_and_its_patch_sums_on_request(tmp_path, method):
    checkpoint, forward = hf_vit(tmp_path / "vit")
    x = preprocess([image()], checkpoint.preprocessing, SIZE, 8)
    expected = captums_pixels(method, forward, x)  # (32, 32)
    shown = vit.explain(checkpoint, image(), method, target=TARGET, size=32)
    assert shown.pixels and shown.map.shape == (32, 32) and shown.grid == (4, 4)
    atol = 1e-5 * float(expected.abs().max())
    np.testing.assert_allclose(shown.map, expected.numpy(), rtol=1e-3, atol=atol)
    by_patch = expected.reshape(4, 8, 4, 8).sum(dim=(1, 3)).numpy()  # (4, 4): each patch's 8 x 8 pixels
    summed = vit.explain(checkpoint, image(), method, target=TARGET, size=32, patch_sums=True)
    assert not summed.pixels and summed.map.shape == (4, 4)
    np.testing.assert_allclose(summed.map, by_patch, rtol=1e-3, atol=atol)
    np.testing.assert_allclose(shown.patch_sums(), by_patch, rtol=1e-3, atol=atol)
    assert "each of the model's input pixels" in shown.description, shown.description
    assert "each patch's pixels" in summed.description, summed.description


def test_a_pixel_map_is_drawn_at_pixel_resolution_over_the_seen_pixels(tmp_path):
    from vit.explain.views.overlay import colorize, map_colours

    checkpoint, forward = hf_vit(tmp_path / "vit")
    x = preprocess([image()], checkpoint.preprocessing, SIZE, 8)
    expected = captums_pixels("input_x_gradient", forward, x).numpy()  # (32, 32)
    shown = vit.explain(checkpoint, image(), "input_x_gradient", target=TARGET, size=32)
    drawn = np.asarray(shown.overlay(alpha=1.0, scale=1), dtype=np.int16)  # (32, 32, 3): the 32-px image's own
    assert drawn.shape == (32, 32, 3)
    # each pixel the colour of its own value on the diverging scale (captum's pixels, not a patch's)
    cmap, vmin, vmax = map_colours("input_x_gradient", expected, "inferno")
    assert np.abs(drawn - colorize(expected, cmap, vmin, vmax).astype(np.int16)).max() <= 1
    patches = drawn.reshape(4, 8, 4, 8, 3)
    assert all(len(np.unique(patches[r, :, c].reshape(-1, 3), axis=0)) > 16 for r in range(4) for c in range(4))


def test_a_pixel_maps_npz_keeps_the_patch_grid_map_and_adds_the_pixels_and_its_export_hovers_patches(tmp_path):
    checkpoint, _ = hf_vit(tmp_path / "vit")
    shown = vit.explain(checkpoint, image(), "input_x_gradient", target=TARGET, size=32)
    with np.load(shown.save(tmp_path / "map.npz")) as saved:
        assert saved["map"].shape == (4, 4) and saved["pixel_map"].shape == (32, 32)
        np.testing.assert_allclose(saved["map"], shown.patch_sums(), rtol=1e-6)
        np.testing.assert_array_equal(saved["pixel_map"], shown.map)
    page = shown.to_html(tmp_path / "map.html").read_text()
    assert "row 4, column 4" in page and "row 5," not in page  # hovered per patch, not per pixel


def test_the_benchmarks_get_a_pixel_methods_patch_sums(tmp_path):
    from vit.explain.benchmarks import benchmark_run

    checkpoint, forward = hf_vit(tmp_path / "vit")
    x = preprocess([image()], checkpoint.preprocessing, SIZE, 8)
    pixels = torch.from_numpy(np.asarray(image())).permute(2, 0, 1)[None]  # (1, 3, 32, 32) uint8
    maps = benchmark_run.method_maps(checkpoint, x, pixels, "input_x_gradient", torch.tensor([TARGET]), None,
                                     explain=vit.explain)
    expected = captums_pixels("input_x_gradient", forward, x).reshape(4, 8, 4, 8).sum(dim=(1, 3))
    assert maps.shape == (1, 4, 4)
    torch.testing.assert_close(maps[0], expected, rtol=1e-3, atol=1e-5 * float(expected.abs().max()))


def test_a_black_baseline_is_captums_call_with_the_black_image_the_preprocessing_makes(tmp_path):
    """Issue 90, item 6: ``baseline="black"`` is a black image normalised as the model's input is (this model's
    zeros are its mean colour), Integrated Gradients' path and feature ablation's replacement both; the caption says
    which baseline ran, and the link's ``attr`` keeps it."""
    checkpoint, forward = hf_vit(tmp_path / "vit")
    x = preprocess([image()], checkpoint.preprocessing, SIZE, 8)
    black = preprocess([Image.new("RGB", (32, 32))], checkpoint.preprocessing, SIZE, 8)  # (1, 3, 32, 32)
    assert not torch.allclose(black, torch.zeros_like(black))
    expected = captum_attr.IntegratedGradients(forward).attribute(x, baselines=black, target=TARGET, n_steps=7)
    shown = vit.explain(checkpoint, image(), "integrated_gradients", target=TARGET, size=32, n_steps=7,
                        baseline="black")
    np.testing.assert_allclose(shown.map, expected.sum(dim=1)[0].detach().numpy(), rtol=1e-3,
                               atol=1e-5 * float(expected.abs().max()))
    assert "from a black image (baseline=black) to the image" in shown.description, shown.description
    zeros = vit.explain(checkpoint, image(), "integrated_gradients", target=TARGET, size=32, n_steps=7)
    assert not np.allclose(zeros.map, shown.map)  # the mean colour's path is another
    p = x.shape[2] // 4
    mask = torch.tensor([[(r // p) * 4 + c // p for c in range(32)] for r in range(32)])[None, None]
    ablated = captum_attr.FeatureAblation(forward).attribute(x, baselines=black, target=TARGET, feature_mask=mask)
    shown = vit.explain(checkpoint, image(), "feature_ablation", target=TARGET, size=32, baseline="black")
    np.testing.assert_allclose(shown.map, patch_grid_by_hand(ablated, (4, 4), mean=True), rtol=1e-4, atol=1e-6)
    assert "set to black (baseline=black)" in shown.description, shown.description
    chosen = captum_maps.chosen_options("integrated_gradients", {"baseline": "black", "n_steps": 7})
    assert captum_maps.options_text(chosen) == "n_steps=7,baseline=black"
    assert captum_maps.parse_options("n_steps=7,baseline=black") == (("n_steps", 7), ("baseline", "black"))
    with pytest.raises(ValueError, match="baseline must be one of value, black"):
        captum_maps.parse_options("baseline=white")
    with pytest.raises(ValueError, match="smoothgrad does not take baseline"):
        vit.explain(checkpoint, image(), "smoothgrad", baseline="black")
