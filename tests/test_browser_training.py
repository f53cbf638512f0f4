"""End to end in headless Chromium: launch a run from the training page, see it complete, scrub its attention
snapshots epoch by epoch and open it in the explorer. Screenshots go to test-artifacts/.

Runs the real app (``streamlit run app.py``) on a free port with its own runs and data folders, a server for each
test. Each test's page is a tab of one blank page of the module (tests/browser_tabs.py), one renderer for the three
where each page started its own: a tab's loads are sessions of their own, and the app keeps no cookie and no browser
storage, so each server still sees a first visitor of its own.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from browser_tabs import opener, tabs
from helpers import ARTIFACTS, BROWSER_TIMEOUT_MS, RUN_MS, chromium, streamlit_app
from test_runs import make_image_folder

ROOT = Path(__file__).resolve().parent.parent
SLOW_MS = RUN_MS  # a step that waits for a training process (it imports torch on two busy cores) and its run

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def app_url(tmp_path):
    pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")
    if not (ROOT / "app.py").is_file():
        pytest.skip("app.py (the app's navigation) is not in the repository yet")
    env = {"VIT_RUNS_DIR": str(tmp_path / "runs"), "VIT_DATA_DIR": str(tmp_path / "data"),
           "VIT_DATA_ROOTS": str(tmp_path)}
    with streamlit_app(env, log=tmp_path / "streamlit.log", timeout=300) as (url, _):
        yield url, make_image_folder(tmp_path / "images")


@pytest.fixture(scope="module")
def first():
    """The blank page the tests' tabs are opened from (tests/browser_tabs.py); each test sets its tab's viewport."""
    with chromium() as browser:
        yield opener(browser)


def fill_tiny_run(page, name: str, images: Path, num_layers: int, epochs: int) -> None:
    """Fill the launch form, as a user types it, for a tiny 16 px model on the image folder ``images``."""
    page.get_by_text("Custom sizes (override the preset)").click()
    for label, value in [("Image size", "16"), ("Patch size", "4"), ("Hidden size", "16"),
                         ("Num layers", str(num_layers)), ("Num heads", "2"), ("Mlp size", "32"),
                         ("Epochs", str(epochs)), ("Batch size", "4"), ("Warmup epochs", "0"), ("Run name", name),
                         ("Folder (for an image folder)", str(images))]:
        field = page.get_by_label(label, exact=True)
        field.fill(value)
        field.press("Tab")
    page.get_by_role("combobox", name="Dataset").click()
    page.get_by_role("option", name="Image folder…").click()


def step_left(page, slider, to: int) -> None:
    """One arrow key to the left, as a user would; again if the panel's own refresh redrew the slider
    (and took the focus) before the key arrived."""
    from playwright.sync_api import Error, expect

    for _ in range(20):
        slider.focus()
        slider.press("ArrowLeft")
        try:
            expect(slider).to_have_attribute("aria-valuetext", str(to), timeout=10_000)
            return
        except (AssertionError, Error):
            if int(slider.get_attribute("aria-valuetext")) < to:
                raise AssertionError(f"the slider went past epoch {to}") from None
    raise AssertionError(f"the slider did not reach epoch {to}")


def test_a_run_launched_from_the_page_completes_shows_its_snapshots_and_opens_in_the_explorer(app_url, first):
    """Long (~25 s of CPU) because a real training process runs 3 epochs, launched and watched from the page of a
    server of its own, and the run is opened in the explorer, in a real Chromium. One run for what were two tests
    (this one's launch with its explorer, and test_browser_snapshots' scrub of a 3-epoch run's snapshots): a
    server, a training process and their page loads fewer (issue 112)."""
    from playwright.sync_api import expect

    url, images = app_url
    ARTIFACTS.mkdir(exist_ok=True)
    name = "browser-tiny"
    with tabs(first, BROWSER_TIMEOUT_MS) as tab:
        page = tab()
        page.set_viewport_size({"width": 1400, "height": 2400})
        try:
            page.goto(url)  # the explorer, the default page; then the navigation, as a user would
            page.get_by_role("link", name="Train").click()
            page.get_by_role("button", name="Launch").wait_for()

            fill_tiny_run(page, name, images, num_layers=2, epochs=3)
            page.screenshot(path=ARTIFACTS / "training-form.png", full_page=True)
            page.get_by_role("button", name="Launch").click()

            page.get_by_text(f"Started {name} on").wait_for(timeout=SLOW_MS)
            page.screenshot(path=ARTIFACTS / "training-launched.png", full_page=True)
            page.get_by_text(f"{name} · completed").wait_for(timeout=SLOW_MS)
            page.get_by_text("Accuracy", exact=True).wait_for()  # the curves of the finished epochs
            page.screenshot(path=ARTIFACTS / "training-completed.png", full_page=True)

            # The snapshot panel refreshes on its own: the last epoch shows once the run is done.
            page.get_by_text("Attention during training").wait_for(timeout=SLOW_MS)
            page.get_by_text(f"Epoch 3 of {name}:", exact=False).wait_for(timeout=SLOW_MS)
            page.screenshot(path=ARTIFACTS / "snapshots-epoch-3.png", full_page=True)
            slider = page.get_by_role("slider", name="Epoch")
            expect(slider).to_have_attribute("aria-valuetext", "3", timeout=SLOW_MS)
            for epoch in (2, 1, 0):  # scrub back to the initial weights, one epoch at a time
                step_left(page, slider, to=epoch)
                page.get_by_text(f"Epoch {epoch} of {name}:", exact=False).wait_for(timeout=SLOW_MS)
                page.get_by_role("img").first.wait_for(timeout=SLOW_MS)
            page.screenshot(path=ARTIFACTS / "snapshots-epoch-0.png", full_page=True)
            # Under each probe image its true class, the epoch's prediction and its probability ('cat → dog 71 % ✗');
            # the panel's caption also holds an arrow, so the probe captions are matched by their own format.
            captions = page.get_by_text(re.compile(r"^\S+ → \S+ \d+ ?% [✓✗]$"))
            captions.first.wait_for(timeout=SLOW_MS)
            assert captions.count() >= 2

            page.get_by_role("link", name=re.compile(r"^Open in explorer \(best weights: epoch [1-3], val acc")).click()
            page.get_by_text(f"{name}/best.pt").wait_for()  # the picker's description of it
            page.screenshot(path=ARTIFACTS / "explorer-opened-run.png", full_page=True)
            page.get_by_role("combobox", name="Checkpoint").click()
            page.get_by_role("option", name=re.compile(f"^run {re.escape(name)} ")).wait_for()
            page.screenshot(path=ARTIFACTS / "explorer-checkpoint-list.png", full_page=True)
        except Exception:
            page.screenshot(path=ARTIFACTS / "training-failure.png", full_page=True)
            raise


@pytest.mark.parametrize("path, title", [("training", "Train a Vision Transformer"), ("analyze", "Analyse a dataset")])
def test_a_page_opened_first_by_its_url_runs_inside_the_apps_navigation(app_url, first, path, title):
    """A fresh server whose first visitor opens a page's own URL (a bookmark, or a tab reloaded after a restart):
    with a ``pages/`` folder next to app.py, Streamlit ran that file alone as a legacy page until some session
    had called ``st.navigation``: no wide layout, and a menu of file names ("app", "analyze", "explorer",
    "training") whose "app" entry ran app.py as one more page. The pages live in ``app_pages/``."""
    url, _ = app_url
    with tabs(first, BROWSER_TIMEOUT_MS) as tab:
        page = tab()
        page.set_viewport_size({"width": 1400, "height": 900})
        page.goto(f"{url}/{path}")
        page.get_by_role("heading", name=title).wait_for()
        page.wait_for_function("""() => document.querySelector('[data-testid="stApp"]')
            .getAttribute('data-test-script-state') !== 'running'""")
        menu = page.locator('[data-testid="stSidebarNav"] a').all_inner_texts()
        assert [re.sub(r"^\S+\n", "", m).strip() for m in menu] == ["Explore attention", "Train",
                                                                    "Analyse a dataset"], menu
        assert page.locator('[data-testid="stMain"]').bounding_box()["width"] > 1000  # app.py's wide layout
