"""Canvases a processor's own code chooses and its outputs do not state, placed by what each layout needs
(``vit.explain.language.vlm_read_layout``; issue 113): Perception LM's thumbnail then tiles, Granite 4 Vision's anyres
canvas of downsampled crops with a newline per row, Nemotron-H Omni's flattened patches (``image_grid_hw``) pixel-
shuffled 2 x 2, Unlimited-OCR's global view of 64-px steps (SAM's 16-px patches and two stride-2 convolutions) with a
newline per row and a separator; and the image tokens no patch holds (Aria's and DeepSeek-OCR 2's learned queries),
refused naming them. Each built tiny by the VLM census's generic builder with its own processor's classes and saved
whole; each answer is ``generate``'s, each map the eager row placed where the processor's tiles (read off their
colours) or transformers' own modules (its pixel shuffle, its SAM encoder's output grid) put it. Taken transposed or
column-major the maps differ.
"""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_vlm_answer import (  # noqa: E402
    QUESTION,
    _differs,
    by_hand,
    eager_generate,
    eager_image_rows,
    picture,
    quadrant_places,
    quadrants,
)
from vlm_saved import saved  # noqa: E402

import vit  # noqa: E402
from vit.registry import VLM_ARCHITECTURES  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

KINDS = ("perception_lm", "granite4_vision", "nemotron_h_omni", "unlimited_ocr")
TOKENS = 2
ATOL = 1e-5


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``{kind: folder}``: the census's tiny ``kind`` (seed 0), saved whole with its processor."""
    built = {kind: tmp_path_factory.mktemp(kind) for kind in KINDS}
    for kind, folder in built.items():
        saved(kind, folder)
    return built


def asked(folder, image):
    """``(vit's answer, eager generate's output, the processor's inputs, the image tokens' positions)``."""
    answer = vit.ask_vlm(vit.open_vlm(folder), image, QUESTION, max_new_tokens=TOKENS)
    out, inputs, image_token = eager_generate(folder, image)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()[:TOKENS]
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    assert torch.equal(answer.layout.positions, positions)
    return answer, out, inputs, positions


def every_map(answer, out, positions, expected) -> None:
    """Each answer token's map at every layer, per head and their mean, equals ``expected(row)`` (on the tiles'
    canvas, and on the overview where it returns two), the rows transformers' eager ``generate``'s."""
    for i in range(TOKENS):
        for layer in range(answer.layers):
            heads = eager_image_rows(out, i, layer, positions)
            np.testing.assert_allclose(answer.image_rows(i, layer).numpy(), heads, rtol=0, atol=ATOL)
            for head in (0, None):
                maps = expected(heads.mean(0) if head is None else heads[head])
                np.testing.assert_allclose(answer.attention(i, layer, head), maps[0], rtol=0, atol=ATOL)
                if len(maps) > 1:
                    np.testing.assert_allclose(answer.attention(i, layer, head, overview=True), maps[1], rtol=0,
                                               atol=ATOL)


def test_the_types_are_none_the_project_names():
    assert not set(KINDS) & set(VLM_ARCHITECTURES)


