"""Windows a model's own code folds into the batch, joined again by its global layers (issue 117 item 6,
``vit.sources.library_road.placing.partitions``): LW-DETR's ViT backbone and RF-DETR's DINOv2 open in hand and from
their folders, every layer's attention equal to transformers' own eager attention (``output_attentions`` of the model
built with ``attn_implementation="eager"``), placed on the grid.

The expected placement is written here from the modelling files' reshapes (LW-DETR: windows of ``grid /
num_windows_side`` row-major, each window's patches row-major; RF-DETR: the same, each window led by its own copy of
the CLS token, which is prefix token ``k`` of window ``k``); a global layer's tokens are the windows joined in that
order. LW-DETR runs at a non-square 4x6 grid, so a transposed placement fails; RF-DETR's test checks it too."""

from __future__ import annotations

import copy

import pytest
import torch
from layer_reference import widened

import vit

transformers = pytest.importorskip("transformers")

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.3, 0.4)


def _widen(model: torch.nn.Module) -> torch.nn.Module:
    return widened(model, matrices_only=True).eval()  # weights wide enough that every row differs from uniform


def _eager(cls, config, state):
    """The same weights built with transformers' eager attention, whose ``output_attentions`` are the reference: from
    a copy of ``config`` (``_from_config`` sets the implementation on the config it is given, which would switch the
    model under test, built from it, to eager too: it keeps its SDPA)."""
    model = cls._from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    model.load_state_dict(state)
    return model


def _window_tokens(grid, side):
    """``(side * side, wh * ww)``: the grid token (row-major) each window slot holds, windows and slots row-major."""
    gh, gw = grid
    wh, ww = gh // side, gw // side
    return torch.tensor([[(a * wh + i) * gw + b * ww + j for i in range(wh) for j in range(ww)]
                         for a in range(side) for b in range(side)])


def _placed(attention, tokens, total):
    """A layer's ``(pieces, H, n, n)`` placed at ``tokens`` ``(pieces, n)`` of ``total`` tokens, zero elsewhere."""
    out = attention.new_zeros(1, attention.shape[1], total, total)
    for piece, where in enumerate(tokens):
        out[0][:, where[:, None], where[None, :]] = attention[piece]
    return out


def _transposed(tokens, grid, prefix):
    """``tokens`` with each patch moved to its transpose's place (prefix tokens kept)."""
    gh, gw = grid
    patch = tokens - prefix
    moved = (patch % gw) * gh + patch // gw + prefix
    return torch.where(tokens < prefix, tokens, moved)


@pytest.fixture(scope="module")
def lw_detr():
    config = transformers.LwDetrViTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                                          pretrain_image_size=32, patch_size=8, num_windows=4,
                                          window_block_indices=[0], out_indices=[2])
    torch.manual_seed(0)
    model = _widen(transformers.LwDetrViTBackbone(config))
    return model, _eager(transformers.LwDetrViTBackbone, config, model.state_dict())


@pytest.fixture(scope="module")
def rf_detr():
    config = transformers.RfDetrDinov2Config(hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                                             intermediate_size=32, image_size=32, patch_size=8, num_windows=2,
                                             out_indices=[1, 3])
    torch.manual_seed(0)
    model = _widen(transformers.RfDetrDinov2Backbone(config))
    return model, _eager(transformers.RfDetrDinov2Backbone, config, model.state_dict())


def test_lw_detrs_windowed_and_global_layers_are_its_own_eager_attention_on_the_grid(lw_detr):
    model, eager = lw_detr
    checkpoint = vit.load(model, image_size=(32, 48), mean=MEAN, std=STD)
    wrapped = checkpoint.model
    assert wrapped.forms_asked_rows and eager.config._attn_implementation == "eager"  # SDPA under test, eager beside
    assert wrapped.layout.grid == (4, 6) and wrapped.layout.num_prefix_tokens == 0
    x = torch.randn(1, 3, 32, 48, generator=torch.Generator().manual_seed(1))
    _, kept = wrapped.run(x, layers=range(2))
    with torch.no_grad():
        own = eager(pixel_values=x, output_attentions=True).attentions
    assert own[0].shape == (4, 2, 6, 6) and own[1].shape == (1, 2, 24, 24)  # 2x2 windows of 2x3, then all joined
    windows = _window_tokens((4, 6), 2)
    for layer, tokens in enumerate((windows, windows.reshape(1, -1))):
        torch.testing.assert_close(kept[layer], _placed(own[layer], tokens, 24), atol=1e-5, rtol=0)
        assert not torch.allclose(kept[layer], _placed(own[layer], _transposed(tokens, (4, 6), 0), 24), atol=1e-3)


