"""Attention analysis on hand-made attention tensors whose answers are known."""

import math

import pytest
import torch

from vit.explain.methods.attention import (
    attention_entropy,
    class_gradients,
    fuse_heads,
    gradient_rollout,
    layer_stats,
    mass_mask,
    mean_attention_distance,
    patch_centres,
    relevance_rollout,
    relevance_rollout_row,
    rollout,
    rollout_factor,
    rollout_rows,
    token_map,
)
from vit.model import ViT, ViTConfig


def uniform(B: int, H: int, T: int) -> torch.Tensor:
    return torch.full((B, H, T, T), 1.0 / T)


def identity(B: int, H: int, T: int) -> torch.Tensor:
    return torch.eye(T).expand(B, H, T, T).clone()


def random_attention(B: int, H: int, T: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, T, T, generator=g).softmax(dim=-1)


# --- fuse_heads -------------------------------------------------------------------------------

def test_fuse_heads_mean_max_min_values():
    attn = torch.tensor([[[[0.2, 0.8], [0.6, 0.4]],
                          [[0.6, 0.4], [0.0, 1.0]]]])  # (1, 2, 2, 2)
    torch.testing.assert_close(fuse_heads(attn, "mean"), torch.tensor([[[0.4, 0.6], [0.3, 0.7]]]))
    torch.testing.assert_close(fuse_heads(attn, "max"), torch.tensor([[[0.6, 0.8], [0.6, 1.0]]]))
    torch.testing.assert_close(fuse_heads(attn, "min"), torch.tensor([[[0.2, 0.4], [0.0, 0.4]]]))


def test_fuse_heads_rejects_unknown_fusion_and_wrong_rank():
    with pytest.raises(ValueError, match="mean, max, min"):
        fuse_heads(uniform(1, 2, 3), "median")
    with pytest.raises(ValueError, match="batch, heads"):
        fuse_heads(torch.ones(2, 3, 3))


# --- token_map --------------------------------------------------------------------------------

def test_token_map_cls_row_is_row_major_on_a_non_square_grid():
    T = 1 + 2 * 3
    attn = torch.zeros(1, 1, T, T)
    attn[0, 0, 0] = torch.tensor([0.4, 0.0, 0.1, 0.2, 0.3, 0.0, 0.0])  # CLS row: key 0 is CLS itself
    m = token_map(attn, 0, (2, 3))
    assert m.shape == (1, 1, 2, 3)
    torch.testing.assert_close(m[0, 0], torch.tensor([[0.0, 0.1, 0.2], [0.3, 0.0, 0.0]]))


def test_token_map_patch_query_and_fused_input():
    T = 1 + 2 * 3
    attn = torch.zeros(2, T, T)  # already fused, batch of 2
    attn[1, 5, 6] = 1.0  # token 5 = patch 4 = (row 1, col 1) attends to patch 5 = (row 1, col 2)
    m = token_map(attn, 5, (2, 3))
    assert m.shape == (2, 2, 3)
    expected = torch.zeros(2, 2, 3)
    expected[1, 1, 2] = 1.0
    torch.testing.assert_close(m, expected)


def test_token_map_renormalize_spreads_the_prefix_mass_back():
    attn = torch.tensor([[0.5, 0.1, 0.4], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])[None]  # (1, 3, 3), grid 1x2
    torch.testing.assert_close(token_map(attn, 0, (1, 2)), torch.tensor([[[0.1, 0.4]]]))
    torch.testing.assert_close(token_map(attn, 0, (1, 2), renormalize=True), torch.tensor([[[0.2, 0.8]]]))


def test_token_map_with_several_prefix_tokens():
    T = 2 + 4  # CLS + a register token, 2x2 grid
    attn = torch.zeros(1, 1, T, T)
    attn[0, 0, 0] = torch.tensor([0.3, 0.3, 0.1, 0.1, 0.1, 0.1])
    torch.testing.assert_close(token_map(attn, 0, (2, 2), num_prefix_tokens=2)[0, 0], torch.full((2, 2), 0.1))


