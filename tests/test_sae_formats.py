"""Other libraries' SAE files encode exactly as their own code does: ViT-Prisma's (``tests/reference/vit_prisma_sae``)
and saev's (``tests/reference/saev``: today's ``modeling`` and the schema-less ``nn_legacy``) build SAEs with random
weights, save them in their own format, and ``vit.features.formats`` reads them; SAELens folders and the others by
Hub id through the local Hub server."""

import json
import os
from pathlib import Path

import pytest
import torch

from vit.features.autoencoder import SAEError, SAEInfo, SparseAutoencoder, check_fits, load_sae, save_sae
from vit.features.formats import load_prisma, load_saev, open_sae
from vit.model import ViT, ViTConfig

D_IN, EXPANSION, K = 12, 4, 5


def randomise(module, seed=0):
    """Non-zero biases and decoder rows of several norms, so that every term of the encoding matters."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in ("W_enc", "W_dec", "b_enc", "b_dec"):
            parameter = getattr(module, name)
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * (0.5 if name[0] == "b" else 1.0))


def activations(seed=1):
    """Residual-stream-like rows: an offset and several scales, so normalisation and b_dec both matter."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(2, 7, D_IN, generator=generator) * torch.linspace(0.5, 3, D_IN) + 2.0


def prisma_sae(folder: Path, activation="topk", normalize="layer_norm", layer=1, d_in=D_IN, context_size=5):
    """A Prisma SAE saved as its trainer's ``checkpoint`` does: config.json, then ``save_model`` of a .pt (by default
    for tiny_model: its 4 patches and CLS)."""
    pytest.importorskip("vit_prisma", reason="install it with: pip install --no-deps -r requirements-test-nodeps.txt")
    from tests.reference.vit_prisma_sae.config import VisionModelSAERunnerConfig
    from tests.reference.vit_prisma_sae.sae import StandardSparseAutoencoder

    cfg = VisionModelSAERunnerConfig(
        d_in=d_in, expansion_factor=EXPANSION, activation_fn_str=activation,
        activation_fn_kwargs={"k": K} if activation == "topk" else {}, normalize_activations=normalize,
        hook_point_layer=layer, layer_subtype="hook_resid_post", _device="cpu", model_name="local-tiny",
        log_to_wandb=False, checkpoint_path=str(folder), context_size=context_size)
    reference = StandardSparseAutoencoder(cfg)
    randomise(reference)
    folder.mkdir(parents=True, exist_ok=True)
    cfg.save_config(str(folder / "config.json"))
    reference.save_model(str(folder / "n_images_100.pt"))
    torch.save(torch.zeros(d_in * EXPANSION), folder / "n_images_100_log_feature_sparsity.pt")
    return reference.eval()


@pytest.mark.parametrize("activation", ["topk", "relu"])
@pytest.mark.parametrize("normalize", ["none", "layer_norm", "constant_norm_rescale"])
def test_prisma_sae_encodes_and_decodes_as_prisma(tmp_path, activation, normalize):
    reference = prisma_sae(tmp_path / "sae", activation, normalize)
    ours = load_prisma(tmp_path / "sae")
    x = activations()
    with torch.no_grad():
        _, expected = reference.encode(x)
        expected_out = reference.decode(expected)
        z = ours.encode(x)
        torch.testing.assert_close(z, expected, rtol=0, atol=1e-6)
        torch.testing.assert_close(ours.decode(z), expected_out, rtol=0, atol=1e-5)
    assert (z > 0).any() and (activation == "relu" or ((z > 0).sum(-1) <= K).all())
    assert (ours.info.hook_name, ours.info.model_name) == ("blocks.1.hook_resid_post", "local-tiny")


def test_prisma_checkpoint_alone_reads_its_pickled_config_without_running_it(tmp_path):
    reference = prisma_sae(tmp_path / "sae", "topk", "constant_norm_rescale")
    (tmp_path / "sae" / "config.json").unlink()
    ours = load_prisma(tmp_path / "sae" / "n_images_100.pt")
    x = activations()
    with torch.no_grad():
        torch.testing.assert_close(ours.encode(x), reference.encode(x)[1], rtol=0, atol=1e-6)


class RunsCode:
    def __reduce__(self):
        return os.system, ("touch pwned-by-sae",)


def test_a_checkpoint_pickling_anything_else_is_refused_without_running_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prisma_sae(tmp_path / "sae")
    saved = torch.load(tmp_path / "sae" / "n_images_100.pt", weights_only=False)
    torch.save({"cfg": RunsCode(), "state_dict": saved["state_dict"]}, tmp_path / "sae" / "n_images_100.pt")
    with pytest.raises(SAEError, match="system") as error:
        load_prisma(tmp_path / "sae")
    assert "\n" not in str(error.value) and not (tmp_path / "pwned-by-sae").exists()


