"""Attention in head and query chunks from the stored block inputs equals the model's whole attention, and the
row-vector rollout equals the full rollout, at chunk sizes that do not divide the heads or tokens evenly."""

import numpy as np
import pytest
import torch

from vit.costs import memory as costs_memory
from vit.explain.methods.attention import fuse_heads, layer_stats, rollout, rollout_factor
from vit.explain.methods.chunked import LayerInputs, attention_chunks, chunk_sizes
from vit.explain.methods.hidden import forward_with_hidden_states
from vit.model import ViT, ViTConfig

# 3 heads, 1 CLS + 2 registers + a 5 x 7 grid = 38 tokens: chunks of 2 heads or 5 queries leave a remainder.
REGISTERS = ViTConfig(image_size=16, patch_size=4, num_classes=3, hidden_size=24, num_layers=3, num_heads=3,
                      mlp_size=48, num_register_tokens=2)
ROTARY = ViTConfig(image_size=16, patch_size=4, num_classes=3, hidden_size=24, num_layers=2, num_heads=3,
                   mlp_size=48, pos_embed=False, rope="dinov3")
CHUNKS = [(1, 1), (2, 5), (3, 7), (2, 38), (None, None)]


def run(config: ViTConfig, batch: int = 1):
    torch.manual_seed(0)
    model = ViT(config).eval()
    images = torch.randn(batch, 3, 20, 28)  # a 5 x 7 grid: non-square, positions interpolated
    with torch.no_grad():
        _, attentions = model(images, output_attentions=True)  # the unchunked reference, (B, H, T, T) per layer
        _, hidden = forward_with_hidden_states(model, images)  # (B, L + 1, T, D)
    return model, hidden, attentions, model.patch_grid(20, 28)


@pytest.mark.parametrize("config", [REGISTERS, ROTARY], ids=["registers", "rotary"])
@pytest.mark.parametrize(("head_chunk", "query_chunk"), CHUNKS)
def test_chunked_rows_equal_the_models_attention(config, head_chunk, query_chunk):
    model, hidden, attentions, grid = run(config, batch=2)
    inputs = LayerInputs(model, hidden, grid, head_chunk=head_chunk, query_chunk=query_chunk)
    T = hidden.shape[2]
    for layer, full in enumerate(attentions):
        torch.testing.assert_close(inputs.rows(layer, range(T)), full, rtol=0, atol=1e-6)
        torch.testing.assert_close(inputs.rows(layer, [9, 0], heads=[2]), full[:, [2]][:, :, [9, 0]], rtol=0, atol=1e-6)


@pytest.mark.parametrize(("head_chunk", "query_chunk"), CHUNKS)
@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
def test_chunked_fused_rows_equal_the_fused_attention(head_chunk, query_chunk, fusion):
    model, hidden, attentions, grid = run(REGISTERS)
    inputs = LayerInputs(model, hidden, grid, head_chunk=head_chunk, query_chunk=query_chunk)
    for layer, full in enumerate(attentions):
        fused = torch.cat([rows for _, rows in inputs.fused_rows(layer, fusion=fusion)], dim=1)  # (1, T, T)
        torch.testing.assert_close(fused, fuse_heads(full, fusion), rtol=0, atol=1e-6)
        torch.testing.assert_close(inputs.fused(layer, 4, fusion), fuse_heads(full, fusion)[:, 4], rtol=0, atol=1e-6)


@pytest.mark.parametrize("config", [REGISTERS, ROTARY], ids=["registers", "rotary"])
@pytest.mark.parametrize(("head_chunk", "query_chunk"), CHUNKS)
@pytest.mark.parametrize(("fusion", "discard_ratio"), [("mean", 0.0), ("max", 0.0), ("mean", 0.3), ("min", 0.5)])
def test_row_vector_rollout_equals_a_row_of_the_full_rollout(config, head_chunk, query_chunk, fusion, discard_ratio):
    model, hidden, attentions, grid = run(config, batch=2)
    prefix = model.num_prefix_tokens
    inputs = LayerInputs(model, hidden, grid, head_chunk=head_chunk, query_chunk=query_chunk)
    for end_layer in (-1, 0):
        full = rollout(attentions, fusion, discard_ratio, end_layer, prefix)  # (B, T, T)
        for query in (0, prefix + 6):
            row = inputs.rollout_row(query, fusion=fusion, discard_ratio=discard_ratio, end_layer=end_layer,
                                     num_prefix_tokens=prefix)
            torch.testing.assert_close(row, full[:, query], rtol=0, atol=1e-6)


