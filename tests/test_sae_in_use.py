"""An SAE whose stored weights are finite but whose computation is not is refused when it is opened (issue 77,
item 7): a gated SAE's ``exp(r_mag)`` that overflows, a ``b_mag`` near float32's largest, a BatchTopK decoder whose
row norms overflow when they are folded in, a saev SAE whose latents overflow its decoder. Each is first shown
non-finite in its own library's computation (SAELens's classes vendored in tests/reference/sae_lens, saev's
``modeling``); a trained-looking SAE of each kind still opens."""

import pytest
import torch
from test_sae_architectures import D_IN, D_SAE, randomize, write_sae_lens_folder
from test_sae_formats import activations, saev_sae

from tests.reference.sae_lens.architectures_reference import (
    ReferenceBatchTopKTrainingSAE,
    ReferenceGatedSAE,
    ReferenceJumpReLUSAE,
)
from vit.features.autoencoder import SAEError, load_sae
from vit.features.formats import load_saev


def finite(reference, x) -> bool:
    with torch.no_grad():
        z = reference.encode(x)
        return bool(torch.isfinite(z).all() and torch.isfinite(reference.decode(z)).all())


def gated(change):
    torch.manual_seed(0)
    reference = randomize(ReferenceGatedSAE(D_IN, D_SAE))
    with torch.no_grad():
        reference.b_gate[3] = 10.0  # latent 3's gate is open for every input
        change(reference)
    return reference


GATED = r"latents \(W_enc \* exp\(r_mag\)\) or reconstruction"


@pytest.mark.parametrize(("change", "message"), [
    (lambda sae: sae.r_mag.__setitem__(3, 200.0), f"{GATED} are not finite"),
    (lambda sae: sae.b_mag.__setitem__(3, 3e38), f"{GATED} may reach 6.6e\\+38"),
], ids=["r_mag 200", "b_mag 3e38"])
def test_a_gated_sae_that_overflows_in_use_is_refused_when_opened(tmp_path, change, message):
    reference = gated(change)
    assert not finite(reference, torch.randn(3, 7, D_IN))  # SAELens's own GatedSAE gives inf or NaN
    folder = write_sae_lens_folder(tmp_path / "sae", reference, "gated")
    with pytest.raises(SAEError, match=f"^sae: for an activation of norm 10000 its {message}"):
        load_sae(folder)


def test_a_trained_looking_gated_sae_opens(tmp_path):
    reference = gated(lambda sae: None)
    assert load_sae(write_sae_lens_folder(tmp_path / "sae", reference, "gated")).architecture == "gated"


def test_a_batch_topk_decoder_whose_norms_overflow_when_folded_is_refused_when_opened(tmp_path):
    torch.manual_seed(1)
    trained = randomize(ReferenceBatchTopKTrainingSAE(D_IN, D_SAE, k=4.5, rescale_acts_by_decoder_norm=True))
    with torch.no_grad():
        trained.topk_threshold.fill_(0.7)
        trained.W_dec[5] = 1e30  # finite; its norm (1e30 * sqrt(12)) is not a float32
    folder = write_sae_lens_folder(tmp_path / "sae", trained, "batchtopk", k=4.5, rescale_acts_by_decoder_norm=True)
    state = dict(trained.state_dict())  # SAELens's own inference SAE from it: the norms folded into the encoder
    trained.process_state_dict_for_saving_inference(state)
    reference = ReferenceJumpReLUSAE(D_IN, D_SAE)
    reference.load_state_dict(state)
    assert not finite(reference, torch.randn(5, 9, D_IN) * 2)
    with pytest.raises(SAEError, match="^sae: .* its latents or reconstruction are not finite"):
        load_sae(folder)


def test_a_saev_sae_whose_latents_overflow_its_decoder_is_refused_when_opened(tmp_path):
    from tests.reference.saev import modeling

    reference = saev_sae(tmp_path / "sae.pt", "relu")
    with torch.no_grad():
        reference.b_enc[2] = 3e38  # a ReLU latent near float32's largest, for every input
    modeling.dump(str(tmp_path / "sae.pt"), reference)
    theirs = modeling.load(str(tmp_path / "sae.pt")).eval()
    with torch.no_grad():
        assert not torch.isfinite(theirs.decode(theirs.encode(activations().reshape(-1, D_IN)).f_x)).all()
    with pytest.raises(SAEError, match="^sae.pt: .*its latents or reconstruction may reach"):
        load_saev(tmp_path / "sae.pt", layer=2)
