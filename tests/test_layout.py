"""Attention layouts (issue 46): the additive bias on the logits at ``attn.hook_bias``, BEiT's relative position
index, SAM's windows and their placement back on the patch grid, checked against hand-built expectations."""

import pytest
import torch

from vit.model import ViT, ViTConfig, beit_relative_position_index


def noised(config: ViTConfig, seed: int = 0) -> ViT:
    torch.manual_seed(seed)
    model = ViT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


BEIT = dict(image_size=32, patch_size=8, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32, num_classes=3)


def test_beit_index_reads_each_patch_pair_by_its_offset_and_cls_pairs_from_the_last_three_rows():
    index = beit_relative_position_index((2, 3))  # offsets span 3 x 5 = 15 rows; CLS rows 15, 16, 17
    assert index.shape == (7, 7)
    assert index[0, 0] == 17 and (index[0, 1:] == 15).all() and (index[1:, 0] == 16).all()
    # patch (0, 0) to patch (1, 2): offset (-1, -2) -> row (-1 + 1) * 5 + (-2 + 2) = 0; to itself: the centre, 7
    assert index[1, 1 + 5] == 0 and index[1, 1] == 7 and index[1 + 5, 1] == 14


@pytest.mark.parametrize("rel_pos", ["beit", "beit_shared"])
def test_the_bias_is_read_at_hook_bias_and_zeroing_it_is_the_model_without_its_tables(rel_pos):
    model = noised(ViTConfig(**BEIT, rel_pos=rel_pos, key_bias=False))
    images = torch.randn(2, 3, 32, 24)
    zero = [(f"blocks.{i}.attn.hook_bias", lambda x, hook: torch.zeros_like(x)) for i in range(2)]
    _, cache = model.run_with_cache(images, ["blocks.0.attn.hook_bias"])
    assert cache["blocks.0.attn.hook_bias"].shape == (1, 2, 13, 13)  # (1, nh, T, T): 4 x 3 patches + CLS
    with torch.no_grad():
        hooked = model.run_with_hooks(images, zero).logits
        for name, p in model.named_parameters():
            if name.endswith("table"):
                p.zero_()
        assert torch.allclose(hooked, model(images)[0], atol=1e-6)


@pytest.mark.parametrize("rel_pos", ["beit", "beit_shared"])
def test_the_fused_and_explicit_paths_add_the_same_bias(rel_pos):
    model = noised(ViTConfig(**BEIT, rel_pos=rel_pos))
    images = torch.randn(2, 3, 40, 24)
    with torch.no_grad():
        assert torch.allclose(model(images)[0], model(images, output_attentions=True)[0], atol=1e-5)
