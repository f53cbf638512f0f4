"""A head around a backbone whose decoders attend too (issue 117, item 6; ``vit.sources.library_road.backbone_parts``):
Mask2Former over a Swin backbone opens from the folder transformers saves; its backbone's attention calls are the
layers, each placed on its stage's grid window by window, and its pixel decoder's and transformer decoder's attention
are named, not drawn. Reference: each Swin block's probabilities as its modelling file's ``eager_attention_forward``
computes them (the model built with eager attention), placed on the grid by transformers' own ``window_partition``
after the block's own padding (one block a stage: unshifted). The input is non-square (64x96), so a transposed grid
fails. Built tiny with random weights in transformers, never downloaded."""

from __future__ import annotations

import pytest
import torch
from layer_reference import caught_eager, placed, widened

import vit

transformers = pytest.importorskip("transformers")

SWIN = dict(embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2], patch_size=4, window_size=4,
            out_features=["stage1", "stage2", "stage3", "stage4"])
GRIDS = [(16, 24), (8, 12), (4, 6), (2, 3)]  # 64x96 px / 4 px patches, then merged 2x2 by each stage


def test_only_a_layout_refusal_is_answered_by_the_backbone_alone():
    """Fast: a refusal of the whole model's preprocessing (ZoeDepth's processor) or weights stands; the backbone
    alone answers the layout's (the decoders' attention, the backbone's windows)."""
    from vit.sources.files import SourceError
    from vit.sources.library_road import backbone_parts

    assert backbone_parts.answers(SourceError("x: 4 attention modules for 2 layers; the library road reads one"))
    assert backbone_parts.answers(SourceError("x: its layer 0 (a) attends over 16 pieces of one image at once"))
    assert not backbone_parts.answers(SourceError("x: preprocessor_config.json cannot be used (ensure_multiple_of"))
    assert backbone_parts.backbone_of(torch.nn.Linear(1, 1)) is None



def test_the_backbone_answering_a_layout_refusal_is_the_one_inside_else_the_model_itself():
    """Fast: the one backbone both roads fall back to (a folder's, ``backbone_parts``; a model in hand's,
    ``module_road``): a head's one ``BackboneMixin`` module, else the model where it is one (LW-DETR's ViT), for a
    layout refusal only; a module that is none, or two backbones side by side, have none."""
    from vit.sources.files import SourceError
    from vit.sources.library_road.placing.backbone_alone import answering

    layout = ValueError("4 attention modules for 2 layers; the library road reads one")
    backbone = transformers.SwinBackbone(transformers.SwinConfig(**SWIN)).eval()
    head = torch.nn.Sequential(backbone, torch.nn.Linear(1, 1))
    assert answering(head, layout) is backbone
    assert answering(head, SourceError(f"x: {layout}")) is backbone
    assert answering(backbone, layout) is backbone
    assert answering(head, ValueError("preprocessor_config.json cannot be used (ensure_multiple_of")) is None
    assert answering(torch.nn.Linear(1, 1), layout) is None
    assert answering(torch.nn.Sequential(backbone, transformers.SwinBackbone(transformers.SwinConfig(**SWIN))),
                     layout) is None

