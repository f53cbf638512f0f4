"""The suite's two lanes and their budget (issue 112), for tests/conftest.py's hooks.

The whole suite is the README's test command and CI's. The everyday lane (``pytest --quick``) leaves out the
scenarios (tests that run a real process: the browser pages, the Ray jobs, the measured memory peaks, the GPU-lease
scripts' trainings, the GPU tests) and the tests marked slow. Two checks keep the lanes honest as the suite grows:

- **The lane touches the whole engine.** A full ``--quick`` run imports every module of ``vit/`` and
  ``app_pages/``; the page scripts Streamlit runs (``app.py``, ``app_pages/*.py``, executed, never imported) are each
  named by a lane test module. A module nothing in the lane reaches fails the run, named.
- **The budget.** The lane's collected count stays at most ``LANE_MAX_TESTS``, and in a run of the whole suite the
  median test's CPU (the worker's own, its children's included) stays at most ``MEDIAN_CPU_MAX_S``: a wave adds
  tests without adding minutes. Past either bound the run fails, saying which.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
ENGINE = ("vit", "app_pages")  # the packages whose every module the lane must reach
# The lane collected 3,010 tests and ran them in 204 s idle on 2 cores (bench/results/cpu-2026-11-29e/lane-budget.txt;
# 2,769 in 209 s before: cpu-2026-11-29/lane-budget.txt); this leaves 10 % for a wave, ~225 s at that pace: past it the
# lane may no longer answer in five minutes. Move the costliest of its tests to slow, or raise this with a measured
# lane time in the same commit.
LANE_MAX_TESTS = 3300
# The whole suite's median test took 0.027 s of CPU (the same file); the bound leaves 7x for a loaded machine, where
# a test's CPU seconds grow with contention (cache, frequency).
MEDIAN_CPU_MAX_S = 0.2
MEDIAN_MIN_TESTS = 1000  # a run of fewer tests is a selection: its median says nothing of the suite


def engine_modules() -> dict[str, Path]:
    """{dotted name: file} of every module of ``vit/`` and ``app_pages/``, packages' ``__init__`` included."""
    found = {}
    for package in ENGINE:
        for path in sorted((REPOSITORY / package).rglob("*.py")):
            name = ".".join((package, *path.relative_to(REPOSITORY / package).with_suffix("").parts))
            found[name.removesuffix(".__init__")] = path
    return found


def page_scripts() -> list[Path]:
    """The scripts Streamlit executes rather than imports: ``app.py`` and each page it names (``st.Page("…")``)."""
    import re

    app = REPOSITORY / "app.py"
    return [app, *sorted(REPOSITORY / page for page in re.findall(r'st\.Page\("([^"]+\.py)"', app.read_text()))]


def imported_engine_modules() -> set[str]:
    """The engine's modules this process has imported."""
    return {name for name in sys.modules if name.split(".")[0] in ENGINE}


def untouched(imported: set[str], lane_files: set[Path]) -> list[str]:
    """The engine's modules the lane never reached: neither imported by its run (``imported``) nor, for a page
    script, named by one of its test modules (``lane_files``: its path from the repository, or its file name with
    its folder)."""
    texts = [path.read_text() for path in lane_files]
    scripts = {path: (str(path.relative_to(REPOSITORY)), f'"{path.parent.name}" / "{path.name}"')
               for path in page_scripts()}
    missing = [name for name, path in engine_modules().items()
               if name not in imported and path not in scripts and not path.name == "__init__.py"]
    missing += [str(path.relative_to(REPOSITORY)) for path, names in scripts.items()
                if not any(n in text for text in texts for n in names)]
    return sorted(missing)


def median_cpu_problem(cpu_seconds: list[float]) -> str | None:
    """Why a whole run's per-test CPU fails the budget, or None (a run of fewer than ``MEDIAN_MIN_TESTS`` tests is
    not judged)."""
    if len(cpu_seconds) < MEDIAN_MIN_TESTS:
        return None
    median = statistics.median(cpu_seconds)
    if median > MEDIAN_CPU_MAX_S:
        return (f"the suite's median test took {median:.3f} s of CPU, past its budget of {MEDIAN_CPU_MAX_S} s "
                "(tests/lanes.py): make the new tests cheaper (a smaller model, a shared fixture) or mark them slow")
    return None


def lane_count_problem(count: int) -> str | None:
    """Why the everyday lane's collected count fails the budget, or None."""
    if count > LANE_MAX_TESTS:
        return (f"the everyday lane collects {count} tests, past its budget of {LANE_MAX_TESTS} (tests/lanes.py): "
                "mark the costliest new ones slow, or raise the bound with a measured lane time")
    return None
