"""Relevance methods on the 2025-26 families: each runs, or refuses with one line naming the option it cannot
reproduce, and what runs computes the model's own forward pass (bit-identical logits)."""

import pytest
import torch

from vit.explain import relevance
from vit.explain.attention import class_gradients
from vit.model import ViT, ViTConfig

BASE = dict(image_size=16, patch_size=4, num_classes=3, hidden_size=16, num_layers=2, num_heads=2, mlp_size=24)
FAMILIES = {
    "dinov3": dict(num_register_tokens=4, layer_scale=0.5, pos_embed=False, rope="dinov3", key_bias=False,
                   layer_norm_eps=1e-5),
    "dinov3-swiglu": dict(pos_embed=False, rope="dinov3", gated_mlp=True, activation="silu"),
    "clip": dict(pre_norm=True, activation="quick_gelu", layer_norm_eps=1e-5),
    "siglip": dict(class_token=False, pooling="map", activation="gelu_tanh"),
    "mae": dict(),
}
METHODS = {"legrad": relevance.legrad, "transformer_attribution": relevance.transformer_attribution,
           "attnlrp": relevance.attnlrp}


def family_model(name: str) -> ViT:
    torch.manual_seed(0)
    return ViT(ViTConfig(**{**BASE, **FAMILIES[name]})).eval()


# What runs where: CLIP's ln_pre and QuickGELU are covered by each method's own LayerNorm and element-wise rules
# (AttnLRP on a CLIP is checked against lxt in test_prompts); SigLIP's attention-pooling probe has an LRP rule in
# neither paper, so only LeGrad (whose authors read SigLIP through it) runs there.
RUNS = {("mae", m) for m in METHODS} | {("clip", m) for m in METHODS} | {("siglip", "legrad")}
REFUSAL = {"dinov3": "model option", "dinov3-swiglu": "model option", "siglip": "pooling"}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("method", list(METHODS))
def test_relevance_methods_run_or_refuse_in_one_line(family, method):
    model, images = family_model(family), torch.randn(1, 3, 16, 20)
    if (family, method) in RUNS:
        assert torch.isfinite(METHODS[method](model, images, 0)).all()
        return
    with pytest.raises(relevance.UnsupportedModelError, match=REFUSAL[family]) as error:
        METHODS[method](model, images, 0)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gradient_rollout_runs_on_every_family_with_the_models_own_logits(family):
    model, images = family_model(family), torch.randn(2, 3, 16, 20)
    logits, attentions, gradients = class_gradients(model, images, 1)
    with torch.no_grad():
        expected, expected_attentions = model(images, output_attentions=True)  # the explicit path it walks
    assert torch.equal(logits, expected) and torch.equal(attentions[-1], expected_attentions[-1])
    assert len(attentions) == len(gradients) == 2 and gradients[0].shape == attentions[0].shape


def test_the_walk_of_a_plain_encoder_is_its_forward_bit_for_bit():
    model, images = family_model("mae"), torch.randn(2, 3, 16, 20)
    with torch.no_grad():
        expected, attentions = model(images, output_attentions=True)
        walked = relevance.walk(model, images)
    assert torch.equal(walked.logits, expected)
    assert all(torch.equal(t.probs, a) for t, a in zip(walked.blocks, attentions, strict=True))
