"""Depth Pro opens on the library road (issue 117, the census's "pieces of one image at once" row) through the recorder
at the attention function: its image encoder (a DINOv2 over the whole input resized to its own size, one patch grid
and a CLS token) is the layers, placed on the whole input (a patch embedding over a resized copy of the input:
``attention_recorder``'s trace); its patch encoder (one DINOv2 over overlapping crops at three scales in one batch) and
its FOV encoder (a second tower over the whole input, whose layers a rollout would chain onto the image encoder's) are
named in ``metadata["left_out"]``, run, never drawn (``placing.layer_kinds.CROPS``, ``SECOND_TOWERS``).

Reference: transformers' own eager attention, caught where DINOv2's modelling file calls its
``eager_attention_forward`` (the module that called it kept, so each layer is matched to its own encoder), every
layer, head and row, at a non-square 64x96-px input: the encoders' grids are square (each resizes the input to its
ViT's 16x16 px), so each 4x4 grid's cell is 16x24 px of the input, and a transposed placement (cells of 24x16 px, or
the grid read column-major) fails. Built tiny with random weights in transformers (as ``bench/census_families.py``
builds its Depth Pro row), never downloaded."""

from __future__ import annotations

import pytest
import torch
from layer_reference import caught_eager, widened
from PIL import Image

import vit
from vit.checkpoint import CheckpointError
from vit.core.inference import preprocess

transformers = pytest.importorskip("transformers")

SIZE = (64, 96)  # the input; each encoder sees it resized to 16x16 px: 4x4 patches of 4 px, 16x24 px of the input
MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.3, 0.4)
VIT = dict(model_type="dinov2", hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
           image_size=16, patch_size=4)
IMAGE_LAYERS = [f"depth_pro.encoder.image_encoder.model.encoder.layer.{i}.attention" for i in range(2)]
FOV_LAYERS = [f"fov_model.fov_encoder.model.encoder.layer.{i}.attention" for i in range(2)]
CROP_LAYERS = [f"depth_pro.encoder.patch_encoder.model.encoder.layer.{i}.attention" for i in range(2)]


def tiny(fov: bool = True) -> torch.nn.Module:
    """A Depth Pro with 16-px crops (its ``patch_size``, each encoder's input side) and 2-layer DINOv2 encoders."""
    config = transformers.DepthProConfig(patch_size=16, use_fov_model=fov, fusion_hidden_size=16,
                                         intermediate_hook_ids=[1, 0], intermediate_feature_dims=[8, 8],
                                         scaled_images_feature_dims=[8, 8, 8], image_model_config=dict(VIT),
                                         patch_model_config=dict(VIT), fov_model_config=dict(VIT))
    torch.manual_seed(0)
    return widened(transformers.DepthProForDepthEstimation(config).eval(), matrices_only=True)


