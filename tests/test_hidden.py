"""Hidden states and per-layer attention recomputed on demand, against HF transformers' ViT with the same weights."""

import pytest
import torch

from vit.core.cache import ByteCache
from vit.explain.methods.hidden import LayerAttentions, forward_with_hidden_states
from vit.model import ViT, ViTConfig
from vit.sources.ports.families.hf import config_from_hf, state_dict_from_hf

TINY = ViTConfig(image_size=16, patch_size=4, num_channels=3, num_classes=3, hidden_size=16, num_layers=3,
                 num_heads=2, mlp_size=32)


def tiny_model() -> ViT:
    torch.manual_seed(0)
    return ViT(TINY).eval()


def test_hidden_states_and_layer_attentions_match_hf_at_a_non_square_size():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=32, patch_size=4, num_channels=3, hidden_size=48, num_hidden_layers=3,
                                    num_attention_heads=4, intermediate_size=96, num_labels=10, layer_norm_eps=1e-12)
    config._attn_implementation = "eager"
    hf = transformers.ViTForImageClassification(config).eval()
    ours = ViT(config_from_hf(hf.config))
    ours.load_state_dict(state_dict_from_hf(hf.state_dict(), ours.config.num_layers), strict=True)
    ours.eval()
    images = torch.randn(1, 3, 24, 40)  # a 6 x 10 grid: positions interpolated, non-square
    with torch.no_grad():
        expected = hf(pixel_values=images, output_attentions=True, output_hidden_states=True,
                      interpolate_pos_encoding=True)
        logits, hidden = forward_with_hidden_states(ours, images)
    torch.testing.assert_close(logits, expected.logits, rtol=0, atol=1e-5)
    assert hidden.shape == (1, 4, 61, 48)
    for i, theirs in enumerate(expected.hidden_states):  # embeddings, then each layer's output
        torch.testing.assert_close(hidden[:, i], theirs, rtol=0, atol=1e-5)
    layers = LayerAttentions(ours, hidden[0], ByteCache(2**20))
    assert len(layers) == 3
    for mine, theirs in zip(layers, expected.attentions, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)


def test_layers_are_computed_when_read_and_kept_while_small():
    model = tiny_model()
    _, hidden = forward_with_hidden_states(model, torch.randn(1, 3, 16, 16))
    one_layer = 2 * 17 * 17 * 4  # bytes of (1, 2 heads, 17, 17) float32
    cache = ByteCache(8 * one_layer)
    layers = LayerAttentions(model, hidden[0], cache)
    assert cache.bytes == 0  # nothing computed yet
    first = layers[0]
    assert layers[0] is first and cache.bytes == one_layer
    assert layers[-1].shape == (1, 2, 17, 17)
    with pytest.raises(IndexError):
        layers[3]
    # A layer over an eighth of the budget is recomputed each time instead of evicting the rest.
    tight = LayerAttentions(model, hidden[0], ByteCache(4 * one_layer))
    assert tight[0] is not tight[0] and torch.equal(tight[0], first)


def test_one_querys_rows_from_queries_and_keys_equal_the_full_attention_rows():
    model = tiny_model()
    _, hidden = forward_with_hidden_states(model, torch.randn(1, 3, 12, 20))  # a 3 x 5 grid
    layers = LayerAttentions(model, hidden[0], ByteCache(2**20))
    rows = layers.rows(7)  # (L, H, T)
    assert rows.shape == (3, 2, 16)
    for layer in range(3):
        torch.testing.assert_close(rows[layer], layers[layer][0, :, 7], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="out of range"):
        layers.rows(16)



def test_queries_and_keys_kept_from_the_forward_give_the_models_own_attention_rows_without_another_block_run(
        monkeypatch):
    from vit.explain.methods import hidden as hidden_module
    from vit.explain.methods.hidden import query_key_hooks

    model, images = tiny_model(), torch.randn(1, 3, 12, 20)  # a 3 x 5 grid
    with torch.no_grad():
        _, expected = model(images, output_attentions=True)  # the explicit path's probabilities
    kept = {}
    with torch.no_grad(), model.hooks(query_key_hooks(model, kept)):
        _, hidden = forward_with_hidden_states(model, images)
    assert sorted(kept) == [0, 1, 2] and kept[0].shape == (2, 2, 16, 8)

    def no_block_run(*args, **kwargs):
        raise AssertionError("the queries and keys were computed again")

    monkeypatch.setattr(hidden_module, "queries_and_keys", no_block_run)
    rows = LayerAttentions(model, hidden[0], ByteCache(2**20), (3, 5), kept).rows(7)  # (L, H, T)
    for layer in range(3):
        torch.testing.assert_close(rows[layer], expected[layer][0, :, 7], rtol=1e-5, atol=1e-6)


def test_no_query_key_hooks_for_a_model_with_a_relative_position_bias():
    from dataclasses import replace

    from vit.explain.methods.hidden import query_key_hooks

    assert query_key_hooks(ViT(replace(TINY, rel_pos="beit")), {}) == []

def test_concurrent_passes_on_one_shared_model_each_get_their_own_states():
    import threading

    model = tiny_model()
    x = torch.randn(1, 3, 16, 16)
    _, expected = forward_with_hidden_states(model, x)
    results, errors = [], []

    def run() -> None:
        try:
            for _ in range(20):
                results.append(forward_with_hidden_states(model, x)[1])
        except Exception as e:  # collected: a failure in a thread must fail the test
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 60 and all(torch.equal(r, expected) for r in results)
