"""The suite's two lanes (issue 112): the everyday lane (``pytest --quick``) leaves out every scenario and slow test,
reaches every module of the engine, and stays within its budget; the whole suite's median test stays cheap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lanes
import pytest
from lane_probe import HEAVY  # the marks the lane leaves out

REPOSITORY = Path(__file__).resolve().parent.parent


class _Module:
    def __init__(self, name: str, *marks: str):
        self.__name__ = f"tests.{name}"
        self.pytestmark = [getattr(pytest.mark, mark) for mark in marks]


class _Item:
    def __init__(self, module: _Module, name: str, *fixtures: str, marks: tuple[str, ...] = ()):
        self.module, self.nodeid, self.fixturenames = module, f"{module.__name__}.py::{name}", list(fixtures)
        self.markers = [getattr(pytest.mark, mark).mark for mark in marks]
        self.markers += [mark.mark for mark in module.pytestmark]
        self.keywords = {m.name: True for m in self.markers}

    def get_closest_marker(self, name):
        return next((m for m in self.markers if m.name == name), None)

    def add_marker(self, mark):
        self.markers.append(mark.mark)


class _Hook:
    def __init__(self):
        self.deselected = []

    def pytest_deselected(self, items):
        self.deselected += items


def _config(quick: bool):
    return type("Config", (), {"option": type("Option", (), {"quick": quick})(), "hook": _Hook()})()


def _items():
    plain, browser = _Module("test_plain"), _Module("test_browser_page", "browser")
    return [_Item(plain, "test_fast"), _Item(plain, "test_slow", marks=("slow",)),
            _Item(plain, "test_gpu", marks=("cuda",)), _Item(browser, "test_click"),
            _Item(plain, "test_ray_job", "ray_cluster"), _Item(_Module("test_costs"), "test_peak"),
            _Item(_Module("test_gpu_lease_scripts"), "test_training"),
            _Item(plain, "test_compiled", marks=("scenario",))]  # marked by hand: it spawns the C++ compiler


def test_the_quick_lane_keeps_only_the_tests_that_are_neither_scenarios_nor_slow():
    import conftest

    items, config = _items(), _config(quick=True)
    conftest.pytest_collection_modifyitems(config, items)
    assert [item.nodeid.rpartition("::")[2] for item in items] == ["test_fast"]
    assert sorted(item.nodeid.rpartition("::")[2] for item in config.hook.deselected) == [
        "test_click", "test_compiled", "test_gpu", "test_peak", "test_ray_job", "test_slow", "test_training"]


def test_the_whole_suite_keeps_every_test_and_marks_the_scenarios():
    import conftest

    items = _items()
    conftest.pytest_collection_modifyitems(_config(quick=False), items)
    assert len(items) == 8  # -m scenario selects the ones that run a real process
    assert [item.nodeid.rpartition("::")[2] for item in items if item.get_closest_marker("scenario")] == [
        "test_gpu", "test_click", "test_ray_job", "test_peak", "test_training", "test_compiled"]


def test_a_module_the_lane_never_imports_is_named():
    modules = lanes.engine_modules()
    imported = {name for name, path in modules.items() if path.name != "__init__.py"}
    # every page script is named by some test module, by its path or by its folder and file name
    named = REPOSITORY / "tests" / "test_app.py", REPOSITORY / "tests" / "test_training_page.py"
    everything = {*named, *(REPOSITORY / "tests").glob("test_*.py")}
    assert lanes.untouched(imported, everything) == []
    assert lanes.untouched(imported - {"vit.core.clips"}, everything) == ["vit.core.clips"]
    # a page script Streamlit executes is never imported: the lane must name it
    assert lanes.untouched(imported, set()) == sorted(str(p.relative_to(REPOSITORY)) for p in lanes.page_scripts())


def test_the_budget_fails_a_lane_that_grew_or_a_suite_whose_median_test_grew():
    assert lanes.lane_count_problem(lanes.LANE_MAX_TESTS) is None
    assert "past its budget" in lanes.lane_count_problem(lanes.LANE_MAX_TESTS + 1)
    cheap = [0.01] * lanes.MEDIAN_MIN_TESTS
    assert lanes.median_cpu_problem(cheap) is None
    costly = [lanes.MEDIAN_CPU_MAX_S * 2] * lanes.MEDIAN_MIN_TESTS
    assert "median test took" in lanes.median_cpu_problem(costly)
    assert lanes.median_cpu_problem(costly[:10]) is None  # a selection of tests is not the suite



def whole_collection(config) -> list | None:
    """(id, item) of every test this pytest collected (tests/conftest.py's ``COLLECTED``) where that is the whole
    suite: no paths given but the suite's own (pyproject's ``testpaths``), no file left out (``--ignore``, ``--lf``),
    every test module among them; else None. ``-k``, ``-m``, ``--quick`` and ``--deselect`` act after it is kept."""
    import conftest

    found = config.stash.get(conftest.COLLECTED, None)
    option = config.option
    if (found is None or [Path(a).resolve() for a in config.args] != [REPOSITORY / "tests"]
            or getattr(option, "lf", False) or getattr(option, "ignore", None) or getattr(option, "ignore_glob", None)
            or getattr(option, "stepwise", False)):
        return None
    files = {test.partition("::")[0] for test, _ in found}
    return found if files == {f"tests/{path.name}" for path in (REPOSITORY / "tests").glob("test_*.py")} else None


def test_the_lane_is_read_from_this_runs_collection_only_where_that_is_the_whole_suite():
    import conftest

    files = sorted((REPOSITORY / "tests").glob("test_*.py"))
    every = [(f"tests/{path.name}::test_x", object()) for path in files]

    def config(found, args=("tests",), **options):
        stash = {conftest.COLLECTED: found} if found is not None else {}
        option = type("Option", (), {"lf": False, "ignore": None, "ignore_glob": None, "stepwise": False, **options})
        return type("Config", (), {"stash": stash, "args": [str(REPOSITORY / a) for a in args], "option": option})

    assert whole_collection(config(every)) is every
    assert whole_collection(config(every[1:])) is None  # a module not collected (an --ignore, a skipped file)
    assert whole_collection(config(every, args=("tests/test_lanes.py",))) is None  # a path given: a selection
    assert whole_collection(config(every, lf=True)) is None
    assert whole_collection(config(None)) is None  # nothing kept (a pytest without this conftest's hook)


def probe_lane(tmp_path) -> tuple[set[str], set[str], set[str]]:
    """(every test, the lane, the scenarios and slow tests) of one ``--collect-only --quick`` of the whole suite in a
    fresh pytest (tests/lane_probe.py), the lane it printed checked against the one the probe saw."""
    probe = tmp_path / "probe.json"
    env = {**os.environ, "VIT_LANE_PROBE": str(probe),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPOSITORY / "tests"), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", "-p",
                           "lane_probe", "--quick"], cwd=REPOSITORY, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lane = {line for line in done.stdout.splitlines() if "::" in line}
    found = json.loads(probe.read_text())
    assert set(found["lane"]) == lane
    return set(found["collected"]), lane, set(found["heavy"])


@pytest.mark.slow
def test_the_everyday_lane_is_within_its_budget_and_holds_no_scenario_or_slow_test(request, tmp_path):
    """Long (~19 s of CPU) where this run did not collect the whole suite: it collects it in a fresh pytest, once;
    in the README's whole run it reads the collection the run made (~0 s)."""
    import conftest

    found = whole_collection(request.config)
    if found is None:  # one collection of the whole suite, the lane --quick prints, and every test's marks
        collected, lane, heavy = probe_lane(tmp_path)
    else:  # the lane is what --quick keeps of this collection (conftest's ``quick``), the heavy by their marks
        collected = {test for test, _ in found}
        lane = {test for test, item in found if conftest.quick(item)}
        heavy = {test for test, item in found if HEAVY & {mark.name for mark in item.iter_markers()}}
    assert lane <= collected
    assert not lane & heavy
    assert 1000 < len(lane) <= lanes.LANE_MAX_TESTS
    # what the lane leaves out is the scenarios and the slow tests, nothing else
    assert collected - lane == heavy
    assert not [test for test in lane if test.startswith("tests/test_browser_")]  # the Chromium modules
