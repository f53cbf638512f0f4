"""What the patch tokens represent: their first principal components as colours, the cosine similarity of one
token to every patch, and the patches two images (or two models) match.

The computations of DINOv3's ``notebooks/pca.ipynb`` and ``notebooks/dense_sparse_matching.ipynb`` on tokens given
here (``tests/test_dense.py`` runs those cells on the same tokens): a PCA with whitening (sklearn's
``PCA(n_components=3, whiten=True)``, its sign convention), colours ``sigmoid(2 x projection)``, and each patch's
nearest patch of the other image by cosine similarity. Pure functions: tokens ``(N, D)`` in, arrays out; the
caller slices the prefix tokens off and knows the grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

COMPONENTS = 3  # red, green, blue
MATCH_CHUNK_BYTES = 64 * 2**20  # one block of the similarity matrix of two images: never the whole N_a x N_b
# Float64 copies of the patch tokens a PCA holds at once (tokens, centred tokens, U of the SVD), and float32
# unit tokens a similarity keeps per image: bytes per token and channel the dense views add to an image's bound.
DENSE_COPIES = 3 * 8 + 4


@dataclass
class PCAFit:
    """A fitted PCA: ``mean (D,)``, ``components (k, D)`` (rows: principal directions, sklearn's sign: each row's
    largest entry in absolute value is positive), ``scale (k,)`` (the square root of each component's variance,
    which whitening divides by)."""

    mean: Tensor
    components: Tensor
    scale: Tensor

    def transform(self, tokens: Tensor) -> Tensor:
        """``tokens (N, D)`` -> whitened projections ``(N, k)``, as sklearn's ``PCA(whiten=True).transform``."""
        return (tokens.double() - self.mean) @ self.components.T / self.scale


def fit_pca(tokens: Tensor, components: int = COMPONENTS) -> PCAFit:
    """The PCA of ``tokens (N, D)`` (N >= 2), in float64: sklearn's full-SVD solver (centred tokens, variance over
    N - 1, ``svd_flip`` on the components since sklearn 1.5)."""
    if tokens.dim() != 2 or tokens.shape[0] < 2:
        raise ValueError(f"a PCA needs at least 2 tokens (N, D), got shape {tuple(tokens.shape)}")
    x = tokens.double()
    mean = x.mean(dim=0)
    _, s, vt = torch.linalg.svd(x - mean, full_matrices=False)  # s (min(N, D),), vt (min(N, D), D)
    k = min(components, vt.shape[0])
    vt = vt[:k]
    signs = torch.sign(vt.gather(1, vt.abs().argmax(dim=1, keepdim=True)))  # (k, 1)
    variance = s[:k] ** 2 / (x.shape[0] - 1)
    # A component of zero variance (constant tokens) whitens to 0 rather than to inf / nan.
    scale = torch.where(variance > 0, variance.sqrt(), torch.ones_like(variance))
    return PCAFit(mean, vt * signs, scale)


class PCAMoments:
    """The mean and scatter of token sets ``(N_i, D)`` added one at a time, in float64 (Chan et al.'s pairwise
    update, stable however far the mean is from 0): the PCA of all of them together holding ``D x D`` numbers, not
    the tokens."""

    def __init__(self) -> None:
        self.count = 0
        self.mean: Tensor | None = None  # (D,)
        self.scatter: Tensor | None = None  # (D, D): the sum of outer products of the centred tokens

    def add(self, tokens: Tensor) -> None:
        """Add ``tokens (N, D)``."""
        x = tokens.double()
        n, mean = x.shape[0], x.mean(dim=0)
        centred = x - mean  # (N, D)
        if self.count == 0:
            self.count, self.mean, self.scatter = n, mean, centred.T @ centred
            return
        total, delta = self.count + n, mean - self.mean
        self.scatter = self.scatter + centred.T @ centred + torch.outer(delta, delta) * (self.count * n / total)
        self.mean = self.mean + delta * (n / total)
        self.count = total

    def fit(self, components: int = COMPONENTS) -> PCAFit:
        """``fit_pca`` of every token added: the covariance's eigenvectors are the SVD's directions, its eigenvalues
        the variances, with sklearn's sign on each."""
        if self.count < 2:
            raise ValueError(f"a PCA needs at least 2 tokens, got {self.count}")
        variance, vectors = torch.linalg.eigh(self.scatter / (self.count - 1))  # ascending
        k = min(components, self.count, variance.shape[0])
        variance, vt = variance.flip(0)[:k], vectors.flip(1)[:, :k].T  # (k,), (k, D)
        signs = torch.sign(vt.gather(1, vt.abs().argmax(dim=1, keepdim=True)))  # (k, 1)
        # Rounding leaves a zero variance at +-1e-16 of the largest where the SVD gives 0: it whitens to 0 there too.
        zero = variance <= variance.abs().max() * variance.new_tensor(torch.finfo(torch.float64).eps) * vt.shape[1]
        scale = torch.where(zero, torch.ones_like(variance), variance.clamp(min=0).sqrt())
        return PCAFit(self.mean, vt * signs, scale)


