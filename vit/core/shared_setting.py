"""A process-wide setting that work in any number of threads needs at once (``WhileAny``).

Some settings a computation wants for its length are the whole process's: transformers' verbosity and progress bars,
Python's warning filters. The usual ``with`` block keeps what it found and puts it back at its end, and that is wrong
once the explorer's sessions run such blocks in threads at once: of two that overlap, the second finds the first's
setting and restores it, so the setting stays on for good. ``WhileAny`` applies it when the first block opens and
undoes it when the last one closes, whichever thread opened or closes each.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


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
