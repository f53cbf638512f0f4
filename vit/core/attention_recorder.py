"""The recorder at the attention function itself: any torch module's attention, recorded where it is computed.

While ``AttentionRecording`` (a ``TorchFunctionMode``) is current, every attention call a module makes is seen,
whatever code surrounds it: ``F.scaled_dot_product_attention`` (the authors' DINOv2, timm's fused path, transformers'
sdpa), ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``: OpenAI's CLIP, open_clip) and an explicit
``softmax(q k^T)`` of a module's own (timm's explicit path, a hand-written attention). The layers are those calls in
the order the forward makes them, each named by the module that made it (the nearest caller that is a module of the
model). The module's own output is returned; for the layers the recorder asks, and those alone, the post-softmax
probabilities ``(B, H, rows, keys)`` are handed to it (``recorder.keep_probabilities``):

- SDPA: the probabilities are formed once, ``softmax(q k^T * scale + mask)`` (a boolean or additive mask, ``is_causal``,
  grouped-query heads and the scale as SDPA reads them), and the output is ``probabilities @ v``: one computation,
  never the eager one and SDPA both. Where the recorder asks for some query rows only, only those rows are formed
  (``rows x keys`` a head) and the output is SDPA's own.
- ``nn.MultiheadAttention``: its own function asked for its per-head weights (``need_weights=True,
  average_attn_weights=False``), the explicit path it computes them on, once; the caller gets what it asked for.
- An explicit softmax over a ``(B, H, T, S)`` tensor (or, in a module that declares its ``num_heads``, a
  ``(B * H, T, S)`` one: an ``nn.MultiheadAttention``'s explicit path, ViTDet's; a ``(B, windows, H, T, S)`` one:
  Twins' windows, handed on as ``(B * windows, H, T, S)``): the module formed its probabilities itself; they are
  handed on as they are.

Before a recorded layer's scores are formed, their bytes are counted against the analysis memory limit
(``TooManyTokens``, one line). ``AttentionTrace`` (the same mode, nothing recorded) notes each call's module, heads,
queries and keys, and the patch embedding (a convolution or an unfold on the input, or a convolution on a resized copy
of the whole input, whose stride is its kernel: its patch then in the input's own pixels) or, where there is none,
the feature map flattened into tokens before the first attention call, on any device, the meta device included: what
``vit.sources.library_road.module_road`` places the tokens by.
"""

from __future__ import annotations

import inspect
import math
import sys
from dataclasses import dataclass
from fractions import Fraction

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from vit.costs import bounds

SDPA = F.scaled_dot_product_attention
MHA = F.multi_head_attention_forward
SOFTMAX = (torch.softmax, F.softmax, torch.Tensor.softmax)
CONV = (torch.conv2d, F.conv2d, torch.conv3d, F.conv3d)  # 3-D: a tubelet of one frame over a clip (VideoPrism's)
FLATTEN = (torch.flatten, torch.Tensor.flatten)
_MHA_SIGNATURE = inspect.signature(MHA)
_SDPA_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


@dataclass(frozen=True)
class AttentionCall:
    """One attention call as the forward made it: its index (the layer), the module that made it (``name``, its
    path in the model), what computed it (``kind``: "sdpa", "mha", "softmax"), its heads, query rows and keys."""

    index: int
    name: str
    kind: str
    heads: int
    queries: int
    keys: int
    batch: int = 1  # the batch it ran over (its crops, where a model splits one image into several)


def _caller(modules: dict[torch.nn.Module, str]) -> torch.nn.Module | None:
    """The nearest frame's ``self`` that is one of ``modules``: the module that made the call being handled."""
    frame = sys._getframe(2)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, torch.nn.Module) and owner in modules:
            return owner
        frame = frame.f_back
    return None


def _sdpa_arguments(args, kwargs) -> dict:
    bound = dict(zip(_SDPA_NAMES, args, strict=False))
    bound.update(kwargs)
    return bound


def _bounded(batch: int, heads: int, rows: int, keys: int, name: str) -> None:
    """``TooManyTokens`` (one line) when one layer's scores and probabilities, float32, are over the memory limit."""
    need, limit = 2 * 4 * batch * heads * rows * keys, bounds.memory_limit()
    if need > limit:
        raise bounds.TooManyTokens(
            f"Recording {name}'s attention ({heads} heads, {rows:,} query rows over {keys:,} keys) needs about "
            f"{need / 2**20:,.0f} MB, over the {limit / 2**20:,.0f} MB limit ({bounds.ANALYSIS_MEMORY_ENV}); ask for "
            "one query's row, fewer images or a smaller input.")


