"""A pytest plugin for tests/test_lanes.py: one ``--collect-only --quick`` of the whole suite tells both what the
everyday lane keeps and which of all the collected tests are scenarios or slow (issue 112: the two collections it
once made, ``--quick`` and ``-m "scenario or slow"``, were ~28 s of CPU; one is half that).

Loaded with ``-p lane_probe`` (the tests folder on ``PYTHONPATH``), it wraps every other
``pytest_collection_modifyitems`` (tests/conftest.py's marks the scenarios, then under ``--quick`` deselects them and
the slow tests) and writes to the file ``VIT_LANE_PROBE`` names, as JSON: every test collected, the ones carrying a
``scenario`` or ``slow`` mark (the names ``-m`` matches, read from the same items after the marks are set) and the
ones the lane kept."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

HEAVY = {"scenario", "slow"}


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items):
    collected = list(items)
    result = yield
    found = {"collected": [item.nodeid for item in collected],
             "heavy": [item.nodeid for item in collected if HEAVY & {mark.name for mark in item.iter_markers()}],
             "lane": [item.nodeid for item in items]}
    Path(os.environ["VIT_LANE_PROBE"]).write_text(json.dumps(found))
    return result
