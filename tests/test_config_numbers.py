"""Numbers a config file declares are finite and in range, each refused naming its field (issue 39, item 5c):
DINOv3's rope_theta of NaN or inf, its RoPE augmentation and layer scale of 1e308, MAE's mask_ratio of 2, -1 or NaN
were accepted silently (even fields the forward pass never reads: such a file is not the model it claims)."""

import math

import pytest

from vit.model import ViTConfig
from vit.sources.ports.families import hf, import_dinov3

DINOV3 = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=16,
              image_size=224, rope_theta=100.0, layerscale_value=1.0, pos_embed_rescale=2.0)
MAE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, patch_size=16,
           image_size=224, mask_ratio=0.75)


@pytest.mark.parametrize("field, value", [
    ("rope_theta", math.nan), ("rope_theta", math.inf), ("rope_theta", 0), ("layerscale_value", 1e308),
    ("layerscale_value", math.nan), ("pos_embed_shift", 1e308), ("pos_embed_jitter", math.nan),
    ("pos_embed_rescale", math.inf), ("pos_embed_rescale", -1.0),
])
def test_a_dinov3_config_with_a_non_finite_or_out_of_range_number_is_refused_naming_it(field, value):
    assert import_dinov3.config_from_hf(DINOV3).rope_theta == 100.0  # the valid config opens
    with pytest.raises(ValueError, match=field):
        import_dinov3.config_from_hf({**DINOV3, field: value})


@pytest.mark.parametrize("field", ["rope_shift_coords", "rope_jitter_coords", "rope_rescale_coords",
                                   "rope_temperature"])
def test_timms_dinov3_model_args_with_a_non_finite_number_are_refused_naming_it(field):
    with pytest.raises(ValueError, match=f"model_args.{field}"):
        import_dinov3.config_from_timm("vit_small_patch16_dinov3", {}, {field: math.nan})


@pytest.mark.parametrize("value", [2, -1, math.nan, 1.0])
def test_an_mae_config_with_a_mask_ratio_outside_0_to_1_is_refused(value):
    assert hf.config_from_hf(MAE, "ViTMAEModel").hidden_size == 32
    with pytest.raises(ValueError, match="mask_ratio"):
        hf.config_from_hf({**MAE, "mask_ratio": value}, "ViTMAEModel")


@pytest.mark.parametrize("field, value", [("rope_theta", math.nan), ("rope_theta", math.inf),
                                          ("layer_scale", 1e308), ("layer_scale", math.nan),
                                          ("layer_norm_eps", math.inf)])
def test_vit_config_refuses_non_finite_numbers_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"ViTConfig.{field}"):
        ViTConfig(**{field: value})
