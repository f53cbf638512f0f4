"""Attention at thousands of tokens within a fixed memory bound: computed in head and query chunks.

A layer's whole attention ``(B, H, T, T)`` costs ``H x T²`` floats: 805 MB for ViT-B/16 at 1,024 px, times
12 layers. Everything a map needs is derived from chunks instead: the layer's scaled queries and keys
``(B, H, T, hd)`` are read at the block's hook points from its stored input (``hidden.queries_and_keys``), and
``softmax(q @ k.T)`` is formed for a few heads and queries at a time, each chunk held at most ``budget``
bytes (its scores, probabilities and the softmax's temporary). Softmax runs along the keys, which a chunk
always holds whole, so every chunk is exactly the rows of the full matrix.

The rollout's CLS row (or any query's) is a row vector times each layer's factor, from the last layer down
(``rollout_row``): ``O(L x T²)`` work and ``O(T)`` memory besides one chunk, where the full product costs
``L x T³`` and ``T²`` memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from vit.costs.memory import gradient_bytes, largest_tokens  # noqa: F401  (the chunked methods' memory model)
from vit.explain.methods.attention import (
    _check_fusion,
    fuse_heads,
    layer_rows,
    layer_step,
    patch_centres,
    rollout_factor_rows,
)
from vit.explain.methods.hidden import (
    CheckpointedStates,
    bias_rows,
    layer_pattern,
    layer_qkv,
    layer_values,
    layout_problem,
    queries_keys_values,
    window_layout,
)

CHUNK_BYTES = 256 * 2**20  # the most one chunk's scores may hold (with _COPIES): the memory bound
# On a CPU a chunk of about a core's L2 cache is what the matmul, softmax and sums run fastest on: ~2x faster per
# layer than chunks of tens of MB that spill to memory (ViT-B/16 at 1,024 px, one thread). A GPU takes the budget.
FAST_CHUNK_BYTES = 2**20
_COPIES = 3  # scores, probabilities and the softmax's temporary are alive at once


def chunk_sizes(num_heads: int, tokens: int, budget: int = CHUNK_BYTES, batch: int = 1,
                target: int | None = FAST_CHUNK_BYTES) -> tuple[int, int]:
    """``(heads, queries)`` per chunk: ``batch x heads x queries x tokens`` float32 scores of about ``target``
    bytes (None: as many as the budget holds), as many queries of one head as that holds, then more heads when
    one head's every query fits; held ``_COPIES`` times they stay within ``budget`` bytes. At least one head and
    one query: a row cannot be split."""
    row = 4 * batch * tokens  # bytes of one query's row of one head
    size = budget // _COPIES if target is None else min(target, budget // _COPIES)
    queries = max(1, min(tokens, size // row))
    return max(1, min(num_heads, size // (row * queries))), queries


def _target(device: torch.device) -> int | None:
    return FAST_CHUNK_BYTES if device.type == "cpu" else None


def attention_chunks(q: Tensor, k: Tensor, heads: Sequence[int] | None = None, queries: Sequence[int] | None = None,
                     head_chunk: int | None = None, query_chunk: int | None = None, budget: int = CHUNK_BYTES,
                     softmax: bool = True, bias: Callable[[list[int]], Tensor | None] | None = None
                     ) -> Iterator[tuple[slice, slice, Tensor]]:
    """Post-softmax attention of scaled queries and keys ``(B, H, T, hd)`` in chunks covering ``heads`` x
    ``queries`` (default: all, in order), query chunks outermost: yields ``(hs, ts, probs (B, h, t, T))``, where
    ``heads[hs]`` and ``queries[ts]`` are the chunk's heads and queries. Chunk sizes default to
    ``chunk_sizes(..., budget)``. ``softmax=False`` gives the chunks of ``q @ k.T`` itself: with the gradient of
    the heads' contexts as ``q`` and the values as ``k``, the gradient of the attention. ``bias(query tokens)``:
    those rows of what the layer adds to its logits, ``(B or 1, H, t, T)`` for all ``H`` heads (``hidden.bias_rows``),
    formed once per query chunk."""
    B, H, T, _ = q.shape
    heads = list(range(H)) if heads is None else [int(h) for h in heads]
    queries = list(range(T)) if queries is None else [int(t) for t in queries]
    if not all(0 <= h < H for h in heads):
        raise ValueError(f"head indices {heads} are out of range for {H} heads")
    if not all(0 <= t < T for t in queries):
        raise ValueError(f"query tokens out of range for {T} tokens")
    auto_h, auto_t = chunk_sizes(len(heads), T, budget, B, _target(q.device))
    head_chunk, query_chunk = head_chunk or auto_h, query_chunk or auto_t
    head_slices = [slice(h0, min(h0 + head_chunk, len(heads))) for h0 in range(0, len(heads), head_chunk)]
    # Each head chunk's queries and keys are taken once (views for a run of heads), not once per query chunk.
    qs = [_take(q, 1, heads[hs]) for hs in head_slices]  # (B, h, T, hd) each
    ks = [_take(k, 1, heads[hs]).transpose(-2, -1) for hs in head_slices]  # (B, h, hd, T) each
    for t0 in range(0, len(queries), query_chunk):
        ts = slice(t0, min(t0 + query_chunk, len(queries)))
        rows = None if bias is None else bias(queries[ts])  # (B or 1, H, t, T)
        for hs, qh, kh in zip(head_slices, qs, ks, strict=True):
            scores = (_take(qh, 2, queries[ts]) @ kh).float()  # (B, h, t, T)
            if rows is not None:
                scores = scores + _take(rows, 1, heads[hs]).float()
            if softmax:  # the scores freed before the chunk is read: one copy held while its reader works, not two
                scores = scores.softmax(dim=-1)
            yield hs, ts, scores
            del scores


def _take(x: Tensor, dim: int, index: list[int]) -> Tensor:
    """``x`` at ``index`` along ``dim``: a view when the indices are one ascending run, else a copy."""
    if index == list(range(index[0], index[0] + len(index))):
        return x.narrow(dim, index[0], len(index))
    return x.index_select(dim, torch.tensor(index, device=x.device))


def run_block(model: nn.Module, layer: int, x: Tensor, grid: tuple[int, int] | None, leaf: bool = False,
              queries: int | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Block ``layer`` on ``x`` (B, T, D) (``queries``: its first tokens only, as ``ViT.run_blocks``): its output
    and the tensors at its ``attn.hook_v`` (B, H, T, hd) and ``attn.hook_z`` (B, T or queries, H, hd) as it
    computed them (in the autograd graph), ``hook_z`` swapped for a leaf that needs grad if ``leaf``: then the
    block runs without a graph up to that leaf (nothing before it is differentiated; a BEiT's bias table, a
    parameter, would otherwise keep every bias chunk of the layer in the graph) and with one from it on."""
    kept: dict[str, Tensor] = {}

    def keep(t: Tensor, hook) -> Tensor:
        if leaf and hook.name.endswith("hook_z"):
            torch.set_grad_enabled(True)  # the rest of the block in the graph (the no_grad below restores the mode)
            t = t.detach().requires_grad_(True)
        kept[hook.name.rsplit(".", 1)[1]] = t
        return t

    prefix = f"blocks.{layer}.attn."
    with model.hooks([(prefix + "hook_v", keep), (prefix + "hook_z", keep)]), \
            (torch.no_grad() if leaf else contextlib.nullcontext()):
        out, _ = model.run_blocks(x, grid, layer, layer + 1, queries=queries)
    return out, kept