def test_row_vector_rollout_of_weights_is_those_weights_times_the_full_rollout():
    model, hidden, attentions, grid = run(REGISTERS)
    weights = torch.rand(1, hidden.shape[2])
    inputs = LayerInputs(model, hidden, grid, query_chunk=4)
    expected = (weights[:, None] @ rollout(attentions, num_prefix_tokens=3))[:, 0]
    torch.testing.assert_close(inputs.rollout_row(row=weights, num_prefix_tokens=3), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("head_chunk", "query_chunk"), CHUNKS)
def test_chunked_factor_and_stats_equal_the_whole_layers(head_chunk, query_chunk):
    model, hidden, attentions, grid = run(REGISTERS, batch=2)
    inputs = LayerInputs(model, hidden, grid, head_chunk=head_chunk, query_chunk=query_chunk)
    for layer, full in enumerate(attentions):
        torch.testing.assert_close(inputs.factor(layer, "max", 0.3, 3), rollout_factor(full, "max", 0.3, 3),
                                   rtol=0, atol=1e-6)
        expected = layer_stats([full], grid, 4, 3)
        distance, entropy = inputs.stats(layer, grid, 4, 3)
        torch.testing.assert_close(distance, expected["distance"][0], rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(entropy, expected["entropy"][0], rtol=0, atol=1e-6)


def test_token_norms_are_the_norms_of_each_layers_output():
    torch.manual_seed(0)
    model, images = ViT(REGISTERS).eval(), torch.randn(1, 3, 20, 28)
    with torch.no_grad():
        first, _ = model.run_blocks(model.embed(images), (5, 7), 0, 1)  # (1, T, D) after layer 0
        _, hidden = forward_with_hidden_states(model, images)
    torch.testing.assert_close(LayerInputs(model, hidden, (5, 7)).token_norms(0), first.norm(dim=-1), rtol=0, atol=1e-6)


def test_chunk_sizes_stay_within_the_budget_and_never_split_a_row():
    T, H = 4097, 12
    heads, queries = chunk_sizes(H, T, 256 * 2**20, target=None)  # as big as the budget holds: every query of a head
    assert (heads, queries) == (1, T) and 3 * 4 * heads * queries * T <= 256 * 2**20 < 3 * 4 * (heads + 1) * queries * T
    assert chunk_sizes(H, T, 256 * 2**20, target=2**20) == (1, 63)  # about 1 MB of one head's queries
    assert chunk_sizes(H, 1025, 256 * 2**20, target=2**20) == (1, 255)
    assert chunk_sizes(H, 17, 256 * 2**20, target=2**20) == (12, 17)  # a head's every query fits: more heads
    assert chunk_sizes(H, T, 1) == (1, 1)  # the least a row needs
    assert chunk_sizes(H, T, 3 * 4 * T * 5, target=None) == (1, 5)


def test_chunks_cover_every_head_and_query_exactly_once():
    q, k = torch.randn(1, 3, 11, 4), torch.randn(1, 3, 11, 4)
    seen = torch.zeros(3, 11)
    for hs, ts, probs in attention_chunks(q, k, head_chunk=2, query_chunk=4):
        assert probs.shape == (1, hs.stop - hs.start, ts.stop - ts.start, 11)
        seen[hs, ts] += 1
    assert torch.equal(seen, torch.ones(3, 11))


def test_out_of_range_layers_queries_and_heads_are_refused():
    model, hidden, _, grid = run(REGISTERS)
    inputs = LayerInputs(model, hidden, grid)
    with pytest.raises(ValueError, match="layer 3"):
        inputs.rows(3, [0])
    with pytest.raises(ValueError, match="out of range"):
        inputs.rows(0, [38])
    with pytest.raises(ValueError, match="heads"):
        inputs.rows(0, [0], heads=[3])
    with pytest.raises(ValueError, match="query token 38"):
        inputs.rollout_row(38)
    with pytest.raises(ValueError, match="head fusion"):
        inputs.rollout_row(0, fusion="median")


def test_the_explorers_maps_past_the_factor_cache_equal_the_whole_attentions(monkeypatch):
    from PIL import Image

    from vit.checkpoint import Checkpoint, Preprocessing
    from vit.core.inference import InputSize
    from vit.explain.views import attention_maps, image_analysis, mechanism_views

    monkeypatch.setattr(image_analysis, "LAYER_CACHE_BYTES", 4096)  # too small for the factors: row vectors instead
    torch.manual_seed(0)
    model = ViT(REGISTERS).eval()
    checkpoint = Checkpoint(model, ["a", "b", "c"], Preprocessing.default_for(REGISTERS))
    image = Image.new("RGB", (28, 20), (200, 30, 90))
    analysis = image_analysis.analyse(checkpoint, image, InputSize(28, keep_aspect=True))  # 28 x 20 px: 5 x 7 patches
    assert not attention_maps.factors_fit(analysis)
    x = mechanism_views._model_input(checkpoint, image, InputSize(28, keep_aspect=True))
    with torch.no_grad():
        _, attentions = model(x, output_attentions=True)
    full = rollout(attentions, "max", 0.2, -2, 3)
    settings = attention_maps.MapSettings(kind="rollout", query=5, fusion="max", discard_ratio=0.2, end_layer=-2)
    torch.testing.assert_close(torch.from_numpy(attention_maps.attention_map(analysis, settings)),
                               full[0, 5, 3:].reshape(5, 7), rtol=0, atol=1e-6)
    torch.testing.assert_close(attention_maps.layer_attention(analysis, 1, None, "min"),
                               fuse_heads(attentions[1], "min"), rtol=0, atol=1e-6)
    torch.testing.assert_close(attention_maps.layer_attention(analysis, 1, 2), attentions[1][:, 2], rtol=0, atol=1e-6)
    expected = layer_stats(attentions, (5, 7), 4, 3)
    distance, entropy = analysis.stats()
    torch.testing.assert_close(torch.from_numpy(entropy), expected["entropy"][:, 0], rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.from_numpy(distance), expected["distance"][:, 0], rtol=1e-6, atol=1e-5)


def test_a_whole_matrix_over_the_memory_limit_is_refused_naming_the_cli(monkeypatch):
    from PIL import Image

    from vit.checkpoint import Checkpoint, Preprocessing
    from vit.costs.bounds import TooManyTokens
    from vit.explain.views import attention_maps, image_analysis

    torch.manual_seed(0)
    checkpoint = Checkpoint(ViT(REGISTERS).eval(), ["a", "b", "c"], Preprocessing.default_for(REGISTERS))
    analysis = image_analysis.analyse(checkpoint, Image.new("RGB", (16, 16)))
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.001")  # 1 KB: under even one 19 x 19 matrix
    with pytest.raises(TooManyTokens, match="vit.predict --save-maps"):
        attention_maps.layer_attention(analysis, 0, None)
    with pytest.raises(TooManyTokens, match="VIT_ANALYSIS_MEMORY_MB"):
        attention_maps.attentions_npz(analysis, ["a", "b", "c"])


def test_gradient_maps_past_the_memory_limit_are_refused_up_front_with_the_largest_size_that_fits(monkeypatch):
    from PIL import Image

    from vit.checkpoint import Checkpoint, Preprocessing
    from vit.costs.bounds import TooManyTokens
    from vit.explain.views import method_maps

    torch.manual_seed(0)
    checkpoint = Checkpoint(ViT(REGISTERS).eval(), ["a", "b", "c"], Preprocessing.default_for(REGISTERS))
    # LRP: 3 layers x 3 heads x T² tokens x 16 bytes beside every block's activations, 3 layers x (11 x 24 + 2 x 48)
    # and 4 x 24 floats a token (4,704 bytes): 19 tokens, 52 KB + 89 KB over 0.04 MB (41,943 bytes); a 3 x 3 grid
    # (12 tokens) 20,736 + 56,448 bytes, still over; 2 x 2 (7 tokens) 7,056 + 32,928, under it: 8 px. AttnLRP
    # counts its own way (``plan.attnlrp``: each block's input, one block's graph under its rules): 12 px, as before.
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.04")
    for kind, side in (("lrp", 8), ("attnlrp", 12)):
        with pytest.raises(TooManyTokens, match=f"largest square input that fits is {side} px"):
            method_maps.model_method_map(checkpoint, Image.new("RGB", (16, 16)), kind, 0)


def test_chunked_gradient_maps_past_the_memory_limit_are_refused_up_front_with_the_largest_size_that_fits(
        monkeypatch):
    from PIL import Image

    from vit.checkpoint import Checkpoint, Preprocessing
    from vit.costs.bounds import TooManyTokens
    from vit.explain.methods.chunked import CHUNK_BYTES, gradient_bytes
    from vit.explain.views import method_maps

    torch.manual_seed(0)
    checkpoint = Checkpoint(ViT(REGISTERS).eval(), ["a", "b", "c"], Preprocessing.default_for(REGISTERS))
    # LeGrad's bytes at a 3 x 3 grid (12 tokens) as the limit: a 4 x 4 grid is over it, 3 x 3 (12 px) the largest
    limit = costs_memory.legrad_bytes(checkpoint.model, (3, 3), -2)
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str(limit / 2**20))
    with pytest.raises(TooManyTokens, match="LeGrad .* the largest square input that fits is 12 px"):
        method_maps.model_method_map(checkpoint, Image.new("RGB", (16, 16)), "legrad", 0)
    assert gradient_bytes(3, 24, 48, 19, True, CHUNK_BYTES) > gradient_bytes(3, 24, 48, 19, False, CHUNK_BYTES)