def test_token_map_rejects_a_grid_that_does_not_fit_and_bad_queries():
    with pytest.raises(ValueError, match="does not fit a 3x3 patch grid"):
        token_map(uniform(1, 1, 5), 0, (3, 3))
    with pytest.raises(ValueError, match="out of range"):
        token_map(uniform(1, 1, 5), 5, (2, 2))


# --- rollout ----------------------------------------------------------------------------------

def test_rollout_of_identity_attention_is_identity():
    attentions = [identity(3, 2, 5) for _ in range(4)]
    torch.testing.assert_close(rollout(attentions), identity(3, 1, 5)[:, 0])


def test_rollout_of_uniform_attention_mixes_uniform_and_residual_and_gives_a_flat_map():
    # Each layer is (U + I) / 2 with U = 1/T everywhere; U @ U = U, so L layers give
    # (1 - 2^-L) U + 2^-L I: flat off the diagonal, the residual keeps 2^-L on it.
    T, L = 5, 3
    result = rollout([uniform(2, 4, T) for _ in range(L)])
    expected = (1 - 2**-L) * torch.full((T, T), 1.0 / T) + 2**-L * torch.eye(T)
    torch.testing.assert_close(result, expected.expand(2, T, T))
    cls_map = token_map(result, 0, (2, 2))
    torch.testing.assert_close(cls_map, torch.full((2, 2, 2), (1 - 2**-L) / T))


def test_rollout_two_layers_by_hand_multiplies_later_layer_on_the_left():
    # Layer 0: every token reads CLS; with the residual, rows [1, 0] and [.5, .5].
    # Layer 1: every token reads the patch; with the residual, rows [.5, .5] and [0, 1].
    # The final CLS is .5 of itself plus .5 of the layer-0 patch token (= .5 CLS + .5 patch):
    # .75 CLS, .25 patch. That is A1 @ A0, not A0 @ A1 (which would give [.5, .5]).
    a0 = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    a1 = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    result = rollout([a0[None, None], a1[None, None]])
    torch.testing.assert_close(result[0], torch.tensor([[0.75, 0.25], [0.5, 0.5]]))


def test_rollout_fuses_heads_before_adding_the_residual():
    heads = torch.stack([torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([[0.0, 1.0], [0.0, 1.0]])])[None]
    # mean of heads: all 0.5; + I: [[1.5, .5], [.5, 1.5]] / 2
    torch.testing.assert_close(rollout([heads])[0], torch.tensor([[0.75, 0.25], [0.25, 0.75]]))
    # max of heads: all 1; + I: [[2, 1], [1, 2]] / 3
    torch.testing.assert_close(rollout([heads], head_fusion="max")[0],
                               torch.tensor([[2 / 3, 1 / 3], [1 / 3, 2 / 3]]))


def test_rollout_end_layer_stops_early_inclusive_and_counts_from_the_end():
    attentions = [random_attention(2, 3, 5, seed=s) for s in range(4)]
    torch.testing.assert_close(rollout(attentions, end_layer=1), rollout(attentions[:2]))
    torch.testing.assert_close(rollout(attentions, end_layer=-1), rollout(attentions))
    with pytest.raises(ValueError, match="out of range"):
        rollout(attentions, end_layer=4)


def test_discard_drops_the_lowest_patch_entries_but_never_the_cls_column():
    # CLS column is the smallest entry of every row, so a careless discard would drop it.
    row = torch.tensor([0.05, 0.10, 0.20, 0.30, 0.35])
    attn = row.expand(5, 5)[None, None].clone()  # (1, 1, 5, 5)
    result = rollout([attn], discard_ratio=0.5)  # 4 patch columns: drop the 2 lowest (0.10, 0.20)
    kept = torch.tensor([0.05, 0.0, 0.0, 0.30, 0.35])
    expected = (kept.expand(5, 5) + torch.eye(5))
    expected = expected / expected.sum(dim=-1, keepdim=True)
    torch.testing.assert_close(result[0], expected)
    assert (result[0, :, 0] > 0).all()
    torch.testing.assert_close(result.sum(dim=-1), torch.ones(1, 5))


