"""The explorer draws its sidebar from ``image_analysis.view_shape`` before the model runs: what it foretells must be
what the analysis then has, on every family (prefix and register tokens, pooling probes, stages), at the training size
and at a non-square keep-aspect one, and it must refuse what ``analyse`` refuses before its forward, in the same
words."""

import numpy as np
import pytest
import torch
from PIL import Image
from test_family_relevance import BASE, FAMILIES
from test_hiera_parity import save_hf_hiera
from test_swin_parity import _hf

from vit.checkpoint import Checkpoint, Preprocessing
from vit.core.inference import TRAINING_SIZE, InputSize
from vit.costs.bounds import TooManyTokens
from vit.explain.views import attention_maps, image_analysis
from vit.model import ViT, ViTConfig
from vit.sources.open import open_source

SIZES = [TRAINING_SIZE, InputSize(28, True)]


def image(width: int = 30, height: int = 20) -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8))


def foretold(shape: image_analysis.ViewShape | image_analysis.Analysis) -> dict:
    return dict(input_size=tuple(shape.input_size), grid=tuple(shape.grid), prefix=shape.num_prefix_tokens,
                names=tuple(shape.prefix_names), layers=shape.num_layers, heads=shape.num_heads,
                per_layer=[shape.heads_in(i) for i in range(shape.num_layers)], probe=shape.num_probe_heads,
                staged=shape.staged, cls=shape.has_cls, tokens=shape.num_tokens, layouts=tuple(shape.layouts),
                kinds=(attention_maps.map_kinds(shape, True), attention_maps.map_kinds(shape, False)))


def family_checkpoint(name: str) -> Checkpoint:
    torch.manual_seed(0)
    config = ViTConfig(**{**BASE, **FAMILIES[name]})
    return Checkpoint(model=ViT(config).eval(), class_names=["a", "b", "c"],
                      preprocessing=Preprocessing.default_for(config))


@pytest.mark.parametrize("size", SIZES, ids=["training", "keep-aspect"])
@pytest.mark.parametrize("family", ["plain", *FAMILIES])
def test_the_view_shape_is_the_analysis_shape_on_every_family(family, size):
    checkpoint = (family_checkpoint(family) if family != "plain" else
                  Checkpoint(model=ViT(ViTConfig(**BASE)).eval(), class_names=["a", "b", "c"],
                             preprocessing=Preprocessing.default_for(ViTConfig(**BASE))))
    shape = image_analysis.view_shape(checkpoint, image(), size)
    assert foretold(shape) == foretold(image_analysis.analyse(checkpoint, image(), size))
    if family in ("siglip", "pe-core", "aimv2-hf-head"):  # the probes are told apart: 2 heads, or their own 4
        assert shape.num_probe_heads == FAMILIES[family].get("pool_heads", BASE["num_heads"]) > 0
        no_cls = FAMILIES[family].get("class_token", True) is False  # PE has CLS too: its maps start there
        assert shape.has_cls is not no_cls and (attention_maps.map_kinds(shape, True)[0] == "probe") is no_cls


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    swin, hiera = tmp_path_factory.mktemp("swin"), tmp_path_factory.mktemp("hiera")
    _hf("swin", 40).save_pretrained(swin)
    save_hf_hiera(hiera)
    return {"swin": open_source(swin), "hiera": open_source(hiera)}


@pytest.mark.parametrize("kind", ["swin", "hiera"])
def test_the_view_shape_of_a_model_with_stages_has_each_stage_heads_and_layouts(staged, kind):
    checkpoint = staged[kind]
    side = checkpoint.preprocessing.image_size
    side = side if isinstance(side, int) else side[0]
    picture = image(side, side)
    shape = image_analysis.view_shape(checkpoint, picture)
    assert shape.staged and len(set(shape.heads)) > 1  # the stages' own heads
    assert foretold(shape) == foretold(image_analysis.analyse(checkpoint, picture))


def test_the_view_shape_refuses_what_the_analysis_refuses_before_its_forward():
    checkpoint = family_checkpoint("dinov2-registers")
    picture = image(400, 300)
    big = InputSize(400, True)
    with pytest.raises(TooManyTokens) as shape_error:
        image_analysis.view_shape(checkpoint, picture, big, max_tokens=100)
    with pytest.raises(TooManyTokens) as analysis_error:
        image_analysis.analyse(checkpoint, picture, big, max_tokens=100)
    assert str(shape_error.value) == str(analysis_error.value)
