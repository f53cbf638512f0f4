"""Interventions at the hook points: head ablation (a head's context zeroed or replaced by its mean over a set of
images, in the forward or in an edited copy of the model), each head's effect on a class (``ablation_grid``), and
activation patching of heads and residual positions from a corrupted run into a clean one (``patch_heads``,
``patch_residuals``). An intervention at layer ``l`` runs only the layers after it (``ViT.run_blocks``) from the
hidden states, with the interventions in the batch dimension, ``chunk`` copies of one image at a time.

Reference: the "head_mask" that HF transformers applied to the attention probabilities before v5 (equivalently a
head's context zeroed before the output projection).
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vit.costs.bounds import forward_flops
from vit.explain.mechanism.forward_reads import (
    MAX_ELEMENTS,
    MechanismError,
    Progress,
    _dims,
    _heads_replaced,
    _keep,
    check_budget,
    check_supported,
    class_indices,
    grid_of,
    hidden_states,
)
from vit.model import ViT

# While a page follows a grid, its Stop (or a closed tab) is heard between batches: one batch holds at most this much
# work (a copy costs at most one forward), ~3 s of one core, so a grid stops within ~5 s on 2 busy cores. 32
# copies of a ViT-B/16 at 609 tokens were 30-50 s.
PROGRESS_FLOPS = 2e11

ABLATION_MODES = ("zero", "mean")


# --- ablation -------------------------------------------------------------------------------------

def parse_heads(text: str, num_layers: int, num_heads: int | Sequence[int]) -> list[tuple[int, int]]:
    """``"2.3,4.1"`` (layer.head counted from 1, as the app shows them) -> ``[(1, 2), (3, 0)]`` from 0.
    ``num_heads``: every layer's, or each layer's (a model with stages)."""
    if not isinstance(num_heads, int) and len(set(num_heads)) == 1:  # one count for all: say "heads 1-H"
        num_heads = num_heads[0]
    heads = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        layer, dot, head = item.partition(".")
        if not (dot and layer.isdigit() and head.isdigit()):
            raise MechanismError(f"cannot read head {item!r}: write LAYER.HEAD counted from 1, e.g. 2.3,4.1")
        layer_i, head_i = int(layer), int(head)
        H = num_heads if isinstance(num_heads, int) else num_heads[layer_i - 1] if 1 <= layer_i <= num_layers else 0
        if not (1 <= layer_i <= num_layers and 1 <= head_i <= H):
            heads_of = f"heads 1-{H}" if isinstance(num_heads, int) or H else "each layer its stage's heads"
            raise MechanismError(f"head {item} does not exist: the model has layers 1-{num_layers} and "
                                 f"{heads_of}{'' if isinstance(num_heads, int) or not H else f' in layer {layer_i}'}")
        heads.append((layer_i - 1, head_i - 1))
    if not heads:
        raise MechanismError("no heads given: write LAYER.HEAD counted from 1, e.g. 2.3,4.1")
    return sorted(set(heads))


Means = Tensor | tuple[Tensor, ...]  # per layer (T, H, hd): one tensor (L, T, H, hd), or one per layer with stages


def mean_contexts(model: ViT, images: Tensor) -> Means:
    """Each layer's per-head context averaged over ``images``, per token position of the layer's grid (what mean
    ablation puts in place of a head's output): ``(L, T, H, hd)``, or with stages (Swin, Hiera: each layer its own
    grid and heads) a tuple of ``(T_l, H_l, hd)``; a windowed layer's read from its windows (the shift undone) back
    on its grid, its padding left out."""
    check_supported(model)
    L, grid = len(model.blocks), grid_of(model, images)
    cache: dict[str, Tensor] = {}
    with torch.no_grad(), model.hooks([(f"blocks.{layer}.attn.hook_z", _keep(cache)) for layer in range(L)]):
        model.tokens(images)
    means = tuple(_on_tokens(model, layer, cache[f"blocks.{layer}.attn.hook_z"], grid).mean(dim=0)
                  for layer in range(L))
    return means if model.config.stage_depths else torch.stack(means)


def _on_tokens(model: ViT, layer: int, context: Tensor, grid: tuple[int, int]) -> Tensor:
    """Layer ``layer``'s per-head contexts as ``hook_z`` holds them -> ``(B, T, H, hd)`` on the layer's grid: a
    windowed layer's ``(B * nw, w*w, H, hd)`` (Swin's shifted windows, SAM's, Hiera's mask units) placed back, the
    shift undone and padding dropped; a global layer's as they are. ``grid``: the image's patch grid."""
    lay = model.layer_layouts(grid)[layer]
    if not lay.window:
        return context
    return lay.join(context.flatten(2)).unflatten(-1, context.shape[2:])


def _as_contexts(model: ViT, layer: int, tokens: Tensor, grid: tuple[int, int], like: Tensor | None = None
                 ) -> Tensor:
    """Per-token values ``(T, ...)`` on layer ``layer``'s grid (the means of ``mean_contexts``, or their
    projection) laid out as its contexts ``like`` (what its ``hook_z`` holds): a windowed layer's
    ``(B * nw, w*w, ...)`` (shifted as its windows are, zeros on the padding, whose outputs the block drops),
    repeated for each of ``like``'s images (None: one); a global layer's as they are."""
    lay = model.layer_layouts(grid)[layer]
    if not lay.window:
        return tokens
    if tokens.shape[0] != lay.num_tokens:
        raise MechanismError(f"the reference means are for {tokens.shape[0]} tokens but layer {layer + 1} of this "
                             f"input has {lay.num_tokens}; compute them at the same input size")
    windows = lay.cut(tokens.reshape(1, tokens.shape[0], -1)).unflatten(-1, tokens.shape[1:])  # (nw, w*w, ...)
    images = 1 if like is None else like.shape[0] // windows.shape[0]
    return windows.repeat(images, *[1] * (windows.dim() - 1))


def check_ablation(model: ViT, mode: str, means: Means | None) -> None:
    """MechanismError (one line) unless ``mode`` is an ablation and ``means`` are given for ``"mean"`` only, as
    ``mean_contexts`` of this model's shape (per layer ``(T, H, hd)``, the layer's own heads); the token count
    ``T`` is checked against the input where it is used. The engine's and the notebook API's one check, before any
    work."""
    if mode not in ABLATION_MODES:
        raise MechanismError(f"unknown ablation mode {mode!r}; choose {' or '.join(ABLATION_MODES)}")
    if mode != "mean":
        if means is not None:
            raise MechanismError("means are read by mode='mean' only; pass mode='mean' or leave means out")
        return
    L, H, hd = _dims(model)
    heads = [(b.attn.num_heads, b.attn.head_dim) for b in model.blocks]
    shapes = None if means is None else [tuple(m.shape[1:]) if m.dim() == 3 else None for m in means]
    if shapes != heads:
        layers = (f"(layers {L}, tokens, heads {H}, {hd})" if not model.config.stage_depths else
                  f"(one per layer, each (tokens, heads, head width): heads {', '.join(str(h) for h, _ in heads)})")
        raise MechanismError(f"mean ablation needs means=vit.reference_means(checkpoint, reference_images, image) "
                             f"(the reference images' mean_contexts), of shape {layers} for this model")


def _check_means_tokens(model: ViT, mode: str, means: Means | None, grid: tuple[int, int]) -> None:
    """MechanismError unless each layer's means are for as many tokens as the layer has on this input."""
    if mode != "mean":
        return
    for layer, lay in enumerate(model.layer_layouts(grid)):
        tokens = model.num_prefix_tokens + lay.num_tokens
        if means[layer].shape[0] != tokens:
            raise MechanismError(f"the reference means are for {means[layer].shape[0]} tokens but this input has "
                                 f"{tokens} in layer {layer + 1}; compute them at the same input size")


