"""The explorer's frame while a fresh server starts: its title and a line that says the model is loading, drawn by
``app.py`` before the page imports PyTorch (5-15 s on a busy machine, once per server), and cleared by the page when
it draws its own title. Without it the first visitor looked at a blank page meanwhile."""

import sys

import streamlit as st

KEY = "explorer_starting"
LINE = "Loading the model: this server is starting PyTorch (a few seconds, once per server)…"


def start() -> None:
    """The title and LINE, when this server process has not imported torch yet; nothing otherwise."""
    if "torch" in sys.modules:
        return
    slot = st.empty()
    with slot.container():
        st.title("ViT Attention Explorer")
        st.info(LINE, icon=":material/hourglass_top:")
    st.session_state[KEY] = slot


def clear() -> None:
    """Removes the frame, if this run drew one (before the page's own title, and when the run ends)."""
    slot = st.session_state.pop(KEY, None)
    if slot is not None:
        slot.empty()
