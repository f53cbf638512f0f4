"""Play: a slider that steps by itself, one option a second, round and round (the Train page's attention snapshots
over epochs, the explorer's clip over its frames).

The part of the page with the slider and its Play toggle is a fragment that runs every ``PLAY_SECONDS`` while the
toggle is on (``idle_seconds``, or never, while it is off); each of its runs moves the slider's value on before the
slider is drawn. A fragment's interval is fixed when the page calls it, so a change of the toggle runs the whole page
again, which calls the fragment with the other interval.
"""

from collections.abc import Callable, Sequence

import streamlit as st

PLAY_SECONDS = 1.0
PLAY_LABEL = "Play"


def advance(key: str, options: Sequence, play_key: str) -> None:
    """While ``play_key``'s toggle is on: the slider ``key`` at the option after its own (the first after the last).
    Call it before the slider is drawn."""
    state = st.session_state
    if state.get(play_key) and state.get(key) in options:
        at = list(options).index(state[key])
        state[key] = options[(at + 1) % len(options)]


def play_toggle(where, play_key: str, help: str) -> bool:
    """The Play toggle in ``where``; whether it is on."""
    return where.toggle(PLAY_LABEL, key=play_key, help=help)


def play_fragment(body: Callable[..., None], play_key: str, *args, idle_seconds: float | None = None) -> None:
    """``body(*args)`` as a fragment that runs every ``PLAY_SECONDS`` while ``play_key``'s toggle is on, every
    ``idle_seconds`` (None: only when its own widgets change) while it is off."""
    playing = bool(st.session_state.get(play_key))

    def run(*arguments) -> None:
        if bool(st.session_state.get(play_key)) != playing:
            st.rerun()  # the whole page: the fragment's interval follows the toggle
        body(*arguments)

    run.__qualname__ = f"play_fragment.{getattr(body, '__qualname__', 'body')}"  # one fragment per body
    st.fragment(run_every=PLAY_SECONDS if playing else idle_seconds)(run)(*args)
