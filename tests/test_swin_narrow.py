"""Swin on a grid no larger than its window on one side (issue 69): each library's own rule, against the library.

With windows of 4 (patch 4, two stages of two blocks), a 48x32 input has a 12x8 grid, then 6x4. There HF Swin takes
the shorter side for both axes (unshifted 4x4 windows), HF Swin V2 the height of the grid it is built for (shifted
by 2 on both axes; a 32x48 input's 4x6 not at all) and timm each axis alone (shifted by 2 down, not across); a 6x3
stage has timm's 4x3 windows, V1's table resized by timm's checkpoint filter. Tiny random models, the reference
built at each input size as in ``test_swin_parity``: logits and every layer's attention to 1e-5, each layer's
window and shift as the library holds them, and the maps placed on the grid against a placement made with timm's
own ``window_partition`` of the token indices, rolled and padded as timm does.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from parity_helpers import assert_parity, capture_inputs, randomize
from PIL import Image
from test_swin_maps import merge_reference
from test_swin_parity import hf_attentions

import vit
from vit.core.inference import preprocess
from vit.explain.methods.stage_maps import layer_row, rollout_row
from vit.model.stages import window_and_shift
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing transformers and timm takes seconds

TIMM_TINY = dict(embed_dim=24, depths=(2, 2), num_heads=(2, 4), window_size=4, num_classes=5)
HF_TINY = dict(patch_size=4, embed_dim=24, depths=[2, 2], num_heads=[2, 4], window_size=4, num_labels=5)
TIMM_NAMES = {"swin": "swin_tiny_patch4_window7_224", "swinv2": "swinv2_tiny_window8_256"}


def test_each_rule_on_a_grid_no_wider_than_the_window():
    """Hand-read from HF's ``set_shift_and_window_size`` / ``_compute_window_shift`` and timm's
    ``_calc_window_shift``: ((window h, w), (shift h, w)) of a shifting layer with windows of 4."""
    assert window_and_shift((6, 4), 4, True, rule="hf") == ((4, 4), (0, 0))
    assert window_and_shift((6, 4), 4, True, rule="hf_v2") == ((4, 4), (2, 2))
    assert window_and_shift((4, 6), 4, True, rule="hf_v2") == ((4, 4), (0, 0))
    assert window_and_shift((5, 7), 4, True, rule="hf_v2", built=(4, 6)) == ((4, 4), (0, 0))  # HF rounds down
    assert window_and_shift((6, 4), 4, True, rule="timm") == ((4, 4), (2, 0))
    assert window_and_shift((4, 6), 4, True, rule="timm") == ((4, 4), (0, 2))
    assert window_and_shift((6, 3), 4, True, shrink=True, rule="timm") == ((4, 3), (2, 0))
    assert window_and_shift((6, 3), 4, True, shrink=True, rule="hf_v2") == ((4, 4), (2, 2))  # the width padded
    assert window_and_shift((6, 4), 4, False, rule="timm") == ((4, 4), (0, 0))
    with pytest.raises(ValueError, match="smaller than the 4x4 windows"):
        window_and_shift((6, 3), 4, True, rule="hf")  # V1's table has a 4x4 window's offsets only


def timm_swin(kind: str, size, seed_noise: bool = True):
    """A tiny random timm Swin (V1 or V2) built at ``size``, fused attention off (its softmax reaches attn_drop)."""
    timm.layers.set_fused_attn(False)
    try:
        torch.manual_seed(0)
        model = timm.create_model(TIMM_NAMES[kind], pretrained=False, img_size=size, **TIMM_TINY)
    finally:
        timm.layers.set_fused_attn(True)
    return randomize(model) if seed_noise else model.eval()


def timm_blocks(model):
    return [block for layer in model.layers for block in layer.blocks]


def timm_run(model, images):
    """timm's logits and each layer's attention ``(B * nw, nh, n, n)``, in our window order."""
    return capture_inputs([b.attn.attn_drop for b in timm_blocks(model)], lambda: model(images))


@pytest.mark.parametrize("kind", ["swin", "swinv2"])
@pytest.mark.parametrize("size, narrow", [((48, 32), ((4, 4), (2, 0))), ((32, 48), ((4, 4), (0, 2)))])
def test_timm_built_at_a_non_square_size_shifts_its_narrow_stage_along_the_long_axis_only(tmp_path, kind, size,
                                                                                          narrow):
    model = timm_swin(kind, size)
    timm.models.save_for_hf(model, tmp_path / kind, model_args=dict(img_size=size, window_size=4),
                            safe_serialization=True)
    checkpoint = open_source(tmp_path / kind)
    grid = (size[0] // 4, size[1] // 4)
    layouts = checkpoint.model.layer_layouts(grid)
    assert [(b.window_size, b.shift_size) for b in timm_blocks(model)][3] == narrow  # timm's own
    assert [(lay.window_hw, lay.shift_hw) for lay in layouts] == [
        (b.window_size, b.shift_size) for b in timm_blocks(model)]
    images = torch.randn(2, 3, *size)
    logits, attentions = timm_run(model, images)
    with torch.no_grad():
        ours = checkpoint.model.encode(images, output_attentions=True)
    assert_parity(f"{kind} | timm built at {size[0]}x{size[1]}", ours.logits, logits, ours.attentions, attentions)


def narrowed(kind: str, square, size):
    """timm's model at ``size`` with ``square``'s weights as timm loads pretrained ones there: its checkpoint filter
    resizes V1's position table for windows narrower than the table's."""
    module = timm.models.swin_transformer if kind == "swin" else timm.models.swin_transformer_v2
    model = timm_swin(kind, size, seed_noise=False)
    model.load_state_dict(module.checkpoint_filter_fn(square.state_dict(), model))
    return model.eval()


@pytest.mark.parametrize("kind", ["swin", "swinv2"])
@pytest.mark.parametrize("size", [(48, 24), (20, 44)])
def test_a_square_timm_swin_on_an_input_narrower_than_its_windows_has_timms_non_square_windows(tmp_path, kind, size):
    square = timm_swin(kind, 48)
    timm.models.save_for_hf(square, tmp_path / kind, model_args=dict(img_size=48, window_size=4),
                            safe_serialization=True)
    checkpoint = open_source(tmp_path / kind)
    model = narrowed(kind, square, size)
    layouts = checkpoint.model.layer_layouts((size[0] // 4, size[1] // 4))
    theirs = [(b.window_size, b.shift_size) for b in timm_blocks(model)]
    assert [(lay.window_hw, lay.shift_hw) for lay in layouts] == theirs
    assert min(theirs[3][0]) == 3  # 4x3 or 3x4: the narrow stage's windows are not square
    images = torch.randn(2, 3, *size)
    logits, attentions = timm_run(model, images)
    with torch.no_grad():
        ours = checkpoint.model.encode(images, output_attentions=True)
    assert_parity(f"{kind} | timm 48 px weights at {size[0]}x{size[1]}", ours.logits, logits, ours.attentions,
                  attentions)


@pytest.mark.parametrize("kind, size, narrow", [
    ("swin", (48, 32), (4, 0)), ("swin", (32, 48), (4, 0)), ("swin", (36, 52), (4, 2)),
    ("swinv2", (48, 32), (4, 2)), ("swinv2", (32, 48), (4, 0)), ("swinv2", (36, 52), (4, 0))])
def test_hf_built_at_a_non_square_size_windows_its_narrow_stage_by_its_own_rule(tmp_path, kind, size, narrow):
    """HF Swin reads the grid it runs on, the shorter side for both axes; HF Swin V2 the height of the grid it is
    built for (36x52: a 9x13 grid, built for 4x6 in stage 1 where it runs on 5x7, so not shifted), for both axes."""
    config_class, model_class = ((transformers.SwinConfig, transformers.SwinForImageClassification) if kind == "swin"
                                 else (transformers.Swinv2Config, transformers.Swinv2ForImageClassification))
    config = config_class(image_size=size, **HF_TINY)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(model_class(config))
    model.save_pretrained(tmp_path / kind)
    checkpoint = open_source(tmp_path / kind)
    images = torch.randn(2, 3, *size)
    out, attentions = hf_attentions(model, images)
    blocks = [block for stage in model.base_model.encoder.layers for block in stage.blocks]
    assert (blocks[3].window_size, blocks[3].shift_size) == narrow  # as HF held them in the forward
    layouts = checkpoint.model.layer_layouts((size[0] // 4, size[1] // 4))
    assert [(lay.window, lay.shift) for lay in layouts] == [(b.window_size, b.shift_size) for b in blocks]
    with torch.no_grad():
        ours = checkpoint.model.encode(images, output_attentions=True)
    assert_parity(f"{kind} | HF built at {size[0]}x{size[1]}", ours.logits, out.logits, ours.attentions, attentions)


def timm_placed(model, attentions, grids):
    """Each layer's attention of one image ``(nw, H, n, n)`` placed on its grid, ``(H, T, T)``: the token indices
    rolled by timm's shift, padded, then cut by timm's own ``window_partition`` with its window."""
    from timm.models.swin_transformer import window_partition

    dense = []
    for block, attn, (gh, gw) in zip(timm_blocks(model), attentions, grids, strict=True):
        (wh, ww), (sh, sw) = block.window_size, block.shift_size
        ids = torch.roll(torch.arange(1, gh * gw + 1, dtype=torch.float32).view(1, gh, gw, 1), (-sh, -sw), (1, 2))
        ids = F.pad(ids, (0, 0, 0, -gw % ww, 0, -gh % wh))  # padding reads 0 -> -1 below
        slots = window_partition(ids, (wh, ww)).reshape(-1, wh * ww).long() - 1  # (nw, n)
        full = torch.zeros(attn.shape[1], gh * gw, gh * gw)
        for win, tokens in enumerate(slots):
            real = (tokens >= 0).nonzero()[:, 0]
            full[:, tokens[real][:, None], tokens[real][None, :]] = attn[win][:, real][:, :, real]
        dense.append(full)
    return dense


def rollout_reference(dense, grid):
    factors = []
    for full in dense:
        a = full.mean(0).double() + torch.eye(full.shape[-1], dtype=torch.float64)
        factors.append(a / a.sum(-1, keepdim=True))
    return factors[3] @ factors[2] @ merge_reference(grid).double() @ factors[1] @ factors[0]


@pytest.mark.parametrize("size", [(48, 32), (48, 24)])
def test_the_maps_of_timms_non_square_windows_are_placed_where_timm_put_them(tmp_path, size):
    """Every layer's row and the rollout through the stages, where the narrow stage is shifted along one axis
    (48x32) or has 4x3 windows (48x24: a 48 px model's weights, its table resized)."""
    square = timm_swin("swin", 48)
    timm.models.save_for_hf(square, tmp_path / "swin", model_args=dict(img_size=48, window_size=4),
                            safe_serialization=True)
    checkpoint = open_source(tmp_path / "swin")
    model = narrowed("swin", square, size)
    grid = (size[0] // 4, size[1] // 4)
    grids = [grid] * 2 + [(grid[0] // 2, grid[1] // 2)] * 2
    images = torch.randn(1, 3, *size)
    _, theirs = timm_run(model, images)
    dense = timm_placed(model, theirs, grids)
    with torch.no_grad():
        attentions = checkpoint.model.encode(images, output_attentions=True).attentions
    layouts = checkpoint.model.layer_layouts(grid)
    for layer, (gh, gw) in enumerate(grids):
        for query in (0, gw + 1, gh * gw - 1):
            row = layer_row(attentions, layouts, layer, query)  # (1, H, gh, gw)
            assert row.shape[-2:] == (gh, gw)
            assert torch.allclose(row[0].flatten(1), dense[layer][:, query], atol=1e-5)
    product = rollout_reference(dense, grid)
    for query in (0, 5, grids[3][0] * grids[3][1] - 1):
        assert torch.allclose(rollout_row(attentions, layouts, -1, query)[0].flatten().double(), product[query],
                              atol=1e-5)


def test_vit_explain_draws_a_one_axis_shift_where_timm_shifts_and_says_so(tmp_path):
    model = timm_swin("swin", (48, 32))
    timm.models.save_for_hf(model, tmp_path / "swin", model_args=dict(img_size=(48, 32), window_size=4),
                            safe_serialization=True)
    checkpoint = open_source(tmp_path / "swin")
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 32, 3), dtype=np.uint8))
    images = preprocess([image], checkpoint.preprocessing)  # what vit.explain feeds the model
    assert images.shape[-2:] == (48, 32)
    _, theirs = timm_run(model, images)
    dense = timm_placed(model, theirs, [(12, 8)] * 2 + [(6, 4)] * 2)
    explanation = vit.explain(checkpoint, image, "attention", layer=3, head=1, query=9)  # row 2, column 1 of 6x4
    assert explanation.map.shape == (6, 4)
    assert np.allclose(explanation.map.ravel(), dense[3][1, 9].numpy(), atol=1e-5)
    assert "in its 4×4 window, shifted by 2 rows and 0 columns" in explanation.description


def test_a_timm_swin_saved_as_our_checkpoint_keeps_timms_rule(tmp_path):
    from vit.checkpoint import load_checkpoint, save_checkpoint
    from vit.model import ViTConfig

    model = timm_swin("swin", (48, 32))
    timm.models.save_for_hf(model, tmp_path / "swin", model_args=dict(img_size=(48, 32), window_size=4),
                            safe_serialization=True)
    opened = open_source(tmp_path / "swin")
    save_checkpoint(tmp_path / "swin.pt", opened.model, opened.class_names, opened.preprocessing)
    loaded = load_checkpoint(tmp_path / "swin.pt")
    assert loaded.config.window_rule == "timm"
    images = torch.randn(1, 3, 48, 32)
    logits, _ = timm_run(model, images)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model.encode(images).logits, logits, rtol=0, atol=1e-5)
    # One saved before the field existed reads its library's rule from what it does say: timm rolls before padding.
    saved = {k: v for k, v in opened.config.to_dict().items() if k != "window_rule"}
    assert ViTConfig.from_dict(saved).window_rule == "timm"
    assert ViTConfig.from_dict({**saved, "shift_padded": True, "rel_pos": "swinv2", "attention": "cosine",
                                "merge": "swinv2", "res_post_norm": True}).window_rule == "hf_v2"
    assert ViTConfig.from_dict({**saved, "shift_padded": True}).window_rule == "hf"


def test_timm_v1_weights_saved_with_a_resized_table_are_refused_in_one_line(tmp_path):
    """timm built at 48x24 resized stage 1's table to its 4x3 windows; the 4x4 table it was resized from is gone."""
    timm.models.save_for_hf(timm_swin("swin", (48, 24)), tmp_path / "swin",
                            model_args=dict(img_size=(48, 24), window_size=4), safe_serialization=True)
    with pytest.raises(ValueError, match="stage 1's position table has 35 rows, not the 49") as error:
        open_source(tmp_path / "swin")
    assert "\n" not in str(error.value)
