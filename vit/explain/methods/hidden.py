"""Per-layer token states of one forward pass, and each layer's attention recomputed from them on demand.

Keeping every layer's attention of a big input costs gigabytes: ViT-S/8 with its long side at
640 px has 4,801 tokens, and 12 layers x 6 heads x 4,801² float32 values are 6.6 GB. The
hidden states cost only ``(L + 1) x T x D`` floats (tens of MB), read at the model's hook points, and one
layer's attention is that block run again on its input (``ViT.run_blocks``): the same numbers the model's
``output_attentions`` gives, one layer at a time, within a memory budget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import Tensor, nn

from vit.core.cache import ByteCache
from vit.costs.memory import kept_layers
from vit.costs.memory import layout_problem as memory_layout_problem
from vit.explain.methods.attention import layer_on_grid
from vit.explain.methods.attention import layer_rows as rows_on_grid
from vit.model import LayerLayout


def residual_names(num_layers: int) -> list[str]:
    """The hook points of the hidden states: every block's input, then the last block's output."""
    return [f"blocks.{i}.hook_resid_pre" for i in range(num_layers)] + [f"blocks.{num_layers - 1}.hook_resid_post"]


def forward_with_hidden_states(model: nn.Module, images: Tensor, layers: Sequence[int] | None = None,
                               run: Callable[[Tensor, list], Tensor | None] | None = None
                               ) -> tuple[Tensor | None, Tensor]:
    """Logits ``(B, classes)`` (None without a classifier) and hidden states ``(B, L + 1, T, D)``: the input
    of every block, then the last block's output, read at the hook points of one fast forward pass (no
    attention probabilities are materialised). ``layers``: only these states (indices 0..L, ascending), ``(B,
    len(layers), T, D)``: ``CheckpointedStates``'s checkpoints. ``run(images, hooks)``: a forward of ``images``
    that a method runs for itself (a CAM's, recording from its layer), read instead of the model's own: it sets
    ``hooks`` on it and returns the logits; the states are kept detached from its graph."""
    if getattr(getattr(model, "config", None), "stage_depths", ()):
        raise ValueError("the hidden states of a model with stages (Swin, Hiera) have each layer's own grid and width "
                         "and do not stack: read them with vit.explain.methods.hidden.forward_with_stage_states")
    names = residual_names(len(model.blocks))
    if layers is not None:
        names = [names[i] for i in layers]
    if torch.is_grad_enabled() and run is None:  # the states stay in the autograd graph
        encoding, cache = model.run_with_cache(images, names)
        return encoding.logits, torch.stack([cache[name] for name in names], dim=1)  # (B, L + 1, T, D)
    # Each state is copied into its slot as the forward passes it and then freed: caching them all and stacking
    # held them twice (ViT-L/16 at 1,024 px: 840 MB at the peak for 420 MB of states).
    out: list[Tensor] = []

    def keep(x: Tensor, hook, index: int) -> None:
        if not out:
            out.append(x.new_empty(x.shape[0], len(names), *x.shape[1:]))
        out[0][:, index].copy_(x.detach())

    hooks = [(name, partial(keep, index=i)) for i, name in enumerate(names)]
    if run is not None:
        return run(images, hooks), out[0]
    return model.run_with_hooks(images, hooks).logits, out[0]


def stage_state_names(num_layers: int) -> list[str]:
    """The hook points of a staged model's hidden states: the first block's input, then every block's output."""
    return ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post" for i in range(num_layers)]


def forward_with_stage_states(model: nn.Module, images: Tensor) -> tuple[Tensor | None, list[Tensor]]:
    """``forward_with_hidden_states`` for a model with stages (Swin, Hiera; ``vit.model.stages``): logits ``(B,
    classes)`` (None without a classifier) and ``L + 1`` states, the embedding then each block's output, each
    ``(B, T_l, D_l)`` row-major on its own grid and width (state ``l + 1`` on ``model.layer_layouts(grid)[l].grid``,
    state 0 on the image's patch grid). Row-major whatever order the library holds its tokens in (Swin's windows are
    put back, Hiera's unrolled order never made): HF's ``reshaped_hidden_states`` at each stage's end, flattened."""
    names = stage_state_names(len(model.blocks))
    encoding, cache = model.run_with_cache(images, names)
    return encoding.logits, [cache[name] for name in names]


def block_attention(model: nn.Module, layer: int, block_input: Tensor, grid: tuple[int, int] | None = None
                    ) -> Tensor:
    """Layer ``layer``'s post-softmax attention ``(B, H, T, T)``: that block run on its input ``(B, T, D)``
    (``grid``: the input's patch grid, for a model with rotary positions or an attention layout). A windowed
    layer's windows are placed on the full grid (``attention.layer_on_grid``: zero outside each query's window)."""
    probs = layer_pattern(model, layer, block_input, grid)
    layout = window_layout(model, layer, grid)
    return probs if layout is None else layer_on_grid(probs, layout)


def window_layout(model: nn.Module, layer: int, grid: tuple[int, int] | None) -> LayerLayout | None:
    """The ``LayerLayout`` of a windowed layer ``layer`` on patch grid ``grid`` (which token each window slot holds,
    in the order the layer cuts them: SAM's row-major slots, Qwen's unit by unit); None for a global layer."""
    block = model.blocks[layer]
    return block.layout(tuple(grid)) if getattr(block, "window", 0) else None


def layer_pattern(model: nn.Module, layer: int, block_input: Tensor, grid: tuple[int, int] | None = None
                  ) -> Tensor:
    """Layer ``layer``'s attention as the layer forms it, read at ``attn.hook_pattern`` (the block stops there):
    ``(B, H, T, T)``, a windowed layer's ``(B * nw, H, w*w, w*w)`` (``H x T x w*w`` values, not ``H x T²``)."""
    return read_block(model, layer, block_input, grid, ("attn.hook_pattern",))[0]


def layer_rows(model: nn.Module, layer: int, block_input: Tensor, grid: tuple[int, int] | None,
               queries: Sequence[int]) -> Tensor:
    """Rows ``queries`` of ``block_attention``, ``(B, H, q, T)``: a windowed layer's from each query's window
    (``attention.layer_rows``), a global one's from its queries, keys and bias rows (``bias_rows``); never
    ``T x T``."""
    layout = window_layout(model, layer, grid)
    if layout is not None:
        return rows_on_grid(layer_pattern(model, layer, block_input, grid), layout, queries)
    q, k, _ = layer_qkv(model, layer, block_input, grid)
    q = q[:, :, list(queries)]  # (B, H, t, hd)
    scores = (q @ k.transpose(-2, -1)) * model.blocks[layer].attn.logit_factor  # (B, H, t, T)
    bias = bias_rows(model, layer, q, queries, grid, k.shape[2])
    return (scores if bias is None else scores + bias).softmax(dim=-1)


def layer_values(model: nn.Module, layer: int, block_input: Tensor, grid: tuple[int, int] | None = None) -> Tensor:
    """Layer ``layer``'s values ``(B, H, T, hd)``, read at ``attn.hook_v`` (the block stops there), each token's on
    its own position: a windowed layer's windows ``(B * nw, H, w*w, hd)`` are put back on the grid, padding dropped."""
    [v] = read_block(model, layer, block_input, grid, ("attn.hook_v",))
    layout = window_layout(model, layer, grid)
    if layout is None:
        return v
    _, H, n, hd = v.shape
    v = layout.join(v.transpose(1, 2).reshape(-1, n, H * hd))  # (B, T, H * hd)
    return v.view(v.shape[0], -1, H, hd).transpose(1, 2)  # (B, H, T, hd)


def placed_attentions(model: nn.Module, attentions: Sequence[Tensor], grid: tuple[int, int]) -> tuple[Tensor, ...]:
    """A forward's ``attentions`` with each windowed layer's windows placed on the full patch grid
    (``attention.layer_on_grid``), so that every layer reads ``(B, H, T, T)``."""
    layouts = [window_layout(model, layer, grid) for layer in range(len(model.blocks))]
    return tuple(a if lay is None else layer_on_grid(a, lay) for a, lay in zip(attentions, layouts, strict=True))


def layout_problem(model: nn.Module) -> str | None:
    """What keeps a layer's attention from being ``softmax(q . k)`` of its queries and keys alone (the chunked
    paths' assumption): a bias on the logits or windows; None for plain global attention (``memory.layout_problem``
    of its config)."""
    return memory_layout_problem(getattr(model, "config", None))


class _Enough(Exception):
    """Raised by a hook once it has what it reads, so that the block stops there."""


def queries_and_keys(model: nn.Module, layer: int, block_input: Tensor, grid: tuple[int, int] | None = None
                     ) -> tuple[Tensor, Tensor]:
    """Layer ``layer``'s scaled queries and keys ``(B, H, T, hd)`` each, from that block's input ``(B, T, D)``.

    ``softmax(q @ k.T)`` is the layer's attention; one query's row from them costs ``H x T x hd``
    instead of the whole ``H x T²`` matrix. Read at the block's ``attn.hook_q`` / ``hook_k`` (after rotary
    positions); the block stops at ``hook_v``, before its attention.
    """
    q, k, _ = queries_keys_values(model, layer, block_input, grid)
    return q, k


def queries_keys_values(model: nn.Module, layer: int, block_input: Tensor, grid: tuple[int, int] | None = None
                        ) -> tuple[Tensor, Tensor, Tensor]:
    """``queries_and_keys`` and the layer's values ``(B, H, T, hd)`` (read at ``attn.hook_v``). ValueError for a
    model whose attention is more than ``softmax(q . k)`` (``layout_problem``), whose maps need the whole layer."""
    problem = layout_problem(model)
    if problem:
        raise ValueError(f"this model {problem}, so its attention is not softmax(q . k) of its queries and keys "
                         "alone; this view computes it that way and does not support it yet")
    q, k, v = layer_qkv(model, layer, block_input, grid)
    return q * model.blocks[layer].attn.logit_factor, k, v


def layer_qkv(model: nn.Module, layer: int, block_input: Tensor, grid: tuple[int, int] | None = None
              ) -> tuple[Tensor, Tensor, Tensor]:
    """Layer ``layer``'s queries (unscaled), keys and values as its hook points hold them, ``(B, H, T, hd)`` each
    (a windowed layer's per window); the block stops at ``attn.hook_v``."""
    q, k, v = read_block(model, layer, block_input, grid, ("attn.hook_q", "attn.hook_k", "attn.hook_v"))
    return q, k, v


def read_block(model: nn.Module, layer: int, block_input: Tensor, grid: tuple[int, int] | None,
               points: Sequence[str]) -> list[Tensor]:
    """What block ``layer``'s hook points ``points`` (names within the block, in forward order) hold when it runs
    on ``block_input``; the block stops at the last of them."""
    kept: dict[str, Tensor] = {}
    last = points[-1]

    def keep(x: Tensor, hook, point: str) -> None:
        kept[point] = x
        if point == last:
            raise _Enough

    try:
        with model.hooks([(f"blocks.{layer}.{point}", partial(keep, point=point)) for point in points]):
            model.run_blocks(block_input, grid, layer, layer + 1)
    except _Enough:
        pass
    return [kept[point] for point in points]


def bias_rows(model: nn.Module, layer: int, q: Tensor, queries: Sequence[int], grid: tuple[int, int] | None,
              keys: int) -> Tensor | None:
    """Rows ``queries`` (token indices) of what global layer ``layer`` adds to its attention logits over its
    ``keys`` keys, ``(B or 1, H or 1, t, T)``, from those queries' ``q`` ``(B, H, t, hd)`` as ``hook_q`` holds them
    (the layer's own ``logit_bias``, BEiT's shared table included, and locality self-attention's mask): ``t x T`` per
    head, never the whole ``T x T``. None when the layer adds nothing."""
    rows = torch.as_tensor(list(queries), dtype=torch.long)
    table = getattr(model, "rel_pos_bias", None)
    shared = table(grid, rows) if table is not None else None  # (H, t, T)
    attn = model.blocks[layer].attn
    bias = attn.logit_bias(q, grid, shared, rows)
    own = attn.own_key_bias(rows.to(q.device), keys, q.dtype)
    return own if bias is None else bias if own is None else bias + own


def query_key_hooks(model: nn.Module, kept: dict[int, Tensor]) -> list[tuple[str, Callable]]:
    """Hooks for a forward of one image that keep each layer's scaled queries and keys, ``kept[layer] = (2, H, T,
    hd)`` float32 on the CPU, as ``LayerAttentions.rows`` reads them: what the forward computes anyway, so the first
    map does not run every layer's projections again. None for a model whose attention is more than ``softmax(q .
    k)`` (``layout_problem``)."""
    if layout_problem(model):
        return []
    queries: dict[int, Tensor] = {}

    def keep_q(q: Tensor, hook, layer: int) -> None:
        queries[layer] = q[0].detach() * model.blocks[layer].attn.logit_factor  # (H, T, hd)

    def keep_k(k: Tensor, hook, layer: int) -> None:  # detached: a forward recording a graph keeps none here
        kept[layer] = torch.stack([queries.pop(layer), k[0].detach()]).float().cpu()  # (2, H, T, hd)

    return [hook for layer in range(len(model.blocks))
            for hook in ((f"blocks.{layer}.attn.hook_q", partial(keep_q, layer=layer)),
                         (f"blocks.{layer}.attn.hook_k", partial(keep_k, layer=layer)))]


class LayerAttentions(Sequence[Tensor]):
    """Every layer's attention of one image, ``(1, H, T, T)`` float32 each, computed from the hidden states
    when read and kept in ``cache`` while it fits. Reads like a tuple of the model's ``output_attentions``.
    ``queries_and_keys``: what ``query_key_hooks`` kept from the forward that made ``hidden``, put in ``cache``.
    """

    def __init__(self, model: nn.Module, hidden: Tensor, cache: ByteCache, grid: tuple[int, int] | None = None,
                 queries_and_keys: dict[int, Tensor] | None = None) -> None:
        if hidden.dim() != 3:
            raise ValueError(f"expected hidden states of one image (L + 1, T, D), got {tuple(hidden.shape)}")
        if grid is None and getattr(model.config, "rope", "none") != "none":
            raise ValueError("a model with rotary positions needs the patch grid of its hidden states")
        self.model, self.hidden, self.cache = model, hidden, cache  # hidden: (L + 1, T, D)
        self.grid = grid
        for layer, qk in (queries_and_keys or {}).items():
            cache.get_or_compute(("qk", layer), lambda qk=qk: qk)

    def __len__(self) -> int:
        return self.hidden.shape[0] - 1

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        if not -len(self) <= index < len(self):
            raise IndexError(f"layer {index} is out of range for {len(self)} layers")
        layer = index % len(self)
        # A full layer at thousands of tokens is recomputed when needed again rather than crowding out
        # the small things (queries and keys, rollout factors) that make every redraw fast.
        return self.cache.get_or_compute(("layer", layer), lambda: self._compute(layer), max_share=0.125)

    @property
    def num_heads(self) -> int:
        return self.model.blocks[0].attn.num_heads

    def rows(self, query: int) -> Tensor:
        """What token ``query`` attends to in every layer and head: ``(L, H, T)``, from cached queries and keys."""
        T = self.hidden.shape[1]
        if not 0 <= query < T:
            raise ValueError(f"query token {query} is out of range for {T} tokens")
        if layout_problem(self.model):  # biases and windows: rows of the exact layers, windowed ones per window
            device = next(self.model.parameters()).device
            with torch.inference_mode():
                return torch.stack([layer_rows(self.model, layer, self.hidden[layer][None].to(device), self.grid,
                                               [query])[0, :, 0].float().cpu() for layer in range(len(self))])
        rows = []
        for layer in range(len(self)):
            qk = self.cache.get_or_compute(("qk", layer), lambda layer=layer: self._queries_and_keys(layer))
            q, k = qk  # (H, T, hd) each
            rows.append((q[:, query:query + 1] @ k.transpose(-2, -1))[:, 0].softmax(dim=-1))  # (H, T)
        return torch.stack(rows)  # (L, H, T)

    def _queries_and_keys(self, layer: int) -> Tensor:
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            q, k = queries_and_keys(self.model, layer, self.hidden[layer][None].to(device), self.grid)
        return torch.stack([q[0], k[0]]).float().cpu()  # (2, H, T, hd)

    def _compute(self, layer: int) -> Tensor:
        device = next(self.model.parameters()).device
        with torch.inference_mode():
            probs = block_attention(self.model, layer, self.hidden[layer][None].to(device), self.grid)  # (1, H, T, T)
        return probs.float().cpu()


class CheckpointedStates:
    """Every block's input of one image and the last block's output, read like the ``(L + 1, T, D)`` tensor of
    ``forward_with_hidden_states`` (``states[i]``: ``(T, D)`` float32 on the CPU), of which only the checkpoints are
    kept: the residual stream at every ``every``-th layer and at the last (``costs.memory.kept_layers``). Another
    state is recomputed from the checkpoint below it, the blocks between run again on the model's device in its dtype
    (the same ops on the same inputs as the forward: the same numbers); the states of the segment last read (at most
    ``every - 1``) are kept, so reading the layers in order, or from the top down as the rollout does, runs each block
    once more. ``checkpoints``: ``(len(kept_layers(L, every)), T, D)``, those states in order."""

    def __init__(self, model: nn.Module, checkpoints: Tensor, every: int, grid: tuple[int, int] | None) -> None:
        L = len(model.blocks)
        layers = kept_layers(L, every)
        if checkpoints.dim() != 3 or checkpoints.shape[0] != len(layers):
            raise ValueError(f"expected {len(layers)} checkpoints (L + 1 = {L + 1} states, every {every}), got "
                             f"{tuple(checkpoints.shape)}")
        self.model, self.every, self.grid = model, every, grid
        self.kept = dict(zip(layers, checkpoints, strict=True))  # layer -> (T, D), views of ``checkpoints``
        self.checkpoints = checkpoints
        self.shape = torch.Size((L + 1, *checkpoints.shape[1:]))
        self.segment: dict[int, Tensor] = {}  # the states recomputed last: one segment between two checkpoints

    def __len__(self) -> int:
        return self.shape[0]

    def dim(self) -> int:
        return 3

    def numel(self) -> int:
        """The floats held: the checkpoints and the segment kept, not ``(L + 1) x T x D``."""
        return self.checkpoints.numel() + sum(t.numel() for t in self.segment.values())

    def held(self) -> tuple[Tensor, ...]:
        """The tensors held (``cache.nbytes`` counts them; the model is not this object's)."""
        return (self.checkpoints, *self.segment.values())

    def __getitem__(self, index: int) -> Tensor:
        if not isinstance(index, int):
            raise TypeError("checkpointed states are read one layer at a time: states[i]")
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"state {index} is out of range for {n} states")
        index %= n
        if index in self.kept:
            return self.kept[index]
        if index not in self.segment:
            self._recompute(index // self.every * self.every)
        return self.segment[index]

    def _recompute(self, start: int) -> None:
        """The states after checkpoint ``start`` up to the next checkpoint, each block run again on the one before."""
        self.segment = {}  # freed before the new segment is formed: one segment held, not two
        param = next(self.model.parameters())
        x = self.kept[start][None].to(param.device, param.dtype)  # (1, T, D)
        with torch.inference_mode():
            for layer in range(start, min(start + self.every, len(self) - 1) - 1):
                x, _ = self.model.run_blocks(x, self.grid, layer, layer + 1)
                self.segment[layer + 1] = x[0].float().cpu()
