"""Click-to-redraw times of the explorer in a real browser (issue 35): ``python bench/bench_explorer_clicks.py``.

``streamlit run app.py`` of a checkout (``--root``, this one by default: point it at an older checkout, e.g. a
``git worktree add /tmp/before <commit>``, for the "before" figures) driven by headless Chromium (Debian's
/usr/bin/chromium through Playwright, as the browser tests do). For each model it times, from the click to the
redrawn section with the script run finished (``stApp``'s ``data-test-script-state`` no longer ``running``) and a
frame painted after it; besides the wall time it gives the CPU time the server and the browser spent meanwhile
(``/proc``), which is what the click costs on an idle machine when wall time is mostly waiting for other jobs:

- a click on a head thumbnail (the heads grid of one layer; the map above shows that head);
- a click on a Mechanism tab (Logit lens and Head attribution in turn; the views are cached after the first);
- an "Ask in words" submit (two label sets in turn, so the model's answers are cached after the first round: what
  is timed is the page's own work), for the CLIP models.

Models: the shipped checkpoint on its first sample (``shipped``); a random ViT-B/16 at 224 px (``vit-b16``); a tiny
random open_clip CLIP (``clip-tiny``) and a random open_clip ViT-B-16 CLIP (``clip-b16``), both as the HF cache holds
them. Medians of ``--repeats`` clicks (after one warm-up click each).

Measured 2026-11-23 on this project's 2-core machine under heavy load from other jobs (load average 10-33),
``--models clip-tiny,vit-b16,shipped --root /tmp/before --root . --repeats 5``, before = ef1e35a (the flat page),
after = issue 35's sections with Streamlit's post-run gc.collect() off; median wall s / server CPU s / browser CPU s:

    model      click                  before               after
    shipped    head thumbnail click   1.48 / 0.59 / 0.83   0.70 / 0.13 / 0.67
    shipped    Mechanism tab click    2.11 / 0.71 / 1.15   0.58 / 0.05 / 0.39
    vit-b16    head thumbnail click   4.39 / 0.76 / 1.35   0.88 / 0.17 / 0.78
    vit-b16    Mechanism tab click    3.18 / 0.79 / 1.48   0.56 / 0.07 / 0.37
    clip-tiny  Ask in words submit    3.72 / 0.76 / 1.04   1.66 / 0.25 / 0.63

The server's share is under 0.3 s everywhere after; what is left is Chromium's (headless, software-composited)
re-render of the charts. A head click and a CLIP's new labels still rerun the page by design (they change what
every section shows).
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
TIMEOUT_MS = 600_000  # the first page load (the model opened, run once)
CLICK_TIMEOUT_MS = 60_000
MODELS = ("shipped", "vit-b16", "clip-tiny", "clip-b16")
SCRIPT_DONE = """() => document.querySelector('[data-testid="stApp"]')
    .getAttribute('data-test-script-state') !== 'running'"""


def photo(width: int, height: int, seed: int) -> bytes:
    """A smooth, photo-like image (noise is unlike photos and slow to encode)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (height // 40, width // 40, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC).save(buffer, format="PNG")
    return buffer.getvalue()


def ship_vit_b16(folder: Path) -> None:
    """A random ViT-B/16 (our format) under the default checkpoint name, as the app's shipped model."""
    import torch

    from vit.checkpoint import save_checkpoint
    from vit.core.runfiles import DEFAULT_CHECKPOINT
    from vit.model import ViT, ViTConfig

    torch.manual_seed(0)
    save_checkpoint(folder / DEFAULT_CHECKPOINT, ViT(ViTConfig.from_preset("vit-base-16")),
                    [f"class {i}" for i in range(1000)])


def cache_open_clip(cache: Path, name: str, model_cfg: dict) -> None:
    """A random open_clip CLIP saved as open_clip saves for the Hub, in an HF cache as ``someone/<name>``."""
    import open_clip
    import torch
    from safetensors.torch import save_file

    # importlib: ``import open_clip.push_to_hf_hub as m`` binds the function of that name open_clip exports
    open_clip_hub = importlib.import_module("open_clip.push_to_hf_hub")
    folder = cache / f"models--someone--{name}" / "snapshots" / "rev1"
    folder.mkdir(parents=True)
    torch.manual_seed(0)
    model = open_clip.model.CLIP(**model_cfg)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "open_clip_model.safetensors")
    model.visual.image_mean, model.visual.image_std = open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD
    open_clip_hub.save_config_for_hf(model, folder / "open_clip_config.json", model_config=model_cfg)
    (folder.parent.parent / "refs").mkdir()
    (folder.parent.parent / "refs" / "main").write_text("rev1")


