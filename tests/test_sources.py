"""Opening models users already have: the convert CLI, predict/evaluate on any source, the HF cache listing,
and one-line refusals of what is unsafe, absurd or unsupported."""

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from vit import convert, evaluate, predict
from vit.app.catalog import describe, find_hf_cache_models
from vit.checkpoint import CheckpointError, load_checkpoint
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds
ROOT = Path(__file__).resolve().parent.parent
CLASSES = ["cat", "dog", "fox"]


def hf_folder(folder: Path, architecture: str = "ViTForImageClassification", **overrides) -> Path:
    """A tiny random HF model saved with save_pretrained: 32 px, 8-px patches, 2 layers."""
    config_class = "Dinov2WithRegistersConfig" if architecture.startswith("Dinov2WithRegisters") else "ViTConfig"
    sizes = dict(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2)
    if config_class == "ViTConfig":
        sizes.update(intermediate_size=32, id2label=dict(enumerate(CLASSES)),
                     label2id={c: i for i, c in enumerate(CLASSES)})
    else:
        sizes.update(mlp_ratio=2, num_register_tokens=2)
    torch.manual_seed(0)
    getattr(transformers, architecture)(getattr(transformers, config_class)(**{**sizes, **overrides})) \
        .save_pretrained(folder)
    return folder


