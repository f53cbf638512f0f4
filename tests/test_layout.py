"""Attention layouts (issue 46): the additive bias on the logits at ``attn.hook_bias``, BEiT's relative position
index, SAM's windows and their placement back on the patch grid, checked against hand-built expectations."""

import pytest
import torch

from vit.explain.methods.attention import rollout, windows_on_grid
from vit.model import ViT, ViTConfig, beit_relative_position_index


def noised(config: ViTConfig, seed: int = 0) -> ViT:
    torch.manual_seed(seed)
    model = ViT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


BEIT = dict(image_size=32, patch_size=8, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32, num_classes=3)


def test_beit_index_reads_each_patch_pair_by_its_offset_and_cls_pairs_from_the_last_three_rows():
    index = beit_relative_position_index((2, 3))  # offsets span 3 x 5 = 15 rows; CLS rows 15, 16, 17
    assert index.shape == (7, 7)
    assert index[0, 0] == 17 and (index[0, 1:] == 15).all() and (index[1:, 0] == 16).all()
    # patch (0, 0) to patch (1, 2): offset (-1, -2) -> row (-1 + 1) * 5 + (-2 + 2) = 0; to itself: the centre, 7
    assert index[1, 1 + 5] == 0 and index[1, 1] == 7 and index[1 + 5, 1] == 14


@pytest.mark.parametrize("rel_pos", ["beit", "beit_shared"])
def test_the_bias_is_read_at_hook_bias_and_zeroing_it_is_the_model_without_its_tables(rel_pos):
    model = noised(ViTConfig(**BEIT, rel_pos=rel_pos, key_bias=False))
    images = torch.randn(2, 3, 32, 24)
    zero = [(f"blocks.{i}.attn.hook_bias", lambda x, hook: torch.zeros_like(x)) for i in range(2)]
    _, cache = model.run_with_cache(images, ["blocks.0.attn.hook_bias"])
    assert cache["blocks.0.attn.hook_bias"].shape == (1, 2, 13, 13)  # (1, nh, T, T): 4 x 3 patches + CLS
    with torch.no_grad():
        hooked = model.run_with_hooks(images, zero).logits
        for name, p in model.named_parameters():
            if name.endswith("table"):
                p.zero_()
        assert torch.allclose(hooked, model(images)[0], atol=1e-6)


@pytest.mark.parametrize("rel_pos", ["beit", "beit_shared"])
def test_the_fused_and_explicit_paths_add_the_same_bias(rel_pos):
    model = noised(ViTConfig(**BEIT, rel_pos=rel_pos))
    images = torch.randn(2, 3, 40, 24)
    with torch.no_grad():
        assert torch.allclose(model(images)[0], model(images, output_attentions=True)[0], atol=1e-5)


SAM = dict(image_size=56, patch_size=8, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32, num_classes=0,
           class_token=False, pooling="avg", final_norm=False, rel_pos="sam", window_size=3, global_layers=(1,))


