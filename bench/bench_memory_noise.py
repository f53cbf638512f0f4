"""How far a measured peak moves on its own: the allocator's slack the cost model's tests allow (tests/test_costs.py).

    python bench/bench_memory_noise.py --repeats 3                 # every family and view of tests/test_costs.py
    python bench/bench_memory_noise.py --families vit hiera --capabilities default avx2 avx512

Measures each cell of ``tests/test_costs.py`` (a family's view at one size: its resident-set peak over the set just
before, in a fresh process per view, as the test does) ``--repeats`` times under each ``ATEN_CPU_CAPABILITY`` of
``--capabilities`` (torch's kernels for another CPU; MKL told the same), and prints each cell's spread (largest less
smallest measured peak) and its excess over the estimate. The largest spread is the slack the tests add to every
estimate: what a peak moves by from one process or machine to the next, not what a view holds.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import test_costs  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(test_costs.FAMILIES), choices=list(test_costs.FAMILIES))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--capabilities", nargs="+", default=["", "avx2"],
                        help="ATEN_CPU_CAPABILITY values ('' for this CPU's own)")
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, "
          f"page {os.sysconf('SC_PAGE_SIZE')} B, slack allowed {test_costs.ALLOCATOR_SLACK / 2**20:.1f} MB")
    cells: dict[tuple, list[tuple[float, float]]] = {}
    for capability in args.capabilities:
        for name in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS"):
            if capability:
                os.environ[name] = capability.upper() if name.startswith("MKL") else capability
            else:
                os.environ.pop(name, None)
        for _ in range(args.repeats):
            for family in args.families:
                for row in test_costs.measure(family):
                    if "measured" in row:
                        key = (family, row["view"], row["side"])
                        cells.setdefault(key, []).append((row["measured"] / 2**20, row["estimate"] / 2**20))
                        print(f"  {capability or 'own'} {family} {row['view']} {row['side']}: "
                              f"{row['measured'] / 2**20:.2f} MB", flush=True)
    print(f"{'family':16} {'view':9} {'side':>5} {'runs':>4} {'min MB':>8} {'max MB':>8} {'spread':>7} "
          f"{'estimate':>9} {'est-max':>8}")
    widest = 0.0
    for (family, view, side), runs in cells.items():
        peaks = [m for m, _ in runs]
        spread = max(peaks) - min(peaks)
        widest = max(widest, spread)
        print(f"{family:16} {view:9} {side:5d} {len(runs):4d} {min(peaks):8.2f} {max(peaks):8.2f} {spread:7.2f} "
              f"{runs[0][1]:9.2f} {runs[0][1] - max(peaks):+8.2f}")
    print(f"largest spread: {widest:.2f} MB")


if __name__ == "__main__":
    main()
