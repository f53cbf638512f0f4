"""vit.core.forkserver: a job forked from the server is what ``python -c CODE ARGV…`` in a fresh interpreter is (the
reference here: that interpreter, run by subprocess), each job in a process of its own, side by side, bounded by its
timeout, and a server that ends or fails to start is one error, not a hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from vit.core.forkserver import ForkServer, ForkServerError

JOBS = {
    "output and exit code": ("import sys; print('out', sys.argv[1:]); print('err', file=sys.stderr); sys.exit(3)",
                             ["a", "b c"], ""),
    "stdin": ("import sys; data = sys.stdin.read(); print(len(data), data[-5:])", [], "x" * 300_000 + "tail!"),
    "a message to exit": ("raise SystemExit('no such file')", [], ""),
    "an exception": ("def f():\n    raise ValueError('bad')\nf()", [], ""),
    "ctrl-c": ("import os, signal, time\nprint('up', flush=True)\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)",
               [], ""),
    "a signal": ("import os, signal; print('before', flush=True); os.kill(os.getpid(), signal.SIGKILL)", [], ""),
    "a large output": ("import sys; sys.stdout.write('y' * 200_000); sys.stderr.write('z' * 100_000)", [], ""),
    "__main__": ("print(__name__, __file__ if '__file__' in dir() else None)", [], ""),
}


def default_ctrl_c() -> None:
    """The reference interpreter starts with Ctrl-C's default action, as the fork server's jobs do: a pytest run
    started in the background by a non-interactive shell inherits SIGINT ignored, and a fresh interpreter started from
    it then ignores its own Ctrl-C (exit 0 where a job gives -2: the lane run by `setsid nohup ... &` failed so)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def server():
    server = ForkServer("import json, email.mime.text, os\njson.imported_by = os.getpid()")
    yield server
    server.close()


@pytest.mark.parametrize("name", JOBS)
def test_a_job_gives_what_a_fresh_interpreter_gives(server, name):
    code, argv, stdin = JOBS[name]
    fresh = subprocess.run([sys.executable, "-c", code, *argv], input=stdin, capture_output=True, text=True,
                           preexec_fn=default_ctrl_c,
                           timeout=60)
    forked = server.run(code, argv, stdin=stdin, timeout=60)
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    # a traceback names the source as the fresh interpreter does ("<string>"), so the lines are the same
    assert forked.stderr == fresh.stderr


def test_the_imports_run_once_and_each_job_is_a_fresh_fork_of_them(server, tmp_path):
    code = ("import json, os, sys; mark = json.__dict__.setdefault('mark', os.getpid()); "
            "print(os.getpid(), os.getppid(), mark, json.imported_by, 'email.mime.text' in sys.modules)")
    rows = [server.run(code, timeout=60).stdout.split() for _ in range(3)]
    pids, parents, marks, importers, imported = zip(*rows, strict=True)
    assert len(set(pids)) == 3 and set(parents) == {str(server._process.pid)}
    assert set(importers) == {str(server._process.pid)}  # imported once, by the server, before each fork
    assert marks == pids  # no job sees what the one before it set
    assert set(imported) == {"True"}


def test_a_jobs_collection_does_not_walk_what_the_preload_made():
    """The preload's objects are frozen (``gc.freeze``): a job's ``gc.collect`` leaves them alone, so it neither
    spends the time (0.2 s after torch and transformers) nor copies their pages; the job's own are collected as in a
    fresh interpreter."""
    server = ForkServer("import json\njson.kept = [[] for _ in range(100_000)]")  # kept by a module, as imports are
    try:
        code = ("import gc, weakref\nclass Cycle: pass\nc = Cycle(); c.me = c; gone = weakref.ref(c); del c\n"
                "gc.collect()\n"
                "print(gc.get_freeze_count() >= 100_000, len(gc.get_objects()) < 100_000, gone() is None)")
        assert server.run(code, timeout=60).stdout.split() == ["True", "True", "True"]
    finally:
        server.close()


def test_a_ctrl_c_to_the_servers_group_is_its_owners_to_handle(server):
    """A terminal's Ctrl-C reaches every process of its group, the server too: the process that started it decides
    (a command that finishes its step first), so the server goes on."""
    import signal

    assert server.run("print('up')", timeout=60).stdout == "up\n"
    os.kill(server._process.pid, signal.SIGINT)
    assert server.run("print('still up')", timeout=60).stdout == "still up\n"


