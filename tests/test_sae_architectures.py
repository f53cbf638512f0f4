"""SAELens 6's JumpReLU, gated, standard, BatchTopK and Matryoshka-BatchTopK SAEs: our reading of each folder encodes
and decodes as SAELens's own class does (its code vendored verbatim in
tests/reference/sae_lens/architectures_reference.py), and what ``save_sae`` writes is the folder SAELens's class loads
(its state dict's names and nothing else)."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.reference.sae_lens.architectures_reference import (
    ReferenceBatchTopKTrainingSAE,
    ReferenceGatedSAE,
    ReferenceJumpReLUSAE,
    ReferenceStandardSAE,
)
from vit.features.autoencoder import SAEError, load_sae, save_sae

D_IN, D_SAE = 12, 40
REFERENCES = {"standard": ReferenceStandardSAE, "jumprelu": ReferenceJumpReLUSAE, "gated": ReferenceGatedSAE}


def randomize(reference: torch.nn.Module) -> torch.nn.Module:
    """Every weight random (biases and thresholds too, so that each of them matters)."""
    with torch.no_grad():
        for name, tensor in reference.state_dict().items():
            if name == "topk_threshold":
                continue
            tensor.copy_(torch.randn_like(tensor) * (0.3 if name in ("r_mag", "threshold") else 1.0))
        if hasattr(reference, "threshold"):
            reference.threshold.abs_()  # SAELens's thresholds are positive
    return reference


def write_sae_lens_folder(folder, reference, architecture, **cfg):
    """The folder SAELens's ``SAE.save_model`` writes: the state dict as it is, and the config's keys."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({name: t.contiguous() for name, t in reference.state_dict().items()},
              str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({
        "d_in": D_IN, "d_sae": D_SAE, "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True,
        "normalize_activations": "none", "reshape_activations": "none", "architecture": architecture,
        "metadata": {"model_name": "m", "hook_name": "blocks.1.hook_resid_post"}, **cfg}))
    return folder


@pytest.mark.parametrize("architecture", ["standard", "jumprelu", "gated"])
def test_each_architecture_encodes_and_decodes_as_sae_lens(tmp_path, architecture):
    torch.manual_seed(0)
    reference = randomize(REFERENCES[architecture](D_IN, D_SAE))
    ours = load_sae(write_sae_lens_folder(tmp_path / "sae", reference, architecture))
    assert ours.architecture == architecture
    x = torch.randn(3, 7, D_IN) * 2
    with torch.no_grad():
        z, z_ref = ours.encode(x), reference.encode(x)
        torch.testing.assert_close(z, z_ref, rtol=0, atol=1e-6)
        assert (z > 0).any() and (z == 0).any()
        torch.testing.assert_close(ours.decode(z), reference.decode(z_ref), rtol=0, atol=1e-6)


def test_jumprelu_zeroes_what_is_at_or_below_its_threshold_and_keeps_the_rest(tmp_path):
    reference = randomize(ReferenceJumpReLUSAE(D_IN, D_SAE))
    ours = load_sae(write_sae_lens_folder(tmp_path / "sae", reference, "jumprelu"))
    x = torch.randn(50, D_IN)
    pre = ours.pre_activations(x)
    z = ours.encode(x)
    # a plain ReLU would keep the positives below the threshold: the threshold must have removed some
    assert ((pre > 0) & (pre <= ours.threshold)).any()
    torch.testing.assert_close(z, torch.where(pre > ours.threshold, pre, 0.0), rtol=0, atol=0)


@pytest.mark.parametrize("architecture", ["batchtopk", "matryoshka_batchtopk"])
@pytest.mark.parametrize("rescale", [True, False])
def test_a_batch_topk_training_folder_reads_as_the_jumprelu_sae_lens_saves_for_inference(tmp_path, architecture,
                                                                                         rescale):
    torch.manual_seed(1)
    trained = randomize(ReferenceBatchTopKTrainingSAE(D_IN, D_SAE, k=4.5, rescale_acts_by_decoder_norm=rescale))
    with torch.no_grad():
        trained.W_dec.mul_(torch.rand(D_SAE, 1) + 0.5)  # rows of several norms: the fold must matter
        trained.topk_threshold.fill_(0.7)
    extra = {"matryoshka_widths": [8, D_SAE]} if architecture == "matryoshka_batchtopk" else {}
    folder = write_sae_lens_folder(tmp_path / "sae", trained, architecture, k=4.5,
                                   rescale_acts_by_decoder_norm=rescale, topk_threshold_lr=0.01, **extra)
    # SAELens's own path to the inference SAE: save_inference_model's state dict, loaded into JumpReLUSAE
    state = dict(trained.state_dict())
    trained.process_state_dict_for_saving_inference(state)
    reference = ReferenceJumpReLUSAE(D_IN, D_SAE)
    reference.load_state_dict(state)
    ours = load_sae(folder)
    assert ours.architecture == "jumprelu" and ours.info.extra["training_architecture"] == architecture
    x = torch.randn(5, 9, D_IN) * 2
    with torch.no_grad():
        z, z_ref = ours.encode(x), reference.encode(x)
        torch.testing.assert_close(z, z_ref, rtol=0, atol=1e-6)
        assert (z > 0).any()
        torch.testing.assert_close(ours.decode(z), reference.decode(z_ref), rtol=0, atol=1e-6)


@pytest.mark.parametrize("architecture", ["jumprelu", "gated"])
def test_a_saved_folder_is_the_one_sae_lens_loads(tmp_path, architecture):
    reference = randomize(REFERENCES[architecture](D_IN, D_SAE))
    ours = load_sae(write_sae_lens_folder(tmp_path / "theirs", reference, architecture))
    save_sae(ours, tmp_path / "ours")
    cfg = json.loads((tmp_path / "ours" / "cfg.json").read_text())
    assert cfg["architecture"] == architecture and "k" not in cfg
    weights = load_file(str(tmp_path / "ours" / "sae_weights.safetensors"))
    # SAELens loads with load_state_dict(assign=True), strict: the same names, nothing more
    fresh = REFERENCES[architecture](D_IN, D_SAE)
    fresh.load_state_dict(weights, strict=True)
    x = torch.randn(6, D_IN)
    with torch.no_grad():
        torch.testing.assert_close(fresh.decode(fresh.encode(x)), reference.decode(reference.encode(x)), rtol=0,
                                   atol=0)
        torch.testing.assert_close(load_sae(tmp_path / "ours")(x), ours(x), rtol=0, atol=0)


def test_a_gated_folder_without_its_gate_bias_is_refused_in_one_line(tmp_path):
    reference = randomize(ReferenceGatedSAE(D_IN, D_SAE))
    folder = write_sae_lens_folder(tmp_path / "sae", reference, "gated")
    weights = load_file(str(folder / "sae_weights.safetensors"))
    del weights["b_gate"]
    save_file(weights, str(folder / "sae_weights.safetensors"))
    with pytest.raises(SAEError, match="not the shapes"):
        load_sae(folder)
