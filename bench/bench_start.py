"""The explorer's start and an upload, in a real browser, against their floors: ``python bench/bench_start.py``.

- **start**: ``streamlit run app.py`` (the checkout's own checkpoints: the shipped default on its first sample) from
  the process's launch to the first map drawn (the overlay chart's image in the page), against a bare Streamlit
  page that imports torch and writes one line, launched and loaded the same way: the floor any page with torch
  pays; and against that page with one small Plotly chart (``bare+plotly``): the floor of a page that draws one,
  whose browser loads Plotly's bundle first. After one start of each (not timed: it writes the bytecode, as a
  user's first start does), they alternate ``--repeats`` times; medians, the ratios, and the server's and the
  browser's CPU seconds by then.
- **upload**: in the app on a random ViT-B/16 (``vit-b16``, shipped under the default name) or the shipped default
  (``shipped``), photos (640 x 480 PNGs, a new one each time) put into the sidebar's uploader, from the upload to the
  new overlay drawn (the map on screen; the rest of the page may still be coming) and to the run over; their wall time
  and the server's CPU seconds against one forward with attentions of the same model on the same image in this process
  (``model(x, output_attentions=True)``, the same thread count). ``floor`` is no model: a bare page that shows the
  uploaded image in a Plotly chart, what any Streamlit page pays to show an upload (its ratios are to one second). The
  first upload after the model opened is shown apart. Each is preceded by an untimed session (a server opened, one
  upload) that writes the bytecode, as a user's installed packages have it; ``--rounds`` repeats it, interleaving the
  roots, and gives the first uploads' medians.
  2026-11-24, ``--what upload --models vit-b16 --rounds 4 --repeats 3`` against the checkout before
  ``drawing.warm_up`` (load average 1.5-2.5): the first upload after opening the random ViT-B/16 took 1.06 s (0.58
  server CPU s, 0.92 browser CPU s; 2.55x one forward's 0.41 s) against 1.20 s (0.74, 0.96; 2.88x); later uploads
  0.85-1.14 s and 0.52-0.57 server CPU s on both. What the first still costs more is the browser's: the 14 lazily
  loaded element bundles (sliders, radios, the download button, images) fetched and compiled, five charts created.

Server and forward run with ``VIT_THREADS`` = ``--threads`` (1 by default: the machine is shared). Headless
Chromium through Playwright, as ``bench/bench_explorer_clicks.py`` (whose helpers this reuses). ``--root`` serves
another checkout (e.g. ``git archive`` of an older commit unpacked in /tmp), repeated to interleave before and
after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_explorer_clicks import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    SCRIPT_DONE,
    browser_cpu_seconds,
    cpu_seconds,
    free_port,
    photo,
    ship_vit_b16,
)

# The overlay's image: the visible chart keyed overlay_picker. Streamlit keeps a keyed chart's previous instance,
# hidden, in the page until the run ends, and the image beside the map is redrawn before the model runs: the second
# chart in the page is not always the map.
OVERLAY_HREF = """() => {
  const charts = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')].filter(c => c.checkVisibility());
  const chart = charts.find(c => c.closest('.st-key-overlay_picker')) || charts[1];
  const image = chart && chart.querySelector('.layer-below image, .imagelayer image');
  return image ? image.getAttribute('href') : null;
}"""
BARE = "import torch  # noqa: F401\nimport streamlit as st\n\nst.write('torch is ready')\n"
# The floor of any page that draws a Plotly chart: the browser loads Plotly's bundle (megabytes of JavaScript) first.
BARE_PLOTLY = BARE + "import plotly.graph_objects as go\n\nst.plotly_chart(go.Figure(go.Bar(x=[1, 2], y=[3, 4])))\n"
# The floor of an upload: a page that shows the uploaded image in a Plotly chart (as the explorer's map, a JPEG data
# URI as the figure's image, keyed so that OVERLAY_HREF finds it) and nothing else: no model, no settings.
UPLOAD_FLOOR = """import base64
import io

import plotly.graph_objects as go
import streamlit as st
from PIL import Image

