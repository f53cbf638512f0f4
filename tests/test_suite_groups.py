"""The suite's own parallel run (``addopts``: two xdist workers, ``tests/conftest.py``'s groups): the modules on the
Ray cluster share one worker and so one cluster, a module's tests that share a module fixture another, and a
module with none is spread. The groups were once lost without a word (pytest 9.2 reads a test's
id where xdist 3.8 did not write its group), and each worker started a cluster of its own."""

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_a_parallel_run_keeps_the_ray_modules_on_one_worker_and_a_module_on_one_worker():
    # Two tests of a Ray module that need no cluster (a module's group is decided before -k deselects), two tests
    # of a module whose module fixture is built once (its own group), and a module with no such fixture (spread).
    # (test_mechanism_cli.py: its fixture is a tiny checkpoint, and its imports are vit's only; test_view_shape.py's
    # pulled in transformers and timm, 29 s more of a 45 s run here)
    tests = ["tests/test_ray_train.py", "tests/test_mechanism_cli.py", "tests/test_widget_keys.py", "-k",
             "cannot_be_reached or cuda_workers or ablate_prints or ablate_with_maps or widget"]
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "--numprocesses=2",
                           "--dist=loadgroup", *tests], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    ran = re.findall(r"^\[(gw\d)\] \[ *\d+%\] PASSED (\S+)", done.stdout, re.MULTILINE)
    groups: dict[str, set[str]] = {}
    for worker, test in ran:
        group = test.rsplit("@", 1)[1] if test.rfind("@") > test.rfind("]") else None
        groups.setdefault(group or test.split("::")[0], set()).add(worker)
    assert len(ran) == 6, done.stdout[-3000:]
    assert set(groups) == {"ray-cluster", "test_mechanism_cli", "tests/test_widget_keys.py"}, groups
    assert len(groups["ray-cluster"]) == 1 and len(groups["test_mechanism_cli"]) == 1, groups
    assert all("test_widget_keys" not in test or "@" not in test for _, test in ran)  # no group: spread


class _Cluster:
    def __init__(self) -> None:
        self.stops = 0

    def stop(self) -> None:
        self.stops += 1


class _Item:
    def __init__(self, *fixtures: str) -> None:
        self.fixturenames, self.nodeid = list(fixtures), "tests/test_x.py::test_x"

    def get_closest_marker(self, name: str) -> None:  # no marks (the protocol asks for "browser")
        return None


def _run_protocol(item, nextitem) -> None:
    import conftest

    protocol = conftest.pytest_runtest_protocol(item, nextitem)
    next(protocol)
    with pytest.raises(StopIteration):
        protocol.send(None)


@pytest.mark.parametrize("after, nextitem, later, stopped", [
    ("ray_cluster", _Item("ray_cluster", "tmp_path"), [], 0),  # the next test runs on it: kept
    ("ray_cluster", _Item("tmp_path"), [], 1),  # the worker's last test on it: stopped now, not idle beside the rest
    # a test without it between two on it (the Ray modules mix them): kept, not started again for the next
    ("ray_cluster", _Item("tmp_path"), [_Item("ray_cluster")], 0),
    ("ray_cluster", None, [], 0),  # the worker's last test: the session's teardown stops it
    ("tmp_path", _Item("tmp_path"), [], 0),  # a test not on the cluster
])
def test_the_ray_cluster_stops_after_the_workers_last_test_on_it(monkeypatch, after, nextitem, later, stopped):
    import conftest

    cluster = _Cluster()
    monkeypatch.setattr(conftest, "_RAY_CLUSTERS", [cluster])
    monkeypatch.delenv("VIT_TEST_TIMELINE", raising=False)
    item = _Item(after)
    item.session = SimpleNamespace(items=[item, *([nextitem] if nextitem else []), *later])
    _run_protocol(item, nextitem)
    assert cluster.stops == stopped and conftest._RAY_CLUSTERS == ([] if stopped else [cluster])


