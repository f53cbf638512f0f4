"""A file uploader's value once it is settled: Streamlit's uploader asks for a run without any file before the run
with a file that replaces the last one."""

import time

import streamlit as st

# Streamlit's uploader (1.67), when a new file replaces the one there, first asks for a run without any file (the old
# one removed before the new one is added), then for one with the new file once it is uploaded (~20-50 ms later on
# this machine). Finished, that first run stripped the page to "upload an image" (or a section to its "upload one"),
# and the next drew every chart anew in the browser. So a run that finds an upload gone waits this long for the next
# request before going on.
REPLACE_WAIT_S = 0.5
HAD_FILE = "-had-file"  # the session state's flag, after the uploader's key, that it had a file in the last run


def _wait_for_a_rerun(seconds: float, step: float) -> None:
    """Gives a rerun ``seconds`` to be asked for. Reading the session state is one of Streamlit's yield points: there
    a run that a newer one is waiting for stops."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(step)
        _ = HAD_FILE in st.session_state  # the yield point


def settled_upload(upload, key: str, seconds: float = REPLACE_WAIT_S, step: float = 0.01):
    """``upload``, the value of the file uploader keyed ``key``, once it is settled: when the last run had a file
    there and this one has none, the run Streamlit will be asked for if a new file is replacing it gets ``seconds``
    to be asked for (``settle_replacements`` at the script's start has usually waited already; a fragment's rerun
    does not pass there). Otherwise (the file was removed) it returns None."""
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
    the new file gets ``seconds`` to be asked for here, where the run that it replaces stops having sent the browser
    nothing (not the page's first half again, for its browser to lay out while the next run's model runs: ~0.1 s of
    CPU on two cores, issue 51). An uploader gone from the page (its section closed) only loses its flag."""
    for flag in [k for k in st.session_state if isinstance(k, str) and k.endswith(HAD_FILE)]:
        key = flag.removesuffix(HAD_FILE)
        if st.session_state.get(key) is not None:
            continue  # its file is still there
        del st.session_state[flag]
        if key in st.session_state:  # drawn in the last run, without its file now
            _wait_for_a_rerun(seconds, step)
            return