def test_the_class_map_past_the_whole_gradients_bound_is_the_chunked_row_of_the_same_rollout(monkeypatch):
    from PIL import Image

    from vit.checkpoint import Checkpoint, Preprocessing
    from vit.explain.views import attention_maps, image_analysis, method_maps

    model = sharp(REGISTERS)
    checkpoint = Checkpoint(model, ["a", "b", "c"], Preprocessing.default_for(REGISTERS))
    image = Image.effect_noise((16, 16), 60).convert("RGB")
    analysis = image_analysis.analyse(checkpoint, image)
    whole = method_maps.class_relevance(checkpoint, image, 1)
    assert whole.terms and whole.contexts is None
    # (A tiny model's whole gradients take less than its chunked path's fixed terms: the bound is moved by hand.)
    monkeypatch.setattr(costs_memory, "whole_gradient_bytes", lambda model, tokens, layers=None: 2**40)
    for module in (method_maps, costs_memory):
        monkeypatch.setattr(module, "CHUNK_BYTES", 4096)
    chunked = method_maps.class_relevance(checkpoint, image, 1)
    assert not chunked.terms and chunked.contexts.shape == (1, 3, 19, 3, 8)
    for query, end_layer in ((0, -1), (7, 1)):
        settings = attention_maps.MapSettings(kind="class", class_index=1, query=query, end_layer=end_layer)
        np.testing.assert_allclose(attention_maps.attention_map(analysis, settings, chunked),
                                   attention_maps.attention_map(analysis, settings, whole), rtol=0, atol=1e-6)