def world(model: str, tmp: Path) -> tuple[dict[str, str], Path | None]:
    """(environment for the server, image to upload or None for the shipped sample)."""
    checkpoints, runs = tmp / "checkpoints", tmp / "runs"
    runs.mkdir()
    env = {"VIT_RUNS_DIR": str(runs), "HOME": str(tmp), "HF_HOME": str(tmp / "hf"),
           "HF_HUB_CACHE": str(tmp / "hf-cache")}
    upload = tmp / "photo.png"
    upload.write_bytes(photo(640, 480, seed=3))
    if model == "shipped":
        return env, None  # the checkout's own checkpoints folder, its sample image
    checkpoints.mkdir()
    env["VIT_CHECKPOINTS_DIR"] = str(checkpoints)
    if model == "vit-b16":
        ship_vit_b16(checkpoints)
    elif model == "clip-tiny":
        cache_open_clip(tmp / "hf-cache", "tiny-clip", dict(
            embed_dim=16, quick_gelu=True, text_cfg=dict(context_length=16, vocab_size=49408, width=64, heads=1,
                                                         layers=1),
            vision_cfg=dict(image_size=32, patch_size=8, width=128, layers=3)))
    else:  # open_clip's ViT-B-16 configuration
        cache_open_clip(tmp / "hf-cache", "clip-b16", dict(
            embed_dim=512, text_cfg=dict(context_length=77, vocab_size=49408, width=512, heads=8, layers=12),
            vision_cfg=dict(image_size=224, patch_size=16, width=768, layers=12)))
    return env, upload


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server(root: Path, env: dict[str, str], threads: int):
    """``streamlit run app.py`` in ``root`` on a free port; yields its URL, stops its process group after."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port), "--server.headless", "true",
         "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
        cwd=root, env={**os.environ, "OMP_NUM_THREADS": str(threads), **env}, stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("streamlit did not start")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=5):
                    break
            except OSError:
                time.sleep(0.5)
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def settled(page) -> None:
    """Wait until the script run is over (and a moment for the browser to lay the page out)."""
    page.wait_for_function(SCRIPT_DONE)
    page.wait_for_timeout(300)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def browser_cpu_seconds() -> float:
    """CPU time so far of the Chromium processes this bench started (its descendants), the renderer included."""
    parents, names = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        name, fields = text[text.index("(") + 1:text.rindex(")")], text.rsplit(")", 1)[1].split()
        parents[int(stat.parent.name)], names[int(stat.parent.name)] = int(fields[1]), name
    total = 0.0
    for pid, name in names.items():
        ancestor = parents.get(pid)
        while ancestor not in (None, 0, 1, os.getpid()):
            ancestor = parents.get(ancestor)
        if ancestor == os.getpid() and "chrom" in name:
            try:
                total += cpu_seconds(pid)
            except (OSError, IndexError):
                pass
    return total


def timed_click(page, pid: int, click, done_js: str) -> tuple[float, float, float]:
    """(wall, server CPU, browser CPU) seconds from ``click()`` until ``done_js`` holds and the run it started is
    over and the browser has painted a frame after it."""
    start, cpu, browser = time.perf_counter(), cpu_seconds(pid), browser_cpu_seconds()
    click()
    try:
        page.wait_for_function(f"() => ({done_js})() && ({SCRIPT_DONE})()", timeout=CLICK_TIMEOUT_MS)
    except Exception:  # playwright's TimeoutError: say what the page showed
        page.screenshot(path=str(ROOT / "test-artifacts" / "bench-explorer-clicks-timeout.png"), full_page=True)
        raise RuntimeError(f"the page did not show {done_js} within {CLICK_TIMEOUT_MS / 1000:.0f} s; it showed:\n"
                           + page.locator('[data-testid="stMain"]').inner_text()[:3000]) from None
    page.evaluate("() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")
    return time.perf_counter() - start, cpu_seconds(pid) - cpu, browser_cpu_seconds() - browser


def text_shown(text: str) -> str:
    return f"() => document.querySelector('[data-testid=\"stMain\"]').innerText.includes({text!r})"


def heads_clicks(page, pid: int, repeats: int) -> list[tuple[float, float, float]]:
    """Click heads 2 and H - 1 of the heads grid in turn; done when the map's caption names the head."""
    page.get_by_text("Click a head").scroll_into_view_if_needed()
    settled(page)
    caption = page.locator('[data-testid="stMain"]').inner_text()
    layers = int(re.search(r"Layer \d+ of (\d+)", caption).group(1))
    heads = int(re.search(r"Every layer \(\d+ × (\d+) =", caption).group(1))
    times = []
    for i in range(repeats + 1):
        head = (1, heads - 2)[i % 2]  # two heads every model has (the first one shown may be head 1)
        keyed = page.locator(".st-key-heads_grid .nsewdrag")
        grid = (keyed.first if keyed.count() else
                page.locator('[data-testid="stPlotlyChart"]').last.locator(".nsewdrag").first)
        box = grid.bounding_box()
        times.append(timed_click(page, pid, partial(page.mouse.click, box["x"] + box["width"] * (head + 0.5) / heads,
                                               box["y"] + box["height"] / 2),
                                 text_shown(f"Layer {layers} of {layers}, head {head + 1}")))
        settled(page)
    return times[1:]


