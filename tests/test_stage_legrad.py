"""LeGrad on models with stages (Swin, Swin V2, Hiera) against the same quantities taken with autograd on HF's own
modules, with none of our code in the reference.

The formula (WalBouss/LeGrad ``compute_legrad_clip``, whose read-out is ``ln_post`` of the mean token, applied to
each explained layer's output): for each layer ``l`` of the last stage from ``start_layer`` on, ``s_l`` = the class
logit of HF's own final layernorm, pooler and classifier applied to layer ``l``'s output; ``g_l = ds_l / dA_l`` for
the attention probabilities HF's layer returns (per window; Hiera's pooled queries against the previous stage's
keys), read by a forward hook. ``g_l`` is placed on the grids by the library's own window order (HF's
``maybe_pad``, the roll by its ``shift_size`` and ``window_partition`` run on token indices; Hiera's ``unroll``),
Swin's shift-mask pairs (HF's ``get_attn_mask`` != 0) dropped; the layer's map is ``relu(g_l)`` averaged over heads,
summed over query rows and divided by the layer's query count, on its keys' grid; each map is upsampled
bilinearly by its cell's side in patches (``F.interpolate(scale_factor=...)``, as the authors upsample by the patch
size), cropped to the patch grid, and the maps are summed.
"""

import pytest
import torch
import torch.nn.functional as F
from parity_helpers import randomize
from test_hiera_parity import library_dense, save_hf_hiera, stage_tokens

from vit.explain.methods.relevance import legrad, legrad_layers
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds

# A 10x10 grid in windows of 4: the last stage's 5x5 grid padded to 8x8, its second block shifted by 2 (every pair
# the shift mask separates then holds a padding token); at 64 px the last stage's 8x8 grid is shifted unpadded, so
# its shift mask separates real tokens.
SIZE = 40
TINY = dict(image_size=SIZE, patch_size=4, embed_dim=24, depths=[2, 2], num_heads=[2, 4], window_size=4,
            num_labels=5)


@pytest.fixture(scope="module", params=["swin", "swinv2"])
def hf_swin(request, tmp_path_factory):
    kind = request.param
    config = (transformers.SwinConfig if kind == "swin" else transformers.Swinv2Config)(**TINY)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model_class = (transformers.SwinForImageClassification if kind == "swin"
                   else transformers.Swinv2ForImageClassification)
    model = randomize(model_class(config))
    folder = tmp_path_factory.mktemp(kind)
    model.save_pretrained(folder)
    return kind, model, open_source(folder).model


def hf_last_stage(model, layers, read_out, images):
    """Each of ``layers``' output and attention probabilities (in the graph), and ``read_out`` (HF's own final
    norm / pooler / classifier) applied to each output: ``[(output, probs, logits)]``."""
    captured, hooks = [], [layer.register_forward_hook(lambda m, i, o: captured.append((o[0], o[1])))
                           for layer in layers]
    try:
        model(pixel_values=images, output_attentions=True)
    finally:
        for hook in hooks:
            hook.remove()
    return [(out, probs, read_out(out)) for (out, probs) in captured]


def swin_layer_map(block, grad, grid, shifted=True):
    """One Swin layer's LeGrad map ``(B, gh, gw)`` from HF's per-window gradient, placed as HF cuts the windows."""
    partition = (transformers.models.swin.modeling_swin.window_partition if hasattr(block, "cyclic_shift")
                 else transformers.models.swinv2.modeling_swinv2.window_partition)
    T, w, s = grid[0] * grid[1], block.window_size, block.shift_size
    ids, _ = block.maybe_pad(torch.arange(T, dtype=torch.float32).view(1, *grid, 1) + 1, *grid)  # padding: 0
    shift = s if shifted else 0
    slots = partition(torch.roll(ids, (-shift, -shift), (1, 2)), w).reshape(-1, w * w).long() - 1  # (nw, n); -1 pad
    mask = block.get_attn_mask(ids.shape[1], ids.shape[2], dtype=torch.float32, device=grad.device)
    allowed = torch.ones(slots.shape[0], w * w, w * w) if mask is None else (mask == 0).float()
    nw, H = slots.shape[0], grad.shape[1]
    positive = grad.clamp(min=0).view(-1, nw, H, w * w, w * w) * allowed[None, :, None]
    dense = torch.zeros(positive.shape[0], H, T, T)
    for win, tokens in enumerate(slots):
        real = (tokens >= 0).nonzero()[:, 0]
        dense[:, :, tokens[real][:, None], tokens[real][None, :]] = positive[:, win][:, :, real][:, :, :, real]
    return (dense.mean(dim=1).sum(dim=1) / T).view(-1, *grid)  # heads, then the query rows


