"""How a second visitor fares while a first runs a long grid: ``python bench/bench_busy_server.py [--root DIR]``.

Issue 33, item 1: a residual-patching grid ("Every layer and token too") kept the server busy long after its tab
was closed, and one visitor's click starved every other. This starts ``streamlit run app.py`` from ``--root`` (this
checkout by default; give a checkout of main for the "before" figures) on a random ViT-S/16 (12 layers, 197 tokens)
with two sample images, and in headless Chromium:

1. times a second session's page load (the page fully drawn) on the idle server;
2. session A starts the residual-patching grid (12 x 197 passes); session B's page load is timed again;
3. session A's tab is closed; after ``--settle`` seconds, session B's page load is timed again, and the server
   process's CPU use over 5 s is read (about 100 % per busy core while a grid still runs for nobody).

Each load is the median of ``--repeats`` fresh browser contexts. Wall-clock on a shared machine: compare the
figures of one run with each other, and "before" with "after" only when both ran side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
from helpers import CHROMIUM, CHROMIUM_ARGS, free_port, wait_for_health  # noqa: E402

VIT_S16 = dict(image_size=224, patch_size=16, num_channels=3, num_classes=10, hidden_size=384, num_layers=12,
               num_heads=6, mlp_size=1536)
DRAWN = "Colours span"  # the main view's caption: the page is drawn
GRID_TOGGLE = "Every layer and token too"


def make_world(folder: Path) -> tuple[Path, Path]:
    """A random ViT-S/16 as the default checkpoint, with two random sample photos (clean and corrupted)."""
    import numpy as np
    import torch
    from PIL import Image

    from vit.checkpoint import save_checkpoint
    from vit.core.runfiles import DEFAULT_CHECKPOINT
    from vit.model import ViT, ViTConfig

    checkpoints, runs = folder / "checkpoints", folder / "runs"
    runs.mkdir(parents=True)
    torch.manual_seed(0)
    save_checkpoint(checkpoints / DEFAULT_CHECKPOINT, ViT(ViTConfig(**VIT_S16)), [f"c{i}" for i in range(10)])
    samples = checkpoints / "samples" / Path(DEFAULT_CHECKPOINT).stem
    samples.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in ("c0_1.png", "c1_1.png"):
        Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)).save(samples / name)
    return checkpoints, runs


def start_server(root: Path, checkpoints: Path, runs: Path, log: Path):
    import subprocess

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VIT_CHECKPOINTS_DIR": str(checkpoints), "VIT_RUNS_DIR": str(runs),
           "PYTHONPATH": str(root)}
    process = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port), "--server.headless", "true",
         "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
        cwd=root, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_for_health(url, process)
    return url, process


def explorer_url(url: str) -> str:
    return url  # the explorer is the default page


def page_load(browser, url: str, timeout_ms: int) -> float:
    """Seconds from opening the explorer in a fresh context until its page is drawn."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        page.set_default_navigation_timeout(timeout_ms)  # a starved server may take more than 30 s to answer
        start = time.perf_counter()
        page.goto(explorer_url(url))
        page.get_by_text(DRAWN).first.wait_for(timeout=timeout_ms)
        return time.perf_counter() - start
    finally:
        context.close()


def median_load(browser, url: str, repeats: int, timeout_ms: int) -> float:
    return statistics.median(page_load(browser, url, timeout_ms) for _ in range(repeats))


def start_grid(browser, url: str, timeout_ms: int):
    """Session A: the Mechanism view's Patching tab with every layer and token; returns its (context, page) once
    the grid runs (its progress bar, or main's spinner, is shown)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(timeout_ms)
    page.goto(explorer_url(url))
    page.get_by_text(DRAWN).first.wait_for()
    page.get_by_text("Mechanism: logit lens, head attribution, ablation, phenomena").click()
    page.get_by_text("Each patch's probability of").wait_for()
    deadline = time.monotonic() + timeout_ms / 1000
    while True:  # a click that lands while the page reruns can be lost: again until the tab shows its toggle
        try:
            page.get_by_role("tab", name="Patching", exact=True).click(timeout=20_000)
            page.get_by_text(GRID_TOGGLE).wait_for(timeout=20_000)
            break
        except Exception:  # playwright's TimeoutError
            if time.monotonic() > deadline:
                raise
    page.get_by_text(GRID_TOGGLE).click()
    page.get_by_text("Patching the clean image's activations into the corrupted one").first.wait_for()
    return context, page


def cpu_share(pid: int, seconds: float = 5.0) -> float:
    """The server's CPU time (with its threads) over ``seconds`` of wall-clock, as a share of one core."""
    process = psutil.Process(pid)
    before = process.cpu_times()
    time.sleep(seconds)
    after = process.cpu_times()
    return (after.user + after.system - before.user - before.system) / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose app.py is served")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--settle", type=float, default=15.0, help="seconds after closing A's tab")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one page load may take")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    timeout_ms = int(args.timeout * 1000)
    with tempfile.TemporaryDirectory(prefix="bench-busy-") as tmp:
        checkpoints, runs = make_world(Path(tmp))
        url, server = start_server(args.root.resolve(), checkpoints, runs, Path(tmp) / "server.log")
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
                page_load(browser, url, timeout_ms)  # warm: the model loaded, the first forward cached
                idle = median_load(browser, url, args.repeats, timeout_ms)
                idle_cpu = cpu_share(server.pid)
                context, _ = start_grid(browser, url, timeout_ms)
                time.sleep(5)
                busy = median_load(browser, url, args.repeats, timeout_ms)
                busy_cpu = cpu_share(server.pid)
                context.close()  # A's tab closed, its grid unfinished
                time.sleep(args.settle)
                closed_cpu = cpu_share(server.pid)
                closed = median_load(browser, url, args.repeats, timeout_ms)
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(f"server: {args.root.resolve()}")
    print(f"{'second session page load (median of ' + str(args.repeats) + ')':<48} {'s':>7} {'server CPU':>11}")
    print(f"{'idle server':<48} {idle:7.2f} {idle_cpu:10.0%}")
    print(f"{'while session A runs the residual grid':<48} {busy:7.2f} {busy_cpu:10.0%}")
    print(f"{f'{args.settle:g} s after session A closed its tab':<48} {closed:7.2f} {closed_cpu:10.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
