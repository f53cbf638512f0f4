"""A CLIP's late attention heads described by texts: ``python -m vit.describe_heads MODEL --data DIR``.

TextSpan (Gandelsman, Efros & Steinhardt, ICLR 2024; yossigandelsman/clip_text_span): each head of the last
``--layers`` layers is described by the ``--texts-per-head`` texts of a bank that best span what it writes into the
image embedding over the images of ``DIR`` (any depth; the authors use ImageNet's 50,000 validation images), each at
the model's own size. ``--texts FILE``: one description a line (default: the authors' 3,497 general image
descriptions). ``--rank``: the span the texts are projected on (their ``--w_ov_rank``). Prints JSON: per head its
texts, best first, and the share of its variance over the images they explain after each; a progress bar on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROG = "vit.describe_heads"  # not vit.textspan: that name is the notebook API's function


def build_parser() -> argparse.ArgumentParser:
    from vit.core.cli import OneLineParser, command_name, positive_int

    summary, details = __doc__.split("\n\n", 1)
    p = OneLineParser(prog=command_name(PROG), description=summary, epilog=details,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a CLIP with its text weights: an open_clip folder, an HF CLIPModel folder, "
                                      "or a Hub id")
    p.add_argument("--data", required=True, metavar="DIR", help="a folder of images (any depth)")
    p.add_argument("--texts", metavar="FILE", help="the text bank: one description a line, no longer than a text "
                   "tower reads (default: the authors')")
    p.add_argument("--layers", type=positive_int, default=8, help="the last layers described (default 8, theirs)")
    p.add_argument("--texts-per-head", type=positive_int, default=10, help="texts per head (default 10, theirs)")
    p.add_argument("--rank", type=positive_int, default=None,
                   help="rank of the span (default theirs: 80; a SigLIP's probe: the width)")
    p.add_argument("--limit", type=positive_int, default=None, metavar="N", help="use N images (seeded shuffle)")
    p.add_argument("--seed", type=int, default=0, help="for the shuffle (default 0)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="where the model runs")
    return p


def check_args(args: argparse.Namespace) -> None:
    """Before torch loads: the model exists (or is a Hub id), ``--data`` is a folder, ``--texts`` a file."""
    from vit.core.cli import UsageError, check_folder
    from vit.predict import check_model_path

    check_model_path(args.checkpoint)
    check_folder(args.data, "--data", "a folder of images")
    if args.texts is not None and not Path(args.texts).is_file():
        raise UsageError(f"--texts {args.texts}: no such file; give a text file with one description a line")


def run(args: argparse.Namespace) -> int:
    import random

    from tqdm import tqdm

    from vit.core.images import open_image
    from vit.explain.mechanism import textspan_run as textspan
    from vit.explain.mechanism.textspan import read_texts
    from vit.predict import UsageError, open_checkpoint, resolve_device
    from vit.sources.vlm.text_tower import open_text_tower
    from vit.training.specs import image_files

    files = image_files(Path(args.data))
    if not files:
        raise UsageError(f"no images in {args.data}; give a folder of images")
    if args.limit is not None and args.limit < len(files):
        files = sorted(random.Random(args.seed).sample(files, args.limit))
    texts = read_texts(args.texts)
    checkpoint = open_checkpoint(args.checkpoint, resolve_device(args.device),
                                 port_only="vit-describe-heads decomposes our own CLIP ViT's heads (TextSpan)")
    textspan.check_model(checkpoint)
    encode = open_text_tower(checkpoint).encode  # TextTowerError in one line before any image is read
    bar = tqdm(total=len(files) + len(texts), unit="item", desc="describe_heads", file=sys.stderr, dynamic_ncols=True)

    def progress(done: int, total: int) -> None:
        bar.update(done - bar.n)

    spans, _ = textspan.run(checkpoint, encode, (open_image(f) for f in files), len(files), texts, args.layers,
                            args.texts_per_head, args.rank, progress)
    bar.close()
    result = {"checkpoint": str(args.checkpoint), "data": str(args.data), "images": len(files),
              "texts": str(args.texts or "the authors' image_descriptions_general.txt"), "rank": args.rank,
              "heads": [{"layer": "probe" if s.probe else s.layer, "head": s.head, "texts": s.texts,
                         "variance_explained": s.variance_explained} for s in spans]}
    print(json.dumps(result, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    from vit.predict import run_cli

    return run_cli(PROG, build_parser(), run, argv, check_args)


def command() -> None:
    """The console command (pyproject.toml) and ``python -m``: ``main()``'s status, with a fast, quiet exit."""
    from vit.core.cli import run_command

    run_command(main)


if __name__ == "__main__":
    command()
