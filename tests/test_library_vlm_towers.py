"""A vision-language model's class in a vision auto-mapping (issue 117, item 6): Cohere 2 Vision's
``Cohere2VisionModel`` and ShieldGemma 2's ``ShieldGemma2ForImageClassification`` open with ``vit.load`` as their
vision tower alone (SigLIP's), its weights read from the whole folder under their prefix. Every layer's attention
equals the probabilities transformers' own eager attention computes in the whole model (SigLIP's modelling file's
``eager_attention_forward`` hooked, the model built with ``attn_implementation="eager"``, its image features asked),
and a drawn map is the eager row row-major on the grid. Built tiny with random weights in transformers."""

from __future__ import annotations

import pytest
import torch
from layer_reference import assert_layers_are, caught_eager, widened

import vit

transformers = pytest.importorskip("transformers")

VISION = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, image_size=32, patch_size=8)
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            head_dim=16, vocab_size=256)


def test_only_a_vlm_class_a_vision_auto_mapping_lists_is_taken():
    """Fast: Cohere 2 Vision's and ShieldGemma 2's classes are; GLM-4.1V's (no vision auto-mapping lists it), or
    another class of Cohere 2 Vision's type, are not: they keep their refusal and answer through vit.ask_vlm."""
    from vit.sources.library_road.vlm_towers import takes

    parts = dict(vision_config=VISION, text_config=TEXT)
    assert takes(dict(model_type="cohere2_vision", architectures=["Cohere2VisionModel"], **parts))
    assert takes(dict(model_type="shieldgemma2", architectures=["ShieldGemma2ForImageClassification"], **parts))
    assert not takes(dict(model_type="cohere2_vision", architectures=["Cohere2VisionForConditionalGeneration"],
                          **parts))
    assert not takes(dict(model_type="glm4v", architectures=["Glm4vModel"], **parts))
    assert not takes(dict(model_type="cohere2_vision", architectures=["Cohere2VisionModel"], vision_config=VISION))


def test_the_towers_prefix_is_the_one_holding_all_its_tensors_at_their_shapes():
    """Fast: the prefix under which every tower tensor sits at its shape; none, or two, refused in one line."""
    from vit.sources.library_road.class_reading import tower_prefix

    shapes = {"a.weight": torch.Size([2]), "b.weight": torch.Size([3])}
    meta = {f"model.tower.{k}": torch.empty(v, device="meta") for k, v in shapes.items()}
    meta["model.lm.a.weight"] = torch.empty(2, device="meta")  # the language model's "a" alone: not the tower
    assert tower_prefix(list(shapes), meta, shapes) == "model.tower."
    wrong = dict(meta, **{"model.tower.b.weight": torch.empty(4, device="meta")})
    with pytest.raises(ValueError, match=r"^its weights hold the 2 tensors of its vision tower under no one prefix$"):
        tower_prefix(list(shapes), wrong, shapes)
    twice = dict(meta, **{f"x.{k}": torch.empty(v, device="meta") for k, v in shapes.items()})
    with pytest.raises(ValueError, match=r"under several prefixes \(model\.tower\., x\.\)$"):
        tower_prefix(list(shapes), twice, shapes)


def _cohere2():
    config = transformers.Cohere2VisionConfig(vision_config=VISION, text_config=dict(TEXT, model_type="cohere2"),
                                              alignment_intermediate_size=32)
    return transformers.Cohere2VisionModel(config), transformers.Cohere2VisionImageProcessor(
        size={"height": 32, "width": 32})


def _shieldgemma2():
    config = transformers.ShieldGemma2Config(vision_config=VISION, text_config=dict(TEXT, model_type="gemma3_text"),
                                             mm_tokens_per_image=4)
    return transformers.ShieldGemma2ForImageClassification(config), transformers.Gemma3ImageProcessor(
        size={"height": 32, "width": 32})


CASES = {"cohere2_vision": _cohere2, "shieldgemma2": _shieldgemma2}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made = {}
    for name, build in CASES.items():
        torch.manual_seed(0)
        model, processor = build()
        widened(model)  # weights wide enough that every head's attention differs from uniform
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        processor.save_pretrained(folder)
        made[name] = folder
    return made


def eager_probabilities(folder, pixels: torch.Tensor) -> list[torch.Tensor]:
    """transformers alone: the whole folder's class built with eager attention, its image features asked, each call
    of SigLIP's ``eager_attention_forward`` hooked (the tower's layers, in order)."""
    from transformers.models.siglip import modeling_siglip

    config = transformers.AutoConfig.from_pretrained(folder)
    model = getattr(transformers, config.architectures[0]).from_pretrained(folder, attn_implementation="eager").eval()
    features = (model.model if hasattr(model, "model") else model).get_image_features
    return caught_eager(modeling_siglip, lambda: features(pixel_values=pixels))


@pytest.mark.slow  # builds and saves two models
@pytest.mark.parametrize("name", list(CASES))
def test_the_tower_opens_and_every_layers_attention_is_transformers_eager(folders, name):
    checkpoint = vit.load(folders[name], device="cpu")
    assert checkpoint.road == "library" and type(checkpoint.model.model).__name__ == "SiglipVisionModel"
    assert checkpoint.metadata["architecture"] == f"hf:{type(CASES[name]()[0]).__name__}"
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    _, attentions = checkpoint.model.run(pixels, layers=range(2))
    expected = eager_probabilities(folders[name], pixels)
    assert_layers_are(attentions, expected, 2, (2, 4, 16, 16))


@pytest.mark.slow
def test_a_drawn_map_is_the_eager_row_on_the_grid(folders):
    from PIL import Image

    from vit.core.inference import preprocess

    checkpoint = vit.load(folders["shieldgemma2"], device="cpu")
    image = Image.fromarray((torch.rand(40, 28, 3, generator=torch.Generator().manual_seed(3)) * 255).byte().numpy())
    expected = eager_probabilities(folders["shieldgemma2"], preprocess([image], checkpoint.preprocessing))
    query = 4 + 2  # the patch at row 1, column 2
    drawn = vit.explain(checkpoint, image, "attention", layer=1, head=2, query=query)
    assert drawn.map.shape == (4, 4)
    row = expected[1][0, 2, query]
    assert torch.allclose(torch.from_numpy(drawn.map), row.reshape(4, 4), atol=1e-6, rtol=0)
