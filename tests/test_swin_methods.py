"""The other methods on Swin: what applies is checked against a reference, what does not is refused in one line.

- Zero-ablating a head (``mechanism.ablate_heads``, ``ablated_copy``) equals HF's Swin with that head's slice of
  the attention context zeroed (a hook on its ``o_proj``'s input), in a later stage with its own heads.
- AttnLRP and CP-LRP through the patch merging and the shifted windows equal lxt's rules patched into timm's Swin
  (fused attention on, so its relative position bias and shift mask reach ``scaled_dot_product_attention`` as
  lxt's mask, a constant of the input). lxt has no rule for Swin V2's cosine attention: there CP-LRP's defining
  property is checked, the relevance of the embedding summing to the logit with no bias parameters.
- The logit lens and direct logit attribution on the last stage (final norm, average pooling and head, linear but
  the norm): the lens equals HF's layernorm, pooler and classifier on the outputs of HF's last-stage blocks; DLA's
  terms sum to HF's logit, and each block's attention term equals HF's attention branch (the stream before its
  ``layernorm_after`` less the block's input) read through HF's final norm frozen at its last hidden state.
- Everything else that stacks the hidden states of one grid, or reads a CLS token, refuses a Swin naming why (LeGrad,
  which reads the pooling at each last-stage layer, is checked against HF in ``test_stage_legrad``).
"""

import pytest
import torch
from parity_helpers import randomize, run_hooked
from test_family_relevance_timm import assert_attnlrp_equals_lxt, assert_cp_lrp_conserves

from vit.explain.mechanism import components as mechanism
from vit.explain.mechanism import phenomena
from vit.explain.methods import attention, relevance
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing transformers and timm takes seconds

SIZE = 32  # an 8x8 grid in windows of 4, shifted; then 4x4, one window
TINY = dict(embed_dim=24, depths=(2, 2), num_heads=(2, 4), window_size=4)


def _saved_swin(tmp_path_factory, name, **overrides):
    """A random HF Swin classifier (``TINY`` with ``overrides``), saved natively: it and ours opened from it."""
    config = transformers.SwinConfig(image_size=SIZE, patch_size=4, num_labels=3, **{**TINY, **overrides})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(transformers.SwinForImageClassification(config))
    folder = tmp_path_factory.mktemp(name)
    model.save_pretrained(folder)
    return model, open_source(folder).model


@pytest.fixture(scope="module")
def hf_swin(tmp_path_factory):
    return _saved_swin(tmp_path_factory, "swin")


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
def hf_swin_shifted(tmp_path_factory):
    """Windows of 2, so the last stage's 4x4 grid is cut into four and every other block shifts them."""
    return _saved_swin(tmp_path_factory, "swin-shifted", window_size=2)


def _last_stage_of_hf(reference, images):
    """HF Swin's last-stage blocks: each one's input, its stream after the attention branch and its output."""
    inputs, mids, outputs, hooks = [], [], [], []
    for block in reference.swin.encoder.layers[-1].blocks:
        hooks += [block.register_forward_pre_hook(lambda m, args: inputs.append(args[0])),
                  block.layernorm_after.register_forward_pre_hook(lambda m, args: mids.append(args[0])),
                  block.register_forward_hook(lambda m, args, out: outputs.append(out[0]))]
    logits = run_hooked(hooks, lambda: reference(pixel_values=images).logits)
    return inputs, mids, outputs, logits


