"""transformers folders whose attention runs off transformers' attention interface (ViTDet, BLIP's vision) open
through the recorder at the attention function (``vit.sources.library_road.recorded_folder``); references: each
model's own eager ``output_attentions``, every layer, every head, every row. One that the recorder cannot place
either (GroupViT's group tokens) is refused in one line saying so."""

import pytest
import torch
import transformers

import vit
from vit.checkpoint import CheckpointError

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
            patch_size=8)
MEAN_STD = dict(image_mean=[0.5, 0.4, 0.3], image_std=[0.2, 0.3, 0.4])


def saved(tmp_path, cls, config) -> tuple[torch.nn.Module, object]:
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():  # weights far from the library's small init, so that each layer's attention is its own
        for parameter in model.parameters():
            parameter.normal_(0, 0.5)
    model.save_pretrained(tmp_path)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}, **MEAN_STD).save_pretrained(tmp_path)
    return model, vit.load(tmp_path, device="cpu")


@pytest.mark.parametrize("cls, config", [
    (transformers.VitDetModel, transformers.VitDetConfig(**TINY, pretrain_image_size=32)),  # (B * H, T, T) softmax
    (transformers.BlipVisionModel, transformers.BlipVisionConfig(**TINY)),  # a CLS token, (B, H, T, T)
], ids=["vitdet", "blip-vision"])
def test_a_folder_off_the_attention_interface_opens_every_layer_its_own_eager_attention(tmp_path, cls, config):
    model, checkpoint = saved(tmp_path, cls, config)
    assert checkpoint.road == "library" and checkpoint.model.num_layers == 2
    assert checkpoint.preprocessing.mean == (0.5, 0.4, 0.3)
    pixels = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        own = model(pixels, output_attentions=True).attentions
        _, recorded = checkpoint.model.run(pixels, layers=[0, 1])
    prefix = 1 if cls is transformers.BlipVisionModel else 0
    assert checkpoint.model.layout.num_prefix_tokens == prefix and checkpoint.model.layout.grid == (4, 4)
    for layer in (0, 1):
        assert own[layer].shape == (1, 2, 16 + prefix, 16 + prefix)
        assert torch.allclose(recorded[layer], own[layer], atol=1e-5)
        assert not torch.allclose(recorded[layer], own[1 - layer], atol=1e-3)  # each layer its own


def test_a_groupvit_folder_opens_its_first_stage_placed_and_its_group_stages_named(tmp_path):
    # GroupViT's later stages attend over groups, nowhere on the grid: named, not layers (tests/test_group_tokens.py
    # checks every placed layer against its own eager attention)
    config = transformers.GroupViTVisionConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                               image_size=32, patch_size=8, depths=[1, 1], num_group_tokens=[4, 0],
                                               num_output_groups=[4, 4], num_hidden_layers=2)
    _, checkpoint = saved(tmp_path, transformers.GroupViTVisionModel, config)
    assert checkpoint.model.num_layers == 1 and checkpoint.model.layout.num_suffix_tokens == 4
    assert "stages.1.layers.0.self_attn" in checkpoint.metadata["not_layers"]


def test_a_timm_cait_folder_opens_through_the_recorder_its_class_attention_layers_placed(tmp_path):
    """Off timm's Attention (its talking heads and class attention): a folder opens through the recorder, its patch
    layers over the 4x6 patches and its class-attention layers asked by their class token alone
    (``layer_places``; every layer's numbers are ``tests/test_layer_places.py``'s)."""
    import timm
    from timm.models import _hub

    args = dict(depth=2, embed_dim=32, num_heads=2, img_size=(32, 48), patch_size=8)
    model = timm.create_model("cait_xxs24_224", pretrained=False, num_classes=3, **args).eval()
    _hub.save_for_hf(model, tmp_path, model_args=args, safe_serialization=True)
    checkpoint = vit.load(tmp_path, device="cpu")
    places = checkpoint.model.places
    assert checkpoint.road == "library" and checkpoint.model.num_layers == 4
    assert [(p.query_grid, p.query_prefix, p.key_grid, p.key_prefix) for p in places] == \
        [((4, 6), 0, (4, 6), 0)] * 2 + [(None, 1, (4, 6), 1)] * 2


