"""Plotly's bundle loaded while the server starts the explorer, not after its first map is computed.

The browser asks for Plotly's JavaScript (megabytes, seconds of parsing on a busy machine) only when the first
chart arrives, and the explorer's first chart (the patch picker) comes after torch is imported, the model opened and
run. A blank chart sent by ``app.py`` before the page imports anything makes the browser load the bundle meanwhile
(on the other core); the page clears it before drawing its own charts. Once per session: a session is one browser
tab, which keeps the bundle once loaded.
"""

import streamlit as st

KEY = "plotly_preload"
# One invisible point (Plotly refuses a figure without a trace), no axes: the lightest chart that still makes the
# browser load Streamlit's Plotly component.
BLANK = {"data": [{"type": "scatter", "x": [0], "y": [0], "mode": "markers", "marker": {"opacity": 0},
                   "hoverinfo": "skip"}], "layout": {"height": 10, "margin": {"l": 0, "r": 0, "t": 0, "b": 0},
                                "xaxis": {"visible": False}, "yaxis": {"visible": False}}}


def start() -> None:
    """The slot for the blank chart (every run, so that the page's elements keep their places), filled on the
    session's first run."""
    slot = st.empty()
    if not st.session_state.get(KEY + "_sent"):
        st.session_state[KEY + "_sent"] = True
        slot.plotly_chart(BLANK, config={"staticPlot": True, "displayModeBar": False})
        st.session_state[KEY] = slot


def clear() -> None:
    """Removes the blank chart, if this run drew one (before the page's own charts, which tests count)."""
    slot = st.session_state.pop(KEY, None)
    if slot is not None:
        slot.empty()
