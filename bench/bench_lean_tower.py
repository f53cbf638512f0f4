"""Gemma 3n's tower alone, its own forward against ``vit.core.lean_tower`` at several budgets: timm's MobileNetV5-300M
(``mobilenetv5_300m_enc``, random weights, float32) over one 768-px image (the size Gemma 3n's processor gives it),
``forward_features`` on one thread, each case in a fresh process after a 64-px warm-up, rounds in alternating order.
Prints each run's CPU seconds and the resident set's peak over the resident set before the forward, then the medians,
and the largest difference of each budget's output from the own forward's (same weights and image). The peak is the
forward's own: VmHWM reset just before it (tests/peak_memory.py's ``start``, /proc/self/clear_refs), in the memory
tests' environment (glibc handing freed blocks back at once). Before 2026-11-29 it was getrusage's ru_maxrss, never
reset, so the model's build and the warm-up counted too where they peaked higher than the forward.

Run from the repository root::

    python bench/bench_lean_tower.py --budgets 8 32 64 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worker(budget: int | None, side: int, out: Path | None) -> dict:
    import time

    import timm
    import torch

    sys.path.insert(0, str(ROOT))
    from tests.peak_memory import can_reset_the_peak, peak, start
    from vit.core import lean_tower

    if not can_reset_the_peak():  # getrusage's ru_maxrss is the whole process's: the model's build and the warm-up
        raise SystemExit("this bench reads the forward's own peak through /proc/self/clear_refs, which this system "
                         "does not offer")

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = timm.create_model("mobilenetv5_300m_enc").eval()
    image = torch.randn(1, 3, side, side, generator=torch.Generator().manual_seed(1))
    if budget is not None:
        lean_tower.BUDGET = budget << 20
        lean_tower.install(model)
    with torch.no_grad():
        model.forward_features(torch.randn(1, 3, 64, 64))
        base = start()  # the resident set now, its peak reset to it: the build and warm-up before are not counted
        began = time.process_time()
        features = model.forward_features(image)
        cpu = time.process_time() - began
        grown = peak() - base  # read before anything else is allocated
    if out is not None:
        torch.save(features, out)
    return {"cpu": cpu, "peak_mb": grown / 2**20}


def run(budget: int | None, side: int, out: Path | None) -> dict:
    sys.path.insert(0, str(ROOT))
    from tests.peak_memory import environment

    command = [sys.executable, __file__, "--worker", "own" if budget is None else str(budget), "--side", str(side)]
    if out is not None:
        command += ["--save", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=environment())
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[8, 32, 64], help="lean_tower.BUDGET in MiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--side", type=int, default=768)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--save", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(None if args.worker == "own" else int(args.worker), args.side, args.save)))
        return 0
    import tempfile

    import torch

    cases = [None, *args.budgets]
    name = {None: "own forward", **{b: f"lean, budget {b} MiB" for b in args.budgets}}
    runs: dict = {case: [] for case in cases}
    print(f"# python bench/bench_lean_tower.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"# load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print("| round | case | CPU s | peak MB over the resident set before |")
    print("|---|---|---|---|")
    for r in range(args.rounds):
        for case in cases if r % 2 == 0 else cases[::-1]:
            result = run(case, args.side, None)
            runs[case].append(result)
            print(f"| {r + 1} | {name[case]} | {result['cpu']:.2f} | {result['peak_mb']:.0f} |", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        outputs = {case: Path(folder) / f"{case}.pt" for case in cases}
        for case in cases:
            run(case, args.side, outputs[case])
        own = torch.load(outputs[None])
        differences = {case: float((torch.load(outputs[case]) - own).abs().max()) for case in args.budgets}
    print(f"# load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print("| case | median CPU s | median peak MB | own CPU / this CPU (median of the rounds' ratios) | own peak / "
          "this peak | largest difference from the own forward's features |")
    print("|---|---|---|---|---|---|")
    base_cpu = statistics.median(r["cpu"] for r in runs[None])
    base_peak = statistics.median(r["peak_mb"] for r in runs[None])
    for case in cases:
        cpu = statistics.median(r["cpu"] for r in runs[case])
        peak = statistics.median(r["peak_mb"] for r in runs[case])
        diff = "-" if case is None else f"{differences[case]:.2e} (largest value {float(own.abs().max()):.1f})"
        paired = statistics.median(o["cpu"] / r["cpu"] for o, r in zip(runs[None], runs[case], strict=True))
        print(f"| {name[case]} | {cpu:.2f} | {peak:.0f} | {base_cpu / cpu:.2f} ({paired:.2f}) | {base_peak / peak:.2f} "
              f"| {diff} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
