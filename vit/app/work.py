"""Long work the pages start: it runs in chunks that report progress and can be stopped, bounded server-wide.

A long computation (an ablation or patching grid, mean contexts, attention flow, a template ensemble,
deletion/insertion curves, a dataset pass) takes a ``progress(done, total)`` callback and calls it between its
chunks. ``Work`` is that callback: it counts the passes done, estimates the time left, and raises ``Stopped`` at
the next chunk once it was asked to stop, once the session that started it has ended (``alive`` says no), or once
no page has looked at it for ``lease_s`` seconds (its tab was closed, its widget changed or went away). So nothing
keeps computing for a page nobody sees.

``Slots`` bounds the heavy computations of the whole server: a ``threading.BoundedSemaphore`` that a ``Work``
holds while it runs; the others wait, and ``Work.describe`` says so in one line. ``Shared`` holds the works the whole
server shares by key (a Hub download, which every visitor asking for the same files watches). Nothing here knows
Streamlit: the pages keep one ``Work`` per session, one ``Slots`` and one ``Shared`` per process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from vit.core.progress import Progress, Stop
from vit.core.text import duration, format_bytes

LEASE_S = 10.0  # no page looked at a work this long: nobody sees it any more (a page looks every second)


class Stopped(Stop):
    """The work was stopped before it finished; the message says why (asked to, its page closed, …)."""


class Slots:
    """At most ``size`` heavy computations at once in this process; the rest wait for one to end."""

    def __init__(self, size: int, noun: str = "heavy computation", others: str = " of other visitors",
                 why: str = " so that every page stays responsive") -> None:
        if size < 1:
            raise ValueError(f"at least one {noun} must be allowed at once, got {size}")
        self.size, self.noun, self.others, self.why = size, noun, others, why  # what a waiting work says
        self._semaphore = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self.running = 0
        self.waiting = 0

    def acquire(self, stop_reason: Callable[[], str | None], poll_s: float = 0.1) -> None:
        """Wait for a free slot; ``Stopped`` as soon as ``stop_reason()`` gives a reason while waiting."""
        with self._lock:
            self.waiting += 1
        try:
            while not self._semaphore.acquire(timeout=poll_s):
                reason = stop_reason()
                if reason:
                    raise Stopped(reason)
        finally:
            with self._lock:
                self.waiting -= 1
        with self._lock:
            self.running += 1

    def release(self) -> None:
        with self._lock:
            self.running -= 1
        self._semaphore.release()


class Work:
    """One long computation: its state, its progress, and the flag that stops it (see the module docstring).

    ``Work(key, label).start(compute)`` runs ``compute(progress)`` in a daemon thread, ``progress`` being the
    work itself; ``state`` is ``"waiting"`` (for a server slot), ``"running"``, ``"done"`` (``result``),
    ``"stopped"`` or ``"failed"`` (``error``). A computation that catches the ``Stopped`` its progress raised, to
    return what it had done (a VLM's answer so far), ends ``"stopped"`` with that as its ``result``; one that has
    something to show as it goes writes it to ``so_far`` (plain text, which the page draws under the progress).
    """

    def __init__(self, key: Any, label: str, slots: Slots | None = None, alive: Callable[[], bool] | None = None,
                 lease_s: float = LEASE_S, clock: Callable[[], float] = time.monotonic, unit: str = "passes") -> None:
        self.key, self.label, self.slots, self.alive, self.unit = key, label, slots, alive, unit
        self.lease_s, self.clock = lease_s, clock
        self.state = "waiting"
        self.done = self.total = 0
        self.result: Any = None
        self.error: BaseException | None = None
        self.compute: Callable[[Progress], Any] | None = None
        self.so_far = ""  # plain text the computation shows as it goes (an answer's words so far)
        self._reason: str | None = None
        self._raised: Stopped | None = None  # the Stopped this work raised into its computation
        self._seen = clock()
        self._started: float | None = None  # when it began to run (after the wait for a slot)
        self._finished = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the page does ------------------------------------------------------------------------------------

    def start(self, compute: Callable[[Progress], Any]) -> Work:
        """Run ``compute(progress)`` in a daemon thread (after a server slot is free); returns the work."""
        self.compute = compute
        self._thread = threading.Thread(target=self._run, name=f"work: {self.label}", daemon=True)
        self._thread.start()
        return self

    def touch(self) -> None:
        """A page showed this work now (its lease starts again)."""
        self._seen = self.clock()

    def unseen_s(self) -> float:
        """Seconds since a page last showed this work."""
        return self.clock() - self._seen

    def stop(self, reason: str = "stopped") -> None:
        """Ask the work to stop: it raises ``Stopped(reason)`` at its next chunk (or while it waits for a slot)."""
        if self._reason is None:
            self._reason = reason

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the work to end (done, stopped or failed); whether it has."""
        return self._finished.wait(timeout)

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    def seconds_left(self) -> float | None:
        """The time left, estimated from the passes done so far; None before the first pass is done."""
        if self._started is None or self.done <= 0 or self.total <= 0:
            return None
        elapsed = self.clock() - self._started
        return elapsed / self.done * max(self.total - self.done, 0)

    def fraction(self) -> float:
        return min(self.done / self.total, 1.0) if self.total > 0 else 0.0

    def _done_of_total(self) -> str:
        if self.unit == "bytes":  # a download: 1.2 MB of 5.0 GB
            return f"{format_bytes(self.done)} of {format_bytes(self.total)}"
        return f"{self.done} of {self.total} {self.unit}"

    def describe(self) -> str:
        """One line: what it waits for, or the passes (bytes, tokens: ``unit``) done of the total and the time left,
        or that it stops at its next chunk, or how it ended."""
        if self.state == "waiting":
            slots = self.slots
            if slots is None or slots.running < slots.size:  # a slot is free: it takes it now
                return f"{self.label}: starting…"
            return (f"{self.label}: waiting — {slots.running} {slots.noun}{'s' if slots.running != 1 else ''}"
                    f"{slots.others} run on this server, at most {slots.size} at once{slots.why}; this one starts "
                    "when one ends")
        if self.state in ("stopped", "failed"):
            return f"{self.label}: {self.state} after {self._done_of_total()} ({self.error})"
        if self._reason is not None:
            return f"{self.label}: stopping at the end of this chunk ({self._reason})"
        if self.total <= 0:  # running, before its first report: "0 of 0" would say it has nothing to do
            return f"{self.label}: starting…"
        left = self.seconds_left()
        eta = "estimating the time left" if left is None else f"about {duration(left)} left"
        return f"{self.label}: {self._done_of_total()}, {eta}"

    # -- what the computation calls ----------------------------------------------------------------------------

    def stop_reason(self) -> str | None:
        """Why the work should stop now, or None: asked to, its session ended, or nobody looked at it lately."""
        if self._reason is not None:
            return self._reason
        if self.alive is not None and not self.alive():
            return "its page was closed"
        if self.unseen_s() > self.lease_s:
            return f"no page showed it for {self.lease_s:g} s"
        return None

    def check(self) -> None:
        """``Stopped`` if the work should stop now (``stop_reason``)."""
        reason = self.stop_reason()
        if reason:
            self._raised = Stopped(reason)
            raise self._raised

    def __call__(self, done: int, total: int) -> None:
        """The progress callback: ``done`` passes of ``total`` are done; ``Stopped`` if it should stop."""
        self.done, self.total = done, total
        self.check()

    def _run(self) -> None:
        held = False
        try:
            if self.slots is not None:
                self.slots.acquire(self.stop_reason)
                held = True
            self.check()
            self.state, self._started = "running", self.clock()
            self.result = self.compute(self)
            if self._raised is not None:  # it caught the stop to keep what it had done
                self.error, self.state = self._raised, "stopped"
            else:
                self.state = "done"
        except Stopped as e:
            self.error, self.state = e, "stopped"
        except Exception as e:  # shown on the page in one line; the thread must not die silently
            self.error, self.state = e, "failed"
        finally:
            if held:
                self.slots.release()
            self._finished.set()




class Shared:
    """The works the whole server shares by key, each run once however many pages ask for it (a Hub download:
    every visitor who asks for the same files watches the one transfer). A page's rerun neither stops nor restarts
    one; it stops as any ``Work`` does (asked to, or no page showed it for its lease). At most ``size`` run at once;
    the others wait for a slot, saying so."""

    def __init__(self, size: int, lease_s: float = LEASE_S, clock: Callable[[], float] = time.monotonic,
                 noun: str = "download") -> None:
        self.slots, self.lease_s, self.clock = Slots(size, noun, others="", why=""), lease_s, clock
        self._lock = threading.Lock()
        self._works: dict[Any, Work] = {}

    def get(self, key: Any) -> Work | None:
        """The work of ``key``: running, waiting, or ended and not yet forgotten; None when there is none."""
        with self._lock:
            return self._works.get(key)

    def works(self) -> list[Work]:
        """Every work held: running, waiting, or ended and not yet forgotten."""
        with self._lock:
            return list(self._works.values())

    def start(self, key: Any, label: str, compute: Callable[[Progress], Any], unit: str = "passes") -> Work:
        """The work of ``key``: the one already running or waiting, else ``compute`` started now (an ended one of
        that key replaced). Ended works no page showed for the lease are forgotten here, so the registry holds the
        works running or waiting and those ended lately (a page still to say how one ended)."""
        with self._lock:
            current = self._works.get(key)
            if current is not None and not current.finished:
                return current
            for other, ended in list(self._works.items()):
                if ended.finished and ended.unseen_s() > self.lease_s:
                    del self._works[other]
            self._works[key] = Work(key, label, self.slots, lease_s=self.lease_s, clock=self.clock, unit=unit)
            return self._works[key].start(compute)

    def forget(self, work: Work) -> None:
        """Drop ``work`` once a page has taken its end (its result, its error) — not one started again since."""
        with self._lock:
            if self._works.get(work.key) is work:
                del self._works[work.key]
