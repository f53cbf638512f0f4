"""ROAD (remove and debias) against pytorch-grad-cam's metrics/road.py (tests/reference/pytorch_grad_cam, copied
verbatim): their NoisyLinearImputer, ROADMostRelevantFirst / LeastRelevantFirst and ROADCombined run unchanged on
the same model, maps and images, their noise drawn from the same seed."""

import numpy as np
import pytest
import torch

from tests.reference.pytorch_grad_cam.model_targets import ClassifierOutputSoftmaxTarget
from tests.reference.pytorch_grad_cam.road import (
    NoisyLinearImputer,
    ROADCombined,
    ROADLeastRelevantFirst,
    ROADMostRelevantFirst,
)
from vit.explain.benchmarks.metrics import input_maps, linear_impute, road_scores


class Logits(torch.nn.Module):
    """Their metrics read ``model(x)`` as logits; ours returns ``(logits, ...)``."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)[0]


def random_vit(channels: int = 3):
    from vit.model import ViT, ViTConfig

    torch.manual_seed(0)
    config = ViTConfig(image_size=24, patch_size=4, hidden_size=32, num_layers=2, num_heads=2, mlp_size=64,
                       num_classes=5, num_channels=channels)
    model = ViT(config).eval()
    with torch.no_grad():
        model.head.weight.mul_(40)  # confident answers, so that imputing pixels moves the probabilities
    return model


def images_and_maps(channels: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(4, channels, 24, 24, generator=g)  # rough: imputing pixels changes them
    maps = torch.rand(4, 6, 6, generator=g)
    maps[2] = (maps[2] * 3).round()  # ties
    return images, maps


@pytest.mark.parametrize("channels", [3, 1])
def test_linear_impute_equals_their_noisy_linear_imputer(channels):
    g = torch.Generator().manual_seed(3)
    images = torch.randn(3, channels, 9, 11, generator=g)
    keep = torch.rand(3, 9, 11, generator=g) > torch.tensor([0.3, 0.7, 0.95])[:, None, None]  # some at the edges
    torch.manual_seed(5)
    theirs = torch.stack([NoisyLinearImputer()(image, k.float()) for image, k in zip(images, keep, strict=True)])
    ours = linear_impute(images, keep, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    assert torch.equal(ours[keep[:, None].expand_as(ours)], images[keep[:, None].expand_as(images)])  # kept as is


def test_linear_impute_without_noise_solves_the_neighbour_equations():
    images = torch.zeros(1, 1, 3, 3)
    images[0, 0, 0] = torch.tensor([1.0, 2.0, 3.0])
    keep = torch.zeros(1, 3, 3, dtype=torch.bool)
    keep[0, 0] = True  # the top row known: the rest by the linear system
    out = linear_impute(images, keep, noise=0.0)[0, 0]
    # Each missing pixel equals the weighted mean (edges 1/6, corners 1/12) of its neighbours inside the image
    weights = {(1, 1): 1 / 12, (0, 1): 1 / 6, (-1, 1): 1 / 12, (1, -1): 1 / 12, (0, -1): 1 / 6, (-1, -1): 1 / 12,
               (1, 0): 1 / 6, (-1, 0): 1 / 6}
    for r in (1, 2):
        for c in range(3):
            near = [(w, float(out[r + dr, c + dc])) for (dr, dc), w in weights.items()
                    if 0 <= r + dr < 3 and 0 <= c + dc < 3]
            assert float(out[r, c]) == pytest.approx(sum(w * v for w, v in near) / sum(w for w, _ in near), abs=1e-6)


def test_linear_impute_of_a_flat_map_is_finite():
    images = torch.randn(2, 3, 5, 5)
    keep = torch.ones(2, 5, 5, dtype=torch.bool)
    keep[1] = False  # nothing kept: their system is singular
    keep[0, 2, 2] = False
    out = linear_impute(images, keep, noise=0.0)
    assert torch.isfinite(out).all() and torch.equal(out[1], torch.zeros(3, 5, 5))


@pytest.mark.parametrize("most_relevant_first, percentile", [(True, 80), (False, 20), (True, 35)])
def test_road_one_percentile_equals_theirs(most_relevant_first, percentile):
    model = random_vit()
    images, maps = images_and_maps()
    with torch.no_grad():
        predicted = model(images)[0].argmax(dim=-1)
    cams = input_maps(maps, (24, 24)).numpy()
    metric = (ROADMostRelevantFirst if most_relevant_first else ROADLeastRelevantFirst)(percentile)
    torch.manual_seed(7)
    theirs = metric(images, cams, [ClassifierOutputSoftmaxTarget(int(c)) for c in predicted], Logits(model))
    ours = road_scores(model, images, maps, predicted, most_relevant_first, (percentile,),
                       generator=torch.Generator().manual_seed(7), batch_size=3)
    np.testing.assert_allclose(ours[0], theirs, atol=1e-6, rtol=0)
    assert np.abs(theirs).max() > 1e-3  # the model's answer moves: the comparison means something


def test_road_combined_over_percentiles_equals_theirs():
    model = random_vit(channels=1)
    images, maps = images_and_maps(channels=1, seed=1)
    with torch.no_grad():
        predicted = model(images)[0].argmax(dim=-1)
    cams = input_maps(maps, (24, 24)).numpy()
    torch.manual_seed(11)
    theirs = ROADCombined()(images, cams, [ClassifierOutputSoftmaxTarget(int(c)) for c in predicted], Logits(model))
    g = torch.Generator().manual_seed(11)
    least = road_scores(model, images, maps, predicted, False, generator=g)  # their order: least, then most
    most = road_scores(model, images, maps, predicted, True, generator=g)
    np.testing.assert_allclose((least.mean(axis=0) - most.mean(axis=0)) / 2, theirs, atol=1e-6, rtol=0)
    assert np.abs(theirs).max() > 1e-3


def test_cli_road_scores_our_methods_and_any_of_vit_methods(tmp_path, capsys):
    import json

    from tests.test_faithfulness_chefer import tiny_model_and_images
    from vit import faithfulness

    checkpoint = tiny_model_and_images(tmp_path, labelled=True)
    code = faithfulness.main([str(checkpoint), "--benchmark", "road", "--data", str(tmp_path / "data"),
                              "--methods", "random,gradcam,lrp", "--batch-size", "3", "--out", str(tmp_path / "out")])
    out = capsys.readouterr()
    assert code == 0, out.err
    result = json.loads(out.out)
    assert result["images"] == 4 and list(result["methods"]) == ["random", "gradcam", "lrp"]
    assert result["removed"] == pytest.approx([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1])
    for scores in result["methods"].values():
        assert len(scores["most_relevant_first_curve"]) == 9
        assert scores["most_relevant_first"] == pytest.approx(np.mean(scores["most_relevant_first_curve"]))
        assert scores["combined"] == pytest.approx((scores["least_relevant_first"] - scores["most_relevant_first"]) / 2)
    assert "| method | most_relevant_first ↓ | least_relevant_first ↑ | combined ↑ | images_per_s ↑ |" in out.err
    assert (tmp_path / "out" / "faithfulness.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_refuses_a_method_the_model_has_not_in_one_line(tmp_path, capsys):
    from tests.test_faithfulness_chefer import tiny_model_and_images
    from vit import faithfulness

    checkpoint = tiny_model_and_images(tmp_path, labelled=True)
    code = faithfulness.main([str(checkpoint), "--benchmark", "road", "--data", str(tmp_path / "data"),
                              "--methods", "rollout,probe"])  # probe: models with an attention-pooling head
    err = capsys.readouterr().err
    assert code == 2 and "unknown method(s) probe for this model; choose from: random" in err, err
    assert "gradcam" in err and len(err.strip().splitlines()) == 1


def test_cli_road_scores_every_method_vit_methods_draws(tmp_path, capsys):
    """The documented command with each map ``vit.methods()`` draws for the model (the pixel methods too, which the
    benchmark reads summed over each patch), on one image at the smallest settings each takes."""
    import json

    import vit
    from tests.test_faithfulness_chefer import tiny_model_and_images
    from vit import faithfulness

    checkpoint = tiny_model_and_images(tmp_path, labelled=True)
    every = list(vit.methods(vit.load(checkpoint, device="cpu")))
    assert {"integrated_gradients", "smoothgrad", "occlusion", "rise"} <= set(every)
    code = faithfulness.main([str(checkpoint), "--benchmark", "road", "--data", str(tmp_path / "data"), "--limit", "1",
                              "--methods", ",".join(every), "--option", "n_steps=2,nt_samples=2,n_samples=4,n_masks=4",
                              "--out", str(tmp_path / "out")])
    out = capsys.readouterr()
    assert code == 0, out.err
    result = json.loads(out.out)
    assert list(result["methods"]) == every
    for scores in result["methods"].values():
        assert len(scores["most_relevant_first_curve"]) == 9 and np.isfinite(scores["combined"])