def test_a_jobs_environment_is_the_servers_plus_its_own(tmp_path):
    server = ForkServer("", env={"VIT_FORK_SERVER_TEST": "server"})
    try:
        code = "import os; print(os.environ['VIT_FORK_SERVER_TEST'], os.environ.get('VIT_FORK_JOB'))"
        assert server.run(code, timeout=60).stdout.split() == ["server", "None"]
        assert server.run(code, env={"VIT_FORK_JOB": "job"}, timeout=60).stdout.split() == ["server", "job"]
        assert server.run(code, timeout=60).stdout.split() == ["server", "None"]
    finally:
        server.close()


def test_jobs_run_side_by_side(server, tmp_path):
    """The first job waits for a file only the second writes: run one after the other, it would wait for ever."""
    import threading

    flag = tmp_path / "flag"
    waiter = f"import os, time\nwhile not os.path.exists({str(flag)!r}):\n    time.sleep(0.01)\nprint('seen')"
    answers = {}
    thread = threading.Thread(target=lambda: answers.update(first=server.run(waiter, timeout=120)))
    thread.start()
    writer = server.run(f"open({str(flag)!r}, 'w').close(); print('written')", timeout=120)
    thread.join(130)
    assert writer.stdout == "written\n" and answers["first"].stdout == "seen\n"


def test_a_job_past_its_timeout_is_killed_and_the_server_goes_on(server, tmp_path):
    pid_file = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        server.run(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)",
                   timeout=3)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 60
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}")  # killed, and reaped by the server
    assert server.run("print('next')", timeout=60).stdout == "next\n"


def test_a_server_that_ends_is_one_error_for_its_jobs_and_the_next_run_starts_another(server):
    import threading

    first = server.run("print('up')", timeout=60)
    assert first.stdout == "up\n"
    ended = server._process
    failures = []
    thread = threading.Thread(target=lambda: failures.append(_error(server, "import time; time.sleep(600)")))
    thread.start()
    deadline = time.monotonic() + 60
    while not server._waiting and time.monotonic() < deadline:
        time.sleep(0.01)
    while not (children := psutil.Process(ended.pid).children()) and time.monotonic() < deadline:
        time.sleep(0.01)
    job = children[0]
    ended.kill()
    thread.join(60)
    assert failures and isinstance(failures[0], ForkServerError), failures
    assert "the fork server ended (exit code -9)" in str(failures[0])
    job.wait(60)  # not a child of this process: no exit code, only its end
    assert not job.is_running()  # killed with its server, not left sleeping for 600 s
    assert server.run("print('again')", timeout=60).stdout == "again\n" and server._process is not ended


def _error(server, code):
    try:
        server.run(code, timeout=120)
    except Exception as e:  # noqa: BLE001 - the test looks at which
        return e
    return None


def test_imports_that_fail_are_one_error_naming_them():
    server = ForkServer("import vit_no_such_module_here")
    with pytest.raises(ForkServerError, match=r"ModuleNotFoundError: No module named 'vit_no_such_module_here'$"):
        server.run("print(1)", timeout=60)


def test_closing_the_server_kills_its_running_jobs(tmp_path):
    import threading

    server = ForkServer("")
    pid_file = tmp_path / "pid"
    answers = []
    code = f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)"
    thread = threading.Thread(target=lambda: answers.append(server.run(code, timeout=120)))
    thread.start()
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.01)
    pid = int(pid_file.read_text())
    server.close()
    thread.join(60)
    assert answers[0].returncode == -9  # the job's answer: killed
    assert not os.path.exists(f"/proc/{pid}")


def test_a_forked_copy_of_the_owner_starts_its_own_server(server):
    owner = server.run("import os; print(os.getppid())", timeout=60).stdout
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the copy: the owner's server is not its to use
        try:
            answer = server.run("import os; print(os.getppid())", timeout=60).stdout
            os.write(write, answer.encode())
            server.close()
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        copy = f.read()
    os.waitpid(pid, 0)
    assert copy.strip() and copy != owner
    assert server.run("import os; print(os.getppid())", timeout=60).stdout == owner


# --- spawn: a child that runs long (a server), what subprocess.Popen gives for the same command ---------------------

def popen_reference(code: str, argv: list[str], output, **kwargs) -> subprocess.Popen:
    with open(output, "ab") as out:
        return subprocess.Popen([sys.executable, "-c", code, *argv], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=out, preexec_fn=default_ctrl_c, **kwargs)


