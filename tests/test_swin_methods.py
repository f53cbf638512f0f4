"""The other methods on Swin: what applies is checked against a reference, what does not is refused in one line.

- Zero-ablating a head (``mechanism.ablate_heads``, ``ablated_copy``) equals HF's Swin with that head's slice of
  the attention context zeroed (a hook on its ``o_proj``'s input), in a later stage with its own heads.
- AttnLRP and CP-LRP through the patch merging and the shifted windows equal lxt's rules patched into timm's Swin
  (fused attention on, so its relative position bias and shift mask reach ``scaled_dot_product_attention`` as
  lxt's mask, a constant of the input). lxt has no rule for Swin V2's cosine attention: there CP-LRP's defining
  property is checked, the relevance of the embedding summing to the logit with no bias parameters.
- Everything that stacks the hidden states of one grid, or reads a CLS token, refuses a Swin naming why.
"""

import pytest
import torch
from parity_helpers import randomize
from test_family_relevance_timm import lxt_relevance

from vit.explain import attention, mechanism, relevance
from vit.model import use_rules
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing transformers and timm takes seconds

SIZE = 32  # an 8x8 grid in windows of 4, shifted; then 4x4, one window
TINY = dict(embed_dim=24, depths=(2, 2), num_heads=(2, 4), window_size=4)


@pytest.fixture(scope="module")
def hf_swin(tmp_path_factory):
    config = transformers.SwinConfig(image_size=SIZE, patch_size=4, num_labels=3, **TINY)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(transformers.SwinForImageClassification(config))
    folder = tmp_path_factory.mktemp("swin")
    model.save_pretrained(folder)
    return model, open_source(folder).model


def test_zero_ablating_a_later_stages_head_equals_hf_with_its_context_zeroed(hf_swin):
    reference, ours = hf_swin
    images = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    layer, head, hd = 3, 2, 12  # stage 1's second block: 4 heads of 12
    o_proj = reference.swin.encoder.layers[1].blocks[1].attention.o_proj  # reads the heads' contexts

    def zeroed(module, inputs):
        context = inputs[0].clone()  # (B * nw, n, C)
        context[..., head * hd:(head + 1) * hd] = 0
        return (context,)

    hook = o_proj.register_forward_pre_hook(zeroed)
    try:
        with torch.no_grad():
            expected = reference(pixel_values=images).logits
    finally:
        hook.remove()
    with torch.no_grad():
        logits, _ = mechanism.ablate_heads(ours, images, [(layer, head)])
        copied = mechanism.ablated_copy(ours, [(layer, head)])(images)[0]
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(copied, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(mechanism.MechanismError, match="heads 0 to 1"):
        mechanism.ablate_heads(ours, images, [(1, 2)])  # stage 0 has two


@pytest.fixture(scope="module")
def timm_swin(tmp_path_factory):
    torch.manual_seed(0)
    model = randomize(timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=SIZE,
                                        num_classes=3, **TINY))
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = True  # lxt's patch replaces scaled_dot_product_attention
    folder = tmp_path_factory.mktemp("timm-swin") / "model"
    timm.models.save_for_hf(model, folder, model_args=dict(img_size=SIZE, window_size=4), safe_serialization=True)
    return model, open_source(folder).model


@pytest.mark.parametrize("cp", [False, True], ids=["attnlrp", "cp-lrp"])
def test_attnlrp_through_merges_and_shifted_windows_equals_lxts_rules_on_timms_swin(timm_swin, monkeypatch, cp):
    reference, ours = timm_swin
    images = torch.randn(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(images)[0], reference(images), rtol=1e-5, atol=1e-5)
    for index in (0, 2):
        expected = lxt_relevance(reference, images, index, cp, monkeypatch)
        scale = expected.abs().max()
        torch.testing.assert_close(relevance.attnlrp(ours, images, index, cp=cp) / scale, expected / scale,
                                   rtol=1e-5, atol=1e-5)


def test_cp_lrp_relevance_of_swin_v2_sums_to_the_logit_through_its_cosine_attention(tmp_path):
    config = transformers.Swinv2Config(image_size=SIZE, patch_size=4, num_labels=3, **TINY)
    torch.manual_seed(0)
    transformers.Swinv2ForImageClassification(config).save_pretrained(tmp_path)
    model = randomize(open_source(tmp_path).model)
    with torch.no_grad():  # no bias parameter but the position MLP's, a constant of the input under CP-LRP
        for name, p in model.named_parameters():
            if name.endswith("bias") and "cpb" not in name and "rel_pos" not in name:
                p.zero_()
    images = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(2))
    with torch.enable_grad(), use_rules(relevance.AttnLRPRules(cp=True)):
        encoding, cache = model.run_with_cache(images.requires_grad_(True), ["hook_embed"])
        logit = encoding.logits[:, 1]
        [grad] = torch.autograd.grad(logit.sum(), cache["hook_embed"])
    total = (cache["hook_embed"] * grad).sum(dim=(1, 2))  # (B,)
    torch.testing.assert_close(total, logit.detach(), rtol=1e-3, atol=1e-3)


REFUSED = {
    "hidden_states": lambda m, x: mechanism.hidden_states(m, x),
    "logit_lens": lambda m, x: mechanism.logit_lens(m, x),
    "direct_logit_attribution": lambda m, x: mechanism.direct_logit_attribution(m, x),
    "mean_contexts": lambda m, x: mechanism.mean_contexts(m, x),
    "mean ablation": lambda m, x: mechanism.ablate_heads(m, x, [(0, 0)], "mean", torch.zeros(4, 64, 2, 12)),
    "ablation_grid": lambda m, x: mechanism.ablation_grid(m, x, 0),
    "patch_heads": lambda m, x: mechanism.patch_heads(m, x, x.flip(-1)),
    "patch_residuals": lambda m, x: mechanism.patch_residuals(m, x, x.flip(-1), 0, 1),
    "sink_stats": lambda m, x: mechanism.sink_stats(m, torch.zeros(1, 5, 64, 24), (8, 8)),
    "find_register_neurons": lambda m, x: mechanism.find_register_neurons(m, x, 1.0),
    "with_test_time_registers": lambda m, x: mechanism.with_test_time_registers(m, x, {0: [0]}),
    "legrad": lambda m, x: relevance.legrad(m, x, 0),
    "transformer_attribution": lambda m, x: relevance.transformer_attribution(m, x, 0),
    "rollout": lambda m, x: attention.rollout(list(m(x, output_attentions=True)[1]), num_prefix_tokens=0),
}


@pytest.mark.parametrize("call", list(REFUSED))
def test_what_needs_one_grid_refuses_a_swin_in_one_line(hf_swin, call):
    _, ours = hf_swin
    with pytest.raises(ValueError, match="stages \\(Swin, Hiera\\)") as error, torch.no_grad():
        REFUSED[call](ours, torch.randn(1, 3, SIZE, SIZE))
    assert "\n" not in str(error.value)
