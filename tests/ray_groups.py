"""Stopping a local Ray cluster of the tests by its nodes' process groups (never by name: other people's Ray
processes may share the machine), and the watchdog ``RayCluster.start`` leaves running in a session of its own:
``python ray_groups.py PARENT_PID TEMP HEAD_PGID [OTHER_PGID ...]`` stops the cluster if the test process ends
without stopping it (a pytest killed from outside). Standard library only: it starts in a blink."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path


def stop_groups(head: int, others: list[int], deadline: float) -> None:
    """SIGTERM in the order Ray needs: the other nodes' groups, then every head process but the GCS, then the head's
    group. Signalled together, the head's ``ray start`` and autoscaler monitor spend ~30 s retrying a GCS that is
    already gone (each tells it of its end)."""
    for pgid in others:
        _signal_group(pgid, signal.SIGTERM)
    _wait_until(lambda: not any(_members(pgid) for pgid in others), deadline)
    before_gcs = [pid for pid in _members(head) if not _is_gcs(pid)]
    for pid in before_gcs:
        _signal(pid, signal.SIGTERM)
    _wait_until(lambda: not set(before_gcs) & set(_members(head)), deadline)
    _signal_group(head, signal.SIGTERM)


def watch(parent: int, temp: str, head: int, others: list[int], poll: float = 1.0) -> None:
    """Return once the cluster is gone; if ``parent`` (the test process) ends first, stop the cluster: SIGTERM in
    Ray's order, SIGKILL to what is left after a minute, then remove its temp dir."""
    while _group_exists(head):
        if not _alive(parent):
            deadline = time.monotonic() + 60
            stop_groups(head, others, deadline)
            _wait_until(lambda: not any(_members(pgid) for pgid in (head, *others)), deadline)
            for pgid in (head, *others):
                _signal_group(pgid, signal.SIGKILL)
            shutil.rmtree(temp, ignore_errors=True)
            return
        time.sleep(poll)


def _group_exists(pgid: int) -> bool:
    """Whether process group ``pgid`` has a process (a zombie not yet reaped counts): one signal-0 call, where reading
    every /proc entry once a second cost the watchdog ~0.4 s of CPU a minute on a busy test machine."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of the group that we may not signal: it exists
        return True
    return True


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_until(done, deadline: float) -> None:
    while not done() and time.monotonic() < deadline:
        time.sleep(0.1)


def _members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, read from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()  # after "pid (comm)"
            except OSError:  # it ended while we looked
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
                pids.append(int(entry.name))
    return pids


def _is_gcs(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe").endswith("/gcs_server")
    except OSError:
        return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    parent, temp, head, *others = sys.argv[1:]
    watch(int(parent), temp, int(head), [int(pgid) for pgid in others])
