"""Ask in words: a CLIP's or SigLIP's scores for labels typed here, and the map of where it sees each (issue 22).

A fragment: typing labels or picking a label's map reruns this section alone, then the page once where that changed
the page's link ("Copy link to this view", drawn above the section, holds the labels and the map's picks; issue 116).
For a model without a classifier the labels are its prediction (the Prediction box) and what its logit lens reads.
"""

import numpy as np
import streamlit as st
from PIL import Image

from app_pages.explorer_sections import view_link
from app_pages.explorer_sections.long_work import long_work
from app_pages.explorer_sections.state import Shown, keep_settings
from vit.app import drawing, share
from vit.app.word_figures import curves_figure, scores_figure
from vit.checkpoint import Checkpoint, CheckpointError
from vit.core.inference import InputSize
from vit.core.text import escape_markdown
from vit.explain.language import words
from vit.explain.language.prompts import DEFAULT_TEMPLATE
from vit.explain.views.overlay import is_signed, map_colours, overlay
from vit.sources.vlm.text_tower import MAX_LABELS, open_text_tower, split_labels

LABELS_KEY, ENSEMBLE_KEY, TEMPLATE_KEY = "words_labels", "words_ensemble", "words_template"
LABEL_KEY, MINUS_KEY, METHOD_KEY, CURVES_KEY = "words_label", "words_minus", "words_method", "words_curves"
DRAWN_KEY = "words_asked_drawn"  # the labels the rest of the page was last drawn with
LINKED_KEY = "words_linked"  # a link's label, minus and method, until the labels they name are asked
PICKED_KEY = "words_picked"  # the map's label, minus and method last drawn, as a link's values
SHARED_KEY = "words_shared"  # the section's part of the page's link as the page last drew it
PICKS = ("wlabel", "wminus", "wmethod")  # the link's parameters of the section's map
KEPT = ("words_",)  # every key of this section: the map's controls are drawn only while labels are asked


@st.cache_resource(max_entries=2, show_spinner="Loading the text tower…")
def text_tower(fingerprint: tuple, _checkpoint: Checkpoint):
    """The model's text side (tokenizer and text transformer, from its own library), once per model; it caches
    the embedding of every text it has read."""
    return open_text_tower(_checkpoint)


@st.cache_resource(max_entries=16, show_spinner="Asking the model…")
def _ask(fingerprint: tuple, digest: str, size: InputSize, labels: tuple[str, ...], templates: tuple[str, ...],
         full_fingerprint: tuple, _checkpoint: Checkpoint, _full_checkpoint: Checkpoint,
         _image: Image.Image) -> words.Answer:
    # The text side does not change with the image's heads switched off: the full model's tower, opened once.
    return words.answer(_checkpoint, text_tower(full_fingerprint, _full_checkpoint), _image, list(labels),
                        list(templates), size)


def ask(fingerprint: tuple, digest: str, size: InputSize, labels: tuple[str, ...], templates: tuple[str, ...],
        full_fingerprint: tuple, checkpoint: Checkpoint, full_checkpoint: Checkpoint,
        image: Image.Image) -> words.Answer | None:
    """The labels' scores, once per model, image and text. The template ensemble (80 texts a label) is long work:
    its progress and a Stop button are drawn here, and None is returned until it is done."""
    if len(templates) == 1:
        return _ask(fingerprint, digest, size, labels, templates, full_fingerprint, checkpoint, full_checkpoint,
                    image)
    tower = text_tower(full_fingerprint, full_checkpoint)
    return long_work(("ask", fingerprint, digest, size, labels, templates), "Encoding every label in each template",
                     lambda progress: words.answer(checkpoint, tower, image, list(labels), list(templates), size,
                                                   progress), "ask_in_words")


@st.cache_resource(max_entries=32, show_spinner="Computing the map for the label…")
def word_map(fingerprint: tuple, digest: str, size: InputSize, labels: tuple[str, ...], templates: tuple[str, ...],
             index: int, method: str, _asked: words.Answer, _checkpoint: Checkpoint,
             _image: Image.Image) -> np.ndarray:
    return words.word_map(_checkpoint, _asked, _image, index, method, size)


