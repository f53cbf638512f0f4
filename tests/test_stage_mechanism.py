"""Ablation and patching on models with stages (Swin, Hiera) equal HF's own models edited by hooks on HF's modules.

- HF ``SwinForImageClassification`` at 40 px (a 10x10 grid in windows of 4, padded to 12 and shifted by 2 in every
  second block; then 5x5, padded to 8 and shifted) and ``HieraForImageClassification`` (mask units, pooled
  queries, a global stage), random weights with noise on every parameter, saved natively, opened by path.
- A head is ablated in HF by a pre-hook on its attention's output projection (Swin's ``o_proj``, Hiera's ``proj``),
  whose input holds every head's context, head-major: its slice is zeroed, replaced by its mean over reference
  images taken per position in HF's own token order (Swin's shifted windows, Hiera's unrolled order), or by the
  clean image's (head patching). HF's order is not ours, so these references place nothing by our code.
- A layer's input is patched in HF by a pre-hook on the module that receives it (Swin: the block, or the previous
  stage's ``downsample`` where our block opens with the merge; Hiera: the layer), one copy per position in the
  batch; Hiera's positions are found by running HF's own ``unroll`` on the token indices (``stage_tokens``).
"""

import pytest
import torch
from parity_helpers import randomize
from test_hiera_parity import library_unroll, save_hf_hiera, stage_tokens

from vit.explain.mechanism import components as mechanism
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds

SWIN_SIZE, HIERA_SIZE = 40, 32


class Family:
    """An HF model with stages and, per layer of ours, the HF module that projects its heads' contexts, the module
    (and argument) that receives its input, and the HF position of each token of that input's grid."""

    def __init__(self, reference, ours, size, projections, inputs, positions):
        self.reference, self.ours, self.size = reference, ours, size
        self.projections, self.inputs, self.positions = projections, inputs, positions

    def images(self, n: int, seed: int) -> torch.Tensor:
        return torch.randn(n, 3, self.size, self.size, generator=torch.Generator().manual_seed(seed))

    def run(self, images, edits=()) -> torch.Tensor:
        """HF's logits with ``edits`` ``(module, edit(tensor) -> tensor)`` on each module's first input."""
        def hook(edit):
            def pre(module, args, kwargs):
                if args:
                    return (edit(args[0]), *args[1:]), kwargs
                name = next(iter(kwargs))
                return args, {**kwargs, name: edit(kwargs[name])}
            return pre
        handles = [m.register_forward_pre_hook(hook(e), with_kwargs=True) for m, e in edits]
        try:
            with torch.no_grad():
                return self.reference(pixel_values=images).logits
        finally:
            for h in handles:
                h.remove()

    def seen(self, modules, images) -> list[torch.Tensor]:
        """The first input each of ``modules`` receives on ``images``."""
        seen = []
        self.run(images, [(m, lambda x: (seen.append(x), x)[1]) for m in modules])
        return seen

    def heads(self, layer: int) -> tuple[int, int]:
        attn = self.ours.blocks[layer].attn
        return attn.num_heads, attn.head_dim


def _slice(head: int, hd: int, value):
    """An edit that puts ``value(x)``'s slice of ``head`` into the projection's input ``x`` (channels head-major)."""
    def edit(x):
        x = x.clone()
        x[..., head * hd:(head + 1) * hd] = value(x)[..., head * hd:(head + 1) * hd]
        return x
    return edit


@pytest.fixture(scope="module")
def swin(tmp_path_factory):
    config = transformers.SwinConfig(image_size=SWIN_SIZE, patch_size=4, embed_dim=24, depths=[2, 2],
                                     num_heads=[2, 4], window_size=4, num_labels=3)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    reference = randomize(transformers.SwinForImageClassification(config))
    folder = tmp_path_factory.mktemp("swin")
    reference.save_pretrained(folder)
    stages = reference.swin.encoder.layers
    blocks = [b for stage in stages for b in stage.blocks]
    inputs = [blocks[0], blocks[1], stages[0].downsample, blocks[3]]  # our block 2 opens with the merge
    grids = [100, 100, 100, 25]
    return Family(reference, open_source(folder).model, SWIN_SIZE, [b.attention.o_proj for b in blocks], inputs,
                  [torch.arange(t) for t in grids])


