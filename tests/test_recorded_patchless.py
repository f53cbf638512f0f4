"""transformers folders whose attention runs through transformers' attention interface but whose config names no
patch size where the library road reads one (SegFormer's and GLPN's stages, a dual encoder's ``vision_config``), or
whose class the port of its model_type does not read (SigLIP's classifier), open through the recorder at the
attention function (``vit.sources.library_road.recorded_folder``, issue 117), the patch embedding read from the
traced forward.

Reference: each model's own eager attention (``attn_implementation="eager"``, ``output_attentions=True``), every
layer, every head, every row; SegFormer and GLPN at a non-square input, their stages' grids named so that a
transposed grid fails (SigLIP's and Chinese-CLIP's position embeddings take their square input only)."""

import pytest
import torch
import transformers

import vit

MEAN_STD = dict(image_mean=[0.5, 0.4, 0.3], image_std=[0.2, 0.3, 0.4])
TOWER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
             patch_size=8)
STAGES = dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3],
              strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2])


def _segformer():
    return transformers.SegformerForImageClassification(transformers.SegformerConfig(**STAGES, num_labels=3))


def _glpn():
    return transformers.GLPNForDepthEstimation(transformers.GLPNConfig(**STAGES, decoder_hidden_size=16))


def _siglip():
    return transformers.SiglipForImageClassification(transformers.SiglipConfig(
        vision_config=TOWER, text_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                              intermediate_size=64, vocab_size=64), num_labels=3))


def _chinese_clip():
    return transformers.ChineseCLIPModel(transformers.ChineseCLIPConfig(
        vision_config=TOWER, text_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                              intermediate_size=64, vocab_size=64), projection_dim=16))


def _eager(model, pixels):
    """The model's own attention probabilities, eager, every layer (a dual encoder's: its vision model's), and
    SigLIP's attention-pooling head's after them, from its own ``nn.MultiheadAttention`` asked for its weights."""
    model.set_attn_implementation("eager")
    head = getattr(getattr(model, "vision_model", None), "head", None)
    tokens = []
    handle = head.register_forward_pre_hook(lambda m, a: tokens.append(a[0])) if head is not None else None
    try:
        with torch.no_grad():
            if isinstance(model, transformers.ChineseCLIPModel):
                return model.vision_model(pixel_values=pixels, output_attentions=True).attentions
            own = list(model(pixel_values=pixels, output_attentions=True).attentions)
            if head is not None:
                probe = head.probe.repeat(pixels.shape[0], 1, 1)
                own.append(head.attention(probe, tokens[0], tokens[0], need_weights=True,
                                          average_attn_weights=False)[1])
            return own
    finally:
        if handle is not None:
            handle.remove()


# name, build, input (height, width), layers, each layer's (query grid, key grid), classifier
FAMILIES = [
    ("segformer", _segformer, (32, 48), 2, [((8, 12), (4, 6)), ((4, 6), (4, 6))], True),
    ("glpn", _glpn, (32, 48), 2, [((8, 12), (4, 6)), ((4, 6), (4, 6))], False),
    ("siglip-classifier", _siglip, (32, 32), 3, None, True),  # its 2 layers and its attention-pooling head
    ("chinese-clip", _chinese_clip, (32, 32), 2, None, False),
]


@pytest.fixture(scope="module", params=FAMILIES, ids=[f[0] for f in FAMILIES])
def opened(request, tmp_path_factory):
    name, build, size, layers, grids, classifier = request.param
    folder = tmp_path_factory.mktemp(name)
    torch.manual_seed(0)
    model = build().eval()
    with torch.no_grad():  # weights far from the library's small init, so that each layer's attention is its own
        for parameter in model.parameters():
            parameter.normal_(0, 0.5)
    model.save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": size[0], "width": size[1]}, **MEAN_STD).save_pretrained(folder)
    return request.param, model, vit.load(folder, device="cpu")


def test_every_layer_equals_the_models_own_eager_attention(opened):
    (name, _, size, layers, _, classifier), model, checkpoint = opened
    wrapped = checkpoint.model
    assert checkpoint.road == "library" and wrapped.num_layers == layers
    assert checkpoint.preprocessing.mean == (0.5, 0.4, 0.3) and wrapped.is_classifier == classifier
    torch.manual_seed(1)
    pixels = torch.randn(1, 3, *size)
    _, recorded = wrapped.run(pixels, layers=range(layers))
    own = _eager(model, pixels)
    assert len(own) == layers
    for layer in range(layers):
        assert recorded[layer].shape == own[layer].shape, (name, layer)
        assert torch.allclose(recorded[layer], own[layer], atol=1e-5), (name, layer)
        other = own[layer - 1 if layer else 1]
        assert other.shape != own[layer].shape or not torch.allclose(recorded[layer], other, atol=1e-3)  # its own


def test_each_stage_sits_on_its_own_grid_not_its_transpose(opened):
    (name, _, size, _, grids, _), _, checkpoint = opened
    places = checkpoint.model.places
    if grids is None:  # one grid: the layout's, at the square input its position embeddings take
        assert checkpoint.model.layout.grid == (4, 4)
        assert checkpoint.model.layout.num_prefix_tokens == (1 if name == "chinese-clip" else 0)
        assert all(p.key_grid == (4, 4) for p in places)
        return
    assert [(p.query_grid, p.key_grid) for p in places] == grids


def test_the_attention_map_is_drawn(opened):
    (_, _, size, _, _, _), _, checkpoint = opened
    import numpy as np
    from PIL import Image

    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (size[0], size[1], 3), dtype=np.uint8))
    drawn = np.asarray(vit.explain(checkpoint, image, "attention").map)
    assert drawn.size and np.isfinite(drawn).all()


def test_a_processor_that_does_not_normalise_feeds_the_model_as_it_is(tmp_path):
    """GLPN's own processor rescales to [0, 1] and declares no mean or std: the recorder's road feeds the model as
    that processor does (mean 0, std 1), not a guess."""
    model = _glpn().eval()
    model.config.image_size = 32  # GLPN's processor resizes to any multiple of 32: the size this road runs at
    model.save_pretrained(tmp_path)
    transformers.GLPNImageProcessor().save_pretrained(tmp_path)
    checkpoint = vit.load(tmp_path, device="cpu")
    assert checkpoint.preprocessing.mean == (0.0, 0.0, 0.0) and checkpoint.preprocessing.std == (1.0, 1.0, 1.0)


def test_a_class_its_port_does_not_read_opens_by_its_vision_model_part(tmp_path):
    """SigLIP 2's classifier takes patches flattened by its processor (NaFlex), not an image: it opens whole, its
    ``vision_model`` fed each image's patches (``vit.sources.library_road.vision_parts``; tests/test_vision_parts.py
    checks every layer), at the size its processor gives (here a plain 32x32 resize: 4x4 patches)."""
    config = transformers.Siglip2Config(vision_config=dict(TOWER, num_patches=16), text_config=dict(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=64), num_labels=3)
    transformers.Siglip2ForImageClassification(config).save_pretrained(tmp_path)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}, **MEAN_STD).save_pretrained(tmp_path)
    checkpoint = vit.load(tmp_path, device="cpu")
    assert checkpoint.metadata["architecture"] == "hf:Siglip2ForImageClassification"
    assert checkpoint.model.places[0].key_grid == (4, 4) and len(checkpoint.class_names) == 3
