"""Is a map faithful? Deletion and insertion curves: ``python -m vit.faithfulness CHECKPOINT --data DIR``.

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

``DIR`` holds one subfolder per class as for ``vit.evaluate``. ``--limit N`` takes N images
after a seeded shuffle, so a limit samples every class. Prints JSON: per method,
``deletion_auc`` and ``insertion_auc`` as ``{"mean", "std"}`` over the images, with a
progress bar on stderr.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torchvision.transforms.functional import gaussian_blur

from vit.attention import class_gradients, fuse_heads, gradient_rollout, rollout, token_map
from vit.attention_flow import attention_flow
from vit.relevance import attnlrp, legrad, patch_sums, transformer_attribution

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
}
DEFAULT_METHODS = [m for m in METHODS if m != "flow"]  # flow takes seconds per image on a CPU


def baseline(images: Tensor, replacement: str = "blur") -> Tensor:
    """What removed patches become: ``(B, C, H, W)`` -> same shape (see the module docstring)."""
    if replacement == "zero":
        return torch.zeros_like(images)
    if replacement == "mean":
        return images.mean(dim=(2, 3), keepdim=True).expand_as(images).clone()
    if replacement == "blur":
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
    return sorted({round(i * num_patches / steps) for i in range(steps + 1)})


def perturbation_curves(model: torch.nn.Module, images: Tensor, maps: Tensor, class_index: Tensor,
                        replacement: str = "blur", steps: int | None = None, batch_size: int = 256
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Deletion and insertion curves of ``images (B, C, H, W)`` ranked by ``maps (B, gh, gw)``.

    ``model(x)`` returns logits or ``(logits, ...)``. Returns ``(fractions (S,), deletion (B, S),
    insertion (B, S))``: the fraction of patches changed and the probability of
    ``class_index[b]`` at each step. Ties in a map keep row-major order.
    """
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
    curves = []
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
                probs.append(logits.float().softmax(dim=-1))
        probs = torch.cat(probs).reshape(B, S, -1)
        curves.append(probs.gather(2, class_index.reshape(B, 1, 1).expand(B, S, 1))[..., 0].cpu().numpy())
    return np.array(counts) / (gh * gw), curves[0], curves[1]


def auc(fractions: np.ndarray, curve: np.ndarray) -> np.ndarray:
    """Area under each curve ``(..., S)`` over ``fractions (S,)`` by the trapezoid rule."""
    return np.trapezoid(curve, fractions, axis=-1)


def method_maps(model: torch.nn.Module, images: Tensor, method: str, class_index: Tensor,
                generator: torch.Generator | None = None) -> Tensor:
    """The ``(B, gh, gw)`` map of ``method`` (a key of ``METHODS``) for each image's class; CLS is the query."""
    grid = model.patch_grid(images.shape[2], images.shape[3])
    prefix = model.num_prefix_tokens
    if method == "random":
        return torch.rand(images.shape[0], *grid, generator=generator).to(images.device)
    if method in ("attention", "rollout", "flow"):
        with torch.no_grad():
            _, attentions = model(images, output_attentions=True)
        if method == "attention":
            return token_map(fuse_heads(attentions[-1]), 0, grid, prefix)
        if method == "rollout":
            return token_map(rollout(attentions, num_prefix_tokens=prefix), 0, grid, prefix)
        return attention_flow(attentions, query=0)[:, prefix:].reshape(-1, *grid)
    if method == "class":
        _, attentions, gradients = class_gradients(model, images, class_index)
        return token_map(gradient_rollout(attentions, gradients), 0, grid, prefix)
    if method == "legrad":
        return legrad(model, images, class_index)
    if method == "transformer_attribution":
        return token_map(transformer_attribution(model, images, class_index), 0, grid, prefix)
    if method == "attnlrp":
        return patch_sums(attnlrp(model, images, class_index), grid)
    raise ValueError(f"unknown method {method!r}; choose from: {', '.join(METHODS)}")


