"""An exported view opens offline in headless Chromium (issue 50): no request leaves the file, and hovering a patch
of the map shows its value."""

import numpy as np
import pytest
from helpers import chromium
from PIL import Image

from vit.app.export import View, view_html

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TIMEOUT_MS = 60_000


def test_the_exported_html_opens_offline_and_hovers_each_patchs_value(tmp_path):
    map2d = np.array([[0.125, 0.25], [0.5, 0.75]], dtype=np.float32)
    image = Image.new("RGB", (32, 32), (200, 30, 30))
    path = tmp_path / "view.html"
    path.write_text(view_html(View("red", image, map2d, "**Layer 1**", heads=np.stack([map2d, 1 - map2d]))),
                    encoding="utf-8")
    fetched: list[str] = []
    with chromium() as browser:
        context = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000})
        context.route("**/*", lambda route: (fetched.append(route.request.url), route.continue_()))
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(path.as_uri())
        page.wait_for_selector("#map .nsewdrag")
        box = page.locator("#map .nsewdrag").bounding_box()
        # The bottom-right patch (row 2, column 2): three quarters across and down the map.
        page.mouse.move(box["x"] + box["width"] * 0.75, box["y"] + box["height"] * 0.75)
        hover = page.locator("#map .hoverlayer .hovertext")
        hover.wait_for()
        assert hover.text_content().strip() == "row 2, column 2: 0.75"
        page.wait_for_selector("#heads .nsewdrag")
        box = page.locator("#heads .nsewdrag").bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.1, box["y"] + box["height"] * 0.25)  # head 1, row 1, column 1
        hover = page.locator("#heads .hoverlayer .hovertext")
        hover.wait_for()
        assert hover.text_content().strip() == "head 1, row 1, column 1: 0.125"
    assert errors == []
    assert [url for url in fetched if not url.startswith(("file:", "data:"))] == []
