"""Attention analysis: per-token maps, attention rollout, gradient rollout and per-head statistics.

Every function is pure (tensors in, tensors out) and works for any batch size, any patch
grid (non-square too) and any number of prefix tokens (CLS, register or distillation tokens,
always first in the sequence). ``T`` is the number of tokens, ``prefix + gh * gw``; patches
follow in row-major order, as the model flattens them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from vit.model.stages import LayerLayout, layer_on_grid, layer_rows, merge_matrix, pair
from vit.model.stages import layer_windows as _layer_windows
from vit.model.stages import window_tokens as model_window_tokens

HEAD_FUSIONS = ("mean", "max", "min")


def window_tokens(grid: tuple[int, int], window: int | tuple[int, int], shift: int | tuple[int, int] = 0,
                  shift_padded: bool = True) -> Tensor:
    """``(nw, wh*ww)``: the patch token each window slot holds (``vit.model.window_partition``'s order: windows
    row-major over the grid padded to a multiple of ``window``, ``(wh, ww)`` or an int for both, slots row-major
    inside; after Swin's cyclic ``shift``, ``vit.model.window_tokens``), ``gh * gw`` for padding."""
    return model_window_tokens(tuple(grid), window, shift, shift_padded)


def windows_on_grid(attn: Tensor, grid: tuple[int, int], window: int | tuple[int, int],
                    shift: int | tuple[int, int] = 0, shift_padded: bool = True) -> Tensor:
    """``layer_on_grid`` of a windowed layer that pools nothing: ``(B * nw, H, wh*ww, wh*ww)`` (windows row-major
    over the grid padded to a multiple of ``window``, ``vit.model.window_partition``'s order; Swin's ``shift``) ->
    ``(B, H, T, T)`` on the full patch grid, zero outside each query's window."""
    return layer_on_grid(attn, LayerLayout(tuple(grid), window, shift, shift_padded))


def layer_columns(attn: Tensor, layout: LayerLayout) -> Tensor:
    """The column sums of ``layer_on_grid(attn, layout)``, ``(B, H, Tk)``: each key's sum over the real queries of
    its window (padding queries and keys dropped), formed window by window, never ``Tq x Tk``."""
    B, queries, keys = _layer_windows(attn, layout)
    (nw, nq), nk = queries.shape, keys.shape[1]
    Tq, Tk, H = layout.num_tokens, layout.key_grid[0] * layout.key_grid[1], attn.shape[1]
    real = (queries < Tq).to(attn.device, attn.dtype)  # (nw, nq)
    sums = torch.einsum("bwhqk,wq->bhwk", attn.reshape(B, nw, H, nq, nk), real)  # (B, H, nw, nk)
    out = attn.new_zeros(B, H, Tk + 1)
    out.scatter_add_(-1, keys.to(attn.device).reshape(1, 1, -1).expand(B, H, -1), sums.reshape(B, H, nw * nk))
    return out[..., :Tk]  # padding keys landed on Tk


def window_rows(attn: Tensor, grid: tuple[int, int], window: int | tuple[int, int], queries: Sequence[int],
                shift: int | tuple[int, int] = 0, shift_padded: bool = True) -> Tensor:
    """``layer_rows`` of a windowed layer that pools nothing (see ``windows_on_grid``): ``(B, H, q, T)``."""
    return layer_rows(attn, LayerLayout(tuple(grid), window, shift, shift_padded), queries)


def layer_residual(layout: LayerLayout, device: torch.device | None = None) -> Tensor:
    """``(nq, nk)``: the residual of one window of a layer as a map of its tokens: the identity, or in a
    pooled-query layer (Hiera, SAM 2) the pooling, whose max is not linear: a pooled token counts as built from
    its stride window uniformly (``vit.model.merge_matrix`` of the key window, 1/4 each), as through Swin's merge."""
    if layout.stride == 1:
        n = math.prod(layout.window_hw) if layout.window else layout.num_tokens
        return torch.eye(n, device=device)
    side = pair(layout.key_window) if layout.window else layout.key_grid
    return merge_matrix(side, device, layout.stride)


def layer_step(row: Tensor, blocks: Tensor, layout: LayerLayout, normalise: bool = True) -> Tensor:
    """``row (B, Tq) @`` one layer's factor, ``(B, Tk)``: ``blocks`` ``(B * nw, nq, nk)`` are its windows' fused
    attention (a global layer's ``(B, Tq, Tk)``), padding keys dropped and ``layer_residual`` added; with
    ``normalise`` the rows are renormalised (the attention rollout's ``Â = (A + R) / rowsum``), else not (Chefer's
    ``I + Ā``). The factor is block-diagonal over the windows, so each window's block is applied to the row's
    entries there (``Tq x nk`` work, not ``Tq x Tk``)."""
    B, queries, keys = _layer_windows(blocks[:, None], layout)
    queries, keys = queries.to(blocks.device), keys.to(blocks.device)
    (nw, nq), nk = queries.shape, keys.shape[1]
    Tk = layout.key_grid[0] * layout.key_grid[1]
    dtype = torch.promote_types(_compute_dtype(blocks), row.dtype)
    a = blocks.to(dtype).view(B, nw, nq, nk) * (keys < Tk)[None, :, None, :]  # padding keys dropped
    a = a + layer_residual(layout, blocks.device).to(dtype)
    if normalise:
        a = a / a.sum(dim=-1, keepdim=True)
    v = torch.cat([row.to(dtype), row.new_zeros(B, 1).to(dtype)], dim=1)[:, queries]  # (B, nw, nq): padding 0
    out = a.new_zeros(B, Tk + 1)
    out[:, keys.flatten()] = (v[:, :, None, :] @ a)[:, :, 0].flatten(1)  # (B, nw * nk); padding lands on Tk
    return out[:, :Tk]


def window_rollout_step(row: Tensor, fused: Tensor, grid: tuple[int, int], window: int | tuple[int, int],
                        shift: int | tuple[int, int] = 0, shift_padded: bool = True) -> Tensor:
    """``layer_step`` of a windowed layer that pools nothing: ``row (B, T) @`` its rollout factor, from its fused
    windows ``(B * nw, wh*ww, wh*ww)``."""
    return layer_step(row, fused, LayerLayout(tuple(grid), window, shift, shift_padded))


def _check_tokens(attn: Tensor, grid: tuple[int, int], num_prefix_tokens: int) -> None:
    gh, gw = grid
    if gh <= 0 or gw <= 0:
        raise ValueError(f"patch grid must be positive, got {tuple(grid)}")
    if num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be >= 0, got {num_prefix_tokens}")
    if attn.dim() < 2 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"expected attention of shape (..., tokens, tokens), got {tuple(attn.shape)}")
    if attn.shape[-1] != num_prefix_tokens + gh * gw:
        raise ValueError(f"attention over {attn.shape[-1]} tokens does not fit a {gh}x{gw} patch grid "
                         f"with {num_prefix_tokens} prefix token(s) ({num_prefix_tokens + gh * gw} tokens)")