def eager(model: torch.nn.Module, pixels: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    """Each DINOv2 attention module of ``model`` (by name) -> the probabilities transformers' eager attention
    function computed for it, in the order it ran, for ``pixels``."""
    from transformers.models.dinov2 import modeling_dinov2

    names = {m: n for n, m in model.named_modules()}
    configs = [m.config for m in model.modules() if isinstance(m, modeling_dinov2.Dinov2Model)]
    implementations = [c._attn_implementation for c in configs]
    try:
        for config in configs:
            config._attn_implementation = "eager"
        caught = caught_eager(modeling_dinov2, lambda: model(pixel_values=pixels), modules=True)
    finally:
        for config, implementation in zip(configs, implementations, strict=True):
            config._attn_implementation = implementation
    seen = {}
    for module, probabilities in caught:
        seen.setdefault(names[module], []).append(probabilities)
    return seen


@pytest.fixture(scope="module")
def opened():
    model = tiny()
    return model, vit.load(model, image_size=SIZE, mean=MEAN, std=STD)


def test_its_image_encoders_layers_are_its_own_eager_attention_its_patch_and_fov_encoders_named(opened):
    model, checkpoint = opened
    wrapped = checkpoint.model
    assert checkpoint.road == "library" and wrapped.names == IMAGE_LAYERS
    left_out = checkpoint.metadata["left_out"]
    assert sorted(left_out) == sorted(CROP_LAYERS + FOV_LAYERS)
    why = "Depth Pro's patch encoder: one ViT over 51 overlapping crops of the image at 3 scales"
    assert all(left_out[name].startswith(why) for name in CROP_LAYERS)
    # the FOV encoder, a second ViT over the whole image after the image encoder: a rollout chaining the two
    # towers' layers would mean nothing, so it is named, not drawn
    assert all(left_out[name].startswith("Depth Pro's FOV encoder: a second ViT") for name in FOV_LAYERS)
    pixels = torch.randn(1, 3, *SIZE, generator=torch.Generator().manual_seed(1))
    own = eager(model, pixels)
    # the crops ran, in one batch: 1 of the input at 1/4 (16x24 px), 3x5 at 1/2, 5x7 at full size, 16 px each
    assert [own[name][0].shape for name in CROP_LAYERS] == [(51, 2, 17, 17)] * 2
    with torch.no_grad():
        _, recorded = wrapped.run(pixels, layers=range(2))
    for layer, name in enumerate(IMAGE_LAYERS):
        (expected,) = own[name]
        assert expected.shape == (1, 2, 17, 17)  # a CLS token and 4x4 patches
        assert torch.allclose(recorded[layer], expected, atol=1e-5, rtol=0)
        assert not torch.allclose(recorded[layer], own[IMAGE_LAYERS[layer ^ 1]][0], atol=1e-3)


def test_a_drawn_map_covers_the_whole_input_its_patches_row_major(opened):
    """The image encoder saw the whole 64x96 input resized to 16x16 px: its 4x4 patches are 16x24-px cells of the
    input, and the map of a patch's row is that row over the patches, row-major."""
    model, checkpoint = opened
    layout = checkpoint.model.layout
    assert layout.image_hw == SIZE and layout.patch_hw == (16, 24) and layout.grid == (4, 4)
    assert layout.num_prefix_tokens == 1
    image = Image.fromarray((torch.rand(*SIZE, 3, generator=torch.Generator().manual_seed(3)) * 255).byte().numpy())
    pixels = preprocess([image], checkpoint.preprocessing)
    assert tuple(pixels.shape[-2:]) == SIZE
    own = eager(model, pixels)
    query = 1 + 6  # the patch at row 1, col 2
    for layer, name in enumerate(IMAGE_LAYERS):
        drawn = torch.from_numpy(vit.explain(checkpoint, image, "attention", layer=layer, head=1, query=query).map)
        row = own[name][0][0, 1, query, 1:].reshape(4, 4)
        assert torch.allclose(drawn, row, atol=1e-6, rtol=0)
        assert not torch.allclose(drawn, row.T, atol=1e-4)  # a grid read column-major fails
    assert vit.explain(checkpoint, image, "rollout", layer=1).map.shape == (4, 4)


def test_a_depth_pro_folder_opens_as_the_census_saves_it_without_its_fov_encoder(tmp_path):
    """As the census opens it: the folder transformers saves, with Depth Pro's own image processor; no FOV model
    (the config's default): the image encoder's two layers. The explorer's picker names the layers left out."""
    model = tiny(fov=False)
    model.save_pretrained(tmp_path)
    transformers.DepthProImageProcessor(size={"height": SIZE[0], "width": SIZE[1]}, image_mean=list(MEAN),
                                        image_std=list(STD)).save_pretrained(tmp_path)
    checkpoint = vit.load(tmp_path, device="cpu")
    assert checkpoint.road == "library" and checkpoint.model.names == IMAGE_LAYERS
    assert sorted(checkpoint.metadata["left_out"]) == CROP_LAYERS
    assert checkpoint.model.layout.patch_hw == (16, 24) and checkpoint.preprocessing.mean == MEAN
    from vit.app import catalog  # the picker says what it leaves out (built on the meta device, no weight read)

    entry = catalog.describe(catalog.Candidate(tmp_path, "path", "depth-pro"), library_road=True)
    assert entry.ok and entry.num_layers == 2, entry.error
    assert "**Not drawn** 2 of its attention layers (Depth Pro" in entry.description  # its words escaped
    assert "overlapping crops of the image at 3 scales" in entry.description


class _Resized(torch.nn.Module):
    """A patch embedding over the whole input resized to ``side`` px (``align_corners`` as given), then one
    attention over its patches."""

    def __init__(self, side: int, align_corners: bool | None):
        super().__init__()
        self.side, self.align_corners = side, align_corners
        self.patch = torch.nn.Conv2d(3, 8, 4, stride=4)
        self.attention = torch.nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, pixels):
        x = torch.nn.functional.interpolate(pixels, size=(self.side, self.side), mode="bilinear",
                                            align_corners=self.align_corners)
        x = self.patch(x).flatten(2).transpose(1, 2)
        return self.attention(x, x, x)[0]


def test_a_patch_embedding_over_the_resized_input_is_placed_only_where_its_patches_are_whole_input_pixels():
    """16 px resized from 64x96: 4-px patches are 16x24 px of the input. Resized from 64x90 they would be 16x22.5 px:
    no patch grid of the input holds them, refused in one line. With ``align_corners=True`` the corner pixels'
    centres are pinned (a cell is not the input's span): the trace takes no patch embedding from it."""
    from vit.sources.library_road.recorded_road import _trace

    checkpoint = vit.load(_Resized(16, False), image_size=SIZE, mean=MEAN, std=STD)
    assert checkpoint.model.layout.patch_hw == (16, 24) and checkpoint.model.layout.grid == (4, 4)
    with pytest.raises(CheckpointError, match="no patch embedding found") as refused:
        vit.load(_Resized(16, False), image_size=(64, 90), mean=MEAN, std=STD)
    assert "\n" not in str(refused.value)
    assert _trace(_Resized(16, False), SIZE, 3)[1].patch == (16, 24)
    assert _trace(_Resized(16, True), SIZE, 3)[1].patch is None
