"""A transformers vision tower with no module named ``embeddings`` (issue 117, item 6;
``vit.sources.library_road.placing.tower_tokens``): Llama 4's vision model opens from the folder transformers saves, its
``class_embedding`` placed after the patches as its forward concatenates it; every layer's attention equals the
probabilities of its modelling file's ``vision_eager_attention_forward`` (the model built with eager attention), and a
drawn map is a patch's eager row over the patches, placed row-major (elementwise: a class token taken for a prefix
shifts every key by one, a transposed grid moves them, and both fail). Its position table holds its config's one
square size. Built tiny with random weights in transformers, never downloaded."""

from __future__ import annotations

import pytest
import torch
from layer_reference import caught_eager, widened

import vit

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama4(tmp_path_factory):
    torch.manual_seed(0)
    model = widened(transformers.Llama4VisionModel(transformers.Llama4VisionConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
        patch_size=8, vision_output_dim=32, projector_input_dim=32, projector_output_dim=32)))
    folder = tmp_path_factory.mktemp("llama4")
    model.save_pretrained(folder)
    transformers.Llama4ImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


def _eager(folder, pixels) -> list[torch.Tensor]:
    from transformers.models.llama4 import modeling_llama4

    model = transformers.Llama4VisionModel.from_pretrained(folder, attn_implementation="eager").eval()
    return caught_eager(modeling_llama4, lambda: model(pixel_values=pixels), "vision_eager_attention_forward")


def test_llama4s_class_token_sits_after_its_patches_and_every_layer_is_transformers_eager(llama4):
    from PIL import Image

    from vit.core.inference import preprocess

    checkpoint = vit.load(llama4, device="cpu")
    layout = checkpoint.model.layout
    assert (layout.num_prefix_tokens, layout.num_suffix_tokens, layout.grid) == (0, 1, (4, 4))
    image = Image.fromarray((torch.rand(40, 28, 3, generator=torch.Generator().manual_seed(3)) * 255).byte().numpy())
    pixels = preprocess([image], checkpoint.preprocessing)
    _, kept = checkpoint.model.run(pixels, layers=range(2))
    expected = _eager(llama4, pixels)
    assert len(expected) == 2
    for layer in range(2):
        assert kept[layer].shape == expected[layer].shape == (1, 4, 17, 17)
        torch.testing.assert_close(kept[layer], expected[layer], atol=1e-6, rtol=0)
    query = 4 + 2  # the patch at row 1, column 2: no token before the patches
    drawn = vit.explain(checkpoint, image, "attention", layer=1, head=2, query=query)
    torch.testing.assert_close(torch.from_numpy(drawn.map), expected[1][0, 2, query, :16].reshape(4, 4), atol=1e-6,
                               rtol=0)


@pytest.mark.parametrize("model_type, module", [("mllama_vision_model", "tiled_towers"),
                                                ("qwen2_5_vl_vision", "merged_towers"),
                                                ("qwen3_vl_vision", "merged_towers")])
def test_towers_fed_their_own_input_open_through_their_own_layouts(model_type, module):
    """Fast: Mllama's tile slots and the Qwen VL towers' flattened patches are opened by modules of their own (their
    tests: test_library_tiled_towers, test_library_merged_towers), never counted here; a tower this module does not
    place is refused in one line."""
    from vit.sources.library_road import transformers_models
    from vit.sources.library_road.placing import tower_tokens

    assert transformers_models.OWN_LAYOUTS[model_type] == f"vit.sources.library_road.{module}"
    with pytest.raises(ValueError, match=r"^it has no embeddings module to count its prefix tokens from$"):
        tower_tokens.count(torch.nn.Linear(1, 1), False)