def _replacement(model: ViT, mode: str, means: Means | None, layer: int, context: Tensor, grid: tuple[int, int]
                 ) -> Tensor:
    """What an ablated head's context becomes (``check_ablation`` first): zeros, or the reference images' mean
    ``(T, H, hd)`` (in a windowed layer, laid out in its windows)."""
    if mode == "zero":
        return torch.zeros_like(context)
    if model.layer_layouts(grid)[layer].window:
        return _as_contexts(model, layer, means[layer], grid, context).to(context)
    if means[layer].shape != context.shape[1:]:
        raise MechanismError(f"the reference means are for {means[layer].shape[0]} tokens but this input has "
                             f"{context.shape[1]}; compute them at the same input size")
    return means[layer].to(context).expand_as(context)


def ablate_heads(model: ViT, images: Tensor, heads: Sequence[tuple[int, int]], mode: str = "zero",
                 means: Tensor | None = None, output_attentions: bool = False
                 ) -> tuple[Tensor | None, tuple[Tensor, ...] | None]:
    """``model(images, output_attentions)`` with the heads ``(layer, head)`` (from 0) ablated: their context
    set to zero before the output projection, or (``mode="mean"``) to ``means`` from ``mean_contexts``."""
    check_supported(model)
    chosen = _heads_by_layer(model, heads)
    check_ablation(model, mode, means)

    grid = grid_of(model, images)

    def edit(layer: int, context: Tensor) -> Tensor:
        context = context.clone()
        idx = chosen[layer]
        context[:, :, idx] = _replacement(model, mode, means, layer, context, grid)[:, :, idx]
        return context

    hooks = [hook for layer in chosen for hook in _heads_replaced(layer, functools.partial(edit, layer))]
    encoding = model.run_with_hooks(images, hooks, output_attentions)
    return encoding.logits, encoding.attentions