@pytest.fixture(scope="module")
def mask2former(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.Mask2FormerConfig(
        backbone_config=transformers.SwinConfig(**SWIN), feature_size=32, mask_feature_size=32, hidden_dim=32,
        encoder_feedforward_dim=64, dim_feedforward=64, encoder_layers=1, decoder_layers=2, num_attention_heads=2,
        num_queries=4, num_labels=3)
    model = widened(transformers.Mask2FormerForUniversalSegmentation(config).eval())
    folder = tmp_path_factory.mktemp("mask2former")
    model.save_pretrained(folder)
    transformers.Mask2FormerImageProcessor(size={"height": 64, "width": 96}).save_pretrained(folder)
    return folder


def _eager(folder, pixels):
    """transformers alone: each Swin block's eager probabilities (windows, heads, n, n), and the placement table of
    each (windows, n) token indices on its stage's grid (-1: the block's padding)."""
    from transformers.models.swin import modeling_swin

    model = transformers.Mask2FormerForUniversalSegmentation.from_pretrained(folder, attn_implementation="eager")
    model.eval()
    seen = caught_eager(modeling_swin, lambda: model(pixel_values=pixels))
    tables = []
    stages = [m for m in model.model.pixel_level_module.encoder.modules() if type(m).__name__ == "SwinStage"]
    for stage, grid in zip(stages, GRIDS, strict=True):
        block = stage.blocks[0]
        assert block.shift_size == 0
        index = torch.arange(1, grid[0] * grid[1] + 1, dtype=torch.float32).view(1, *grid, 1)
        padded, _ = block.maybe_pad(index, *grid)
        tables.append(modeling_swin.window_partition(padded, block.window_size).reshape(-1, block.window_size ** 2)
                      - 1)
    return seen, tables


def test_mask2formers_backbone_layers_are_swins_eager_windows_on_each_stages_grid(mask2former):
    checkpoint = vit.load(mask2former, device="cpu")
    wrapped = checkpoint.model
    assert checkpoint.road == "library"
    assert checkpoint.metadata["architecture"] == "hf:Mask2FormerForUniversalSegmentation"
    assert wrapped.num_layers == 4 and [place.key_grid for place in wrapped.places] == GRIDS
    assert all(name.startswith("model.pixel_level_module.encoder.") for name in checkpoint.metadata["layers"])
    others = checkpoint.metadata["other_attention"]
    assert any("transformer_module.decoder" in name for name in others)  # the object queries' attention, named
    assert any("pixel_level_module.decoder" in name for name in others)  # its deformable attention, named
    pixels = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(1))
    _, kept = wrapped.run(pixels, layers=range(4))
    raw, tables = _eager(mask2former, pixels)
    assert len(raw) == 4
    for layer, grid in enumerate(GRIDS):
        expected = placed(raw[layer], tables[layer], grid[0] * grid[1])
        assert kept[layer].shape == expected.shape
        torch.testing.assert_close(kept[layer], expected, atol=1e-5, rtol=0)
    from PIL import Image

    image = Image.fromarray((torch.rand(64, 96, 3, generator=torch.Generator().manual_seed(2)) * 255).byte().numpy())
    drawn = vit.explain(checkpoint, image, "attention", layer=0, head=0, query=24 + 5)  # row 1, column 5
    from vit.core.inference import preprocess

    raw, tables = _eager(mask2former, preprocess([image], checkpoint.preprocessing))
    torch.testing.assert_close(torch.from_numpy(drawn.map), placed(raw[0], tables[0], 16 * 24)[0, 0, 29].reshape(
        16, 24), atol=1e-5, rtol=0)


def test_a_timm_backbone_folder_transformers_cannot_read_back_is_refused_in_one_line(tmp_path):
    """TimmBackbone's ``from_pretrained`` takes a timm model's name, not a folder: its config's strict validation
    refuses the folder's path, said in one line (not huggingface_hub's two)."""
    pytest.importorskip("timm")
    from vit.checkpoint import CheckpointError

    transformers.TimmBackbone(transformers.TimmBackboneConfig(backbone="test_vit")).save_pretrained(tmp_path)
    transformers.ViTImageProcessor(size={"height": 160, "width": 160}).save_pretrained(tmp_path)  # timm's test ViT
    with pytest.raises(CheckpointError) as refused:
        vit.load(tmp_path, device="cpu")
    assert "\n" not in str(refused.value) and "its config is refused by transformers" in str(refused.value)


def test_x_clips_vision_model_is_refused_naming_its_two_attentions_a_layer(tmp_path):
    """X-CLIP's vision layers attend twice (over a frame's patches, and across the clip's frames by one message token
    a frame), with no backbone to read alone, and take clips of exactly num_frames frames: refused in one line naming
    both and that."""
    from vit.checkpoint import CheckpointError

    transformers.XCLIPVisionModel(transformers.XCLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8,
        mit_hidden_size=32, mit_intermediate_size=64, num_frames=2)).save_pretrained(tmp_path)
    transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size=32).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=r"4 attention modules for 2 layers \(self_attn, message_attn\); the "
                                              r"library road reads one attention per layer; X-CLIP's vision layers "
                                              r"take clips of exactly num_frames \(2\) frames, each layer's message "
                                              r"attention over the frames' class tokens .* no input for them$"):
        vit.load(tmp_path, device="cpu")
