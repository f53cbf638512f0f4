"""The progress of long work: ``progress(done, total)``, which a long computation calls between its chunks (it may
raise ``Stop`` there to stop the work: the pages' ``vit.app.work.Work`` is such a callback), and ``in_parts`` to
report consecutive parts of one computation as one whole."""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
