"""Video models fed an image as a clip of one frame (issue 117 item 6, ``vit.sources.library_road.placing.one_frame``):
VideoMT (EoMT a frame: its object queries join its last block) and VideoPrism (factorized space-time attention: its
spatial layers are the layers, its temporal layers over one frame named and left out) open from their folders and in
hand, every layer's attention equal to transformers' own eager function's (``eager_attention_forward`` of the
modelling file, hooked) on the same one-frame clip, and placed on the grid: a query's row drawn is the eager row
reshaped row-major, not transposed (VideoPrism at a non-square 4x6 grid)."""

from __future__ import annotations

import importlib

import pytest
import torch
from layer_reference import caught_eager, widened
from PIL import Image
from rows_formed import spy_formed

import vit
from vit.core.inference import preprocess

transformers = pytest.importorskip("transformers")

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.3, 0.4)


def _spread(model):
    return widened(model, matrices_only=True).eval()  # weights wide enough that every row differs from uniform


def _image(hw=(32, 32)):
    pixels = torch.rand(*hw, 3, generator=torch.Generator().manual_seed(2)) * 255
    return Image.fromarray(pixels.byte().numpy())


def _eager(module_name, model, **inputs):
    """Each attention call's post-softmax probabilities as the modelling file's eager function returns them
    (``layer_reference.caught_eager``), the model run with eager attention."""
    modeling = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
    before = model.config._attn_implementation  # VideoPrism's is eager already (it has no SDPA path)
    if before != "eager":
        model.set_attn_implementation("eager")
    try:
        return caught_eager(modeling, lambda: model(**inputs))
    finally:
        if before != "eager":
            model.set_attn_implementation(before)


@pytest.fixture(scope="module")
def videomt_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("videomt")
    config = transformers.VideomtConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=32, image_size=32, patch_size=8, num_blocks=1,
                                        num_queries=3, num_register_tokens=2, num_labels=2)
    torch.manual_seed(0)
    _spread(transformers.VideomtForUniversalSegmentation(config)).save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=list(MEAN),
                                   image_std=list(STD)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def videoprism():
    config = transformers.VideoPrismVisionConfig(hidden_size=16, intermediate_size=32, num_attention_heads=2,
                                                 num_spatial_layers=2, num_temporal_layers=1, image_size=32,
                                                 tubelet_size=[1, 8, 8], num_frames=2)
    torch.manual_seed(0)
    return _spread(transformers.VideoPrismVisionModel(config))


def test_videomt_is_eomt_on_a_one_frame_clip_every_layer_its_eager_attention(videomt_folder, monkeypatch):
    checkpoint = vit.load(videomt_folder, device="cpu")
    layout = checkpoint.model.layout
    assert layout.num_prefix_tokens == 3 and layout.extra_tokens == (0, 3)  # CLS, 2 registers; 3 queries in layer 2
    image = _image()
    x = preprocess([image], checkpoint.preprocessing)
    reference = transformers.VideomtForUniversalSegmentation.from_pretrained(videomt_folder).eval()
    expected = _eager("videomt", reference, pixel_values_videos=x[:, None])
    _, kept = checkpoint.model.run(x, layers=range(2))
    for layer, extra in enumerate((0, 3)):
        assert kept[layer].shape == expected[layer].shape == (1, 2, extra + 3 + 16, extra + 3 + 16)
        torch.testing.assert_close(kept[layer], expected[layer], atol=1e-5, rtol=0)
        query = 3 + 6  # the patch at row 1, col 2
        formed = spy_formed(monkeypatch)
        drawn = torch.from_numpy(vit.explain(checkpoint, image, "attention", layer=layer, head=1, query=query).map)
        assert formed and all(rows == 1 for rows, _ in formed)  # only the asked row formed (issue 117, Speed)
        monkeypatch.undo()
        row = expected[layer][0, 1, extra + query, extra + 3:].reshape(4, 4)
        torch.testing.assert_close(drawn, row, atol=1e-5, rtol=0)
        assert not torch.allclose(drawn, row.T, atol=1e-5, rtol=0)


def test_videoprisms_spatial_layers_are_its_eager_attention_its_temporal_ones_named(videoprism):
    checkpoint = vit.load(videoprism, image_size=(32, 48), mean=MEAN, std=STD)
    wrapped = checkpoint.model
    assert wrapped.names == ["model.spatial_layers.0.attention", "model.spatial_layers.1.attention"]
    assert "temporal attention" in checkpoint.metadata["left_out"]["model.temporal_layers.0.attention"]
    image = _image((32, 48))
    x = preprocess([image], checkpoint.preprocessing)
    expected = _eager("videoprism", videoprism, pixel_values_videos=x[:, None],
                      interpolate_pos_encoding=True)
    assert [tuple(p.shape) for p in expected] == [(1, 2, 24, 24), (1, 2, 24, 24), (24, 2, 1, 1)]  # time: 1 frame
    _, kept = wrapped.run(x, layers=range(2))
    for layer in range(2):
        torch.testing.assert_close(kept[layer], expected[layer], atol=1e-5, rtol=0)
    drawn = vit.explain(checkpoint, image, "attention", layer=1, head=0, query=7)
    torch.testing.assert_close(torch.from_numpy(drawn.map), expected[1][0, 0, 7].reshape(4, 6), atol=1e-5, rtol=0)


def test_videoprisms_clip_model_folder_opens_its_video_towers_spatial_layers(tmp_path):
    vision = dict(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_spatial_layers=1,
                  num_temporal_layers=1, image_size=32, tubelet_size=[1, 8, 8], num_frames=2)
    text = dict(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_text_layers=1)
    config = transformers.VideoPrismConfig(vision_config=vision, text_config=text)
    torch.manual_seed(0)
    transformers.VideoPrismClipModel(config).eval().save_pretrained(tmp_path)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    checkpoint = vit.load(tmp_path, device="cpu")
    names = checkpoint.model.names  # its spatial layer, then the video model's own over the frame's tokens
    assert names[0].endswith("vision_model.spatial_layers.0.attention") and "auxiliary_layers.0" in names[1]
    assert not any("temporal" in name for name in names)
    assert list(checkpoint.metadata["left_out"]) == ["model.video_model.vision_model.temporal_layers.0.attention"]
    assert bool(torch.isfinite(torch.as_tensor(vit.explain(checkpoint, _image(), "attention").map)).all())

