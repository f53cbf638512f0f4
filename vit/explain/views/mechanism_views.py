"""The Mechanism view's data for one image (issue 24): logit lens, direct logit attribution and the phenomena
(``mechanism_view``), head ablation (``ablation_view``, ``ablation_effects``; mean ablation's ``reference_means``),
activation patching (``patching_view``) and test-time registers (``registers_view``). The analyses themselves are
``vit.explain.mechanism.components``; layers and heads are 0-based here, the page shows them from 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import chain, islice

import numpy as np
import torch
from PIL import Image

from vit.checkpoint import Checkpoint
from vit.core.inference import (
    TRAINING_SIZE,
    InputSize,
    Prediction,
    input_shape,
    predictions_from_logits,
    preprocess,
    preprocess_at,
)
from vit.core.progress import Progress, in_parts
from vit.costs.fits import check_input_fits
from vit.explain.mechanism import components as mechanism
from vit.explain.mechanism import phenomena
from vit.explain.methods.attention import token_map
from vit.explain.views.image_analysis import TOP_K
from vit.model import ViT

MAX_REFERENCE_IMAGES = 32  # mean ablation's reference set: ViT-B/16 at 224 on 2 cores, 1.8 s per 8 (bench_mechanism)
REFERENCE_CHUNK = 8  # reference images run at once: one chunk's activations are held, not the whole set's


@dataclass
class MechanismView:
    """What the Mechanism view shows for one image and class (layers and heads 0-based)."""

    class_index: int
    lens_maps: np.ndarray  # (L + 1, gh, gw): each patch's probability of the class, after the embedding, each layer
    lens_top: list[list[tuple[int, float]]]  # per row of lens_maps, the pooled read-out's top 3 (class, probability)
    dla_heads: np.ndarray  # (L, H) direct contribution of each head to the class logit
    dla_mlps: np.ndarray  # (L,)
    dla_rest: dict[str, float]  # embedding, attention biases, final biases
    logit: float
    norms: np.ndarray  # (L + 1, T) token norms
    massive: np.ndarray  # (L, 4) top 1-3 and median |block output|
    sink_token: np.ndarray  # (L, H)
    sink_mass: np.ndarray  # (L, H)
    sink_value_norm: np.ndarray  # (L, H)
    lens_labels: list[str] | None = None  # a feature model's lens reads these typed labels (no attribution then)
    # The block whose output each row of lens_maps reads (-1: the embedding): every layer, or with stages (Swin,
    # Hiera) the last stage's only, whose tokens the final norm and head read; dla_heads' rows start at dla_first.
    lens_layers: tuple[int, ...] = ()
    dla_first: int = 0
    norm_grids: tuple[tuple[int, int], ...] = ()  # with stages: the grid of each row of norms (a list then)
    sinks_refused: str = ""  # why the sink statistics are empty (a model with stages)


def _model_input(checkpoint: Checkpoint, image: Image.Image, size: InputSize) -> torch.Tensor:
    model, p = checkpoint.model, checkpoint.preprocessing
    shape = input_shape(image, p, model.config.patch_size, size)
    check_input_fits(checkpoint, model.patch_grid(*shape), f"A {shape[1]}×{shape[0]} px input")
    return preprocess([image], p, size, model.config.patch_size).to(next(model.parameters()).device)


def mechanism_view(checkpoint: Checkpoint, image: Image.Image, class_index: int | None,
                   size: InputSize = TRAINING_SIZE, asked=None) -> MechanismView:
    """Logit lens, direct logit attribution and the phenomena of one image (``class_index`` None: predicted).

    A model without a classifier gets the phenomena only (empty lens and attribution), or, given ``asked``
    (``prompts.Prompts`` of labels typed for a CLIP), the lens over those labels: each token read through the
    final norm, the projection and the cosine to each label, as the model reads its pooled vector. Raises
    ``mechanism.MechanismError`` for a model the analyses do not support and ``TooManyTokens`` for too big an input.
    """
    from vit.explain.language import prompts

    lens_labels = None
    if checkpoint.model.head is None and asked is not None:
        checkpoint, lens_labels = prompts.prompt_checkpoint(checkpoint, asked), list(asked.labels)
    model = checkpoint.model
    x = _model_input(checkpoint, image, size)
    L, H = len(model.blocks), model.blocks[0].attn.num_heads
    norm_grids, sinks_refused = (), ""
    with torch.inference_mode():
        if model.config.stage_depths:  # each layer's tokens on its own grid: norms and activations per layer
            image_grid = model.patch_grid(*x.shape[-2:])
            outputs = _stage_outputs(model, x)  # each (1, T_l, D_l)
            norms = [s[0].float().norm(dim=-1).cpu().numpy() for s in [model.embed(x), *outputs]]  # each (T_l,)
            norm_grids = (image_grid,) + tuple(lay.grid for lay in model.layer_layouts(image_grid))
            massive = phenomena.massive_activations(outputs)[0].float().cpu().numpy()  # (L, 4)
            sink_token = sink_mass = sink_value_norm = np.zeros((L, 0))
            sinks_refused = STAGE_SINKS
        else:
            states = mechanism.hidden_states(model, x)  # (1, L + 1, T, D)
            sinks = phenomena.sink_stats(model, states, model.patch_grid(*x.shape[-2:]))
            norms = phenomena.token_norms(states)[0].cpu().numpy()
            massive = phenomena.massive_activations(states)[0].float().cpu().numpy()
            sink_token, sink_mass, sink_value_norm = (sinks.token[0].cpu().numpy(), sinks.mass[0].float().cpu().numpy(),
                                                      sinks.value_norm[0].float().cpu().numpy())
    lens_maps, lens_top, lens_layers = np.zeros((0, 1, 1), np.float32), [], ()
    dla_heads, dla_mlps, rest, logit, chosen, dla_first = np.zeros((L, H)), np.zeros(L), {}, 0.0, -1, 0
    if model.head is not None:
        with torch.inference_mode():
            lens = mechanism.logit_lens(model, x, class_index)
            dla = None if lens_labels else mechanism.direct_logit_attribution(model, x, lens.classes)
        grid, prefix = model.layer_layouts(model.patch_grid(*x.shape[-2:]))[-1].grid, model.num_prefix_tokens
        lens_maps = lens.token_probs[0, :, prefix:].reshape(-1, *grid).float().cpu().numpy()
        lens_layers = lens.layers
        top = lens.pooled_logits[0].softmax(-1).topk(min(3, lens.pooled_logits.shape[-1]), dim=-1)
        lens_top = [[(int(i), float(p)) for p, i in zip(ps, idx, strict=True)]
                    for ps, idx in zip(top.values, top.indices, strict=True)]
        chosen = int(lens.classes[0])
        if dla is not None:
            dla_heads, dla_mlps = dla.heads[0].cpu().numpy(), dla.mlps[0].cpu().numpy()
            dla_first = dla.first_layer
            rest = {"embedding" if not dla_first else f"stream entering layer {dla_first + 1}": float(dla.embed[0]),
                    "attention biases": float(dla.attn_biases[0].sum()),
                    "final norm and head biases": float(dla.bias[0])}
            logit = float(dla.logit[0])
    return MechanismView(chosen, lens_maps, lens_top, dla_heads, dla_mlps, rest, logit, norms, massive,
                         sink_token, sink_mass, sink_value_norm, lens_labels, lens_layers, dla_first, norm_grids,
                         sinks_refused)


# Why a model with stages has no sink statistics, in one line.
STAGE_SINKS = ("Attention sinks are not measured for a model with stages (Swin, Hiera): their windowed layers let each "
               "key be read only by its own window's queries, so a key's share of attention averaged over all queries "
               "measures its window, not a sink")


def _stage_outputs(model: ViT, x: torch.Tensor) -> list[torch.Tensor]:
    """Each block's output ``(1, T_l, D_l)`` on its own grid, read at its hook point in one pass."""
    names = [f"blocks.{i}.hook_resid_post" for i in range(len(model.blocks))]
    _, cache = model.run_with_cache(x, names)
    return [cache[name] for name in names]


