"""The census's refusal buckets this wave opened (issue 117, bench/census_families.py), one representative each,
through the shared mechanism rather than a family's own case:

- a convolutional stem before the patches (timm's ViTamin and hybrid ViTs, open_clip's ViTamin and MobileCLIP-B): the
  patch embedding's grid does not account for the tokens, so the recorder places them on the forward's own feature
  map (the input's channels its stem's, not its projection's);
- an open_clip tower around a timm trunk timm's road cannot place (LeViT's, Swin's, FastViT's): the recorder at the
  attention function on the tower, as a timm model of that trunk is; a tower without attention (ConvNeXt) says so.

References: timm's own explicit attention path (``fused_attn`` off), the probabilities its ``attn_drop`` receives or
its attention modules' softmax, caught by the test's own hooks; the trunk's own features. Inputs are non-square
wherever the library takes one, so a transposed grid fails."""

from __future__ import annotations

import pytest
import torch
from layer_reference import library_softmax
from PIL import Image
from test_import_parity import timm_attentions

import vit
from vit.checkpoint import CheckpointError
from vit.core.inference import preprocess

timm = pytest.importorskip("timm")
from timm.models import _hub  # noqa: E402  (timm's save_for_hf)

# a convolutional stem before the patches: architecture -> (model_args, its grid at 64x96 px, its prefix tokens)
STEMS = {
    "vitamin_small_224": (dict(img_size=[64, 96], depth=2), (4, 6), 0),  # three conv stages, 16 px; no CLS
    "vit_tiny_r_s16_p8_224": (dict(img_size=[64, 96], depth=2), (2, 3), 1),  # a ResNet stem, 32 px; its proj's
    # input is the stem's 64 channels, not the image's 3
}


def spread(model: torch.nn.Module) -> torch.nn.Module:
    """Weights wide enough that every head's attention differs from uniform."""
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
    return model.eval()


@pytest.fixture(scope="module", params=STEMS)
def stem(request, tmp_path_factory):
    args, grid, prefix = STEMS[request.param]
    torch.manual_seed(0)
    model = spread(timm.create_model(request.param, pretrained=False, num_classes=3, **args))
    folder = tmp_path_factory.mktemp("stem")
    _hub.save_for_hf(model, folder, model_args=args)
    return model, folder, grid, prefix


def test_a_conv_stem_before_the_patches_places_every_layer_on_its_feature_map_as_timms_explicit_path(stem):
    model, folder, grid, prefix = stem
    checkpoint = vit.load(folder, device="cpu")
    wrapped = checkpoint.model
    assert checkpoint.road == "library" and wrapped.num_layers == 2
    assert wrapped.layout.grid == grid and wrapped.layout.num_prefix_tokens == prefix
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(1))
    out, kept = wrapped.run(x, layers=range(2))
    for block in model.blocks:
        block.attn.fused_attn = False
    logits, own = timm_attentions(model, x)
    torch.testing.assert_close(out.logits, logits, atol=1e-5, rtol=0)
    assert len(own) == 2
    for layer in range(2):
        torch.testing.assert_close(kept[layer], own[layer], atol=1e-6, rtol=0)
    image = Image.fromarray((torch.rand(64, 96, 3, generator=torch.Generator().manual_seed(2)) * 255).byte().numpy())
    explanation = vit.explain(checkpoint, image, "attention", layer=-1, head=1, query=0)
    _, own = timm_attentions(model, preprocess([image], checkpoint.preprocessing))
    torch.testing.assert_close(torch.from_numpy(explanation.map), own[-1][0, 1, 0, prefix:].reshape(grid), atol=1e-5,
                               rtol=0)


def test_a_conv_stem_model_in_hand_is_placed_the_same_not_on_its_one_pixel_patches(stem):
    model, folder, grid, prefix = stem
    checkpoint = vit.load(model, image_size=(64, 96))
    assert checkpoint.model.layout.grid == grid and checkpoint.model.layout.num_prefix_tokens == prefix


def open_clip_tower_folder(folder, trunk: str, image_size):
    open_clip = pytest.importorskip("open_clip")
    open_clip_hub = pytest.importorskip("open_clip.push_to_hf_hub")
    from safetensors.torch import save_file

    model_cfg = dict(embed_dim=16, vision_cfg=dict(image_size=image_size, timm_model_name=trunk,
                                                   timm_model_pretrained=False, timm_pool="avg", timm_proj="linear"),
                     text_cfg=dict(context_length=8, vocab_size=64, width=32, heads=1, layers=1))
    torch.manual_seed(0)
    model = spread(open_clip.model.CLIP(**model_cfg))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "open_clip_model.safetensors")
    model.visual.image_mean, model.visual.image_std = open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD
    open_clip_hub.save_config_for_hf(model, folder / "open_clip_config.json", model_config=model_cfg)
    return model, folder


def test_an_open_clip_tower_whose_timm_trunk_is_off_timms_attention_records_every_layer_as_its_own_softmax(tmp_path):
    reference, folder = open_clip_tower_folder(tmp_path, "levit_128s", 224)  # LeViT: pooled stages; open_clip
    # builds the trunk at its own 224 px (it passes no size to timm), and LeViT takes a square input only
    checkpoint = vit.load(folder, device="cpu")
    wrapped = checkpoint.model
    assert checkpoint.road == "library" and checkpoint.metadata["architecture"] == "open_clip:timm:levit_128s"
    assert not wrapped.classifier  # open_clip's image embedding, not logits
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    out, kept = wrapped.run(x, layers=range(wrapped.num_layers))
    with torch.no_grad():
        expected = reference.visual.trunk.forward_features(x)  # its features: the last block's tokens
    own = library_softmax(reference.visual, [reference.visual.get_submodule(n) for n in wrapped.names], x)
    assert len(own) == wrapped.num_layers == 11  # levit_128s: 2 + 3 + 4 blocks, 2 downsampling attentions
    for layer in range(wrapped.num_layers):
        torch.testing.assert_close(kept[layer], own[layer], atol=1e-5, rtol=0)
    torch.testing.assert_close(out.last_hidden_state, expected, atol=1e-5, rtol=0)


def test_an_open_clip_tower_without_attention_says_so_in_one_line(tmp_path):
    _, folder = open_clip_tower_folder(tmp_path, "convnext_atto", 32)
    with pytest.raises(CheckpointError, match="makes no attention call this road sees") as refused:
        vit.load(folder, device="cpu")
    assert "\n" not in str(refused.value)
