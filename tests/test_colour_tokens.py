"""ImageGPT fed an image (issue 117 item 6, ``vit.sources.library_road.placing.colour_tokens``): its folder opens, the
pixels quantised to its image processor's colour clusters as the processor itself does (its ``input_ids``), each
pixel a token; every layer's attention equals transformers' own (``output_attentions``: ImageGPT's explicit path),
placed on the image's grid row-major (a 4x8 image: a transposed placement cannot match)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from layer_reference import widened
from PIL import Image

import vit
from vit.core.inference import preprocess

transformers = pytest.importorskip("transformers")

CLUSTERS = [[r, g, b] for r in (-0.8, 0.0, 0.8) for g in (-0.6, 0.6) for b in (-0.5, 0.5)]  # 12 colours


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("imagegpt")
    config = transformers.ImageGPTConfig(vocab_size=len(CLUSTERS) + 1, n_positions=32, n_embd=16, n_layer=2,
                                         n_head=2, num_labels=3)
    torch.manual_seed(0)
    # weights wide enough that every row of every head differs from uniform
    model = widened(transformers.ImageGPTForImageClassification(config).eval(), matrices_only=True)
    model.save_pretrained(folder)
    transformers.ImageGPTImageProcessor(clusters=CLUSTERS, size={"height": 4, "width": 8}).save_pretrained(folder)
    return folder


def test_imagegpts_pixels_are_its_processors_colour_tokens_and_its_attention_is_its_own(folder):
    checkpoint = vit.load(folder, device="cpu")
    assert checkpoint.model.layout.grid == (4, 8) and checkpoint.model.layout.num_prefix_tokens == 0
    image = Image.fromarray((torch.rand(4, 8, 3, generator=torch.Generator().manual_seed(2)) * 255).byte().numpy())
    ids = transformers.ImageGPTImageProcessor.from_pretrained(folder)(image, return_tensors="pt")["input_ids"]
    reference = transformers.ImageGPTForImageClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        own = reference(input_ids=ids, output_attentions=True).attentions
    x = preprocess([image], checkpoint.preprocessing)
    _, kept = checkpoint.model.run(x, layers=range(2))
    for layer in range(2):
        torch.testing.assert_close(kept[layer], own[layer], atol=1e-5, rtol=0)
    drawn = vit.explain(checkpoint, image, "attention", layer=1, head=1, query=27)  # row 3, col 3: 28 keys before
    torch.testing.assert_close(torch.from_numpy(drawn.map), own[1][0, 1, 27].reshape(4, 8), atol=1e-5, rtol=0)
    for method in ("class", "legrad"):  # no gradient passes its colour lookup: one line, not autograd's error
        with pytest.raises(ValueError, match="no gradient") as refused:
            vit.explain(checkpoint, image, method)
        assert "\n" not in str(refused.value)


def test_an_imagegpt_folder_whose_processor_has_no_clusters_is_refused_in_one_line(tmp_path, folder):
    import shutil

    shutil.copytree(folder, tmp_path / "bare")
    transformers.ImageGPTImageProcessor(size={"height": 4, "width": 8}).save_pretrained(tmp_path / "bare")
    with pytest.raises(Exception, match="declares no clusters to quantise an image by") as refused:
        vit.load(tmp_path / "bare", device="cpu")
    assert "\n" not in str(refused.value)


def test_imagegpts_listed_methods_are_the_ones_that_run(folder):
    """``vit.methods`` lists what ``explain`` draws for ImageGPT and no more: every map of the library road either
    draws (listed) or is refused in one line (not listed), by the one rule both read (``LibraryMethod.problem``): no
    gradient passes its colour lookup to the pixels, so the maps that read one from there are left out."""
    from vit.explain.views.library.road_maps import methods

    checkpoint = vit.load(folder, device="cpu")
    image = Image.fromarray((torch.rand(4, 8, 3, generator=torch.Generator().manual_seed(2)) * 255).byte().numpy())
    listed = vit.methods(checkpoint)
    cheap = {"rise": dict(n_masks=40), "kernel_shap": dict(n_samples=5)}  # their default counts: seconds of CPU
    for method in methods():
        if method in listed:
            drawn = vit.explain(checkpoint, image, method, **cheap.get(method, {}))
            assert drawn.map.shape == (4, 8) and np.isfinite(drawn.map).all()
        else:
            with pytest.raises(ValueError) as refused:
                vit.explain(checkpoint, image, method)
            assert "\n" not in str(refused.value)
    assert {"attention", "rollout", "gradcam", "occlusion"} <= set(listed)
    assert not {"class", "legrad", "attnlrp", "integrated_gradients", "smoothgrad", "input_x_gradient"} & set(listed)