def test_discard_keeps_every_prefix_column_and_rows_sum_to_one_over_layers():
    attentions = [random_attention(3, 4, 2 + 9, seed=s) for s in range(3)]
    for a in attentions:
        a[..., :2] = 1e-6  # the prefix columns are the lowest entries
    first_only = rollout(attentions[:1], discard_ratio=0.9, num_prefix_tokens=2)
    assert (first_only[..., :2] > 0).all()
    result = rollout(attentions, discard_ratio=0.9, num_prefix_tokens=2)
    torch.testing.assert_close(result.sum(dim=-1), torch.ones(3, 11))


def test_rollout_rejects_bad_discard_ratio_and_empty_input():
    with pytest.raises(ValueError, match="discard_ratio"):
        rollout([uniform(1, 1, 3)], discard_ratio=1.0)
    with pytest.raises(ValueError, match="no attention layers"):
        rollout([])


# --- gradient rollout -------------------------------------------------------------------------

def test_gradient_rollout_one_layer_by_hand():
    attn = torch.full((1, 1, 2, 2), 0.5)
    grad = torch.tensor([[2.0, -2.0], [0.0, 4.0]])[None, None]
    # grad * attn = [[1, -1], [0, 2]] -> clamp -> [[1, 0], [0, 2]]; R = I + that
    torch.testing.assert_close(gradient_rollout([attn], [grad])[0], torch.tensor([[2.0, 0.0], [0.0, 3.0]]))


def test_gradient_rollout_clamps_each_head_before_the_mean():
    attn = torch.ones(1, 2, 2, 2)
    grad = torch.stack([torch.tensor([[-1.0, 0.0], [0.0, 0.0]]), torch.tensor([[1.0, 0.0], [0.0, 0.0]])])[None]
    # clamp then mean: 0.5 at [0, 0]; mean then clamp would give 0
    torch.testing.assert_close(gradient_rollout([attn], [grad])[0], torch.tensor([[1.5, 0.0], [0.0, 1.0]]))


def test_gradient_rollout_two_layers_accumulates_in_layer_order():
    c0 = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    c1 = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    ones = torch.ones(1, 1, 2, 2)
    result = gradient_rollout([c0[None, None], c1[None, None]], [ones, ones])[0]
    # R = I + c0 = [[1, 1], [0, 1]]; R = R + c1 @ R = [[1, 1], [0, 1]] + [[0, 0], [1, 1]]
    torch.testing.assert_close(result, torch.tensor([[1.0, 1.0], [1.0, 2.0]]))


def test_gradient_rollout_pairs_each_layer_with_its_own_gradient():
    a0 = torch.tensor([[0.0, 1.0], [0.0, 1.0]])[None, None]
    a1 = torch.tensor([[1.0, 0.0], [1.0, 0.0]])[None, None]
    zero, ones = torch.zeros(1, 1, 2, 2), torch.ones(1, 1, 2, 2)
    # Layer 0 has no gradient, so only layer 1 counts: R = I + a1.
    torch.testing.assert_close(gradient_rollout([a0, a1], [zero, ones])[0], torch.tensor([[2.0, 0.0], [1.0, 1.0]]))
    # And the other way round: R = I + a0.
    torch.testing.assert_close(gradient_rollout([a0, a1], [ones, zero])[0], torch.tensor([[1.0, 1.0], [0.0, 2.0]]))


