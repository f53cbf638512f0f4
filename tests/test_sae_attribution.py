"""Feature attribution to a prediction: with the SAE spliced in at its hook point, each latent's share
``f_i · (∂y/∂x · W_dec[i])``, the decoder bias's and the error's sum to ``∂y/∂x · x`` at that layer, per token and per
image; the gradient here is computed by hand with autograd on the model's own hook point, not by the code tested."""

import pytest
import torch

from vit.api.arguments import input_size, pil_image
from vit.features.attribution import feature_attribution
from vit.features.autoencoder import SAEInfo, SparseAutoencoder, model_fingerprint
from vit.model import ViT, ViTConfig

HOOK = "blocks.1.hook_resid_post"


def model_and_sae(architecture="topk", rescale=False, seed=0):
    torch.manual_seed(seed)
    model = ViT(ViTConfig(image_size=8, patch_size=4, num_classes=5, hidden_size=16, num_layers=3, num_heads=2,
                          mlp_size=32, num_register_tokens=1)).eval()
    sae = SparseAutoencoder(16, 48, 6 if architecture == "topk" else None, architecture,
                            rescale_acts_by_decoder_norm=rescale,
                            info=SAEInfo(hook_name=HOOK, model_fingerprint=model_fingerprint(model)))
    with torch.no_grad():
        for name in sae.weight_names():
            if name not in ("W_enc", "W_dec"):
                getattr(sae, name).normal_(0, 0.1)
        sae.W_dec.mul_(torch.rand(48, 1) + 0.5)  # rows of several norms: a rescaling SAE must divide by them
    return model, sae.eval().requires_grad_(False)


def gradient_at_hook(model, image, target, hook=HOOK):
    """``(∂y/∂x, x)`` at the hook, by hand: the hook's tensor made a leaf, the target logit differentiated."""
    held = {}

    def leaf(x, point):
        held["x"] = x.detach().requires_grad_(True)
        return held["x"]

    logits = model.run_with_hooks(image, [(hook, leaf)]).logits
    (g,) = torch.autograd.grad(logits[0, target], held["x"])
    return g[0], held["x"].detach()[0], logits[0].detach()


@pytest.mark.parametrize("architecture, rescale", [("topk", False), ("topk", True), ("jumprelu", False),
                                                   ("gated", False), ("standard", False)])
def test_latents_bias_and_error_sum_to_the_gradient_times_the_stream(architecture, rescale):
    model, sae = model_and_sae(architecture, rescale)
    image = torch.randn(1, 3, 8, 12)  # a non-square 2 x 3 grid after CLS and one register
    result = feature_attribution(model, sae, image, target=3)
    g, x, logits = gradient_at_hook(model, image, 3)
    expected = (g * x).sum(-1)  # (T,)
    got = result.attributions.sum(-1) + result.bias + result.error
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    totals = result.totals()
    assert totals["latents"] + totals["bias"] + totals["error"] == pytest.approx(float(expected.sum()), abs=1e-5)
    # each latent's share by hand: f_i (g · W_dec[i]), over |W_dec[i]| when the SAE rescales by the norms
    f = sae.encode(x)
    rows = sae.W_dec / sae.W_dec.norm(dim=-1, keepdim=True) if rescale else sae.W_dec
    torch.testing.assert_close(result.attributions, f * (g @ rows.T), rtol=0, atol=1e-6)
    torch.testing.assert_close(result.bias, g @ sae.b_dec, rtol=0, atol=1e-6)
    assert (result.attributions != 0).any() and result.logit == pytest.approx(float(logits[3]), abs=1e-5)


def test_default_target_is_the_predicted_class_and_maps_lie_on_the_patch_grid():
    model, sae = model_and_sae()
    image = torch.randn(1, 3, 8, 12)
    result = feature_attribution(model, sae, image)
    assert result.target == int(model.encode(image).logits[0].argmax())
    top = result.top(3)
    assert top and all(share > 0 for _, share in top)
    assert [share for _, share in top] == sorted((share for _, share in top), reverse=True)
    latent = top[0][0]
    assert top[0][1] == pytest.approx(float(result.attributions[:, latent].sum()), abs=1e-6)
    torch.testing.assert_close(result.patch_map(latent), result.attributions[2:, latent].reshape(2, 3))
    assert result.patch_maps([latent]).shape == (1, 2, 3)


def test_a_model_without_a_classifier_is_refused_in_one_line():
    torch.manual_seed(0)
    model = ViT(ViTConfig(image_size=8, patch_size=4, num_classes=0, hidden_size=16, num_layers=3, num_heads=2,
                          mlp_size=32)).eval()
    sae = SparseAutoencoder(16, 48, 6, info=SAEInfo(hook_name=HOOK))
    with pytest.raises(ValueError, match="has none"):
        feature_attribution(model, sae, torch.randn(1, 3, 8, 8))


def test_vit_feature_attribution_opens_the_sae_folder_and_attributes_the_preprocessed_image(tmp_path):
    import vit
    from vit.core.inference import preprocess
    from vit.features.autoencoder import save_sae

    checkpoint = vit.load(vit.shipped())
    model = checkpoint.model
    D = model.config.hidden_size
    torch.manual_seed(0)
    sae = SparseAutoencoder(D, 64, None, "jumprelu", info=SAEInfo(hook_name="blocks.2.hook_resid_post",
                                                                  model_fingerprint=model_fingerprint(model)))
    with torch.no_grad():
        sae.threshold.uniform_(0, 0.05)
    save_sae(sae, tmp_path / "sae")
    image = vit.samples()[0]
    result = vit.feature_attribution(checkpoint, image, tmp_path / "sae", target=1)
    x = preprocess([pil_image(image)], checkpoint.preprocessing, input_size(None), model.config.patch_size)
    g, stream, _ = gradient_at_hook(model, x, 1, "blocks.2.hook_resid_post")
    assert result.target == 1 and result.attributions.shape == (len(stream), 64)
    torch.testing.assert_close(result.attributions.sum(-1) + result.bias + result.error, (g * stream).sum(-1),
                               rtol=0, atol=1e-5)


@pytest.mark.parametrize("normalize", ["layer_norm", "constant_norm_rescale"])
def test_the_sum_holds_for_an_sae_that_normalises_its_input(normalize):
    """ViT-Prisma's run-time normalisation is undone after the decoder: the decoder is still affine in the latents,
    its constant part (b_dec rescaled, plus the mean) the bias's term."""
    from vit.features.formats import ForeignSAE

    model, plain = model_and_sae("standard")
    sae = ForeignSAE(16, 48, None, True, plain.info, activation="threshold", normalize=normalize)
    sae.load_state_dict(plain.state_dict())
    sae.eval().requires_grad_(False)
    image = torch.randn(1, 3, 8, 8)
    result = feature_attribution(model, sae, image, target=0)
    g, x, _ = gradient_at_hook(model, image, 0)
    torch.testing.assert_close(result.attributions.sum(-1) + result.bias + result.error, (g * x).sum(-1), rtol=0,
                               atol=1e-5)
    assert (result.attributions != 0).any()
