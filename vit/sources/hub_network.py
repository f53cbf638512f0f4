"""Deadlines and a byte bound for what this program asks the Hub, on huggingface_hub's own HTTP session.

huggingface_hub asks its model info and file list with no timeout at all, and reads a file's body with a 10 s
timeout per read but no deadline (a body that trickles never ends) and no bound (a body larger than its declared
size is written to disk before its consistency check). Inside ``budget(...)``, two event hooks on its session
(``huggingface_hub.get_session()``, the client it uses for every request) give each request connect and read
timeouts, end the whole step at its deadline, end a file that has sent nothing for ``STALL_S``, and stop reading a
body once it passes the size declared for it. A download (all its files) has no deadline that its declared size
sets: it is given up when, over any ``WINDOW_S``, it moved less than ``MIN_BYTES_PER_S`` (``RateFloor``), so a
mirror that trickles into a large declared file ends within a minute, not after hours. Outside a budget the hooks do
nothing.

Files the Hub keeps in Xet storage (most of its weights) are announced with a Xet hash, and huggingface_hub then
fetches them with hf_xet's own client, from a content store, past that session: none of these bounds would hold, nor
a page's Stop (a progress callback's exception raised inside the Rust transfer). ``budget`` turns Xet off for this
process (``HF_HUB_DISABLE_XET``): the Hub serves every such file over HTTP too, through the session the hooks are on.

Inside ``local_only(...)`` no request leaves for the Hub from that thread (a library opening local files: a text
tower). ``HF_HUB_OFFLINE`` cannot say that: huggingface_hub reads it once, at its import, so setting it refused
nothing in a process that had imported it, while the environment is the whole process's: every process started
meanwhile inherited it (a run the Train page started), and two towers opening at once left it set for good.
"""

from __future__ import annotations

import contextvars
import math
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

try:  # the HTTP client huggingface_hub uses: httpx2 (2.x), httpx before
    import httpx2 as http
except ImportError:
    import httpx as http

CONNECT_S = 10.0  # a Hub that has not accepted the connection in 10 s is not there
READ_S = 10.0  # silence between two reads of an answer (huggingface_hub's own DEFAULT_DOWNLOAD_TIMEOUT)
ASK_S = 60.0  # the model info and the file list together: a silent or trickling server is given up within a minute
STALL_S = 30.0  # a file that has sent no byte for this long (huggingface_hub's retries included) is given up
WINDOW_S = 60.0  # the download's rate is measured over the last minute (and first judged a minute in)
MIN_BYTES_PER_S = 100_000  # slower than 100 kB/s over a minute is no download


class HubDeadline(Exception):
    """A step against the Hub ran past its deadline, or a file stalled; the message says which and how long."""


class HubTooLarge(Exception):
    """A file's body passed the size declared for it."""


class RateFloor:
    """A download's bytes over time, shared by its files: from ``WINDOW_S`` after it started, the bytes of the last
    ``WINDOW_S`` must reach ``MIN_BYTES_PER_S`` times it, whatever size the files declare."""

    def __init__(self) -> None:
        self.received = 0
        self.samples: deque[tuple[float, int]] = deque([(time.monotonic(), 0)])  # (time, bytes received by then)

    def add(self, count: int) -> None:
        self.received += count
        self.samples.append((time.monotonic(), self.received))

    def check(self, what: str) -> None:
        now = time.monotonic()
        start = now - WINDOW_S
        if self.samples[0][0] > start:
            return  # not a whole window yet
        while len(self.samples) > 1 and self.samples[1][0] <= start:
            self.samples.popleft()  # the first sample is then the count at the window's start
        moved = self.received - self.samples[0][1]
        if moved < MIN_BYTES_PER_S * WINDOW_S:
            raise HubDeadline(f"{what} came at {moved / WINDOW_S:,.0f} bytes/s over the last {WINDOW_S:.0f} s, "
                              f"under the {MIN_BYTES_PER_S / 1000:g} kB/s a download must keep")


