"""A 16-frame 224-px VideoMAE-B clip (8 x 14 x 14 = 1,568 tubelet tokens): our forward with every layer's attention
next to transformers' eager ``VideoMAEForVideoClassification(output_attentions=True)`` on the same weights, and the
peak memory of the explorer's clip analysis with every map it draws (issue 65's speed and memory goals).

The model is VideoMAE-B's shape (12 layers, 768 wide, 12 heads, MLP 3,072, 16-px patches, tubelets of 2 frames)
with random weights (float32), ours opened from transformers' state dict by
``vit.sources.ports.families.video_ports.import_videomae``. Calls alternate so background load slows both alike; the
table gives medians, our time as a ratio of theirs and the median of each pair's ratio. The memory runs in a
subprocess after a warm-up clip: the analysis (one forward, every layer's hidden states kept), then each layer's
attention from the middle token and its token norms, one head's map, the rollout and the statistics, each frame's
map as the page draws them (``vit.explain.views.video.clip_map``). The peak is the resident set's high-water mark
(VmHWM, reset through /proc/self/clear_refs) over the resident set before the analysis, as tests/test_costs.py
measures it. Run from the repository root::

    python -m bench.bench_videomae --threads 1 --repeats 3
    python -m bench.bench_videomae --no-forward --methods   # the memory, each class's map too
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SHAPE = dict(image_size=224, patch_size=16, num_frames=16, tubelet_size=2, hidden_size=768, num_hidden_layers=12,
             num_attention_heads=12, intermediate_size=3072, num_labels=400)


def build(layers: int):
    """transformers' VideoMAE-B-shaped classifier (eager attention) and ours from its state dict."""
    import transformers

    from vit.sources.open import build_model
    from vit.sources.ports.families.video_ports import import_videomae

    config = transformers.VideoMAEConfig(**{**SHAPE, "num_hidden_layers": layers})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = transformers.VideoMAEForVideoClassification(config).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    ours_config = import_videomae.config_from_hf({**config.to_dict(),
                                                  "architectures": ["VideoMAEForVideoClassification"]})
    ours = build_model(ours_config, import_videomae.state_dict_from_hf(theirs.state_dict(), ours_config), "bench")
    return theirs, ours


WORKER = r'''
import json, sys, time
import numpy as np
import torch
from PIL import Image
sys.path.insert(0, sys.argv[2])
from bench.bench_highres import start_peak, status_mb
from bench.bench_videomae import build
from vit.checkpoint import Checkpoint, Preprocessing
from vit.explain.views.attention_maps import MapSettings
from vit.explain.views.video import analyse_clip, clip_map

_, ours = build(int(sys.argv[1]))
c = ours.config
checkpoint = Checkpoint(ours, [f"class {i}" for i in range(c.num_classes)],
                        Preprocessing(c.image_size, 3, (0.45, 0.45, 0.45), (0.225, 0.225, 0.225)))
rng = np.random.default_rng(0)
frames = [Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)) for _ in range(c.num_frames)]


def every_map():
    clip = analyse_clip(checkpoint, frames)
    middle = clip.analysis.num_tokens // 2
    for layer in range(clip.analysis.num_layers):
        clip_map(clip, MapSettings(layer=layer, query=middle))
        clip_map(clip, MapSettings(kind="norms", layer=layer))
    clip_map(clip, MapSettings(layer=-1, head=0, query=middle))
    clip_map(clip, MapSettings(kind="rollout", query=middle))
    clip.analysis.stats()
    return clip


def measured(work):
    """``work()``'s result, its peak RSS growth (bytes) and seconds."""
    since = start_peak()
    start = time.perf_counter()
    result = work()
    seconds = time.perf_counter() - start
    return result, (status_mb("VmHWM") - since) * 2**20, seconds


every_map()
clip, peak, seconds = measured(every_map)
out = {"peak": peak, "tokens": clip.analysis.num_tokens, "seconds": seconds, "methods": {}}
if sys.argv[3] == "1":  # each class's map on the same analysis, its own peak over the resident set before it
    from vit.costs import plan
    from vit.explain.views.video import explain_analysed
    from vit.model.layouts import folded_grid

    cam = lambda model, grid: plan.gradient(model, grid, "a CAM", layers=1)  # the last layer's, the default
    for method in ("legrad", "class", "attnlrp", "gradcam", "layercam", "eigencam"):
        _, peak, seconds = measured(lambda: explain_analysed(checkpoint, clip, method))
        cost = {"legrad": plan.legrad, "class": plan.class_map, "attnlrp": plan.attnlrp, "gradcam": cam,
                "layercam": cam, "eigencam": cam}[method](ours, folded_grid(clip.grid))
        verdict = plan.decide(cost)
        out["methods"][method] = {"peak": peak, "seconds": seconds, "path": verdict,
                                  "estimate": cost.memory if verdict == "run" else cost.chunked}
print(json.dumps(out))
'''


def memory(layers: int, threads: int, methods: bool) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "VIT_THREADS": str(threads),
           "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", WORKER, str(layers), str(ROOT), str(int(methods))],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode:
        raise SystemExit(done.stderr.strip().splitlines()[-1])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--no-forward", action="store_true", help="the memory alone")
    parser.add_argument("--methods", action="store_true", help="also each class's map (LeGrad, the class map, "
                        "AttnLRP) and the CAMs: its peak and the cost model's estimate of the path it takes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not args.no_forward:
        forward(args)
    if not args.no_memory:
        r = memory(args.layers, args.threads, args.methods)
        print(f"clip analysis and every map (each layer's attention and norms, a head, the rollout, the statistics):"
              f" peak RSS growth {r['peak'] / 2**20:,.0f} MB at {r['tokens']:,} tokens, {r['seconds']:,.1f} s")
        for method, m in r["methods"].items():
            print(f"{method}: peak RSS growth {m['peak'] / 2**20:,.0f} MB, the cost model's {m['path']} path "
                  f"{m['estimate'] / 2**20:,.0f} MB, {m['seconds']:,.1f} s")


def forward(args) -> None:
    theirs, ours = build(args.layers)
    x = torch.randn(1, 16, 3, 224, 224)
    times = {"ours": [], "theirs": []}
    with torch.inference_mode():
        ours(x, output_attentions=True)  # warm-up both
        theirs(pixel_values=x, output_attentions=True)
        for _ in range(args.repeats):
            start = time.perf_counter()
            expected = theirs(pixel_values=x, output_attentions=True)
            times["theirs"].append(time.perf_counter() - start)
            start = time.perf_counter()
            logits, attentions = ours(x, output_attentions=True)
            times["ours"].append(time.perf_counter() - start)
    difference = max((a - b).abs().max().item() for a, b in zip(attentions, expected.attentions, strict=True))
    t_ours, t_theirs = statistics.median(times["ours"]), statistics.median(times["theirs"])
    pairs = statistics.median(o / t for o, t in zip(times["ours"], times["theirs"], strict=True))
    print(f"VideoMAE-B shape, {args.layers} layers, 16 frames of 224 px (1,568 tokens), forward with every layer's "
          f"attention, {args.threads} thread(s), medians of {args.repeats}")
    print("| transformers eager | ours | ours / theirs | pairs | largest attention difference |")
    print("|---|---|---|---|---|")
    print(f"| {t_theirs * 1e3:,.0f} ms | {t_ours * 1e3:,.0f} ms | {t_ours / t_theirs:.2f}x | {pairs:.2f}x | "
          f"{difference:.1e} |", flush=True)


if __name__ == "__main__":
    main()