def stage_tokens(model: torch.nn.Module, stream: Tensor, layer: int) -> Tensor:
    """Layer ``layer``'s output ``(B, T_l, D_l)`` of a model with stages (Swin, Hiera) as the dense views read it:
    through the final norm in the last stage only (the norm has that stage's width: timm's
    ``forward_intermediates(norm=True)``), as it is before; float32 on the CPU."""
    config = model.config
    if config.stage_of(layer) < config.num_stages - 1:
        return stream.float().cpu()
    parameter = next(model.parameters())
    with torch.inference_mode():
        return model.norm(stream.to(parameter.device, parameter.dtype)).float().cpu()


def pca_colours(tokens: Tensor, fit: PCAFit) -> Tensor:
    """``(N, 3)`` colours in (0, 1): the notebook's ``sigmoid(2 x whitened projection)``."""
    return torch.sigmoid(fit.transform(tokens) * 2.0).float()


def pca_images(token_sets: Sequence[Tensor], foreground: float | None = None, flip: bool = False
               ) -> tuple[list[Tensor], list[Tensor | None]]:
    """Colours of several images' patch tokens (``(N_i, D)`` each) fitted on them together, so a colour means the
    same direction in all: ``(N_i, 3)`` each, and each image's foreground mask ``(N_i,)`` bool (None without one).

    ``foreground``: a threshold on the first whitened component of a first fit on every patch; the patches above
    it (below it with ``flip``: the component's sign is arbitrary) are the foreground, the PCA is fitted again on
    them alone (the notebook's fit on the foreground) and the background is black."""
    if not token_sets:
        raise ValueError("give the tokens of at least one image")
    every = torch.cat([t.double() for t in token_sets])  # (sum N_i, D)
    if foreground is None:
        fit = fit_pca(every)
        return [pca_colours(t, fit) for t in token_sets], [None] * len(token_sets)
    first = fit_pca(every, 1)
    masks = [(first.transform(t)[:, 0] < foreground) if flip else (first.transform(t)[:, 0] > foreground)
             for t in token_sets]
    chosen = every[torch.cat(masks)]
    if chosen.shape[0] < 2:
        raise ValueError(f"at most one patch is on the foreground side of threshold {foreground:g}; choose a threshold "
                         "nearer 0, or flip the side")
    fit = fit_pca(chosen)
    return [pca_colours(t, fit) * m[:, None] for t, m in zip(token_sets, masks, strict=True)], masks


def unit_tokens(tokens: Tensor) -> Tensor:
    """``tokens (N, D)`` scaled to length 1 (float32): a cosine similarity is then one matrix product."""
    return F.normalize(tokens.float(), p=2, dim=-1)


def similarity(unit: Tensor, query: Tensor) -> Tensor:
    """The cosine similarity of ``query (D,)`` to every row of ``unit (N, D)`` (from ``unit_tokens``): ``(N,)``."""
    return unit @ F.normalize(query.float(), p=2, dim=-1)


@dataclass
class Matches:
    """Patches of image A and their matches in image B, best first: ``a``, ``b`` ``(M,)`` row-major patch
    indices, ``score (M,)`` their cosine similarity."""

    a: Tensor
    b: Tensor
    score: Tensor


def nearest_patches(unit_a: Tensor, unit_b: Tensor, chunk_bytes: int = MATCH_CHUNK_BYTES
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """For unit tokens ``unit_a (N_a, D)`` and ``unit_b (N_b, D)``: each A patch's most similar B patch and that
    similarity ``(N_a,)``, and each B patch's most similar A patch and similarity ``(N_b,)`` (ties: the first).
    The ``N_a x N_b`` similarities are computed a block of A rows at a time."""
    n_a, n_b = unit_a.shape[0], unit_b.shape[0]
    rows = max(1, chunk_bytes // (4 * max(n_b, 1)))
    best_b, score_b = torch.empty(n_a, dtype=torch.long), torch.empty(n_a)
    best_a, score_a = torch.zeros(n_b, dtype=torch.long), torch.full((n_b,), -float("inf"))
    for start in range(0, n_a, rows):
        block = unit_a[start:start + rows] @ unit_b.T  # (rows, N_b)
        score_b[start:start + rows], best_b[start:start + rows] = block.max(dim=1)
        column, where = block.max(dim=0)  # (N_b,)
        better = column > score_a  # strictly: an earlier A patch keeps a tie
        score_a = torch.where(better, column, score_a)
        best_a = torch.where(better, where + start, best_a)
    return best_b, score_b, best_a, score_a


def correspondences(unit_a: Tensor, unit_b: Tensor, top: int | None = None, mutual: bool = True) -> Matches:
    """Each A patch matched to its most similar B patch (the dense-matching notebook's ``argmax``), kept when the
    match is mutual (that B patch's most similar A patch is it) with ``mutual``, the ``top`` most similar first."""
    best_b, score_b, best_a, _ = nearest_patches(unit_a, unit_b)
    a = torch.arange(unit_a.shape[0])
    if mutual:
        a = a[best_a[best_b] == a]
    order = torch.argsort(score_b[a], descending=True, stable=True)[:top]
    a = a[order]
    return Matches(a, best_b[a], score_b[a])