def take_link(values: dict) -> None:
    """Once per session (``share_view.read_link``): the link's map label, minus and method wait for the labels."""
    linked = {name: values.pop(name) for name in PICKS if name in values}
    if linked:
        st.session_state[LINKED_KEY] = linked


def _apply_link(labels: list[str], methods: dict[str, str]) -> list[str]:
    """The link's label and minus (by their text) and method as the pickers' values, where these labels and this
    model have them; one line for each that they do not."""
    linked, notes = st.session_state.pop(LINKED_KEY, None) or {}, []
    for name, key in (("wlabel", LABEL_KEY), ("wminus", MINUS_KEY)):
        if name in linked and linked[name] in labels:
            st.session_state[key] = labels.index(linked[name])
        elif name in linked:
            notes.append(share.dropped(name, linked[name], "it is not one of the link's labels"))
    if linked.get("wmethod") in methods:
        st.session_state[METHOD_KEY] = linked["wmethod"]
    elif "wmethod" in linked:
        notes.append(share.dropped("wmethod", linked["wmethod"], f"this model's methods are {', '.join(methods)}"))
    return notes


def link_values() -> dict[str, object]:
    """The section's part of the page's link while labels are asked: the labels, and the map's label and minus
    (their text) and method; before the section draws (a link, a reload), the link's picks it is about to apply."""
    labels = str(st.session_state.get(LABELS_KEY) or "").strip()
    if not labels:
        return {}
    picked = st.session_state.get(LINKED_KEY) or st.session_state.get(PICKED_KEY) or {}
    return {"labels": labels, **{k: v for k, v in picked.items() if v is not None}}


def shared_values() -> dict[str, object]:
    """``link_values`` for the page's link, remembered: the section reruns the page when its own reruns change them
    (``link_is_stale``)."""
    st.session_state[SHARED_KEY] = link_values()
    return st.session_state[SHARED_KEY]


def link_is_stale() -> bool:
    """Whether the page's link, drawn before this section, lacks the section's view as it is now."""
    return SHARED_KEY in st.session_state and st.session_state[SHARED_KEY] != link_values()


def section_inputs(with_ensemble: bool) -> tuple[tuple, str, bool, str]:
    """The section's heading and its three columns, the labels and template typed in the first (and, with
    ``with_ensemble``, the ImageNet templates' checkbox): ``(columns, labels text, ensemble, template)``. The main
    page's section and the library road's (``library_words``) draw the same inputs under the same keys."""
    st.subheader("Ask in words")
    columns = st.columns([0.8, 0.8, 1], gap="medium")
    with columns[0]:
        # No max_chars: Streamlit would show a "47/12928" counter; split_labels bounds the text (one line if over).
        labels_text = st.text_area("Labels", key=LABELS_KEY, placeholder="a dog, a cat, a ball",
                                   help=f"Up to {MAX_LABELS} labels or whole prompts, separated by commas, semicolons "
                                        "or line breaks. They are read as plain text.")
        ensemble = with_ensemble and st.checkbox(
            "Average open_clip's 80 ImageNet templates", key=ENSEMBLE_KEY,
            help="As OpenAI's and open_clip's zero-shot ImageNet classifiers: each label in 80 templates, the "
                 "normalised embeddings averaged.")
        st.session_state.setdefault(TEMPLATE_KEY, DEFAULT_TEMPLATE)
        template = st.text_input("Template", key=TEMPLATE_KEY, max_chars=200, disabled=ensemble,
                                 help="Where each label goes, marked by {}; \"{}\" alone uses the labels as typed.")
    return tuple(columns), labels_text, ensemble, template


