"""Imported models match their own library: logits and every layer's attention to 1e-5.

Each reference is a tiny randomly initialised model built by the library itself (transformers,
timm, torchvision), saved in its native format and opened through ``vit.sources.open.open_source``.
Random biases, norms, layer scales and tokens make a wrong mapping visible.
"""

import json

import pytest
import torch
from parity_helpers import ATOL, hf_random, randomize
from safetensors.torch import save_file

from vit.model import ViT
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
torchvision = pytest.importorskip("torchvision")
pytestmark = pytest.mark.slow  # importing transformers and timm takes seconds

def assert_same(ours: tuple, logits: torch.Tensor | None, attentions: list[torch.Tensor]) -> None:
    our_logits, our_attentions = ours
    if logits is None:
        assert our_logits is None
    else:
        torch.testing.assert_close(our_logits, logits, rtol=0, atol=ATOL)
    assert len(our_attentions) == len(attentions)
    for mine, theirs in zip(our_attentions, attentions, strict=True):
        assert mine.shape == theirs.shape
        torch.testing.assert_close(mine, theirs, rtol=0, atol=ATOL)


# -- Hugging Face ---------------------------------------------------------------------------------------------------

HF_CASES = {
    "ViTForImageClassification": ("ViTConfig", dict(intermediate_size=40), True),
    "ViTModel": ("ViTConfig", dict(intermediate_size=40), True),
    "DeiTForImageClassification": ("DeiTConfig", dict(intermediate_size=40), True),
    "DeiTForImageClassificationWithTeacher": ("DeiTConfig", dict(intermediate_size=40), True),
    "Dinov2Model": ("Dinov2Config", dict(mlp_ratio=3), False),
    "Dinov2ForImageClassification": ("Dinov2Config", dict(mlp_ratio=3), False),
    "Dinov2WithRegistersModel": ("Dinov2WithRegistersConfig", dict(mlp_ratio=3, num_register_tokens=3), False),
    "Dinov2WithRegistersForImageClassification": ("Dinov2WithRegistersConfig",
                                                  dict(mlp_ratio=3, num_register_tokens=3), False),
}


def hf_folder(tmp_path, architecture: str, **overrides):
    config_class, extra, _ = HF_CASES[architecture]
    config = getattr(transformers, config_class)(
        image_size=32, patch_size=8, num_channels=3, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        num_labels=5, **{**extra, **overrides})
    model = hf_random(getattr(transformers, architecture), config)
    folder = tmp_path / architecture
    model.save_pretrained(folder)
    return model, folder


@pytest.mark.parametrize("architecture", list(HF_CASES))
def test_hf_model_matches_transformers_at_native_and_other_size(tmp_path, architecture):
    hf, folder = hf_folder(tmp_path, architecture)
    ours = open_source(folder).model
    flag = {"interpolate_pos_encoding": True} if HF_CASES[architecture][2] else {}  # DINOv2 always interpolates
    for size in ((32, 32), (48, 40)):
        images = torch.randn(2, 3, *size)
        with torch.no_grad():
            expected = hf(pixel_values=images, output_attentions=True, **(flag if size != (32, 32) else {}))
            mine = ours(images, output_attentions=True)
        logits = getattr(expected, "logits", None)
        assert_same(mine, logits, list(expected.attentions))


def test_hf_model_without_qkv_bias_matches(tmp_path):
    hf, folder = hf_folder(tmp_path, "ViTForImageClassification", qkv_bias=False)
    ours = open_source(folder).model
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = hf(pixel_values=images, output_attentions=True)
        assert_same(ours(images, output_attentions=True), expected.logits, list(expected.attentions))