upload = st.sidebar.file_uploader("Upload an image")
if upload is not None:
    image = Image.open(upload).convert("RGB")
    image.thumbnail((224, 224))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    axis = {"range": [0, 1], "visible": False}
    figure = go.Figure(layout={"width": 300, "height": 300, "margin": {"l": 0, "r": 0, "t": 0, "b": 0},
                               "xaxis": axis, "yaxis": axis})
    figure.add_layout_image(source="data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode(), x=0, y=1,
                            sizex=1, sizey=1, xref="x", yref="y", sizing="stretch", layer="below")
    st.plotly_chart(figure, key="overlay_picker")
"""
CHART_DRAWN = "() => document.querySelectorAll('[data-testid=\"stPlotlyChart\"] .main-svg').length > 0"
TIMEOUT_MS = 300_000
# Installed in the page just before an upload: the time from then to the frame after the one whose DOM first holds
# the new overlay image (the map on screen, painted), in ``window.__mapDrawn`` (ms); the rest of the page may still
# be coming.
MAP_WATCH = """(before) => {
  const t0 = performance.now();
  window.__mapDrawn = null;
  const tick = () => {
    const href = (OVERLAY_HREF)();
    if (href !== before && href !== null) {
      requestAnimationFrame(() => { window.__mapDrawn = performance.now() - t0; });
    } else {
      requestAnimationFrame(tick);
    }
  };
  requestAnimationFrame(tick);
}""".replace("OVERLAY_HREF", OVERLAY_HREF)


def launch(root: Path, script: str, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", script, "--server.port", str(port), "--server.headless", "true",
         "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
        cwd=root, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"streamlit run {script} did not start")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=5):
                return process, url
        except OSError:
            time.sleep(0.05)


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def frame(page) -> None:
    page.evaluate("() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")


def world(tmp: Path, model: str, threads: int) -> dict[str, str]:
    runs = tmp / "runs"
    runs.mkdir(exist_ok=True)
    # Bytecode written (to a folder of its own, not the checkout) even where PYTHONDONTWRITEBYTECODE is set, as a
    # user's Python does: else every start compiles the page's ~90 modules again.
    env = {"VIT_RUNS_DIR": str(runs), "HOME": str(tmp), "HF_HOME": str(tmp / "hf"), "HF_HUB_CACHE": str(tmp / "hub"),
           "VIT_THREADS": str(threads), "PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(tmp / "pycache")}
    if model == "vit-b16":
        checkpoints = tmp / "checkpoints"
        if not checkpoints.exists():
            checkpoints.mkdir()
            ship_vit_b16(checkpoints)
        env["VIT_CHECKPOINTS_DIR"] = str(checkpoints)
    return env


def start_once(browser, root: Path, script: str, env: dict[str, str], done_js: str) -> tuple[float, float, float]:
    """(wall s from launch to ``done_js`` and a painted frame, server CPU s by then, the browser's CPU s meanwhile)
    of a fresh server."""
    start, browser_cpu = time.perf_counter(), browser_cpu_seconds()
    process, url = launch(root, script, env)
    try:
        page = browser.new_context(viewport={"width": 1500, "height": 1100}).new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(url)
        page.wait_for_function(done_js)
        frame(page)
        wall = time.perf_counter() - start
        cpu = cpu_seconds(process.pid)
        browser_cpu = browser_cpu_seconds() - browser_cpu
        page.context.close()
        return wall, cpu, browser_cpu
    finally:
        stop(process)


def bench_start(browser, roots: list[Path], repeats: int, threads: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "bare.py").write_text(BARE)
        (tmp / "chart_page.py").write_text(BARE_PLOTLY)
        env = world(tmp, "shipped", threads)
        text = "() => document.body.innerText.includes('torch is ready')"
        runs = {"bare": (tmp, "bare.py", text), "bare+plotly": (tmp, "chart_page.py", f"() => ({text})() && "
                                                                                  f"({CHART_DRAWN})()")}
        apps = [f"app {root}" for root in roots]
        runs.update({app: (root, "app.py", f"() => ({OVERLAY_HREF})() !== null && ({SCRIPT_DONE})()")
                     for app, root in zip(apps, roots, strict=True)})
        times: dict[str, list[tuple[float, float, float]]] = {kind: [] for kind in runs}
        for kind in runs:  # not timed: the bytecode written, the files read once
            start_once(browser, *runs[kind][:2], env, runs[kind][2])
        for i in range(repeats):
            for kind in list(runs) if i % 2 == 0 else list(runs)[::-1]:
                times[kind].append(start_once(browser, *runs[kind][:2], env, runs[kind][2]))
                wall, cpu, browser_cpu = times[kind][-1]
                print(f"  start {kind}: {wall:.2f} s, server CPU {cpu:.2f} s, browser CPU {browser_cpu:.2f} s",
                      flush=True)
    wall = {k: statistics.median(t[0] for t in v) for k, v in times.items()}
    cpu = {k: statistics.median(t[1] for t in v) for k, v in times.items()}
    browser_cpu = {k: statistics.median(t[2] for t in v) for k, v in times.items()}
    for app in apps:
        for floor in ("bare", "bare+plotly"):
            ratios = [a[0] / b[0] for a, b in zip(times[app], times[floor], strict=True)]
            print(f"start, {app}: to the first map {wall[app]:.2f} s ({cpu[app]:.2f} server CPU s, "
                  f"{browser_cpu[app]:.2f} browser CPU s), {floor} page {wall[floor]:.2f} s ({cpu[floor]:.2f} + "
                  f"{browser_cpu[floor]:.2f} CPU s): {wall[app] / wall[floor]:.2f}x (median of "
                  f"pairs {statistics.median(ratios):.2f}: {', '.join(f'{r:.2f}' for r in ratios)}); load average "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def forward_seconds(env: dict[str, str], root: Path, image: Path, repeats: int, threads: int
                    ) -> tuple[float, float]:
    """Median wall and CPU seconds of one forward with attentions of the app's default model on ``image`` (or the
    shipped sample), as the page's input (its training size)."""
    import torch
    from PIL import Image

    from vit.core.inference import preprocess
    from vit.core.runfiles import DEFAULT_CHECKPOINT
    from vit.sources.open import open_source

    torch.set_num_threads(threads)
    folder = Path(env.get("VIT_CHECKPOINTS_DIR", root / "checkpoints"))
    checkpoint = open_source(folder / DEFAULT_CHECKPOINT)
    model = checkpoint.model
    x = preprocess([Image.open(image).convert("RGB")], checkpoint.preprocessing, patch_size=model.config.patch_size)
    times = []
    with torch.inference_mode():
        model(x, output_attentions=True)
        for _ in range(repeats):
            start, cpu = time.perf_counter(), time.process_time()
            model(x, output_attentions=True)
            times.append((time.perf_counter() - start, time.process_time() - cpu))
    return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)


