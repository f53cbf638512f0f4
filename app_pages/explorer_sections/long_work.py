"""Long work on a page: a progress bar (passes done of the total, the time left), a Stop button, a server-wide bound.

``long_work(key, label, compute, place)`` returns ``compute(progress)``'s result when it is known (kept for every
visitor, by ``key``); otherwise it starts the computation in a worker thread owned by this session
(``vit.app.work.Work``: at most one per session, so a new one stops the one before) and draws its progress in a
fragment that redraws itself every half second, with a Stop button and what the work shows so far (``Work.so_far``),
and returns None; the page reruns when the work is done. A computation that keeps what it had done when stopped (a
VLM's answer so far) has it returned after the stop, for this page only. At most ``AT_ONCE`` heavy computations
run at once on the server (``VIT_HEAVY_AT_ONCE``); the others wait, and their page says so in one line. A work
stops by itself at its next chunk when its session ends (the tab was closed), when its widget changes (another key
is asked for) or when no page has drawn its progress for ``work.LEASE_S`` seconds (its widget went away).
"""

import os
from collections.abc import Callable
from typing import Any

import streamlit as st
from streamlit import runtime
from streamlit.runtime.scriptrunner import get_script_run_ctx

from vit.app import work
from vit.core.cache import ByteCache
from vit.core.progress import Progress
from vit.core.text import escape_markdown

SESSION_KEY = "long_work"
RESULT_CACHE_BYTES = 256 * 2**20
POLL_S = 1.0  # how often the progress redraws (and tells the work that its page is still open)
QUICK_S = 1.0  # work done within this after it starts is shown at once, with no progress bar
_MISSING = object()
STOPPED_BY_YOU = "stopped by you"


def at_once() -> int:
    """How many heavy computations may run at once on this server: ``VIT_HEAVY_AT_ONCE``, else half the cores."""
    value = os.environ.get("VIT_HEAVY_AT_ONCE", "").strip()
    if value.isdigit() and int(value) >= 1:
        return int(value)
    return max(1, (os.cpu_count() or 2) // 2)


@st.cache_resource(show_spinner=False)
def results() -> ByteCache:
    """The results of long work, kept for every visitor by key (bounded by bytes, the least recently used go)."""
    return ByteCache(RESULT_CACHE_BYTES)


@st.cache_resource(show_spinner=False)
def server_slots(size: int) -> work.Slots:
    """The one bound of the whole server process (every session shares it)."""
    return work.Slots(size)


def _session_alive() -> Callable[[], bool] | None:
    """Whether this page's session is still connected, asked from the worker thread; None outside a server."""
    ctx = get_script_run_ctx()
    if ctx is None or not runtime.exists():
        return None
    instance, session_id = runtime.get_instance(), ctx.session_id
    return lambda: instance.is_active_session(session_id)


def _start(key: Any, label: str, compute: Callable[[Progress], Any], unit: str = "passes",
           heavy: bool = True) -> work.Work:
    slots = server_slots(at_once()) if heavy else None
    current = work.Work(key, label, slots, _session_alive(), unit=unit).start(compute)
    st.session_state[SESSION_KEY] = current
    return current


def long_work(key: Any, label: str, compute: Callable[[Progress], Any], place: str, unit: str = "passes",
              kept: ByteCache | None = None, heavy: bool = True) -> Any:
    """``compute(progress)``'s result for ``key``, or None while it runs or after it was stopped (its progress and
    a Stop or Run-again button are drawn here; stopped, what the computation kept if it caught the stop to keep it,
    not kept for other visitors). ``place`` names the call site (its widgets' keys), ``unit`` what
    ``progress`` counts, ``kept`` the cache the result is kept in (default: ``results()``), ``heavy`` False for
    work that only waits on another machine (a Ray job), which takes none of the server's slots. Raises what the
    computation raised (a ValueError the page shows in one line)."""
    kept = kept if kept is not None else results()
    found = kept.get(key, _MISSING)
    if found is not _MISSING:
        return found
    current: work.Work | None = st.session_state.get(SESSION_KEY)
    # Asked for again after it stopped by itself (its widget went away and came back): it starts again; stopped
    # by the visitor's Stop, it waits for Run again.
    restart = current is not None and current.state == "stopped" and (
        str(current.error) != STOPPED_BY_YOU or st.session_state.get(f"long_work_again-{place}"))
    if current is None or current.key != key or restart:
        if current is not None and not current.finished:
            current.stop("another computation was asked for on this page")
        current = _start(key, label, compute, unit, heavy)
        waited = 0.0
        while waited < QUICK_S and not current.wait(min(POLL_S, QUICK_S - waited)):
            current.touch()  # this run waits for it: its page is showing it (its lease is shorter than QUICK_S may be)
            waited += POLL_S
    current.touch()
    if current.state == "done":  # kept for every visitor (if it fits the cache), and for this page
        return kept.get_or_compute(key, lambda: current.result)
    if current.state == "failed":
        raise current.error
    if current.state == "stopped":  # by the visitor: said, with a button to run it again
        st.info(escape_markdown(f"{current.describe()}."))
        st.button("Run again", key=f"long_work_again-{place}")
        return current.result  # None unless the computation kept what it had done (a VLM's answer so far)
    progress_panel(place)
    return None


@st.fragment(run_every=POLL_S)
def progress_panel(place: str) -> None:
    """The session's running work: a progress bar and a Stop button, redrawn every ``POLL_S``; the page reruns
    when the work has ended. A Stop click is read before the button is drawn, so it takes effect in this run."""
    current: work.Work | None = st.session_state.get(SESSION_KEY)
    if current is None:
        return
    stop_key = f"long_work_stop-{place}"
    if st.session_state.get(stop_key) and not current.finished:
        current.stop(STOPPED_BY_YOU)
        current.wait(2.0)  # most chunks end within this; else the panel says "stopping" until it has
    current.touch()
    if current.finished:
        st.rerun()  # the page shows the result, the error or "stopped" where it asked for the work
    st.progress(current.fraction(), text=escape_markdown(current.describe()))
    if current.so_far:
        st.text(current.so_far)  # plain text: a model's words are data
    st.button("Stop", key=stop_key, help="Stops the computation at its next chunk.")
