"""Chefer et al. (2021)'s segmentation and perturbation tests against their own code (tests/reference/chefer_eval,
copied verbatim): their scripts' functions run unchanged on the same maps, masks, images and model."""

import argparse
import ast
from pathlib import Path

import numpy as np
import pytest
import torch

from vit.explain.benchmarks.metrics import (
    PERTURBATION_STEPS,
    average_precision,
    perturbation_auc,
    perturbation_hits,
    segmentation_counts,
    segmentation_scores,
)

REFERENCE = Path(__file__).parent / "reference" / "chefer_eval"


def their_metrices():
    """Their utils/metrices.py, imported by the tests that run it: it imports scikit-learn (with SciPy and pandas,
    ~1 s of CPU), which every xdist worker would otherwise import while collecting this module (issue 112)."""
    from tests.reference.chefer_eval import metrices

    return metrices


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
    theirs = their_metrices().get_ap_scores(scores, target)
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

    metrices = their_metrices()
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


@pytest.mark.parametrize("method, theirs", [("attn-gradcam", "attn_gradcam"), ("lrp-partial", "lrp_last_layer"),
                                             ("lrp-full", "full_lrp"), ("rollout", "rollout"),
                                             ("transformer_attribution", "transformer_attribution")])
def test_baselines_segmentation_equals_their_eval_batch_with_their_generators(monkeypatch, method, theirs):
    """Chefer's three baselines through their eval_batch, their maps from their generators on their models with
    our weights (float64: LRP's sums nearly cancel), against ours through method_maps and segmentation_counts.
    Their eval_batch reads 224 px inputs and a 14 x 14 grid: a two-layer ViT-B/16-shaped model 32 wide. Also their
    rollout and transformer attribution, which their script rolls out from layer 1 (start_layer=1)."""
    from tests.reference.chefer import ViT_LRP, ViT_new, ViT_orig_LRP
    from tests.reference.chefer.ViT_explanation_generator import LRP, Baselines
    from tests.test_chefer_baselines import random_vit, reference
    from vit.explain.benchmarks.metrics import CHEFER_START_LAYER, method_maps
    from vit.model import ViTConfig

    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    model = random_vit(ViTConfig(image_size=224, patch_size=16, num_classes=5, hidden_size=32, num_layers=2,
                                 num_heads=4, mlp_size=64)).double()
    _, masks = maps_and_masks()
    images = torch.nn.functional.interpolate(torch.randn(4, 3, 7, 7, generator=torch.Generator().manual_seed(3)),
                                             size=224, mode="bilinear").double()
    metrices = their_metrices()
    namespace = {name: getattr(metrices, name) for name in metrices.__all__}
    namespace.update(np=np, torch=torch, F=torch.nn.functional, batch_size=1,
                     baselines=Baselines(reference(model, ViT_new)), orig_lrp=LRP(reference(model, ViT_orig_LRP)),
                     lrp=LRP(reference(model, ViT_LRP)),
                     args=argparse.Namespace(method=theirs, save_img=False, thr=0.0, is_ablation=False),
                     iterator=Progress((image[None], m[None]) for image, m in zip(images, masks, strict=True)))
    namespace["get_f1_scores"] = lambda predict, target: 0.0
    namespace["model"] = Evaluator()
    exec(script_parts("imagenet_seg_eval.py", named("eval_batch", "total_inter", "total_ap", "predictions", "for")),
         namespace)

    predicted = model(images)[0].argmax(-1)
    maps = method_maps(model, images, method, predicted, pixels=True, start_layer=CHEFER_START_LAYER)
    assert maps.shape == ((4, 224, 224) if method == "lrp-full" else (4, 14, 14))
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


def tiny_model_and_images(tmp_path, labelled: bool):
    """A random 16 px ViT checkpoint and four images (in class folders when ``labelled``) with blob masks."""
    from PIL import Image

    from vit.checkpoint import save_checkpoint
    from vit.model import ViT, ViTConfig

    torch.manual_seed(0)
    config = ViTConfig(image_size=16, patch_size=4, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32,
                       num_classes=2)
    save_checkpoint(tmp_path / "m.pt", ViT(config).eval(), ["cat", "dog"])
    rng = np.random.default_rng(0)
    for i in range(4):
        folder = tmp_path / "data" / (("cat", "dog")[i % 2] if labelled else "")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(folder / f"im{i}.jpg")
        mask = np.zeros((20, 24), dtype=np.uint8)
        mask[4 + i:14, 6:18 - i] = 255
        (tmp_path / "masks").mkdir(exist_ok=True)
        Image.fromarray(mask).save(tmp_path / "masks" / f"im{i}.png")
    return tmp_path / "m.pt"


def test_benchmark_items_for_the_page_reads_a_folder_and_names_no_option(tmp_path):
    """``command=False`` (the Analyse page): segmentation's data is a folder even when a file is given (no
    gtsegs_ijcv.mat), and an empty folder's message names no ``--data``; the command's own keeps both."""
    from vit import faithfulness
    from vit.core.cli import UsageError

    (tmp_path / "empty").mkdir()
    (tmp_path / "masks").mkdir()
    (tmp_path / "gtsegs_ijcv.mat").write_bytes(b"not HDF5")
    parse = faithfulness.build_parser().parse_args
    road = parse(["m.pt", "--benchmark", "road", "--data", str(tmp_path / "empty")])
    with pytest.raises(UsageError) as page:
        faithfulness.benchmark_items(road, None, command=False)
    assert str(page.value) == f"no images in {tmp_path / 'empty'}; give a folder of images"
    with pytest.raises(UsageError, match=r"give a folder of images \(--data\)$"):
        faithfulness.benchmark_items(road, None)
    segmentation = parse(["m.pt", "--benchmark", "segmentation", "--data", str(tmp_path / "gtsegs_ijcv.mat"),
                          "--masks", str(tmp_path / "masks")])
    with pytest.raises(UsageError) as page:
        faithfulness.benchmark_items(segmentation, None, command=False)
    assert str(page.value) == (f"no images in {tmp_path / 'gtsegs_ijcv.mat'}; give a folder of images and a folder "
                               "of their masks")
    with pytest.raises(UsageError) as command:
        faithfulness.benchmark_items(segmentation, None)
    assert str(command.value) != str(page.value)  # the command opens it as gtsegs_ijcv.mat


