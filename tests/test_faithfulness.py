"""Deletion and insertion curves on a toy model whose probabilities are known by hand, and the CLI."""

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from vit import faithfulness
from vit.checkpoint import save_checkpoint
from vit.explain.benchmarks.metrics import METHODS, auc, baseline, method_maps, perturbation_curves, step_counts
from vit.explain.views.dataset import sample_files
from vit.model import ViT, ViTConfig


class SumModel(torch.nn.Module):
    """Two classes with logits ``[sum of pixels, 0]``: P(class 0) = sigmoid(sum)."""

    def forward(self, x):
        s = x.sum(dim=(1, 2, 3))
        return torch.stack([s, torch.zeros_like(s)], dim=-1), None


def sigmoid(v: float) -> float:
    return 1 / (1 + math.exp(-v))


IMAGE = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])  # (1, 1, 2, 2): four 1-px patches
MAP = torch.tensor([[[0.1, 0.4], [0.3, 0.2]]])  # ranks patches 1, 2, 3, 0 (values 2, 3, 4, 1)


def test_deletion_and_insertion_follow_the_maps_order_by_hand():
    fractions, deletion, insertion = perturbation_curves(SumModel(), IMAGE, MAP, torch.tensor([0]), "zero")
    np.testing.assert_allclose(fractions, [0, 0.25, 0.5, 0.75, 1])
    np.testing.assert_allclose(deletion[0], [sigmoid(v) for v in (10, 8, 5, 1, 0)], rtol=1e-6)
    np.testing.assert_allclose(insertion[0], [sigmoid(v) for v in (0, 2, 5, 9, 10)], rtol=1e-6)


def test_auc_is_the_trapezoid_rule():
    fractions = np.array([0, 0.25, 0.5, 0.75, 1])
    curve = np.array([1.0, 0.5, 0.5, 0.0, 0.0])
    assert auc(fractions, curve) == pytest.approx(0.25 * (0.75 + 0.5 + 0.25 + 0))
    # a perfect deletion (drops to 0 at once) beats a reversed one on the toy model
    _, good, _ = perturbation_curves(SumModel(), IMAGE, IMAGE[:, 0], torch.tensor([0]), "zero")
    _, bad, _ = perturbation_curves(SumModel(), IMAGE, -IMAGE[:, 0], torch.tensor([0]), "zero")
    assert auc(fractions, good)[0] < auc(fractions, bad)[0]


def test_steps_group_patches_and_ties_keep_row_major_order():
    assert step_counts(4, 2) == [0, 2, 4]
    assert step_counts(10, 3) == [0, 3, 7, 10]
    flat = torch.zeros(1, 2, 2)  # all tied: patches 0, 1, 2, 3 in order (values 1, 2, 3, 4)
    _, deletion, _ = perturbation_curves(SumModel(), IMAGE, flat, torch.tensor([0]), "zero", steps=2)
    np.testing.assert_allclose(deletion[0], [sigmoid(10), sigmoid(7), sigmoid(0)], rtol=1e-6)


def test_mean_replacement_and_a_larger_patch_by_hand():
    # Pixel sums stay small so that sigmoid does not saturate to 1 and hide which patch was replaced.
    image = torch.arange(16.0).reshape(1, 1, 4, 4) / 16  # 2x2 grid of 2x2 patches; sum 7.5, mean 0.46875
    m = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])  # top-left patch first, then ties in row-major order
    # Patch sums: top-left (0+1+4+5)/16 = 0.625, top-right 1.125, bottom-left 2.625, bottom-right 3.125;
    # each replaced patch becomes 4 pixels of the mean, 1.875.
    _, deletion, _ = perturbation_curves(SumModel(), image, m, torch.tensor([0]), "mean", steps=4)
    sums = [7.5, 7.5 - 0.625 + 1.875, 8.75 - 1.125 + 1.875, 9.5 - 2.625 + 1.875, 8.75 - 3.125 + 1.875]
    np.testing.assert_allclose(deletion[0], [sigmoid(v) for v in sums], rtol=1e-6)
    _, deletion, _ = perturbation_curves(SumModel(), image, m, torch.tensor([0]), "mean", steps=1)
    np.testing.assert_allclose(deletion[0], [sigmoid(7.5), sigmoid(0.46875 * 16)], rtol=1e-6)


@pytest.mark.cuda
def test_curves_on_the_gpu_equal_the_hand_computed_ones():
    model = SumModel().cuda()
    fractions, deletion, insertion = perturbation_curves(model, IMAGE.cuda(), MAP.cuda(), torch.tensor([0]).cuda(),
                                                         "zero")
    np.testing.assert_allclose(deletion[0], [sigmoid(v) for v in (10, 8, 5, 1, 0)], rtol=1e-6)
    np.testing.assert_allclose(insertion[0], [sigmoid(v) for v in (0, 2, 5, 9, 10)], rtol=1e-6)