def layers_up_to(attentions: Sequence[Tensor], end_layer: int | None) -> list[Tensor]:
    """The layers 0..end_layer (inclusive; negative counts from the end), checked for equal shapes."""
    layers = list(attentions)
    if not layers:
        raise ValueError("no attention layers given; run the model with output_attentions=True")
    for i, attn in enumerate(layers):
        if attn.dim() == 4 and attn.shape[-1] != attn.shape[-2]:  # pooled queries (Hiera): a grid of its own
            raise ValueError(f"layer {i} has shape {tuple(attn.shape)}: a model with stages (Hiera's pooled queries) "
                             "has each layer on its own grid; roll out with vit.explain.methods.stage_maps.rollout_row")
        if attn.dim() != 4:
            raise ValueError(f"layer {i}: expected attention of shape (batch, heads, tokens, tokens), "
                             f"got {tuple(attn.shape)}")
        if attn.shape[0] != layers[0].shape[0] or attn.shape[-1] != layers[0].shape[-1]:
            if attn.shape[1] != layers[0].shape[1]:  # heads change in one forward: a later stage's
                raise ValueError(f"layer {i} has shape {tuple(attn.shape)}, layer 0 has {tuple(layers[0].shape)}: "
                                 "a model with stages (Swin, Hiera) has each layer on its own grid; roll out with "
                                 "vit.explain.methods.stage_maps.rollout_row")
            raise ValueError(f"layer {i} has shape {tuple(attn.shape)}, layer 0 has {tuple(layers[0].shape)}; "
                             "all layers must come from the same forward pass")
    if end_layer is None:
        return layers
    if not -len(layers) <= end_layer < len(layers):
        raise ValueError(f"end_layer {end_layer} is out of range for {len(layers)} layers")
    return layers[: end_layer % len(layers) + 1]


