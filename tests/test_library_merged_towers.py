"""Qwen 2.5-VL's and Qwen3-VL's vision towers open alone from the folder transformers saves (issue 117, item 6),
fed their processor's flattened patches: every layer's attention equals transformers' own eager attention (its
modelling file's ``eager_attention_forward`` hooked, the model built with ``attn_implementation="eager"``, fed by
``Qwen2VLImageProcessor`` itself), each window's block placed in the image's full ``N x N`` (every entry outside a
window exactly 0), queries and keys on a non-square grid where transformers' own position ids put them (a transposed
or merge-order placement fails). Each model is built tiny with random weights in transformers, never downloaded."""

from __future__ import annotations

import importlib

import pytest
import torch
from layer_reference import caught_eager, widened

import vit

transformers = pytest.importorskip("transformers")

PATCH, MERGE, HW = 8, 2, (48, 64)  # a 6x8 grid of patches, 3x4 merge units: Qwen 2.5-VL's 2x2-unit windows uneven
GRID = (HW[0] // PATCH, HW[1] // PATCH)
PROCESSOR = dict(patch_size=PATCH, merge_size=MERGE, size=dict(shortest_edge=16 * 16, longest_edge=64 * 64))


def test_the_tower_order_is_where_transformers_positions_put_each_token():
    """Fast: our order (the processor's ``patchify`` of an index image, then the window index) is the grid place of
    transformers' own rotary position ids (``get_vision_position_ids``, permuted by the model's window index as its
    forward permutes them); the transposed grid's is not."""
    from transformers.vision_utils import get_vision_position_ids, get_vision_window_index

    from vit.sources.library_road.placing import merge_order

    patchify = transformers.Qwen2VLImageProcessor().patchify
    grid_thw = torch.tensor([[1, *GRID]])
    positions = get_vision_position_ids(grid_thw, MERGE)  # (N, 2) (row, column), the processor's order
    expected = positions[:, 0] * GRID[1] + positions[:, 1]
    assert torch.equal(merge_order.tower_order(patchify, GRID, PATCH, MERGE, 2), expected)
    window, _ = get_vision_window_index(grid_thw, MERGE, 32, PATCH)
    windowed = expected.reshape(-1, MERGE * MERGE)[window].flatten()  # as ``permute_input_for_window_attn`` does
    assert not torch.equal(windowed, expected)
    assert torch.equal(merge_order.tower_order(patchify, GRID, PATCH, MERGE, 2, 32), windowed)
    transposed = merge_order.tower_order(patchify, GRID[::-1], PATCH, MERGE, 2)
    assert not torch.equal(transposed, expected)


def test_the_tower_order_is_built_once_a_grid(monkeypatch):
    """Fast (issue 112): a tower's order (asked three times a recorded forward) is built once a grid, is
    ``merge_order.tower_order``'s for that grid, and a new grid builds its own; only the last ``MAX_ORDERS`` grids
    are kept."""
    from vit.sources.library_road import merged_towers
    from vit.sources.library_road.placing import merge_order

    built, own = [], merge_order.tower_order

    def counted(patchify, grid, *args):
        built.append(tuple(grid))
        return own(patchify, grid, *args)

    monkeypatch.setattr(merge_order, "tower_order", counted)
    entry = merged_towers._FlattenedPatches(torch.nn.Identity(), PATCH, MERGE, 2, 32)
    orders = [entry.order(GRID) for _ in range(3)]
    assert built == [GRID] and all(order is orders[0] for order in orders)
    assert torch.equal(orders[0], own(entry.patchify, GRID, PATCH, MERGE, 2, 32))
    assert torch.equal(entry.order((4, 4)), own(entry.patchify, (4, 4), PATCH, MERGE, 2, 32))
    assert built == [GRID, (4, 4)]
    for side in range(1, merged_towers.MAX_ORDERS + 2):
        entry.order((2, 2 * side))
    assert len(entry._orders) == merged_towers.MAX_ORDERS


def test_pieces_are_placed_on_the_diagonal_and_moved_to_the_grid():
    """Fast: two pieces of one image's 4 tokens (a window of 3, one of 1) handed in order make one (1, H, 4, 4), zero
    off their blocks, queries and keys moved by the order: entry [order[i], order[j]] is the tower's [i, j]."""
    from vit.sources.library_road.merged_towers import _Pieces

    class View:
        layers, kept = {"module": 0}, {}

        def keep_probabilities(self, layer, probabilities, rows_formed=False):
            self.kept[layer] = probabilities

    order = torch.tensor([2, 0, 3, 1])  # tower position -> grid index
    first = torch.arange(9.0).reshape(1, 1, 3, 3) + 1
    pieces = _Pieces(View(), order, 1)
    pieces.keep_probabilities(0, first)
    assert 0 not in View.kept
    pieces.keep_probabilities(0, torch.full((1, 1, 1, 1), 10.0))
    pieces.check()
    tower = torch.zeros(4, 4)
    tower[:3, :3], tower[3, 3] = first[0, 0], 10.0
    expected = torch.zeros(4, 4)
    for i in range(4):
        for j in range(4):
            expected[order[i], order[j]] = tower[i, j]
    assert torch.equal(View.kept[0][0, 0], expected)
    short = _Pieces(View(), order, 1)
    short.keep_probabilities(1, first)
    with pytest.raises(ValueError, match=r"^layer 1's attention covered 3 of its 4 tokens$"):
        short.check()


def test_an_asked_row_is_formed_in_the_one_piece_that_holds_it():
    """Fast: grid row 3 sits at tower position 2 (``order[2] == 3``): the first piece (positions 0-2) forms its row 2
    alone, the second none; the row handed on is that row with its keys moved to the grid, zero outside its piece."""
    from vit.sources.library_road.merged_towers import _Pieces

    class View:
        layers, kept, rows = {"module": 0}, {}, [3]

        def keep_probabilities(self, layer, probabilities, rows_formed=False):
            self.kept[layer] = (probabilities, rows_formed)

    order = torch.tensor([2, 0, 3, 1])
    pieces = _Pieces(View(), order, 1)
    assert pieces.rows_for(0, 3) == [2]
    pieces.keep_probabilities(0, torch.tensor([[[[0.5, 0.25, 0.25]]]]), rows_formed=True)
    assert pieces.rows_for(0, 1) == []
    pieces.keep_probabilities(0, torch.ones(1, 1, 0, 1), rows_formed=True)
    pieces.check()
    kept, formed = View.kept[0]
    assert formed and torch.equal(kept, torch.tensor([[[[0.25, 0.0, 0.5, 0.25]]]]))  # grid key order[j] <- tower j
    with pytest.raises(ValueError, match=r"^a query row must be one of its 4 patches \(0 to 3\)$"):
        _Pieces(type("Far", (View,), {"rows": [4]})(), order, 1)


def _qwen25():
    config = transformers.Qwen2_5_VLVisionConfig(depth=2, hidden_size=32, intermediate_size=64, num_heads=4,
                                                 out_hidden_size=32, patch_size=PATCH, spatial_merge_size=MERGE,
                                                 window_size=MERGE * PATCH * 2, fullatt_block_indexes=[1])
    return transformers.Qwen2_5_VisionTransformerPretrainedModel(config)


def _qwen3():
    config = transformers.Qwen3VLVisionConfig(depth=2, hidden_size=32, intermediate_size=64, num_heads=4,
                                              out_hidden_size=32, patch_size=PATCH, spatial_merge_size=MERGE,
                                              num_position_embeddings=16, deepstack_visual_indexes=[0])
    return transformers.Qwen3VLVisionModel(config)


CASES = {"qwen2_5": (_qwen25, "qwen2_5_vl.modeling_qwen2_5_vl"), "qwen3": (_qwen3, "qwen3_vl.modeling_qwen3_vl")}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made = {}
    for name, (build, _) in CASES.items():
        torch.manual_seed(0)
        model = build()
        widened(model)  # weights wide enough that every head's attention differs from uniform
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        transformers.Qwen2VLImageProcessor(**PROCESSOR).save_pretrained(folder)
        made[name] = folder
    return made


def eager_on_grid(folder, name: str, pixels: torch.Tensor) -> list[torch.Tensor]:
    """transformers alone: each layer's eager probabilities, each piece (its ``cu_seqlens``: windows or images) placed
    in the sequence's block diagonal, then each image's queries and keys put where the model's own position ids
    (permuted by its window index, as its forward permutes them) say: ``(B, H, N, N)`` a layer, row-major on the
    grid. The model is fed by the processor itself (its resize, rescale and normalisation off: the pixels are)."""
    from transformers.vision_utils import get_vision_cu_seqlens, get_vision_position_ids, get_vision_window_index

    config = transformers.AutoConfig.from_pretrained(folder)
    model = getattr(transformers, config.architectures[0]).from_pretrained(folder, attn_implementation="eager").eval()
    fed = transformers.Qwen2VLImageProcessor(**PROCESSOR)(images=list(pixels), do_resize=False, do_rescale=False,
                                                          do_normalize=False, return_tensors="pt")
    modeling = importlib.import_module(f"transformers.models.{CASES[name][1]}")
    seen = caught_eager(modeling, lambda: model(hidden_states=fed["pixel_values"], grid_thw=fed["image_grid_thw"]),
                        modules=True)
    grid_thw = fed["image_grid_thw"]
    total = int(grid_thw[:, 1:].prod(-1).sum())
    positions = get_vision_position_ids(grid_thw, MERGE)
    full = get_vision_cu_seqlens(grid_thw)
    window = None
    if name == "qwen2_5":
        window, windows = get_vision_window_index(grid_thw, MERGE, model.window_size, PATCH)
        positions = model.permute_input_for_window_attn(positions, window, total)
    n = GRID[0] * GRID[1]
    layers = []
    for i, block in enumerate(model.blocks):
        pieces = [p for m, p in seen if m is block.attn]
        bounds = full if window is None or i in model.fullatt_block_indexes else windows
        assert [p.shape[-1] for p in pieces] == (bounds[1:] - bounds[:-1]).tolist()
        heads = [torch.block_diag(*[p[0, h] for p in pieces]) for h in range(pieces[0].shape[1])]
        dense = torch.stack(heads)  # (H, T, T), the tower's order
        on_grid = torch.zeros(len(pixels), dense.shape[0], n, n)
        place = positions[:, 0] * GRID[1] + positions[:, 1]
        for b in range(len(pixels)):
            own = torch.arange(b * n, (b + 1) * n)
            on_grid[b][:, place[own][:, None], place[own][None, :]] = dense[:, own][:, :, own]
        layers.append(on_grid)
    return layers


@pytest.mark.slow  # builds and saves two models
@pytest.mark.parametrize("name", list(CASES))
def test_every_layers_attention_is_transformers_eager_on_the_grid(folders, name):
    checkpoint = vit.load(folders[name], device="cpu")
    assert checkpoint.road == "library" and checkpoint.model.layout.num_prefix_tokens == 0
    pixels = torch.randn(2, 3, *HW, generator=torch.Generator().manual_seed(1))
    out, attentions = checkpoint.model.run(pixels, layers=range(2))
    expected = eager_on_grid(folders[name], name, pixels)
    n = GRID[0] * GRID[1]
    for layer, theirs in enumerate(expected):
        assert attentions[layer].shape == theirs.shape == (2, 4, n, n)
        assert torch.allclose(attentions[layer], theirs, atol=1e-6, rtol=0)
        assert torch.allclose(attentions[layer].sum(-1), torch.ones(2, 4, n), atol=1e-5)
    if name == "qwen2_5":  # its windowed layer: a query's row is exactly 0 outside its window
        assert (attentions[0] == 0).any() and not (attentions[1] == 0).any()
    assert out.last_hidden_state.shape == (2, n, 32)


@pytest.mark.slow
def test_a_drawn_map_is_the_eager_row_on_the_non_square_grid(folders):
    from PIL import Image

    from vit.core.inference import preprocess

    checkpoint = vit.load(folders["qwen2_5"], device="cpu")
    image = Image.fromarray((torch.rand(HW[0], HW[1], 3, generator=torch.Generator().manual_seed(3)) * 255)
                            .byte().numpy())
    pixels = preprocess([image], checkpoint.preprocessing)
    assert tuple(pixels.shape[-2:]) == HW  # smart_resize keeps a size of whole merge units
    expected = eager_on_grid(folders["qwen2_5"], "qwen2_5", pixels)
    query = GRID[1] + 1  # the patch at row 1, column 1
    drawn = vit.explain(checkpoint, image, "attention", layer=0, head=2, query=query)
    assert drawn.map.shape == GRID
    row = expected[0][0, 2, query]
    assert torch.allclose(torch.from_numpy(drawn.map), row.reshape(GRID), atol=1e-6, rtol=0)


@pytest.mark.slow
def test_a_processor_of_another_patch_size_is_refused_in_one_line(folders, tmp_path):
    import shutil

    folder = tmp_path / "other"
    shutil.copytree(folders["qwen3"], folder)
    transformers.Qwen2VLImageProcessor(**dict(PROCESSOR, patch_size=14)).save_pretrained(folder)
    from vit.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match=r"its image processor's patch_size 14 is not its config's 8; fix "
                                                  r"one of them$"):
        vit.load(folder, device="cpu")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_an_asked_row_alone_is_formed_and_is_transformers_eager_row(folders, name, monkeypatch):
    """Issue 117's speed item: one query's row of each layer is formed alone (each call of a window or image forms
    only the rows it holds, none where it holds none), so at a memory bound that one layer's whole ``H x N x N``
    would break it opens, and each row equals transformers' own eager row on the grid, for both images."""
    from vit.core import attention_recorder
    from vit.costs.bounds import TooManyTokens

    checkpoint = vit.load(folders[name], device="cpu")
    pixels = torch.randn(2, 3, *HW, generator=torch.Generator().manual_seed(2))
    expected = eager_on_grid(folders[name], name, pixels)
    n, query = GRID[0] * GRID[1], 2 * GRID[1] + 5  # the patch at row 2, column 5: in a window of its own
    # 2 images x 4 heads x 48 x 48 float32, scores and probabilities: 147 kB for the whole layer, 3 kB for its row
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.02")
    with pytest.raises(TooManyTokens, match="ask for fewer layers, one query's row, or a smaller input"):
        checkpoint.model.run(pixels, layers=[0])
    original, formed = attention_recorder.sdpa_probabilities, []

    def spy(query_states, key_states, *args):
        out = original(query_states, key_states, *args)
        formed.append(tuple(out.shape[-2:]))
        return out

    monkeypatch.setattr(attention_recorder, "sdpa_probabilities", spy)
    _, attentions = checkpoint.model.run(pixels, layers=range(2), rows=[query])
    # never a window's or image's every row: its windowed layer's four windows an image of 16, 16, 8 and 8 tokens
    # (2x2 merge units of 2x2 patches, row-major, the grid's last unit row cut short), the row in the second; then
    # its global layer, each image whole
    windows = [(0, 16), (1, 16), (0, 8), (0, 8)] * 2 if name == "qwen2_5" else [(1, n)] * 2
    assert formed == windows + [(1, n)] * 2
    for layer, theirs in enumerate(expected):
        assert attentions[layer].shape == (2, 4, 1, n)
        assert torch.allclose(attentions[layer][:, :, 0], theirs[:, :, query], atol=1e-6, rtol=0)
    if name == "qwen2_5":
        assert (attentions[0] == 0).any() and not (attentions[1] == 0).any()


@pytest.mark.slow
def test_attention_modules_other_than_its_layers_are_refused_in_one_line(folders, monkeypatch):
    from test_library_whole_folders import refused_one_attention_short

    assert refused_one_attention_short(folders["qwen3"], monkeypatch).endswith(
        ": 1 attention modules for 2 layers; the library road reads one attention per layer")
