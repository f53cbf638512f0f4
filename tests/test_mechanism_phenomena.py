"""High-norm tokens, massive activations, attention sinks and test-time register neurons on a timm model.

References, run on timm's own ``VisionTransformer`` with the same random weights:
- locuslab/massive-activations @ 6521c05e, ``monkey_patch/modify_vit.py`` (MIT, vendored verbatim in
  ``tests/reference/massive_activations``): ``enable_vit_custom_block`` puts the authors' block forward on each of
  timm's blocks, which keeps its output as ``feat``; ``main_vit.py --exp2``'s statistic (top 3 of |feat| and its
  median per layer, four lines of a script) is copied below.
- nickjiang2378/test-time-registers @ 248dbaa0, ``shared/algorithms.py`` ``find_register_neurons`` (without the
  sparsity filter), re-typed below on activations captured from timm's ``mlp.act`` and block outputs; and
  @ fd81fd22 ``shared/hook_fn.py`` ``activate_on_registers`` and ``shared/utils.py`` ``sign_max``, re-typed below as
  hooks on timm's ``mlp.act`` with the extra tokens appended after the patches.
"""

import copy

import pytest
import torch

from vit.explain.mechanism.components import MechanismError, hidden_states
from vit.explain.mechanism.phenomena import (
    find_register_neurons,
    high_norm_rate,
    massive_activations,
    sink_stats,
    token_norms,
    with_test_time_registers,
)
from vit.model import ViT
from vit.sources.ports.libraries.import_timm import config_from_timm, state_dict_from_timm

timm = pytest.importorskip("timm")
ARGS = dict(img_size=32, patch_size=8, depth=3, embed_dim=16, num_heads=2, num_classes=5, reg_tokens=2,
            init_values=0.5)


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    reference = timm.create_model("vit_base_patch16_224", pretrained=False, **ARGS).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.3)
    state = reference.state_dict()
    ours = ViT(config_from_timm("vit_base_patch16_224", state, {k: v for k, v in ARGS.items()
                                                                 if k in ("num_heads", "img_size")}))
    ours.load_state_dict(state_dict_from_timm(state), strict=True)
    return reference, ours.eval()


