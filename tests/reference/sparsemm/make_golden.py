"""Writes ``golden.npz`` beside this file: SparseMM's own ``hit_score`` run unchanged (from a checkout named by
``SPARSEMM_REPO``; see README.md) on fixed inputs, and those inputs, so that CI holds our visual scores to the authors'
output without their code (``tests/test_vlm_heads_golden.py``).

The inputs are those of ``tests/test_vlm_heads.py::test_the_visual_scores_are_sparsemms_own_hit_score``: the tiny
random LLaVA's and Qwen2.5-VL's eager ``generate`` (seed 0), and for each hit of ``sparsemm_hits`` the step's
attention rows that ``hit_score`` reads (``[layer][0][head][-1]``: the query that predicted the answer token, over
every position; kept in the model's float32) and the region's positions. Stored per model ``kind``:
``{kind}_rows_{k}`` (L, H, S) float32, ``{kind}_region_{k}`` int64, ``{kind}_scores`` (L, H) float64, the authors'
scores summed over the hits in order; with ``commit`` and ``sha256``, the file it was run from.

    SPARSEMM_REPO=/tmp/SparseMM python tests/reference/sparsemm/make_golden.py
"""

import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden.npz"
COMMIT = "f52655b624d2c2114c59d9e48a1cb545feaea0dd"


class _Temp:
    """What ``saved_whole`` asks of pytest's ``tmp_path_factory``: a fresh folder per name."""

    def __init__(self, root: str):
        self.root = root

    def mktemp(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.root))


def main() -> None:
    if not os.environ.get("SPARSEMM_REPO"):
        sys.exit("set SPARSEMM_REPO to a checkout of CR400AF-A/SparseMM at f52655b (see README.md beside this file)")
    with tempfile.TemporaryDirectory(prefix="sparsemm-golden-") as root:
        # hermetic, as tests/conftest.py makes the tests: no real home or Hugging Face cache is read
        os.environ.update(HOME=root, HF_HOME=f"{root}/hf", HF_HUB_CACHE=f"{root}/hf/hub", HF_HUB_OFFLINE="1",
                          XDG_CACHE_HOME=f"{root}/.cache")
        sys.path[:0] = [str(HERE.parents[1]), str(HERE.parents[2])]  # tests/ and the repository root (vit)
        import torch
        from test_vlm_answer import eager_generate, picture, saved_whole
        from test_vlm_heads import KINDS, SPARSEMM_SHA256, run_hit_score, sparsemm_hits, sparsemms_hit_score

        stored = {"commit": np.str_(COMMIT), "sha256": np.str_(SPARSEMM_SHA256)}
        for kind, folder in saved_whole(_Temp(root), KINDS).items():
            out, inputs, image_token = eager_generate(folder, picture())
            positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
            hits = sparsemm_hits(kind, positions)
            rows = [torch.stack([layer[0, :, -1] for layer in out.attentions[i]]) for i, _, _ in hits]  # (L, H, S)
            layers, heads = rows[0].shape[:2]
            hit_score = sparsemms_hit_score(layers, heads)
            regions = [region for _, _, region in hits]
            stored_steps = [(row[:, None, :, None, :], region) for row, region in zip(rows, regions, strict=True)]
            with contextlib.redirect_stdout(io.StringIO()):  # their function prints each hit's region size
                scores = run_hit_score(hit_score, layers, heads, stored_steps)  # (L, 1, H, 1, S): [layer][0][head][-1]
                whole = run_hit_score(hit_score, layers, heads, [(out.attentions[i], region) for i, _, region in hits])
            assert np.array_equal(scores, whole), "the stored rows are not all that hit_score reads"
            for k, (row, region) in enumerate(zip(rows, regions, strict=True)):
                assert row.dtype == torch.float32 and ((row == row.amax(-1, keepdim=True)).sum(-1) == 1).all(), \
                    "a tied top-1 key: the fixture would not say which one hit_score takes"
                stored[f"{kind}_rows_{k}"] = row.numpy()
                stored[f"{kind}_region_{k}"] = region.numpy().astype(np.int64)
            stored[f"{kind}_scores"] = scores.astype(np.float64)
        np.savez_compressed(GOLDEN, **stored)
    print(f"{GOLDEN}: {GOLDEN.stat().st_size} bytes")


if __name__ == "__main__":
    main()
