"""``vit.train --init``: fine-tuning a model the user has, on a dataset with other classes or the same ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import make_image_folder

from vit.checkpoint import load_checkpoint, save_checkpoint
from vit.model import ViT, ViTConfig
from vit.sources.open import open_source
from vit.train import main
from vit.training.finetune import prepare_init

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("data") / "colours", classes=("red", "green"), per_class=6)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    """A tiny HF DeiT with a teacher head and 5 classes, 16 px, 4-px patches."""
    config = transformers.DeiTConfig(image_size=16, patch_size=4, hidden_size=8, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=16, num_labels=5)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("hf") / "deit"
    transformers.DeiTForImageClassificationWithTeacher(config).save_pretrained(folder)
    return folder


def run(images: Path, tmp_path: Path, source: Path, *extra: str) -> int:
    return main(["--dataset", f"folder:{images}", "--out", str(tmp_path / "run"), "--cache-dir",
                 str(tmp_path / "cache"), "--init", str(source), "--epochs", "1", "--batch-size", "4",
                 "--threads", "1", *extra])


def test_init_from_an_hf_folder_replaces_the_classifier_and_keeps_every_other_weight(images, tmp_path, hf_folder):
    frozen = ["--lr", "1e-12", "--min-lr", "0", "--warmup-epochs", "0", "--weight-decay", "0"]
    assert run(images, tmp_path, hf_folder, *frozen) == 0
    trained = load_checkpoint(tmp_path / "run" / "last.pt")
    source = open_source(hf_folder)
    assert trained.class_names == ["green", "red"] and trained.config.num_classes == 2
    assert trained.config.distillation_token and not trained.config.distillation_head
    assert trained.preprocessing.mean == source.preprocessing.mean  # the source's statistics, not the dataset's
    before, after = source.model.state_dict(), trained.model.state_dict()
    for key in after:
        if not key.startswith("head"):
            torch.testing.assert_close(after[key], before[key], rtol=0, atol=1e-6)  # lr 1e-12: unchanged
    record = json.loads((tmp_path / "run" / "config.json").read_text())
    assert record["args"]["init"] == str(hf_folder)


def test_init_with_the_same_classes_keeps_the_classifier(tmp_path):
    config = ViTConfig(image_size=16, patch_size=4, num_classes=2, hidden_size=8, num_layers=1, num_heads=2,
                       mlp_size=16)
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "ours.pt", ViT(config), ["green", "red"])
    init = prepare_init(str(tmp_path / "ours.pt"), 2, ["green", "red"])
    assert not init.head_replaced and "head.weight" in init.state_dict


def test_init_at_another_size_resamples_the_positions_as_the_model_does(hf_folder):
    init = prepare_init(str(hf_folder), 3, ["a", "b", "c"], image_size=24)
    source = open_source(hf_folder).model
    assert init.config.image_size == 24 and init.state_dict["pos_embed"].shape == (1, 2 + 36, 8)
    model = ViT(init.config).eval()
    model.load_state_dict({**model.state_dict(), **init.state_dict})
    images = torch.randn(1, 3, 24, 24)
    with torch.no_grad():
        for mine, theirs in zip(model(images, output_attentions=True)[1], source(images, output_attentions=True)[1],
                                strict=True):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)


def test_init_refuses_a_preset_or_model_sizes(images, tmp_path, hf_folder, capsys):
    assert run(images, tmp_path, hf_folder, "--hidden-size", "16") == 2
    assert "--hidden-size cannot be given with --init" in capsys.readouterr().err


def test_init_from_an_unsupported_source_is_one_line(images, tmp_path, capsys):
    (tmp_path / "swin").mkdir()
    (tmp_path / "swin" / "config.json").write_text(json.dumps({"architectures": ["SwinModel"]}))
    assert run(images, tmp_path, tmp_path / "swin") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "SwinModel" in err
