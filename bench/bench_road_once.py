"""A recorded layer computed once (issue 117, Speed): the library road's recording of every layer (the rollout's:
``LibraryModel.run(x, layers=all, heads_mean=True)``) against transformers' own eager ``output_attentions=True`` on
the same model and pixels, and the library road's sdpa forward with nothing recorded beside it; then one query's row
of the last layer (a CLS map): the largest attention tensor it forms (a spy on every softmax's input).

A ViT-MSN-S (a family the library road opens: 384 wide, 6 heads, 12 layers) with random weights, at 224 px /
16-px patches (197 tokens) and 518 px / 14-px patches (1,370 tokens). Calls interleaved A B C, C B A ... so
background load slows each alike; the median of each road and the median of the per-round ratios. The machine's
load average is written beside the numbers. Run from the repository root::

    python -m bench.bench_road_once --threads 1 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def load() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import torch
    import transformers
    from torch.overrides import TorchFunctionMode

    import vit
    from vit.core import attention_recorder

    torch.set_num_threads(args.threads)
    lines = [f"threads {args.threads}, repeats {args.repeats}, torch {torch.__version__}, "
             f"transformers {transformers.__version__}", f"load average before: {load()}"]
    for size, patch in ((224, 16), (518, 14)):
        torch.manual_seed(0)
        config = transformers.ViTMSNConfig(hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
                                        intermediate_size=1536, image_size=size, patch_size=patch, num_labels=10)
        with tempfile.TemporaryDirectory() as folder:
            transformers.ViTMSNForImageClassification(config).save_pretrained(folder)
            transformers.ViTImageProcessor(size={"height": size, "width": size}).save_pretrained(folder)
            road = vit.load(folder, device="cpu").model
            eager = transformers.ViTMSNForImageClassification.from_pretrained(
                folder, attn_implementation="eager").eval()
        x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
        L, T = 12, (size // patch) ** 2 + 1
        calls = {"road rollout": lambda road=road, x=x, L=L: road.run(x, layers=range(L), heads_mean=True),
                 "eager output_attentions": lambda eager=eager, x=x: eager(pixel_values=x, output_attentions=True),
                 "road, nothing recorded": lambda road=road, x=x: road.run(x)}
        times = {name: [] for name in calls}
        with torch.no_grad():
            for call in calls.values():
                call()  # warm-up
            for r in range(args.repeats):
                order = list(calls) if r % 2 == 0 else list(reversed(calls))
                for name in order:
                    start = time.perf_counter()
                    calls[name]()
                    times[name].append(time.perf_counter() - start)
            out, kept = road.run(x, layers=range(L))
            theirs = eager(pixel_values=x, output_attentions=True)
        gap = max(float((kept[i] - theirs.attentions[i]).abs().max()) for i in range(L))
        logits_gap = float((out.logits - theirs.logits).abs().max())
        ratios = [a / b for a, b in zip(times["road rollout"], times["eager output_attentions"], strict=True)]
        lines.append(f"\nViT-MSN-S/{patch} at {size} px ({T:,} tokens, 6 heads, 12 layers):")
        for name, t in times.items():
            lines.append(f"  {name:26s} median {statistics.median(t) * 1e3:8.1f} ms  "
                         f"({', '.join(f'{v * 1e3:.0f}' for v in t)})")
        by_medians = statistics.median(times["road rollout"]) / statistics.median(times["eager output_attentions"])
        lines.append(f"  road rollout / eager output_attentions: {statistics.median(ratios):.2f}x (median of the "
                     f"interleaved rounds' ratios; by medians {by_medians:.2f}x)")
        lines.append(f"  every layer's attention vs eager's: max |diff| {gap:.1e}; logits {logits_gap:.1e}")

        class Spy(TorchFunctionMode):
            largest = 0

            def __torch_function__(self, func, types, args=(), kwargs=None):
                if func in attention_recorder.SOFTMAX:
                    Spy.largest = max(Spy.largest, args[0].numel())
                return func(*args, **(kwargs or {}))

        with torch.no_grad(), Spy():
            road.run(x, layers=[L - 1], rows=[0])
        lines.append(f"  a CLS map's row (last layer): largest softmax input {Spy.largest:,} floats "
                     f"(= H x 1 x T = {6 * T:,}; the whole layer's H x T x T = {6 * T * T:,})")
        print("\n".join(lines[-6:]), flush=True)
    lines.append(f"\nload average after: {load()}")
    print(lines[-1])
    out_path = ROOT / "bench/results/cpu-2026-11-29/road-once.txt"
    out_path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
