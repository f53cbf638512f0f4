"""The explorer in a real browser: ``streamlit run app.py`` driven through headless Chromium with Playwright.

Uses Debian's /usr/bin/chromium (no browser download); skipped with a reason where it is
missing. Screenshots go to test-artifacts/ (git-ignored).
"""

import io
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from browser_tabs import new_tab, opener
from helpers import ARTIFACTS, BROWSER_TIMEOUT_MS, chromium, ship_default, streamlit_app
from PIL import Image
from shared_app import TINY, png

from app_pages.explorer_sections.uploader import REPLACE_WAIT_S, UPLOAD_WAIT_S
from vit.model import ViTConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
# The server imports torch and runs the model on a busy machine.
TIMEOUT_MS = BROWSER_TIMEOUT_MS  # what a user would wait (tests/helpers.py)


@pytest.fixture(scope="module")
def world(local_app, tmp_path_factory):
    """The shared app's folders (tests/shared_app.py: a tiny random model under the default name with its samples,
    cat_1.png first), and an image to upload (read, never written, by the tests: one for the module)."""
    upload = tmp_path_factory.mktemp("world") / "wide-upload.png"
    upload.write_bytes(png(120, 80, seed=2))
    return local_app.checkpoints, local_app.runs, upload


@pytest.fixture(scope="module")
def server(local_app):
    """The app on ``world``: the server the browser modules share; each test opens its own browser session on it."""
    return local_app.url


@pytest.fixture(scope="module")
def browser():
    """One Chromium for the module's tests, each in a tab of its own (its own session): a launch took ~1.5 s of CPU
    (Python, Playwright's driver, Chromium), paid once (issue 112)."""
    with chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def first(browser):
    """The blank page every test's tab is opened from (tests/browser_tabs.py: one renderer for the module's pages)."""
    return opener(browser, viewport={"width": 1500, "height": 1100})


@pytest.fixture
def page(first):
    """A tab of the test's own (its listeners, routes and viewport go with it); each load a new session."""
    page = new_tab(first, TIMEOUT_MS)
    yield page
    page.close()


SCROLL_TOP = """() => Math.max(...[document.scrollingElement,
  ...document.querySelectorAll('[data-testid="stMain"], [data-testid="stAppViewContainer"], section.main')]
  .map(e => e ? e.scrollTop : 0))"""


SCRIPT_DONE = """() => document.querySelector('[data-testid="stApp"]')
    .getAttribute('data-test-script-state') !== 'running'"""


def expect_selected(page, label: str, start: str, exact: bool = False, timeout_ms: float = TIMEOUT_MS) -> None:
    """Wait until the selectbox labelled ``label`` shows an option that starts with ``start``; fails after
    ``timeout_ms``. The rerun that draws a caption can redraw the selectbox after it: ``input_value()`` read right
    after the caption may still be the last run's."""
    from playwright.sync_api import expect

    box = page.get_by_role("combobox", name=label, exact=exact)
    expect(box).to_have_value(re.compile("^" + re.escape(start)), timeout=timeout_ms)


