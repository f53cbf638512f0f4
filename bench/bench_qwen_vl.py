"""Qwen2.5-VL's vision tower with attentions: ours next to transformers' eager forward on the same weights.

transformers' ``Qwen2_5_VisionTransformerPretrainedModel`` (eager attention: its ``eager_attention_forward`` forms
every window's probabilities, kept here by a spy as ours are returned) at the real width (1,280 wide, 16 heads,
SwiGLU 3,420) with fewer layers (``--depth``, a global layer every fourth as in the 32-layer tower's 7, 15, 23, 31),
random weights; ours opened from its state dict by ``vit.sources.import_qwen``. Calls alternate so background load
slows both alike; the table shows medians, our time as a ratio of theirs, and the median of each pair's ratio.
Run from the repository root::

    python -m bench.bench_qwen_vl --threads 1 --repeats 5 --depth 8 --sizes 448x448 672x896

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

    from vit.sources import import_qwen
    from vit.sources.open import build_model

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--sizes", nargs="+", default=["448x448", "672x896"], help="HxW, multiples of 28")
    parser.add_argument("--globals", type=int, nargs="*", default=None,
                        help="the global layers (default: every fourth from 3); --depth 8 --globals 7 has the "
                             "32-layer tower's 7 windowed layers to 1 global")
    args = parser.parse_args()
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
