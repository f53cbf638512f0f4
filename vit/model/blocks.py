"""The blocks: norms, attention (fused and explicit paths), the MLP, the attention-pooling probe and the
transformer block, each written once."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vit.costs.bounds import BIAS_CHUNK_BYTES
from vit.model.config import ViTConfig
from vit.model.hooks import PLAIN_RULES, HookPoint, activate, active_hooks, current_rules
from vit.model.layouts import (
    RelativePositionBias,
    decomposed_rel_pos,
    diagonal_bias,
    divided_partitions,
    neighbourhood_bias,
    padding_bias,
    partition,
    unpartition,
)
from vit.model.positions import apply_rope
from vit.model.stages import (
    LayerLayout,
    PatchMerging,
    QueryPool,
    SwinPositionBias,
    SwinV2PositionBias,
    pool_queries,
    shift_mask,
    shift_windows,
    unshift_windows,
    window_and_shift,
)

# One fused attention call on a CPU does at most this many FLOPs (~0.1 s on 2 cores): between calls Python runs,
# so Ctrl-C and a page's Stop are heard within a second even at 65,537 tokens, where one whole layer's call took a
# minute. Below it (one image of up to ~1,180 tokens on ViT-B) the call stays whole.
FUSED_CHUNK_FLOPS = 2**32
# InternViT-6B's q and k norms (HF InternVLVisionRMSNorm's default), whatever the tower's layer_norm_eps
QK_NORM_EPS = 1e-6
# InternVL's projector norm is a plain nn.LayerNorm (its default eps), whatever the tower's layer_norm_eps
INTERNVL_PROJECTOR_EPS = 1e-5
# The model's shared BEiT bias, asked for by rows (token indices; None: all): (nh, n or T, T).
SharedBias = Callable[[torch.Tensor | None], torch.Tensor]


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (same parameters and state-dict keys) that runs under the current relevance rules."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rules = current_rules()
        if rules is PLAIN_RULES:
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return rules.layer_norm(x, self)


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` (one ``weight``, no bias: AIMv2's) that runs under the current relevance rules."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rules = current_rules()
        if rules is PLAIN_RULES:
            return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)
        return rules.rms_norm(x, self)


def make_norm(config: ViTConfig, size: int) -> LayerNorm | RMSNorm:
    """The config's norm (``ViTConfig.norm``) over ``size`` channels."""
    if config.norm == "rms":
        return RMSNorm(size, eps=config.layer_norm_eps)
    return LayerNorm(size, eps=config.layer_norm_eps)


class Parent(nn.Module):
    """An ``nn.Module`` whose children are plain attributes too, so ``self.attn`` or ``self.hook_q`` is a dict
    lookup: nn.Module finds them through ``__getattr__``, after a failed instance lookup, which costs as much as
    ~30 function calls (measured here: 5 us against 0.2 us); with 65 hook points that made a cifar-s forward 8 %
    slower than before them. ``_modules`` stays the record (state dicts, ``named_modules``); the copy in
    ``__dict__`` follows every assignment and deletion."""

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        modules = self.__dict__.get("_modules")
        if modules is not None and name in modules:
            self.__dict__[name] = modules[name]

    def __delattr__(self, name: str) -> None:
        modules = self.__dict__.get("_modules")
        if modules is not None and name in modules:
            self.__dict__.pop(name, None)
        super().__delattr__(name)


@dataclass(frozen=True)
class AttentionVariant:
    """A training-free change of one block's computation (the dense text maps of ``vit.explain.methods.dense_clip``):
    its attention is the sum over ``pairs`` of ``softmax(a bᵀ / sqrt(hd) + neighbourhood)`` (each pair ``"ab"`` of q, k,
    v: ``"qk"`` the model's own), times v; no pairs: each token attends to itself alone, its context its own value
    (MaskCLIP); the block then adds it to its input or not, and runs its MLP or not. Only a global layer without
    position biases takes one (``Block.forward`` refuses the others)."""

    # SCLIP ("qq", "kk"); ClearCLIP ("qq",); NACLIP ("kk",); CLIP Surgery ("vv",); MaskCLIP () (the identity)
    pairs: tuple[str, ...] = ("qk",)
    neighbourhood: float = 0.0  # NACLIP: the std, in patches, of a Gaussian of two patches' distance on the logits
    residual: bool = True  # the block's output is its input plus the attention (NACLIP, ClearCLIP: the attention)
    mlp: bool = True  # the block runs its MLP after the attention (NACLIP, ClearCLIP, a Surgery branch: not)

    def __post_init__(self) -> None:
        if any(len(p) != 2 or set(p) - set("qkv") for p in self.pairs):
            raise ValueError(f"attention pairs {self.pairs!r}: each is two of q, k, v (e.g. 'qk')")
        if self.neighbourhood < 0:
            raise ValueError(f"a neighbourhood std of {self.neighbourhood} patches; give a positive one (0: none)")

    def operands(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                 ) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """Each pair's (rows, columns) of the logits, from q, k, v (B, nh, N, hd)."""
        named = {"q": q, "k": k, "v": v}
        return tuple((named[a], named[b]) for a, b in self.pairs)


MODEL_ATTENTION = AttentionVariant()  # the model's own: softmax(q kᵀ / sqrt(hd)), the residual and the MLP