# --- command line ---------------------------------------------------------------------------------

PROG = "vit.faithfulness"


def build_parser() -> argparse.ArgumentParser:
    from vit.predict import OneLineParser, positive_int

    summary, details = __doc__.split("\n\n", 1)
    p = OneLineParser(prog=f"python -m {PROG}", description=summary, epilog=details,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a .pt checkpoint written by vit.train")
    p.add_argument("--data", required=True, metavar="DIR", help="a folder with one subfolder of images per class")
    p.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, metavar="METHOD",
                   help=f"maps to score (default: all but flow); any of: {', '.join(METHODS)}")
    p.add_argument("--limit", type=positive_int, default=None, metavar="N", help="score N images (seeded shuffle)")
    p.add_argument("--replacement", choices=REPLACEMENTS, default="blur", help="what removed patches become")
    p.add_argument("--steps", type=positive_int, default=None, help="points per curve (default: one per patch)")
    p.add_argument("--batch-size", type=positive_int, default=16, help="images per step (default 16)")
    p.add_argument("--seed", type=int, default=0, help="for the shuffle and the random baseline (default 0)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="where the model runs")
    return p


def sample_files(files: list, limit: int | None, seed: int) -> list:
    """``limit`` items of ``files`` after a seeded shuffle (all of them, shuffled, without a limit)."""
    files = list(files)
    random.Random(seed).shuffle(files)
    return files if limit is None else files[:limit]


def _summary(values: list[float]) -> dict:
    array = np.asarray(values, dtype=np.float64)
    return {"mean": float(array.mean()), "std": float(array.std())}


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from vit.evaluate import labelled_files
    from vit.images import ImageError, open_image
    from vit.inference import preprocess
    from vit.predict import UsageError, open_checkpoint, resolve_device

    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        raise UsageError(f"unknown method(s) {', '.join(unknown)}; choose from: {', '.join(METHODS)}")
    checkpoint = open_checkpoint(args.checkpoint, resolve_device(args.device))
    model = checkpoint.model.eval()
    device = next(model.parameters()).device
    files = sample_files(labelled_files(Path(args.data), checkpoint.class_names), args.limit, args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    scores = {m: {"deletion": [], "insertion": []} for m in args.methods}
    skipped = 0
    bar = tqdm(total=len(files), unit="img", desc="faithfulness", file=sys.stderr, dynamic_ncols=True)
    for start in range(0, len(files), args.batch_size):
        chunk, images = files[start:start + args.batch_size], []
        for path, _ in chunk:
            try:
                images.append(open_image(path))
            except ImageError as e:
                print(f"{PROG}: skipped: {e}", file=sys.stderr)
                skipped += 1
        if images:
            x = preprocess(images, checkpoint.preprocessing).to(device)
            with torch.no_grad():
                predicted = model(x)[0].argmax(dim=-1)
            for method in args.methods:
                maps = method_maps(model, x, method, predicted, generator)
                fractions, deletion, insertion = perturbation_curves(model, x, maps, predicted, args.replacement,
                                                                     args.steps)
                scores[method]["deletion"] += auc(fractions, deletion).tolist()
                scores[method]["insertion"] += auc(fractions, insertion).tolist()
        bar.update(len(chunk))
    bar.close()
    count = len(files) - skipped
    if count == 0:
        raise UsageError(f"none of the {len(files)} images in {args.data} could be read")
    result = {"checkpoint": str(args.checkpoint), "data": str(args.data), "images": count,
              "replacement": args.replacement, "explained_class": "predicted",
              "methods": {m: {"deletion_auc": _summary(s["deletion"]), "insertion_auc": _summary(s["insertion"])}
                          for m, s in scores.items()}}
    print(json.dumps(result, indent=2))
    return 1 if skipped else 0


def main(argv: list[str] | None = None) -> int:
    from vit.predict import run_cli

    return run_cli(PROG, build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
