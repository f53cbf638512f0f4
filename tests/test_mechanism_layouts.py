"""The mechanism analyses on the attention layouts of issue 46, against timm's own models: BEiT (a relative position
bias per layer, a classifier) and SAM's image encoder (windowed layers beside a global one, decomposed relative
positions, no classifier). Heads are zeroed or patched in timm by pre-hooks on ``attn.proj``'s input, its
attentions caught on ``attn_drop``; SAM's windows are placed on the grid by ``windows_on_grid`` (itself checked
against a hand loop in ``test_layout.py``).
"""

import pytest
import torch
from parity_helpers import capture_inputs, randomize, run_hooked

from vit.explain.mechanism import components as mechanism
from vit.explain.mechanism import phenomena
from vit.explain.methods.attention import windows_on_grid
from vit.sources.open import open_source

timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing timm takes seconds

HD = 16  # 32 channels, 2 heads


def _timm(name: str, **options):
    timm.layers.set_fused_attn(False)  # the explicit path, so attn_drop sees the probabilities
    try:
        torch.manual_seed(0)
        return randomize(timm.create_model(name, pretrained=False, patch_size=8, embed_dim=32, depth=3, num_heads=2,
                                           **options))
    finally:
        timm.layers.set_fused_attn(True)


@pytest.fixture(scope="module")
def beit_folder(tmp_path_factory):
    reference = _timm("beit_base_patch16_224", img_size=32, num_classes=5, use_rel_pos_bias=True, init_values=0.1)
    folder = tmp_path_factory.mktemp("beit") / "model"
    timm.models.save_for_hf(reference, folder, model_args=dict(num_heads=2), safe_serialization=True)
    return reference, folder


@pytest.fixture(scope="module")
def beit(beit_folder):
    reference, folder = beit_folder
    return reference, open_source(folder).model


@pytest.fixture(scope="module")
def sam_checkpoint(tmp_path_factory):
    # a 7 x 7 grid in windows of 3: padded to 9 x 9, the last row and column of windows mostly padding
    reference = _timm("samvit_base_patch16", img_size=56, window_size=3, global_attn_indexes=[1], neck_chans=8,
                      num_classes=0)
    folder = tmp_path_factory.mktemp("sam") / "model"
    timm.models.save_for_hf(reference, folder, model_args=dict(num_heads=2, window_size=3, global_attn_indexes=[1]),
                            safe_serialization=True)
    return reference, open_source(folder)


@pytest.fixture(scope="module")
def sam(sam_checkpoint):
    reference, checkpoint = sam_checkpoint
    return reference, checkpoint.model


def images(size: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(seed))


def timm_run(model, run, edits=None):
    """``run()`` with ``edits[layer](proj input) -> edited`` applied by pre-hooks on timm's ``attn.proj``."""
    handles = [model.blocks[layer].attn.proj.register_forward_pre_hook(lambda m, args, fn=fn: (fn(args[0]),)
                                                                        + args[1:])
               for layer, fn in (edits or {}).items()]
    return run_hooked(handles, run)


def zero_head(head):
    def fn(inp):
        inp = inp.clone()
        inp[..., head * HD:(head + 1) * HD] = 0
        return inp
    return fn


def test_beit_zero_ablation_its_grid_and_a_mean_ablated_copy_equal_timm(beit):
    reference, ours = beit
    x, references = images(32), torch.cat([images(32, seed=5), images(32, seed=6)])
    with torch.no_grad():
        logits, _ = mechanism.ablate_heads(ours, x, [(0, 1), (2, 0)])
        grid = mechanism.ablation_grid(ours, x, torch.tensor([1, 3]))
    torch.testing.assert_close(logits, timm_run(reference, lambda: reference(x), {0: zero_head(1), 2: zero_head(0)}),
                               rtol=0, atol=1e-5)
    base = timm_run(reference, lambda: reference(x))
    for layer in range(3):
        for head in range(2):
            change = timm_run(reference, lambda: reference(x), {layer: zero_head(head)}) - base
            torch.testing.assert_close(grid[:, layer, head], change[torch.arange(2), torch.tensor([1, 3])], rtol=0,
                                       atol=1e-5)
    _, seen = capture_inputs([block.attn.proj for block in reference.blocks], lambda: reference(references))

    def to_mean(inp):
        inp = inp.clone()
        inp[..., HD:] = seen[1].mean(0)[..., HD:]
        return inp

    with torch.no_grad():
        copy, _ = mechanism.ablated_copy(ours, [(1, 1)], "mean", mechanism.mean_contexts(ours, references))(x)
    torch.testing.assert_close(copy, timm_run(reference, lambda: reference(x), {1: to_mean}), rtol=0, atol=1e-5)


