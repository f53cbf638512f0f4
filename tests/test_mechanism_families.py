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

from vit.explain.mechanism import components as mechanism
from vit.explain.mechanism import phenomena
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
                phenomena.sink_stats(ours, states)
        sinks = phenomena.sink_stats(ours, states, ours.patch_grid(48, 24))
    expected = torch.stack([a.mean(dim=2).max(dim=-1).values for a in attentions], dim=1)  # (B, L, H)
    torch.testing.assert_close(sinks.mass, expected, rtol=0, atol=1e-5)


def test_test_time_registers_are_refused_in_one_line_for_rotary_models(pair):
    _, ours = pair  # AIMv2 has no rotary positions, but its SwiGLU has no fc1-GELU-fc2 neurons either
    with pytest.raises(mechanism.MechanismError, match="rotary positions|fc1-GELU-fc2"):  # EVA-02: SwiGLU first
        phenomena.with_test_time_registers(ours, images(), {0: [1]})


# --- NaFlex: each image on its own grid at its aspect (issue 46) ----------------------------------------------------
# A 40 x 24 px input is the 5 x 3 grid NaFlex gives a 50 x 30 photo at 16 patches of 8 px (test below): the square
# 4 x 4 position table resized to a non-square grid, nothing padded. timm's naflexvit_* are the classifiers (its
# *_gap averages the patches, registers left out: linear, so DLA applies; its *_map probe skips the register and is
# not); HF's Siglip2VisionModel has no classifier, so its heads are checked through the pooled embedding.

NAFLEX = {"naflexvit gap": "naflexvit_so150m2_patch16_reg1_gap", "naflexvit map": "naflexvit_so150m2_patch16_reg1_map"}
NAFLEX_SIZE = (24, 40)  # (height, width)


def test_the_naflex_size_is_a_native_aspect_grid():
    from test_siglip2_naflex_parity import noise_image

    from vit.core.images import naflex_size

    assert naflex_size(*noise_image(50, 30).size[::-1], 8, 16) == NAFLEX_SIZE


@pytest.fixture(scope="module", params=list(NAFLEX))
def naflex_pair(request, tmp_path_factory):
    timm.layers.set_fused_attn(False)
    try:
        torch.manual_seed(0)
        reference = timm.create_model(NAFLEX[request.param], pretrained=False, patch_size=8, embed_dim=32, depth=3,
                                      num_heads=2, num_classes=5, pos_embed_grid_size=(4, 4), qkv_bias=True)
    finally:
        timm.layers.set_fused_attn(True)
    reference = randomize(reference)
    folder = tmp_path_factory.mktemp("naflex") / "model"
    timm.models.save_for_hf(reference, folder, model_args=dict(num_heads=2, patch_size=8, qkv_bias=True),
                            safe_serialization=True)
    ours = open_source(folder).model
    assert ours.config.max_num_patches == 16 and ours.num_prefix_tokens == 1  # one register
    return reference, ours


def timm_token_readout(model, tokens):
    """timm's head reading one token as its whole sequence (its pooling cannot: it drops the register first)."""
    x = model.norm(tokens[:, None])  # (N, 1, D)
    pooled = model.attn_pool(x) if model.attn_pool is not None else x[:, 0]
    return model.head(model.fc_norm(pooled))


def block_outputs(model, x) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """timm's logits and each block's output ``(B, T, D)``, caught by forward hooks."""
    seen = []
    handles = [b.register_forward_hook(lambda m, i, o: seen.append(o)) for b in model.blocks]
    try:
        with torch.no_grad():
            return model(x), seen
    finally:
        for handle in handles:
            handle.remove()


def test_naflex_logit_lens_reads_timms_tokens_through_timms_head(naflex_pair):
    reference, ours = naflex_pair
    x = images(*NAFLEX_SIZE)
    expected, outputs = block_outputs(reference, x)
    with torch.no_grad():
        lens = mechanism.logit_lens(ours, x)
        assert lens.token_probs.shape == (2, 4, 1 + 15)
        torch.testing.assert_close(lens.pooled_logits[:, -1], expected, rtol=0, atol=1e-5)
        for layer, tokens in enumerate(outputs, start=1):
            probs = timm_token_readout(reference, tokens.flatten(0, 1)).softmax(-1).view(2, 16, 5)
            chosen = probs.gather(-1, lens.classes[:, None, None].expand(2, 16, 1))[..., 0]  # (B, T)
            torch.testing.assert_close(lens.token_probs[:, layer], chosen, rtol=0, atol=1e-5)