def _compute_dtype(attn: Tensor) -> torch.dtype:
    # Products over many layers lose too much in half precision.
    return torch.promote_types(attn.dtype, torch.float32)


def _check_fusion(how: str) -> None:
    if how not in HEAD_FUSIONS:
        raise ValueError(f"unknown head fusion {how!r}; choose one of: {', '.join(HEAD_FUSIONS)}")


def fuse_heads(attn: Tensor, how: str = "mean") -> Tensor:
    """Combine the heads of one layer: ``(B, H, T, T)`` -> ``(B, T, T)`` by mean, max or min."""
    if attn.dim() != 4:
        raise ValueError(f"expected attention of shape (batch, heads, tokens, tokens), got {tuple(attn.shape)}")
    _check_fusion(how)
    if how == "mean":
        return attn.mean(dim=1)
    if how == "max":
        return attn.amax(dim=1)
    if how == "min":
        return attn.amin(dim=1)
    raise ValueError(f"unknown head fusion {how!r}; choose one of: {', '.join(HEAD_FUSIONS)}")


def token_map(attn: Tensor, query: int, grid: tuple[int, int], num_prefix_tokens: int = 1,
              renormalize: bool = False) -> Tensor:
    """What token ``query`` attends to, as a patch-grid image (DINO's ``attn[:, :, 0, 1:]``).

    ``attn`` is ``(B, H, T, T)`` or ``(B, T, T)``; ``query`` is a token index (0 is the first
    prefix token, CLS; patch ``i`` is token ``num_prefix_tokens + i``). The prefix keys are
    dropped and the patch keys reshaped row-major to ``(B, H, gh, gw)`` or ``(B, gh, gw)``.
    With ``renormalize`` each map sums to 1 (the mass the prefix keys took is spread back).
    """
    if attn.dim() not in (3, 4):
        raise ValueError(f"expected attention of shape (batch, [heads,] tokens, tokens), got {tuple(attn.shape)}")
    _check_tokens(attn, grid, num_prefix_tokens)
    T = attn.shape[-1]
    if not 0 <= query < T:
        raise ValueError(f"query token {query} is out of range for {T} tokens")
    row = attn[..., query, num_prefix_tokens:]  # (B, [H,] gh*gw)
    if renormalize:
        total = row.sum(dim=-1, keepdim=True)
        row = row / total.clamp_min(torch.finfo(total.dtype).tiny)
    return row.reshape(*row.shape[:-1], grid[0], grid[1])  # (B, [H,] gh, gw)


def _discard_lowest(fused: Tensor, ratio: float, num_prefix_tokens: int) -> Tensor:
    """Zero the lowest ``ratio`` of each row's non-prefix entries; prefix columns are never dropped."""
    prefix, patches = fused[..., :num_prefix_tokens], fused[..., num_prefix_tokens:]  # (B, T, p), (B, T, T-p)
    count = math.floor(ratio * patches.shape[-1] + 1e-9)  # 1e-9: 0.29 * 100 must drop 29, not 28
    if count == 0:
        return fused
    lowest = patches.topk(count, dim=-1, largest=False).indices  # (B, T, count)
    patches = patches.scatter(-1, lowest, 0.0)
    return torch.cat([prefix, patches], dim=-1)  # (B, T, T)