def image_file(path: Path, seed: int = 0) -> Path:
    pixels = np.random.default_rng(seed).integers(0, 256, (40, 56, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def test_convert_writes_our_checkpoint_and_prints_its_summary(tmp_path, capsys):
    folder = hf_folder(tmp_path / "vit")
    assert convert.main([str(folder), "--out", str(tmp_path / "vit.pt")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary == {"architecture": "hf:ViTForImageClassification", "parameters": summary["parameters"],
                       "classes": 3, "image_size": 32, "patch_size": 8, "prefix_tokens": 1}
    converted, direct = load_checkpoint(tmp_path / "vit.pt"), open_source(folder)
    assert converted.class_names == CLASSES and converted.metadata["source"]["kind"] == "hf"
    assert summary["parameters"] == sum(p.numel() for p in direct.model.parameters())
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(converted.model(images)[0], direct.model(images)[0], rtol=0, atol=0)


def test_predict_on_an_hf_folder_saves_every_layer_and_the_logits(tmp_path, capsys):
    folder = hf_folder(tmp_path / "vit")
    photo = image_file(tmp_path / "photo.png")
    assert predict.main([str(folder), str(photo), "--save-maps", str(tmp_path / "maps"), "--device", "cpu"]) == 0
    [record] = json.loads(capsys.readouterr().out)
    assert [p["label"] for p in record["predictions"]] and record["predictions"][0]["label"] in CLASSES
    maps = np.load(tmp_path / "maps" / "photo.npz")
    assert sorted(k for k in maps if k.startswith("layer_")) == ["layer_0", "layer_1"]
    assert maps["layer_0"].shape == (2, 17, 17) and maps["logits"].shape == (3,)


def test_predict_on_a_model_without_head_keeps_maps_but_no_logits(tmp_path, capsys):
    folder = hf_folder(tmp_path / "dino", "Dinov2WithRegistersModel")
    photo = image_file(tmp_path / "photo.png")
    assert predict.main([str(folder), str(photo), "--save-maps", str(tmp_path / "maps"), "--device", "cpu"]) == 0
    [record] = json.loads(capsys.readouterr().out)
    assert record["predictions"] == []
    maps = np.load(tmp_path / "maps" / "photo.npz")
    assert "logits" not in maps and maps["layer_1"].shape[0] == 2  # (heads, T, T), T = 1 + 2 registers + patches


def test_evaluate_on_an_hf_folder_counts_its_id2label_classes(tmp_path, capsys):
    folder = hf_folder(tmp_path / "vit")
    for i, name in enumerate(CLASSES):
        (tmp_path / "data" / name).mkdir(parents=True)
        image_file(tmp_path / "data" / name / "a.png", seed=i)
    assert evaluate.main([str(folder), "--data", str(tmp_path / "data"), "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["count"] == 3 and set(result["per_class"]) <= set(CLASSES)


class Boom:
    def __reduce__(self):
        return (Path.touch, (Path(MARKER),))


MARKER = "/tmp/vit-import-test-pickle-ran"


def test_a_malicious_pickle_in_a_model_folder_is_refused_and_never_run(tmp_path, capsys):
    folder = hf_folder(tmp_path / "vit")
    (folder / "model.safetensors").unlink()
    with open(folder / "pytorch_model.bin", "wb") as f:
        pickle.dump({"classifier.weight": Boom()}, f)
    Path(MARKER).unlink(missing_ok=True)
    capsys.readouterr()
    assert predict.main([str(folder), str(image_file(tmp_path / "x.png"))]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "refused to load" in err
    assert not Path(MARKER).exists()


def test_legacy_format_weights_in_a_model_folder_are_refused_before_unpickling(tmp_path, monkeypatch):
    folder = hf_folder(tmp_path / "vit")
    (folder / "model.safetensors").unlink()
    torch.save({"classifier.weight": torch.zeros(3, 16)}, folder / "pytorch_model.bin",
               _use_new_zipfile_serialization=False)  # torch's pre-1.6 format: pickles that cannot be sized
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("the legacy file was unpickled"))
    with pytest.raises(CheckpointError, match=r"refused to load .*legacy \(pre-1\.6\) format") as error:
        open_source(folder)
    assert "\n" not in str(error.value)


def test_a_config_declaring_absurd_sizes_fails_in_one_line_before_allocating(tmp_path):
    folder = hf_folder(tmp_path / "vit")
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_size=2**30, intermediate_size=2**32)  # 4 G x 1 G floats if anything were allocated
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="at most 16,384") as error:
        open_source(folder)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("config, expected", [
    ({"architectures": ["SwinForImageClassification"], "model_type": "swin"}, "SwinForImageClassification"),
    ({"architectures": ["CLIPModel"]}, "CLIPModel"),
    ({"architectures": ["ViTForImageClassification"], "auto_map": {"AutoModel": "modeling_evil.Evil"}},
     "custom model code"),
    ({"architecture": "convnext_tiny", "num_classes": 10}, "convnext_tiny"),
])
def test_unsupported_models_get_one_line_naming_what_is_supported(tmp_path, capsys, config, expected):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"x": torch.zeros(1)}, folder / "model.safetensors")
    (folder / "modeling_evil.py").write_text(f"open({MARKER!r}, 'w')\n")
    Path(MARKER).unlink(missing_ok=True)
    assert convert.main([str(folder), "--out", str(tmp_path / "x.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err and "supported" in err
    assert not Path(MARKER).exists() and not (tmp_path / "x.pt").exists()


@pytest.mark.parametrize("config, closest", [
    ({"architectures": ["SwinForMaskedImageModeling"]}, "SwinModel, SwinForImageClassification"),
    ({"architectures": ["Dinov2ForDepthEstimation"], "model_type": "dinov2"},
     "Dinov2ForImageClassification, Dinov2Model"),
    ({"model_type": "swin2sr"}, "swinv2"),
    ({"architectures": ["ConvNextForImageClassification"], "model_type": "convnext"}, None),
])
def test_an_unsupported_model_is_refused_in_a_short_line_naming_the_closest_family(tmp_path, config, closest):
    # Issue 69, item 11: the refusal listed every supported family, one line of 2,330 characters.
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"x": torch.zeros(1)}, folder / "model.safetensors")
    with pytest.raises(CheckpointError) as error:
        open_source(folder)
    message = str(error.value)
    assert "\n" not in message and len(message) < 250 + len(str(folder))
    assert message.endswith("is not supported; " + ("" if closest is None else f"the closest supported: {closest}; ")
                            + "the README's table \"What it opens\" links a page listing every model this program "
                              "opens")
    assert "## What it opens" in (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_an_arch_is_read_from_its_text_and_open_source_refuses_what_the_commands_refuse():
    from vit.sources.arch_names import arch_problem
    from vit.sources.files import SourceError
    from vit.sources.open import parse_arch

    assert arch_problem(None) is None and parse_arch(None) == (None, None)
    assert arch_problem("timm:vit_base_patch16_224") is None
    assert parse_arch("scratch:num_heads=8") == ("scratch", "num_heads=8")
    for bad in ("keras:vit", "timm:", "timm", ":vit_base_patch16_224"):
        problem = arch_problem(bad)
        assert problem.startswith(f"--arch {bad!r} must be timm:NAME, torchvision:NAME") and "\n" not in problem
        with pytest.raises(SourceError) as error:
            parse_arch(bad)
        assert str(error.value) == problem


def test_convert_cli_runs_as_a_module_and_refuses_an_unknown_arch_prefix(tmp_path):
    result = subprocess.run([sys.executable, "-m", "vit.convert", str(tmp_path), "--out", str(tmp_path / "x.pt"),
                             "--arch", "keras:vit"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 2 and "must be timm:NAME, torchvision:NAME" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def fake_hf_cache(root: Path) -> Path:
    """models--ORG--NAME/{refs/main, snapshots/REV/...} as huggingface_hub lays them out."""
    for name, architecture, ref in (("google--vit-tiny", "ViTForImageClassification", "abc123"),
                                    ("facebook--dinov2-reg-tiny", "Dinov2WithRegistersModel", "def456"),
                                    ("microsoft--swin-tiny", None, "0000")):
        model_dir = root / f"models--{name}"
        snapshot = model_dir / "snapshots" / ref
        if architecture:
            hf_folder(snapshot, architecture)
        else:
            snapshot.mkdir(parents=True)
            (snapshot / "config.json").write_text(json.dumps({"architectures": ["SwinForImageClassification"]}))
        (model_dir / "refs").mkdir(parents=True)
        (model_dir / "refs" / "main").write_text(ref)
    return root


def test_hf_cache_lists_the_supported_models_by_hub_name(tmp_path, monkeypatch):
    cache = fake_hf_cache(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    found = find_hf_cache_models()
    assert [c.name for c in found] == ["facebook/dinov2-reg-tiny", "google/vit-tiny"]
    assert found[1].path == cache / "models--google--vit-tiny" / "snapshots" / "abc123"
    entry = describe(found[0])
    assert entry.ok and entry.label == "facebook/dinov2-reg-tiny · hf:Dinov2WithRegistersModel · no classifier"
    assert open_source(found[0].path).config.prefix_token_names == ("CLS", "REG 1", "REG 2")


def test_hf_cache_listing_never_touches_the_network(tmp_path, monkeypatch):
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError("network access")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    fake_hf_cache(tmp_path / "hub")
    assert len(find_hf_cache_models()) == 2


def test_a_timm_folder_is_described_from_its_config_and_header_without_reading_weights(tmp_path, monkeypatch):
    timm = pytest.importorskip("timm")
    model = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, img_size=28, embed_dim=12, depth=2,
                              num_heads=2)
    folder = tmp_path / "models--timm--vit_small_patch14_reg4_dinov2" / "snapshots" / "r1"
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"architecture": "vit_small_patch14_reg4_dinov2",
                                                    "model_args": {"num_heads": 2}}))
    (folder.parent.parent / "refs").mkdir()
    (folder.parent.parent / "refs" / "main").write_text("r1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    [candidate] = find_hf_cache_models()
    monkeypatch.setattr("vit.sources.open.read_weights", lambda path: pytest.fail("weights were read"))
    entry = describe(candidate)
    assert entry.ok and entry.label == "timm/vit_small_patch14_reg4_dinov2 · timm:vit_small_patch14_reg4_dinov2 · " \
                                       "no classifier"
    assert entry.parameters == sum(p.numel() for p in model.parameters()) and entry.num_layers == 2


def test_sharded_hf_weights_and_a_config_without_architectures_open(tmp_path):
    from safetensors.torch import load_file

    folder = hf_folder(tmp_path / "vit")
    state = load_file(folder / "model.safetensors")
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for name, part in shards.items():
        save_file({k: state[k] for k in part}, folder / name)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: name for name, part in shards.items() for k in part}}))
    (folder / "model.safetensors").unlink()
    config = json.loads((folder / "config.json").read_text())
    del config["architectures"]
    (folder / "config.json").write_text(json.dumps(config))
    checkpoint = open_source(folder)
    assert checkpoint.metadata["architecture"] == "hf:ViTForImageClassification"
    assert checkpoint.class_names == CLASSES


