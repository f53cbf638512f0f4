"""The suite's own parallel run (``addopts``: two xdist workers, ``tests/conftest.py``'s groups): the modules on the
Ray cluster share one worker and so one cluster. The groups were once lost without a word (pytest 9.2 reads a test's
id where xdist 3.8 did not write its group), and each worker started a cluster of its own."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_a_parallel_run_keeps_the_ray_modules_on_one_worker_and_a_module_on_one_worker():
    # Two tests of a Ray module that need no cluster (a module's group is decided before -k deselects), and a module.
    tests = ["tests/test_ray_train.py", "tests/test_widget_keys.py", "-k", "head_that or cuda_workers or widget"]
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "--numprocesses=2",
                           "--dist=loadgroup", *tests], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    ran = re.findall(r"^\[(gw\d)\] \[ *\d+%\] PASSED (\S+)@(\S+)", done.stdout, re.MULTILINE)
    groups: dict[str, set[str]] = {}
    for worker, _, group in ran:
        groups.setdefault(group, set()).add(worker)
    assert len(ran) == 4, done.stdout[-3000:]
    assert set(groups) == {"ray-cluster", "test_widget_keys"}
    assert all(len(workers) == 1 for workers in groups.values()), groups