@dataclass
class Budget:
    """What the requests of one step may take: until ``deadline`` (``time.monotonic``), and for a file's body at
    most ``max_bytes``, never ``STALL_S`` without a byte and, with a ``floor``, the download's rate."""

    what: str
    seconds: float
    deadline: float
    max_bytes: int | None = None
    last_byte: float = 0.0
    floor: RateFloor | None = None

    def check(self) -> None:
        now = time.monotonic()
        if now > self.deadline:
            raise HubDeadline(f"{self.what} took longer than {self.seconds:.0f} s")
        if self.max_bytes is not None and now - self.last_byte > STALL_S:
            raise HubDeadline(f"{self.what} sent nothing for {STALL_S:.0f} s")
        if self.floor is not None:
            self.floor.check(self.what)


_BUDGET: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("vit_hub_budget", default=None)
_LOCAL: contextvars.ContextVar[str | None] = contextvars.ContextVar("vit_hub_local_only", default=None)


@contextmanager
def local_only(what: str) -> Iterator[None]:
    """Within it, huggingface_hub's requests (transformers' and open_clip's too: they ask through it) raise
    ``OfflineModeIsEnabled`` naming ``what``, in this thread (this context) only."""
    _guard_session()
    token = _LOCAL.set(what)
    try:
        yield
    finally:
        _LOCAL.reset(token)


@contextmanager
def budget(what: str, seconds: float = math.inf, max_bytes: int | None = None,
           floor: RateFloor | None = None) -> Iterator[Budget]:
    """Within it, huggingface_hub's requests end by ``seconds`` from now, a file's body (``max_bytes`` given)
    stops once it passes ``max_bytes``, and the download ``floor`` counts its bytes stops below its rate:
    ``HubDeadline`` / ``HubTooLarge`` out of the library's call."""
    _guard_session()
    now = time.monotonic()
    token = _BUDGET.set(Budget(what, seconds, now + seconds, max_bytes, now, floor))
    try:
        yield _BUDGET.get()
    finally:
        _BUDGET.reset(token)


def _guard_session() -> None:
    # The session is the library's (recreated after a fork or set_client_factory): hook it where it is now.
    from huggingface_hub import constants, get_session

    constants.HF_HUB_DISABLE_XET = True  # every file over this session (the module docstring)

    session = get_session()
    hooks = session.event_hooks
    if _on_request not in hooks["request"]:
        session.event_hooks = {"request": [*hooks["request"], _on_request],
                               "response": [*hooks["response"], _on_response]}


def _on_request(request) -> None:
    local = _LOCAL.get()
    if local is not None:
        from huggingface_hub.errors import OfflineModeIsEnabled

        raise OfflineModeIsEnabled(f"{local} reads local files only: no request to {request.url.host}")
    spent = _BUDGET.get()
    if spent is None:
        return
    spent.check()
    left = max(spent.deadline - time.monotonic(), 0.1)
    asked = request.extensions.get("timeout") or {}
    # huggingface_hub passes no timeout for its API calls: ours, and never past the step's deadline
    request.extensions["timeout"] = {
        "connect": min(asked.get("connect") or CONNECT_S, CONNECT_S, left),
        "read": min(asked.get("read") or READ_S, READ_S, left),
        "write": min(asked.get("write") or READ_S, READ_S, left),
        "pool": min(asked.get("pool") or CONNECT_S, CONNECT_S, left),
    }


def _on_response(response) -> None:
    spent = _BUDGET.get()
    if spent is not None:
        response.stream = _GuardedStream(response.stream, spent, _range_start(response.request.headers.get("Range")))


def _range_start(header: str | None) -> int:
    try:
        return int(header.removeprefix("bytes=").split("-")[0]) if header else 0
    except ValueError:
        return 0


class _GuardedStream(http.SyncByteStream):
    """A response body read under a budget: each network read checks the deadline and, for a file, the bytes so far
    (from where its Range starts) against the declared size."""

    def __init__(self, stream, spent: Budget, start: int):
        self.stream, self.spent, self.count = stream, spent, start

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.stream:
            self.count += len(chunk)
            if self.spent.max_bytes is not None and self.count > self.spent.max_bytes:
                raise HubTooLarge(f"{self.spent.what} sent more than the {self.spent.max_bytes} bytes declared for it")
            if chunk:
                self.spent.last_byte = time.monotonic()
                if self.spent.floor is not None:
                    self.spent.floor.add(len(chunk))
            self.spent.check()
            yield chunk

    def close(self) -> None:
        self.stream.close()