@pytest.mark.parametrize("shard", ["../model.safetensors", "/etc/passwd", "..", "", 7])
def test_every_reader_of_a_shard_index_refuses_a_shard_outside_the_folder_in_one_line(tmp_path, shard):
    """The opener, the VLM's missing-shard check and the word lens's embedding lookup read a shard index through one
    helper: a shard that is not a file name beside the index is refused by each in one line, before any file is
    opened (the VLM check once skipped such a name quietly, and ``..`` passed every check)."""
    from vit.sources.vlm import whole_vlm, word_embeddings

    folder = hf_folder(tmp_path / "vit")
    (folder / "model.safetensors").rename(tmp_path / "model.safetensors")  # what "../model.safetensors" names
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"embed_tokens.weight": shard}}))
    refused = "names a shard outside the folder"
    for read in (open_source, whole_vlm.missing_weights, word_embeddings._embedding_entry):
        with pytest.raises(CheckpointError, match=refused) as caught:
            read(folder)
        assert "\n" not in str(caught.value)
    assert word_embeddings.missing_embedding_shard(folder) is None  # the page's check: the lens says why


def test_a_shard_index_is_read_once_for_each_version_of_the_file(tmp_path, monkeypatch):
    """A VLM's explorer page asks which shards are missing on every run: the index (tens of kB for a 7B) is read once
    until the file changes."""
    from vit.sources import weights_files

    folder = tmp_path / "model"
    folder.mkdir()
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "model-1.safetensors"}}))
    read = []
    real = weights_files.read_json
    monkeypatch.setattr(weights_files, "read_json", lambda path: read.append(path) or real(path))
    for _ in range(3):
        assert dict(weights_files.shard_index(folder)[1]) == {"a": "model-1.safetensors"}
    assert read == [index]
    index.write_text(json.dumps({"weight_map": {"a": "model-1.safetensors", "b": "model-22.safetensors"}}))
    assert dict(weights_files.shard_index(folder)[1]) == {"a": "model-1.safetensors", "b": "model-22.safetensors"}
    assert read == [index, index]
    with pytest.raises(TypeError):
        weights_files.shard_index(folder)[1]["c"] = "x"  # the cached map is shared: read-only
    index.write_text(json.dumps({"weights": {}}))
    with pytest.raises(CheckpointError, match="has no weight_map"):
        weights_files.shard_index(folder)
    assert weights_files.shard_index(tmp_path) is None

