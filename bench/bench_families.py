"""Inference with attentions on AIMv2 and Perception Encoder: ours next to the library's eager forward.

AIMv2: HF ``Aimv2VisionModel`` (eager attention, ``output_attentions=True``); PE: timm ``vit_pe_core_*`` with
its fused attention off (the explicit softmax a test hook reads). Both built by the library at ViT-B size with
random weights, saved natively and opened by path, so the weights are the same; calls alternate so background
load slows both alike; the table shows medians and our time as a ratio of theirs. Run from the repository root::

    python -m bench.bench_families --threads 2 --repeats 5

Measured (two CPU cores shared with other work, load average 7-10; medians of 5 and of 9 calls):

    | AIMv2 (HF eager, B/14 224 px)        | 4656 ms | 4244 ms | 0.91x |  (9 calls: 6599 / 6033 ms, 0.91x)
    | PE core (timm explicit, B/16 224 px) | 4305 ms | 4420 ms | 1.03x |  (9 calls: 4788 / 4313 ms, 0.90x)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script too
from vit.sources.open import open_source  # noqa: E402


def aimv2(folder: Path):
    import transformers

    config = transformers.Aimv2VisionConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                                            num_attention_heads=12, image_size=224, patch_size=14)
    config._attn_implementation = "eager"
    model = transformers.Aimv2VisionModel(config).eval()
    model.save_pretrained(folder)
    return "AIMv2 (HF eager, B/14 224 px)", lambda x: model(pixel_values=x, output_attentions=True), 224


def pe(folder: Path):
    import timm

    timm.layers.set_fused_attn(False)
    try:
        model = timm.create_model("vit_pe_core_base_patch16_224", pretrained=False).eval()
    finally:
        timm.layers.set_fused_attn(True)
    timm.models.save_for_hf(model, folder, safe_serialization=True)
    return "PE core (timm explicit, B/16 224 px)", model, 224


def beit_hf(folder: Path):
    import transformers

    config = transformers.BeitConfig(use_relative_position_bias=True, use_mean_pooling=True)  # BEiT-B/16, 224 px
    config._attn_implementation = "eager"
    model = transformers.BeitModel(config).eval()
    model.save_pretrained(folder)
    return "BEiT (HF eager, B/16 224 px)", lambda x: model(pixel_values=x, output_attentions=True), 224


def beit_timm(folder: Path):
    import timm

    timm.layers.set_fused_attn(False)
    try:
        model = timm.create_model("beit_base_patch16_224", pretrained=False).eval()
    finally:
        timm.layers.set_fused_attn(True)
    timm.models.save_for_hf(model, folder, safe_serialization=True)
    return "BEiT (timm explicit, B/16 224 px)", model, 224


def sam_hf(folder: Path):
    import transformers

    config = transformers.SamVisionConfig()  # SAM ViT-B: 1,024 px, windows of 14, global layers 2, 5, 8, 11
    config._attn_implementation = "eager"
    model = transformers.SamVisionModel(config).eval()
    model.save_pretrained(folder)
    return "SAM (HF eager, ViT-B 1,024 px)", lambda x: model(pixel_values=x, output_attentions=True), 1024


FAMILIES = {"aimv2": aimv2, "pe": pe, "beit-hf": beit_hf, "beit-timm": beit_timm, "sam": sam_hf}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--models", default=",".join(FAMILIES), help=f"some of {', '.join(FAMILIES)}")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("| model | theirs (ms) | ours (ms) | ours / theirs | load (1 min) |\n| --- | --- | --- | --- | --- |")
    for build in (FAMILIES[name] for name in args.models.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            torch.manual_seed(0)
            name, theirs, size = build(Path(tmp) / "model")
            ours = open_source(Path(tmp) / "model").model.eval()
        x = torch.randn(args.batch, 3, size, size)
        times: dict[str, list[float]] = {"theirs": [], "ours": []}
        with torch.inference_mode():
            theirs(x), ours.encode(x, output_attentions=True)  # warm-up
            for _ in range(args.repeats):
                for label in ("theirs", "ours"):
                    start = time.perf_counter()
                    theirs(x) if label == "theirs" else ours.encode(x, output_attentions=True)
                    times[label].append(time.perf_counter() - start)
        a, b = statistics.median(times["theirs"]) * 1e3, statistics.median(times["ours"]) * 1e3
        print(f"| {name} | {a:.0f} | {b:.0f} | {b / a:.2f}x | {os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