@st.fragment
def ask_in_words(view: Shown) -> words.Answer | None:
    """The section, for a model with a text tower; the answer to the labels typed (None without labels)."""
    keep_settings(KEPT)
    checkpoint, image, size = view.checkpoint, view.image, view.size
    model = (view.fingerprint, view.image_key, size)
    full = (view.full_fingerprint, checkpoint, view.full_checkpoint, image)
    (col_ask, col_scores, col_map), labels_text, ensemble, template = section_inputs(with_ensemble=True)
    asked, labels = None, []
    try:
        labels = split_labels(labels_text) if labels_text.strip() else []
        templates = words.templates_for(template, ensemble)
        if labels:
            asked = ask(*model, tuple(labels), tuple(templates), *full)
    except (ValueError, CheckpointError) as e:  # bounds, a template without {}, a folder without tokenizer files
        col_ask.error(escape_markdown(e))
    if not view.class_names:  # the labels are the prediction and what the logit lens reads: redraw the page
        asked_key = None if asked is None else (tuple(labels), tuple(templates))
        if DRAWN_KEY in st.session_state and st.session_state[DRAWN_KEY] != asked_key:
            st.rerun(scope="app")
        st.session_state[DRAWN_KEY] = asked_key
    if asked is None:
        if not labels:
            col_scores.caption("Type labels to see how this model scores them and where it sees each.")
        return None
    with col_scores:
        st.plotly_chart(scores_figure(asked), config={"displayModeBar": False})
        st.caption(words.describe_scores(asked, ensemble))
    with col_map:
        methods = words.methods(checkpoint.model)  # a tower on the library road: the road's class maps
        if not methods:
            st.caption("No map of a label reaches this model (its gradient does not pass back to its pixels); its "
                       "scores are above, its attention maps in the main view.")
            return asked
        for line in _apply_link(labels, methods):
            st.caption(escape_markdown(line))
        chosen = st.selectbox("Map for", range(len(labels)), key=LABEL_KEY,
                              format_func=lambda i: labels[i])
        minus = st.selectbox("Minus (optional)", [None, *range(len(labels))], key=MINUS_KEY,
                             placeholder="nothing: this label's own map",  # what Streamlit shows for None
                             format_func=lambda i: "nothing: this label's own map" if i is None else labels[i])
        method = st.selectbox("Method", list(methods), format_func=methods.get, key=METHOD_KEY)
        st.session_state[PICKED_KEY] = {"wlabel": labels[chosen], "wminus": None if minus is None else labels[minus],
                                        "wmethod": method}
        view_link.follow_part(link_values(), PICKS)  # a click here reruns this fragment alone
        if link_is_stale():  # the page's "Copy link to this view" is redrawn with this view
            st.rerun(scope="app")
        try:
            map_a = word_map(*model, tuple(labels), tuple(templates), chosen, method, asked, checkpoint, image)
            other = None if minus is None or minus == chosen else minus
            if other is None:
                shown_map = map_a
                signed = method == "attnlrp" or (words.is_library(checkpoint.model) and is_signed(method))
            else:
                map_b = word_map(*model, tuple(labels), tuple(templates), other, method, asked, checkpoint, image)
                shown_map, signed = words.difference(map_a, map_b), True
        except ValueError as e:  # a method the model's layout does not support, too many tokens
            st.error(escape_markdown(e))
        else:
            cmap, low, high = map_colours("attnlrp" if signed else "", shown_map, view.colormap)
            st.image(overlay(view.shown, shown_map, view.opacity, cmap, view.mode, show_grid=view.show_grid,
                             vmin=low, vmax=high), output_format="PNG")
            st.caption(words.describe_method(method, labels[chosen], None if other is None else labels[other],
                                             kind=asked.prompts.kind)
                       + " Drawn over the part of the image the model saw. " + drawing.describe_range(shown_map))
            if other is None and not words.is_library(checkpoint.model) and st.toggle(  # the port's cosine
                    "Deletion and insertion curves", key=CURVES_KEY,
                    help="Patches most relevant for the label are blurred away (deletion) or restored (insertion), "
                         "and the image-text cosine similarity is tracked."):
                curves = long_work(("word curves", *model, tuple(labels), tuple(templates), chosen, method),
                                   "Deletion and insertion curves",
                                   lambda progress: curves_figure(checkpoint, asked, image, map_a, chosen, size,
                                                                        progress), "word_curves")
                if curves is not None:
                    st.plotly_chart(curves, config={"displayModeBar": False}, width="stretch")
    return asked
