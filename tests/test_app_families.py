"""The explorer opens the 2025-26 families from the picker (the HF cache) and by path: a DINOv3 HF folder (its 4
storage tokens labelled), a SigLIP 2 fixed-resolution HF folder (the pooling probe's map first) and an open_clip
model (its folder in the cache; its weights file by path)."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from test_app import dirs, png_bytes, run_app, sidebar_widget, upload  # noqa: F401 (a fixture)

transformers = pytest.importorskip("transformers")
open_clip = pytest.importorskip("open_clip")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dirs")]  # the app's own empty world

DINOV3_OPTIONS = ["0 · CLS", "1 · REG 1", "2 · REG 2", "3 · REG 3", "4 · REG 4", "5 · patch row 1, col 1"]


def dinov3_folder(folder):
    config = transformers.DINOv3ViTConfig(image_size=16, patch_size=4, hidden_size=16, intermediate_size=16,
                                          num_hidden_layers=2, num_attention_heads=2, num_register_tokens=4)
    torch.manual_seed(0)
    transformers.DINOv3ViTModel(config).save_pretrained(folder)
    return folder


def siglip2_folder(folder):
    """SigLIP 2's fixed-resolution checkpoints are SiglipModel folders."""
    config = transformers.SiglipConfig(
        vision_config=dict(image_size=16, patch_size=4, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                           num_attention_heads=2),
        text_config=dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                         vocab_size=32, max_position_embeddings=8))
    torch.manual_seed(0)
    transformers.SiglipModel(config).save_pretrained(folder)
    return folder


def siglip2_naflex_folder(folder):
    """SigLIP 2 NaFlex: a Siglip2Model whose processor fits each image's own aspect into 16 patches of 4 px."""
    config = transformers.Siglip2Config(
        vision_config=dict(num_patches=16, patch_size=4, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                           num_attention_heads=2),
        text_config=dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                         vocab_size=32, max_position_embeddings=8))
    torch.manual_seed(0)
    transformers.Siglip2Model(config).save_pretrained(folder)
    transformers.Siglip2ImageProcessorPil(patch_size=4, max_num_patches=16).save_pretrained(folder)
    return folder


def open_clip_folder(folder):
    model_cfg = dict(embed_dim=8, vision_cfg=dict(image_size=16, patch_size=4, width=16, layers=2, head_width=8),
                     text_cfg=dict(context_length=8, vocab_size=32, width=16, heads=2, layers=1), quick_gelu=True)
    torch.manual_seed(0)
    model = open_clip.model.CLIP(**model_cfg)
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "open_clip_model.safetensors")
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": model_cfg, "preprocess_cfg": {
        "mean": list(open_clip.OPENAI_DATASET_MEAN), "std": list(open_clip.OPENAI_DATASET_STD)}}))
    return folder


def in_hf_cache(tmp_path, hub_name: str, make):
    model_dir = tmp_path / "hf-cache" / f"models--{hub_name.replace('/', '--')}"  # dirs: HF_HUB_CACHE is here
    snapshot = make(model_dir / "snapshots" / "rev1")
    (model_dir / "refs").mkdir()
    (model_dir / "refs" / "main").write_text("rev1")
    return snapshot


def open_by_path(path):
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(path))
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    upload(at, "photo.png", png_bytes(40, 30))
    assert not at.exception, [e.message for e in at.exception]
    return at


def open_from_picker(label: str, snapshot):
    at = run_app()
    picker = sidebar_widget(at, "selectbox", "Checkpoint")
    assert any(option.startswith(label) for option in picker.options), picker.options
    picker.set_value(str(snapshot))
    at.run()
    upload(at, "photo.png", png_bytes(40, 30))
    assert not at.exception, [e.message for e in at.exception]
    return at


def assert_dinov3_view(at):
    assert sidebar_widget(at, "selectbox", "Query token").options[:6] == DINOV3_OPTIONS
    assert any("no classifier" in info.value for info in at.main.info)
    assert [c.value for c in at.main.caption if "Colours span" in c.value]  # the overlay is drawn


def assert_siglip_view(at):
    kinds = sidebar_widget(at, "radio", "Map").options
    assert kinds[0].startswith("Pooling probe"), kinds
    assert any("no CLS token" in c.value for c in [*at.main.markdown, *at.main.caption])
    assert any("embedding" in info.value and "norm" in info.value for info in at.main.info)


def test_a_dinov3_folder_opens_by_path(tmp_path):
    assert_dinov3_view(open_by_path(dinov3_folder(tmp_path / "dinov3")))


def test_a_dinov3_model_of_the_hf_cache_opens_from_the_picker(tmp_path):
    snapshot = in_hf_cache(tmp_path, "facebook/dinov3-tiny", dinov3_folder)
    assert_dinov3_view(open_from_picker("facebook/dinov3-tiny · hf:DINOv3ViTModel", snapshot))


def test_a_siglip2_folder_opens_by_path_with_the_probe_map_first(tmp_path):
    assert_siglip_view(open_by_path(siglip2_folder(tmp_path / "siglip2")))


