"""AttnLRP and CP-LRP through BEiT's relative position bias, against lxt's rules patched into timm's BEiT (as
``test_family_relevance_timm.py`` patches the other families). lxt gives the additive bias on the logits no rule of
its own: it is a constant of the input (a table of learned parameters, HF's and lxt's attention mask alike), so the
attention-input rules (the uniform rule on q, k and v; CP-LRP's stopped q and k) hold around it unchanged, and the
relevance that reaches the logits' bias stays there. CP-LRP's defining property holds with it: with no bias
parameters elsewhere, the relevance of the embedding sums to the explained logit.

Reference: rachtibat/LRP-eXplains-Transformers @ f0434417, lxt/efficient/{rules,patches}.py (tests/reference/lxt).
"""

import pytest
import torch
from parity_helpers import randomize
from test_family_relevance_timm import assert_attnlrp_equals_lxt, assert_cp_lrp_conserves

from vit.sources.open import open_source

timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing timm takes seconds


@pytest.fixture(scope="module", params=[False, True], ids=["per-layer", "shared"])
def beit(request, tmp_path_factory):
    torch.manual_seed(0)  # timm's BEiT takes one input size (a non-square one does not open yet: its table's grid)
    model = timm.create_model("beit_base_patch16_224", pretrained=False, img_size=32, patch_size=8,
                              embed_dim=32, depth=2, num_heads=2, num_classes=3, use_rel_pos_bias=not request.param,
                              use_shared_rel_pos_bias=request.param, init_values=0.1)
    randomize(model)
    folder = tmp_path_factory.mktemp("beit") / "model"
    timm.models.save_for_hf(model, folder, model_args=dict(num_heads=2), safe_serialization=True)
    return model, open_source(folder).model


@pytest.mark.parametrize("cp", [False, True], ids=["attnlrp", "cp-lrp"])
def test_attnlrp_through_the_bias_equals_lxts_rules_on_timms_beit(beit, monkeypatch, cp):
    reference, ours = beit
    images = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    assert_attnlrp_equals_lxt(reference, ours, images, cp, monkeypatch)


def test_cp_lrp_relevance_sums_to_the_logit_through_the_bias(beit):
    _, ours = beit
    with torch.no_grad():  # no bias parameter but the position tables, which absorb no relevance under CP-LRP
        for name, p in ours.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    assert_cp_lrp_conserves(ours, images, atol_of_logit=1e-5)


def test_a_forward_in_inference_mode_leaves_a_cached_index_a_gradient_pass_can_save(beit):
    """The explorer's forward runs in inference mode, then AttnLRP or LeGrad takes gradients through the same model:
    the position index the first caches must not be an inference tensor, which autograd refuses to save."""
    _, ours = beit
    for module in ours.modules():
        if hasattr(module, "_index"):
            module._index = None
    images = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        ours(images)
    images.requires_grad_(True)
    ours(images)[0][0, 0].backward()
    assert images.grad is not None and images.grad.abs().sum() > 0
