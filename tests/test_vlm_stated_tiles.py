"""Tiles a processor states, placed by what it states, not by the model's name (issue 113): Aya Vision and Qianfan-OCR
(the GOT-OCR2 image processor's crops: the canvas its ``crop_to_patches`` settings choose, the processor's own
``images_kwargs`` over its image processor's) and Granite-Docling (its image processor's ``rows`` and ``cols``),
types the project's list of named families never held, built tiny by the VLM census's generic builder with their own
processors' classes and saved whole. Each tile's image tokens cover the part of the canvas its pixels came from (read
off the colours of the pixels the tower read, transformers alone), the whole image's one tile after them the
overview; the answer is ``generate``'s and each map the eager row placed by hand. Tiles taken column-major would be
another map. Where the processor states no canvas, the tokens answer unplaced and a map is refused in one line.
"""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_vlm_answer import (  # noqa: E402
    NEW_TOKENS,
    QUESTION,
    _differs,
    by_hand,
    eager_generate,
    eager_image_rows,
    quadrant_places,
    quadrants,
)
from vlm_saved import saved  # noqa: E402

import vit  # noqa: E402
from vit.registry import VLM_ARCHITECTURES  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

KINDS = ("aya_vision", "qianfan_ocr", "granite_docling")


@pytest.fixture(scope="module", params=KINDS)
def tiled(request, tmp_path_factory):
    """``(kind, folder)``: the census's tiny ``kind``, its processor cutting an image into at most 4 tiles (a square
    image into 2 x 2, one quadrant each) and the whole image after them, saved whole."""
    folder = tmp_path_factory.mktemp(request.param)
    saved(request.param, folder, images={"max_patches": 4})
    return request.param, folder


def test_stated_tiles_are_placed_where_the_processor_cut_them(tiled):
    kind, folder = tiled
    assert kind not in VLM_ARCHITECTURES
    image = quadrants(800, 800)
    answer = vit.ask_vlm(vit.open_vlm(folder), image, QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, image_token = eager_generate(folder, image)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    pixels = inputs["pixel_values"]
    tiles = pixels[0] if pixels.dim() == 5 else pixels  # Granite-Docling's (1, views, C, H, W)
    places = quadrant_places(tiles[:-1].float())  # the whole image last
    assert sorted(places) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    config = answer.layout
    (gh, gw), unit = config.view_grid, config.unit
    per = (gh // unit) * (gw // unit)
    assert len(positions) == 5 * per and answer.grid == (2 * gh, 2 * gw) and torch.equal(config.positions, positions)
    for i in range(NEW_TOKENS):
        for layer in range(answer.layers):
            heads = eager_image_rows(out, i, layer, positions)
            np.testing.assert_allclose(answer.image_rows(i, layer).numpy(), heads, rtol=0, atol=1e-5)
            for head in (0, None):
                row = heads.mean(0) if head is None else heads[head]
                expected = np.zeros((2 * gh, 2 * gw), dtype=np.float32)
                for k, (r, c) in enumerate(places):
                    expected[gh * r:gh * (r + 1), gw * c:gw * (c + 1)] = by_hand(row[per * k:per * (k + 1)],
                                                                                 (gh, gw), unit, 0)
                np.testing.assert_allclose(answer.attention(i, layer, head), expected, rtol=0, atol=1e-5)
                np.testing.assert_allclose(answer.attention(i, layer, head, overview=True),
                                           by_hand(row[-per:], (gh, gw), unit, 0), rtol=0, atol=1e-5)
    row = eager_image_rows(out, 1, answer.layers - 1, positions).mean(0)
    column_major = np.zeros((2 * gh, 2 * gw), dtype=np.float32)
    for k in range(4):
        column_major[gh * (k % 2):gh * (k % 2 + 1), gw * (k // 2):gw * (k // 2 + 1)] = by_hand(
            row[per * k:per * (k + 1)], (gh, gw), unit, 0)
    assert _differs(answer.attention(1, answer.layers - 1), column_major)


def test_tiles_no_canvas_states_answer_unplaced_and_a_map_is_refused_in_one_line(tiled, monkeypatch):
    from vit.explain.language import vlm_read_layout

    kind, folder = tiled
    monkeypatch.setattr(vlm_read_layout, "stated_canvas", lambda vlm, image: None)
    answer = vit.ask_vlm(vit.open_vlm(folder), quadrants(800, 800), QUESTION, max_new_tokens=2)
    assert len(answer.tokens) == 2 and answer.image_rows(1, 0).shape[-1] == len(answer.layout.positions)
    with pytest.raises(ValueError, match=r"^its image tokens are not placed on the image: the processor gave "
                                         r"pixel_values of shape .* tiles or crops whose canvas neither it nor the "
                                         r"config states; their values come as a list over the image tokens "
                                         r"\(image_rows\)$"):
        answer.attention(0)
