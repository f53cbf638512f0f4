"""A reload and a link keep every page's view (issue 116, item 6), in a real browser: on each of the five pages (the
main page, the library road's, SAM 3's, "Ask the VLM" and "Ask in words") a non-default view is picked on a tiny
model, the drawn map's image bytes read, the page reloaded (F5) and the same model, view and bytes found again; then
every "Copy link to this view" the page offers holds the address bar's view, and that link opened in a new session
draws the same bytes. One app server (the one the browser modules share, tests/shared_app.py) and one browser tab for
the module: each load in it is a new Streamlit session (the app keeps no cookie and no browser storage), where a
context per page started a renderer process per page for nothing more (bench/results/cpu-2026-11-29g/browser-tab.txt);
the models are the other browser tests' tiny random ones, built by their own libraries (the
builders imported, not copied).

The library road's page is reached as a user first reaches it: from the shipped model's page (its view drawn at once,
from its sample), by typing the folder into "Open a path". Before an image is given the address bar already names that
model and nothing of the shipped model's view, and a reload then reopens the library page (waiting for its image), not
the shipped model with the previous page's settings; only then is the image given and the view picked. (This was
test_browser_library_reload.py, a page load of its own: one fewer, issue 112.)"""

from __future__ import annotations

import base64
import re
from urllib.parse import parse_qs, urljoin, urlsplit

import pytest
from helpers import BROWSER_TIMEOUT_MS, chromium, shared_tab
from shared_app import ask_the_vlm, enter, open_with_image, png, upload_image
from test_browser_explorer import OVERLAY_HREF, SCRIPT_DONE
from test_browser_words import MAP_SRC

pytest.importorskip("transformers")
pytest.importorskip("open_clip")
pytestmark = [pytest.mark.browser, pytest.mark.slow]

TIMEOUT_MS = max(BROWSER_TIMEOUT_MS, 240_000)  # a VLM, a SAM 3 and a CLIP load on two busy cores
VIEWPORT = {"width": 1400, "height": 1000}
PAGES = ("main", "library", "sam3", "vlm", "words")
HINT = "Upload an image in the sidebar to see what the model attends to."  # a page waiting for its image

# The library road's map: the image of its patch picker (a Plotly chart keyed library_map_picker).
LIBRARY_HREF = """() => {
  const chart = document.querySelector('.st-key-library_map_picker [data-testid="stPlotlyChart"]');
  const image = chart && chart.querySelector('.layer-below image, .imagelayer image');
  return image ? image.getAttribute('href') : null;
}"""
# SAM 3's and the VLM's map: the first image of the row of columns that holds the page's colour bar.
COLOURED_MAP = """() => {
  for (const bar of document.querySelectorAll('[data-testid="stMain"] .vit-colorbar')) {
    const row = bar.closest('[data-testid="stHorizontalBlock"]');
    const image = row && row.querySelector('[data-testid="stImage"] img');
    if (image) return image.src;
  }
  return null;
}"""


@pytest.fixture(scope="module")
def world(local_app, llava, msn, tmp_path_factory):
    """The server the browser modules share (tests/shared_app.py: the shipped tiny model with its samples, no token,
    so this local visitor may open paths), the four other pages' tiny models and their images."""
    from test_prompts import save_open_clip
    from test_sam3_concepts import build_sam3
    from test_sam3_concepts import picture as sam3_picture
    from test_vlm_answer import picture as vlm_picture

    tmp = tmp_path_factory.mktemp("reload-pages")
    (tmp / "photo.png").write_bytes(png(32, 32, seed=2))
    sam3_picture().save(tmp / "sam3.png")
    vlm_picture().save(tmp / "vlm.png")
    models = {"library": msn, "sam3": build_sam3(tmp / "sam3"), "vlm": llava,
              "words": save_open_clip(tmp / "open_clip", layers=2)[1]}
    images = {"library": tmp / "photo.png", "sam3": tmp / "sam3.png", "vlm": tmp / "vlm.png",
              "words": tmp / "photo.png"}
    return local_app.url, models, images


@pytest.fixture(scope="module")
def tab():
    """The module's one tab, of the worker's blank page (``helpers.shared_tab``; the app keeps no cookie and no
    storage): each case's first load in it, a link's load and each reload are new Streamlit sessions."""
    with chromium() as browser:
        page = shared_tab(browser, VIEWPORT)
        page.set_default_timeout(TIMEOUT_MS)
        yield page


def pick(page, scope, label: str, option: str) -> None:
    """Pick ``option`` in the selectbox labelled ``label`` inside ``scope`` by typing it, as a keyboard user would."""
    scope.get_by_role("combobox", name=label, exact=True).click()
    page.keyboard.type(option)
    page.keyboard.press("Enter")


def query(link: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(link).query)


# Each page: its address, how its view is picked, the text that says the view is drawn, its map's source and the
# link's parameters that must hold the view.
def open_main(page, url, models, images):
    page.goto(url)
    page.get_by_text("cat_1.png, 32×32 px").wait_for()
    pick(page, page, "Head", "head 2")