def sharp(config: ViTConfig) -> ViT:
    """A model whose weights are drawn wide (std 0.2, not 0.02): gradients of the attention of the order of 0.1,
    so that an absolute tolerance of 1e-6 tests them."""
    torch.manual_seed(0)
    model = ViT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    return model


def pattern_gradients(model, images, index, layers):
    """The unchunked reference: d(class score read at each layer's output)/d(that layer's whole attention), by
    autograd through the explicit attention path (the probabilities cached at ``hook_pattern``)."""
    names = [f"blocks.{i}.{p}" for i in layers for p in ("hook_resid_post", "attn.hook_pattern")]
    with torch.enable_grad():
        _, cache = model.run_with_cache(images.clone().requires_grad_(True), names)
        grads = []
        for i in layers:
            score = model.classify(cache[f"blocks.{i}.hook_resid_post"]).gather(1, index[:, None]).sum()
            grads.append(torch.autograd.grad(score, cache[f"blocks.{i}.attn.hook_pattern"], retain_graph=True)[0])
    return grads


@pytest.mark.parametrize("config", [REGISTERS, ROTARY], ids=["registers", "rotary"])
@pytest.mark.parametrize(("head_chunk", "query_chunk"), CHUNKS)
def test_chunked_legrad_equals_legrad_of_the_whole_attention_gradients(config, head_chunk, query_chunk):
    from vit.explain.methods.relevance import legrad, legrad_from_gradients

    model, images, index = sharp(config), torch.randn(2, 3, 20, 28), torch.tensor([2, 0])
    expected = legrad_from_gradients(pattern_gradients(model, images, index, range(config.num_layers)), (5, 7),
                                     model.num_prefix_tokens)
    ours = legrad(model, images, index, start_layer=0, head_chunk=head_chunk, query_chunk=query_chunk)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("config", [REGISTERS, ROTARY], ids=["registers", "rotary"])
