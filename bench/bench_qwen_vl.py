"""Qwen2.5-VL's vision tower with attentions: ours next to transformers' eager forward on the same weights.

transformers' ``Qwen2_5_VisionTransformerPretrainedModel`` (eager attention: its ``eager_attention_forward`` forms
every window's probabilities, kept here by a spy as ours are returned) at the real width (1,280 wide, 16 heads,
SwiGLU 3,420) with fewer layers (``--depth``, a global layer every fourth as in the 32-layer tower's 7, 15, 23, 31),
random weights; ours opened from its state dict by ``vit.sources.vlm.import_qwen``. Calls alternate so background load
slows both alike; the table shows medians, our time as a ratio of theirs, and the median of each pair's ratio.
Run from the repository root::

    python -m bench.bench_qwen_vl --threads 1 --repeats 5 --depth 8 --sizes 448x448 672x896
    python -m bench.bench_qwen_vl --memory --repeats 2 --depth 8 --globals 7 --sizes 448x448 672x672

``--memory``: the working memory of each forward with every layer's attention kept, each in a fresh process
(bench/results/cpu-2026-11-25/qwen-vl-memory.txt).

Measured 2026-11-25 on the development machine (two cores shared with other helpers' work), one thread,
``--repeats 3 --depth 8`` (layers 3 and 7 global), load average 2.6 rising to 6.6:

    | Qwen2.5-VL tower, 8 layers, 448x448 px (1,024 tokens) |  5,923 ms |  5,454 ms | 0.92x | pairs 0.90x |
    | Qwen2.5-VL tower, 8 layers, 672x896 px (3,072 tokens) | 26,458 ms | 27,562 ms | 1.04x | pairs 0.92x |

(transformers' time first, ours second). At 1,036 x 1,036 px (Qwen's 1,024 px, 5,476 tokens), ``--depth 8
--globals 7 --repeats 3`` (the 32-layer tower's seven windowed layers to one global), our merger included, one
thread, load 4-12 from other work, 2026-11-25:

    | Qwen2.5-VL tower, 8 layers (global 7), 1036x1036 px (5,476 tokens) | 20,670 ms | 21,279 ms | 1.03x | pairs 0.96x |

so the 32 layers are about four times that, ~83 s each (bench/results/cpu-2026-11-25/qwen-vl-7b-1024px.txt). The
32-layer tower at 1,024 x 1,024 px (5,476 tokens) is beyond a
two-core machine's patience; at that size the explorer's analysis would need ~1.5 GB with its 33 hidden states kept
(925 MB), and keeps them every 4 layers instead within the default 1 GB bound (bench/bench_qwen_vl_memory.py).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def build(depth: int, globals_: list[int] | None = None):
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl

    from vit.sources.open import build_model
    from vit.sources.vlm import import_qwen

    vision = dict(depth=depth, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                  fullatt_block_indexes=list(range(3, depth, 4)) if globals_ is None else globals_)
    config = Qwen2_5_VLConfig(vision_config=vision)
    config.vision_config._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = modeling_qwen2_5_vl.Qwen2_5_VisionTransformerPretrainedModel(config.vision_config).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    ours_config = import_qwen.config_from_hf({"model_type": "qwen2_5_vl", "vision_config": vision})
    state = {f"visual.{k}": v for k, v in theirs.state_dict().items()}
    ours = build_model(ours_config, import_qwen.state_dict_from_hf(state, ours_config), "bench")
    return theirs, ours


def pixel_values(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Our ``(1, 3, H, W)`` input as Qwen's processor lays it out: units, their patches, two identical frames."""
    _, C, H, W = x.shape
    gh, gw = H // 14, W // 14
    p = x.reshape(C, gh // 2, 2, 14, gw // 2, 2, 14).permute(1, 4, 2, 5, 0, 3, 6)
    p = p.unsqueeze(5).expand(-1, -1, -1, -1, -1, 2, -1, -1).reshape(gh * gw, -1)
    return p, torch.tensor([[1, gh, gw]])


MEMORY_WORKER = r'''
import json, sys, time
import torch
from bench.bench_highres import start_peak, status_mb
from bench.bench_qwen_vl import build, pixel_values
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl

impl, side, depth, globals_ = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
torch.set_num_threads(1)
theirs, ours = build(depth, globals_)
kept, eager = [], modeling_qwen2_5_vl.eager_attention_forward


def spy(module, *a, **k):  # keeps the probabilities, as ours are kept (returned)
    out, weights = eager(module, *a, **k)
    kept.append(weights)
    return out, weights


modeling_qwen2_5_vl.eager_attention_forward = spy
model = theirs if impl == "theirs" else ours
del theirs, ours  # only the one measured stays


def run(s):
    x = torch.randn(1, 3, s, s)
    with torch.inference_mode():
        if impl == "theirs":
            pv, thw = pixel_values(x)
            return model(pv, grid_thw=thw), list(kept)
        tokens, attentions = model.tokens(x, output_attentions=True)
        return model.project(tokens, (s // 14, s // 14)), attentions


run(224)  # lazy imports, thread pools
kept.clear()
since, cpu = start_peak(), time.process_time()
out, attentions = run(side)
print(json.dumps({"peak": status_mb("VmHWM") - since, "cpu": time.process_time() - cpu,
                  "kept": sum(a.numel() * a.element_size() for a in attentions) / 2**20}))
'''


def memory(args) -> None:
    """``--memory``: each forward with every layer's attention kept in a fresh process, its working memory (VmHWM
    over the resident set before it, with glibc's mmap threshold at 64 KB so that the resident set follows what is
    held: freed blocks go back) and CPU seconds; transformers' and ours alternate (A B B A ...)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536",
           "MALLOC_TRIM_THRESHOLD_": "65536", "PYTHONPATH": str(root)}
    print(f"# load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print("| input | transformers MB | ours MB | theirs / ours (memory) | CPU theirs / ours | attentions kept MB |")
    print("|---|---|---|---|---|---|")
    for size in args.sizes:
        side = int(size.split("x")[0])
        runs: dict[str, list[dict]] = {"theirs": [], "ours": []}
        for r in range(args.repeats):
            for impl in (("theirs", "ours") if r % 2 == 0 else ("ours", "theirs")):
                done = subprocess.run([sys.executable, "-c", MEMORY_WORKER, impl, str(side), str(args.depth),
                                       json.dumps(args.globals)], capture_output=True, text=True, env=env, cwd=root)
                if done.returncode:
                    raise SystemExit(done.stderr.strip().splitlines()[-1])
                runs[impl].append(json.loads(done.stdout.strip().splitlines()[-1]))
        t, o = ({k: statistics.median(r[k] for r in runs[i]) for k in ("peak", "cpu", "kept")}
                for i in ("theirs", "ours"))
        cpu = statistics.median(a["cpu"] / b["cpu"] for a, b in zip(runs["theirs"], runs["ours"], strict=True))
        print(f"| {side}x{side} px ({(side // 14) ** 2:,} tokens) | {t['peak']:,.0f} | {o['peak']:,.0f} | "
              f"{t['peak'] / o['peak']:.2f} | {cpu:.2f} | {t['kept']:,.0f} / {o['kept']:,.0f} |", flush=True)
    print(f"# load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--sizes", nargs="+", default=["448x448", "672x896"], help="HxW, multiples of 28")
    parser.add_argument("--globals", type=int, nargs="*", default=None,
                        help="the global layers (default: every fourth from 3); --depth 8 --globals 7 has the "
                             "32-layer tower's 7 windowed layers to 1 global")
    parser.add_argument("--memory", action="store_true", help="working memory instead of time: each forward in a "
                        "fresh process (square sizes: HxW's H)")
    args = parser.parse_args()
    if args.memory:
        return memory(args)
    torch.set_num_threads(args.threads)
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl

    theirs, ours = build(args.depth, args.globals)
    kept, eager = [], modeling_qwen2_5_vl.eager_attention_forward

    def spy(module, *a, **k):  # keeps the probabilities, as ours are kept (returned)
        out, weights = eager(module, *a, **k)
        kept.append(weights)
        return out, weights

    modeling_qwen2_5_vl.eager_attention_forward = spy
    for size in args.sizes:
        h, w = (int(v) for v in size.split("x"))
        x = torch.randn(1, 3, h, w)
        pv, thw = pixel_values(x)
        grid = (h // 14, w // 14)
        times = {"ours": [], "theirs": []}
        with torch.inference_mode():
            ours.project(ours.tokens(x, output_attentions=True)[0], grid)  # warm-up both
            theirs(pv, grid_thw=thw)
            for _ in range(args.repeats):
                kept.clear()
                start = time.perf_counter()
                theirs(pv, grid_thw=thw)
                times["theirs"].append(time.perf_counter() - start)
                kept.clear()
                start = time.perf_counter()
                ours.project(ours.tokens(x, output_attentions=True)[0], grid)  # the merger too, as theirs
                times["ours"].append(time.perf_counter() - start)
        t_ours, t_theirs = statistics.median(times["ours"]), statistics.median(times["theirs"])
        pairs = statistics.median(o / t for o, t in zip(times["ours"], times["theirs"], strict=True))
        layers = f"{args.depth} layers (global {', '.join(map(str, ours.config.global_layers))})"
        print(f"| Qwen2.5-VL tower, {layers}, {h}x{w} px ({h // 14 * w // 14:,} tokens) | "
              f"{t_theirs * 1e3:,.0f} ms | {t_ours * 1e3:,.0f} ms | {t_ours / t_theirs:.2f}x | pairs {pairs:.2f}x |",
              flush=True)


if __name__ == "__main__":
    main()