def reference_means(checkpoint: Checkpoint, references: Iterable[Image.Image], image: Image.Image,
                    size: InputSize = TRAINING_SIZE, registers: dict[int, list[int]] | None = None,
                    progress: Progress | None = None, count: int = 0) -> mechanism.Means:
    """Per-head mean contexts ``(L, T, H, hd)`` over ``references`` (mean ablation) on ``image``'s token grid (with
    stages, one ``(T_l, H_l, hd)`` per layer on its own grid):
    each reference is prepared as the checkpoint prepares an image at ``size``, or, for another size, resized to
    exactly ``image``'s input shape (means are per position, whatever a reference's own aspect). With
    ``registers`` (layer -> register neurons) the references run with one test-time register, as the image will:
    ``(L, T + 1, H, hd)``. References are read ``REFERENCE_CHUNK`` at a time, so a lazy iterable holds no more
    decoded images than that; ValueError for none or more than ``MAX_REFERENCE_IMAGES``. ``progress(images
    done, count)`` after each chunk, ``count`` being how many references there are (for the progress only)."""
    p, model = checkpoint.preprocessing, checkpoint.model
    shape = input_shape(image, p, model.config.patch_size, size)
    check_input_fits(checkpoint, model.patch_grid(*shape), f"A {shape[1]}×{shape[0]} px input")
    device = next(model.parameters()).device
    references, total, expected, count = iter(references), None, count, 0
    with torch.inference_mode():
        while chunk := list(islice(references, REFERENCE_CHUNK)):
            count += len(chunk)
            if count > MAX_REFERENCE_IMAGES:
                break
            x = preprocess(chunk, p) if size == TRAINING_SIZE else preprocess_at(chunk, p, shape)
            if registers is None:
                part = mechanism.mean_contexts(model, x.to(device))  # (L, T, H, hd)
            else:
                contexts: list[torch.Tensor] = []  # per layer (B, T + 1, H, hd)
                phenomena.with_test_time_registers(model, x.to(device), registers, 1, contexts=contexts)
                part = torch.stack([c.mean(dim=0) for c in contexts])  # (L, T + 1, H, hd)
            part = [m * len(chunk) for m in part]  # summed over the chunk, per layer (a stage's own shape)
            total = part if total is None else [t + m for t, m in zip(total, part, strict=True)]
            if progress is not None:
                progress(count, max(expected, count))
    if not 1 <= count <= MAX_REFERENCE_IMAGES:
        raise ValueError(f"mean ablation averages over 1 to {MAX_REFERENCE_IMAGES} reference images; "
                         + ("add some" if not count else "remove some"))
    means = [t / count for t in total]
    return tuple(means) if model.config.stage_depths else torch.stack(means)


