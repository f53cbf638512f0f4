"""Convert a model you have into our checkpoint: ``python -m vit.convert SOURCE --out FILE.pt [--arch timm:NAME]``.

SOURCE is a Hugging Face model folder (also a snapshot in the HF cache), a timm folder or
weights file, a torchvision ``vit_*`` state dict, or one of our checkpoints (see
``vit.sources.open``). The written file holds the weights, config, class names, preprocessing and
where it came from, and loads safely (``torch.load(weights_only=True)``). Prints one JSON
object: ``{"architecture", "parameters", "classes", "image_size", "patch_size",
"prefix_tokens"}``. Exit status: 0; 2 for a source that cannot be opened or invalid
arguments (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys

from vit.predict import OneLineParser, UsageError, run_cli  # light: torch loads in run(), after parsing

PROG = "vit.convert"


def build_parser() -> argparse.ArgumentParser:
    summary, details = __doc__.split("\n\n", 1)
    p = OneLineParser(prog=f"python -m {PROG}", description=summary, epilog=details,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="a model folder or weights file")
    p.add_argument("--out", required=True, metavar="FILE.pt", help="where to write our checkpoint")
    p.add_argument("--arch", metavar="LIB:NAME",
                   help="architecture of a bare state dict: timm:NAME, torchvision:NAME, dinov3:NAME or "
                        "open_clip:quickgelu|gelu")
    return p


def summary(checkpoint) -> dict:
    """The one-object JSON the CLI prints."""
    config = checkpoint.config
    return {"architecture": checkpoint.metadata.get("architecture", "vit"),
            "parameters": sum(p.numel() for p in checkpoint.model.parameters()),
            "classes": len(checkpoint.class_names), "image_size": checkpoint.preprocessing.image_size,
            "patch_size": config.patch_size, "prefix_tokens": config.num_prefix_tokens}


def run(args: argparse.Namespace) -> int:
    from vit.checkpoint import CheckpointError, save_checkpoint
    from vit.sources.open import open_source

    try:
        checkpoint = open_source(args.source, args.arch)
    except CheckpointError as e:
        raise UsageError(str(e)) from None
    metadata = {**checkpoint.metadata, "converted_from": str(args.source)}
    save_checkpoint(args.out, checkpoint.model, checkpoint.class_names, checkpoint.preprocessing, metadata=metadata)
    print(json.dumps(summary(checkpoint)))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(PROG, build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
