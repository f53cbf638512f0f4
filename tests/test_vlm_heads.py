"""The heads that ground an answer (issue 115, item 2): ``VLMAnswer.grounding_heads`` against the authors' code of
Kang et al. (CVPR 2025; their ``analyze.py`` vendored unchanged under ``tests/reference/localization_heads``: its
``analyze_heads``, ``spatial_entropy`` and ``elbow_chord``) on synthetic attention and on the eager ``generate``'s
attention of the tiny random LLaVA (its forward mode: the prompt's last query over the image tokens, ``[L, H, 1, V]``);
``VLMAnswer.visual_heads`` against SparseMM's ``hit_score`` rule written out here by hand (the top-1 key of each
head's last row in the region's tokens scores ``1 / their count``) and, where a checkout of CR400AF-A/SparseMM is
named by ``SPARSEMM_REPO``, against the authors' ``hit_score`` itself, run unchanged from their file (their repository
carries no licence, so no copy of it is kept here: see ``tests/reference/sparsemm/README.md``); there its output on
fixed rows is kept (``golden.npz``, checked here against their function again, and held against ours without a
checkout by ``tests/test_vlm_heads_golden.py``).
"""

import ast
import hashlib
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("scipy")
from test_vlm_answer import NEW_TOKENS, QUESTION, eager_generate, picture, saved_whole  # noqa: E402

import vit  # noqa: E402
from vit.explain.language.inside.heads import elbow, score_maps, spatial_entropy  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

KINDS = ["llava", "qwen2_5_vl"]
CONFIG = SimpleNamespace(logic=SimpleNamespace(threshold=SimpleNamespace(method="chord", min_keep=1),
                                               entropy=SimpleNamespace(binarize_threshold=0.001)))


@pytest.fixture(scope="module")
def vlms(tmp_path_factory):
    return saved_whole(tmp_path_factory, KINDS)


@pytest.fixture(scope="module")
def asked(vlms):
    image = picture()
    return {kind: (vit.ask_vlm(vit.open_vlm(folder), image, QUESTION, max_new_tokens=NEW_TOKENS),
                   *eager_generate(folder, image)) for kind, folder in vlms.items()}