def summed(maps, grid):
    """Each layer's map upsampled bilinearly by its cell's side in patches, cropped to ``grid``, summed."""
    total = 0
    for m in maps:
        factor = -(-grid[0] // m.shape[-2])
        up = F.interpolate(m[:, None], scale_factor=factor, mode="bilinear", align_corners=False)[:, 0]
        total = total + up[:, :grid[0], :grid[1]]
    return total


def swin_reference(kind, model, images, classes, start, shifted=True):
    grid = last = (images.shape[-2] // 4, images.shape[-1] // 4)
    for _ in model.config.depths[1:]:  # each merge halves the grid, padding an odd side
        last = (-(-last[0] // 2), -(-last[1] // 2))
    base = model.swin if kind == "swin" else model.swinv2
    blocks = list(base.encoder.layers[-1].blocks)

    def read_out(out):
        return model.classifier(base.pooler(base.layernorm(out).transpose(1, 2)).flatten(1))

    maps = []
    layers = list(zip(blocks, hf_last_stage(model, blocks, read_out, images), strict=True))
    for block, (_, probs, logits) in layers[start:]:
        score = logits.gather(1, classes[:, None]).sum()
        [grad] = torch.autograd.grad(score, probs, retain_graph=True)
        maps.append(swin_layer_map(block, grad, last, shifted))
    return summed(maps, grid)


def assert_maps_close(ours, expected):
    assert ours.shape == expected.shape
    scale = expected.abs().max()
    assert scale > 0
    torch.testing.assert_close(ours / scale, expected / scale, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("size", "start_layer"), [(40, -2), (40, -1), (64, -2)])
def test_legrad_on_swin_equals_autograd_on_hfs_windows_through_a_shifted_layer(hf_swin, size, start_layer):
    kind, model, ours = hf_swin
    images = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    classes = torch.tensor([1, 3])
    layout = ours.layer_layouts((size // 4, size // 4))[3]
    assert (layout.window, layout.shift) == (4, 2)
    expected = swin_reference(kind, model, images, classes, start_layer)
    assert_maps_close(legrad(ours, images, classes, start_layer=start_layer), expected)


def test_swin_legrad_reference_fails_when_the_shifted_windows_are_placed_unshifted(hf_swin):
    kind, model, ours = hf_swin
    images = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    classes = torch.tensor([1, 3])
    wrong = swin_reference(kind, model, images, classes, -1, shifted=False)
    right = legrad(ours, images, classes, start_layer=-1)
    assert (right - wrong).abs().max() > 0.05 * right.abs().max()


def test_legrad_before_the_last_stage_is_refused_in_one_line(hf_swin):
    _, _, ours = hf_swin
    with pytest.raises(ValueError, match="last stage \\(layers 2 to 3\\); choose start_layer from -2") as error:
        legrad(ours, torch.randn(1, 3, SIZE, SIZE), 0, start_layer=1)
    assert "\n" not in str(error.value)


def test_stage_legrad_of_a_batch_is_each_images_own_for_its_predicted_class(hf_swin):
    _, _, ours = hf_swin
    images = torch.randn(3, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        predicted = ours(images)[0].argmax(-1)
    maps = legrad(ours, images)
    torch.testing.assert_close(maps, legrad(ours, images, predicted))
    torch.testing.assert_close(maps[1:2], legrad(ours, images[1:2], int(predicted[1])), rtol=1e-5, atol=1e-8)


HIERA_SIZE = 64  # a 16x16 grid in 4x4 mask units; 8x8; 4x4 (global), whose first layer pools the 8x8 queries


def test_legrad_on_hiera_equals_autograd_on_hfs_pooled_and_global_layers(tmp_path):
    from transformers.models.hiera.modeling_hiera import unroll

    model = save_hf_hiera(tmp_path, HIERA_SIZE)
    ours = open_source(tmp_path).model
    images = torch.randn(2, 3, HIERA_SIZE, HIERA_SIZE, generator=torch.Generator().manual_seed(2))
    classes = torch.tensor([4, 0])
    grid = (HIERA_SIZE // 4,) * 2
    orders = stage_tokens(lambda x: unroll(x, (HIERA_SIZE, HIERA_SIZE), [4, 4], [[2, 2]] * 2), grid, 3)
    layers = list(model.hiera.encoder.stages[-1].layers)  # layers 3 (pooled queries) and 4
    maps = []
    read_out = lambda out: model.classifier(model.hiera.pooler(out))  # noqa: E731
    for i, (_, probs, logits) in enumerate(hf_last_stage(model, layers, read_out, images)):
        score = logits.gather(1, classes[:, None]).sum()
        [grad] = torch.autograd.grad(score, probs, retain_graph=True)
        dense = library_dense(grad.clamp(min=0), orders[2], orders[1 if i == 0 else 2])  # (B, H, Tq, Tk)
        side = int(dense.shape[-1] ** 0.5)
        maps.append((dense.mean(dim=1).sum(dim=1) / dense.shape[-2]).view(-1, side, side))
    assert [m.shape[-1] for m in maps] == [8, 4]
    assert_maps_close(legrad(ours, images, classes), summed(maps, grid))


def test_the_explorer_offers_legrad_the_last_stages_layers_and_draws_from_the_one_chosen(hf_swin, tmp_path):
    from PIL import Image

    from vit.core.inference import TRAINING_SIZE, preprocess
    from vit.explain.views import method_maps

    _, _, ours = hf_swin
    folder = tmp_path / "swin"
    hf_swin[1].save_pretrained(folder)
    checkpoint = open_source(folder)
    image = Image.new("RGB", (SIZE, SIZE), (90, 40, 200))
    assert legrad_layers(checkpoint.model) == range(2, 4)  # stage 2's two blocks: what "From layer" offers
    got = method_maps.model_method_map(checkpoint, image, "legrad", class_index=1, start_layer=-1)
    x = preprocess([image], checkpoint.preprocessing, TRAINING_SIZE, ours.config.patch_size)
    torch.testing.assert_close(torch.from_numpy(got), legrad(checkpoint.model, x, 1, start_layer=-1)[0])
    assert not torch.allclose(torch.from_numpy(got), legrad(checkpoint.model, x, 1)[0])  # not the default's two
