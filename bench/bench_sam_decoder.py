"""A second click on SAM ViT-B (issue 81): the CPU time of ``vit.segment`` once the image's embedding is kept (what
the explorer's Prompts section runs per click), side by side with transformers' ``SamModel`` fed the same precomputed
``image_embeddings`` (what its predictor runs per click), on the same 640 x 480 photo and point.

- ours, click: ``vit.segment(checkpoint, image, points=[...])``, the embedding kept: the prompt mapped, the mask
  decoder (eager attention, its weights recorded by hooks), the masks put on the image, the seen region; the decoder
  on one thread (``vit.explain.methods.segment.DECODER_THREADS``) whatever ``--threads`` gives the process.
- theirs, decoder: ``SamModel(image_embeddings=..., input_points=..., input_labels=...)`` alone.
- theirs, click: that forward and ``post_process_masks`` (the masks on the image); the prompt's tensors made once
  before (this transformers' processor refuses a prompt without its image, which would preprocess the image again).
- theirs, decoder, 1 thread: the decoder alone with torch on one thread, as ours runs it.

Random weights at SAM ViT-B's shapes (``transformers.SamConfig()``: 1,024 px, a 64 x 64 embedding), saved whole with
its processor; the image encoder runs once (tens of seconds on this machine). Calls interleaved, each round in
another order; the ratios are medians of the per-round ratios of CPU seconds (``time.process_time``); the wall
seconds include any wait for a core other processes hold. Run from the repository root::

    python -m bench.bench_sam_decoder --threads 2 --repeats 15 --out bench/results/cpu-2026-11-26/sam-decoder.txt
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script too

POINTS = [(400, 180, 1), (120, 400, 0)]  # in the photo's pixels


def photo(width: int = 640, height: int = 480, seed: int = 0) -> Image.Image:
    """A smooth, photo-like image."""
    coarse = np.random.default_rng(seed).integers(0, 256, (height // 40, width // 40, 3), dtype=np.uint8)
    return Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)


def seconds(call) -> tuple[float, float]:
    """``(CPU seconds, wall seconds)`` of one call."""
    cpu, wall = time.process_time(), time.perf_counter()
    call()
    return time.process_time() - cpu, time.perf_counter() - wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers

    import vit

    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "sam-vit-b"
        torch.manual_seed(0)
        transformers.SamModel(transformers.SamConfig()).save_pretrained(folder)
        transformers.SamProcessor(image_processor=transformers.SamImageProcessor()).save_pretrained(folder)
        checkpoint = vit.load(folder, device="cpu")
        library = transformers.SamModel.from_pretrained(folder).eval()
        processor = transformers.SamProcessor.from_pretrained(folder)
        image = photo()
        started = time.perf_counter()
        first = vit.segment(checkpoint, image, points=POINTS)  # the image encoder runs here, once
        encode_s = time.perf_counter() - started
        from vit.explain.methods.segment import segmenter

        [(embedding, _)] = segmenter(checkpoint, None).embeddings.values()
        inputs = processor(images=image, input_points=[[[p[:2] for p in POINTS]]],
                           input_labels=[[[p[2] for p in POINTS]]], return_tensors="pt")
        prompt = {k: inputs[k] for k in ("input_points", "input_labels")}

        def ours() -> None:
            done = vit.segment(checkpoint, image, points=POINTS)
            assert done.embedding_reused

        def theirs_decoder() -> None:
            with torch.no_grad():
                library(image_embeddings=embedding, multimask_output=True, **prompt)

        def theirs_click() -> None:
            with torch.no_grad():
                out = library(image_embeddings=embedding, multimask_output=True, **prompt)
            processor.post_process_masks(out.pred_masks, inputs["original_sizes"], inputs["reshaped_input_sizes"])

        def theirs_decoder_one_thread() -> None:
            torch.set_num_threads(1)
            try:
                theirs_decoder()
            finally:
                torch.set_num_threads(args.threads)

        with torch.no_grad():
            out = library(image_embeddings=embedding, multimask_output=True, **prompt)
        diff = float((torch.from_numpy(first.scores) - out.iou_scores[0, 0]).abs().max())
        calls = {"ours, click": ours, "theirs, decoder": theirs_decoder, "theirs, click": theirs_click,
                 "theirs, decoder, 1 thread": theirs_decoder_one_thread}
        for call in calls.values():  # warm-up
            call()
        times: dict[str, list[float]] = {name: [] for name in calls}
        walls: dict[str, list[float]] = {name: [] for name in calls}
        names = list(calls)
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                cpu, wall = seconds(calls[name])
                times[name].append(cpu)
                walls[name].append(wall)
    ratios = {name: statistics.median(a / b for a, b in zip(times[name], times["ours, click"], strict=True))
              for name in names[1:]}
    lines = [f"# python -m bench.bench_sam_decoder --threads {args.threads} --repeats {args.repeats}   (issue 81)",
             "# Machine: the development machine, 2 logical CPUs shared with other engineers' work; "
             f"torch {torch.__version__} on the CPU, {args.threads} thread(s); transformers {transformers.__version__}",
             "# SAM ViT-B shapes (transformers.SamConfig(), random weights), a 640x480 photo, two points; the image "
             f"encoder ran once ({encode_s:.1f} s wall), every call below reuses its embedding",
             f"# ours' IoU scores vs theirs on the same embedding: max |diff| {diff:.1e}",
             "# Portable: the ratios (medians of the per-round ratios of CPU seconds). This machine and its load only: "
             "the seconds (medians).",
             f"# load average before: {' '.join(f'{v:.2f}' for v in load)}",
             "| call | CPU s (median) | wall s (median) | theirs / ours (CPU s) |", "|---|---|---|---|"]
    for name in names:
        ratio = "1.00" if name == "ours, click" else f"{ratios[name]:.2f}"
        cpu, wall = statistics.median(times[name]), statistics.median(walls[name])
        lines.append(f"| {name} | {cpu:.3f} | {wall:.3f} | {ratio} |")
    lines.append(f"# load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
