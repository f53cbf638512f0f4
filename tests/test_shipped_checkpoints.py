"""The checkpoints in checkpoints/ are complete, meet their bars and behave as their cards say."""

import json
from pathlib import Path

import pytest
from PIL import Image

from vit.checkpoint import load_checkpoint
from vit.core.inference import predict
from vit.model import count_parameters

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "checkpoints").glob("*.pt"))
CARDS = (ROOT / "checkpoints" / "README.md").read_text() if (ROOT / "checkpoints" / "README.md").exists() else ""


def test_a_cifar10_and_an_mnist_checkpoint_ship():
    names = [p.name for p in SHIPPED]
    assert any("cifar10" in n for n in names), names
    assert any("mnist" in n for n in names), names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_checkpoint_stores_classes_preprocessing_and_training_metadata(path):
    checkpoint = load_checkpoint(path)
    pre = checkpoint.preprocessing
    assert len(checkpoint.class_names) == checkpoint.config.num_classes == 10
    assert pre.image_size == checkpoint.config.image_size
    assert pre.num_channels == checkpoint.config.num_channels == len(pre.mean) == len(pre.std)
    meta = checkpoint.metadata
    for key in ("dataset", "epochs", "val_acc", "date", "parameters", "train_size", "val_size"):
        assert meta.get(key) is not None, key
    assert 0 < meta["val_acc"] <= 1
    assert meta["parameters"] == count_parameters(checkpoint.model)
    assert checkpoint.training_state is None, "shipped files should not carry optimizer state"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_checkpoint_classifies_its_sample_images_as_its_card_says(path):
    folder = path.parent / "samples" / path.stem
    records = json.loads((folder / "samples.json").read_text())
    assert len(records) >= 3
    predictions = predict(load_checkpoint(path), [Image.open(folder / r["file"]) for r in records], top_k=1,
                          output_attentions=False)
    for record, prediction in zip(records, predictions, strict=True):
        label, probability = prediction.top_k[0]
        assert label == record["predicted"], record["file"]
        assert probability == pytest.approx(record["probability"], abs=2e-3)
        assert record["file"] in CARDS, f"{record['file']} is not listed in checkpoints/README.md"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_model_card_reports_the_stored_validation_accuracy(path):
    meta = load_checkpoint(path).metadata
    assert path.name in CARDS
    assert f"{100 * meta['val_acc']:.2f} %" in CARDS


def test_cifar10_default_meets_its_bar():
    checkpoint = load_checkpoint(ROOT / "checkpoints" / "cifar10-cifar-s.pt")
    assert count_parameters(checkpoint.model) <= 500_000
    assert checkpoint.metadata["val_acc"] >= 0.80


def test_the_default_is_the_gpu_trained_model_its_card_and_its_runs_files_describe():
    # Issue 89: the app's default is trained on a GPU; its accuracy is the run's own (metrics.jsonl), < 16 MiB.
    from vit.core.runfiles import DEFAULT_CHECKPOINT

    path = ROOT / "checkpoints" / DEFAULT_CHECKPOINT
    assert path.stat().st_size < 16 * 2**20
    meta = load_checkpoint(path).metadata
    assert meta["hardware"].startswith("NVIDIA") and meta["val_acc"] >= 0.85
    run = ROOT / "bench" / "results" / "h100-2026-11-26b" / meta["run"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert meta["val_acc"] == max(r["val_acc"] for r in rows) and meta["epochs"] == len(rows)
    config = json.loads((run / "config.json").read_text())
    assert config["device"].startswith("cuda") and config["compile_mode"] == "reduce-overhead"
    assert f"**{100 * meta['val_acc']:.2f} %**" in CARDS.split("## `cifar10-cifar-s.pt`")[0]


def test_mnist_checkpoint_meets_its_bar():
    (path,) = [p for p in SHIPPED if "mnist" in p.name]
    assert load_checkpoint(path).metadata["val_acc"] >= 0.97