def test_the_controller_writes_every_test_modules_rewritten_asserts_and_the_projects_bytecode(request, tmp_path,
                                                                                            monkeypatch):
    # What keeps the four workers from rewriting every module's asserts again (tests/conftest.py's write_bytecode,
    # through pytest's internal functions: a pytest that changes them fails here, not silently slower). Into an
    # empty cache (sys.pycache_prefix, which compileall, importlib and pytest's rewrite all follow): what this
    # checkout's earlier runs wrote does not count. On a small tree laid out as the repository (the whole one's
    # ~450 test modules and the project took ~12 s of CPU here; the controller does that once a run).
    from _pytest.assertion import rewrite
    from conftest import write_bytecode

    assert not sys.dont_write_bytecode and "PYTHONDONTWRITEBYTECODE" not in os.environ
    root = tmp_path / "repository"
    for module in ("vit/api/__init__.py", "vit/core/images.py", "app_pages/explorer.py", "bench/suite_cpu.py",
                   "app.py", "tests/helpers.py", "tests/reference/theirs.py"):
        (root / module).parent.mkdir(parents=True, exist_ok=True)
        (root / module).write_text("VALUE = 1\n")
    for name in ("test_a", "test_b", "test_c"):
        (root / "tests" / f"{name}.py").write_text("def test_it():\n    assert [1] == [1]\n")
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "cache"))
    write_bytecode(request.config, root)
    tests = sorted((root / "tests").glob("test_*.py"))
    stale = [test.name for test in tests
             if rewrite._read_pyc(test, rewrite.get_cache_dir(test) / (test.name[:-3] + rewrite.PYC_TAIL)) is None]
    assert len(tests) == 3 and not stale, stale
    import importlib.util

    for module in ("vit/api/__init__.py", "vit/core/images.py", "app_pages/explorer.py", "bench/suite_cpu.py",
                   "app.py", "tests/helpers.py", "tests/reference/theirs.py"):
        assert Path(importlib.util.cache_from_source(str(root / module))).is_file(), module
    # a test module's pyc is pytest's rewritten one, not compileall's plain one (which a worker would not read)
    assert not [test.name for test in tests if Path(importlib.util.cache_from_source(str(test))).is_file()]


def test_no_browser_test_waits_for_a_text_by_expects_visibility():
    """tests/helpers.py: each poll of ``expect(...).to_be_visible()`` that finds nothing snapshots the whole page;
    a browser test waits with ``locator.wait_for()`` (bench/results/cpu-2026-11-28/suite-browser-waits.txt)."""
    found = [f"{path.name}:{number}" for path in sorted(Path(__file__).parent.glob("test_browser*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if ".to_be_visible(" in line]
    assert found == []


class _Module:
    def __init__(self, name: str, *marks: str) -> None:
        self.__name__, self.pytestmark = f"tests.{name}", [getattr(pytest.mark, mark) for mark in marks]


class _Collected:
    """A collected test as the workers' sort reads it: its module, fixtures and markers."""

    def __init__(self, module: _Module, name: str, *fixtures: str, slow: bool = False) -> None:
        self.module, self.fixturenames, self.keywords = module, list(fixtures), {}
        self.nodeid = f"tests/{module.__name__.rpartition('.')[2]}.py::{name}"
        self.markers = [pytest.mark.slow.mark] if slow else []

    def get_closest_marker(self, name: str):
        return next((mark for mark in self.markers if mark.name == name), None)

    def add_marker(self, marker) -> None:
        self.markers.append(marker.mark if hasattr(marker, "mark") else marker)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnknownMarkWarning")  # xdist_group, where xdist is off
def test_a_worker_hands_out_the_ray_browser_and_memory_chains_first_then_the_slow_tests():
    """The order a worker's collection is sorted in is the order xdist's controller hands the groups out
    (``loadscopereorder`` off): the three groups that each run as one chain on one worker first (Ray, browsers,
    measured peaks), each on a worker of its own while there are workers, then the slow tests, then the rest; a
    module keeps its own order (tests/conftest.py's ``HEAVY_FIRST``: the memory group, handed out after a dozen slow
    modules by name, was the last to end in a loaded gate)."""
    import conftest

    quick, app = _Module("test_aa_quick"), _Module("test_app_slow")
    costs, browser, ray = _Module("test_costs"), _Module("test_browser_x", "browser"), _Module("test_zz_ray")
    items = [_Collected(quick, "test_a"), _Collected(app, "test_b", slow=True), _Collected(costs, "test_c", slow=True),
             _Collected(costs, "test_d"), _Collected(browser, "test_e"), _Collected(quick, "test_f"),
             _Collected(ray, "test_g", "ray_cluster"), _Collected(ray, "test_h")]
    worker = type("Config", (), {"workerinput": {}, "option": type("Option", (), {"quick": False})()})()
    conftest.pytest_collection_modifyitems(worker, items)
    assert [item.nodeid.rpartition("::")[2] for item in items] == [
        "test_g", "test_h", "test_e", "test_c", "test_d", "test_b", "test_a", "test_f"]
    groups = [[mark.args[0] for mark in item.markers if mark.name == "xdist_group"] for item in items]
    assert groups == [["ray-cluster"], ["ray-cluster"], ["browser"], ["memory"], ["memory"], [], [], []]