def test_gradient_rollout_end_layer_and_batch():
    attentions = [random_attention(3, 2, 5, seed=s) for s in range(3)]
    grads = [random_attention(3, 2, 5, seed=10 + s) - 0.2 for s in range(3)]
    full = gradient_rollout(attentions, grads, end_layer=1)
    torch.testing.assert_close(full, gradient_rollout(attentions[:2], grads[:2]))
    for b in range(3):
        single = gradient_rollout([a[b:b + 1] for a in attentions], [g[b:b + 1] for g in grads], end_layer=1)
        torch.testing.assert_close(full[b:b + 1], single)


def test_gradient_rollout_rejects_mismatched_gradients():
    with pytest.raises(ValueError, match="1 gradient tensors for 2"):
        gradient_rollout([uniform(1, 1, 3)] * 2, [uniform(1, 1, 3)])
    with pytest.raises(ValueError, match="gradient of shape"):
        gradient_rollout([uniform(1, 1, 3)], [uniform(1, 2, 3)])


# --- class_gradients --------------------------------------------------------------------------

@pytest.fixture
def tiny_vit() -> ViT:
    torch.manual_seed(0)
    config = ViTConfig(image_size=8, patch_size=4, num_channels=3, num_classes=5, hidden_size=16,
                       num_layers=2, num_heads=2, mlp_size=32)
    return ViT(config).eval()


def test_class_gradients_match_autograd_through_the_explicit_path(tiny_vit):
    images = torch.randn(3, 3, 8, 8)
    logits, attentions, gradients = class_gradients(tiny_vit, images, 2)
    ref_logits, ref_attentions = tiny_vit(images, output_attentions=True)
    for a in ref_attentions:
        a.retain_grad()
    ref_logits[:, 2].sum().backward()
    torch.testing.assert_close(logits, ref_logits.detach())
    assert len(gradients) == len(attentions) == 2
    for ours, ref, attn in zip(gradients, ref_attentions, attentions, strict=True):
        assert ours.shape == (3, 2, 5, 5)
        assert not ours.requires_grad and not attn.requires_grad
        torch.testing.assert_close(attn, ref.detach())
        torch.testing.assert_close(ours, ref.grad)
        assert ours.abs().sum() > 0


def test_class_gradients_per_image_classes_equal_one_image_at_a_time(tiny_vit):
    images = torch.randn(2, 3, 8, 8)
    _, _, batched = class_gradients(tiny_vit, images, torch.tensor([1, 4]))
    for b, c in enumerate([1, 4]):
        _, _, single = class_gradients(tiny_vit, images[b:b + 1], c)
        for g_batched, g_single in zip(batched, single, strict=True):
            torch.testing.assert_close(g_batched[b:b + 1], g_single, rtol=1e-4, atol=1e-6)


def test_class_gradients_work_under_inference_mode_and_with_frozen_weights(tiny_vit):
    tiny_vit.requires_grad_(False)
    with torch.inference_mode():
        images = torch.randn(1, 3, 8, 8)  # an inference tensor, as the app's preprocessing may make
        _, _, gradients = class_gradients(tiny_vit, images, 0)
    assert all(g.abs().sum() > 0 for g in gradients)
    assert all(p.grad is None for p in tiny_vit.parameters())


def test_class_gradients_rejects_a_class_out_of_range(tiny_vit):
    with pytest.raises(ValueError, match="out of range for 5 classes"):
        class_gradients(tiny_vit, torch.randn(1, 3, 8, 8), 5)


# --- mean attention distance, entropy ---------------------------------------------------------

def test_mean_distance_of_identity_among_patches_is_zero_even_with_mass_on_cls():
    T = 1 + 2 * 3
    attn = identity(2, 3, T) * 0.5
    attn[..., 0] += 0.5  # every query also gives half its attention to CLS
    torch.testing.assert_close(mean_attention_distance(attn, (2, 3), 16), torch.zeros(2, 3, dtype=torch.float32))


