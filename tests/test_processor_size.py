"""A processor's non-square size is the size the model runs at (issue 116, item 9): a ``{"height": 48, "width": 32}``
processor over a square config feeds 48 x 32 on the port road, as transformers' processor feeds its model, and an
HF ViT whose config is itself non-square opens as transformers builds it instead of being refused. References:
transformers' own processor and model on the same folder."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import vit
from vit.core.inference import preprocess

transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, patch_size=8)


def photo() -> Image.Image:
    return Image.fromarray(np.random.default_rng(2).integers(0, 256, (40, 56, 3), dtype=np.uint8))


def test_a_square_dinov2_with_a_48_by_32_processor_runs_at_48_by_32_as_transformers(tmp_path):
    torch.manual_seed(0)
    model = transformers.Dinov2ForImageClassification(transformers.Dinov2Config(**SMALL, image_size=32,
                                                                               num_labels=3)).eval()
    model.save_pretrained(tmp_path)
    processor = transformers.ViTImageProcessor(size={"height": 48, "width": 32})
    processor.save_pretrained(tmp_path)
    checkpoint = vit.load(tmp_path, device="cpu")
    assert checkpoint.road == "port" and tuple(checkpoint.preprocessing.image_hw) == (48, 32)
    x = preprocess([photo()], checkpoint.preprocessing)
    theirs = processor(photo(), return_tensors="pt").pixel_values  # (1, 3, 48, 32)
    assert x.shape == theirs.shape == (1, 3, 48, 32)
    torch.testing.assert_close(x, theirs, atol=1e-5, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(checkpoint.model(x)[0], model(pixel_values=theirs).logits, atol=1e-5, rtol=1e-5)


def test_an_hf_vit_whose_config_is_not_square_opens_as_transformers_builds_it(tmp_path):
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(transformers.ViTConfig(**SMALL, image_size=[48, 32],
                                                                         num_labels=3)).eval()
    model.save_pretrained(tmp_path)
    processor = transformers.ViTImageProcessor(size={"height": 48, "width": 32})
    processor.save_pretrained(tmp_path)
    checkpoint = vit.load(tmp_path, device="cpu")
    assert checkpoint.road == "library" and checkpoint.model.layout.grid == (6, 4)
    theirs = processor(photo(), return_tensors="pt").pixel_values
    torch.testing.assert_close(preprocess([photo()], checkpoint.preprocessing), theirs, atol=1e-5, rtol=0)
    explained = vit.explain(checkpoint, photo(), "attention")
    with torch.no_grad():
        expected = model(pixel_values=theirs).logits.softmax(-1)[0]
    assert explained.map.shape == (6, 4)
    assert explained.prediction.probabilities[0] == pytest.approx(float(expected.max()), abs=1e-5)