@pytest.fixture(scope="module")
def hiera(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hiera")
    reference = save_hf_hiera(folder, HIERA_SIZE)
    ours = open_source(folder).model
    layers = [layer for stage in reference.hiera.encoder.stages for layer in stage.layers]
    c = ours.config
    orders = stage_tokens(lambda x: library_unroll(x, (8, 8), c), (8, 8), c.num_stages)  # HF position -> token
    stage_in = [0] + [c.stage_of(layer) for layer in range(len(layers) - 1)]  # the grid each layer receives
    positions = [orders[s].argsort() for s in stage_in]  # token -> HF position
    return Family(reference, ours, HIERA_SIZE, [layer.attn.proj for layer in layers], layers, positions)


FAMILIES = ["swin", "hiera"]


def hf_means(family: Family, references: torch.Tensor) -> list[torch.Tensor]:
    """Each projection's input averaged over ``references`` per position in HF's own order (a window's slot, or
    an unrolled token): ``(nw, n, C)`` or ``(T, C)``."""
    R = references.shape[0]
    return [x.view(R, -1, *x.shape[1:]).mean(0) for x in family.seen(family.projections, references)]


def _mean_of(mean):
    """The per-position mean for every image of the projection's input ``x`` (HF puts images first)."""
    return lambda x: mean.expand(x.numel() // mean.numel(), *mean.shape).reshape(x.shape)


@pytest.mark.parametrize("name", FAMILIES)
def test_mean_ablating_heads_in_two_stages_equals_hf_with_hfs_per_position_means_put_in(request, name):
    family = request.getfixturevalue(name)
    x, references = family.images(2, 1), family.images(3, 2)
    heads = [(1, 1), (3, 2)]  # a shifted (Swin) / pooled-window (Hiera) layer of stage 0-1, one of the last stage
    means = hf_means(family, references)
    expected = family.run(x, [(family.projections[layer], _slice(head, family.heads(layer)[1], _mean_of(means[layer])))
                              for layer, head in heads])
    ours_means = mechanism.mean_contexts(family.ours, references)
    assert [m.shape[1] for m in ours_means] == [family.heads(layer)[0] for layer in range(len(ours_means))]
    with torch.no_grad():
        logits, _ = mechanism.ablate_heads(family.ours, x, heads, "mean", ours_means)
        copied = mechanism.ablated_copy(family.ours, heads, "mean", ours_means)(x)[0]
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(copied, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(mechanism.MechanismError, match="one per layer"):
        mechanism.ablate_heads(family.ours, x, heads, "mean", ours_means[:-1])


@pytest.mark.parametrize("mode", ["zero", "mean"])
@pytest.mark.parametrize("name", FAMILIES)
def test_each_heads_effect_equals_hf_with_that_head_alone_ablated(request, name, mode):
    family = request.getfixturevalue(name)
    x, references = family.images(2, 3), family.images(3, 4)
    classes = torch.tensor([0, 2])
    means = hf_means(family, references)
    base = family.run(x).gather(1, classes[:, None])[:, 0]
    ours_means = mechanism.mean_contexts(family.ours, references) if mode == "mean" else None
    with torch.no_grad():
        grid = mechanism.ablation_grid(family.ours, x, classes, mode, ours_means, chunk=3)  # (B, L, H_max)
    L = len(family.projections)
    assert grid.shape == (2, L, max(family.heads(layer)[0] for layer in range(L)))
    for layer in range(L):
        H, hd = family.heads(layer)
        assert grid[:, layer, H:].isnan().all()  # heads this layer's stage lacks
        for head in range(H):
            value = (lambda t: torch.zeros_like(t)) if mode == "zero" else _mean_of(means[layer])
            logits = family.run(x, [(family.projections[layer], _slice(head, hd, value))])
            expected = logits.gather(1, classes[:, None])[:, 0] - base
            torch.testing.assert_close(grid[:, layer, head], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_patching_each_head_equals_hf_with_the_clean_images_slice_put_in(request, name):
    family = request.getfixturevalue(name)
    clean, corrupted = family.images(1, 5), family.images(1, 6)
    a, b = int(family.run(clean).argmax()), int(family.run(corrupted).argmax())
    contexts = family.seen(family.projections, clean)
    with torch.no_grad():
        patched = mechanism.patch_heads(family.ours, clean, corrupted, a, b, chunk=2)
    for layer, context in enumerate(contexts):
        H, hd = family.heads(layer)
        for head in range(H):
            logits = family.run(corrupted, [(family.projections[layer],
                                             _slice(head, hd, lambda t, c=context: c))])[0]
            torch.testing.assert_close(patched.patched[0, layer, head], logits[a] - logits[b], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_patching_each_layer_inputs_tokens_equals_hf_with_that_position_patched(request, name):
    family = request.getfixturevalue(name)
    clean, corrupted = family.images(1, 7), family.images(1, 8)
    with torch.no_grad():
        patched = mechanism.patch_residuals(family.ours, clean, corrupted, 0, 1)  # (1, L, T_max)
    states = family.seen(family.inputs, clean)
    for layer, (module, positions) in enumerate(zip(family.inputs, family.positions, strict=True)):
        T = len(positions)
        assert states[layer].shape[1] == T and patched.patched[0, layer, T:].isnan().all()

        def put(x, clean_state=states[layer], positions=positions):  # copy j: token j of our grid, HF's position
            x = x.clone()
            x[torch.arange(len(positions)), positions] = clean_state[0, positions]
            return x

        logits = family.run(corrupted.expand(T, -1, -1, -1), [(module, put)])
        torch.testing.assert_close(patched.patched[0, layer, :T], logits[:, 0] - logits[:, 1], rtol=1e-5, atol=1e-5)
