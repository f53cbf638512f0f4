"""Accuracy of a checkpoint on an image folder: ``python -m vit.evaluate CHECKPOINT --data DIR``.

``DIR`` holds one subfolder per class, named as the checkpoint names its classes (images may
sit in nested folders below it); classes the folder lacks are simply not counted. Prints
JSON: ``{"accuracy": 0-1, "count": N, "per_class": {name: {"accuracy", "count"}},
"skipped": N, "checkpoint": PATH, "data": DIR}``. ``--size N`` evaluates on N-px squares instead of
the training size (position embeddings interpolated). A progress bar is drawn when stderr is a
terminal.

``--zero-shot`` asks a CLIP or SigLIP in words instead: the class names are the subfolders' names
(underscores read as spaces), each filled into ``--template`` (default "a photo of a {}."; "imagenet":
open_clip's 80-template ensemble), and an image counts as right when its own folder's name scores highest —
the accuracy open_clip's zero-shot classifier gives on the same images and templates.

Exit status: 0; 1 when some images could not be read (each is named on stderr,
the JSON covers the rest); 2 for invalid arguments, a missing or damaged checkpoint, an
unknown class folder or a folder without images.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

# Only what parsing needs: torch and the rest load once the arguments are read (--help answers at once).
from vit.predict import (
    OneLineParser,
    UsageError,
    add_size_arguments,
    check_folder,
    check_library_arguments,
    check_model_path,
    command_name,
    input_size,
    open_checkpoint,
    positive_int,
    resolve_device,
    run_cli,
    templates,
)

if TYPE_CHECKING:
    from vit.checkpoint import Checkpoint
    from vit.core.inference import InputSize

PROG = "vit.evaluate"


def build_parser() -> argparse.ArgumentParser:
    summary, details = __doc__.split("\n\n", 1)
    p = OneLineParser(prog=command_name(PROG), description=summary, epilog=details,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a .pt checkpoint, a Hugging Face or timm model folder, timm / torchvision "
                                      "weights, or a Hub id: ORG/NAME[@REV], hf-hub:ORG/NAME, a timm name")
    p.add_argument("--arch", metavar="LIB:NAME", help="architecture of bare weights: timm:NAME, torchvision:NAME, "
                   "dinov3:NAME, open_clip:quickgelu|gelu, scratch:num_heads=N or vit_pytorch:heads=N,...")
    p.add_argument("--data", required=True, metavar="DIR", help="a folder with one subfolder of images per class")
    p.add_argument("--batch-size", type=positive_int, default=64, help="images per forward pass (default 64)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the model runs (default auto: a GPU when there is one)")
    p.add_argument("--zero-shot", action="store_true",
                   help="a CLIP or SigLIP: classify by the subfolders' names in words instead of a classifier")
    p.add_argument("--template", metavar="TEXT",
                   help="with --zero-shot: where each class name goes, '{}' marking it (default 'a photo of a "
                        "{}.'; 'imagenet' for open_clip's 80-template ensemble)")
    add_size_arguments(p, keep_aspect=False)  # one shape per batch: a square size only
    return p


def labelled_files(root: Path, class_names: list[str]) -> list[tuple[Path, int]]:
    """``(image file, class index)`` for every image under ``root/<class>/``, sorted.

    Raises UsageError for a missing folder, a class folder the checkpoint does not know, or
    no images at all.
    """
    from vit.training.specs import image_files, list_class_folders, skipped_links

    if not root.is_dir():
        raise UsageError(f"--data {root} is not a folder; give a folder with one subfolder per class")
    folders = list_class_folders(root)
    unknown = [name for name in folders if name not in class_names]
    if unknown:
        split = set(unknown) & {"train", "val", "test"}
        hint = f"; pass one split's folder, e.g. {root / sorted(split)[-1]}" if split else ""
        known = ", ".join(class_names[:20]) + (", ..." if len(class_names) > 20 else "")
        raise UsageError(f"{root} has class folder(s) the checkpoint does not know: {', '.join(unknown)} "
                         f"(its classes: {known}){hint}")
    files = [(path, class_names.index(name)) for name in folders for path in image_files(root / name, root)]
    if not files:
        raise UsageError(f"no images in {root}; lay it out as {root}/<class>/<image>{skipped_links(root)}")
    return files


def evaluate(checkpoint: Checkpoint, files: list[tuple[Path, int]], batch_size: int = 64,
             progress: bool = False, size: InputSize | None = None) -> tuple[dict, list[str]]:
    """Accuracy overall and per class of ``(file, class index)`` pairs (at ``size``, None: the checkpoint's own);
    also the unreadable files' errors."""
    from vit.core.inference import TRAINING_SIZE, predict_files

    size = TRAINING_SIZE if size is None else size
    names = checkpoint.class_names
    correct, count = [0] * len(names), [0] * len(names)
    errors: list[str] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(files), unit="img", desc="evaluating", file=sys.stderr, dynamic_ncols=True)
    results = predict_files(checkpoint, [path for path, _ in files], top_k=1, output_attentions=False,
                            batch_size=batch_size, size=size)
    for (_, label), result in zip(files, results, strict=True):
        if result.prediction is None:
            errors.append(result.error)
        else:
            count[label] += 1
            correct[label] += int(result.prediction.class_index == label)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    total = sum(count)
    summary = {
        "accuracy": sum(correct) / total if total else None,
        "count": total,
        "per_class": {names[c]: {"accuracy": correct[c] / count[c], "count": count[c]}
                      for c in range(len(names)) if count[c]},
        "skipped": len(errors),
    }
    return summary, errors


