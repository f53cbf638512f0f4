"""The mechanism analyses on the 2025-26 families (issue 24: every new computation runs on each family the project
opens): timm's own EVA-02 (interleaved rotary positions, SwiGLU with its inner norm), DINOv3 (axial rotary
positions, registers, layer scale), Perception Encoder spatial (PE's rotary positions, norm_pre, no final norm) and
AIMv2 (RMSNorm, bias-free SwiGLU, no class token), each with a classifier, are the references. Heads are zeroed or
patched in timm by pre-hooks written here on ``attn.proj``'s input, its attentions caught on ``attn_drop``; a
non-square input checks that the rotary positions follow the grid.
"""

import pytest
import torch
from parity_helpers import capture_inputs, randomize

from vit.explain import mechanism
from vit.sources.open import open_source

timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing timm takes seconds

FAMILIES = {"EVA-02": "eva02_tiny_patch14_224", "DINOv3": "vit_small_patch16_dinov3_qkvb",
            "PE-spatial": "vit_pe_spatial_tiny_patch16_512", "AIMv2": "aimv2_large_patch14_224"}
HD = 16  # 32 channels, 2 heads


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request, tmp_path_factory):
    timm.layers.set_fused_attn(False)  # the explicit path, so attn_drop sees the probabilities
    try:
        torch.manual_seed(0)
        reference = timm.create_model(FAMILIES[request.param], pretrained=False, img_size=32, patch_size=8,
                                      embed_dim=32, depth=3, num_heads=2, num_classes=5, dynamic_img_size=True)
    finally:
        timm.layers.set_fused_attn(True)
    reference = randomize(reference)
    folder = tmp_path_factory.mktemp("family") / "model"
    timm.models.save_for_hf(reference, folder, model_args=dict(num_heads=2, img_size=32), safe_serialization=True)
    ours = open_source(folder).model
    assert ours.head is not None
    return reference, ours


def images(height: int = 32, width: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(seed))


def timm_logits(model, x, edits=None):
    """timm's logits with ``edits[layer](proj input (B, T, H*hd)) -> edited`` applied by pre-hooks."""
    handles = [model.blocks[layer].attn.proj.register_forward_pre_hook(lambda m, args, fn=fn: (fn(args[0]),)
                                                                        + args[1:])
               for layer, fn in (edits or {}).items()]
    try:
        with torch.no_grad():
            return model(x)
    finally:
        for handle in handles:
            handle.remove()


def proj_inputs(model, x) -> list[torch.Tensor]:
    _, seen = capture_inputs([block.attn.proj for block in model.blocks], lambda: model(x))
    return seen


def zero_head(head):
    def fn(inp):
        inp = inp.clone()
        inp[..., head * HD:(head + 1) * HD] = 0
        return inp
    return fn


@pytest.mark.parametrize("size", [(32, 32), (48, 24)])
def test_the_walk_ends_where_the_model_ends(pair, size):
    reference, ours = pair
    x = images(*size)
    with torch.no_grad():
        states = mechanism.hidden_states(ours, x)
        torch.testing.assert_close(ours.classify(states[:, -1]), timm_logits(reference, x), rtol=0, atol=1e-5)


def test_zero_ablation_and_its_grid_equal_timm_with_the_heads_outputs_zeroed(pair):
    reference, ours = pair
    x = images(48, 24)
    with torch.no_grad():
        logits, _ = mechanism.ablate_heads(ours, x, [(0, 1), (2, 0)])
        in_weights, _ = mechanism.ablated_copy(ours, [(0, 1), (2, 0)])(x)  # what the explorer draws every map with
        grid = mechanism.ablation_grid(ours, x, torch.tensor([1, 3]))
    expected = timm_logits(reference, x, {0: zero_head(1), 2: zero_head(0)})
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(in_weights, expected, rtol=0, atol=1e-5)
    base = timm_logits(reference, x)
    for layer in range(3):
        for head in range(2):
            change = (timm_logits(reference, x, {layer: zero_head(head)}) - base)[torch.arange(2), torch.tensor([1, 3])]
            torch.testing.assert_close(grid[:, layer, head], change, rtol=0, atol=1e-5)


