"""Relevance methods on every family: AttnLRP, CP-LRP and LeGrad run on each (the rules sit on the model's own
elementary operations, so a family's options need no map of their own); Chefer et al.'s LRP refuses in one line
where its paper has no rule. CP-LRP's defining property: with no bias to absorb any, the relevance of the first
block's input sums to the explained logit. Parity with lxt's own rules patched into timm's models of each family
is in test_family_relevance_timm.py."""

import pytest
import torch

from vit.explain.methods import relevance
from vit.explain.methods.attention import class_gradients
from vit.model import ViT, ViTConfig, use_rules

BASE = dict(image_size=16, patch_size=4, num_classes=3, hidden_size=16, num_layers=2, num_heads=2, mlp_size=24)
FAMILIES = {
    "dinov3": dict(num_register_tokens=4, layer_scale=0.5, pos_embed=False, rope="dinov3", key_bias=False,
                   layer_norm_eps=1e-5),
    "dinov3-swiglu": dict(pos_embed=False, rope="dinov3", gated_mlp=True, activation="silu"),
    "eva02": dict(rope="eva", rope_theta=10000.0, rope_ref_grid=4, gated_mlp=True, mlp_norm=True, activation="silu",
                  key_bias=False, pooling="avg", fc_norm=True),
    "clip": dict(pre_norm=True, activation="quick_gelu", layer_norm_eps=1e-5),
    "siglip": dict(class_token=False, pooling="map", activation="gelu_tanh"),
    "mae": dict(pooling="avg", fc_norm=True),
    "deit-distilled": dict(distillation_token=True, distillation_head=True),
    "dinov2-registers": dict(layer_scale=0.5, num_register_tokens=4, pooling="cls+avg"),
    "aimv2": dict(class_token=False, pooling="avg", norm="rms", embed_norm=True, qkv_bias=False, proj_bias=False,
                  gated_mlp=True, activation="silu", layer_norm_eps=1e-5),
    "aimv2-hf-head": dict(class_token=False, pooling="map", pool_head="aimv2", pool_heads=4, norm="rms",
                          embed_norm=True, qkv_bias=False, proj_bias=False, gated_mlp=True, activation="silu"),
    "pe-core": dict(rope="pe", rope_theta=10000.0, rope_ref_grid=4, pre_norm=True, pooling="map", pool_heads=4,
                    pool_mlp_size=32, layer_norm_eps=1e-5),
    "pe-spatial": dict(rope="pe", rope_theta=10000.0, rope_ref_grid=4, pre_norm=True, pooling="avg", final_norm=False,
                       layer_scale=0.5),
}
METHODS = {"legrad": relevance.legrad, "transformer_attribution": relevance.transformer_attribution,
           "attnlrp": relevance.attnlrp}
# Chefer et al.'s LRP: CLS through one norm and one head, plain GELU MLPs, learned positions.
CHEFER_REFUSAL = {"dinov3": "layer_scale", "dinov3-swiglu": "rope", "eva02": "pooling", "siglip": "pooling",
                  "mae": "pooling", "deit-distilled": "distillation_head", "dinov2-registers": "layer_scale",
                  "aimv2": "pooling", "aimv2-hf-head": "pooling", "pe-core": "pooling", "pe-spatial": "layer_scale"}


