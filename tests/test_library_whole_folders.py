"""Whole folders as the Hub ships them (issue 117, item 6): TIPSv2 (``Tipsv2Model``, image and text towers),
``VitPoseForPoseEstimation`` (its backbone's attention through the interface), Pixtral's and Molmo 2's vision models
(no module named ``embeddings``) open from the folder transformers saves, with the image processor of their own
class, by the library road. Every layer's attention equals the probabilities transformers' own eager attention
computes (its modelling file's ``eager_attention_forward`` hooked, the reference model built with
``attn_implementation="eager"``) on a non-square input, and a drawn map is the eager row placed row-major on a
non-square grid (a transposed placement has another shape and fails). Each model is built tiny with random weights
in transformers, never downloaded."""

from __future__ import annotations

import importlib

import pytest
import torch
from layer_reference import assert_layers_are, caught_eager, widened

import vit

transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4)


# name -> (the model, its own image processor, the modelling file whose eager attention is the vision part's, the
# input (height, width), the prefix tokens, the reference's input from pixels)
def _tipsv2():
    return transformers.Tipsv2Model(transformers.Tipsv2Config(
        vision_config=dict(**SMALL, patch_size=8, image_size=32),
        text_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)))


def _vitpose():
    backbone = transformers.VitPoseBackboneConfig(**SMALL, intermediate_size=64, patch_size=[8, 8], image_size=[32, 24])
    return transformers.VitPoseForPoseEstimation(transformers.VitPoseConfig(backbone_config=backbone))


def _pixtral():
    return transformers.PixtralVisionModel(transformers.PixtralVisionConfig(**SMALL, intermediate_size=64, patch_size=8,
                                                                            image_size=32, head_dim=8))


def _molmo2():
    return transformers.Molmo2VisionModel(transformers.Molmo2VisionConfig(
        **SMALL, intermediate_size=64, num_key_value_heads=4, head_dim=8, patch_size=8, image_size=[16, 24],
        num_position_embeddings=6))


def _molmo2_patches(pixels: torch.Tensor) -> torch.Tensor:
    from transformers.models.molmo2.image_processing_molmo2 import batch_pixels_to_patches

    return batch_pixels_to_patches(pixels.permute(0, 2, 3, 1), 8)  # what its processor hands the model


CASES = {
    "tipsv2": (_tipsv2, lambda: transformers.Tipsv2ImageProcessor(size={"height": 32, "width": 24}),
               "tipsv2.modeling_tipsv2", (32, 24), 2, lambda x: {"pixel_values": x}),
    "vitpose": (_vitpose, lambda: transformers.VitPoseImageProcessor(size={"height": 32, "width": 24}),
                "vitpose_backbone.modeling_vitpose_backbone", (32, 24), 0, lambda x: {"pixel_values": x}),
    "pixtral": (_pixtral, lambda: transformers.PixtralImageProcessor(patch_size={"height": 8, "width": 8}),
                "pixtral.modeling_pixtral", (16, 24), 0, lambda x: {"pixel_values": x}),
    "molmo2": (_molmo2, lambda: transformers.Molmo2ImageProcessor(size={"height": 16, "width": 24}, patch_size=8),
               "molmo2.modeling_molmo2", (16, 24), 0, lambda x: {"pixel_values": _molmo2_patches(x)}),
}


def test_the_whole_folders_are_the_library_roads_own_layouts():
    """Fast: the model_types this module opens are those ``opens`` routes to it, and Molmo 2's input refuses another
    size in one line before the model runs."""
    from vit.sources.library_road import transformers_models, whole_folders

    assert {t: transformers_models.OWN_LAYOUTS[t] for t in whole_folders.MODEL_TYPES} == dict.fromkeys(
        whole_folders.MODEL_TYPES, "vit.sources.library_road.whole_folders")
    patches = whole_folders._Patches(torch.nn.Identity(), 8, (16, 24))
    with pytest.raises(ValueError, match=r"^Molmo 2's vision model takes 16x24-px images only"):
        patches(torch.zeros(1, 3, 24, 16))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made = {}
    for name, (build, processor, *_) in CASES.items():
        torch.manual_seed(0)
        model = build()
        widened(model)  # weights wide enough that every head's attention differs from uniform
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        processor().save_pretrained(folder)
        made[name] = folder
    return made