def rollout_factor(attn: Tensor, head_fusion: str = "mean", discard_ratio: float = 0.0,
                   num_prefix_tokens: int = 1) -> Tensor:
    """One layer's factor of the attention rollout: ``(B, H, T, T)`` -> ``Â = (fused + I) / rowsum``, ``(B, T, T)``.

    The heads are fused, the lowest ``discard_ratio`` of each row's patch entries zeroed
    (prefix columns are kept) and the residual added as identity; see ``rollout``.
    """
    return rollout_factor_rows(fuse_heads(attn.to(_compute_dtype(attn)), head_fusion), 0, discard_ratio,
                               num_prefix_tokens)


def rollout_factor_rows(fused: Tensor, first_query: int, discard_ratio: float = 0.0, num_prefix_tokens: int = 1
                        ) -> Tensor:
    """Rows ``first_query .. first_query + t`` of ``rollout_factor`` from the same rows of the fused attention
    ``(B, t, T)``: each row's discard, residual and normalisation need only that row, so a factor can be formed
    in query chunks (``vit.explain.methods.chunked``)."""
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    t, T = fused.shape[-2:]
    if not 0 <= num_prefix_tokens < T:
        raise ValueError(f"num_prefix_tokens must be in [0, {T}), got {num_prefix_tokens}")
    dtype = _compute_dtype(fused)
    a = fused.to(dtype, copy=True)  # changed in place below, never the caller's
    if discard_ratio > 0:
        a = _discard_lowest(a, discard_ratio, num_prefix_tokens)
    rows = torch.arange(t, device=a.device)
    a[..., rows, rows + first_query] += 1.0  # the identity's rows first_query .. first_query + t
    return a.div_(a.sum(dim=-1, keepdim=True))


def rollout(attentions: Sequence[Tensor], head_fusion: str = "mean", discard_ratio: float = 0.0,
            end_layer: int | None = None, num_prefix_tokens: int = 1) -> Tensor:
    """Attention rollout (Abnar & Zuidema 2020): how much each output token draws on each input token.

    ``attentions`` holds one ``(B, H, T, T)`` tensor per layer. Each layer's heads are fused,
    the lowest ``discard_ratio`` of every row's patch entries zeroed (prefix columns are kept:
    dropping CLS would cut the path most attention takes), the residual added as identity
    and rows renormalised: ``Â = (A + I) / rowsum``. The result is ``Â_end @ ... @ Â_0``,
    ``(B, T, T)``: row ``i`` is output token ``i``'s attribution over the input tokens, so
    ``token_map(result, 0, grid)`` is the usual CLS rollout map.
    """
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    layers = layers_up_to(attentions, end_layer)
    result = None
    for attn in layers:
        a = rollout_factor(attn, head_fusion, discard_ratio, num_prefix_tokens)  # (B, T, T)
        result = a if result is None else a @ result  # the later layer reads the earlier one's output
    return result


def rollout_rows(factors: Sequence[Tensor], query: int) -> Tensor:
    """Row ``query`` of ``factors[-1] @ ... @ factors[0]`` (``rollout_factor`` outputs, ``(B, T, T)`` each): ``(B, T)``.

    Vector-matrix products from the last layer down cost ``L x T²`` instead of the full
    product's ``L x T³``: what a map of one query needs at thousands of tokens.
    """
    factors = list(factors)
    if not factors:
        raise ValueError("no rollout factors given")
    T = factors[-1].shape[-1]
    if not 0 <= query < T:
        raise ValueError(f"query token {query} is out of range for {T} tokens")
    row = factors[-1][:, query].float()  # (B, T)
    for a in reversed(factors[:-1]):
        row = (row[:, None, :] @ a.float())[:, 0]  # (B, T)
    return row


