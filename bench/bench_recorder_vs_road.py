"""The generic recorder against the library road, side by side on the same model (issue 117, Speed: "a map from the
generic recorder within 10 % of the library road's time and memory on the families both open").

Each family is built twice from the same weights: one object opened by ``vit.load(model)`` (the library road:
transformers' recording attention function, timm's explicit path for the asked layers) and one by ``vit.load(model,
grid=..., prefix=...)`` (the recorder at the attention function, ``recorded_road``: a ``TorchFunctionMode`` at
``F.scaled_dot_product_attention``). Two maps each: a CLS map (the last layer, one query's row) and a rollout (every
layer, the heads' mean). Time: CPU seconds of the call (one thread), the calls interleaved A B, B A ... so background
load slows each alike; the median of the per-round ratios. Memory: the call's peak of CPU memory allocated over
what was live before it (torch's profiler's allocation events, ``peak_mb``). The two roads' maps are checked equal
first. Run from the repository root::

    python -m bench.bench_recorder_vs_road --repeats 7 --out bench/results/cpu-2026-11-29/recorder-vs-road.txt
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIDE, PATCH, LAYERS, WIDTH, HEADS = 224, 16, 12, 384, 6  # a ViT-S/16 at 224 px: 197 tokens
FAMILIES = ("transformers ViT-S/16", "timm ViT-S/16")
MAPS = ("CLS map (last layer, row 0)", "rollout (every layer, heads' mean)")
STATS = dict(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def build(family: str):
    """The family's model, random weights from a fixed seed (the same each call)."""
    import torch

    torch.manual_seed(0)
    if family.startswith("transformers"):
        import transformers

        config = transformers.ViTConfig(hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                        intermediate_size=4 * WIDTH, image_size=SIDE, patch_size=PATCH,
                                        num_labels=10)
        return transformers.ViTForImageClassification(config).eval()
    import timm

    return timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=10).eval()


def opened(family: str, road: str):
    import vit

    model = build(family)
    if road == "library road":
        checkpoint = vit.load(model, **STATS)
        assert type(checkpoint.model).__name__ != "ModuleModel", type(checkpoint.model)
    else:
        checkpoint = vit.load(model, image_size=SIDE, grid=(SIDE // PATCH, SIDE // PATCH), prefix=1, **STATS)
        assert type(checkpoint.model).__name__ == "ModuleModel", type(checkpoint.model)
    return checkpoint.model


def work(wrapped, which: str, x):
    if which.startswith("CLS"):
        return wrapped.run(x, layers=[LAYERS - 1], rows=[0])[1][LAYERS - 1]
    kept = wrapped.run(x, layers=range(LAYERS), heads_mean=True)[1]
    return {k: v for k, v in kept.items()}


def pixels():
    import torch

    return torch.randn(1, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(1))


def peak_mb(wrapped, which: str, x) -> float:
    """The call's peak of CPU memory allocated over what was live before it, in MB: torch's profiler's allocation
    events (each op's own allocations less its frees), summed in the order they start, at their highest."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        work(wrapped, which, x)
    live = high = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        high = max(high, live)
    return high / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    load = Path("/proc/loadavg").read_text().split(" ", 3)[:3]
    lines = [f"Command: python -m bench.bench_recorder_vs_road --repeats {args.repeats}",
             f"torch {torch.__version__}, one thread, {args.repeats} interleaved rounds; load average {load}",
             f"A ViT-S/16 ({LAYERS} layers, {HEADS} heads, {WIDTH} wide) at {SIDE} px ({(SIDE // PATCH) ** 2 + 1} "
             "tokens), random weights; each family opened by the library road and by the generic recorder", ""]
    for family in FAMILIES:
        roads = {road: opened(family, road) for road in ("library road", "generic recorder")}
        x = pixels()
        for which in MAPS:
            with torch.no_grad():
                a, b = (work(w, which, x) for w in roads.values())
            pairs = zip(a.values(), b.values(), strict=True) if isinstance(a, dict) else [(a, b)]
            gap = max(float((p - q).abs().max()) for p, q in pairs)
            times = {road: [] for road in roads}
            with torch.no_grad():
                for road in roads:
                    work(roads[road], which, x)  # warm-up
                for r in range(args.repeats):
                    for road in (list(roads) if r % 2 == 0 else list(reversed(roads))):
                        start = time.process_time()
                        work(roads[road], which, x)
                        times[road].append(time.process_time() - start)
            ratios = [g / lib for g, lib in zip(times["generic recorder"], times["library road"], strict=True)]
            peaks = {road: peak_mb(roads[road], which, x) for road in roads}
            lines.append(f"{family}, {which}: maps equal to {gap:.1e}")
            for road in roads:
                lines.append(f"  {road:17s} CPU median {statistics.median(times[road]) * 1e3:7.1f} ms  "
                             f"({', '.join(f'{v * 1e3:.0f}' for v in times[road])});  peak allocated "
                             f"{peaks[road]:6.1f} MB")
            ratio = statistics.median(ratios)
            memory = peaks["generic recorder"] / peaks["library road"] if peaks["library road"] > 0 else float("nan")
            lines.append(f"  generic / library: time {ratio:.2f}x (median of the rounds' ratios), peak {memory:.2f}x")
            print("\n".join(lines[-4:]), flush=True)
    lines.append(f"\nload average after: {Path('/proc/loadavg').read_text().split(' ', 3)[:3]}")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
