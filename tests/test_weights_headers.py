"""Weights are checked from their headers (names, shapes, counts) before any tensor data is read, on every path
that opens a model: ``open_source`` with and without ``--arch``, ``vit.convert``, ``vit.train --init``
(issue 20, item 8: a 12 KB sparse safetensors declaring one 3 GB tensor used 6 GB before it was refused)."""

import json
import struct

import pytest
import safetensors.torch
import torch

from vit import convert
from vit.checkpoint import (
    MAX_SAFETENSORS_HEADER_BYTES,
    MAX_TENSORS,
    CheckpointError,
    load_checkpoint,
    safetensors_shapes,
    save_checkpoint,
)
from vit.model import ViT, ViTConfig
from vit.sources.open import open_source
from vit.training.finetune import prepare_init

GIB = 2**30
HF_CONFIG = {"architectures": ["ViTForImageClassification"], "model_type": "vit", "image_size": 32, "patch_size": 8,
             "num_channels": 3, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 32, "id2label": {"0": "cat", "1": "dog"}}


def sparse_safetensors(path, tensors: dict[str, tuple[str, list[int]]], itemsize: int = 4) -> None:
    """A safetensors file whose header declares ``tensors`` ({name: (dtype, shape)}) and whose data is a hole: the
    file takes a few kB of disk whatever it declares, as in the issue."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = itemsize
        for n in shape:
            size *= n
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)


@pytest.fixture
def data_never_read(monkeypatch):
    """Fails the test if any tensor data is read: safetensors' reader, or a torch.load that is not shapes-only."""
    def refuse_safetensors(*args, **kwargs):
        raise AssertionError("tensor data was read before the header was checked")

    real_load = torch.load

    def shapes_only(*args, **kwargs):
        if str(kwargs.get("map_location")) != "meta" and not kwargs.get("mmap"):
            raise AssertionError("tensor data was read before the names and shapes were checked")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "load_file", refuse_safetensors)
    monkeypatch.setattr(torch, "load", shapes_only)


@pytest.fixture
def hf_folder_declaring_3_gb(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(HF_CONFIG))
    sparse_safetensors(folder / "model.safetensors", {"x": ("F32", [3 * GIB // 4])})
    assert (folder / "model.safetensors").stat().st_blocks * 512 < 1_000_000  # a hole, not 3 GB of disk
    return folder


def test_an_hf_folder_declaring_a_3_gb_tensor_it_has_no_place_for_is_refused_before_reading_it(
        hf_folder_declaring_3_gb, data_never_read):
    with pytest.raises(CheckpointError, match="has no .embeddings.cls_token."):
        open_source(hf_folder_declaring_3_gb)


def test_convert_and_train_init_refuse_it_the_same_way(hf_folder_declaring_3_gb, data_never_read, tmp_path, capsys):
    assert convert.main([str(hf_folder_declaring_3_gb), "--out", str(tmp_path / "out.pt")]) == 2
    assert "embeddings.cls_token" in capsys.readouterr().err
    assert not (tmp_path / "out.pt").exists()
    with pytest.raises(CheckpointError, match="embeddings.cls_token"):
        prepare_init(str(hf_folder_declaring_3_gb), 2)


def test_a_bare_weights_file_with_and_without_arch_is_checked_before_it_is_read(tmp_path, data_never_read):
    weights = tmp_path / "vit.safetensors"
    sparse_safetensors(weights, {"cls_token": ("F32", [1, 1, 16]), "pos_embed": ("F32", [1, 17, 16]),
                                 "patch_embed.proj.weight": ("F32", [16, 3, 8, 8]),
                                 "blocks.0.attn.qkv.weight": ("F32", [GIB // 16, 48])})
    for arch in (None, "timm:vit_tiny_patch16_224"):
        with pytest.raises(CheckpointError):
            open_source(weights, arch)


def test_a_torch_pickle_of_weights_that_do_not_fit_is_refused_from_its_shapes(tmp_path, data_never_read):
    weights = tmp_path / "vit.pth"
    torch.save({"cls_token": torch.zeros(1, 1, 16), "patch_embed.proj.weight": torch.zeros(16, 3, 8, 8),
                "blocks.0.attn.qkv.weight": torch.zeros(100, 48)}, weights)
    with pytest.raises(CheckpointError):
        open_source(weights, "timm:vit_tiny_patch16_224")


def test_our_checkpoint_is_checked_while_its_tensors_are_only_mapped(tmp_path, data_never_read):
    config = ViTConfig(image_size=16, patch_size=4, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32,
                       num_classes=2)
    model = ViT(config)
    path = save_checkpoint(tmp_path / "ours.pt", model, ["a", "b"])
    torch.testing.assert_close(load_checkpoint(path).model.state_dict(), model.state_dict(), rtol=0, atol=0)
    assert open_source(path).config == config


def test_a_header_declaring_58_mb_is_refused_from_its_first_8_bytes(tmp_path, monkeypatch):
    path = tmp_path / "huge_header.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", 58 * 2**20) + b"{")
        f.truncate(8 + 58 * 2**20)
    monkeypatch.setattr("json.loads", lambda *a, **k: pytest.fail("the header was parsed"))
    with pytest.raises(CheckpointError, match=f"at most {MAX_SAFETENSORS_HEADER_BYTES:,}"):
        safetensors_shapes(path)


def test_more_tensors_than_any_model_has_are_refused_before_any_is_made(tmp_path, data_never_read):
    path = tmp_path / "many.safetensors"
    sparse_safetensors(path, {f"t{i}": ("F32", [0]) for i in range(MAX_TENSORS + 1)})
    with pytest.raises(CheckpointError, match=f"lists {MAX_TENSORS + 1:,} tensors, more than the {MAX_TENSORS:,}"):
        open_source(path)


@pytest.mark.parametrize("entry, expected", [
    ({"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}, "does not match its shape"),
    ({"dtype": "F32", "shape": [4], "data_offsets": [0, 10**9]}, "does not match its shape"),
    ({"dtype": "X9", "shape": [4], "data_offsets": [0, 16]}, "known dtype"),
    ({"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}, "sizes >= 0"),
    ({"dtype": "F32", "shape": [1] * 9, "data_offsets": [0, 4]}, "at most 8 sizes"),
    ([1, 2], "known dtype"),
])
def test_a_header_entry_that_does_not_describe_its_bytes_is_one_line(tmp_path, entry, expected):
    text = json.dumps({"w": entry}).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(16))
    with pytest.raises(CheckpointError, match=expected) as info:
        safetensors_shapes(path)
    assert "\n" not in str(info.value)


def test_a_header_nested_past_the_parsers_stack_is_one_line(tmp_path):
    text = b"[" * 200_000
    path = tmp_path / "nested.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text)
    with pytest.raises(CheckpointError, match="nested too deeply"):
        safetensors_shapes(path)


def test_the_header_gives_the_names_dtypes_and_shapes_safetensors_itself_reads(tmp_path):
    tensors = {"a": torch.zeros(2, 3), "b": torch.zeros(5, dtype=torch.bfloat16), "c": torch.zeros(0, 4),
               "d": torch.zeros((), dtype=torch.int64)}
    safetensors.torch.save_file(tensors, tmp_path / "w.safetensors", metadata={"format": "pt"})
    shapes = safetensors_shapes(tmp_path / "w.safetensors")
    reference = safetensors.torch.load_file(tmp_path / "w.safetensors")
    assert {k: (v.dtype, tuple(v.shape)) for k, v in shapes.items()} == \
        {k: (v.dtype, tuple(v.shape)) for k, v in reference.items()}
    assert all(v.is_meta for v in shapes.values())