def rollout_vector(factors: Sequence[Tensor], row: Tensor) -> Tensor:
    """``row @ factors[-1] @ ... @ factors[0]`` for a ``(B, T)`` row of weights over the last layer's tokens:
    ``(B, T)``. With the attention-pooling probe's attention as ``row`` (a model without CLS, e.g. SigLIP), the
    rollout ends with what the pooled embedding reads, as the CLS row ends it for other models."""
    factors = list(factors)
    if not factors:
        raise ValueError("no rollout factors given")
    if row.shape[-1] != factors[-1].shape[-1]:
        raise ValueError(f"a row of {row.shape[-1]} weights does not fit {factors[-1].shape[-1]} tokens")
    row = row.float()
    for a in reversed(factors):
        row = (row[:, None, :] @ a.float())[:, 0]  # (B, T)
    return row


def positive_gradient_attention(attn: Tensor, grad: Tensor) -> Tensor:
    """Chefer et al.'s per-layer term ``Ā = mean_heads((grad * attn).clamp(min=0))``: ``(B, H, T, T)`` -> ``(B, T, T)``.
    """
    if grad.shape != attn.shape:
        raise ValueError(f"gradient of shape {tuple(grad.shape)} for attention of shape {tuple(attn.shape)}")
    dtype = _compute_dtype(attn)
    return (grad.to(dtype) * attn.to(dtype)).clamp(min=0).mean(dim=1)


def _terms_up_to(terms: Sequence[Tensor], end_layer: int | None) -> list[Tensor]:
    """The layers' terms up to ``end_layer`` (None: all), checked."""
    terms = list(terms)
    if not terms:
        raise ValueError("no layers given; run the model with output_attentions=True")
    if end_layer is None:
        return terms
    if not -len(terms) <= end_layer < len(terms):
        raise ValueError(f"end_layer {end_layer} is out of range for {len(terms)} layers")
    return terms[: end_layer % len(terms) + 1]


def relevance_rollout(terms: Sequence[Tensor], end_layer: int | None = None) -> Tensor:
    """``R = I``, then ``R = R + Ā @ R`` for each layer's ``positive_gradient_attention`` term ``(B, T, T)``
    up to ``end_layer``: the gradient rollout's ``(B, T, T)`` relevance."""
    terms = _terms_up_to(terms, end_layer)
    B, T, _ = terms[0].shape
    dtype = _compute_dtype(terms[0])
    R = torch.eye(T, dtype=dtype, device=terms[0].device).expand(B, T, T)  # (B, T, T)
    for cam in terms:
        R = R + cam.to(dtype) @ R
    return R


def relevance_rollout_row(terms: Sequence[Tensor], query: int, end_layer: int | None = None) -> Tensor:
    """Row ``query`` of ``relevance_rollout(terms, end_layer)``, ``(B, T)``: ``R = (I + Ā_end) ... (I + Ā_0)``, so
    its row is ``v = e_query``, then ``v = v + v @ Ā_l`` from layer ``end_layer`` down: ``L x T²`` work where the
    whole product costs ``L x T³`` (what a map of one query reads)."""
    terms = _terms_up_to(terms, end_layer)
    T = terms[0].shape[-1]
    if not 0 <= query < T:
        raise ValueError(f"query token {query} is out of range for {T} tokens")
    row = torch.zeros(1, T)
    row[0, query] = 1.0
    return relevance_rollout_vector(terms, row)


def relevance_rollout_vector(terms: Sequence[Tensor], row: Tensor, end_layer: int | None = None) -> Tensor:
    """``row @ relevance_rollout(terms, end_layer)`` for a ``(B or 1, T)`` row of weights over the tokens, ``(B, T)``:
    with ``pooled_readout``'s row, the relevance of what a mean-pooling classifier reads (the mean of the patches'
    rows), as Chefer et al. start from the CLS row for a classifier that reads CLS."""
    terms = _terms_up_to(terms, end_layer)
    B, T, _ = terms[0].shape
    if row.shape[-1] != T:
        raise ValueError(f"a row of {row.shape[-1]} weights does not fit {T} tokens")
    dtype = _compute_dtype(terms[0])
    v = row.to(dtype=dtype, device=terms[0].device).reshape(-1, 1, T).expand(B, 1, T)
    for cam in reversed(terms):
        v = v + v @ cam.to(dtype)
    return v[:, 0]


