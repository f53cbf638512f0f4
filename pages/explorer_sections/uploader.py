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


def settled_upload(upload, name: str, seconds: float = REPLACE_WAIT_S, step: float = 0.01):
    """``upload``, the value of a file uploader (``name``: its own, for what the session state keeps of it), once it
    is settled: when the last run had a file there and this one has none, the run Streamlit will be asked for if a
    new file is replacing it gets ``seconds`` to be asked for. Reading the session state is one of Streamlit's yield
    points: there a run that a newer one is waiting for stops (``RerunException``) before it sent anything more to
    the browser, whose page is then updated in place rather than cleared and drawn again. Otherwise (the file was
    removed) it returns None."""
    had = f"{name}-had-file"
    if upload is not None:
        st.session_state[had] = True
        return upload
    if st.session_state.pop(had, False):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(step)
            _ = had in st.session_state  # the yield point
    return None