def ablation_effects(checkpoint: Checkpoint, image: Image.Image, class_index: int, mode: str = "zero",
                     means: torch.Tensor | None = None, size: InputSize = TRAINING_SIZE,
                     progress: Progress | None = None) -> np.ndarray:
    """``(L, H)``: the change of the class logit when each head alone is ablated (one pass per layer); with stages
    ``H`` is the most heads of any layer, NaN where a layer's stage has fewer."""
    x = _model_input(checkpoint, image, size)
    with torch.inference_mode():
        grid = mechanism.ablation_grid(checkpoint.model, x, class_index, mode, means, progress=progress)
    return grid[0].cpu().numpy()


@dataclass
class PatchingView:
    """Activation patching of the clean image's activations into the corrupted one (0-based layers, heads)."""

    clean_class: int  # a: the clean image's predicted class
    corrupted_class: int  # b: the corrupted image's
    clean_difference: float  # logit[a] - logit[b] on the clean image
    corrupted_difference: float
    heads: np.ndarray  # (L, H) share of the difference recovered by patching each head's output
    residual: np.ndarray | None  # (L, T) by patching each layer input at each token position
    # With stages: the grid each layer's input is on (its row of ``residual`` holds that many tokens, then NaN)
    residual_grids: tuple[tuple[int, int], ...] = ()

    def residual_maps(self) -> np.ndarray:
        """With stages: each layer's row of ``residual`` on its input's grid, placed on the image's patch grid
        ``(L, gh, gw)`` (each cell over the patches it covers)."""
        from vit.explain.methods.stage_maps import on_patch_grid

        grid = self.residual_grids[0]
        return np.stack([on_patch_grid(row[:g[0] * g[1]].reshape(g), grid)
                         for row, g in zip(self.residual, self.residual_grids, strict=True)])


