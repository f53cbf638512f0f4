"""GroupViT's vision tower (issue 117 item 6, ``vit.sources.library_road.placing.group_tokens``): its first stage's
layers attend over the patches with the stage's learnt group tokens after them, and are recorded and placed; the
token-assign steps and the later stages, over groups that sit nowhere on the image, are run and named, never layers.

Reference: transformers' own eager attention of each first-stage layer (``GroupViTAttention`` called with
``output_attentions=True`` on the hidden states the layer received). GroupViT's position embeddings take only its
square input, so the placement check reads a query's row back on the grid against the library's own row, which is
not symmetric: a transposed grid fails."""

from __future__ import annotations

import pytest
import torch
from layer_reference import widened
from parity_helpers import run_hooked
from PIL import Image

import vit
from vit.core.inference import preprocess

transformers = pytest.importorskip("transformers")

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.3, 0.4)


@pytest.fixture(scope="module")
def tower():
    config = transformers.GroupViTVisionConfig(hidden_size=16, intermediate_size=32, depths=[2, 1, 1],
                                               num_hidden_layers=4, num_group_tokens=[4, 2, 0],
                                               num_output_groups=[4, 2, 2], num_attention_heads=2, image_size=32,
                                               patch_size=8)
    torch.manual_seed(0)
    return widened(transformers.GroupViTVisionModel(config).eval(), matrices_only=True)


def eager(model, pixels):
    """The library's own attention of each first-stage layer: its module called eagerly on what it was given."""
    stage = model.vision_model.encoder.stages[0]
    given = []
    handles = [layer.self_attn.register_forward_pre_hook(
        lambda m, args, kwargs: given.append((m, args[0] if args else kwargs["hidden_states"])), with_kwargs=True)
        for layer in stage.layers]
    run_hooked(handles, lambda: model(pixel_values=pixels))
    with torch.no_grad():
        return [m(hidden_states=h, output_attentions=True)[1] for m, h in given]


def test_groupvits_first_stage_is_recorded_over_its_patches_and_group_tokens_as_its_own_attention(tower):
    checkpoint = vit.load(tower, image_size=32, mean=MEAN, std=STD)
    wrapped = checkpoint.model
    assert wrapped.names == ["vision_model.encoder.stages.0.layers.0.self_attn",
                             "vision_model.encoder.stages.0.layers.1.self_attn"]
    layout = wrapped.layout
    assert layout.grid == (4, 4) and layout.num_prefix_tokens == 0 and layout.num_suffix_tokens == 4
    aside = checkpoint.metadata["not_layers"]
    assert "stages.0.group_token" in aside and "stages.1.layers.0.self_attn" in aside and "pre_assign_attn" in aside
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    _, kept = wrapped.run(x, layers=range(2))
    own = eager(tower, x)
    assert len(own) == 2 and own[0].shape == (1, 2, 20, 20)
    for layer in range(2):
        torch.testing.assert_close(kept[layer], own[layer], atol=1e-5, rtol=0)
    image = Image.fromarray((torch.rand(32, 32, 3, generator=torch.Generator().manual_seed(2)) * 255).byte().numpy())
    explanation = vit.explain(checkpoint, image, "attention", layer=1, head=1, query=6)
    row = eager(tower, preprocess([image], checkpoint.preprocessing))[1][0, 1, 6, :16].reshape(4, 4)
    assert not torch.allclose(row, row.T, atol=1e-3)  # a transposed placement would not match
    torch.testing.assert_close(torch.from_numpy(explanation.map), row, atol=1e-5, rtol=0)
