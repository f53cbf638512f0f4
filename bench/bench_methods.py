"""Cost of each map for one image, as a ratio to plain attention rollout run side by side.

Every method gets the same model and image and computes the map the explorer draws (CLS
query). Rollout (one forward pass with attentions, then the rollout) is the baseline; the
calls alternate so that background load slows all alike, and the table shows medians.
Models: the shipped CIFAR-10 checkpoint and a random ViT-B/16 (our ``vit-base-16`` preset).
Attention flow is timed only up to ``--flow-max-tokens`` tokens and with fewer repeats (it is
pure-Python max-flow: seconds for 65 tokens, minutes for 197). Run from the repository root::

    python -m bench.bench_methods --threads 1 --quick
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script too: python bench/bench_methods.py
from vit.explain.benchmarks.metrics import method_maps  # noqa: E402
from vit.model import ViT, ViTConfig  # noqa: E402

METHODS = ["rollout", "attention", "class", "legrad", "transformer_attribution", "attnlrp", "flow"]
SHIPPED = ROOT / "checkpoints" / "cifar10-cifar-s.pt"


def models() -> list[tuple[str, ViT]]:
    from vit.checkpoint import load_checkpoint

    torch.manual_seed(0)
    return [("cifar10-cifar-s (shipped)", load_checkpoint(SHIPPED).model.eval()),
            ("vit-base-16 (random)", ViT(ViTConfig.from_preset("vit-base-16")).eval())]


def time_call(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_model(model: ViT, methods: list[str], repeats: int, flow_repeats: int, flow_max_tokens: int
                ) -> dict[str, float]:
    """Median seconds per map for each method (one image, its predicted class)."""
    c = model.config
    image = torch.randn(1, c.num_channels, c.image_size, c.image_size)
    with torch.no_grad():
        predicted = model(image)[0].argmax(dim=-1)
    tokens = c.num_patches + model.num_prefix_tokens
    runnable = [m for m in methods if m != "flow" or tokens <= flow_max_tokens]
    calls = {m: (lambda m=m: method_maps(model, image, m, predicted)) for m in runnable}
    for m, fn in calls.items():  # warm-up (not flow: pure Python, minutes on big models)
        if m != "flow":
            fn()
    times: dict[str, list[float]] = {m: [] for m in runnable}
    for i in range(repeats):
        order = runnable if i % 2 == 0 else runnable[::-1]
        for m in order:
            if m == "flow" and i >= flow_repeats:
                continue
            times[m].append(time_call(calls[m]))
    return {m: statistics.median(t) for m, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per method")
    parser.add_argument("--flow-repeats", type=int, default=2, help="timed calls of attention flow")
    parser.add_argument("--flow-max-tokens", type=int, default=100,
                        help="time attention flow only up to this many tokens (197: about 6 minutes a map)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--quick", action="store_true", help="3 repeats, 1 of attention flow")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.flow_repeats = min(args.repeats, 3), 1
    if "rollout" not in args.methods:
        args.methods = ["rollout", *args.methods]
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), float32, one image; median of up to "
          f"{args.repeats} calls after one warm-up ({args.flow_repeats} for attention flow)")
    header = f"{'model':<28} {'method':<24} {'ms':>10} {'x rollout':>10}"
    print(header)
    print("-" * len(header))
    for name, model in models():
        result = bench_model(model, args.methods, args.repeats, args.flow_repeats, args.flow_max_tokens)
        for method in args.methods:
            if method not in result:
                print(f"{name:<28} {method:<24} {'skipped (--flow-max-tokens)':>21}")
                continue
            print(f"{name:<28} {method:<24} {result[method] * 1e3:>10.1f} {result[method] / result['rollout']:>10.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
