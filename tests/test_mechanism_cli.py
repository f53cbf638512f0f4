"""``python -m vit.predict MODEL IMAGE --ablate L.H,...``: the usual JSON with those heads zero-ablated."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from vit import predict as predict_cli
from vit.checkpoint import load_checkpoint, save_checkpoint
from vit.core.inference import preprocess
from vit.explain.mechanism.components import ablate_heads
from vit.model import ViT, ViTConfig

CONFIG = ViTConfig(image_size=16, patch_size=4, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32,
                   num_classes=3)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("ablate")
    torch.manual_seed(0)
    model = ViT(CONFIG).eval()
    with torch.no_grad():  # random weights large enough that one head moves the prediction
        for p in model.parameters():
            p.normal_(0, 0.5)
    save_checkpoint(root / "model.pt", model, ["cat", "dog", "ship"])
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8), "RGB").save(root / "photo.png")
    return root / "model.pt", root / "photo.png"


def probabilities(capsys) -> dict[str, float]:
    [record] = json.loads(capsys.readouterr().out)
    return {p["label"]: p["probability"] for p in record["predictions"]}


def test_ablate_prints_the_prediction_with_those_heads_zeroed(files, capsys):
    checkpoint_path, image = files
    assert predict_cli.main([str(checkpoint_path), str(image)]) == 0
    plain = probabilities(capsys)
    assert predict_cli.main([str(checkpoint_path), str(image), "--ablate", "1.2,2.1"]) == 0
    ablated = probabilities(capsys)
    checkpoint = load_checkpoint(checkpoint_path)
    x = preprocess([Image.open(image)], checkpoint.preprocessing)
    with torch.no_grad():
        expected = ablate_heads(checkpoint.model, x, [(0, 1), (1, 0)])[0].softmax(-1)[0]
    for i, name in enumerate(checkpoint.class_names):
        assert ablated[name] == pytest.approx(float(expected[i]), abs=1e-5)
    assert any(abs(ablated[k] - plain[k]) > 1e-3 for k in plain)


def test_ablate_with_maps_saves_the_ablated_models_attention(files, tmp_path, capsys):
    checkpoint_path, image = files
    assert predict_cli.main([str(checkpoint_path), str(image), "--ablate", "1.1", "--save-maps", str(tmp_path)]) == 0
    [record] = json.loads(capsys.readouterr().out)
    assert set(record["maps"]) == {"npz", "cls", "rollout"}
    checkpoint = load_checkpoint(checkpoint_path)
    x = preprocess([Image.open(image)], checkpoint.preprocessing)
    with torch.no_grad():
        _, expected = ablate_heads(checkpoint.model, x, [(0, 0)], output_attentions=True)
        _, intact = checkpoint.model(x, output_attentions=True)
    saved = np.load(record["maps"]["npz"])["layer_1"]  # the layer after the ablated head's
    np.testing.assert_allclose(saved, expected[1][0].numpy(), rtol=0, atol=1e-5)
    assert not np.allclose(saved, intact[1][0].numpy(), atol=1e-4)


@pytest.mark.parametrize("text", ["3.1", "1.3", "x", "1-1", ""])
def test_ablate_refuses_a_head_that_does_not_exist_on_one_line(files, capsys, text):
    checkpoint_path, image = files
    assert predict_cli.main([str(checkpoint_path), str(image), "--ablate", text]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("vit.predict: error: --ablate:")


@pytest.mark.parametrize("text", ["9.1", "1.3"])
def test_ablate_past_a_plain_vits_heads_names_its_layers_and_heads(files, capsys, text):
    # Issue 69, item 11: a plain ViT's refusal read Swin's "each layer its stage's heads" for a layer past the last.
    checkpoint_path, image = files
    assert predict_cli.main([str(checkpoint_path), str(image), "--ablate", text]) == 2
    assert capsys.readouterr().err.strip() == (f"vit.predict: error: --ablate: head {text} does not exist: the model "
                                               "has layers 1-2 and heads 1-2")