@pytest.mark.parametrize(("head_chunk", "query_chunk"), CHUNKS)
def test_row_vector_gradient_rollout_equals_a_row_of_the_whole_gradient_rollout(config, head_chunk, query_chunk):
    from vit.explain.methods.attention import class_gradients, gradient_rollout

    model, grid = sharp(config), (5, 7)
    images, index = torch.randn(2, 3, 20, 28), torch.tensor([1, 2])
    with torch.no_grad():
        _, hidden = forward_with_hidden_states(model, images)
    _, attentions, gradients = class_gradients(model, images, index)  # every layer's whole (B, H, T, T)
    inputs = LayerInputs(model, hidden, grid, head_chunk=head_chunk, query_chunk=query_chunk)
    contexts = inputs.context_gradients(index)  # (B, L, T, H, hd)
    for end_layer in (-1, 0):
        full = gradient_rollout(attentions, gradients, end_layer)  # (B, T, T)
        for query in (0, model.num_prefix_tokens + 6):
            torch.testing.assert_close(inputs.gradient_rollout_row(contexts, query, end_layer), full[:, query],
                                       rtol=0, atol=1e-6)


def test_negative_layers_count_from_the_end():
    model, hidden, attentions, grid = run(REGISTERS)
    inputs = LayerInputs(model, hidden, grid)
    torch.testing.assert_close(inputs.rows(-1, [0, 5]), attentions[-1][:, :, [0, 5]], rtol=0, atol=1e-6)
    torch.testing.assert_close(inputs.fused(-2, 5), fuse_heads(attentions[-2])[:, 5], rtol=0, atol=1e-6)


def test_attention_flow_past_its_token_limit_is_refused_before_any_forward(monkeypatch):
    from PIL import Image

    from vit.checkpoint import Checkpoint, Preprocessing
    from vit.costs.bounds import TooManyTokens
    from vit.explain.methods import attention_flow
    from vit.explain.views import method_maps

    torch.manual_seed(0)
    model = ViT(REGISTERS).eval()
    checkpoint = Checkpoint(model, ["a", "b", "c"], Preprocessing.default_for(REGISTERS))
    forwards = []

    def spy(*args, **kwargs):
        forwards.append(kwargs)
        raise AssertionError("the model ran before the flow's bound was checked")

    monkeypatch.setattr(model, "forward", spy)
    # 19 tokens (3 prefix + a 4 x 4 grid) over a limit of 12: 9 patches fit, a 3 x 3 grid, 12 px.
    monkeypatch.setattr(attention_flow, "MAX_FLOW_TOKENS", 12)
    with pytest.raises(TooManyTokens, match="19 tokens .* limit of 12.* fits is 12 px"):
        method_maps.model_method_map(checkpoint, Image.new("RGB", (16, 16)), "flow", 0)
    assert forwards == []


@pytest.mark.parametrize(("kind", "blocks"), [("legrad", 3 + 1), ("lrp", 3), ("attnlrp", 3), ("class", 3),
                                              ("class chunked", 2 * 3)])