class Attention(Parent):
    """Multi-head self-attention with one fused qkv projection and two paths.

    Without ``output_attentions`` it calls ``scaled_dot_product_attention`` (fast, never
    materialises the probabilities); with it, the explicit softmax, whose probabilities
    are returned and stay in the autograd graph for gradient-weighted maps. Rotary
    positions, when given, turn q and k before either path, so the probabilities are the
    ones the model computed.
    """

    def __init__(self, config: ViTConfig, window: int = 0, dim_in: int = 0) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim or config.hidden_size // config.num_heads
        inner = self.num_heads * self.head_dim  # hidden_size unless head_dim is set apart
        # dim_in: a pooled-query layer (Hiera) reads the previous stage's width and writes its own
        self.qkv = nn.Linear(dim_in or config.hidden_size, 3 * inner, bias=config.qkv_bias)
        self.key_bias = config.key_bias
        # InternViT-6B (qk_norm): q and k each normed over all heads' channels at once, before the heads split
        self.q_norm = RMSNorm(inner, eps=QK_NORM_EPS) if config.qk_norm else None
        self.k_norm = RMSNorm(inner, eps=QK_NORM_EPS) if config.qk_norm else None
        self.rope_interleaved = config.rope in ("eva", "pe", "vjepa2")
        self.proj = nn.Linear(inner, config.hidden_size, bias=config.proj_bias)
        self.attention_dropout = config.attention_dropout
        self.proj_dropout = nn.Dropout(config.dropout)
        # What this layer adds to its logits: BEiT's own table (a shared one comes from the model), or SAM's
        # decomposed relative positions, sized for its windows or, in a global layer, the model's grid.
        self.rel_pos_bias = (RelativePositionBias(config.grid_size, config.num_heads, config.rel_pos_resize)
                             if config.rel_pos == "beit" else None)
        side = window or config.grid_size[0]
        self.rel_pos_h = nn.Parameter(torch.zeros(2 * side - 1, self.head_dim)) if config.rel_pos == "sam" else None
        self.rel_pos_w = (nn.Parameter(torch.zeros(2 * (window or config.grid_size[1]) - 1, self.head_dim))
                          if config.rel_pos == "sam" else None)
        # Swin's table over a window's offsets, or Swin V2's continuous bias from its MLP.
        self.window_bias = (SwinPositionBias(config.window_size, self.num_heads) if config.rel_pos == "swin" else
                            SwinV2PositionBias(config.window_size, self.num_heads, config.pretrained_windows[0]
                                                                  if config.pretrained_windows else 0)
                            if config.rel_pos == "swinv2" else None)
        # Swin V2's cosine attention: unit q and k, their product times exp(logit_scale) (clamped at 100, as HF and
        # timm do) instead of 1 / sqrt(head_dim).
        self.logit_scale = (nn.Parameter(torch.log(10 * torch.ones(self.num_heads, 1, 1)))
                            if config.attention == "cosine" else None)
        # Locality self-attention (Lee et al. 2021): the logits' scale learned, one a head (the authors', from
        # 1 / sqrt(head_dim)) or one a layer as exp(temperature) (vit-pytorch's), and each token's own key masked out.
        self.lsa_scale = (nn.Parameter(torch.full((self.num_heads,), self.head_dim ** -0.5))
                          if config.attention == "lsa" else None)
        self.lsa_temperature = (nn.Parameter(torch.tensor(math.log(self.head_dim ** -0.5)))
                                if config.attention == "lsa_temperature" else None)
        self.locality = config.attention.startswith("lsa")
        # (B, nh, T, hd) each, q and k after rotary positions; the bias (B or 1, nh, T, T) added to the scaled logits
        # before the softmax (only in models with one; formed whole only when hooked or when the pattern is, else
        # per query chunk by the fused path); the pattern (B, nh, T, T) exists only when it is asked for or hooked
        # (else the fused path runs); z (B, T, nh, hd) is each head's context. In a windowed layer B counts windows
        # (B * nw) and T a window's tokens.
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_bias = HookPoint()
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()

    def qkv_bias(self) -> torch.Tensor | None:
        """The qkv bias as used: the key's third zeroed when ``key_bias`` is off (DINOv3's ``bias_mask``)."""
        bias = self.qkv.bias
        if bias is None or self.key_bias:
            return bias
        q, _, v = bias.chunk(3)
        return torch.cat([q, torch.zeros_like(q), v])

    def queries_keys_values(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x`` (B, N, C) -> q, k, v (B, nh, N, hd) each, unscaled, with rotary positions applied to q and k."""
        B, N, C = x.shape
        # One product, as timm's: three of the weight's thirds (the same values, bit for bit) were at best 2 % faster
        # at one thread, and at two threads cost 1.5-2x the CPU time of one (three parallel regions, not one).
        qkv = F.linear(x, self.qkv.weight, self.qkv_bias())
        if self.q_norm is not None:
            q, k, v = qkv.view(B, N, 3, -1).unbind(2)  # each (B, N, nh*hd)
            q, k = self.q_norm(q), self.k_norm(k)
            q, k, v = (t.reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        else:
            qkv = qkv.view(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, nh, N, hd)
            q, k, v = qkv.unbind(0)  # each (B, nh, N, hd)
        if rope is not None:
            q, k = apply_rope(q, rope, self.rope_interleaved), apply_rope(k, rope, self.rope_interleaved)
        return q, k, v

    @property
    def logit_factor(self) -> float:
        """What the queries at ``hook_q`` are multiplied by to give the logits: 1 / sqrt(head_dim), or 1 where the
        layer's own scale is in them already (cosine attention, locality self-attention)."""
        learned = self.logit_scale is not None or self.lsa_scale is not None or self.lsa_temperature is not None
        return 1.0 if learned else self.head_dim ** -0.5

    def own_key_bias(self, rows: torch.Tensor, keys: int, dtype: torch.dtype) -> torch.Tensor | None:
        """Locality self-attention's mask for the queries ``rows`` (token indices) over ``keys`` keys, ``(1, 1,
        len(rows), keys)``; None for a layer without it."""
        return diagonal_bias(rows, keys, dtype)[None, None] if self.locality else None

    def logit_bias(self, q: torch.Tensor, grid: tuple[int, int] | None, shared: torch.Tensor | None,
                   rows: torch.Tensor | None = None) -> torch.Tensor | None:
        """What this layer adds to its logits: the model's ``shared`` BEiT bias (nh, N, N) plus its own table's for
        the patch ``grid`` (1, nh, N, N), or SAM's decomposed relative positions of the queries ``q`` (B, nh, N, hd;
        all N of them) (B, nh, N, N); None when nothing is added. With ``rows`` (token indices), the rows of those
        queries alone, ``q`` and ``shared`` holding only theirs: (B or 1, nh, n, N)."""
        bias = shared
        if self.rel_pos_bias is not None:
            own = self.rel_pos_bias(grid, rows)  # (nh, n or N, N)
            bias = own if bias is None else bias + own
        if self.window_bias is not None:
            bias = self.window_bias(grid)  # (nh, wh*ww, wh*ww): grid is the window's
            bias = bias if rows is None else bias[:, rows]
        if bias is not None:
            bias = bias[None].to(q.dtype)  # (1, nh, N, N)
        if self.rel_pos_h is not None:
            bias = decomposed_rel_pos(q, self.rel_pos_h, self.rel_pos_w, grid, rows)  # (B, nh, n or N, N)
        return bias

    def forward(self, x: torch.Tensor, output_attentions: bool = False,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None, queries: int | None = None,
                grid: tuple[int, int] | None = None, shared_bias: SharedBias | None = None,
                mask: torch.Tensor | None = None, key_mask: torch.Tensor | None = None, pool: int = 1,
                variant: AttentionVariant | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``x`` (B, N, C) -> the attention's output (B, n, C) and its probabilities (B, nh, n, N) when asked, for
        the first ``n = queries`` tokens' queries (None: all N) against every key. ``grid``: the patch grid of the
        tokens (a window's, in a windowed layer), which a relative position bias needs; ``shared_bias(rows)``: rows
        ``rows`` (token indices; None: all) of the bias every layer adds (BEiT's shared table), (nh, n or N, N);
        ``mask`` (B, 1, N, N): added to the logits too (Swin's
        shifted-window mask); ``key_mask`` (B, N): False at padding keys, which then get zero probability in both
        paths (NaFlex batches of images on different grids); ``pool``: the queries are max-pooled ``pool`` x
        ``pool`` on ``grid`` (Hiera's query pooling), so ``n = N / pool**2``; ``variant``: the logits' pairs and
        NACLIP's neighbourhood (``AttentionVariant``; None: the model's own), in a plain global layer alone."""
        B, N, C = x.shape
        if variant is not None and (queries is not None or pool > 1 or self.logit_scale is not None or self.locality
                                    or self.rel_pos_bias is not None or self.rel_pos_h is not None
                                    or self.window_bias is not None or shared_bias is not None or mask is not None
                                    or key_mask is not None):
            raise ValueError("an attention variant (SCLIP, NACLIP, ClearCLIP, CLIP Surgery, MaskCLIP) is defined for "
                             "a plain global layer over every token: this one has position biases, windows, padding, "
                             "cosine or locality attention or pooled queries")
        near = 0.0 if variant is None else variant.neighbourhood
        if near and grid is None:
            raise ValueError("NACLIP's neighbourhood lies on the patch grid, so the grid must be given")
        q, k, v = self.queries_keys_values(x, rope)  # each (B, nh, N, hd)
        scale = 1.0 / math.sqrt(self.head_dim)
        if self.logit_scale is not None:  # cosine attention: the scale goes into q, the softmax's is 1
            limit = torch.clamp(self.logit_scale, max=math.log(100.0)).exp()  # (nh, 1, 1)
            rules = current_rules()
            if rules is PLAIN_RULES:
                q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
            else:  # relevance rules: each vector's norm a constant of the backward, as LayerNorm's scale
                q = rules.divide_by_norm(q, q.norm(dim=-1, keepdim=True).clamp_min(1e-12))  # F.normalize's eps
                k = rules.divide_by_norm(k, k.norm(dim=-1, keepdim=True).clamp_min(1e-12))
            q, scale = q * limit.to(q.dtype), 1.0
        elif self.lsa_scale is not None:  # the learned scale goes into q, the softmax's is 1
            q, scale = q * self.lsa_scale.view(1, -1, 1, 1).to(q.dtype), 1.0
        elif self.lsa_temperature is not None:
            q, scale = q * self.lsa_temperature.exp().to(q.dtype), 1.0
        if pool > 1:
            q = pool_queries(q, grid, pool)  # (B, nh, N / pool**2, hd)
        if queries is not None:
            if self.rel_pos_h is not None:
                raise ValueError("SAM's relative positions read every query; run the layer on all of them")
            q = q[:, :, :queries]  # (B, nh, n, hd)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        n, rules, active = q.shape[2], current_rules(), active_hooks()
        explicit = output_attentions or self.hook_pattern in active  # the probabilities are asked for, or hooked
        bias = None
        if (self.rel_pos_bias is not None or self.rel_pos_h is not None or self.window_bias is not None
                or shared_bias is not None or mask is not None or key_mask is not None or near or self.locality):
            def bias_rows(start: int, stop: int, q: torch.Tensor = q) -> torch.Tensor:  # q before the rules' copy
                """Rows ``start..stop`` of all that is added to the logits, ``(B or 1, nh or 1, stop - start, N)``:
                the position biases, Swin's shifted-window mask, NaFlex's key padding and NACLIP's neighbourhood."""
                rows = None if (start, stop) == (0, N) else torch.arange(start, stop)  # None: every row (cached index)
                shared = None if shared_bias is None else shared_bias(rows)  # (nh, stop - start, N)
                bias = self.logit_bias(q[:, :, start:stop], grid, shared, rows)
                if near:
                    gh, gw = grid
                    neighbours = neighbourhood_bias(grid, N - gh * gw, near, rows, q.device).to(q.dtype)  # (n, N)
                    bias = neighbours[None, None] if bias is None else bias + neighbours
                if mask is not None:
                    rows_mask = mask[:, :, start:stop].to(q.dtype)  # (B, 1, stop - start, N)
                    bias = rows_mask if bias is None else bias + rows_mask
                if key_mask is not None:
                    padding = padding_bias(key_mask, q.dtype, stop - start)  # (B, 1, stop - start, N)
                    bias = padding if bias is None else bias + padding
                own = self.own_key_bias(torch.arange(start, stop, device=q.device), N, q.dtype)
                if own is not None:  # locality self-attention: each query's own key gets zero probability
                    bias = own if bias is None else bias + own
                return bias

            if self.hook_bias in active or (explicit and rules is not PLAIN_RULES):  # whole, as its reader needs it
                bias = rules.logit_bias(self.hook_bias(bias_rows(0, n)))  # (B or 1, nh or 1, n, N)
            else:  # formed per query chunk (by the fused path, or added to the scores below): never all n rows
                bias = bias_rows if rules is PLAIN_RULES else lambda s, e: rules.logit_bias(bias_rows(s, e))
        if rules is not PLAIN_RULES:
            q, k, v = rules.attention_inputs(q, k, v)
        dropout_p = self.attention_dropout if self.training else 0.0
        # The logits' rows and columns: q against k, or a variant's pairs, whose softmaxes are summed
        operands = ((q, k),) if variant is None else variant.operands(q, k, v)
        probs = y = None
        if not operands:  # MaskCLIP: no logits; each token attends to itself alone, so its context is its value
            if explicit:
                probs = torch.eye(N, dtype=v.dtype, device=v.device).expand(B, self.num_heads, N, N)
            else:
                y = v
        for rows, columns in operands:
            if explicit:
                # The scale on the rows (n x hd) rather than on the logits (n x N): one pass over the smaller tensor
                # (timm's order); at SAM 2's global layers (4,096 keys) scaling the logits cost 8 % of the forward.
                scores = (rows * scale if scale != 1.0 else rows) @ columns.transpose(-2, -1)  # (B, nh, n, N)
                if callable(bias):  # added in place a chunk of rows at a time: the scores and one chunk, not two T²
                    scores = add_bias_rows(scores, bias)
                elif bias is not None:
                    scores = scores + bias
                pair = scores.softmax(dim=-1)
                del scores  # before probs @ v: one (B, nh, n, N) tensor held through it, not two
                probs = pair if probs is None else probs + pair
                del pair  # nor the softmax a hook on the pattern replaces
            else:
                # SAM ViT-B's global layer at 1,024 px: its bias is 805 MB whole (12 x 4,096 x 4,096), 67 MB a chunk
                pair = fused_attention(rows, columns, v, dropout_p, bias,
                                       None if scale != 1.0 else 1.0)  # (B, nh, n, hd)
                y = pair if y is None else y + pair
        if explicit:
            probs = self.hook_pattern(probs)
            y = F.dropout(probs, dropout_p, self.training) @ v  # (B, nh, n, hd)
        z = self.hook_z(y.transpose(1, 2))  # (B, n, nh, hd): each head's context, before the projection
        return self.proj_dropout(self.proj(z.reshape(B, q.shape[2], -1))), probs if output_attentions else None


def add_bias_rows(scores: torch.Tensor, bias: Callable[[int, int], torch.Tensor]) -> torch.Tensor:
    """``scores`` (B, nh, n, N) plus ``bias(start, stop)`` (its rows ``start..stop``, broadcast to the scores'),
    added in place in chunks of at most ``BIAS_CHUNK_BYTES``: the same sums as one add of the whole bias. Where
    autograd records the scores, one add of the whole (the in-place chunks would each keep a copy for the backward
    of their slice)."""
    B, nh, n, N = scores.shape
    if scores.requires_grad:
        return scores + bias(0, n)
    rows = max(1, BIAS_CHUNK_BYTES // (B * nh * N * scores.element_size()))
    for s in range(0, n, rows):
        scores[:, :, s:s + rows] += bias(s, min(s + rows, n))
    return scores


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    bias: torch.Tensor | Callable[[int, int], torch.Tensor] | None = None,
                    scale: float | None = None) -> torch.Tensor:
    """``scaled_dot_product_attention`` of q (B, nh, n, hd) against k, v (B, nh, N, hd), ``bias`` (B or 1, nh, n,
    N) added to the logits, or ``bias(start, stop)`` forming its rows ``start..stop`` when asked (``scale``: of
    q . k, None for 1 / sqrt(hd)). On a CPU in query chunks of at most ``FUSED_CHUNK_FLOPS`` each (a row's softmax
    runs along the keys, which every chunk holds whole, so each chunk is exactly those rows of the whole call), with
    a formed bias chunk of at most ``BIAS_CHUNK_BYTES`` on any device; otherwise (a GPU's calls return at once)
    whole."""
    B, nh, n, hd = q.shape
    N = k.shape[2]
    rows = max(1, FUSED_CHUNK_FLOPS // (4 * B * nh * N * hd)) if q.device.type == "cpu" else n
    if callable(bias):
        rows = min(rows, max(1, BIAS_CHUNK_BYTES // (B * nh * N * q.element_size())))
    if rows >= n:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias(0, n) if callable(bias) else bias,
                                              dropout_p=dropout_p, scale=scale)
    out = q.new_empty(B, nh, n, v.shape[-1])
    for s in range(0, n, rows):
        e = min(s + rows, n)
        mask = None if bias is None else bias(s, e) if callable(bias) else bias[:, :, s:e]
        out[:, :, s:e] = F.scaled_dot_product_attention(q[:, :, s:e], k, v, attn_mask=mask, dropout_p=dropout_p,
                                                        scale=scale)
        del mask  # before the next chunk's is formed: one chunk at a time, not two
    return out  # (B, nh, n, hd)


class MLP(Parent):
    """fc1, activation, fc2; gated (SwiGLU: ``act(fc1_g(x)) * fc1(x)``) and with EVA's inner norm when configured."""

    def __init__(self, config: ViTConfig, size: int = 0) -> None:
        super().__init__()
        self.activation = config.activation
        size, bias = size or config.mlp_size, config.proj_bias  # size: the pooling probe's own MLP width (PE-G)
        self.fc1_g = nn.Linear(config.hidden_size, size, bias=bias) if config.gated_mlp else None
        self.fc1 = nn.Linear(config.hidden_size, size, bias=bias)
        self.norm = make_norm(config, size) if config.mlp_norm else None
        self.fc2 = nn.Linear(size, config.hidden_size, bias=bias)
        self.dropout = nn.Dropout(config.dropout)
        self.hook_pre = HookPoint()  # (B, T, mlp): what the activation reads (the gate's, for SwiGLU)
        self.hook_pre_linear = HookPoint()  # SwiGLU's ungated branch fc1(x)
        self.hook_post = HookPoint()  # the activations (gated), before EVA's norm and fc2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rules = current_rules()
        if self.fc1_g is None:
            pre = self.hook_pre(self.fc1(x))
            if rules is not PLAIN_RULES:
                h = rules.activation(pre, self.activation)
            else:
                # In place where nothing else reads fc1's output (no gradient, no hook that may keep it): one
                # (B, T, mlp) tensor instead of two, so no 2 x 2.4 MB freed at the heap's top in every block for
                # glibc to hand back and fault in again (PE core at one thread: 22,000 page faults a forward, 900)
                h = activate(pre, self.activation, not pre.requires_grad and self.hook_pre not in active_hooks())
        else:
            h = rules.product(rules.activation(self.hook_pre(self.fc1_g(x)), self.activation),
                              self.hook_pre_linear(self.fc1(x)))
        h = self.hook_post(h)
        if self.norm is not None:
            h = self.norm(h)
        return self.dropout(self.fc2(self.dropout(h)))


class AttentionPool(Parent):
    """Multi-head attention pooling ("MAP", SigLIP's and PE's head; timm ``AttentionPoolLatent``): a learned probe
    attends to every token, then ``x + mlp(norm(x))``; AIMv2's (``pool_head="aimv2"``) has no q projection and
    nothing after its output projection; V-JEPA 2's (``pool_head="vjepa2"``, HF ``VJEPA2PoolerCrossAttentionLayer``)
    reads its keys and values from ``kv_norm(x)``, has no output projection, adds the latent as the residual, then
    ``x + mlp(norm(x))``. Its attention is returned like a layer's, ``(B, nh, 1, T)`` (``nh`` the probe's heads):
    the map of what the model reads for its embedding, where others have a CLS row."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.num_heads = config.pool_heads or config.num_heads
        self.head_dim = d // self.num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, d))
        full = config.pool_head in ("map", "vjepa2")
        residual = config.pool_head == "vjepa2"  # the latent added back after the attention, no projection
        self.q = nn.Linear(d, d) if full else None
        self.kv_norm = make_norm(config, d) if residual else None
        self.kv = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(d, d) if not residual else None
        self.norm = make_norm(config, d) if full else None
        self.mlp = MLP(config, config.pool_mlp_size) if full else None
        self.hook_k, self.hook_v = HookPoint(), HookPoint()  # (B, nh, T, hd)
        self.hook_pattern = HookPoint()  # (B, nh, 1, T): the probe's attention
        # timm naflexvit's pool_include_prefix=False: the leading prefix tokens are masked as keys, so the probe
        # gives them exactly zero, as timm's slicing them off does, and its attention still spans every token
        self.skip = 0 if config.pool_prefix else config.num_prefix_tokens

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` (B, T, D) -> pooled (B, D), probe attention (B, nh, 1, T); ``key_mask`` (B, T): False at padding
        tokens, which the probe then does not read (HF Siglip2's head with ``pixel_attention_mask``)."""
        B, N, C = x.shape
        if self.skip:  # one token alone (the logit lens's read-out) is still read: a softmax over one key is 1
            skipped = torch.arange(N, device=x.device)[None, :] >= self.skip  # (1, N)
            key_mask = skipped if key_mask is None else key_mask.bool() & skipped  # (B, N)
        latent = self.q(self.latent) if self.q is not None else self.latent  # (1, 1, C)
        q = latent.view(1, 1, self.num_heads, self.head_dim).transpose(1, 2)  # (1, nh, 1, hd)
        if self.kv_norm is not None:
            x = self.kv_norm(x)
        kv = self.kv(x).view(B, N, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (2, B, nh, N, hd)
        k, v = kv.unbind(0)  # each (B, nh, N, hd)
        k, v = self.hook_k(k), self.hook_v(v)
        rules = current_rules()
        if rules is not PLAIN_RULES:  # the probe's two matmuls take the attention rules, as in a layer
            q, k, v = rules.attention_inputs(q, k, v)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))  # (B, nh, 1, N)
        if key_mask is not None:
            scores = scores + padding_bias(key_mask, scores.dtype, 1)  # (B, 1, 1, N)
        probs = self.hook_pattern(scores.softmax(dim=-1))
        y = (probs @ v).transpose(1, 2).reshape(B, 1, C)  # (B, 1, C)
        y = self.proj(y) if self.proj is not None else y + self.latent
        if self.mlp is not None:
            y = y + self.mlp(self.norm(y))
        return y[:, 0], probs


class Projector(Parent):
    """A vision-language model's projector (``ViTConfig.projector``): the tower's tokens -> the language model's
    image tokens. LLaVA's ``LlavaMultiModalProjector`` (fc1, activation, fc2 on each token), PaliGemma's one linear,
    or Gemma 3's ``Gemma3MultiModalProjector``: a ``pool`` x ``pool`` average over the patch grid, Gemma's RMSNorm
    (its ``1 + weight`` held as the norm's weight) and a bias-free linear, one token per pooled cell; or Qwen-VL's
    merger (``Qwen2_5_VLPatchMerger``): each token normed (``ln_q``), each ``unit`` x ``unit`` merge unit's tokens
    concatenated (row-major inside the unit), then fc1, GELU, fc2, one token per unit; ``shuffled_norm``: the norm
    over each unit's concatenation instead (Qwen3-VL's DeepStack mergers, ``use_postshuffle_norm``); or InternVL's
    (``pixel_shuffle`` then ``InternVLMultiModalProjector``): each ``unit`` x ``unit`` unit's tokens concatenated in
    the same order, a LayerNorm over the concatenation, then fc1 to the language model's width, the activation,
    fc2."""

    def __init__(self, config: ViTConfig, shuffled_norm: bool = False) -> None:
        super().__init__()
        d, e, kind = config.hidden_size, config.projector_dim, config.projector
        self.pool = config.projector_pool
        self.activation = config.projector_activation
        self.unit = config.spatial_merge if kind == "qwen" else config.projector_unit if kind == "internvl" else 0
        self.shuffled_norm = shuffled_norm or kind == "internvl"
        self.norm = (RMSNorm(d, eps=config.layer_norm_eps) if kind == "gemma3" else
                     make_norm(config, d * self.unit ** 2 if shuffled_norm else d) if kind == "qwen" else
                     LayerNorm(d * self.unit ** 2, eps=INTERNVL_PROJECTOR_EPS) if kind == "internvl" else None)
        if self.unit:  # the mlp reads a unit's u*u tokens at once; Qwen's merger keeps that width to its last linear
            d = d * self.unit ** 2
            hidden = d if kind == "qwen" else e
        else:
            hidden = e
        self.fc1 = nn.Linear(d, hidden, bias=kind in ("linear", "qwen", "internvl")
                             or (kind == "mlp" and config.projector_bias))
        self.fc2 = (nn.Linear(hidden, e, bias=config.projector_bias) if kind in ("mlp", "qwen")
                    else nn.Linear(e, e) if kind == "internvl" else None)
        self.hook_pre = HookPoint()  # (B, N, E): mlp's fc1 output, what its activation reads (qwen: u*u*D wide)

    def forward(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """``x`` (B, N, D), the tokens the projector reads (gemma3: ``grid``'s patches, row-major) -> (B, N', E)."""
        if self.pool:
            B, N, D = x.shape
            (gh, gw), k = grid, self.pool
            if gh % k or gw % k:
                raise ValueError(f"a {gh}x{gw} patch grid is not made of whole {k}x{k} cells of the projector's "
                                 f"average pool; give the image sides that are multiples of {k} patches")
            x = x.transpose(1, 2).reshape(B, D, gh, gw)  # (B, D, gh, gw), as HF reshapes it
            x = self.norm(F.avg_pool2d(x, k).flatten(2).transpose(1, 2))  # (B, gh/k * gw/k, D)
        if self.unit:
            B, N, D = x.shape
            (gh, gw), u = grid, self.unit
            if gh % u or gw % u:
                raise ValueError(f"a {gh}x{gw} patch grid is not made of whole {u}x{u} merge units; give the image "
                                 f"sides that are multiples of {u} patches")
            x = x if self.shuffled_norm else self.norm(x)
            x = x.view(B, gh // u, u, gw // u, u, D).permute(0, 1, 3, 2, 4, 5)  # (B, gh/u, gw/u, u, u, D)
            x = x.reshape(B, (gh // u) * (gw // u), u * u * D)  # (B, units, u*u*D), units row-major
            x = self.norm(x) if self.shuffled_norm else x
        h = self.fc1(x)  # (B, N', E)
        if self.fc2 is None:
            return h
        rules = current_rules()
        h = self.hook_pre(h)
        h = activate(h, self.activation) if rules is PLAIN_RULES else rules.activation(h, self.activation)
        return self.fc2(h)


def drop_path(x: torch.Tensor, rate: float, training: bool) -> torch.Tensor:
    """Stochastic depth: drop the whole residual branch per sample, rescale the kept ones."""
    if rate == 0.0 or not training:
        return x
    keep = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(1.0 - rate)
    return x * keep / (1.0 - rate)


class Block(Parent):
    """Pre-norm encoder block: x + MSA(LN(x)), then x + MLP(LN(x)) (each branch times its layer scale, if any);
    with ``post_norm``: LN(x + MSA(x)), then LN(x + MLP(x)); with ``res_post_norm`` (Swin V2): x + LN(MSA(x)),
    then x + LN(MLP(x)). The first block of a later stage opens with its ``merge`` (``vit.model.stages``)."""

    def __init__(self, config: ViTConfig, drop_path_rate: float = 0.0, window: int = 0, shift: bool = False,
                 merge: PatchMerging | QueryPool | None = None) -> None:
        super().__init__()
        self.window = window  # SAM / ViTDet / Swin: the attention runs in window x window patches; 0: globally
        self.shift = shift  # Swin: this block shifts its windows by half a window (where the grid allows)
        self.table_window = config.rel_pos in ("swin", "swinv2")  # Swin's windows never exceed the grid
        self.shift_padded = config.shift_padded
        self.window_rule = config.window_rule  # how Swin's windows and shift meet a grid no wider than a window
        self.merge = merge  # the downsampling block opening this block's stage (None: the grid stays)
        # Hiera / SAM 2: this block pools its queries and residual by this stride (its window, ``self.window``, is
        # then the previous stage's, on the grid it receives); 1: no query pooling.
        self.pool = merge.stride if isinstance(merge, QueryPool) else 1
        self.mask_units = config.mask_units
        self.unit = config.spatial_merge or 1  # Qwen2.5-VL: windows of whole merge units, slots unit by unit
        # Post-norm blocks normalise the residual stream after each sum instead (post_norm1/2), Swin V2 each
        # branch before it (res_norm1/2); norm1 and norm2 are then identities, so norm1(x) is still what the
        # attention reads.
        d = config.hidden_size
        plain = not (config.post_norm or config.res_post_norm)
        d_in = merge.proj.in_features if isinstance(merge, QueryPool) else d  # Hiera: the previous stage's width
        self.norm1 = make_norm(config, d_in) if plain else nn.Identity()
        self.attn = Attention(config, window, d_in if d_in != d else 0)
        self.norm2 = make_norm(config, d) if plain else nn.Identity()
        self.mlp = MLP(config)
        post = config.post_norm
        self.post_norm1 = make_norm(config, d) if post else None
        self.post_norm2 = make_norm(config, d) if post else None
        # TimeSformer (divided_attention): before the spatial attention (self.attn, each frame's patches with the CLS
        # copied in front), the patches attend over their own position's frames: HF's temporal_layernorm,
        # temporal_attention and temporal_dense; the CLS takes no part in it. frames: the clip's, which the
        # partitions need (the blocks see the folded grid (t*gh, gw)); 0 in every other model.
        self.frames = config.num_frames if config.divided_attention else 0
        self.temporal_norm = make_norm(config, d) if self.frames else None
        self.temporal_attn = Attention(config) if self.frames else None
        self.temporal_dense = nn.Linear(d, d) if self.frames else None
        self.res_norm1 = make_norm(config, d) if config.res_post_norm else None
        self.res_norm2 = make_norm(config, d) if config.res_post_norm else None
        self.drop_path_rate = drop_path_rate
        # Layer scale (CaiT, DINOv2): a learned per-channel gain on each residual branch.
        scale = config.layer_scale
        self.ls1 = nn.Parameter(torch.full((config.hidden_size,), float(scale))) if scale is not None else None
        self.ls2 = nn.Parameter(torch.full((config.hidden_size,), float(scale))) if scale is not None else None
        # Each (B, T, D): the block's input, norm1(x), the attention branch as added (after layer scale), the
        # stream between the branches, norm2(mid), the MLP branch as added, the block's output. A block with a
        # merge: hook_resid_pre is the stream as it arrives (the previous stage's grid and width), hook_merged the
        # merged one, on this block's grid (B, T', D').
        self.hook_resid_pre, self.hook_attn_in, self.hook_attn_out = HookPoint(), HookPoint(), HookPoint()
        self.hook_resid_mid, self.hook_mlp_in, self.hook_mlp_out = HookPoint(), HookPoint(), HookPoint()
        self.hook_resid_post = HookPoint()
        self.hook_merged = HookPoint() if merge is not None else None
        # TimeSformer: the temporal branch as added to the patch tokens (B, t*gh*gw, D), after temporal_dense; the
        # temporal attention's pattern is blocks.i.temporal_attn.hook_pattern, (B * gh*gw, nh, t, t), a patch
        # position's frames in order (vit.model.layouts.divided_partitions)
        self.hook_temporal_out = HookPoint() if self.frames else None

    def grid_after(self, grid: tuple[int, int]) -> tuple[int, int]:
        """This block's own grid, given the grid of the stream it receives (its merge's output grid, if any)."""
        return self.merge.grid_after(grid) if self.merge is not None else tuple(grid)

    def layout(self, grid: tuple[int, int], built: tuple[int, int] | None = None) -> LayerLayout:
        """Where this block's attention sits, on its own ``grid``: window and cyclic shift (0: none). ``built``: the
        grid HF Swin V2 builds this layer for, whose height fixes its windows (``window_and_shift``)."""
        if self.pool > 1 or self.mask_units:
            return self._pooled_layout(grid)
        if not self.window:
            return LayerLayout(tuple(grid))
        if self.table_window:
            # V2's MLP reads any offsets; V1's table only its own, unless timm's checkpoint filter resizes it
            shrink = self.attn.logit_scale is not None or self.window_rule == "timm"
            window, shift = window_and_shift(grid, self.window, self.shift, shrink, self.window_rule, built)
        else:
            window, shift = self.window, 0
        return LayerLayout(tuple(grid), window, shift, self.shift_padded, unit=self.unit)

    def _pooled_layout(self, grid: tuple[int, int]) -> LayerLayout:
        """Hiera / SAM 2: a pooled-query layer's queries on ``grid``, keys and windows ``pool`` times finer; the
        pooled grid must be whole, and Hiera's mask units must tile their grid (its libraries pad nothing)."""
        s = self.pool
        keys = (grid[0] * s, grid[1] * s)
        if self.window % s:
            raise ValueError(f"a {self.window}x{self.window} window does not pool by {s}")
        if self.mask_units and self.window and (keys[0] % self.window or keys[1] % self.window):
            raise ValueError(f"a {keys[0]}x{keys[1]} patch grid is not tiled by {self.window}x{self.window} mask "
                             "units")
        return LayerLayout(tuple(grid), self.window // s, 0, self.shift_padded, s)

    def forward(self, x: torch.Tensor, output_attentions: bool = False,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None, queries: int | None = None,
                grid: tuple[int, int] | None = None, shared_bias: SharedBias | None = None,
                key_mask: torch.Tensor | None = None, layout: LayerLayout | None = None,
                variant: AttentionVariant | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``x`` (B, T, D) -> the block's output for its first ``queries`` tokens (None: all), which attend to
        every token, and the attention (B, nh, queries or T, T) when asked; a windowed block's is each window's,
        ``(B * nw, nh, wh*ww, wh*ww)`` (``window_partition``'s order, after the cyclic shift in a shifting block).
        ``grid``: the patch grid of ``x`` (needed by windows, relative positions and a merge; after a merge the
        block works on ``grid_after(grid)``); ``shared_bias(rows)``: rows of the bias every layer adds (BEiT's shared
        table, ``Attention.forward``); ``key_mask`` (B, T): False at padding tokens, which no query reads; ``layout``:
        this layer's (``ViT.layer_layouts``; None: ``self.layout`` of its grid); ``variant``: the block computed as an
        ``AttentionVariant`` says (its attention's pairs, with or without the residual and the MLP; None: as the model
        does), in a global block alone."""
        if variant is not None and (self.window or self.mask_units or self.merge is not None or self.frames):
            raise ValueError("an attention variant (SCLIP, NACLIP, ClearCLIP, CLIP Surgery, MaskCLIP) changes a "
                             "global block; this one attends in windows or opens a stage")
        x = self.hook_resid_pre(x)
        if self.frames:
            x = self._temporal(x, grid)  # (B, T, D): the patches plus their attention over time
        if self.merge is not None and grid is None:
            raise ValueError("this block merges patches, so the patch grid must be given")
        if self.merge is not None and self.pool == 1 and not isinstance(self.merge, QueryPool):
            x = self.hook_merged(self.merge(x, grid))  # (B, T', D')
            grid = self.merge.grid_after(grid)
        h = self.hook_attn_in(self.norm1(x))
        if key_mask is not None and (self.window or self.mask_units or self.merge is not None or self.frames):
            raise ValueError("padding tokens (NaFlex batches) meet windows, mask units or a merge only on a plain grid")
        if isinstance(self.merge, QueryPool):  # Hiera / SAM 2: the residual and the queries pooled from norm1(x)
            x = self.hook_merged(self.merge(h, grid))  # (B, T', D')
            y, probs = self._pooled_attention(h, grid, output_attentions)
        elif self.mask_units:
            y, probs = self._pooled_attention(h, grid, output_attentions)
        elif self.frames:
            y, probs = self._spatial(h, grid, output_attentions)
        elif self.window:
            if grid is None:
                raise ValueError("this model attends within windows, so the patch grid must be given")
            layout = self.layout(grid) if layout is None else layout
            w, s = layout.window, layout.shift
            windows = layout.cut(h)  # (B * nw, wh*ww, D)
            mask = None
            if s:
                mask = shift_mask(tuple(grid), w, s).to(h.device)  # (nw, n, n)
                mask = mask.repeat(h.shape[0], 1, 1)[:, None]  # (B * nw, 1, n, n)
            if rope is not None:  # each window's tokens turned by their own positions on the grid
                rope = tuple(layout.cut(t[None]).repeat(h.shape[0], 1, 1) for t in rope)  # (B * nw, n, hd) each
            padding = layout.key_mask()  # (nw, n): Qwen's padding slots are no tokens
            if padding is not None:
                padding = padding.to(h.device).repeat(h.shape[0], 1)  # (B * nw, n)
            y, probs = self.attn(windows, output_attentions, rope, None, layout.window_hw, shared_bias, mask,
                                 key_mask=padding)
            y = layout.join(y)[:, :queries]  # (B, T or queries, D)
        else:
            y, probs = self.attn(h, output_attentions, rope, queries, grid, shared_bias, key_mask=key_mask,
                                 variant=variant)
        if queries is not None:
            x = x[:, :queries]  # (B, n, D)
            y = y[:, :queries]
        if self.res_norm1 is not None:
            y = self.res_norm1(y)
        if self.ls1 is not None:
            y = y * self.ls1
        y = drop_path(self.hook_attn_out(y), self.drop_path_rate, self.training)
        x = x + y if variant is None or variant.residual else y
        if self.post_norm1 is not None:
            x = self.post_norm1(x)
        x = self.hook_resid_mid(x)
        if variant is None or variant.mlp:
            y = self.mlp(self.hook_mlp_in(self.norm2(x)))
            if self.res_norm2 is not None:
                y = self.res_norm2(y)
            if self.ls2 is not None:
                y = y * self.ls2
            x = x + drop_path(self.hook_mlp_out(y), self.drop_path_rate, self.training)
            if self.post_norm2 is not None:
                x = self.post_norm2(x)
        return self.hook_resid_post(x), probs



    def _pooled_attention(self, h: torch.Tensor, grid: tuple[int, int], output_attentions: bool
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Hiera / SAM 2's attention on the normed stream ``h`` (B, gh*gw, D) of the grid it receives: in its
        windows (zero-padded to a multiple, SAM 2) or globally, queries max-pooled by ``pool``. Returns (B, T', D')
        on the pooled grid and the attention ``(B * nw, nh, (w/s)**2, w*w)`` (global: ``(B, nh, T', T)``)."""
        s, w = self.pool, self.window
        layout = self._pooled_layout((grid[0] // s, grid[1] // s))
        if not w:
            return self.attn(h, output_attentions, grid=tuple(grid), pool=s)
        windows = shift_windows(h, grid, w, 0, True)  # (B * nw, w*w, D)
        y, probs = self.attn(windows, output_attentions, grid=(w, w), pool=s)  # (B * nw, (w/s)**2, D')
        return unshift_windows(y, layout.grid, w // s, 0, True), probs

    def clip_grid(self, grid: tuple[int, int] | None) -> tuple[int, int, int]:
        """TimeSformer: the clip ``(t, gh, gw)`` whose folded grid ``(t*gh, gw)`` this block receives."""
        if grid is None or grid[0] % self.frames:
            raise ValueError(f"this block divides its attention over {self.frames} frames, so the clip's folded "
                             f"grid (frames*rows, cols) must be given, got {grid}")
        return self.frames, grid[0] // self.frames, grid[1]

    def _temporal(self, x: torch.Tensor, grid: tuple[int, int] | None) -> torch.Tensor:
        """TimeSformer's temporal step on the stream ``x`` (B, 1 + t*gh*gw, D): each patch position's tokens attend
        over its frames (their own norm and attention), then ``temporal_dense``; added to the patches alone."""
        by_position, _ = divided_partitions(self.clip_grid(grid))
        patches = x[:, 1:]  # (B, t*gh*gw, D)
        h = partition(self.temporal_norm(patches), by_position)  # (B * gh*gw, t, D)
        y, _ = self.temporal_attn(h)  # (B * gh*gw, t, D); its pattern at temporal_attn.hook_pattern
        y = drop_path(unpartition(y, by_position), self.drop_path_rate, self.training)  # (B, t*gh*gw, D)
        y = self.hook_temporal_out(self.temporal_dense(y))
        return torch.cat([x[:, :1], patches + y], dim=1)

    def _spatial(self, h: torch.Tensor, grid: tuple[int, int] | None, output_attentions: bool
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """TimeSformer's spatial attention on the normed stream ``h`` (B, 1 + t*gh*gw, D): each frame's patches, the
        CLS copied in front, attend among themselves; the CLS's outputs are averaged over the frames (HF
        ``TimesformerLayer``). Returns (B, 1 + t*gh*gw, D) and the attention ``(B * t, nh, 1 + gh*gw, 1 + gh*gw)``
        (frame-major within each clip: HF's ``output_attentions``)."""
        B, _, D = h.shape
        _, by_frame = divided_partitions(self.clip_grid(grid))
        t = by_frame.shape[0]
        frames = partition(h[:, 1:], by_frame)  # (B * t, gh*gw, D)
        cls = h[:, :1].repeat_interleave(t, dim=0)  # (B * t, 1, D): the CLS in front of every frame
        y, probs = self.attn(torch.cat([cls, frames], dim=1), output_attentions)  # (B * t, 1 + gh*gw, D)
        cls = y[:, :1].reshape(B, t, D).mean(dim=1, keepdim=True)  # (B, 1, D)
        return torch.cat([cls, unpartition(y[:, 1:], by_frame)], dim=1), probs
