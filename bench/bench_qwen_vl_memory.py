"""The explorer's analysis of a Qwen2.5-VL tower and every map drawn from it, peak RSS: every layer's hidden states kept
whole (the baseline, the bound raised) next to the states kept every k-th layer under the bound (the cost model's path
in chunks, ``hidden.CheckpointedStates``), with the cost model's estimate of each.

Each path runs in its own subprocess, random weights (float32), after a warm-up at a small size: the analysis, then
each layer's attention for the middle patch and its token norms, one head's map, the rollout from the middle patch,
every head's statistics, then a word's visual logit lens (one forward and the merger, as ``vit.visual_logit_lens``
once the word's row is read; the row here random). The peak is the resident set's high-water mark (VmHWM, reset
through /proc/self/clear_refs) over the resident set before the analysis, as tests/test_costs.py measures it. Run
from the repository root::

    python -m bench.bench_qwen_vl_memory --depth 32 --width 320 --heads 2 --side 224 --limit 170

The real Qwen2.5-VL-7B tower (``--width 1280 --heads 16 --mlp 3420 --patch 14 --window 112 --side 1036 --out 3584``:
5,476 patches) is 2.7 GB of float32 weights and about 8 TFLOP a forward; the maps run its blocks about five times
more. On the 2-core development machine under other work (load 7-12) its 32 layers did not finish in 30 minutes;
``--depth 8 --globals 7`` keeps the real width and the 32-layer tower's seven windowed layers to one global
(bench/results/cpu-2026-11-25/qwen-vl-7b-1024px.txt). ``--no-baseline`` runs the path in chunks alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = r'''
import json, sys, time
import numpy as np
import torch
from PIL import Image
from bench.bench_highres import start_peak, status_mb
from vit.checkpoint import Checkpoint, Preprocessing
from vit.costs import plan
from vit.explain.views import attention_maps, image_analysis
from vit.explain.methods.visual_lens import lens_maps
from vit.core.inference import InputSize, preprocess
from vit.model import ViT
from vit.sources.vlm import import_qwen

vision, side, drawn = json.loads(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
torch.manual_seed(0)
model = ViT(import_qwen.config_from_hf({"model_type": "qwen2_5_vl", "vision_config": vision})).eval()
with torch.no_grad():
    for p in model.parameters():
        p.add_(torch.randn_like(p) * 0.05)
checkpoint = Checkpoint(model, [], Preprocessing(model.config.image_size, 3, (0.5,) * 3, (0.5,) * 3))


word = torch.randn(1, model.config.projector_dim)  # a word's input embedding (a row the lens would read)
seconds = {}


def every_map(side):
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8))
    start = time.perf_counter()
    analysis = image_analysis.analyse(checkpoint, image, InputSize(side))
    seconds["analysis"] = time.perf_counter() - start
    middle = analysis.num_tokens // 2
    for layer in range(analysis.num_layers) if drawn is None else drawn:
        attention_maps.attention_map(analysis, attention_maps.MapSettings(layer=layer, query=middle))
        attention_maps.attention_map(analysis, attention_maps.MapSettings(kind="norms", layer=layer))
    attention_maps.attention_map(analysis, attention_maps.MapSettings(layer=-1, head=0, query=middle))
    attention_maps.rollout_map(analysis, attention_maps.MapSettings(kind="rollout", query=middle))
    analysis.stats()
    seconds["maps"] = time.perf_counter() - start - seconds["analysis"]
    # the visual logit lens of a word, as vit.visual_logit_lens computes it once the word's row is read
    x = preprocess([image], checkpoint.preprocessing, InputSize(side), model.config.patch_size)
    with torch.inference_mode():
        projected = model.project(model.tokens(x)[0], analysis.grid)[0]  # (N, E)
        lens_maps(projected, word, analysis.grid, model.config.spatial_merge)
    seconds["lens"] = time.perf_counter() - start - seconds["analysis"] - seconds["maps"]
    return analysis


every_map(2 * vision["window_size"])
since = start_peak()
analysis = every_map(side)
peak = (status_mb("VmHWM") - since) * 2**20
cost = plan.analysis(model, analysis.grid)
estimate = cost.memory if plan.decide(cost) == "run" else cost.chunked
print(json.dumps({"peak": peak, "estimate": estimate, "every": getattr(analysis.hidden, "every", 1),
                  "tokens": analysis.num_tokens, "seconds": sum(seconds.values()), "stages": seconds}))
'''


def measure(vision: dict, side: int, limit_mb: float, threads: int, layers: list[int] | None = None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "VIT_THREADS": str(threads),
           "VIT_ANALYSIS_MEMORY_MB": str(limit_mb), "VIT_MAX_TOKENS": "2000000",
           "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", WORKER, json.dumps(vision), str(side), json.dumps(layers)],
                          capture_output=True,
                          text=True, env=env, cwd=ROOT)
    if done.returncode:
        raise SystemExit(done.stderr.strip().splitlines()[-1])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=32)
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--mlp", type=int, default=0, help="the SwiGLU's width (0: 1.5 x the width)")
    parser.add_argument("--patch", type=int, default=4)
    parser.add_argument("--window", type=int, default=32, help="px (8 x 8 patches, as the 7B's 112 px in 14-px ones)")
    parser.add_argument("--side", type=int, default=224, help="px, a multiple of 2 x the patch")
    parser.add_argument("--limit", type=float, default=170, help="VIT_ANALYSIS_MEMORY_MB of the path in chunks")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--globals", type=int, nargs="*", default=None,
                        help="the global layers (default: one every quarter of the depth, the last of each)")
    parser.add_argument("--layers", type=int, nargs="*", default=None,
                        help="the layers whose attention and norms maps are drawn (default: every layer; the rollout "
                        "and the statistics always read every layer)")
    parser.add_argument("--out", type=int, default=24, help="the merger's output width (the 7B's LM: 3,584)")
    parser.add_argument("--no-baseline", action="store_true", help="only the path in chunks (the baseline keeps "
                        "every state: at the 7B's size that is the analysis run twice)")
    args = parser.parse_args()
    vision = dict(depth=args.depth, hidden_size=args.width, intermediate_size=args.mlp or args.width * 3 // 2,
                  num_heads=args.heads, out_hidden_size=args.out, patch_size=args.patch, spatial_merge_size=2,
                  window_size=args.window, fullatt_block_indexes=args.globals if args.globals is not None
                  else list(range(args.depth // 4 - 1, args.depth, args.depth // 4)))
    whole = None if args.no_baseline else measure(vision, args.side, 1e6, args.threads, args.layers)
    chunks = measure(vision, args.side, args.limit, args.threads, args.layers)
    print(f"Qwen2.5-VL tower, {args.depth} layers x {args.width} wide, {args.heads} heads, {args.side} px "
          f"({chunks['tokens']:,} tokens); analysis, "
          f"{'every layer' if args.layers is None else 'layers ' + ', '.join(map(str, args.layers))}'s attention "
          "and norms, the rollout, the "
          "statistics, then a word's visual logit lens (one forward and the merger)")
    print("| path | states kept | peak RSS | estimate | time (analysis + maps + lens) |")
    print("|---|---|---|---|---|")
    rows = [("every state (baseline)", whole)] if whole else []
    for name, r in rows + [(f"in chunks, bound {args.limit:g} MB", chunks)]:
        stages = " + ".join(f"{r['stages'][k]:,.1f}" for k in ("analysis", "maps", "lens"))
        print(f"| {name} | every {r['every']} layers | {r['peak'] / 2**20:,.0f} MB | {r['estimate'] / 2**20:,.0f} MB "
              f"| {r['seconds']:,.1f} s ({stages}) |")
    if whole:
        print(f"peak in chunks / baseline: {chunks['peak'] / whole['peak']:.2f}x; time: "
              f"{chunks['seconds'] / whole['seconds']:.2f}x")


if __name__ == "__main__":
    main()
