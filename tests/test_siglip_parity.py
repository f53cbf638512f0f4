"""SigLIP image towers opened through ``vit.sources`` match their own library: the pooled embedding, every layer's
attention and the pooling probe's attention to 1e-5.

- HF: tiny random ``SiglipVisionModel`` / ``SiglipModel`` (eager attention); SigLIP 2's fixed-resolution
  checkpoints are ``SiglipModel`` folders. The probe's attention is recomputed from the reference's own ``head``
  (its ``nn.MultiheadAttention`` with ``need_weights=True, average_attn_weights=False``).
- timm: a tiny random ``vit_base_patch16_siglip_224`` (``global_pool='map'``, fused attention off); the probe's
  attention is recomputed from the reference's own ``attn_pool`` weights on the tokens it received.
"""

import pytest
import torch
from parity_helpers import (
    HF_TEXT,
    HF_VISION,
    assert_parity,
    capture_inputs,
    hf_random,
    randomize,
    save_timm,
    timm_pair,
    timm_random,
)

from vit.sources.open import SourceError, open_source

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing transformers and timm takes seconds


def hf_probe_attention(head, tokens: torch.Tensor) -> torch.Tensor:
    probe = head.probe.expand(tokens.shape[0], -1, -1)
    return head.attention(probe, tokens, tokens, need_weights=True, average_attn_weights=False)[1]  # (B, nh, 1, T)


@pytest.mark.parametrize("architecture", ["SiglipVisionModel", "SiglipModel"])
def test_hf_siglip_matches_transformers(tmp_path, architecture):
    if architecture == "SiglipModel":
        config = transformers.SiglipConfig(vision_config=HF_VISION, text_config=HF_TEXT)
    else:
        config = transformers.SiglipVisionConfig(**HF_VISION)
    model = hf_random(getattr(transformers, architecture), config)
    model.save_pretrained(tmp_path / "siglip")
    checkpoint = open_source(tmp_path / "siglip")
    assert checkpoint.model.num_prefix_tokens == 0 and checkpoint.config.pooling == "map"
    vision = getattr(model, "vision_model", model)  # SiglipVisionModel is the tower itself in transformers 5
    for label, size, interpolate in (("native", (32, 32), False), ("40x24", (40, 24), True)):
        images = torch.randn(2, 3, *size)
        with torch.no_grad():
            out = vision(pixel_values=images, output_attentions=True, interpolate_pos_encoding=interpolate)
            probe = hf_probe_attention(vision.head, out.last_hidden_state)
            ours = checkpoint.model.encode(images, output_attentions=True)
        assert_parity(f"SigLIP | HF {architecture} | {label}", ours.embedding, out.pooler_output, ours.attentions,
                      out.attentions)
        assert_parity(f"SigLIP | HF {architecture} probe attention | {label}", ours.embedding, out.pooler_output,
                      [ours.pool_attention], [probe])


TIMM_SIGLIP = "vit_base_patch16_siglip_224"


def timm_probe_attention(pool, tokens: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd)) of timm's AttentionPoolLatent, from its own q / kv weights."""
    B, N, C = tokens.shape
    q = pool.q(pool.latent.expand(B, -1, -1)).reshape(B, 1, pool.num_heads, pool.head_dim).transpose(1, 2)
    k = pool.kv(tokens).reshape(B, N, 2, pool.num_heads, pool.head_dim).permute(2, 0, 3, 1, 4)[0]
    return ((q * pool.scale) @ k.transpose(-2, -1)).softmax(dim=-1)


def test_timm_siglip_with_map_pooling_matches_timm(tmp_path):
    model, dynamic = timm_pair(TIMM_SIGLIP, num_classes=0)
    checkpoint = open_source(save_timm(model, tmp_path / "timm"))
    assert checkpoint.config.pooling == "map" and not checkpoint.config.class_token
    for label, reference, size in (("native", model, (32, 32)), ("40x24", dynamic, (40, 24))):
        images = torch.randn(2, 3, *size)
        modules = [b.attn.attn_drop for b in reference.blocks] + [reference.attn_pool]
        expected, captured = capture_inputs(modules, lambda reference=reference, images=images: reference(images))
        with torch.no_grad():
            probe = timm_probe_attention(reference.attn_pool, captured[-1])
            ours = checkpoint.model.encode(images, output_attentions=True)
        assert_parity(f"SigLIP | timm vit_*_siglip_* (map) | {label}", ours.embedding, expected, ours.attentions,
                      captured[:-1])
        assert_parity(f"SigLIP | timm attn_pool probe attention | {label}", ours.embedding, expected,
                      [ours.pool_attention], [probe])


