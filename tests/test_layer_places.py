"""Families whose layers run over different tokens open through the recorder at the attention function, each layer
placed by ``vit.sources.library_road.placing.layer_places`` (issue 117 item 3): pooled stages (PiT, LeViT, MViT
v2), pooled keys (Twins), pooled queries (EfficientFormer V2's strided attention), class-attention layers (CaiT,
VOLO), two
branches (CrossViT), windows (Donut-Swin, MaxViT, Twins), dilated windows (MaxViT's grid, MobileViT's unfolding) and a
finer grid's windows (TNT's pixels).

Reference: each layer's probabilities as the library's own softmax makes them (its explicit path: timm's
``fused_attn`` off), caught at ``torch.softmax`` in the attention modules, in the forward's order; a windowed layer's
placed on the grid by the library's own partition function applied to a map of token indices
(``timm.models.maxxvit.window_partition`` / ``grid_partition``, TNT's ``Unfold``, MobileViT's ``unfolding``,
Donut-Swin's ``window_partition``). Inputs are non-square wherever the library takes one, so a transposed grid
fails; LeViT and MViT v2 take square inputs only (their attention biases are built for a square grid)."""

import numpy as np
import pytest
import timm
import torch
import transformers
from layer_reference import MEAN_STD, on_its_grid, recorded_and_library, tiny
from PIL import Image

import vit
from vit.checkpoint import CheckpointError


def _timm(arch, **kwargs):
    return lambda: timm.create_model(arch, pretrained=False, num_classes=3, **kwargs)


def _maxvit_table(model, layer, grid):
    from timm.models.maxxvit import grid_partition, window_partition

    block = model.get_submodule(layer.rpartition(".attn")[0])
    index = torch.arange(grid[0] * grid[1], dtype=torch.float32).view(1, *grid, 1)
    cut = window_partition if block.partition_block else grid_partition
    return cut(index, block.partition_size).reshape(-1, block.partition_size[0] * block.partition_size[1])


def _twins_table(model, layer, grid):
    """Twins' locally-grouped windows as its own forward cuts them: its ``qkv`` reads the windows ``(B, rows, cols,
    ws, ws, C)``, here of tokens whose first channel is their index + 1 (its padding: 0, no token)."""
    attention = model.get_submodule(layer)
    x = torch.zeros(1, grid[0] * grid[1], attention.dim)
    x[0, :, 0] = torch.arange(1, grid[0] * grid[1] + 1)
    seen = []
    handle = attention.qkv.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        with torch.no_grad():
            attention(x, grid)
    finally:
        handle.remove()
    return seen[0][..., 0].reshape(-1, attention.ws * attention.ws) - 1


def _tnt_table(model, layer, grid):
    """Each patch's inner tokens (its convolution's outputs, ``new_patch_size`` a side, one every ``stride`` px):
    the fine grid's token under each, read through the library's own ``Unfold`` of a map of the fine tokens."""
    embed = model.pixel_embed
    step = embed.img_size[0] // grid[0]  # px a fine token
    index = torch.arange(grid[0] * grid[1], dtype=torch.float32).view(1, 1, *grid)
    pixels = index.repeat_interleave(step, -2).repeat_interleave(step, -1)  # (1, 1, H, W)
    side = embed.new_patch_size[0]
    cut = embed.unfold(pixels)[0].T.reshape(-1, side * step, side * step)  # (patches, patch px, patch px)
    return cut[:, ::step, ::step].reshape(-1, side * side)


def _mobilevit_table(model, layer, grid):
    owner = model.get_submodule(layer.split(".transformer.")[0])
    index = torch.arange(grid[0] * grid[1], dtype=torch.float32).view(1, 1, *grid)
    patches, _ = owner.unfolding(index)  # (patch area, patches, 1)
    return patches[..., 0]


def _timm_mobilevit_table(model, layer, grid):
    """timm's MobileViT block's own unfolding (inline in its forward): its ``conv_1x1`` made to give a map of token
    indices on ``grid`` (whole patches: no resize), the tokens its ``transformer`` then receives."""
    block = model.get_submodule(layer.split(".transformer.")[0])
    index = torch.arange(grid[0] * grid[1], dtype=torch.float32).view(1, 1, *grid)
    seen = []
    handles = [block.conv_1x1.register_forward_hook(lambda m, a, out: index.expand(out.shape).clone()),
               block.transformer.register_forward_pre_hook(lambda m, a: seen.append(a[0]))]
    try:
        with torch.no_grad():
            block(torch.zeros(1, block.conv_kxk.conv.in_channels, *grid))
    finally:
        for handle in handles:
            handle.remove()
    return seen[0][..., 0]  # (pieces, tokens)


