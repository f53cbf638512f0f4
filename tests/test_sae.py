"""Sparse autoencoders: SAELens's encoding and AuxK exactly, its folders both ways, the harvest at the model's own
hook point, the bounded shuffle buffer, and ``python -m vit.sae train`` end to end on the shipped samples."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.reference.sae_lens.topk_reference import ReferenceTopKSAE
from vit.checkpoint import load_checkpoint
from vit.features.autoencoder import (
    SAEError,
    SAEInfo,
    SparseAutoencoder,
    check_fits,
    load_sae,
    model_fingerprint,
    save_sae,
)
from vit.features.harvest import ShuffleBuffer, layer_tokens
from vit.model import ViT, ViTConfig
from vit.sae import main

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT = ROOT / "checkpoints" / "cifar10-cifar-s.pt"
SAMPLES = ROOT / "checkpoints" / "samples" / "cifar10-cifar-s"


def random_pair(d_in=12, d_sae=40, k=5, rescale=False, seed=0):
    """Our SAE and SAELens's reference with the same random weights (b_enc and b_dec non-zero)."""
    torch.manual_seed(seed)
    reference = ReferenceTopKSAE(d_in, d_sae, k, rescale_acts_by_decoder_norm=rescale)
    with torch.no_grad():
        reference.W_dec.mul_(torch.rand(d_sae, 1) + 0.5)  # rows of several norms: the rescale must matter
        reference.b_enc.normal_()
        reference.b_dec.normal_()
    ours = SparseAutoencoder(d_in, d_sae, k, rescale_acts_by_decoder_norm=rescale)
    with torch.no_grad():
        for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
            getattr(ours, name).copy_(getattr(reference, name))
    return ours, reference


@pytest.mark.parametrize("rescale", [False, True])
def test_encoding_and_decoding_equal_sae_lens_topk(rescale):
    ours, reference = random_pair(rescale=rescale)
    x = torch.randn(3, 7, 12)
    with torch.no_grad():
        z, z_ref = ours.encode(x), reference.encode(x)
        torch.testing.assert_close(z, z_ref, rtol=0, atol=1e-6)
        assert ((z > 0).sum(dim=-1) <= 5).all() and (z > 0).any()
        torch.testing.assert_close(ours.decode(z), reference.decode(z_ref), rtol=0, atol=1e-5)


def test_aux_k_loss_equals_sae_lens():
    ours, reference = random_pair(d_sae=64)
    reference.cfg.aux_loss_coefficient = 1 / 32
    x = torch.randn(50, 12)
    dead = torch.zeros(64, dtype=torch.bool)
    dead[::3] = True  # 22 dead latents: more than d_in / 2, so k_aux = 6 and the scale is 1
    pre = ours.pre_activations(x)
    x_hat = ours(x)
    expected = reference.calculate_topk_aux_loss(x, x_hat, pre, dead)
    torch.testing.assert_close(ours.aux_k_loss(x, x_hat, pre, dead, 1 / 32), expected)
    few = torch.zeros(64, dtype=torch.bool)
    few[:2] = True  # two dead: scaled by 2 / 6
    torch.testing.assert_close(ours.aux_k_loss(x, x_hat, pre, few, 1 / 32),
                               reference.calculate_topk_aux_loss(x, x_hat, pre, few))
    assert float(ours.aux_k_loss(x, x_hat, pre, torch.zeros(64, dtype=torch.bool))) == 0


def test_saved_folder_has_sae_lens_keys_and_loads_back_exactly(tmp_path):
    ours, _ = random_pair()
    ours.info = SAEInfo(model_name="m", hook_name="blocks.1.hook_resid_post", model_fingerprint="abc")
    save_sae(ours, tmp_path / "sae")
    cfg = json.loads((tmp_path / "sae" / "cfg.json").read_text())
    assert (cfg["architecture"], cfg["k"], cfg["d_in"], cfg["d_sae"], cfg["apply_b_dec_to_input"]) == ("topk", 5, 12,
                                                                                                        40, True)
    assert cfg["metadata"]["hook_name"] == "blocks.1.hook_resid_post" and cfg["metadata"]["model_name"] == "m"
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "sae" / "sae_weights.safetensors"))
    assert {n: tuple(t.shape) for n, t in weights.items()} == {"W_enc": (12, 40), "b_enc": (40,), "W_dec": (40, 12),
                                                               "b_dec": (12,)}
    loaded = load_sae(tmp_path / "sae")
    x = torch.randn(9, 12)
    torch.testing.assert_close(loaded(x), ours(x).detach(), rtol=0, atol=0)
    assert loaded.info.hook_name == "blocks.1.hook_resid_post" and loaded.info.model_fingerprint == "abc"


