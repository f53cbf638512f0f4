"""Decode a share of an image folder in a process of its own: ``python -m vit.training.decoding REQUEST``.

``vit.training.data`` decodes a folder of many images in several such processes at once, one per thread torch may
use: decoding a small image is mostly Python, which threads would run one at a time. Each process is a fresh
interpreter started by its module's name, so nothing of the caller runs again in it (``multiprocessing``'s spawn
re-runs a script's unguarded top level).

REQUEST is a JSON file ``{"files": [...], "image_size": S, "num_channels": C, "out": PREFIX}``. The process writes
``PREFIX.npy``, the images it decoded as one ``(n, C, S, S)`` uint8 array in the files' order, then ``PREFIX.json``,
``{"errors": [...]}`` with ``null`` for each file decoded and its one-line error for each that was not. The JSON is
written last, so its presence means that both files are whole.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def decode_share(files: list[str], image_size: int, num_channels: int) -> tuple[np.ndarray, list[str | None]]:
    """The images of ``files`` as ``vit.training.data.decode_file`` gives each, stacked, and each file's error
    (None where it decoded)."""
    import torch

    from vit.training.data import decode_file

    torch.set_num_threads(1)  # one process per core already
    images, errors = [], []
    for file in files:
        image = decode_file(Path(file), image_size, num_channels)
        if isinstance(image, str):
            errors.append(image)
        else:
            images.append(image.numpy())
            errors.append(None)
    shape = (0, num_channels, image_size, image_size)
    return (np.stack(images) if images else np.zeros(shape, np.uint8)), errors


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text())
    images, errors = decode_share(request["files"], int(request["image_size"]), int(request["num_channels"]))
    out = Path(request["out"])
    np.save(out.with_suffix(".npy"), images)
    out.with_suffix(".json").write_text(json.dumps({"errors": errors}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
