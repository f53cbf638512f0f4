"""SAM 2's Hiera image encoder opened from HF ``sam2`` folders matches transformers: every layer's attention, each
stage's output and the last hidden state to 1e-5 at two input sizes, windows padded, pooled queries and a global
block; by path and by Hub id. (timm's ``sam2_hiera_*`` is in ``test_hiera_parity.py``.)

- A tiny random ``Sam2VisionModel`` / ``Sam2Model`` (eager attention), saved natively, opened once each. HF's
  ``Sam2MultiScaleAttention`` computes an unused softmax before pooling its queries; the attention it applies is
  the one its attention interface returns, read by wrapping ``eager_attention_forward`` for the forward.
- HF cuts windows row-major on the zero-padded grid, slots row-major, as we do: each window's attention
  ``(B * nw, nh, q, k)`` compares as is; a global block's is ``(B, nh, T, T)``.
"""

import pytest
import torch
from parity_helpers import assert_parity, hf_random

from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
modeling_sam2 = pytest.importorskip("transformers.models.sam2.modeling_sam2")
pytestmark = pytest.mark.slow  # importing transformers takes seconds

# Patch stride 4: on 64 px a 16x16 grid in windows of 4; the pooling block (in those windows) makes 8x8, in windows of
# 6 (padded to 12x12), pooled to 4x4 in windows of 3 (padded to 6x6), then a global block. 80 px: 20x20, 10x10, 5x5.
SIZES = (64, 80)
BACKBONE = dict(model_type="sam2_hiera_det_model", hidden_size=8, embed_dim_per_stage=[8, 16, 32],
                num_attention_heads_per_stage=[1, 2, 4], blocks_per_stage=[1, 2, 2], num_query_pool_stages=2,
                window_size_per_stage=[4, 6, 2], global_attention_blocks=[4],
                window_positional_embedding_background_size=[3, 3], image_size=[64, 64])
VISION = dict(backbone_config=BACKBONE, backbone_channel_list=[32, 16, 8],
              backbone_feature_sizes=[[16, 16], [8, 8], [4, 4]], fpn_hidden_size=8, fpn_top_down_levels=[1, 2])
STAGE_ENDS = (0, 2, 4)


def _config(architecture: str):
    if architecture == "Sam2VisionModel":
        return transformers.Sam2VisionConfig(**VISION)
    return transformers.Sam2Config(vision_config=VISION,
                                   prompt_encoder_config=dict(hidden_size=8, image_size=64, patch_size=16),
                                   mask_decoder_config=dict(hidden_size=8, mlp_dim=16, num_attention_heads=2,
                                                            iou_head_hidden_dim=8))


@pytest.fixture(scope="module", params=["Sam2VisionModel", "Sam2Model"])
def hf_pair(request, tmp_path_factory):
    model = hf_random(getattr(transformers, request.param), _config(request.param))
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    backbone = model.backbone if request.param == "Sam2VisionModel" else model.vision_encoder.backbone
    return request.param, folder, backbone, open_source(folder)


def hf_run(backbone, images):
    """The backbone's output and the attention each layer applied, from its attention interface."""
    captured, eager = [], modeling_sam2.eager_attention_forward

    def recording(*args, **kwargs):
        out, weights = eager(*args, **kwargs)
        captured.append(weights)
        return out, weights

    modeling_sam2.eager_attention_forward = recording
    try:
        with torch.no_grad():
            out = backbone(pixel_values=images)
    finally:
        modeling_sam2.eager_attention_forward = eager
    return out, captured


def ours_run(checkpoint, images):
    names = [f"blocks.{i}.hook_resid_post" for i in STAGE_ENDS]
    with torch.no_grad():
        encoding = checkpoint.model.encode(images, output_attentions=True)
        _, cache = checkpoint.model.run_with_cache(images, names)
    return encoding, [cache[n] for n in names]