def test_upload_predict_and_click_a_patch_in_a_real_browser(server, world, page):
    """Long (~13 s of CPU) because it is the module's first on its server (the model's load, where no browser module
    before it opened the shared server) and its scenario is the explorer's page drawn and clicked in a real Chromium,
    twice (an upload, then a patch)."""
    _, _, upload = world
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(server)
    page.wait_for_selector('[data-testid="stApp"]')
    # The default checkpoint opens on its sample: a prediction, the picker and the overlay.
    page.get_by_text("Colours span").wait_for()
    page.get_by_text("cat_1.png, 32×32 px").wait_for()

    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(upload))
    page.get_by_text("wide-upload.png, 120×80 px").wait_for()
    charts = page.locator('[data-testid="stPlotlyChart"]')
    page.wait_for_function("document.querySelectorAll('[data-testid=\"stPlotlyChart\"] .bars .point').length >= 3")
    # The model's input decoded (not a broken link); the image and the overlay drawn in their charts.
    page.wait_for_function("Array.from(document.querySelectorAll('[data-testid=\"stImage\"] img'))"
                           ".filter(img => img.complete && img.naturalWidth > 0).length >= 1")
    page.wait_for_function("document.querySelectorAll('[data-testid=\"stPlotlyChart\"] svg image')"
                           ".length >= 2")
    expect_selected(page, "Query token", "0 · CLS")
    page.screenshot(path=str(ARTIFACTS / "explorer-upload.png"), full_page=True)

    # Click the patch in row 2, column 3 of the 4 x 4 grid: token 1 + 1 * 4 + 2 = 7.
    picker = charts.first.locator(".nsewdrag").first
    box = picker.bounding_box()
    page.mouse.click(box["x"] + box["width"] * 2.5 / 4, box["y"] + box["height"] * 1.5 / 4)
    page.get_by_text("the query patch row 2, col 3 (outlined)").wait_for()
    expect_selected(page, "Query token", "7 · patch row 2, col 3")
    page.screenshot(path=str(ARTIFACTS / "explorer-clicked-patch.png"), full_page=True)

    # A second click elsewhere moves the query again (the picker is redrawn with a fresh selection).
    page.mouse.click(box["x"] + box["width"] * 0.5 / 4, box["y"] + box["height"] * 3.5 / 4)
    page.get_by_text("the query patch row 4, col 1 (outlined)").wait_for()
    expect_selected(page, "Query token", "13 · patch row 4, col 1")

    # Issue 10, rough edge 6: opening another tab keeps the scroll position and the "Every layer" toggle.
    page.get_by_text("Every layer (").click()
    page.get_by_text("(2 × 2 = 4 maps)").wait_for()
    tab = page.get_by_role("tab", name="Attention matrix")
    tab.scroll_into_view_if_needed()
    page.mouse.wheel(0, 300)
    page.wait_for_timeout(500)
    before = page.evaluate(SCROLL_TOP)
    assert before > 0
    tab.click()
    page.get_by_text("Row i is what token i attends to").wait_for()
    page.get_by_role("tab", name="Heads").click()
    page.get_by_text("Click a head").wait_for()
    assert abs(page.evaluate(SCROLL_TOP) - before) <= 5
    assert page.get_by_role("switch", name="Every layer").is_checked()


# -- a ViT-B/16-shaped model at a keep-aspect input size ------------------------------------------------------------

