"""EVA-02 opened through ``vit.sources`` matches timm: the pooled output and every layer's attention to 1e-5 at the
native size and a non-square one (timm's ``dynamic_img_size`` resamples the table and rebuilds the RoPE grid).

Tiny random ``eva02_tiny_patch14_224`` (fused qkv, packed SwiGLU) and ``eva02_base_patch14_224`` (separate q/k/v,
SwiGLU with its inner LayerNorm), fused attention off, saved with timm's ``save_for_hf``.
"""

import pytest
import torch
from parity_helpers import assert_parity, assert_timm_parity, save_timm, timm_outputs, timm_pair, timm_random

from vit.sources.open import SourceError, open_source

timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing timm takes seconds


@pytest.mark.parametrize("name", ["eva02_tiny_patch14_224", "eva02_base_patch14_224"])
def test_timm_eva02_matches_timm(tmp_path, name):
    model, dynamic = timm_pair(name, num_classes=0)
    checkpoint = open_source(save_timm(model, tmp_path / "eva"))
    assert checkpoint.config.rope == "eva" and checkpoint.config.gated_mlp
    assert_timm_parity(f"EVA-02 | timm {name}", checkpoint, (("native", model, (32, 32)), ("48x24", dynamic, (48, 24))))


def test_timm_eva02_built_at_a_rectangular_img_size_opens_and_matches_timm(tmp_path):
    # timm builds the position table and RoPE on the 6 x 3 grid of img_size=(48, 24) (RotaryEmbeddingCat's
    # feat_shape, each axis rescaled to ref_feat_shape); the logits and attention equal timm's there, and at another
    # size equal its dynamic_img_size twin's (the rectangular table resampled).
    model, dynamic = timm_pair("eva02_tiny_patch14_224", img_size=(48, 24), num_classes=5)
    checkpoint = open_source(save_timm(model, tmp_path / "eva", img_size=[48, 24]))
    assert checkpoint.config.image_size == (48, 24)
    for label, reference, size in (("48x24 built", model, (48, 24)), ("24x40", dynamic, (24, 40))):
        images = torch.randn(2, 3, *size)
        expected, attentions = timm_outputs(reference, images)
        with torch.no_grad():
            ours = checkpoint.model.encode(images, output_attentions=True)
        assert_parity(f"EVA-02 | timm eva02_tiny img_size=(48, 24) | {label}", ours.logits, expected,
                      ours.attentions, attentions)


def test_an_eva_clip_tower_is_refused_in_one_line(tmp_path):
    save_timm(timm_random("eva02_base_patch16_clip_224", num_classes=0), tmp_path / "eva")
    with pytest.raises(SourceError, match="scale_attn_inner") as error:
        open_source(tmp_path / "eva")
    assert "\n" not in str(error.value)


def test_timm_eva02_and_dinov3_folders_of_the_hf_cache_are_listed_and_described(tmp_path):
    from vit.app.catalog import describe, find_hf_cache_models

    for name in ("vit_small_patch16_dinov3_qkvb", "eva02_tiny_patch14_224"):
        model = timm.create_model(name, pretrained=False, img_size=32, patch_size=8, embed_dim=32, depth=1,
                                  num_heads=2)
        repo = tmp_path / f"models--timm--{name}"
        save_timm(model, repo / "snapshots" / "rev1")
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("rev1")
    entries = {c.name: describe(c) for c in find_hf_cache_models([tmp_path])}
    assert set(entries) == {"timm/vit_small_patch16_dinov3_qkvb", "timm/eva02_tiny_patch14_224"}
    assert all(e.error is None and e.num_layers == 1 for e in entries.values())

