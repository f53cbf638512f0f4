"""End to end in headless Chromium with a real two-node Ray cluster (issue 23): the app is started with
VIT_RAY_ADDRESS, "the Ray cluster" is chosen as the device with two workers, and the run launched from the Train
page completes on the cluster and shows its curves."""

from __future__ import annotations

import pytest
from helpers import ARTIFACTS, chromium, streamlit_app
from test_browser_training import SLOW_MS, fill_tiny_run
from test_runs import make_image_folder

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def app_url(ray_cluster, tmp_path):
    pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")
    env = {"VIT_RUNS_DIR": str(tmp_path / "runs"), "VIT_DATA_DIR": str(tmp_path / "data"),
           "VIT_DATA_ROOTS": str(tmp_path), "VIT_RAY_ADDRESS": ray_cluster.address}
    with streamlit_app(env, log=tmp_path / "streamlit.log", timeout=300) as (url, _):
        yield url, make_image_folder(tmp_path / "images")


def test_a_run_launched_on_the_ray_cluster_from_the_page_completes(app_url):
    url, images = app_url
    ARTIFACTS.mkdir(exist_ok=True)
    name = "browser-ray"
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        page.set_default_timeout(SLOW_MS)
        page.goto(url)
        page.get_by_role("link", name="Train").click()
        page.get_by_role("button", name="Launch").wait_for()
        page.get_by_text("the Ray cluster: 2 node(s)").wait_for()  # read from Ray's dashboard
        fill_tiny_run(page, name, images, num_layers=1, epochs=1)
        page.get_by_role("combobox", name="Device").click()
        page.get_by_role("option", name="the Ray cluster").click()
        workers = page.get_by_label("Ray workers", exact=True)
        workers.fill("2")
        workers.press("Tab")
        page.get_by_role("button", name="Launch").click()
        page.get_by_text(f"Started {name} on the Ray cluster").wait_for()
        page.get_by_text(f"{name} · completed").wait_for()
        page.get_by_text("Accuracy", exact=True).wait_for()  # the finished epoch's curves
        page.screenshot(path=ARTIFACTS / "training-ray-completed.png", full_page=True)
