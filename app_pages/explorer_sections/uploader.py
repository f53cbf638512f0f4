"""A file uploader's value once it is settled: Streamlit's uploader asks for a run without any file before the run
with a file that replaces the last one."""

import threading
import time

import streamlit as st
from streamlit.runtime import Runtime
from streamlit.runtime.scriptrunner import get_script_run_ctx

# Streamlit's uploader (1.67), when a new file replaces the one there, asks the server for the new file's upload URL,
# removes the old file (asking for a run without any file), uploads the new one and then asks for a run with it.
# Finished, that first run stripped the page to "upload an image" (or a section to its "upload one"), and the next
# drew every chart anew in the browser. So a run that finds an upload gone waits for the next request: while a file
# this session asked to upload is still on its way (as long as the upload takes, up to UPLOAD_WAIT_S), then this long.
REPLACE_WAIT_S = 0.5
UPLOAD_WAIT_S = 30.0  # an upload asked for longer ago than this (failed, or cancelled in the browser) is not awaited
MAX_IDS_PER_SESSION = 64  # a page has a few uploaders, one of many files: more URLs at once is no browser's
HAD_FILE = "-had-file"  # the session state's flag, after the uploader's key, that it had a file in the last run


class UploadsInFlight:
    """The files each session asked upload URLs for (the browser's first step of every upload) and the server has
    not received yet. It wraps the uploaded-file manager's ``get_upload_urls`` (the requests) and ``add_file`` (the
    arrivals: a file removed since, the one a replacement deletes, has arrived all the same).

    Any visitor can ask for upload URLs without end (a websocket message each): a session keeps its latest
    ``MAX_IDS_PER_SESSION`` ids, and ids are forgotten ``UPLOAD_WAIT_S`` after they were asked for, a session's own
    on each of its checks, every session's at most once per ``UPLOAD_WAIT_S``, so a check costs a few ids."""

    def __init__(self, manager):
        # session id -> file id -> when its URL was asked for, oldest first (so expired ones are at the front)
        self._asked: dict[str, dict[str, float]] = {}
        self._swept = time.monotonic()  # when every session's expired ids were last forgotten
        self._lock = threading.Lock()
        get_upload_urls, add_file = manager.get_upload_urls, manager.add_file

        def asked_for(session_id, file_names):
            urls = get_upload_urls(session_id, file_names)
            now = time.monotonic()
            with self._lock:
                asked = self._asked.setdefault(session_id, {})
                asked.update((url.file_id, now) for url in urls[-MAX_IDS_PER_SESSION:])
                for file_id in list(asked)[:len(asked) - MAX_IDS_PER_SESSION]:  # the oldest beyond the cap
                    del asked[file_id]
                self._sweep(now)
            return urls

        def arrived(session_id, file):
            add_file(session_id, file)
            with self._lock:
                self._asked.get(session_id, {}).pop(file.file_id, None)

        manager.get_upload_urls, manager.add_file = asked_for, arrived

    def _expire(self, session_id: str, now: float) -> None:
        asked = self._asked.get(session_id)
        if asked is None:
            return
        while asked and now - next(iter(asked.values())) >= UPLOAD_WAIT_S:
            del asked[next(iter(asked))]
        if not asked:
            del self._asked[session_id]

    def _sweep(self, now: float) -> None:
        if now - self._swept < UPLOAD_WAIT_S:
            return
        self._swept = now
        for session_id in list(self._asked):
            self._expire(session_id, now)

    def uploading(self, session_id: str) -> bool:
        """Whether a file ``session_id`` asked to upload in the last UPLOAD_WAIT_S seconds has not arrived yet."""
        with self._lock:
            now = time.monotonic()
            self._expire(session_id, now)
            self._sweep(now)
            return bool(self._asked.get(session_id))

    def sessions(self) -> set[str]:
        """The sessions with an id still held (expired ones may remain until the next sweep)."""
        with self._lock:
            return set(self._asked)


_install_lock = threading.Lock()


def uploads_in_flight() -> UploadsInFlight | None:
    """The server's ``UploadsInFlight``, made on its first call; None outside a Streamlit server (``AppTest``) or
    when its uploaded-file manager lacks the two methods watched (another manager, a later Streamlit): the run that
    finds a file gone then waits its plain REPLACE_WAIT_S."""
    if not Runtime.exists():
        return None
    manager = Runtime.instance().uploaded_file_mgr
    if not all(callable(getattr(manager, method, None)) for method in ("get_upload_urls", "add_file")):
        return None
    with _install_lock:  # one per manager, also when Streamlit reloads this module
        if not isinstance(getattr(manager, "vit_uploads_in_flight", None), UploadsInFlight):
            manager.vit_uploads_in_flight = UploadsInFlight(manager)
        return manager.vit_uploads_in_flight


def _wait_for_a_rerun(seconds: float, step: float) -> None:
    """Gives a rerun ``seconds`` to be asked for, and as long again after each moment a file this session asked to
    upload was still on its way. Reading the session state is one of Streamlit's yield points: there a run that a
    newer one is waiting for stops."""
    uploads, ctx = uploads_in_flight(), get_script_run_ctx()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(step)
        _ = HAD_FILE in st.session_state  # the yield point
        if uploads is not None and ctx is not None and uploads.uploading(ctx.session_id):
            deadline = time.monotonic() + seconds


def settled_upload(upload, key: str, seconds: float = REPLACE_WAIT_S, step: float = 0.01):
    """``upload``, the value of the file uploader keyed ``key``, once it is settled: when the last run had a file
    there and this one has none, the run Streamlit will be asked for if a new file is replacing it gets ``seconds``
    (and the upload's time) to be asked for (``settle_replacements`` at the script's start has usually waited
    already; a fragment's rerun does not pass there). Otherwise (the file was removed) it returns None."""
    if upload is not None:
        st.session_state[key + HAD_FILE] = True
        return upload
    if st.session_state.pop(key + HAD_FILE, False):
        _wait_for_a_rerun(seconds, step)
    return None


def file_upload(where, label: str, key: str, **kwargs):
    """``where.file_uploader(label, key=key, **kwargs)``'s file, settled (``settled_upload``)."""
    return settled_upload(where.file_uploader(label, key=key, **kwargs), key)


def settle_replacements(seconds: float = REPLACE_WAIT_S, step: float = 0.01) -> None:
    """At the start of a run, before anything is drawn: when an uploader that had a file in the last run (one that
    ``settled_upload`` saw) is there without it, this run may be the first of a replacement's two, and the run with
    the new file gets ``seconds`` (and the upload's time) to be asked for here, where the run that it replaces stops
    having sent the browser nothing (not the page's first half again, for its browser to lay out while the next run's
    model runs: ~0.1 s of CPU on two cores, issue 51). An uploader gone from the page (its section closed) only loses
    its flag."""
    uploads_in_flight()  # watching from the first run on, before any uploader is drawn
    for flag in [k for k in st.session_state if isinstance(k, str) and k.endswith(HAD_FILE)]:
        key = flag.removesuffix(HAD_FILE)
        if st.session_state.get(key) is not None:
            continue  # its file is still there
        del st.session_state[flag]
        if key in st.session_state:  # drawn in the last run, without its file now
            _wait_for_a_rerun(seconds, step)
            return
