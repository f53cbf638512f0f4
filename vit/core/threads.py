"""How many threads torch's CPU work uses: the cores free when the process starts, not every core it may run on.

torch starts with one thread per core. When other processes keep some of those cores busy, its OpenMP threads wait
at every barrier for the one that was descheduled: with one of two cores busy, a ViT-B/16 forward on two threads
took 2.2x as long as on one. The app and every command call ``use_free_cores`` once before their first forward; env
``VIT_THREADS`` (a whole number) overrides the choice, and a command's own ``--threads`` (vit.train) overrides both.

Some settings a computation wants for its length are the whole process's, not its thread's: transformers' verbosity
and progress bars, Python's warning filters. The usual ``with`` block keeps what it found and puts it back at its
end, which is wrong once the explorer's sessions run such blocks in threads at once: of two that overlap, the second
finds the first's setting and restores it, so the setting stays on for good. ``WhileAny`` applies it when the first
block opens and undoes it when the last one closes, whichever thread opened or closes each.

A model is every session's too (one cached object), and a hook a computation puts on one of its modules fires in
every thread's forward while it is there: ``this_thread_only`` makes such a hook a no-op outside the thread that set
it, so one visitor's activation patching or ablation never edits (nor reads, nor stops) another's forward.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
from collections.abc import Callable, Iterator

THREADS_ENV = "VIT_THREADS"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and ``taskset`` narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def busy_cores() -> float:
    """How many cores other work keeps busy: the one-minute load average (runnable processes, ours included while
    it runs), 0 where the system does not report one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def free_threads(cores: int, load: float) -> int:
    """Threads for ``cores`` usable cores under a load of ``load`` busy ones: the cores left free, a core counted
    free when less than half of it is busy, at least one and at most ``cores``."""
    return max(1, min(cores, math.floor(cores - load + 0.5)))


def chosen_threads(environ: dict[str, str] | None = None) -> int:
    """``VIT_THREADS`` when set, else ``free_threads`` of this machine now; ValueError (one line) for a
    ``VIT_THREADS`` that is not a whole number of at least 1."""
    value = (os.environ if environ is None else environ).get(THREADS_ENV, "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{THREADS_ENV} must be a whole number of at least 1, got {value!r}")
        return int(value)
    return free_threads(usable_cores(), busy_cores())


@functools.cache
def use_free_cores() -> int:
    """Set torch's thread count to ``chosen_threads()`` once per process (later calls return the same count) and
    return it."""
    import torch

    threads = chosen_threads()
    torch.set_num_threads(threads)
    return threads


@contextlib.contextmanager
def at_most(threads: int) -> Iterator[int]:
    """For the ``with`` block, torch's thread count lowered to ``threads`` (never raised), then restored; yields the
    count used. For work made of many small ops (SAM's mask decoder: ~250 ops on a 64 x 64 grid, each a millisecond
    or less), where a barrier per op costs more than a second thread saves.

    torch keeps OpenMP's count per calling thread, so another thread's work is not narrowed by it (MKL's own count
    is process-wide: a concurrent call may run its BLAS on fewer threads for that moment, with the same results)."""
    import torch

    before = torch.get_num_threads()
    used = max(1, min(threads, before))
    if used != before:
        torch.set_num_threads(used)
    try:
        yield used
    finally:
        if used != before:
            torch.set_num_threads(before)


class WhileAny:
    """``with setting():`` holds the setting ``apply`` makes (``apply()`` returns the function that undoes it) while
    any thread is inside such a block."""

    def __init__(self, apply: Callable[[], Callable[[], None]]) -> None:
        self._apply = apply
        self._lock = threading.Lock()
        self._open = 0  # the blocks open now, over every thread
        self._undo: Callable[[], None] | None = None

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._open == 0:
                self._undo = self._apply()
            self._open += 1
        try:
            yield
        finally:
            with self._lock:
                self._open -= 1
                if self._open == 0:
                    undo, self._undo = self._undo, None
                    undo()


def this_thread_only(hook: Callable) -> Callable:
    """``hook`` (a module's forward or pre-forward hook), called for the forwards the calling thread runs and a
    no-op (None: nothing changed) in any other thread's; to be removed before this thread ends."""
    owner = threading.get_ident()

    @functools.wraps(hook)
    def guarded(*args, **kwargs):
        return hook(*args, **kwargs) if threading.get_ident() == owner else None

    return guarded
