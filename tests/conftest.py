import atexit
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

# Hermetic: no test reads the user's real home, Hugging Face cache or XDG cache (a model in the real
# ~/.cache/huggingface once made three tests fail). Subprocesses (servers, CLIs) inherit this.
_HOME = tempfile.mkdtemp(prefix="vit-tests-home-")
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
os.environ.update(HOME=_HOME, HF_HOME=os.path.join(_HOME, "hf"), HF_HUB_CACHE=os.path.join(_HOME, "hf", "hub"),
                  XDG_CACHE_HOME=os.path.join(_HOME, ".cache"))
os.environ.pop("HUGGINGFACE_HUB_CACHE", None)


# The Hub is a local server (tests/hub_server.py, the ``fake_hub`` fixture) whose port is bound now, before anything
# imports huggingface_hub (it reads HF_ENDPOINT once, then); it answers only once a test asks for it, and refuses
# connections before. No test reaches the real Hub.
from hub_server import FakeHub, bind  # noqa: E402

FAKE_HUB = FakeHub()
HUB_SERVER = bind(FAKE_HUB)
os.environ["HF_ENDPOINT"] = f"http://127.0.0.1:{HUB_SERVER.server_address[1]}"
for _name in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VIT_MAX_DOWNLOAD_GB", "VIT_HF_IMAGE_BACKEND"):
    os.environ.pop(_name, None)

# Bytecode is cached, as Python does by default, though the environment says not to (PYTHONDONTWRITEBYTECODE, set on
# this project's machines): without it each of the four workers rewrote every test module's asserts again while
# collecting (31 s of CPU a worker, 18 s with the cache), and every command, app server and notebook kernel a test
# starts compiled the project's modules again. The controller writes the cache once before the workers start
# (``pytest_sessionstart``). Nothing reads a __pycache__ (git ignores them; Ray's code package leaves them out).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# Tests share two cores with whatever else runs; one thread each keeps them predictable.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VIT_THREADS", "1")  # what the app and the commands give torch (vit.core.threads), in process too

import pytest  # noqa: E402
import streamlit_once  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


def pytest_addoption(parser, pluginmanager):
    """``-p no:xdist`` runs the suite serially although ``addopts`` (pyproject.toml) asks xdist for two workers:
    without xdist its two options are accepted here and mean nothing. ``-n 0`` is the other way to a serial run."""
    parser.addoption("--quick", action="store_true", default=False,
                     help="the everyday lane: leave out the scenarios (tests that run real processes: the browser "
                          "pages, the Ray jobs, the measured memory sizes, the GPU-lease scripts' trainings) and the "
                          "tests marked slow")
    if not pluginmanager.has_plugin("xdist"):
        parser.addoption("--numprocesses", dest="numprocesses", default=None, help="(xdist is off: ignored)")
        parser.addoption("--dist", dest="dist", default="no", help="(xdist is off: ignored)")


def pytest_configure(config):
    _CONFIG[:] = [config]
    _unfreeze_at_exit()
    # xdist would hand out the groups largest first by their count of tests; the order below (by seconds) is better.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


# The groups that each run as one chain of minutes on one worker (the Ray cluster's, the browsers', the measured
# peaks'): handed out first, one to each worker, so that no worker is left with one of them at the end. Until
# 87be912 the memory group came after a dozen slow modules (by name) and ended last in a loaded gate; handed out
# first it ended 250 s before the other workers, the total unchanged (1,396 -> 1,392 s, one machine:
# bench/results/cpu-2026-11-28/suite-gate-loaded-87be912.txt, suite-gate-loaded-a61904e.txt).
HEAVY_FIRST = ("ray-cluster", "browser", "memory")
# The modules whose tests each measure a subprocess's peak memory over a model at its largest allowed size (up to a
# few GB each): one group, so two of them never run at once on a CI machine's memory
MEMORY_MODULES = ("test_costs", "test_layout_memory", "test_checkpointed_states")
# The modules whose every test runs a real process as its scenario (beside the browser and Ray modules): the
# GPU-lease scripts' trainings and the measured peaks
SCENARIO_MODULES = (*MEMORY_MODULES, "test_gpu_lease_scripts", "test_gpu_session")
RAY_TIMEOUT_S = 480  # the deadline of a test on the Ray cluster (pyproject.toml's timeout is every other test's)
# Every test this process collected, as (id, item), its scenarios marked, before ``--quick``, ``-k`` or ``-m`` left any
# out: where that is the whole suite (every xdist worker collects it in the README's command) the lanes' test reads the
# lane from it rather than collecting the suite again in a pytest of its own (~20 s of CPU: issue 112)
COLLECTED = pytest.StashKey[list]()


