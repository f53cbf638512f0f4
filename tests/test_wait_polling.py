"""The browser tests' waits poll ten times a second unless a wait asks for every frame (tests/helpers.py, issue 112):
checked on stand-in classes, as ``_poll_by_default`` patches Playwright's ``Page`` and ``Frame``."""

from types import SimpleNamespace

import helpers


def _stand_in():
    class Waits:
        def wait_for_function(self, expression, *, arg=None, polling=None, timeout=None):
            return expression, arg, polling, timeout

    return type("Page", (Waits,), {}), type("Frame", (Waits,), {})


def test_a_wait_polls_every_poll_ms_unless_it_says_and_the_patch_is_made_once():
    page, frame = _stand_in()
    api = SimpleNamespace(Page=page, Frame=frame)
    helpers._poll_by_default(api)
    patched = page.wait_for_function
    helpers._poll_by_default(api)  # a second browser block: not wrapped twice
    assert page.wait_for_function is patched
    assert page().wait_for_function("x", timeout=5) == ("x", None, helpers.POLL_MS, 5)
    assert frame().wait_for_function("y", arg=1) == ("y", 1, helpers.POLL_MS, None)
    assert page().wait_for_function("z", polling="raf") == ("z", None, "raf", None)
    assert helpers.POLL_MS == 100