def synthetic(layers: int, heads: int = 8, side: int = 4, seed: int = 0) -> torch.Tensor:
    """[L, H, 1, V]: rows over V image tokens, some peaked, each a random share of a whole row."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(layers, heads, 1, side * side, generator=generator) * torch.rand(layers, heads, 1, 1,
                                                                                         generator=generator) * 6
    return logits.softmax(-1) * torch.rand(layers, heads, 1, 1, generator=generator)


def ours_on(attn: torch.Tensor, side: int):
    sums = attn[:, :, 0].sum(-1).double().numpy()
    return score_maps(sums, attn[:, :, 0].reshape(*attn.shape[:2], side, side).numpy())


@pytest.mark.parametrize(("layers", "seed"), [(4, 0), (4, 1), (6, 2), (2, 3)])  # 2 layers: the code's fallback
def test_the_scores_and_ranking_are_the_published_codes_on_synthetic_attention(layers, seed):
    from reference.localization_heads.analyze import analyze_heads, elbow_chord
    from reference.localization_heads.analyze import spatial_entropy as theirs

    attn = synthetic(layers, seed=seed)
    ours = ours_on(attn, 4)
    ranked = analyze_heads(CONFIG, attn, {"patch_size": 4})
    assert ours.ranked == tuple((r["layer"], r["head"]) for r in ranked)
    sums = [float(attn[lay, h, 0].sum()) for lay in range(layers) for h in range(8)]
    assert ours.threshold == pytest.approx(elbow_chord(sums), abs=1e-7) and elbow(np.array(sums)) == ours.threshold
    for lay in range(layers):
        for h in range(8):
            expected = theirs(attn[lay, h, 0].reshape(4, 4), 0.001)["spatial_entropy"]
            assert spatial_entropy(attn[lay, h, 0].reshape(4, 4).numpy()) == pytest.approx(expected, abs=1e-6)
    for r in ranked:
        assert ours.spatial_entropy[r["layer"], r["head"]] == pytest.approx(r["spatial_entropy"], abs=1e-6)
        assert ours.attention_sum[r["layer"], r["head"]] == pytest.approx(r["attn_sum"], abs=1e-7)
        assert not ours.last_row[r["layer"], r["head"]]
    if layers > 2:
        assert ours.ranked and all(layer > 1 for layer, _ in ours.ranked)


def test_an_answers_localization_heads_are_the_published_codes_on_the_eager_attention(asked):
    from reference.localization_heads.analyze import analyze_heads

    answer, out, inputs, image_token = asked["llava"]
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    attn = torch.stack([layer[0, :, -1:, positions] for layer in out.attentions[0]])  # [L, H, 1, V]: the last query
    ranked = analyze_heads(CONFIG, attn, {"patch_size": 4})
    ours = answer.grounding_heads(0)
    assert ours.ranked == tuple((r["layer"], r["head"]) for r in ranked)
    np.testing.assert_allclose(ours.attention_sum, attn[:, :, 0].sum(-1).numpy(), atol=1e-5)
    for r in ranked:
        assert ours.spatial_entropy[r["layer"], r["head"]] == pytest.approx(r["spatial_entropy"], abs=1e-5)


def test_a_merged_units_map_has_the_token_grids_entropy(asked):
    """Qwen2.5-VL's 4 x 6 patches are 2 x 3 merge units: the entropy on the patch grid is the code's on the tokens."""
    from reference.localization_heads.analyze import spatial_entropy as theirs

    answer, out, inputs, image_token = asked["qwen2_5_vl"]
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    ours = answer.grounding_heads(0)
    checked = 0
    for layer, attention in enumerate(out.attentions[0]):
        for head in range(answer.heads):
            if np.isfinite(ours.spatial_entropy[layer, head]):
                tokens = attention[0, head, -1, positions].reshape(2, 3)
                expected = theirs(tokens, 0.001)["spatial_entropy"]
                assert ours.spatial_entropy[layer, head] == pytest.approx(expected, abs=1e-5)
                checked += 1
    assert checked


@pytest.mark.parametrize("kind", KINDS)
def test_the_visual_scores_are_sparsemms_hit_rule_by_hand(asked, kind):
    answer, out, inputs, image_token = asked[kind]
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    box, tokens = ((0, 0, 2, 2), positions[[0, 1, 4, 5]]) if kind == "llava" else ((0, 0, 2, 4), positions[[0, 1]])
    whole = (0, 0, *answer.grid)
    hits = [(i, box) for i in range(NEW_TOKENS)] + [(1, whole)]
    expected = np.zeros((answer.layers, answer.heads))
    for i, region in [(i, tokens) for i in range(NEW_TOKENS)] + [(1, positions)]:
        for layer in range(answer.layers):
            for head in range(answer.heads):
                top = int(out.attentions[i][layer][0, head, -1].topk(1).indices[0])
                if top in region.tolist():
                    expected[layer, head] += 1 / len(region)
    np.testing.assert_allclose(answer.visual_heads(hits), expected, atol=1e-12)
    assert expected.any()


# SparseMM's visual-head finder: the file, at the commit read, and its sha256 (a changed file is refused, not run)
SPARSEMM_FILE = "visual_head/qwen_visual_head.py"  # CR400AF-A/SparseMM at f52655b624d2c2114c59d9e48a1cb545feaea0dd
SPARSEMM_SHA256 = "76d65eeeb33cc667fd686cff7224f2277ce1e65488d82303391cc5ed74a99805"


def sparsemms_hit_score(layers: int, heads: int):
    """The authors' ``hit_score``, unchanged, from ``$SPARSEMM_REPO/visual_head/qwen_visual_head.py``. The module loads
    a 7B model when imported, so only the function's own source is taken (by ``ast``) and run with the two module
    names it reads, ``layer_num`` and ``head_num``, set to the tiny model's."""
    root = os.environ.get("SPARSEMM_REPO")
    if not root:
        pytest.skip("SPARSEMM_REPO names no checkout of CR400AF-A/SparseMM (no licence: not vendored)")
    source = (Path(root) / SPARSEMM_FILE).read_bytes()
    assert hashlib.sha256(source).hexdigest() == SPARSEMM_SHA256, "not the file read at f52655b"
    text = source.decode()
    tree = ast.parse(text)
    [function] = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "hit_score"]
    namespace = {"layer_num": layers, "head_num": heads}
    exec(compile(ast.get_source_segment(text, function), SPARSEMM_FILE, "exec"), namespace)
    return namespace["hit_score"]