def test_baselines():
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(baseline(x, "zero"), torch.zeros_like(x))
    torch.testing.assert_close(baseline(x, "mean")[:, :, 3, 5], x.mean(dim=(2, 3)))
    constant = torch.full((1, 3, 8, 8), 0.7)
    torch.testing.assert_close(baseline(constant, "blur"), constant)  # blurring a flat image changes nothing
    assert baseline(x, "blur").std() < x.std()
    with pytest.raises(ValueError, match="blur, mean, zero"):
        baseline(x, "noise")


def test_every_method_gives_a_map_of_the_grid_for_a_batch():
    torch.manual_seed(0)
    model = ViT(ViTConfig(image_size=16, patch_size=4, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32,
                          num_classes=3)).eval()
    x = torch.randn(2, 3, 12, 16)
    for method in METHODS:
        maps = method_maps(model, x, method, torch.tensor([0, 2]), torch.Generator().manual_seed(0))
        assert maps.shape == (2, 3, 4), method
        assert torch.isfinite(maps).all(), method


def test_sample_files_is_seeded_and_limited():
    items = list(range(100))
    assert sample_files(items, 10, 0) == sample_files(items, 10, 0)
    assert sample_files(items, 10, 0) != items[:10]
    assert sorted(sample_files(items, None, 1)) == items


def test_cli_prints_json_per_method(tmp_path, capsys):
    torch.manual_seed(0)
    config = ViTConfig(image_size=16, patch_size=4, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32,
                       num_classes=2)
    save_checkpoint(tmp_path / "m.pt", ViT(config).eval(), ["cat", "dog"])
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (tmp_path / "data" / name).mkdir(parents=True)
        for i in range(2):
            pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "data" / name / f"{i}.png")
    code = faithfulness.main([str(tmp_path / "m.pt"), "--data", str(tmp_path / "data"), "--methods", "random",
                              "legrad", "--limit", "3", "--steps", "4"])
    out = capsys.readouterr()
    assert code == 0, out.err
    result = json.loads(out.out)
    assert result["images"] == 3 and result["replacement"] == "blur"
    assert set(result["methods"]) == {"random", "legrad"}
    for scores in result["methods"].values():
        assert 0 <= scores["deletion_auc"]["mean"] <= 1 and scores["insertion_auc"]["std"] >= 0
    assert "faithfulness" in out.err  # the progress bar


def test_a_method_named_many_times_is_scored_once(tmp_path):
    """Issue 114, finding 6: duplicates in the methods are merged, on the command line and in a run's settings."""
    from vit.explain.benchmarks.benchmark_run import Settings

    args = faithfulness.build_parser().parse_args([str(tmp_path), "--data", str(tmp_path), "--out", str(tmp_path),
                                                   "--methods", "legrad,random", "legrad", *["random"] * 1000])
    faithfulness.check_args(args)
    assert args.methods == ["legrad", "random"]
    assert Settings("saco", ("legrad",) * 1000 + ("random",)).methods == ("legrad", "random")


def test_cli_rejects_an_unknown_method_in_one_line(tmp_path, capsys):
    code = faithfulness.main([str(tmp_path / "none.pt"), "--data", str(tmp_path), "--methods", "magic"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown method(s) magic" in err and "Traceback" not in err


def test_the_cli_defaults_to_a_fixed_number_of_curve_points(tmp_path, monkeypatch, capsys):
    """One point per patch made ViT-S/16 take 196 steps x 14 curves per image: 20 steps whatever the grid."""
    torch.manual_seed(0)
    config = ViTConfig(image_size=32, patch_size=2, hidden_size=8, num_layers=1, num_heads=2, mlp_size=16,
                       num_classes=2)  # 256 patches
    save_checkpoint(tmp_path / "m.pt", ViT(config).eval(), ["cat", "dog"])
    for name in ("cat", "dog"):
        (tmp_path / "data" / name).mkdir(parents=True)
        Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(tmp_path / "data" / name / "0.png")
    seen = []
    from vit.explain.benchmarks import metrics as scores  # what the command runs (imported after parsing)

    real = scores.perturbation_curves

    def counting(model, x, maps, cls, replacement, steps=None):
        seen.append(steps)
        return real(model, x, maps, cls, replacement, steps)

    monkeypatch.setattr(scores, "perturbation_curves", counting)
    assert faithfulness.main([str(tmp_path / "m.pt"), "--data", str(tmp_path / "data"), "--methods", "random"]) == 0
    capsys.readouterr()
    assert seen == [faithfulness.DEFAULT_STEPS] == [20]
