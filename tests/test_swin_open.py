"""Swin opened the other ways users open models: by Hub id (the local Hub, then the HF cache), by timm name through
the Hub, as our own ``.pt`` saved and loaded back; Swin V2 with nonzero pretrained windows (its position MLP reads
offsets scaled by them, as HF does), and a non-square input. Each against the library's own numbers."""

import pytest
import torch
from parity_helpers import assert_parity, capture_inputs, randomize
from test_swin_parity import hf_attentions

from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing transformers and timm takes seconds

TINY = dict(patch_size=4, embed_dim=24, depths=[2, 2], num_heads=[2, 4], window_size=4, num_labels=3)


def hf_swinv2(image_size, **extra):
    config = transformers.Swinv2Config(image_size=image_size, **{**TINY, **extra})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return randomize(transformers.Swinv2ForImageClassification(config))


def test_hf_swinv2_with_pretrained_windows_opens_by_hub_id_then_from_the_cache(tmp_path, fake_hub):
    model = hf_swinv2(32, pretrained_window_sizes=[2, 3])  # offsets scaled by 2 - 1 and 3 - 1, not by the window
    model.save_pretrained(tmp_path / "swinv2")
    fake_hub.add_folder("acme/swinv2-tiny", tmp_path / "swinv2")
    images = torch.randn(2, 3, 32, 32)
    out, attentions = hf_attentions(model, images)
    for _ in range(2):  # downloaded, then read from the HF cache
        checkpoint = open_source("acme/swinv2-tiny")
        assert checkpoint.model.config.pretrained_windows == (2, 3)
        with torch.no_grad():
            ours = checkpoint.model.encode(images, output_attentions=True)
        assert_parity("swinv2 | HF Hub id | pretrained windows", ours.logits, out.logits, ours.attentions,
                      attentions)
    assert fake_hub.fetched("GET").count("model.safetensors") == 1


def test_timm_swin_opens_by_its_timm_name_from_the_hub(tmp_path, fake_hub):
    name = "swin_tiny_patch4_window7_224"
    timm.layers.set_fused_attn(False)
    try:
        torch.manual_seed(0)
        model = randomize(timm.create_model(name, pretrained=False, img_size=32, embed_dim=24, depths=(2, 2),
                                            num_heads=(2, 4), window_size=4, num_classes=3))
    finally:
        timm.layers.set_fused_attn(True)
    timm.models.save_for_hf(model, tmp_path / "swin", model_args=dict(img_size=32, window_size=4),
                            safe_serialization=True)
    fake_hub.add_folder(f"timm/{name}.ms_in1k", tmp_path / "swin")
    images = torch.randn(1, 3, 32, 32)
    blocks = [b for layer in model.layers for b in layer.blocks]
    logits, attentions = capture_inputs([b.attn.attn_drop for b in blocks], lambda: model(images))
    with torch.no_grad():
        ours = open_source(f"{name}.ms_in1k").model.encode(images, output_attentions=True)
    assert_parity("swin | timm name via the Hub", ours.logits, logits, ours.attentions, attentions)


def test_an_opened_swinv2_saved_as_our_checkpoint_loads_back_to_the_same_numbers(tmp_path):
    from vit.checkpoint import load_checkpoint, save_checkpoint

    hf_swinv2(32, pretrained_window_sizes=[2, 3]).save_pretrained(tmp_path / "swinv2")
    opened = open_source(tmp_path / "swinv2")
    save_checkpoint(tmp_path / "swinv2.pt", opened.model, opened.class_names, opened.preprocessing)
    loaded = load_checkpoint(tmp_path / "swinv2.pt")
    assert loaded.config == opened.config and loaded.config.stage_depths == (2, 2)
    images = torch.randn(1, 3, 40, 40)  # a padded grid: the stages rebuilt from the saved config
    with torch.no_grad():
        a, b = opened.model.encode(images, output_attentions=True), loaded.model.encode(images, output_attentions=True)
    torch.testing.assert_close(b.logits, a.logits, rtol=0, atol=0)
    for x, y in zip(a.attentions, b.attentions, strict=True):
        torch.testing.assert_close(y, x, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["swin", "swinv2"])
def test_a_non_square_input_matches_hf_built_at_that_size(tmp_path, kind):
    size = (32, 48)  # an 8x12 grid in windows of 4 (shifted), then 4x6: padded to 8x8 and shifted
    config_class, model_class = ((transformers.SwinConfig, transformers.SwinForImageClassification) if kind == "swin"
                                 else (transformers.Swinv2Config, transformers.Swinv2ForImageClassification))
    config = config_class(image_size=size, **TINY)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(model_class(config))
    model.save_pretrained(tmp_path / kind)
    checkpoint = open_source(tmp_path / kind)
    images = torch.randn(1, 3, *size)
    out, attentions = hf_attentions(model, images)
    with torch.no_grad():
        ours = checkpoint.model.encode(images, output_attentions=True)
    assert [lay.grid for lay in checkpoint.model.layer_layouts((8, 12))] == [(8, 12)] * 2 + [(4, 6)] * 2
    assert_parity(f"{kind} | HF | 32x48 px", ours.logits, out.logits, ours.attentions, attentions)


def test_predict_save_maps_writes_the_logits_and_each_layers_windows_as_hf_gives_them(tmp_path):
    import numpy as np
    from PIL import Image

    from vit import predict
    from vit.core.inference import preprocess

    model = hf_swinv2(40)  # a 10x10 grid: padded windows, shifted
    model.save_pretrained(tmp_path / "swinv2")
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8))
    image.save(tmp_path / "photo.png")
    assert predict.main([str(tmp_path / "swinv2"), str(tmp_path / "photo.png"), "--save-maps",
                         str(tmp_path / "maps")]) == 0
    out, attentions = hf_attentions(model, preprocess([image], open_source(tmp_path / "swinv2").preprocessing))
    saved = np.load(tmp_path / "maps" / "photo.npz")
    np.testing.assert_allclose(saved["logits"], out.logits[0].numpy(), atol=1e-5)
    for i, attn in enumerate(attentions):
        np.testing.assert_allclose(saved[f"layer_{i}"], attn.numpy(), atol=1e-5)
    assert saved["layer_3_grid"].tolist() == [5, 5] and int(saved["layer_1_shift"]) == 2
    assert (tmp_path / "maps" / "photo_rollout.png").is_file()
