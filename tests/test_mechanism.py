"""Logit lens, direct logit attribution, head ablation and activation patching (vit.explain.mechanism.components).

References: a decomposition computed by hand in the test; HF transformers' own ViT (eager attention) with
each head's output zeroed, replaced by a mean or patched through forward hooks written here on its
``attention.o_proj`` input (transformers 5 dropped ``head_mask``; zeroing a head's slice of the projection's
input is what it did); residual patching through a pre-hook on HF's ``ViTLayer``.
"""

import contextlib
import dataclasses

import pytest
import torch

from vit.explain.mechanism.components import (
    MechanismError,
    ablate_heads,
    ablated_copy,
    ablation_grid,
    direct_logit_attribution,
    hidden_states,
    logit_lens,
    mean_contexts,
    parse_heads,
    patch_heads,
    patch_residuals,
)
from vit.model import ViT, ViTConfig

CONFIG = ViTConfig(image_size=16, patch_size=4, num_channels=3, num_classes=5, hidden_size=32, num_layers=3,
                   num_heads=4, mlp_size=64)
EVERY_OPTION = dataclasses.replace(CONFIG, distillation_token=True, distillation_head=True, num_register_tokens=2,
                                   layer_scale=0.5, pooling="cls+avg", prefix_positions="cls")
AVG_POOLED = dataclasses.replace(CONFIG, num_register_tokens=3, pooling="avg", fc_norm=True, prefix_positions="none")
# AIMv2's layout: RMSNorm everywhere (no centring, no offsets), no class token, mean pooling, bias-free SwiGLU.
AIMV2 = dataclasses.replace(CONFIG, class_token=False, pooling="avg", norm="rms", embed_norm=True, qkv_bias=False,
                            proj_bias=False, gated_mlp=True, activation="silu")