def _donut_table(model, layer, grid):
    from transformers.models.donut.modeling_donut_swin import window_partition

    block = model.get_submodule(layer.rpartition(".attention")[0])
    assert block.shift_size == 0  # one block a stage: unshifted, so the library's padding and partition cut it
    index = torch.arange(1, grid[0] * grid[1] + 1, dtype=torch.float32).view(1, *grid, 1)
    padded, _ = block.maybe_pad(index, *grid)  # zeros past the grid: -1 below, no token
    return window_partition(padded, block.window_size).reshape(-1, block.window_size ** 2) - 1


HF_LEVIT = dict(image_size=64, hidden_sizes=[16, 32, 48], num_attention_heads=[1, 2, 2], depths=[1, 1, 1],
                key_dim=[8, 8, 8])

# name, build, input (height, width), layers, the library's partition where a layer attends in pieces
FAMILIES = [
    ("cait", _timm("cait_xxs24_224", depth=2, embed_dim=32, num_heads=2, img_size=(32, 48), patch_size=8),
     (32, 48), 4, None),
    ("pit", _timm("pit_ti_224", img_size=(64, 96)), (64, 96), 12, None),
    ("levit", _timm("levit_128s", img_size=64), (64, 64), 11, None),
    ("mvitv2", _timm("mvitv2_tiny", img_size=64), (64, 64), 10, None),
    ("twins-pcpvt", _timm("twins_pcpvt_small", img_size=(64, 96), depths=(1, 1, 1, 1)), (64, 96), 4, None),
    ("twins-svt", _timm("twins_svt_small", img_size=(64, 96), depths=(2, 2, 2, 2)), (64, 96), 8, _twins_table),
    ("crossvit", _timm("crossvit_tiny_240", img_size=(48, 96), img_scale=(1.0, 1.0)), (48, 96), 21, None),
    ("volo", _timm("volo_d1_224", img_size=(64, 96)), (64, 96), 16, None),
    ("tnt", _timm("tnt_s_patch16_224", img_size=(32, 48), depth=2), (32, 48), 4, _tnt_table),
    ("efficientformerv2", _timm("efficientformerv2_s0", img_size=(64, 96)), (64, 96), 5, None),
    ("maxvit", _timm("maxvit_tiny_tf_224", img_size=(64, 96), depths=(1, 1, 1, 1)), (64, 96), 8, _maxvit_table),
    ("timm-mobilevit", _timm("mobilevit_xxs"), (64, 96), 9, _timm_mobilevit_table),
    ("hf-levit", lambda: transformers.LevitForImageClassificationWithTeacher(transformers.LevitConfig(**HF_LEVIT)),
     (64, 64), 5, None),
    ("hf-mobilevit", lambda: transformers.MobileViTForImageClassification(transformers.MobileViTConfig(
        image_size=64, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32])), (64, 96), 9,
     _mobilevit_table),
    ("hf-donut-swin", lambda: transformers.DonutSwinForImageClassification(transformers.DonutSwinConfig(
        image_size=[32, 48], embed_dim=16, depths=[1, 1], num_heads=[1, 2], patch_size=4, window_size=4)), (32, 48),
     2, _donut_table),
]


# Each layer's key grid, in order of first use, worked out by hand from each architecture at its input (LeViT and MViT
# v2 run square inputs only: not listed)
KEY_GRIDS = {
    "cait": [(4, 6)],  # 32x48 px / 8 px patches; its class-attention layers over the same patches
    "pit": [(7, 11), (4, 6), (2, 3)],  # (64 - 16) / 8 + 1 x (96 - 16) / 8 + 1, then pooled by stride-2 convolutions
    "twins-pcpvt": [(2, 3)],  # every stage's keys reduced to (64 / 32) x (96 / 32) by its sr_ratio convolution
    "twins-svt": [(16, 24), (2, 3), (8, 12), (4, 6)],  # windows on each stage's grid, then keys reduced to 2x3
    "crossvit": [(4, 8), (3, 6)],  # 48x96 px / 12 px, then / 16 px: its two branches
    "volo": [(4, 6)],  # 64x96 px / 8 px outlooked, then halved for its transformer and class-attention layers
    "tnt": [(8, 12), (2, 3)],  # its inner tokens one every 4 px, its outer ones every 16 px
    # 64x96 px / 16 px in its third stage, whose attention runs strided (/ 32 px) and whose downsampling attention
    # asks the / 32 px queries over the / 16 px keys; its fourth stage / 32 px
    "efficientformerv2": [(2, 3), (4, 6)],
    "maxvit": [(16, 24), (8, 12), (4, 6), (2, 3)],  # its stem's / 4 px, then halved by each stage
    "hf-mobilevit": [(8, 12), (4, 6), (2, 4)],  # / 8, / 16 and / 32 px; the last (2x3) resized to whole 2x2 patches
    "timm-mobilevit": [(8, 12), (4, 6), (2, 4)],  # the same stages, timm's own block
    "hf-donut-swin": [(8, 12), (4, 6)],  # 32x48 px / 4 px patches, then merged 2x2
}