def test_perception_lms_thumbnail_comes_first_then_its_tiles_where_the_processor_cut_them(folders):
    """The thumbnail's 16 x 16 pooled tokens first (the overview), then each of 2 x 2 tiles' (32 x 32 patches pooled
    2 x 2), each tile's tokens over the quadrant its pixels came from."""
    image = quadrants(800, 800)
    answer, out, inputs, positions = asked(folders["perception_lm"], image)
    views = inputs["pixel_values"][0]  # (thumbnail + 4 tiles, C, h, w)
    places = quadrant_places(views[1:].float())
    assert sorted(places) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    gh, gw = answer.layout.view_grid
    per = (gh // 2) * (gw // 2)
    assert answer.grid == (2 * gh, 2 * gw) and len(positions) == 5 * per and answer.layout.unit == 2

    def expected(row):
        canvas = np.zeros((2 * gh, 2 * gw), dtype=np.float32)
        for k, (r, c) in enumerate(places):
            canvas[gh * r:gh * (r + 1), gw * c:gw * (c + 1)] = by_hand(row[per * (k + 1):per * (k + 2)], (gh, gw),
                                                                       2, 0)
        return canvas, by_hand(row[:per], (gh, gw), 2, 0)

    every_map(answer, out, positions, expected)
    row = eager_image_rows(out, 1, answer.layers - 1, positions).mean(0)
    thumbnail_last = expected(np.concatenate([row[per:], row[:per]]))[0]  # InternVL's order
    assert _differs(answer.attention(1, answer.layers - 1), thumbnail_last)
    column_major = np.zeros_like(thumbnail_last)
    for k in range(4):
        column_major[gh * (k % 2):gh * (k % 2 + 1), gw * (k // 2):gw * (k // 2 + 1)] = by_hand(
            row[per * (k + 1):per * (k + 2)], (gh, gw), 2, 0)
    assert _differs(answer.attention(1, answer.layers - 1), column_major)


def test_granite_visions_downsampled_crops_lie_on_its_canvas_each_row_closed_by_a_newline(folders):
    """A square image on Granite 4 Vision's 2 x 2 canvas of 336-px crops: its base image's 12 x 12 tokens (24 x 24
    patches, downsample_rate 2/4), then the canvas's 24 rows of 24 tokens and a newline, each token over its 2 x 2
    patches; the canvas drawn from the processor's crops, each quadrant the image's."""
    image = quadrants(672, 672)
    answer, out, inputs, positions = asked(folders["granite4_vision"], image)
    crops = inputs["pixel_values"][0, 1:5]
    assert quadrant_places(crops.float()) == [(0, 0), (0, 1), (1, 0), (1, 1)]  # row-major, as pack_image_features
    assert len(positions) == 144 + 24 * 25 and answer.grid == (48, 48) and answer.layout.view(True).grid == (24, 24)

    def expected(row):
        canvas = np.zeros((48, 48), dtype=np.float32)
        for r in range(48):
            for c in range(48):
                canvas[r, c] = row[144 + (r // 2) * 25 + c // 2]
        return canvas, by_hand(row[:144], (24, 24), 2, 0)

    every_map(answer, out, positions, expected)
    pixels = answer.layout.pixels  # the canvas the tower read, 672 x 672
    colours = np.array(image)
    for r in range(2):
        for c in range(2):
            box = (slice(336 * r + 40, 336 * (r + 1) - 40), slice(336 * c + 40, 336 * (c + 1) - 40))
            assert np.abs(pixels[box].astype(float).mean((0, 1)) - colours[box].mean((0, 1))).max() < 3
    row = eager_image_rows(out, 1, answer.layers - 1, positions).mean(0)
    no_newline = by_hand(row[144:144 + 24 * 24], (48, 48), 2, 0)  # the rows read without their newlines
    assert _differs(answer.attention(1, answer.layers - 1), no_newline)


def test_granite_visions_unpadded_canvas_holds_every_kept_token_once(folders):
    """A 90 x 70 image on a canvas of two crops, unpadded at the tokens' grid (transformers' unpad_image): each canvas
    token that is not a newline covers one 2 x 2 box, the newlines and the base image none."""
    answer = vit.ask_vlm(vit.open_vlm(folders["granite4_vision"]), picture(), QUESTION, max_new_tokens=1)
    layout = answer.layout
    high, wide = layout.grid[0] // 2, layout.grid[1] // 2
    assert len(layout.positions) == 144 + high * (wide + 1)
    tokens, counts = layout.index.unique(return_counts=True)
    newlines = {144 + r * (wide + 1) + wide for r in range(high)}
    assert set(tokens.tolist()) == set(range(144, len(layout.positions))) - newlines and (counts == 4).all()


def test_nemotrons_flattened_patches_are_pixel_shuffled_2x2_row_major_on_image_grid_hw(folders):
    """Nemotron-H Omni's image one view of ``image_grid_hw`` patches, each token the 2 x 2 patches transformers'
    own ``pixel_shuffle`` gathers into it."""
    image = picture()
    answer, out, inputs, positions = asked(folders["nemotron_h_omni"], image)
    gh, gw = (int(v) for v in inputs["image_grid_hw"][0])
    assert answer.grid == (gh, gw) and gh != gw
    model = vit.open_vlm(folders["nemotron_h_omni"]).model
    inner = next(m for m in model.modules() if callable(getattr(m, "pixel_shuffle", None)))
    patches = torch.arange(gh * gw, dtype=torch.float32).view(1, gh, gw, 1).expand(1, gh, gw, 4)
    shuffled = inner.pixel_shuffle(patches.contiguous(), scale_factor=0.5).reshape(-1, 16)  # (tokens, 4 x 4)
    for j in (0, 1, (gh // 2) * (gw // 2) - 1, gw // 2 + 3):
        one = torch.zeros(1, len(positions))
        one[0, j] = 1
        placed = answer.layout.place(one)[0].flatten()
        assert set(placed.nonzero()[:, 0].tolist()) == set(shuffled[j].long().tolist())
    every_map(answer, out, positions, lambda row: (by_hand(row, (gh, gw), 2, 0),))
    row = eager_image_rows(out, 1, answer.layers - 1, positions).mean(0)
    assert _differs(answer.attention(1, answer.layers - 1), by_hand(row, (gw, gh), 2, 0).T)


def test_unlimited_ocrs_global_view_steps_64_px_a_token_each_row_closed_then_a_separator(folders):
    """Unlimited-OCR's 1024-px global view: SAM's 16-px patches and its two stride-2 convolutions make the 16 x 16
    grid its encoder keeps (the SAM encoder's own output), each row of tokens then a newline, the separator last."""
    image = picture()
    answer, out, inputs, positions = asked(folders["unlimited_ocr"], image)
    model = vit.open_vlm(folders["unlimited_ocr"]).model
    with torch.no_grad():
        sam = model.model.vision_tower.sam_encoder(inputs["pixel_values"]).last_hidden_state  # (1, C, gh, gw)
    gh, gw = sam.shape[-2:]
    assert answer.grid == (gh, gw) == (inputs["pixel_values"].shape[-2] // 64, inputs["pixel_values"].shape[-1] // 64)
    assert len(positions) == gh * (gw + 1) + 1

    def expected(row):
        return (np.array([[row[r * (gw + 1) + c] for c in range(gw)] for r in range(gh)], dtype=np.float32),)

    every_map(answer, out, positions, expected)
    row = eager_image_rows(out, 1, answer.layers - 1, positions).mean(0)
    assert _differs(answer.attention(1, answer.layers - 1), by_hand(row[1:], (gh, gw), 1, 0))  # a lead, no newlines


def test_aria_and_deepseek_ocr2_image_tokens_are_learned_queries_covering_no_patch():
    """Aria's projector and DeepSeek-OCR 2's second tower read the patches through learned queries: refused naming
    them, not as a merge unit that does not fit."""
    from bench.census_vlm import generic_build
    from vit.explain.language.vlm_read_layout import tower_queries
    from vit.sources.vlm.any_vlm import learned_queries

    assert learned_queries(transformers.AriaConfig()) == (
        "its projector's learned queries, read by cross-attention over the patches (128 for 1225 patches, 256 for "
        "4900 patches: projector_patch_to_query_dict)")
    torch.manual_seed(0)
    model, _ = generic_build("deepseek_ocr2")

    class Opened:  # what tower_queries reads of an opened VLM: its model
        pass

    vlm = Opened()
    vlm.model = model
    assert tower_queries(vlm) == ("its vision tower's learned queries over the patches (query_768_resolution: 144, "
                                  "query_1024_resolution: 256)")


def test_unlimited_ocrs_local_crops_lie_on_their_canvas_before_the_global_view(folders):
    """An image past the tile size: its local crops (``patches_grid``, cut row-major) first, their canvas's rows of
    tokens each closed by a newline, then the global view's (the overview), then the separator; each crop's tokens
    over the quadrant its pixels came from."""
    image = quadrants(1280, 1280)
    answer, out, inputs, positions = asked(folders["unlimited_ocr"], image)
    crops = inputs["pixel_values_local"]
    assert [int(v) for v in inputs["patches_grid"][0]] == [2, 2]
    assert quadrant_places(crops.float()) == [(0, 0), (0, 1), (1, 0), (1, 1)]  # row-major, as get_image_features
    q, g = crops.shape[-1] // 64, inputs["pixel_values"].shape[-1] // 64
    canvas = 2 * q * (2 * q + 1)
    assert answer.grid == (2 * q, 2 * q) and answer.layout.view(True).grid == (g, g)
    assert len(positions) == canvas + g * (g + 1) + 1

    def expected(row):
        return (np.array([[row[r * (2 * q + 1) + c] for c in range(2 * q)] for r in range(2 * q)], np.float32),
                np.array([[row[canvas + r * (g + 1) + c] for c in range(g)] for r in range(g)], np.float32))

    every_map(answer, out, positions, expected)