def upload_session(browser, root: Path, model: str, env: dict[str, str], photos: list[Path]
                   ) -> list[tuple[float, float, float, float]]:
    """A fresh server opened in a fresh tab, ``photos`` uploaded in turn: (wall s, server CPU s, browser CPU s, map
    drawn s) of each, from the upload to the run over (the new overlay drawn), and to the overlay drawn. ``root``
    is the folder of ``upload_floor.py`` for the ``floor`` model."""
    process, url = launch(root, "upload_floor.py" if model == "floor" else "app.py", env)
    try:
        page = browser.new_context(viewport={"width": 1500, "height": 1100}).new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(url)
        page.wait_for_selector('[data-testid="stApp"]')
        if model == "shipped":  # the sample's map first: uploads then replace it
            page.wait_for_function(f"() => ({OVERLAY_HREF})() !== null && ({SCRIPT_DONE})()")
        else:
            page.locator('[data-testid="stSidebar"] input[type="file"]').first.wait_for(state="attached")
            page.wait_for_function(SCRIPT_DONE)
        page.wait_for_timeout(500)
        results = []
        for path in photos:
            before = page.evaluate(OVERLAY_HREF)
            page.evaluate(MAP_WATCH, before)
            start, cpu, browser_cpu = time.perf_counter(), cpu_seconds(process.pid), browser_cpu_seconds()
            page.locator('[data-testid="stSidebar"] input[type="file"]').first.set_input_files(str(path))
            page.wait_for_function(f"(before) => ({OVERLAY_HREF})() !== before && ({OVERLAY_HREF})() !== null "
                                   f"&& ({SCRIPT_DONE})()", arg=before)
            frame(page)
            results.append((time.perf_counter() - start, cpu_seconds(process.pid) - cpu,
                            browser_cpu_seconds() - browser_cpu, page.evaluate("() => window.__mapDrawn") / 1000))
            page.wait_for_timeout(300)
        page.context.close()
        return results
    finally:
        stop(process)


