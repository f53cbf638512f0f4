"""Unpack the data these development machines ship into training folders under data/.

Users train on torchvision datasets or their own ``folder:`` datasets and never need this;
it exists to reproduce the shipped checkpoints from the machine-provided files:

    python scripts/prepare_data.py --shared ../shared/data --out data

gives ``data/cifar10/train/<class>/*.jpg`` (CIFAR-10's training split as JPEGs) and
``data/mnist-test/<digit>/*.png`` (the official MNIST *test* set, the only MNIST here).
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

MNIST_CLASSES = ["0 - zero", "1 - one", "2 - two", "3 - three", "4 - four", "5 - five", "6 - six", "7 - seven",
                 "8 - eight", "9 - nine"]  # torchvision's MNIST.classes


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (MNIST's format) as a numpy array: big-endian dims after a magic number."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def prepare_cifar10(shared: Path, out: Path) -> None:
    target = out / "cifar10"
    if (target / "train").is_dir():
        print(f"{target}/train exists; skipping")
        return
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(shared / "cifar10" / "train.tar.gz") as tar:
        tar.extractall(target, filter="data")
    print(f"extracted CIFAR-10 training split into {target}/train")


def prepare_mnist(shared: Path, out: Path) -> None:
    target = out / "mnist-test"
    if target.is_dir():
        print(f"{target} exists; skipping")
        return
    images = read_idx(shared / "mnist" / "t10k-images-idx3-ubyte.gz")
    labels = read_idx(shared / "mnist" / "t10k-labels-idx1-ubyte.gz")
    for name in MNIST_CLASSES:
        (target / name).mkdir(parents=True, exist_ok=True)
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        Image.fromarray(image, "L").save(target / MNIST_CLASSES[label] / f"{i:05d}.png")
    print(f"wrote {len(images)} MNIST test images into {target}/<digit>/")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", type=Path, default=Path("../shared/data"), help="the machine's data folder")
    parser.add_argument("--out", type=Path, default=Path("data"), help="where the training folders go")
    args = parser.parse_args()
    if not args.shared.is_dir():
        print(f"prepare_data: {args.shared} does not exist; pass --shared PATH", file=sys.stderr)
        return 2
    prepare_cifar10(args.shared, args.out)
    prepare_mnist(args.shared, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
