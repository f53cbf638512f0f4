"""End to end in headless Chromium: launch a run from the training page, see it complete, open it
in the explorer. Screenshots go to test-artifacts/.

Runs the real app (``streamlit run app.py``) on a free port with its own runs and data folders.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
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


def test_a_run_launched_from_the_page_completes_and_opens_in_the_explorer(app_url):
    url, images = app_url
    ARTIFACTS.mkdir(exist_ok=True)
    name = "browser-tiny"
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        page.set_default_timeout(BROWSER_TIMEOUT_MS)
        try:
            page.goto(url)  # the explorer, the default page; then the navigation, as a user would
            page.get_by_role("link", name="Train").click()
            page.get_by_role("button", name="Launch").wait_for()

            fill_tiny_run(page, name, images, num_layers=1, epochs=1)
            page.screenshot(path=ARTIFACTS / "training-form.png", full_page=True)
            page.get_by_role("button", name="Launch").click()

            page.get_by_text(f"Started {name} on").wait_for(timeout=SLOW_MS)
            page.screenshot(path=ARTIFACTS / "training-launched.png", full_page=True)
            page.get_by_text(f"{name} · completed").wait_for(timeout=SLOW_MS)
            page.get_by_text("Accuracy", exact=True).wait_for()  # the curves of the finished epoch
            page.screenshot(path=ARTIFACTS / "training-completed.png", full_page=True)

            page.get_by_role("link", name=re.compile(r"^Open in explorer \(best weights: epoch 1, val acc")).click()
            page.get_by_text(f"{name}/best.pt").wait_for()  # the picker's description of it
            page.screenshot(path=ARTIFACTS / "explorer-opened-run.png", full_page=True)
            page.get_by_role("combobox", name="Checkpoint").click()
            page.get_by_role("option", name=re.compile(f"^run {re.escape(name)} ")).wait_for()
            page.screenshot(path=ARTIFACTS / "explorer-checkpoint-list.png", full_page=True)
        except Exception:
            page.screenshot(path=ARTIFACTS / "training-failure.png", full_page=True)
            raise


@pytest.mark.parametrize("path, title", [("training", "Train a Vision Transformer"), ("analyze", "Analyse a dataset")])
def test_a_page_opened_first_by_its_url_runs_inside_the_apps_navigation(app_url, path, title):
    """A fresh server whose first visitor opens a page's own URL (a bookmark, or a tab reloaded after a restart):
    with a ``pages/`` folder next to app.py, Streamlit ran that file alone as a legacy page until some session
    had called ``st.navigation``: no wide layout, and a menu of file names ("app", "analyze", "explorer",
    "training") whose "app" entry ran app.py as one more page. The pages live in ``app_pages/``."""
    url, _ = app_url
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(BROWSER_TIMEOUT_MS)
        page.goto(f"{url}/{path}")
        page.get_by_role("heading", name=title).wait_for()
        page.wait_for_function("""() => document.querySelector('[data-testid="stApp"]')
            .getAttribute('data-test-script-state') !== 'running'""")
        menu = page.locator('[data-testid="stSidebarNav"] a').all_inner_texts()
        assert [re.sub(r"^\S+\n", "", m).strip() for m in menu] == ["Explore attention", "Train",
                                                                    "Analyse a dataset"], menu
        assert page.locator('[data-testid="stMain"]').bounding_box()["width"] > 1000  # app.py's wide layout
