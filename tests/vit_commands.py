"""Run one of vit's commands (``python -m vit.predict ...``) from a test, in this process or in a real one, with one
signature: ``vit_command("vit.predict", model, image, in_process=False)``. In this process it calls what the
command's ``__main__`` calls (``entry``: ``main(argv)``, or vit.train's ``cli(argv)``).

A real process costs a Python start and torch's imports (2-3 s of CPU each; ~84 of them were ~216 s of the suite's
CPU, bench/results/cpu-2026-11-29/suite-cpu.txt): a test of what a command prints, writes and exits with calls its
entry here instead, with stdout and stderr captured. A test of what only a real process shows (the console
entry point, ``finish``'s fast exit, signals, a traceback Python itself would print) passes ``in_process=False``;
each command keeps at least one such test.

In this process the run gets what a fresh one would (its own ``sys.argv``, the ``env`` and ``cwd`` asked for) and
everything it may change is put back when it ends: the environment, the working folder, ``sys.argv``, the
handlers, level and propagation of every logger there was and of vit's own (a library imported during the run keeps
the loggers its import made), the warnings filters, the signal handlers, torch's thread count, grad mode
and random state, and Python's and NumPy's random states — so no later test sees that it ran.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import random
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The signals a command may take over (training's SIGTERM/SIGINT/SIGHUP stop, a progress report's SIGUSR1).
SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGALRM")
                if hasattr(signal, name))


def vit_command(module: str, *argv: object, in_process: bool = True, env: Mapping[str, str] | None = None,
                cwd: str | Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGV...`` as a ``CompletedProcess`` (``returncode``, ``stdout``, ``stderr`` as text).
    ``env`` is added to this process's environment; ``cwd`` defaults to the repository's root, as the real command
    is run. ``in_process`` calls ``MODULE.main(argv)`` here (``timeout`` then unused); otherwise a real process."""
    args = [str(a) for a in argv]
    cwd = Path(cwd) if cwd is not None else ROOT
    if not in_process:
        full = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
                **(env or {})}
        return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=full, capture_output=True,
                              text=True, timeout=timeout)
    out, err = io.StringIO(), io.StringIO()
    with restored_state(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        os.environ.update(env or {})
        os.chdir(cwd)
        command = importlib.import_module(module)
        sys.argv = [command.__file__, *args]  # what ``python -m`` gives: usage lines say ``python -m MODULE``
        if env and "OMP_NUM_THREADS" in env and "torch" in sys.modules:  # read once at torch's start: set it
            sys.modules["torch"].set_num_threads(int(env["OMP_NUM_THREADS"]))
        code = _status(entry(command), args)
    return subprocess.CompletedProcess([sys.executable, "-m", module, *args], code, out.getvalue(), err.getvalue())


def entry(command):
    """The function a command module's ``command()`` (its ``__main__`` and console script) runs: ``cli`` where the
    module has one (vit.train's: ``--ray`` submits the run as a job), else ``main``."""
    return getattr(command, "cli", None) or command.main


def _status(main, args: list[str]) -> int:
    """``main(args)``'s exit status as ``vit.core.cli.run_command`` and ``finish`` give it to the shell."""
    try:
        code = main(args)
    except SystemExit as e:  # argparse's --help and usage errors
        code = e.code if isinstance(e.code, int) or e.code is None else 1
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    return code if isinstance(code, int) else 1 if code else 0


@contextlib.contextmanager
def restored_state() -> Iterator[None]:
    """Everything a command's run may change in this process, put back as it was when the block ends."""
    environ, cwd, argv, argv_items = dict(os.environ), os.getcwd(), sys.argv, list(sys.argv)
    loggers = {name: (list(lg.handlers), lg.level, lg.propagate, lg.disabled)
               for name, lg in [("", logging.getLogger()), *logging.Logger.manager.loggerDict.items()]
               if isinstance(lg, logging.Logger)}
    handlers = {sig: signal.getsignal(sig) for sig in SIGNALS}
    python_random, numpy_random = random.getstate(), _numpy_state()
    torch = sys.modules.get("torch")
    torch_state = (torch.get_num_threads(), torch.is_grad_enabled(), torch.random.get_rng_state()) if torch else None
    try:
        with warnings.catch_warnings():
            yield
    finally:
        os.chdir(cwd)
        sys.argv = argv
        argv[:] = argv_items
        if dict(os.environ) != environ:
            os.environ.clear()
            os.environ.update(environ)
        for name, lg in [("", logging.getLogger()), *logging.Logger.manager.loggerDict.items()]:
            if not isinstance(lg, logging.Logger):
                continue
            if name not in loggers and not name.startswith("vit"):
                continue  # a library's logger made as it was imported: as any later import would leave it
            kept, level, propagate, disabled = loggers.get(name, ([], logging.NOTSET, True, False))
            for handler in lg.handlers:
                if handler not in kept:
                    handler.close()  # a log file a run opened
            lg.handlers[:] = kept
            lg.setLevel(level)
            lg.propagate, lg.disabled = propagate, disabled
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)
        random.setstate(python_random)
        if numpy_random is not None:
            sys.modules["numpy"].random.set_state(numpy_random)
        torch = sys.modules.get("torch")
        if torch is not None and torch_state is not None:
            threads, grad, rng = torch_state
            torch.set_num_threads(threads)
            torch.set_grad_enabled(grad)
            torch.random.set_rng_state(rng)


def _numpy_state():
    numpy = sys.modules.get("numpy")
    return numpy.random.get_state() if numpy is not None else None
