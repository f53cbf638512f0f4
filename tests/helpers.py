"""Small generated datasets for tests: image folders in the layouts ``folder:PATH`` accepts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

# A colour per class, far apart so that even a tiny model separates them in a few steps.
CLASS_COLOURS = [(220, 40, 40), (40, 200, 60), (50, 60, 230), (230, 210, 40), (200, 50, 210), (40, 210, 210)]


def make_image_folder(root: str | Path, classes: Sequence[str] = ("cat", "dog"), per_class: int = 8,
                      size: int = 8, mode: str = "RGB", val_per_class: int = 0, seed: int = 0) -> Path:
    """Write ``per_class`` PNGs per class: ``root/<class>/<i>.png``, or with ``val_per_class`` the
    ``root/train/<class>/`` + ``root/val/<class>/`` layout. Each image is its class's colour plus
    noise; ``mode`` "L" gives greyscale files. Returns ``root``."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    splits = [("train", per_class), ("val", val_per_class)] if val_per_class else [("", per_class)]
    for split, count in splits:
        for c, name in enumerate(classes):
            folder = root / split / name if split else root / name
            folder.mkdir(parents=True, exist_ok=True)
            colour = np.array(CLASS_COLOURS[c % len(CLASS_COLOURS)], dtype=np.int16)
            for i in range(count):
                pixels = colour + rng.integers(-30, 31, size=(size, size, 3))
                image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
                (image.convert("L") if mode == "L" else image).save(folder / f"{i}.png")
    return root
