"""Convert a model you have into our checkpoint: ``python -m vit.convert SOURCE --out FILE.pt [--arch timm:NAME]``.

SOURCE is a Hugging Face model folder (also a snapshot in the HF cache) or Hub id, a timm folder or
weights file, a torchvision ``vit_*`` state dict, or one of our checkpoints (see
``vit.sources.open``). The written file holds the weights, config, class names, preprocessing and
where it came from, and loads safely (``torch.load(weights_only=True)``). Prints one JSON
object: ``{"architecture", "parameters", "classes", "image_size", "patch_size",
"prefix_tokens"}``. Exit status: 0; 2 for a source that cannot be opened or invalid
arguments (one line on stderr).

Weights of a from-scratch ViT this program does not recognise: ``--inspect`` prints their structure and a draft
mapping (JSON: regular expressions from their keys to ours, the config fields their shapes tell, '?' for what
they cannot); save it, complete it, and convert with ``--map mapping.json --out FILE.pt``. With the model's own
code at hand, ``--verify module:Class --verify-args '{"dim": 64}'`` builds that class with those arguments, loads
the weights into it and prints how far our logits (and attentions, if its forward takes ``output_attentions``)
are from its own on random images. It imports and runs that module: use it on your own code only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vit.core.cli import OneLineParser, UsageError, command_name, run_cli  # light: torch loads in run(), after parsing

PROG = "vit.convert"


def build_parser() -> argparse.ArgumentParser:
    summary, details = __doc__.split("\n\n", 1)
    p = OneLineParser(prog=command_name(PROG), description=summary, epilog=details,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="a model folder or weights file, or a Hub id: ORG/NAME[@REV], hf-hub:ORG/NAME, "
                                  "a timm name")
    p.add_argument("--out", metavar="FILE.pt", help="where to write our checkpoint")
    p.add_argument("--arch", metavar="LIB:NAME",
                   help="architecture of a bare state dict: timm:NAME, torchvision:NAME, dinov3:NAME, "
                        "open_clip:quickgelu|gelu, scratch:num_heads=N or vit_pytorch:heads=N,...")
    p.add_argument("--inspect", action="store_true",
                   help="print the weights' structure and a draft mapping (JSON on stdout) instead of converting")
    p.add_argument("--map", metavar="MAPPING.json", help="convert by this mapping (from --inspect, completed)")
    p.add_argument("--verify", metavar="MODULE:CLASS",
                   help="compare with your model class (imported from the current folder): runs its code")
    p.add_argument("--verify-args", metavar="JSON", default="{}", help="keyword arguments for --verify's class")
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
    from vit.predict import open_checkpoint
    from vit.sources.open import open_mapped

    if args.inspect:
        return inspect(args.source)
    if not args.out:
        raise UsageError("--out FILE.pt is required (or --inspect to see the weights' structure)")
    if args.map:
        try:
            checkpoint = open_mapped(args.source, args.map)
        except CheckpointError as e:
            raise UsageError(str(e)) from None
    else:
        checkpoint = open_checkpoint(args.source, "cpu", args.arch, port_only="vit-convert writes our own ViT")
    weights = str(checkpoint.path or args.source)  # a folder's weights file, as opened
    checked = verify(checkpoint, weights, args.verify, args.verify_args) if args.verify else None
    metadata = {**checkpoint.metadata, "converted_from": str(args.source)}
    save_checkpoint(args.out, checkpoint.model, checkpoint.class_names, checkpoint.preprocessing, metadata=metadata)
    print(json.dumps(summary(checkpoint) | ({"verify": checked} if checked is not None else {})))
    return 0


def inspect(source: str) -> int:
    """Print one line describing the weights on stderr and the draft mapping (JSON) on stdout."""
    from vit.checkpoint import CheckpointError
    from vit.sources.open import open_source, read_weights
    from vit.sources.ports.libraries.mapping import describe, draft_mapping

    path = Path(source).expanduser()
    if path.exists():
        try:
            opened = open_source(path, map_location="meta")  # names and shapes only
        except CheckpointError:
            pass  # not a layout the program knows: draft a mapping below
        else:
            architecture = opened.metadata.get("architecture", "our checkpoint")
            print(f"{source} already opens as {architecture}, with no mapping: use it as it is, or convert it with "
                  f"python -m vit.convert {source} --out FILE.pt", file=sys.stderr)
            return 0
    try:
        state = read_weights(path, "meta")  # names and shapes only
    except CheckpointError as e:
        raise UsageError(str(e)) from None
    print(f"{source}: {describe(state)}", file=sys.stderr)
    print(json.dumps(draft_mapping(state), indent=2))
    return 0


def verify(checkpoint, source: str, target: str, arguments: str) -> dict:
    """Build the user's ``module:Class(**arguments)``, load the source weights into it strictly and compare its
    logits (and attentions, when its forward takes ``output_attentions``) with ours on random images."""
    import importlib
    import inspect as pyinspect
    import os
    from pathlib import Path

    import torch

    from vit.sources.open import read_weights

    module_name, _, class_name = target.partition(":")
    try:
        kwargs = json.loads(arguments)
        if not isinstance(kwargs, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        raise UsageError(f"--verify-args is not a JSON object of keyword arguments ({e})") from None
    def failed(what: str, error: BaseException) -> UsageError:  # the user's code: any failure in one line
        return UsageError(f"--verify {target}: {what} ({type(error).__name__}: "
                          f"{str(error).strip().splitlines()[0][:160] if str(error).strip() else ''})")

    sys.path.insert(0, os.getcwd())
    try:
        reference = getattr(importlib.import_module(module_name), class_name)(**kwargs).eval()
    except Exception as e:
        raise failed(f"cannot build it with --verify-args {arguments[:80]}", e) from None
    finally:
        sys.path.pop(0)
    weights = read_weights(Path(source).expanduser())
    problem = state_dict_difference(reference.state_dict(), weights)
    if problem:
        raise UsageError(f"--verify {target}: the weights do not fit it: {problem}; check --verify-args")
    try:
        reference.load_state_dict(weights, strict=True)
    except Exception as e:
        raise failed("cannot load the weights", e) from None
    config = checkpoint.config
    images = torch.randn(2, config.num_channels, *config.image_hw,
                         generator=torch.Generator().manual_seed(0))
    takes_attentions = "output_attentions" in pyinspect.signature(reference.forward).parameters
    with torch.no_grad():
        try:
            theirs = reference(images, output_attentions=True) if takes_attentions else reference(images)
        except Exception as e:
            raise failed(f"its forward fails on {config.num_channels}x{'x'.join(map(str, config.image_hw))} images, "
                         "the size the weights give ours", e) from None
        logits, attentions = checkpoint.model(images, output_attentions=True)
    their_logits = theirs[0] if isinstance(theirs, (tuple, list)) else theirs
    if not isinstance(their_logits, torch.Tensor) or their_logits.shape != logits.shape:
        shape = tuple(their_logits.shape) if isinstance(their_logits, torch.Tensor) else type(their_logits).__name__
        raise UsageError(f"--verify {target}: its forward returns {shape} where our logits are {tuple(logits.shape)}")
    report = {"max_logit_difference": float((logits - their_logits).abs().max())}
    their_attentions = theirs[1] if takes_attentions and isinstance(theirs, (tuple, list)) else None
    if their_attentions is not None:
        shapes = [tuple(a.shape) for a in their_attentions]
        if shapes != [tuple(a.shape) for a in attentions]:
            raise UsageError(f"--verify {target}: its {len(shapes)} attentions ({', '.join(map(str, shapes[:2]))}"
                             f"{', ...' if shapes[2:] else ''}) are not our {len(attentions)} of "
                             f"{tuple(attentions[0].shape)}")
        report["max_attention_difference"] = max(float((a - b).abs().max())
                                                 for a, b in zip(attentions, their_attentions, strict=True))
    else:
        report["max_attention_difference"] = None  # its forward does not return them
    return report


def state_dict_difference(expected: dict, weights: dict, shown: int = 2) -> str | None:
    """What keeps ``weights`` from loading strictly into a module whose state dict is ``expected``, in one line
    (keys it lacks, keys it has no place for, shapes that differ), or None."""
    def some(keys: list[str]) -> str:
        return ", ".join(keys[:shown]) + (f" and {len(keys) - shown} more" if keys[shown:] else "")

    parts = []
    if missing := [k for k in expected if k not in weights]:
        parts.append(f"they lack {some(missing)}")
    if unexpected := [k for k in weights if k not in expected]:
        parts.append(f"it has no place for {some(unexpected)}")
    if misfit := [k for k in weights if k in expected and tuple(weights[k].shape) != tuple(expected[k].shape)]:
        more = f" (and {len(misfit) - shown} more)" if misfit[shown:] else ""
        parts.append("; ".join(f"{k} is {tuple(weights[k].shape)} in the weights, {tuple(expected[k].shape)} in it"
                               for k in misfit[:shown]) + more)
    return "; ".join(parts) or None


def check_paths(args: argparse.Namespace) -> None:
    """Before torch loads: the source exists (or is a Hub id), ``--arch`` names a library we read, and ``--map``'s
    file exists."""
    from vit.predict import check_model_path
    from vit.sources.arch_names import check_arch

    check_model_path(args.source)
    check_arch(args.arch)
    if args.map is not None and not Path(args.map).is_file():
        raise UsageError(f"--map {args.map}: no such file; give the mapping --inspect drafted, completed")


def main(argv: list[str] | None = None) -> int:
    return run_cli(PROG, build_parser(), run, argv, check_paths)


def command() -> None:
    """The console command (pyproject.toml) and ``python -m``: ``main()``'s status, with a fast, quiet exit."""
    from vit.core.cli import run_command

    run_command(main)


if __name__ == "__main__":
    command()
