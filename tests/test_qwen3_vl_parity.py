"""Qwen3-VL's vision tower opened from the VLM's own folder (a random tiny Qwen3VLForConditionalGeneration that
transformers builds and saves in small shards, its processor beside it), against transformers itself: every layer's
attention as its ``eager_attention_forward`` computes it, taken back to the grid, at two aspect ratios (the learned
table resized to each grid, the rotary positions); the merger's tokens and each DeepStack merger's as
``get_image_features`` gives them; reading only the tower's shards."""

import json

import numpy as np
import pytest
import torch
from parity_helpers import ATOL, randomize
from PIL import Image

transformers = pytest.importorskip("transformers")
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration  # noqa: E402
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor  # noqa: E402
from transformers.models.qwen3_vl import modeling_qwen3_vl  # noqa: E402
from transformers.vision_utils import get_vision_position_ids  # noqa: E402

import vit  # noqa: E402
from vit.core.inference import preprocess  # noqa: E402
from vit.sources import open as sources  # noqa: E402

VISION = dict(depth=4, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=24,
              num_position_embeddings=64, deepstack_visual_indexes=[1, 2])  # an 8 x 8 table, two DeepStack taps
TEXT = dict(hidden_size=24, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            head_dim=12, vocab_size=64, max_position_embeddings=64,
            rope_parameters={"rope_type": "default", "mrope_section": [2, 2, 2], "rope_theta": 10000.0,
                             "mrope_interleaved": True})
IMAGES = [(310, 230), (130, 400)]  # (width, height): a landscape (a 12 x 18 grid), a tall strip (24 x 8)


@pytest.fixture(scope="module")
def qwen():
    config = Qwen3VLConfig(vision_config=VISION, text_config=TEXT)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return randomize(Qwen3VLForConditionalGeneration(config))


@pytest.fixture(scope="module")
def folder(qwen, tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_vl")
    qwen.save_pretrained(path, max_shard_size="20KB")
    Qwen2VLImageProcessor(patch_size=16, merge_size=2, min_pixels=64 * 64, max_pixels=32 * 32 * 64,
                          image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(path)
    return path


def image(size: tuple[int, int]) -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def transformers_run(qwen, folder, picture, modeling=modeling_qwen3_vl, depth: int = VISION["depth"]):
    """The processor's input, its grid, each layer's attention as transformers' eager function (``modeling``'s: a
    Qwen-VL's modelling file) computes it placed on the row-major grid ``(H, T, T)``, and ``get_image_features``."""
    theirs = Qwen2VLImageProcessor.from_pretrained(folder)(images=[picture], return_tensors="pt")
    grid = tuple(theirs["image_grid_thw"][0, 1:].tolist())
    calls, eager = [], modeling.eager_attention_forward

    def spy(module, query, key, value, attention_mask, **kwargs):
        out, weights = eager(module, query, key, value, attention_mask, **kwargs)
        calls.append(weights.detach()[0])
        return out, weights

    modeling.eager_attention_forward = spy
    try:
        with torch.no_grad():
            features = qwen.get_image_features(theirs["pixel_values"], theirs["image_grid_thw"])
    finally:
        modeling.eager_attention_forward = eager
    assert len(calls) == depth  # one image, global attention: one call a layer
    ids = get_vision_position_ids(theirs["image_grid_thw"], 2)  # (T, 2): each of Qwen's tokens' (row, column)
    token = ids[:, 0] * grid[1] + ids[:, 1]  # its place on the row-major grid
    placed = []
    for reference in calls:
        on_grid = torch.zeros_like(reference)
        on_grid[:, token[:, None], token[None, :]] = reference
        placed.append(on_grid)
    return grid, placed, features


@pytest.mark.parametrize("size", IMAGES)
def test_every_layer_attention_the_merger_and_deepstack_equal_transformers(qwen, folder, size):
    checkpoint, picture = vit.load(folder), image(size)
    model = checkpoint.model
    grid, reference, features = transformers_run(qwen, folder, picture)
    x = preprocess([picture], checkpoint.preprocessing, patch_size=16)
    assert x.shape[-2:] == (grid[0] * 16, grid[1] * 16) and grid != (8, 8)  # the table is resized
    with torch.no_grad():
        states, attentions = model.tokens(x, output_attentions=True)
        _, cache = model.run_with_cache(x, [f"blocks.{i}.hook_resid_post" for i in VISION["deepstack_visual_indexes"]])
        projected = model.project(states, grid)[0]
        taps = [model.project(cache[f"blocks.{i}.hook_resid_post"], grid, tap=t)[0]
                for t, i in enumerate(VISION["deepstack_visual_indexes"])]
    for layer, (ours, want) in enumerate(zip(attentions, reference, strict=True)):
        assert torch.allclose(ours[0], want, atol=ATOL), f"layer {layer}"
    assert torch.allclose(projected, features.pooler_output[0], atol=ATOL)
    for ours, want in zip(taps, features.deepstack_features, strict=True):  # each split by image
        assert torch.allclose(ours, want[0], atol=ATOL)


def test_explain_draws_a_query_row_on_the_grid_as_transformers_computes_it(qwen, folder):
    picture = image(IMAGES[1])
    grid, reference, _ = transformers_run(qwen, folder, picture)
    query = 13 * grid[1] + 5
    shown = vit.explain(vit.load(folder), picture, "attention", layer=1, head=0, query=query)
    assert shown.grid == grid and shown.num_prefix_tokens == 0
    assert np.allclose(shown.map, reference[1][0, query].view(grid).numpy(), atol=ATOL)


def test_the_position_table_taken_as_its_own_size_does_not_match(qwen, folder):
    """What the test above would catch: the table resized with align_corners=False (HF ViT's, timm's bilinear)."""
    from dataclasses import replace

    from vit.sources.open import build_model

    checkpoint, picture = vit.load(folder), image(IMAGES[0])
    x = preprocess([picture], checkpoint.preprocessing, patch_size=16)
    other = build_model(replace(checkpoint.config, pos_resize="bilinear"), checkpoint.model.state_dict(), "test")
    with torch.no_grad():
        assert (other.tokens(x)[0] - checkpoint.model.tokens(x)[0]).abs().max() > 0.01


def test_only_the_towers_shards_are_read(folder, monkeypatch):
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    tower = {shard for key, shard in index.items() if key.startswith("model.visual.")}
    assert set(index.values()) - tower
    from vit.sources import weights_files

    opened, real = [], weights_files.read_weights

    def spy(path, *args, **kwargs):
        opened.append(path.name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(weights_files, "read_weights", spy)
    checkpoint = sources.open_source(folder)
    assert set(opened) == tower and checkpoint.config.deepstack_layers == (1, 2)
    with pytest.raises(ValueError, match="2 DeepStack mergers"):
        checkpoint.model.project(torch.zeros(1, 4, 32), (2, 2), tap=2)
