"""DINOv3 opened from its three layouts matches its own library: the pooled output and every layer's attention
to 1e-5, at the native size and at a non-square one (DINOv3's RoPE takes any H x W).

- HF: a tiny random ``DINOv3ViTModel`` (eager attention), saved with ``save_pretrained``.
- timm: a tiny random ``vit_small_patch16_dinov3_qkvb`` (fused attention off), saved with timm's ``save_for_hf``.
- The original facebookresearch/dinov3 layout: built by reversing timm's ``eva.checkpoint_filter_fn`` key map
  on that timm model (the test checks the filter maps it back key for key), saved as a ``.pth``.
"""

import pytest
import torch
from parity_helpers import assert_parity, assert_timm_parity, hf_random, save_timm, timm_random

from vit.sources.open import SourceError, open_source

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing transformers and timm takes seconds

SIZES = {"native": (32, 32), "48x24": (48, 24)}


def hf_dinov3(folder, **overrides):
    config = transformers.DINOv3ViTConfig(**{**dict(
        image_size=32, patch_size=8, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
        num_register_tokens=4, layerscale_value=0.5), **overrides})
    model = hf_random(transformers.DINOv3ViTModel, config)
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("overrides", [{}, dict(use_gated_mlp=True, hidden_act="silu", key_bias=True, mlp_bias=False)],
                         ids=["mlp", "swiglu"])
def test_hf_dinov3_matches_transformers(tmp_path, overrides):
    reference = hf_dinov3(tmp_path / "dinov3", **overrides)
    checkpoint = open_source(tmp_path / "dinov3")
    assert checkpoint.model.config.prefix_token_names == ("CLS", "REG 1", "REG 2", "REG 3", "REG 4")
    for label, size in SIZES.items():
        images = torch.randn(2, 3, *size)
        with torch.no_grad():
            expected = reference(pixel_values=images, output_attentions=True)
            ours = checkpoint.model.encode(images, output_attentions=True)
        assert_parity(f"DINOv3 | HF DINOv3ViTModel{' SwiGLU' if overrides else ''} | {label}", ours.embedding,
                      expected.pooler_output, ours.attentions, expected.attentions)


def timm_dinov3(**kwargs):
    return timm_random("vit_small_patch16_dinov3_qkvb", dynamic=True, **kwargs)  # as timm's model function sets it


@pytest.mark.parametrize("pool", ["avg", "token"])
def test_timm_dinov3_matches_timm(tmp_path, pool):
    model = timm_dinov3(global_pool=pool)
    checkpoint = open_source(save_timm(model, tmp_path / "timm", global_pool=pool))
    assert checkpoint.config.pooling == ("cls" if pool == "token" else "avg") and not checkpoint.config.key_bias
    assert_timm_parity(f"DINOv3 | timm vit_*_dinov3_qkvb global_pool={pool}", checkpoint,
                       [(label, model, size) for label, size in SIZES.items()])


def original_from_timm(state: dict, head_dim: int) -> dict:
    """timm's eva.checkpoint_filter_fn for DINOv3, run backwards: gamma_1 -> ls1.gamma, reg_token ->
    storage_tokens, q_bias/v_bias -> qkv.bias with a zero key third and its bias_mask, plus the pieces timm drops
    (mask_token, rope_embed.periods, the 7B's local_cls_norm)."""
    out = {}
    for key, value in state.items():
        if key.endswith("attn.q_bias"):
            v_bias = state[key.replace("q_bias", "v_bias")]
            out[key.replace("q_bias", "qkv.bias")] = torch.cat([value, torch.zeros_like(value), v_bias])
            out[key.replace("q_bias", "qkv.bias_mask")] = torch.cat(
                [torch.ones_like(value), torch.zeros_like(value), torch.ones_like(value)])
            continue
        if key.endswith("attn.v_bias"):
            continue
        key = key.replace("gamma_1", "ls1.gamma").replace("gamma_2", "ls2.gamma").replace("reg_token", "storage_tokens")
        out[key] = value
    out["mask_token"] = torch.zeros(1, state["cls_token"].shape[-1])
    width = state["cls_token"].shape[-1]
    out["local_cls_norm.weight"], out["local_cls_norm.bias"] = torch.ones(width), torch.zeros(width)  # 7B pre-training
    out["rope_embed.periods"] = 100.0 ** (2 * torch.arange(head_dim // 4, dtype=torch.float32) / (head_dim // 2))
    return out


def test_original_dinov3_layout_matches_timm_with_cls_pooling(tmp_path):
    model = timm_dinov3(global_pool="token")
    original = original_from_timm(model.state_dict(), head_dim=16)
    back = timm.models.eva.checkpoint_filter_fn(dict(original), model)
    assert back.keys() == model.state_dict().keys()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(back[key], value, rtol=0, atol=0)
    torch.save({"model": original}, tmp_path / "dinov3_vits16_pretrain.pth")
    checkpoint = open_source(tmp_path / "dinov3_vits16_pretrain.pth")
    assert checkpoint.metadata["architecture"] == "dinov3:backbone"
    assert_timm_parity("DINOv3 | original facebookresearch .pth (timm filter reversed)", checkpoint,
                       [(label, model, size) for label, size in SIZES.items()])


def test_original_dinov3_with_a_wrong_arch_name_is_refused_in_one_line(tmp_path):
    model = timm_dinov3(global_pool="token")
    torch.save(original_from_timm(model.state_dict(), head_dim=16), tmp_path / "backbone.pth")
    with pytest.raises(SourceError, match="DINOv3 vitl16 has width 1024") as error:
        open_source(tmp_path / "backbone.pth", arch="dinov3:vitl16")
    assert "\n" not in str(error.value)