def _group(module, items) -> str | None:
    """A module's group: every module with a test on the Ray cluster shares one (so one cluster, on one worker); the
    modules that drive Chromium against an app server share another (two browsers and two servers never compete
    for two cores: their timeouts stay what they were measured for); the ``MEMORY_MODULES`` a third. None: its
    tests are grouped as ``_item_group`` says."""
    if any("ray_cluster" in item.fixturenames for item in items):
        return "ray-cluster"
    marks = getattr(module, "pytestmark", [])
    if any(mark.name == "browser" for mark in (marks if isinstance(marks, list) else [marks])):
        return "browser"
    if module.__name__.rpartition(".")[2] in MEMORY_MODULES:
        return "memory"
    return None


def _item_group(item) -> str | None:
    """The group of a test of no module group (``_group``): the tests of a module that share a fixture built once
    per module (or class) share one (built once, on one worker); any other test is in none, handed out on its own
    as workers free up (test_costs.py's and test_layout_memory.py's subprocesses, and the tests beside a module
    fixture that do not use it, held one worker for minutes, the run's tail)."""
    return item.module.__name__ if _shares_fixtures(item) else None


def _shares_fixtures(item) -> bool:
    """Whether ``item`` uses a fixture built once for more than one test of its module (module, class or package
    scope; the session's, the Hub's and the Ray cluster's, are each worker's own anyway)."""
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(defs and defs[-1].scope in ("module", "class", "package")
                                    for defs in info.name2fixturedefs.values())


def scenario(item) -> bool:
    """Whether a test is a scenario: it drives Chromium, runs a job on the Ray cluster, measures a process's peak
    memory, runs a GPU lease's training, or needs a GPU, or is marked ``scenario`` by hand (a test that spawns some
    other real process, e.g. torch.compile's C++ compiler). The everyday lane (``--quick``) leaves them out."""
    if any(item.get_closest_marker(mark) is not None for mark in ("browser", "cuda", "scenario")):
        return True
    return "ray_cluster" in item.fixturenames or item.module.__name__.rpartition(".")[2] in SCENARIO_MODULES


def quick(item) -> bool:
    """Whether a test is in the everyday lane (``pytest --quick``): neither a scenario nor marked slow."""
    return not scenario(item) and item.get_closest_marker("slow") is None


def _slow(items) -> bool:
    return any(item.get_closest_marker("slow") is not None for item in items)