def test_each_layer_sits_on_its_stages_grid_not_its_transpose(opened):
    name, model, checkpoint, size, layers, table = opened
    grids = list(dict.fromkeys(p.key_grid for p in checkpoint.model.places))
    assert grids == KEY_GRIDS.get(name, grids)


@pytest.fixture(scope="module", params=FAMILIES, ids=[f[0] for f in FAMILIES])
def opened(request):
    name, build, size, layers, table = request.param
    model = tiny(build())
    checkpoint = vit.load(model, image_size=size, **MEAN_STD)
    return name, model, checkpoint, size, layers, table


def test_every_layer_equals_the_librarys_own_softmax_placed_on_its_grid(opened):
    name, model, checkpoint, size, layers, table = opened
    wrapped = checkpoint.model
    assert checkpoint.road == "library" and wrapped.num_layers == layers
    recorded, own = recorded_and_library(wrapped, model, size)
    for layer in range(layers):
        raw = own[layer].reshape(-1, *own[layer].shape[-3:])  # (B or pieces, H, queries, keys)
        place = wrapped.places[layer]
        expected = on_its_grid(raw, place, table, model, wrapped.names[layer])
        assert recorded[layer].shape == expected.shape, (name, layer)
        assert torch.allclose(recorded[layer], expected, atol=1e-5), (name, layer)
        assert place.keys == expected.shape[-1] and place.queries == expected.shape[-2]


def test_the_attention_map_is_drawn_on_the_layers_own_grid(opened):
    name, model, checkpoint, size, layers, table = opened
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (*size, 3), dtype=np.uint8))
    drawn = vit.explain(checkpoint, image, "attention")
    place = checkpoint.model.places[-1]
    assert drawn.map.shape == place.key_grid and np.isfinite(drawn.map).all()
    layout = checkpoint.model.layout
    gh, gw = layout.image_hw[0] // layout.patch_hw[0], layout.image_hw[1] // layout.patch_hw[1]
    corner = layout.num_prefix_tokens + gh * gw - 1  # the bottom-right patch: its row in layer 0's own grid
    first = vit.explain(checkpoint, image, "attention", layer=0, query=corner)
    wrapped = checkpoint.model
    row = wrapped.places[0].row(corner, layout.num_prefix_tokens, (gh, gw), 0)
    assert row == wrapped.places[0].queries - 1  # the covering token of a bottom-right patch is the last
    assert first.map.shape == wrapped.places[0].key_grid and np.isfinite(first.map).all()


def test_a_pooled_model_refuses_rollout_in_one_line_naming_its_grids():
    checkpoint = vit.load(tiny(_timm("pit_ti_224", img_size=(64, 96))()), **MEAN_STD)
    image = Image.new("RGB", (96, 64))
    with pytest.raises(ValueError, match="this model's layers run over different ones") as raised:
        vit.explain(checkpoint, image, "rollout")
    assert "\n" not in str(raised.value)
    listed = vit.methods(checkpoint)
    assert "attention" in listed and "rise" in listed and not {"rollout", "class", "legrad"} & set(listed)


def test_a_class_attention_layer_is_asked_by_its_class_token_and_a_patch_layer_by_the_covering_patch():
    checkpoint = vit.load(tiny(_timm("cait_xxs24_224", depth=2, embed_dim=32, num_heads=2, img_size=(32, 48),
                                      patch_size=8)()), **MEAN_STD)
    place = checkpoint.model.places
    assert place[0].row(1 + 7, 1, (4, 6), 0) == 7  # patch (1, 1) of the 4x6 grid, no CLS in a patch layer
    with pytest.raises(ValueError, match="has no token 0 among its queries"):
        place[0].row(0, 1, (4, 6), 0)
    with pytest.raises(ValueError, match="class-attention layer"):
        place[3].row(5, 1, (4, 6), 3)


# XCiT opens, its channels left out (test_timm_layer_kinds); GroupViT opens, its first stage placed (test_group_tokens)
@pytest.mark.parametrize("build, size, says", [
    (lambda: transformers.MobileViTV2ForImageClassification(transformers.MobileViTV2Config(
        image_size=64, width_multiplier=0.25)), (64, 96), "separable linear attention"),
], ids=["mobilevit-v2"])
def test_a_family_with_no_layout_is_refused_in_one_line_naming_it(build, size, says):
    with pytest.raises(CheckpointError) as raised:
        vit.load(tiny(build()), image_size=size, **MEAN_STD)
    assert "\n" not in str(raised.value) and says in str(raised.value)
