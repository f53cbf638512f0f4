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
import sys
from pathlib import Path

PROG = "vit.faithfulness"
# vit.explain.faithfulness's METHODS and REPLACEMENTS by name, for --help without torch (tests/test_faithfulness.py
# checks they are the same), so that an unknown method is refused before torch loads.
METHOD_NAMES = ("random", "attention", "rollout", "class", "legrad", "transformer_attribution", "attnlrp", "flow")
REPLACEMENTS = ("blur", "mean", "zero")
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
    p.add_argument("--data", required=True, metavar="DIR", help="a folder with one subfolder of images per class")
    p.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                   help=f"maps to score (default: all but flow); any of: {', '.join(METHOD_NAMES)}")
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
    return 1 if skipped else 0



def check_args(args: argparse.Namespace) -> None:
    """Before torch loads: the methods are known, the model exists (or is a Hub id) and ``--data`` is a folder."""
    from vit.cli import UsageError, check_folder
    from vit.predict import check_model_path

    unknown = [m for m in args.methods or () if m not in METHOD_NAMES]
    if unknown:
        raise UsageError(f"unknown method(s) {', '.join(unknown)}; choose from: {', '.join(METHOD_NAMES)}")
    check_model_path(args.checkpoint)
    check_folder(args.data, "--data", "a folder with one subfolder per class")


def main(argv: list[str] | None = None) -> int:
    from vit.predict import run_cli

    return run_cli(PROG, build_parser(), run, argv, check_args)


def command() -> None:
    """The console command (pyproject.toml) and ``python -m``: ``main()``'s status, with a fast, quiet exit."""
    from vit.cli import run_command

    run_command(main)


if __name__ == "__main__":
    command()
