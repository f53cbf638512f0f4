"""Whole folders whose patch size sits in their ``vision_config`` (issue 117, item 6;
``vit.sources.library_road.vision_parts``): BLIP's dual encoder (``BlipModel``), BLIP-2's retrieval model
(``Blip2ForImageTextRetrieval``) and SigLIP 2's classifier (``Siglip2ForImageClassification``, NaFlex input) open from
the folder transformers saves, their ``vision_model`` the part the maps read. References: each layer's probabilities
as transformers computes them, caught at the library's own softmax in its attention modules (BLIP's, whose attention
is off the interface) or at its modelling file's ``eager_attention_forward`` (the model built with eager attention),
and the pooling head's ``nn.MultiheadAttention`` asked for its own per-head weights. A drawn map is the reference row
placed row-major on the grid (elementwise: a transposed placement fails); SigLIP 2's NaFlex input is placed on a
non-square 64x96 grid. Each model is built tiny with random weights in transformers, never downloaded."""

from __future__ import annotations

import pytest
import torch
from layer_reference import caught_eager, library_softmax, widened

import vit
from vit.sources.library_road import vision_parts

transformers = pytest.importorskip("transformers")

VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, patch_size=8,
              image_size=32)
TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=99)


def _blip():
    return transformers.BlipModel(transformers.BlipConfig(vision_config=VISION, text_config=TEXT, projection_dim=16))


def _blip2():
    return transformers.Blip2ForImageTextRetrieval(transformers.Blip2Config(
        vision_config=VISION, qformer_config=dict(TEXT, encoder_hidden_size=32), num_query_tokens=2,
        image_text_hidden_size=16))


def _siglip2():
    return transformers.Siglip2ForImageClassification(transformers.Siglip2Config(
        vision_config=dict(VISION, num_patches=64), text_config=TEXT, num_labels=3))


CASES = {"blip": (_blip, lambda: transformers.BlipImageProcessor(size={"height": 32, "width": 32})),
         "blip2": (_blip2, lambda: transformers.BlipImageProcessor(size={"height": 32, "width": 32})),
         "siglip2": (_siglip2, lambda: transformers.Siglip2ImageProcessor(patch_size=8, max_num_patches=16))}


def test_takes_dual_encoders_and_classifiers_not_models_that_answer_in_text():
    """Fast: the classes it takes are read from transformers' own classes and config.json."""
    vision = {"vision_config": {"patch_size": 8}}
    assert vision_parts.takes({"architectures": ["BlipModel"], **vision})
    assert vision_parts.takes({"architectures": ["Siglip2ForImageClassification"], **vision})
    assert not vision_parts.takes({"architectures": ["Blip2ForConditionalGeneration"], **vision})  # it generates
    assert not vision_parts.takes({"architectures": ["Cohere2VisionModel"], **vision})  # a language model beside
    assert not vision_parts.takes({"architectures": ["BlipModel"]})  # no patch size in a vision_config
    with pytest.raises(ValueError, match=r"^its image processor's max_num_patches None is not a patch count"):
        vision_parts._naflex_size({}, (8, 8))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made = {}
    for name, (build, processor) in CASES.items():
        torch.manual_seed(0)
        model = widened(build()).eval()  # weights wide enough that every head's attention differs from uniform
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        processor().save_pretrained(folder)
        made[name] = folder
    return made


def _reference(folder, name: str, pixels: torch.Tensor) -> list[torch.Tensor]:
    """transformers alone: the folder's class (eager attention), each vision layer's probabilities caught where the
    library forms them: BLIP's attention modules' own softmax, BLIP-2's modelling file's eager function."""
    from transformers.models.blip_2 import modeling_blip_2

    config = transformers.AutoConfig.from_pretrained(folder)
    cls = getattr(transformers, config.architectures[0])
    model = cls.from_pretrained(folder, attn_implementation="eager").eval()
    if name == "blip":
        layers = [layer.self_attn for layer in model.vision_model.encoder.layers]
        return library_softmax(model.vision_model, layers, pixels)
    return caught_eager(modeling_blip_2, lambda: model.vision_model(pixel_values=pixels))


