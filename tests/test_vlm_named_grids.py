"""Grids a processor names beside its flattened patches, read by what it gives, not by the model's name (issue 113):
LFM2-VL (SigLIP 2's NaFlex patches, ``spatial_shapes``, pixel-unshuffled 2 x 2), Gemma 4 (``image_position_ids``,
each patch's column and row, pooled 3 x 3), MiniCPM-o-OCR and MiniCPM-V 4.6 / 4.7 (a strip of patches and
``target_sizes``, merged 2 x 2 once or twice: Qwen 3.5 language models, whose attention layers call transformers'
attention interface though the model declines the flag for its linear-attention ones), LFM 3-VL (a stack of
convolutions and attention layers the census's builder keeps one of each), LightOnOCR (a patch merger that drops the
patches past its last whole 2 x 2 unit) and HunYuan-VL (rows of units each closed by a newline token), built tiny by
the VLM census's generic builder with their own processors' classes and saved whole. Each answers with
``generate``'s tokens, each answer token's attention at every layer is the eager row, and its image tokens are placed
row-major over their merge units on the grid the processor names, checked by hand on a grid the placement would fail
transposed.
"""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_vlm_answer import (  # noqa: E402
    QUESTION,
    by_hand,
    eager_generate,
    eager_image_rows,
    picture,
)
from vlm_saved import saved  # noqa: E402

import vit  # noqa: E402
from vit.registry import VLM_ARCHITECTURES  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

# Each type's grid for the 90 x 70 picture, as its processor names it, the output naming it, and the merge unit
GRIDS = {"lfm2_vl": ((16, 20), "spatial_shapes", 2), "gemma4": ((42, 54), "image_position_ids", 3),
         "minicpm_ocr": ((28, 36), "target_sizes", 2), "minicpmv4_6": ((28, 36), "target_sizes", 4),
         "minicpmv4_7": ((28, 36), "target_sizes", 4), "lfm3_vl": ((4, 6), None, 2),
         # LightOnOCR: its processor's 80 x 96 px of 14-px patches (5 x 6), merged 2 x 2 by an unfold that drops
         # the last row, as its processor counts side // 28 tokens: 4 x 6 patches covered
         "lighton_ocr": ((4, 6), "image_sizes", 2)}


@pytest.fixture(scope="module", params=list(GRIDS))
def asked(request, tmp_path_factory):
    """``(kind, vit's answer, transformers' eager generate output, the processor's inputs, image token id)``."""
    folder = tmp_path_factory.mktemp(request.param)
    saved(request.param, folder)
    answer = vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=3)
    return request.param, answer, *eager_generate(folder, picture())


def test_the_answer_and_its_rows_are_generates(asked):
    kind, answer, out, inputs, image_token = asked
    assert kind not in VLM_ARCHITECTURES
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()[:3]
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    assert torch.equal(answer.layout.positions, positions)
    for i in range(len(answer.tokens)):
        for layer in range(len(out.attentions[0])):
            np.testing.assert_allclose(answer.image_rows(i, layer).numpy(), eager_image_rows(out, i, layer, positions),
                                       rtol=0, atol=1e-5)


def test_the_image_tokens_are_placed_row_major_on_the_grid_the_processor_names(asked):
    kind, answer, out, inputs, image_token = asked
    (gh, gw), output, unit = GRIDS[kind]
    if output == "image_position_ids":  # each patch's (column, row), -1 for padding
        where = inputs[output][0]
        assert (int(where[:, 1].max()) + 1, int(where[:, 0].max()) + 1) == (gh, gw)
    elif output == "image_sizes":  # pixels, 14-px patches, the merger's whole units
        assert inputs[output].tolist() == [[80, 96]] and (80 // 14 // unit * unit, 96 // 14 // unit * unit) == (gh, gw)
        assert answer.layout.pixels.shape == (gh * 14, gw * 14, 3)  # drawn over the patches its tokens cover
    elif output is not None:
        assert inputs[output].tolist() == [[gh, gw]]
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    assert len(positions) == (gh // unit) * (gw // unit)
    assert answer.layout.grid == (gh, gw) and answer.layout.unit == unit and answer.layout.lead == 0
    last = len(out.attentions[0]) - 1  # the attention layers' (Qwen 3.5's linear-attention ones have no rows)
    for i in range(len(answer.tokens)):
        row = eager_image_rows(out, i, last, positions).mean(0)
        ours = answer.attention(i, layer=last)
        np.testing.assert_allclose(ours, by_hand(row, (gh, gw), unit, 0), rtol=0, atol=1e-5)
        transposed = row.reshape(gw // unit, gh // unit).T.repeat(unit, 0).repeat(unit, 1)
        assert np.abs(ours - transposed).max() > 1e-4  # the units laid column-major: another map


@pytest.fixture(scope="module")
def hunyuan(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hunyuan_vl")
    saved("hunyuan_vl", folder)
    return vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=3), *eager_generate(folder, picture())


def test_rows_closed_by_a_newline_are_placed_without_it(hunyuan):
    """HunYuan-VL's merger writes its image as a begin token, each row of 2 x 2 units followed by a newline token,
    then an end token, all with its image token: each patch is placed under its unit's token, the begin, end and
    newline tokens over none (transformers' ``HunYuanVLVisionPatchMerger``: ``image_begin``, ``image_newline``,
    ``image_end``)."""
    answer, out, inputs, image_token = hunyuan
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()[:3]
    (_, gh, gw), unit = inputs["image_grid_thw"][0].tolist(), 2
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    wide = gw // unit + 1  # a row's units and its newline
    assert len(positions) == 1 + (gh // unit) * wide + 1 and answer.grid == (gh, gw)
    for i in range(len(answer.tokens)):
        for layer in range(len(out.attentions[0])):
            heads = eager_image_rows(out, i, layer, positions)
            np.testing.assert_allclose(answer.image_rows(i, layer).numpy(), heads, rtol=0, atol=1e-5)
            row = heads.mean(0)
            expected = np.array([[row[1 + (r // unit) * wide + c // unit] for c in range(gw)] for r in range(gh)])
            np.testing.assert_allclose(answer.attention(i, layer), expected, rtol=0, atol=1e-5)
    row = eager_image_rows(out, 1, 0, positions).mean(0)
    no_newlines = by_hand(row[1:], (gh, gw), unit, 0)  # the units taken as if no newline closed each row
    assert np.abs(answer.attention(1, 0) - no_newlines).max() > 1e-4