def patching_view(checkpoint: Checkpoint, clean: Image.Image, corrupted: Image.Image,
                  size: InputSize = TRAINING_SIZE, residual: bool = False,
                  progress: Progress | None = None) -> PatchingView:
    """Patch each head output (and with ``residual`` each (layer, position) of the residual stream) of ``clean``
    into ``corrupted``; the logit difference between their predicted classes, as the share recovered.
    ``progress(passes done, total)``: the head grid's one pass a head of every layer, then the residual grid's
    ``L * T``."""
    x_clean, x_corrupted = _model_input(checkpoint, clean, size), _model_input(checkpoint, corrupted, size)
    model = checkpoint.model
    grid = model.patch_grid(*x_clean.shape[-2:])
    grids = (grid, *model.layer_grids(grid)[:-1]) if model.config.stage_depths else ()  # block l gets l - 1's grid
    T = model.num_prefix_tokens + math.prod(grid)
    tokens = sum(math.prod(g) for g in grids) if grids else len(model.blocks) * T  # the residual grid's passes
    H = sum(block.attn.num_heads for block in model.blocks)  # every layer's heads (a stage's own)
    heads_progress, tokens_progress = in_parts(progress, [H, tokens if residual else 0])
    with torch.inference_mode():
        heads = mechanism.patch_heads(model, x_clean, x_corrupted, progress=heads_progress)
        a, b = (int(model(x)[0].argmax(-1)[0]) for x in (x_clean, x_corrupted))
        tokens = (mechanism.patch_residuals(model, x_clean, x_corrupted, a, b, progress=tokens_progress) if residual
                  else None)
    return PatchingView(a, b, float(heads.clean[0]), float(heads.corrupted[0]), heads.recovered()[0].cpu().numpy(),
                        tokens.recovered()[0].cpu().numpy() if tokens is not None else None, grids)


@dataclass
class RegisterView:
    """Test-time registers on one image: the neurons found, and the last layer before and after (``(gh, gw)``)."""

    neurons: list[tuple[int, int, float]]  # (layer, neuron, score), 0-based, best first
    attention_before: np.ndarray  # the last layer's CLS attention to the patches, heads averaged
    attention_after: np.ndarray
    norms_before: np.ndarray  # the patch tokens' norms after the last layer
    norms_after: np.ndarray


