"""Attention flow: the networkx preflow-push solver (before) vs scipy's Dinic + exact min cut (now), side by side.

    python bench/bench_flow.py [--tokens 65 197 261] [--layers 12] [--old-up-to 65]

Random ViT-B-like attentions (12 heads); prints seconds per map for each solver and the largest difference
between them. The old solver is timed only up to ``--old-up-to`` tokens (it takes minutes beyond).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from networkx.algorithms.flow import build_residual_network, preflow_push  # noqa: E402

from vit.explain.methods.attention import rollout_factor  # noqa: E402
from vit.explain.methods.attention_flow import _flow_row, flow_graph  # noqa: E402


def old_flow_row(matrices: np.ndarray, query: int) -> np.ndarray:
    """The solver before this change (vit/attention_flow.py at 8d39407): networkx preflow-push per input token."""
    L, T, _ = matrices.shape
    G = flow_graph(matrices, query)
    residual = build_residual_network(G, "capacity")
    values = np.array([preflow_push(G, L * T + query, t, residual=residual, value_only=True).graph["flow_value"]
                       for t in range(T)])
    return values / values.sum()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[65, 197, 261])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--old-up-to", type=int, default=65)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for T in args.tokens:
        g = torch.Generator().manual_seed(T)
        attentions = [torch.randn(1, 12, T, T, generator=g).mul(3).softmax(-1).double() for _ in range(args.layers)]
        matrices = torch.stack([rollout_factor(a, "mean", num_prefix_tokens=0)[0] for a in attentions]).numpy()
        start = time.perf_counter()
        new = _flow_row(matrices, 0)
        new_s = time.perf_counter() - start
        line = f"{T:4d} tokens, {args.layers} layers: scipy Dinic + min cut {new_s:7.2f} s"
        if T <= args.old_up_to:
            start = time.perf_counter()
            old = old_flow_row(matrices, 0)
            old_s = time.perf_counter() - start
            diff = np.abs(old - new).max()
            line += f" | networkx preflow-push {old_s:7.2f} s ({old_s / new_s:.1f}x) | max |diff| {diff:.1e}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
