"""The link to a view (issue 50): the URL follows the view's values, and a popover offers it to copy. Every section
that can be linked uses these (the image page, the clip view, Ask the VLM); what the values are is theirs, and the
codec is ``vit.app.share``."""

from urllib.parse import urlencode

import streamlit as st

from vit.app import share


def follow(values: dict[str, object]) -> None:
    """The URL follows the view (a message to the browser: no rerun)."""
    params = share.encode(values)
    if st.query_params.to_dict() != params:
        st.query_params.from_dict(params)


def follow_part(values: dict[str, object], names: tuple[str, ...]) -> None:
    """The URL's parameters ``names`` follow ``values`` (the others kept): a section that is a fragment reruns
    alone on a click there, which the page's own ``follow`` does not see until the page runs again."""
    wanted = share.encode(values)
    for name in names:
        if name not in wanted:
            st.query_params.pop(name, None)
        elif st.query_params.get(name) != wanted[name]:
            st.query_params[name] = wanted[name]


def follow_model(model: str) -> None:
    """Before a page draws anything: a URL that names another model than the one shown (the previous page's view, a
    link whose model did not open) holds the shown model alone until the page writes its view, so that a reload or a
    bookmark taken meanwhile (a page waiting for an upload or a concept, or one that stops early) opens this model,
    never the previous one with its settings."""
    params = st.query_params.to_dict()
    if params and params.get("model") != share.encode({"model": model}).get("model"):
        st.query_params.from_dict(share.encode({"model": model}))


def link_popover(where, values: dict[str, object], what: str = "image") -> None:
    """"Copy link to this view" in ``where``: the URL of the view ``values`` describe, to copy."""
    url = str(st.context.url or "").split("?")[0] + "?" + urlencode(share.encode(values))
    with where.popover("Copy link to this view"):
        st.code(url, language=None, wrap_lines=True)  # its copy button puts the link on the clipboard
        st.caption(f"Anyone who can reach this server sees this view at this link; an uploaded {what} is kept for a "
                   "while (the most recent uploads), a model opened by path opens only for a visitor with access.")
