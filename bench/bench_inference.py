"""Inference latency with ``output_attentions=True``: our ViT next to HF transformers' ViTForImageClassification.

Both models get the same config and the same weights (converted with ``vit.hf``), run on
the same inputs under ``torch.inference_mode`` with the same thread count, HF with its
eager attention (the path that returns attention probabilities). Calls alternate between
the two models so that background load slows both alike; the table shows the median of
the timed calls. Run from the repository root::

    python -m bench.bench_inference --threads 1 --quick
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script too: python bench/bench_inference.py
from vit.model import ViT, ViTConfig  # noqa: E402
from vit.sources.ports.families.hf import hf_config_kwargs, state_dict_from_hf  # noqa: E402


def build_pair(preset: str) -> tuple[torch.nn.Module, ViT]:
    """An HF model (eager attention) with random weights, and ours with the same weights."""
    import transformers  # only the benchmark and the parity tests need it

    torch.manual_seed(0)
    config = ViTConfig.from_preset(preset, layer_norm_eps=1e-12, drop_path=0.0)  # HF's eps, so outputs agree
    hf_config = transformers.ViTConfig(**hf_config_kwargs(config))
    hf_config._attn_implementation = "eager"
    hf = transformers.ViTForImageClassification(hf_config).eval()
    ours = ViT(config)
    ours.load_state_dict(state_dict_from_hf(hf.state_dict(), config.num_layers), strict=True)
    return hf, ours.eval()


def time_call(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_case(hf: torch.nn.Module, ours: ViT, batch: int, repeats: int, warmup: int,
               budget_s: float) -> dict:
    """Median seconds per call for both models; fewer repeats when one round would overrun ``budget_s``."""
    c = ours.config
    images = torch.randn(batch, c.num_channels, c.image_size, c.image_size)
    run_ours = lambda: ours(images, output_attentions=True)
    run_hf = lambda: hf(pixel_values=images, output_attentions=True)
    with torch.inference_mode():
        # The first warm-up round checks that both give the same answer and estimates a round's time.
        start = time.perf_counter()
        ours_logits, ours_attn = run_ours()
        hf_out = run_hf()
        round_s = time.perf_counter() - start
        max_diff = max([(ours_logits - hf_out.logits).abs().max().item()] +
                       [(a - b).abs().max().item() for a, b in zip(ours_attn, hf_out.attentions, strict=True)])
        del ours_logits, ours_attn, hf_out
        for _ in range(warmup - 1):
            run_ours()
            run_hf()
        repeats = max(1, min(repeats, int(budget_s // max(round_s, 1e-9))))
        ours_s, hf_s = [], []
        for i in range(repeats):
            # Alternate which model goes first, so neither always runs right after the other's frees.
            pair = [(ours_s, run_ours), (hf_s, run_hf)]
            for times, fn in pair if i % 2 == 0 else pair[::-1]:
                times.append(time_call(fn))
    return dict(ours=statistics.median(ours_s), hf=statistics.median(hf_s), repeats=repeats, max_diff=max_diff)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tintn-cifar10", "vit-base-16"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 64])
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per model and case")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per model and case (at least 1)")
    parser.add_argument("--budget", type=float, default=600.0,
                        help="seconds of timed calls per case; heavy cases get fewer repeats")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--quick", action="store_true", help="5 repeats, 1 warm-up, 120 s per case")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.warmup, args.budget = min(args.repeats, 5), 1, min(args.budget, 120.0)
    torch.set_num_threads(args.threads)

    print(f"torch {torch.__version__}, {args.threads} thread(s), output_attentions=True, float32, "
          f"inference_mode; median of up to {args.repeats} calls after {max(args.warmup, 1)} warm-up")
    header = (f"{'preset':<14} {'batch':>5} {'tokens':>6} {'runs':>4} {'ours ms':>10} {'HF ms':>10} "
              f"{'HF/ours':>8} {'max |diff|':>10}")
    print(header)
    print("-" * len(header))
    for preset in args.presets:
        hf, ours = build_pair(preset)
        for batch in args.batch_sizes:
            r = bench_case(hf, ours, batch, args.repeats, max(args.warmup, 1), args.budget)
            print(f"{preset:<14} {batch:>5} {ours.config.num_patches + 1:>6} {r['repeats']:>4} "
                  f"{r['ours'] * 1e3:>10.2f} {r['hf'] * 1e3:>10.2f} {r['hf'] / r['ours']:>8.2f} "
                  f"{r['max_diff']:>10.1e}", flush=True)
        del hf, ours


if __name__ == "__main__":
    main()
