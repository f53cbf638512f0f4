"""The language model's heads that ground an answer (issue 115, item 2): every head of every layer scored by how much,
and how precisely, it attends to the image.

- **Localization heads** (Kang et al., CVPR 2025, "Your Large Vision-Language Model Only Needs A Few Attention Heads
  For Visual Grounding"; the authors' ``analyze.py``, see ``tests/reference/localization_heads``): the query's
  row over the image tokens per head (the prompt's last position: answer token 0's query, as the code's forward mode
  reads it). Criterion 1, its **attention sum** over the image tokens, a head kept at or over the elbow of all heads'
  sums (the chord method: the sorted sums' point farthest from the line through their ends). Criterion 2, its
  **spatial entropy**: the map ``S`` on the image's grid, ``B = relu(S - 2 mean(S))``, the cells of ``B`` over
  ``threshold`` (the code's 0.001) in 8-connected components, ``-sum p log p`` over the components' shares of ``B``'s
  sum (inf where ``B`` is 0). Ranked: the heads at or over the elbow, past layer 1, whose map's last row holds no value
  over 0.05, lowest entropy first; where none is, the one with the largest sum that does not look at the last row.
  The map is placed on the tower's patch grid through the answer's layout (a unit of ``u x u`` patches one token's
  value: the components and their shares are the token grid's).
- **Visual heads** (SparseMM, Wang et al. 2025; ``hit_score`` in CR400AF-A/SparseMM's ``visual_head``): for each
  answer token read off a known region of the image, every head whose row's most attended key (its top 1 over every
  position it reads) is one of that region's image tokens scores ``1 / (the region's image tokens)``; the scores summed
  over the tokens given.

Rows are the answer's own (``VLMAnswer.row``: from its kept query rows and the KV cache), no forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

THRESHOLD = 0.001  # the code's ``entropy.binarize_threshold``
MARGIN = 2.0  # ``B = relu(S - MARGIN * mean(S))``
LAST_ROW = 0.05  # a head whose map's last row holds more than this is passed over (the code's ``bottom_row_focus``)
FIRST_LAYER = 2  # heads of the layers before it are passed over (the code's ``layer > 1``)


def spatial_entropy(grid: np.ndarray, threshold: float = THRESHOLD) -> float:
    """The spatial entropy of one head's map ``grid`` (gh, gw) (see the module's docstring)."""
    from scipy.ndimage import label

    grid = np.asarray(grid, dtype=np.float64)
    above = np.maximum(grid - MARGIN * grid.mean(), 0)
    components, count = label(above > threshold, structure=np.ones((3, 3)))
    total = above.sum()
    if total <= 0:
        return float("inf")
    shares = np.array([above[components == c].sum() / total for c in range(1, count + 1)])
    shares = shares[shares > 0]
    return float(-(shares * np.log(shares)).sum())


def elbow(values: np.ndarray) -> float:
    """The chord elbow of ``values``: sorted ascending, the value farthest from the line through the first and the
    last."""
    y = np.sort(np.asarray(values, dtype=np.float64).ravel())
    if len(y) <= 2:
        return float(y.min()) if len(y) else 0.0
    x = np.arange(len(y), dtype=np.float64)
    line = np.array([x[-1] - x[0], y[-1] - y[0]])
    if not np.linalg.norm(line):
        return float(y[0])
    unit = line / np.linalg.norm(line)
    points = np.stack([x - x[0], y - y[0]], axis=1)
    distance = np.linalg.norm(points - (points @ unit)[:, None] * unit, axis=1)
    return float(y[int(np.argmax(distance))])


@dataclass(frozen=True)
class HeadScores:
    """Every head's scores: ``attention_sum`` and ``spatial_entropy`` (L, H) (the entropy inf below ``threshold``,
    as the code leaves it), ``last_row`` (L, H) bool, ``threshold`` the elbow of the sums, ``ranked`` the
    localization heads ``(layer, head)``, best first."""

    attention_sum: np.ndarray
    spatial_entropy: np.ndarray
    last_row: np.ndarray
    threshold: float
    ranked: tuple[tuple[int, int], ...]


def score_maps(sums: np.ndarray, maps: np.ndarray, threshold: float = THRESHOLD) -> HeadScores:
    """``HeadScores`` of heads whose image attention sums ``sums`` (L, H) and maps ``maps`` (L, H, gh, gw) are
    given."""
    layers, heads = sums.shape
    cut = elbow(sums)
    entropy = np.full((layers, heads), np.inf)
    last_row = np.zeros((layers, heads), dtype=bool)
    for layer in range(layers):
        for head in range(heads):
            if sums[layer, head] >= cut:
                entropy[layer, head] = spatial_entropy(maps[layer, head], threshold)
                last_row[layer, head] = bool((maps[layer, head][-1] > LAST_ROW).any())
    kept = [(layer, head) for layer in range(layers) for head in range(heads)
            if np.isfinite(entropy[layer, head]) and not last_row[layer, head] and layer >= FIRST_LAYER]
    if not kept:  # the code's fallback: the largest sum that does not look at the last row
        order = sorted(((layer, head) for layer in range(layers) for head in range(heads)),
                       key=lambda lh: sums[lh], reverse=True)
        kept = [lh for lh in order if not last_row[lh]][:1]
    kept.sort(key=lambda lh: entropy[lh])
    return HeadScores(sums, entropy, last_row, cut, tuple(kept))


def same_heads(answer, what: str) -> None:
    """ValueError (one line) where the language model's layers have different numbers of heads (Inkling 2's sliding
    layers beside its global ones): ``what`` scores an (L, H) table of every layer's heads."""
    counts = sorted({rows[0].shape[0] for rows in answer._recorder.queries if rows})
    if len(counts) > 1:
        raise ValueError(f"{what} score a table of every layer's heads, and this language model's layers have "
                         f"{' or '.join(map(str, counts))} heads: ask each layer's attention per head")


