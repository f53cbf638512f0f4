"""EVA-02 opened through ``vit.sources`` matches timm: the pooled output and every layer's attention to 1e-5 at the
native size and a non-square one (timm's ``dynamic_img_size`` resamples the table and rebuilds the RoPE grid).

Tiny random ``eva02_tiny_patch14_224`` (fused qkv, packed SwiGLU) and ``eva02_base_patch14_224`` (separate q/k/v,
SwiGLU with its inner LayerNorm), fused attention off, saved with timm's ``save_for_hf``.
"""

import pytest
import torch
from parity_helpers import assert_parity, capture_inputs, randomize

from vit.sources.open import SourceError, open_source

timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing timm takes seconds


def eva(name: str, dynamic: bool = False, **kwargs):
    timm.layers.set_fused_attn(False)
    try:
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False, img_size=32, patch_size=8, embed_dim=32, depth=2,
                                  num_heads=2, num_classes=0, dynamic_img_size=dynamic, **kwargs)
    finally:
        timm.layers.set_fused_attn(True)
    return randomize(model)


@pytest.mark.parametrize("name", ["eva02_tiny_patch14_224", "eva02_base_patch14_224"])
def test_timm_eva02_matches_timm(tmp_path, name):
    model, dynamic = eva(name), eva(name, dynamic=True)
    dynamic.load_state_dict(model.state_dict())
    timm.models.save_for_hf(model, tmp_path / "eva", model_args=dict(num_heads=2, img_size=32),
                            safe_serialization=True)
    checkpoint = open_source(tmp_path / "eva")
    assert checkpoint.config.rope == "eva" and checkpoint.config.gated_mlp
    for label, reference, size in (("native", model, (32, 32)), ("48x24", dynamic, (48, 24))):
        images = torch.randn(2, 3, *size)
        expected, attentions = capture_inputs([b.attn.attn_drop for b in reference.blocks],
                                              lambda reference=reference, images=images: reference(images))
        with torch.no_grad():
            ours = checkpoint.model.encode(images, output_attentions=True)
        assert_parity(f"EVA-02 | timm {name} | {label}", ours.embedding, expected, ours.attentions, attentions)


def test_an_eva_clip_tower_is_refused_in_one_line(tmp_path):
    model = eva("eva02_base_patch16_clip_224")
    timm.models.save_for_hf(model, tmp_path / "eva", model_args=dict(num_heads=2, img_size=32),
                            safe_serialization=True)
    with pytest.raises(SourceError, match="scale_attn_inner") as error:
        open_source(tmp_path / "eva")
    assert "\n" not in str(error.value)


def test_timm_eva02_and_dinov3_folders_of_the_hf_cache_are_listed_and_described(tmp_path):
    from vit.app.catalog import describe, find_hf_cache_models

    for name in ("vit_small_patch16_dinov3_qkvb", "eva02_tiny_patch14_224"):
        model = timm.create_model(name, pretrained=False, img_size=32, patch_size=8, embed_dim=32, depth=1,
                                  num_heads=2)
        repo = tmp_path / f"models--timm--{name}"
        timm.models.save_for_hf(model, repo / "snapshots" / "rev1", model_args=dict(num_heads=2, img_size=32),
                                safe_serialization=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("rev1")
    entries = {c.name: describe(c) for c in find_hf_cache_models([tmp_path])}
    assert set(entries) == {"timm/vit_small_patch16_dinov3_qkvb", "timm/eva02_tiny_patch14_224"}
    assert all(e.error is None and e.num_layers == 1 for e in entries.values())

