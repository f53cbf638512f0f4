"""LeGrad of a SAM mask (issue 81, item 4): ``vit.segment(..., methods=["legrad"])`` equals LeGrad computed by autograd
on transformers' whole ``SamModel``: at each of the image encoder's last two layers (``SamVisionLayer``), the
library's own neck and mask decoder read that layer's output (as the authors' ``compute_legrad_clip`` reads CLIP's
``ln_post`` at each layer), the gradient of the mask's logits (summed over the last layer's mask, or at the cell
under the point) with respect to the layer's attention weights (what ``SamVisionAttention`` returns, post-softmax)
is clamped at 0, summed over heads and queries, each window's keys put back on the grid by the library's own
``window_unpartition`` (its padding cut), divided by heads x tokens and summed over the layers.

The model is ``test_sam_prompts``' tiny SAM: a 7 x 7 grid, layer 1 global, layer 2 in 3 x 3 windows over the grid
padded to 9 x 9, so both kinds of layer and the padding are read. SAM 2's neck reads every stage at once: refused in
one line.

Reference: Bousselham et al. 2024, WalBouss/LeGrad ``legrad/wrapper.py`` (``compute_legrad_clip``).
"""

import numpy as np
import pytest
import torch
from test_sam_attnlrp_lxt import RTOL, distance, image  # noqa: F401 (a fixture)
from test_sam_prompts import PROMPTS, _sam, _sam2, library_inputs

import vit

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds


@pytest.fixture(scope="module")
def sam(tmp_path_factory):
    """(the library's SamModel, its processor, our checkpoint) of a tiny model saved whole."""
    model, processor = _sam()
    folder = tmp_path_factory.mktemp("sam") / "model"
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return model, processor, vit.load(folder, device="cpu")


def library_legrad(model, processor, picture, prompt, mask: int, at) -> torch.Tensor:
    """LeGrad of mask ``mask`` by autograd on transformers' whole ``model``: ``(gh, gw)``."""
    inputs = library_inputs(processor, picture, **prompt)
    prompts = {k: inputs[k] for k in ("input_points", "input_labels", "input_boxes") if k in inputs}
    encoder = model.vision_encoder
    layers = len(encoder.layers)
    weights, handles = {}, []
    for i in (layers - 2, layers - 1):
        handles.append(encoder.layers[i].attn.register_forward_hook(
            lambda module, args, out, i=i: weights.__setitem__(i, out[1])))
    try:
        with torch.enable_grad():
            states = encoder.patch_embed(inputs["pixel_values"]) + encoder.pos_embed  # (1, gh, gw, C)
            outputs = []
            for layer in encoder.layers:
                states = layer(states)
                outputs.append(states)
    finally:
        for handle in handles:
            handle.remove()
    _, gh, gw, _ = states.shape
    heads, tokens = encoder.layers[-1].attn.num_attention_heads, gh * gw
    region, total = None, torch.zeros(gh, gw, dtype=torch.float64)
    for i in (layers - 1, layers - 2):  # the last first: its mask is the region read at both
        with torch.enable_grad():
            logits = model(image_embeddings=encoder.neck(outputs[i]), multimask_output=True,
                           **prompts).pred_masks[0, 0, mask]
            if at is not None:
                x, y = inputs["input_points"][0, 0, 0].tolist()
                h, w = logits.shape
                score = logits[int(y * h / inputs["pixel_values"].shape[2]),
                               int(x * w / inputs["pixel_values"].shape[3])]
            else:
                region = logits.detach() > 0 if region is None else region
                score = logits[region].sum()
            [grad] = torch.autograd.grad(score, weights[i], retain_graph=True)
        layer = encoder.layers[i]
        keys = grad.clamp(min=0).sum(dim=1).double()  # (windows * heads, keys): the queries summed
        if layer.window_size:
            size = layer.window_size
            _, padding = layer.window_partition(torch.zeros(1, gh, gw, 1), size)
            keys = keys.reshape(-1, heads, size, size).sum(1)[..., None]  # (windows, size, size, 1): heads summed
            total += layer.window_unpartition(keys, size, padding, (gh, gw))[0, ..., 0]
        else:
            total += keys.reshape(heads, gh, gw).sum(0)
    return (total / (heads * tokens)).float()


@pytest.mark.parametrize("at", [None, (52, 30)])
def test_legrad_of_a_mask_equals_autograd_on_the_librarys_sam(sam, image, at):  # noqa: F811
    model, processor, checkpoint = sam
    prompt = PROMPTS["mixed"]
    ours = vit.segment(checkpoint, image, **prompt, mask=1, methods=["legrad"], at=at)
    theirs = library_legrad(model, processor, image, prompt, 1, at)
    assert distance(ours.patch_maps["legrad"], theirs) <= RTOL
    # on the pixels: each patch's value on its 8 x 8 pixels
    np.testing.assert_array_equal(ours.maps["legrad"], np.kron(ours.patch_maps["legrad"], np.ones((8, 8))))


def test_legrad_read_at_the_last_layer_alone_is_not_the_two_layers(sam, image, monkeypatch):  # noqa: F811
    # what the test above tells apart: both layers are read, each through the neck and the decoder
    from vit.explain.methods import segment

    model, processor, checkpoint = sam
    prompt = PROMPTS["mixed"]
    monkeypatch.setattr(segment, "LEGRAD_START", -1)
    monkeypatch.setattr(segment.legrad, "__defaults__", (None, -1))
    ours = vit.segment(checkpoint, image, **prompt, mask=1, methods=["legrad"])
    assert distance(ours.patch_maps["legrad"], library_legrad(model, processor, image, prompt, 1, None)) > 1e-2


def test_legrad_of_a_sam_2_mask_is_refused_in_one_line(tmp_path, image):  # noqa: F811
    from vit.explain.methods.segment import PromptError

    model, processor = _sam2()
    model.save_pretrained(tmp_path / "model")
    processor.save_pretrained(tmp_path / "model")
    with pytest.raises(PromptError, match="SAM 2's neck reads every Hiera stage") as error:
        vit.segment(vit.load(tmp_path / "model", device="cpu"), image, points=[(30, 20)], methods=["legrad"])
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("method", ["attnlrp", "legrad"])
def test_a_mask_map_over_the_memory_limit_is_refused_before_any_work(sam, image, monkeypatch, method):  # noqa: F811
    from vit.costs.bounds import TooManyTokens
    from vit.explain.methods import segment

    _, _, checkpoint = sam
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.01")
    ran = []
    monkeypatch.setattr(segment, method, lambda *args: ran.append(args))
    with pytest.raises(TooManyTokens, match="limit") as error:
        vit.segment(checkpoint, image, points=[(10, 10)], methods=[method])
    assert not ran and "\n" not in str(error.value)
