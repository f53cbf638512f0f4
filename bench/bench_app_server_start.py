"""What a browser test's app server costs until the explorer's first page is drawn (issue 93): the server process's
CPU seconds (user + system, /proc/PID/stat) from its start to one page load done, a fresh interpreter
(``python -c LAUNCH run app.py``, what tests/helpers.py's ``streamlit_app`` started before) against a child forked
from ``helpers.APP_SERVERS`` (what it starts now: torch, Plotly and Streamlit imported once per test process). The
fork server's own start (its imports, once per test process) is timed apart, as the CPU of its process.

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
import tempfile
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


def fresh_server(port: int, log: Path) -> subprocess.Popen:
    """The server as tests/helpers.py started it before the fork server (its LAUNCH, a fresh interpreter)."""
    from helpers import LAUNCH

    with log.open("wb") as output:
        return subprocess.Popen(
            [sys.executable, "-c", LAUNCH, "run", "app.py", "--server.port", str(port), "--server.headless", "true",
             "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
            cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True)


def forked_server(port: int, log: Path):
    from helpers import APP_SERVERS, LAUNCH

    return APP_SERVERS.spawn(LAUNCH, ["run", "app.py", "--server.port", str(port), "--server.headless", "true",
                                      "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
                             cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, output=log, new_session=True)


def one(variant: str, folder: Path) -> float:
    """The server's CPU seconds from its start to the explorer's first page drawn once."""
    from helpers import free_port, wait_for_health

    port = free_port()
    start = fresh_server if variant == VARIANTS[0] else forked_server
    server = start(port, folder / f"{variant.split()[0]}.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, server)
        subprocess.run([sys.executable, str(ROOT / "bench" / "bench_browser_launch.py"), "--run", url, "launched",
                        "1"], check=True)
        return cpu(server.pid)
    finally:
        server.terminate()
        server.wait(30)


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
    with tempfile.TemporaryDirectory() as folder:
        for i in range(args.rounds):
            for variant in (VARIANTS if i % 2 == 0 else VARIANTS[::-1]):
                spent[variant].append(one(variant, Path(folder)))
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
