"""The library road in the commands and the dense views (issue 91): vit-predict and vit-evaluate classify with a model
opened as its library builds it (transformers' or timm's own logits, softmaxed); the commands that need our own ViT
(vit-convert, vit-analyze, vit-faithfulness, vit-describe-heads, vit-sae) refuse it in one line naming what works;
vit.pca, vit.similarity and vit.correspondences read the library's own last hidden state, its patches placed
row-major on the layout's grid. References are the library's own modules (loaded by transformers or built by timm
themselves) and DINOv3's PCA notebook cells, never our own output. Each model is tiny, random and saved locally."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from layer_reference import widened
from PIL import Image

import vit
from vit import evaluate as evaluate_cli
from vit import predict as predict_cli
from vit.core.inference import preprocess

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
from test_dense import aligned, photo, run_pca_notebook  # noqa: E402  (the port's PCA reference: the notebook)
from test_library_path import SMALL, reference, save_family  # noqa: E402
from test_library_timm import FAMILIES as TIMM_FAMILIES  # noqa: E402
from test_library_timm import build  # noqa: E402
from timm.models import _hub  # noqa: E402  (timm's save_for_hf)

CLASSES = ["cat", "dog", "fox"]  # vit_msn's id2label in test_library_path.FAMILIES
TIMM = "flexivit_small"  # a timm architecture the ports refuse, with a 3-class head


def non_square_folder(folder):
    """A ViT-MSN classifier on 32 x 48 px inputs: a 4 x 6 patch grid, one CLS token."""
    torch.manual_seed(0)
    model = transformers.ViTMSNForImageClassification(transformers.ViTMSNConfig(
        **SMALL, image_size=[32, 48], num_labels=3, id2label=dict(enumerate(CLASSES))))
    widened(model)
    model.save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 32, "width": 48}).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("library_commands")
    out = {"vit_msn": save_family(root / "vit_msn", "vit_msn"), "ijepa": save_family(root / "ijepa", "ijepa"),
           "wide": non_square_folder(root / "wide"), TIMM: root / TIMM}
    _hub.save_for_hf(build(TIMM), out[TIMM], model_args=TIMM_FAMILIES[TIMM][0])
    images = []
    for i in range(4):
        images.append(root / f"{i}.png")
        photo(i, (40 + 8 * i, 36)).save(images[-1])
    out["images"] = images
    data = root / "data"
    for i, name in enumerate(CLASSES):
        (data / name).mkdir(parents=True)
        photo(10 + i, (44, 40)).save(data / name / "a.png")
        photo(20 + i, (36, 52)).save(data / name / "b.png")
    out["data"] = data
    return out


def librarys_own(world, name: str) -> torch.nn.Module:
    """The folder's model as its library builds it itself: transformers' from_pretrained (eager), timm's own."""
    return build(name) if name == TIMM else reference(world[name], "eager")


def librarys_logits(world, name: str, image: Image.Image) -> torch.Tensor:
    """The library's own logits ``(classes,)`` of ``image``, prepared as vit.load prepares it."""
    checkpoint = vit.load(world[name], device="cpu")
    x = preprocess([image], checkpoint.preprocessing)
    model = librarys_own(world, name)
    with torch.no_grad():
        return (model(x) if name == TIMM else model(pixel_values=x).logits)[0]


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


# --- vit-predict and vit-evaluate: the library's own logits

@pytest.mark.parametrize("name", ["vit_msn", "wide", TIMM])
def test_vit_predict_prints_the_librarys_own_softmax(world, name, capsys):
    images = world["images"][:2]
    assert predict_cli.main([str(world[name]), *map(str, images), "--top-k", "3", "--device", "cpu"]) == 0
    records = json.loads(capsys.readouterr().out)
    names = CLASSES if name != TIMM else vit.load(world[TIMM], device="cpu").class_names
    for record, path in zip(records, images, strict=True):
        expected = torch.softmax(librarys_logits(world, name, Image.open(path).convert("RGB")), dim=-1)
        printed = {p["label"]: p["probability"] for p in record["predictions"]}
        assert list(printed.values()) == sorted(printed.values(), reverse=True)
        assert printed == pytest.approx({names[i]: float(expected[i]) for i in range(3)}, abs=1e-6)


def test_vit_predict_matches_transformers_own_image_processor(world, capsys):
    """The whole road against transformers alone: its image processor and its model, the probabilities softmaxed."""
    path = world["images"][1]
    assert predict_cli.main([str(world["wide"]), str(path), "--top-k", "3", "--device", "cpu"]) == 0
    [record] = json.loads(capsys.readouterr().out)
    processor = transformers.AutoImageProcessor.from_pretrained(world["wide"])
    with torch.no_grad():
        logits = librarys_own(world, "wide")(**processor(Image.open(path).convert("RGB"), return_tensors="pt")).logits
    expected = torch.softmax(logits[0], dim=-1)
    printed = {p["label"]: p["probability"] for p in record["predictions"]}
    assert printed == pytest.approx({CLASSES[i]: float(expected[i]) for i in range(3)}, abs=1e-4)


