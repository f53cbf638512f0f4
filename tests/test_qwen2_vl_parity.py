"""Qwen2-VL's vision tower (issue 92, a named family) opened from the VLM's own folder (a random tiny
Qwen2VLForConditionalGeneration that transformers builds and saves, its processor beside it), against transformers
itself: every layer's attention as its ``eager_attention_forward`` computes it, taken back to the row-major grid, at
two aspect ratios (the rotary positions), and the merger's tokens as ``get_image_features`` gives them.

Qwen2-VL's tower is Qwen2.5-VL's rotary positions and merger without its windows, with LayerNorms and a QuickGELU MLP
(``embed_dim`` wide: its ``hidden_size`` is the language model's)."""

import numpy as np
import pytest
import torch
from parity_helpers import ATOL, randomize
from test_qwen3_vl_parity import IMAGES, image, transformers_run

transformers = pytest.importorskip("transformers")
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration  # noqa: E402
from transformers.models.qwen2_vl import modeling_qwen2_vl  # noqa: E402
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor  # noqa: E402

import vit  # noqa: E402
from vit.core.inference import preprocess  # noqa: E402

VISION = dict(depth=3, embed_dim=32, mlp_ratio=2, num_heads=2, hidden_size=24, patch_size=14)
TEXT = dict(hidden_size=24, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            vocab_size=64, max_position_embeddings=64,
            rope_parameters={"rope_type": "default", "mrope_section": [2, 2, 2], "rope_theta": 10000.0})


@pytest.fixture(scope="module")
def qwen():
    config = Qwen2VLConfig(vision_config=VISION, text_config=TEXT)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return randomize(Qwen2VLForConditionalGeneration(config))


@pytest.fixture(scope="module")
def folder(qwen, tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2_vl")
    qwen.save_pretrained(path, max_shard_size="20KB")
    Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=28 * 28 * 60).save_pretrained(path)
    return path


@pytest.mark.parametrize("size", IMAGES)
def test_every_layer_attention_and_the_merger_equal_transformers(qwen, folder, size):
    checkpoint, picture = vit.load(folder, device="cpu"), image(size)
    assert checkpoint.road == "port" and checkpoint.config.norm == "layer" and not checkpoint.config.window_size
    model = checkpoint.model
    grid, reference, features = transformers_run(qwen, folder, picture, modeling_qwen2_vl, VISION["depth"])
    merged = features.pooler_output[0]
    x = preprocess([picture], checkpoint.preprocessing, patch_size=14)
    assert x.shape[-2:] == (grid[0] * 14, grid[1] * 14) and grid[0] != grid[1]
    with torch.no_grad():
        states, attentions = model.tokens(x, output_attentions=True)
        projected = model.project(states, grid)[0]
    assert len(attentions) == len(reference) == VISION["depth"]
    for layer, (ours, want) in enumerate(zip(attentions, reference, strict=True)):
        assert torch.allclose(ours[0], want, atol=ATOL), f"layer {layer}"
        assert not torch.allclose(ours[0], want.transpose(-1, -2), atol=ATOL)
    assert torch.allclose(projected, merged, atol=ATOL)


def test_its_attention_map_is_drawn_on_the_processors_grid(folder):
    picture = image(IMAGES[0])
    drawn = vit.explain(vit.load(folder, device="cpu"), picture, "attention", layer=-1, query=5)
    theirs = Qwen2VLImageProcessor.from_pretrained(folder)(images=[picture], return_tensors="pt")
    assert drawn.map.shape == tuple(theirs["image_grid_thw"][0, 1:].tolist())
    assert np.isfinite(drawn.map).all()