def pooled_readout(num_tokens: int, num_prefix_tokens: int, num_patches: int) -> Tensor:
    """``(1, T)``: the weights a mean-pooling classifier reads the last layer's tokens with, ``1 / num_patches`` on
    each patch token (after the ``num_prefix_tokens``: timm's ``global_pool="avg"`` leaves registers out), 0
    elsewhere; the row rollout and the class map start from for a model without CLS (``rollout_vector``,
    ``relevance_rollout_vector``)."""
    if num_patches < 1 or num_prefix_tokens + num_patches > num_tokens:
        raise ValueError(f"{num_patches} patches after {num_prefix_tokens} prefix tokens do not fit {num_tokens}")
    row = torch.zeros(1, num_tokens)
    row[0, num_prefix_tokens:num_prefix_tokens + num_patches] = 1.0 / num_patches
    return row


def gradient_rollout(attentions: Sequence[Tensor], gradients: Sequence[Tensor],
                     end_layer: int | None = None) -> Tensor:
    """Gradient-weighted rollout (Chefer, Gur & Wolf 2021, "Generic attention-model explainability").

    ``gradients[i]`` is d(class score)/d(``attentions[i]``), both ``(B, H, T, T)``. Per layer
    ``Ā = mean_heads((grad * attn).clamp(min=0))``; starting from ``R = I`` each layer in
    order does ``R = R + Ā @ R``. Returns ``R``, ``(B, T, T)``; ``token_map(R, 0, grid)``
    is the class-specific map of the paper.
    """
    layers = layers_up_to(attentions, end_layer)
    grads = list(gradients)
    if len(grads) != len(attentions):
        raise ValueError(f"{len(grads)} gradient tensors for {len(attentions)} attention layers")
    for i, (attn, grad) in enumerate(zip(layers, grads, strict=False)):
        if grad.shape != attn.shape:
            raise ValueError(f"layer {i}: gradient of shape {tuple(grad.shape)} for attention of shape "
                             f"{tuple(attn.shape)}")
    return relevance_rollout([positive_gradient_attention(a, g) for a, g in zip(layers, grads, strict=False)])