def test_cli_segmentation_prints_scores_per_method_and_writes_them(tmp_path, capsys):
    import json

    from vit import faithfulness

    checkpoint = tiny_model_and_images(tmp_path, labelled=False)
    code = faithfulness.main([str(checkpoint), "--benchmark", "segmentation", "--data", str(tmp_path / "data"),
                              "--masks", str(tmp_path / "masks"), "--methods", "rollout,class", "--batch-size", "3",
                              "--out", str(tmp_path / "out")])
    out = capsys.readouterr()
    assert code == 0, out.err
    result = json.loads(out.out)
    assert result["images"] == 4 and set(result["methods"]) == {"rollout", "class"}
    for scores in result["methods"].values():
        assert all(0 <= scores[k] <= 1 for k in ("pixel_accuracy", "mIoU", "mAP"))
    assert "segmentation" in out.err and "| rollout |" in out.err  # the progress bar and the table
    assert json.loads((tmp_path / "out" / "faithfulness.json").read_text()) == result
    assert "| method | pixel_accuracy ↑ | mIoU ↑ | mAP ↑ |" in (tmp_path / "out" / "faithfulness.md").read_text()
    assert (tmp_path / "out" / "faithfulness.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_runs_chefers_baselines_in_both_tests(tmp_path, capsys):
    import json

    from vit import faithfulness

    checkpoint = tiny_model_and_images(tmp_path, labelled=False)
    code = faithfulness.main([str(checkpoint), "--benchmark", "segmentation", "--data", str(tmp_path / "data"),
                              "--masks", str(tmp_path / "masks"), "--methods", "attn-gradcam,lrp-full,lrp-partial"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert set(json.loads(out.out)["methods"]) == {"attn-gradcam", "lrp-full", "lrp-partial"}
    checkpoint = tiny_model_and_images(tmp_path / "labelled", labelled=True)
    code = faithfulness.main([str(checkpoint), "--data", str(tmp_path / "labelled" / "data"), "--methods",
                              "lrp-full", "--steps", "4"])  # deletion: the patch sums of its pixels
    out = capsys.readouterr()
    assert code == 0, out.err
    assert set(json.loads(out.out)["methods"]) == {"lrp-full"}


def test_cli_perturbation_gives_both_orders_from_the_intact_accuracy(tmp_path, capsys):
    import json

    from vit import faithfulness

    checkpoint = tiny_model_and_images(tmp_path, labelled=True)
    code = faithfulness.main([str(checkpoint), "--benchmark", "perturbation", "--data", str(tmp_path / "data"),
                              "--methods", "random", "attention", "--out", str(tmp_path / "out")])
    out = capsys.readouterr()
    assert code == 0, out.err
    result = json.loads(out.out)
    assert result["removed"] == [0.0, *PERTURBATION_STEPS]
    for scores in result["methods"].values():
        for order in ("positive", "negative"):
            curve = scores[f"{order}_accuracy"]
            assert curve[0] == result["model_accuracy"] and len(curve) == 10
            assert scores[f"{order}_auc"] == pytest.approx(np.trapezoid(curve, result["removed"]))
    assert (tmp_path / "out" / "faithfulness.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("extra, message", [
    (["--benchmark", "segmentation"], "--benchmark segmentation needs --masks DIR"),
    (["--benchmark", "roads"], "invalid choice: 'roads'"),
    (["--benchmark", "segmentation", "--masks", "MASKS"], "no mask in"),
])
def test_cli_usage_errors_are_one_line(tmp_path, capsys, extra, message):
    from vit import faithfulness

    checkpoint = tiny_model_and_images(tmp_path, labelled=False)
    (tmp_path / "masks" / "im2.png").rename(tmp_path / "masks" / "other.png")  # a stem without its image
    extra = [str(tmp_path / "masks") if e == "MASKS" else e for e in extra]
    code = faithfulness.main([str(checkpoint), "--data", str(tmp_path / "data"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1


def test_the_command_rolls_out_from_their_start_layer_in_chefers_tests_only(tmp_path, monkeypatch, capsys):
    """The benchmark's maps: rollout from layer 1 in Chefer's segmentation test, as their script (the parity above
    checks method_maps at that layer), from layer 0 in ROAD."""
    from vit import faithfulness
    from vit.explain.benchmarks import metrics as bench

    asked = []
    maps = bench.method_maps

    def spy(*args, start_layer=0, **kwargs):
        asked.append(start_layer)
        return maps(*args, start_layer=start_layer, **kwargs)

    monkeypatch.setattr(bench, "method_maps", spy)
    checkpoint = tiny_model_and_images(tmp_path, labelled=False)
    common = [str(checkpoint), "--data", str(tmp_path / "data"), "--methods", "rollout"]
    assert faithfulness.main([*common, "--benchmark", "segmentation", "--masks", str(tmp_path / "masks")]) == 0
    assert asked == [bench.CHEFER_START_LAYER] == [1]
    asked.clear()
    assert faithfulness.main([*common, "--benchmark", "road"]) == 0
    assert asked == [0]
    capsys.readouterr()
