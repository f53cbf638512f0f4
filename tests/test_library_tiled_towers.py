"""Llama 3.2 Vision's tower (``MllamaVisionModel``) opens alone from the folder transformers saves (issue 117, item 6),
each image fed as the one tile of a 1 x 1 canvas in slot 0 of its tile slots, as its processor pads them: every local
and global layer's attention equals transformers' own eager attention (its modelling file's
``eager_attention_forward`` hooked, the model built with ``attn_implementation="eager"``, fed by
``MllamaImageProcessor`` itself), and a drawn map is the eager row over slot 0's patches row-major on the grid (the
slots' padding and empty slots are tokens after the patches). Built tiny with random weights in transformers."""

from __future__ import annotations

import pytest
import torch
from layer_reference import assert_layers_are, caught_eager, widened
from rows_formed import spy_formed

import vit

transformers = pytest.importorskip("transformers")

SIZE, PATCH, TILES = 32, 8, 4
TOKENS = TILES * 24  # each slot's CLS and 16 patches, padded to a multiple of 8


def test_the_tower_is_the_library_roads_own_layout_and_takes_its_tile_size_only():
    """Fast: ``opens`` routes its model_type here, and another size is refused in one line before the model runs."""
    from vit.sources.library_road import tiled_towers, transformers_models

    assert transformers_models.OWN_LAYOUTS["mllama_vision_model"] == "vit.sources.library_road.tiled_towers"
    with pytest.raises(ValueError, match=r"^Llama 3.2 Vision's tower takes 32x32-px tiles only \(its position table "
                                         r"has a row per patch\), not 32x48$"):
        tiled_towers._OneTile(torch.nn.Identity(), TILES, (SIZE, SIZE))(torch.zeros(1, 3, 32, 48))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.MllamaVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_global_layers=1, attention_heads=4, image_size=SIZE,
                                             patch_size=PATCH, max_num_tiles=TILES, intermediate_layers_indices=[0, 1],
                                             vision_output_dim=32 * 3)
    model = transformers.MllamaVisionModel(config)
    widened(model)  # weights wide enough that every head's attention differs from uniform
    made = tmp_path_factory.mktemp("mllama")
    model.save_pretrained(made)
    processor().save_pretrained(made)
    return made


def processor():
    return transformers.MllamaImageProcessor(size={"height": SIZE, "width": SIZE}, max_image_tiles=TILES)


def eager_probabilities(folder, image) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """transformers alone: the processor's inputs for ``image`` (slot 0's pixels returned) and each layer's eager
    probabilities, in the order the forward makes them."""
    from transformers.models.mllama import modeling_mllama

    inputs = processor()(images=[[image]], return_tensors="pt")
    assert inputs["aspect_ratio_ids"].tolist() == [[1]] and inputs["aspect_ratio_mask"].tolist() == [[[1, 0, 0, 0]]]
    model = transformers.MllamaVisionModel.from_pretrained(folder, attn_implementation="eager").eval()
    return inputs["pixel_values"][:, 0, 0], caught_eager(modeling_mllama, lambda: model(**inputs))


@pytest.mark.slow  # builds and saves a model
def test_every_local_and_global_layers_attention_is_transformers_eager(folder):
    from PIL import Image

    checkpoint = vit.load(folder, device="cpu")
    layout = checkpoint.model.layout
    assert checkpoint.road == "library" and layout.num_prefix_tokens == 1 and layout.num_tokens == TOKENS
    image = Image.fromarray((torch.rand(SIZE, SIZE, 3, generator=torch.Generator().manual_seed(1)) * 255).byte()
                            .numpy())
    pixels, expected = eager_probabilities(folder, image)
    out, attentions = checkpoint.model.run(pixels, layers=range(3))
    assert_layers_are(attentions, expected, 3, (1, 4, TOKENS, TOKENS))
    assert out.last_hidden_state.shape == (1, 17, 32 * 3)


@pytest.mark.slow
def test_a_drawn_map_is_the_eager_row_over_the_tiles_patches(folder, monkeypatch):
    from PIL import Image

    checkpoint = vit.load(folder, device="cpu")
    image = Image.fromarray((torch.rand(SIZE, SIZE, 3, generator=torch.Generator().manual_seed(3)) * 255).byte()
                            .numpy())
    _, expected = eager_probabilities(folder, image)
    query = 1 + 4 + 2  # CLS, then the patch at row 1, column 2
    formed = spy_formed(monkeypatch)
    drawn = vit.explain(checkpoint, image, "attention", layer=2, head=1, query=query)
    assert formed and all(rows == 1 for rows, _ in formed)  # only the asked row formed (issue 117, Speed)
    assert drawn.map.shape == (4, 4)
    row = expected[2][0, 1, query, 1:17]
    assert torch.allclose(torch.from_numpy(drawn.map), row.reshape(4, 4), atol=1e-6, rtol=0)


@pytest.mark.slow
def test_attention_modules_other_than_its_local_and_global_layers_are_refused_in_one_line(folder, monkeypatch):
    from test_library_whole_folders import refused_one_attention_short

    assert refused_one_attention_short(folder, monkeypatch).endswith(
        ": 2 attention modules for its 3 local and global layers; the library road reads one attention per layer")