def test_mean_distance_on_a_1x2_grid_by_hand():
    # Tokens: CLS, patch 0, patch 1; centres 16 px apart.
    attn = torch.tensor([[0.3, 0.3, 0.4],
                         [0.5, 0.25, 0.25],  # patch 0: renormalised 0.5 / 0.5 -> 8 px
                         [0.0, 0.75, 0.25]])  # patch 1: 0.75 on the other patch -> 12 px
    result = mean_attention_distance(attn[None, None], (1, 2), patch_size=16)
    torch.testing.assert_close(result, torch.tensor([[10.0]]))


def test_mean_distance_uses_row_major_pixel_distances_on_a_non_square_grid():
    T = 1 + 2 * 3
    attn = torch.zeros(1, 2, T, T)
    attn[0, :, 1:, 1:] = torch.eye(6)  # head 0: every patch attends to itself
    attn[0, 1, 1, 1:] = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 1.0])  # head 1: patch (0,0) attends (1,2)
    result = mean_attention_distance(attn, (2, 3), patch_size=10)
    # head 1: one query at distance sqrt(1^2 + 2^2) * 10, five at 0
    torch.testing.assert_close(result, torch.tensor([[0.0, math.sqrt(5) * 10 / 6]]))


def test_patch_centres_are_row_major_pixel_centres():
    torch.testing.assert_close(patch_centres((2, 3), 4),
                               torch.tensor([[2, 2], [2, 6], [2, 10], [6, 2], [6, 6], [6, 10]], dtype=torch.float64))


def test_entropy_of_uniform_rows_is_log_t_and_of_one_hot_rows_zero():
    torch.testing.assert_close(attention_entropy(uniform(2, 3, 7)), torch.full((2, 3), math.log(7)))
    torch.testing.assert_close(attention_entropy(identity(2, 3, 7)), torch.zeros(2, 3))


def test_entropy_of_a_hand_made_row():
    attn = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.25, 0.25, 0.5]])[None, None]
    expected = (math.log(2) + 0.0 + 1.5 * math.log(2)) / 3
    torch.testing.assert_close(attention_entropy(attn), torch.tensor([[expected]]))


def test_layer_stats_stacks_layers_first():
    attentions = [identity(2, 3, 5), uniform(2, 3, 5)]
    stats = layer_stats(attentions, (2, 2), patch_size=8)
    assert stats["distance"].shape == stats["entropy"].shape == (2, 2, 3)
    torch.testing.assert_close(stats["distance"][0], torch.zeros(2, 3))
    # uniform over a 2x2 grid of 8 px patches: per query 2 neighbours at 8 px, 1 at 8*sqrt(2), 1 at 0
    torch.testing.assert_close(stats["distance"][1], torch.full((2, 3), (16 + 8 * math.sqrt(2)) / 4))
    torch.testing.assert_close(stats["entropy"][1], torch.full((2, 3), math.log(5)))


def test_analysis_on_a_real_model_any_batch_and_non_square_input(tiny_vit):
    images = torch.randn(3, 3, 12, 8)  # 3x2 grid
    _, attentions = tiny_vit(images, output_attentions=True)
    grid = (3, 2)
    r = rollout(attentions, discard_ratio=0.5)
    assert r.shape == (3, 7, 7)
    torch.testing.assert_close(r.sum(dim=-1), torch.ones(3, 7))
    assert token_map(r, 0, grid).shape == (3, 3, 2)
    assert token_map(attentions[-1], 0, grid).shape == (3, 2, 3, 2)
    stats = layer_stats(attentions, grid, patch_size=4)
    assert stats["distance"].shape == (2, 3, 2)
    assert (stats["entropy"] <= math.log(7) + 1e-6).all()


# -- rollout of one query's row, and DINO's attention-mass mask ---------------------------------------------------

