"""The explorer opens imported models: an HF folder by path, a timm weights file, and a model of the HF cache."""

import json

import pytest
import torch
from safetensors.torch import save_file
from test_app import dirs, open_by_path, png_bytes, run_app, sidebar_widget, upload, write_checkpoint  # noqa: F401 (a fixture)
from test_catalog import tiny_hf_cache

from vit.app import catalog
from vit.core import runfiles
from vit.sources import open as sources

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dirs")]  # the app's own empty world


def hf_registers_folder(folder):
    """A tiny DINOv2 with 2 registers and no classifier: 16 px, 4-px patches."""
    config = transformers.Dinov2WithRegistersConfig(image_size=16, patch_size=4, hidden_size=8, num_hidden_layers=2,
                                                    num_attention_heads=2, mlp_ratio=2, num_register_tokens=2)
    torch.manual_seed(0)
    transformers.Dinov2WithRegistersModel(config).save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "do_resize": True, "size": {"shortest_edge": 20}, "do_center_crop": True, "crop_size": 16, "resample": 3,
        "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}))
    return folder


def test_an_hf_folder_opened_by_path_shows_maps_with_register_labels_and_no_prediction(tmp_path):
    folder = hf_registers_folder(tmp_path / "dino-reg")
    at = run_app()
    open_by_path(at, folder)
    options = sidebar_widget(at, "selectbox", "Query token").options
    assert options[:4] == ["0 · CLS", "1 · REG 1", "2 · REG 2", "3 · patch row 1, col 1"]
    assert any("no classifier" in info.value for info in at.main.info)
    assert [c.value for c in at.main.caption if "Colours span" in c.value]  # the overlay is drawn
    assert not any("Class-specific" in o for o in sidebar_widget(at, "radio", "Map").options)  # no classes


def test_a_timm_weights_file_opened_by_path_predicts_with_its_label_names(tmp_path):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, img_size=32, patch_size=8,
                              embed_dim=8, depth=1, num_heads=2, num_classes=3)
    folder = tmp_path / "timm-deit"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({
        "architecture": "deit_tiny_distilled_patch16_224", "num_classes": 3, "label_names": ["ant", "bee", "cow"],
        "model_args": {"num_heads": 2, "img_size": 32}}))
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(folder / "model.safetensors"))
    at.run()
    upload(at, "photo.png", png_bytes(40, 30))
    options = sidebar_widget(at, "selectbox", "Query token").options
    assert options[:3] == ["0 · CLS", "1 · DIST", "2 · patch row 1, col 1"]
    bars = [t for c in at.get("plotly_chart") for t in json.loads(c.proto.spec)["data"] if t.get("type") == "bar"]
    assert set(bars[0]["y"]) == {"ant", "bee", "cow"}


def test_a_model_of_the_hf_cache_is_listed_by_hub_name_and_opens(tmp_path):
    cache = tmp_path / "hf-cache"  # the dirs fixture points HF_HUB_CACHE here
    hf_registers_folder(cache / "models--facebook--dinov2-reg-tiny" / "snapshots" / "rev1")
    (cache / "models--facebook--dinov2-reg-tiny" / "refs").mkdir()
    (cache / "models--facebook--dinov2-reg-tiny" / "refs" / "main").write_text("rev1")
    at = run_app()
    picker = sidebar_widget(at, "selectbox", "Checkpoint")
    assert "facebook/dinov2-reg-tiny · hf:Dinov2WithRegistersModel · no classifier" in picker.options
    picker.set_value(str(cache / "models--facebook--dinov2-reg-tiny" / "snapshots" / "rev1"))
    at.run()
    upload(at, "photo.png", png_bytes(24, 24))
    assert not at.exception
    assert sidebar_widget(at, "selectbox", "Query token").options[1] == "1 · REG 1"


def test_a_large_hf_cache_costs_the_picker_a_bounded_number_of_config_files(tmp_path, monkeypatch):
    """10,000 cached models once took 51 s a page load: the picker lists the first MAX_HF_CACHE_EXAMINED folders,
    says how many there are, and a name filter reaches the others."""
    checkpoints = tmp_path / "checkpoints"  # the dirs fixture's
    write_checkpoint(checkpoints / runfiles.DEFAULT_CHECKPOINT)
    count = catalog.MAX_HF_CACHE_EXAMINED + 10
    tiny_hf_cache(tmp_path / "hf-cache", count)  # the dirs fixture points HF_HUB_CACHE here
    reads, read_json = [], sources.read_json
    monkeypatch.setattr(sources, "read_json", lambda path: reads.append(path) or read_json(path))
    at = run_app()
    assert len(reads) <= 2 * catalog.MAX_HF_CACHE_EXAMINED  # listed, then described
    picker = sidebar_widget(at, "selectbox", "Checkpoint")
    assert len(picker.options) == 1 + catalog.MAX_HF_CACHE_EXAMINED
    assert any(f"{count:,} models in the Hugging Face cache match" in c.value for c in at.sidebar.caption)
    sidebar_widget(at, "text_input", "Find in the HF cache").set_value(f"vit-{count - 1:04d}")
    at.run()
    last = tmp_path / "hf-cache" / f"models--org--vit-{count - 1:04d}" / "snapshots" / "rev1"
    assert sidebar_widget(at, "selectbox", "Checkpoint").options[-1] == f"org/vit-{count - 1:04d} · " \
                                                                          "hf:ViTForImageClassification · 2 classes"
    sidebar_widget(at, "selectbox", "Checkpoint").set_value(str(last))
    at.run()
    assert not at.exception
    sidebar_widget(at, "text_input", "Find in the HF cache").set_value("vit-0001")
    at.run()  # the model chosen stays chosen when the filter no longer matches it
    assert sidebar_widget(at, "selectbox", "Checkpoint").value == str(last)
