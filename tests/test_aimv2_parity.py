"""AIMv2 image towers opened through ``vit.sources`` match their own library: the pooled (or projected) output and
every layer's attention to 1e-5, and the pooling head's attention where there is one.

- HF: tiny random ``Aimv2VisionModel`` (with and without its attention-pooling head) and ``Aimv2Model`` (eager
  attention), saved with ``save_pretrained``. HF's towers with a table take only their native size (their
  position ids are fixed); the native-resolution ones (``is_native``) any size. The head runs SDPA, so its
  attention is recomputed from the reference's own ``head`` weights.
- timm: a tiny random ``aimv2_large_patch14_224`` (mean pooling, fused attention off), at its native size and a
  non-square one (``dynamic_img_size`` resamples the table).
"""

import pytest
import torch
from parity_helpers import (
    HF_TEXT,
    HF_VISION,
    assert_parity,
    assert_timm_parity,
    hf_random,
    randomize,
    save_timm,
    timm_pair,
)

from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing transformers and timm takes seconds


def hf_head_attention(head, tokens: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd)) of HF's Aimv2AttentionPoolingHead, from its own cls_token and k_proj weights."""
    B, N, C = tokens.shape
    hd = C // head.num_heads
    q = head.cls_token.reshape(1, head.num_heads, 1, hd)
    k = head.k_proj(tokens).reshape(B, N, head.num_heads, hd).transpose(1, 2)
    return (q @ k.transpose(-2, -1) / hd ** 0.5).softmax(dim=-1)  # (B, nh, 1, N)


@pytest.mark.parametrize("architecture,use_head", [("Aimv2VisionModel", True), ("Aimv2VisionModel", False),
                                                   ("Aimv2Model", True)])
def test_hf_aimv2_matches_transformers(tmp_path, architecture, use_head):
    if architecture == "Aimv2Model":
        config = transformers.Aimv2Config(vision_config=HF_VISION, projection_dim=24, text_config=HF_TEXT)
    else:
        config = transformers.Aimv2VisionConfig(**HF_VISION, use_head=use_head)
    model = hf_random(getattr(transformers, architecture), config)
    model.save_pretrained(tmp_path / "aimv2")
    checkpoint = open_source(tmp_path / "aimv2")
    assert checkpoint.model.num_prefix_tokens == 0 and checkpoint.config.norm == "rms"
    vision = getattr(model, "vision_model", model)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = vision(pixel_values=images, output_attentions=True)
        ours = checkpoint.model.encode(images, output_attentions=True)
        if architecture == "Aimv2Model":
            expected = model.visual_projection(out.pooler_output)
        else:  # without a head HF pools nothing; AIMv2's own readout (timm's, the paper's probe input) is the mean
            expected = out.pooler_output if use_head else out.last_hidden_state.mean(dim=1)
    row = f"AIMv2 | HF {architecture}{'' if use_head else ' (no head)'} | native"
    assert_parity(row, ours.embedding, expected, ours.attentions, out.attentions)
    if use_head:
        with torch.no_grad():
            probe = hf_head_attention(vision.head, out.last_hidden_state)
        assert_parity(f"{row} head attention", ours.embedding, expected, [ours.pool_attention], [probe])


def test_hf_native_resolution_aimv2_matches_transformers_at_any_size(tmp_path):
    """``is_native``: no table, 2D sine-cosine positions for each grid, so a non-square input too."""
    config = transformers.Aimv2VisionConfig(**HF_VISION, is_native=True)
    model = hf_random(transformers.Aimv2VisionModel, config)
    model.save_pretrained(tmp_path / "native")
    checkpoint = open_source(tmp_path / "native")
    assert checkpoint.config.sincos_pos and not checkpoint.config.pos_embed
    for label, size in (("native", (32, 32)), ("48x24", (48, 24))):
        images = torch.randn(2, 3, *size)
        with torch.no_grad():
            out = model(pixel_values=images, output_attentions=True)
            ours = checkpoint.model.encode(images, output_attentions=True)
        assert_parity(f"AIMv2 | HF Aimv2VisionModel (is_native) | {label}", ours.embedding, out.pooler_output,
                      ours.attentions, out.attentions)


def test_timm_aimv2_matches_timm(tmp_path):
    model, dynamic = timm_pair("aimv2_large_patch14_224", num_classes=0)
    checkpoint = open_source(save_timm(model, tmp_path / "timm"))
    assert checkpoint.config.pooling == "avg" and checkpoint.config.norm == "rms" and not checkpoint.config.proj_bias
    assert_timm_parity("AIMv2 | timm aimv2_*", checkpoint, (("native", model, (32, 32)), ("48x24", dynamic, (48, 24))))


def test_hf_aimv2_opens_by_hub_id_from_the_hub_and_then_from_the_cache(tmp_path, fake_hub):
    config = transformers.Aimv2VisionConfig(**HF_VISION)
    model = hf_random(transformers.Aimv2VisionModel, config)
    model.save_pretrained(tmp_path / "aimv2")
    fake_hub.add_folder("apple/aimv2-tiny-patch8-32", tmp_path / "aimv2")
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        out = model(pixel_values=images, output_attentions=True)
        for _ in range(2):  # downloaded, then read from the HF cache
            ours = open_source("apple/aimv2-tiny-patch8-32").model.encode(images, output_attentions=True)
            assert_parity("AIMv2 | HF Hub id | native", ours.embedding, out.pooler_output, ours.attentions,
                          out.attentions)
    assert fake_hub.fetched("GET").count("model.safetensors") == 1


@pytest.mark.parametrize("native", [False, True])
def test_an_opened_aimv2_saved_as_our_checkpoint_loads_back_to_the_same_numbers(tmp_path, native):
    from vit.checkpoint import load_checkpoint, save_checkpoint

    torch.manual_seed(0)
    model = randomize(transformers.Aimv2VisionModel(transformers.Aimv2VisionConfig(**HF_VISION, is_native=native)))
    model.save_pretrained(tmp_path / "aimv2")
    opened = open_source(tmp_path / "aimv2")
    save_checkpoint(tmp_path / "aimv2.pt", opened.model, opened.class_names, opened.preprocessing)
    loaded = load_checkpoint(tmp_path / "aimv2.pt")
    assert loaded.config == opened.config
    images = torch.randn(1, 3, 32, 24)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model.encode(images).embedding, opened.model.encode(images).embedding,
                                   rtol=0, atol=1e-6)  # the same weights; BLAS may sum in another order
