"""``vit.analyze --pca``: each image's PCA picture and arrays, the ones ``vit.pca`` gives for it (issue 48)."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vit
from tests.test_analyze import CLASSES, CONFIG, world  # noqa: F401  (fixture)
from vit import analyze
from vit.checkpoint import save_checkpoint
from vit.evaluate import labelled_files
from vit.explain import dataset_pca
from vit.inference import preprocess
from vit.model import ViT


@pytest.fixture
def random_model(world):  # noqa: F811
    """A seeded random tiny ViT beside ``world``'s data (uniform attention would give near-equal tokens)."""
    torch.manual_seed(3)
    save_checkpoint(world / "random.pt", ViT(CONFIG).eval(), CLASSES)
    return world / "random.pt"


def readable(world) -> list:  # noqa: F811
    return [path for path, _ in labelled_files(world / "data", CLASSES) if path.name != "broken.png"]


def written(out, world, path) -> tuple[np.ndarray, np.ndarray, int]:  # noqa: F811
    """The PNG's pixels, the .npz's map and layer written for image ``path``."""
    stem = out / "pca" / path.relative_to(world / "data")
    with np.load(stem.with_name(stem.name + ".npz")) as saved:
        return (np.asarray(Image.open(stem.with_name(stem.name + ".png"))), saved["map"], int(saved["layer"]))


def test_pca_writes_the_picture_vit_pca_draws_for_each_image(world, random_model, capsys):  # noqa: F811
    out = world / "out"
    code = analyze.main([str(random_model), "--data", str(world / "data"), "--out", str(out), "--pca",
                         "--pca-layer", "1"])
    streams = capsys.readouterr()
    assert code == 1 and "broken.png" in streams.err  # named by the analysis; no picture for it
    checkpoint = vit.load(random_model, device="cpu")
    for path in readable(world):
        expected = vit.pca(checkpoint, path, layer=0)
        pixels, colours, layer = written(out, world, path)
        np.testing.assert_array_equal(pixels, np.asarray(expected.picture()))
        np.testing.assert_array_equal(colours, expected.map)
        assert layer == 0
    assert not list((out / "pca").rglob("broken*"))
    saved = json.loads((out / "analysis.json").read_text())
    assert saved["pca"] == {"folder": "pca", "images": 6, "layer": 1, "fit": "each image alone"}
    assert "pca/" in json.loads(streams.out)["files"]


def test_pca_joint_is_one_fit_on_every_image_as_vit_pca_of_the_list(world, random_model):  # noqa: F811
    out = world / "out"
    analyze.main([str(random_model), "--data", str(world / "data"), "--out", str(out), "--pca", "--pca-joint"])
    checkpoint = vit.load(random_model, device="cpu")
    paths = readable(world)
    for path, expected in zip(paths, vit.pca(checkpoint, paths), strict=True):  # the last layer, fitted together
        pixels, colours, layer = written(out, world, path)
        np.testing.assert_array_equal(pixels, np.asarray(expected.picture()))
        np.testing.assert_allclose(colours, expected.map, atol=1e-6)
        assert layer == CONFIG.num_layers - 1
    alone = vit.pca(checkpoint, paths[0])
    assert np.abs(written(out, world, paths[0])[1] - alone.map).max() > 0.01  # not each image's own fit
    assert json.loads((out / "analysis.json").read_text())["pca"]["fit"] == "all the images together"


@pytest.mark.parametrize("extra, message", [
    (["--pca", "--ray", "http://127.0.0.1:1"], "--pca runs locally only"),
    (["--pca-joint"], "--pca-layer and --pca-joint go with --pca"),
    (["--pca", "--pca-layer", "3"], "--pca-layer 3 is out of range: this model has 2 layers"),
])
def test_pca_options_it_cannot_honour_are_refused_in_one_line_before_any_image(world, random_model, capsys,  # noqa: F811
                                                                                extra, message):
    code = analyze.main([str(random_model), "--data", str(world / "data"), "--out", str(world / "out"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "analysing" not in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_pca_past_the_memory_bound_is_refused_before_any_image(world, random_model, capsys,  # noqa: F811
                                                                monkeypatch):
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.01")  # 10 KB: one image's block needs 12.8 KB, its copies 7.4
    code = analyze.main([str(random_model), "--data", str(world / "data"), "--out", str(world / "out"), "--pca"])
    err = capsys.readouterr().err
    assert code == 2 and "VIT_ANALYSIS_MEMORY_MB" in err and "analysing" not in err
    assert len(err.strip().splitlines()) == 1


def test_pca_past_the_token_gate_is_refused_before_any_image(world, random_model, capsys,  # noqa: F811
                                                              monkeypatch):
    monkeypatch.setenv("VIT_MAX_TOKENS", "15")  # the checkpoint's 16 px are 4x4 patches (+ CLS, not counted)
    code = analyze.main([str(random_model), "--data", str(world / "data"), "--out", str(world / "out"), "--pca"])
    err = capsys.readouterr().err
    assert code == 2 and "16 patches" in err and "VIT_MAX_TOKENS" in err and "analysing" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_layer_s_tokens_come_from_a_forward_that_stops_after_that_layer(random_model):
    checkpoint = vit.load(random_model, device="cpu")
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8))
    ran = []
    with checkpoint.model.hooks([(f"blocks.{i}.hook_resid_post", lambda t, hook, i=i: ran.append(i))
                                 for i in range(CONFIG.num_layers)]):
        tokens = dataset_pca.layer_tokens(checkpoint, image, 0)
    assert ran == [0]  # block 1 (counted from 0) is not run
    x = preprocess([image], checkpoint.preprocessing)
    with torch.inference_mode():  # the whole forward's output of block 0, after the final norm
        _, cache = checkpoint.model.run_with_cache(x, ["blocks.0.hook_resid_post"])
        expected = checkpoint.model.norm(cache["blocks.0.hook_resid_post"])[0, 1:]
    torch.testing.assert_close(tokens, expected, rtol=0, atol=1e-6)
