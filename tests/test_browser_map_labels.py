"""What the page calls each main map, in a real browser (issue 76, item 6): the map's panel is headed by the method
(a CAM's "Grad-CAM", not "Attention"), its PNG download is named by it, and the layer slider says what the map reads
of the layers: a CAM reads one block ("Layer", its file name "L2"), rollout runs through layers 1 to the one chosen
("Up to layer", "L1-2"), LeGrad sums from a layer to the last ("From layer").

One page for the module's four maps: the first opened by its link (``?map=``), each later one picked in the sidebar
as a user switches maps (a page load of its own each cost ~4 s of Chromium's CPU, issue 112); a test run alone
opens its map by the link."""

import re

import pytest
from helpers import BROWSER_TIMEOUT_MS, chromium, shared_tab
from test_browser_explorer import SCRIPT_DONE, choose

from vit.app.explorer_page import MORE_METHODS_LABEL
from vit.explain.views import attention_maps

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TIMEOUT_MS = BROWSER_TIMEOUT_MS  # what a user would wait (tests/helpers.py)
SLIDERS = ("Layer", "Up to layer", "From layer")


@pytest.fixture(scope="module")
def server(local_app):
    """The tiny 2-layer model (4 x 4 patches, three classes) under the default name with its samples: the server
    the browser modules share (tests/shared_app.py)."""
    return local_app.url


@pytest.fixture(scope="module")
def maps_page():
    """One page for the module's tests, a tab of the worker's blank page (``helpers.shared_tab``); blank until the first
    test opens it."""
    with chromium() as browser:
        page = shared_tab(browser, {"width": 1500, "height": 1100})  # downloads accepted by default
        page.set_default_timeout(TIMEOUT_MS)
        yield page


def show_map(page, server: str, kind: str) -> None:
    """The page on the ``kind`` map: opened by its link where the page is blank, else picked in the sidebar (the
    "Attention map" choice, or its "More" entry and then the method)."""
    if page.url == "about:blank":
        page.goto(f"{server}?map={kind}")
        return
    page.wait_for_function(SCRIPT_DONE)
    sidebar = page.locator('[data-testid="stSidebar"]')
    if kind in attention_maps.method_map_kinds():
        sidebar.get_by_text(MORE_METHODS_LABEL, exact=True).click()
        choose(page, "Method", attention_maps.method_of(kind).title)
    else:
        sidebar.get_by_text(attention_maps.MAP_KINDS[kind], exact=True).click()
    page.wait_for_function("(kind) => new URL(location.href).searchParams.get('map') === kind", arg=kind)


@pytest.mark.parametrize(("kind", "caption", "heading", "slider", "file_part"), [
    ("gradcam", "Grad-CAM for “", "Grad-CAM", "Layer", "-gradcam-L2-"),
    ("eigencam", "EigenCAM", "EigenCAM", "Layer", "-eigencam-L2-"),
    ("rollout", "Attention rollout through layers 1–2", "Attention", "Up to layer", "-rollout-L1-2-"),
    ("legrad", "LeGrad for “", "LeGrad", "From layer", "-legrad-"),
])
def test_the_maps_panel_download_and_layer_slider_name_what_it_is(server, maps_page, kind, caption, heading, slider,
                                                                  file_part):
    page = maps_page
    show_map(page, server, kind)
    page.locator('[data-testid="stCaptionContainer"]').filter(has_text=caption).first.wait_for()
    page.wait_for_function(SCRIPT_DONE)
    main = page.locator('[data-testid="stMain"]')
    headings = [h.strip() for h in main.get_by_role("heading").all_inner_texts()]
    assert heading in headings and (heading == "Attention" or "Attention" not in headings), headings
    labels = page.locator('[data-testid="stSidebar"] [data-testid="stSlider"] [data-testid="stWidgetLabel"]')
    labels.filter(has_text=re.compile(f"^({'|'.join(SLIDERS)})$")).first.wait_for()  # drawn after the caption
    shown = [name for name in (t.strip() for t in labels.all_inner_texts()) if name in SLIDERS]
    assert shown == [slider], shown
    button = page.get_by_role("button", name="overlay (PNG)")
    assert button.inner_text().strip() == f"{heading} overlay (PNG)"
    with page.expect_download() as download:
        button.click()
    assert file_part in download.value.suggested_filename, download.value.suggested_filename
