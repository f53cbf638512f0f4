"""Is a map faithful? Deletion, insertion and Chefer et al.'s tests; what each measures: ``vit.explain.faithfulness``.

``DIR`` holds one subfolder per class as for ``vit.evaluate``. ``--limit N`` takes N images
after a seeded shuffle, so a limit samples every class. Prints JSON: per method,
``deletion_auc`` and ``insertion_auc`` as ``{"mean", "std"}`` over the images, with a
progress bar on stderr.

``--benchmark segmentation --masks MASKS``: ``DIR`` a folder of images, ``MASKS`` a 0/non-0 PNG for each, of the same
file stem; or ``--data gtsegs_ijcv.mat`` alone, the paper's file of images and masks (MATLAB v7.3, read as their
``Imagenet_Segmentation``). ``--benchmark perturbation``: ``DIR`` as for deletion. ``--benchmark road`` and
``--benchmark saco`` (``--groups K``): ``DIR`` any folder of images. All print ``images_per_s`` per method, a table on
stderr, and with ``--out DIR`` write ``DIR/faithfulness.json``, ``DIR/faithfulness.md`` and ``DIR/faithfulness.png``.
Besides their own methods (``METHOD_NAMES``) they score any map ``vit.methods()`` draws for the model (the CAMs,
``lrp``, ...), image by image. Chefer et al.'s baselines are methods too: ``attn-gradcam`` (GradCAM on the last
attention), ``lrp-partial`` (the last attention's LRP relevance) and ``lrp-full`` (LRP to the pixels; read as pixels
by the segmentation and perturbation tests, as their full_lrp).
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
BENCHMARKS = ("deletion", "segmentation", "perturbation", "road", "saco")
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
                   help="a folder with one subfolder of images per class (segmentation, road, saco: a folder of "
                        "images; segmentation: or gtsegs_ijcv.mat)")
    p.add_argument("--benchmark", choices=BENCHMARKS, default="deletion",
                   help="deletion and insertion curves (default), Chefer et al.'s segmentation or perturbation test, "
                        "ROAD or SaCo")
    p.add_argument("--masks", metavar="DIR", help="segmentation: a 0/non-0 PNG per image, named by the image's stem")
    p.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                   help=f"maps to score, spaces or commas between (default: all but flow); any of: "
                        f"{', '.join(METHOD_NAMES)}, and (but for deletion) any map vit.methods() draws for the model")
    p.add_argument("--out", metavar="DIR",
                   help="also write DIR/faithfulness.json, .md (a table) and, for Chefer's tests, .png (a plot)")
    p.add_argument("--limit", type=positive_int, default=None, metavar="N", help="score N images (seeded shuffle)")
    p.add_argument("--replacement", choices=REPLACEMENTS, default="blur", help="what removed patches become")
    p.add_argument("--steps", type=positive_int, default=DEFAULT_STEPS,
                   help=f"steps per curve, each changing an equal share of the patches (default {DEFAULT_STEPS}: "
                        "5 %% each, whatever the grid; one per patch made ViT-S/16 take 196 steps x 14 curves per "
                        "image)")
    p.add_argument("--groups", type=positive_int, default=10, metavar="K",
                   help="saco: groups of pixels (default 10, the paper's)")
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
        return run_benchmark(args)
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


def open_mask(mask, hw: tuple[int, int]):
    """A 0/1 ``(H, W)`` long tensor of the PNG at ``mask`` (or a PIL image of one) resized to ``hw`` nearest (their
    ``Image.NEAREST``)."""
    import numpy as np
    import torch
    from PIL import Image

    from vit.cli import UsageError

    try:
        if isinstance(mask, Image.Image):
            mask = mask.convert("L").resize((hw[1], hw[0]), Image.NEAREST)
        else:
            with Image.open(mask) as image:
                mask = image.convert("L").resize((hw[1], hw[0]), Image.NEAREST)
    except OSError as e:
        raise UsageError(f"cannot read the mask {mask} ({e}); give a PNG, 0 for background") from None
    return torch.from_numpy((np.asarray(mask) > 0).astype(np.int64))


def check_methods(methods: list[str], checkpoint) -> None:
    """After the model loads: each method is the benchmark's own (``METHOD_NAMES``) or a map ``vit.methods()`` draws
    for this model; UsageError in one line otherwise."""
    from vit.cli import UsageError

    others = [m for m in methods if m not in METHOD_NAMES]
    if not others:
        return
    from vit.api import methods as drawn

    available = [m for m in drawn(checkpoint) if m not in METHOD_NAMES]
    unknown = [m for m in others if m not in available]
    if unknown:
        raise UsageError(f"unknown method(s) {', '.join(unknown)} for this model; choose from: "
                         f"{', '.join([*METHOD_NAMES, *available])}")


def method_maps(checkpoint, x, pixels, method: str, class_index, generator, as_pixels: bool = False):
    """``(B, gh, gw)`` maps of ``x`` (normalised) for each image's ``class_index``: the benchmark's own methods
    batched (``vit.explain.faithfulness.method_maps``), any other map of ``vit.methods()`` image by image as
    ``vit.explain`` draws it, on the same ``pixels (B, C, H, W)`` (uint8, already at the input's size: resized
    straight to it, not cropped again). ``as_pixels``: a method that maps the input's pixels (full LRP) gives its
    ``(B, H, W)`` map as it is."""
    from dataclasses import replace

    import numpy as np
    import torch

    from vit import api
    from vit.explain import faithfulness as bench
    from vit.explain.attention_maps import MAP_CONTROLS

    if method in bench.METHODS:
        return bench.method_maps(checkpoint.model, x, method, class_index, generator, pixels=as_pixels)
    straight = replace(checkpoint, preprocessing=replace(checkpoint.preprocessing, resize_size=None,
                                                         resize_mode="square"))
    reads_class = "class" in MAP_CONTROLS.get(method, ())
    maps = [api.explain(straight, image, method, target=int(c) if reads_class else None).map
            for image, c in zip(pixels, class_index.tolist(), strict=True)]
    return torch.from_numpy(np.stack(maps)).to(x.device)


def run_benchmark(args: argparse.Namespace) -> int:
    """``--benchmark segmentation``, ``perturbation``, ``road`` or ``saco`` (the module docstring)."""
    import time

    import numpy as np
    import torch
    from PIL import Image
    from tqdm import tqdm

    from vit.evaluate import labelled_files
    from vit.explain import faithfulness as bench
    from vit.explain.dataset import sample_files
    from vit.images import ImageError, normalize, open_image, to_uint8
    from vit.predict import UsageError, open_checkpoint, resolve_device
    from vit.training.data import image_files

    benchmark = args.benchmark
    checkpoint = open_checkpoint(args.checkpoint, resolve_device(args.device))
    methods = args.methods or list(bench.DEFAULT_METHODS)
    check_methods(methods, checkpoint)
    model = checkpoint.model.eval()
    device = next(model.parameters()).device
    p = checkpoint.preprocessing
    hw = tuple(p.image_hw)
    gtsegs = None
    if benchmark == "segmentation" and Path(args.data).is_file():  # gtsegs_ijcv.mat: images and masks in one file
        from vit.explain.gtsegs import GtSegs, GtSegsError

        try:
            gtsegs = GtSegs(args.data)
        except GtSegsError as e:
            raise UsageError(str(e)) from None
        try:
            gtsegs.check()  # every declared size before the work
        except GtSegsError as e:
            gtsegs.close()
            raise UsageError(str(e)) from None
        files = sample_files([(i, None) for i in range(len(gtsegs))], args.limit, args.seed)
    elif benchmark == "segmentation":
        files = sample_files(matched_masks(Path(args.data), Path(args.masks)), args.limit, args.seed)
    elif benchmark == "perturbation":
        files = sample_files(labelled_files(Path(args.data), checkpoint.class_names), args.limit, args.seed)
    else:  # ROAD and SaCo explain the predicted class and need no label
        files = sample_files([(path, None) for path in image_files(Path(args.data))], args.limit, args.seed)
        if not files:
            raise UsageError(f"no images in {args.data}; give a folder of images (--data)")
    zero = normalize(torch.zeros(1, p.num_channels, 1, 1, dtype=torch.uint8), p.mean, p.std)[0, :, 0, 0]  # black
    generator = torch.Generator().manual_seed(args.seed)
    noise = {m: torch.Generator().manual_seed(args.seed) for m in methods}  # ROAD's imputation noise, per method
    parts = {m: [] for m in methods}  # per batch: what each benchmark keeps of it (summed up below)
    intact, seconds, skipped = [], dict.fromkeys(methods, 0.0), 0
    bar = tqdm(total=len(files) * len(methods), unit="map", desc=benchmark, file=sys.stderr, dynamic_ncols=True)
    for start in range(0, len(files), args.batch_size):
        chunk, images, kept = files[start:start + args.batch_size], [], []
        for item in chunk:
            if gtsegs is not None:
                try:
                    image, mask = gtsegs.item(item[0])
                except GtSegsError as e:
                    raise UsageError(str(e)) from None
                images.append(image)
                kept.append((item[0], Image.fromarray(mask)))
                continue
            try:
                images.append(open_image(item[0]))
                kept.append(item)
            except ImageError as e:
                print(f"{PROG}: skipped: {e}", file=sys.stderr)
                skipped += 1
        if images:
            # resized to the input, no crop: Chefer's Resize((224, 224))
            pixels = torch.stack([to_uint8(image, hw, p.num_channels, resample=p.resample, backend=p.backend)
                                  for image in images])  # (B, C, H, W) uint8
            x = normalize(pixels, p.mean, p.std).to(device)
            with torch.no_grad():
                predicted = model(x)[0].argmax(dim=-1)
            if benchmark == "segmentation":
                masks = torch.stack([open_mask(mask, hw) for _, mask in kept])
            elif benchmark == "perturbation":
                target = torch.tensor([label for _, label in kept], device=device)
                intact.append((predicted == target).cpu().numpy().astype(np.float64))
            for method in methods:
                began = time.perf_counter()
                # their vis_class "top"; full LRP's pixels as they are in Chefer's tests (their full_lrp: no upsampling)
                maps = method_maps(checkpoint, x, pixels, method, predicted, generator,
                                   benchmark in ("segmentation", "perturbation"))
                if benchmark == "segmentation":
                    parts[method].append(bench.segmentation_counts(maps, masks))
                elif benchmark == "perturbation":
                    parts[method].append([bench.perturbation_hits(model, x, maps, target, zero, negative,
                                                                  args.batch_size) for negative in (False, True)])
                elif benchmark == "road":  # their ROADCombined's order: least relevant first, then most
                    parts[method].append([bench.road_scores(model, x, maps, predicted, most, generator=noise[method],
                                                            batch_size=args.batch_size) for most in (False, True)])
                else:
                    parts[method].append(bench.saco_coefficient(*bench.saco_groups(model, x, maps, predicted,
                                                                                   args.groups, args.batch_size)))
                seconds[method] += time.perf_counter() - began
                bar.update(len(images))
        bar.update((len(chunk) - len(images)) * len(methods))
    bar.close()
    if gtsegs is not None:
        gtsegs.close()
    count = len(files) - skipped
    if count == 0:
        raise UsageError(f"none of the {len(files)} images in {args.data} could be read")
    scores = {m: summary(benchmark, parts[m], np.concatenate(intact).mean() if intact else None) for m in methods}
    for method in methods:
        scores[method]["images_per_s"] = count / seconds[method] if seconds[method] else None
    result = {"checkpoint": str(args.checkpoint), "data": str(args.data), "benchmark": benchmark,
              "images": count, "explained_class": "predicted", "methods": scores}
    if benchmark == "segmentation":
        result["masks"] = str(args.masks)
    elif benchmark == "perturbation":
        result["removed"] = [0.0, *bench.PERTURBATION_STEPS]
        result["model_accuracy"] = float(np.concatenate(intact).mean())
    elif benchmark == "road":
        result["percentiles"] = list(bench.ROAD_PERCENTILES)
        result["removed"] = [(100 - q) / 100 for q in bench.ROAD_PERCENTILES]
        result["noise"] = bench.ROAD_NOISE
    else:
        result["groups"] = args.groups
    print(json.dumps(result, indent=2))
    text = table(result)
    print(text, file=sys.stderr)
    write_out(args.out, result, text)
    return 1 if skipped else 0


def summary(benchmark: str, parts: list, accuracy: float | None) -> dict:
    """One method's scores from its per-batch ``parts`` (see ``run_benchmark``)."""
    import numpy as np

    from vit.explain import faithfulness as bench

    if benchmark == "segmentation":
        return bench.segmentation_scores(*(np.concatenate(arrays) for arrays in zip(*parts, strict=True)))
    if benchmark == "perturbation":
        scores = {}
        for i, order in enumerate(("positive", "negative")):
            curve = np.concatenate([part[i] for part in parts], axis=1).mean(axis=1)  # (S,)
            scores[f"{order}_auc"] = bench.perturbation_auc(float(accuracy), curve)
            scores[f"{order}_accuracy"] = [float(accuracy), *map(float, curve)]
        return scores
    if benchmark == "road":
        least, most = (np.concatenate([part[i] for part in parts], axis=1) for i in (0, 1))  # (P, images)
        return {"most_relevant_first": float(most.mean()), "least_relevant_first": float(least.mean()),
                "combined": float(((least.mean(axis=0) - most.mean(axis=0)) / 2).mean()),
                "most_relevant_first_curve": most.mean(axis=1).tolist(),
                "least_relevant_first_curve": least.mean(axis=1).tolist()}
    coefficients = np.concatenate(parts)
    defined = coefficients[~np.isnan(coefficients)]
    return {"saco": float(defined.mean()) if len(defined) else None,
            "saco_std": float(defined.std()) if len(defined) else None,
            "undefined": int(np.isnan(coefficients).sum())}


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
    if result.get("benchmark", "deletion") != "deletion":
        plot(result, folder / "faithfulness.png")


