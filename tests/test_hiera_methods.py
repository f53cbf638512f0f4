"""The other methods on Hiera: what applies is checked against a reference, what does not is refused in one line.

- Zero-ablating a head (``mechanism.ablate_heads``, ``ablated_copy``) of a later stage, in its pooled-query first
  layer, equals HF's Hiera with that head's slice of the attention context zeroed (a hook on its ``proj``'s input).
- AttnLRP and CP-LRP through the mask units, the pooled queries and the max-pooled residual equal lxt's rules
  patched into timm's Hiera (fused attention on; lxt has no rule for a max, whose gradient goes to the winner in
  both, so x * grad of a max is the max: conservative); CP-LRP's relevance of the embedding sums to the logit.
- The logit lens and direct logit attribution on the last stage (average pooling, the pooler's norm and the head,
  linear but the norm): the lens's pooled logits equal HF's pooler and classifier on the outputs of HF's last-stage
  layers; DLA's terms sum to HF's logit, and each block's attention term equals HF's attention output read through
  HF's pooler norm frozen at the pooled last hidden state.
- Everything else that stacks the hidden states of one grid, or reads a CLS token, refuses a Hiera naming why.
"""

import pytest
import torch
from parity_helpers import randomize, run_hooked
from test_family_relevance_timm import assert_attnlrp_equals_lxt, assert_cp_lrp_conserves
from test_hiera_parity import TIMM_TINY, save_hf_hiera
from test_swin_methods import one_grid_calls

from vit.explain.mechanism import components as mechanism
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing transformers and timm takes seconds

SIZE = 32  # an 8x8 grid in 4x4 mask units; 4x4 in units of 2; 2x2 global


@pytest.fixture(scope="module")
def hf_hiera(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hiera")
    model = save_hf_hiera(folder, SIZE)
    return model, open_source(folder).model


def test_zero_ablating_a_pooled_layers_head_equals_hf_with_its_context_zeroed(hf_hiera):
    reference, ours = hf_hiera
    images = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    layer, head, hd = 3, 2, 8  # the last stage's first block (pooled queries): 4 heads of 8
    proj = reference.hiera.encoder.stages[2].layers[0].attn.proj  # reads the heads' contexts

    def zeroed(module, inputs):
        context = inputs[0].clone()  # (B, T, C), channels head-major
        context[..., head * hd:(head + 1) * hd] = 0
        return (context,)

    hook = proj.register_forward_pre_hook(zeroed)
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
        mechanism.ablate_heads(ours, images, [(1, 2)])  # stage 1 has two


def _last_stage_of_hf(reference, images):
    """HF Hiera's last-stage layers: each one's attention output (as added to the residual) and its output."""
    branches, outputs, hooks = [], [], []
    for layer in reference.hiera.encoder.stages[-1].layers:
        hooks += [layer.attn.register_forward_hook(lambda m, args, out: branches.append(out[0])),
                  layer.register_forward_hook(lambda m, args, out: outputs.append(out[0]))]
    logits = run_hooked(hooks, lambda: reference(pixel_values=images).logits)
    return branches, outputs, logits


def test_the_logit_lens_on_the_last_stage_equals_hfs_pooler_and_classifier_on_its_layers(hf_hiera):
    reference, ours = hf_hiera
    images = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(3))
    _, outputs, logits = _last_stage_of_hf(reference, images)
    with torch.no_grad():
        expected = torch.stack([reference.classifier(reference.hiera.pooler(out)) for out in outputs], dim=1)
        lens = mechanism.logit_lens(ours, images)
    assert lens.layers == (3, 4)  # the last stage's blocks; earlier stages' tokens are not read
    torch.testing.assert_close(lens.pooled_logits, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lens.pooled_logits[:, -1], logits, rtol=1e-5, atol=1e-5)


def test_dla_on_the_last_stage_sums_to_hfs_logit_and_its_attention_terms_are_hfs_branches(hf_hiera):
    reference, ours = hf_hiera
    images = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(4))
    branches, outputs, logits = _last_stage_of_hf(reference, images)
    classes = torch.tensor([1, 4])
    with torch.no_grad():
        dla = mechanism.direct_logit_attribution(ours, images, classes)
    expected_logit = logits.gather(1, classes[:, None])[:, 0]
    assert dla.first_layer == 3 and dla.heads.shape == (2, 2, 4)
    torch.testing.assert_close(dla.logit, expected_logit, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dla.total(), expected_logit, rtol=1e-4, atol=1e-4)
    norm, head = reference.hiera.pooler.layernorm, reference.classifier
    pooled = outputs[-1].mean(1)  # (B, D): the pooler's norm reads the average, its scale frozen there
    scale = (pooled.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    for i, branch in enumerate(branches):
        mean = branch.mean(1)  # (B, D), token order aside (HF's is unrolled)
        read = ((mean - mean.mean(-1, keepdim=True)) / scale * norm.weight) @ head.weight.T  # (B, C)
        expected = read.gather(1, classes[:, None])[:, 0]
        torch.testing.assert_close(dla.heads[:, i].sum(-1) + dla.attn_biases[:, i], expected, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def timm_hiera(tmp_path_factory):
    torch.manual_seed(0)
    model = randomize(timm.create_model("hiera_tiny_224", pretrained=False, img_size=SIZE, **TIMM_TINY))
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = True  # lxt's patch replaces scaled_dot_product_attention
    folder = tmp_path_factory.mktemp("timm-hiera") / "model"
    args = {k: v for k, v in TIMM_TINY.items() if k != "num_classes"}
    timm.models.save_for_hf(model, folder, model_args=dict(img_size=SIZE, **args), safe_serialization=True)
    return model, open_source(folder).model


@pytest.mark.parametrize("cp", [False, True], ids=["attnlrp", "cp-lrp"])
def test_attnlrp_through_pooled_queries_equals_lxts_rules_on_timms_hiera(timm_hiera, monkeypatch, cp):
    reference, ours = timm_hiera
    images = torch.randn(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    assert_attnlrp_equals_lxt(reference, ours, images, cp, monkeypatch)


def test_cp_lrp_relevance_of_hiera_sums_to_the_logit_through_the_max_pooling(hf_hiera):
    _, ours = hf_hiera
    model = randomize(type(ours)(ours.config))  # a copy with the same stages, its biases zeroed below
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    images = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(2))
    assert_cp_lrp_conserves(model, images)


REFUSED = one_grid_calls((1, 5, 64, 8))


@pytest.mark.parametrize("call", list(REFUSED))
def test_what_needs_one_grid_refuses_a_hiera_in_one_line(hf_hiera, call):
    _, ours = hf_hiera
    with pytest.raises(ValueError, match="stages") as error, torch.no_grad():
        REFUSED[call](ours, torch.randn(1, 3, SIZE, SIZE))
    assert "\n" not in str(error.value)
