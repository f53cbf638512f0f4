"""Pick sample images for a shipped checkpoint from its *training* split and record what it predicts.

    python scripts/pick_samples.py checkpoints/cifar10-cifar-s.pt --dataset folder:data/cifar10 \
        --val-fraction 0.1 --seed 0 --per-class 1

Uses the same cached data and the same stratified split as the training run (so no sample is
from the validation split), writes ``checkpoints/samples/<stem>/<class>_<n>.png`` and a
``samples.json`` with the true label and the checkpoint's prediction for each, which the model
card lists and ``tests/test_shipped_checkpoints.py`` checks.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere in the repo

from vit.checkpoint import load_checkpoint  # noqa: E402
from vit.core.inference import predict  # noqa: E402
from vit.training.data import load_dataset  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0, help="the training run's --seed (fixes its split)")
    parser.add_argument("--per-class", type=int, default=1)
    parser.add_argument("--pick-seed", type=int, default=1, help="which training images to pick")
    args = parser.parse_args()

    checkpoint = load_checkpoint(args.checkpoint)
    pre = checkpoint.preprocessing
    data = load_dataset(args.dataset, pre.image_size, pre.num_channels, val_fraction=args.val_fraction,
                        seed=args.seed)
    out = args.checkpoint.parent / "samples" / args.checkpoint.stem
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):
        old.unlink()
    generator = torch.Generator().manual_seed(args.pick_seed)
    records = []
    for label, name in enumerate(data.class_names):
        idx = torch.nonzero(data.train.labels == label).flatten()
        for n, i in enumerate(idx[torch.randperm(len(idx), generator=generator)[:args.per_class]].tolist()):
            array = data.train.images[i].permute(1, 2, 0).squeeze(-1).numpy()
            image = Image.fromarray(array, "L" if array.ndim == 2 else "RGB")
            slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
            file = out / f"{slug}_{n + 1}.png"
            image.save(file)
            records.append({"file": file.name, "label": name})
    images = [Image.open(out / r["file"]) for r in records]
    for record, prediction in zip(records, predict(checkpoint, images, top_k=1, output_attentions=False),
                                  strict=True):
        record["predicted"], record["probability"] = prediction.top_k[0][0], round(prediction.top_k[0][1], 4)
    (out / "samples.json").write_text(json.dumps(records, indent=2) + "\n")
    right = sum(r["label"] == r["predicted"] for r in records)
    print(f"{len(records)} samples in {out}; {right} classified correctly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
