"""Chefer et al. (2021)'s segmentation and perturbation tests against their own code (tests/reference/chefer_eval,
copied verbatim): their scripts' functions run unchanged on the same maps, masks, images and model."""

import argparse
import ast
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.reference.chefer_eval import metrices
from vit.explain.faithfulness import (
    PERTURBATION_STEPS,
    average_precision,
    perturbation_auc,
    perturbation_hits,
    segmentation_counts,
    segmentation_scores,
)

REFERENCE = Path(__file__).parent / "reference" / "chefer_eval"


def script_parts(name: str, keep) -> str:
    """The source of the top-level statements of a reference script that ``keep(node)`` selects, unchanged."""
    text = (REFERENCE / name).read_text()
    return "\n\n".join(ast.get_source_segment(text, node) for node in ast.parse(text).body if keep(node))


def named(*names):
    def keep(node):
        if isinstance(node, ast.FunctionDef):
            return node.name in names
        if isinstance(node, ast.Assign):
            return any(isinstance(t, ast.Tuple) and any(getattr(e, "id", None) in names for e in t.elts)
                       for t in node.targets)
        return isinstance(node, ast.For) and "for" in names
    return keep


class Evaluator(torch.nn.Module):
    """Their evaluator: zero_grad() and a forward whose answer eval_batch ignores (the map comes from Baselines)."""

    def forward(self, image):
        return image.sum()


class Progress(list):
    """Their loop's tqdm: iterable, with set_description."""

    def set_description(self, text):
        self.description = text


def maps_and_masks(seed: int = 0):
    """Four 14 x 14 maps (their scripts' grid; one flat, one with ties) and 224 x 224 0/1 masks of blobs."""
    g = torch.Generator().manual_seed(seed)
    maps = torch.rand(4, 14, 14, generator=g)
    maps[1] = 0.3  # flat: their NaN path
    maps[2] = (maps[2] * 4).round()  # ties
    ys, xs = torch.meshgrid(torch.arange(224.0), torch.arange(224.0), indexing="ij")
    centres = torch.rand(4, 2, generator=g) * 224
    radii = 30 + torch.rand(4, generator=g) * 60
    masks = ((ys - centres[:, None, None, 0]) ** 2 + (xs - centres[:, None, None, 1]) ** 2 < radii[:, None, None] ** 2)
    return maps, masks.long()


def test_average_precision_equals_their_get_ap_scores_with_ties():
    g = torch.Generator().manual_seed(1)
    scores = (torch.rand(3, 2, 20, 24, generator=g) * 8).round() / 8  # many ties
    target = (torch.rand(3, 20, 24, generator=g) > 0.6).long()
    theirs = metrices.get_ap_scores(scores, target)
    for i in range(3):
        one_hot = torch.stack([target[i] == 0, target[i] == 1])
        assert average_precision(scores[i].reshape(-1), one_hot.reshape(-1)) == pytest.approx(theirs[i], abs=1e-6)


def test_segmentation_equals_their_eval_batch_and_totals(monkeypatch):
    maps, masks = maps_and_masks()
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)  # their script's .cuda() on a CPU
    served = iter(maps)

    class Baselines:
        def generate_rollout(self, image, start_layer):
            return next(served)

    namespace = {name: getattr(metrices, name) for name in metrices.__all__}
    namespace.update(np=np, torch=torch, F=torch.nn.functional, batch_size=1, baselines=Baselines(),
                     args=argparse.Namespace(method="rollout", save_img=False, thr=0.0),
                     iterator=Progress((torch.zeros(1, 3, 224, 224), m[None]) for m in masks))
    namespace["get_f1_scores"] = lambda predict, target: 0.0  # their mF1 (not reported here) takes seconds
    namespace["model"] = Evaluator()
    exec(script_parts("imagenet_seg_eval.py", named("eval_batch", "total_inter", "total_ap", "predictions", "for")),
         namespace)
    assert namespace["total_label"] == 4 * 224 * 224  # their loop ran over every image

    ours = segmentation_scores(*segmentation_counts(maps, masks))
    assert ours["pixel_accuracy"] == pytest.approx(namespace["pixAcc"], abs=1e-6)
    assert ours["mIoU"] == pytest.approx(namespace["mIoU"], abs=1e-6)
    assert ours["mAP"] == pytest.approx(namespace["mAp"], abs=1e-6)


def test_perturbation_equals_their_eval(tmp_path, capsys):
    torch.manual_seed(0)
    # A linear model over the pixels: which pixels go changes its answer, so positive and negative orders differ
    # (a random ViT's answer barely moves)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 224 * 224, 3)).eval()
    g = torch.Generator().manual_seed(2)
    # smooth images, so that removing pixels changes the toy model's answer gradually
    data = torch.nn.functional.interpolate(torch.rand(4, 3, 7, 7, generator=g), size=224, mode="bilinear")
    patch_maps = torch.rand(4, 14, 14, generator=g)
    # generate_visualizations.py's map: bilinear x 16, min-max over its batch of one
    vis = torch.nn.functional.interpolate(patch_maps[:, None], scale_factor=16, mode="bilinear")
    vis = torch.stack([(v - v.min()) / (v.max() - v.min()) for v in vis])
    target = torch.tensor([0, 1, 2, 1])
    dataset = list(zip(data, vis, target, strict=True))
    hits = {}
    for negative in (False, True):
        namespace = {"torch": torch, "np": np, "os": __import__("os"), "tqdm": lambda x: x,
                     "imagenet_ds": dataset, "device": torch.device("cpu"), "model": model,
                     "sample_loader": torch.utils.data.DataLoader(dataset, batch_size=2, shuffle=False)}
        exec(script_parts("pertubation_eval_from_hdf5.py", named("normalize", "eval")), namespace)
        (tmp_path / str(negative)).mkdir()
        namespace["eval"](argparse.Namespace(scale="per", wrong=False, neg=negative,
                                             experiment_dir=str(tmp_path / str(negative))))
        theirs = np.load(tmp_path / str(negative) / "perturbations_hits.npy")  # (9, images)
        model_hits = np.load(tmp_path / str(negative) / "model_hits.npy")
        normalised = namespace["normalize"](data.clone())
        zero = namespace["normalize"](torch.zeros(1, 3, 1, 1))[0, :, 0, 0]
        ours = perturbation_hits(model, normalised, patch_maps, target, zero, negative, batch_size=5)
        np.testing.assert_array_equal(ours, theirs)
        hits[negative] = theirs
        curve = theirs.mean(axis=1)
        expected = np.trapezoid([model_hits.mean(), *curve], [0, *PERTURBATION_STEPS])
        assert perturbation_auc(model_hits.mean(), curve) == pytest.approx(expected, abs=1e-12)
    assert not np.array_equal(hits[False], hits[True])  # the test tells the orders apart
    capsys.readouterr()