def mass_mask(maps: Tensor, share: float) -> Tensor:
    """DINO's attention-mass mask: the patches that together hold ``share`` of each map's mass.

    ``maps`` is ``(..., gh, gw)`` of non-negative values; the largest values are kept until
    their cumulative sum exceeds ``1 - share`` of the map's total from the bottom, as in DINO's
    ``visualize_attention.py`` (``cumval > 1 - threshold``). Returns a boolean tensor of the same shape.
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be in [0, 1], got {share}")
    flat = maps.reshape(*maps.shape[:-2], -1).to(_compute_dtype(maps))  # (..., N)
    total = flat.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(flat.dtype).tiny)
    values, order = torch.sort(flat / total, dim=-1)  # ascending, as DINO sorts
    keep_sorted = values.cumsum(dim=-1) > (1.0 - share)
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return keep.reshape(maps.shape)


def class_gradients(model: torch.nn.Module, images: Tensor, class_index: int | Tensor
                    ) -> tuple[Tensor, tuple[Tensor, ...], tuple[Tensor, ...]]:
    """Logits, attentions and d(class logit)/d(attention) per layer, for ``gradient_rollout``.

    ``images`` is ``(B, C, H, W)``; ``class_index`` one class for the whole batch or a ``(B,)``
    tensor of one class per image. The model (put it in eval mode first, or dropout makes the
    maps random) must follow ``logits, attentions = model(images, output_attentions=True)``
    with attentions in the autograd graph. The gradient of the sum of the chosen logits is
    taken, so each image gets the gradient of its own logit. Returns detached
    ``(logits (B, classes), attentions (per layer (B, H, T, T)), gradients (same shapes))``.
    Works inside ``torch.no_grad`` / ``inference_mode`` and with frozen parameters.
    """
    with torch.inference_mode(False), torch.enable_grad():
        # A leaf that needs grad puts the attentions in the graph even if every weight is frozen.
        images = images.detach().clone().requires_grad_(True)
        logits, attentions = model(images, output_attentions=True)
        if attentions is None:
            raise ValueError("the model returned no attentions for output_attentions=True")
        num_classes = logits.shape[-1]
        index = torch.as_tensor(class_index, device=logits.device).long()
        if index.dim() == 0:
            index = index.expand(logits.shape[0])
        if index.shape != (logits.shape[0],):
            raise ValueError(f"class_index must be one class or one per image ({logits.shape[0]}), "
                             f"got shape {tuple(index.shape)}")
        if bool(((index < 0) | (index >= num_classes)).any()):
            raise ValueError(f"class_index {index.tolist()} is out of range for {num_classes} classes")
        score = logits.gather(1, index[:, None]).sum()  # images are independent: sum = per-image grads
        gradients = torch.autograd.grad(score, attentions)
    return (logits.detach(), tuple(a.detach() for a in attentions), tuple(g.detach() for g in gradients))


def patch_centres(grid: tuple[int, int], patch_size: int | tuple[int, int], device: torch.device | None = None
                  ) -> Tensor:
    """Pixel coordinates (row, column) of the patch centres in row-major order: ``(gh*gw, 2)``; ``patch_size`` is
    an int, or ``(height, width)`` for rectangular patches."""
    gh, gw = grid
    rows = torch.arange(gh, dtype=torch.float64, device=device)
    cols = torch.arange(gw, dtype=torch.float64, device=device)
    rr, cc = torch.meshgrid(rows, cols, indexing="ij")  # each (gh, gw)
    size = torch.tensor((patch_size, patch_size) if isinstance(patch_size, int) else patch_size, dtype=torch.float64,
                        device=device)  # (2,): row and column pitch
    return (torch.stack([rr, cc], dim=-1).reshape(gh * gw, 2) + 0.5) * size  # (gh*gw, 2)


def mean_attention_distance(attn: Tensor, grid: tuple[int, int], patch_size: int | tuple[int, int],
                            num_prefix_tokens: int = 1) -> Tensor:
    """The ViT paper's "attention distance" (Fig. 7) per head: ``(B, H, T, T)`` -> ``(B, H)``, in pixels.

    For each patch query: the sum over patch keys of weight x Euclidean distance between the
    patch centres, the weights renormalised over the patch keys (prefix keys dropped);
    then the mean over patch queries. Any leading dimensions are kept.
    """
    _check_tokens(attn, grid, num_prefix_tokens)
    p = num_prefix_tokens
    dtype = _compute_dtype(attn)
    a = attn[..., p:, p:].to(dtype)  # (B, H, N, N), N = gh*gw
    a = a / a.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
    centres = patch_centres(grid, patch_size, attn.device)
    distance = torch.cdist(centres, centres).to(dtype)  # (N, N)
    return (a * distance).sum(dim=-1).mean(dim=-1)  # (B, H)


def attention_entropy(attn: Tensor) -> Tensor:
    """Mean over queries of each attention row's entropy in nats: ``(B, H, T, T)`` -> ``(B, H)``.

    ``log(T)`` for uniform rows, 0 for one-hot rows; any leading dimensions are kept.
    """
    if attn.dim() < 2 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"expected attention of shape (..., tokens, tokens), got {tuple(attn.shape)}")
    p = attn.to(_compute_dtype(attn))
    return -torch.special.xlogy(p, p).sum(dim=-1).mean(dim=-1)  # xlogy: 0 * log 0 = 0


def layer_stats(attentions: Sequence[Tensor], grid: tuple[int, int], patch_size: int | tuple[int, int],
                num_prefix_tokens: int = 1) -> dict[str, Tensor]:
    """Mean attention distance and entropy for every layer: ``{"distance", "entropy"}``, each ``(L, B, H)``."""
    layers = layers_up_to(attentions, None)
    return {
        "distance": torch.stack([mean_attention_distance(a, grid, patch_size, num_prefix_tokens) for a in layers]),
        "entropy": torch.stack([attention_entropy(a) for a in layers]),
    }
