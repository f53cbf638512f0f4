"""The progress of long work: ``progress(done, total)``, which a long computation calls between its chunks (it may
raise ``Stop`` there to stop the work: the pages' ``vit.app.work.Work`` is such a callback), and ``in_parts`` to
report consecutive parts of one computation as one whole."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vit.core.text import duration

Progress = Callable[[int, int], None]  # progress(done, total): passes done so far of total; may raise to stop


class Stop(Exception):
    """What a progress callback raises to stop the work between two chunks; the message says why. Most computations
    let it pass; one that can keep what it has done (a VLM's answer so far) catches it and returns that."""


def in_parts(progress: Progress | None, sizes: Sequence[int]) -> list[Progress | None]:
    """One callback per consecutive part of a computation whose parts take ``sizes`` passes: each reports its
    ``(done, total)`` as the whole's ``(passes before it + done, sum(sizes))``."""
    if progress is None:
        return [None] * len(sizes)
    whole = sum(sizes)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [lambda done, total, start=start: progress(start + done, whole) for start in starts]


PROGRESS_AFTER_S = 3.0  # a forward still running after this says where it is on stderr (an estimate of the time left)
PROGRESS_EVERY_S = 10.0


class ForwardProgress:
    """Where a long forward is: once one has run ``PROGRESS_AFTER_S``, a line on stderr every ``PROGRESS_EVERY_S``
    with the layer it is at and the time left, estimated from the layers done. Its ``hooks`` go on a ``ViT``'s
    block hook points; a daemon thread prints, so a line comes while a layer runs in C."""

    def __init__(self, num_layers: int, stream=None, after_s: float | None = None, every_s: float | None = None,
                 prog: str = "vit.predict") -> None:
        import sys
        import threading
        import time

        self.num_layers, self.stream, self.prog = num_layers, stream if stream is not None else sys.stderr, prog
        self.after_s = PROGRESS_AFTER_S if after_s is None else after_s
        self.every_s = PROGRESS_EVERY_S if every_s is None else every_s
        self.clock = time.monotonic
        self.started: float | None = None  # when the forward now running began
        self.done = 0  # its layers done
        self.printed = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="predict progress", daemon=True)

    def hooks(self) -> list:
        def start(x, hook):
            self.started, self.done, self.printed = self.clock(), 0, 0.0

        def layer_done(x, hook, i):
            self.done = i + 1

        return [("blocks.0.hook_resid_pre", start)] + [
            (f"blocks.{i}.hook_resid_post", lambda x, hook, i=i: layer_done(x, hook, i))
            for i in range(self.num_layers)]

    def line(self) -> str | None:
        """The line due now, or None."""
        if self.started is None or self.done >= self.num_layers:
            return None
        now = self.clock()
        elapsed = now - self.started
        if elapsed < self.after_s or now - self.printed < self.every_s:
            return None
        self.printed = now
        left = (f"about {duration(elapsed / self.done * (self.num_layers - self.done))} left" if self.done
                else "estimating the time left")
        return (f"{self.prog}: layer {self.done + 1} of {self.num_layers} running, {duration(elapsed)} into this "
                f"forward, {left} (Ctrl-C stops it)")

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            line = self.line()
            if line:
                print(line, file=self.stream, flush=True)

    def __enter__(self) -> ForwardProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
