"""Qwen2.5-VL's window index and rotary positions as our layout's data, against transformers' own functions: the
windows' slots in Qwen's order (``get_vision_window_index``) and the rotary tables (``Qwen2_5_VLVisionRotaryEmbedding``
on ``get_vision_position_ids``), both read back to our row-major grid."""

import pytest
import torch

from vit.model import LayerLayout, ViT, ViTConfig
from vit.model.positions import qwen_rope

transformers = pytest.importorskip("transformers")
from transformers.vision_utils import get_vision_position_ids, get_vision_window_index  # noqa: E402

GRIDS = [(10, 6), (4, 18), (16, 16), (2, 2)]  # patch grids: sides of whole 2x2 units, in 8x8-patch windows or less


def qwen_order(grid: tuple[int, int], window_px: int = 112, patch: int = 14, merge: int = 2) -> tuple[list, list]:
    """Transformers' own order of the patches (as row-major token indices of ``grid``) and its windows' lengths."""
    gh, gw = grid
    units, cu = get_vision_window_index(torch.tensor([[1, gh, gw]]), merge, window_px, patch)
    order = []
    for u in units.tolist():  # unit u, row-major over the (gh/2, gw/2) units; its patches row-major inside
        uy, ux = divmod(u, gw // merge)
        order += [(uy * merge + py) * gw + ux * merge + px for py in range(merge) for px in range(merge)]
    return order, torch.diff(cu).tolist()


@pytest.mark.parametrize("grid", GRIDS)
def test_window_slots_are_qwens_window_index(grid):
    slots = LayerLayout(grid, 8, unit=2).window_tokens()  # (nw, 64): padding marked gh*gw
    real = slots < grid[0] * grid[1]
    order, lengths = qwen_order(grid)
    assert slots[real].tolist() == order
    assert [n for n in real.sum(1).tolist() if n] == lengths


def test_window_slots_taken_row_major_are_not_qwens():
    """The unit order matters: Swin's and SAM's row-major slots hold the same windows in another order."""
    grid = (10, 6)
    slots = LayerLayout(grid, 8).window_tokens()
    order, _ = qwen_order(grid)
    assert slots[slots < 60].tolist() != order
    assert sorted(slots[slots < 60].tolist()) == sorted(order)


def test_cut_and_join_are_inverse_and_mask_the_padding():
    lay = LayerLayout((10, 6), 8, unit=2)
    x = torch.randn(3, 60, 5)
    windows = lay.cut(x)  # (3 * 2, 64, 5)
    assert windows.shape == (6, 64, 5)
    assert torch.equal(lay.join(windows), x)
    mask = lay.key_mask()
    assert mask.shape == (2, 64) and int(mask.sum()) == 60
    assert torch.equal(windows.view(3, 2, 64, 5)[:, ~mask], torch.zeros(3, 68, 5))  # padding slots hold zeros


def test_layout_refuses_a_grid_of_broken_units():
    with pytest.raises(ValueError, match="whole 2x2 units"):
        LayerLayout((5, 6), 8, unit=2).window_tokens()


@pytest.mark.parametrize("grid", [(10, 6), (4, 18)])
def test_rotary_tables_are_qwens_on_the_row_major_grid(grid):
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLVisionRotaryEmbedding

    vision = Qwen2_5_VLConfig(vision_config=dict(hidden_size=64, num_heads=2)).vision_config
    rotary = Qwen2_5_VLVisionRotaryEmbedding(vision)
    ids = get_vision_position_ids(torch.tensor([[1, *grid]]), 2)  # (T, 2), Qwen's unit-by-unit order
    cos, sin = rotary(torch.zeros(1), ids)
    token = ids[:, 0] * grid[1] + ids[:, 1]  # the row-major token each of Qwen's positions is
    ours = qwen_rope(grid, 32, 10000.0)
    assert torch.equal(ours[0][token], cos) and torch.equal(ours[1][token], sin)


def test_windowed_rotary_layers_need_qwens_units():
    with pytest.raises(ValueError, match="rotary"):
        ViTConfig(class_token=False, pooling="avg", pos_embed=False, rope="qwen", window_size=4)
    config = ViTConfig(image_size=56, patch_size=7, class_token=False, pooling="avg", pos_embed=False, rope="qwen",
                       window_size=4, spatial_merge=2, global_layers=(1,))
    assert ViT(config).blocks[0].layout((8, 8)).unit == 2


@pytest.mark.parametrize("grid", [(6, 4), (2, 10)])
def test_merger_is_qwens_patch_merger_on_the_row_major_grid(grid):
    from parity_helpers import ATOL, randomize
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLPatchMerger

    torch.manual_seed(0)
    theirs = randomize(Qwen2_5_VLPatchMerger(dim=24, context_dim=16, spatial_merge_size=2))
    config = ViTConfig(image_size=56, patch_size=14, hidden_size=16, num_heads=2, mlp_size=32, num_classes=0,
                       class_token=False, pooling="avg", pos_embed=False, norm="rms", spatial_merge=2,
                       projector="qwen", projector_dim=24)
    model = ViT(config).eval()
    model.projector.load_state_dict({"norm.weight": theirs.ln_q.weight, "fc1.weight": theirs.mlp[0].weight,
                                     "fc1.bias": theirs.mlp[0].bias, "fc2.weight": theirs.mlp[2].weight,
                                     "fc2.bias": theirs.mlp[2].bias})
    gh, gw = grid
    x = torch.randn(1, gh * gw, 16)  # row-major on the grid
    units = x.view(gh // 2, 2, gw // 2, 2, 16).permute(0, 2, 1, 3, 4).reshape(-1, 16)  # Qwen's unit by unit
    with torch.no_grad():
        ours, reference = model.project(x, grid)[0], theirs(units)  # (units, 24), units row-major both
    assert torch.allclose(ours, reference, atol=ATOL)
    with pytest.raises(ValueError, match="whole 2x2 merge units"):
        model.project(torch.randn(1, 15, 16), (5, 3))


def test_the_nominal_size_both_roads_name_is_what_transformers_processor_makes_of_the_square():
    """Fast: ``qwen_nominal_size`` is transformers' own ``smart_resize`` of a 1,024 px square at the processor's
    bounds (its defaults, which bind; Qwen2.5-VL's and Qwen3-VL's shipped ones, which do not), and the port's and the
    library road's preprocessing both name it (``_qwen_preprocessing``)."""
    qwen2_vl = pytest.importorskip("transformers.models.qwen2_vl.image_processing_qwen2_vl")
    from vit.sources.hf_preprocessing import QWEN_MAX_PIXELS, QWEN_MIN_PIXELS, _qwen_preprocessing, qwen_nominal_size

    for unit, low, high in ((28, QWEN_MIN_PIXELS, QWEN_MAX_PIXELS), (28, 3136, 12845056), (32, 65536, 16777216)):
        assert qwen_nominal_size(unit, low, high) == qwen2_vl.smart_resize(1024, 1024, unit, low, high)
    assert qwen_nominal_size(28, QWEN_MIN_PIXELS, QWEN_MAX_PIXELS) == (980, 980)  # the defaults bind
    assert qwen_nominal_size(28) == qwen2_vl.smart_resize(1024, 1024, 28, 3136, 12845056) == (1036, 1036)
    config = ViTConfig(image_size=28, patch_size=14, class_token=False, pooling="avg", spatial_merge=2)
    assert _qwen_preprocessing(None, config).image_size == 980
    assert _qwen_preprocessing({"max_pixels": 12845056}, config).image_size == 1036
