"""Inference with no hooks set, against another checkout's ``vit/model.py``, interleaved in one process.

The hook points (``vit.model.HookPoint``) are identity modules on the one forward; with no hooks set they must
cost nothing measurable. This script loads the other checkout's ``model.py`` beside ours (it imports only torch),
gives both models the same weights, checks they compute the same logits, and times ``model(images)`` (the fused
path) and ``model(images, output_attentions=True)`` in turn, A B A B, so that background load slows both alike,
in the process's CPU seconds (under other jobs' load the wall time mostly measures theirs);
it prints each median and the median of the pairwise ratios (ours / theirs)::

    python bench/bench_hooks.py --baseline ../baseline/vit/model.py --preset vit-base-16 --repeats 20
    python bench/bench_hooks.py --baseline ../baseline/vit/model.py --preset cifar-s --batch 1 --repeats 200

ViT-B/16 at 224 px shows the cost at scale; the CIFAR preset on one image the per-call overhead of the hook
points (65 of them), where Python's share of the forward is largest.

Measured 2026-11-23 on the 2-core machine under heavy load from other jobs (a ViT-B/16 forward took 1.6-1.9 s
instead of ~0.3 s), against the checkout before the hook points: ViT-B/16, 8 pairs: median ratio 0.958 (fused) and
0.997 (``output_attentions``); cifar-s, 1 thread, 100 pairs: 1.131 and 0.993 (another 30: 0.986 and 1.272), i.e.
noise of +-15 %. Measured alone (``timeit``), a hook point with no hooks set costs 0.64 us (``nn.Identity``: 3.6 us):
65 of them are ~42 us of a cifar-s forward (~15 ms here), ~0.3 %.

The cost was elsewhere: reading a child module (``self.hook_q``, ``self.attn``) goes through
``nn.Module.__getattr__`` after a failed instance lookup, 5 us against 0.2 us for a plain attribute here. Measured
2026-11-23 in CPU seconds (the machine under a load of 10-25), cifar-s, batch 1, 1 thread, 400 pairs each:
the hook points as first landed against the checkout before them 1.124 (fused) and 1.079 (``output_attentions``);
with ``vit.model.Parent`` (children kept in ``__dict__`` too) 0.983 and 1.012, and against the hook points as first
landed 0.943 and 0.926.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parent.parent))  # run as a script too
from vit.model import ViT, ViTConfig  # noqa: E402


def load_baseline(path: Path):
    spec = importlib.util.spec_from_file_location("baseline_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_model"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", type=Path, required=True, help="the other checkout's vit/model.py")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--preset", default="vit-base-16")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ours = ViT(ViTConfig.from_preset(args.preset)).eval()
    base = load_baseline(args.baseline)
    theirs = base.ViT(base.ViTConfig(**ours.config.to_dict())).eval()
    theirs.load_state_dict(ours.state_dict())
    c = ours.config
    images = torch.randn(args.batch, c.num_channels, c.image_size, c.image_size)
    with torch.inference_mode():
        assert torch.equal(ours(images)[0], theirs(images)[0]), "the two models compute different logits"
        for attentions in (False, True):
            times = {"ours": [], "theirs": []}
            for _ in range(args.repeats):
                for name, model in (("ours", ours), ("theirs", theirs)):
                    start = time.process_time()
                    model(images, output_attentions=attentions)
                    times[name].append(time.process_time() - start)
            ratio = statistics.median(a / b for a, b in zip(times["ours"], times["theirs"], strict=True))
            a, b = (statistics.median(times[name]) * 1e3 for name in ("ours", "theirs"))
            print(f"{args.preset} batch {args.batch} output_attentions={attentions}: ours {a:.2f} ms, theirs "
                  f"{b:.2f} ms, median ratio ours/theirs {ratio:.3f} over {args.repeats} pairs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