def zero_shot_checkpoint(checkpoint: Checkpoint, root: Path, template: str | None) -> Checkpoint:
    """``checkpoint`` as a classifier over ``root``'s subfolder names in words (``--zero-shot``)."""
    from dataclasses import replace

    from vit.checkpoint import CheckpointError
    from vit.explain.language.prompts import PromptError, ask, prompt_checkpoint
    from vit.sources.vlm.text_tower import MAX_DATASET_CLASSES, check_labels, open_text_tower
    from vit.training.specs import list_class_folders

    if not root.is_dir():
        raise UsageError(f"--data {root} is not a folder; give a folder with one subfolder per class")
    folders = list_class_folders(root)
    try:
        labels = check_labels([name.replace("_", " ") for name in folders], MAX_DATASET_CLASSES)
        if len(labels) != len(folders):
            raise ValueError("two class folders read as the same name (or one as none)")
        prompts = ask(open_text_tower(checkpoint), labels, templates(template))
    except (CheckpointError, PromptError) as e:
        raise UsageError(str(e)) from None
    except ValueError as e:
        raise UsageError(f"--zero-shot: the class folders of {root}: {e}") from None
    # counted by folder: the words were only what the text tower read
    return replace(prompt_checkpoint(checkpoint, prompts), class_names=folders)


def run(args: argparse.Namespace) -> int:
    checkpoint = open_checkpoint(args.checkpoint, resolve_device(args.device), args.arch, library_road=True)
    check_library_arguments(checkpoint, args)  # the library's own model: its own classes, at its own input size
    if args.zero_shot:
        checkpoint = zero_shot_checkpoint(checkpoint, Path(args.data), args.template)
    elif args.template is not None:
        raise UsageError("--template goes with --zero-shot")
    if not checkpoint.class_names:
        raise UsageError(f"{args.checkpoint} has no classifier (a feature model); there is no accuracy to measure")
    files = labelled_files(Path(args.data), checkpoint.class_names)
    summary, errors = evaluate(checkpoint, files, args.batch_size, progress=sys.stderr.isatty(), size=input_size(args))
    for error in errors:
        print(f"{PROG}: skipped: {error}", file=sys.stderr)
    if summary["count"] == 0:
        raise UsageError(f"none of the {len(files)} images in {args.data} could be read")
    print(json.dumps({**summary, "checkpoint": str(args.checkpoint), "data": str(args.data)}, indent=2))
    return 1 if errors else 0


def check_paths(args: argparse.Namespace) -> None:
    """Before torch loads: the model exists (or is a Hub id), ``--arch`` names a library we read and ``--data`` is a
    folder."""
    from vit.sources.arch_names import check_arch

    check_model_path(args.checkpoint)
    check_arch(args.arch)
    check_folder(args.data, "--data", "a folder with one subfolder per class")


def main(argv: list[str] | None = None) -> int:
    return run_cli(PROG, build_parser(), run, argv, check_paths)


def command() -> None:
    """The console command (pyproject.toml) and ``python -m``: ``main()``'s status, with a fast, quiet exit."""
    from vit.core.cli import run_command

    run_command(main)


if __name__ == "__main__":
    command()
