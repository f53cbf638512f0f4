"""A reload keeps the library road's page (issue 116, item 6), in a real browser: a model no port reads, opened by
path after the shipped model's page, is in the address bar as soon as its page draws (before an image is given), so
F5 reopens it, not the shipped model with the previous page's settings. The model is built tiny with random weights
by transformers itself (test_library_path's ``save_family``, conftest's ``msn``); the server (the one the browser
modules share, tests/shared_app.py) runs without a token, so this local visitor may open paths."""

from urllib.parse import parse_qs, urlsplit

import pytest
from helpers import BROWSER_TIMEOUT_MS, chromium
from test_browser_explorer import SCRIPT_DONE

pytest.importorskip("transformers")
pytestmark = [pytest.mark.browser, pytest.mark.slow]

HINT = "Upload an image in the sidebar to see what the model attends to."


def test_a_reload_of_the_library_page_reopens_its_model(local_app, msn):
    # The shared server (tests/shared_app.py): the shipped model has samples, so its page draws its view at once.
    url, folder = local_app.url, msn
    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1500, "height": 1100}).new_page()
        page.set_default_timeout(BROWSER_TIMEOUT_MS)
        page.goto(url)
        page.wait_for_function(SCRIPT_DONE)
        page.wait_for_function("() => new URL(location.href).searchParams.has('map')")  # the shipped model's view
        box = page.get_by_role("textbox", name="Open a path")
        box.fill(str(folder))
        box.press("Enter")
        page.get_by_text(HINT).wait_for()
        page.wait_for_function(f"() => new URL(location.href).searchParams.get('model') === {str(folder)!r}")
        assert parse_qs(urlsplit(page.url).query) == {"model": [str(folder)]}  # none of the shipped model's view
        page.reload()
        page.get_by_text(HINT).wait_for()  # the library page again, waiting for its image: not the shipped model
        page.wait_for_function(SCRIPT_DONE)
        assert parse_qs(urlsplit(page.url).query) == {"model": [str(folder)]}