def context_gradient_chunks(contexts: Tensor, values: Tensor, budget: int = CHUNK_BYTES,
                            head_chunk: int | None = None, query_chunk: int | None = None
                            ) -> Iterator[tuple[slice, slice, Tensor]]:
    """Chunks ``(hs, ts, (B, h, t, T))`` of the gradient of a layer's attention, ``dS/dA = dS/dz @ vᵀ``, from the
    gradient of its heads' contexts ``contexts`` (B, n, H, hd) (``n``: the queries it was computed for) and its
    values (B, H, T, hd); chunk sizes for rows of ``T`` keys within ``budget`` unless given."""
    g = contexts.to(values.device, values.dtype).transpose(1, 2)  # (B, H, n, hd)
    B, H, T, _ = values.shape
    hc, qc = chunk_sizes(H, T, budget, B, _target(values.device))
    yield from attention_chunks(g, values, None, None, head_chunk or hc, query_chunk or qc, softmax=False)


class LayerInputs:
    """The stored inputs of a model's blocks and what is computed from them within a chunk budget.

    ``hidden`` is ``(B, L + 1, T, D)`` (``hidden.forward_with_hidden_states``), or one image's states kept every
    k-th layer (``hidden.CheckpointedStates``, read layer by layer); ``grid`` the input's patch grid (needed for
    rotary positions). Each layer's queries and keys ``(B, H, T, hd)`` are computed when a method asks and dropped
    after it (``2 x T x D`` floats, megabytes).
    """

    def __init__(self, model: nn.Module, hidden: Tensor | CheckpointedStates, grid: tuple[int, int] | None = None,
                 budget: int = CHUNK_BYTES, head_chunk: int | None = None, query_chunk: int | None = None) -> None:
        if isinstance(hidden, Tensor) and hidden.dim() != 4:
            raise ValueError(f"expected hidden states (B, L + 1, T, D), got {tuple(hidden.shape)}")
        self.model, self.hidden, self.grid = model, hidden, grid
        self.budget, self.head_chunk, self.query_chunk = budget, head_chunk, query_chunk
        # (B, L + 1, T, D) of a tensor; one image's (L + 1, T, D) of checkpointed states
        batched = isinstance(hidden, Tensor)
        self.batch, self._shape = (hidden.shape[0], hidden.shape[1:]) if batched else (1, hidden.shape)

    def _state(self, layer: int) -> Tensor:
        """Hidden state ``layer`` (block ``layer``'s input; ``L``: the last block's output), ``(B, T, D)``."""
        return self.hidden[:, layer] if isinstance(self.hidden, Tensor) else self.hidden[layer][None]

    @property
    def num_layers(self) -> int:
        return self._shape[0] - 1

    @property
    def num_heads(self) -> int:
        return self.model.blocks[0].attn.num_heads

    @property
    def num_tokens(self) -> int:
        return self._shape[1]

    def _layer(self, layer: int) -> int:
        L = self.num_layers
        if not -L <= layer < L:
            raise ValueError(f"layer {layer} is out of range for {L} layers")
        return layer % L

    def queries_and_keys(self, layer: int) -> tuple[Tensor, Tensor]:
        """Layer ``layer``'s scaled queries and keys, ``(B, H, T, hd)`` each."""
        return self.queries_keys_values(layer)[:2]

    def queries_keys_values(self, layer: int) -> tuple[Tensor, Tensor, Tensor]:
        """Layer ``layer``'s scaled queries, keys and values, ``(B, H, T, hd)`` each."""
        layer = self._layer(layer)
        with torch.inference_mode():
            return queries_keys_values(self.model, layer, self._input(layer), self.grid)

    def values(self, layer: int) -> Tensor:
        """Layer ``layer``'s values ``(B, H, T, hd)``, each token's on its own position (``hidden.layer_values``)."""
        layer = self._layer(layer)
        with torch.inference_mode():
            return layer_values(self.model, layer, self._input(layer), self.grid)

    def _input(self, layer: int) -> Tensor:
        """Block ``layer``'s input ``(B, T, D)`` on the model's device and in its dtype (``layer = L``: the last
        block's output)."""
        param = next(self.model.parameters())
        return self._state(layer).to(param.device, param.dtype)

    def chunks(self, layer: int, heads: Sequence[int] | None = None, queries: Sequence[int] | None = None
               ) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """``attention_chunks`` of layer ``layer``."""
        if layout_problem(self.model):  # a bias or windows: chunks of the exact layer, placed on the patch grid
            yield from self._layer_chunks(layer, heads, queries)
            return
        q, k = self.queries_and_keys(layer)
        yield from attention_chunks(q, k, heads, queries, self.head_chunk, self.query_chunk, self.budget)

    def _layer_chunks(self, layer: int, heads: Sequence[int] | None, queries: Sequence[int] | None
                      ) -> Iterator[tuple[slice, slice, Tensor]]:
        """``chunks`` of a layer with a bias or windows: a global layer's from its queries, keys and the bias rows of
        each query chunk (``hidden.bias_rows``); a windowed layer's from its windows as it forms them
        (``hidden.layer_pattern``, ``H x T x w*w`` values), each row placed on the patch grid from its window
        (``attention.layer_rows``). Query chunks of the budget, every chunk all the heads asked for."""
        layer, H, T, window = self._layer(layer), self.num_heads, self.num_tokens, self._window(layer)
        heads = list(range(H)) if heads is None else [int(h) for h in heads]
        queries = list(range(T)) if queries is None else [int(t) for t in queries]
        if not all(0 <= h < H for h in heads) or not all(0 <= t < T for t in queries):
            raise ValueError(f"heads {heads} or queries out of range for {H} heads, {T} tokens")
        # every chunk holds all the heads asked for (the bias rows are formed once for them): they count as the batch
        step = self.query_chunk or chunk_sizes(1, T, self.budget, self.batch * len(heads),
                                               _target(next(self.model.parameters()).device))[1]
        if not window:
            # Chunks as large as the budget (with the bias rows as a fourth copy), not the CPU's cache-sized ones:
            # each chunk's bias rows cost a fixed overhead that dominated (SAM ViT-B's global layer at 1,024 px:
            # 25 s in 820 chunks of 5 queries, 1.4 s in chunks of 128, on two cores)
            step = self.query_chunk or chunk_sizes(1, T, self.budget * _COPIES // (_COPIES + 1),
                                                   self.batch * len(heads), None)[1]
            model, grid = self.model, self.grid
            with torch.inference_mode():
                q, k, _ = layer_qkv(model, layer, self._input(layer), grid)  # (B, H, T, hd) each, q unscaled

            def bias(rows: list[int]) -> Tensor | None:
                with torch.inference_mode():
                    return bias_rows(model, layer, q[:, :, rows], rows, grid, k.shape[2])

            scaled = q * model.blocks[layer].attn.logit_factor
            yield from attention_chunks(scaled, k, heads, queries, len(heads), step, self.budget, bias=bias)
            return
        with torch.inference_mode():
            probs = _take(layer_pattern(self.model, layer, self._input(layer), self.grid).float(), 1, heads)
        for t0 in range(0, len(queries), step):
            ts = slice(t0, min(t0 + step, len(queries)))
            yield slice(0, len(heads)), ts, layer_rows(probs, window_layout(self.model, layer, self.grid), queries[ts])

    def _window(self, layer: int) -> int:
        """The window side of layer ``layer`` (0: global)."""
        return getattr(self.model.blocks[layer], "window", 0)

    def rows(self, layer: int, queries: Sequence[int], heads: Sequence[int] | None = None) -> Tensor:
        """What each of ``queries`` attends to in layer ``layer``: ``(B, heads, queries, T)`` float32 (one head's
        map of any query; ``queries=[0]`` is the CLS row)."""
        H = len(heads) if heads is not None else self.num_heads
        out = torch.empty(self.batch, H, len(queries), self.num_tokens)
        for hs, ts, probs in self.chunks(layer, heads, queries):
            out[:, hs, ts] = probs.cpu()
        return out

    def fused_rows(self, layer: int, queries: Sequence[int] | None = None, fusion: str = "mean"
                   ) -> Iterator[tuple[slice, Tensor]]:
        """Layer ``layer``'s heads fused by ``fusion`` (mean, max, min) in query chunks: yields
        ``(ts, fused rows (B, t, T))`` where ``queries[ts]`` (default all tokens) are the chunk's queries."""
        _check_fusion(fusion)
        acc, current = None, None
        for _, ts, probs in self.chunks(layer, None, queries):
            if current is not None and ts != current:
                yield current, acc / self.num_heads if fusion == "mean" else acc
                acc = None
            current = ts
            if fusion == "mean":
                part = probs.sum(dim=1)  # (B, t, T)
                acc = part if acc is None else acc + part
            elif fusion == "max":
                part = probs.amax(dim=1)
                acc = part if acc is None else torch.maximum(acc, part)
            else:
                part = probs.amin(dim=1)
                acc = part if acc is None else torch.minimum(acc, part)
        if current is not None:
            yield current, acc / self.num_heads if fusion == "mean" else acc

    def fused(self, layer: int, query: int, fusion: str = "mean") -> Tensor:
        """The heads' fused map of one query in layer ``layer``: ``(B, T)``."""
        [(_, rows)] = list(self.fused_rows(layer, [query], fusion))
        return rows[:, 0]

    def factor(self, layer: int, fusion: str = "mean", discard_ratio: float = 0.0, num_prefix_tokens: int = 1,
               dtype: torch.dtype = torch.float32) -> Tensor:
        """Layer ``layer``'s whole rollout factor ``(B, T, T)`` (``attention.rollout_factor``), built from fused
        query chunks: ``T²`` values held, never ``H x T²``."""
        B, T = self.batch, self.num_tokens
        out = torch.empty(B, T, T, dtype=dtype)
        for ts, fused in self.fused_rows(layer, None, fusion):
            out[:, ts] = rollout_factor_rows(fused.cpu(), ts.start, discard_ratio, num_prefix_tokens).to(dtype)
        return out

    def stats(self, layer: int, grid: tuple[int, int], patch_size: int | tuple[int, int], num_prefix_tokens: int = 1
              ) -> tuple[Tensor, Tensor]:
        """Layer ``layer``'s per-head mean attention distance in px and entropy in nats, ``(B, H)`` each, as
        ``attention.mean_attention_distance`` and ``attention_entropy`` compute them, summed chunk by chunk."""
        p, (B, H) = num_prefix_tokens, (self.batch, self.num_heads)
        centres = patch_centres(grid, patch_size)  # (N, 2)
        distance, entropy = torch.zeros(B, H, dtype=torch.float64), torch.zeros(B, H, dtype=torch.float64)
        for hs, ts, probs in self.chunks(layer):  # probs (B, h, t, T); queries[ts] are tokens ts.start..
            probs = probs.cpu()
            entropy[:, hs] -= torch.special.xlogy(probs, probs).sum(dim=(-1, -2)).double()
            first = max(ts.start, p)  # patch queries only
            if first < ts.stop:
                a = probs[:, :, first - ts.start:, p:]  # (B, h, t', N)
                d = torch.cdist(centres[first - p:ts.stop - p], centres).to(a.dtype)  # (t', N)
                # each row's distance over its patch keys' share of it: sum(a * d) / sum(a) row by row, without
                # forming a / sum(a) or a * d beside the chunk (two more copies of it)
                rows = torch.einsum("bhtn,tn->bht", a, d) / a.sum(dim=-1).clamp_min(torch.finfo(a.dtype).tiny)
                distance[:, hs] += rows.sum(dim=-1).double()
        N = grid[0] * grid[1]
        return (distance / N).float(), (entropy / self.num_tokens).float()

    def token_norms(self, layer: int) -> Tensor:
        """The L2 norm of every token after layer ``layer``: ``(B, T)``."""
        return self._state(self._layer(layer) + 1).float().norm(dim=-1)

    def rollout_row(self, query: int | None = None, row: Tensor | None = None, fusion: str = "mean",
                    discard_ratio: float = 0.0, end_layer: int = -1, num_prefix_tokens: int = 1,
                    progress: Callable[[int, int], None] | None = None) -> Tensor:
        """Row ``query`` of ``attention.rollout(...)`` (or ``row (B, T) @`` the rollout's product), ``(B, T)``,
        with the same head fusion, discard and residual: from layer ``end_layer`` down to 0, ``v = v @ Â_l``,
        each ``Â_l`` formed query chunk by query chunk (``v @ Â = sum over chunks v[t] @ Â[t]``).
        ``progress(layers done, layers)`` after every chunk (it may raise to stop there)."""
        if (query is None) == (row is None):
            raise ValueError("give either a query token or a row of weights")
        B, T = self.batch, self.num_tokens
        if row is None:
            if not 0 <= query < T:
                raise ValueError(f"query token {query} is out of range for {T} tokens")
            row = torch.zeros(B, T)
            row[:, query] = 1.0
        if row.shape[-1] != T:
            raise ValueError(f"a row of {row.shape[-1]} weights does not fit {T} tokens")
        v = row.float().cpu().expand(B, T)
        top = self._layer(end_layer)
        for layer in range(top, -1, -1):
            if self._window(layer) and discard_ratio == 0:  # block-diagonal: each window's block on its tokens
                with torch.inference_mode():
                    probs = layer_pattern(self.model, layer, self._input(layer), self.grid)  # (B * nw, H, n, n)
                v = layer_step(v, fuse_heads(probs.float(), fusion).cpu(), window_layout(self.model, layer, self.grid))
                if progress is not None:
                    progress(top - layer, top + 1)
                continue
            out = torch.zeros(B, T)
            for ts, fused in self.fused_rows(layer, None, fusion):  # queries[ts] are tokens ts.start..
                factor = rollout_factor_rows(fused.cpu(), ts.start, discard_ratio, num_prefix_tokens)  # (B, t, T)
                out += (v[:, None, ts] @ factor)[:, 0]  # (B, T)
                if progress is not None:  # each chunk, not each layer: a layer at 14,400 tokens is seconds
                    progress(top - layer, top + 1)
            v = out
        if progress is not None:
            progress(top + 1, top + 1)
        return v

    # --- gradient methods: each block's backward from its stored input, one block's graph at a time ---------------

    def _context_chunks(self, layer: int, contexts: Tensor, values: Tensor, budget: int
                        ) -> Iterator[tuple[slice, slice, Tensor]]:
        """``context_gradient_chunks`` of layer ``layer`` with this object's chunk sizes."""
        return context_gradient_chunks(contexts, values, budget, self.head_chunk, self.query_chunk)

    def context_gradients(self, class_index: Tensor) -> Tensor:
        """The gradient of the class ``class_index (B,)``'s logit with respect to every layer's heads' contexts,
        ``(B, L, T, H, hd)`` float32 (as many floats as the hidden states): what ``gradient_rollout_row`` needs.

        The backward runs one block at a time from the last down, each block again on its stored input (its
        fused attention's backward, no ``T x T`` held): only that block's graph is alive."""
        model, L = self.model, self.num_layers
        index = class_index.to(self._state(self.num_layers).device)
        with torch.inference_mode(False), torch.enable_grad():
            top = self._input(L).clone().requires_grad_(True)
            score = model.classify(top).gather(1, index[:, None].to(top.device)).sum()  # images independent
            [grad] = torch.autograd.grad(score, top)  # (B, T, D)
            out: Tensor | None = None
            for layer in reversed(range(L)):
                x = self._input(layer).clone().requires_grad_(True)
                y, kept = run_block(model, layer, x, self.grid)
                grad, contexts = torch.autograd.grad(y, [x, kept["hook_z"]], grad)  # (B, T, D), (B, T, H, hd)
                if out is None:
                    out = torch.empty(x.shape[0], L, *contexts.shape[1:])
                out[:, layer] = contexts.detach().float().cpu()
        return out

    def gradient_rollout_row(self, contexts: Tensor, query: int | None = 0, end_layer: int = -1,
                             row: Tensor | None = None) -> Tensor:
        """Row ``query`` of ``attention.gradient_rollout`` (Chefer et al.'s class-specific relevance), ``(B, T)``
        (or ``row (B, T) @`` it, query None: ``attention.pooled_readout``'s for a mean-pooling classifier), from
        ``context_gradients``: ``v = e_query``, then from layer ``end_layer`` down to 0, ``v = v + v @ Ā_l``
        with ``Ā_l = mean_heads(clamp(dS/dA_l * A_l, min=0))``, each formed chunk by chunk from the layer's
        queries, keys and values (``v @ Ā = sum over chunks v[t] @ Ā[t]``)."""
        B, T, H = self.batch, self.num_tokens, self.num_heads
        if row is not None:
            if row.shape[-1] != T:
                raise ValueError(f"a row of {row.shape[-1]} weights does not fit {T} tokens")
            v = row.float().cpu().expand(B, T).clone()
        elif not 0 <= query < T:
            raise ValueError(f"query token {query} is out of range for {T} tokens")
        else:
            v = torch.zeros(B, T)
            v[:, query] = 1.0
        half = self.budget // 2  # an attention chunk and its gradient's
        for layer in range(self._layer(end_layer), -1, -1):
            q, k, values = self.queries_keys_values(layer)
            hc, qc = chunk_sizes(H, T, half, B, _target(q.device))
            hc, qc = self.head_chunk or hc, self.query_chunk or qc
            step = torch.zeros(B, T)
            pairs = zip(attention_chunks(q, k, None, None, hc, qc),
                        self._context_chunks(layer, contexts[:, layer], values, half), strict=True)
            for (_, ts, probs), (_, _, grad) in pairs:
                term = (grad * probs).clamp(min=0).sum(dim=1).cpu() / H  # (B, t, T): these heads' share of Ā
                step += (v[:, None, ts] @ term)[:, 0]
            v = v + step
        return v


def layer_bytes(num_heads: int, tokens: int) -> int:
    """Bytes of one layer's whole float32 attention ``(H, T, T)`` (what the chunks avoid holding)."""
    return 4 * num_heads * tokens * tokens


def chunked_bytes(num_layers: int, hidden_size: int, tokens: int, budget: int = CHUNK_BYTES) -> int:
    """The memory model of a chunked analysis: hidden states ``(L + 1) x T x D``, one layer's queries and keys
    (``2 x T x D``), the rollout's vectors and one chunk."""
    return 4 * (num_layers + 3) * tokens * hidden_size + 8 * tokens + budget