def test_windows_are_placed_on_the_grid_where_a_hand_loop_puts_them():
    # A 5 x 4 grid in windows of 3: padded to 6 x 6, 2 x 2 windows; the right and bottom windows hold padding.
    gh, gw, w = 5, 4, 3
    attn = torch.rand(2 * 4, 3, w * w, w * w)  # (B * nw, H, n, n), every entry distinct
    dense = windows_on_grid(attn, (gh, gw), w)
    expected = torch.zeros(2, 3, gh * gw, gh * gw)
    for b in range(2):
        for wy in range(2):
            for wx in range(2):
                for i in range(w * w):
                    for j in range(w * w):
                        (qy, qx), (ky, kx) = (wy * w + i // w, wx * w + i % w), (wy * w + j // w, wx * w + j % w)
                        if max(qy, ky) < gh and max(qx, kx) < gw:
                            expected[b, :, qy * gw + qx, ky * gw + kx] = attn[b * 4 + wy * 2 + wx, :, i, j]
    assert torch.equal(dense, expected)


def test_a_patch_attends_exactly_to_its_own_window_and_rollout_keeps_it_there():
    model = noised(ViTConfig(**SAM))
    images = torch.randn(1, 3, 56, 48)  # a 7 x 6 grid: windows of rows 0-2, 3-5, 6 and columns 0-2, 3-5
    from vit.explain.methods.hidden import block_attention

    with torch.no_grad():
        x = model.embed(images)
        placed = block_attention(model, 0, x, (7, 6))  # (1, H, 42, 42)
        _, (windowed,) = model.run_blocks(x, (7, 6), 0, 1, output_attentions=True)
    query = 4 * 6 + 2  # patch (4, 2): window rows 3-5, columns 0-2
    window = {r * 6 + c for r in range(3, 6) for c in range(0, 3)}
    assert {int(t) for t in placed[0, 0, query].nonzero()} == window
    assert torch.allclose(placed[0, :, query].sum(-1), torch.ones(2))  # a window without padding: rows sum to 1
    # patch (4, 2) is slot (1, 2) of window (1, 0), the third of the 3 x 2 windows
    assert torch.allclose(placed[0, :, query, sorted(window)], windowed[1 * 2 + 0, :, 1 * 3 + 2])
    row = rollout([placed])[0, query]  # one windowed layer: 0.5 (A + I), renormalised, stays in the window
    assert {int(t) for t in row.nonzero()} == window


def test_chunked_views_read_the_placed_layer_and_q_k_shortcuts_refuse_in_one_line():
    from vit.explain.methods.chunked import LayerInputs
    from vit.explain.methods.hidden import block_attention, queries_and_keys

    model = noised(ViTConfig(**SAM))
    with torch.no_grad():
        x = model.embed(torch.randn(1, 3, 56, 56))
        hidden = torch.stack([x, model.run_blocks(x, (7, 7), 0, 1)[0]], dim=1)  # (1, 2, T, D): inputs of layers 0, 1
        rows = LayerInputs(model, hidden, (7, 7)).rows(0, [10, 20], [1])
        assert torch.allclose(rows, block_attention(model, 0, x, (7, 7))[:, [1]][:, :, [10, 20]])
    with pytest.raises(ValueError, match="windows") as error:
        queries_and_keys(model, 0, x, (7, 7))
    assert "\n" not in str(error.value)


def test_flow_on_a_windowed_model_reads_the_placed_windows():
    from vit.explain.methods.attention_flow import attention_flow
    from vit.explain.methods.hidden import placed_attentions

    model = noised(ViTConfig(**SAM))
    with torch.no_grad():
        _, attentions = model(torch.randn(1, 3, 56, 56), output_attentions=True)
    placed = placed_attentions(model, attentions, (7, 7))
    assert [tuple(a.shape) for a in placed] == [(1, 2, 49, 49)] * 2
    assert attention_flow(placed, query=24).shape == (1, 49)


def _no_placement(monkeypatch):
    """Make placing a whole windowed layer on the grid (T x T per head) an error: the views must not do it."""
    def refuse(*args, **kwargs):
        raise AssertionError("a view placed a whole windowed layer on the grid")
    monkeypatch.setattr("vit.explain.methods.hidden.layer_on_grid", refuse)  # what places a layer whole there


def _no_whole_global_layer(monkeypatch):
    """Make forming a global layer's whole attention (H x T x T) an error: its views read it in query chunks."""
    from vit.explain.methods import chunked, hidden

    def windows_only(model, layer, *args):
        assert model.blocks[layer].window, f"a view formed global layer {layer}'s whole attention"
        return layer_pattern(model, layer, *args)

    layer_pattern = hidden.layer_pattern
    monkeypatch.setattr(hidden, "layer_pattern", windows_only)
    monkeypatch.setattr(chunked, "layer_pattern", windows_only)


@pytest.mark.parametrize("config", [dict(**BEIT, rel_pos="beit"), dict(**BEIT, rel_pos="beit_shared"), SAM],
                         ids=["beit", "beit-shared", "sam"])
def test_a_global_layers_rows_with_its_bias_are_formed_in_query_chunks(monkeypatch, config):
    from vit.core.cache import ByteCache
    from vit.explain.methods.chunked import LayerInputs
    from vit.explain.methods.hidden import LayerAttentions, block_attention, forward_with_hidden_states

    model, size = noised(ViTConfig(**config)), (40, 24) if config is not SAM else (56, 48)
    grid = model.patch_grid(*size)
    with torch.no_grad():
        _, hidden = forward_with_hidden_states(model, torch.randn(1, 3, *size))
        expected = block_attention(model, 1, hidden[:, 1], grid)  # (1, H, T, T): the model's own, parity-tested
    _no_whole_global_layer(monkeypatch)
    queries = [0, 7, 3, 14]
    rows = LayerInputs(model, hidden, grid, query_chunk=3).rows(1, queries, [1, 0])  # (1, 2, 4, T)
    assert torch.allclose(rows, expected[:, [1, 0]][:, :, queries], atol=1e-6)
    one = LayerAttentions(model, hidden[0], ByteCache(2**20), grid).rows(7)  # (L, H, T)
    assert torch.allclose(one[1], expected[0, :, 7], atol=1e-6)


@pytest.mark.parametrize("fusion, discard", [("mean", 0.0), ("max", 0.0), ("mean", 0.5)])
def test_the_chunked_rollout_row_of_a_windowed_model_is_the_dense_rollout_of_its_placed_attentions(
        monkeypatch, fusion, discard):
    from vit.explain.methods.chunked import LayerInputs
    from vit.explain.methods.hidden import forward_with_hidden_states, placed_attentions

    model = noised(ViTConfig(**{**SAM, "num_layers": 3, "global_layers": (1,)}))
    images = torch.randn(1, 3, 56, 48)  # a 7 x 6 grid: windows of 3 with padding at the bottom and the right
    with torch.no_grad():
        _, attentions = model(images, output_attentions=True)
        _, hidden = forward_with_hidden_states(model, images)
    dense = rollout(placed_attentions(model, attentions, (7, 6)), fusion, discard, num_prefix_tokens=0)  # (1, T, T)
    _no_placement(monkeypatch)
    inputs = LayerInputs(model, hidden, (7, 6), query_chunk=5)
    for query in (0, 4 * 6 + 2, 41):  # a corner, an inner window, the padded corner window
        assert torch.allclose(inputs.rollout_row(query, fusion=fusion, discard_ratio=discard, num_prefix_tokens=0),
                              dense[:, query], atol=1e-6)


def test_views_of_a_windowed_layer_read_the_query_row_from_its_window(monkeypatch):
    from vit.core.cache import ByteCache
    from vit.explain.methods.chunked import LayerInputs
    from vit.explain.methods.hidden import LayerAttentions, block_attention, forward_with_hidden_states

    model = noised(ViTConfig(**SAM))
    with torch.no_grad():
        _, hidden = forward_with_hidden_states(model, torch.randn(1, 3, 56, 48))
        expected = [block_attention(model, i, hidden[:, i], (7, 6))[0, :, 26] for i in range(2)]  # (H, T) each
    _no_placement(monkeypatch)
    rows = LayerAttentions(model, hidden[0], ByteCache(2**20), (7, 6)).rows(26)  # (L, H, T)
    assert torch.allclose(rows, torch.stack(expected), atol=1e-6)
    inputs = LayerInputs(model, hidden, (7, 6), query_chunk=4)
    assert torch.allclose(inputs.rows(0, [26, 3, 40], [1])[0, 0, 0], expected[0][1], atol=1e-6)
    assert torch.allclose(inputs.fused(0, 26)[0], expected[0].mean(0), atol=1e-6)


def test_sam_b_at_1024_px_is_within_the_memory_bound_and_a_query_row_reads_only_its_window_or_its_own_row(
        monkeypatch):
    from types import SimpleNamespace

    from vit.costs.fits import check_input_fits
    from vit.explain.methods import chunked

    sam_b = dict(image_size=1024, patch_size=16, hidden_size=768, num_heads=12, mlp_size=3072, num_classes=0,
                 class_token=False, pooling="avg", final_norm=False, rel_pos="sam", window_size=14)
    config = ViTConfig(**sam_b, num_layers=12, global_layers=(2, 5, 8, 11))
    check_input_fits(SimpleNamespace(model=SimpleNamespace(config=config, num_prefix_tokens=0)), (64, 64))
    torch.manual_seed(0)
    model = ViT(ViTConfig(**sam_b, num_layers=2, global_layers=(1,))).eval()  # SAM ViT-B's layers, random weights
    formed = []

    def recorded(*args):
        formed.append(layer_pattern(*args))
        return formed[-1]

    _no_whole_global_layer(monkeypatch)
    layer_pattern = chunked.layer_pattern
    monkeypatch.setattr(chunked, "layer_pattern", recorded)
    _no_placement(monkeypatch)
    inputs = chunked.LayerInputs(model, torch.randn(1, 3, 4096, 768), (64, 64))
    row = inputs.rows(1, [30 * 64 + 45], [3])[0, 0, 0]  # the global layer: q, k and this query's bias row alone
    assert torch.isfinite(row).all() and torch.allclose(row.sum(), torch.tensor(1.0)) and row.count_nonzero() == 4096
    for (r, c), (wy, wx) in [((30, 45), (2, 3)), ((60, 61), (4, 4))]:  # the 64 x 64 grid padded to 5 x 5 windows
        row = inputs.rows(0, [r * 64 + c], [3])[0, 0, 0]  # (4096,)
        window = formed[-1][wy * 5 + wx, 3, (r - 14 * wy) * 14 + c - 14 * wx]  # (196,): the query's slot
        assert formed[-1].shape == (25, 12, 196, 196)  # windows only: 46 MB, not 12 x 4096² (805 MB)
        keys = [(14 * wy + i) * 64 + 14 * wx + j for i in range(14) for j in range(14)
                if 14 * wy + i < 64 and 14 * wx + j < 64]
        slots = [i * 14 + j for i in range(14) for j in range(14) if 14 * wy + i < 64 and 14 * wx + j < 64]
        assert torch.equal(row[keys], window[slots].float())
        assert row.count_nonzero() == len(keys) and row.sum() <= 1


def test_beit_index_rows_are_the_rows_of_the_whole_index():
    rows = torch.tensor([5, 0, 12, 1])
    assert torch.equal(beit_relative_position_index((3, 4), rows), beit_relative_position_index((3, 4))[rows])
