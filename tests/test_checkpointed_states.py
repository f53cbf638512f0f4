"""Issue 68, speed and memory: past the memory bound the explorer's analysis keeps the residual stream every k-th
layer only (``hidden.CheckpointedStates``) and recomputes the rest from the checkpoint below, and every map drawn
from it (each layer's and head's attention, the rollout, the token norms, the heads' statistics) equals the one drawn
from every layer's states kept whole. The cost model chooses k from the bound (``plan.analysis``), answers "chunks"
for Qwen2.5-VL-7B's tower at its default 1,024 px (5,476 patches) under 1 GB and refuses past it in one line; a
scaled tower's analysis and maps stay under the bound in a subprocess (peak RSS), where its states alone are over."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from peak_memory import ALLOCATOR_SLACK, MEMORY_GROUP, can_reset_the_peak, run_measured
from PIL import Image

from vit.checkpoint import Checkpoint, Preprocessing
from vit.core.cache import ByteCache
from vit.core.inference import InputSize
from vit.costs import memory, plan
from vit.explain.methods.hidden import CheckpointedStates, forward_with_hidden_states
from vit.explain.views import attention_maps, image_analysis
from vit.model import ViT
from vit.sources.vlm import import_qwen

ROOT = Path(__file__).resolve().parents[1]

# Qwen2.5-VL-7B-Instruct's vision_config (its config.json), as the importer reads it
QWEN_7B = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584, patch_size=14,
               spatial_merge_size=2, window_size=112, fullatt_block_indexes=[7, 15, 23, 31])
# A small tower of the same layout: 4-px patches, 2x2 merge units, 32-px windows (8x8 patches), a global layer every
# fourth as the 7B's
SMALL = dict(depth=8, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=24, patch_size=4,
             spatial_merge_size=2, window_size=32, fullatt_block_indexes=[3, 7])


def tower(vision: dict, device: str | None = None) -> ViT:
    config = import_qwen.config_from_hf({"model_type": "qwen2_5_vl", "vision_config": vision})
    torch.manual_seed(0)
    if device == "meta":
        with torch.device("meta"):
            return ViT(config)
    model = ViT(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # away from the initialisation's ones and zeros, as a trained tower is
            p.add_(torch.randn_like(p) * 0.05)
    return model


def checkpoint_of(model: ViT) -> Checkpoint:
    return Checkpoint(model, [], Preprocessing(model.config.image_size, 3, (0.5,) * 3, (0.5,) * 3))


def photo(side: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8))


# --- the cost model ----------------------------------------------------------------------------------------------

def test_kept_layers_are_every_kth_state_and_the_last():
    assert memory.kept_layers(32, 4) == (0, 4, 8, 12, 16, 20, 24, 28, 32)
    assert memory.kept_layers(8, 3) == (0, 3, 6, 8)
    assert memory.kept_layers(5, 1) == (0, 1, 2, 3, 4, 5)


def test_the_7b_tower_at_1024_px_runs_in_chunks_under_one_gigabyte(monkeypatch):
    monkeypatch.delenv("VIT_ANALYSIS_MEMORY_MB", raising=False)
    model = tower(QWEN_7B, "meta")  # its shapes, no weights
    cost = plan.analysis(model, (74, 74))  # smart_resize(1,024 x 1,024) -> 1,036 px -> 74 x 74 patches
    assert cost.tokens == 5476
    assert cost.memory > 2**30  # every layer's states whole: 33 x 5,476 x 1,280 x 4 bytes alone are 925 MB
    assert plan.decide(cost) == "chunks"
    assert cost.chunked <= 2**30 and 1 < cost.every < 32


def test_the_7b_tower_past_the_bound_is_refused_in_one_line(monkeypatch):
    monkeypatch.delenv("VIT_ANALYSIS_MEMORY_MB", raising=False)
    cost = plan.analysis(tower(QWEN_7B, "meta"), (100, 100), "A 1,400×1,400 px input")
    with pytest.raises(plan.TooManyTokens) as refused:
        plan.decide(cost)
    message = str(refused.value)
    assert "\n" not in message and "10,000 tokens" in message and "kept every" in message
    assert "1,024 MB limit" in message


def test_a_view_that_keeps_every_state_is_refused_where_only_the_chunks_fit(monkeypatch):
    from vit.costs.fits import check_input_fits

    monkeypatch.delenv("VIT_ANALYSIS_MEMORY_MB", raising=False)
    checkpoint = checkpoint_of(tower(QWEN_7B, "meta"))
    assert check_input_fits(checkpoint, (74, 74), chunks=True) == "chunks"
    with pytest.raises(plan.TooManyTokens, match="over the 1,024 MB limit"):
        check_input_fits(checkpoint, (74, 74))  # the mechanism views keep every layer's states


# --- the checkpointed maps equal the whole-kept ones --------------------------------------------------------------

def test_checkpointed_states_equal_the_forwards_own():
    model = tower(SMALL)
    x = torch.randn(1, 3, 48, 80)  # a 12 x 20 patch grid: windows cut by the edges
    grid = model.patch_grid(48, 80)
    with torch.inference_mode():
        _, whole = forward_with_hidden_states(model, x)  # (1, L + 1, T, D)
        _, kept = forward_with_hidden_states(model, x, memory.kept_layers(8, 3))
    states = CheckpointedStates(model, kept[0], 3, grid)
    assert states.shape == whole.shape[1:] and states.numel() == 4 * whole[0, 0].numel()
    for layer in [8, 7, 6, 5, 4, 3, 2, 1, 0, 4, 1]:  # from the top down as the rollout reads, then at random
        torch.testing.assert_close(states[layer], whole[0, layer], rtol=0, atol=1e-6)
    assert len(states.segment) <= 2  # one segment between two checkpoints held


@pytest.fixture(scope="module")
def analyses():
    """One image's analysis with every state kept, and with the states kept every few layers (the bound set just
    under what the whole path needs)."""
    checkpoint = checkpoint_of(tower(SMALL))
    image, size = photo(96), InputSize(96)  # 24 x 24 patches: 9 windows, 576 tokens
    whole = image_analysis.analyse(checkpoint, image, size)
    need = plan.analysis(checkpoint.model, (24, 24)).memory
    with pytest.MonkeyPatch.context() as patched:  # a module fixture: the bound set back as it was, set or not
        patched.setenv("VIT_ANALYSIS_MEMORY_MB", str((need - 1) / 2**20))
        cost = plan.analysis(checkpoint.model, (24, 24))
        assert plan.decide(cost) == "chunks"
        chunked = image_analysis.analyse(checkpoint, image, size)
    assert isinstance(chunked.hidden, CheckpointedStates) and chunked.hidden.every == cost.every
    assert isinstance(whole.hidden, torch.Tensor)
    return whole, chunked


def test_every_layers_attention_is_the_same(analyses):
    whole, chunked = analyses
    for query in (0, 300, 575):
        for settings in [attention_maps.MapSettings(layer=layer, head=head, query=query)
                         for layer in range(8) for head in (None, 0, 1)]:
            np.testing.assert_allclose(attention_maps.attention_map(chunked, settings),
                                       attention_maps.attention_map(whole, settings), rtol=0, atol=1e-6)


def test_the_rollout_norms_and_statistics_are_the_same(analyses):
    whole, chunked = analyses
    for end in (-1, 4, 1):
        settings = attention_maps.MapSettings(kind="rollout", query=300, end_layer=end)
        np.testing.assert_allclose(attention_maps.rollout_map(chunked, settings),
                                   attention_maps.rollout_map(whole, settings), rtol=0, atol=1e-6)
    # the rollout by row vector from the top layer down (its factors past the cache), each layer from its states
    small = [dataclasses.replace(a, cache=ByteCache(2**10)) for a in (whole, chunked)]
    assert not attention_maps.factors_fit(small[1])
    for end in (-1, 5):
        settings = attention_maps.MapSettings(kind="rollout", query=17, end_layer=end)
        np.testing.assert_allclose(attention_maps.rollout_map(small[1], settings),
                                   attention_maps.rollout_map(small[0], settings), rtol=0, atol=1e-6)
    for layer in range(8):
        settings = attention_maps.MapSettings(kind="norms", layer=layer)
        np.testing.assert_allclose(attention_maps.attention_map(chunked, settings),
                                   attention_maps.attention_map(whole, settings), rtol=0, atol=1e-5)
    np.testing.assert_allclose(chunked.distance, whole.distance, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(chunked.entropy, whole.entropy, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(chunked.embedding, whole.embedding, rtol=0, atol=0)


# --- measured: a scaled tower's analysis and maps within the bound where its states alone are over it -------------

SCALED = dict(depth=16, hidden_size=320, intermediate_size=480, num_heads=2, out_hidden_size=24, patch_size=4,
              spatial_merge_size=2, window_size=32, fullatt_block_indexes=[7, 15])
SCALED_SIDE = 192  # 48 x 48 patches: 2,304 tokens

WORKER = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from peak_memory import peak, start
from test_checkpointed_states import SCALED, SCALED_SIDE, checkpoint_of, photo, tower
from vit.costs import plan
from vit.explain.views import attention_maps, image_analysis
from vit.core.inference import InputSize

checkpoint = checkpoint_of(tower(SCALED))


def every_map(side):
    analysis = image_analysis.analyse(checkpoint, photo(side), InputSize(side))
    middle = analysis.num_tokens // 2
    for layer in range(analysis.num_layers):
        attention_maps.attention_map(analysis, attention_maps.MapSettings(layer=layer, query=middle))
        attention_maps.attention_map(analysis, attention_maps.MapSettings(kind="norms", layer=layer))
    attention_maps.attention_map(analysis, attention_maps.MapSettings(layer=7, head=1, query=middle))
    attention_maps.rollout_map(analysis, attention_maps.MapSettings(kind="rollout", query=middle))
    analysis.stats()
    return analysis


every_map(64)  # lazy imports, thread pools: before measuring
since = start()
analysis = every_map(SCALED_SIDE)
measured = peak() - since
held = start() - since  # what the analysis keeps once its maps are drawn (collected, the heap trimmed)
cost = plan.analysis(checkpoint.model, analysis.grid)
states = 4 * (SCALED["depth"] + 1) * analysis.num_tokens * SCALED["hidden_size"]
print(json.dumps({"measured": measured, "held": held, "whole": cost.memory, "chunked": cost.chunked,
                  "every": cost.every, "states": states, "kind": type(analysis.hidden).__name__}))
'''


@pytest.mark.slow
@pytest.mark.timeout(900)  # one process of 80-230 s on an idle two-core machine: three times that with both cores busy
@pytest.mark.skipif(not can_reset_the_peak(), reason="the peak RSS cannot be reset here (/proc/self/clear_refs)")
def test_a_16_layer_towers_maps_stay_under_a_bound_its_whole_path_is_over():
    # 2,304 tokens x 320 wide: every state 48 MB, with a layer's chunks and the layouts 158 MB; in chunks, the states
    # every 2 layers, 139 MB (at this width the chunks' fixed budget, not the states, dominates). 16 layers, not the
    # 7B's 32: the same claim at half the layers' recomputation (32 layers: 248 / 167 MB under a 170 MB bound, 90-121 s
    # of a busy CI run). 192 px, not 224 (3,136 tokens: 186 / 152 MB under 155, measured 133 MB, 23.9 s of CPU; at
    # 192 px measured 114 MB, 17.2 s; issue 112): the bound still 13 MB under the whole path, the allocator's slack
    # a thirty-fifth of the count.
    limit_mb = 145
    done = run_measured(WORKER, [str(ROOT / "tests")], timeout=880, preload=MEMORY_GROUP,  # the memory group's server
                        VIT_ANALYSIS_MEMORY_MB=str(limit_mb))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["kind"] == "CheckpointedStates"
    assert result["chunked"] <= limit_mb * 2**20 < result["whole"]
    # the count bounds the peak less the allocator's slack (tests/peak_memory.py), at 152 MB many times it
    assert result["measured"] - ALLOCATOR_SLACK <= result["chunked"], result
    # Nor is every layer's state kept behind the checkpoints: the checks above all held where the forward kept every
    # state and the checkpoints were a view of them (``kind`` still CheckpointedStates, 136.6 MB measured, under the
    # 138.5 counted plus the slack), both below fail there (53.9 held; 136.6). At rest the analysis keeps less than
    # every state (17 x 2,304 x 320 floats: 47.8 MB; measured 31.4, the 9 checkpoints and a segment 28.1), and its
    # peak is under every state beside what the rollout over a global layer reads at once, its q, k and v as the
    # hooks hold them (6 T x D floats) and a chunk of attention (``memory.CHUNK_BYTES``): 114 MB measured of 128.7
    T, D = SCALED_SIDE**2 // SCALED["patch_size"] ** 2, SCALED["hidden_size"]
    assert result["states"] == 4 * (SCALED["depth"] + 1) * T * D
    assert result["held"] < result["states"] - ALLOCATOR_SLACK, result
    assert result["measured"] < result["states"] + 4 * 6 * T * D + memory.CHUNK_BYTES - ALLOCATOR_SLACK, result
