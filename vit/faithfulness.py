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

Chefer et al. (CVPR 2021)'s two tests, as their scripts (github.com/hila-chefer/Transformer-Explainability):
``--benchmark segmentation --masks MASKS``: ``DIR`` a folder of images, ``MASKS`` a 0/non-0 PNG for each, of the same
file stem. Each image, resized to the model's input (no crop), is explained for its predicted class; the map,
upsampled bilinearly and min-max normalised, is foreground above its mean. ``pixel_accuracy`` and ``mIoU``
(background and foreground) count pixels over the whole set; ``mAP`` is the mean over images of the average precision
of (1 - map, map) against the one-hot mask. ``--benchmark perturbation``: ``DIR`` as for deletion; 10 %, 20 %, ...
90 % of the pixels, ranked by the upsampled map, are made black, most relevant first (``positive``) and least relevant
first (``negative``); each gives top-1 accuracy against the true class per step and its ``auc`` over 0-0.9 (trapezoid,
the intact images at 0; the paper prints it x 100). Both print ``images_per_s`` per method, a table on stderr, and
with ``--out DIR`` write ``DIR/faithfulness.json``, ``DIR/faithfulness.md`` and ``DIR/faithfulness.png``.
Their baselines are methods too: ``attn-gradcam`` (GradCAM on the last attention), ``lrp-partial`` (the last
attention's LRP relevance) and ``lrp-full`` (LRP to the pixels; read as pixels by both tests, as their full_lrp).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROG = "vit.faithfulness"
# vit.explain.faithfulness's METHODS and REPLACEMENTS by name, for --help without torch (tests/test_faithfulness.py
# checks they are the same), so that an unknown method is refused before torch loads.
METHOD_NAMES = ("random", "attention", "rollout", "class", "legrad", "transformer_attribution", "attnlrp", "flow",
                "attn-gradcam", "lrp-full", "lrp-partial")
REPLACEMENTS = ("blur", "mean", "zero")
BENCHMARKS = ("deletion", "segmentation", "perturbation")
# A fixed number of curve points whatever the patch grid: Chefer et al. (2021)'s perturbation tests remove the
# patches in 10 % steps; 5 % steps here draw the curve twice as finely at a cost that does not grow with the grid.
DEFAULT_STEPS = 20



def build_parser() -> argparse.ArgumentParser:
    from vit.cli import OneLineParser, command_name, positive_int

    summary, details = __doc__.split("\n\n", 1)
    p = OneLineParser(prog=command_name(PROG), description=summary, epilog=details,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a .pt checkpoint written by vit.train, any model vit.convert opens,"
                                      " or a Hub id: ORG/NAME[@REV], hf-hub:ORG/NAME, a timm name")
    p.add_argument("--data", required=True, metavar="DIR",
                   help="a folder with one subfolder of images per class (segmentation: a folder of images)")
    p.add_argument("--benchmark", choices=BENCHMARKS, default="deletion",
                   help="deletion and insertion curves (default), or Chefer et al.'s segmentation or perturbation test")
    p.add_argument("--masks", metavar="DIR", help="segmentation: a 0/non-0 PNG per image, named by the image's stem")
    p.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                   help=f"maps to score, spaces or commas between (default: all but flow); any of: "
                        f"{', '.join(METHOD_NAMES)}")
    p.add_argument("--out", metavar="DIR",
                   help="also write DIR/faithfulness.json, .md (a table) and, for Chefer's tests, .png (a plot)")
    p.add_argument("--limit", type=positive_int, default=None, metavar="N", help="score N images (seeded shuffle)")
    p.add_argument("--replacement", choices=REPLACEMENTS, default="blur", help="what removed patches become")
    p.add_argument("--steps", type=positive_int, default=DEFAULT_STEPS,
                   help=f"steps per curve, each changing an equal share of the patches (default {DEFAULT_STEPS}: "
                        "5 %% each, whatever the grid; one per patch made ViT-S/16 take 196 steps x 14 curves per "
                        "image)")
    p.add_argument("--batch-size", type=positive_int, default=16, help="images per step (default 16)")
    p.add_argument("--seed", type=int, default=0, help="for the shuffle and the random baseline (default 0)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="where the model runs")
    return p



def _summary(values: list[float]) -> dict:
    import numpy as np

    array = np.asarray(values, dtype=np.float64)
    return {"mean": float(array.mean()), "std": float(array.std())}



def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from vit.evaluate import labelled_files
    from vit.explain.dataset import sample_files
    from vit.explain.faithfulness import DEFAULT_METHODS, auc, method_maps, perturbation_curves
    from vit.images import ImageError, open_image
    from vit.inference import preprocess
    from vit.predict import UsageError, open_checkpoint, resolve_device

    if args.benchmark != "deletion":
        return run_chefer(args)
    if args.methods is None:
        args.methods = list(DEFAULT_METHODS)
    checkpoint = open_checkpoint(args.checkpoint, resolve_device(args.device))
    model = checkpoint.model.eval()
    device = next(model.parameters()).device
    files = sample_files(labelled_files(Path(args.data), checkpoint.class_names), args.limit, args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    scores = {m: {"deletion": [], "insertion": []} for m in args.methods}
    skipped = 0
    # Progress per image and method (a batch of 16 ViT-B images can take minutes per method).
    bar = tqdm(total=len(files) * len(args.methods), unit="map", desc="faithfulness", file=sys.stderr,
               dynamic_ncols=True)
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
                bar.update(len(images))
        bar.update((len(chunk) - len(images)) * len(args.methods))  # skipped images
    bar.close()
    count = len(files) - skipped
    if count == 0:
        raise UsageError(f"none of the {len(files)} images in {args.data} could be read")
    result = {"checkpoint": str(args.checkpoint), "data": str(args.data), "images": count,
              "replacement": args.replacement, "explained_class": "predicted",
              "methods": {m: {"deletion_auc": _summary(s["deletion"]), "insertion_auc": _summary(s["insertion"])}
                          for m, s in scores.items()}}
    print(json.dumps(result, indent=2))
    write_out(args.out, result, table(result))
    return 1 if skipped else 0


def matched_masks(data: Path, masks: Path) -> list[tuple[Path, Path]]:
    """``(image, mask)`` for every image under ``data``, its mask the PNG of its stem under ``masks``; UsageError
    in one line when a stem repeats or an image has no mask."""
    from vit.cli import UsageError
    from vit.training.data import image_files

    images = image_files(data)
    if not images:
        raise UsageError(f"no images in {data}; give a folder of images (--data) and their masks (--masks)")
    pngs = {}
    for path in sorted(masks.rglob("*")):
        if path.suffix.lower() == ".png":
            if path.stem in pngs:
                raise UsageError(f"two masks named {path.stem} in {masks} ({pngs[path.stem]}, {path}); "
                                 "stems must be unique")
            pngs[path.stem] = path
    stems = [p.stem for p in images]
    repeated = sorted({s for s in stems if stems.count(s) > 1})
    if repeated:
        raise UsageError(f"images share the stem(s) {', '.join(repeated[:5])} in {data}; masks are matched by stem, "
                         "so rename them")
    missing = [s for s in stems if s not in pngs]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise UsageError(f"no mask in {masks} for image(s) {', '.join(missing[:5])}{more}; give a PNG named by "
                         "each image's stem (e.g. cat.jpg -> cat.png)")
    return [(p, pngs[p.stem]) for p in images]


def open_mask(path: Path, hw: tuple[int, int]):
    """A 0/1 ``(H, W)`` long tensor of the PNG at ``path`` resized to ``hw`` nearest (their ``Image.NEAREST``)."""
    import numpy as np
    import torch
    from PIL import Image

    from vit.cli import UsageError

    try:
        with Image.open(path) as mask:
            mask = mask.convert("L").resize((hw[1], hw[0]), Image.NEAREST)
    except OSError as e:
        raise UsageError(f"cannot read the mask {path} ({e}); give a PNG, 0 for background") from None
    return torch.from_numpy((np.asarray(mask) > 0).astype(np.int64))


def run_chefer(args: argparse.Namespace) -> int:
    """``--benchmark segmentation`` or ``perturbation`` (the module docstring)."""
    import time

    import numpy as np
    import torch
    from tqdm import tqdm

    from vit.evaluate import labelled_files
    from vit.explain import faithfulness as bench
    from vit.explain.dataset import sample_files
    from vit.images import ImageError, normalize, open_image
    from vit.inference import preprocess_at
    from vit.predict import UsageError, open_checkpoint, resolve_device

    methods = args.methods or list(bench.DEFAULT_METHODS)
    segmentation = args.benchmark == "segmentation"
    checkpoint = open_checkpoint(args.checkpoint, resolve_device(args.device))
    model = checkpoint.model.eval()
    device = next(model.parameters()).device
    p = checkpoint.preprocessing
    hw = tuple(p.image_hw)
    if segmentation:
        files = sample_files(matched_masks(Path(args.data), Path(args.masks)), args.limit, args.seed)
    else:
        files = sample_files(labelled_files(Path(args.data), checkpoint.class_names), args.limit, args.seed)
    zero = normalize(torch.zeros(1, p.num_channels, 1, 1, dtype=torch.uint8), p.mean, p.std)[0, :, 0, 0]  # black
    generator = torch.Generator().manual_seed(args.seed)
    counts = {m: [] for m in methods}  # segmentation: per batch, segmentation_counts' five arrays
    hits = {m: {"positive": [], "negative": []} for m in methods}  # perturbation: per batch, (S, B)
    intact, seconds, skipped = [], dict.fromkeys(methods, 0.0), 0
    bar = tqdm(total=len(files) * len(methods), unit="map", desc=args.benchmark, file=sys.stderr, dynamic_ncols=True)
    for start in range(0, len(files), args.batch_size):
        chunk, images, kept = files[start:start + args.batch_size], [], []
        for item in chunk:
            try:
                images.append(open_image(item[0]))
                kept.append(item)
            except ImageError as e:
                print(f"{PROG}: skipped: {e}", file=sys.stderr)
                skipped += 1
        if images:
            x = preprocess_at(images, p, hw).to(device)  # resized to the input, no crop: their Resize((224, 224))
            with torch.no_grad():
                predicted = model(x)[0].argmax(dim=-1)
            if segmentation:
                masks = torch.stack([open_mask(mask, hw) for _, mask in kept])
            else:
                target = torch.tensor([label for _, label in kept], device=device)
                intact.append((predicted == target).cpu().numpy().astype(np.float64))
            for method in methods:
                began = time.perf_counter()
                # their vis_class "top"; full LRP's pixels as they are (their full_lrp is not upsampled)
                maps = bench.method_maps(model, x, method, predicted, generator, pixels=True)
                if segmentation:
                    counts[method].append(bench.segmentation_counts(maps, masks))
                else:
                    for order in ("positive", "negative"):
                        hits[method][order].append(bench.perturbation_hits(model, x, maps, target, zero,
                                                                           order == "negative", args.batch_size))
                seconds[method] += time.perf_counter() - began
                bar.update(len(images))
        bar.update((len(chunk) - len(images)) * len(methods))
    bar.close()
    count = len(files) - skipped
    if count == 0:
        raise UsageError(f"none of the {len(files)} images in {args.data} could be read")
    scores = {}
    for method in methods:
        if segmentation:
            scores[method] = bench.segmentation_scores(*(np.concatenate(parts) for parts in zip(*counts[method],
                                                                                                  strict=True)))
        else:
            accuracy = float(np.concatenate(intact).mean())
            scores[method] = {}
            for order in ("positive", "negative"):
                curve = np.concatenate(hits[method][order], axis=1).mean(axis=1)
                scores[method][f"{order}_auc"] = bench.perturbation_auc(accuracy, curve)
                scores[method][f"{order}_accuracy"] = [accuracy, *map(float, curve)]
        scores[method]["images_per_s"] = count / seconds[method] if seconds[method] else None
    result = {"checkpoint": str(args.checkpoint), "data": str(args.data), "benchmark": args.benchmark,
              "images": count, "explained_class": "predicted", "methods": scores}
    if segmentation:
        result["masks"] = str(args.masks)
    else:
        result["removed"] = [0.0, *bench.PERTURBATION_STEPS]
        result["model_accuracy"] = float(np.concatenate(intact).mean())
    print(json.dumps(result, indent=2))
    text = table(result)
    print(text, file=sys.stderr)
    write_out(args.out, result, text)
    return 1 if skipped else 0


def table(result: dict) -> str:
    """A Markdown table of ``result``'s scalar scores per method."""
    rows = result["methods"]
    columns = [k for k, v in next(iter(rows.values())).items() if not isinstance(v, (list, dict))]
    if not columns:  # deletion: {"mean", "std"} each
        columns = list(next(iter(rows.values())))
        cells = {m: [f"{s[c]['mean']:.4f} ± {s[c]['std']:.4f}" for c in columns] for m, s in rows.items()}
    else:
        cells = {m: ["-" if s[c] is None else f"{s[c]:.4f}" for c in columns] for m, s in rows.items()}
    lines = [f"| method | {' | '.join(columns)} |", "|---" * (len(columns) + 1) + "|"]
    lines += [f"| {m} | {' | '.join(c)} |" for m, c in cells.items()]
    return "\n".join(lines)


def write_out(out: str | None, result: dict, text: str) -> None:
    """``--out DIR``: the JSON and the Markdown table."""
    if out is None:
        return
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "faithfulness.json").write_text(json.dumps(result, indent=2) + "\n")
    title = f"# {result.get('benchmark', 'deletion')} on {result['images']} images of {result['data']}"
    (folder / "faithfulness.md").write_text(f"{title}\n\nModel: {result['checkpoint']}\n\n{text}\n")
    if result.get("benchmark") in ("segmentation", "perturbation"):
        plot(result, folder / "faithfulness.png")


def plot(result: dict, path: Path) -> None:
    """``--out``'s figure: the segmentation scores as bars per method, or the perturbation curves per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    methods = result["methods"]
    if result["benchmark"] == "segmentation":
        fig, ax = plt.subplots(figsize=(1.6 + 0.9 * len(methods), 3.6))
        metrics = ("pixel_accuracy", "mIoU", "mAP")
        width = 0.8 / len(metrics)
        for i, metric in enumerate(metrics):
            ax.bar(np.arange(len(methods)) + (i - 1) * width, [s[metric] for s in methods.values()], width,
                   label=metric)
        ax.set_xticks(range(len(methods)), list(methods), rotation=30, ha="right")
        ax.set_ylim(0, 1)
        ax.legend()
    else:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
        for ax, order in zip(axes, ("positive", "negative"), strict=True):
            for method, scores in methods.items():
                ax.plot(result["removed"], scores[f"{order}_accuracy"], marker="o", ms=3,
                        label=f"{method} ({scores[f'{order}_auc']:.3f})")
            ax.set_title(f"{order}: {'most' if order == 'positive' else 'least'} relevant removed first")
            ax.set_xlabel("share of pixels removed")
            ax.legend(fontsize=7)
        axes[0].set_ylabel("top-1 accuracy")
    fig.suptitle(f"{result['benchmark']}, {result['images']} images")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)



def check_args(args: argparse.Namespace) -> None:
    """Before torch loads: the methods are known, the model exists (or is a Hub id) and ``--data`` is a folder."""
    from vit.cli import UsageError, check_folder
    from vit.predict import check_model_path

    if args.methods is not None:  # --methods a,b and --methods a b alike
        args.methods = [m for part in args.methods for m in part.split(",") if m]
    unknown = [m for m in args.methods or () if m not in METHOD_NAMES]
    if unknown:
        raise UsageError(f"unknown method(s) {', '.join(unknown)}; choose from: {', '.join(METHOD_NAMES)}")
    if args.benchmark == "segmentation" and args.masks is None:
        raise UsageError("--benchmark segmentation needs --masks DIR: a PNG per image, named by the image's stem")
    if args.benchmark != "segmentation" and args.masks is not None:
        raise UsageError(f"--masks is for --benchmark segmentation, not {args.benchmark}")
    check_model_path(args.checkpoint)
    check_folder(args.data, "--data", "a folder of images" if args.benchmark == "segmentation"
                 else "a folder with one subfolder per class")
    check_folder(args.masks, "--masks", "a folder with a PNG mask per image")


def main(argv: list[str] | None = None) -> int:
    from vit.predict import run_cli

    return run_cli(PROG, build_parser(), run, argv, check_args)


def command() -> None:
    """The console command (pyproject.toml) and ``python -m``: ``main()``'s status, with a fast, quiet exit."""
    from vit.cli import run_command

    run_command(main)


if __name__ == "__main__":
    command()