def test_naflex_zero_and_mean_ablation_and_the_grid_equal_timm_with_the_heads_outputs_edited(naflex_pair):
    reference, ours = naflex_pair
    x = images(*NAFLEX_SIZE)
    references = torch.cat([images(*NAFLEX_SIZE, seed=5), images(*NAFLEX_SIZE, seed=6)])
    seen = proj_inputs(reference, references)

    def to_mean(layer, head):
        def fn(inp):
            inp = inp.clone()
            inp[..., head * HD:(head + 1) * HD] = seen[layer].mean(0)[..., head * HD:(head + 1) * HD]
            return inp
        return fn

    means = mechanism.mean_contexts(ours, references)
    with torch.no_grad():
        zeroed, _ = mechanism.ablate_heads(ours, x, [(0, 1), (2, 0)])
        zeroed_copy, _ = mechanism.ablated_copy(ours, [(0, 1), (2, 0)])(x)
        meaned, _ = mechanism.ablate_heads(ours, x, [(1, 1)], "mean", means)
        meaned_copy, _ = mechanism.ablated_copy(ours, [(1, 1)], "mean", means)(x)
        grid = mechanism.ablation_grid(ours, x, torch.tensor([1, 3]))
    expected = timm_logits(reference, x, {0: zero_head(1), 2: zero_head(0)})
    torch.testing.assert_close(zeroed, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(zeroed_copy, expected, rtol=0, atol=1e-5)
    expected = timm_logits(reference, x, {1: to_mean(1, 1)})
    torch.testing.assert_close(meaned, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(meaned_copy, expected, rtol=0, atol=1e-5)
    base = timm_logits(reference, x)
    for layer in range(3):
        for head in range(2):
            change = (timm_logits(reference, x, {layer: zero_head(head)}) - base)[torch.arange(2), torch.tensor([1, 3])]
            torch.testing.assert_close(grid[:, layer, head], change, rtol=0, atol=1e-5)


def test_naflex_means_of_another_aspect_are_refused_in_one_line(naflex_pair):
    """Another aspect is another grid, so another token count: the means of a portrait do not fit a landscape."""
    _, ours = naflex_pair
    means = mechanism.mean_contexts(ours, images(40, 24))  # 3 x 5 patches on their side
    assert means.shape[1] == 1 + 15
    for call in (lambda: mechanism.ablate_heads(ours, images(24, 48), [(0, 0)], "mean", means),
                 lambda: mechanism.ablated_copy(ours, [(0, 0)], "mean", means)(images(24, 48))):
        with pytest.raises(mechanism.MechanismError, match="same input size|compute the means") as error:
            call()
        assert "\n" not in str(error.value)


def test_naflex_dla_sums_to_timms_logit_where_the_pooling_is_linear_and_refuses_the_probe(naflex_pair):
    reference, ours = naflex_pair
    x = images(*NAFLEX_SIZE)
    if ours.config.pooling == "map":
        with pytest.raises(mechanism.MechanismError, match="not linear") as error:
            mechanism.direct_logit_attribution(ours, x)
        assert "\n" not in str(error.value)
        return
    with torch.no_grad():
        dla = mechanism.direct_logit_attribution(ours, x, torch.tensor([0, 4]))
    expected = timm_logits(reference, x)[torch.arange(2), torch.tensor([0, 4])]
    torch.testing.assert_close(dla.logit, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(dla.total(), expected, rtol=0, atol=1e-4)


def test_naflex_patching_equals_timm_with_the_clean_runs_head_patched_in(naflex_pair):
    reference, ours = naflex_pair
    clean, corrupted = images(*NAFLEX_SIZE, seed=1), images(*NAFLEX_SIZE, seed=2)
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


def test_naflex_sinks_and_norms_read_timms_own_attention_and_tokens(naflex_pair):
    reference, ours = naflex_pair
    x = images(*NAFLEX_SIZE)
    _, attentions = capture_inputs([block.attn.attn_drop for block in reference.blocks], lambda: reference(x))
    _, outputs = block_outputs(reference, x)
    with torch.no_grad():
        states = mechanism.hidden_states(ours, x)
        sinks = phenomena.sink_stats(ours, states)
    expected = torch.stack([a.mean(dim=2).max(dim=-1).values for a in attentions], dim=1)  # (B, L, H)
    torch.testing.assert_close(sinks.mass, expected, rtol=0, atol=1e-5)
    norms = phenomena.token_norms(states)[:, 1:]  # (B, L, T)
    torch.testing.assert_close(norms, torch.stack([o.norm(dim=-1) for o in outputs], dim=1), rtol=0, atol=1e-4)


@pytest.fixture(scope="module")
def siglip2_pair(tmp_path_factory):
    """HF's Siglip2VisionModel (eager attention, 3 layers) and ours from its folder."""
    transformers = pytest.importorskip("transformers")
    from test_siglip2_naflex_parity import VISION

    config = transformers.Siglip2VisionConfig(**{**VISION, "num_hidden_layers": 3})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    reference = randomize(transformers.Siglip2VisionModel(config)).eval()
    folder = tmp_path_factory.mktemp("siglip2") / "model"
    reference.save_pretrained(folder)
    transformers.Siglip2ImageProcessorPil(patch_size=8, max_num_patches=16).save_pretrained(folder)
    return reference, open_source(folder).model


def hf_naflex(model, x, edits=None, **options):
    """HF's output on our pixels ``x`` (B, C, H, W) as its unpadded patch rows, with ``edits[layer](out_proj input
    (B, T, H*hd)) -> edited`` applied by pre-hooks on each layer's ``self_attn.out_proj``."""
    from test_siglip2_naflex_parity import as_patches

    B, _, H, W = x.shape
    patches = torch.stack([as_patches(image, 8) for image in x])  # (B, gh*gw, 8*8*C)
    layers = model.encoder.layers
    handles = [layers[layer].self_attn.out_proj.register_forward_pre_hook(
        lambda m, args, fn=fn: (fn(args[0]),) + args[1:]) for layer, fn in (edits or {}).items()]
    try:
        with torch.no_grad():
            return model(pixel_values=patches, pixel_attention_mask=torch.ones(B, patches.shape[1], dtype=torch.long),
                         spatial_shapes=torch.tensor([[H // 8, W // 8]] * B), **options)
    finally:
        for handle in handles:
            handle.remove()


def test_siglip2_naflex_head_ablation_in_the_weights_equals_hf_with_the_heads_outputs_edited(siglip2_pair):
    """No classifier: the zero- and mean-ablated copies (what the maps are drawn with) give HF's pooled embedding
    with those heads' out_proj inputs zeroed or set to their mean over reference images, and the later layers'
    attentions HF's."""
    reference, ours = siglip2_pair
    x = images(*NAFLEX_SIZE)
    references = torch.cat([images(*NAFLEX_SIZE, seed=5), images(*NAFLEX_SIZE, seed=6)])
    _, seen = capture_inputs([layer.self_attn.out_proj for layer in reference.encoder.layers],
                             lambda: hf_naflex(reference, references))

    def to_mean(inp):
        inp = inp.clone()
        inp[..., :HD] = seen[1].mean(0)[..., :HD]
        return inp

    for heads, mode, edits in [([(0, 1), (2, 0)], "zero", {0: zero_head(1), 2: zero_head(0)}),
                               ([(1, 0)], "mean", {1: to_mean})]:
        means = mechanism.mean_contexts(ours, references) if mode == "mean" else None
        expected = hf_naflex(reference, x, edits, output_attentions=True)
        with torch.no_grad():
            encoding = mechanism.ablated_copy(ours, heads, mode, means).encode(x, output_attentions=True)
        torch.testing.assert_close(encoding.embedding, expected.pooler_output, rtol=0, atol=1e-5)
        assert float((expected.pooler_output - hf_naflex(reference, x).pooler_output).abs().max()) > 1e-3
        for mine, theirs in zip(encoding.attentions, expected.attentions, strict=True):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)


def test_siglip2_naflex_sinks_and_norms_read_hfs_attention_and_hidden_states(siglip2_pair):
    reference, ours = siglip2_pair
    x = images(*NAFLEX_SIZE)
    out = hf_naflex(reference, x, output_attentions=True, output_hidden_states=True)
    with torch.no_grad():
        states = mechanism.hidden_states(ours, x)
        sinks = phenomena.sink_stats(ours, states, (3, 5))
    expected = torch.stack([a.mean(dim=2).max(dim=-1).values for a in out.attentions], dim=1)  # (B, L, H)
    torch.testing.assert_close(sinks.mass, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(phenomena.token_norms(states), torch.stack(out.hidden_states, 1).norm(dim=-1),
                               rtol=0, atol=1e-4)


def test_siglip2_naflex_methods_of_class_logits_refuse_in_one_line(siglip2_pair):
    _, ours = siglip2_pair
    x = images(*NAFLEX_SIZE)
    for call in (lambda: mechanism.logit_lens(ours, x), lambda: mechanism.direct_logit_attribution(ours, x),
                 lambda: mechanism.ablation_grid(ours, x),
                 lambda: mechanism.patch_heads(ours, x, images(*NAFLEX_SIZE, seed=1), 0, 1)):
        with pytest.raises(mechanism.MechanismError, match="no classifier") as error:
            call()
        assert "\n" not in str(error.value)