def open_library(page, url, models, images):
    folder = str(models["library"])
    page.goto(url)
    page.wait_for_function(SCRIPT_DONE)
    page.wait_for_function("() => new URL(location.href).searchParams.has('map')")  # the shipped model's view
    enter(page.get_by_role("textbox", name="Open a path"), folder)
    page.get_by_text(HINT).wait_for()
    page.wait_for_function("(folder) => new URL(location.href).searchParams.get('model') === folder", arg=folder)
    assert query(page.url) == {"model": [folder]}, "the library page kept part of the shipped model's view"
    page.reload()
    page.get_by_text(HINT).wait_for()  # the library page again, waiting for its image: not the shipped model
    page.wait_for_function(SCRIPT_DONE)
    assert query(page.url) == {"model": [folder]}, "the reload before an image lost the library page's model"
    upload_image(page, images["library"])
    pick(page, page.locator('[data-testid="stSidebar"]'), "Head", "head 2")


def open_sam3(page, url, models, images):
    from test_sam3_concepts import TEXT

    main = open_with_image(page, url, models["sam3"], images["sam3"], "&cthreshold=0")
    enter(main.get_by_role("textbox", name="Concept"), TEXT)
    main.get_by_text(re.compile(r"decoder layer \d+, the heads' mean")).wait_for()
    pick(page, main, "Head", "head 2")


def open_vlm(page, url, models, images):
    from test_vlm_answer import QUESTION

    ask_the_vlm(page, url, models["vlm"], images["vlm"], QUESTION, length=2)


def open_words(page, url, models, images):
    open_with_image(page, url, models["words"], images["words"])
    area = page.get_by_role("textbox", name="Labels")
    area.fill("a dog, a cat")
    area.press("Control+Enter")
    page.get_by_text("softmax").first.wait_for()
    pick(page, page.locator('[data-testid="stMain"]'), "Map for", "a cat")


PAGE = {  # opener, the view's caption, the map's source, the link's parameters the view must hold
    "main": (open_main, re.compile(r"Layer 2 of 2, head 2"), OVERLAY_HREF, {"head": "2"}),
    "library": (open_library, None, LIBRARY_HREF, {"map": "attention", "head": "2"}),
    "sam3": (open_sam3, re.compile(r"decoder layer \d+, head 2"), COLOURED_MAP, {"chead": "2"}),
    "vlm": (open_vlm, re.compile(r"Answer token 1 “"), COLOURED_MAP, {"answer_length": "2"}),
    "words": (open_words, re.compile(r"for “a cat”"), MAP_SRC, {"wlabel": "a cat", "labels": "a dog, a cat"}),
}


def offered_links(page) -> list[str]:
    """What each "Copy link to this view" on the page offers to copy (the VLM's section has one of its own)."""
    buttons = page.get_by_role("button", name="Copy link to this view")
    links = []
    for i in range(buttons.count()):
        buttons.nth(i).click()
        code = page.locator('[data-testid="stPopoverBody"] code:visible').first
        code.wait_for()
        links.append(code.inner_text().strip())
        page.keyboard.press("Escape")
        code.wait_for(state="hidden")
    return links


def drawn_map(page, source: str) -> bytes:
    """The bytes of the map's image as the page draws it, once the page has settled: a data URI's, or those the
    server sends for a media URL."""
    page.wait_for_function(SCRIPT_DONE)
    page.wait_for_timeout(500)  # a rerun a pick asked for has started by now
    page.wait_for_function(SCRIPT_DONE)
    page.wait_for_function(f"() => !!({source})()")
    src = page.evaluate(source)
    if src.startswith("data:"):
        return base64.b64decode(src.split(",", 1)[1])
    response = page.request.get(urljoin(page.url, src))
    assert response.ok, (src, response.status)
    return response.body()


def view_shown(page, caption, want: dict[str, str]) -> None:
    """Wait until the view is drawn: its caption shown and its parameters in the address bar."""
    if caption is not None:
        page.locator('[data-testid="stMain"]').get_by_text(caption).first.wait_for()
    page.wait_for_function("(want) => Object.entries(want).every(([k, v]) => "
                           "new URL(location.href).searchParams.get(k) === v)", arg=want)


def settled_to(page, source: str, before: bytes) -> bytes:
    """The map's bytes once they are ``before``'s (a page can draw its map, then a rerun redraws it), or the last
    ones after a while: the assertion says what differs."""
    for _ in range(10):
        now = drawn_map(page, source)
        if now == before:
            break
        page.wait_for_timeout(1000)
    return now


@pytest.mark.parametrize("name", PAGES)
def test_a_reload_and_a_link_keep_the_pages_model_view_and_map(world, tab, name):
    url, models, images = world
    opener, caption, source, want = PAGE[name]
    page = tab
    opener(page, url, models, images)  # its first step a load: a new session, whatever the last case left
    view_shown(page, caption, want)
    first = drawn_map(page, source)
    address = query(page.url)
    if name != "main":
        assert address["model"] == [str(models[name])]

    page.reload()
    view_shown(page, caption, want)
    assert settled_to(page, source, first) == first, "the reload drew another map"
    assert query(page.url) == address, "the reload lost part of the view"

    links = offered_links(page)
    assert links, "the page offers no link to its view"
    assert [query(link) for link in links] == [address] * len(links), "a link offered is not the view"
    link = links[0]
    page.evaluate("() => { window.beforeTheLink = true; }")
    page.goto(link)  # a new session (the page's own is closed with its load): only the link holds the view
    assert page.evaluate("() => !window.beforeTheLink"), "the link did not load a new page"
    view_shown(page, caption, want)
    assert settled_to(page, source, first) == first, "the link drew another map"
    assert query(page.url) == address
