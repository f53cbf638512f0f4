"""A fresh process per job without a fresh interpreter's imports: one process imports what the jobs need once, then
forks a child per job (``ForkServer``).

Used where each job must run in a process of its own (its own resource limits, its own heap and peak, nothing left by
the job before) but the imports would cost more than the job: a chat template renders in milliseconds after 1.4 s of
CPU importing transformers (``vit.explain.language.chat_template``; bench/bench_chat_template_server.py); the memory
tests' measured views
(``tests/peak_memory.py``). A job is Python source run as ``python -c CODE ARGV…`` would run it, with its own stdin,
stdout, stderr and exit code; jobs run side by side (the explorer's sessions render from their own threads).
``ForkServer.run`` waits for a job's end; ``ForkServer.spawn`` gives a ``Popen``-like child that runs on (the browser
tests' app servers, ``tests/helpers.py``). A child dies with the server, however the server ends.

The server is single-threaded, so a fork copies no lock held by another thread. It reads the jobs from its stdin and
answers on its stdout, one line of JSON each; a child's output goes to files, so a full pipe never blocks it. The
server ends (killing the children still running) when its stdin closes: when the process that started it ends.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading

_SERVER = r'''
import ctypes, gc, json, os, select, shutil, signal, sys, tempfile, traceback
exec(compile(sys.argv[1], "<preload>", "exec"), {"__name__": "__preload__"})
# What the preload made lives as long as the server: out of the collector's reach, so a child's collection does not
# walk (and so copy, page by page) the preload's objects: 0.2 s of CPU a collection after torch and transformers
# (378,621 objects), which the memory tests' children paid before each measure (tests/peak_memory.start; issue 112)
gc.collect()
gc.freeze()
server = os.getpid()
try:  # Linux's prctl: a child is killed when the server dies, however it dies
    prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    prctl = None
sys.stdout.flush()
answers = os.fdopen(os.dup(1), "w")  # the protocol's channel; the server's fd 1 then goes nowhere
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
wake_r, wake_w = os.pipe()  # a child's end wakes the select (SIGCHLD's wakeup fd)
os.set_blocking(wake_w, False)
signal.signal(signal.SIGCHLD, lambda *_: None)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches its whole group: its owner decides
folder = tempfile.mkdtemp(prefix="vit-forkserver-")
running, pending, jobs_open = {}, b"", True  # pid -> (job id, its folder)


def child(job, files):
    code = 1
    try:
        if prctl is not None:
            prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != server:  # it died before that
            os._exit(1)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a job's Ctrl-C is a fresh interpreter's
        for fd in (wake_r, wake_w, answers.fileno(), 0):
            os.close(fd)
        if files is None:  # spawned: no input, its output to the caller's file, maybe a session of its own
            if job["session"]:
                os.setsid()
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            out = os.open(job["output"] or os.devnull, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(out, 1)
            os.dup2(out, 2)
        else:
            for fd, name, mode in ((0, "in", os.O_RDONLY), (1, "out", os.O_WRONLY), (2, "err", os.O_WRONLY)):
                os.dup2(os.open(os.path.join(files, name), mode), fd)
        if job.get("cwd"):
            os.chdir(job["cwd"])
        if job.get("environ") is not None:  # the whole environment, as Popen's env= is
            os.environ.clear()
        os.environ.update(job.get("environ") or {})
        os.environ.update(job["env"])
        sys.argv = ["-c", *job["argv"]]
        try:
            exec(compile(job["code"], "<string>", "exec"), {"__name__": "__main__"})
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, int) and e.code is not None:
                print(e.code, file=sys.stderr)
        except BaseException as e:  # as the interpreter reports it: from the job's own frames
            e.__traceback__ = e.__traceback__.tb_next
            sys.excepthook(type(e), e, e.__traceback__)
            if isinstance(e, KeyboardInterrupt):  # and ends by the signal, as the interpreter does
                sys.stdout.flush(); sys.stderr.flush()
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(code)


def answer(message):
    answers.write(json.dumps(message) + "\n")
    answers.flush()


def start(job):
    files = None
    if not job.get("spawn"):
        files = tempfile.mkdtemp(dir=folder)
        with open(os.path.join(files, "in"), "w") as f:
            f.write(job["stdin"])
        for name in ("out", "err"):
            open(os.path.join(files, name), "w").close()
    sys.stdout.flush(); sys.stderr.flush()  # nothing buffered for a child to write out again
    pid = os.fork()
    if pid == 0:
        child(job, files)
    running[pid] = (job["id"], files)
    if files is None:
        answer({"id": job["id"], "pid": pid})


def reap():
    while running:
        try:
            pid, raw = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid not in running:
            continue
        job, files = running.pop(pid)
        ended = {"id": job, "returncode": os.waitstatus_to_exitcode(raw)}
        if files is not None:
            with open(os.path.join(files, "out"), errors="replace") as out, \
                    open(os.path.join(files, "err"), errors="replace") as err:
                ended.update(stdout=out.read(), stderr=err.read())
            shutil.rmtree(files, ignore_errors=True)
        answer(ended)


while jobs_open or running:
    ready = select.select([0, wake_r] if jobs_open else [wake_r], [], [])[0]
    if wake_r in ready:
        os.read(wake_r, 4096)
    reap()
    if 0 in ready:
        data = os.read(0, 1 << 16)
        if not data:  # the process that started the server ended: so do its jobs
            jobs_open = False
            for pid in list(running):
                os.kill(pid, signal.SIGKILL)
            continue
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            if "kill" in request:
                for pid, (job, _) in running.items():
                    if job == request["kill"]:
                        os.kill(pid, signal.SIGKILL)
            else:
                start(request)
shutil.rmtree(folder, ignore_errors=True)
'''


class _Slot:
    """A job of ``ForkServer.run`` waiting for its answer (None: the server ended first)."""

    def __init__(self) -> None:
        self.done, self.answer = threading.Event(), None

    def deliver(self, answer: dict | None) -> None:
        self.answer = answer
        self.done.set()


class ForkedProcess:
    """A child of ``ForkServer.spawn``: ``subprocess.Popen``'s ``pid``, ``returncode``, ``poll``, ``wait``,
    ``send_signal``, ``terminate`` and ``kill``. Its exit code is the server's reading of it (a child of the server,
    not of this process): minus the signal that ended it, as Popen's. ``ForkServerError`` from ``poll`` or ``wait``
    if the server ended first."""

    def __init__(self, args: list[str]) -> None:
        self.args, self.pid, self.returncode = args, None, None
        self._running, self._done = threading.Event(), threading.Event()

    def deliver(self, answer: dict | None) -> None:
        """The server's answer: the child's pid, then its exit code; None: the server ended first."""
        if answer is not None and "pid" in answer:
            self.pid = answer["pid"]
        else:
            self.returncode = None if answer is None else answer["returncode"]
            self._done.set()
        self._running.set()

    def poll(self) -> int | None:
        if self._done.is_set():
            return self.wait()
        return None

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(["<fork server>", *self.args], timeout)
        if self.returncode is None:
            raise ForkServerError(f"the fork server ended before child {self.pid} did")
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if not self._done.is_set():  # ended, or its server did: its pid may name another process by now
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServerError(RuntimeError):
    """The server ended before it answered (killed, or its preload failed: the message ends with what it said)."""


class ForkServer:
    """A server that runs ``preload`` (Python source: the imports) once, started on the first ``run``, and forks a
    child per job from there. ``env``: added to this process's environment for the server's (read once, at its
    start: glibc's tunables, thread counts, a library's log level at import); ``isolated``: ``python -I`` (neither
    the working folder nor PYTHONPATH on the path)."""

    def __init__(self, preload: str, *, env: dict[str, str] | None = None, cwd: str | None = None,
                 isolated: bool = False) -> None:
        self.preload, self.env, self.cwd, self.isolated = preload, env, cwd, isolated
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._owner: int | None = None  # the pid that started it: a forked copy of this process starts its own
        self._waiting: dict[int, _Slot] = {}  # the running server's jobs still to answer, by id
        self._ids = itertools.count()
        atexit.register(self.close)

    def run(self, code: str, argv: list[str] | tuple[str, ...] = (), *, stdin: str = "",
            env: dict[str, str] | None = None, timeout: float | None = None) -> subprocess.CompletedProcess:
        """``code`` run as ``python -c code *argv`` would run it (``env`` added to the server's environment,
        ``stdin`` its input) in a child forked from the server: its exit code (minus the signal that ended it),
        stdout and stderr. ``subprocess.TimeoutExpired`` past ``timeout`` seconds, the server's start included (the
        child is killed); ``ForkServerError`` if the server ended first."""
        slot = _Slot()
        with self._lock:
            process, waiting = self._started()
            job = next(self._ids)
            waiting[job] = slot
            self._send(process, {"id": job, "code": code, "argv": list(argv), "stdin": stdin,
                                 "env": dict(env or {})})
        if not slot.done.wait(timeout):
            with self._lock:
                waiting.pop(job, None)
                self._send(process, {"kill": job})
            raise subprocess.TimeoutExpired(["<fork server>", *argv], timeout)
        answer = slot.answer
        if answer is None:
            raise ForkServerError(self._ended(process))
        return subprocess.CompletedProcess(list(argv), answer["returncode"], answer["stdout"], answer["stderr"])

    def spawn(self, code: str, argv: list[str] | tuple[str, ...] = (), *, env: dict[str, str] | None = None,
              cwd: str | os.PathLike | None = None, output: str | os.PathLike | None = None,
              new_session: bool = False) -> ForkedProcess:
        """``code`` run as ``python -c code *argv`` would run it, in a child forked from the server, without
        waiting for it: what ``subprocess.Popen`` gives for such a command, for a child that runs long (a server).
        ``env``: its whole environment, as Popen's (None: the server's); ``cwd``: its working folder; ``output``: the
        file its stdout and stderr are appended to (None: nowhere); its stdin is empty; ``new_session``: a session of
        its own (``start_new_session``). Returns once the child runs (``ForkedProcess.pid``)."""
        forked = ForkedProcess(list(argv))
        with self._lock:
            process, waiting = self._started()
            job = next(self._ids)
            waiting[job] = forked
            self._send(process, {"id": job, "spawn": True, "code": code, "argv": list(argv), "env": {},
                                 "environ": None if env is None else dict(env), "cwd": None if cwd is None else
                                 str(cwd), "output": None if output is None else str(output),
                                 "session": new_session})
        forked._running.wait()
        if forked.pid is None:
            raise ForkServerError(self._ended(process))
        return forked

    def close(self) -> None:
        """End the server (its running children are killed); a later ``run`` starts a new one."""
        with self._lock:
            process, self._process = self._process, None
        if process is None or self._owner != os.getpid():
            return
        try:
            process.stdin.close()
        except OSError:
            pass
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    @staticmethod
    def _send(process: subprocess.Popen, request: dict) -> None:
        try:
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
        except (OSError, ValueError):
            pass  # it ended: its reader wakes every job still waiting

    def _started(self) -> tuple[subprocess.Popen, dict[int, list]]:
        """The running server and its jobs (the lock held): started if there is none, if it ended, or if this
        process is a fork of the one that started it."""
        if self._process is not None and self._process.poll() is None and self._owner == os.getpid():
            return self._process, self._waiting
        flags = ["-I"] if self.isolated else []
        said = tempfile.TemporaryFile(mode="w+")  # the server's own stderr: a failed preload's error
        self._process = subprocess.Popen([sys.executable, *flags, "-c", _SERVER, self.preload],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=said, text=True,
                                         env={**os.environ, **(self.env or {})}, cwd=self.cwd)
        self._process.said = said
        self._owner, self._waiting = os.getpid(), {}
        threading.Thread(target=self._read, args=(self._process, self._waiting), daemon=True,
                         name="fork-server").start()
        return self._process, self._waiting

    def _read(self, process: subprocess.Popen, waiting: dict[int, list]) -> None:
        """Hand each answer of ``process`` to the job waiting for it; at its end, wake every job still waiting."""
        for line in process.stdout:
            answer = json.loads(line)
            with self._lock:  # a spawned child's first answer (its pid) keeps it waiting for its end
                slot = waiting.get(answer["id"]) if "pid" in answer else waiting.pop(answer["id"], None)
            if slot is not None:
                slot.deliver(answer)
        with self._lock:
            left = list(waiting.values())
            waiting.clear()
        for slot in left:
            slot.deliver(None)

    def _ended(self, process: subprocess.Popen) -> str:
        return f"the fork server ended (exit code {process.wait()}){self._said(process)}"

    @staticmethod
    def _said(process: subprocess.Popen) -> str:
        """The last line the server wrote to its stderr (a failed preload's error), if any."""
        try:
            process.said.seek(0)
            lines = process.said.read().strip().splitlines()
        except (OSError, ValueError, AttributeError):
            return ""
        return f": {lines[-1]}" if lines else ""
