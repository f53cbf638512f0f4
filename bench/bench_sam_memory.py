"""SAM ViT-B's image encoder at 1,024 px (a 64 x 64 grid, 4,096 tokens) within the analysis memory bound
(``vit.costs.bounds.ANALYSIS_MEMORY_LIMIT``, 1 GB): the working memory of its plain forward, of the forward that keeps
the hidden states, and of each view read from them (one head's row and the heads' mean of one query in a global
layer and in a windowed one, the rollout row through all twelve layers).

Each measurement runs in its own fresh process (so each peak is its own): the working memory is the peak resident
set (VmHWM, cleared through /proc/self/clear_refs once the model is built) minus the resident set then, as in
``bench_highres``; tracemalloc does not see torch's allocations. Random weights: the memory is the shapes'. Run from
the repository root::

    python -m bench.bench_sam_memory --threads 1

Measured (2026-11-24, 2 shared cores, one thread; working memory in MB against the 1,024 MB bound). Before: commit
6759b96, the global layers' bias formed whole (12 x 4,096 x 4,096, 805 MB), load 3-6; after: 3a55376, the bias
formed per query chunk of the fused path, load 6-9 (the times are the machine's load as much as the method's):

    | measure     | before MB | after MB | before s | after s |
    | forward     |       967 |      339 |     83.3 |    83.2 |
    | hidden      |     1,111 |      437 |     94.6 |    37.1 |
    | head-global |     1,092 |      459 |     48.8 |    64.5 |
    | mean-global |     1,092 |      459 |     17.3 |    48.5 |
    | head-window |     1,080 |      457 |     51.0 |    83.6 |
    | rollout     |     1,111 |      669 |    113.3 |   140.7 |
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script too
from bench.bench_highres import reset_peak, rss_mb, status_mb  # noqa: E402
from vit.costs.bounds import ANALYSIS_MEMORY_LIMIT  # noqa: E402
from vit.model import ViT, ViTConfig  # noqa: E402

SAM_B = dict(image_size=1024, patch_size=16, hidden_size=768, num_layers=12, num_heads=12, mlp_size=3072,
             num_classes=0, class_token=False, pooling="avg", final_norm=False, rel_pos="sam", window_size=14,
             global_layers=(2, 5, 8, 11))
GLOBAL, WINDOWED, HEAD = 5, 4, 3  # a global layer, a windowed one, a head
MEASURES = ("forward", "hidden", "head-global", "mean-global", "head-window", "rollout")


def measure(what: str, size: int) -> dict:
    """One measurement in this process: wall time and working memory from the image tensor to the result."""
    from vit.explain.methods.chunked import LayerInputs
    from vit.explain.methods.hidden import forward_with_hidden_states

    torch.manual_seed(0)
    model = ViT(ViTConfig(**SAM_B)).eval()
    images = torch.randn(1, 3, size, size)
    grid = model.patch_grid(size, size)
    query = (grid[0] * 30 // 64) * grid[1] + grid[1] * 45 // 64  # an inner patch: (30, 45) at 1,024 px
    gc.collect()
    reset_peak()
    base = status_mb("VmRSS")
    start = time.perf_counter()
    with torch.inference_mode():
        if what == "forward":
            out = model.encode(images).embedding[0]
        else:
            _, hidden = forward_with_hidden_states(model, images)
            inputs = LayerInputs(model, hidden, grid)
            if what == "hidden":
                out = hidden[0, -1, 0]
            elif what == "head-global":
                out = inputs.rows(GLOBAL, [query], heads=[HEAD])[0, 0, 0]
            elif what == "mean-global":
                out = inputs.fused(GLOBAL, query)[0]
            elif what == "head-window":
                out = inputs.rows(WINDOWED, [query], heads=[HEAD])[0, 0, 0]
            else:
                out = inputs.rollout_row(query, num_prefix_tokens=0)[0]
    seconds = time.perf_counter() - start
    return {"what": what, "seconds": seconds, "peak_mb": rss_mb(), "work_mb": status_mb("VmHWM") - base,
            "sum": float(out.float().sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--measures", default=",".join(MEASURES))
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.one:
        print(json.dumps(measure(args.one, args.size)))
        return
    bound = ANALYSIS_MEMORY_LIMIT / 2**20
    print(f"SAM ViT-B (random weights) at {args.size} px, {args.threads} thread(s); bound {bound:,.0f} MB")
    print(f"{'measure':12} {'s':>8} {'peak MB':>9} {'work MB':>9} {'within':>7}")
    for what in args.measures.split(","):
        done = subprocess.run([sys.executable, "-m", "bench.bench_sam_memory", "--size", str(args.size),
                               "--threads", str(args.threads), "--one", what],
                              cwd=ROOT, capture_output=True, text=True, check=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{what:12} {r['seconds']:8.1f} {r['peak_mb']:9.0f} {r['work_mb']:9.0f} "
              f"{'yes' if r['work_mb'] <= bound else 'NO':>7}", flush=True)


if __name__ == "__main__":
    main()
