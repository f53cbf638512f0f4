"""AttnLRP and CP-LRP on timm's own models of every family, against lxt's rules patched into timm (the way
lxt's ``efficient`` module patches a model: its LayerNorm, activation and attention-input rules, its gated-MLP
rules for SwiGLU, ``gated_mlp_forward`` and CP-LRP's ``cp_gated_mlp_forward``), on a non-square input: EVA-02
(RoPE, SwiGLU, the MLP's norm), DINOv3 (RoPE, registers, layer scale), SigLIP (attention pooling), MAE (avg
pooling + fc_norm), DeiT distilled (two heads), DINOv2 (layer scale), AIMv2 (RMSNorm with lxt's
``rms_norm_forward``, bias-free SwiGLU), Perception Encoder spatial (PE's rotary positions, ``norm_pre``), NaFlex
(timm's ``naflexvit``: its square table resized to the image's own 6 x 3 grid).

Reference: rachtibat/LRP-eXplains-Transformers @ f0434417, lxt/efficient/{rules,patches}.py (tests/reference/lxt).
"""

import pytest
import torch
import torch.nn.functional as F
from parity_helpers import randomize

from tests.reference.lxt.patches import (
    layer_norm_forward,
    non_linear_forward,
    rms_norm_forward,
    stop_gradient,
    wrap_attention_forward,
)
from tests.reference.lxt.rules import divide_gradient, identity_rule_implicit
from vit.explain.methods.relevance import AttnLRPRules, attnlrp
from vit.model import use_rules
from vit.sources.open import open_source

timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing timm takes seconds

CASES = {  # name, patch, extra model args
    "eva02-tiny (packed SwiGLU)": ("eva02_tiny_patch14_224", 7, {}),
    "eva02-base (SwiGLU + norm)": ("eva02_base_patch14_224", 7, {}),
    "dinov3": ("vit_small_patch16_dinov3_qkvb", 8, {}),
    "siglip": ("vit_base_patch16_siglip_224", 8, {}),
    "mae": ("vit_base_patch16_224.mae", 8, dict(global_pool="avg", fc_norm=True)),
    "deit-distilled": ("deit_tiny_distilled_patch16_224", 8, {}),
    "dinov2": ("vit_small_patch14_dinov2", 7, {}),
    "aimv2 (RMSNorm, bias-free SwiGLU)": ("aimv2_large_patch14_224", 7, {}),
    "pe-spatial (PE's RoPE, norm_pre)": ("vit_pe_spatial_tiny_patch16_512", 8, {}),
    "naflexvit (NaFlex grid, table resized per image)": ("naflexvit_base_patch16_gap", 8, {}),
}


def timm_and_ours(tmp_path, name: str, patch: int, kwargs: dict):
    torch.manual_seed(0)
    any_size = {} if name.startswith("naflexvit") else dict(dynamic_img_size=True)  # NaFlex takes any grid anyway
    model = timm.create_model(name, pretrained=False, img_size=4 * patch, patch_size=patch, embed_dim=32, depth=2,
                              num_heads=2, num_classes=3, **any_size, **kwargs)
    randomize(model)
    timm.models.save_for_hf(model, tmp_path / "timm", model_args=dict(num_heads=2, img_size=4 * patch, **kwargs),
                            safe_serialization=True)
    return model, open_source(tmp_path / "timm").model


def gate_and_up(self, x):
    """timm's SwiGLU (``fc1_g``/``fc1_x``) or packed GluMlp (``fc1`` chunked): lxt's gate_proj(x), up_proj(x)."""
    if hasattr(self, "fc1_g"):
        return self.fc1_g(x), self.fc1_x(x)
    return self.fc1(x).chunk(2, dim=-1)


def gated_mlp_forward(self, x):
    """lxt's ``gated_mlp_forward`` (identity rule on the activation, uniform rule on the product) on timm's
    gated MLPs, with timm's inner norm before ``fc2``."""
    gate, up = gate_and_up(self, x)
    weighted = divide_gradient(identity_rule_implicit(self.act, gate) * up, 2)
    return self.fc2(self.norm(weighted))