def test_a_prisma_checkpoint_larger_than_its_config_declares_is_refused_before_reading(tmp_path):
    prisma_sae(tmp_path / "sae")
    config = json.loads((tmp_path / "sae" / "config.json").read_text())
    (tmp_path / "sae" / "config.json").write_text(json.dumps({**config, "d_in": 2, "expansion_factor": 1}))
    with open(tmp_path / "sae" / "n_images_100.pt", "ab") as f:
        f.write(b"\0" * (2 << 20))
    with pytest.raises(SAEError, match="bytes, more than"):
        load_prisma(tmp_path / "sae")


def test_sizes_a_file_declares_but_does_not_hold_are_refused_before_allocating(tmp_path):
    saev_sae(tmp_path / "sae.pt", "relu")
    header, _, rest = (tmp_path / "sae.pt").read_bytes().partition(b"\n")
    cfg = json.loads(header)
    cfg["cfg"].update(d_model=16384, d_sae=2**20)  # 128 GiB of weights, declared in a file of a few kB
    (tmp_path / "big.pt").write_bytes(json.dumps(cfg).encode() + b"\n" + rest)
    with pytest.raises(SAEError, match="bytes, less than"):
        load_saev(tmp_path / "big.pt")


def saev_sae(path: Path, activation: str, d_in=D_IN):
    """A saev SAE as saev is today (schema 5), dumped with its own ``dump``; BatchTopK with a trained threshold."""
    from tests.reference.saev import modeling

    kinds = {"relu": modeling.Relu(), "topk": modeling.TopK(top_k=K), "batch_topk": modeling.BatchTopK(top_k=K)}
    reference = modeling.SparseAutoencoder(modeling.SparseAutoencoderConfig(d_model=d_in, d_sae=d_in * EXPANSION,
                                                                            activation=kinds[activation]))
    randomise(reference)
    if activation == "topk":
        reference.b_enc.data -= 30  # most pre-activations negative: saev's TopK keeps negative ones (no ReLU)
    if activation == "batch_topk":
        reference.activation.threshold.fill_(0.7)
    modeling.dump(str(path), reference)
    return modeling.load(str(path)).eval()


@pytest.mark.parametrize("activation", ["relu", "topk", "batch_topk"])
def test_saev_sae_encodes_as_saev(tmp_path, activation):
    reference = saev_sae(tmp_path / "sae.pt", activation)
    ours = load_saev(tmp_path / "sae.pt", layer=2)
    x = activations().reshape(-1, D_IN)
    with torch.no_grad():
        expected = reference.encode(x)
        z = ours.encode(x)
        torch.testing.assert_close(z, expected.f_x, rtol=0, atol=1e-6)
        torch.testing.assert_close(ours.decode(z), reference.decode(expected.f_x)[:, -1], rtol=0, atol=1e-5)
    assert (z != 0).any() and ours.info.hook_name == "blocks.1.hook_resid_post"
    if activation == "topk":
        assert (z < 0).any()  # saev keeps the k largest as they are: no ReLU


def test_saev_file_without_schema_encodes_as_the_saev_that_wrote_it(tmp_path):
    from tests.reference.saev import legacy_config, nn_legacy

    reference = nn_legacy.SparseAutoencoder(legacy_config.SparseAutoencoder(d_vit=D_IN, exp_factor=EXPANSION))
    randomise(reference)
    nn_legacy.dump(str(tmp_path / "sae.pt"), reference)
    ours = load_saev(tmp_path / "sae.pt")
    x = activations().reshape(-1, D_IN)
    with torch.no_grad():
        x_hat, f_x, _ = reference(x)
        torch.testing.assert_close(ours.encode(x), f_x, rtol=0, atol=1e-6)
        torch.testing.assert_close(ours(x), x_hat, rtol=0, atol=1e-5)


def test_saev_schema_1_and_unknown_schemas_are_one_line_refusals(tmp_path):
    saev_sae(tmp_path / "sae.pt", "relu")
    data = (tmp_path / "sae.pt").read_bytes()
    header, _, rest = data.partition(b"\n")
    for schema, message in ((1, "schema 1"), (9, "not known")):
        (tmp_path / "bad.pt").write_bytes(json.dumps({**json.loads(header), "schema": schema}).encode() + b"\n" + rest)
        with pytest.raises(SAEError, match=message) as error:
            load_saev(tmp_path / "bad.pt")
        assert "\n" not in str(error.value)