def test_beit_direct_logit_attribution_and_patching_equal_timm(beit):
    reference, ours = beit
    clean, corrupted = images(32, seed=1), images(32, seed=2)
    with torch.no_grad():
        dla = mechanism.direct_logit_attribution(ours, clean, torch.tensor([0, 4]))
        patched = mechanism.patch_heads(ours, clean, corrupted, a=2, b=3)
    expected = timm_run(reference, lambda: reference(clean))[torch.arange(2), torch.tensor([0, 4])]
    torch.testing.assert_close(dla.logit, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(dla.total(), expected, rtol=0, atol=1e-4)
    _, clean_inputs = capture_inputs([block.attn.proj for block in reference.blocks], lambda: reference(clean))
    for layer, head in [(0, 0), (2, 1)]:
        s = slice(head * HD, (head + 1) * HD)

        def patch(inp, layer=layer, s=s):
            inp = inp.clone()
            inp[..., s] = clean_inputs[layer][..., s]
            return inp

        logits = timm_run(reference, lambda: reference(corrupted), {layer: patch})
        torch.testing.assert_close(patched.patched[:, layer, head], logits[:, 2] - logits[:, 3], rtol=0, atol=1e-5)


def test_beit_attention_sinks_read_timms_biased_attention(beit):
    reference, ours = beit
    x = images(32)
    _, attentions = capture_inputs([block.attn.attn_drop for block in reference.blocks], lambda: reference(x))
    with torch.no_grad():
        states = mechanism.hidden_states(ours, x)
        with pytest.raises(mechanism.MechanismError, match="patch grid must be given"):
            phenomena.sink_stats(ours, states)
        sinks = phenomena.sink_stats(ours, states, (4, 4))
    expected = torch.stack([a.mean(dim=2).max(dim=-1).values for a in attentions], dim=1)  # (B, L, H)
    torch.testing.assert_close(sinks.mass, expected, rtol=0, atol=1e-5)


def test_sam_attention_sinks_read_timms_windows_placed_on_the_grid(sam):
    reference, ours = sam
    x = images(56)
    blocks = reference.blocks
    (tokens,), attentions = capture_inputs([b.attn.attn_drop for b in blocks], lambda: (
        blocks(reference.patch_embed(x) + reference.pos_embed),))
    _, values = capture_inputs([b.attn.qkv for b in blocks], lambda: blocks(reference.patch_embed(x)
                                                                            + reference.pos_embed))
    placed = [windows_on_grid(a.reshape(-1, 2, *a.shape[1:]), (7, 7), 3) if a.shape[-1] == 9
              else a.reshape(2, 2, 49, 49) for a in attentions]  # (B, H, T, T) each
    with torch.no_grad():
        sinks = phenomena.sink_stats(ours, mechanism.hidden_states(ours, x), (7, 7))
    mass, token = torch.stack([a.mean(dim=2) for a in placed], dim=1).max(dim=-1)  # (B, L, H)
    torch.testing.assert_close(sinks.mass, mass, rtol=0, atol=1e-5)
    assert torch.equal(sinks.token, token)
    # each sink's value vector: the v third of timm's qkv, a windowed layer's put back by timm's window_unpartition
    from timm.models.vision_transformer_sam import window_unpartition

    for layer, (block, inp) in enumerate(zip(blocks, values, strict=True)):
        with torch.no_grad():
            v = block.attn.qkv(inp)[..., 64:]  # (B * nw, 9, 32) or (B, 49, 32)
            if v.shape[1] == 9:
                v = window_unpartition(v.reshape(-1, 3, 3, 32), 3, (7, 7), (9, 9))
            v = v.reshape(2, 49, 2, HD)  # (B, T, H, hd)
        expected = v.norm(dim=-1).gather(1, token[:, layer][:, None]).squeeze(1)  # (B, H)
        torch.testing.assert_close(sinks.value_norm[:, layer], expected, rtol=0, atol=1e-5)


def test_sam_register_neuron_scores_read_timms_mlp_activations(sam):
    """With a threshold of 0 every token is an outlier: each neuron scores its mean |post-GELU activation| over the
    tokens, averaged over the images (test-time-registers' find_register_neurons, no sparsity filter)."""
    reference, ours = sam
    x = images(56)
    blocks = reference.blocks
    _, acts = capture_inputs([b.mlp.drop1 for b in blocks], lambda: blocks(reference.patch_embed(x)
                                                                            + reference.pos_embed))
    with torch.no_grad():
        scores, used = phenomena.register_neuron_scores(ours, x, threshold=0.0)
    expected = torch.stack([a.abs().reshape(2, -1, a.shape[-1]).mean(dim=1).mean(dim=0) for a in acts])  # (L, mlp)
    assert used == 2
    torch.testing.assert_close(scores, expected, rtol=0, atol=1e-5)


def test_sam_zero_ablation_in_the_weights_equals_timm_and_what_has_no_meaning_refuses_in_one_line(sam):
    reference, ours = sam
    x = images(56)
    blocks = reference.blocks
    run = lambda: blocks(reference.patch_embed(x) + reference.pos_embed)  # noqa: E731
    expected, attentions = capture_inputs([b.attn.attn_drop for b in blocks],
                                          lambda: timm_run(reference, run, {0: zero_head(1)}))
    with torch.no_grad():
        _, ours_attentions = mechanism.ablated_copy(ours, [(0, 1)])(x, output_attentions=True)
    for mine, theirs in zip(ours_attentions[1:], attentions[1:], strict=True):  # the layers after the ablated head
        torch.testing.assert_close(mine, theirs.reshape(-1, 2, *theirs.shape[1:]), rtol=0, atol=1e-5)
    refusals = [
        (lambda: mechanism.logit_lens(ours, x), "no classifier"),
        (lambda: mechanism.direct_logit_attribution(ours, x), "no classifier"),
        (lambda: mechanism.ablation_grid(ours, x), "no classifier"),
        (lambda: mechanism.patch_heads(ours, x, images(56, seed=1), 0, 1), "no classifier"),
        (lambda: phenomena.with_test_time_registers(ours, x, {0: [1]}), "within windows"),
    ]
    for call, match in refusals:
        with pytest.raises(mechanism.MechanismError, match=match) as error:
            call()
        assert "\n" not in str(error.value)


def test_sam_mean_ablation_of_a_windowed_and_a_global_head_equals_timm_with_the_means_put_in_by_hand(sam):
    """timm's own window_partition / window_unpartition move its proj inputs between windows and the 7 x 7 grid: the
    mean over the reference images is taken per grid position (padding left out) and put back in the windows."""
    from timm.models.vision_transformer_sam import window_partition, window_unpartition

    reference, ours = sam
    x, references = images(56), torch.cat([images(56, seed=5), images(56, seed=6), images(56, seed=7)])
    blocks = reference.blocks
    run = lambda inputs: lambda: blocks(reference.patch_embed(inputs) + reference.pos_embed)  # noqa: E731
    _, seen = capture_inputs([block.attn.proj for block in blocks], run(references))  # (R * nw, 9, C), (R, 49, C)
    window_mean = window_unpartition(seen[0].view(-1, 3, 3, 32), 3, (7, 7), (9, 9)).mean(0)  # (7, 7, C)
    global_mean = seen[1].mean(0)  # (49, C)

    def to_mean(head, mean, windowed):
        def fn(inp):  # (B * nw, 9, C) in the windowed layer, (B, 49, C) in the global one
            if windowed:
                mean_in = window_partition(mean[None].expand(2, -1, -1, -1), 3)[0].view(-1, 9, 32)
            else:
                mean_in = mean.expand_as(inp)
            inp = inp.clone()
            inp[..., head * HD:(head + 1) * HD] = mean_in[..., head * HD:(head + 1) * HD]
            return inp
        return fn

    expected = timm_run(reference, run(x), {0: to_mean(1, window_mean, True), 1: to_mean(0, global_mean, False)})
    heads, means = [(0, 1), (1, 0)], mechanism.mean_contexts(ours, references)
    assert means.shape == (3, 49, 2, HD)  # (L, T, H, hd): the windowed layers' too, on the grid
    last = "blocks.2.hook_resid_post"
    with torch.no_grad():
        _, weights = mechanism.ablated_copy(ours, heads, "mean", means).run_with_cache(x, [last])
        kept = {}
        with ours.hooks([(last, lambda t, hook: kept.setdefault("out", t))]):
            mechanism.ablate_heads(ours, x, heads, "mean", means)
    for output in (weights[last], kept["out"]):
        torch.testing.assert_close(output, expected.flatten(1, 2), rtol=0, atol=1e-5)


def test_a_windowed_mean_ablation_grid_is_each_head_ablated_alone():
    from vit.model import ViT, ViTConfig

    torch.manual_seed(0)
    model = ViT(ViTConfig(image_size=56, patch_size=8, hidden_size=32, num_layers=2, num_heads=2, mlp_size=48,
                          num_classes=4, class_token=False, pooling="avg", rel_pos="sam", window_size=3,
                          global_layers=(1,))).eval()
    x, means = images(56), mechanism.mean_contexts(model, images(56, seed=3))
    with torch.no_grad():
        grid = mechanism.ablation_grid(model, x, torch.tensor([1, 2]), "mean", means, chunk=3)  # (B, L, H)
        base = model(x)[0][torch.arange(2), [1, 2]]
        for layer in range(2):
            for head in range(2):
                logits, _ = mechanism.ablate_heads(model, x, [(layer, head)], "mean", means)
                torch.testing.assert_close(grid[:, layer, head], logits[torch.arange(2), [1, 2]] - base, rtol=0,
                                           atol=1e-5)


def test_beit_test_time_registers_refuse_in_one_line_naming_the_bias(beit):
    _, ours = beit
    with pytest.raises(mechanism.MechanismError, match="relative position bias") as error:
        phenomena.with_test_time_registers(ours, images(32), {0: [1]})
    assert "\n" not in str(error.value)


def test_the_explorers_mean_ablated_copy_places_the_means_on_the_images_own_grid(sam_checkpoint):
    """At another input size than the model's (80 px: a 10 x 10 grid, windows padded to 12 x 12), the copy the page
    draws from puts each window's means where the hooked ablation of the same pass does."""
    from vit.explain.views import mechanism_views

    _, checkpoint = sam_checkpoint
    ours = checkpoint.model
    x, references = images(80), torch.cat([images(80, seed=5), images(80, seed=6)])
    heads, means = [(0, 1), (1, 0)], mechanism.mean_contexts(ours, references)
    ablated = mechanism_views.ablated_checkpoint(checkpoint, heads, "mean", means, ours.patch_grid(80, 80)).model
    with torch.no_grad():
        expected, _ = mechanism.ablate_heads(ours, x, heads, "mean", means)
        torch.testing.assert_close(ablated(x)[0], expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["beit", "sam"])
def test_predict_save_maps_writes_each_layers_attention_as_the_forward_gives_it(family, beit_folder, sam_checkpoint,
                                                                                tmp_path):
    """A bias (BEiT) or windows (SAM): the .npz's layers are the forward's attentions, windows placed on the grid.
    It stopped before writing ("attends within windows") while the layers were read from queries and keys alone."""
    import numpy as np
    from PIL import Image

    from vit.core.inference import preprocess
    from vit.explain.methods.hidden import placed_attentions
    from vit.predict import main

    folder = beit_folder[1] if family == "beit" else sam_checkpoint[1].path
    checkpoint = open_source(folder)
    image = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(image)
    assert main([str(folder), str(image), "--save-maps", str(tmp_path / "maps")]) == 0
    model = checkpoint.model
    x = preprocess([Image.open(image)], checkpoint.preprocessing)
    with torch.no_grad():
        _, attentions = model(x, output_attentions=True)
    expected = placed_attentions(model, attentions, model.patch_grid(*x.shape[-2:]))
    saved = np.load(tmp_path / "maps" / "photo.npz")
    for i, layer in enumerate(expected):
        np.testing.assert_allclose(saved[f"layer_{i}"], layer[0].numpy(), rtol=0, atol=1e-5)
