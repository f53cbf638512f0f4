"""LeGrad, Chefer's transformer attribution, AttnLRP and attention flow against their authors' code on the same weights.

References (copied under tests/reference/ with their licences, or, for attention flow whose
repository has no licence, its procedure re-typed here):
- Chefer et al. 2021a: hila-chefer/Transformer-Explainability @ c3e578f7, baselines/ViT/ViT_LRP.py,
  modules/layers_ours.py; the call sequence of baselines/ViT/ViT_explanation_generator.py ``LRP.generate_LRP``.
- LeGrad: WalBouss/LeGrad @ a9edb031, legrad/wrapper.py ``compute_legrad_clip`` (adapted to a classifier),
  run on HF transformers' ViT.
- AttnLRP: rachtibat/LRP-eXplains-Transformers @ f0434417, lxt/efficient/{rules,patches}.py: its rules
  patched into HF transformers' ViT (AttnLRP) and torchvision's ViT (CP-LRP, lxt's ``vit_torch`` map).
- Attention flow: samiraabnar/attention_flow @ 8044f531, attention_graph_util.py ``get_adjmat``/``compute_flows``.
"""

import dataclasses
import math

import networkx as nx
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import lxt_norms

from vit.explain.methods.attention import token_map
from vit.explain.methods.attention_flow import TooManyTokensError, attention_flow, flow_graph
from vit.explain.methods.relevance import (
    AttnLRPRules,
    UnsupportedModelError,
    attnlrp,
    legrad,
    legrad_from_gradients,
    patch_sums,
    transformer_attribution,
)
from vit.model import ViT, ViTConfig, use_rules

CONFIG = ViTConfig(image_size=16, patch_size=4, num_channels=3, num_classes=5, hidden_size=32, num_layers=3,
                   num_heads=4, mlp_size=64)


def random_vit(config: ViTConfig = CONFIG, seed: int = 0) -> ViT:
    torch.manual_seed(seed)
    model = ViT(config).eval()
    with torch.no_grad():  # zero biases and unit norms would hide mapping mistakes
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.fixture(scope="module")
def model() -> ViT:
    return random_vit()


def images(batch: int = 1, size: tuple[int, int] = (16, 16), seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, *size, generator=torch.Generator().manual_seed(seed))


# --- the rules context ------------------------------------------------------------------------------