def _heads_by_layer(model: ViT, heads: Sequence[tuple[int, int]]) -> dict[int, list[int]]:
    """``heads`` ``(layer, head)`` (from 0) grouped by layer; MechanismError naming one the model lacks."""
    L = len(model.blocks)
    chosen: dict[int, list[int]] = {}
    for layer, head in heads:
        H = model.blocks[layer].attn.num_heads if 0 <= layer < L else model.config.num_heads  # a stage's own
        if not (0 <= layer < L and 0 <= head < H):
            raise MechanismError(f"head ({layer}, {head}) does not exist: the model has layers 0 to {L - 1} and heads "
                                 f"0 to {H - 1} (counted from 0)")
        chosen.setdefault(layer, []).append(head)
    return chosen


class MeanAblatedProj(nn.Linear):
    """``attn.proj`` of a mean-ablated copy: the ablated heads' input columns are zero and ``offset`` ``(T, D)``,
    what those columns make of the reference means at each token position, is added. A linear map splits by its
    input, so this equals ``proj`` of a context whose ablated head slices hold the means: every walk that calls
    ``attn.proj`` (the forward, its attentions, gradients, relevance) sees the ablation. The means belong to one
    token count; another is refused in one line. In a windowed layer ``offset`` is laid out in its windows,
    ``(nw, w*w, D)``, and the proj runs on ``(B * nw, w*w, inner)``: another grid with as many windows is not
    told apart there."""

    def __init__(self, proj: nn.Linear, offset: Tensor) -> None:
        super().__init__(proj.in_features, proj.out_features, bias=proj.bias is not None, device="meta")
        self.weight, self.bias = proj.weight, proj.bias  # the copy's own, not new ones (nothing allocated above)
        self.register_buffer("offset", offset, persistent=False)  # (T, D), or a windowed layer's (nw, w*w, D)

    def forward(self, x: Tensor) -> Tensor:
        windows = self.offset.shape[0] if self.offset.dim() == 3 else 1
        if x.shape[-2] != self.offset.shape[-2] or (windows > 1 and x.shape[0] % windows):
            raise MechanismError(f"heads mean-ablated at {self.offset.shape[-2]} token positions"
                                 f"{f' in {windows} windows' if windows > 1 else ''} cannot run on "
                                 f"{x.shape[-2]} tokens (another input size, or added register tokens); compute the "
                                 "means at this size, or zero-ablate them")
        if windows > 1:  # (B * nw, w*w, D): each image's windows in order
            return (super().forward(x).unflatten(0, (-1, windows)) + self.offset).flatten(0, 1)
        return super().forward(x) + self.offset