def cp_gated_mlp_forward(self, x):
    """lxt's ``cp_gated_mlp_forward`` (no gradient through the gate) on timm's gated MLPs."""
    gate, up = gate_and_up(self, x)
    weighted = self.act(stop_gradient(gate)) * up
    return self.fc2(self.norm(weighted))


def lxt_relevance(model, images, index: int, cp: bool, monkeypatch) -> torch.Tensor:
    from timm.layers import LayerNorm as TimmLayerNorm
    from timm.layers import RmsNorm
    from timm.layers.mlp import GluMlp, SwiGLU

    sdpa = F.scaled_dot_product_attention
    attention = wrap_attention_forward(lambda module, q, k, v, **kw: sdpa(q, k, v, **kw))
    if cp:  # CP-LRP: lxt's vit_torch map stops the gradient through the attention weights (and the gate)
        def attention(module, q, k, v, **kw):
            return sdpa(stop_gradient(q), stop_gradient(k), v, **kw)
    activations = {type(m) for m in model.modules() if type(m).__name__ in ("GELU", "GELUTanh", "SiLU")}
    with monkeypatch.context() as m:  # undone before our model runs
        for norm in (torch.nn.LayerNorm, TimmLayerNorm):
            m.setattr(norm, "forward", layer_norm_forward)
        m.setattr(RmsNorm, "variance_epsilon", property(lambda self: self.eps), raising=False)  # lxt's name for eps
        m.setattr(RmsNorm, "forward", rms_norm_forward)
        for act in activations:
            m.setattr(act, "original_forward", act.forward, raising=False)
            m.setattr(act, "forward", non_linear_forward)
        for mlp in (SwiGLU, GluMlp):
            m.setattr(mlp, "forward", cp_gated_mlp_forward if cp else gated_mlp_forward)
        m.setattr(F, "scaled_dot_product_attention", lambda q, k, v, **kw: attention(None, q, k, v, **kw))
        x = images.clone().requires_grad_(True)
        model(x)[0, index].backward()
    return (x * x.grad).sum(1).detach()


def assert_attnlrp_equals_lxt(reference, ours, images, cp: bool, monkeypatch) -> None:
    """``ours`` is ``reference``'s network, and its AttnLRP (CP-LRP with ``cp``) of classes 0 and 2 equals lxt's
    rules patched into ``reference``, relative to the map's largest value."""
    with torch.no_grad():
        torch.testing.assert_close(ours(images)[0], reference(images), rtol=1e-5, atol=1e-5)  # the same network
    for index in (0, 2):
        expected = lxt_relevance(reference, images, index, cp, monkeypatch)
        scale = expected.abs().max()
        torch.testing.assert_close(attnlrp(ours, images, index, cp=cp) / scale, expected / scale,
                                   rtol=1e-5, atol=1e-5)


def assert_cp_lrp_conserves(model, images, index: int = 1, atol_of_logit: float | None = None) -> None:
    """CP-LRP's relevance at the embedding sums to the explained logit (a model whose biases are zero: they would
    absorb relevance), rtol 1e-3 and atol 1e-3 (or ``atol_of_logit`` times the largest logit)."""
    with torch.enable_grad(), use_rules(AttnLRPRules(cp=True)):
        encoding, cache = model.run_with_cache(images.requires_grad_(True), ["hook_embed"])
        logit = encoding.logits[:, index]
        [grad] = torch.autograd.grad(logit.sum(), cache["hook_embed"])
    total = (cache["hook_embed"] * grad).sum(dim=(1, 2))  # (B,)
    logit = logit.detach()
    atol = 1e-3 if atol_of_logit is None else atol_of_logit * float(logit.abs().max())
    torch.testing.assert_close(total, logit, rtol=1e-3, atol=atol)


@pytest.mark.parametrize("cp", [False, True], ids=["attnlrp", "cp-lrp"])
@pytest.mark.parametrize("case", list(CASES))
def test_attnlrp_equals_lxts_rules_on_timms_model_of_each_family(tmp_path, monkeypatch, case, cp):
    name, patch, kwargs = CASES[case]
    reference, ours = timm_and_ours(tmp_path, name, patch, kwargs)
    images = torch.randn(1, 3, 6 * patch, 3 * patch, generator=torch.Generator().manual_seed(1))  # a 6 x 3 grid
    assert_attnlrp_equals_lxt(reference, ours, images, cp, monkeypatch)
