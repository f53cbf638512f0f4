"""Every config field that changes the computation is honoured or refused, never silently ignored.

The walks read the reference libraries' own signatures and config classes, so a field a new
timm or transformers release adds fails here until it is classified. timm's ``model_args.act_layer``
was once ignored (a QuickGELU model opened with GELU, logits off by 6e-3): it is checked by parity.
"""

import inspect

import pytest
import torch
from parity_helpers import assert_parity, capture_inputs, randomize

from vit.sources.open import SourceError, open_source
from vit.sources.ports.families import hf, import_clip, import_dinov3, import_siglip
from vit.sources.ports.libraries import import_timm

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing transformers and timm takes seconds

SKIP = {"self", "device", "dtype", "kwargs"}


def other_value(default):
    """A value unlike the parameter's default."""
    if isinstance(default, bool):
        return not default
    if default is None:
        return "something"
    if isinstance(default, (int, float)):
        return default + 1
    return "something-else"


def tiny_vit_state() -> dict:
    model = timm.create_model("vit_base_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=32,
                              depth=1, num_heads=2, num_classes=0)
    return model.state_dict()


def test_every_timm_vision_transformer_argument_is_classified():
    params = set(inspect.signature(timm.models.vision_transformer.VisionTransformer.__init__).parameters) - SKIP
    known = import_timm.MODEL_ARGS_HONOURED | import_timm.MODEL_ARGS_INERT | set(import_timm.MODEL_ARGS_FIXED)
    assert params - known == set(), "timm arguments neither honoured nor refused"


def test_timm_arguments_we_cannot_express_are_refused_in_one_line():
    state = tiny_vit_state()
    params = inspect.signature(timm.models.vision_transformer.VisionTransformer.__init__).parameters
    for key, fixed in import_timm.MODEL_ARGS_FIXED.items():
        value = other_value(params[key].default if fixed is None else fixed)
        with pytest.raises(ValueError, match=f"model_args.{key}") as error:
            import_timm.config_from_timm("vit_base_patch16_224", state, {"num_heads": 2, key: value})
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="model_args.brand_new_option"):
        import_timm.config_from_timm("vit_base_patch16_224", state, {"num_heads": 2, "brand_new_option": 1})
    with pytest.raises(ValueError, match="act_layer='relu'"):
        import_timm.config_from_timm("vit_base_patch16_224", state, {"num_heads": 2, "act_layer": "relu"})


def test_every_timm_eva_argument_for_dinov3_is_classified():
    params = set(inspect.signature(timm.models.eva.Eva.__init__).parameters) - SKIP
    known = import_dinov3.TIMM_HONOURED | import_dinov3.TIMM_INERT | set(import_dinov3.TIMM_FIXED)
    unknown = params - known
    # Eva options DINOv3 never sets are refused by name (config_from_timm rejects any key it does not know).
    state = timm.create_model("vit_small_patch16_dinov3_qkvb", pretrained=False, img_size=32, patch_size=8,
                              embed_dim=32, depth=1, num_heads=2).state_dict()
    for key in sorted(unknown):
        with pytest.raises(ValueError, match=key):
            import_dinov3.config_from_timm("vit_small_patch16_dinov3_qkvb", state, {"num_heads": 2, key: "x"})


@pytest.mark.parametrize("config_class, module", [
    ("DINOv3ViTConfig", import_dinov3), ("CLIPVisionConfig", import_clip), ("SiglipVisionConfig", import_siglip),
    ("ViTConfig", hf), ("ViTMAEConfig", hf)])
def test_every_hf_config_field_is_classified(config_class, module):
    base = set(transformers.PretrainedConfig().to_dict())
    fields = set(getattr(transformers, config_class)().to_dict()) - base
    assert fields - module.HF_HONOURED - module.HF_INERT == set()


def timm_parity(tmp_path, name, model_args, row):
    timm.layers.set_fused_attn(False)
    try:
        torch.manual_seed(0)
        model = randomize(timm.create_model(name, pretrained=False, img_size=32, patch_size=8, embed_dim=32, depth=2,
                                            num_heads=2, num_classes=3, **model_args))
    finally:
        timm.layers.set_fused_attn(True)
    timm.models.save_for_hf(model, tmp_path / "timm", model_args=dict(num_heads=2, img_size=32, **model_args),
                            safe_serialization=True)
    checkpoint = open_source(tmp_path / "timm")
    images = torch.randn(2, 3, 32, 32)
    logits, attentions = capture_inputs([b.attn.attn_drop for b in model.blocks], lambda: model(images))
    with torch.no_grad():
        ours = checkpoint.model.encode(images, output_attentions=True)
    assert_parity(row, ours.logits, logits, ours.attentions, attentions)
    return checkpoint


def test_timm_model_args_act_layer_is_honoured(tmp_path):
    checkpoint = timm_parity(tmp_path, "vit_base_patch16_224", {"act_layer": "quick_gelu"},
                             "ViT | timm model_args.act_layer=quick_gelu | native")
    assert checkpoint.config.activation == "quick_gelu"


def test_timm_clip_quickgelu_tower_matches_timm(tmp_path):
    checkpoint = timm_parity(tmp_path, "vit_base_patch16_clip_quickgelu_224", {},
                             "CLIP | timm vit_*_clip_quickgelu_* | native")
    assert checkpoint.config.pre_norm and checkpoint.config.layer_norm_eps == 1e-5


def test_an_unknown_timm_model_arg_in_a_folder_is_refused_in_one_line(tmp_path):
    model = timm.create_model("vit_base_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=32,
                              depth=1, num_heads=2, num_classes=3)
    timm.models.save_for_hf(model, tmp_path / "timm", model_args=dict(num_heads=2, qk_norm=True),
                            safe_serialization=True)
    with pytest.raises(SourceError, match="qk_norm") as error:
        open_source(tmp_path / "timm")
    assert "\n" not in str(error.value)


def test_every_timm_eva_argument_for_eva02_is_honoured_or_refused():
    from vit.sources.ports.families import import_eva

    params = set(inspect.signature(timm.models.eva.Eva.__init__).parameters) - SKIP
    state = timm.create_model("eva02_tiny_patch14_224", pretrained=False, img_size=32, patch_size=8, embed_dim=32,
                              depth=1, num_heads=2).state_dict()
    for key in sorted(params - import_eva.MODEL_ARGS_HONOURED - import_eva.MODEL_ARGS_INERT):
        with pytest.raises(ValueError, match=key):
            import_eva.config_from_timm("eva02_tiny_patch14_224", state, {"num_heads": 2, key: "x"})