def images(batch: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def timm_captures(model, x):
    """Block outputs (locuslab's ``feat``) and post-GELU MLP activations, per layer."""
    feats, acts = [], []
    hooks = [b.register_forward_hook(lambda m, i, o: feats.append(o.detach().double())) for b in model.blocks]
    hooks += [b.mlp.act.register_forward_hook(lambda m, i, o: acts.append(o.detach())) for b in model.blocks]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return feats, acts


def test_massive_activations_match_the_authors_statistics(pair):
    from reference.massive_activations.modify_vit import enable_vit_custom_block

    reference, ours = pair
    x = images(2)
    with torch.no_grad():
        mine = massive_activations(hidden_states(ours, x))  # (B, L, 4)
    authors = copy.deepcopy(reference)
    for layer_id, layer in enumerate(authors.blocks):
        enable_vit_custom_block(layer, layer_id)
    for b in range(2):
        with torch.no_grad():
            authors(x[b:b + 1])
        for layer_id in range(len(authors.blocks)):  # main_vit.py --exp2, one image
            feat_abs = authors.blocks[layer_id].feat.abs()
            top = torch.sort(feat_abs.flatten(), descending=True).values[:3]
            torch.testing.assert_close(mine[b, layer_id, :3].double(), top, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(mine[b, layer_id, 3].double(), torch.median(feat_abs), rtol=1e-5, atol=1e-5)


def reference_register_neurons(model, xs, threshold, detect_outliers_layer=-1):
    """test-time-registers' find_register_neurons on captured activations (apply_sparsity_filter=False)."""
    num_layers, num_neurons = len(model.blocks), model.blocks[0].mlp.fc1.out_features
    neuron_scores = torch.zeros((len(xs), num_layers, num_neurons))
    image_count = 0
    for x in xs:
        feats, acts = timm_captures(model, x[None])
        norm_map = torch.norm(feats[detect_outliers_layer][0].float(), dim=1)
        filtered_norms = norm_map.clone()
        filtered_norms[filtered_norms < threshold] = 0
        register_locations = torch.where(filtered_norms > threshold)[0]
        if len(register_locations) == 0:
            continue
        for layer in range(num_layers):
            register_values = torch.abs(acts[layer][0][register_locations])
            neuron_scores[image_count, layer] = register_values.mean(dim=0)
        image_count += 1
    mean_neuron_scores = neuron_scores[:image_count].mean(dim=0)
    sorted_values, sorted_indices = torch.sort(mean_neuron_scores.flatten(), descending=True)
    return [(int(i) // num_neurons, int(i) % num_neurons, float(v))
            for v, i in zip(sorted_values, sorted_indices, strict=True)]


def test_register_neurons_match_test_time_registers(pair):
    reference, ours = pair
    x = images(4, seed=2)
    with torch.no_grad():
        norms = token_norms(hidden_states(ours, x))[:, -1]  # (B, T) after the last block
    threshold = float(norms.flatten().quantile(0.9))  # a few outliers per image on random weights
    mine = find_register_neurons(ours, x, threshold, top_k=8)
    expected = reference_register_neurons(reference, x, threshold)[:8]
    assert [(layer, neuron) for layer, neuron, _ in mine] == [(layer, neuron) for layer, neuron, _ in expected]
    torch.testing.assert_close(torch.tensor([s for *_, s in mine]), torch.tensor([s for *_, s in expected]),
                               rtol=1e-4, atol=1e-5)
    with pytest.raises(MechanismError, match="lower the threshold"):
        find_register_neurons(ours, x, 1e9)


def test_high_norm_rate_counts_patches_over_the_threshold():
    norms = torch.tensor([[[9.0, 1.0, 5.0, 7.0, 2.0]]])  # one image, one layer, CLS + 4 patches
    rate, mask = high_norm_rate(norms, 4.0, num_prefix_tokens=1)
    assert rate.tolist() == [[0.5]]
    assert mask[0, 0].tolist() == [True, False, True, True, False]


def test_sink_stats_find_the_key_most_attended_and_its_value_norm(pair):
    reference, ours = pair
    x = images(2)
    with torch.no_grad():
        sinks = sink_stats(ours, hidden_states(ours, x))
        _, attentions = ours(x, output_attentions=True)
    assert sinks.mass.shape == sinks.token.shape == sinks.value_norm.shape == (2, 3, 2)
    received = torch.stack([a.mean(dim=2) for a in attentions], dim=1)  # (B, L, H, T)
    torch.testing.assert_close(sinks.mass, received.max(-1).values, rtol=0, atol=1e-6)
    assert torch.equal(sinks.token, received.argmax(-1))
    # The value norm, from timm's own qkv projection of its normalised block input.
    captured = []
    hooks = [b.attn.qkv.register_forward_hook(lambda m, i, o: captured.append(o)) for b in reference.blocks]
    with torch.no_grad():
        reference(x)
    for h in hooks:
        h.remove()
    for layer, qkv in enumerate(captured):
        v = qkv.view(2, qkv.shape[1], 3, 2, 8)[:, :, 2]  # (B, T, H, hd)
        expected = v.norm(dim=-1).gather(1, sinks.token[:, layer][:, None, :])[:, 0]  # (B, H)
        torch.testing.assert_close(sinks.value_norm[:, layer], expected, rtol=0, atol=1e-5)


def sign_max(tensor):  # test-time-registers shared/utils.py @ fd81fd22
    pos_max = torch.max(tensor)
    neg_max = torch.min(tensor)
    return pos_max if abs(pos_max) > abs(neg_max) else neg_max


def activate_on_registers(module, input, output, num_registers, neuron_indices, scale=1.0):
    """test-time-registers shared/hook_fn.py @ fd81fd22 with normal_values="zero", as a forward hook on mlp.act."""
    output[0, -num_registers:, neuron_indices] = scale * sign_max(output[0, :, neuron_indices]).unsqueeze(0).expand(
        num_registers, -1)
    output[0, 1:-num_registers, neuron_indices] = 0


def test_test_time_registers_match_the_authors_hooks_on_timm():
    torch.manual_seed(0)
    args = {k: v for k, v in ARGS.items() if k != "reg_tokens"}  # CLS only: their hook zeroes tokens 1:-R
    reference = timm.create_model("vit_base_patch16_224", pretrained=False, **args).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.3)
    for block in reference.blocks:
        block.attn.fused_attn = False
    state = reference.state_dict()
    ours = ViT(config_from_timm("vit_base_patch16_224", state, {"num_heads": 2, "img_size": 32}))
    ours.load_state_dict(state_dict_from_timm(state), strict=True)
    ours.eval()
    neurons, R = {0: [3, 17], 2: [40]}, 2
    x = images(1, seed=3)
    hooks = [reference.blocks[layer].mlp.act.register_forward_hook(
        lambda m, i, o, idx=idx: activate_on_registers(m, i, o, R, idx)) for layer, idx in neurons.items()]
    attentions = []
    hooks += [b.attn.attn_drop.register_forward_hook(lambda m, i, o: attentions.append(i[0])) for b in reference.blocks]
    with torch.no_grad():
        tokens = reference.norm_pre(reference._pos_embed(reference.patch_embed(x)))
        tokens = torch.cat([tokens, tokens.new_zeros(1, R, tokens.shape[-1])], dim=1)
        for block in reference.blocks:
            tokens = block(tokens)
        expected_logits = reference.forward_head(reference.norm(tokens)[:, :-R])
        logits, mine, final = with_test_time_registers(ours, x, neurons, R, output_attentions=True)
    for h in hooks:
        h.remove()
    torch.testing.assert_close(final, tokens, rtol=0, atol=1e-4)
    torch.testing.assert_close(logits, expected_logits, rtol=0, atol=1e-4)
    for a, b in zip(mine, attentions, strict=True):
        assert a.shape == (1, 2, 1 + 16 + R, 1 + 16 + R)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