def sparsemm_hits(kind: str, positions: torch.Tensor) -> list[tuple[int, tuple | None, torch.Tensor]]:
    """The hits the authors' ``hit_score`` is run on for ``kind``'s tiny answer: ``(answer token, box, the box's image
    tokens' positions in the whole sequence)``, box None the whole image (``positions``: every image token's).
    ``tests/reference/sparsemm/make_golden.py`` stores the same."""
    box, tokens = ((0, 0, 2, 2), positions[[0, 1, 4, 5]]) if kind == "llava" else ((0, 0, 2, 4), positions[[0, 1]])
    last = ((0, 2, 2, 4), positions[[2, 3, 6, 7]]) if kind == "llava" else (None, positions)
    return [(i, box, tokens) for i in range(NEW_TOKENS)] + [(1, None, positions), (2, *last)]


def run_hit_score(hit_score, layers: int, heads: int, steps) -> np.ndarray:
    """(L, H): the authors' ``hit_score`` called as their ``decode`` loop calls it, once per answer token read off a
    region, on ``steps``: ``(that step's attentions, indexed [layer][0][head][-1], the region's positions as
    bbox_token_idx)``. Their function prints each hit's region size: the caller swallows it."""
    visual_head_score = [[[0, ""] for _ in range(heads)] for _ in range(layers)]
    for k, (attentions, region) in enumerate(steps):
        hit_score(attentions, visual_head_score, None, f"<{k}>", region)
    return np.array([[score for score, _ in layer] for layer in visual_head_score])


@pytest.mark.parametrize("kind", KINDS)
def test_the_visual_scores_are_sparsemms_own_hit_score(asked, kind, capsys):
    answer, out, inputs, image_token = asked[kind]
    hit_score = sparsemms_hit_score(answer.layers, answer.heads)
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    hits = sparsemm_hits(kind, positions)
    theirs = run_hit_score(hit_score, answer.layers, answer.heads,
                           [(out.attentions[i], region) for i, _, region in hits])
    capsys.readouterr()
    assert theirs.any() and not theirs.all()
    whole = (0, 0, *answer.grid)
    np.testing.assert_allclose(answer.visual_heads([(i, whole if box is None else box) for i, box, _ in hits]), theirs,
                               atol=1e-12)


def test_the_stored_golden_scores_are_sparsemms_own_hit_score(capsys):
    """The committed fixture's scores (``tests/test_vlm_heads_golden.py`` holds ours to them without a checkout)
    are the authors' ``hit_score`` on its stored rows."""
    from test_vlm_heads_golden import GOLDEN, stored

    with np.load(GOLDEN) as golden:
        assert str(golden["sha256"]) == SPARSEMM_SHA256
        for kind in KINDS:
            rows, regions, expected = stored(golden, kind)
            layers, heads = expected.shape
            # (L, 1, H, 1, S): what their [layer][0][head][-1] reads
            steps = [(row[:, None, :, None, :], region) for row, region in zip(rows, regions, strict=True)]
            theirs = run_hit_score(sparsemms_hit_score(layers, heads), layers, heads, steps)
            capsys.readouterr()
            np.testing.assert_array_equal(theirs, expected)


def test_what_does_not_fit_is_refused_in_one_line(asked):
    answer = asked["llava"][0]
    with pytest.raises(ValueError, match=r"^box must be \(top, left, bottom, right\) whole patches"):
        answer.visual_heads([(0, (0, 0, 9, 9))])
    with pytest.raises(ValueError, match=r"^answer token 9 does not exist"):
        answer.grounding_heads(9)
