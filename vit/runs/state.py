"""What state a run is in: its launch record and status.json weighed against its process.

States: ``queued`` (waiting for its device, persisted in launch.json), ``running``,
``completed``, ``failed`` (status.json's error, or the CLI's one-line usage error when it
exited before writing status.json), ``cancelled`` (stopped by the user), ``crashed`` (the
process is gone, or its heartbeat is stale, without a final state: SIGKILL, OOM, reboot) and
``damaged`` (its files cannot be read as run files; the manager says which and why).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from vit.core.runfiles import STALE_SECONDS, pid_alive, timestamp

STATES = ("queued", "running", "completed", "failed", "cancelled", "crashed", "damaged")
ACTIVE_STATES = ("queued", "running")
STARTING = "starting"  # a running run's detail until its status.json exists, with the phase it said after a colon


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


def proc_cmdline(pid: int) -> list[str] | None:
    """A process's command line from /proc; None if it is gone (or a zombie, whose is empty)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    args = raw.decode("utf-8", errors="replace").split("\0")
    return args[:-1] if args and args[-1] == "" else (args or None)


def proc_start_time(pid: int) -> float | None:
    """When a process started, in seconds since the epoch (boot time + its start in clock ticks)."""
    info = proc_start(pid)
    if info is None:
        return None
    try:
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return None
    return boot + info[1] / os.sysconf("SC_CLK_TCK")


def _pgrp(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2:].split()[2])


def cli_process_problem(pid: object, run_dir: Path, started_by: float | None) -> str | None:
    """Why ``pid`` (from a run's status.json) is not that run's training process, or None when it is.

    It must be alive, run ``vit.train`` on this run folder (its --out or --resume, resolved from the
    process's own working directory) and have started no later than ``started_by``, the status
    file's start time: a reused pid belongs to a process started after the run wrote its status.
    """
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
        return f"status.json names no usable process ({pid!r})"
    args = proc_cmdline(pid)
    info = proc_start(pid)
    if not args or info is None or info[0] in ("Z", "X"):
        return f"process {pid} is gone"
    if "vit.train" not in args and "vit.sae" not in args and not any(
            a.endswith(("vit/train.py", "vit\\train.py")) for a in args):
        return f"process {pid} is not a vit.train process"
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return f"process {pid} cannot be inspected"
    target = run_dir.resolve()
    values = [a.split("=", 1)[1] if a.startswith("--") and "=" in a else a for a in args[1:]]  # --out=DIR too
    if not any(_same_path(cwd / a, target) for a in values if a and not a.startswith("-")):
        return f"process {pid} trains another run folder"
    started = proc_start_time(pid)
    if started_by is not None and (started is None or started > started_by + 2.0):  # 2 s: clock tick rounding
        return f"process {pid} started after this run's status was written (its pid was reused)"
    return None


def _same_path(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b
    except (OSError, RuntimeError, ValueError):
        return False


# A launched process carries a secret in its environment that only its launcher knew; launch.json keeps a
# hash of it bound to the run's name. Everything else a launch record holds (pid, start time, command line)
# can be copied from /proc into a forged record; the secret cannot, and /proc/PID/environ of another
# user's process is not readable at all.
LAUNCH_SECRET_ENV = "VIT_LAUNCH_SECRET"


def launch_secret_hash(run_name: str, secret: str) -> str:
    """What launch.json keeps of a launch's secret: a hash bound to the run's name (a record copied
    under another name does not verify)."""
    return hashlib.sha256(f"{run_name}\0{secret}".encode()).hexdigest()


def environ_value(pid: int, key: str) -> str | None:
    """One variable of a process's initial environment; None when it has none or cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = f"{key}=".encode()
    for entry in raw.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):].decode("utf-8", errors="replace")
    return None


def session_problem(session: dict, run_name: str) -> str | None:
    """Why a launched session's process group may not be signalled, or None: its leader must be the
    process this server (or an earlier run of it) started for ``run_name`` — same start time in clock
    ticks, same command line, leading its own group, and holding the launch's secret in its environment."""
    pid, pgid = session.get("pid"), session.get("pgid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1 or pgid != pid:
        return f"launch.json names no process group of ours ({pgid!r})"
    info, args = proc_start(pid), proc_cmdline(pid)
    if info is None or not args or info[0] in ("Z", "X"):
        return f"process {pid} is gone"
    if session.get("proc_start") is not None and info[1] != session["proc_start"]:
        return f"process {pid} is not the one started for this run (its pid was reused)"
    command = session.get("command")
    ours = pid in _children and _children[pid].poll() is None  # started by this server (maybe not exec()ed yet)
    # nice exec()s the command it runs, so the process shows the recorded command without nice's prefix.
    if not ours and (not isinstance(command, list) or len(args) < 2 or command[len(command) - len(args):] != args):
        return f"process {pid} runs another command than the one started for this run"
    if not ours:
        secret, recorded = environ_value(pid, LAUNCH_SECRET_ENV), session.get("secret_hash")
        if secret is None or not isinstance(recorded, str) or not hmac.compare_digest(
                launch_secret_hash(run_name, secret), recorded):
            return f"process {pid} was not launched by this server for this run (it lacks the launch's secret)"
    if _pgrp(pid) != pgid:
        return f"process {pid} no longer leads its process group"
    return None


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
        return pid_alive(pid), None
    state, started = info
    if state in ("Z", "X") or (session.get("proc_start") is not None and started != session["proc_start"]):
        return False, None  # a zombie, or the pid now belongs to another process
    return True, None


def _usage_line(output: str) -> str | None:
    """The CLI's one-line error ('vit.train: error: ...', 'vit.sae: error: ...') in a process's output, without
    the prefix."""
    for line in reversed(output.splitlines()):
        for prefix in ("vit.train: error: ", "vit.sae: error: "):
            if line.startswith(prefix):
                return line[len(prefix):]
    return None


# ---------------------------------------------------------------------------------------------
# Reconciling what the files say with what the processes do


def reconcile(record: dict | None, status: dict | None, alive: bool | None, exit_code: int | None,
              output: str, now: float, stale_seconds: float = STALE_SECONDS,
              end: dict | None = None, phase: str | None = None) -> tuple[str, str | None]:
    """(state, detail) of a run from its launch record, its status.json and its process.

    ``alive`` is whether the last started process runs (None: unknown, on another host);
    ``end`` the record that process left of its one-line error before it wrote a status.json (``end.json``);
    ``output`` the tail of its output, read only for a process launched without one; ``phase`` what that process
    said it does before its status.json exists (``phase.json``). ``detail`` is the error of a failed run, the
    reason for a crashed, cancelled or queued one, and what a running one does while it starts ("starting: reading
    the data", then status.json's ``phase``: "compiling the model (the first step)", "first epoch").
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
        return "running", status.get("phase")

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
        return "running", status.get("phase")
    if alive is True or (alive is None and now - started < stale_seconds):
        return "running", STARTING + (f": {phase}" if phase else "")
    usage = end["error"] if end is not None and end.get("error") else _usage_line(output)
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


