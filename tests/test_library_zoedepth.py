"""ZoeDepth (``ZoeDepthForDepthEstimation``: a BEiT backbone, a DPT neck, metric bins) on the library road (issue 117):
its processor's ``ensure_multiple_of`` read as the Hub's folders write it (32), a fractional one (transformers 5's
class default, 1/32) refused in one line that says to set it, never to remove the file (its aspect-keeping resize
would be lost); every backbone layer's attention equals transformers' own eager attention (BEiT's
``eager_attention_forward`` hooked, the whole model built with ``attn_implementation="eager"``), and a drawn map is the
eager row row-major on the grid. Built tiny with random weights in transformers, never downloaded."""

from __future__ import annotations

import pytest
import torch
from layer_reference import assert_layers_are, caught_eager, widened

import vit

transformers = pytest.importorskip("transformers")

BACKBONE = dict(model_type="beit", hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64,
                image_size=32, patch_size=8, out_indices=[1, 2, 3, 4], reshape_hidden_states=False,
                use_relative_position_bias=True, use_absolute_position_embeddings=False)  # ZoeDepth's own BEiT's


def test_a_fractional_multiple_is_refused_saying_to_set_it():
    """Fast: ZoeDepth's processor as transformers 5 writes it from its class default (1/32 of a pixel)."""
    from vit.model import ViTConfig
    from vit.sources.files import SourceError
    from vit.sources.hf_preprocessing import hf_preprocessing

    processor = transformers.ZoeDepthImageProcessor(size={"height": 32, "width": 32}).to_dict()
    assert processor["ensure_multiple_of"] == 1 / 32
    with pytest.raises(SourceError) as refused:
        hf_preprocessing(processor, ViTConfig(image_size=32, patch_size=8, num_classes=0), "ZoeDepth")
    message = str(refused.value)
    assert message.startswith("preprocessor_config.json cannot be used (ensure_multiple_of must be a whole number of "
                              "pixels from 1 to 2048, got 0.03125; set it to one in the file (the Hub's ZoeDepth "
                              "folders say 32")
    assert "fix or remove" not in message and "\n" not in message


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.ZoeDepthConfig(backbone_config=BACKBONE, neck_hidden_sizes=[8, 16, 16, 16],
                                         fusion_hidden_size=16, bottleneck_features=16)
    model = transformers.ZoeDepthForDepthEstimation(config)
    widened(model.backbone)  # the backbone's weights wide enough that every head's attention differs from uniform
    made = tmp_path_factory.mktemp("zoedepth")
    model.save_pretrained(made)
    transformers.ZoeDepthImageProcessor(size={"height": 32, "width": 48}, ensure_multiple_of=16).save_pretrained(made)
    return made


def eager_probabilities(folder, pixels: torch.Tensor) -> list[torch.Tensor]:
    from transformers.models.beit import modeling_beit

    model = transformers.ZoeDepthForDepthEstimation.from_pretrained(folder, attn_implementation="eager").eval()
    return caught_eager(modeling_beit, lambda: model(pixel_values=pixels))


@pytest.mark.slow  # builds and saves a model
def test_every_backbone_layers_attention_is_transformers_eager(folder):
    checkpoint = vit.load(folder, device="cpu")
    assert checkpoint.road == "library" and checkpoint.preprocessing.multiple_of == 16
    pixels = torch.randn(2, 3, 32, 48, generator=torch.Generator().manual_seed(1))
    _, attentions = checkpoint.model.run(pixels, layers=range(4))
    expected = eager_probabilities(folder, pixels)
    assert_layers_are(attentions, expected, 4, (2, 4, 25, 25))


@pytest.mark.slow
def test_a_drawn_map_is_the_eager_row_on_the_grid(folder):
    from PIL import Image

    from vit.core.inference import preprocess

    checkpoint = vit.load(folder, device="cpu")
    image = Image.fromarray((torch.rand(40, 60, 3, generator=torch.Generator().manual_seed(3)) * 255).byte().numpy())
    expected = eager_probabilities(folder, preprocess([image], checkpoint.preprocessing))
    pixels = preprocess([image], checkpoint.preprocessing)
    assert tuple(pixels.shape[-2:]) == (32, 48)  # its aspect kept, on a 4x6 grid
    query = 1 + 6 + 2  # CLS, then the patch at row 1, column 2
    drawn = vit.explain(checkpoint, image, "attention", layer=2, head=1, query=query)
    assert drawn.map.shape == (4, 6)
    row = expected[2][0, 1, query, 1:]
    assert torch.allclose(torch.from_numpy(drawn.map), row.reshape(4, 6), atol=1e-6, rtol=0)
