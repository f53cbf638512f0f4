"""Attention flow (Abnar & Zuidema 2020): the maximum flow from an output token to each input token.

The layers form a graph: node ``(l, t)`` is token ``t`` after ``l`` layers, and the edge from
``(l, i)`` down to ``(l - 1, j)`` has capacity ``Â_{l-1}[i, j]``, the heads' mean attention plus
the residual, rows renormalised (as in rollout). The flow map of a query token is the max-flow
value from its node at the top to every input node, normalised to sum to 1, as in the
reference (samiraabnar/attention_flow ``attention_graph_util.py``: ``get_adjmat``,
``compute_flows``).

One max-flow problem per input token over ``L * T^2`` edges: each is solved by scipy's Dinic
(``scipy.sparse.csgraph.maximum_flow``) on the capacities scaled to integers, and its value is then
read exactly, as the real capacity of the minimum cut that flow finds (max-flow = min-cut). That
equals the real-valued max flow whenever no other cut is within ``L * T / FLOW_SCALE`` of the
minimum (ties give the same value either way); the reference's Edmonds-Karp agrees to 1e-9 in
the tests. ViT-B/16 at 224 px (197 tokens) takes seconds instead of minutes (``bench/bench_flow.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from vit.explain.methods.attention import layers_up_to, rollout_factor

if TYPE_CHECKING:  # networkx and scipy load when a flow is computed, not with every page that can show one
    import networkx as nx
    from scipy import sparse

# Time grows ~T^3: 197 tokens ~4 s, 261 ~10 s on 2 busy cores (bench/bench_flow.py), 400 ~40 s; beyond, refuse.
MAX_FLOW_TOKENS = 400
FLOW_SCALE = 2**28  # capacities (each <= 1, rows summing to 1) as integers; flows stay below 2**29 < int32's max


class TooManyTokensError(ValueError):
    """Attention flow over this many tokens would take too long."""


def flow_graph(matrices: np.ndarray, query: int) -> nx.DiGraph:
    """The layered graph of ``matrices (L, T, T)`` (row-stochastic, residual included) seen from ``query`` at the top.

    Node ``l * T + t`` is token ``t`` after ``l`` layers; only the query's node of the top layer
    is kept (the others carry no flow from it). Zero capacities get no edge, as in the
    reference's ``from_numpy_matrix``.
    """
    import networkx as nx

    L, T, _ = matrices.shape
    G = nx.DiGraph()
    G.add_nodes_from(range((L + 1) * T - T))
    G.add_node(L * T + query)
    for layer in range(L, 0, -1):
        sources = [query] if layer == L else range(T)
        for i in sources:
            row = matrices[layer - 1, i]
            G.add_edges_from((layer * T + i, (layer - 1) * T + j, {"capacity": float(row[j])})
                             for j in np.flatnonzero(row))
    return G


def flow_capacities(matrices: np.ndarray, query: int) -> sparse.csr_matrix:
    """``flow_graph`` as a sparse ``((L+1)T, (L+1)T)`` capacity matrix, built without networkx (466k edges for
    ViT-B/16 at 224 px): row ``l * T + i``, column ``(l - 1) * T + j`` holds ``matrices[l - 1, i, j]``."""
    from scipy import sparse

    L, T, _ = matrices.shape
    n = (L + 1) * T
    rows, cols, values = [], [], []
    for layer in range(L, 0, -1):
        sources = np.array([query]) if layer == L else np.arange(T)
        block = matrices[layer - 1][sources]  # (S, T)
        i, j = np.nonzero(block)  # zero capacities get no edge, as in the reference
        rows.append(layer * T + sources[i])
        cols.append((layer - 1) * T + j)
        values.append(block[i, j])
    return sparse.csr_matrix((np.concatenate(values), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n))


def _flow_row(matrices: np.ndarray, query: int, progress: Callable[[int, int], None] | None = None,
              done: int = 0, total: int = 0) -> np.ndarray:
    from scipy.sparse import csgraph

    L, T, _ = matrices.shape
    n = (L + 1) * T
    capacity = flow_capacities(matrices, query)
    scaled = capacity.copy()
    scaled.data = np.rint(scaled.data * FLOW_SCALE).astype(np.int32)
    scaled.eliminate_zeros()
    source = L * T + query
    values = np.empty(T)
    for t in range(T):
        flow = csgraph.maximum_flow(scaled, source, t).flow  # (n, n), antisymmetric
        residual = (scaled - flow).tocsr()
        residual.data = (residual.data > 0).astype(np.int8)  # edges with room left, and back along any flow
        residual.eliminate_zeros()
        reached = np.zeros(n, dtype=bool)
        reached[csgraph.breadth_first_order(residual, source, directed=True, return_predecessors=False)] = True
        # The minimum cut's real capacity: every edge from the source's side to the other.
        values[t] = capacity[reached][:, ~reached].sum()
        if progress is not None:
            progress(done + t + 1, total)
    return values / values.sum()


def attention_flow(attentions: Sequence[Tensor], query: int = 0, head_fusion: str = "mean",
                   end_layer: int | None = None, max_tokens: int = MAX_FLOW_TOKENS,
                   progress: Callable[[int, int], None] | None = None) -> Tensor:
    """Attention flow from output token ``query`` (after ``end_layer``) to every input token: ``(B, T)``, rows sum to 1.

    ``attentions`` holds one ``(B, H, T, T)`` tensor per layer (any prefix tokens: take the
    patch part of the result with ``[:, num_prefix_tokens:]``). Raises ``TooManyTokensError``
    above ``max_tokens`` tokens. ``progress(problems solved, B * T)`` after each max-flow problem (it may raise
    to stop).
    """
    layers = layers_up_to(attentions, end_layer)
    B, _, T, _ = layers[0].shape
    if T > max_tokens:
        raise TooManyTokensError(f"attention flow solves {T} max-flow problems over {len(layers)} x {T}^2 edges per "
                                 f"image; {T} tokens is above the limit of {max_tokens}. Use rollout instead, "
                                 "or a smaller input")
    if not 0 <= query < T:
        raise ValueError(f"query token {query} is out of range for {T} tokens")
    # Rollout's factors (heads fused, residual added, rows renormalised) are the edge capacities.
    factors = torch.stack([rollout_factor(attn.detach().to("cpu", torch.float64), head_fusion, num_prefix_tokens=0)
                           for attn in layers], dim=1)  # (B, L, T, T)
    if progress is not None:
        progress(0, B * T)
    rows = [torch.from_numpy(_flow_row(factors[b].numpy(), query, progress, b * T, B * T)) for b in range(B)]
    return torch.stack(rows).to(layers[0].device)  # (B, T)