@pytest.mark.parametrize("name", ["blip", "blip2"])
def test_a_dual_encoders_vision_part_opens_whole_and_every_layer_is_the_librarys(folders, name):
    from PIL import Image

    from vit.core.inference import preprocess

    checkpoint = vit.load(folders[name], device="cpu")
    architecture = {"blip": "hf:BlipModel", "blip2": "hf:Blip2ForImageTextRetrieval"}[name]
    assert checkpoint.road == "library" and checkpoint.metadata["architecture"] == architecture
    assert checkpoint.model.layout.num_prefix_tokens == 1 and checkpoint.model.layout.grid == (4, 4)
    image = Image.fromarray((torch.rand(40, 28, 3, generator=torch.Generator().manual_seed(3)) * 255).byte().numpy())
    pixels = preprocess([image], checkpoint.preprocessing)
    _, kept = checkpoint.model.run(pixels, layers=range(2))
    expected = _reference(folders[name], name, pixels)
    assert len(expected) == 2
    for layer in range(2):
        assert kept[layer].shape == expected[layer].shape == (1, 4, 17, 17)
        torch.testing.assert_close(kept[layer], expected[layer], atol=1e-6, rtol=0)
    query = 1 + 4 + 2  # the patch at row 1, column 2
    drawn = vit.explain(checkpoint, image, "attention", layer=1, head=2, query=query)
    torch.testing.assert_close(torch.from_numpy(drawn.map), expected[1][0, 2, query, 1:].reshape(4, 4), atol=1e-6,
                               rtol=0)


def _siglip2_reference(folder, pixels: torch.Tensor):
    """SigLIP 2's classifier alone (eager), fed as its processor feeds it: its encoder's eager probabilities and its
    pooling head's per-head weights, and its logits."""
    from transformers.models.siglip2 import modeling_siglip2
    from transformers.models.siglip2.image_processing_siglip2 import convert_image_to_patches

    model = transformers.Siglip2ForImageClassification.from_pretrained(folder, attn_implementation="eager").eval()
    head, pooled, out = model.vision_model.head.attention, [], []

    def weights(module, args, kwargs, output):
        query, key, value = args[:3]
        _, w = torch.nn.MultiheadAttention.forward(module, query, key, value, need_weights=True,
                                                   average_attn_weights=False)
        pooled.append(w.detach())
    hook = head.register_forward_hook(weights, with_kwargs=True)
    h, w = pixels.shape[-2:]
    patches = torch.stack([convert_image_to_patches(image, 8) for image in pixels])
    mask = torch.ones(patches.shape[:2], dtype=torch.long)
    try:
        seen = caught_eager(modeling_siglip2, lambda: out.append(model(
            pixel_values=patches, pixel_attention_mask=mask, spatial_shapes=torch.tensor([[h // 8, w // 8]])).logits))
    finally:
        hook.remove()
    return seen + pooled, out[0]  # the pooling head's attention after the encoder's layers, as the forward runs them


def test_siglip2s_classifier_opens_whole_on_its_naflex_patches(folders):
    checkpoint = vit.load(folders["siglip2"], device="cpu")
    assert checkpoint.metadata["architecture"] == "hf:Siglip2ForImageClassification"
    assert checkpoint.preprocessing.image_hw == (32, 32) and len(checkpoint.class_names) == 3


def test_siglip2s_classifier_in_hand_places_its_patches_on_a_non_square_grid(folders):
    from vit.sources.library_road import module_road

    model = transformers.Siglip2ForImageClassification.from_pretrained(folders["siglip2"]).eval()
    checkpoint = module_road.open_module(vision_parts._NaFlexPart(model, 8), image_size=(64, 96), mean=(0.5,) * 3,
                                         std=(0.5,) * 3)
    wrapped = checkpoint.model
    assert wrapped.num_layers == 3 and wrapped.is_classifier  # two encoder layers, the pooling head's attention
    pixels = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(1))
    out, kept = wrapped.run(pixels, layers=range(3))
    expected, logits = _siglip2_reference(folders["siglip2"], pixels)
    torch.testing.assert_close(out.logits, logits, atol=1e-5, rtol=0)
    assert [tuple(e.shape) for e in expected] == [(1, 4, 96, 96), (1, 4, 96, 96), (1, 4, 1, 96)]
    for layer in range(3):
        torch.testing.assert_close(kept[layer], expected[layer], atol=1e-6, rtol=0)
    from PIL import Image

    image = Image.fromarray((torch.rand(64, 96, 3, generator=torch.Generator().manual_seed(2)) * 255).byte().numpy())
    drawn = vit.explain(checkpoint, image, "attention", layer=0, head=1, query=13)  # row 1, column 1 of 8x12
    from vit.core.inference import preprocess

    expected, _ = _siglip2_reference(folders["siglip2"], preprocess([image], checkpoint.preprocessing))
    torch.testing.assert_close(torch.from_numpy(drawn.map), expected[0][0, 1, 13].reshape(8, 12), atol=1e-6, rtol=0)