def tiny_model(hidden=D_IN, layers=2, image=8):
    torch.manual_seed(0)
    return ViT(ViTConfig(image_size=image, patch_size=4, num_classes=3, hidden_size=hidden, num_layers=layers,
                         num_heads=2, mlp_size=24)).eval()


def test_a_mismatch_of_model_layer_or_width_is_a_one_line_refusal(tmp_path):
    prisma_sae(tmp_path / "sae", layer=1)
    saev_sae(tmp_path / "saev.pt", "topk")
    assert check_fits(open_sae(tmp_path / "sae"), tiny_model()) == 2
    for call, message in ((lambda: open_sae(tmp_path / "sae", layer=1), "not block 1's output"),
                          (lambda: check_fits(open_sae(tmp_path / "sae"), tiny_model(hidden=16)), "width"),
                          (lambda: check_fits(open_sae(tmp_path / "sae"), tiny_model(layers=1)), "1 blocks"),
                          (lambda: check_fits(open_sae(tmp_path / "sae"), tiny_model(image=12)), "another model"),
                          (lambda: check_fits(open_sae(tmp_path / "saev.pt"), tiny_model()), "give the layer")):
        with pytest.raises(SAEError, match=message) as error:
            call()
        assert "\n" not in str(error.value)
    assert check_fits(open_sae(tmp_path / "saev.pt", layer=1), tiny_model()) == 1


def test_an_sae_encoding_as_another_library_is_not_saved_as_sae_lens(tmp_path):
    prisma_sae(tmp_path / "sae")
    with pytest.raises(SAEError, match="cannot hold it"):
        save_sae(load_prisma(tmp_path / "sae"), tmp_path / "out")
    assert not (tmp_path / "out" / "cfg.json").exists()


@pytest.mark.slow  # the Hub client's first import takes seconds
def test_saes_open_by_hub_id_fetching_only_their_own_files(fake_hub, tmp_path):
    sae = SparseAutoencoder(D_IN, D_IN * EXPANSION, K, info=SAEInfo(hook_name="blocks.1.hook_resid_post"))
    randomise(sae)
    save_sae(sae, tmp_path / "lens")
    prisma_sae(tmp_path / "prisma")
    saev_sae(tmp_path / "saev.pt", "topk")
    files = {f"blocks.1.hook_resid_post/{p.name}": p.read_bytes() for p in (tmp_path / "lens").iterdir()}
    files.update({f"prisma/{p.name}": p.read_bytes() for p in (tmp_path / "prisma").iterdir()})
    files.update({"saev/sae.pt": (tmp_path / "saev.pt").read_bytes(), "sparsity.safetensors": b"\0" * 64,
                  "README.md": b"# SAEs"})
    fake_hub.add("acme/saes", files)
    x = activations()
    with torch.no_grad():
        lens = open_sae("acme/saes/blocks.1.hook_resid_post")
        torch.testing.assert_close(lens.encode(x), load_sae(tmp_path / "lens").encode(x), rtol=0, atol=0)
        assert sorted(fake_hub.fetched()) == ["blocks.1.hook_resid_post/cfg.json",
                                              "blocks.1.hook_resid_post/sae_weights.safetensors"]
        prisma = open_sae("acme/saes/prisma@main")
        torch.testing.assert_close(prisma.encode(x), load_prisma(tmp_path / "prisma").encode(x), rtol=0, atol=0)
        assert "prisma/n_images_100_log_feature_sparsity.pt" not in fake_hub.fetched()
        saev = open_sae("acme/saes/saev/sae.pt", layer=2)
        torch.testing.assert_close(saev.encode(x.reshape(-1, D_IN)),
                                   load_saev(tmp_path / "saev.pt").encode(x.reshape(-1, D_IN)), rtol=0, atol=0)
    with pytest.raises(SAEError, match="its SAEs are in blocks.1.hook_resid_post") as error:
        open_sae("acme/saes")
    assert "\n" not in str(error.value)


def test_a_normalising_sae_edits_the_stream_exactly_when_nothing_changes(tmp_path):
    from vit.features.explore import intervene

    prisma_sae(tmp_path / "sae", "topk", "layer_norm", layer=0)
    sae, model = open_sae(tmp_path / "sae"), tiny_model()
    images = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, _ = model(images)
    torch.testing.assert_close(intervene(model, sae, images, {0: 1.0}).logits, logits, rtol=0, atol=1e-5)
    latent = int(sae.encode(model.run_with_cache(images, ["blocks.0.hook_resid_post"])[1]["blocks.0.hook_resid_post"])
                 .flatten(0, 1).sum(0).argmax())
    assert not torch.allclose(intervene(model, sae, images, {latent: 0.0}).logits, logits, atol=1e-4)
