"""Our ViT against HF transformers' ViTForImageClassification with the same weights: logits and attentions."""

import pytest
import torch

from vit.model import ViT, ViTConfig
from vit.sources.ports.families.hf import config_from_hf, hf_config_kwargs, state_dict_from_hf

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers' ViT takes seconds

# transformers 4 names (also those of the checkpoints on the Hub) for the 5 names that differ.
V4_NAMES = {"vit.layers.": "vit.encoder.layer.", "attention.q_proj": "attention.attention.query",
            "attention.k_proj": "attention.attention.key", "attention.v_proj": "attention.attention.value",
            "attention.o_proj": "attention.output.dense", "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}

HF_KWARGS = dict(image_size=32, patch_size=4, num_channels=3, hidden_size=48, num_hidden_layers=3,
                 num_attention_heads=4, intermediate_size=96, num_labels=10, qkv_bias=True, hidden_act="gelu",
                 layer_norm_eps=1e-12)


def hf_model(**overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.ViTConfig(**{**HF_KWARGS, **overrides})
    config._attn_implementation = "eager"  # the path that returns attention probabilities
    model = transformers.ViTForImageClassification(config).eval()
    with torch.no_grad():  # HF zero-initialises biases and norms; random ones test the mapping better
        for name, p in model.named_parameters():
            if name.endswith("bias") or "layernorm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def ours_from(hf: torch.nn.Module) -> ViT:
    model = ViT(config_from_hf(hf.config))
    model.load_state_dict(state_dict_from_hf(hf.state_dict(), model.config.num_layers), strict=True)
    return model.eval()


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, ViT]:
    hf = hf_model()
    return hf, ours_from(hf)


def test_converted_config_is_ours_with_hf_eps():
    assert config_from_hf(transformers.ViTConfig(**HF_KWARGS)) == ViTConfig(
        image_size=32, patch_size=4, num_channels=3, num_classes=10, hidden_size=48, num_layers=3, num_heads=4,
        mlp_size=96, qkv_bias=True, layer_norm_eps=1e-12)


def test_config_round_trips_through_hf_kwargs():
    ours = ViTConfig.from_preset("tintn-cifar10", layer_norm_eps=1e-12)
    assert config_from_hf(transformers.ViTConfig(**hf_config_kwargs(ours))) == ours


def test_logits_and_every_layers_attention_match_hf(pair):
    hf, ours = pair
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        expected = hf(pixel_values=images, output_attentions=True)
        logits, attentions = ours(images, output_attentions=True)
        fused_logits, _ = ours(images)
    assert len(expected.attentions) == len(attentions) == 3
    torch.testing.assert_close(logits, expected.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(fused_logits, expected.logits, rtol=0, atol=1e-5)
    for theirs, mine in zip(expected.attentions, attentions, strict=True):
        assert mine.shape == theirs.shape == (3, 4, 65, 65)
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)


def test_interpolated_positions_match_hf_on_a_non_square_input(pair):
    hf, ours = pair
    images = torch.randn(2, 3, 48, 32)  # height 48, width 32: a 12x8 grid from an 8x8 table
    with torch.no_grad():
        expected = hf(pixel_values=images, output_attentions=True, interpolate_pos_encoding=True)
        logits, attentions = ours(images, output_attentions=True)
    torch.testing.assert_close(logits, expected.logits, rtol=0, atol=1e-5)
    for theirs, mine in zip(expected.attentions, attentions, strict=True):
        assert mine.shape == theirs.shape == (2, 4, 97, 97)
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)


def test_hf_model_without_qkv_bias_converts_and_matches():
    hf = hf_model(qkv_bias=False)
    ours = ours_from(hf)
    assert ours.blocks[0].attn.qkv.bias is None
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(images)[0], hf(pixel_values=images).logits, rtol=0, atol=1e-5)


def test_transformers_4_key_names_convert_to_the_same_weights(pair):
    hf, _ = pair
    state = hf.state_dict()
    if any(k.startswith("vit.encoder.layer.") for k in state):
        pytest.skip("the installed transformers already uses the version-4 names")

    def v4(key: str) -> str:
        for new, old in V4_NAMES.items():
            key = key.replace(new, old)
        return key

    old_state = {v4(k): v for k, v in state.items()}
    assert "vit.encoder.layer.0.attention.attention.query.weight" in old_state
    converted, expected = state_dict_from_hf(old_state, 3), state_dict_from_hf(state, 3)
    assert converted.keys() == expected.keys()
    assert all(torch.equal(converted[k], expected[k]) for k in expected)


def test_conversion_refuses_unknown_or_missing_keys(pair):
    hf, _ = pair
    state = dict(hf.state_dict())
    with pytest.raises(ValueError, match="no place for: vit.pooler.dense.weight"):
        state_dict_from_hf({**state, "vit.pooler.dense.weight": torch.zeros(1)}, 3)
    del state["classifier.bias"]
    with pytest.raises(ValueError, match="lacks 'classifier.bias'"):
        state_dict_from_hf(state, 3)


def test_config_conversion_refuses_what_our_model_cannot_express():
    with pytest.raises(ValueError, match="only has exact GELU"):
        config_from_hf(transformers.ViTConfig(**{**HF_KWARGS, "hidden_act": "relu"}))
    with pytest.raises(ValueError, match="not square"):
        config_from_hf(transformers.ViTConfig(**{**HF_KWARGS, "image_size": [32, 48]}))
