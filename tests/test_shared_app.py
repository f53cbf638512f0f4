"""The shared app server (tests/shared_app.py) stops after the run's last test that asks for it (issue 112)."""

from __future__ import annotations

import shared_app


class _Stack:
    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1


class _Session:
    items: list = []


class _Item:
    def __init__(self, *fixtures: str):
        self.fixturenames, self.session = list(fixtures), _Session


def test_the_shared_server_stops_after_the_last_test_that_asks_for_it_and_not_before(monkeypatch):
    first, plain, last, after = _Item("local_app"), _Item("tmp_path"), _Item("world", "local_app"), _Item()
    _Session.items = [first, plain, last, after]
    stack = _Stack()
    monkeypatch.setattr(shared_app, "_RUNNING", [stack])
    for item in (first, plain):  # a later test still asks for it; a test that does not ask stops nothing
        shared_app.stop_after(item)
        assert stack.closed == 0 and shared_app._RUNNING == [stack]
    shared_app.stop_after(last)
    assert stack.closed == 1 and shared_app._RUNNING == []
    shared_app.stop_after(after)  # stopped once
    assert stack.closed == 1