@pytest.mark.parametrize("pair", ["hf_swin", "hf_swin_shifted"], ids=["one-window", "shifted-windows"])
def test_the_logit_lens_on_the_last_stage_equals_hfs_norm_pooler_and_classifier_on_its_blocks(request, pair):
    reference, ours = request.getfixturevalue(pair)
    images = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(3))
    _, _, outputs, logits = _last_stage_of_hf(reference, images)
    with torch.no_grad():
        expected = torch.stack([reference.classifier(reference.swin.pooler(reference.swin.layernorm(out)
                                                                           .transpose(1, 2)).flatten(1))
                                for out in outputs], dim=1)  # (B, 2, classes)
        lens = mechanism.logit_lens(ours, images)
    assert lens.layers == (2, 3)  # stage 1's blocks; stage 0's tokens are not read
    torch.testing.assert_close(lens.pooled_logits, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lens.pooled_logits[:, -1], logits, rtol=1e-5, atol=1e-5)
    token = reference.classifier(reference.swin.layernorm(outputs[0])).softmax(-1)  # (B, T, classes)
    expected_probs = token.gather(-1, lens.classes[:, None, None].expand(-1, token.shape[1], 1))[..., 0]
    torch.testing.assert_close(lens.token_probs[:, 0], expected_probs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pair", ["hf_swin", "hf_swin_shifted"], ids=["one-window", "shifted-windows"])
def test_dla_on_the_last_stage_sums_to_hfs_logit_and_its_attention_terms_are_hfs_branches(request, pair):
    reference, ours = request.getfixturevalue(pair)
    images = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(4))
    inputs, mids, outputs, logits = _last_stage_of_hf(reference, images)
    classes = torch.tensor([0, 2])
    with torch.no_grad():
        dla = mechanism.direct_logit_attribution(ours, images, classes)
    expected_logit = logits.gather(1, classes[:, None])[:, 0]
    assert dla.first_layer == 2 and dla.heads.shape == (2, 2, 4)
    torch.testing.assert_close(dla.logit, expected_logit, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dla.total(), expected_logit, rtol=1e-4, atol=1e-4)
    norm, head = reference.swin.layernorm, reference.classifier
    scale = (outputs[-1].var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()  # (B, T, 1), frozen
    for i, (before, mid) in enumerate(zip(inputs, mids, strict=True)):
        branch = mid - before  # (B, T, D): what the attention added
        read = ((branch - branch.mean(-1, keepdim=True)) / scale * norm.weight).mean(1) @ head.weight.T  # (B, C)
        expected = read.gather(1, classes[:, None])[:, 0]
        torch.testing.assert_close(dla.heads[:, i].sum(-1) + dla.attn_biases[:, i], expected, rtol=1e-5, atol=1e-5)


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
    assert_attnlrp_equals_lxt(reference, ours, images, cp, monkeypatch)


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
    assert_cp_lrp_conserves(model, images)


def one_grid_calls(sink_shape: tuple[int, ...]) -> dict:
    """What needs one grid of one width, called on a model with stages (shared with the Hiera tests): the shape of
    the sink statistics' tokens is the model's own. Ablation and patching work per layer's grid
    (``test_stage_mechanism``)."""
    return {
        "hidden_states": lambda m, x: mechanism.hidden_states(m, x),
        "sink_stats": lambda m, x: phenomena.sink_stats(m, torch.zeros(sink_shape), (8, 8)),
        "find_register_neurons": lambda m, x: phenomena.find_register_neurons(m, x, 1.0),
        "with_test_time_registers": lambda m, x: phenomena.with_test_time_registers(m, x, {0: [0]}),
        "transformer_attribution": lambda m, x: relevance.transformer_attribution(m, x, 0),
        "rollout": lambda m, x: attention.rollout(list(m(x, output_attentions=True)[1]), num_prefix_tokens=0),
    }


REFUSED = one_grid_calls((1, 5, 64, 24))


@pytest.mark.parametrize("call", list(REFUSED))
def test_what_needs_one_grid_refuses_a_swin_in_one_line(hf_swin, call):
    _, ours = hf_swin
    with pytest.raises(ValueError, match="stages \\(Swin, Hiera\\)") as error, torch.no_grad():
        REFUSED[call](ours, torch.randn(1, 3, SIZE, SIZE))
    assert "\n" not in str(error.value)