def test_windows_every_layer_joins_are_placed_in_the_order_the_forward_keeps_them(tmp_path):
    """LW-DETR with no windowed layer still cuts its grid into windows before its encoder, and every (global) layer
    attends over the windows joined, in window order: a row-major layout would draw every map on the wrong patches.
    In hand and from its folder (the library road refuses it; its backbone opens on the recorder's road), every
    layer equals the eager attention placed in window order, and differs from the row-major reading of it."""
    config = transformers.LwDetrViTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                                          pretrain_image_size=32, patch_size=8, num_windows=4,
                                          window_block_indices=[], out_indices=[2])
    torch.manual_seed(0)
    model = _widen(transformers.LwDetrViTBackbone(config))
    eager = _eager(transformers.LwDetrViTBackbone, config, model.state_dict())
    assert model.config._attn_implementation == "sdpa"  # the model under test keeps SDPA; only the reference is eager
    model.save_pretrained(tmp_path)
    transformers.ViTImageProcessor(size={"height": 32, "width": 48}, image_mean=MEAN, image_std=STD).save_pretrained(
        tmp_path)
    x = torch.randn(1, 3, 32, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        own = eager(pixel_values=x, output_attentions=True).attentions
    assert own[0].shape == (1, 2, 24, 24)
    windows = _window_tokens((4, 6), 2).reshape(1, -1)
    for checkpoint in (vit.load(model, image_size=(32, 48), mean=MEAN, std=STD), vit.load(tmp_path, device="cpu")):
        wrapped = checkpoint.model
        assert wrapped.layout.grid == (4, 6)
        _, kept = wrapped.run(x, layers=range(2))
        for layer in range(2):
            torch.testing.assert_close(kept[layer], _placed(own[layer], windows, 24), atol=1e-5, rtol=0)
            assert not torch.allclose(kept[layer], own[layer], atol=1e-3)  # the row-major reading


def test_rf_detrs_windows_each_with_its_cls_copy_are_its_own_eager_attention(rf_detr):
    model, eager = rf_detr
    checkpoint = vit.load(model, image_size=32, mean=MEAN, std=STD)
    wrapped = checkpoint.model
    assert wrapped.forms_asked_rows and eager.config._attn_implementation == "eager"  # SDPA under test, eager beside
    layout = wrapped.layout
    assert layout.grid == (4, 4) and layout.num_prefix_tokens == 4  # window k's copy of the CLS token: token k
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    _, kept = wrapped.run(x, layers=range(3))
    with torch.no_grad():
        own = eager(pixel_values=x, output_attentions=True).attentions
    assert [tuple(a.shape) for a in own] == [(4, 2, 5, 5), (1, 2, 20, 20), (4, 2, 5, 5)]  # layer 1 global
    windows = torch.cat([torch.arange(4)[:, None], _window_tokens((4, 4), 2) + 4], dim=1)  # (4, 1 + 4)
    for layer in range(3):
        tokens = windows if own[layer].shape[0] == 4 else windows.reshape(1, -1)
        torch.testing.assert_close(kept[layer], _placed(own[layer], tokens, 20), atol=1e-5, rtol=0)
        assert not torch.allclose(kept[layer], _placed(own[layer], _transposed(tokens, (4, 4), 4), 20), atol=1e-3)


def test_asked_rows_are_read_from_their_own_window_never_the_whole_grid(rf_detr, monkeypatch):
    """Issue 117's speed item: a query's row of a windowed layer (and of the global layer that joins the windows) is
    read from its own window, no layer's whole ``T x T`` placed on the grid, and equals the model's eager row."""
    from rows_formed import spy_formed

    from vit.sources.library_road import library_model

    model, eager = rf_detr
    wrapped = vit.load(model, image_size=32, mean=MEAN, std=STD).model
    assert wrapped.forms_asked_rows  # over SDPA
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))

    def dense(*args):
        raise AssertionError("a layer's whole attention was placed on the grid for one row")

    monkeypatch.setattr(library_model, "layer_on_grid", dense)
    rows = [0, 4 + 6, 4 + 15]  # window 0's CLS copy, the patch at (1, 2), the last patch
    formed = spy_formed(monkeypatch)
    _, kept = wrapped.run(x, layers=range(3), rows=rows)
    # the windowed layers' four windows of 5 whole (each row read from its own), the global layer's 3 rows alone
    assert formed == [(5, 5), (3, 20), (5, 5)]
    with torch.no_grad():
        own = eager(pixel_values=x, output_attentions=True).attentions
    windows = torch.cat([torch.arange(4)[:, None], _window_tokens((4, 4), 2) + 4], dim=1)  # (4, 1 + 4)
    for layer in range(3):
        tokens = windows if own[layer].shape[0] == 4 else windows.reshape(1, -1)
        assert kept[layer].shape == (1, 2, 3, 20)
        torch.testing.assert_close(kept[layer], _placed(own[layer], tokens, 20)[:, :, rows], atol=1e-5, rtol=0)