def photo(width: int, height: int, seed: int) -> bytes:
    """A smooth, photo-like image (noise is unlike photos and slow to encode)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (height // 40, width // 40, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def base_server(tmp_path):
    """The app on a random ViT-B/16 (our own format, 12 layers x 12 heads) shipped under the default name."""
    checkpoints, runs = ship_default(tmp_path, ViTConfig.from_preset("vit-base-16"),
                                     [f"class {i}" for i in range(1000)])
    env = {"VIT_CHECKPOINTS_DIR": str(checkpoints), "VIT_RUNS_DIR": str(runs)}
    with streamlit_app(env, log=tmp_path / "server.log") as (url, _):
        yield url, tmp_path


# The overlay's image: the visible chart keyed overlay_picker. Streamlit keeps a keyed chart's previous instance,
# hidden, in the page until the run ends, and the image beside the map is redrawn before the model runs: the second
# chart in the page is not always the map.
OVERLAY_HREF = """() => {
  const charts = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')].filter(c => c.checkVisibility());
  const chart = charts.find(c => c.closest('.st-key-overlay_picker')) || charts[1];
  const image = chart && chart.querySelector('.layer-below image, .imagelayer image');
  return image ? image.getAttribute('href') : null;
}"""


def image_boxes(page) -> list[dict]:
    """Screen boxes of the clickable image and of the overlay (the first two charts' layout images), once both
    are laid out (a chart redrawn after a rerun has no box for a moment)."""
    charts = page.locator('[data-testid="stPlotlyChart"]')
    images = [charts.nth(i).locator(".layer-below image, .imagelayer image").first for i in (0, 1)]
    for _ in range(50):
        boxes = [image.bounding_box() for image in images]
        if all(boxes):
            return boxes
        page.wait_for_timeout(200)
    raise AssertionError(f"the image and the overlay were not both laid out: {boxes}")


def open_dropdown(page, label: str) -> None:
    """Open the selectbox labelled ``label``: a click right after a rerun sometimes only focuses it."""
    box = page.get_by_role("combobox", name=label, exact=True)
    for _ in range(5):
        box.click()
        try:
            page.get_by_role("listbox").wait_for(timeout=3000)
            return
        except Exception:  # playwright's TimeoutError: click again
            page.keyboard.press("Escape")
    page.get_by_role("listbox").wait_for()


def choose(page, label: str, option: str) -> None:
    """Pick ``option`` in the selectbox labelled ``label`` by typing it, as a keyboard user would."""
    box = page.get_by_role("combobox", name=label, exact=True)
    box.click()
    page.keyboard.type(option)
    page.keyboard.press("Enter")


def wait_for_new_overlay(page, before: str, timeout_ms: float | None = None) -> float:
    """Seconds until the overlay image differs from ``before``."""
    start = time.perf_counter()
    page.wait_for_function(f"(before) => ({OVERLAY_HREF})() !== before", arg=before, timeout=timeout_ms)
    return time.perf_counter() - start


# Records what the page shows, now and at every change: the file name in the caption of the image, or "no image"
# for the page that asks for one. What a user sees while the page changes.
SHOWN_WATCH = """() => {
  window.__shown = [];
  const seen = () => {
    let now = null;
    for (const c of document.querySelectorAll('[data-testid="stCaptionContainer"]')) {
      const m = c.innerText.match(/^Click a patch to make it the query\\. (\\S+), /);
      if (m) now = m[1];
    }
    if (document.body.innerText.includes('Upload an image in the sidebar')) now = 'no image';
    if (now !== null && window.__shown[window.__shown.length - 1] !== now) window.__shown.push(now);
  };
  seen();
  new MutationObserver(seen).observe(document.body, {childList: true, subtree: true, characterData: true});
}"""


def test_a_new_upload_replaces_the_last_one_without_the_empty_page_in_between(tmp_path, page):
    """Long (~10 s of CPU) because it needs a server of its own (a model without samples) and two uploads drawn in
    a real Chromium."""
    # Issue 51: Streamlit's uploader asks for a run without any file before the one with the new file. Finished,
    # that run stripped the page to "Upload an image" for a moment (a model without samples; with samples it is
    # stopped before it draws) and the next drew every chart anew; the page now waits for the next request, and
    # the browser updates the last upload's view in place.
    checkpoints, runs = ship_default(tmp_path, TINY, ["airplane", "cat", "dog"])  # no sample images
    first, second = tmp_path / "first-upload.png", tmp_path / "second-upload.png"
    first.write_bytes(png(120, 80, seed=2))
    second.write_bytes(png(64, 48, seed=3))
    received = []  # what the server sent: each run starts with new_session
    page.on("websocket", lambda ws: ws.on("framereceived", lambda frame: received.append(forward_kind(frame))))
    with streamlit_app({"VIT_CHECKPOINTS_DIR": str(checkpoints), "VIT_RUNS_DIR": str(runs)}) as (url, _):
        page.goto(url)
        page.get_by_text("Upload an image in the sidebar").wait_for()
        uploader = page.locator('[data-testid="stFileUploaderDropzoneInput"]')
        uploader.set_input_files(str(first))
        page.get_by_text("first-upload.png, 120×80 px").wait_for()
        page.wait_for_function(SCRIPT_DONE)
        page.evaluate(SHOWN_WATCH)
        received.clear()
        # The new file takes longer to arrive than the page's wait for a rerun (a photo over a real network): the
        # run without a file waits for as long as the upload takes.
        page.route("**/_stcore/upload_file/**", lambda route: (
            time.sleep(3 * REPLACE_WAIT_S) if route.request.method == "PUT" else None, route.continue_()))
        uploader.set_input_files(str(second))
        page.get_by_text("second-upload.png, 64×48 px").wait_for()
        page.wait_for_function(SCRIPT_DONE)
        assert page.evaluate("() => window.__shown") == ["first-upload.png", "second-upload.png"]
        frames = len(received)
        # Removed, the file is not awaited: the page asks for an image again after its short wait for a rerun,
        # not when the file's upload (which arrived, then was deleted) would be given up on (UPLOAD_WAIT_S).
        page.locator('[data-testid="stFileChipDeleteBtn"] button').click()
        page.get_by_text("Upload an image in the sidebar").wait_for(timeout=UPLOAD_WAIT_S * 1000 / 3)
        del received[frames:]
    # The run without a file waited at the script's start and stopped there: the browser got nothing of it to lay
    # out (page settings, navigation, the sidebar's first widgets) while the next run's model ran.
    runs_sent = "".join("|" if kind == "new_session" else "d" if kind == "delta" else "" for kind in received)
    assert runs_sent.startswith("||") or runs_sent.count("|") == 1, received  # 1: both requests before a run


def forward_kind(frame) -> str:
    """The kind of a websocket frame from Streamlit's server (a ``ForwardMsg``: new_session, delta, ...)."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    message = ForwardMsg()
    message.ParseFromString(frame if isinstance(frame, bytes) else frame.encode())
    return message.WhichOneof("type")


def test_an_enlarged_zoomed_picker_and_the_patch_similarity_pick_the_patch_clicked(server, page):
    """Issue 19, item 9: enlarged, the wheel zooms the image around the cursor and a click still picks the patch
    under it (a pan, not a box selection, is what a drag does); the overlay zooms with it (issue 33, item 6).

    Then, on the same page, issue 69, item 1: a click on a patch of "Patch similarity" makes it the query (the
    chart's state was read without its ``.selection``, so a click reran the page and kept the old patch). Its query
    is its own (the section's "Patch"), not the main view's: it starts at the middle token whatever was clicked
    above. It was a test of its own, which loaded the page again (issue 112)."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(server)
    page.get_by_text("cat_1.png, 32×32 px").wait_for()
    page.get_by_text("Enlarge the image and the map").click()
    page.wait_for_function("""() => { const p = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
        return p && p._fullLayout && p._fullLayout.xaxis2 && p.querySelector('.modebar'); }""")  # the linked figure
    page.wait_for_function(SCRIPT_DONE)
    time.sleep(1)  # the rerun's layout settles
    plot = page.locator('[data-testid="stPlotlyChart"]').first
    box = plot.locator(".nsewdrag").first.bounding_box()
    x, y = box["x"] + box["width"] * 2.5 / 4, box["y"] + box["height"] * 1.5 / 4
    span = """() => { const r = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot')
        .layout.xaxis.range; return r[1] - r[0]; }"""
    whole = page.evaluate(span)
    page.mouse.move(x, y)
    for _ in range(4):  # zoom in around the cursor (~10 % a notch): the point under it stays where it is
        page.mouse.wheel(0, -400)
        time.sleep(0.3)
    page.wait_for_function(f"() => ({span})() < 0.8 * {whole}")
    # Issue 33, item 6: the overlay beside it shows the same window (its axes match the image's).
    ranges = page.evaluate("""() => { const l = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot')
        ._fullLayout; return [l.xaxis.range, l.xaxis2.range, l.yaxis.range, l.yaxis2.range]; }""")
    assert ranges[1] == ranges[0] and ranges[3] == ranges[2], ranges
    page.mouse.click(x, y)
    page.get_by_text("the query patch row 2, col 3 (outlined)").wait_for()
    expect_selected(page, "Query token", "7 · patch row 2, col 3")
    page.screenshot(path=str(ARTIFACTS / "explorer-enlarged-zoomed.png"), full_page=True)

    page.get_by_text("What the patches represent").click()
    page.get_by_text("Cosine similarity to patch row 3, col 1").wait_for()  # the middle token (9) at first
    page.wait_for_function(SCRIPT_DONE)
    picker = page.locator("xpath=//*[contains(text(), 'Patch similarity')]/following::*"
                          "[@data-testid='stPlotlyChart'][1]")
    picker.scroll_into_view_if_needed()
    box = picker.locator(".nsewdrag").first.bounding_box()
    page.mouse.click(box["x"] + box["width"] * 2.5 / 4, box["y"] + box["height"] * 1.5 / 4)  # row 2, col 3
    page.get_by_text("Cosine similarity to patch row 2, col 3").wait_for()
    expect_selected(page, "Patch", "7 · patch row 2, col 3", exact=True)
    page.screenshot(path=str(ARTIFACTS / "explorer-similarity-click.png"), full_page=True)


def test_a_fresh_servers_first_page_says_the_model_is_loading_before_the_page_is_drawn(world, tmp_path, page):
    """Issue 69, item 7: a freshly started server's first page was blank while the page imported PyTorch (10-14 s
    on a busy machine). Its title and a "loading the model" line come first, and go when the page draws its own."""
    from app_pages.explorer_sections.starting import LINE

    checkpoints, runs, _ = world
    outside = []  # requests that leave the machine: none (the app works offline)
    page.on("request", lambda r: None if r.url.startswith(("http://127.0.0.1", "data:", "blob:"))
            else outside.append(r.url))
    with streamlit_app({"VIT_CHECKPOINTS_DIR": str(checkpoints), "VIT_RUNS_DIR": str(runs)},
                       log=tmp_path / "server.log", fresh=True) as (url, _):  # torch not imported yet
        page.goto(url)
        page.get_by_text(LINE).wait_for()  # before torch is imported: nothing of the page's own yet
        assert page.get_by_text("Colours span").count() == 0
        assert page.get_by_role("heading", name="ViT Attention Explorer").count() == 1
        page.get_by_text("Colours span").wait_for()
        page.wait_for_function(SCRIPT_DONE)
        assert page.get_by_text(LINE).count() == 0
        assert page.get_by_role("heading", name="ViT Attention Explorer").count() == 1
    assert outside == []  # the page icon was a Material icon, fetched from fonts.gstatic.com


# Loaded by the server's interpreter at start (Python imports ``sitecustomize`` from its path): every call of the main
# view, i.e. every run of the whole page, writes a line to EXPLORER_CALLS_LOG. The page imports ``main_view`` from its
# module on each run, so it gets the counted one.
COUNT_MAIN_VIEW = """
import os
from pathlib import Path

