"""RISE (Petsiuk et al. 2018): the class's probability under random masks of the input, each mask weighted by it.

As the authors' ``explanations.py`` (github.com/eclique/RISE, ``RISE.generate_masks`` and ``RISE.forward``): ``N``
binary ``s x s`` grids, each cell kept with probability ``p1``, upsampled bilinearly (skimage's ``resize``,
``order=1``, ``mode='reflect'``) to ``(s + 1)`` cells of ``ceil(H / s)`` px and cropped at a random shift; the
saliency is ``sum_i P(class | x * mask_i) * mask_i / N / p1``. Their defaults (their Saliency notebook): ``N=6000``,
``s=8``, ``p1=0.1``. The masks are drawn from ``numpy.random.RandomState(seed)`` in the authors' order (the grids,
then each mask's two shifts), so ``np.random.seed(seed)`` before their ``generate_masks`` gives the same masks; they
are formed a batch at a time (never the ``N x H x W`` the authors keep: 1.2 GB at their defaults). The grids are
drawn ``DRAW_BYTES`` of numbers at a time, in the same order, and kept as bits (``N x s x s / 8`` bytes), so a large
``s`` never holds the ``N x s x s`` float64 draw at once; ``vit.costs.plan.rise_masks`` counts what is held.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

# The authors' defaults (their Saliency notebook's generate_masks(N=6000, s=8, p1=0.1))
N_MASKS, CELLS, P1 = 6000, 8, 0.1
# The explorer's first look: a sixth of the authors' forwards (their 6,000 took ~14 minutes on a ViT-S on a CPU),
# the authors' count one click away there; the API's and the links' default stays the authors'.
FIRST_LOOK_MASKS = 1000
DRAW_BYTES = 8 * 2**20  # the grids' uniform draws at once (float64), at least one grid's


def draw_masks(s: int) -> int:
    """The grids drawn at once: ``DRAW_BYTES`` of float64 uniforms, at least one ``s x s`` grid."""
    return max(1, DRAW_BYTES // (8 * s * s))


def held_bytes(n: int, s: int) -> int:
    """What ``Masks`` holds while it lives: the grids as bits, each mask's shift, and one draw (float64 uniforms and
    their comparison) while it draws."""
    return math.ceil(n * s * s / 8) + 16 * n + draw_masks(s) * s * s * 9


def batch_bytes(s: int, input_size: tuple[int, int]) -> int:
    """One mask's share of ``Masks.batch``: its grid unpacked, the upsampling's row and column weights at its shift
    and the product through them, in float64, and the mask in float32 and on the input (``rise``)."""
    H, W = input_size
    return 8 * (s * s + H * s + W * s + H * s + H * W) + 4 * H * W * 2


def _linear_weights(size: int, out: int) -> Tensor:
    """``(out, size)`` weights of skimage's order-1 resize along one axis (``scipy.ndimage.zoom`` with
    ``grid_mode=True``, ``mode='mirror'``: skimage's ``'reflect'``), in float64."""
    coords = (torch.arange(out, dtype=torch.float64) + 0.5) * size / out - 0.5
    low = torch.floor(coords)
    frac = coords - low
    weights = torch.zeros(out, size, dtype=torch.float64)
    for index, w in ((low, 1 - frac), (low + 1, frac)):
        i = index.long()
        if size > 1:  # mirror about the end samples, not repeating them (ndimage's 'mirror')
            period = 2 * (size - 1)
            i = i % period
            i = torch.where(i >= size, period - i, i)
        else:
            i = torch.zeros_like(i)
        weights.index_put_((torch.arange(out), i), w, accumulate=True)
    return weights


class Masks:
    """RISE's ``n`` masks of an ``input_size = (H, W)`` input, seeded: ``batch(start, stop)`` forms masks
    ``start..stop-1`` as ``(B, H, W)`` float32, each as the authors' ``generate_masks`` forms it."""

    def __init__(self, n: int, s: int, p1: float, input_size: tuple[int, int], seed: int = 0):
        H, W = input_size
        random = np.random.RandomState(seed)
        # The authors' order: every grid first, then each mask's two shifts (so their np.random.seed gives these).
        # RandomState's uniforms are one stream: rand(a + b) is rand(a) then rand(b), so drawing a few grids at a
        # time gives the authors' grids; each is kept as s * s bits.
        self.bits = np.empty((n, math.ceil(s * s / 8)), dtype=np.uint8)
        step = draw_masks(s)
        for start in range(0, n, step):
            stop = min(start + step, n)
            self.bits[start:stop] = np.packbits((random.rand(stop - start, s, s) < p1).reshape(stop - start, -1),
                                                axis=1)
        cell = (math.ceil(H / s), math.ceil(W / s))
        self.shifts = torch.tensor([(random.randint(0, cell[0]), random.randint(0, cell[1])) for _ in range(n)])
        up = ((s + 1) * cell[0], (s + 1) * cell[1])
        self.rows, self.cols = _linear_weights(s, up[0]), _linear_weights(s, up[1])  # (up_h, s), (up_w, s)
        self.n, self.s, self.p1, self.input_size = n, s, p1, (H, W)

    def grids(self, start: int, stop: int) -> Tensor:
        """Grids ``start..stop-1``: ``(B, s, s)`` float64 of 0 and 1."""
        cells = np.unpackbits(self.bits[start:stop], axis=1, count=self.s * self.s)
        return torch.from_numpy(cells.reshape(stop - start, self.s, self.s)).double()

    def batch(self, start: int, stop: int) -> Tensor:
        """Masks ``start..stop-1``: ``(B, H, W)`` float32, the upsampled grids cropped at their shifts."""
        H, W = self.input_size
        shifts = self.shifts[start:stop]  # (B, 2)
        rows = self.rows[shifts[:, :1] + torch.arange(H)]  # (B, H, s): the crop's rows of the upsampling
        cols = self.cols[shifts[:, 1:] + torch.arange(W)]  # (B, W, s)
        return (rows @ self.grids(start, stop) @ cols.transpose(1, 2)).float()  # (B, H, W)


def rise(forward, x: Tensor, class_index: int, masks: Masks, batch: int = 100, progress=None) -> Tensor:
    """RISE's saliency of ``class_index`` for one input ``x (1, C, H, W)``: ``(1, H, W)`` (the authors'
    ``RISE.forward``'s row of the class). ``forward`` gives logits ``(B, classes)``, turned to probabilities by
    a softmax as the authors' ``nn.Sequential(model, nn.Softmax(dim=1))``; ``batch`` masked inputs at once (their
    ``gpu_batch``, default 100). ``progress(done, total)``: masks done."""
    H, W = masks.input_size
    if x.shape[0] != 1 or tuple(x.shape[2:]) != (H, W):
        raise ValueError(f"RISE explains one {H}x{W} input; got {tuple(x.shape)}")
    saliency = torch.zeros(H * W, dtype=torch.float32, device=x.device)
    with torch.no_grad():
        for start in range(0, masks.n, batch):
            stop = min(start + batch, masks.n)
            m = masks.batch(start, stop).to(x.device)  # (B, H, W)
            p = torch.softmax(forward(m[:, None] * x), dim=1)[:, class_index]  # (B,)
            saliency += p @ m.view(stop - start, H * W)
            if progress is not None:
                progress(stop, masks.n)
    return (saliency / masks.n / masks.p1).view(1, H, W)
