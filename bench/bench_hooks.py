"""Inference with no hooks set, as the model's forward runs it: one checkout against another, side by side.

The hook points (``vit.model.HookPoint``) are identity modules on the one forward; with no hooks set they must
cost nothing measurable. This script times ``model(images)`` (the fused attention path) and
``model(images, output_attentions=True)`` and prints the medians; run it with ``PYTHONPATH`` set to each
checkout, alternating the two several times (each run also timed as a whole process, e.g. ``/usr/bin/time -v``),
and compare the printed medians (the forward alone)::

    PYTHONPATH=../baseline python bench/bench_hooks.py; PYTHONPATH=. python bench/bench_hooks.py  # repeat, in turn

Model: a random ViT-B/16 at 224 px (``--preset vit-base-16``) or the CIFAR preset for the per-call overhead.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vit.model import ViT, ViTConfig


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--preset", default="vit-base-16")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = ViT(ViTConfig.from_preset(args.preset)).eval()
    c = model.config
    images = torch.randn(args.batch, c.num_channels, c.image_size, c.image_size)
    for attentions in (False, True):
        times = []
        with torch.inference_mode():
            model(images, output_attentions=attentions)  # warm-up
            for _ in range(args.repeats):
                start = time.perf_counter()
                model(images, output_attentions=attentions)
                times.append(time.perf_counter() - start)
        print(f"{args.preset} batch {args.batch} output_attentions={attentions}: "
              f"median {statistics.median(times) * 1e3:.2f} ms over {args.repeats}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