def test_rollout_rows_give_the_query_row_of_the_full_rollout_for_any_grid_and_prefix():
    torch.manual_seed(0)
    layers = [torch.rand(2, 3, 2 + 12, 2 + 12).softmax(dim=-1) for _ in range(4)]  # 2 prefix tokens, 3 x 4 grid
    full = rollout(layers, "max", 0.3, end_layer=2, num_prefix_tokens=2)  # (2, 14, 14)
    factors = [rollout_factor(a, "max", 0.3, num_prefix_tokens=2) for a in layers[:3]]
    for query in (0, 1, 7, 13):
        torch.testing.assert_close(rollout_rows(factors, query), full[:, query], rtol=1e-6, atol=1e-7)


def test_rollout_rows_by_hand_for_two_layers():
    a0 = torch.tensor([[[0.5, 0.5], [0.0, 1.0]]])  # (1, 2, 2); factor (A + I) / 2
    a1 = torch.tensor([[[1.0, 0.0], [0.5, 0.5]]])
    f0 = rollout_factor(a0[:, None], num_prefix_tokens=0)
    f1 = rollout_factor(a1[:, None], num_prefix_tokens=0)
    torch.testing.assert_close(f0, torch.tensor([[[0.75, 0.25], [0.0, 1.0]]]))
    # row 1 of f1 @ f0 = [0.25, 0.75] @ f0 = [0.1875, 0.8125]
    torch.testing.assert_close(rollout_rows([f0, f1], 1), torch.tensor([[0.1875, 0.8125]]))


def test_relevance_rollout_row_is_the_query_row_of_the_whole_relevance():
    torch.manual_seed(0)
    terms = [torch.rand(2, 9, 9) / 9 for _ in range(5)]
    for end_layer in (None, 2, -1):
        full = relevance_rollout(terms, end_layer)
        for query in (0, 4, 8):
            torch.testing.assert_close(relevance_rollout_row(terms, query, end_layer), full[:, query],
                                       rtol=1e-6, atol=1e-7)


def test_relevance_rollout_row_by_hand_for_two_layers():
    a0 = torch.tensor([[[0.2, 0.0], [0.1, 0.3]]])
    a1 = torch.tensor([[[0.0, 0.4], [0.5, 0.0]]])
    # row 1 of (I + a1) (I + a0) = [0.5, 1.0] @ [[1.2, 0.0], [0.1, 1.3]] = [0.7, 1.3]
    torch.testing.assert_close(relevance_rollout_row([a0, a1], 1), torch.tensor([[0.7, 1.3]]))
    with pytest.raises(ValueError, match="out of range"):
        relevance_rollout_row([a0, a1], 2)


def test_mass_mask_keeps_the_largest_patches_until_the_share_is_reached():
    m = torch.tensor([[0.5, 0.3], [0.15, 0.05]])
    # DINO: sorted ascending, cumulative share 0.05, 0.2, 0.5, 1.0; keep where it exceeds 1 - share.
    assert mass_mask(m, 0.6).tolist() == [[True, True], [False, False]]
    assert mass_mask(m, 0.9).tolist() == [[True, True], [True, False]]
    assert mass_mask(m * 7, 0.6).tolist() == [[True, True], [False, False]]  # only shares count
    assert mass_mask(torch.stack([m, m.flip(0)]), 0.6).shape == (2, 2, 2)  # per head
    with pytest.raises(ValueError, match="share"):
        mass_mask(m, 1.5)


def test_patch_centres_of_rectangular_patches_step_by_their_height_and_width():
    # (2, 8) patches on a 2x2 grid: centres at rows 1 and 3, columns 4 and 12
    expected = torch.tensor([[1.0, 4.0], [1.0, 12.0], [3.0, 4.0], [3.0, 12.0]], dtype=torch.float64)
    torch.testing.assert_close(patch_centres((2, 2), (2, 8)), expected, rtol=0, atol=0)
    attn = torch.zeros(1, 1, 3, 3)
    attn[..., 1:, 1:] = torch.tensor([[0.0, 1.0], [1.0, 0.0]])  # each patch attends to the other, 8 px away
    assert mean_attention_distance(attn, (1, 2), (2, 8)).item() == pytest.approx(8.0)