def plot(result: dict, path: Path) -> None:
    """``--out``'s figure: the segmentation and SaCo scores as bars per method, the perturbation and ROAD curves per
    method."""
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
    elif result["benchmark"] == "saco":
        fig, ax = plt.subplots(figsize=(1.6 + 0.7 * len(methods), 3.6))
        ax.bar(range(len(methods)), [np.nan if s["saco"] is None else s["saco"] for s in methods.values()],
               yerr=[np.nan if s["saco_std"] is None else s["saco_std"] for s in methods.values()], capsize=3)
        ax.set_xticks(range(len(methods)), list(methods), rotation=30, ha="right")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_ylim(-1, 1)
        ax.set_ylabel(f"SaCo (K = {result['groups']}), mean ± std")
    elif result["benchmark"] == "road":
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
        for ax, order in zip(axes, ("most_relevant_first", "least_relevant_first"), strict=True):
            for method, scores in methods.items():
                ax.plot(result["removed"], scores[f"{order}_curve"], marker="o", ms=3,
                        label=f"{method} ({scores[order]:.3f})")
            ax.set_title(order.replace("_", " ") + " imputed")
            ax.set_xlabel("share of pixels imputed")
            ax.axhline(0, color="grey", lw=0.8)
            ax.legend(fontsize=7)
        axes[0].set_ylabel("change of the class probability")
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
    if unknown and args.benchmark == "deletion":  # the others also take vit.methods()' maps, checked once it loads
        raise UsageError(f"unknown method(s) {', '.join(unknown)}; choose from: {', '.join(METHOD_NAMES)} (the maps "
                         "of vit.methods() are scored by --benchmark segmentation, perturbation, road and saco)")
    if args.benchmark == "segmentation" and args.masks is None and not Path(args.data).is_file():
        raise UsageError("--benchmark segmentation needs --masks DIR: a PNG per image, named by the image's stem (or "
                         "--data gtsegs_ijcv.mat alone)")
    if args.benchmark != "segmentation" and args.masks is not None:
        raise UsageError(f"--masks is for --benchmark segmentation, not {args.benchmark}")
    check_model_path(args.checkpoint)
    if args.benchmark == "segmentation" and Path(args.data).is_file():
        if args.masks is not None:
            raise UsageError(f"--data {args.data} is a file (gtsegs_ijcv.mat holds the masks too): leave --masks out")
    else:
        check_folder(args.data, "--data", "a folder of images" if args.benchmark != "perturbation"
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
