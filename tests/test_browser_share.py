"""A view you can send, in a real browser (issue 50): a link copied in one session opens the identical overlay in a
fresh one, and a link cannot open a server path for a visitor without the token. One app server for the module
(``streamlit run app.py`` with a token set); each session a tab of its own, in one context whose cookies and
storage the app never uses (tests/browser_tabs.py)."""

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from browser_tabs import new_tab, opener
from helpers import ARTIFACTS, BROWSER_TIMEOUT_MS, chromium, ship_default, streamlit_app
from shared_app import TINY, ship_tiny
from test_browser_explorer import OVERLAY_HREF, SCRIPT_DONE, choose

from vit.core.runfiles import DEFAULT_CHECKPOINT
from vit.runs.access import TOKEN_ENV

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TIMEOUT_MS = BROWSER_TIMEOUT_MS  # what a user would wait (tests/helpers.py)
VIEWPORT = {"width": 1500, "height": 1100}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The tiny model under the default name with two samples, a checkpoint elsewhere on the server (a path a link
    might name) and the server, with a token set so that only a session that entered it may open paths."""
    tmp_path = tmp_path_factory.mktemp("share")
    checkpoints, runs = ship_tiny(tmp_path)  # cat_1.png (32 x 32) and dog_1.png (40 x 24)
    (tmp_path / "elsewhere").mkdir()
    elsewhere = ship_default(tmp_path / "elsewhere", TINY, ["a", "b", "c"])[0] / DEFAULT_CHECKPOINT
    env = {"VIT_CHECKPOINTS_DIR": str(checkpoints), "VIT_RUNS_DIR": str(runs),
           TOKEN_ENV: "correct-horse-battery-staple"}
    with streamlit_app(env, log=tmp_path / "server.log") as (url, _):
        yield url, elsewhere


@pytest.fixture(scope="module")
def first():
    """The blank page of the module's one context (no cookie, no storage) whose tabs its sessions are
    (tests/browser_tabs.py: one renderer draws them all)."""
    with chromium() as browser:
        yield opener(browser, viewport=VIEWPORT, accept_downloads=True)


def fresh_page(first):
    """A tab opened from ``first``: a new Streamlit session (the app keeps no cookie or storage: a token entered
    would be the session's, on the server)."""
    return new_tab(first, TIMEOUT_MS)


def settled(page) -> None:
    """The last rerun has finished and the overlay chart has drawn its image (Plotly draws after the script ends)."""
    page.wait_for_function(SCRIPT_DONE)
    page.wait_for_timeout(500)  # a rerun a click asked for has started by now
    page.wait_for_function(SCRIPT_DONE)
    page.wait_for_function(f"({OVERLAY_HREF})() !== null")


def overlay_png(page) -> bytes:
    """The bytes of the "Overlay (PNG)" download."""
    with page.expect_download() as download:
        page.get_by_role("button", name="Overlay (PNG)").click()
    return Path(download.value.path()).read_bytes()


def copied_link(page) -> str:
    """What "Copy link to this view" offers to copy."""
    page.get_by_role("button", name="Copy link to this view").click()
    code = page.locator('[data-testid="stPopoverBody"] code').first
    code.wait_for()
    link = code.inner_text().strip()
    page.keyboard.press("Escape")
    return link


def test_a_copied_link_opens_the_identical_overlay_in_a_fresh_session(world, first):
    url, _ = world
    a = fresh_page(first)
    try:
        check_a_copied_link(url, first, a)
    finally:  # what session A looked like, also when a step timed out
        ARTIFACTS.mkdir(exist_ok=True)
        a.screenshot(path=str(ARTIFACTS / "share-link-copied.png"), full_page=True)


def check_a_copied_link(url: str, first, a) -> None:
    a.goto(url)
    a.get_by_text("cat_1.png, 32×32 px").wait_for()
    # Session A: another sample, a head, a colour map, the first layer and a query patch clicked.
    choose(a, "…or a sample image", "dog 1")
    a.get_by_text("dog_1.png, 40×24 px").wait_for()
    choose(a, "Head", "head 2")
    a.get_by_text("Layer 2 of 2, head 2").wait_for()
    choose(a, "Colour map", "viridis")
    settled(a)
    slider = a.get_by_role("slider", name="Layer")
    slider.focus()
    slider.press("ArrowLeft")
    a.get_by_text("Layer 1 of 2, head 2").wait_for()
    settled(a)
    picker = a.locator('[data-testid="stPlotlyChart"]').first.locator(".nsewdrag").first
    box = picker.bounding_box()
    a.mouse.click(box["x"] + box["width"] * 2.5 / 4, box["y"] + box["height"] * 1.5 / 4)  # row 2, col 3: token 7
    a.get_by_text("the query patch row 2, col 3 (outlined)").wait_for()
    settled(a)
    link = copied_link(a)
    assert parse_qs(urlsplit(link).query) == parse_qs(urlsplit(a.url).query), "the URL follows the view"
    assert {k: v[0] for k, v in parse_qs(urlsplit(link).query).items()}.items() >= {
        "sample": "dog_1.png", "layer": "1", "head": "2", "query": "7", "cmap": "viridis"}.items()
    expected_png = overlay_png(a)

    b = fresh_page(first)
    b.goto(link)
    b.get_by_text("dog_1.png, 40×24 px").wait_for()
    b.get_by_text("Layer 1 of 2, head 2").wait_for()
    b.get_by_text("the query patch row 2, col 3 (outlined)").wait_for()
    settled(b)
    ARTIFACTS.mkdir(exist_ok=True)
    b.screenshot(path=str(ARTIFACTS / "share-link-opened.png"), full_page=True)
    # Plotly draws the overlay after the run ends: read A's at rest (idle while B loaded), wait for B's to be drawn.
    expected_href = a.evaluate(OVERLAY_HREF)
    b.wait_for_function(f"(want) => ({OVERLAY_HREF})() === want", arg=expected_href)
    assert b.evaluate(OVERLAY_HREF) == expected_href
    assert overlay_png(b) == expected_png
    assert b.get_by_text("was not used").count() == 0


def test_a_link_cannot_open_a_server_path_for_a_visitor_without_the_token(world, first):
    url, elsewhere = world
    page = fresh_page(first)
    page.goto(f"{url}/?model={elsewhere}")
    page.get_by_text("is a path on the server").wait_for()
    page.get_by_text("cat_1.png, 32×32 px").wait_for()  # the shipped model and its sample, not the path's
    settled(page)
    assert parse_qs(urlsplit(page.url).query)["model"] != [str(elsewhere)]