def _in_group(item, group: str) -> None:
    """Put ``item`` in xdist's ``group``. xdist (3.8) tells the controller a test's group by a ``@group`` suffix of its
    id, which it writes to ``item._nodeid``; pytest 9.2 builds the id from ``item._id`` instead, so that suffix, and
    with it every group, was silently lost (the Ray tests ran on both workers, each starting a cluster). The suffix
    is written where this pytest reads it."""
    item.add_marker(pytest.mark.xdist_group(group))
    try:
        from _pytest.nodeid import NodeId  # pytest >= 9.2
    except ImportError:  # an older pytest reads _nodeid, where xdist writes the suffix itself
        return
    if hasattr(item, "_id") and not item.nodeid.endswith(f"@{group}"):
        item._id = NodeId.parse(f"{item.nodeid}@{group}")


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups into the test ids it sends
def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` need a CUDA GPU: skipped, with the reason, where there is none. In xdist's workers
    (``addopts`` in pyproject.toml: ``--numprocesses=4 --dist=loadgroup``) a module's tests that share its module
    fixtures stay on one worker (app servers and models are built once; any other test is spread, ``_item_group``),
    the modules on the Ray cluster share one worker and so one cluster, the browser modules another, the memory
    modules a third, and those three groups start first (``HEAVY_FIRST``), then the slow tests."""
    for item in items:
        if scenario(item):
            item.add_marker(pytest.mark.scenario)
    if config in _CONFIG:  # the session's own collection, before any deselection (tests/test_lanes.py reads it)
        config.stash[COLLECTED] = [(item.nodeid, item) for item in items]
    if getattr(config.option, "quick", False):
        kept = [item for item in items if quick(item)]
        config.hook.pytest_deselected(items=[item for item in items if not quick(item)])
        items[:] = kept
    if hasattr(config, "workerinput"):  # an xdist worker: the controller hands out the groups in this order
        modules: dict = {}
        for item in items:
            modules.setdefault(item.module, []).append(item)
        groups = {module: _group(module, its) for module, its in modules.items()}
        group = {id(item): groups[item.module] or _item_group(item) for item in items}  # by id: _in_group renames
        members: dict = {}
        for item in items:
            members.setdefault(group[id(item)] or id(item), []).append(item)
        order = {module: (HEAVY_FIRST.index(g) if g in HEAVY_FIRST else len(HEAVY_FIRST), i)
                 for i, (module, g) in enumerate(groups.items())}
        # Then the slow ones (a group with a slow test, a slow test of no group) before the rest: the run ends on
        # tests of seconds, which even out the workers, not on one of minutes started last
        slow = {key: _slow(its) for key, its in members.items()}
        items.sort(key=lambda item: (order[item.module][0],  # stable: a module's own order is kept
                                     not slow[group[id(item)] or id(item)], order[item.module][1]))
        for item in items:
            if group[id(item)] is not None:
                _in_group(item, group[id(item)])
    for item in items:  # a Ray job's chain of process starts: 174 s once at a load of 10; the others keep 300 s
        if "ray_cluster" in item.fixturenames and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(RAY_TIMEOUT_S))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run them with: pytest -m cuda on a GPU machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which starts the workers
def pytest_sessionstart(session):
    """In the controller of a parallel run (or a serial run), before any worker starts: the bytecode of the project's
    modules and the test modules' rewritten asserts, written once, so that no worker rewrites them again."""
    if not hasattr(session.config, "workerinput"):
        write_bytecode(session.config)


def write_bytecode(config, root: Path | None = None) -> None:
    """The project's modules compiled (``compileall``) and every test module's asserts rewritten into pytest's own
    cache (its pyc, checked by the source's hash), what collecting them would write; a pyc already current is kept.
    Through pytest's internal ``_rewrite_test`` and ``_write_pyc``: should they change, the run only loses the
    saving (each worker rewrites as before), which the test of this function tells (on a small tree: ``root``,
    the repository by default)."""
    import compileall
    import re

    root = root or Path(__file__).resolve().parent.parent
    tests = re.compile(r"/test_[^/]*\.py$")  # their asserts are rewritten into pytest's own pyc, below
    for folder in ("vit", "app_pages", "tests", "bench"):
        compileall.compile_dir(root / folder, quiet=2, rx=tests)
    compileall.compile_file(root / "app.py", quiet=2)
    try:
        from _pytest.assertion import rewrite
    except ImportError:
        return
    state = config.stash.get(rewrite.assertstate_key, None)
    if state is None:  # --assert=plain: nothing is rewritten
        return
    try:
        for test in sorted((root / "tests").glob("test_*.py")):
            pyc = rewrite.get_cache_dir(test) / (test.name[:-3] + rewrite.PYC_TAIL)
            if rewrite._read_pyc(test, pyc) is None and rewrite.try_makedirs(pyc.parent):
                source_hash, code = rewrite._rewrite_test(test, config)
                rewrite._write_pyc(state, code, source_hash, pyc)
    except (AttributeError, TypeError):  # a pytest whose internals changed: the workers rewrite, as before
        return


_FULL_COLLECTIONS = [0]  # Python's full (generation 2) collections in this process when a test last ended


def _freeze_after_a_full_collection() -> None:
    """At a test's end, when Python made a full collection during it, every object then alive is frozen (``gc.freeze``):
    later full collections skip them. A worker's objects are mostly what it imported (torch, transformers' model
    modules, timm) and its fixtures; each full collection walked them all again, ~0.4 s of CPU, ~30 times a worker in
    the lane (11-15 % of a worker's CPU in garbage collection). Objects alive at a test's end are its module's
    fixtures, caches and what was imported; one of them left in a reference cycle later is never freed (it would be
    at the worker's end anyway), and a test's own objects are never frozen while it runs."""
    import gc

    full = gc.get_stats()[2]["collections"]
    if full != _FULL_COLLECTIONS[0]:
        _FULL_COLLECTIONS[0] = full
        gc.freeze()


def _unfreeze_at_exit() -> None:
    """What ``_freeze_after_a_full_collection`` froze is let go at the interpreter's exit (``atexit``), after pytest's
    own end: nanobind's leak check (triton's) would report every frozen object still alive then, in ~30 lines on
    stderr. Not in ``pytest_unconfigure``: pytest's unraisable-exception plugin makes two full collections after that
    hook (its own ``pytest_unconfigure`` and its cleanup), and unfrozen they walked the worker's whole heap again,
    ~1 s of CPU each at a worker's end (frozen they find only what the last tests left)."""
    import atexit
    import gc

    atexit.register(gc.unfreeze)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """After a worker's last test on the Ray cluster (the Ray modules are one group, run first: ``_group``) the
    cluster is stopped, not left idle beside every later test (its ~20 processes took 4.3 s of CPU a minute, idle).
    With ``VIT_TEST_TIMELINE=FILE`` each test appends ``worker pid start stop id`` to FILE (its worker's name and
    process, wall-clock seconds, setup and teardown included): which worker ran what, and when, to see where a
    parallel run waits, and whose CPU a process's is (bench/suite_cpu.py)."""
    import time

    began = time.time()
    yield
    if _RAY_CLUSTERS and "ray_cluster" in item.fixturenames and (
            nextitem is not None and "ray_cluster" not in nextitem.fixturenames) and _last_on_the_cluster(item):
        _stop_ray_clusters()  # the worker's last test on the cluster: its ~20 idle processes stop now
    if item.get_closest_marker("browser") is not None and (
            nextitem is None or nextitem.get_closest_marker("browser") is None) and "helpers" in sys.modules:
        sys.modules["helpers"].close_chromium()  # the worker's shared Chromium (tests/helpers.py) stops with its tests
    if "shared_app" in sys.modules:
        sys.modules["shared_app"].stop_after(item)  # the shared app server: after the last test that asks for it
    _freeze_after_a_full_collection()
    path = os.environ.get("VIT_TEST_TIMELINE")
    if path:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(path, "a") as out:
            out.write(f"{worker} {os.getpid()} {began:.2f} {time.time():.2f} {item.nodeid}\n")


# ---------------------------------------------------------------------------------------------
# The lanes' budget (tests/lanes.py): each test's CPU, the engine modules the lane imported, judged at the end.

_CPU_AT = pytest.StashKey[float]()
_BUDGET = pytest.StashKey[dict]()


def _cpu_now() -> float:
    """This process's CPU seconds, its threads' and its ended children's included."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_AT] = _cpu_now()
    streamlit_once.scan_components_once()  # once Streamlit is imported: its AppTests' component scan done once
    streamlit_once.compile_scripts_once()  # and each app script compiled once for all its runs
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """A test's CPU, setup to teardown, goes with its teardown's report (``cpu_s``) to the process that judges it."""
    yield
    if _CPU_AT in item.stash:
        item.user_properties.append(("cpu_s", _cpu_now() - item.stash[_CPU_AT]))


def _budget(config) -> dict:
    return config.stash.setdefault(_BUDGET, {"cpu": [], "imported": set(), "files": set(), "problems": []})


def _whole(config) -> bool:
    """Whether this run is the whole suite (or, under ``--quick``, the whole lane): no paths, ``-k``, ``-m``,
    ``--lf`` or ``--deselect`` narrowing it."""
    option = config.option
    if option.keyword or option.markexpr or getattr(option, "lf", False) or getattr(option, "deselect", None):
        return False
    tests = Path(__file__).resolve().parent
    return [Path(a).resolve() for a in config.args] == [tests]


def pytest_runtest_logreport(report):
    if report.when == "teardown":
        cpu = dict(report.user_properties).get("cpu_s")
        if cpu is not None and _CONFIG:
            _budget(_CONFIG[0])["cpu"].append(cpu)


_CONFIG: list = []  # the running config, for pytest_runtest_logreport (which is given no config)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """An xdist worker's engine modules imported and test files run, for the lane's check (``pytest_sessionfinish``)."""
    output = getattr(node, "workeroutput", {})
    budget = _budget(node.config)
    budget["imported"] |= set(output.get("engine_imported", ()))
    budget["files"] |= set(output.get("lane_files", ()))


def pytest_sessionfinish(session, exitstatus):
    """A worker hands the controller what the lane's check needs; the controller (or a serial run) judges the lanes'
    budget (tests/lanes.py) and fails a run past it."""
    import lanes

    config = session.config
    quick = config.getoption("quick")
    if hasattr(config, "workerinput"):
        if quick:
            config.workeroutput["engine_imported"] = sorted(lanes.imported_engine_modules())
            config.workeroutput["lane_files"] = sorted({str(item.path) for item in session.items})
        return
    if not _whole(config) or config.option.collectonly:  # a collection ran nothing: nothing to judge
        return
    budget = _budget(config)
    if quick:
        if not hasattr(config, "workerinput") and not budget["files"]:  # a serial run: this process ran the lane
            budget["imported"] |= lanes.imported_engine_modules()
            budget["files"] |= {str(item.path) for item in session.items}
        count_problem = lanes.lane_count_problem(session.testscollected)
        missing = lanes.untouched(budget["imported"], {Path(f) for f in budget["files"]})
        if missing:
            budget["problems"].append(f"the everyday lane reaches none of these engine modules (give each a fast "
                                      f"test, or import it where a fast test runs it): {', '.join(missing)}")
        if count_problem:
            budget["problems"].append(count_problem)
    else:
        median_problem = lanes.median_cpu_problem(budget["cpu"])
        if median_problem:
            budget["problems"].append(median_problem)
    if budget["problems"]:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    budget = config.stash.get(_BUDGET, None)
    if budget and budget["cpu"] and not hasattr(config, "workerinput"):
        import statistics

        terminalreporter.write_line(f"per-test CPU: median {statistics.median(budget['cpu']):.3f} s over "
                                    f"{len(budget['cpu'])} tests (tests/lanes.py's budget)")
    for problem in (budget or {}).get("problems", ()):
        terminalreporter.write_line(f"LANE BUDGET FAILED: {problem}", red=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A browser test that fails (or times out) while an app server runs reports that server's thread stacks and the
    last lines of its output (``helpers.server_report``): a page that never rendered says where its server was."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and report.when in ("setup", "call"):
        from helpers import LIVE_SERVERS, server_report

        if LIVE_SERVERS:
            report.sections.append(("the app servers: thread stacks and output", server_report()))


# ---------------------------------------------------------------------------------------------
# A real local Ray cluster for the tests that ask for it (tests/ray_cluster.py): started once.


_RAY_CLUSTERS: list = []  # this process's running cluster (``_ray_cluster``), for ``pytest_runtest_protocol``


def _last_on_the_cluster(item) -> bool:
    """Whether no test after ``item`` in this run asks for the cluster. The Ray modules mix tests on it with tests
    without it (an unreachable address, a refusal before submitting): stopped at each of those, the cluster was
    started four times in one run of the group, each start ~20 s of CPU and a minute of wall time, where the idle
    cluster costs ~0.1 s of CPU a second (bench/results/cpu-2026-11-29b/ray-group-*.txt)."""
    items = item.session.items
    later = items[items.index(item) + 1:] if item in items else []
    return not any("ray_cluster" in other.fixturenames for other in later)


def _stop_ray_clusters() -> None:
    while _RAY_CLUSTERS:
        _RAY_CLUSTERS.pop().stop()


@pytest.fixture
def ray_cluster(_ray_cluster):
    """A head and a second worker node on 127.0.0.1 (1 CPU each), started once per test process; the ``RayCluster``
    (its ``address`` is the job address). Stopped after the worker's last test that asks for it, and started again
    should a later test ask."""
    if _ray_cluster not in _RAY_CLUSTERS:
        _ray_cluster.restart()
        _RAY_CLUSTERS.append(_ray_cluster)
    return _ray_cluster


@pytest.fixture(scope="session")
def _ray_cluster(tmp_path_factory):
    import warnings

    from ray_cluster import RayCluster, RayClusterError

    cluster = RayCluster(tmp_path_factory.mktemp("ray"))
    try:
        try:
            cluster.start()
        except RayClusterError as e:
            # Like a missing GPU for the cuda tests: a machine where Ray itself cannot start a node skips the
            # tests that need one, and the warnings summary carries Ray's own log of why, in full.
            warnings.warn(f"no local Ray cluster could start on this machine: {e}", stacklevel=1)
            pytest.skip(f"no local Ray cluster could start on this machine ({str(e).splitlines()[0]}); "
                        "see the warnings summary for Ray's log")
        _RAY_CLUSTERS.append(cluster)
        yield cluster
    finally:
        _stop_ray_clusters()
        cluster.stop()


@pytest.fixture(scope="session")
def _hub_server():
    from hub_server import serve

    serve(HUB_SERVER)
    yield FAKE_HUB
    HUB_SERVER.shutdown()


@pytest.fixture
def fake_hub(_hub_server, tmp_path, monkeypatch):
    """The local Hub at HF_ENDPOINT, emptied, with a fresh HF cache for this test; yields its ``FakeHub``."""
    from huggingface_hub import constants

    _hub_server.repos.clear()
    _hub_server.requests.clear()
    _hub_server.cut_once.clear()
    _hub_server.sent.clear()
    _hub_server.release.clear()
    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    yield _hub_server
    _hub_server.release.set()  # a silent or trickling answer still under way ends now


@pytest.fixture(autouse=True)
def long_work_waited_for(request, monkeypatch):
    """An AppTest sees one script run at a time, so a page's long work (``app_pages/explorer_sections/long_work.py``)
    and a Hub download (``hub_download.py``) are waited for there, as a user waits for their result; tests of the
    progress and the Stop button set it back."""
    from pathlib import Path

    text = Path(request.module.__file__).read_text()
    # "_app(": a module driving the page through another's AppTest helper (test_textspan's open_clip_app), whose
    # long work once came back unfinished on a busy machine
    if "AppTest" in text or "_app(" in text or hasattr(request.module, "run_app"):
        from app_pages.explorer_sections import hub_download, long_work

        monkeypatch.setattr(long_work, "QUICK_S", 600.0)
        monkeypatch.setattr(hub_download, "QUICK_S", 600.0)  # and a Hub download, as its page waits for it


# The library road's two classifiers, one per road, shared by its map tests (test_library_gradients.py,
# test_library_attributions.py): built tiny with random weights by their own library and saved natively, once per
# module that asks.
@pytest.fixture(scope="module")
def msn(tmp_path_factory):
    """A transformers ViT-MSN classifier folder (``test_library_path.save_family``)."""
    from test_library_path import save_family

    return save_family(tmp_path_factory.mktemp("vit_msn"), "vit_msn")


@pytest.fixture(scope="module")
def flexivit(tmp_path_factory):
    """A timm FlexiViT classifier folder (``test_library_timm``'s model, saved with ``save_for_hf``)."""
    from test_library_timm import FAMILIES, build
    from timm.models import _hub

    folder = tmp_path_factory.mktemp("flexivit_small")
    _hub.save_for_hf(build("flexivit_small"), folder, model_args=FAMILIES["flexivit_small"][0])
    return folder


# The app server the browser modules share (tests/shared_app.py): one per test process, the browser modules' worker.
@pytest.fixture(scope="session")
def local_app(tmp_path_factory):
    """``shared_app.serve_local_app``: the tiny model shipped with its samples, no token; yields a ``LocalApp``.
    Stopped after the run's last test that asks for it (``shared_app.stop_after``)."""
    from shared_app import shared_local_app

    with shared_local_app(tmp_path_factory.mktemp("local-app")) as app:
        yield app


@pytest.fixture(scope="session")
def llava(tmp_path_factory):
    """test_vlm_answer's tiny LLaVA saved whole (``shared_app.save_llava``): one folder, so ``local_app`` loads it
    once for every module that opens it."""
    from shared_app import save_llava

    return save_llava(tmp_path_factory.mktemp("shared-llava") / "llava")
