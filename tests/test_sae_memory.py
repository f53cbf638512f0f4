"""``python -m vit.sae train`` checks the width, k and the buffer against memory before anything runs, and says in
one line how many latents would fit."""

import pytest
import torch

from vit.features import autoencoder_training as train
from vit.features.autoencoder import SAEError
from vit.features.autoencoder_training import SAESettings, check_settings, memory_needed


def test_the_refusal_names_the_largest_width_that_fits(monkeypatch):
    monkeypatch.setattr(train, "available_memory", lambda device: 2 * 2**30)
    settings = dict(layer=1, k=16, batch_size=512, buffer_tokens=65536)
    with pytest.raises(SAEError, match=r"at most [\d,]+ latents fit") as error:
        check_settings(SAESettings(width=10**6, **settings), 768, 12, "cpu", held_out_rows=64 * 197)
    fits = int(str(error.value).split("at most ")[1].split(" ")[0].replace(",", ""))
    assert "\n" not in str(error.value)
    assert memory_needed(768, fits, 512, 65536, 64 * 197) <= 2**30 < memory_needed(768, fits + 1, 512, 65536, 64 * 197)
    check_settings(SAESettings(width=fits, **settings), 768, 12, "cpu", held_out_rows=64 * 197)
    with pytest.raises(SAEError):
        check_settings(SAESettings(width=fits + 1, **settings), 768, 12, "cpu", held_out_rows=64 * 197)


def test_the_held_out_pass_counts_against_memory():
    without = memory_needed(96, 768, 512, 65536)
    assert memory_needed(96, 768, 512, 65536, held_out_rows=64 * 65) > without + 64 * 65 * 768 * 8


def sparse_saelens_folder(folder, d_in: int, d_sae: int):
    """A SAELens folder whose weights file declares (d_in, d_sae) float32 tensors and is as large as they are, but
    sparse: it costs no disk, and reading it costs all of its size in memory."""
    import json
    import os

    folder.mkdir()
    (folder / "cfg.json").write_text(json.dumps({"d_in": d_in, "d_sae": d_sae, "architecture": "standard"}))
    header, offset = {}, 0
    for name, shape in (("W_enc", [d_in, d_sae]), ("b_enc", [d_sae]), ("W_dec", [d_sae, d_in]), ("b_dec", [d_in])):
        size = 4 * (shape[0] * (shape[1] if len(shape) > 1 else 1))
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    with open(folder / "sae_weights.safetensors", "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        os.truncate(f.fileno(), 8 + len(text) + offset)
    return folder


def test_a_saelens_file_is_refused_before_it_is_read_when_its_sizes_exceed_the_free_memory(tmp_path, monkeypatch):
    from vit.features import autoencoder as sae
    from vit.features.autoencoder import load_sae

    monkeypatch.setattr(sae, "available_memory", lambda device: 32 * 2**20)
    folder = sparse_saelens_folder(tmp_path / "sae", 512, 2**14)  # 64 MiB of weights
    with pytest.raises(SAEError, match=r"^sae/sae_weights.safetensors: an SAE of d_in 512, d_sae 16384 needs "
                                       r"0\.06 GiB, more than half of the 0\.03 GiB free$"):
        load_sae(folder)


def test_the_free_memory_is_what_the_address_space_limit_leaves(tmp_path):
    import resource

    from vit.features.autoencoder import load_sae

    folder = sparse_saelens_folder(tmp_path / "sae", 1024, 2**16)  # 512 MiB of weights: a MemoryError under it
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (mapped + 256 * 2**20, hard))
    try:
        assert train.available_memory(torch.device("cpu")) <= 256 * 2**20
        with pytest.raises(SAEError, match=r"needs 0\.50 GiB, more than half of the 0\.\d\d GiB free$"):
            load_sae(folder)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