def test_a_windowed_backbones_features_are_its_tokens_in_grid_order(lw_detr):
    model, _ = lw_detr
    wrapped = vit.load(model, image_size=(32, 48), mean=MEAN, std=STD).model
    x = torch.randn(1, 3, 32, 48, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        features = wrapped(x)  # its last hidden tokens (1, 24, D), in the layout's order
        own = model(pixel_values=x).feature_maps[-1]  # (1, D, 4, 6): the model's own unpartitioned map
    torch.testing.assert_close(features, own.flatten(2).transpose(1, 2), atol=1e-5, rtol=0)


def test_a_partition_is_read_from_the_models_own_forward_not_its_counts(lw_detr):
    from vit.sources.library_road.placing import patch_codes

    model, _ = lw_detr
    block = patch_codes.first_block("encoder.layer.0.attention", dict(model.named_modules()))
    codes = patch_codes.read_pieces(model, block, (32, 48), 3)
    torch.testing.assert_close(codes, _window_tokens((4, 6), 2) + 1)  # patch p's code is p + 1


def test_windowed_folders_open_and_draw(tmp_path, lw_detr, rf_detr):
    from PIL import Image

    image = Image.fromarray((torch.rand(32, 32, 3, generator=torch.Generator().manual_seed(2)) * 255).byte().numpy())
    for name, (model, _) in (("lw", lw_detr), ("rf", rf_detr)):
        model.save_pretrained(tmp_path / name)
        transformers.ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=list(MEAN),
                                       image_std=list(STD)).save_pretrained(tmp_path / name)
        checkpoint = vit.load(tmp_path / name, device="cpu")
        assert checkpoint.road == "library"
        assert bool(torch.isfinite(torch.as_tensor(vit.explain(checkpoint, image, "attention").map)).all())


class _Toy(torch.nn.Module):
    """A patch embedding, optionally a 3x3 convolution mixing neighbouring patches, then one block."""

    def __init__(self, mix: bool):
        super().__init__()
        self.patch = torch.nn.Conv2d(3, 4, 8, 8)
        self.mix = torch.nn.Conv2d(4, 4, 3, padding=1) if mix else torch.nn.Identity()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4)])

    def forward(self, x):
        return self.blocks[0](self.mix(self.patch(x)).flatten(2).transpose(1, 2))  # (B, 16, 4)


def test_a_first_block_input_that_mixes_the_patches_is_no_partition():
    from vit.sources.library_road.placing import patch_codes

    plain, mixed = _Toy(mix=False), _Toy(mix=True)
    torch.testing.assert_close(patch_codes.read_pieces(plain, plain.blocks[0], (32, 32), 3),
                               torch.arange(1, 17)[None])  # one piece, the patches row-major
    assert patch_codes.read_pieces(mixed, mixed.blocks[0], (32, 32), 3) is None


def _counted(monkeypatch, placer: bool = True) -> list[tuple[int, ...]]:
    """The input shape of each forward the patch codes are read from (``patch_codes``' probe), in order; with
    ``placer``, the partition placer made to fail (patches in row order must never reach it)."""
    from vit.sources.library_road.placing import partitions, patch_codes

    shapes, probe = [], patch_codes.probe_forward

    def counted(model, pixels_shape, *args, **kwargs):
        shapes.append(tuple(pixels_shape))
        return probe(model, pixels_shape, *args, **kwargs)

    def refused(*args, **kwargs):
        raise AssertionError("the partition placer ran for a first block that takes its patches row-major")

    monkeypatch.setattr(patch_codes, "probe_forward", counted)
    if placer:
        monkeypatch.setattr(partitions, "partition_places", refused)
    return shapes


class _InHand(torch.nn.Module):
    """A transformers ViT in a class of the user's own: the recorder's road opens it."""

    def __init__(self, vit_model):
        super().__init__()
        self.vit_model = vit_model

    def forward(self, x):
        return self.vit_model(pixel_values=x).last_hidden_state


