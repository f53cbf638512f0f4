"""The explorer on a model in hand (issue 117, item 5): a page whose ``?model=`` names a model ``vit.explore`` holds
in this process (``vit.app.notebook.in_hand``) draws that very object with the library road's view
(``library_view``), an uploaded image in; no file of the model is read or written. A name this process does not hold
(the call returned, a link from another server) says so in one line."""

from dataclasses import replace
from pathlib import Path

import streamlit as st

from app_pages.explorer_sections import library_view, starting
from vit.app import catalog
from vit.app import explorer_page as explorer
from vit.app.notebook import in_hand
from vit.checkpoint import Checkpoint
from vit.core.text import escape_markdown, visible

GONE = "This model is no longer served: call vit.explore(model) again in its notebook."
SERVED = "a model in hand, served by vit.explore from its notebook's process"


def entry_for(text: str, name: str, checkpoint: Checkpoint) -> catalog.CatalogEntry:
    """The picker's line for a model in hand: named by the notebook, no file (hence no samples of its own)."""
    return catalog.CatalogEntry(path=Path(text), source="in-hand", name=name,
                                class_names=tuple(checkpoint.class_names))


def page() -> None:
    """When the URL's ``model`` names a model in hand: its page, then the run stops; else nothing is drawn."""
    text = st.query_params.get("model")
    if not in_hand.is_in_hand(text):
        return
    held = in_hand.held(text)
    starting.clear()
    st.title("ViT Attention Explorer")
    if held is None:
        st.error(GONE)
        st.stop()
    name = visible(held.name)  # the notebook's text: control characters shown as their escapes, never Markdown
    st.caption(f"{escape_markdown(name)}: {SERVED}.")
    st.sidebar.header("Checkpoint")
    st.sidebar.caption(escape_markdown(name))
    # Class names come from the module: shown with U+202E and the like as their escapes (as caches.load_model does);
    # a shallow copy, the model object itself shared
    checkpoint = replace(held.checkpoint, class_names=[visible(c) for c in held.checkpoint.class_names])
    if checkpoint.road != "library":
        st.error("This model opened as our own ViT: the page opens such a model by its path (vit.explore(path)).")
        st.stop()
    entry = entry_for(text, name, checkpoint)
    model_key = explorer.image_digest(text.encode())[:10]
    library_view.library_view(checkpoint, ("in-hand", text), entry, {str(entry.path): entry}, model_key, text)
    st.stop()