@pytest.mark.parametrize("name", ["vit_msn", TIMM])
def test_vit_evaluate_scores_the_librarys_own_predictions(world, name, capsys):
    model_names = vit.load(world[name], device="cpu").class_names
    data = world["data"]
    if name == TIMM:  # timm's saved head names its classes as it does: lay the folders out by those names
        data = data.parent / "timm_data"
        for i, label in enumerate(model_names):
            (data / label).mkdir(parents=True, exist_ok=True)
            for file in (world["data"] / CLASSES[i]).iterdir():
                (data / label / file.name).write_bytes(file.read_bytes())
    assert evaluate_cli.main([str(world[name]), "--data", str(data), "--device", "cpu"]) == 0
    summary = json.loads(capsys.readouterr().out)
    right = [int(librarys_logits(world, name, Image.open(f).convert("RGB")).argmax()) == i
             for i, label in enumerate(model_names) for f in sorted((data / label).iterdir())]
    assert summary["count"] == len(right) == 6
    assert summary["accuracy"] == pytest.approx(sum(right) / len(right))


@pytest.mark.parametrize("extra", [["--size", "64"], ["--save-maps", "maps"], ["--ablate", "1.1"],
                                   ["--labels", "a cat,a dog"]])
def test_vit_predict_refuses_what_asks_for_a_port_in_one_line(world, extra, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert predict_cli.main([str(world["vit_msn"]), str(world["images"][0]), *extra, "--device", "cpu"]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"{extra[0]} is for a model with a port" in line and "vit.explain" in line
    assert not (tmp_path / "maps").exists()


def test_vit_evaluate_refuses_another_size_in_one_line(world, capsys):
    assert evaluate_cli.main([str(world["vit_msn"]), "--data", str(world["data"]), "--size", "64"]) == 2
    assert "--size is for a model with a port" in one_line(capsys.readouterr().err)


# --- the commands that need our own ViT: one line naming what works

def command_argv(name: str, folder, world, tmp_path) -> list[str]:
    data, out = str(world["data"]), str(tmp_path / "out")
    return {"convert": [str(folder), "--out", str(tmp_path / "x.pt")],
            "analyze": [str(folder), "--data", data, "--out", out, "--device", "cpu"],
            "faithfulness": [str(folder), "--data", data, "--device", "cpu"],
            "faithfulness_benchmark": [str(folder), "--data", data, "--benchmark", "perturbation", "--device", "cpu"],
            "describe_heads": [str(folder), "--data", data, "--device", "cpu"],
            "sae": ["train", str(folder), "--data", data, "--layer", "1", "--out", out, "--device", "cpu"]}[name]


@pytest.mark.parametrize("command", ["convert", "analyze", "faithfulness", "faithfulness_benchmark", "describe_heads",
                                     "sae"])
@pytest.mark.parametrize("name", ["vit_msn", TIMM])
def test_the_commands_that_need_our_vit_refuse_it_in_one_line_naming_what_works(world, command, name, tmp_path,
                                                                                capsys):
    import importlib

    module = importlib.import_module(f"vit.{command.removesuffix('_benchmark')}")
    assert module.main(command_argv(command, world[name], world, tmp_path)) == 2
    line = one_line(capsys.readouterr().err)
    assert f"vit-{command.removesuffix('_benchmark').replace('_', '-')} " in line
    assert "a model opened as its library builds it has no port to run that on: vit-predict and vit-evaluate" in line
    assert "vit.load" in line and "has no port; it opens" not in line
    assert not (tmp_path / "x.pt").exists() and not (tmp_path / "out").exists()


# --- vit.pca, vit.similarity, vit.correspondences: the library's own last hidden state

def librarys_tokens(world, name: str, image: Image.Image) -> tuple[torch.Tensor, torch.Tensor]:
    """The library's own last hidden state of ``image`` (vit.load's preprocessing): transformers' base model's
    ``last_hidden_state`` (a classifier's ViT), timm's ``forward_features``; ``(prefix tokens, patches)``."""
    checkpoint = vit.load(world[name], device="cpu")
    x = preprocess([image], checkpoint.preprocessing)
    model = librarys_own(world, name)
    with torch.no_grad():
        states = (model.forward_features(x) if name == TIMM else model.base_model(pixel_values=x).last_hidden_state)[0]
    prefix = {"ijepa": 0, TIMM: TIMM_FAMILIES[TIMM][1]}.get(name, 1)
    return states[:prefix], states[prefix:]


GRIDS = {"wide": (4, 6), "ijepa": (4, 4), "vit_msn": (4, 4), TIMM: (6, 6)}


@pytest.mark.parametrize("name", ["wide", "ijepa", TIMM])
def test_pca_is_the_notebooks_on_the_librarys_own_last_hidden_state(world, name):
    image, grid = photo(5, (60, 44)), GRIDS[name]
    ours = vit.pca(vit.load(world[name], device="cpu"), image)
    _, patches = librarys_tokens(world, name, image)
    expected = run_pca_notebook(patches, grid, torch.ones(grid))
    assert ours.map.shape == (*grid, 3) and ours.grid == grid
    np.testing.assert_allclose(ours.map, aligned(expected, ours.map, np.ones(grid, bool)), atol=1e-4)
    if grid[0] != grid[1]:  # the same tokens laid column-major would be another picture
        transposed = run_pca_notebook(patches.reshape(grid[1], grid[0], -1).transpose(0, 1).reshape(len(patches), -1),
                                      grid, torch.ones(grid))
        assert not np.allclose(ours.map, aligned(transposed, ours.map, np.ones(grid, bool)), atol=1e-2)


def test_similarity_is_the_cosine_of_the_librarys_own_tokens_on_a_non_square_grid(world):
    image, grid = photo(6, (60, 44)), GRIDS["wide"]
    checkpoint = vit.load(world["wide"], device="cpu")
    prefix, patches = librarys_tokens(world, "wide", image)
    query = 1 * grid[1] + 4  # row 1, column 4
    ours = vit.similarity(checkpoint, image, query=1 + query)
    expected = F.cosine_similarity(patches, patches[query][None], dim=-1)
    np.testing.assert_allclose(ours.map, expected.reshape(grid).numpy(), atol=1e-5)
    assert not np.allclose(ours.map, expected.reshape(grid[1], grid[0]).T.numpy(), atol=1e-3)
    cls = vit.similarity(checkpoint, image, query=0)  # the CLS token of the same last hidden state
    np.testing.assert_allclose(cls.map, F.cosine_similarity(patches, prefix[0][None], dim=-1).reshape(grid).numpy(),
                               atol=1e-5)


def test_correspondences_are_the_mutual_nearest_neighbours_of_the_librarys_own_tokens(world):
    checkpoint = vit.load(world["wide"], device="cpu")
    a, b = photo(7, (60, 44)), photo(8, (50, 40))
    tokens_a, tokens_b = librarys_tokens(world, "wide", a)[1], librarys_tokens(world, "wide", b)[1]
    similar = F.normalize(tokens_a, dim=-1) @ F.normalize(tokens_b, dim=-1).T
    forward, backward = similar.argmax(dim=1), similar.argmax(dim=0)
    mutual = [(i, int(forward[i])) for i in range(len(forward)) if backward[forward[i]] == i]
    matches = vit.correspondences(checkpoint, a, checkpoint, b, top=None)
    assert mutual and sorted(map(tuple, matches.matches.tolist())) == mutual
    assert matches.grid_a == matches.grid_b == GRIDS["wide"]
    np.testing.assert_allclose(np.sort(matches.scores), np.sort([float(similar[i, j]) for i, j in mutual]), atol=1e-5)


@pytest.mark.parametrize(("call", "message"), [
    (lambda c, image: vit.pca(c, image, layer=0), r"layer 0: .* last hidden state only \(layer -1, or 2\)"),
    (lambda c, image: vit.similarity(c, image, query=0, layer=1), r"layer 1: .* last hidden state only"),
    (lambda c, image: vit.pca(c, image, size=64), r"runs at its own input size \(48×32 px\); leave out size"),
])
def test_what_the_library_road_does_not_give_is_refused_in_one_line(world, call, message):
    with pytest.raises(ValueError, match=message) as refused:
        call(vit.load(world["wide"], device="cpu"), photo(9, (60, 44)))
    assert "\n" not in str(refused.value)


def test_a_depth_models_dense_view_is_refused_in_one_line(tmp_path):
    from test_library_path import depth_anything_folder

    checkpoint = vit.load(depth_anything_folder(tmp_path), device="cpu")
    with pytest.raises(ValueError, match="has no last hidden state .* read a model's patch tokens") as refused:
        vit.pca(checkpoint, photo(9, (40, 40)))
    assert "\n" not in str(refused.value)


# --- the mechanism: our ViT's hook points, which the library road has not

MECHANISM_CALLS = {
    "mechanism": lambda c, image: vit.mechanism(c, image),
    "ablate": lambda c, image: vit.ablate(c, [(0, 1)]),
    "head_effects": lambda c, image: vit.head_effects(c, image),
    "reference_means": lambda c, image: vit.reference_means(c, [image], image),
    "patching": lambda c, image: vit.patching(c, image, image),
    "registers": lambda c, image: vit.registers(c, image, [image], threshold=1.0),
    "sinks": lambda c, image: vit.sinks(c, image),
    "textspan": lambda c, image: vit.textspan(c, [image], texts=["a cat"]),
    "feature_attribution": lambda c, image: vit.feature_attribution(c, image, sae=None),
}


@pytest.mark.parametrize("call", list(MECHANISM_CALLS))
@pytest.mark.parametrize("name", ["vit_msn", "ijepa", TIMM])
def test_the_mechanism_refuses_a_library_road_model_in_one_line_naming_what_works(world, name, call):
    from vit.explain.mechanism.components import MechanismError

    checkpoint = vit.load(world[name], device="cpu")
    assert checkpoint.road == "library"
    with pytest.raises(MechanismError) as refused:
        MECHANISM_CALLS[call](checkpoint, photo(9, (40, 36)))
    line = one_line(str(refused.value))
    assert line.startswith(f"vit.{call} reads and edits this project's ViT at its hook points")
    assert "opened as its library builds it" in line and "vit.explain draws its maps" in line