@pytest.mark.parametrize("include", [None, True])
def test_timm_map_probe_skips_the_registers_unless_pool_include_prefix(tmp_path, include):
    """timm's VisionTransformer slices the prefix tokens off before its probe (``pool_include_prefix=False``, the
    default of vit_so150m_patch16_reg4_map_256); ours masks them (``pool_prefix``), so both read the patches alone."""
    options = {} if include is None else dict(pool_include_prefix=include)
    torch.manual_seed(0)
    model = randomize(timm.create_model("vit_so150m_patch16_reg4_map_256", pretrained=False, img_size=32, patch_size=8,
                                        embed_dim=32, depth=2, num_heads=2, num_classes=5, **options)).eval()
    timm.models.save_for_hf(model, tmp_path / "timm", model_args=dict(num_heads=2, img_size=32, **options),
                            safe_serialization=True)
    checkpoint = open_source(tmp_path / "timm")
    assert checkpoint.config.num_register_tokens == 4 and checkpoint.config.pool_prefix is bool(include)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ours = checkpoint.model.encode(images, output_attentions=True)
        torch.testing.assert_close(ours.logits, model(images), rtol=0, atol=1e-5)
    registers = float(ours.pool_attention[..., :4].sum())
    assert registers > 1e-3 if include else registers == 0.0


# timm's SigLIP 2 ports: their model functions fix act_layer='gelu_tanh' inside themselves, so neither config.json
# nor model_args names it (issue 33, item 2).
SIGLIP2_TIMM_NAMES = [
    "vit_base_patch32_siglip_256", "vit_base_patch32_siglip_gap_256",
    "vit_large_patch16_siglip_512", "vit_large_patch16_siglip_gap_512",
    "vit_so400m_patch16_siglip_256", "vit_so400m_patch16_siglip_384", "vit_so400m_patch16_siglip_512",
    "vit_so400m_patch16_siglip_gap_256", "vit_so400m_patch16_siglip_gap_384", "vit_so400m_patch16_siglip_gap_512",
    "vit_giantopt_patch16_siglip_256", "vit_giantopt_patch16_siglip_384",
    "vit_giantopt_patch16_siglip_gap_256", "vit_giantopt_patch16_siglip_gap_384",
]


@pytest.mark.parametrize("name", SIGLIP2_TIMM_NAMES)
def test_timm_siglip2_port_opens_with_the_activation_its_model_function_fixes(tmp_path, name):
    sizes = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=1.5)
    torch.manual_seed(0)
    model = randomize(timm.create_model(name, pretrained=False, num_classes=0, **sizes)).eval()
    timm.models.save_for_hf(model, tmp_path / "timm", model_args=sizes, safe_serialization=True)
    checkpoint = open_source(tmp_path / "timm")
    assert checkpoint.config.activation == "gelu_tanh"
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(images)
        ours = checkpoint.model.encode(images).embedding
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)


def test_timm_architecture_the_registry_does_not_know_is_refused_in_one_line(tmp_path):
    config = save_timm(timm_random(TIMM_SIGLIP, num_classes=0), tmp_path / "timm") / "config.json"
    config.write_text(config.read_text().replace("vit_base_patch16_siglip_224", "vit_base_patch16_siglip3_224"))
    with pytest.raises(SourceError, match="timm does not know the architecture 'vit_base_patch16_siglip3_224'") as e:
        open_source(tmp_path / "timm")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("with_processor", [True, False])
def test_an_hf_siglip_whose_side_is_no_whole_number_of_patches_is_transformers_on_the_pixels_it_reads(
        tmp_path, with_processor):
    """google/siglip-so400m-patch14-384's kind (384 px in 14-px patches, 27 x 27 over 378 px; LLaVA-OneVision's
    tower) was refused: "image_size must be divisible by patch_size". transformers' patch convolution (stride =
    kernel, no padding) never reads the pixels past the last whole patch. Here 36 px in 8-px patches: the processor's
    36 x 36 input, cropped at its top left to 32 x 32, is what we feed, and the embedding and every layer's attention
    are transformers' own on its whole 36 x 36 input; with or without the processor's file."""
    import numpy as np
    from PIL import Image

    import vit
    from vit.core.inference import preprocess

    model = hf_random(transformers.SiglipVisionModel, transformers.SiglipVisionConfig(**{**HF_VISION,
                                                                                          "image_size": 36}))
    model.save_pretrained(tmp_path / "siglip")
    processor = transformers.SiglipImageProcessor(size={"height": 36, "width": 36})  # its defaults otherwise
    if with_processor:
        processor.save_pretrained(tmp_path / "siglip")
    checkpoint = vit.load(tmp_path / "siglip", device="cpu")
    assert checkpoint.road == "port" and checkpoint.config.image_size == 32 and checkpoint.model.patch_grid(32, 32) \
        == (4, 4)
    photo = Image.fromarray(np.random.default_rng(5).integers(0, 256, (30, 50, 3), dtype=np.uint8))
    theirs = processor(photo, return_tensors="pt").pixel_values  # (1, 3, 36, 36)
    x = preprocess([photo], checkpoint.preprocessing)
    assert x.shape == (1, 3, 32, 32)
    torch.testing.assert_close(x, theirs[..., :32, :32], atol=1e-5, rtol=0)  # the top left the patches read
    with torch.no_grad():
        out = model(pixel_values=theirs, output_attentions=True)
        ours = checkpoint.model.encode(x, output_attentions=True)
    assert_parity("SigLIP | HF 36 px in 8-px patches", ours.embedding, out.pooler_output, ours.attentions,
                  out.attentions)
    # the map lies over the photo's pixels the patches read: the top left 32/36 of it each way, not the whole photo
    box = vit.explain(checkpoint, photo, "attention").input_box
    assert box == pytest.approx((0.0, 0.0, 50 * 32 / 36, 30 * 32 / 36))
