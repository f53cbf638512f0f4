"""SparseMM's visual scores (issue 115, item 2) against the authors' own output, without their code: their repository
carries no licence, so ``tests/reference/sparsemm/golden.npz`` keeps only fixed inputs (the tiny random LLaVA's and
Qwen2.5-VL's attention rows at each hit, and the hit regions' positions) and what the authors' ``hit_score``, run
unchanged from a checkout, made of them (``make_golden.py`` beside it; ``tests/test_vlm_heads.py`` checks, where
``SPARSEMM_REPO`` names a checkout, that the stored scores are still theirs). Here ``hit_scores``, the scoring
``VLMAnswer.visual_heads`` runs on the answer's rows, is held to those scores exactly; no model is built.
"""

from pathlib import Path

import numpy as np
import pytest
import torch

from vit.explain.language.inside.heads import hit_scores

GOLDEN = Path(__file__).parent / "reference" / "sparsemm" / "golden.npz"
KINDS = ["llava", "qwen2_5_vl"]


def stored(golden, kind: str) -> tuple[list[torch.Tensor], list[torch.Tensor], np.ndarray]:
    """``kind``'s hits from the fixture: each hit's (L, H, S) rows and region positions, and the authors' (L, H)
    scores."""
    count = sum(1 for name in golden.files if name.startswith(f"{kind}_rows_"))
    rows = [torch.from_numpy(golden[f"{kind}_rows_{k}"]) for k in range(count)]
    regions = [torch.from_numpy(golden[f"{kind}_region_{k}"]) for k in range(count)]
    return rows, regions, golden[f"{kind}_scores"]


@pytest.fixture(scope="module")
def golden():
    with np.load(GOLDEN) as data:  # no pickles: the strings are numpy strings
        yield {kind: stored(data, kind) for kind in KINDS} | {"commit": str(data["commit"])}


def test_the_fixture_was_made_by_the_authors_file_and_is_unambiguous(golden):
    assert golden["commit"] == "f52655b624d2c2114c59d9e48a1cb545feaea0dd"
    for kind in KINDS:
        rows, regions, theirs = golden[kind]
        assert len(rows) == len(regions) == 7 and theirs.dtype == np.float64
        # one top-1 key in every row: argmax and their topk(1) cannot part on a tie
        assert all(((row == row.amax(-1, keepdim=True)).sum(-1) == 1).all() for row in rows)
        assert theirs.any() and not theirs.all()  # some heads hit, some do not


@pytest.mark.parametrize("kind", KINDS)
def test_the_visual_scores_are_sparsemms_hit_score_output_on_the_stored_rows(golden, kind):
    rows, regions, theirs = golden[kind]
    np.testing.assert_array_equal(hit_scores(rows, regions), theirs)
    # as visual_heads gives them: one hit at a time, each a list of its layers' (H, S) rows
    np.testing.assert_array_equal(hit_scores(([*row] for row in rows), iter(regions)), theirs)


def test_no_hit_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^give at least one \(answer token, box\) hit to score the visual heads$"):
        hit_scores([], [])