def sdpa_probabilities(query: torch.Tensor, key: torch.Tensor, attn_mask: torch.Tensor | None = None,
                       is_causal: bool = False, scale: float | None = None, rows: list[int] | None = None
                       ) -> torch.Tensor:
    """The probabilities ``F.scaled_dot_product_attention`` weighs its values by: ``softmax(q k^T * scale + mask)``
    for query ``(..., H, L, D)`` and key ``(..., Hk, S, D)`` (``Hk`` dividing ``H``: grouped-query heads share a
    key), a boolean mask (True: attend) or an additive one broadcast to ``(..., H, L, S)``, ``is_causal``'s lower
    triangle, ``scale`` (default ``D ** -0.5``); only the query ``rows`` where given: ``(..., H, rows, S)``."""
    heads, keys = query.shape[-3], key.shape[-2]
    if key.shape[-3] != heads:  # grouped-query attention: each key head serves heads // Hk query heads
        key = key.repeat_interleave(heads // key.shape[-3], dim=-3)
    length = query.shape[-2]
    index = torch.arange(length, device=query.device) if rows is None else torch.as_tensor(
        rows, dtype=torch.long, device=query.device)  # an empty list too: no row formed
    if rows is not None:
        query = query[..., index, :]
    # the scale on the queries (rows x D a head), not on the scores (rows x keys): one T x T pass and buffer fewer
    scores = (query * (1.0 / math.sqrt(query.shape[-1]) if scale is None else scale)) @ key.transpose(-2, -1)
    if is_causal:  # SDPA's causal mask: query i sees keys 0..i (its top-left aligned lower triangle)
        allowed = index[:, None] >= torch.arange(keys, device=query.device)[None, :]
        scores = scores.masked_fill(~allowed, float("-inf"))
    if attn_mask is not None:
        mask = attn_mask.expand(*attn_mask.shape[:-2], length, keys) if attn_mask.shape[-2] == 1 else attn_mask
        if rows is not None:
            mask = mask[..., index, :]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return scores.softmax(-1)


def sdpa_once(a: dict, rows: list[int] | None, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One ``F.scaled_dot_product_attention`` call (its arguments ``a``, by name) computed once with its
    probabilities: every row (``rows`` None) formed, ``softmax(q k^T * scale + mask)``, and the output ``probabilities
    @ v`` from them (in autograd's graph where it runs); else only the asked query ``rows`` formed, ``(..., H, rows,
    S)``, and the output SDPA's own. Counted first (``TooManyTokens``, one line, ``rows x keys`` a head); a call with
    dropout is refused in one line (``name``: the module that made it). Both roads' recorders compute through it: this
    module's and transformers' recording attention (``vit.core.recording_attention``)."""
    query, key, value = a["query"], a["key"], a["value"]
    if a.get("dropout_p", 0.0):
        raise ValueError(f"{name} runs its attention with dropout; put the model in eval mode (model.eval()) to "
                         "record it")
    _bounded(math.prod(query.shape[:-3]), query.shape[-3], query.shape[-2] if rows is None else len(rows),
             key.shape[-2], name)
    probabilities = sdpa_probabilities(query, key, a.get("attn_mask"), bool(a.get("is_causal")), a.get("scale"), rows)
    if rows is not None:  # some rows formed: the output is SDPA's own over every row
        return SDPA(**a), probabilities
    if value.shape[-3] != query.shape[-3]:  # grouped-query heads
        value = value.repeat_interleave(query.shape[-3] // value.shape[-3], dim=-3)
    return (probabilities @ value.to(probabilities.dtype)).to(query.dtype), probabilities


def formed_rows(recorder, layer: int, queries: int) -> list[int] | None:
    """The query rows an asked layer's call (of ``queries`` queries) forms or keeps alone, in the call's own order, on
    both roads (this module's ``AttentionRecording``, transformers' interface in ``recording_attention``); None: every
    row (a forward with a gradient; a windowed layer, whose rows are not the grid's: its windows formed whole, the
    asked rows read from each query's own, ``layer_rows``). A recorder with ``rows_for(layer, queries)`` names each
    call's own (an empty list: none): the library road's (a windowed layer that is one piece holding every token:
    the asked rows' slots), Qwen's pieces' (the asked rows its next piece holds)."""
    if recorder.gradient:
        return None
    rows_for = getattr(recorder, "rows_for", None)
    if rows_for is not None:
        return rows_for(layer, queries)
    if layer in getattr(recorder, "windows", {}):
        return None
    return recorder.rows_of.get(layer, recorder.rows) if recorder.rows_of else recorder.rows


def _heads_first(tensor: torch.Tensor, module: torch.nn.Module | None) -> bool:
    """Whether a 5-D SDPA call is ``(B, H, pieces, T, D)`` (NesT's blocks, after its heads) rather than ``(B, pieces,
    H, T, D)`` (Twins' windows): its module declares ``num_heads`` at dim 1, and not at dim 2. (A 5-D softmax of that
    shape is VOLO's outlook attention, pieces of overlapping neighbourhoods: not read so.)"""
    heads = getattr(module, "num_heads", None)
    return (tensor.dim() == 5 and isinstance(heads, int) and not isinstance(heads, bool) and tensor.shape[1] == heads
            and tensor.shape[2] != heads)


class AttentionRecording(TorchFunctionMode):
    """Within it, ``model``'s attention calls are counted in order and the layers ``recorder.modules`` lists
    (layer -> the module that makes that call) hand their probabilities to ``recorder.keep_probabilities(layer,
    probabilities, rows_formed)``; ``recorder.rows`` (None: every row) the query rows it asks, ``recorder.gradient``
    whether the probabilities stay in autograd's graph (then every row is formed and the output is computed from
    them). ``trace``: a list each call is noted in (``AttentionCall``), nothing recorded. ``layers``: the call each
    layer is, where some calls are no layer (DETR's decoder: ``image_tokens``; None: call i is layer i). ``calls``
    after the forward: how many attention calls it made."""

    def __init__(self, model: torch.nn.Module, recorder=None, trace: list | None = None,
                 image_hw: tuple[int, int] | None = None, skip: frozenset = frozenset(),
                 layers: list[int] | None = None):
        super().__init__()
        self.names = {module: name for name, module in model.named_modules()}
        self.recorder, self.trace, self.image_hw = recorder, trace, image_hw
        self.skip = skip  # modules whose calls are no layer (attention over channels): run as made, not counted
        self.layer_of = None if layers is None else {call: layer for layer, call in enumerate(layers)}
        self.calls = 0
        self.patch: tuple[int, int] | None = None  # the patch embedding's kernel (trace only)
        self.flat_grid: tuple[int, int] | None = None  # the last (B, C, h, w) map flattened to tokens before the
        # first attention call (trace only): a convolutional stem's grid (EfficientFormer's)
        self.linear_out: torch.Tensor | None = None  # the last linear layer's output (trace only)
        self.maps: set[tuple[int, int]] = set()  # the (rows, cols) of every 4-D tensor the forward made, channels
        # first or last (trace only): the grids a layer's tokens may be (``layer_places``)
        self.resized: list[torch.Tensor] = []  # the whole input resized (trace only): a patch embedding over one of
        # these covers the whole input too (Depth Pro's image encoder sees it at its ViT's own size)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is SDPA:
            return self._sdpa(_sdpa_arguments(args, kwargs))
        if func is MHA:
            return self._mha(_MHA_SIGNATURE.bind(*args, **kwargs))
        out = func(*args, **kwargs)
        if func in SOFTMAX:
            self._softmax(out, args, kwargs)
        elif self.trace is not None:
            self._note(func, args, kwargs, out)
        return out

    def _layer(self, kind: str, heads: int, queries: int, keys: int, batch: int = 1):
        """The call's layer and module, and the layer when the recorder asks it (else None)."""
        module = _caller(self.names)
        if module in self.skip:
            return None
        layer = self.calls
        self.calls += 1
        if self.trace is not None:
            self.trace.append(AttentionCall(layer, self.names.get(module, "?"), kind, heads, queries, keys, batch))
            return None
        if self.layer_of is not None:
            layer = self.layer_of.get(layer)
        asked = self.recorder.modules.get(layer) if self.recorder is not None and layer is not None else None
        if asked is None:
            return None
        if asked is not module:
            raise ValueError(f"the forward's attention call {layer} was made by {self.names.get(module, '?')}, not "
                             f"{self.names.get(asked, '?')} as when the model was opened: its layers change with "
                             "the input, which this road cannot place")
        return layer

    def _sdpa(self, a: dict):
        query, key = a["query"], a["key"]
        heads_first = _heads_first(query, _caller(self.names))
        heads = query.shape[1] if heads_first else query.shape[-3]
        layer = self._layer("sdpa", heads, query.shape[-2], key.shape[-2], math.prod(query.shape[:-2]) // heads)
        if layer is None:
            return SDPA(**a)
        rows = formed_rows(self.recorder, layer, query.shape[-2])
        out, probabilities = sdpa_once(a, rows, self.names.get(self.recorder.modules[layer], "?"))
        if heads_first:  # (B, H, pieces, ...): its pieces before its heads, as a windowed call's
            probabilities = probabilities.transpose(1, 2)
        if probabilities.dim() > 4:  # (B, windows, H, ...) of a 5-D call (Twins' windows): its pieces in the batch
            probabilities = probabilities.reshape(-1, *probabilities.shape[-3:])  # (a 4-D one kept as it is: the
            # tensor the output is computed from, whose gradient a class map reads)
        self.recorder.keep_probabilities(layer, probabilities, rows is not None)
        return out

    def _mha(self, bound: inspect.BoundArguments):
        a = bound.arguments
        query, key, heads = a["query"], a["key"], int(a["num_heads"])
        queries, keys = (query.shape[0], key.shape[0])
        keys += int(a.get("bias_k") is not None) + int(bool(a.get("add_zero_attn")))
        layer = self._layer("mha", heads, queries, keys, query.shape[1] if query.dim() == 3 else 1)
        if layer is None:
            return MHA(*bound.args, **bound.kwargs)
        batch = query.shape[1] if query.dim() == 3 else 1
        _bounded(batch, heads, queries, keys, self.names.get(self.recorder.modules[layer], "?"))
        asked, averaged = a.get("need_weights", True), a.get("average_attn_weights", True)
        a["need_weights"], a["average_attn_weights"] = True, False
        out, weights = MHA(*bound.args, **bound.kwargs)  # its explicit path: (B, H, L, S) weights, formed once
        weights = weights if weights.dim() == 4 else weights[None]
        rows = formed_rows(self.recorder, layer, queries)
        self.recorder.keep_probabilities(layer, weights if rows is None else weights[:, :, rows], rows is not None)
        return out, (weights.mean(1) if averaged else weights) if asked else None

    def _softmax(self, out: torch.Tensor, args, kwargs) -> None:
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        if not isinstance(out, torch.Tensor) or dim not in (-1, out.dim() - 1) or out.dim() not in (3, 4, 5):
            return
        module = _caller(self.names)
        if module is None:
            return
        declared = next((h for h in (getattr(module, n, None) for n in ("num_heads", "n_heads")) if isinstance(h, int)
                         and not isinstance(h, bool)), None)
        if out.dim() == 4 and declared is not None and out.shape[1] != declared == out.shape[2]:
            return  # (B, queries, H, points): a deformable attention's weights over its sampled points (Deformable
            # DETR's), not rows of queries over tokens
        if out.dim() == 5:  # (B, windows, H, T, S) of a module that declares its H heads (Twins' windows), not
            heads = getattr(module, "num_heads", None)  # a local attention's (B, H, T, k*k, k*k) (VOLO's outlook)
            if not isinstance(heads, int) or isinstance(heads, bool) or out.shape[2] != heads:
                return
            out = out.flatten(0, 1)
        if out.dim() == 3:  # (B * H, T, S): an nn.MultiheadAttention's explicit path, or a module that declares
            heads = getattr(module, "num_heads", None)  # its heads and folds them into the batch (ViTDet's)
            if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1 or out.shape[0] % heads:
                return
            out = out.view(-1, heads, *out.shape[-2:])
        layer = self._layer("softmax", out.shape[1], out.shape[2], out.shape[3], out.shape[0])
        if layer is not None:
            rows = formed_rows(self.recorder, layer, out.shape[2])
            self.recorder.keep_probabilities(layer, out if rows is None else out[:, :, rows], rows is not None)

    def _note(self, func, args, kwargs, out) -> None:
        """In a trace: the patch embedding (the first convolution or unfold over the whole input, or convolution over
        a resized copy of it, whose stride is its kernel), the last linear layer's output (what a classifier returns)
        and each 4-D tensor's sides."""
        if isinstance(out, torch.Tensor) and out.dim() == 4:
            self.maps.update({tuple(out.shape[-2:]), tuple(out.shape[1:3])})
        if func is F.linear:
            self.linear_out = out
            return
        if func in FLATTEN and self.calls == 0 and args and isinstance(args[0], torch.Tensor) and args[0].dim() == 4:
            start = args[1] if len(args) > 1 else kwargs.get("start_dim", 0)
            end = args[2] if len(args) > 2 else kwargs.get("end_dim", -1)
            if start == 2 and end in (-1, 3):  # (B, C, h, w) -> (B, C, h * w): its positions row-major
                self.flat_grid = tuple(args[0].shape[-2:])
            return
        if self.patch is not None or self.image_hw is None or not args or not isinstance(args[0], torch.Tensor):
            return
        x = args[0]
        if func is F.interpolate:
            self._note_resize(x, args, kwargs, out)
            return
        scale = (1, 1) if tuple(x.shape[-2:]) == tuple(self.image_hw) else _resized_scale(x, self.resized,
                                                                                           self.image_hw)
        if scale is None:
            return
        if func in CONV:
            weight = args[1] if len(args) > 1 else kwargs["weight"]
            stride = args[3] if len(args) > 3 else kwargs.get("stride", 1)
            padding = args[4] if len(args) > 4 else kwargs.get("padding", 0)
            kernel, depth = tuple(weight.shape[-2:]), weight.shape[2:-2]  # depth: a 3-D conv's frames, () for 2-D
            stride = (stride,) * (2 + len(depth)) if isinstance(stride, int) else tuple(stride)
            padding = (padding,) * (2 + len(depth)) if isinstance(padding, int) else padding
            unpadded = padding == "valid" or not any(tuple(padding))
            if tuple(stride[-2:]) == kernel and unpadded and all(d == 1 for d in depth):  # one frame a patch
                self.patch = _in_input(kernel, scale)
        elif func is F.unfold:
            kernel = args[1] if len(args) > 1 else kwargs["kernel_size"]
            stride = args[4] if len(args) > 4 else kwargs.get("stride", 1)
            kernel = (kernel, kernel) if isinstance(kernel, int) else tuple(kernel)
            stride = (stride, stride) if isinstance(stride, int) else tuple(stride)
            if stride == kernel and scale == (1, 1):  # (an unfold of a resized copy cuts crops: Depth Pro's)
                self.patch = kernel

    def _note_resize(self, x: torch.Tensor, args, kwargs, out) -> None:
        """A resize of the whole input (``F.interpolate`` of a ``(1, C, *image_hw)`` tensor, its output's pixel
        ``i`` the input's span ``[i * H / h, (i + 1) * H / h)``: not ``align_corners=True``, which pins the corner
        pixels' centres instead), noted so that a patch embedding over it is placed on the whole input."""
        align = args[4] if len(args) > 4 else kwargs.get("align_corners")
        if (tuple(x.shape[-2:]) == tuple(self.image_hw) and x.dim() == 4 and x.shape[0] == 1 and not align
                and isinstance(out, torch.Tensor) and out.dim() == 4):
            self.resized.append(out)


def _resized_scale(x: torch.Tensor, resized: list[torch.Tensor], image_hw) -> tuple[Fraction, Fraction] | None:
    """How many input pixels one pixel of ``x`` spans, a side, where ``x`` is one of the ``resized`` copies of the
    whole input (that tensor itself), else None."""
    if not any(x is r for r in resized):
        return None
    return Fraction(int(image_hw[0]), int(x.shape[-2])), Fraction(int(image_hw[1]), int(x.shape[-1]))


def _in_input(kernel: tuple[int, int], scale) -> tuple[int, int] | None:
    """A patch of ``kernel`` pixels of a resized input, in the input's own pixels (``scale`` of them a pixel); None
    where that is not a whole number of them (then no grid of the input's pixels holds its patches)."""
    sides = [k * s for k, s in zip(kernel, scale, strict=True)]
    return None if any(side.denominator != 1 for side in map(Fraction, sides)) else tuple(int(side) for side in sides)
