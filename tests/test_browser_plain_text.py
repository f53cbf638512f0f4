"""Names a file brings are shown as text in a real browser: no image fetched, no link, no bold, in Markdown or Plotly.

A checkpoint whose class names are Markdown and HTML is opened by ``streamlit run app.py`` in
headless Chromium; every request the page makes is recorded.
"""

from pathlib import Path

import pytest
from helpers import chromium, shared_tab, ship_default, streamlit_app

from vit.core.runfiles import DEFAULT_CHECKPOINT
from vit.model import ViTConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_MS = 120_000
TINY = ViTConfig(image_size=16, patch_size=4, num_channels=3, num_classes=3, hidden_size=16, num_layers=2,
                 num_heads=2, mlp_size=32)
CLASSES = ["![x](http://example.invalid/x.png)", "<b>bold</b>", "[link](http://example.invalid/page)"]


@pytest.fixture
def server(tmp_path):
    checkpoints, runs = ship_default(tmp_path, TINY, CLASSES, metadata={"dataset": "<i>tiny</i>"})
    samples = checkpoints / "samples" / Path(DEFAULT_CHECKPOINT).stem
    samples.mkdir(parents=True)
    from PIL import Image

    Image.new("RGB", (32, 32), (200, 30, 30)).save(samples / "red.png")
    with streamlit_app({"VIT_CHECKPOINTS_DIR": str(checkpoints), "VIT_RUNS_DIR": str(runs)}) as (url, _):
        yield url


def test_class_names_are_text_in_the_browser_and_fetch_nothing(server):
    requested: list[str] = []
    with chromium() as browser:
        page = shared_tab(browser, {"width": 1400, "height": 1000})
        page.set_default_timeout(TIMEOUT_MS)
        page.on("request", lambda request: requested.append(request.url))
        page.goto(server)
        page.get_by_text("Colours span").wait_for()
        page.wait_for_function("document.querySelectorAll('[data-testid=\"stPlotlyChart\"] .bars .point')"
                               ".length >= 3")
        # (URLs carry an invisible word joiner that keeps them from becoming links; the reader sees none.)
        sidebar = page.locator('[data-testid="stSidebar"]').inner_text().replace("\u2060", "")
        app = page.locator('[data-testid="stApp"]')
        # The checkpoint's description names every class, as written.
        for name in CLASSES:
            assert name in sidebar
        assert "<i>tiny</i>" in sidebar
        # Nothing was turned into an image, a link or bold text ...
        assert app.locator('img[src*="example.invalid"]').count() == 0
        assert app.locator('a[href*="example.invalid"]').count() == 0
        assert app.locator('[data-testid="stMarkdownContainer"] b, [data-testid="stMarkdownContainer"] i')\
            .count() == 0
        # ... and the prediction chart's labels show the tags instead of applying them.
        labels = page.locator('[data-testid="stPlotlyChart"] .ytick text').all_text_contents()
        assert "<b>bold</b>" in labels, labels
        assert page.locator('[data-testid="stPlotlyChart"] .ytick text b').count() == 0
    assert not [url for url in requested if "example.invalid" in url], "the page fetched a URL a class name gave"