@pytest.mark.parametrize("cp", [False, True])
def test_lrp_rules_keep_the_forward_values_and_change_the_gradients_only_within_their_block(model, cp):
    x = images(2, (12, 16))

    def logits_and_gradient():
        xr = x.clone().requires_grad_(True)
        logits = model(xr)[0]
        return logits.detach(), torch.autograd.grad(logits[:, 0].sum(), xr)[0]

    plain_logits, plain_gradient = logits_and_gradient()
    with use_rules(AttnLRPRules(cp)):
        logits, gradient = logits_and_gradient()
    torch.testing.assert_close(logits, plain_logits, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(gradient, plain_gradient, rtol=1e-3, atol=1e-6)
    assert torch.equal(logits_and_gradient()[1], plain_gradient)


EVERY_OPTION = dataclasses.replace(CONFIG, distillation_token=True, distillation_head=True, num_register_tokens=2,
                                   layer_scale=0.5, pooling="cls+avg", prefix_positions="cls")
AVG_POOLED = dataclasses.replace(CONFIG, num_register_tokens=3, pooling="avg", fc_norm=True, prefix_positions="none",
                                 pos_embed_antialias=True)


def test_legrad_and_attnlrp_work_with_four_prefix_tokens_and_every_option():
    model = random_vit(EVERY_OPTION)
    x = images(2, (12, 16))
    assert legrad(model, x, torch.tensor([0, 1]), start_layer=0).shape == (2, 3, 4)
    assert attnlrp(model, x, 1).shape == (2, 12, 16)
    assert attnlrp(random_vit(AVG_POOLED), x, 1, cp=True).shape == (2, 12, 16)
    registers = random_vit(dataclasses.replace(CONFIG, num_register_tokens=3))
    assert token_map(transformer_attribution(registers, x, 0), 0, (3, 4), 4).shape == (2, 3, 4)


def test_unsupported_models_raise_a_clear_error(model):
    with pytest.raises(UnsupportedModelError, match="model.eval"):
        legrad(random_vit().train(), images())
    with pytest.raises(UnsupportedModelError, match="no rule for layer_scale=0.5"):
        transformer_attribution(random_vit(dataclasses.replace(CONFIG, layer_scale=0.5)), images())
    with pytest.raises(UnsupportedModelError, match="no rule for pooling='avg'"):
        transformer_attribution(random_vit(dataclasses.replace(CONFIG, pooling="avg")), images())
    with pytest.raises(UnsupportedModelError, match="this project's ViT"):
        attnlrp(torch.nn.Identity(), images())


# --- Chefer et al. 2021a ------------------------------------------------------------------------------

def chefer_reference(ours: ViT):
    from tests.reference.chefer.ViT_LRP import VisionTransformer

    c = ours.config
    ref = VisionTransformer(img_size=c.image_size, patch_size=c.patch_size, in_chans=c.num_channels,
                            num_classes=c.num_classes, embed_dim=c.hidden_size, depth=c.num_layers,
                            num_heads=c.num_heads, mlp_ratio=c.mlp_size / c.hidden_size, qkv_bias=c.qkv_bias)
    if c.head_dim:  # the reference's attention is dim wide; its forward and relprop reshape to any width
        from tests.reference.chefer.layers_ours import Linear

        for block in ref.blocks:
            inner = c.num_heads * c.head_dim
            block.attn.qkv = Linear(c.hidden_size, 3 * inner, bias=c.qkv_bias)
            block.attn.proj = Linear(inner, c.hidden_size)
            block.attn.scale = c.head_dim ** -0.5
    state = {k.replace("patch_embed.", "patch_embed.proj."): v for k, v in ours.state_dict().items()}
    ref.load_state_dict(state, strict=True)
    for module in ref.modules():  # the reference's blocks have timm's 1e-6, its final norm torch's 1e-5
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = c.layer_norm_eps
    return ref.eval()


def chefer_reference_map(ref, x: torch.Tensor, index: int) -> torch.Tensor:
    """ViT_explanation_generator.LRP.generate_LRP, without its .cuda() and in the model's dtype (float32 there)."""
    output = ref(x)
    one_hot = np.zeros((1, output.size()[-1]), dtype=np.float64 if output.dtype == torch.float64 else np.float32)
    one_hot[0, index] = 1
    one_hot_vector = one_hot
    one_hot = torch.from_numpy(one_hot).requires_grad_(True)
    one_hot = torch.sum(one_hot * output)
    ref.zero_grad()
    one_hot.backward(retain_graph=True)
    return ref.relprop(torch.tensor(one_hot_vector), method="transformer_attribution", is_ablation=False,
                       start_layer=0, alpha=1)


# Equal to rounding in float64 on both sides; in float32 the two sum a patch's pixels in different orders (our stem is
# one matrix product, theirs a convolution), 1.0e-5 of the peak apart after three layers' products.
TOLERANCES = {torch.float64: dict(rtol=1e-12, atol=1e-14), torch.float32: dict(rtol=1e-4, atol=3e-5)}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("index", [0, 3])
def test_transformer_attribution_matches_the_authors_code(model, index, dtype):
    model = model.to(dtype)
    ref = chefer_reference(model).to(dtype)
    x = images(seed=index).to(dtype)
    expected = chefer_reference_map(ref, x, index)  # (1, gh*gw)
    ours = token_map(transformer_attribution(model, x, index), 0, (4, 4))  # (1, 4, 4)
    scale = expected.abs().max()  # relevances here are ~1e-5: compare on the map's own scale
    torch.testing.assert_close(ours.flatten(1) / scale, expected.detach() / scale, **TOLERANCES[dtype])


@pytest.mark.parametrize("head_dim", [4, 16])  # heads x head_dim narrower, then wider than hidden_size (32)
def test_transformer_attribution_of_an_attention_not_as_wide_as_the_model_matches_the_authors_code(head_dim):
    model = random_vit(dataclasses.replace(CONFIG, head_dim=head_dim)).double()  # vit-pytorch's dim_head
    ref = chefer_reference(model).double()
    x = images(seed=2).double()
    expected = chefer_reference_map(ref, x, 1)  # (1, gh*gw)
    ours = token_map(transformer_attribution(model, x, 1), 0, (4, 4))  # (1, 4, 4)
    scale = expected.abs().max()
    torch.testing.assert_close(ours.flatten(1) / scale, expected.detach() / scale, **TOLERANCES[torch.float64])


def test_transformer_attribution_of_a_batch_equals_one_image_at_a_time(model):
    x = images(3, (12, 16))
    batched = transformer_attribution(model, x, torch.tensor([0, 2, 4]))
    for b, c in enumerate([0, 2, 4]):
        torch.testing.assert_close(batched[b:b + 1], transformer_attribution(model, x[b:b + 1], c),
                                   rtol=1e-4, atol=1e-6)
    default = transformer_attribution(model, x)  # the predicted class of each image
    torch.testing.assert_close(default, transformer_attribution(model, x, model(x)[0].argmax(-1)))


# --- LeGrad --------------------------------------------------------------------------------------

transformers = pytest.importorskip("transformers")


def hf_and_ours(seed: int = 0):
    from vit.sources.ports.families.hf import config_from_hf, state_dict_from_hf

    torch.manual_seed(seed)
    config = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=3,
                                    num_attention_heads=4, intermediate_size=64, num_labels=5, qkv_bias=True,
                                    hidden_act="gelu", layer_norm_eps=1e-6)
    config._attn_implementation = "eager"
    hf = transformers.ViTForImageClassification(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "layernorm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    ours = ViT(config_from_hf(hf.config))
    ours.load_state_dict(state_dict_from_hf(hf.state_dict(), ours.config.num_layers), strict=True)
    return hf, ours.eval()


@pytest.mark.parametrize("start_layer", [-2, 0])
def test_legrad_matches_the_authors_code_on_hf_vit(start_layer):
    from tests.reference.legrad.legrad_reference import compute_legrad, min_max

    hf, ours = hf_and_ours()
    x, classes = images(2), torch.tensor([1, 3])
    out = hf(pixel_values=x, output_hidden_states=True, output_attentions=True)
    feats, attns = list(out.hidden_states[1:]), list(out.attentions)  # each layer's output and attention

    def score_of_feat(feat):
        logits = hf.classifier(hf.vit.layernorm(feat)[:, 0])  # (batch, classes)
        return logits[:, classes].T  # (prompts = images, batch)

    expected = compute_legrad(feats, attns, score_of_feat, num_prompts=2, patch_size=4,
                              starting_depth=start_layer % 3)
    ours_map = legrad(ours, x, classes, start_layer=start_layer)  # (2, 4, 4)
    upsampled = min_max(F.interpolate(ours_map[None], scale_factor=4, mode="bilinear"))
    torch.testing.assert_close(upsampled, expected.detach(), rtol=1e-4, atol=1e-5)


def test_legrad_aggregation_by_hand_with_two_prefix_tokens():
    # 2 prefix tokens + a 1x2 grid; one head. Layer 0: negative gradients are dropped.
    g0 = torch.zeros(1, 1, 4, 4)
    g0[0, 0, :, 2] = 4.0  # every query: +4 on patch 0
    g0[0, 0, :, 3] = -4.0
    g1 = torch.zeros(1, 2, 4, 4)
    g1[0, 0, 0, 3] = 8.0  # head 0, query 0 only: mean over 2 heads and 4 queries -> 1
    result = legrad_from_gradients([g0, g1], grid=(1, 2), num_prefix_tokens=2)
    torch.testing.assert_close(result, torch.tensor([[[4.0, 1.0]]]))


def test_legrad_batch_and_non_square_grid(model):
    x = images(2, (8, 16))
    maps = legrad(model, x, torch.tensor([0, 1]), start_layer=0)
    assert maps.shape == (2, 2, 4)
    torch.testing.assert_close(maps[1:], legrad(model, x[1:], 1, start_layer=0), rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="out of range"):
        legrad(model, x, 0, start_layer=3)


# --- AttnLRP -------------------------------------------------------------------------------------

def test_attnlrp_matches_lxt_rules_on_hf_vit(monkeypatch):
    import transformers.models.vit.modeling_vit as modeling_vit

    from tests.reference.lxt.patches import wrap_attention_forward

    hf, ours = hf_and_ours(seed=3)
    x = images(1, seed=4)
    expected = {}
    with monkeypatch.context() as m:  # lxt patches classes; undo it before anything else runs
        lxt_norms(m)
        m.setattr(modeling_vit, "eager_attention_forward", wrap_attention_forward(modeling_vit.eager_attention_forward))
        for c in (0, 2):
            xr = x.clone().requires_grad_(True)
            hf(pixel_values=xr).logits[0, c].backward()
            expected[c] = (xr * xr.grad).sum(1).detach()
    for c in (0, 2):
        scale = expected[c].abs().max()
        torch.testing.assert_close(attnlrp(ours, x, c) / scale, expected[c] / scale, rtol=1e-5, atol=1e-5)


def torchvision_vit(ours: ViT):
    from torchvision.models import VisionTransformer

    c = ours.config
    tv = VisionTransformer(image_size=c.image_size, patch_size=c.patch_size, num_layers=c.num_layers,
                           num_heads=c.num_heads, hidden_dim=c.hidden_size, mlp_dim=c.mlp_size,
                           num_classes=c.num_classes)
    s = ours.state_dict()
    state = {"conv_proj.weight": s["patch_embed.weight"], "conv_proj.bias": s["patch_embed.bias"],
             "class_token": s["cls_token"], "encoder.pos_embedding": s["pos_embed"],
             "encoder.ln.weight": s["norm.weight"], "encoder.ln.bias": s["norm.bias"],
             "heads.head.weight": s["head.weight"], "heads.head.bias": s["head.bias"]}
    names = {"ln_1": "norm1", "ln_2": "norm2", "self_attention.out_proj": "attn.proj", "mlp.0": "mlp.fc1",
             "mlp.3": "mlp.fc2"}
    for i in range(c.num_layers):
        theirs, mine = f"encoder.layers.encoder_layer_{i}", f"blocks.{i}"
        for t, o in names.items():
            for p in ("weight", "bias"):
                state[f"{theirs}.{t}.{p}"] = s[f"{mine}.{o}.{p}"]
        state[f"{theirs}.self_attention.in_proj_weight"] = s[f"{mine}.attn.qkv.weight"]
        state[f"{theirs}.self_attention.in_proj_bias"] = s[f"{mine}.attn.qkv.bias"]
    tv.load_state_dict(state, strict=True)
    return tv.eval()


def test_cp_lrp_matches_lxts_vit_map_on_torchvision_vit(model, monkeypatch):
    from tests.reference.lxt.patches import cp_multi_head_attention_forward, layer_norm_forward, non_linear_forward

    tv, x = torchvision_vit(model), images(1, seed=5)
    torch.testing.assert_close(tv(x), model(x)[0], rtol=1e-5, atol=1e-5)  # the same network
    with monkeypatch.context() as m:  # lxt.efficient.models.vit_torch.cp_LRP, undone afterwards
        m.setattr(torch.nn.GELU, "original_forward", torch.nn.GELU.forward, raising=False)
        m.setattr(torch.nn.GELU, "forward", non_linear_forward)
        m.setattr(torch.nn.LayerNorm, "forward", layer_norm_forward)
        m.setattr(torch.nn.MultiheadAttention, "original_forward", torch.nn.MultiheadAttention.forward,
                  raising=False)
        m.setattr(torch.nn.MultiheadAttention, "forward", cp_multi_head_attention_forward)
        xr = x.clone().requires_grad_(True)
        tv(xr)[0, 1].backward()
        expected = (xr * xr.grad).sum(1).detach()
    scale = expected.abs().max()
    torch.testing.assert_close(attnlrp(model, x, 1, cp=True) / scale, expected / scale, rtol=1e-5, atol=1e-5)


def hf_swiglu_dinov3(folder):
    """A tiny random HF ``DINOv3ViTModel`` with SwiGLU (DINOv3 H+ / 7B's MLP), eager attention, and ours from it."""
    from parity_helpers import randomize
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    from vit.sources.open import open_source

    config = DINOv3ViTConfig(image_size=32, patch_size=8, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                             num_attention_heads=2, num_register_tokens=2, layerscale_value=0.5, use_gated_mlp=True,
                             hidden_act="silu", mlp_bias=True)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = randomize(DINOv3ViTModel(config))
    hf.save_pretrained(folder)
    return hf, open_source(folder).model


@pytest.mark.slow  # imports transformers
@pytest.mark.parametrize("cp", [False, True], ids=["attnlrp", "cp-lrp"])
def test_gated_mlp_rules_match_lxts_own_forwards_on_hf_swiglu_dinov3(tmp_path, monkeypatch, cp):
    """lxt's ``gated_mlp_forward`` (AttnLRP) and ``cp_gated_mlp_forward`` (CP-LRP: no gradient through the gate)
    patched unchanged into HF's ``DINOv3ViTGatedMLP``, whose names (gate_proj, up_proj, act_fn) are lxt's own."""
    import transformers.models.dinov3_vit.modeling_dinov3_vit as modeling
    from transformers.activations import SiLUActivation

    from tests.reference.lxt.patches import (
        cp_gated_mlp_forward,
        cp_wrap_attention_forward,
        gated_mlp_forward,
        layer_norm_forward,
        non_linear_forward,
        wrap_attention_forward,
    )

    hf, ours = hf_swiglu_dinov3(tmp_path / "dinov3")
    x = images(1, (32, 24), seed=6)
    with torch.no_grad():
        torch.testing.assert_close(ours.encode(x).embedding, hf(pixel_values=x).pooler_output, rtol=1e-5, atol=1e-5)
    expected = {}
    with monkeypatch.context() as m:  # lxt patches classes; undone before ours runs
        m.setattr(torch.nn.LayerNorm, "forward", layer_norm_forward)
        m.setattr(SiLUActivation, "original_forward", SiLUActivation.forward, raising=False)
        m.setattr(SiLUActivation, "forward", non_linear_forward)
        m.setattr(modeling.DINOv3ViTGatedMLP, "forward", cp_gated_mlp_forward if cp else gated_mlp_forward)
        wrap = cp_wrap_attention_forward if cp else wrap_attention_forward
        m.setattr(modeling, "eager_attention_forward", wrap(modeling.eager_attention_forward))
        for j in (0, 5):
            xr = x.clone().requires_grad_(True)
            hf(pixel_values=xr).pooler_output[0, j].backward()
            expected[j] = (xr * xr.grad).sum(1).detach()
    for j in (0, 5):
        xr = x.clone().requires_grad_(True)
        with torch.enable_grad(), use_rules(AttnLRPRules(cp)):
            ours.encode(xr).embedding[0, j].backward()
        scale = expected[j].abs().max()
        torch.testing.assert_close((xr * xr.grad).sum(1).detach() / scale, expected[j] / scale, rtol=1e-5, atol=1e-5)


def test_attnlrp_is_signed_batched_and_sums_per_patch(model):
    x = images(2, (8, 12))
    relevance = attnlrp(model, x, torch.tensor([0, 1]))
    assert relevance.shape == (2, 8, 12)
    assert (relevance > 0).any() and (relevance < 0).any()
    torch.testing.assert_close(relevance[1:], attnlrp(model, x[1:], 1), rtol=1e-4, atol=1e-7)
    sums = patch_sums(relevance, (2, 3))
    torch.testing.assert_close(sums[0, 1, 2], relevance[0, 4:8, 8:12].sum())


# --- attention flow ------------------------------------------------------------------------------

def reference_flow(attentions: list[torch.Tensor], query: int) -> np.ndarray:
    """attention_graph_util.py, re-typed (the repository has no licence): the notebook's residual matrices,
    ``get_adjmat``, the capacity graph, ``compute_flows`` with Edmonds-Karp; the row of the top-layer ``query``."""
    att_mat = torch.stack([a[0] for a in attentions]).double().numpy()  # (L, H, T, T)
    res_att_mat = att_mat.sum(axis=1) / att_mat.shape[1]
    res_att_mat = res_att_mat + np.eye(res_att_mat.shape[1])[None, ...]
    res_att_mat = res_att_mat / res_att_mat.sum(axis=-1)[..., None]
    n_layers, length, _ = res_att_mat.shape
    adj_mat = np.zeros(((n_layers + 1) * length, (n_layers + 1) * length))
    for i in np.arange(1, n_layers + 1):
        for k_f in np.arange(length):
            for k_t in np.arange(length):
                adj_mat[i * length + k_f][(i - 1) * length + k_t] = res_att_mat[i - 1][k_f][k_t]
    G = nx.from_numpy_array(adj_mat, create_using=nx.DiGraph())
    for i, j in G.edges:
        G[i][j]["capacity"] = adj_mat[i, j]
    u = n_layers * length + query
    flows = np.array([nx.maximum_flow_value(G, u, v, flow_func=nx.algorithms.flow.edmonds_karp)
                      for v in range(length)])
    return flows / flows.sum()


@pytest.mark.parametrize("query", [0, 3])
def test_attention_flow_matches_the_reference_procedure_with_two_prefix_tokens(query):
    g = torch.Generator().manual_seed(query)
    attentions = [torch.randn(1, 2, 6, 6, generator=g).mul(2).softmax(-1) for _ in range(3)]  # 2 prefix + 2x2
    ours = attention_flow(attentions, query=query)
    assert ours.shape == (1, 6)
    np.testing.assert_allclose(ours[0].numpy(), reference_flow(attentions, query), rtol=1e-9, atol=1e-12)


def test_attention_flow_by_hand_is_the_bottleneck_not_the_product():
    # One layer, 2 tokens, attention: token 0 reads token 1 only. With the residual: [[.5, .5], [0, 1]].
    # Flow from top token 0: 0.5 to each input, i.e. [0.5, 0.5] after normalising.
    a = torch.tensor([[0.0, 1.0], [0.0, 1.0]])[None, None]
    torch.testing.assert_close(attention_flow([a]), torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    # Two such layers: rollout multiplies, [.25, .75]. Flow takes the bottleneck of each path:
    # input 0 only through middle token 0 (min(.5, .5) = .5), input 1 through both (.5 + .5 = 1),
    # so [.5, 1] / 1.5.
    result = attention_flow([a, a])
    torch.testing.assert_close(result, torch.tensor([[1 / 3, 2 / 3]], dtype=torch.float64))


def test_attention_flow_batch_end_layer_and_the_token_limit():
    g = torch.Generator().manual_seed(7)
    attentions = [torch.randn(2, 2, 5, 5, generator=g).softmax(-1) for _ in range(3)]
    both = attention_flow(attentions, end_layer=1)
    torch.testing.assert_close(both[1:], attention_flow([a[1:] for a in attentions[:2]]))
    torch.testing.assert_close(both.sum(-1), torch.ones(2, dtype=torch.float64))
    with pytest.raises(TooManyTokensError, match="above the limit of 4"):
        attention_flow(attentions, max_tokens=4)


def test_flow_graph_keeps_only_the_query_at_the_top():
    mats = np.full((2, 3, 3), 1 / 3)
    G = flow_graph(mats, query=1)
    assert G.out_degree(2 * 3 + 1) == 3 and 2 * 3 + 0 not in G
    assert G.number_of_edges() == 3 + 9
    assert math.isclose(G[7][3]["capacity"], 1 / 3)


def test_the_sparse_capacities_are_the_flow_graph():
    from vit.explain.methods.attention_flow import flow_capacities

    g = torch.Generator().manual_seed(3)
    matrices = torch.randn(3, 5, 5, generator=g).softmax(-1).double().numpy()
    matrices[1, 2, 4] = 0.0  # a zero capacity has no edge in either
    G = flow_graph(matrices, query=2)
    dense = flow_capacities(matrices, query=2).toarray()
    assert np.count_nonzero(dense) == G.number_of_edges()
    for u, v, data in G.edges(data=True):
        assert dense[u, v] == data["capacity"]


def test_attention_flow_over_261_tokens_is_no_longer_refused():
    """DINOv2 with 4 registers at its own 224 px has 261 tokens, above the old limit of 260 (flow refused it)."""
    g = torch.Generator().manual_seed(11)
    attentions = [torch.randn(1, 1, 261, 261, generator=g).mul(3).softmax(-1)]
    flow = attention_flow(attentions, query=0)
    assert flow.shape == (1, 261)
    torch.testing.assert_close(flow.sum(-1), torch.ones(1, dtype=torch.float64))


@pytest.mark.parametrize("cp", [False, True])
def test_attnlrp_with_checkpointed_blocks_is_the_same_relevance_from_one_blocks_graph_at_a_time(cp):
    """Each block's input kept and the block run again in the backward under AttnLRP's rules: the same relevance
    (float64, to rounding), while what the forward saves for the backward is the blocks' inputs alone, not every
    layer's attention (counted by autograd's saved-tensor hooks)."""
    model = random_vit(dataclasses.replace(CONFIG, num_layers=4)).double()
    x = images(2, (16, 16)).double()

    def saved_bytes(**options) -> tuple[torch.Tensor, int]:
        total = [0]

        def pack(t):
            total[0] += t.numel() * t.element_size()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            relevance = attnlrp(model, x, 1, cp=cp, **options)
        return relevance, total[0]

    whole, whole_bytes = saved_bytes()
    checkpointed, checkpointed_bytes = saved_bytes(checkpointed=True)
    torch.testing.assert_close(checkpointed, whole, rtol=1e-12, atol=1e-15)
    assert torch.count_nonzero(whole) > 0
    assert checkpointed_bytes < whole_bytes / 3, (checkpointed_bytes, whole_bytes)
