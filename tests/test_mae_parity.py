"""MAE encoders opened through ``vit.sources`` match their own library: CLS after the final norm and every layer's
attention to 1e-5, at the native size and a non-square one.

- HF: a tiny random ``ViTMAEModel`` run with ``mask_ratio=0`` and ``noise=arange(patches)``, so it keeps every
  patch in order (it shuffles them even at ratio 0 otherwise).
- timm: a tiny random ``vit_base_patch16_224.mae`` (a plain ViT encoder, fused attention off).
"""

import pytest
import torch
from parity_helpers import assert_parity, assert_timm_parity, hf_random, save_timm, timm_pair

from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing transformers and timm takes seconds


def test_hf_vit_mae_without_masking_matches_transformers(tmp_path):
    config = transformers.ViTMAEConfig(image_size=32, patch_size=8, hidden_size=32, intermediate_size=48,
                                       num_hidden_layers=2, num_attention_heads=2, mask_ratio=0.0)
    model = hf_random(transformers.ViTMAEModel, config)
    model.save_pretrained(tmp_path / "mae")
    checkpoint = open_source(tmp_path / "mae")
    for label, size, interpolate in (("native", (32, 32), False), ("40x24", (40, 24), True)):
        images = torch.randn(2, 3, *size)
        patches = (size[0] // 8) * (size[1] // 8)
        noise = torch.arange(patches, dtype=torch.float32).expand(2, -1)  # argsort keeps the order
        with torch.no_grad():
            out = model(pixel_values=images, noise=noise, output_attentions=True,
                        interpolate_pos_encoding=interpolate)
            ours = checkpoint.model.encode(images, output_attentions=True)
        assert_parity(f"MAE | HF ViTMAEModel (mask off, order fixed) | {label}", ours.embedding,
                      out.last_hidden_state[:, 0], ours.attentions, out.attentions)


def test_timm_mae_matches_timm(tmp_path):
    model, dynamic = timm_pair("vit_base_patch16_224.mae", num_classes=0)
    checkpoint = open_source(save_timm(model, tmp_path / "timm"))
    assert_timm_parity("MAE | timm vit_*.mae", checkpoint, (("native", model, (32, 32)), ("40x24", dynamic, (40, 24))))


def test_hf_vit_mae_for_pretraining_opens_its_encoder_as_vit_mae_model(tmp_path):
    """Issue 33, item 4: MAE's checkpoints are published as ViTMAEForPreTraining (encoder + pixel decoder); the
    encoder opens with every patch in order, as ViTMAEModel with mask_ratio=0 and noise=arange(patches)."""
    config = transformers.ViTMAEConfig(image_size=32, patch_size=8, hidden_size=32, intermediate_size=48,
                                       num_hidden_layers=2, num_attention_heads=2, decoder_hidden_size=16,
                                       decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
                                       decoder_intermediate_size=32, mask_ratio=0.75)
    model = hf_random(transformers.ViTMAEForPreTraining, config)
    model.save_pretrained(tmp_path / "mae")
    checkpoint = open_source(tmp_path / "mae")
    assert checkpoint.metadata["architecture"] == "hf:ViTMAEForPreTraining"
    encoder = model.vit
    encoder.config.mask_ratio = 0.0
    images = torch.randn(2, 3, 32, 32)
    noise = torch.arange(16, dtype=torch.float32).expand(2, -1)
    with torch.no_grad():
        out = encoder(pixel_values=images, noise=noise, output_attentions=True)
        ours = checkpoint.model.encode(images, output_attentions=True)
    assert out.last_hidden_state.shape[1] == 17  # every patch kept
    assert_parity("MAE | HF ViTMAEForPreTraining encoder (mask off, order fixed) | native", ours.embedding,
                  out.last_hidden_state[:, 0], ours.attentions, out.attentions)