def per(model: str, forward: float | None = None, forward_cpu: float | None = None) -> str:
    """What an upload's ratios are to: one forward with attentions (its times when given), or for the floor (no
    model) one second."""
    if model == "floor":
        return "one second (the floor has no model)"
    if forward is None:
        return "one forward"
    return f"one forward with attentions ({forward:.3f} s, {forward_cpu:.3f} CPU s)"


def bench_upload(browser, root: Path, model: str, repeats: int, threads: int
                 ) -> tuple[tuple[float, float, float, float], float]:
    """Prints the first upload's and the later ones' figures; returns the first's (wall, server CPU, browser CPU)
    and one forward's wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = world(tmp, model, threads)
        photos = []
        for seed in range(repeats + 2):
            photos.append(tmp / f"photo-{seed}.png")
            photos[-1].write_bytes(photo(640, 480, seed=seed + 10))
        if model == "floor":  # no model: the ratios below are to a second
            (tmp / "upload_floor.py").write_text(UPLOAD_FLOOR)
            served, forward, forward_cpu = tmp, 1.0, 1.0
        else:
            served, (forward, forward_cpu) = root, forward_seconds(env, root, photos[0], 5, threads)
        # Not timed: the bytecode of what an upload imports written, as a user's installed packages have it (else
        # the first upload compiles the modules it is the first to import, which no user's does).
        upload_session(browser, served, model, env, photos[-1:])
        results = upload_session(browser, served, model, env, photos[:-1])
    first, rest = results[0], results[1:]
    wall, cpu = statistics.median(r[0] for r in rest), statistics.median(r[1] for r in rest)
    browser_cpu, drawn = statistics.median(r[2] for r in rest), statistics.median(r[3] for r in rest)
    print(f"upload, {model}, {root}: first: map drawn {first[3]:.2f} s ({first[3] / forward:.2f}x), run over "
          f"{first[0]:.2f} s ({first[1]:.2f} server CPU s, {first[2]:.2f} browser CPU s: {first[0] / forward:.2f}x "
          f"wall, {first[1] / forward_cpu:.2f}x CPU); then medians: map drawn {drawn:.2f} s ({drawn / forward:.2f}x), "
          f"run over {wall:.2f} s ({cpu:.2f} server CPU s, {browser_cpu:.2f} browser CPU s: "
          f"{wall / forward:.2f}x wall, {cpu / forward_cpu:.2f}x CPU) of {per(model, forward, forward_cpu)}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    return first, forward


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, action="append",
                   help="a checkout whose app.py is served (this one by default; repeat it to interleave several)")
    p.add_argument("--what", default="start,upload", help="start, upload or both (comma-separated)")
    p.add_argument("--models", default="vit-b16,shipped",
                   help="the upload's models: vit-b16, shipped, floor (a bare page that shows the upload in a chart)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=1,
                   help="upload benches per root, the roots' order reversed every other round (interleaved)")
    args = p.parse_args(argv)
    from playwright.sync_api import sync_playwright

    roots = [root.resolve() for root in args.root or [ROOT]]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            if "start" in args.what:
                bench_start(browser, roots, args.repeats, args.threads)
            if "upload" in args.what:
                for model in args.models.split(","):
                    firsts: dict[Path, list[tuple[float, float, float, float]]] = {root: [] for root in roots}
                    forwards = []
                    for i in range(args.rounds):
                        for root in roots if i % 2 == 0 else roots[::-1]:
                            first, forward = bench_upload(browser, root, model, args.repeats, args.threads)
                            firsts[root].append(first)
                            forwards.append(forward)
                    forward = statistics.median(forwards)
                    for root, times in firsts.items():
                        wall, drawn = statistics.median(t[0] for t in times), statistics.median(t[3] for t in times)
                        print(f"first upload, {model}, {root}: medians of {len(times)}: map drawn {drawn:.2f} s "
                              f"({drawn / forward:.2f}x {per(model)}), run over {wall:.2f} s "
                              f"({wall / forward:.2f}x), server CPU "
                              f"{statistics.median(t[1] for t in times):.2f} s, browser CPU "
                              f"{statistics.median(t[2] for t in times):.2f} s", flush=True)
        finally:
            browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
