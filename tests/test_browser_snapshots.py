"""End to end in headless Chromium: launch a 3-epoch run from the Train page and scrub its attention
snapshots epoch by epoch. Screenshots go to test-artifacts/.

Runs the real app (``streamlit run app.py``) on a free port with its own runs and data folders.
"""

from __future__ import annotations

import re

import pytest
from helpers import ARTIFACTS, chromium
from test_browser_training import SLOW_MS, app_url, fill_tiny_run  # noqa: F401 (app_url: the fixture that serves the app)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


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


def test_a_launched_run_shows_its_probe_images_at_every_epoch(app_url):  # noqa: F811
    from playwright.sync_api import expect

    url, images = app_url
    ARTIFACTS.mkdir(exist_ok=True)
    name = "browser-snapshots"
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 2400})
        page.set_default_timeout(SLOW_MS)
        expect.set_options(timeout=SLOW_MS)
        try:
            page.goto(url)
            page.get_by_role("link", name="Train").click()
            page.get_by_role("button", name="Launch").wait_for()
            fill_tiny_run(page, name, images, num_layers=2, epochs=3)
            page.get_by_role("button", name="Launch").click()
            page.get_by_text(f"{name} · completed").wait_for()

            # The snapshot panel refreshes on its own: the last epoch shows once the run is done.
            page.get_by_text("Attention during training").wait_for()
            page.get_by_text(f"Epoch 3 of {name}:", exact=False).wait_for()
            page.screenshot(path=ARTIFACTS / "snapshots-epoch-3.png", full_page=True)
            slider = page.get_by_role("slider", name="Epoch")
            expect(slider).to_have_attribute("aria-valuetext", "3")
            for epoch in (2, 1, 0):  # scrub back to the initial weights, one epoch at a time
                step_left(page, slider, to=epoch)
                page.get_by_text(f"Epoch {epoch} of {name}:", exact=False).wait_for()
                page.get_by_role("img").first.wait_for()
            page.screenshot(path=ARTIFACTS / "snapshots-epoch-0.png", full_page=True)
            # Under each probe image its true class, the epoch's prediction and its probability ('cat → dog 71 % ✗');
            # the panel's caption also holds an arrow, so the probe captions are matched by their own format.
            captions = page.get_by_text(re.compile(r"^\S+ → \S+ \d+ ?% [✓✗]$"))
            captions.first.wait_for()
            assert captions.count() >= 2
        except Exception:
            page.screenshot(path=ARTIFACTS / "snapshots-failure.png", full_page=True)
            raise