def test_a_siglip2_naflex_model_of_the_hf_cache_opens_from_the_picker_on_the_photos_own_grid(tmp_path):
    snapshot = in_hf_cache(tmp_path, "google/siglip2-naflex-tiny", siglip2_naflex_folder)
    at = open_from_picker("google/siglip2-naflex-tiny · hf:Siglip2Model", snapshot)
    assert_siglip_view(at)
    # the 40x30 photo keeps its aspect within 16 patches (HF's rule: 16x12 px, 3 x 4 patches; 4 x 4 would stretch it)
    assert any("sees it as 16×12 px in 3 rows × 4 columns" in c.value for c in at.main.caption)


def test_a_siglip2_model_of_the_hf_cache_opens_from_the_picker(tmp_path):
    snapshot = in_hf_cache(tmp_path, "google/siglip2-tiny", siglip2_folder)
    assert_siglip_view(open_from_picker("google/siglip2-tiny · hf:SiglipModel", snapshot))


def test_an_open_clip_weights_file_opens_by_path(tmp_path):
    folder = open_clip_folder(tmp_path / "clip")
    at = open_by_path(folder / "open_clip_model.safetensors")
    assert sidebar_widget(at, "selectbox", "Query token").options[0] == "0 · CLS"
    assert any("embedding (8 numbers)" in info.value for info in at.main.info)


def test_an_open_clip_model_of_the_hf_cache_opens_from_the_picker(tmp_path):
    snapshot = in_hf_cache(tmp_path, "laion/clip-tiny", open_clip_folder)
    at = open_from_picker("laion/clip-tiny", snapshot)
    assert any("embedding (8 numbers)" in info.value for info in at.main.info)


def test_a_cropping_dinov2_folder_draws_over_the_centre_the_model_saw(tmp_path):
    """HF DINOv2 resizes the short side to 256 and crops 224: on a 640x480 upload it sees x 109-529 only."""
    config = transformers.Dinov2Config(image_size=224, patch_size=56, hidden_size=8, intermediate_size=16,
                                       num_hidden_layers=1, num_attention_heads=2)
    folder = tmp_path / "dinov2"
    torch.manual_seed(0)
    transformers.Dinov2Model(config).save_pretrained(folder)
    transformers.BitImageProcessor(size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224},
                                   do_center_crop=True).save_pretrained(folder)
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(folder))
    at.run()
    upload(at, "photo.png", png_bytes(640, 480))
    assert not at.exception, [e.message for e in at.exception]
    [caption] = [c.value for c in at.main.caption if "Click a patch" in c.value]
    assert "sees only x 109–529, y 30–450 of the image" in caption and "stretched" not in caption


def test_a_model_change_opens_siglip_on_its_probe_map_and_keeps_a_choice_that_fits(tmp_path):
    """Issue 33, item 5: a session starts on a classifier's CLS attention; that default survived the switch, so a
    SigLIP showed its top-left patch's attention instead of the pooling probe's map. A map picked by hand (here
    rollout), which SigLIP also draws, stays."""
    from vit.checkpoint import save_checkpoint
    from vit.model import ViT, ViTConfig

    config = ViTConfig(image_size=16, patch_size=4, hidden_size=8, num_layers=1, num_heads=2, mlp_size=16,
                       num_classes=2)
    save_checkpoint(tmp_path / "vit.pt", ViT(config), ["cat", "dog"])
    siglip = siglip2_folder(tmp_path / "siglip2")
    for picked, expected in ((None, "probe"), ("rollout", "rollout")):
        at = open_by_path(tmp_path / "vit.pt")
        assert sidebar_widget(at, "radio", "Map").value == "attention"
        if picked:
            sidebar_widget(at, "radio", "Map").set_value(picked)
            at.run()
        sidebar_widget(at, "text_input", "Open a path").set_value(str(siglip))
        at.run()
        assert not at.exception, [e.message for e in at.exception]
        assert sidebar_widget(at, "radio", "Map").value == expected


def aimv2_folder(folder):
    """An HF AIMv2 tower with its attention-pooling head: no CLS, so the probe's map comes first."""
    config = transformers.Aimv2VisionConfig(image_size=16, patch_size=4, hidden_size=16, intermediate_size=16,
                                            num_hidden_layers=2, num_attention_heads=2)
    torch.manual_seed(0)
    transformers.Aimv2VisionModel(config).save_pretrained(folder)
    return folder