def localization_heads(answer, i: int = 0, image: int = 0, threshold: float = THRESHOLD) -> HeadScores:
    """Every head's attention sum and spatial entropy over ``image`` for answer token ``i``'s query (0: the prompt's
    last position, the code's), and the localization heads ranked (see the module's docstring)."""
    answer._one_image("the localization heads' spatial entropy")
    layout = answer._image(image)
    same_heads(answer, "the localization heads")
    rows = torch.stack([answer.image_rows(i, layer, image) for layer in range(answer.layers)])  # (L, H, lead + N)
    maps = torch.stack([layout.place(layer_rows) for layer_rows in rows])  # (L, H, gh, gw)
    return score_maps(rows.sum(-1).numpy().astype(np.float64), maps.numpy(), threshold)


def hit_scores(rows, regions) -> np.ndarray:
    """(L, H) float64: SparseMM's hit rule on tensors. ``rows``: each hit's attention rows, its answer token's query
    over every position it reads, per layer (an (L, H, S) tensor, or L (H, S) tensors); ``regions``: each hit's
    positions of the region's image tokens (1-D) (iterables, read one hit at a time). A head whose row's most attended
    key is one of them scores ``1 / their count``, summed over the hits in order."""
    scores = None
    for layer_rows, tokens in zip(rows, regions, strict=True):
        top = torch.stack([row.argmax(-1) for row in layer_rows])  # (L, H) each head's most attended position
        hit = torch.isin(top, tokens).numpy().astype(np.float64) / len(tokens)
        scores = hit if scores is None else scores + hit
    if scores is None:
        raise ValueError("give at least one (answer token, box) hit to score the visual heads")
    return scores


def visual_scores(answer, hits, image: int = 0, overview: bool = False) -> np.ndarray:
    """(L, H) float64: SparseMM's visual score of every head over ``hits``, ``(answer token, box)`` pairs: each head
    whose row for that token has its most attended key among the box's image tokens scores ``1 / their count``
    (``hit_scores`` on the answer's rows)."""
    from vit.explain.language.vlm_lens import region_tokens

    layout = answer._image(image)
    same_heads(answer, "the visual heads")
    if not hits:
        return np.zeros((answer.layers, answer.heads))
    view = layout.view(overview)
    regions = [layout.positions[region_tokens(view, box)] for _, box in hits]  # every box refused before any row
    rows = ([answer.row(i, layer) for layer in range(answer.layers)] for i, _ in hits)  # L (H, t_i) each
    return hit_scores(rows, regions)
