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
from vit.core.inference import preprocess
from vit.evaluate import labelled_files
from vit.explain.views import dataset_pca
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


def report_pictures(report: str) -> list[dict]:
    """Each picture of report.html's PCA grid: its link, caption, displayed size, pixels and class heading."""
    import base64
    import io
    from html.parser import HTMLParser

    class Pictures(HTMLParser):
        def __init__(self):
            super().__init__()
            self.found, self.heading, self.in_heading, self.in_caption, self.href = [], None, False, False, None

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            self.in_heading, self.in_caption = tag == "h3", tag == "figcaption"
            if tag == "a":
                self.href = attrs.get("href")
            if tag == "img" and attrs.get("src", "").startswith("data:image/png;base64,"):
                png = base64.b64decode(attrs["src"].removeprefix("data:image/png;base64,"))
                self.found.append(dict(href=self.href, size=(int(attrs["width"]), int(attrs["height"])),
                                       pixels=np.asarray(Image.open(io.BytesIO(png))), heading=self.heading))

        def handle_data(self, data):
            if self.in_heading:
                self.heading = data
            elif self.in_caption:
                self.found[-1]["caption"] = data

        def handle_endtag(self, tag):
            self.in_heading = self.in_caption = False

    parser = Pictures()
    parser.feed(report)
    return parser.found


def test_the_report_shows_the_pca_pictures_in_a_grid_by_class(world, random_model, monkeypatch):  # noqa: F811
    # Issue 69, item 11: the 16-px pictures were written to pca/ and report.html did not show them.
    monkeypatch.setattr(dataset_pca, "REPORT_PER_CLASS", 2)  # 3 cats, 2 dogs, 1 ship: 2 + 2 + 1 shown
    out = world / "out"
    analyze.main([str(random_model), "--data", str(world / "data"), "--out", str(out), "--pca"])
    report = (out / "report.html").read_text()
    pictures = report_pictures(report)
    assert [p["heading"] for p in pictures] == ["cat", "cat", "dog", "dog", "ship"]
    assert "5 of the 6 pictures" in report
    for picture in pictures:
        file = out / picture["href"]
        assert picture["caption"] == file.relative_to(out / "pca").as_posix().removesuffix(".png")
        assert picture["caption"].split("/")[0] == picture["heading"]
        np.testing.assert_array_equal(picture["pixels"], np.asarray(Image.open(file)))  # the file, embedded
        assert picture["size"] == (128, 128)  # 16 px, enlarged 8x pixel for pixel


def test_a_large_pca_picture_is_reduced_in_the_report(tmp_path):
    out, root = tmp_path / "out", tmp_path / "data"
    (out / "pca" / "cat").mkdir(parents=True)
    Image.new("RGB", (300, 200), (10, 200, 30)).save(out / "pca" / "cat" / "big.jpg.png")
    section = dataset_pca.report_section([(root / "cat" / "big.jpg", 0), (root / "cat" / "unread.jpg", 0)],
                                         ["cat"], root, out, {"layer": 2, "fit": "each image alone", "images": 1})
    [picture] = report_pictures(section)
    assert picture["size"] == (128, 85) and picture["pixels"].shape == (85, 128, 3)
    assert (picture["pixels"] == (10, 200, 30)).all() and picture["href"] == "pca/cat/big.jpg.png"