def ablated_copy(model: ViT, heads: Sequence[tuple[int, int]], mode: str = "zero", means: Tensor | None = None,
                 grid: tuple[int, int] | None = None) -> ViT:
    """A copy of ``model`` in which the heads ``(layer, head)`` (from 0) are ablated in the weights: their input
    columns of ``attn.proj`` are zero, and with ``mode="mean"`` their mean output (``means`` from
    ``mean_contexts``) is added per token position (``MeanAblatedProj``). ``proj`` of a context whose head slice
    is zero equals ``proj`` with that slice's columns zero, so this is ``ablate_heads(..., mode, means)`` for
    every pass over the copy — the forward, its attentions, and every gradient or relevance walk the page draws
    (rollout, class maps, LeGrad, AttnLRP, flow), on every family (RoPE ones too: the heads' outputs meet only
    at ``proj``). The model itself is left alone; the copy shares its other parameters. ``grid``: the patch grid
    the means were taken on, which a windowed layer's windows need (default: the model's own input size's)."""
    if not isinstance(model, ViT):
        raise MechanismError(f"head ablation needs this project's ViT, got {type(model).__name__}")
    chosen = _heads_by_layer(model, heads)
    check_ablation(model, mode, means)
    # Only the ablated layers' proj weights are new; every other parameter and buffer is shared with the model, so
    # a copy costs those weights (a ViT-B/16 layer: 2.4 MB), not the whole model (350 MB).
    changed = {f"blocks.{layer}.attn.proj.weight" for layer in chosen}
    shared = {id(t): t for name, t in [*model.named_parameters(), *model.named_buffers()] if name not in changed}
    ablated = copy.deepcopy(model, memo=shared)
    with torch.no_grad():
        for layer, idx in chosen.items():
            attn = ablated.blocks[layer].attn  # its own heads (a Swin stage's)
            weight = attn.proj.weight.view(attn.proj.out_features, attn.num_heads, attn.head_dim)  # columns by head
            if mode == "mean":
                offset = torch.einsum("the,dhe->td", means[layer][:, idx].to(weight), weight[:, idx])  # (T, D)
                offset = _as_contexts(model, layer, offset, grid or model.config.grid_size)  # windowed: (nw, w*w, D)
                attn.proj = MeanAblatedProj(attn.proj, offset)
            weight[:, idx] = 0
    return ablated


def _report(progress: Progress | None, done: int, total: int) -> None:
    """Tell ``progress`` (if any) that ``done`` passes of ``total`` are done; it may raise to stop the work."""
    if progress is not None:
        progress(done, total)


