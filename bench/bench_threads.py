"""torch's thread count on shared cores: a ViT-B/16 forward with attentions (224 px) on one thread and on all usable
cores, interleaved in one process, with the machine as it is and then with one core kept busy by a spinning
process; each case prints the medians, their ratio, the load average and what ``vit.core.threads`` chooses there.

Run from the repository root::

    python bench/bench_threads.py --repeats 7

2026-11-24, ``--repeats 5 --settle 40`` on the 2 shared cores: as the machine was (load average 6.7), one thread
1.35 s, two 3.72 s (2.76x); one core spinning (load 8.2), 3.29 s and 7.47 s (2.27x); ``vit.core.threads`` chose one
thread in both.

The load average lags (one minute): ``--settle`` seconds of spinning before the busy case is timed let it show the
spinner, so the printed choice is the one a process starting then would make.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a clean checkout
from vit.core.threads import busy_cores, chosen_threads, usable_cores  # noqa: E402
from vit.model import ViT, ViTConfig  # noqa: E402


def case(model: ViT, image: torch.Tensor, counts: list[int], repeats: int, label: str) -> None:
    times: dict[int, list[float]] = {n: [] for n in counts}
    with torch.inference_mode():
        for i in range(repeats + 1):
            for n in counts if i % 2 == 0 else counts[::-1]:
                torch.set_num_threads(n)
                start = time.perf_counter()
                model(image, output_attentions=True)
                if i:  # the first round warms up
                    times[n].append(time.perf_counter() - start)
    medians = {n: statistics.median(t) for n, t in times.items()}
    text = ", ".join(f"{n} thread(s) {m:.3f} s" for n, m in medians.items())
    print(f"{label}: {text}; {counts[-1]} / 1: {medians[counts[-1]] / medians[1]:.2f}x; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; vit.core.threads chooses {chosen_threads({})} "
          f"({usable_cores()} cores, {busy_cores():.2f} busy)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--settle", type=float, default=45.0, help="seconds of spinning before the busy case")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = ViT(ViTConfig.from_preset("vit-base-16")).eval()
    image = torch.randn(1, 3, 224, 224)
    counts = [1, max(usable_cores(), 2)]
    case(model, image, counts, args.repeats, "as the machine is")
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(args.settle)
        case(model, image, counts, args.repeats, "one core spinning")
    finally:
        spinner.kill()
        spinner.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
