"""Is a map faithful? Deletion and insertion curves, and Chefer et al.'s segmentation and perturbation tests (the
command is ``python -m vit.faithfulness``).

Patches are ranked by a map, most relevant first. Deletion replaces the top-ranked patches of
the image, one step at a time, by a baseline and tracks the probability of the explained
class (each image's predicted class); a faithful map makes it fall fast (low area under the
curve). Insertion starts from the baseline and puts the top-ranked patches back; a faithful
map makes it rise fast (high area). Areas use the trapezoid rule over the fraction of patches
changed, in [0, 1] (Petsiuk et al. 2018, RISE; the perturbation tests of Chefer et al. 2021).

Replacement (``--replacement``), always in the model's normalised input space:
``blur`` a Gaussian blur of the image (sigma = 1/8 of its side, so objects lose their detail
but keep their colours; the RISE choice for insertion); ``mean`` each channel's mean over this
image; ``zero`` a normalised value of 0, which is the training data's mean colour.

Chefer et al. (CVPR 2021)'s two tests, as their scripts (github.com/hila-chefer/Transformer-Explainability):
segmentation: each image, resized to the model's input (no crop), is explained for its predicted class; the map,
upsampled bilinearly and min-max normalised, is foreground above its mean. ``pixel_accuracy`` and ``mIoU``
(background and foreground) count pixels over the whole set; ``mAP`` is the mean over images of the average precision
of (1 - map, map) against the one-hot mask. Perturbation: 10 %, 20 %, ... 90 % of the pixels, ranked by the upsampled
map, are made black, most relevant first (``positive``) and least relevant first (``negative``); each gives top-1
accuracy against the true class per step and its ``auc`` over 0-0.9 (trapezoid, the intact images at 0; the paper
prints it x 100).

ROAD (Rong et al. 2022, as pytorch-grad-cam's metrics/road.py): at each percentile p of 10, 20, ... 90 of the upsampled
map, the pixels above it (``most_relevant_first``) or below 100 - p (``least_relevant_first``) are imputed from their
neighbours (a sparse linear system, plus noise of std 0.01) and the predicted class's probability change is averaged
over percentiles and images (most first: low is good; least first: high is good); ``combined`` is (least - most) / 2,
their ROADCombined (high is good).
SaCo (Wu et al. CVPR 2024): the pixels, ranked by the upsampled map, are split into K equal groups, each replaced alone
by the image's mean colour; ``saco`` (in [-1, 1], high is good) weighs every pair of groups by their difference of
summed salience, for when the more salient group changes the probability more and against otherwise; ``undefined``
counts flat maps.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from vit.explain.methods.attention import class_gradients, fuse_heads, gradient_rollout, rollout, token_map
from vit.explain.methods.attention_flow import attention_flow
from vit.explain.methods.cam import attention_gradcam
from vit.explain.methods.hidden import placed_attentions
from vit.explain.methods.relevance import attnlrp, full_lrp, legrad, partial_lrp, patch_sums, transformer_attribution

REPLACEMENTS = ("blur", "mean", "zero")
METHODS = {
    "random": "random patch order (the baseline every map should beat)",
    "attention": "last layer's CLS attention, mean over heads",
    "rollout": "attention rollout (mean over heads)",
    "class": "gradient rollout (Chefer et al. 2021b)",
    "legrad": "LeGrad (Bousselham et al. 2024)",
    "transformer_attribution": "LRP transformer attribution (Chefer et al. 2021a)",
    "attnlrp": "AttnLRP (Achtibat et al. 2024), patch sums",
    "flow": "attention flow (Abnar & Zuidema 2020; slow)",
    # Chefer et al. (2021)'s baselines, as their ViT_explanation_generator.py / ViT_orig_LRP.py
    "attn-gradcam": "GradCAM on the last attention (Chefer et al. 2021a's baseline)",
    "lrp-full": "full LRP to the pixels (Chefer et al. 2021a's baseline), patch sums",
    "lrp-partial": "partial LRP: the last attention's relevance (Voita et al. 2019; Chefer et al. 2021a's baseline)",
}
# Which way each score is better, as its paper defines it (the module docstring): deletion (Petsiuk et al.) and
# Chefer's positive perturbation remove the most relevant pixels first, so a faithful map makes the curve fall fast
# (low area); insertion and the negative perturbation, the other way round (high area). ROAD's values are the
# probability after imputation minus before: most relevant first, a faithful map lowers it most (low); least
# relevant first, it keeps it (high); their combined is (least - most) / 2 (high). Segmentation's pixel accuracy,
# mIoU and mAP, and SaCo's coefficient in [-1, 1]: high. ``images_per_s`` is speed (high: faster). The report's
# other columns (SaCo's std, its count of flat maps) have no better side.
BETTER = {"deletion_auc": "lower", "insertion_auc": "higher",
          "pixel_accuracy": "higher", "mIoU": "higher", "mAP": "higher",
          "positive_auc": "lower", "negative_auc": "higher",
          "most_relevant_first": "lower", "least_relevant_first": "higher", "combined": "higher",
          "saco": "higher", "images_per_s": "higher"}
PIXEL_METHODS = ("lrp-full",)  # a map of the input's pixels: Chefer's tests read it as it is (their full_lrp)
DEFAULT_METHODS = [m for m in METHODS if m != "flow"]  # flow takes seconds per image on a CPU


def baseline(images: Tensor, replacement: str = "blur") -> Tensor:
    """What removed patches become: ``(B, C, H, W)`` -> same shape (see the module docstring)."""
    if replacement == "zero":
        return torch.zeros_like(images)
    if replacement == "mean":
        return images.mean(dim=(2, 3), keepdim=True).expand_as(images).clone()
    if replacement == "blur":
        # torchvision only here: importing it loads torch._dynamo and inductor (2-3 s), on the explorer's start too
        from torchvision.transforms.functional import gaussian_blur

        side = min(images.shape[-2:])
        sigma = max(side / 8, 0.5)
        kernel = 2 * int(2 * sigma) + 1  # covers +-2 sigma
        return gaussian_blur(images, [kernel, kernel], [sigma, sigma])
    raise ValueError(f"unknown replacement {replacement!r}; choose one of: {', '.join(REPLACEMENTS)}")


def step_counts(num_patches: int, steps: int | None = None) -> list[int]:
    """How many patches are changed at each point of a curve: 0 .. num_patches in ``steps`` (default: one each)."""
    steps = num_patches if steps is None else steps
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    # past one step per patch every count is taken already: the same points, without a loop of ``steps``
    steps = min(steps, max(num_patches, 1))
    return sorted({round(i * num_patches / steps) for i in range(steps + 1)})


def perturbation_curves(model: torch.nn.Module, images: Tensor, maps: Tensor, class_index: Tensor,
                        replacement: str = "blur", steps: int | None = None, batch_size: int = 256,
                        score: Callable[[Tensor], Tensor] | None = None,
                        progress: Callable[[int, int], None] | None = None
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Deletion and insertion curves of ``images (B, C, H, W)`` ranked by ``maps (B, gh, gw)``.

    ``model(x)`` returns logits or ``(logits, ...)``. Returns ``(fractions (S,), deletion (B, S),
    insertion (B, S))``: the fraction of patches changed and the probability of
    ``class_index[b]`` at each step (``score(logits)`` instead of the softmax when given: a prompt's
    similarity, ``vit.explain.language.prompts.prompt_curves``). Ties in a map keep row-major order.
    ``progress(images scored, 2 * B * S)`` after each model batch (it may raise to stop the curves there).
    """
    score = score if score is not None else (lambda logits: logits.softmax(dim=-1))
    B, _, H, W = images.shape
    gh, gw = maps.shape[-2:]
    if maps.shape[0] != B or H % gh or W % gw:
        raise ValueError(f"maps of shape {tuple(maps.shape)} do not fit images of shape {tuple(images.shape)}")
    counts = step_counts(gh * gw, steps)
    base = baseline(images, replacement)
    device = images.device  # every helper tensor on the model's device: CUDA refuses to mix in CPU ones
    order = torch.sort(maps.to(device).reshape(B, -1).float(), dim=1, descending=True, stable=True).indices  # (B, N)
    ranks = torch.empty_like(order).scatter_(1, order, torch.arange(gh * gw, device=device).expand(B, -1))  # rank
    counts_t = torch.tensor(counts, device=device)
    S = len(counts)
    changed = (ranks[:, None, :] < counts_t[None, :, None]).reshape(B * S, gh, gw)  # True where step s changes a patch
    curves, done = [], 0
    if progress is not None:
        progress(0, 2 * B * S)
    for first, second in ((images, base), (base, images)):  # deletion: image -> baseline; insertion: baseline -> image
        probs = []
        with torch.no_grad():
            # The B*S variants are built one model batch at a time: all at once they take GBs at 224 px.
            for rows in torch.arange(B * S, device=device).split(batch_size):  # row = image * S + step
                mask = changed[rows].float()
                mask = mask.repeat_interleave(H // gh, dim=1).repeat_interleave(W // gw, dim=2)[:, None]  # (n,1,H,W)
                image = rows // S
                out = model(first[image] * (1 - mask) + second[image] * mask)  # (n, C, H, W) in
                logits = out[0] if isinstance(out, tuple) else out
                probs.append(score(logits.float()))
                done += len(rows)
                if progress is not None:
                    progress(done, 2 * B * S)
        probs = torch.cat(probs).reshape(B, S, -1)
        curves.append(probs.gather(2, class_index.reshape(B, 1, 1).expand(B, S, 1))[..., 0].cpu().numpy())
    return np.array(counts) / (gh * gw), curves[0], curves[1]


def auc(fractions: np.ndarray, curve: np.ndarray) -> np.ndarray:
    """Area under each curve ``(..., S)`` over ``fractions (S,)`` by the trapezoid rule."""
    return np.trapezoid(curve, fractions, axis=-1)


def method_maps(model: torch.nn.Module, images: Tensor, method: str, class_index: Tensor,
                generator: torch.Generator | None = None, pixels: bool = False, start_layer: int = 0) -> Tensor:
    """The ``(B, gh, gw)`` map of ``method`` (a key of ``METHODS``) for each image's class; CLS is the query.
    With ``pixels``, a method of ``PIXEL_METHODS`` gives its ``(B, H, W)`` map of the input's pixels instead.
    ``start_layer``: the first layer rollout and transformer attribution roll out (Chefer et al.'s benchmark
    scripts, ``imagenet_seg_eval.py`` and ``generate_visualizations.py``, pass 1: ``CHEFER_START_LAYER``)."""
    grid = model.patch_grid(images.shape[2], images.shape[3])
    prefix = model.num_prefix_tokens
    if method == "random":
        return torch.rand(images.shape[0], *grid, generator=generator).to(images.device)
    if method in ("attention", "rollout", "flow"):
        with torch.no_grad():
            _, attentions = model(images, output_attentions=True)
        attentions = placed_attentions(model, attentions, grid)
        if method == "attention":
            return token_map(fuse_heads(attentions[-1]), 0, grid, prefix)
        if method == "rollout":
            return token_map(rollout(attentions[start_layer:], num_prefix_tokens=prefix), 0, grid, prefix)
        return attention_flow(attentions, query=0)[:, prefix:].reshape(-1, *grid)
    if method == "class":
        _, attentions, gradients = class_gradients(model, images, class_index)
        return token_map(gradient_rollout(attentions, gradients), 0, grid, prefix)
    if method == "legrad":
        return legrad(model, images, class_index)
    if method == "transformer_attribution":
        return token_map(transformer_attribution(model, images, class_index, start_layer=start_layer), 0, grid,
                         prefix)
    if method == "attnlrp":
        return patch_sums(attnlrp(model, images, class_index), grid)
    if method == "attn-gradcam":
        return attention_gradcam(model, images, class_index)
    if method == "lrp-partial":
        return partial_lrp(model, images, class_index)
    if method == "lrp-full":
        relevance = full_lrp(model, images, class_index)
        return relevance if pixels else patch_sums(relevance, grid)
    raise ValueError(f"unknown method {method!r}; choose from: {', '.join(METHODS)}")




# --- Chefer et al. (2021)'s benchmarks: ImageNet-segmentation and positive/negative perturbation ---------------
# As their baselines/ViT/imagenet_seg_eval.py, utils/metrices.py and pertubation_eval_from_hdf5.py
# (github.com/hila-chefer/Transformer-Explainability @ c3e578f; tests/test_faithfulness_chefer.py compares with them).

# The first layer their scripts roll out for rollout and transformer attribution (generate_rollout(start_layer=1),
# generate_LRP(start_layer=1, method="transformer_attribution") in imagenet_seg_eval.py and generate_visualizations.py)
CHEFER_START_LAYER = 1
PERTURBATION_STEPS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # their --scale per: shares of the input's pixels


def input_maps(maps: Tensor, size: tuple[int, int]) -> Tensor:
    """Patch maps ``(B, gh, gw)`` -> ``(B, H, W)`` at the input's ``size``: bilinear, then min-max per image.

    A flat map (max = min) comes out 0 everywhere, as their scripts' NaN -> 0."""
    res = torch.nn.functional.interpolate(maps[:, None].float(), size=size, mode="bilinear")[:, 0]  # (B, H, W)
    low = res.amin(dim=(1, 2), keepdim=True)
    high = res.amax(dim=(1, 2), keepdim=True)
    return torch.nan_to_num((res - low) / (high - low), nan=0.0)


def average_precision(scores: Tensor, labels: Tensor) -> float:
    """sklearn's ``average_precision_score(labels, scores)`` of flat ``scores (N,)`` against 0/1 ``labels (N,)``:
    the sum over distinct thresholds, highest first, of the recall gained times the precision there."""
    order = torch.argsort(scores, descending=True, stable=True)
    s, y = scores[order], labels[order].double()
    last = torch.ones_like(s, dtype=torch.bool)  # the last index of each run of equal scores: one threshold each
    last[:-1] = s[1:] != s[:-1]
    tps = torch.cumsum(y, 0)[last]
    seen = (torch.arange(len(s), device=s.device, dtype=torch.float64) + 1)[last]
    if tps[-1] == 0:
        return 0.0  # no positives: sklearn's nan, which their get_ap_scores turns into 0
    recall = tps / tps[-1]
    gained = recall - torch.cat([recall.new_zeros(1), recall[:-1]])
    return float((gained * (tps / seen)).sum())


def segmentation_counts(maps: Tensor, masks: Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                                np.ndarray]:
    """Chefer's per-image segmentation counts of patch ``maps (B, gh, gw)`` against 0/1 ``masks (B, H, W)``.

    The map, at the input size and min-max normalised, is foreground above its mean. Returns ``(correct (B,),
    labelled (B,), intersection (B, 2), union (B, 2), ap (B,))``: their ``batch_pix_accuracy``,
    ``batch_intersection_union(..., 2)`` (classes background, foreground) and ``get_ap_scores`` of
    ``(1 - map, map)`` against the one-hot mask. ``segmentation_scores`` sums them over a set.
    """
    res = input_maps(maps, tuple(masks.shape[-2:]))
    masks = masks.to(res.device).long()
    foreground = res > res.mean(dim=(1, 2), keepdim=True)  # (B, H, W); their argmax of (Res_0, Res_1)
    correct = (foreground.long() == masks).sum(dim=(1, 2))
    labelled = torch.full_like(correct, masks[0].numel())
    inter, union = [], []
    for c in (0, 1):
        predicted, truth = (foreground.long() == c), (masks == c)
        both = (predicted & truth).sum(dim=(1, 2))
        inter.append(both)
        union.append(predicted.sum(dim=(1, 2)) + truth.sum(dim=(1, 2)) - both)
    # AP over 2 H W scores: the background channel scored 1 - map, the foreground one map; a flat map scores 0 in
    # both, as theirs, whose 1 - NaN becomes 0 too
    ap = [average_precision(torch.cat([(1 - r if r.amax() > 0 else r).reshape(-1), r.reshape(-1)]),
                            torch.cat([(m == 0).reshape(-1), (m == 1).reshape(-1)]))
          for r, m in zip(res, masks, strict=True)]
    return (correct.cpu().numpy(), labelled.cpu().numpy(), torch.stack(inter, 1).cpu().numpy(),
            torch.stack(union, 1).cpu().numpy(), np.array(ap))


def segmentation_scores(correct: np.ndarray, labelled: np.ndarray, intersection: np.ndarray, union: np.ndarray,
                        ap: np.ndarray) -> dict[str, float]:
    """Pixel accuracy and mIoU of the counts summed over the set, and the mean AP, as their script's last line."""
    eps = np.spacing(1, dtype=np.float64)
    iou = np.float64(1.0) * intersection.sum(0) / (eps + union.sum(0))
    return {"pixel_accuracy": float(np.float64(1.0) * correct.sum() / (eps + labelled.sum())),
            "mIoU": float(iou.mean()), "mAP": float(np.mean(ap))}


def perturbation_hits(model: torch.nn.Module, images: Tensor, maps: Tensor, target: Tensor, zero: Tensor,
                      negative: bool, batch_size: int = 64) -> np.ndarray:
    """Chefer's perturbation test: ``(S, B)`` 1 where the model still predicts ``target`` with the top
    ``PERTURBATION_STEPS`` shares of the pixels removed, ranked by ``maps (B, gh, gw)`` at the input size.

    ``images (B, C, H, W)`` are normalised model input; a removed pixel becomes ``zero (C,)``, the normalised value
    of black (their 0 before ``normalize``). ``negative`` removes the least relevant first (their ``--neg``).
    """
    B, C, H, W = images.shape
    vis = input_maps(maps, (H, W)).to(images.device)
    if negative:
        vis = -vis
    vis = vis.reshape(B, -1)
    fill = zero.to(images.device, images.dtype)[None, :, None]  # (1, C, 1)
    variants = []
    for step in PERTURBATION_STEPS:
        _, idx = torch.topk(vis, int(H * W * step), dim=-1)  # their base_size * step, truncated
        removed = torch.zeros(B, H * W, dtype=torch.bool, device=images.device).scatter_(1, idx, True)
        flat = images.reshape(B, C, -1)
        variants.append(torch.where(removed[:, None], fill, flat).reshape(B, C, H, W))
    variants = torch.cat(variants)  # (S * B, C, H, W), step-major
    hits = []
    with torch.no_grad():
        for chunk in variants.split(batch_size):
            out = model(chunk)
            logits = out[0] if isinstance(out, tuple) else out
            hits.append(logits.argmax(dim=-1))
    predicted = torch.cat(hits).reshape(len(PERTURBATION_STEPS), B)
    return (predicted == target.to(predicted.device)[None]).cpu().numpy().astype(np.float64)


def perturbation_auc(accuracy: float, curve: np.ndarray) -> float:
    """Area under top-1 accuracy over the share of pixels removed, 0 (``accuracy``, the intact images) to 0.9 in
    ``PERTURBATION_STEPS`` (``curve (S,)``), by the trapezoid rule; Chefer et al.'s tables print it x 100."""
    return float(np.trapezoid(np.concatenate([[accuracy], curve]), (0.0, *PERTURBATION_STEPS)))


# --- ROAD (Rong et al. 2022, "remove and debias"), as pytorch-grad-cam's metrics/road.py ----------------------------
# (github.com/jacobgil/pytorch-grad-cam @ 084273b, after github.com/tleemann/road_evaluation;
# tests/test_faithfulness_road.py compares with it.)

ROAD_PERCENTILES = (10, 20, 30, 40, 50, 60, 70, 80, 90)  # their ROAD*Average and ROADCombined defaults
ROAD_NOISE = 0.01  # their NoisyLinearImputer's default: absolute, in the normalised input's units
# A missing pixel: the weighted mean of its 8 neighbours (edges 1/6, corners 1/12), in their order (b's sums follow)
ROAD_NEIGHBOURS = (((1, 1), 1 / 12), ((0, 1), 1 / 6), ((-1, 1), 1 / 12), ((1, -1), 1 / 12), ((0, -1), 1 / 6),
                   ((-1, -1), 1 / 12), ((1, 0), 1 / 6), ((-1, 0), 1 / 6))


def linear_impute(images: Tensor, keep: Tensor, noise: float = ROAD_NOISE,
                  generator: torch.Generator | None = None) -> Tensor:
    """ROAD's noisy linear imputation: ``images (B, C, H, W)`` with each pixel where ``keep (B, H, W)`` is False set
    to the weighted mean of its neighbours (``ROAD_NEIGHBOURS``; missing neighbours are unknowns of the same linear
    system), plus Gaussian noise of std ``noise`` drawn image by image from ``generator`` as their
    ``torch.randn_like``. Returns float32 on ``images``' device.

    The batch is one sparse system, block diagonal (no equation links two images), solved by scipy's ``spsolve`` as
    theirs. An image with no pixel kept (a flat map) has nothing to interpolate from: their system is singular
    (NaN); here it becomes 0, the normalised data's mean, plus the noise.
    """
    from scipy.sparse import csc_matrix
    from scipy.sparse.linalg import spsolve

    B, C, H, W = images.shape
    img = images.detach().to("cpu", torch.float32).numpy().reshape(B, C, H * W)
    known = keep.detach().cpu().numpy().reshape(B, H * W).astype(bool)
    solvable = known.any(axis=1)
    out = torch.from_numpy(img.copy())  # (B, C, H*W)
    out[torch.from_numpy(~solvable)] = 0.0  # every pixel missing, nothing to solve
    image, pixel = np.nonzero(~known & solvable[:, None])  # the unknowns, image by image, row-major (their order)
    n = len(pixel)
    number = np.zeros((B, H * W), dtype=np.int64)
    number[image, pixel] = np.arange(n)
    row, col = pixel // W, pixel % W
    rows, cols, values = [np.arange(n)], [np.arange(n)], []
    rhs = np.zeros((n, C))
    weights = np.ones(n)  # the diagonal: minus the weight of the neighbours inside the image
    for (dr, dc), weight in ROAD_NEIGHBOURS:
        r, c = row + dr, col + dc
        inside = (r >= 0) & (c >= 0) & (r < H) & (c < W)
        weights[~inside] -= weight
        eq = np.nonzero(inside)[0]
        neighbour = r[eq] * W + c[eq]
        has = known[image[eq], neighbour]
        rhs[eq[has]] -= weight * img[image[eq[has]], :, neighbour[has]]  # (m, C), float32 products as theirs
        rows.append(eq[~has])
        cols.append(number[image[eq[~has]], neighbour[~has]])
        values.append(np.full(len(rows[-1]), weight))
    values.insert(0, -weights)
    if n:
        system = csc_matrix((np.concatenate(values), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n))
        solved = torch.tensor(np.reshape(spsolve(system, rhs), (n, C)), dtype=torch.float)  # (n, C)
        out[torch.from_numpy(image), :, torch.from_numpy(pixel)] = solved
    for b in range(B):  # noise image by image, (C, unknowns) as their randn_like of res.t()
        where = ~known[b]
        out[b, :, torch.from_numpy(where)] += noise * torch.randn(C, int(where.sum()), generator=generator)
    return out.reshape(B, C, H, W).to(images.device)


def road_scores(model: torch.nn.Module, images: Tensor, maps: Tensor, class_index: Tensor,
                most_relevant_first: bool, percentiles: tuple[int, ...] = ROAD_PERCENTILES,
                noise: float = ROAD_NOISE, generator: torch.Generator | None = None,
                batch_size: int = 64) -> np.ndarray:
    """ROAD: ``(P, B)`` change of the probability of ``class_index`` when pixels are imputed (``linear_impute``).

    ``maps (B, gh, gw)`` are upsampled to the input as Chefer's tests do (``input_maps``). At percentile ``p`` of an
    image's map, their ``ROADMostRelevantFirst(p)`` keeps the pixels below it (removes the top ``100 - p`` %);
    ``ROADLeastRelevantFirst(p)`` does so with 1 - map (removes the bottom ``100 - p`` %). Each value is the
    probability after minus before (their ``return_diff``); their ``ROAD*Average`` is the mean over ``percentiles``
    and ``ROADCombined`` (least - most) / 2, each order drawn from ``generator`` in their order (percentile by
    percentile, image by image; ROADCombined: least relevant first, then most).
    """
    B, C, H, W = images.shape
    cams = input_maps(maps, (H, W)).cpu()  # (B, H, W) float32
    ranked = cams if most_relevant_first else 1 - cams
    flat = ranked.reshape(B, -1).numpy()
    with torch.no_grad():
        out = model(images)
        before = (out[0] if isinstance(out, tuple) else out).float().softmax(dim=-1)
        before = before.gather(1, class_index.reshape(B, 1).to(before.device))[:, 0]  # (B,)
        variants = []
        for p in percentiles:
            # their np.percentile of the float32 map, compared with it in float32 (torch casts the float64 scalar)
            threshold = torch.from_numpy(np.percentile(flat, p, axis=1).astype(np.float32))
            variants.append(linear_impute(images, ranked < threshold[:, None, None], noise, generator))
        after = []
        for chunk in torch.cat(variants).split(batch_size):  # (P * B, C, H, W), percentile-major
            out = model(chunk)
            after.append((out[0] if isinstance(out, tuple) else out).float().softmax(dim=-1))
        after = torch.cat(after).reshape(len(percentiles), B, -1)
        after = after.gather(2, class_index.reshape(1, B, 1).expand(len(percentiles), B, 1).to(after.device))[..., 0]
    return (after - before[None]).cpu().numpy()


# --- SaCo (Wu et al. CVPR 2024): salience-guided faithfulness coefficient -------------------------------------------
# github.com/adreamwu/SaCo publishes the pairwise loop (compute_SaCo.py); the groups and their perturbation follow the
# paper. tests/test_faithfulness_saco.py runs their loop on the same inputs.

SACO_GROUPS = 10  # K in the paper's experiments


def saco_groups(model: torch.nn.Module, images: Tensor, maps: Tensor, class_index: Tensor, groups: int = SACO_GROUPS,
                batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """SaCo's ``(s(G_i), pred(x, G_i))``, each ``(B, K)``, for ``images (B, C, H, W)`` and ``maps (B, gh, gw)``.

    The map, upsampled to the input as Chefer's tests do (``input_maps``), ranks the pixels, most salient first
    (ties in row-major order); ``G_i`` is the ``i``-th of ``K`` equal shares of that order (pixel at rank ``r`` in
    group ``r K // HW``) and ``s(G_i)`` the sum of the map over it. ``pred(x, G_i)`` is the probability of
    ``class_index`` on the image minus that with ``G_i`` alone replaced by the image's per-channel mean (the
    paper's per-sample mean): each group perturbed on its own, not cumulatively.
    """
    B, C, H, W = images.shape
    if not 2 <= groups <= H * W:
        raise ValueError(f"SaCo needs 2 to {H * W} groups (the input's pixels), got {groups}")
    salience = input_maps(maps, (H, W)).to(images.device).reshape(B, -1)  # (B, HW)
    order = torch.sort(salience, dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(H * W, device=images.device).expand(B, -1))
    group = rank * groups // (H * W)  # (B, HW): 0 = most salient
    # each group's salience summed in place: a (B, HW, K) one-hot took 9.6 GB at K = 1,000 for 16 images of 224 px
    s = torch.zeros(B, groups, dtype=torch.float64, device=images.device).scatter_add_(1, group, salience.double())
    mean = images.mean(dim=(2, 3), keepdim=True)  # (B, C, 1, 1)
    with torch.no_grad():
        out = model(images)
        before = (out[0] if isinstance(out, tuple) else out).float().softmax(dim=-1)
        before = before.gather(1, class_index.reshape(B, 1).to(before.device))[:, 0]  # (B,)
        after = []
        for rows in torch.arange(B * groups, device=images.device).split(batch_size):  # row = image * K + group
            b, k = rows // groups, rows % groups
            removed = (group[b] == k[:, None]).reshape(-1, 1, H, W)  # (n, 1, H, W)
            out = model(torch.where(removed, mean[b], images[b]))
            after.append((out[0] if isinstance(out, tuple) else out).float().softmax(dim=-1))
        after = torch.cat(after).reshape(B, groups, -1)
        after = after.gather(2, class_index.reshape(B, 1, 1).expand(B, groups, 1).to(after.device))[..., 0]
    return s.cpu().numpy(), (before[:, None] - after).cpu().numpy()


def saco_coefficient(salience: np.ndarray, change: np.ndarray) -> np.ndarray:
    """SaCo's ``F`` per image from ``s(G_i)`` and ``pred(x, G_i)``, each ``(B, K)``, in [-1, 1]: over the pairs
    ``i < j``, ``s(G_i) - s(G_j)`` counted for when ``pred(x, G_i) >= pred(x, G_j)`` and against otherwise, divided
    by the sum of the pairs' ``|s(G_i) - s(G_j)|``. NaN where that sum is 0 (a flat map; their code raises)."""
    i, j = np.triu_indices(salience.shape[1], k=1)
    gap = salience[:, i] - salience[:, j]  # (B, pairs)
    weight = np.where(change[:, i] >= change[:, j], gap, -gap)
    total = np.abs(weight).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total != 0, weight.sum(axis=1) / total, np.nan)