def family_model(name: str, biases: bool = True) -> ViT:
    torch.manual_seed(0)
    model = ViT(ViTConfig(**{**BASE, **FAMILIES[name]})).eval()
    with torch.no_grad():  # random norms and biases, or none at all: zero biases absorb no relevance
        for key, p in model.named_parameters():
            if key.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1 if biases else torch.zeros_like(p))
            elif "norm" in key or key.split(".")[-1] in ("ls1", "ls2"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("method", list(METHODS))
def test_relevance_methods_run_on_every_family_or_refuse_in_one_line(family, method):
    model, images = family_model(family), torch.randn(2, 3, 16, 20)
    if method == "transformer_attribution" and family in CHEFER_REFUSAL:
        with pytest.raises(relevance.UnsupportedModelError, match=CHEFER_REFUSAL[family]) as error:
            METHODS[method](model, images, 0)
        assert "\n" not in str(error.value) and "AttnLRP" in str(error.value)
        return
    maps = METHODS[method](model, images, torch.tensor([0, 2]))
    assert torch.isfinite(maps).all() and maps.abs().sum() > 0
    torch.testing.assert_close(maps[1:], METHODS[method](model, images[1:], 2), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_cp_lrp_relevance_of_the_embedding_sums_to_the_logit_on_every_family(family):
    model, images = family_model(family, biases=False), torch.randn(2, 3, 16, 20)
    with torch.enable_grad(), use_rules(relevance.AttnLRPRules(cp=True)):
        encoding, cache = model.run_with_cache(images.requires_grad_(True), ["hook_embed"])
        logit = encoding.logits[:, 1]
        [grad] = torch.autograd.grad(logit.sum(), cache["hook_embed"])
    total = (cache["hook_embed"] * grad).sum(dim=(1, 2))  # (B,)
    torch.testing.assert_close(total, logit.detach(), rtol=1e-3, atol=1e-5 * float(logit.detach().abs().max()))


@pytest.mark.parametrize("cp", [False, True], ids=["attnlrp", "cp-lrp"])
@pytest.mark.parametrize("family", ["dinov3-swiglu", "eva02", "aimv2"])
def test_gated_mlp_passes_on_all_its_relevance_under_both_rules(family, cp):
    """With no biases the MLP is linear under either rule (identity rule on the activation, the gate split evenly
    or, CP-LRP, held constant), so the relevance of its input sums to that of its output."""
    mlp = family_model(family, biases=False).blocks[0].mlp
    x = torch.randn(2, 5, BASE["hidden_size"], requires_grad=True)
    with torch.enable_grad(), use_rules(relevance.AttnLRPRules(cp)):
        y = mlp(x)
        out_relevance = torch.randn_like(y)
        [grad] = torch.autograd.grad(y, x, out_relevance)
    torch.testing.assert_close((x * grad).sum(), (y * out_relevance).sum(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gradient_rollout_runs_on_every_family_with_the_models_own_logits(family):
    model, images = family_model(family), torch.randn(2, 3, 16, 20)
    logits, attentions, gradients = class_gradients(model, images, 1)
    with torch.no_grad():
        expected, expected_attentions = model(images, output_attentions=True)  # the explicit path it walks
    assert torch.equal(logits, expected) and torch.equal(attentions[-1], expected_attentions[-1])
    assert len(attentions) == len(gradients) == 2 and gradients[0].shape == attentions[0].shape


def test_chefer_lrp_names_rmsnorm_as_the_operation_it_has_no_rule_for():
    model = ViT(ViTConfig(**{**BASE, "norm": "rms"})).eval()
    with pytest.raises(relevance.UnsupportedModelError, match="no rule for norm='rms'") as error:
        relevance.transformer_attribution(model, torch.randn(1, 3, 16, 16), 0)
    assert "\n" not in str(error.value)


def test_attnlrp_holds_an_rmsnorms_scale_as_lxts_rms_norm_forward_does():
    """lxt's own ``rms_norm_forward`` (identity rule: the gradient stops at the root mean square) on transformers'
    ``Aimv2RMSNorm`` and our RMSNorm under AttnLRP's rules give the same output and the same gradient."""
    transformers = pytest.importorskip("transformers")
    from tests.reference.lxt.patches import rms_norm_forward

    torch.manual_seed(0)
    theirs = transformers.models.aimv2.modeling_aimv2.Aimv2RMSNorm(16, eps=1e-5)
    ours = family_model("aimv2").norm
    with torch.no_grad():
        theirs.weight.copy_(ours.weight)
    x = torch.randn(2, 5, 16, requires_grad=True)
    out = torch.randn(2, 5, 16)
    expected = rms_norm_forward(theirs, x)
    [expected_grad] = torch.autograd.grad(expected, x, out)
    with use_rules(relevance.AttnLRPRules()):
        y = ours(x)
        [grad] = torch.autograd.grad(y, x, out)
    torch.testing.assert_close(y, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-6, atol=1e-6)


def test_cp_lrp_holds_sams_relative_positions_constant_so_relevance_sums_to_the_logit():
    """SAM's decomposed relative positions are computed from the queries: CP-LRP, which stops the gradient at
    q and k (lxt), must stop it there too, or relevance leaks through the softmax and is not conserved."""
    torch.manual_seed(0)
    model = ViT(ViTConfig(image_size=24, patch_size=4, hidden_size=16, num_layers=2, num_heads=2, mlp_size=24,
                          num_classes=3, class_token=False, pooling="avg", final_norm=False, rel_pos="sam",
                          window_size=4, global_layers=(1,))).eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            p.copy_(torch.zeros_like(p) if key.endswith("bias") else p + torch.randn_like(p) * 0.3)
    images = torch.randn(2, 3, 24, 20)  # a 6 x 5 grid in windows of 4: padded to 8 x 8
    with torch.enable_grad(), use_rules(relevance.AttnLRPRules(cp=True)):
        encoding, cache = model.run_with_cache(images.requires_grad_(True), ["hook_embed"])
        logit = encoding.logits[:, 1]
        [grad] = torch.autograd.grad(logit.sum(), cache["hook_embed"])
    total = (cache["hook_embed"] * grad).sum(dim=(1, 2))  # (B,)
    torch.testing.assert_close(total, logit.detach(), rtol=1e-3, atol=1e-5 * float(logit.detach().abs().max()))