def eager_probabilities(folder, name: str, pixels: torch.Tensor) -> list[torch.Tensor]:
    """transformers alone: the folder's class built with eager attention, each call of its vision part's modelling
    file's ``eager_attention_forward`` hooked, its probabilities in the order the forward makes them."""
    config = transformers.AutoConfig.from_pretrained(folder)
    model = getattr(transformers, config.architectures[0]).from_pretrained(folder, attn_implementation="eager").eval()
    modeling = importlib.import_module(f"transformers.models.{CASES[name][2]}")
    run = model.get_image_features if name == "tipsv2" else model
    return caught_eager(modeling, lambda: run(**CASES[name][5](pixels)))


@pytest.mark.slow  # builds and saves four models
@pytest.mark.parametrize("name", list(CASES))
def test_a_whole_folder_opens_and_every_layers_attention_is_transformers_eager(folders, name):
    checkpoint = vit.load(folders[name], device="cpu")
    hw, prefix = CASES[name][3], CASES[name][4]
    assert checkpoint.road == "library" and checkpoint.model.layout.num_prefix_tokens == prefix
    pixels = torch.randn(1, 3, *hw, generator=torch.Generator().manual_seed(1))
    _, attentions = checkpoint.model.run(pixels, layers=range(2))
    expected = eager_probabilities(folders[name], name, pixels)
    tokens = prefix + (hw[0] // 8) * (hw[1] // 8)
    assert_layers_are(attentions, expected, 2, (1, 4, tokens, tokens))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tipsv2", "vitpose", "molmo2"])
def test_a_drawn_map_is_the_eager_row_on_the_non_square_grid(folders, name):
    from PIL import Image

    from vit.core.inference import preprocess

    checkpoint = vit.load(folders[name], device="cpu")
    hw, prefix = CASES[name][3], CASES[name][4]
    assert tuple(checkpoint.preprocessing.image_hw) == hw
    image = Image.fromarray((torch.rand(40, 28, 3, generator=torch.Generator().manual_seed(3)) * 255).byte().numpy())
    expected = eager_probabilities(folders[name], name, preprocess([image], checkpoint.preprocessing))
    grid = (hw[0] // 8, hw[1] // 8)
    query = prefix + grid[1] + 1  # the patch at row 1, column 1
    drawn = vit.explain(checkpoint, image, "attention", layer=1, head=2, query=query)
    assert drawn.map.shape == grid
    row = expected[1][0, 2, query, prefix:]
    assert torch.allclose(torch.from_numpy(drawn.map), row.reshape(grid), atol=1e-6, rtol=0)


@pytest.mark.slow
def test_pixtral_takes_one_image_at_a_time_in_one_line(folders):
    checkpoint = vit.load(folders["pixtral"], device="cpu")
    with pytest.raises(ValueError, match=r"^Pixtral's vision model packs a batch into one sequence; give it one image "
                                         r"at a time, not 2$"):
        checkpoint.model.run(torch.zeros(2, 3, 16, 24))


@pytest.mark.slow
def test_molmo2_refuses_another_size_in_one_line(folders):
    checkpoint = vit.load(folders["molmo2"], device="cpu")
    with pytest.raises(ValueError, match=r"^Molmo 2's vision model takes 16x24-px images only \(its position table "
                                         r"has a row per patch\), not 24x16$"):
        checkpoint.model.run(torch.zeros(1, 3, 24, 16))


@pytest.mark.slow
def test_vitposes_heatmaps_are_the_librarys(folders):
    """The whole pose estimator runs: its heatmaps are transformers' own (SDPA) for the same pixels."""
    checkpoint = vit.load(folders["vitpose"], device="cpu")
    pixels = torch.randn(1, 3, 32, 24, generator=torch.Generator().manual_seed(2))
    theirs = transformers.VitPoseForPoseEstimation.from_pretrained(folders["vitpose"]).eval()
    with torch.no_grad():
        expected = theirs(pixel_values=pixels).heatmaps
    assert torch.allclose(checkpoint.model(pixels), expected, atol=1e-6, rtol=0)


def refused_one_attention_short(folder, monkeypatch) -> str:
    """The line ``vit.load`` refuses ``folder`` in when one attention module fewer than its model holds is found
    (``whole_folders.layer_attentions``' check, every folder tower's)."""
    from vit.checkpoint import CheckpointError
    from vit.sources.library_road import transformers_models

    found = transformers_models.attention_modules
    monkeypatch.setattr(transformers_models, "attention_modules", lambda model: found(model)[:-1])
    with pytest.raises(CheckpointError) as refused:
        vit.load(folder, device="cpu")
    assert "\n" not in str(refused.value)
    return str(refused.value)


@pytest.mark.slow
def test_attention_modules_other_than_its_layers_are_refused_in_one_line(folders, monkeypatch):
    assert refused_one_attention_short(folders["pixtral"], monkeypatch).endswith(
        ": 1 attention modules for 2 layers; the library road reads one attention per layer")
