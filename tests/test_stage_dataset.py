"""The dataset analysis (``vit.analyze``) of a model with stages (a tiny HF Swin, opened by path): each layer's
mean attention distance and entropy on its own grid, with its stage's heads, and the class maps read from the
average pooling, against numbers computed by hand from HF's own per-window attentions and window partition."""

import json

import numpy as np
import pytest
import torch
from helpers import make_image_folder
from test_app_swin import hf_attentions
from test_swin_parity import _hf

from vit.core.images import open_image
from vit.core.inference import preprocess
from vit.explain.methods.stage_maps import rollout_row
from vit.explain.views.dataset import DatasetAnalysis, analyze_files, write_outputs
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds

SIZE = 32  # the image's 8x8 patches of 4 px in windows of 4 (shifted by 2 in layer 1), then 4x4 in one window


def hf_window_stats(attn, layout, cell: int):
    """Distance (px) and entropy (nats) per head, ``(B, H)``, from HF's windows ``(B * nw, H, n, n)``: each slot's
    cell centre read through HF's own roll and ``window_partition`` of a coordinate map (nothing padded here)."""
    from transformers.models.swin.modeling_swin import window_partition

    gh, gw = layout.grid
    rows, cols = torch.meshgrid(torch.arange(gh) + 0.5, torch.arange(gw) + 0.5, indexing="ij")
    xy = torch.stack([rows, cols], dim=-1)[None].double() * cell  # (1, gh, gw, 2) in px
    if layout.shift:
        xy = torch.roll(xy, (-layout.shift, -layout.shift), (1, 2))
    slots = window_partition(xy, layout.window).reshape(-1, layout.window ** 2, 2)  # (nw, n, 2)
    nw = slots.shape[0]
    p = attn.double().reshape(-1, nw, *attn.shape[1:])  # (B, nw, H, n, n)
    distance = (p * torch.cdist(slots, slots)[None, :, None]).sum(-1).mean(dim=(1, 3))
    entropy = -torch.special.xlogy(p, p).sum(-1).mean(dim=(1, 3))
    return distance, entropy


@pytest.fixture(scope="module")
def swin(tmp_path_factory):
    """A tiny HF Swin saved and opened by path, and one image a class."""
    root = tmp_path_factory.mktemp("swin")
    model = _hf("swin", SIZE)
    model.save_pretrained(root / "swin")
    data = make_image_folder(root / "data", per_class=1, size=SIZE)
    return model, open_source(root / "swin"), data, [(data / "cat" / "0.png", 0), (data / "dog" / "0.png", 1)]


def test_the_dataset_analysis_of_a_swin_reads_each_layer_on_its_grid(swin, tmp_path):
    model, checkpoint, _, files = swin
    analysis = analyze_files(checkpoint, files)
    images = preprocess([open_image(p.read_bytes()) for p, _ in files], checkpoint.preprocessing)
    attentions, layouts = hf_attentions(model, images)
    assert [lay.grid for lay in layouts] == [(8, 8), (8, 8), (4, 4), (4, 4)]
    assert analysis.distance.shape == (4, 4) and analysis.readout == "average pooling"
    for layer, (attn, lay) in enumerate(zip(attentions, layouts, strict=True)):
        distance, entropy = hf_window_stats(attn, lay, 4 * 8 // lay.grid[0])
        heads = attn.shape[1]  # 2 in stage 0, 4 in stage 1
        np.testing.assert_allclose(analysis.distance[layer, :heads], distance.mean(0), rtol=1e-5)
        np.testing.assert_allclose(analysis.entropy[layer, :heads], entropy.mean(0), rtol=1e-5)
        assert np.isnan(analysis.distance[layer, heads:]).all()  # stage 0 has no heads 3 and 4
    last = attentions[-1].double().reshape(2, 4, 16, 16)  # one window: (B, H, 16, 16)
    read = np.kron(last.mean(dim=(1, 2)).reshape(2, 4, 4).numpy(), np.ones((1, 2, 2)))  # each cell over its patches
    np.testing.assert_allclose(analysis.class_attention[:2], read, atol=1e-6)  # classes 0 and 1 of 5
    for i in range(2):  # one image a class
        one = [a.reshape(2, -1, *a.shape[1:])[i] for a in attentions]
        np.testing.assert_allclose(analysis.class_rollout[i], rollout_row(one, layouts, -1, None)[0].numpy(),
                                   atol=1e-6)
    write_outputs(analysis, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "analysis.json").read_text())  # standard JSON: null, never NaN
    assert written["mean_attention_distance"][0][2] is None and written["readout"] == "average pooling"
    back = DatasetAnalysis.from_json(written)
    np.testing.assert_allclose(back.distance, analysis.distance)  # NaN where NaN
    assert "average pooling's rollout" in (tmp_path / "out" / "report.html").read_text()


def test_the_pca_of_a_swin_layer_is_of_its_own_tokens_over_the_image(swin, tmp_path):
    from vit.explain.views.dataset_pca import layer_tokens, write_pca

    model, checkpoint, data, files = swin
    image = open_image(files[0][0].read_bytes())
    x = preprocess([image], checkpoint.preprocessing)
    with torch.no_grad():
        hf = model.swin(x, output_hidden_states=True, output_hidden_states_before_downsampling=True)
    stage0 = hf.reshaped_hidden_states[1][0].flatten(1).T  # (64, 24): stage 0's output, no norm
    torch.testing.assert_close(layer_tokens(checkpoint, image, 1), stage0, atol=1e-5, rtol=0)
    torch.testing.assert_close(layer_tokens(checkpoint, image, 3), hf.last_hidden_state[0], atol=1e-5, rtol=0)
    assert write_pca(checkpoint, files, data, tmp_path, layer=4)["images"] == 2
    colours = np.load(tmp_path / "pca" / "cat" / "0.png.npz")["map"]
    assert colours.shape == (8, 8, 3) and (colours[::2, ::2] == colours[1::2, 1::2]).all()  # 4x4 cells, 2x2 each