import app_pages.explorer_sections.main_view as module

_main_view = module.main_view


def main_view(*args, **kwargs):
    with Path(os.environ["EXPLORER_CALLS_LOG"]).open("a") as log:
        log.write("main_view\\n")
    return _main_view(*args, **kwargs)


module.main_view = main_view
"""


@pytest.fixture
def counted_server(world, tmp_path):
    """The app of ``server`` with its page runs counted; yields (url, the count's log)."""
    checkpoints, runs, _ = world
    (tmp_path / "counting").mkdir()
    (tmp_path / "counting" / "sitecustomize.py").write_text(COUNT_MAIN_VIEW)
    calls = tmp_path / "calls.log"
    env = {"VIT_CHECKPOINTS_DIR": str(checkpoints), "VIT_RUNS_DIR": str(runs), "EXPLORER_CALLS_LOG": str(calls),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "counting"), str(ROOT)])}
    with streamlit_app(env) as (url, _):
        yield url, calls


def page_runs(page, calls: Path) -> int:
    page.wait_for_function(SCRIPT_DONE)
    page.wait_for_timeout(500)  # a rerun a click asked for has started by now
    page.wait_for_function(SCRIPT_DONE)
    return calls.read_text().count("main_view") if calls.exists() else 0


def test_a_tab_click_reruns_its_section_alone(counted_server, page):
    """Long (~13 s of CPU) because it needs a server of its own (one that counts its runs) and clicks each tab in a
    real Chromium.

    Issue 35: the heads / matrix / distance tabs and the Mechanism tabs are fragments; a click on one of their tabs
    redraws that section without running the rest of the page (the main view, its overlay and figures)."""
    url, calls = counted_server
    page.goto(url)
    page.get_by_text("cat_1.png, 32×32 px").wait_for()
    page.get_by_text("Mechanism: logit lens").click()  # a page setting: the whole page runs
    page.get_by_role("tab", name="Head attribution").wait_for()
    runs = page_runs(page, calls)
    assert runs >= 2

    page.get_by_role("tab", name="Attention matrix").click()
    page.get_by_text("Row i is what token i attends to").wait_for()
    assert page_runs(page, calls) == runs
    page.get_by_role("tab", name="Head attribution").click()
    page.get_by_text("direct contribution to the logit").wait_for()
    assert page_runs(page, calls) == runs

    page.get_by_text("Enlarge the image and the map").click()  # a setting of the main view: it runs again
    page.get_by_text("Enlarge the image and the map").wait_for()
    assert page_runs(page, calls) > runs


