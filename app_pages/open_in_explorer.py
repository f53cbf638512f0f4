"""Opening the explorer from another page (a run, an SAE, a dataset's mistake) with a link, not ``st.switch_page``.

``st.switch_page`` asks the server for the explorer's run while the browser still shows the page it left. Every
page that offers "Open in explorer" also has a fragment that refreshes itself (``run_every``: the runs table, a Ray
job's wait), whose timer lives in the browser and is cancelled only when the browser learns of the new page. A tick
in between sends a rerun of that fragment for the old page; Streamlit (1.67) runs it after the explorer's run and the
browser then drops the explorer's elements: a blank page with "Explore attention" selected, for good (10 of 30 clicks
on a 0.3 s timer; on a busy machine the 3 s runs table did it in a test that waited 15 minutes). ``st.page_link`` is
the browser's own page change: it cancels the timers before it asks for the page (0 of 60).

What the explorer should open travels as a hand-off in this session's state; the link names it by an id in its URL
(``?open=ID``). The explorer applies it (``take``) before anything reads the session state, and removes the
parameter. A link opened in a new tab is another session, which holds no hand-off: the link also names the model
(and an SAE) as a shared view's link does (``model=``: its catalogue name, else its path; ``sae=``), read there under
the same access rule, so the new tab opens the model it names rather than the default one.
"""

import hashlib
import json

import streamlit as st
from streamlit.errors import StreamlitPageNotFoundError

from vit.app import catalog, share
from vit.core.runfiles import default_checkpoints_dir, default_runs_dir

EXPLORER_PAGE = "app_pages/explorer.py"
PARAM = "open"  # the URL parameter that names a hand-off
KEY = "explorer_handoffs"  # session state: id -> the session-state values the explorer takes
MAX_HANDOFFS = 256  # links drawn in one session that are kept (a page redraws its links every few seconds)
NAMED = {"explorer_checkpoint": "model", "explorer_sae": "sae"}  # hand-off values a new tab reads from the URL


@st.cache_data(ttl=5, show_spinner=False)  # a runs panel redraws a link per run every few seconds
def _model_names(checkpoints_dir: str, runs_dir: str) -> dict[str, str]:
    return share.model_names(catalog.find_checkpoints(checkpoints_dir, runs_dir))


def url_values(values: dict[str, str]) -> dict[str, str]:
    """The parameters that name ``values``' model and SAE in the link's URL, as a shared view's link names them."""
    names = _model_names(str(default_checkpoints_dir()), str(default_runs_dir()))
    by_path = {path: name for name, path in names.items()}
    named = {NAMED[key]: str(value) for key, value in values.items() if key in NAMED and value}
    if "model" in named:
        named["model"] = share.model_text(named["model"], by_path.get(named["model"], ""), names)
    return named


def link(where, label: str, values: dict[str, str], disabled: bool = False, help: str | None = None) -> None:
    """A link in ``where`` (``st`` or a column) that opens the explorer with ``values`` set in the session state
    (``explorer_checkpoint``, ``explorer_sae``, ``explorer_image`` …)."""
    ident = hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]
    handoffs = st.session_state.setdefault(KEY, {})
    handoffs.pop(ident, None)  # the newest last: the oldest go first past the cap
    handoffs[ident] = dict(values)
    while len(handoffs) > MAX_HANDOFFS:
        handoffs.pop(next(iter(handoffs)))
    try:
        where.page_link(EXPLORER_PAGE, label=label, query_params={PARAM: ident, **url_values(values)},
                        disabled=disabled, help=help, icon=":material/visibility:")
    except StreamlitPageNotFoundError:  # this page was started alone (streamlit run app_pages/…): no explorer
        where.button(label, key=f"{KEY}-{ident}", disabled=True,
                     help="The explorer is a page of the app: start it with streamlit run app.py.")


def take() -> None:
    """On the explorer, first: the hand-off the URL names, set in the session state, and the parameter removed. A
    name this session did not hand off (the link opened in a new tab, a URL copied from another browser) leaves
    the model and SAE the URL names to the shared view's reading (``share_view.read_link``)."""
    ident = st.query_params.get(PARAM)
    if ident is None:
        return
    del st.query_params[PARAM]
    values = st.session_state.get(KEY, {}).pop(ident, None)
    if values is not None:
        st.session_state.update(values)
        for name in NAMED.values():  # the hand-off named them already
            st.query_params.pop(name, None)