def wait_for_text(path, text: str, process) -> None:
    deadline = time.monotonic() + 60
    while text not in (path.read_text() if path.exists() else ""):
        assert process.poll() is None and time.monotonic() < deadline, path.read_text()
        time.sleep(0.05)


@pytest.mark.parametrize("name", ["output and exit code", "a message to exit", "an exception", "ctrl-c", "a signal",
                                  "a large output", "__main__"])
def test_a_spawned_child_ends_as_a_popen_of_a_fresh_interpreter(server, tmp_path, name):
    code, argv, _ = JOBS[name]
    fresh = popen_reference(code, argv, tmp_path / "fresh.log")
    forked = server.spawn(code, argv, output=tmp_path / "forked.log")
    assert isinstance(forked.pid, int) and forked.pid != fresh.pid
    assert forked.wait(60) == fresh.wait(60) == forked.returncode == forked.poll()
    assert (tmp_path / "forked.log").read_text() == (tmp_path / "fresh.log").read_text()


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_a_spawned_child_is_signalled_as_a_popen_is(server, tmp_path, signal_name):
    import signal

    code = "import time\nprint('up', flush=True)\ntime.sleep(120)"
    fresh = popen_reference(code, [], tmp_path / "fresh.log")
    forked = server.spawn(code, output=tmp_path / "forked.log")
    for process, log in ((fresh, tmp_path / "fresh.log"), (forked, tmp_path / "forked.log")):
        wait_for_text(log, "up", process)
        assert process.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(0.2)
        process.send_signal(getattr(signal, signal_name))
    assert forked.wait(60) == fresh.wait(60)
    assert (tmp_path / "forked.log").read_text() == (tmp_path / "fresh.log").read_text()  # Ctrl-C's traceback too
    forked.kill()  # ended: not signalled again (its pid may name another process by now)


def test_a_spawned_childs_environment_folder_and_session_are_popens(tmp_path):
    server = ForkServer("", env={"VIT_FORK_SERVER_TEST": "server"})
    code = ("import os; print(os.environ.get('VIT_FORK_SERVER_TEST'), os.environ.get('VIT_FORK_JOB'), os.getcwd(), "
            "os.getsid(0) == os.getpid(), os.getpgid(0) == os.getpid())")
    try:
        env = {"PATH": os.environ["PATH"], "VIT_FORK_JOB": "job"}  # the whole environment: the server's is not kept
        rows = []
        for spawn in (False, True):
            for session in (False, True):
                log = tmp_path / f"{spawn}-{session}.log"
                if spawn:
                    process = server.spawn(code, env=env, cwd=tmp_path, output=log, new_session=session)
                else:
                    process = popen_reference(code, [], log, env=env, cwd=tmp_path, start_new_session=session)
                assert process.wait(60) == 0
                rows.append(log.read_text().split())
        assert rows[:2] == rows[2:]
        assert rows[2] == ["None", "job", str(tmp_path), "False", "False"]
        assert rows[3] == ["None", "job", str(tmp_path), "True", "True"]
        forked = server.spawn(code, output=tmp_path / "server-env.log")  # env=None: the server's own
        assert forked.wait(60) == 0 and (tmp_path / "server-env.log").read_text().split()[:2] == ["server", "None"]
    finally:
        server.close()


def test_closing_the_server_kills_its_spawned_children(tmp_path):
    server = ForkServer("")
    forked = server.spawn("import time\nprint('up', flush=True)\ntime.sleep(120)", output=tmp_path / "log",
                          new_session=True)
    wait_for_text(tmp_path / "log", "up", forked)
    server.close()
    assert forked.wait(60) == -9
    with pytest.raises(ProcessLookupError):
        os.kill(forked.pid, 0)


def test_a_killed_server_is_an_error_for_its_spawned_childs_wait(tmp_path):
    import signal

    server = ForkServer("")
    try:
        forked = server.spawn("import time; time.sleep(120)", output=tmp_path / "log", new_session=True)
        child = psutil.Process(forked.pid)
        os.kill(server._process.pid, signal.SIGKILL)
        with pytest.raises(ForkServerError, match="the fork server ended before child"):
            forked.wait(60)
        child.wait(60)
        assert not child.is_running()  # killed with its server, its own session notwithstanding
        forked.terminate()  # not signalled: nothing says what its pid names now
        assert server.spawn("print('again')", output=tmp_path / "again").wait(60) == 0  # a new server
        assert (tmp_path / "again").read_text() == "again\n"
    finally:
        server.close()