def test_hf_folder_gives_class_names_from_id2label_and_preprocessing_from_the_processor(tmp_path):
    _, folder = hf_folder(tmp_path, "DeiTForImageClassification",
                          id2label={i: f"kind {i}" for i in range(5)}, label2id={f"kind {i}": i for i in range(5)})
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "do_resize": True, "size": {"height": 40, "width": 40}, "resample": 3, "do_center_crop": True,
        "crop_size": {"height": 32, "width": 32}, "image_mean": [0.4, 0.5, 0.6], "image_std": [0.2, 0.3, 0.4]}))
    checkpoint = open_source(folder)
    assert checkpoint.class_names == [f"kind {i}" for i in range(5)]
    p = checkpoint.preprocessing
    assert (p.image_size, p.resize_size, p.resize_mode, p.resample) == (32, 40, "square", "bicubic")
    assert p.mean == (0.4, 0.5, 0.6) and p.std == (0.2, 0.3, 0.4)
    assert checkpoint.model.num_prefix_tokens == 2 and checkpoint.config.prefix_token_names == ("CLS", "DIST")


# -- timm -----------------------------------------------------------------------------------------------------------

TIMM_CASES = {
    "vit-reg-tokens": ("vit_base_patch16_224", dict(reg_tokens=2)),
    "vit-no-embed-class-layer-scale-avg-fc-norm": ("vit_base_patch16_224", dict(
        reg_tokens=1, no_embed_class=True, init_values=0.1, global_pool="avg", fc_norm=True)),
    "vit-no-qkv-bias": ("vit_base_patch16_224", dict(qkv_bias=False)),
    "deit-distilled": ("deit_tiny_distilled_patch16_224", {}),
    "dinov2": ("vit_small_patch14_dinov2", dict(num_classes=5)),
    "dinov2-reg4": ("vit_small_patch14_reg4_dinov2", {}),
}


def timm_model(name: str, patch: int, dynamic: bool = False, **kwargs):
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, img_size=2 * 2 * patch, patch_size=patch, depth=2,
                              dynamic_img_size=dynamic, **{"num_classes": 5, "embed_dim": 16, "num_heads": 2, **kwargs})
    for block in model.blocks:
        block.attn.fused_attn = False  # the explicit softmax, whose probabilities the hook reads
    return model


def timm_attentions(model, images):
    """Every block's post-softmax attention, read where timm applies attention dropout."""
    captured = []
    hooks = [block.attn.attn_drop.register_forward_hook(lambda m, i, o: captured.append(i[0]))
             for block in model.blocks]
    try:
        with torch.no_grad():
            logits = model(images)
    finally:
        for hook in hooks:
            hook.remove()
    return logits, captured


@pytest.mark.parametrize("case", list(TIMM_CASES))
def test_timm_model_matches_timm_at_native_and_other_size(tmp_path, case):
    name, kwargs = TIMM_CASES[case]
    patch = 7 if "patch14" in name else 8
    model = randomize(timm_model(name, patch, **kwargs))
    dynamic = timm_model(name, patch, dynamic=True, **kwargs).eval()
    dynamic.load_state_dict(model.state_dict())
    folder = tmp_path / case
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({
        "architecture": name, "num_classes": model.num_classes,
        "model_args": {"num_heads": 2, "img_size": 4 * patch, **kwargs}, "pretrained_cfg": dict(model.pretrained_cfg)},
        default=list))
    ours = open_source(folder).model
    side = 4 * patch
    for reference, size in ((model, (side, side)), (dynamic, (side + 2 * patch, side - patch))):
        images = torch.randn(2, 3, *size)
        logits, attentions = timm_attentions(reference, images)
        with torch.no_grad():
            mine = ours(images, output_attentions=True)
        assert_same(mine, logits if model.num_classes else None, attentions)


def test_timm_state_dict_file_opens_with_the_name_given(tmp_path):
    # No config.json: the heads come from timm's convention for the width (deit_tiny: 192 wide, 3 heads).
    model = randomize(timm_model("deit_tiny_distilled_patch16_224", 8, embed_dim=192, num_heads=3))
    torch.save(model.state_dict(), tmp_path / "deit.pth")
    checkpoint = open_source(tmp_path / "deit.pth", arch="timm:deit_tiny_distilled_patch16_224")
    assert checkpoint.metadata["architecture"] == "timm:deit_tiny_distilled_patch16_224"
    images = torch.randn(1, 3, 32, 32)
    logits, attentions = timm_attentions(model, images)
    with torch.no_grad():
        assert_same(checkpoint.model(images, output_attentions=True), logits, attentions)