def random_vit(config: ViTConfig = CONFIG, seed: int = 0) -> ViT:
    torch.manual_seed(seed)
    model = ViT(config).eval()
    with torch.no_grad():  # zero biases and unit norms would hide mistakes
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name or ".ls" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def images(batch: int = 1, size: tuple[int, int] = (16, 16), seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, *size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("config", [CONFIG, EVERY_OPTION, AVG_POOLED, AIMV2])
def test_the_walk_gives_the_models_own_logits(config):
    model = random_vit(config)
    x = images(2, (12, 16))
    with torch.no_grad():
        states = hidden_states(model, x)
        torch.testing.assert_close(model.classify(states[:, -1]), model(x)[0], rtol=0, atol=1e-5)
        logits, attentions = ablate_heads(model, x, [], output_attentions=True)
        expected_logits, expected = model(x, output_attentions=True)
    torch.testing.assert_close(logits, expected_logits, rtol=0, atol=1e-5)
    for mine, theirs in zip(attentions, expected, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)


@pytest.mark.parametrize("config", [CONFIG, EVERY_OPTION, AVG_POOLED, AIMV2])
def test_direct_logit_attribution_sums_to_the_logit(config):
    model = random_vit(config)
    x = images(3, (12, 16))
    dla = direct_logit_attribution(model, x, torch.tensor([0, 3, 4]))
    assert dla.heads.shape == (3, 3, 4) and dla.mlps.shape == (3, 3)
    torch.testing.assert_close(dla.logit, model(x)[0][torch.arange(3), torch.tensor([0, 3, 4])])
    torch.testing.assert_close(dla.total(), dla.logit, rtol=0, atol=1e-5)


def test_direct_logit_attribution_matches_a_hand_computed_decomposition():
    """One layer, CLS pooling: each head's output at CLS, centred, divided by the final residual's scale,
    times the norm weight and the class row of the head, computed here step by step."""
    model = random_vit(dataclasses.replace(CONFIG, num_layers=1))
    x = images(1)
    dla = direct_logit_attribution(model, x, 2)
    block = model.blocks[0]
    with torch.no_grad():
        tokens = model.embed(x)[0]  # (T, D)
        n1 = torch.nn.functional.layer_norm(tokens, (32,), block.norm1.weight, block.norm1.bias, block.norm1.eps)
        qkv = n1 @ block.attn.qkv.weight.T + block.attn.qkv.bias
        q, k, v = qkv[:, :32], qkv[:, 32:64], qkv[:, 64:]
        head_outputs = []
        for h in range(4):
            s = slice(8 * h, 8 * h + 8)
            attn = torch.softmax(q[:, s] @ k[:, s].T / 8 ** 0.5, dim=-1)
            head_outputs.append((attn @ v[:, s]) @ block.attn.proj.weight[:, s].T)  # (T, D)
        mid = tokens + sum(head_outputs) + block.attn.proj.bias
        final = mid + block.mlp(block.norm2(mid))
        cls = final[0]
        scale = (cls.var(unbiased=False) + model.norm.eps).sqrt()
        row = model.head.weight[2] * model.norm.weight

        def direct(vector):
            return ((vector - vector.mean()) / scale * row).sum()

        expected = torch.stack([direct(h[0]) for h in head_outputs])
    torch.testing.assert_close(dla.heads[0, 0], expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(dla.embed[0], direct(tokens[0]), rtol=0, atol=1e-5)


def test_logit_lens_reads_the_last_layer_as_the_model_does():
    model = random_vit()
    x = images(2, (12, 16))
    lens = logit_lens(model, x)
    logits = model(x)[0]
    assert lens.token_probs.shape == (2, 4, 1 + 12) and lens.pooled_logits.shape == (2, 4, 5)
    torch.testing.assert_close(lens.pooled_logits[:, -1], logits)
    # CLS pooling: the CLS token's read-out after the last layer is the model's own probability.
    torch.testing.assert_close(lens.token_probs[:, -1, 0], logits.softmax(-1)[torch.arange(2), logits.argmax(-1)])


def test_parse_heads_counts_from_one_and_names_bad_input():
    assert parse_heads("2.3, 1.1", 3, 4) == [(0, 0), (1, 2)]
    with pytest.raises(MechanismError, match="layers 1-3 and heads 1-4"):
        parse_heads("4.1", 3, 4)
    with pytest.raises(MechanismError, match="LAYER.HEAD"):
        parse_heads("2-3", 3, 4)


def test_refusals_are_one_line():
    with pytest.raises(MechanismError, match="classifier head"):
        logit_lens(random_vit(dataclasses.replace(CONFIG, num_classes=0)), images())
    model = random_vit()
    with pytest.raises(MechanismError, match="same shape"):
        patch_heads(model, images(1), images(1, (12, 16)))
    with pytest.raises(MechanismError, match="same input size"):
        ablate_heads(model, images(1, (12, 16)), [(0, 0)], "mean", mean_contexts(model, images(2)))


# --- against HF transformers' ViT with hooks written here ----------------------------------------------

transformers = pytest.importorskip("transformers")


def hf_pair():
    from vit.sources.ports.families.hf import config_from_hf, state_dict_from_hf

    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=3,
                                    num_attention_heads=4, intermediate_size=64, num_labels=5, qkv_bias=True,
                                    layer_norm_eps=1e-12)
    config._attn_implementation = "eager"
    hf = transformers.ViTForImageClassification(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "layernorm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    ours = ViT(config_from_hf(hf.config))
    ours.load_state_dict(state_dict_from_hf(hf.state_dict(), ours.config.num_layers), strict=True)
    return hf, ours.eval()


@pytest.fixture(scope="module")
def pair():
    return hf_pair()


@contextlib.contextmanager
def hf_hooked(hf, replace_heads=None, replace_tokens=None):
    """HF's model with ``replace_heads[layer] = fn(o_proj input (B, T, H*hd)) -> edited`` and
    ``replace_tokens[layer] = fn(layer input) -> edited``, as forward pre-hooks, for the ``with`` block."""
    handles = []
    for layer, fn in (replace_heads or {}).items():
        handles.append(hf.vit.layers[layer].attention.o_proj.register_forward_pre_hook(
            lambda module, args, fn=fn: (fn(args[0]),) + args[1:]))
    for layer, fn in (replace_tokens or {}).items():
        handles.append(hf.vit.layers[layer].register_forward_pre_hook(
            lambda module, args, fn=fn: (fn(args[0]),) + args[1:]))
    try:
        yield hf
    finally:
        for handle in handles:
            handle.remove()


def hf_logits(hf, x, replace_heads=None, replace_tokens=None):
    """HF's logits with ``hf_hooked``'s edits."""
    with hf_hooked(hf, replace_heads, replace_tokens), torch.no_grad():
        return hf(pixel_values=x).logits


def hf_o_proj_inputs(hf, x):
    """Each layer's o_proj input ``(B, T, H*hd)`` on ``x``, captured by hooks."""
    seen = {}
    handles = [layer.attention.o_proj.register_forward_pre_hook(
        lambda module, args, i=i: seen.__setitem__(i, args[0].clone())) for i, layer in enumerate(hf.vit.layers)]
    with torch.no_grad():
        hf(pixel_values=x)
    for handle in handles:
        handle.remove()
    return seen


def zero_heads(heads, hd=8):
    def fn(inp):
        inp = inp.clone()
        for h in heads:
            inp[..., h * hd:(h + 1) * hd] = 0
        return inp
    return fn


def test_zero_ablation_matches_hf_with_the_heads_outputs_zeroed(pair):
    hf, ours = pair
    x = images(2)
    expected = hf_logits(hf, x, {1: zero_heads([2]), 2: zero_heads([0, 3])})
    logits, _ = ablate_heads(ours, x, [(1, 2), (2, 0), (2, 3)])
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    assert not torch.allclose(logits, hf_logits(hf, x), atol=1e-4)


def test_a_zero_ablated_copy_is_hf_with_the_heads_outputs_zeroed_and_leaves_the_model_alone(pair):
    """What the explorer draws every map with when heads are switched off (ablated_copy): the same logits as HF
    with those heads' o_proj inputs zeroed, and the same attentions as ablate_heads."""
    hf, ours = pair
    x = images(2)
    heads = [(1, 2), (2, 0), (2, 3)]
    expected = hf_logits(hf, x, {1: zero_heads([2]), 2: zero_heads([0, 3])})
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    ablated = ablated_copy(ours, heads)
    with torch.no_grad():
        logits, attentions = ablated(x, output_attentions=True)
        _, walked = ablate_heads(ours, x, heads, output_attentions=True)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    for mine, theirs in zip(attentions, walked, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)
    assert all(torch.equal(v, before[k]) for k, v in ours.state_dict().items()), "the original model was changed"
    mine, theirs = dict(ablated.named_parameters()), dict(ours.named_parameters())
    new = {name for name, p in mine.items() if p.data_ptr() != theirs[name].data_ptr()}
    assert new == {"blocks.1.attn.proj.weight", "blocks.2.attn.proj.weight"}  # the rest is shared, not copied
    with pytest.raises(MechanismError, match=r"head \(3, 0\) does not exist: the model has layers 0 to 2"):
        ablated_copy(ours, [(3, 0)])


def mean_heads(means, heads, hd=8):
    """Set the heads' slices of an o_proj input to ``means`` (T, H*hd), their mean over reference images."""
    def fn(inp):
        inp = inp.clone()
        for h in heads:
            inp[..., h * hd:(h + 1) * hd] = means[..., h * hd:(h + 1) * hd]
        return inp
    return fn


def test_a_mean_ablated_copy_is_hf_with_the_heads_outputs_set_to_their_means(pair):
    """What the explorer draws every map with under mean ablation: HF's logits, and the input gradient that every
    gradient map starts from, with those heads' o_proj inputs replaced per position by their mean over reference
    images (the means captured from HF itself); the same attentions as ablate_heads."""
    hf, ours = pair
    x, reference = images(2), images(3, seed=7)
    heads = [(1, 2), (2, 0), (2, 3)]
    seen = hf_o_proj_inputs(hf, reference)
    edits = {1: mean_heads(seen[1].mean(0), [2]), 2: mean_heads(seen[2].mean(0), [0, 3])}
    means = mean_contexts(ours, reference)
    ablated = ablated_copy(ours, heads, "mean", means)
    with torch.no_grad():
        logits, attentions = ablated(x, output_attentions=True)
        _, walked = ablate_heads(ours, x, heads, "mean", means, output_attentions=True)
    expected = hf_logits(hf, x, edits)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    assert not torch.allclose(logits, hf_logits(hf, x, {1: zero_heads([2]), 2: zero_heads([0, 3])}), atol=1e-4)
    for mine, theirs in zip(attentions, walked, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)

    x_ours, x_hf = x.clone().requires_grad_(), x.clone().requires_grad_()
    ablated(x_ours)[0][:, 3].sum().backward()
    with hf_hooked(hf, edits):
        hf(pixel_values=x_hf).logits[:, 3].sum().backward()
    torch.testing.assert_close(x_ours.grad, x_hf.grad, rtol=0, atol=1e-5)


def test_a_mean_ablated_copys_head_attribution_still_sums_to_its_logit(pair):
    """The means enter as a per-position bias of the attention output: direct logit attribution counts them there."""
    _, ours = pair
    ablated = ablated_copy(ours, [(0, 1), (2, 2)], "mean", mean_contexts(ours, images(3, seed=7)))
    dla = direct_logit_attribution(ablated, images(2), torch.tensor([0, 4]))
    with torch.no_grad():
        logits = ablated(images(2))[0][torch.arange(2), torch.tensor([0, 4])]
    torch.testing.assert_close(dla.logit, logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(dla.total(), logits, rtol=0, atol=1e-4)
    assert torch.all(dla.heads[:, 0, 1] == 0) and torch.all(dla.heads[:, 2, 2] == 0)  # the ablated heads' columns


def test_a_mean_ablated_copy_refuses_another_input_size_and_wrong_means():
    model = random_vit()
    means = mean_contexts(model, images(2))  # 17 tokens
    ablated = ablated_copy(model, [(0, 0)], "mean", means)
    with pytest.raises(MechanismError, match="mean-ablated at 17 token positions cannot run on 13 tokens"):
        ablated(images(1, (12, 16)))
    with pytest.raises(MechanismError, match="mean_contexts"):
        ablated_copy(model, [(0, 0)], "mean")
    with pytest.raises(MechanismError, match="mean_contexts"):
        ablated_copy(model, [(0, 0)], "mean", means[:, :, :2])
    with pytest.raises(MechanismError, match="unknown ablation"):
        ablated_copy(model, [(0, 0)], "random")
    with pytest.raises(MechanismError, match="^means are read by mode='mean' only"):  # not silently ignored
        ablate_heads(model, images(1), [(0, 0)], "zero", means)


def test_ablation_grids_match_hf_one_head_at_a_time(pair):
    hf, ours = pair
    x, reference = images(2), images(3, seed=7)
    base = hf_logits(hf, x)
    classes = torch.tensor([1, 4])
    means = hf_o_proj_inputs(hf, reference)
    zero = ablation_grid(ours, x, classes)
    mean = ablation_grid(ours, x, classes, "mean", mean_contexts(ours, reference))
    for layer in range(3):
        for head in range(4):
            s = slice(8 * head, 8 * head + 8)

            def with_mean(inp, layer=layer, s=s):
                inp = inp.clone()
                inp[..., s] = means[layer].mean(0)[..., s]
                return inp

            for grid, fn in ((zero, zero_heads([head])), (mean, with_mean)):
                expected = (hf_logits(hf, x, {layer: fn}) - base)[torch.arange(2), classes]
                torch.testing.assert_close(grid[:, layer, head], expected, rtol=0, atol=1e-5)


def test_head_patching_matches_hf_hooks(pair):
    hf, ours = pair
    clean, corrupted = images(2, seed=3), images(2, seed=4)
    a, b = torch.tensor([0, 1]), torch.tensor([2, 3])
    result = patch_heads(ours, clean, corrupted, a, b)
    clean_inputs = hf_o_proj_inputs(hf, clean)
    for layer in range(3):
        for head in range(4):
            s = slice(8 * head, 8 * head + 8)

            def patch(inp, layer=layer, s=s):
                inp = inp.clone()
                inp[..., s] = clean_inputs[layer][..., s]
                return inp

            logits = hf_logits(hf, corrupted, {layer: patch})
            expected = logits[torch.arange(2), a] - logits[torch.arange(2), b]
            torch.testing.assert_close(result.patched[:, layer, head], expected, rtol=0, atol=1e-5)
    clean_logits = hf_logits(hf, clean)
    torch.testing.assert_close(result.clean, clean_logits[torch.arange(2), a] - clean_logits[torch.arange(2), b])
    # Patching every head of the last layer is not the clean run, but the recovered fraction is well defined.
    assert result.recovered().shape == (2, 3, 4)


def test_residual_patching_matches_hf_hooks(pair):
    hf, ours = pair
    clean, corrupted = images(1, seed=5), images(1, seed=6)
    result = patch_residuals(ours, clean, corrupted, 1, 2)
    assert result.patched.shape == (1, 3, 17)
    clean_inputs = {}
    handles = [layer.register_forward_pre_hook(lambda m, args, i=i: clean_inputs.__setitem__(i, args[0].clone()))
               for i, layer in enumerate(hf.vit.layers)]
    hf_logits(hf, clean)
    for handle in handles:
        handle.remove()
    for layer, position in [(0, 0), (0, 5), (1, 16), (2, 0), (2, 9)]:
        def patch(inp, layer=layer, position=position):
            inp = inp.clone()
            inp[:, position] = clean_inputs[layer][:, position]
            return inp

        logits = hf_logits(hf, corrupted, replace_tokens={layer: patch})
        torch.testing.assert_close(result.patched[0, layer, position], logits[0, 1] - logits[0, 2],
                                   rtol=0, atol=1e-5)
    assert result.recovered().shape == (1, 3, 17)


def test_work_past_the_memory_bound_is_refused_before_it_starts(monkeypatch):
    import vit.explain.mechanism.forward_reads as mechanism  # where check_budget reads the bound

    model = random_vit()
    monkeypatch.setattr(mechanism, "MAX_ELEMENTS", 1000)
    for run in (lambda: direct_logit_attribution(model, images(2)), lambda: ablation_grid(model, images(2)),
                lambda: hidden_states(model, images(2))):
        with pytest.raises(MechanismError, match="GiB bound\\); use fewer images or a smaller input size"):
            run()


def test_models_the_walk_cannot_reproduce_are_refused_in_one_line():
    with pytest.raises(MechanismError, match="this project's ViT"):
        hidden_states(torch.nn.Linear(2, 2), images())
    with pytest.raises(MechanismError, match="call model.eval"):
        hidden_states(random_vit().train(), images())


def test_the_logit_lens_of_an_attention_pooled_model_reads_each_token_through_its_probe():
    model = random_vit(dataclasses.replace(CONFIG, class_token=False, pooling="map", prefix_positions="none"))
    x = images(2, (12, 16))
    lens = logit_lens(model, x, torch.tensor([1, 3]))
    states = hidden_states(model, x)  # (B, L + 1, T, D)
    b, layer, t = 1, 2, 5
    T = states.shape[2]
    with torch.no_grad():  # what the model outputs when every token equals token t: the probe's softmax is uniform
        expected = model.classify(states[b, layer, t].expand(1, T, -1)).softmax(-1)[0, 3]
    torch.testing.assert_close(lens.token_probs[b, layer, t], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lens.pooled_logits[:, -1], model(x)[0], rtol=1e-5, atol=1e-5)


def test_direct_logit_attribution_refuses_post_norm_blocks_whose_stream_is_no_sum_of_parts():
    # The MNIST tutorial's blocks (nn.TransformerEncoderLayer, norm_first=False) normalise after each sum.
    model = random_vit(dataclasses.replace(CONFIG, post_norm=True, activation="relu", final_norm=False))
    with pytest.raises(MechanismError, match="post-norm"):
        direct_logit_attribution(model, images())
    lens = logit_lens(model, images())  # reads the stream as it is: still exact at the last layer
    assert torch.allclose(lens.pooled_logits[:, -1], model(images())[0], atol=1e-5)


DEIT = dataclasses.replace(CONFIG, distillation_token=True, distillation_head=True)


def logits_with_torch_hooks(model: ViT, x: torch.Tensor, block_input=None, proj_input=None) -> torch.Tensor:
    """``model(x)`` with plain torch forward pre-hooks (a TransformerLens-style loop, one forward per cell):
    ``block_input = (layer, fn)`` edits that block's input, ``proj_input = (layer, fn)`` its ``attn.proj`` input."""
    handles = []
    if block_input is not None:
        layer, fn = block_input
        handles.append(model.blocks[layer].register_forward_pre_hook(lambda m, args: (fn(args[0]), *args[1:])))
    if proj_input is not None:
        layer, fn = proj_input
        handles.append(model.blocks[layer].attn.proj.register_forward_pre_hook(lambda m, args: (fn(args[0]),)))
    try:
        with torch.no_grad():
            return model(x)[0]
    finally:
        for handle in handles:
            handle.remove()


def inputs_of(model: ViT, x: torch.Tensor, module) -> dict[int, torch.Tensor]:
    """Each layer's input to ``module(block)`` in one plain forward, through torch pre-hooks."""
    seen = {}
    handles = [module(block).register_forward_pre_hook(lambda m, args, i=i: seen.__setitem__(i, args[0].clone()))
               for i, block in enumerate(model.blocks)]
    logits_with_torch_hooks(model, x)
    for handle in handles:
        handle.remove()
    return seen


@pytest.mark.parametrize("config", [CONFIG, DEIT, AVG_POOLED], ids=["cls", "deit-two-heads", "avg"])
def test_batched_grids_equal_one_forward_per_cell_with_torch_hooks(config, chunk=3):
    """Every cell of the three grids, batched ``chunk`` copies at a time (3 divides neither 2 x 4 heads nor
    2 x T positions), against a loop of single forwards edited by plain torch hooks, on a non-square input."""
    model = random_vit(config)
    clean, corrupted, reference = images(2, (8, 12), seed=7), images(2, (8, 12), seed=8), images(3, (8, 12), seed=9)
    a, b, classes = torch.tensor([1, 0]), torch.tensor([2, 4]), torch.tensor([3, 1])
    L, H, hd, T = 3, 4, 8, model.num_prefix_tokens + 6
    residual = patch_residuals(model, clean, corrupted, a, b, chunk=chunk).patched
    heads = patch_heads(model, clean, corrupted, a, b, chunk=chunk).patched
    zero = ablation_grid(model, clean, classes, chunk=chunk)
    mean = ablation_grid(model, clean, classes, "mean", mean_contexts(model, reference), chunk=chunk)
    clean_blocks = inputs_of(model, clean, lambda block: block)
    clean_proj = inputs_of(model, clean, lambda block: block.attn.proj)
    reference_proj = inputs_of(model, reference, lambda block: block.attn.proj)
    base = logits_with_torch_hooks(model, clean)
    for i in range(2):
        def diff(logits: torch.Tensor, i: int = i) -> torch.Tensor:
            return logits[0, a[i]] - logits[0, b[i]]

        for layer in range(L):
            for position in range(T):
                def put(t, layer=layer, position=position, i=i):
                    t = t.clone()
                    t[:, position] = clean_blocks[layer][i, position]
                    return t

                expected = diff(logits_with_torch_hooks(model, corrupted[i:i + 1], block_input=(layer, put)))
                torch.testing.assert_close(residual[i, layer, position], expected, rtol=0, atol=1e-5)
            for head in range(H):
                cols = slice(head * hd, (head + 1) * hd)

                def set_head(value, layer=layer, cols=cols):
                    def edit(t):
                        t = t.clone()
                        t[..., cols] = value(t)[..., cols]
                        return t
                    return layer, edit

                patched = logits_with_torch_hooks(model, corrupted[i:i + 1], proj_input=set_head(
                    lambda t, layer=layer, i=i: clean_proj[layer][i:i + 1]))
                torch.testing.assert_close(heads[i, layer, head], diff(patched), rtol=0, atol=1e-5)
                zeroed = logits_with_torch_hooks(model, clean[i:i + 1], proj_input=set_head(torch.zeros_like))
                torch.testing.assert_close(zero[i, layer, head], (zeroed - base[i])[0, classes[i]], rtol=0, atol=1e-5)
                averaged = logits_with_torch_hooks(model, clean[i:i + 1], proj_input=set_head(
                    lambda t, layer=layer: reference_proj[layer].mean(0, keepdim=True)))
                torch.testing.assert_close(mean[i, layer, head], (averaged - base[i])[0, classes[i]], rtol=0,
                                           atol=1e-5)


@pytest.mark.parametrize("grid", ["ablation", "heads", "residuals"])
def test_a_followed_grid_runs_batches_of_at_most_progress_flops_of_work(grid, monkeypatch):
    # A page's Stop is heard between batches: 32 copies of a ViT-B/16 at 609 tokens were 30-50 s of 2 cores.
    from vit.costs.bounds import forward_flops
    from vit.explain.mechanism import interventions as mechanism  # where the grids batch their copies

    model = random_vit()
    one = forward_flops(model.config, model.num_prefix_tokens + 16)
    monkeypatch.setattr(mechanism, "PROGRESS_FLOPS", 3 * one)
    sizes = []
    run_from = mechanism._run_from
    monkeypatch.setattr(mechanism, "_run_from", lambda model, x, *a, **k: sizes.append(len(x)) or run_from(
        model, x, *a, **k))
    run = {"ablation": lambda **k: ablation_grid(model, images(1), **k),
           "heads": lambda **k: patch_heads(model, images(1), images(1, seed=2), **k),
           "residuals": lambda **k: patch_residuals(model, images(1), images(1, seed=2), **k)}[grid]
    run(progress=lambda done, total: None)
    assert sizes and max(sizes) == 3  # each copy is at most one forward's work
    sizes.clear()
    run()  # not followed: as many copies as the memory bound allows
    assert max(sizes) > 3


def test_grids_report_progress_after_each_batch():
    model = random_vit()
    seen = []
    patch_residuals(model, images(1), images(1, seed=2), chunk=7, progress=lambda done, total: seen.append((done,
                                                                                                          total)))
    per_layer = model.num_prefix_tokens + 16  # 17 positions: batches of 7, 7 and 3 per layer
    assert seen == [(0, 3 * per_layer)] + [(layer * per_layer + done, 3 * per_layer)  # the total first, then each batch
                                           for layer in range(3) for done in (7, 14, 17)]
    with pytest.raises(MechanismError, match="positive number of copies"):
        ablation_grid(model, images(1), chunk=0)
