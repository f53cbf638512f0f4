"""NaFlex images on different grids: one forward per image (what ``vit.predict`` does for a run of differing shapes)
next to one padded forward over all of them (``ViT.encode_padded``), on a SigLIP 2 NaFlex B/16 of random weights
at 256 patches. The images' aspects differ, so every grid differs; calls alternate so background load slows both
alike; medians, and the padded time as a ratio of one-at-a-time. Run from the repository root::

    python -m bench.bench_naflex_predict --repeats 3 --images 8

Measured (two CPU cores shared with 7 other helpers, load average 12.7 / 9.6 / 7.4; median of 3), 8 images of
243-256 tokens padded to 256:

    | one forward per image | 45808 ms |
    | encode_padded         | 26704 ms | 0.58x |  max |embedding diff| 1.3e-06
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script too
from vit.core.images import naflex_size  # noqa: E402
from vit.model import ViT, ViTConfig  # noqa: E402

ASPECTS = [(480, 640), (640, 480), (500, 333), (333, 500), (1000, 400), (400, 1000), (512, 512), (300, 900),
           (900, 300), (720, 1280), (1280, 720), (600, 800)]  # (height, width)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    config = ViTConfig(image_size=256, patch_size=16, num_classes=0, hidden_size=768, num_layers=12, num_heads=12,
                       mlp_size=3072, class_token=False, pooling="map", activation="gelu_tanh",
                       max_num_patches=256, pos_resize="bilinear", pos_embed_antialias=True)
    torch.manual_seed(0)
    model = ViT(config).eval()
    images = []
    for height, width in (ASPECTS * 4)[:args.images]:
        h, w = naflex_size(height, width, 16, 256)
        images.append(torch.randn(3, h, w))
    tokens = [x.shape[1] // 16 * x.shape[2] // 16 for x in images]
    print(f"{len(images)} images, tokens {tokens} (padded to {max(tokens)}); threads {torch.get_num_threads()}")
    alone, padded = [], []
    with torch.inference_mode():
        model.encode_padded(images[:2]), model.encode(images[0][None])  # warm-up
        for _ in range(args.repeats):
            start = time.perf_counter()
            a = [model.encode(x[None]).embedding for x in images]
            alone.append(time.perf_counter() - start)
            start = time.perf_counter()
            b = [e.embedding for e in model.encode_padded(images)]
            padded.append(time.perf_counter() - start)
    difference = max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))
    one, many = statistics.median(alone), statistics.median(padded)
    print(f"| one forward per image | {one * 1e3:7.0f} ms |\n| encode_padded         | {many * 1e3:7.0f} ms | "
          f"{many / one:.2f}x |  max |embedding diff| {difference:.1e}; load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
