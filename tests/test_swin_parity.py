"""Swin and Swin V2 opened through ``vit.sources`` match their libraries: logits and every layer's attention to 1e-5
at two input sizes, shifted windows (with their mask) beside unshifted ones, a stage's grid padded to a multiple of
the window, and the patch merging between stages.

- HF: tiny random ``SwinForImageClassification`` / ``Swinv2ForImageClassification`` (eager attention), saved
  natively, opened once; each layer's per-window attention ``(B * nw, nh, w*w, w*w)``, in our order, read from
  its attention module's output (transformers 5's ``output_attentions`` keeps only each stage's last layer). HF
  fixes windows when built (V2) or keeps a shift it once turned off (V1), so it is built at each size with the
  same weights.
- timm: tiny random ``swin_*`` / ``swinv2_*`` (fused attention off) built at each size, saved with ``save_for_hf``;
  the attention read by a forward hook on ``attn_drop`` (its softmax).
"""

import pytest
import torch
from parity_helpers import assert_parity, capture_inputs, randomize

from vit.explain.methods.attention import windows_on_grid
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing transformers and timm takes seconds

# Patch 4 on 32 px: an 8x8 grid in windows of 4 (stage 0: shifted by 2 in its second block), merged to 4x4 (one
# window, unshifted). 40 px: a 10x10 grid padded to 12x12, then 5x5 padded to 8x8 (shifted again).
TINY = dict(patch_size=4, embed_dim=24, depths=[2, 2], num_heads=[2, 4], window_size=4, num_labels=5)
SIZES = (32, 40)


def _hf(kind: str, size: int, state=None):
    config_class, model_class = ((transformers.SwinConfig, transformers.SwinForImageClassification) if kind == "swin"
                                 else (transformers.Swinv2Config, transformers.Swinv2ForImageClassification))
    config = config_class(image_size=size, **TINY)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = model_class(config)
    if state is None:
        return randomize(model)
    model.load_state_dict(state)
    return model.eval()


@pytest.fixture(scope="module", params=["swin", "swinv2"])
def hf_pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    model = _hf(request.param, SIZES[0])
    model.save_pretrained(folder)
    return request.param, model, open_source(folder)


@pytest.mark.parametrize("size", SIZES)
def test_hf_swin_matches_transformers_at_two_sizes(hf_pair, size):
    kind, model, checkpoint = hf_pair
    model = _hf(kind, size, model.state_dict())  # fresh: HF V1 keeps a shift it once turned off at a small grid
    images = torch.randn(2, 3, size, size)
    out, attentions = hf_attentions(model, images)
    with torch.no_grad():
        ours = checkpoint.model.encode(images, output_attentions=True)
    assert_parity(f"{kind} | HF | {size} px", ours.logits, out.logits, ours.attentions, attentions)


def hf_attentions(model, images):
    """HF's output and every layer's attention ``(B * nw, nh, n, n)``, from each layer's attention module."""
    layers = [block.attention for stage in model.base_model.encoder.layers for block in stage.blocks]
    captured = []
    hooks = [m.register_forward_hook(lambda m, i, o: captured.append(o[1])) for m in layers]
    try:
        with torch.no_grad():
            out = model(pixel_values=images, output_attentions=True)
    finally:
        for hook in hooks:
            hook.remove()
    return out, captured


def test_a_shifted_window_placed_unshifted_would_differ(hf_pair):
    kind, model, checkpoint = hf_pair
    layouts = checkpoint.model.layer_layouts((8, 8))
    assert [(lay.grid, lay.window, lay.shift) for lay in layouts] == [((8, 8), 4, 0), ((8, 8), 4, 2), ((4, 4), 4, 0),
                                                                       ((4, 4), 4, 0)]
    _, attentions = hf_attentions(model, torch.randn(1, 3, 32, 32))
    shifted = windows_on_grid(attentions[1], (8, 8), 4, shift=2)
    unshifted = windows_on_grid(attentions[1], (8, 8), 4)
    assert torch.allclose(shifted.sum(-1), torch.ones(1, 2, 64), atol=1e-5)  # every row whole on the grid
    assert not torch.allclose(shifted, unshifted, atol=1e-3)
    # Token 0 (top-left) shares its shifted window with the far corner's tokens (cyclic), masked apart: its row is
    # zero there (exp(-100) of the mask), its mass on its own region of the window: rows and columns 0-1.
    row = shifted[0, :, 0].reshape(2, 8, 8)
    assert row[:, 2:, :].abs().max() < 1e-30 and row[:, :, 2:].abs().max() < 1e-30
    assert row[:, :2, :2].sum(dim=(1, 2)).allclose(torch.ones(2), atol=1e-4)


@pytest.mark.parametrize("kind", ["swin", "swinv2"])
def test_timm_swin_matches_timm_at_two_sizes(tmp_path, kind):
    name = "swin_tiny_patch4_window7_224" if kind == "swin" else "swinv2_tiny_window8_256"
    args = dict(embed_dim=24, depths=(2, 2), num_heads=(2, 4), window_size=4, num_classes=5)
    timm.layers.set_fused_attn(False)
    try:
        models = {}
        for size in SIZES:
            torch.manual_seed(0)
            models[size] = timm.create_model(name, pretrained=False, img_size=size, **args)
    finally:
        timm.layers.set_fused_attn(True)
    models[SIZES[0]] = randomize(models[SIZES[0]])
    models[SIZES[1]].load_state_dict(models[SIZES[0]].state_dict())
    models[SIZES[1]].eval()
    timm.models.save_for_hf(models[SIZES[0]], tmp_path / kind, model_args=dict(img_size=SIZES[0], window_size=4),
                            safe_serialization=True)
    checkpoint = open_source(tmp_path / kind)
    for size, model in models.items():
        images = torch.randn(2, 3, size, size)
        blocks = [b for layer in model.layers for b in layer.blocks]
        logits, attentions = capture_inputs([b.attn.attn_drop for b in blocks], lambda m=model, x=images: m(x))
        with torch.no_grad():
            ours = checkpoint.model.encode(images, output_attentions=True)
        assert_parity(f"{kind} | timm {name} | {size} px", ours.logits, logits, ours.attentions, attentions)


def test_swin_v2_forms_its_offsets_once_a_window_for_inference_and_gradient_passes(tmp_path):
    """Swin V2's log-spaced offsets (what its position MLP reads) are kept per window, as HF keeps them in a buffer,
    not formed in every block of every forward; kept from an inference-mode forward, a gradient pass can still read
    them (an inference tensor cannot be saved for backward)."""
    from vit.model.stages import swinv2_coords

    _hf("swinv2", SIZES[0]).save_pretrained(tmp_path)
    model = open_source(tmp_path).model
    swinv2_coords.cache_clear()
    images = torch.randn(1, 3, SIZES[0], SIZES[0])
    with torch.inference_mode():
        model(images)
    assert swinv2_coords.cache_info().misses == 1  # 4x4 windows in both stages, four blocks
    images.requires_grad_(True)
    model(images)[0][0, 0].backward()
    assert swinv2_coords.cache_info().misses == 1 and images.grad.abs().sum() > 0
