"""A reload keeps the library road's page (issue 116, item 6), in a real browser: a model no port reads, opened by
path after the shipped model's page, is in the address bar as soon as its page draws (before an image is given), so
F5 reopens it, not the shipped model with the previous page's settings. The model is built tiny with random weights
by transformers itself (test_library_path's ``save_family``); the server runs without a token, so this local
visitor may open paths."""

from urllib.parse import parse_qs, urlsplit

import pytest
from helpers import BROWSER_TIMEOUT_MS, chromium, ship_default, streamlit_app
from test_browser_explorer import SCRIPT_DONE, TINY, png
from test_library_path import save_family

from vit.core.runfiles import DEFAULT_CHECKPOINT
from vit.runs.access import TOKEN_ENV

pytest.importorskip("transformers")
pytestmark = [pytest.mark.browser, pytest.mark.slow]

HINT = "Upload an image in the sidebar to see what the model attends to."


def test_a_reload_of_the_library_page_reopens_its_model(tmp_path):
    checkpoints, runs = ship_default(tmp_path, TINY, ["airplane", "cat", "dog"])
    samples = checkpoints / "samples" / DEFAULT_CHECKPOINT.rsplit(".", 1)[0]
    samples.mkdir(parents=True)
    (samples / "cat_1.png").write_bytes(png(32, 32, seed=1))  # the shipped model's page draws its view at once
    folder = save_family(tmp_path / "vit_msn", "vit_msn")
    env = {"VIT_CHECKPOINTS_DIR": str(checkpoints), "VIT_RUNS_DIR": str(runs),
           "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_HOME": str(tmp_path / "hf-home")}
    with streamlit_app(env, log=tmp_path / "server.log", unset=(TOKEN_ENV,)) as (url, _), chromium() as browser:
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