def mechanism_clicks(page, pid: int, repeats: int) -> list[tuple[float, float, float]]:
    """Open Mechanism, then click the Logit lens and Head attribution tabs in turn."""
    page.get_by_text("Mechanism: logit lens").click()
    page.get_by_role("tab", name="Logit lens").wait_for()
    settled(page)
    tabs = (("Head attribution", "direct contribution to the logit"), ("Logit lens", "read it directly"))
    times = []
    for i in range(repeats + 1):
        name, shown = tabs[i % 2]
        tab = page.get_by_role("tab", name=name)
        tab.scroll_into_view_if_needed()
        times.append(timed_click(page, pid, tab.click, text_shown(shown)))
        settled(page)
    return times[1:]


def words_submits(page, pid: int, repeats: int) -> list[tuple[float, float, float]]:
    """Submit two label sets in turn; done when the scores name the first label of the set."""
    sets = ("a dog, a cat, a ball", "a tree, a house, a car")
    area = page.get_by_role("textbox", name="Labels")
    times = []
    for i in range(repeats + 2):  # one warm-up round: each set asked once
        labels = sets[i % 2]
        area.scroll_into_view_if_needed()
        area.fill(labels)
        ticks = ("() => [...document.querySelectorAll('[data-testid=\"stPlotlyChart\"] .ytick text')]"
                 f".some(t => t.textContent === {labels.split(', ')[0]!r}) && document.querySelector("
                 "'[data-testid=\"stMain\"]').innerText.includes('Drawn over the part of the image')")
        times.append(timed_click(page, pid, lambda: area.press("Control+Enter"), ticks))
        settled(page)
    return times[2:]


def bench(root: Path, model: str, repeats: int, threads: int) -> dict[str, list[tuple[float, float, float]]]:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        env, upload = world(model, Path(tmp))
        with server(root, env, threads) as (url, pid), sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_context(viewport={"width": 1500, "height": 1100}).new_page()
                page.set_default_timeout(TIMEOUT_MS)
                page.goto(url)
                page.wait_for_selector('[data-testid="stApp"]')
                if upload is not None:
                    page.locator('[data-testid="stSidebar"] input[type="file"]').first.set_input_files(str(upload))
                page.get_by_text("Colours span").wait_for()
                settled(page)
                if model.startswith("clip"):
                    return {"Ask in words submit": words_submits(page, pid, repeats)}
                return {"head thumbnail click": heads_clicks(page, pid, repeats),
                        "Mechanism tab click": mechanism_clicks(page, pid, repeats)}
            finally:
                browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, action="append",
                        help="a checkout whose app.py is served (repeatable: each model is timed on each in turn, "
                             "so background load falls on all alike); this one by default")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--repeats", type=int, default=5, help="timed clicks per row (the median is printed)")
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of the server")
    args = parser.parse_args(argv)
    roots = [root.resolve() for root in args.root or [ROOT]]
    rows = []
    for model in args.models.split(","):
        for root in roots:
            for what, times in bench(root, model, args.repeats, args.threads).items():
                wall, cpu, browser = (statistics.median(t[i] for t in times) for i in (0, 1, 2))
                rows.append((model, what, root, wall, cpu, browser))
                print(f"{model:<10} {what:<22} {root}: wall {wall:.2f} s, server CPU {cpu:.2f} s, browser CPU "
                      f"{browser:.2f} s ({', '.join('/'.join(f'{v:.2f}' for v in t) for t in times)})", flush=True)
    print(f"\nclick -> redrawn section, run finished: median of {args.repeats} clicks, wall s / server CPU s / "
          "browser CPU s")
    print(f"  {'model':<10} {'click':<22} " + " ".join(f"{str(root)[-24:]:>24}" for root in roots))
    for model in args.models.split(","):
        for what in dict.fromkeys(r[1] for r in rows if r[0] == model):
            cells = [f"{r[3]:.2f} / {r[4]:.2f} / {r[5]:.2f}" for root in roots for r in rows
                     if r[:3] == (model, what, root)]
            print(f"  {model:<10} {what:<22} " + " ".join(f"{c:>24}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