def test_vit_base_at_a_keep_aspect_size_in_a_real_browser(base_server, page):
    """Long (~18 s of CPU) because its subject is a ViT-Base (86 M parameters) at 224 and 384 px, opened by a
    server of its own and drawn in a real Chromium."""
    try:
        check_vit_base_at_a_keep_aspect_size(base_server, page)
    finally:  # what the page looked like, also when a step timed out
        page.screenshot(path=str(ARTIFACTS / "explorer-vit-base-keep-aspect.png"), full_page=True)


def check_vit_base_at_a_keep_aspect_size(base_server, page) -> None:
    url, tmp_path = base_server
    upload = tmp_path / "street.png"
    upload.write_bytes(photo(640, 480, seed=3))
    ARTIFACTS.mkdir(exist_ok=True)
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(url)
    page.get_by_text("Upload an image in the sidebar").wait_for()
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(upload))
    page.get_by_text("sees it as 224×224 px in 14 rows × 14 columns of 16-px patches").wait_for()

    # 384 px, aspect kept: 384 x 288 px, 18 x 24 patches, 433 tokens; the prediction says it is not 224 px.
    choose(page, "Input size", "384 px")
    page.get_by_text("Keep the aspect ratio").click()
    page.get_by_text("sees it as 384×288 px in 18 rows × 24 columns of 16-px patches (433 tokens)").wait_for()
    page.get_by_text("not the 224×224 px the model was trained at").wait_for()
    page.wait_for_function(f"({OVERLAY_HREF})() !== null")

    # Rough edge 2: the clickable image and the overlay at one size and top.
    picker, drawn = image_boxes(page)
    assert abs(picker["y"] - drawn["y"]) <= 1 and abs(picker["width"] - drawn["width"]) <= 1
    assert abs(picker["height"] - drawn["height"]) <= 1 and picker["width"] >= 200

    # Time until the overlay changes: a click on a patch (query change), then a head change.
    timings = {}
    before = page.evaluate(OVERLAY_HREF)
    page.mouse.click(picker["x"] + picker["width"] * 5.5 / 24, picker["y"] + picker["height"] * 2.5 / 18)
    timings["query click -> overlay"] = wait_for_new_overlay(page, before)
    page.get_by_text("the query patch row 3, col 6 (outlined)").wait_for()
    before = page.evaluate(OVERLAY_HREF)
    choose(page, "Head", "head 3")
    timings["head change -> overlay"] = wait_for_new_overlay(page, before)
    page.get_by_text("Layer 12 of 12, head 3").wait_for()

    # Rough edge 8: clicking a thumbnail shows that head (the heads grid is the last chart).
    page.get_by_text("Click a head").scroll_into_view_if_needed()
    before = page.evaluate(OVERLAY_HREF)
    for attempt in range(3):  # a click while the grid is being redrawn after the last rerun can be lost
        grid = page.locator('[data-testid="stPlotlyChart"]').last.locator(".nsewdrag").first
        grid.wait_for()
        box = grid.bounding_box()
        if box is None:  # redrawn just now: try again
            page.wait_for_timeout(500)
            continue
        page.mouse.click(box["x"] + box["width"] * 7.5 / 12, box["y"] + box["height"] / 2)
        try:
            timings["thumbnail click -> overlay"] = wait_for_new_overlay(page, before, timeout_ms=20_000)
            break
        except Exception:  # playwright's TimeoutError
            if attempt == 2:
                raise
    page.get_by_text("Layer 12 of 12, head 8").wait_for()
    print("\nbrowser timings (s):", {k: round(v, 2) for k, v in timings.items()})
    (ARTIFACTS / "browser-timings.txt").write_text("".join(f"{k}: {v:.2f} s\n" for k, v in timings.items()))


