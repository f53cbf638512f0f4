"""Perception Encoder opened through ``vit.sources`` matches timm: the pooled (projected) output, every layer's
attention (caught on ``attn_drop``) and the probe's attention to 1e-5, at the native size and a non-square one
(timm's ``dynamic_img_size`` resamples the table and rebuilds the RoPE grid).

Tiny random ``vit_pe_core_tiny_patch16_384`` (the probe with its own 8 heads, the projection) and
``vit_pe_spatial_tiny_patch16_512`` / ``vit_pe_lang_large_patch14_448`` (mean of the patches, no final norm; lang
with layer scale), fused attention off, saved with timm's ``save_for_hf``. PE-core's head bias is zero, as timm's
conversion of the original bias-free ``proj`` writes it.
"""

import pytest
import torch
from parity_helpers import assert_parity, capture_inputs, randomize, save_timm, timm_outputs, timm_random

from vit.sources.open import SourceError, open_source

timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing timm takes seconds

NAMES = ["vit_pe_core_tiny_patch16_384", "vit_pe_spatial_tiny_patch16_512", "vit_pe_lang_large_patch14_448"]


def pe(name: str, dynamic: bool = False):
    model = timm_random(name, dynamic)
    if isinstance(model.head, torch.nn.Linear):
        with torch.no_grad():
            model.head.bias.zero_()
    return model


def probe_attention(pool, tokens: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd)) of timm's AttentionPoolLatent, from its own q / kv weights."""
    B, N, C = tokens.shape
    q = pool.q(pool.latent.expand(B, -1, -1)).reshape(B, 1, pool.num_heads, pool.head_dim).transpose(1, 2)
    k = pool.kv(tokens).reshape(B, N, 2, pool.num_heads, pool.head_dim).permute(2, 0, 3, 1, 4)[0]
    return ((q * pool.scale) @ k.transpose(-2, -1)).softmax(dim=-1)


@pytest.mark.parametrize("name", NAMES)
def test_timm_pe_matches_timm(tmp_path, name):
    model, dynamic = pe(name), pe(name, dynamic=True)
    dynamic.load_state_dict(model.state_dict())
    checkpoint = open_source(save_timm(model, tmp_path / "pe"))
    assert checkpoint.config.rope == "pe" and checkpoint.model.num_prefix_tokens == 1
    core = model.attn_pool is not None
    for label, reference, size in (("native", model, (32, 32)), ("48x24", dynamic, (48, 24))):
        images = torch.randn(2, 3, *size)
        modules = [b.attn.attn_drop for b in reference.blocks] + ([reference.attn_pool] if core else [])
        expected, captured = capture_inputs(modules, lambda reference=reference, images=images: reference(images))
        with torch.no_grad():
            ours = checkpoint.model.encode(images, output_attentions=True)
        row = f"PE | timm {name} | {label}"
        assert_parity(row, ours.embedding, expected, ours.attentions, captured[:len(reference.blocks)])
        if core:
            with torch.no_grad():
                probe = probe_attention(reference.attn_pool, captured[-1])
            assert ours.pool_attention.shape[1] == 8  # the probe's own heads, not the blocks' 2
            assert_parity(f"{row} probe attention", ours.embedding, expected, [ours.pool_attention], [probe])


def test_a_pe_head_with_a_bias_is_refused_in_one_line(tmp_path):
    model = randomize(timm.create_model(NAMES[0], pretrained=False, img_size=32, patch_size=8, embed_dim=32,
                                        depth=1, num_heads=2))
    save_timm(model, tmp_path / "pe")
    with pytest.raises(SourceError, match="head.bias is not zero") as error:
        open_source(tmp_path / "pe")
    assert "\n" not in str(error.value)


def test_timm_pe_opens_by_its_timm_name_from_the_hub(tmp_path, fake_hub):
    model = pe(NAMES[0])
    fake_hub.add_folder(f"timm/{NAMES[0]}.fb", save_timm(model, tmp_path / "pe"))
    images = torch.randn(1, 3, 32, 32)
    expected, captured = timm_outputs(model, images)
    with torch.no_grad():
        ours = open_source(f"{NAMES[0]}.fb").model.encode(images, output_attentions=True)
    assert_parity("PE | timm name via the Hub | native", ours.embedding, expected, ours.attentions, captured)


def test_an_opened_pe_saved_as_our_checkpoint_loads_back_to_the_same_numbers(tmp_path):
    from vit.checkpoint import load_checkpoint, save_checkpoint

    opened = open_source(save_timm(pe(NAMES[0]), tmp_path / "pe"))
    save_checkpoint(tmp_path / "pe.pt", opened.model, opened.class_names, opened.preprocessing)
    loaded = load_checkpoint(tmp_path / "pe.pt")
    assert loaded.config == opened.config and loaded.config.pool_heads == 8
    images = torch.randn(1, 3, 48, 24)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model.encode(images).embedding, opened.model.encode(images).embedding,
                                   rtol=0, atol=1e-6)  # the same weights; BLAS may sum in another order