def test_gradient_maps_report_each_block_and_stop_where_their_progress_says_so(monkeypatch, kind, blocks):
    from PIL import Image

    from vit.app import work
    from vit.checkpoint import Checkpoint, Preprocessing
    from vit.explain.views import method_maps

    torch.manual_seed(0)
    checkpoint = Checkpoint(ViT(REGISTERS).eval(), ["a", "b", "c"], Preprocessing.default_for(REGISTERS))
    image = Image.new("RGB", (16, 16))
    if kind == "class chunked":
        monkeypatch.setattr(costs_memory, "whole_gradient_bytes", lambda *args: 2**62)  # one block at a time

    def run(progress):
        if kind.startswith("class"):
            return method_maps.class_relevance(checkpoint, image, 1, progress=progress)
        return method_maps.model_method_map(checkpoint, image, kind, 1, progress=progress)

    reports = []
    run(lambda done, total: reports.append((done, total)))
    assert reports == [(i, blocks) for i in range(1, blocks + 1)]

    def stop_at_the_second_block(done, total):
        if done == 2:
            raise work.Stopped("its page was closed")

    with pytest.raises(work.Stopped, match="its page was closed"):
        run(stop_at_the_second_block)


def test_the_row_vector_rollout_reports_every_chunk_and_stops_where_its_progress_says_so():
    from vit.app import work

    model, hidden, attentions, grid = run(REGISTERS)
    inputs = LayerInputs(model, hidden, grid, query_chunk=5)  # 38 tokens: 8 query chunks per layer
    reports = []
    row = inputs.rollout_row(0, num_prefix_tokens=3, progress=lambda done, total: reports.append((done, total)))
    assert reports == [(0, 3)] * 8 + [(1, 3)] * 8 + [(2, 3)] * 8 + [(3, 3)]
    torch.testing.assert_close(row, rollout(attentions, num_prefix_tokens=3)[:, 0], rtol=0, atol=1e-6)

    def closed(done, total):
        raise work.Stopped("its page was closed")

    with pytest.raises(work.Stopped):
        inputs.rollout_row(0, num_prefix_tokens=3, progress=closed)


def test_the_class_map_of_a_model_with_a_logit_bias_past_its_whole_path_is_refused_before_the_work(monkeypatch):
    import re

    from PIL import Image

    from vit.checkpoint import Checkpoint, Preprocessing
    from vit.core.inference import InputSize
    from vit.costs import plan
    from vit.explain.views import method_maps

    # BEiT's relative position bias: the path in chunks forms a layer's attention from its queries and keys alone
    # (``hidden.queries_keys_values`` refuses the bias), so it once ran every layer's context gradients and only
    # then refused, at the map's row. 96 px: 577 tokens, whole 33.8 MB, in chunks 19.9: under 25 MB it took chunks.
    config = ViTConfig(image_size=16, patch_size=4, num_classes=3, hidden_size=24, num_layers=2, num_heads=3,
                       mlp_size=48, rel_pos="beit")
    torch.manual_seed(0)
    checkpoint = Checkpoint(ViT(config).eval(), ["a", "b", "c"], Preprocessing.default_for(config))
    image = Image.effect_noise((96, 96), 60).convert("RGB")
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "25")
    with monkeypatch.context() as work:
        for name in ("forward_with_hidden_states", "class_gradients"):
            work.setattr(method_maps, name, lambda *args, **kwargs: pytest.fail("the work ran"))
        with pytest.raises(plan.TooManyTokens, match="adds a relative position bias") as error:
            method_maps.class_relevance(checkpoint, image, 1, InputSize(96))
    message = str(error.value)
    assert "\n" not in message
    side = int(re.search(r"the largest square input that fits is (\d+) px", message)[1])
    assert side < 96
    at = method_maps.class_relevance(checkpoint, image, 1, InputSize(side))  # the size it names runs, whole
    assert at.terms and at.row(0, -1).shape == (1, 1 + (side // 4) ** 2)
    bigger = side + 4  # and the next one is over the limit again
    with pytest.raises(plan.TooManyTokens, match="adds a relative position bias"):
        method_maps.class_relevance(checkpoint, image, 1, InputSize(bigger))
