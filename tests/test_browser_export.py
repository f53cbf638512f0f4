"""An exported view opens offline in headless Chromium (issue 50): no request leaves the file, and hovering a patch
of the map shows its value; the export of the app's view shows what the page shows (issue 69)."""

from pathlib import Path

import numpy as np
import pytest
from helpers import ARTIFACTS, chromium
from PIL import Image
from shared_app import open_with_image
from test_browser_explorer import OVERLAY_HREF, SCRIPT_DONE, TINY, png

from vit.app import share
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


# -- the export of the app's own view shows what the page shows (issue 69, item 5) ----------------------------------

# Names as long as ImageNet's longest: they must fit beside the bars, not lose their first letters.
CLASSES = ["tench, Tinca tinca", "rock beauty, Holocanthus tricolor", "golden retriever"]
# The shapes of the app's overlay chart (Plotly keeps the figure it drew on its graph div); null until drawn.
APP_OVERLAY_SHAPES = """() => {
  const graph = document.querySelector('.st-key-overlay_picker .js-plotly-plot');
  return graph && graph.layout ? graph.layout.shapes || [] : null;
}"""
# The sidebar radio's option shown as chosen; null while a rerun has the group off the page (waited for).
CHECKED_RADIO = """(label) => {
  const group = [...document.querySelectorAll('[data-testid="stSidebar"] [data-testid="stRadio"]')]
    .find(g => g.querySelector('[data-testid="stWidgetLabel"]')?.innerText.trim() === label);
  const checked = group && group.querySelector('input:checked');
  return checked ? checked.closest('label').innerText.trim() : null;
}"""


def inside(box: dict, outer: dict, slack: float = 0.5) -> bool:
    """Whether the bounding ``box`` lies whole inside ``outer`` (``slack`` px for rounding)."""
    return (outer["x"] - slack <= box["x"] and box["x"] + box["width"] <= outer["x"] + outer["width"] + slack
            and outer["y"] - slack <= box["y"] and box["y"] + box["height"] <= outer["y"] + outer["height"] + slack)


@pytest.fixture(scope="module")
def app(local_app, tmp_path_factory):
    """The shared app server (tests/shared_app.py: no token, so a local visitor may open a path), a tiny model of
    ``TINY``'s shape with ``CLASSES``' long names saved by path, and the image to upload: the shipped sample's."""
    import torch

    from vit.checkpoint import save_checkpoint
    from vit.model import ViT

    tmp_path = tmp_path_factory.mktemp("export-app")
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "long-names.pt", ViT(TINY), CLASSES)
    (tmp_path / "cat_1.png").write_bytes(png(32, 32, seed=1))
    return local_app.url, tmp_path / "long-names.pt", tmp_path / "cat_1.png"


def test_the_export_of_a_view_shows_what_the_page_shows(app, tmp_path):
    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1500, "height": 1100}, accept_downloads=True).new_page()
        page.set_default_timeout(TIMEOUT_MS)
        url, model, image = app
        open_with_image(page, url, model, image, "&map=attention&layer=2&query=7")  # patch row 2, col 3 of 4 x 4
        page.get_by_text("the query patch row 2, col 3 (outlined)").wait_for()
        for _ in range(2):  # the run the link's URL asks for after the first has drawn, then the page at rest
            page.wait_for_function(SCRIPT_DONE)
            page.wait_for_timeout(500)
        page.wait_for_function(f"({OVERLAY_HREF})() !== null")
        app_outline = [s for s in page.wait_for_function(APP_OVERLAY_SHAPES).json_value() if s["type"] == "rect"]
        sidebar = {label: page.get_by_role("combobox", name=label, exact=True).input_value()
                   for label in ("Input size", "Query token", "Colour map", "Head")}
        sidebar["Colour scale"] = page.wait_for_function(CHECKED_RADIO, arg="Colour scale").json_value()
        grid_shown = page.get_by_role("checkbox", name="Show the patch grid").is_checked()
        sidebar["Show the patch grid"] = "yes" if grid_shown else "no"
        with page.expect_download() as download:
            page.get_by_role("button", name="Export this view (HTML)").click()
        path = tmp_path / "exported.html"
        path.write_bytes(Path(download.value.path()).read_bytes())

        offline = browser.new_context(offline=True, viewport={"width": 1400, "height": 1000}).new_page()
        offline.set_default_timeout(TIMEOUT_MS)
        offline.goto(path.as_uri())
        offline.wait_for_selector("#prediction .ytick text")
        offline.wait_for_selector("#heads .nsewdrag")  # drawn; its ticks, if any, with it
        ARTIFACTS.mkdir(exist_ok=True)
        offline.screenshot(path=str(ARTIFACTS / "export-of-the-app.png"), full_page=True)

        # (a) Every class name and probability tick lies whole inside the prediction chart (and so on the page).
        chart = offline.locator("#prediction").bounding_box()
        shown = {label.text_content(): label.bounding_box()  # Plotly hides a tick that would overflow (100%)
                 for label in offline.locator("#prediction .ytick text, #prediction .xtick text").all()
                 if label.is_visible()}
        assert [name for name, box in shown.items() if not inside(box, chart)] == [], (shown, chart)
        assert set(shown) >= {*CLASSES, "0%", "50%"}

        # (b) The query's patch is outlined in the map as the page outlines it: the same rectangle.
        outline = [s for s in offline.evaluate("() => document.getElementById('map').layout.shapes || []")
                   if s["type"] == "rect"]
        assert app_outline and outline == app_outline

        # (c) Each head's thumbnail carries its number, over it.
        sheet = offline.locator("#heads .layer-below image, #heads .imagelayer image").first.bounding_box()
        ticks = offline.locator("#heads .xtick text")
        assert ticks.all_text_contents() == ["head 1", "head 2"]
        for h, tick in enumerate(ticks.all()):
            box = tick.bounding_box()
            centre = box["x"] + box["width"] / 2
            assert sheet["x"] + sheet["width"] * h / 2 < centre < sheet["x"] + sheet["width"] * (h + 1) / 2
            assert sheet["y"] - 30 < box["y"] + box["height"] <= sheet["y"] + 1  # just above its thumbnail

        # (d) The settings in the sidebar's words, not the link's codes.
        rows = dict(zip(offline.locator("#settings th").all_text_contents(),
                        offline.locator("#settings td").all_text_contents(), strict=True))
        assert {label: rows.get(label) for label in sidebar} == sidebar
        assert sidebar["Input size"] == "the model's size (16 px)" and sidebar["Colour scale"] == "each map's min–max"
        assert not set(rows) & set(share.PARSERS), "a link's parameter name"