def hf_registers_folder(folder: Path) -> Path:
    """A tiny DINOv2 with 2 registers and no classifier, saved by transformers itself: 16 px, 4-px patches."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Dinov2WithRegistersConfig(image_size=16, patch_size=4, hidden_size=8, num_hidden_layers=2,
                                                    num_attention_heads=2, mlp_ratio=2, num_register_tokens=2)
    torch.manual_seed(0)
    transformers.Dinov2WithRegistersModel(config).save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(
        '{"do_resize": true, "size": {"shortest_edge": 20}, "do_center_crop": true, "crop_size": 16, "resample": 3,'
        ' "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}')
    return folder


def test_open_an_hf_folder_by_path_and_see_register_tokens_in_a_real_browser(server, world, page, tmp_path):
    """Long (~13 s of CPU) because a second model (an HF folder) is opened on the server after the first, and both
    are drawn in a real Chromium."""
    _, _, upload = world
    folder = hf_registers_folder(tmp_path / "dinov2-registers")
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(server)
    page.wait_for_selector('[data-testid="stApp"]')
    page.get_by_text("Colours span").wait_for()
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(upload))
    page.get_by_text("wide-upload.png, 120×80 px").wait_for()
    field = page.get_by_role("textbox", name="Open a path")
    field.fill(str(folder))
    field.press("Enter")
    page.get_by_text("No prediction: this model has no classifier").wait_for()
    page.get_by_text("Colours span").wait_for()
    open_dropdown(page, "Query token")
    page.get_by_role("option", name="1 · REG 1").wait_for()
    page.get_by_role("option", name="2 · REG 2").click()
    page.get_by_text("the REG 2 token").first.wait_for()
    expect_selected(page, "Query token", "2 · REG 2")
    page.screenshot(path=str(ARTIFACTS / "explorer-hf-registers.png"), full_page=True)
