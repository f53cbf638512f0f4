"""MAE encoders opened through ``vit.sources`` match their own library: CLS after the final norm and every layer's
attention to 1e-5, at the native size and a non-square one.

- HF: a tiny random ``ViTMAEModel`` run with ``mask_ratio=0`` and ``noise=arange(patches)``, so it keeps every
  patch in order (it shuffles them even at ratio 0 otherwise).
- timm: a tiny random ``vit_base_patch16_224.mae`` (a plain ViT encoder, fused attention off).
"""

import pytest
import torch
from parity_helpers import assert_parity, capture_inputs, randomize

from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing transformers and timm takes seconds


def test_hf_vit_mae_without_masking_matches_transformers(tmp_path):
    config = transformers.ViTMAEConfig(image_size=32, patch_size=8, hidden_size=32, intermediate_size=48,
                                       num_hidden_layers=2, num_attention_heads=2, mask_ratio=0.0)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(transformers.ViTMAEModel(config))
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


def timm_mae(dynamic: bool = False):
    timm.layers.set_fused_attn(False)
    try:
        torch.manual_seed(0)
        model = timm.create_model("vit_base_patch16_224.mae", pretrained=False, img_size=32, patch_size=8,
                                  embed_dim=32, depth=2, num_heads=2, num_classes=0, dynamic_img_size=dynamic)
    finally:
        timm.layers.set_fused_attn(True)
    return randomize(model)


def test_timm_mae_matches_timm(tmp_path):
    model, dynamic = timm_mae(), timm_mae(dynamic=True)
    dynamic.load_state_dict(model.state_dict())
    timm.models.save_for_hf(model, tmp_path / "timm", model_args=dict(num_heads=2, img_size=32),
                            safe_serialization=True)
    checkpoint = open_source(tmp_path / "timm")
    for label, reference, size in (("native", model, (32, 32)), ("40x24", dynamic, (40, 24))):
        images = torch.randn(2, 3, *size)
        expected, attentions = capture_inputs([b.attn.attn_drop for b in reference.blocks],
                                              lambda reference=reference, images=images: reference(images))
        with torch.no_grad():
            ours = checkpoint.model.encode(images, output_attentions=True)
        assert_parity(f"MAE | timm vit_*.mae | {label}", ours.embedding, expected, ours.attentions, attentions)


def test_hf_vit_mae_for_pretraining_opens_its_encoder_as_vit_mae_model(tmp_path):
    """Issue 33, item 4: MAE's checkpoints are published as ViTMAEForPreTraining (encoder + pixel decoder); the
    encoder opens with every patch in order, as ViTMAEModel with mask_ratio=0 and noise=arange(patches)."""
    config = transformers.ViTMAEConfig(image_size=32, patch_size=8, hidden_size=32, intermediate_size=48,
                                       num_hidden_layers=2, num_attention_heads=2, decoder_hidden_size=16,
                                       decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
                                       decoder_intermediate_size=32, mask_ratio=0.75)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(transformers.ViTMAEForPreTraining(config))
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