def test_a_mean_ablated_copy_equals_timm_with_the_heads_outputs_set_to_their_means(pair):
    """Mean ablation in the weights (what the explorer draws every map with) on rotary models at a non-square
    size: timm with those heads' proj inputs replaced, per position, by their mean over reference images."""
    reference, ours = pair
    x, references = images(48, 24), torch.cat([images(48, 24, seed=5), images(48, 24, seed=6)])
    seen = proj_inputs(reference, references)

    def to_mean(layer, head):
        def fn(inp):
            inp = inp.clone()
            inp[..., head * HD:(head + 1) * HD] = seen[layer].mean(0)[..., head * HD:(head + 1) * HD]
            return inp
        return fn

    means = mechanism.mean_contexts(ours, references)
    with torch.no_grad():
        in_weights, _ = mechanism.ablated_copy(ours, [(0, 1), (2, 0)], "mean", means)(x)
        walked, _ = mechanism.ablate_heads(ours, x, [(0, 1), (2, 0)], "mean", means)
    expected = timm_logits(reference, x, {0: to_mean(0, 1), 2: to_mean(2, 0)})
    torch.testing.assert_close(in_weights, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(walked, expected, rtol=0, atol=1e-5)


def test_direct_logit_attribution_sums_to_timms_logit(pair):
    reference, ours = pair
    x = images()
    with torch.no_grad():
        dla = mechanism.direct_logit_attribution(ours, x, torch.tensor([0, 4]))
    expected = timm_logits(reference, x)[torch.arange(2), torch.tensor([0, 4])]
    torch.testing.assert_close(dla.logit, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(dla.total(), expected, rtol=0, atol=1e-4)


def test_patching_one_head_equals_timm_with_the_clean_runs_head_patched_in(pair):
    reference, ours = pair
    clean, corrupted = images(seed=1), images(seed=2)
    with torch.no_grad():
        patched = mechanism.patch_heads(ours, clean, corrupted, a=2, b=3)
    clean_inputs = proj_inputs(reference, clean)
    for layer, head in [(0, 0), (1, 1), (2, 1)]:
        s = slice(head * HD, (head + 1) * HD)

        def patch(inp, layer=layer, s=s):
            inp = inp.clone()
            inp[..., s] = clean_inputs[layer][..., s]
            return inp

        logits = timm_logits(reference, corrupted, {layer: patch})
        torch.testing.assert_close(patched.patched[:, layer, head], logits[:, 2] - logits[:, 3], rtol=0, atol=1e-5)


def test_attention_sinks_read_timms_own_attention_and_need_the_grid(pair):
    reference, ours = pair
    x = images(48, 24)
    _, attentions = capture_inputs([block.attn.attn_drop for block in reference.blocks], lambda: reference(x))
    with torch.no_grad():
        states = mechanism.hidden_states(ours, x)
        if ours.config.rope != "none":
            with pytest.raises(mechanism.MechanismError, match="patch grid must be given"):
                mechanism.sink_stats(ours, states)
        sinks = mechanism.sink_stats(ours, states, ours.patch_grid(48, 24))
    expected = torch.stack([a.mean(dim=2).max(dim=-1).values for a in attentions], dim=1)  # (B, L, H)
    torch.testing.assert_close(sinks.mass, expected, rtol=0, atol=1e-5)


def test_test_time_registers_are_refused_in_one_line_for_rotary_models(pair):
    _, ours = pair  # AIMv2 has no rotary positions, but its SwiGLU has no fc1-GELU-fc2 neurons either
    with pytest.raises(mechanism.MechanismError, match="rotary positions|fc1-GELU-fc2"):  # EVA-02: SwiGLU first
        mechanism.with_test_time_registers(ours, images(), {0: [1]})