# -- torchvision ----------------------------------------------------------------------------------------------------

def torchvision_attentions(model, images):
    """Each encoder layer's attention, by re-running its MultiheadAttention on its own input with weights asked for."""
    inputs = []
    hooks = [layer.ln_1.register_forward_hook(lambda m, i, o: inputs.append(o)) for layer in model.encoder.layers]
    try:
        with torch.no_grad():
            logits = model(images)
            attentions = [layer.self_attention(x, x, x, need_weights=True, average_attn_weights=False)[1]
                          for layer, x in zip(model.encoder.layers, inputs, strict=True)]
    finally:
        for hook in hooks:
            hook.remove()
    return logits, attentions


def test_torchvision_vision_transformer_matches_torchvision():
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = randomize(VisionTransformer(image_size=48, patch_size=16, num_layers=2, num_heads=2, hidden_dim=16,
                                        mlp_dim=40, num_classes=5))
    # A tiny model is none of the named architectures; its mapping is the one vit_b_16 uses.
    import vit.sources.ports.libraries.import_torchvision as tv

    config = tv.config_from_torchvision("vit_b_16", model.state_dict())
    config = type(config)(**{**config.to_dict(), "hidden_size": 16, "num_layers": 2, "num_heads": 2, "mlp_size": 40})
    ours = ViT(config)
    ours.load_state_dict(tv.state_dict_from_torchvision(model.state_dict()), strict=True)
    images = torch.randn(2, 3, 48, 48)
    logits, attentions = torchvision_attentions(model, images)
    with torch.no_grad():
        assert_same(ours.eval()(images, output_attentions=True), logits, attentions)


@pytest.mark.parametrize("name", ["vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14"])
def test_named_torchvision_architectures_map_key_for_key_and_shape_for_shape(name):
    import vit.sources.ports.libraries.import_torchvision as tv

    with torch.device("meta"):
        reference = getattr(torchvision.models, name)()
        state = reference.state_dict()
        assert tv.architecture_of(state) == name
        ours = ViT(tv.config_from_torchvision(name, state))
    mapped = tv.state_dict_from_torchvision(state)
    assert {k: tuple(v.shape) for k, v in mapped.items()} == {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    # The head count is in no weight's shape: compare it with the module torchvision builds.
    assert ours.config.num_heads == reference.encoder.layers[0].self_attention.num_heads


def test_torchvision_file_is_recognised_and_named_with_imagenet_classes(tmp_path):
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in torchvision.models.vit_b_32().state_dict().items()}
    state = {k: torch.zeros(s) for k, s in shapes.items()}  # 88 M zeros: real weights are not needed here
    save_file(state, tmp_path / "vit_b_32.safetensors")
    checkpoint = open_source(tmp_path / "vit_b_32.safetensors")
    assert checkpoint.metadata["architecture"] == "torchvision:vit_b_32"
    assert checkpoint.class_names[0] == "tench" and len(checkpoint.class_names) == 1000
    p = checkpoint.preprocessing
    assert (p.image_size, p.resize_size, p.resize_mode, p.resample) == (224, 256, "shortest_edge", "bilinear")


@pytest.mark.parametrize("architecture", ["DeiTForImageClassificationWithTeacher", "Dinov2WithRegistersModel"])
def test_in_memory_and_saved_hf_key_names_map_to_the_same_weights(tmp_path, architecture):
    from safetensors.torch import load_file

    from vit.sources.ports.families.hf import state_dict_from_hf

    hf, folder = hf_folder(tmp_path, architecture)
    saved = state_dict_from_hf(load_file(folder / "model.safetensors"), 2, architecture)  # the Hub's layout
    in_memory = state_dict_from_hf(hf.state_dict(), 2, architecture)  # transformers 5's module names
    assert saved.keys() == in_memory.keys()
    assert all(torch.equal(saved[k], in_memory[k]) for k in saved)