def test_a_pre_6_sae_lens_config_loads(tmp_path):
    ours, reference = random_pair()
    save_sae(ours, tmp_path)
    (tmp_path / "cfg.json").write_text(json.dumps({
        "d_in": 12, "d_sae": 40, "hook_point": "blocks.0.hook_resid_post", "model_name": "old",
        "activation_fn_str": "topk", "activation_fn_kwargs": {"k": 5}, "apply_b_dec_to_input": True}))
    loaded = load_sae(tmp_path)
    assert (loaded.architecture, loaded.k, loaded.info.hook_name, loaded.info.model_name) == (
        "topk", 5, "blocks.0.hook_resid_post", "old")
    x = torch.randn(4, 12)
    torch.testing.assert_close(loaded.encode(x), reference.encode(x).detach(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("change, message", [
    ({"d_sae": 41}, "not the shapes"),
    ({"k": 0}, "k must be"),
    ({"d_sae": 2**30}, "d_sae must be"),
    ({"architecture": "jumprelu_transcoder"}, "not supported"),
    ({"normalize_activations": "layer_norm"}, "normalize_activations"),
])
def test_a_damaged_config_is_one_line_refusal(tmp_path, change, message):
    ours, _ = random_pair()
    save_sae(ours, tmp_path)
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    (tmp_path / "cfg.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(SAEError, match=message) as error:
        load_sae(tmp_path)
    assert "\n" not in str(error.value)


def tiny_model(seed=0, hidden=16):
    torch.manual_seed(seed)
    return ViT(ViTConfig(image_size=8, patch_size=4, num_classes=3, hidden_size=hidden, num_layers=2, num_heads=2,
                         mlp_size=32)).eval()


def test_an_sae_of_another_model_layer_or_width_is_refused():
    model = tiny_model()
    sae = SparseAutoencoder(16, 32, 4, info=SAEInfo(hook_name="blocks.1.hook_resid_post",
                                                    model_fingerprint=model_fingerprint(model)))
    assert check_fits(sae, model) == 2
    with pytest.raises(SAEError, match="another model"):
        check_fits(sae, tiny_model(seed=1))
    with pytest.raises(SAEError, match="width"):
        check_fits(SparseAutoencoder(8, 32, 4, info=SAEInfo(hook_name="blocks.1.hook_resid_post")), model)
    with pytest.raises(SAEError, match="2 blocks"):
        check_fits(SparseAutoencoder(16, 32, 4, info=SAEInfo(hook_name="blocks.5.hook_resid_post")), model)
    with pytest.raises(SAEError, match="only a block's output"):
        check_fits(SparseAutoencoder(16, 32, 4, info=SAEInfo(hook_name="blocks.1.hook_mlp_out")), model)


def test_harvest_reads_the_output_of_block_l():
    model = tiny_model()
    images = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        x = model.embed(images)
        x = model.blocks[0](x)[0]  # the stream after block 1, computed block by block
    torch.testing.assert_close(layer_tokens(model, images, "blocks.0.hook_resid_post"), x)


def test_shuffle_buffer_gives_every_row_once_in_mixed_batches():
    buffer = ShuffleBuffer(capacity=8, d=1, batch_size=4, generator=torch.Generator().manual_seed(0))
    rows = torch.arange(30, dtype=torch.float32)[:, None]
    out = []
    for start in range(0, 30, 5):
        out += buffer.add(rows[start:start + 5])
        assert buffer.size <= 8
    out += buffer.drain()
    values = torch.cat(out)[:, 0]
    assert sorted(values.tolist()) == list(range(30))
    assert values.tolist() != list(range(30))
    assert all(len(batch) <= 4 for batch in out)


def run_main(args, capsys):
    code = main(args)
    return code, capsys.readouterr()


def test_train_command_writes_a_sae_lens_folder_metrics_and_features(tmp_path, capsys):
    out = tmp_path / "sae"
    code, printed = run_main(["train", str(CHECKPOINT), "--data", str(SAMPLES), "--layer", "2", "--expansion", "2",
                              "--k", "8", "--epochs", "12", "--batch-size", "64", "--buffer-tokens", "256",
                              "--holdout", "2", "--lr", "0.003", "--out", str(out), "--device", "cpu"], capsys)
    assert code == 0, printed.err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["images"] == 2 and metrics["tokens"] == 2 * 65 and metrics["l0"] <= 8
    assert metrics["explained_variance"] > 0.4  # 8 images, 520 tokens: far from the full recipe (0.54 here)
    assert 0 <= metrics["top1_agreement"] <= 1 and metrics["ce_clean"] >= 0
    assert metrics["data"] == str(SAMPLES.resolve())  # where features.npz's image names are (the explorer's crops)
    sae = load_sae(out)
    checkpoint = load_checkpoint(CHECKPOINT)
    assert check_fits(sae, checkpoint.model) == 2 and (sae.d_in, sae.d_sae, sae.k) == (96, 192, 8)
    features = np.load(out / "features.npz")
    assert features["exemplar_values"].shape == (192, 16) and features["histograms"].shape == (192, 64)
    assert len(features["images"]) == 2 and features["exemplar_images"].max() <= 1
    assert features["exemplar_tokens"].max() < 65
    fired = features["frequency"] > 0
    assert (features["histograms"].sum(axis=1)[fired] > 0).all()
    assert [json.loads(line)["step"] for line in (out / "steps.jsonl").read_text().splitlines()][0] == 1


@pytest.mark.parametrize("args, message", [
    (["--layer", "7"], "--layer 7 is out of range"),
    (["--layer", "2", "--width", "10", "--k", "11"], "--k 11"),
    (["--layer", "2", "--width", "1000000", "--buffer-tokens", "100000000"], "GiB"),
    (["--layer", "0"], "at least 1"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, capsys, args, message):
    code, printed = run_main(["train", str(CHECKPOINT), "--data", str(SAMPLES), "--out", str(tmp_path / "o"),
                              "--device", "cpu", *args], capsys)
    assert code == 2 and message in printed.err and printed.err.count("\n") == 1
    assert not (tmp_path / "o").exists()