def pe_core_folder(folder):
    """timm's PE-core: 2 heads in its blocks, 8 in its probe."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("vit_pe_core_tiny_patch16_384", pretrained=False, img_size=16, patch_size=4,
                              embed_dim=16, depth=2, num_heads=2).eval()
    timm.models.save_for_hf(model, folder, model_args=dict(num_heads=2, img_size=16), safe_serialization=True)
    return folder


def test_an_aimv2_folder_opens_by_path_with_the_probe_map_first(tmp_path):
    assert_siglip_view(open_by_path(aimv2_folder(tmp_path / "aimv2")))


def test_a_pe_model_of_the_hf_cache_offers_each_of_its_probes_eight_heads(tmp_path):
    snapshot = in_hf_cache(tmp_path, "timm/vit_pe_core_tiny_patch16_384.fb", pe_core_folder)
    at = open_from_picker("timm/vit_pe_core_tiny_patch16_384.fb", snapshot)
    sidebar_widget(at, "radio", "Map").set_value("probe")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    head = sidebar_widget(at, "selectbox", "Head")
    assert len(head.options) == 1 + 8
    head.set_value(head.options[-1])  # head 8: beyond the blocks' two
    at.run()
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    assert [c.value for c in at.main.caption if "Colours span" in c.value]  # the probe head's overlay is drawn


def timm_aimv2_folder(folder):
    """timm's AIMv2: no CLS and no probe (mean pooling), no classifier."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("aimv2_large_patch14_224", pretrained=False, img_size=16, patch_size=4, embed_dim=16,
                              depth=2, num_heads=2).eval()
    timm.models.save_for_hf(model, folder, model_args=dict(num_heads=2, img_size=16), safe_serialization=True)
    return folder


def test_a_timm_aimv2_without_cls_or_probe_opens_by_path_on_a_patchs_attention(tmp_path):
    at = open_by_path(timm_aimv2_folder(tmp_path / "aimv2"))
    assert sidebar_widget(at, "selectbox", "Query token").options[0].startswith("0 · patch row 1, col 1")
    assert any("no classifier" in info.value for info in at.main.info)
    assert [c.value for c in at.main.caption if "Colours span" in c.value]  # the overlay is drawn


def test_a_naflex_models_own_sizing_is_not_called_another_training_size_or_a_stretch(tmp_path):
    """Issue 69, item 10: NaFlex is trained on each image's own aspect within its patch budget, so its own sizing of
    a 70x30 photo (20x12 px, 3 x 5 patches: the aspect as near as whole patches allow) is neither "not its training
    size" nor "the image is stretched", as the caption said."""
    snapshot = in_hf_cache(tmp_path, "google/siglip2-naflex-tiny", siglip2_naflex_folder)
    at = open_from_picker("google/siglip2-naflex-tiny · hf:Siglip2Model", snapshot)
    upload(at, "wide.png", png_bytes(70, 30))
    [caption] = [c.value for c in at.main.caption if "Click a patch" in c.value]
    assert "sees it as 20×12 px in 3 rows × 5 columns" in caption
    assert "training size" not in caption and "stretched" not in caption
    assert "NaFlex keeps the image's aspect ratio within 16 patches" in caption


def sam_folder(folder):
    """SAM's image encoder on a 7 x 7 grid of 8-px patches: layers 1 and 3 in windows of 3 (the grid padded to 9 x 9,
    windows tiling it from the top left), layer 2 global; its processor pads to 56 px."""
    config = transformers.SamVisionConfig(image_size=56, patch_size=8, hidden_size=32, mlp_dim=48,
                                          num_hidden_layers=3, num_attention_heads=2, window_size=3,
                                          global_attn_indexes=[1], output_channels=8)
    torch.manual_seed(0)
    transformers.SamVisionModel(config).save_pretrained(folder)
    transformers.SamImageProcessorPil(size={"longest_edge": 56}, pad_size={"height": 56, "width": 56}
                                      ).save_pretrained(folder)
    return folder


def test_a_sam_windowed_layers_caption_says_the_map_is_the_querys_window(tmp_path, monkeypatch):
    """Issue 69, item 10: SAM's windowed layer drew the query's window alone (zero elsewhere) under a caption that
    never said so (Swin's does); its global layers say they read the whole grid."""
    from vit.app import drawing

    drawn, overlay = [], drawing.overlay_image  # the main map, as the page draws it
    monkeypatch.setattr(drawing, "overlay_image", lambda image, map2d, *a, **k: drawn.append(map2d) or overlay(
        image, map2d, *a, **k))
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(sam_folder(tmp_path / "sam")))
    at.run()
    upload(at, "photo.png", png_bytes(56, 56))
    edge = "cut by the grid's edge, row 7, cols 1–3"  # the last row of windows: one row of the grid, two of padding
    for query, layer, rows, cols, words in ((3 * 7 + 4, 1, slice(3, 6), slice(3, 6), "rows 4–6, cols 4–6"),
                                            (6 * 7 + 1, 3, slice(6, 7), slice(0, 3), edge)):
        sidebar_widget(at, "selectbox", "Query token").set_value(query)
        sidebar_widget(at, "select_slider", "Layer").set_value(layer)
        at.run()
        assert not at.exception and not at.main.error, [e.value for e in at.main.error]
        [caption] = [c.value for c in at.main.caption if "Colours span" in c.value]
        assert f"in its 3×3 window: {words} of the grid (zero outside it" in caption, caption
        inside = np.zeros((7, 7), bool)
        inside[rows, cols] = True
        assert (np.asarray(drawn[-1])[~inside] == 0).all() and (np.asarray(drawn[-1])[inside] > 0).all()
    sidebar_widget(at, "select_slider", "Layer").set_value(2)
    at.run()
    [caption] = [c.value for c in at.main.caption if "Colours span" in c.value]
    assert "over the whole grid (one of its global layers" in caption and "3×3 window:" not in caption
