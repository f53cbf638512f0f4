"""Browser tabs that share one renderer process (issue 112).

A page in a browser context of its own starts a renderer process of its own, and compiles the app's bundle again in
it: ~1.3 s more of Chromium's CPU per load of the explorer's first page than a load in a tab that already ran one
(bench/results/cpu-2026-11-29g/browser-tab.txt). Tabs opened from one page (``window.open``, as a user opens a link in
a new tab) share its browsing instance, so every page of one site is drawn by one renderer. Each tab is still a page
of its own (its own listeners, routes and viewport, closed with it) and each load in it a new Streamlit session; they
share the context's cookies and storage, which this app never uses (it keeps a visitor's state, a token entered
included, on the server). A test whose check is two visitors' separate browsers keeps contexts of its own. A module
that loads one page opens it with ``helpers.shared_tab``: a tab of the worker's one blank page, whose renderer the
worker's modules share.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page


def opener(browser: Browser, **context_options) -> Page:
    """A blank page in a new context (``context_options``: its viewport...), whose tabs ``new_tab`` opens."""
    return browser.new_context(**context_options).new_page()


def new_tab(first: Page, timeout_ms: float) -> Page:
    """A new blank tab opened from ``first`` (an ``opener``), waiting ``timeout_ms`` at most for what it is asked."""
    with first.context.expect_page() as opened:
        first.evaluate("() => { window.open('about:blank'); }")
    page = opened.value
    page.set_default_timeout(timeout_ms)
    return page


@contextmanager
def tabs(first: Page, timeout_ms: float) -> Iterator[Callable[[], Page]]:
    """A block's tabs: what it yields opens one more (``new_tab``); each is closed when the block ends."""
    opened: list[Page] = []

    def tab() -> Page:
        opened.append(new_tab(first, timeout_ms))
        return opened[-1]

    try:
        yield tab
    finally:
        for page in opened:
            if not page.is_closed():
                page.close()