@pytest.mark.parametrize("size", SIZES)
def test_hf_sam2_matches_transformers_at_two_sizes(hf_pair, size):
    architecture, _, backbone, checkpoint = hf_pair
    images = torch.randn(2, 3, size, size)
    out, attentions = hf_run(backbone, images)
    ours, stages = ours_run(checkpoint, images)
    assert len(attentions) == 5 and attentions[3].shape[-2:] == (9, 36)  # the pooled block: 3x3 queries, 6x6 keys
    assert_parity(f"sam2 hiera | HF {architecture} | {size} px", stages[-1], out.last_hidden_state.flatten(1, 2),
                  ours.attentions, attentions)
    for mine, theirs in zip(stages, out.intermediate_hidden_states, strict=True):
        assert torch.allclose(mine, theirs.flatten(1, 2), atol=1e-5)
    assert torch.allclose(ours.embedding, out.last_hidden_state.mean(dim=(1, 2)), atol=1e-5)


def test_hf_sam2_is_the_backbone_alone_in_its_own_preprocessing(hf_pair):
    _, _, _, checkpoint = hf_pair
    c = checkpoint.config
    assert checkpoint.model.head is None and not c.fc_norm and c.stage_widths == (8, 16, 32)
    assert (c.stage_windows, c.global_layers, c.pos_embed_grid, c.pos_embed_window) == ((4, 6, 2), (4,), 3, 4)
    p = checkpoint.preprocessing  # Sam2ImageProcessor's defaults: a square resize, bilinear, ImageNet statistics
    assert p.image_size == 64 and p.resample == "bilinear" and p.mean == pytest.approx((0.485, 0.456, 0.406))


def test_hf_sam2_refuses_a_size_its_position_windows_do_not_tile_in_one_line(hf_pair):
    _, _, _, checkpoint = hf_pair
    with pytest.raises(ValueError, match="multiples of 16 px") as error:
        checkpoint.model.encode(torch.randn(1, 3, 72, 72))
    assert "\n" not in str(error.value)


def test_hf_sam2_backbone_alone_opens_by_hub_id_from_the_hub_and_then_from_the_cache(tmp_path, fake_hub):
    config = transformers.Sam2HieraDetConfig(**{k: v for k, v in BACKBONE.items() if k != "model_type"})
    backbone = hf_random(modeling_sam2.Sam2HieraDetModel, config)
    backbone.save_pretrained(tmp_path / "sam2")
    fake_hub.add_folder("facebook/sam2-tiny-test", tmp_path / "sam2")
    images = torch.randn(1, 3, 64, 64)
    out, attentions = hf_run(backbone, images)
    for _ in range(2):  # downloaded, then read from the HF cache
        checkpoint = open_source("facebook/sam2-tiny-test")
        ours, stages = ours_run(checkpoint, images)
        assert_parity("sam2 hiera | HF Sam2HieraDetModel by Hub id | 64 px", stages[-1],
                      out.last_hidden_state.flatten(1, 2), ours.attentions, attentions)
    assert checkpoint.metadata["source"]["architecture"] == "hf:Sam2HieraDetModel"
    assert fake_hub.fetched("GET").count("model.safetensors") == 1


@pytest.mark.parametrize(("field", "value", "message"), [
    ("hidden_act", "relu", "exact GELU"), ("embed_dim_per_stage", [], "list of widths"),
    ("window_positional_embedding_background_size", [3, 4], "square sides"),
    ("num_query_pool_stages", 1, "query pooling in 1 of 2")])
def test_a_sam2_config_this_model_cannot_read_is_refused_in_one_line(hf_pair, tmp_path, field, value, message):
    import json
    import shutil

    from vit.sources.open import SourceError

    _, folder, _, _ = hf_pair
    shutil.copytree(folder, tmp_path / "bad")
    config = json.loads((tmp_path / "bad" / "config.json").read_text())
    backbone = config["backbone_config"] if "backbone_config" in config else config["vision_config"]["backbone_config"]
    backbone[field] = value
    (tmp_path / "bad" / "config.json").write_text(json.dumps(config))
    with pytest.raises(SourceError, match=message) as error:
        open_source(tmp_path / "bad")
    assert "\n" not in str(error.value)