def registers_view(checkpoint: Checkpoint, image: Image.Image, references: Iterable[Image.Image],
                   threshold: float, top_k: int = 10, size: InputSize = TRAINING_SIZE,
                   mean_ablated: tuple[Checkpoint, Sequence[tuple[int, int]]] | None = None) -> RegisterView:
    """Find the register neurons on ``references`` and this image (at the checkpoint's size; outliers: last-layer
    norms over ``threshold``), then add one test-time register to this image at ``size``.

    ``mean_ablated`` (the full checkpoint, the heads) says ``checkpoint`` is its copy with those heads mean-ablated:
    their means hold for the image's tokens only, so the register pass runs on a copy whose means are the
    references' with the register too (one more token)."""
    references = list(references)
    model = checkpoint.model
    found = torch.cat([_model_input(checkpoint, im, TRAINING_SIZE) for im in chain([image], references)])
    x = _model_input(checkpoint, image, size)
    grid, P = model.patch_grid(*x.shape[-2:]), model.num_prefix_tokens
    with torch.inference_mode():
        neurons = phenomena.find_register_neurons(model, found, threshold, top_k=top_k)
        chosen: dict[int, list[int]] = {}
        for layer, neuron, _ in neurons:
            chosen.setdefault(layer, []).append(neuron)
        logits, before = model(x, output_attentions=True)
        states = mechanism.hidden_states(model, x)
    registered = model
    if mean_ablated is not None:
        full, heads = mean_ablated
        means = reference_means(full, references, image, size, registers=chosen)  # (L, T + 1, H, hd)
        registered = ablated_checkpoint(full, heads, "mean", means, grid).model
    with torch.inference_mode():
        _, after, final = phenomena.with_test_time_registers(registered, x, chosen, 1, output_attentions=True)
    n = grid[0] * grid[1]

    def cls_map(attentions) -> np.ndarray:
        return attentions[-1][0].mean(0)[0, P:P + n].reshape(grid).float().cpu().numpy()

    return RegisterView(neurons, cls_map(before), cls_map(after),
                        states[0, -1, P:].norm(dim=-1).reshape(grid).float().cpu().numpy(),
                        final[0, P:P + n].norm(dim=-1).reshape(grid).float().cpu().numpy())


def ablated_checkpoint(checkpoint: Checkpoint, heads: Sequence[tuple[int, int]], mode: str = "zero",
                       means: torch.Tensor | None = None, grid: tuple[int, int] | None = None) -> Checkpoint:
    """``checkpoint`` with a copy of its model in which ``heads`` (layer, head from 0) are ablated in the weights
    (``mechanism.ablated_copy``; ``means`` from ``reference_means`` for ``mode="mean"``): the page draws every
    map and its prediction from it. ``grid``: the patch grid the means were taken on (the image's at its size),
    which windowed layers place them by (default: the model's input size's)."""
    return replace(checkpoint, model=mechanism.ablated_copy(checkpoint.model, heads, mode, means, grid))


@dataclass
class AblationView:
    """One image with some heads ablated, next to all heads on."""

    prediction: Prediction  # with the heads ablated
    rollout_on: np.ndarray | None  # (gh, gw) the CLS rollout (heads averaged) with all heads on; None with stages
    rollout_off: np.ndarray | None  # with the heads ablated: ablating a head changes every later layer's attention


def ablation_view(checkpoint: Checkpoint, image: Image.Image, heads: Sequence[tuple[int, int]], mode: str = "zero",
                  means: torch.Tensor | None = None, size: InputSize = TRAINING_SIZE, top_k: int = TOP_K
                  ) -> AblationView:
    """The prediction and the CLS rollout with ``heads`` (layer, head from 0) ablated, and the rollout with all
    heads on: two passes. A model with stages has no CLS token to roll out from: its prediction alone (one pass)."""
    from vit.explain.methods.attention import rollout

    model = checkpoint.model
    x = _model_input(checkpoint, image, size)
    grid, P = model.patch_grid(*x.shape[-2:]), model.num_prefix_tokens
    if model.config.stage_depths:
        with torch.inference_mode():
            logits, _ = mechanism.ablate_heads(model, x, heads, mode, means)
        [prediction] = predictions_from_logits(logits, checkpoint.class_names, top_k, model=model)
        return AblationView(prediction, None, None)
    with torch.inference_mode():
        _, full = mechanism.ablate_heads(model, x, [], output_attentions=True)
        logits, ablated = mechanism.ablate_heads(model, x, heads, mode, means, output_attentions=True)
    [prediction] = predictions_from_logits(logits, checkpoint.class_names, top_k, model=model)
    on, off = (token_map(rollout(list(a), "mean", num_prefix_tokens=P), 0, grid, P)[0].float().cpu().numpy()
               for a in (full, ablated))
    return AblationView(prediction, on, off)