def test_a_timm_efficientformer_opens_on_its_stems_flattened_grid_its_layer_its_own_biased_attention():
    """No patch embedding (a convolutional stem): the grid is the feature map its ``Flat`` flattens row-major into
    the tokens; the layer equals ``softmax(q k^T * scale + its attention biases)`` from its own qkv."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("efficientformer_l1", pretrained=False, num_classes=3).eval()
    attention = model.stages[-1].blocks[-1].token_mixer
    with torch.no_grad():
        attention.attention_biases.normal_(0, 2.0)  # biases that change the rows (the library's init is zeros)
    checkpoint = vit.load(model, mean=(0.5,) * 3, std=(0.5,) * 3)
    layout = checkpoint.model.layout
    assert (layout.grid, layout.num_prefix_tokens, checkpoint.model.num_layers) == ((7, 7), 0, 1)
    kept = []
    handle = attention.register_forward_pre_hook(lambda m, a: kept.append(a[0].detach()))
    pixels = torch.randn(1, 3, 224, 224)
    try:
        _, recorded = checkpoint.model.run(pixels, layers=[0])
    finally:
        handle.remove()
    x = kept[0]  # (1, 49, C)
    with torch.no_grad():
        qkv = attention.qkv(x).reshape(1, 49, attention.num_heads, -1).permute(0, 2, 1, 3)
        q, k, _ = qkv.split([attention.key_dim, attention.key_dim, attention.val_dim], dim=3)
        biases = attention.attention_biases[:, attention.attention_bias_idxs]
        own = ((q @ k.transpose(-2, -1)) * attention.scale + biases).softmax(-1)
        without = ((q @ k.transpose(-2, -1)) * attention.scale).softmax(-1)
    assert torch.allclose(recorded[0], own, atol=1e-5)
    assert not torch.allclose(recorded[0], without, atol=1e-3)  # its biases are in the rows


def test_a_timm_xcit_folder_opens_its_class_attention_and_names_its_channel_layers_left_out(tmp_path):
    import timm
    from timm.models import _hub

    args = dict(depth=2, embed_dim=32, num_heads=2, img_size=32)
    model = timm.create_model("xcit_nano_12_p8_224", pretrained=False, num_classes=3, **args).eval()
    _hub.save_for_hf(model, tmp_path, model_args=args, safe_serialization=True)
    checkpoint = vit.load(tmp_path, device="cpu")
    assert checkpoint.model.names == ["cls_attn_blocks.0.attn", "cls_attn_blocks.1.attn"]
    assert sorted(checkpoint.metadata["left_out"]) == ["blocks.0.attn", "blocks.1.attn"]
    assert all("channels a head" in why for why in checkpoint.metadata["left_out"].values())


def test_a_model_that_attends_over_crops_of_one_image_is_refused_not_placed_on_the_whole_image():
    class Crops(torch.nn.Module):  # a ViT run over the four quarters of its input as a batch of four
        def __init__(self):
            super().__init__()
            self.patch = torch.nn.Conv2d(3, 8, 4, stride=4)
            self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            quarters = torch.cat([x[..., :8, :8], x[..., :8, 8:], x[..., 8:, :8], x[..., 8:, 8:]])  # (4B, 3, 8, 8)
            tokens = self.patch(quarters).flatten(2).transpose(1, 2)  # (4B, 4, 8)
            return self.attn(tokens, tokens, tokens)[0]

    with pytest.raises(CheckpointError, match=r"attends over 4 pieces of one image at once \(crops or tiles\)"):
        vit.load(Crops(), image_size=16, grid=(4, 4), prefix=0, mean=(0.5,) * 3, std=(0.5,) * 3)


def test_depth_pro_whose_patch_encoder_attends_over_crops_of_the_image_opens_its_image_encoder_and_names_the_crops(
        tmp_path):
    """Depth Pro's patch encoder runs over 35 overlapping crops of the image at three scales as one batch: no layer
    of it sits on one grid of the image, so its layers are named left out (once refused whole: issue 117), and its
    image encoder, over the whole input resized to its 8 px (one 8-px patch: 32x32 px of the input), is the layers
    (``tests/test_depth_pro.py`` checks them against DINOv2's eager attention on a 4x4 grid)."""
    tiny = dict(model_type="dinov2", hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=8,
                patch_size=8, intermediate_size=64)
    config = transformers.DepthProConfig(image_model_config=tiny, patch_model_config=tiny, fov_model_config=tiny,
                                         patch_size=8,
                                         fusion_hidden_size=16, intermediate_hook_ids=[1, 0],
                                         intermediate_feature_dims=[16, 16], scaled_images_feature_dims=[16, 16, 16],
                                         use_fov_model=False)
    _, checkpoint = saved(tmp_path, transformers.DepthProForDepthEstimation, config)
    assert checkpoint.model.names == [f"depth_pro.encoder.image_encoder.model.encoder.layer.{i}.attention"
                                      for i in range(2)]
    assert checkpoint.model.layout.patch_hw == (32, 32) and checkpoint.model.layout.num_prefix_tokens == 1
    left_out = checkpoint.metadata["left_out"]
    assert sorted(left_out) == [f"depth_pro.encoder.patch_encoder.model.encoder.layer.{i}.attention" for i in range(2)]
    assert all("one ViT over 35 overlapping crops of the image at 3 scales" in why for why in left_out.values())
