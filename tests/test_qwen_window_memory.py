"""Qwen2.5-VL's windowed layers hold their attention as windows (issue 83, item 1): a forward with every layer's
attention returns each windowed layer's ``(windows, heads, slots, slots)``, never ``T x T``, and holds no more than
the cost model counts (``memory.attentions_bytes``: the windows, every global layer's ``H x T²`` and one layer's
scores beside them) — measured as the peak resident memory of a fresh process, as tests/test_costs.py measures."""

import json
from pathlib import Path

import pytest
import torch
from peak_memory import run_measured
from test_costs import build, can_reset_the_peak

from vit.costs import memory

ROOT = Path(__file__).resolve().parent.parent
SIDE = 256  # 64 x 64 patches of 4 px: 4,096 tokens, 64 windows of 8 x 8 in layers 0 and 2, layer 1 global


def test_a_windowed_layers_attention_is_its_windows_and_the_cost_model_counts_them_so():
    model = build("qwen2.5-vl")
    grid = (SIDE // 4, SIDE // 4)
    with torch.inference_mode():
        _, attentions = model(torch.randn(1, 3, SIDE, SIDE), output_attentions=True)
    T = grid[0] * grid[1]
    assert [tuple(a.shape) for a in attentions] == [(64, 2, 64, 64), (1, 2, T, T), (64, 2, 64, 64)]
    held = sum(a.numel() * a.element_size() for a in attentions)
    assert held == memory.attentions_bytes(model, grid) - 4 * 2 * T * T  # less the one layer's scores beside


WORKER = r'''
import ctypes, gc, json, re, resource, sys
sys.path.insert(0, sys.argv[1])
import torch
from test_costs import build
from vit.costs import plan

side = int(sys.argv[2])
model = build("qwen2.5-vl")
libc = ctypes.CDLL("libc.so.6")


def forward(s):
    with torch.inference_mode():
        return model(torch.randn(1, 3, s, s), output_attentions=True)


forward(64)  # lazy imports, thread pools
gc.collect()
libc.malloc_trim(0)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
with open("/proc/self/statm") as f:
    since = int(f.read().split()[1]) * resource.getpagesize()
kept = forward(side)
with open("/proc/self/status") as f:
    peak = int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) * 1024
print(json.dumps({"measured": peak - since, "estimate": plan.forward(model, model.patch_grid(side, side),
                                                                     attentions=True).memory}))
'''


@pytest.mark.slow
@pytest.mark.skipif(not can_reset_the_peak(), reason="the peak RSS cannot be reset here (/proc/self/clear_refs)")
def test_the_forward_with_every_attention_holds_no_more_than_the_windows_the_cost_model_counts():
    # forked from the measuring server (peak_memory.environment(): one thread, glibc's thresholds), which imported
    # torch and transformers once
    done = run_measured(WORKER, [str(ROOT / "tests"), str(SIDE)], timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    # a windowed layer held whole (2 x 4,096² floats, 134 MB) would be far over the estimate (281 MB; 269 measured)
    assert r["measured"] <= r["estimate"] <= 1.5 * r["measured"], {k: v / 2**20 for k, v in r.items()}
