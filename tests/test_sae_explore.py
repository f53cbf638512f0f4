"""The explorer's Features view: the latents on the patch grid, the features at a token, and the intervention
that scales a latent at the SAE's layer and runs the rest of the model's forward on the edited stream."""

import pytest
import torch

from vit.features.explore import image_features, intervene
from vit.features.sae import SAEError, SAEInfo, SparseAutoencoder, model_fingerprint
from vit.model import ViT, ViTConfig


def model_and_sae(seed=0):
    torch.manual_seed(seed)
    model = ViT(ViTConfig(image_size=8, patch_size=4, num_classes=3, hidden_size=16, num_layers=3, num_heads=2,
                          mlp_size=32, num_register_tokens=1)).eval()
    sae = SparseAutoencoder(16, 48, 6, info=SAEInfo(hook_name="blocks.1.hook_resid_post",
                                                    model_fingerprint=model_fingerprint(model)))
    with torch.no_grad():
        sae.b_enc.normal_(0, 0.1)
        sae.b_dec.normal_(0, 0.1)
    return model, sae.eval()


def test_latents_are_the_sae_encoding_of_the_layer_output_on_a_non_square_grid():
    model, sae = model_and_sae()
    image = torch.randn(1, 3, 8, 12)  # a 2 x 3 grid after CLS and one register
    with torch.no_grad():
        x = model.embed(image)
        for block in model.blocks[:2]:
            x = block(x, rope=None)[0]
        expected = sae.encode(x[0])  # (2 + 6, 48)
    features = image_features(model, sae, image)
    torch.testing.assert_close(features.latents, expected)
    latent, value = features.strongest(1)[0]
    assert value == pytest.approx(float(expected[2:, latent].max()))
    torch.testing.assert_close(features.patch_map(latent), expected[2:, latent].reshape(2, 3))
    at = features.active_at(5)
    assert [i for i, _ in at] == expected[5].topk(len(at)).indices.tolist() and len(at) <= 6


def test_no_change_gives_back_the_model_exactly():
    model, sae = model_and_sae()
    images = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        logits, attentions = model(images, output_attentions=True)
    edited = intervene(model, sae, images, {})
    torch.testing.assert_close(edited.logits, logits, rtol=0, atol=1e-5)
    scaled_by_one = intervene(model, sae, images, {3: 1.0, 7: 1.0})
    torch.testing.assert_close(scaled_by_one.logits, logits, rtol=0, atol=1e-5)
    for a, b in zip(scaled_by_one.attentions, attentions, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_zeroing_a_feature_removes_its_decoder_direction_from_the_stream():
    model, sae = model_and_sae()
    images = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        x = model.embed(images)
        for block in model.blocks[:2]:
            x = block(x, rope=None)[0]
        z = sae.encode(x)
        latent = int(z.sum(dim=(0, 1)).argmax())
        edited_stream = x - z[..., latent:latent + 1] * sae.W_dec[latent]  # by hand: the latent's share taken out
        after, attentions = model.run_blocks(edited_stream, (2, 2), 2, output_attentions=True)
        expected = model.classify(after)
        _, clean_attentions = model(images, output_attentions=True)
    edited = intervene(model, sae, images, {latent: 0.0})
    torch.testing.assert_close(edited.logits, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(edited.attentions[2], attentions[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(edited.attentions[1], clean_attentions[1])  # layers up to the SAE's are untouched
    assert not torch.allclose(edited.logits, model(images)[0])


def test_an_sae_of_another_model_or_a_bad_feature_is_refused():
    model, sae = model_and_sae()
    other, _ = model_and_sae(seed=1)
    with pytest.raises(SAEError, match="another model"):
        intervene(other, sae, torch.randn(1, 3, 8, 8), {0: 0.0})
    with pytest.raises(ValueError, match="out of range"):
        intervene(model, sae, torch.randn(1, 3, 8, 8), {48: 0.0})
