"""What state a run is in: its launch record and status.json weighed against its process.

States: ``queued`` (waiting for its device, persisted in launch.json), ``running``,
``completed``, ``failed`` (status.json's error, or the CLI's one-line usage error when it
exited before writing status.json), ``cancelled`` (stopped by the user), ``crashed`` (the
process is gone, or its heartbeat is stale, without a final state: SIGKILL, OOM, reboot) and
``damaged`` (its files cannot be read as run files; the manager says which and why).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from vit.runfiles import STALE_SECONDS, timestamp

STATES = ("queued", "running", "completed", "failed", "cancelled", "crashed", "damaged")
ACTIVE_STATES = ("queued", "running")


# ---------------------------------------------------------------------------------------------
# Whether a launched process still runs


def boot_id() -> str | None:
    """This boot's id: a process recorded under another one is gone (the machine rebooted)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def proc_start(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of a process, from /proc; None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return rest[0], int(rest[19])


# The launched processes of this server, so that they are reaped (a zombie looks alive) and
# their exit codes known. Only a cache: after a restart the processes are found through /proc.
_children: dict[int, subprocess.Popen] = {}


def remember_child(process: subprocess.Popen) -> None:
    """Keep a launched process so that it is reaped and its exit code known."""
    _children[process.pid] = process


def process_alive(session: dict) -> tuple[bool | None, int | None]:
    """(alive, exit code if we saw it) of a session's process; alive None when it ran on another host."""
    pid = session.get("pid")
    if not pid:
        return False, None
    if session.get("host") != socket.gethostname():
        return None, None
    if session.get("boot_id") and session["boot_id"] != boot_id():
        return False, None  # rebooted since
    child = _children.get(pid)
    if child is not None:
        code = child.poll()
        if code is not None:
            return False, code
        return True, None
    with contextlib.suppress(ChildProcessError, OSError):
        done, status = os.waitpid(pid, os.WNOHANG)  # ours from before a module reload
        if done == pid:
            return False, os.waitstatus_to_exitcode(status)
    info = proc_start(pid)
    if info is None:
        if sys.platform.startswith("linux"):
            return False, None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False, None
        except PermissionError:
            pass
        return True, None
    state, started = info
    if state in ("Z", "X") or (session.get("proc_start") is not None and started != session["proc_start"]):
        return False, None  # a zombie, or the pid now belongs to another process
    return True, None


def _usage_line(output: str) -> str | None:
    """The CLI's one-line error ('vit.train: error: ...') in a process's output, without the prefix."""
    for line in reversed(output.splitlines()):
        if line.startswith("vit.train: error: "):
            return line[len("vit.train: error: "):]
    return None


# ---------------------------------------------------------------------------------------------
# Reconciling what the files say with what the processes do


def reconcile(record: dict | None, status: dict | None, alive: bool | None, exit_code: int | None,
              output: str, now: float, stale_seconds: float = STALE_SECONDS) -> tuple[str, str | None]:
    """(state, detail) of a run from its launch record, its status.json and its process.

    ``alive`` is whether the last started process runs (None: unknown, on another host);
    ``output`` the tail of that process's output. ``detail`` is the error of a failed run or
    the reason for a crashed, cancelled or queued one.
    """
    updated = timestamp(status.get("updated_time")) if status else None
    stale = updated is None or now - updated > stale_seconds
    if record is None:  # a run the CLI was started for outside the app
        if status is None:
            return "crashed", "no status.json: the run never started training"
        state = status.get("state")
        if state == "failed":
            return "failed", status.get("error")
        if state in ("completed", "cancelled"):
            return state, None
        if alive is False:
            return "crashed", f"process {status.get('pid')} is gone without a final state"
        if stale:
            return "crashed", f"no heartbeat for {now - (updated or now):.0f} s"
        return "running", None

    if record.get("state") == "queued":
        return "queued", record.get("queue_reason")
    if record.get("state") == "cancelled":
        return "cancelled", "cancelled while queued"
    if record.get("state") == "error":
        return "failed", record.get("start_error")
    session = record["sessions"][-1]
    started = session["started_at"]
    # status.json may still be the previous session's (a resume rewrites it once training starts).
    current = status is not None and (status.get("pid") == session.get("pid") or
                                      (updated is not None and updated >= started))
    stop_requested = record.get("stop_requested_at") is not None
    if current:
        state = status.get("state")
        if state == "failed":
            return "failed", status.get("error") or "failed without a message; see the log"
        if state in ("completed", "cancelled"):
            return state, None
        if alive is False:
            if stop_requested:
                return "cancelled", "killed after the stop grace period; resumes from the last saved epoch"
            return "crashed", _gone(exit_code, output)
        if stale:
            return "crashed", f"no heartbeat for {now - updated:.0f} s"
        return "running", None
    if alive is True or (alive is None and now - started < stale_seconds):
        return "running", "starting"
    usage = _usage_line(output)
    if usage is not None:
        return "failed", usage
    if stop_requested:
        return "cancelled", "stopped before training started"
    return "crashed", _gone(exit_code, output)


def _gone(exit_code: int | None, output: str) -> str:
    if exit_code is not None and exit_code < 0:
        reason = f"killed by {signal.Signals(-exit_code).name}" if -exit_code in signal.valid_signals() \
            else f"killed by signal {-exit_code}"
    elif exit_code is not None:
        reason = f"exited with code {exit_code}"
    else:
        reason = "the process is gone"
    last = next((line for line in reversed(output.splitlines()) if line.strip()), None)
    return f"{reason} without a final state" + (f"; last output: {last.strip()}" if last else "")


