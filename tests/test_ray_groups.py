"""The watchdog that stops the tests' Ray cluster when the test process dies without stopping it (a pytest killed
from outside left its cluster running for hours): here on stand-in process groups, in seconds."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from ray_groups import _members

WATCHDOG = Path(__file__).with_name("ray_groups.py")


def _group() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "120"], start_new_session=True)  # a node: the leader of its own group


def _until(done, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)
    return done()


def test_the_watchdog_stops_the_nodes_and_removes_their_temp_dir_when_the_test_process_dies(tmp_path):
    parent, head, other = subprocess.Popen(["sleep", "120"]), _group(), _group()
    temp = tmp_path / "vray"
    temp.mkdir()
    watchdog = subprocess.Popen([sys.executable, str(WATCHDOG), str(parent.pid), str(temp), str(head.pid),
                                 str(other.pid)], start_new_session=True)
    try:
        time.sleep(1.5)
        assert _members(head.pid) and _members(other.pid) and watchdog.poll() is None  # the test process lives
        parent.kill()
        parent.wait()
        assert _until(lambda: not _members(head.pid) and not _members(other.pid))
        assert watchdog.wait(15) == 0 and not temp.exists()
    finally:
        for process in (parent, head, other, watchdog):
            process.kill()
            process.wait()


def test_the_watchdog_leaves_once_the_cluster_is_stopped_and_signals_nothing(tmp_path):
    parent, head = subprocess.Popen(["sleep", "120"]), _group()
    watchdog = subprocess.Popen([sys.executable, str(WATCHDOG), str(parent.pid), str(tmp_path), str(head.pid)],
                                start_new_session=True)
    try:
        time.sleep(0.5)
        head.terminate()  # RayCluster.stop did its work
        head.wait()
        assert watchdog.wait(15) == 0
        assert parent.poll() is None and tmp_path.exists()
    finally:
        for process in (parent, head, watchdog):
            process.kill()
            process.wait()


def test_the_clusters_ports_sit_below_the_kernels_ephemeral_range():
    # A port bind(0) hands out (every other test's server, every client socket) comes from the ephemeral range; the
    # cluster's nodes take theirs below it, so none is taken between the pick and Ray's bind.
    from ray_cluster import _ephemeral_start, ray_port

    start = _ephemeral_start()
    assert all(1024 <= ray_port() < start for _ in range(20))
