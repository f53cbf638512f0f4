"""Shared test helpers: generated image folders (the layouts ``folder:PATH`` accepts) and the
plumbing of the real-browser tests."""

from __future__ import annotations

import html
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from markdown_it import MarkdownIt
from PIL import Image

from vit.core.forkserver import ForkedProcess, ForkServer

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

    from vit.model import ViTConfig

# The smallest model vit.train builds, and one thread: what a test of the trainer's machinery trains
TINY_TRAIN = ("--image-size", "8", "--patch-size", "4", "--hidden-size", "8", "--num-layers", "1", "--num-heads", "2",
              "--mlp-size", "16", "--threads", "1")

# A colour per class, far apart so that even a tiny model separates them in a few steps.
CLASS_COLOURS = [(220, 40, 40), (40, 200, 60), (50, 60, 230), (230, 210, 40), (200, 50, 210), (40, 210, 210)]


def make_image_folder(root: str | Path, classes: Sequence[str] = ("cat", "dog"), per_class: int = 8,
                      size: int = 8, mode: str = "RGB", val_per_class: int = 0, seed: int = 0) -> Path:
    """Write ``per_class`` PNGs per class: ``root/<class>/<i>.png``, or with ``val_per_class`` the
    ``root/train/<class>/`` + ``root/val/<class>/`` layout. Each image is its class's colour plus
    noise; ``mode`` "L" gives greyscale files. Returns ``root``."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    splits = [("train", per_class), ("val", val_per_class)] if val_per_class else [("", per_class)]
    for split, count in splits:
        for c, name in enumerate(classes):
            folder = root / split / name if split else root / name
            folder.mkdir(parents=True, exist_ok=True)
            colour = np.array(CLASS_COLOURS[c % len(CLASS_COLOURS)], dtype=np.int16)
            for i in range(count):
                pixels = colour + rng.integers(-30, 31, size=(size, size, 3))
                image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
                (image.convert("L") if mode == "L" else image).save(folder / f"{i}.png")
    return root


def displayed(markdown: str) -> str:
    """The text a Markdown body (``st.markdown``, ``st.caption``, ``st.error``, ...) shows, as a CommonMark
    parser renders it: escapes resolved, formatting and tags dropped, invisible word joiners removed."""
    rendered = MarkdownIt("commonmark").render(markdown)
    return html.unescape(re.sub(r"<[^>]+>", "", rendered)).replace("\u2060", "").strip()


# -- real-browser tests: Debian's Chromium driven by Playwright against `streamlit run` -------

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"  # screenshots, git-ignored
# Without the background-networking flags Chromium keeps dialling out on this closed network.
SERVER_LOG_LINES = 400  # of a failed browser test's server output: its stacks and what it said last
# How long a browser test waits for a page to show something: what a user would wait on a busy machine, not more.
# A step that includes a training process's start and run waits RUN_MS. BROWSER_TIMEOUT_MS overrides both.
BROWSER_TIMEOUT_MS = int(os.environ.get("BROWSER_TIMEOUT_MS", 120_000))
RUN_MS = int(os.environ.get("BROWSER_TIMEOUT_MS", 240_000))
# A test waits for what is to appear with ``locator.wait_for()``, not ``expect(locator).to_be_visible()``: each poll
# of expect that finds nothing takes an ARIA snapshot of the whole page for its error message, so 20 s of waiting on
# the explorer's page cost Chromium and Playwright's driver 13.5 s of CPU where wait_for cost 10.1 (medians of 3
# rounds, the page's load included): bench/bench_browser_launch.py --compare waits,
# bench/results/cpu-2026-11-28/suite-browser-waits.txt. A step waiting for a training run polls for minutes.
BASE_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--no-first-run"]
# Paint and composite on the page's own threads, images decoded before they are drawn, no smooth scrolling: the
# same frames for less of Chromium's CPU per explorer page load, 10.0 vs 10.8 s (median of 3 rounds; an unkept
# first run 9.9 vs 11.9): bench/bench_browser_launch.py --compare flags,
# bench/results/cpu-2026-11-27/suite-browser-flags.txt. Fewer raster threads alone gave nothing.
RENDER_ARGS = ["--num-raster-threads=1", "--disable-checker-imaging", "--disable-partial-raster",
               "--disable-threaded-animation", "--disable-threaded-scrolling", "--disable-smooth-scrolling"]
CHROMIUM_ARGS = BASE_ARGS + RENDER_ARGS
# Every page of a browser test holds its CSS animations and transitions still. While the app runs a script, its
# spinner and the header's running icon animate at the display's frame rate, each frame painted in software: a page
# load and 20 s of a spinner took Chromium 7.35 s of CPU, 3.46 s held still (medians of 3 rounds; the explorer's
# first page on an idle machine 7.60 vs 7.29: it runs ~2 s): bench/bench_browser_launch.py --compare spinner,
# bench/results/cpu-2026-11-28/suite-browser-spinner.txt and suite-browser-animations.txt. A test waits through
# many such seconds, the more the busier the machine, and on two cores those frames are taken from the app server
# it waits for. No test looks at an animation; the pages' JavaScript (Plotly, a clip's player) runs as before.
STILL_CSS = "*, *::before, *::after { animation: none !important; transition: none !important; }"
STILL_SCRIPT = ("(() => { const add = () => { const s = document.createElement('style'); s.textContent = "
                f"{STILL_CSS!r}; (document.head || document.documentElement).appendChild(s); }}; "
                "if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', add); "
                "else add(); })();")


class StillBrowser:
    """A Playwright ``Browser`` whose every context and page (``new_context``, ``new_page``) runs ``STILL_SCRIPT``
    before the page's own scripts; everything else is the browser's own."""

    def __init__(self, browser: Browser) -> None:
        self._browser = browser

    def new_context(self, **kwargs):
        context = self._browser.new_context(**kwargs)
        context.add_init_script(STILL_SCRIPT)
        return context

    def new_page(self, **kwargs):
        page = self._browser.new_page(**kwargs)
        page.add_init_script(STILL_SCRIPT)
        return page

    def __getattr__(self, name: str):
        return getattr(self._browser, name)


# The test process's one Playwright driver and Chromium, launched by the first ``chromium()`` and shared by every
# later one (each gets contexts of its own, closed when its block ends): a launch cost ~1.15 s of CPU (Playwright's
# driver and Chromium's browser, GPU, network and zygote processes; 6 launches of an empty page 10.6 s against one
# launch with 6 contexts 4.8 s), and the browser tests made ~40 (issue 112). Stopped by ``close_chromium()`` after a
# worker's last browser test (tests/conftest.py): the driver's event loop holds the thread while it lives, and
# ``asyncio.run()`` refuses to start beside it.
_SHARED: dict[str, object] = {}


# How often a page's ``wait_for_function`` checks its condition when the test does not say: ten times a second.
# Playwright's default ("raf") checks it at every animation frame, which keeps the page's main thread busy through
# every second a test waits: 20 s of waiting on the explorer's drawn page took 1.51 / 1.53 s of Chromium's CPU per
# frame, 0.29 / 0.37 s at 100 ms (two rounds each, issue 112). A wait for something shown only briefly (a clip
# player's frame label) passes ``polling="raf"`` itself.
POLL_MS = 100


def _poll_by_default(sync_api) -> None:
    """``Page.wait_for_function`` and ``Frame.wait_for_function`` poll every ``POLL_MS`` unless asked otherwise."""
    for cls in (sync_api.Page, sync_api.Frame):
        if getattr(cls.wait_for_function, "_polls_by_default", False):
            continue
        original = cls.wait_for_function

        def wait_for_function(self, expression, *, arg=None, timeout=None, polling=POLL_MS, _original=original):
            return _original(self, expression, arg=arg, timeout=timeout, polling=polling)

        wait_for_function._polls_by_default = True
        cls.wait_for_function = wait_for_function


def _shared_chromium(sync_api) -> Browser:
    """The shared Chromium (``_SHARED``), launched now where there is none or it went away (a crash)."""
    _poll_by_default(sync_api)
    browser = _SHARED.get("browser")
    if browser is not None and browser.is_connected():
        return browser
    if "playwright" not in _SHARED:
        _SHARED["playwright"] = sync_api.sync_playwright().start()
    browser = _SHARED["playwright"].chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
    _SHARED["browser"] = browser
    return browser


def close_chromium() -> None:
    """Close the shared Chromium and stop its Playwright driver, if they run."""
    _SHARED.pop("opener", None), _SHARED.pop("opener_crashed", None)  # closed with its browser
    browser, playwright = _SHARED.pop("browser", None), _SHARED.pop("playwright", None)
    try:
        if browser is not None and browser.is_connected():
            browser.close()
    finally:
        if playwright is not None:
            playwright.stop()


@contextmanager
def chromium(still: bool = True) -> Iterator[Browser]:
    """Debian's headless Chromium through Playwright with ``CHROMIUM_ARGS``: the process's shared one (``_SHARED``);
    the contexts and pages opened while the block runs (``new_context``, ``new_page``, also through
    ``page.context.browser``) are closed when it ends, so a test sees what a browser launched for it shows: no cookie,
    no storage, no cache of another's. ``still``: its pages hold their animations still (``StillBrowser``). Skips the
    test where Chromium or the playwright package is missing (pytest is imported here: scripts import this module
    without it)."""
    import pytest

    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} is missing: install it with `apt-get install -y chromium`")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    browser = _shared_chromium(sync_api)
    before = list(browser.contexts)  # those of an enclosing block (a module's fixture) stay
    opener = _SHARED.get("opener")
    tabs_before = list(opener.context.pages) if opener is not None and not opener.is_closed() else []
    try:
        yield StillBrowser(browser) if still else browser
    finally:
        if browser.is_connected():
            opener = _SHARED.get("opener")
            for context in browser.contexts:
                if context not in before and (opener is None or context is not opener.context):
                    context.close()
            if opener is not None and not opener.is_closed():  # the block's shared tabs go; the blank page stays
                for page in opener.context.pages:
                    if page is not opener and page not in tabs_before:
                        page.close()


def shared_tab(browser: Browser, viewport: dict[str, int]) -> Page:
    """A new tab, ``viewport`` wide and high, of the worker's one blank page (``_SHARED["opener"]``, opened on first
    use in a context of its own, closed with the shared Chromium): for a module whose test loads one page, which in a
    context of its own would start a renderer of its own and compile the app's bundle again in it
    (tests/browser_tabs.py): five such modules' Chromium 49.8-59.0 -> 46.9-48.3 s of CPU over three runs each
    (bench/results/cpu-2026-11-30b/shared-tab-*.txt). Its pages hold their animations still (``STILL_SCRIPT``); the
    tab is closed when the ``chromium()`` block that opened it ends. Each load in it is still a new Streamlit
    session; the tabs of the worker's modules share the context's cookies and storage, which this app never uses,
    and its cache."""
    from browser_tabs import new_tab, opener

    raw = browser._browser if isinstance(browser, StillBrowser) else browser
    first = _SHARED.get("opener")
    # None yet, Chromium relaunched, or its renderer crashed (a crashed page is not closed, and its tabs would fail)
    if first is None or first.is_closed() or first.context.browser is not raw or _SHARED.get("opener_crashed"):
        if first is not None and raw.is_connected() and first.context.browser is raw:
            first.context.close()
        first = _SHARED["opener"] = opener(StillBrowser(raw))
        _SHARED["opener_crashed"] = False
        first.on("crash", lambda _: _SHARED.update(opener_crashed=True))
    page = new_tab(first, BROWSER_TIMEOUT_MS)
    page.set_viewport_size(viewport)
    return page


def click_until(click, shown, timeout_ms: float, screenshot: tuple | None = None, attempt_ms: float = 20_000) -> None:
    """``click()`` again and again, until ``shown`` (a playwright locator) is visible, ``timeout_ms`` at most.

    On two loaded cores a click that lands while the page reruns can be lost (the element it hit is redrawn under
    it): each try waits ``attempt_ms`` for the click and as long again for ``shown``. ``screenshot``: (page, path)
    taken before the last failure is raised."""
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        try:
            click(attempt_ms)
            shown.wait_for(timeout=attempt_ms)
            return
        except Exception:  # playwright's TimeoutError
            if time.monotonic() > deadline:
                if screenshot is not None:
                    page, path = screenshot
                    page.screenshot(path=str(path), full_page=True)
                raise


def lxt_norms(m, gelu: type | None = None) -> None:
    """lxt's AttnLRP rules for transformers' LayerNorm and activation (tests/reference/lxt), set through ``m`` (a
    ``monkeypatch.context()``, so undone when it closes): every ``nn.LayerNorm`` and ``gelu`` (default
    transformers' ``GELUActivation``). The caller patches the model's attention with lxt's wrapper of its own."""
    import torch

    from tests.reference.lxt.patches import layer_norm_forward, non_linear_forward

    if gelu is None:
        from transformers.activations import GELUActivation as gelu
    m.setattr(torch.nn.LayerNorm, "forward", layer_norm_forward)
    m.setattr(gelu, "original_forward", gelu.forward, raising=False)
    m.setattr(gelu, "forward", non_linear_forward)


def ship_default(tmp_path: Path, config: ViTConfig, class_names: list[str],
                 metadata: dict | None = None) -> tuple[Path, Path]:
    """A random model (seed 0) saved under the default checkpoint name, as the app's shipped model; returns the
    checkpoints and (empty) runs folders to point ``VIT_CHECKPOINTS_DIR`` and ``VIT_RUNS_DIR`` at."""
    import torch  # here, not at the top: scripts/screenshots.py imports this module without the package

    from vit.checkpoint import save_checkpoint
    from vit.core.runfiles import DEFAULT_CHECKPOINT
    from vit.model import ViT

    checkpoints, runs = tmp_path / "checkpoints", tmp_path / "runs"
    runs.mkdir()
    torch.manual_seed(0)
    save_checkpoint(checkpoints / DEFAULT_CHECKPOINT, ViT(config), class_names, metadata=metadata)
    return checkpoints, runs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_health(url: str, server: subprocess.Popen | ForkedProcess, timeout: float = 180.0) -> None:
    """Block until the Streamlit server at ``url`` answers its health check, or fail clearly."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"streamlit exited with code {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"streamlit did not answer at {url} within {timeout:.0f} s")


# The servers of the browser tests now running in this process, each with its output's file: a failed test reports
# their stacks (tests/conftest.py, ``server_report``).
LIVE_SERVERS: dict[subprocess.Popen | ForkedProcess, Path] = {}
# Starts Streamlit as ``python -m streamlit`` does, with faulthandler answering SIGUSR1: every thread's stack into the
# server's output, and the server goes on.
LAUNCH = ("import faulthandler, runpy, signal, sys; faulthandler.register(signal.SIGUSR1, all_threads=True); "
          "sys.argv[0] = 'streamlit'; runpy.run_module('streamlit', run_name='__main__', alter_sys=True)")
# Each app server is forked from one process per test process that imported what every server imports first (torch,
# Plotly, Streamlit): from its start to the explorer's first page drawn a server spent 3.01 s of CPU fresh, 1.40
# forked; the fork server's imports cost 1.57 s once (medians of 3 rounds: bench/bench_app_server_start.py,
# bench/results/cpu-2026-11-28/app-server-start.txt). Nothing imported there reads the environment a test gives its
# server (HOME, HF_HOME: huggingface_hub reads them once, at its import, so it must not be), and it starts no thread
# (OMP_NUM_THREADS=1, what every server had; pandas would start jemalloc's).
APP_PRELOAD = ("import numpy, torch, PIL.Image, plotly.graph_objects, streamlit, streamlit.web.cli, "
               "streamlit.web.bootstrap, sys, os\n"
               "assert not {'huggingface_hub', 'transformers', 'vit', 'pandas'} & set(sys.modules), 'read at import'\n"
               "assert len(os.listdir('/proc/self/task')) == 1, 'a thread started'")
APP_SERVERS = ForkServer(APP_PRELOAD, env={"OMP_NUM_THREADS": "1"}, cwd=str(ROOT))


def server_report() -> str:
    """Every live server's thread stacks (SIGUSR1) and the last SERVER_LOG_LINES lines of its output: what a failed
    browser test prints, so that a page that never rendered says where its server was."""
    parts = []
    for process, log in list(LIVE_SERVERS.items()):
        if process.poll() is None:
            process.send_signal(signal.SIGUSR1)
            time.sleep(1.0)  # faulthandler writes from its own thread
        lines = log.read_text(errors="replace").splitlines()[-SERVER_LOG_LINES:] if log.is_file() else []
        parts.append(f"--- server pid {process.pid} (exit code {process.poll()}), {log} ---\n" + "\n".join(lines))
    return "\n".join(parts)


@contextmanager
def streamlit_app(env: dict[str, str], log: Path | None = None, timeout: float = 180.0,
                  unset: Sequence[str] = (), app: str | Path = "app.py",
                  fresh: bool = False) -> Iterator[tuple[str, subprocess.Popen | ForkedProcess]]:
    """``streamlit run app.py`` (or ``app``) on a free loopback port with ``env`` added to the environment (and the
    variables named in ``unset`` removed) and the repository's own config (no file watcher); yields
    ``(url, process)`` once it is healthy, stops it after. Output goes to ``log`` (a temporary file when not
    given), whose tail, with the server's stacks, a failed test prints (``server_report``). The server is forked
    from ``APP_SERVERS`` (torch already imported); ``fresh``, or an ``env`` that sets a PYTHON* variable (read at an
    interpreter's start: a ``sitecustomize`` on PYTHONPATH), starts a fresh interpreter instead."""
    port = free_port()
    inherited = {key: value for key, value in os.environ.items() if key not in unset}
    if log is None:
        log = Path(tempfile.mkdtemp(prefix="streamlit-log-")) / "streamlit.log"
    log.write_bytes(b"")
    argv = ["run", str(app), "--server.port", str(port), "--server.headless", "true", "--server.address", "127.0.0.1",
            "--browser.gatherUsageStats", "false"]
    environment = {**inherited, "OMP_NUM_THREADS": "1", **env}
    if fresh or any(key.startswith("PYTHON") for key in env):
        with log.open("wb") as output:
            process = subprocess.Popen([sys.executable, "-c", LAUNCH, *argv], cwd=ROOT, env=environment,
                                       stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    else:
        process = APP_SERVERS.spawn(LAUNCH, argv, cwd=ROOT, env=environment, output=log, new_session=True)
    LIVE_SERVERS[process] = log
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, process, timeout)
        yield url, process
    finally:
        LIVE_SERVERS.pop(process, None)
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


def selectbox_labelled(at, label: str):
    """The one selectbox of an AppTest page labelled ``label`` (a picker the server chooses for has a moving key:
    app_pages/explorer_sections/checkpoint_picker.py's ``picker``)."""
    found = [box for box in at.selectbox if box.label == label]
    assert len(found) == 1, f"{len(found)} selectboxes labelled {label!r}"
    return found[0]


def follow_page_link(at, label: str, page: str = "app_pages/explorer.py", index: int = 0):
    """What a click on the ``index``-th page link labelled ``label`` does in a browser (AppTest cannot click one):
    ``page``, the page it names (the proto carries only its hash), run with the link's query parameters. Returns
    the AppTest, run."""
    from urllib.parse import parse_qsl

    links = [link for link in at.page_link if link.value == label]
    assert links, f"no page link labelled {label!r}: {[link.value for link in at.page_link]}"
    link = links[index]
    assert not link.proto.disabled, f"the link {label!r} is disabled"
    for name, value in parse_qsl(link.proto.query_string):
        at.query_params[name] = value
    return at.switch_page(page).run()