def test_patches_in_row_order_are_read_in_one_forward_and_no_partition_is_placed(monkeypatch):
    """Issue 112: opening a model whose first block takes its patches row-major (the common case) reads their order
    once, in one forward of the two coded images, on transformers' library road and on the recorder's road, and
    never runs the partition placer."""
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=32)
    torch.manual_seed(0)
    model = transformers.ViTModel(config, add_pooling_layer=False).eval()
    forwards = _counted(monkeypatch)
    library = vit.load(model, mean=MEAN, std=STD)
    assert type(library.model).__name__ == "LibraryModel" and forwards == [(2, 3, 32, 32)]
    forwards.clear()
    recorded = vit.load(_InHand(model), image_size=32, mean=MEAN, std=STD)
    assert type(recorded.model).__name__ == "ModuleModel" and forwards == [(2, 3, 32, 32)]
    assert recorded.model.layout.grid == (4, 4) and not hasattr(recorded.model.layout, "pieces")  # row-major


def test_one_opening_reads_the_patch_order_once_for_both_roads(monkeypatch):
    """LW-DETR with every layer global: the library road reads its windows' order and refuses it, and its backbone
    opens on the recorder's road placed from that same reading (``patch_codes.one_reading``): one forward in all."""
    config = transformers.LwDetrViTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                                          pretrain_image_size=32, patch_size=8, num_windows=4,
                                          window_block_indices=[], out_indices=[2])
    torch.manual_seed(0)
    model = transformers.LwDetrViTBackbone(config).eval()
    forwards = _counted(monkeypatch, placer=False)
    wrapped = vit.load(model, image_size=(32, 48), mean=MEAN, std=STD).model
    assert type(wrapped.model).__name__ == "_Backbone"  # the library road refused it; the recorder's road placed it
    assert forwards == [(2, 3, 32, 48)]
    assert torch.equal(wrapped.layout.pieces.window_tokens(), _window_tokens((4, 6), 2))  # its 4 windows of 2x3


class _Folded(torch.nn.Module):
    """A patch embedding on a 4x4 grid, its top and bottom halves folded into the batch as two pieces, image-major
    (``(B * 2, 8, D)``, image 0's pieces first) or pieces-major (piece 0 of every image first), then one block."""

    def __init__(self, pieces_major: bool):
        super().__init__()
        self.pieces_major = pieces_major
        self.patch = torch.nn.Conv2d(3, 4, 8, 8)
        self.pos = torch.nn.Parameter(torch.randn(1, 16, 4))
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4)])

    def forward(self, x):
        tokens = self.patch(x).flatten(2).transpose(1, 2) + self.pos  # (B, 16, 4)
        halves = tokens.reshape(len(x), 2, 8, 4)
        if self.pieces_major:
            halves = halves.transpose(0, 1)
        return self.blocks[0](halves.reshape(-1, 8, 4))


@pytest.mark.parametrize("pieces_major", [False, True])
def test_pieces_are_read_whichever_way_the_batch_holds_them(monkeypatch, pieces_major):
    """The two coded images run in one forward: pieces folded image-major are told apart in it; folded pieces-major
    (where the image-major reading is no partition) they are read one image a forward, as one image runs alone. The
    codes are the halves' patches row-major either way."""
    from vit.sources.library_road.placing import patch_codes

    torch.manual_seed(0)
    model = _Folded(pieces_major)
    forwards = _counted(monkeypatch, placer=False)
    codes = patch_codes.read_pieces(model, model.blocks[0], (32, 32), 3)
    assert torch.equal(codes, torch.arange(1, 17).reshape(2, 8))
    assert forwards == ([(2, 3, 32, 32), (1, 3, 32, 32), (1, 3, 32, 32)] if pieces_major else [(2, 3, 32, 32)])


def test_the_patch_embeddings_features_replaced_by_codes_are_never_computed():
    """Issue 112: the codes stand in for the patch embedding's output, so its convolution is not run (on two shared
    cores it was most of an opening's reading); a convolution after it (the mixing one) runs as it did."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from vit.sources.library_road.placing import patch_codes

    class Convolutions(TorchDispatchMode):
        run = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            # a real one only: the probe's allocation budget first runs an op it has not yet sized on the meta
            # device (once a process), which counted it twice where this test ran before any other
            self.run += "convolution" in str(func) and not args[0].is_meta
            return func(*args, **(kwargs or {}))

    for mix, run in ((False, 0), (True, 1)):
        model = _Toy(mix=mix)
        with Convolutions() as seen:
            patch_codes.read_pieces(model, model.blocks[0], (32, 32), 3)
        assert seen.run == run
