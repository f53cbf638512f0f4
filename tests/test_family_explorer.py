"""The explorer on the new families: a SigLIP-like tower without CLS draws the pooling probe's attention (and a
rollout ending with it) by default, a DINOv3-like one keeps every map exact at a non-square keep-aspect size with
its rotary positions and names its 4 storage tokens, and a feature model's caption gives its embedding norm."""

import numpy as np
import torch
from PIL import Image

from vit.app import drawing
from vit.checkpoint import Checkpoint, Preprocessing
from vit.core.inference import TRAINING_SIZE, InputSize, preprocess
from vit.explain.methods.attention import fuse_heads, rollout_factor, rollout_vector
from vit.explain.views import attention_maps, image_analysis, map_captions
from vit.explain.views.map_captions import token_label
from vit.model import ViT, ViTConfig

BASE = dict(image_size=16, patch_size=4, num_classes=0, hidden_size=16, num_layers=2, num_heads=2, mlp_size=24)


def checkpoint(**options) -> Checkpoint:
    torch.manual_seed(0)
    config = ViTConfig(**{**BASE, **options})
    model = ViT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return Checkpoint(model=model, class_names=[], preprocessing=Preprocessing.default_for(config))


def image(width: int = 30, height: int = 20) -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8))


def test_a_model_without_cls_shows_its_pooling_probe_first_and_exactly():
    ckpt = checkpoint(class_token=False, pooling="map", activation="gelu_tanh", projection_dim=8)
    analysis = image_analysis.analyse(ckpt, image())
    assert not analysis.has_cls and attention_maps.map_kinds(analysis, False)[:2] == ["probe", "probe_rollout"]
    x = preprocess([image()], ckpt.preprocessing, TRAINING_SIZE, 4)
    with torch.no_grad():
        encoded = ckpt.model.encode(x, output_attentions=True)
    probe = encoded.pool_attention[0, :, 0]  # (H, T)
    drawn = attention_maps.attention_map(analysis, attention_maps.MapSettings(kind="probe"))
    np.testing.assert_allclose(drawn, probe.mean(0).reshape(4, 4).numpy(), atol=1e-6)
    one_head = attention_maps.attention_map(analysis, attention_maps.MapSettings(kind="probe", head=1))
    np.testing.assert_allclose(one_head, probe[1].reshape(4, 4).numpy(), atol=1e-6)
    factors = [rollout_factor(a, "mean") for a in encoded.attentions]
    expected = rollout_vector(factors, fuse_heads(probe[None, :, None], "mean")[:, 0])[0].reshape(4, 4)
    rolled = attention_maps.attention_map(analysis, attention_maps.MapSettings(kind="probe_rollout"))
    np.testing.assert_allclose(rolled, expected.numpy(), atol=1e-6)
    caption = map_captions.describe_map(attention_maps.MapSettings(kind="probe"), analysis, [])
    assert "no CLS token" in caption
    assert "CLS" not in map_captions.describe_map(attention_maps.MapSettings(kind="attention"), analysis, [])
    assert "norm" in drawing.describe_embedding(analysis)
    torch.testing.assert_close(analysis.embedding, encoded.embedding[0], rtol=0, atol=1e-6)


def test_a_model_with_cls_offers_no_probe_maps():
    analysis = image_analysis.analyse(checkpoint(), image())
    assert not set(attention_maps.map_kinds(analysis, False)) & set(attention_maps.PROBE_MAP_KINDS)


def test_a_native_aimv2_like_model_says_its_positions_are_computed_for_the_grid_it_sees():
    ckpt = checkpoint(class_token=False, pooling="avg", pos_embed=False, sincos_pos=True, norm="rms", embed_norm=True)
    analysis = image_analysis.analyse(ckpt, image(), InputSize(side=24, keep_aspect=True))
    assert analysis.grid == (4, 6)
    assert "sine-cosine positions are computed for this grid" in drawing.describe_input(analysis, (30, 20))


def test_a_dinov3_like_model_is_exact_at_a_non_square_size_and_names_its_storage_tokens():
    ckpt = checkpoint(num_register_tokens=4, layer_scale=0.5, pos_embed=False, rope="dinov3", key_bias=False)
    size = InputSize(side=24, keep_aspect=True)
    analysis = image_analysis.analyse(ckpt, image(), size)
    assert analysis.grid == (4, 6) and analysis.prefix_names == ("CLS", "REG 1", "REG 2", "REG 3", "REG 4")
    assert token_label(3, analysis.grid, 5, analysis.prefix_names) == "REG 3"
    assert "rotary positions take any size" in drawing.describe_input(analysis, (30, 20))
    x = preprocess([image()], ckpt.preprocessing, size, 4)
    with torch.no_grad():
        _, attentions = ckpt.model(x, output_attentions=True)
    for mine, theirs in zip(analysis.attentions, attentions, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)
    np.testing.assert_allclose(attention_maps.attention_map(analysis, attention_maps.MapSettings(query=7)),
                               attentions[-1][0, :, 7, 5:].mean(0).reshape(4, 6).numpy(), atol=1e-6)
