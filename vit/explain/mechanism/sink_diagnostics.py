"""Sink diagnostics: which heads' attention sinks are NOPs and which broadcast (Fesser, Jacobs, Fel, Keller and
Kakade 2026, "A Unifying View of Attention Sinks").

A head whose queries all attend to one key token (a sink) can compute one of two things: nothing (the sink's value,
after the output projection, is near zero: an adaptive NOP), or one shared vector written to every token (the head's
update is near rank one: a broadcast). The statistics and the verdict are those of the authors' Stage 1,
KempnerInstitute/attention_sink @ a83cd59 ``vit_causal/diagnose_heads.py`` with ``common.py``'s ``event_class``:

- ``s = argmax_j mean_i A_ij``, the dominant key, and ``mass`` that mean; ``a_i = A_is`` for every query ``i``;
  ``routed`` the share of queries with ``a_i >= 0.5``, ``min_attention`` the least ``a_i``.
- ``u_j = gamma * W_O^h v_j``: token ``j``'s value in the head after the head's columns of the output projection and
  the layer scale (no bias); ``value_norm = ||u_s||``; ``value_ratio = ||u_s|| / mean_{j != s} ||u_j||``;
  ``head_value_ratio`` the same of the values ``v`` themselves.
- ``U = A u``, the head's update to the residual stream: ``stable_rank = ||U||_F² / sigma_1²`` (1 for a rank-one
  update), ``rank1_energy = sigma_1² / sum sigma²``, ``update_norm = mean_i ||U_i||``.
- The verdict: not a sink unless ``routed >= 0.9``; a sink is a NOP sink when ``value_ratio <= 0.2``, a broadcast
  sink when ``value_ratio >= 0.5`` and ``stable_rank <= 1.5``, else an other sink.

Here the attention is the model's own (read in head and query chunks from the stored block inputs,
``chunked.LayerInputs``: position biases, windows and rotary positions included), never a whole ``H x T x T`` layer;
``U`` is formed head by head, and its singular values come from the QR factor of the head's context
(``U = z W``, ``z = A v``: the ``hd x hd`` factor times ``W``'s rows, the same nonzero singular values as the
authors' ``T x T`` Gram matrix, without its ``T³`` eigen-decomposition). Shapes: ``B`` images, ``L`` layers, ``H``
heads, ``T`` tokens, ``hd`` a head's width, ``D`` the model's width; layers and heads from 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from vit.checkpoint import Checkpoint
from vit.core.inference import TRAINING_SIZE, InputSize, input_shape, preprocess
from vit.costs import plan
from vit.explain.mechanism import components as mechanism
from vit.explain.methods.chunked import LayerInputs
from vit.explain.methods.hidden import layout_problem
from vit.model import ViT

# The authors' thresholds (common.py: ROUTE_THR, DEF1_FRAC, NOP_RATIO_MAX, BC_RATIO_MIN, BC_SR_MAX)
ROUTED = 0.5  # a query is routed to the sink when it puts at least this much attention on it
SINK_SHARE = 0.9  # a head's dominant key is a sink when at least this share of all queries is routed to it
NOP_RATIO = 0.2  # a NOP sink's value is at most this fraction of the other tokens' mean value norm
BROADCAST_RATIO = 0.5  # a broadcast sink's value is at least this fraction of it ...
BROADCAST_RANK = 1.5  # ... and the head's update has a stable rank of at most this
VERDICTS = ("not a sink", "other sink", "NOP sink", "broadcast sink")


@dataclass
class SinkDiagnostics:
    """Per image, layer and head ``(B, L, H)`` (float32 unless said): the dominant key token and its statistics
    (the module's docstring defines each), and the verdict, one of ``VERDICTS``."""

    token: Tensor  # (B, L, H) long: s
    mass: Tensor  # mean over queries of A_is
    routed: Tensor  # share of queries with A_is >= 0.5
    min_attention: Tensor  # min over queries of A_is
    value_norm: Tensor  # ||u_s||
    value_ratio: Tensor  # ||u_s|| / mean_{j != s} ||u_j||
    head_value_ratio: Tensor  # ||v_s|| / mean_{j != s} ||v_j||
    stable_rank: Tensor  # ||U||_F² / sigma_1²
    rank1_energy: Tensor  # sigma_1² / sum sigma²
    update_norm: Tensor  # mean_i ||U_i||
    verdict: np.ndarray  # (B, L, H) str

    def counts(self) -> dict[str, int]:
        """How many (image, layer, head) cells each verdict has."""
        return {v: int((self.verdict == v).sum()) for v in VERDICTS}


def verdicts(routed: Tensor | np.ndarray, value_ratio: Tensor | np.ndarray, stable_rank: Tensor | np.ndarray
             ) -> np.ndarray:
    """Each cell's verdict (``VERDICTS``) from its routed share, value ratio and stable rank, as the authors'
    ``event_class``: a broadcast where both classes' rules would hold (they cannot: 0.2 < 0.5)."""
    routed, ratio, rank = (np.asarray(a.cpu() if isinstance(a, Tensor) else a) for a in (routed, value_ratio,
                                                                                            stable_rank))
    out = np.full(ratio.shape, VERDICTS[1], dtype=object)
    out[ratio <= NOP_RATIO] = VERDICTS[2]
    out[(ratio >= BROADCAST_RATIO) & (rank <= BROADCAST_RANK)] = VERDICTS[3]
    out[~(routed >= SINK_SHARE)] = VERDICTS[0]  # NaN (no such head) is no sink
    return out


def _rank_stats(z: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """``(rank1_energy, stable_rank)`` ``(B,)`` of ``U = z @ w`` for one head's contexts ``z`` ``(B, T, hd)`` and
    its output map ``w`` ``(hd, D)``, from ``R w`` (``z = QR``): float64, eigenvalues clamped at 0 as the authors'."""
    r = torch.linalg.qr(z.double(), mode="r").R  # (B, min(T, hd), hd)
    p = r @ w.double()  # (B, min(T, hd), D): U's nonzero singular values
    ev = torch.linalg.eigvalsh(p @ p.transpose(-1, -2)).clamp_min(0.0)  # ascending
    total, top = ev.sum(-1).clamp_min(1e-30), ev[:, -1]
    return (top / total).float(), (total / top.clamp_min(1e-30)).float()


def sink_diagnostics(model: ViT, states: Tensor, grid: tuple[int, int] | None = None) -> SinkDiagnostics:
    """The sink diagnostics of every head from the hidden states ``(B, L + 1, T, D)``
    (``mechanism.hidden_states``) on the patch ``grid`` (needed by models with rotary positions or an attention
    layout). Raises ``MechanismError`` for a model with stages (its windows and merges leave no key that all
    queries read) and where the grid is needed but missing."""
    mechanism.check_supported(model)
    mechanism.check_one_grid(model, "sink diagnostics")
    if grid is None and model.config.rope != "none":
        raise mechanism.MechanismError("this model turns q and k by rotary positions, so the patch grid must be given")
    if grid is None and layout_problem(model):
        raise mechanism.MechanismError(f"this model {layout_problem(model)}, so the patch grid must be given")
    B, _, T, _ = states.shape
    inputs = LayerInputs(model, states, grid)
    keys = ("token", "mass", "routed", "min_attention", "value_norm", "value_ratio", "head_value_ratio",
            "stable_rank", "rank1_energy", "update_norm")
    per_layer: dict[str, list[Tensor]] = {k: [] for k in keys}
    others = max(T - 1, 1)
    with torch.inference_mode():
        for layer, block in enumerate(model.blocks):
            attn = block.attn
            H, hd = attn.num_heads, attn.head_dim
            v = inputs.values(layer).float()  # (B, H, T, hd)
            received = torch.zeros(B, H, T, device=v.device)  # attention each key gets, summed over queries
            z = torch.zeros_like(v)  # (B, H, T, hd): each head's context A v
            for hs, ts, probs in inputs.chunks(layer):  # probs (B, h, t, T)
                probs = probs.to(v.device)
                received[:, hs] += probs.sum(dim=2)
                z[:, hs, ts] = probs @ v[:, hs]
            mass, s = (received / T).max(dim=-1)  # (B, H)
            a = torch.zeros(B, H, T, device=v.device)  # (B, H, T): A_is, every query's attention on the sink
            for hs, ts, probs in inputs.chunks(layer):  # the sink is known only once every row is summed
                index = s[:, hs, None, None].expand(-1, -1, probs.shape[2], 1).to(probs.device)
                a[:, hs, ts] = probs.gather(-1, index)[..., 0].to(v.device)
            weight = attn.proj.weight.float().view(-1, H, hd)  # (D, H, hd)
            gamma = None if block.ls1 is None else block.ls1.float()  # (D,)
            rank1, stable, update = (torch.empty(B, H, device=v.device) for _ in range(3))
            un = torch.empty(B, H, T, device=v.device)  # ||u_j||
            for h in range(H):  # one head's (B, T, D) at a time: a hidden state's size, not H of them
                w = weight[:, h].T if gamma is None else weight[:, h].T * gamma  # (hd, D): u_j = v_j @ w
                un[:, h] = (v[:, h] @ w).norm(dim=-1)
                update[:, h] = (z[:, h] @ w).norm(dim=-1).mean(dim=-1)
                rank1[:, h], stable[:, h] = _rank_stats(z[:, h], w)
            vn = v.norm(dim=-1)  # (B, H, T)
            at_sink = s[..., None]
            us, vs = un.gather(2, at_sink)[..., 0], vn.gather(2, at_sink)[..., 0]
            other = torch.ones_like(vn, dtype=torch.bool).scatter_(2, at_sink, False)  # every token but the sink
            u_other, v_other = (un * other).sum(-1) / others, (vn * other).sum(-1) / others
            values = dict(token=s, mass=mass, routed=(a >= ROUTED).float().mean(-1), min_attention=a.min(-1).values,
                          value_norm=us, value_ratio=us / u_other.clamp_min(1e-12),
                          head_value_ratio=vs / v_other.clamp_min(1e-12), stable_rank=stable, rank1_energy=rank1,
                          update_norm=update)
            for k in keys:
                per_layer[k].append(values[k].cpu())
    out = {k: torch.stack(per_layer[k], dim=1) for k in keys}  # (B, L, H) each
    return SinkDiagnostics(**out, verdict=verdicts(out["routed"], out["value_ratio"], out["stable_rank"]))


# --- one image, as the explorer and the notebook API show it ----------------------------------------------------

@dataclass
class SinkTable:
    """One image's sink diagnostics, per layer and head ``(L, H)`` (layers and heads from 0): the numbers of
    ``SinkDiagnostics`` for that image, and the grid and prefix the token indices refer to."""

    diagnostics: SinkDiagnostics  # with B = 1
    grid: tuple[int, int]
    num_prefix_tokens: int

    def rows(self, token_label=str, first: int = 0) -> list[dict[str, object]]:
        """One row per layer and head, ``token_label(index)`` naming the sink's token. Layers and heads count from
        ``first``: 0, as every function of the API (a row's ``(layer, head)`` is what ``vit.ablate`` takes); the
        explorer's table shows them from 1, as its sidebar, and says so."""
        d = self.diagnostics
        L, H = d.token.shape[1:]
        return [{"layer": layer + first, "head": head + first, "sink token": token_label(int(d.token[0, layer, head])),
                 "mass": float(d.mass[0, layer, head]), "queries routed": float(d.routed[0, layer, head]),
                 "sink value norm": float(d.value_norm[0, layer, head]),
                 "value ratio": float(d.value_ratio[0, layer, head]),
                 "stable rank": float(d.stable_rank[0, layer, head]),
                 "verdict": str(d.verdict[0, layer, head])}
                for layer in range(L) for head in range(H)]


def sink_table(checkpoint: Checkpoint, image: Image.Image, size: InputSize = TRAINING_SIZE) -> SinkTable:
    """The sink diagnostics of one image at ``size``. Its cost is counted first (``plan.sink_diagnostics``): an
    input past the token gate or the memory limit raises ``TooManyTokens`` (one line) before any work; a model the
    diagnostics do not support raises ``MechanismError``."""
    model, p = checkpoint.model, checkpoint.preprocessing
    mechanism.check_supported(model)
    mechanism.check_one_grid(model, "sink diagnostics")
    shape = input_shape(image, p, model.config.patch_size, size)
    grid = model.patch_grid(*shape)
    plan.tokens_gate(model, grid, f"A {shape[1]}×{shape[0]} px input ({grid[0]}×{grid[1]} patches)")
    plan.decide(plan.sink_diagnostics(model, grid, f"A {shape[1]}×{shape[0]} px input"))
    x = preprocess([image], p, size, model.config.patch_size).to(next(model.parameters()).device)
    with torch.inference_mode():
        states = mechanism.hidden_states(model, x)  # (1, L + 1, T, D)
        diagnostics = sink_diagnostics(model, states, model.patch_grid(*x.shape[-2:]))
    return SinkTable(diagnostics, grid, model.num_prefix_tokens)
