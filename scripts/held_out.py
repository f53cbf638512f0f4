"""Copy images of a training run's *validation* split (never trained on) into a folder of class subfolders.

    python scripts/held_out.py --dataset folder:data/cifar10 --val-fraction 0.1 --seed 0 --per-class 20 \
        --out data/cifar10-heldout

The split is the one ``vit.train --dataset folder:... --val-fraction F --seed S`` held out (``stratified_split`` over
the files in the order ``vit.training.data`` decodes them); ``--per-class`` of each class's validation images are
picked with ``--pick-seed`` and copied unchanged, so ``vit.evaluate`` and ``vit.faithfulness`` see the same pixels.
The README's faithfulness tables of the shipped CIFAR-10 checkpoint are measured on these.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere in the repo

from vit.training.data import folder_layout, image_files, parse_dataset, stratified_split  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, help="folder:PATH, as the training run's --dataset")
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0, help="the training run's --seed (fixes its split)")
    parser.add_argument("--per-class", type=int, default=20)
    parser.add_argument("--pick-seed", type=int, default=1, help="which validation images to copy")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    kind, value = parse_dataset(args.dataset)
    if kind != "folder":
        print("held_out: give --dataset folder:PATH", file=sys.stderr)
        return 2
    root, _, classes = folder_layout(value)
    files, labels = [], []
    for label, name in enumerate(classes):  # the order _decode_folder reads them in (every file readable)
        found = image_files(root / name, root)
        files += found
        labels += [label] * len(found)
    _, val = stratified_split(torch.tensor(labels), args.val_fraction, args.seed)
    generator = torch.Generator().manual_seed(args.pick_seed)
    for label, name in enumerate(classes):
        mine = val[torch.tensor(labels)[val] == label]
        (args.out / name).mkdir(parents=True, exist_ok=True)
        for i in mine[torch.randperm(len(mine), generator=generator)[:args.per_class]].tolist():
            shutil.copy2(files[i], args.out / name / files[i].name)
    print(f"copied {args.per_class} of each class's {len(val) // len(classes)} validation images into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
