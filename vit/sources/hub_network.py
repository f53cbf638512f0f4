"""Deadlines and a byte bound for what this program asks the Hub, on huggingface_hub's own HTTP session.

huggingface_hub asks its model info and file list with no timeout at all, and reads a file's body with a 10 s
timeout per read but no deadline (a body that trickles never ends) and no bound (a body larger than its declared
size is written to disk before its consistency check). Inside ``budget(...)``, two event hooks on its session
(``huggingface_hub.get_session()``, the client it uses for every request) give each request connect and read
timeouts, end the whole step at its deadline, end a file that has sent nothing for ``STALL_S``, and stop reading a
body once it passes the size declared for it. Outside a budget the hooks do nothing.
"""

from __future__ import annotations

import contextvars
import time
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
FILE_S = 60.0  # a file's deadline: this long plus its size at MIN_BYTES_PER_S
MIN_BYTES_PER_S = 100_000  # slower than 100 kB/s is no download: a 5 GB model gets 14 hours


class HubDeadline(Exception):
    """A step against the Hub ran past its deadline, or a file stalled; the message says which and how long."""


class HubTooLarge(Exception):
    """A file's body passed the size declared for it."""


@dataclass
class Budget:
    """What the requests of one step may take: until ``deadline`` (``time.monotonic``), and for a file's body at
    most ``max_bytes`` and never ``STALL_S`` without a byte."""

    what: str
    seconds: float
    deadline: float
    max_bytes: int | None = None
    last_byte: float = 0.0

    def check(self) -> None:
        now = time.monotonic()
        if now > self.deadline:
            raise HubDeadline(f"{self.what} took longer than {self.seconds:.0f} s")
        if self.max_bytes is not None and now - self.last_byte > STALL_S:
            raise HubDeadline(f"{self.what} sent nothing for {STALL_S:.0f} s")


_BUDGET: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("vit_hub_budget", default=None)


@contextmanager
def budget(what: str, seconds: float, max_bytes: int | None = None) -> Iterator[Budget]:
    """Within it, huggingface_hub's requests end by ``seconds`` from now and a file's body (``max_bytes`` given)
    stops once it passes ``max_bytes``: ``HubDeadline`` / ``HubTooLarge`` out of the library's call."""
    _guard_session()
    now = time.monotonic()
    token = _BUDGET.set(Budget(what, seconds, now + seconds, max_bytes, now))
    try:
        yield _BUDGET.get()
    finally:
        _BUDGET.reset(token)


def file_seconds(size: int) -> float:
    """The deadline for a file of ``size`` bytes."""
    return FILE_S + max(size, 0) / MIN_BYTES_PER_S


def _guard_session() -> None:
    # The session is the library's (recreated after a fork or set_client_factory): hook it where it is now.
    from huggingface_hub import get_session

    session = get_session()
    hooks = session.event_hooks
    if _on_request not in hooks["request"]:
        session.event_hooks = {"request": [*hooks["request"], _on_request],
                               "response": [*hooks["response"], _on_response]}


def _on_request(request) -> None:
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
            self.spent.check()
            yield chunk

    def close(self) -> None:
        self.stream.close()