def _chunks(total: int, per_copy: int) -> int:
    """How many copies of one image to run at once so that one step stays within ``MAX_ELEMENTS`` / 8."""
    return max(1, min(total, MAX_ELEMENTS // 8 // max(per_copy, 1)))


def _default_chunk(model: ViT, cells: int, tokens: int, progress: Progress | None) -> int:
    """Copies of one image per batch: as many as keep one step within the memory bound, and while ``progress``
    follows the grid, no more than ``PROGRESS_FLOPS`` of work (at least one copy)."""
    chunk = _chunks(cells, _copy_size(model, tokens))
    if progress is not None:
        chunk = min(chunk, max(1, int(PROGRESS_FLOPS // forward_flops(model.config, tokens))))
    return chunk


def _copy_size(model: ViT, tokens: int) -> int:
    """Floats one copy of an input of ``tokens`` tokens holds at once in a block: its widest activation (the MLP's,
    or one head's attention rows)."""
    c = model.config
    return tokens * max(c.hidden_size, c.mlp_size, tokens * c.num_heads)


def _batches(per_layer: Sequence[int], chunk: int):
    """``(layer, cells)`` for every layer and every ``chunk`` of its ``per_layer[layer]`` cells (``cells`` a
    range): the interventions of one layer that run in one batch through the layers after it."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise MechanismError(f"the batch of interventions must be a positive number of copies, got {chunk!r}")
    for layer, cells in enumerate(per_layer):
        for start in range(0, cells, chunk):
            yield layer, range(start, min(start + chunk, cells))


def _run_from(model: ViT, x: Tensor, grid: tuple[int, int], layer: int, hooks=()) -> Tensor:
    """The logits ``(n, classes)`` of ``n`` copies whose block ``layer`` input is ``x`` ``(n, T, D)``: the layers
    from ``layer`` on, with ``hooks``, the last one only for the tokens the head reads."""
    with model.hooks(hooks):
        out, _ = model.run_blocks(x, grid, layer, queries=model.readout_tokens())
    return model.classify(out)


def block_inputs(model: ViT, images: Tensor) -> list[Tensor]:
    """Each block's input, then the last block's output: ``L + 1`` tensors ``(B, T_l, D_l)``, each on its own grid
    and width (a model with stages: block ``l``'s input is the stream it receives, before its merge or pooling)."""
    check_supported(model)
    if not model.config.stage_depths:
        return list(hidden_states(model, images).unbind(1))
    L = len(model.blocks)
    names = [f"blocks.{i}.hook_resid_pre" for i in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]
    layouts = model.layer_layouts(grid_of(model, images))
    widths = [model.blocks[0].attn.qkv.in_features] + [b.mlp.fc2.out_features for b in model.blocks]
    tokens = [math.prod(grid_of(model, images))] + [lay.num_tokens for lay in layouts]
    check_budget(images.shape[0] * sum(t * d for t, d in zip(tokens, widths, strict=True)),
                 "keeping every layer's tokens")
    cache: dict[str, Tensor] = {}
    with model.hooks([(name, _keep(cache)) for name in names]):
        model.tokens(images)
    return [cache[name] for name in names]


def _heads(model: ViT) -> list[int]:
    """Each layer's heads (a stage's own in a model with stages)."""
    return [block.attn.num_heads for block in model.blocks]


def _per_copy(context: Tensor, images: int, index: Tensor) -> Tensor:
    """``hook_z``'s contexts of ``images`` images, ``(images * nw, n, H, hd)`` (nw = 1 in a global layer) -> those
    of the copies ``index`` ``(k,)``, ``(k * nw, n, H, hd)``: each copy takes all its image's windows."""
    return context.unflatten(0, (images, -1))[index].flatten(0, 1)


def ablation_grid(model: ViT, images: Tensor, classes: Tensor | int | None = None, mode: str = "zero",
                  means: Means | None = None, *, chunk: int | None = None, progress: Progress | None = None
                  ) -> Tensor:
    """``(B, L, H)``: the change of each image's class logit (default: predicted) when each head alone is
    ablated. Each layer's ``B x H`` interventions run in the batch dimension, ``chunk`` at a time (default: as many
    as the memory bound allows, and a short batch while ``progress`` follows it), through the layers from that one on;
    ``progress(done, total)`` after each batch. A model with stages: each layer its stage's heads, ``H`` the most
    of any, NaN where a layer has fewer."""
    check_supported(model, needs_head=True)
    check_ablation(model, mode, means)
    with torch.no_grad():
        states, grid = block_inputs(model, images), grid_of(model, images)  # L + 1 of (B, T_l, D_l)
        B, heads = images.shape[0], _heads(model)
        _check_means_tokens(model, mode, means, grid)
        base = model.classify(states[-1])
        classes = class_indices(base, classes)
        chunk = _default_chunk(model, B * max(heads), states[0].shape[1], progress) if chunk is None else chunk
        out = torch.full((B, len(heads), max(heads)), float("nan"))
        total, done = B * sum(heads), 0
        _report(progress, 0, total)
        for layer, cells in _batches([B * h for h in heads], chunk):
            H = heads[layer]
            cell = torch.tensor(cells, device=states[0].device)
            image, head = cell // H, cell % H  # (n,) each: copy j ablates head[j] on image[j]
            mask = F.one_hot(head, H).bool()[:, None, :, None]  # (n, 1, H, 1)

            def ablate(context: Tensor, hook, layer: int = layer, mask: Tensor = mask) -> Tensor:
                rows = context.shape[1]  # fewer than T when this is the last layer (only the read-out's rows)
                windowed = context.shape[0] != mask.shape[0]  # contexts (n * nw, w*w, H, hd), all the windows' rows
                gone = torch.zeros_like(context) if mode == "zero" else _as_contexts(
                    model, layer, means[layer] if windowed else means[layer][:rows], grid, context).to(context)
                if windowed:  # each copy's windows take its head
                    mask = mask.repeat_interleave(context.shape[0] // mask.shape[0], dim=0)
                return torch.where(mask, gone, context)

            logits = _run_from(model, states[layer][image], grid, layer, [(f"blocks.{layer}.attn.hook_z", ablate)])
            out[image.cpu(), layer, head.cpu()] = (logits - base[image]).gather(-1, classes[image, None])[:, 0].cpu()
            done += len(cells)
            _report(progress, done, total)
    return out


# --- activation patching --------------------------------------------------------------------------

@dataclass
class Patching:
    """Logit difference ``logit[a] - logit[b]`` of the corrupted run with one clean activation patched in."""

    patched: Tensor  # (B, L, H) for heads, (B, L, T) for residual positions
    clean: Tensor  # (B,) logit difference of the clean run
    corrupted: Tensor  # (B,) of the corrupted run

    def recovered(self) -> Tensor:
        """The fraction of the clean-corrupted difference the patch restores: 0 nothing, 1 all (nan if equal)."""
        extra = (1,) * (self.patched.dim() - 1)
        return (self.patched - self.corrupted.view(-1, *extra)) / (self.clean - self.corrupted).view(-1, *extra)


def _patching_setup(model: ViT, clean: Tensor, corrupted: Tensor, a: Tensor | int | None, b: Tensor | int | None,
                    heads: bool = False):
    """Both runs' block inputs (``block_inputs``), logit differences, the classes and the clean run's head contexts
    as each ``hook_z`` holds them (``heads``)."""
    check_supported(model, needs_head=True)
    if clean.shape != corrupted.shape:
        raise MechanismError(f"clean {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)} images must have "
                             "the same shape; resize them to the same size")
    names = [f"blocks.{layer}.attn.hook_z" for layer in range(len(model.blocks))] if heads else []
    clean_logits, clean_states, clean_contexts = _states_and_contexts(model, clean, names)
    corrupt_logits, corrupt_states, _ = _states_and_contexts(model, corrupted, [])
    a = class_indices(clean_logits, a)
    b = class_indices(corrupt_logits, b)

    def diff(logits: Tensor) -> Tensor:  # (..., B, classes) with B last but one
        return logits.gather(-1, a.view(-1, 1)).squeeze(-1) - logits.gather(-1, b.view(-1, 1)).squeeze(-1)

    return (clean_states, corrupt_states, diff(clean_logits), diff(corrupt_logits), a, b, clean_contexts,
            grid_of(model, clean))


def _states_and_contexts(model: ViT, images: Tensor, names: list[str]) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """One pass: logits, the block inputs and last output (``L + 1`` of ``(B, T_l, D_l)``) and the tensors at the
    hook points ``names``."""
    L = len(model.blocks)
    resid = [f"blocks.{i}.hook_resid_pre" for i in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]
    B, T = images.shape[0], model.num_prefix_tokens + math.prod(grid_of(model, images))
    check_budget(B * (L + 1) * T * model.config.hidden_size * (2 if names else 1), "keeping every layer's tokens")
    encoding, cache = model.run_with_cache(images, resid + names)
    return encoding.logits, [cache[n] for n in resid], [cache[n] for n in names]


def patch_heads(model: ViT, clean: Tensor, corrupted: Tensor, a: Tensor | int | None = None,
                b: Tensor | int | None = None, *, chunk: int | None = None, progress: Progress | None = None
                ) -> Patching:
    """Patch each (layer, head)'s context of the clean run into the corrupted run; the logit difference
    ``logit[a] - logit[b]`` (defaults: the clean and the corrupted predictions) for each. Each layer's ``B x H``
    patches run in the batch dimension, ``chunk`` at a time, through the layers from that one on;
    ``progress(done, total)`` after each batch. With stages, ``patched`` is ``(B, L, H)`` with ``H`` the most heads
    of any layer, NaN where a layer has fewer; a windowed layer's head is patched in all its windows (the two runs
    cut the same windows, so no placement is needed)."""
    with torch.no_grad():
        clean_s, corrupt_s, clean_d, corrupt_d, a, b, contexts, grid = _patching_setup(model, clean, corrupted, a, b,
                                                                                       heads=True)
        B, heads = clean.shape[0], _heads(model)
        chunk = _default_chunk(model, B * max(heads), clean_s[0].shape[1], progress) if chunk is None else chunk
        out = torch.full((B, len(heads), max(heads)), float("nan"))
        total, done = B * sum(heads), 0
        _report(progress, 0, total)
        for layer, cells in _batches([B * h for h in heads], chunk):
            H = heads[layer]
            cell = torch.tensor(cells, device=clean_s[0].device)
            image, head = cell // H, cell % H  # (n,) each: copy j takes head[j] of image[j] from the clean run
            source = _per_copy(contexts[layer], B, image)  # (n * nw, T or w*w, H, hd)
            mask = F.one_hot(head, H).bool()[:, None, :, None]  # (n, 1, H, 1)
            mask = mask.repeat_interleave(source.shape[0] // len(cell), dim=0)  # each copy's windows

            def patch(context: Tensor, hook, source: Tensor = source, mask: Tensor = mask) -> Tensor:
                return torch.where(mask, source[:, :context.shape[1]], context)  # the read-out's rows at the last

            logits = _run_from(model, corrupt_s[layer][image], grid, layer,
                               [(f"blocks.{layer}.attn.hook_z", patch)])
            out[image.cpu(), layer, head.cpu()] = (logits.gather(-1, a[image, None])
                                                   - logits.gather(-1, b[image, None]))[:, 0].cpu()
            done += len(cells)
            _report(progress, done, total)
    return Patching(out, clean_d, corrupt_d)


def patch_residuals(model: ViT, clean: Tensor, corrupted: Tensor, a: Tensor | int | None = None,
                    b: Tensor | int | None = None, *, chunk: int | None = None, progress: Progress | None = None
                    ) -> Patching:
    """Patch the clean run's residual stream at each (layer input, token position) into the corrupted run:
    ``patched`` is ``(B, L, T)``. Each layer's ``B x T`` patches run in the batch dimension, ``chunk`` at a time
    (default: as many as keep one step within the memory bound), through the layers from that one on (the
    corrupted run's cached block inputs are where they start); ``progress(done, total)`` after each batch. With
    stages, layer ``l``'s positions are the tokens of the grid its input is on (the previous layer's, before a
    merge or pooling), row-major, ``T`` the image's patch grid's and NaN past a smaller grid's tokens."""
    with torch.no_grad():
        clean_s, corrupt_s, clean_d, corrupt_d, a, b, _, grid = _patching_setup(model, clean, corrupted, a, b)
        B, L = clean.shape[0], len(model.blocks)
        tokens = [x.shape[1] for x in clean_s[:L]]
        chunk = _default_chunk(model, B * max(tokens), max(tokens), progress) if chunk is None else chunk
        out = torch.full((B, L, max(tokens)), float("nan"))
        total, done = B * sum(tokens), 0
        _report(progress, 0, total)
        for layer, cells in _batches([B * t for t in tokens], chunk):
            T = tokens[layer]
            cell = torch.tensor(cells, device=clean_s[0].device)
            image, position = cell // T, cell % T  # (n,) each: copy j patches position[j] of image[j]
            x = corrupt_s[layer][image]  # (n, T, D), a copy
            x[torch.arange(len(cell)), position] = clean_s[layer][image, position]
            logits = _run_from(model, x, grid, layer)
            out[image.cpu(), layer, position.cpu()] = (logits.gather(-1, a[image, None])
                                                       - logits.gather(-1, b[image, None]))[:, 0].cpu()
            done += len(cells)
            _report(progress, done, total)
    return Patching(out, clean_d, corrupt_d)