def test_a_preprocessor_declaring_an_absurd_input_size_is_refused(tmp_path):
    folder = hf_folder(tmp_path / "vit")
    (folder / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 800_000, "width": 800_000}}))
    with pytest.raises(CheckpointError, match="at most 2048 px"):
        open_source(folder)


def test_convert_and_predict_take_a_bare_timm_file_with_its_arch(tmp_path, capsys):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, img_size=32, patch_size=8,
                              depth=1, num_classes=4)  # width 192: 3 heads by timm's convention
    torch.save(model.state_dict(), tmp_path / "deit.pth")
    arch = "timm:deit_tiny_distilled_patch16_224"
    assert convert.main([str(tmp_path / "deit.pth"), "--arch", arch, "--out", str(tmp_path / "deit.pt")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["architecture"], summary["prefix_tokens"], summary["classes"]) == (arch, 2, 4)
    photo = image_file(tmp_path / "photo.png")
    assert predict.main([str(tmp_path / "deit.pth"), str(photo), "--arch", arch, "--top-k", "1"]) == 0
    [record] = json.loads(capsys.readouterr().out)
    assert record["predictions"][0]["label"].startswith("class ")


@pytest.mark.parametrize("change, expected", [
    ({"num_labels": 10**12, "id2label": None}, "num_classes is 1,000,000,000,000; at most 100,000"),
    ({"num_hidden_layers": 10**6}, "num_layers is 1,000,000; at most 256"),
    ({"image_size": 10**7}, "image_size is 10,000,000; at most 8,192"),
])
def test_a_config_declaring_absurd_numbers_is_refused_before_anything_is_built(tmp_path, change, expected,
                                                                               monkeypatch):
    """num_labels 10**12 without id2label once built 10**12 class names: sizes are bounded as the config is read."""
    from vit.sources import open_hf  # the HF folder road, which names the classes

    monkeypatch.setattr(open_hf, "default_class_names", lambda n: pytest.fail("class names were built"))
    folder = hf_folder(tmp_path / "vit")
    config = json.loads((folder / "config.json").read_text())
    config.update(change)
    config = {k: v for k, v in config.items() if v is not None}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=expected) as error:
        open_source(folder)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("config_text, expected", [
    ('{"model_type": "dinov2", "architectures": ["Dinov2Model"], "mlp_ratio": 1e308, "hidden_size": 8}',
     "mlp_ratio must be a number in"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_hostile_configs_in_the_hf_cache_get_one_line_and_the_healthy_model_beside_them_still_lists(
        tmp_path, config_text, expected):
    from vit.app.catalog import describe_import, find_hf_cache_models
    from vit.sources import open as sources

    cache = tmp_path / "hub"
    for name, text in (("bad", config_text), ("good", None)):
        snapshot = cache / f"models--org--{name}" / "snapshots" / "rev1"
        if text is None:
            hf_folder(snapshot)
        else:
            snapshot.mkdir(parents=True)
            (snapshot / "config.json").write_text(text)
            (snapshot / "model.safetensors").write_bytes(b"")
        (cache / f"models--org--{name}" / "refs").mkdir()
        (cache / f"models--org--{name}" / "refs" / "main").write_text("rev1")
    entries = {e.name: e for e in (describe_import(c) for c in find_hf_cache_models([cache]))}
    assert entries["org/good"].error is None
    if "org/bad" in entries:  # listed with its one line (a config that cannot even be parsed is not listed)
        assert expected in entries["org/bad"].error and "\n" not in entries["org/bad"].error
    else:
        with pytest.raises(CheckpointError, match=expected):
            sources.read_json(cache / "models--org--bad" / "snapshots" / "rev1" / "config.json")


@pytest.mark.parametrize("processor, expected", [
    ({"image_mean": "abc"}, "image_mean must be a list of numbers"),
    ({"resample": [1]}, "resample must be a PIL filter number"),
    ({"image_std": [0, 0, 0]}, "image_std must be positive"),
])
def test_a_hostile_preprocessor_config_is_refused_in_one_line(tmp_path, processor, expected):
    folder = hf_folder(tmp_path / "vit")
    (folder / "preprocessor_config.json").write_text(json.dumps({"do_resize": True, "size": 32, **processor}))
    with pytest.raises(CheckpointError, match=expected) as error:
        open_source(folder)
    assert "\n" not in str(error.value) and "preprocessor_config.json" in str(error.value)


def test_weights_without_a_preprocessing_config_say_what_is_assumed(tmp_path):
    """Issue 19, item 8: bare timm weights (and an HF folder without preprocessor_config.json) opened silently with
    family defaults; the checkpoint now carries a line saying which defaults, which the explorer shows."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1,
                              num_classes=4)
    torch.save(model.state_dict(), tmp_path / "deit.pth")
    bare = open_source(tmp_path / "deit.pth", "timm:deit_tiny_patch16_224")
    guessed = bare.metadata["preprocessing_guessed"]
    assert guessed.startswith("No timm pretrained_cfg (mean, std) came with these weights")
    assert "mean (0.485, 0.456, 0.406)" in guessed and "centre 32 px" in guessed
    timm.models.save_for_hf(model, tmp_path / "with-config", model_args=dict(img_size=32, patch_size=8, depth=1))
    assert "preprocessing_guessed" not in open_source(tmp_path / "with-config").metadata
    folder = hf_folder(tmp_path / "hf")
    (folder / "preprocessor_config.json").unlink(missing_ok=True)
    assert "No preprocessor_config.json" in open_source(folder).metadata["preprocessing_guessed"]
