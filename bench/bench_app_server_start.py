"""What a browser test's app server costs until the explorer's first page is drawn (issue 93): the server process's
CPU seconds (user + system, /proc/PID/stat) from its start to one page load done, a fresh interpreter
(``python -c LAUNCH run app.py``: tests/helpers.py's ``streamlit_app(fresh=True)``, what it started before) against
a child forked from ``helpers.APP_SERVERS`` (what it starts now: torch, Plotly and Streamlit imported once per test
process). The fork server's own start (its imports, once per test process) is timed apart, as the CPU of its process.

    python bench/bench_app_server_start.py --rounds 3 --out bench/results/cpu-2026-11-28/app-server-start.txt

Each round starts one server of each kind, in alternating order, loads the explorer's first page once in a browser
(bench/bench_browser_launch.py's load, in a process of its own), reads the server's CPU and stops it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
TICK = os.sysconf("SC_CLK_TCK")
VARIANTS = ("fresh interpreter", "forked from APP_SERVERS")


def cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def one(variant: str) -> float:
    """The server's CPU seconds from its start to the explorer's first page drawn once: tests/helpers.py's
    ``streamlit_app``, a fresh interpreter (``fresh=True``) or forked from ``APP_SERVERS``."""
    from helpers import streamlit_app

    with streamlit_app({}, fresh=variant == VARIANTS[0]) as (url, server):
        subprocess.run([sys.executable, str(ROOT / "bench" / "bench_browser_launch.py"), "--run", url, "launched",
                        "1"], check=True)
        return cpu(server.pid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from helpers import APP_SERVERS

    began = time.perf_counter()
    APP_SERVERS.run("pass", timeout=300)  # the fork server's imports, once
    server_start = (cpu(APP_SERVERS._process.pid), time.perf_counter() - began)
    spent: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for i in range(args.rounds):
        for variant in (VARIANTS if i % 2 == 0 else VARIANTS[::-1]):
            spent[variant].append(one(variant))
    lines = [f"# python bench/bench_app_server_start.py --rounds {args.rounds}",
             f"# {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end; the app server's CPU "
             "seconds from its start to the explorer's first page drawn once, each round's, then the median", "",
             "| app server | CPU s, by round | median |", "|---|---|---:|"]
    for variant, values in spent.items():
        lines.append(f"| {variant} | {', '.join(f'{v:.2f}' for v in values)} | {statistics.median(values):.2f} |")
    lines += ["", f"The fork server's start (its imports, once per test process): {server_start[0]:.2f} s of CPU, "
              f"{server_start[1]:.2f} s of wall."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
