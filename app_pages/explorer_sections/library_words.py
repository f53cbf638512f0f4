"""“Ask in words” on the library road's page: a CLIP or SigLIP tower opened as its library builds it (an open_clip
tower on a timm trunk, SigLIP 2's and PE-Core's kind; CoCa's) scores typed labels as open_clip's zero-shot does,
and draws a label's map by the road's own class maps of that label's logit (``vit.explain.views.library.road_prompts``).
The main page's section (``ask_in_words``) reads the port's model; this one reads the library's, sharing its text
tower, its cached answer and maps, its widgets' keys and its part of the page's link (the labels, the label and the
method)."""

import streamlit as st
from PIL import Image

from app_pages.explorer_sections import ask_in_words
from vit.app import drawing
from vit.app.word_figures import scores_figure
from vit.checkpoint import Checkpoint, CheckpointError
from vit.core.inference import TRAINING_SIZE
from vit.core.text import escape_markdown
from vit.explain.language import words
from vit.explain.views.overlay import map_colours, overlay
from vit.sources.vlm.text_tower import has_text_tower, split_labels

# The main page's section's keys (never drawn on the same page): a link's labels, label and method (``share_view``,
# ``ask_in_words.take_link``) set them, and the page's link and the section's settings (``ask_in_words.KEPT``) keep them
LABELS_KEY, TEMPLATE_KEY = ask_in_words.LABELS_KEY, ask_in_words.TEMPLATE_KEY
LABEL_KEY, METHOD_KEY, PICKED_KEY = ask_in_words.LABEL_KEY, ask_in_words.METHOD_KEY, ask_in_words.PICKED_KEY


def applies(checkpoint: Checkpoint) -> bool:
    """Whether the library road's page asks ``checkpoint`` in words: a tower with a text side beside it."""
    return has_text_tower(checkpoint)


def library_words(checkpoint: Checkpoint, fingerprint: tuple, image: Image.Image, digest: str,
                  opacity: float) -> None:
    """The section: the labels, their scores, and the picked label's map by the picked method, drawn over the
    image the model saw."""
    (col_ask, col_scores, col_map), text, _, template = ask_in_words.section_inputs(with_ensemble=False)
    size = TRAINING_SIZE  # the library road reads the model's own input size
    try:
        labels = split_labels(text) if text.strip() else []
        templates = words.templates_for(template, False)
        asked = ask_in_words.ask(fingerprint, digest, size, tuple(labels), tuple(templates), fingerprint,
                                 checkpoint, checkpoint, image) if labels else None
    except (ValueError, CheckpointError) as e:  # bounds, a template without {}, a folder without tokenizer files
        col_ask.error(escape_markdown(" ".join(str(e).split())))
        return
    if asked is None:
        col_scores.caption("Type labels to see how this model scores them and where it sees each.")
        return
    with col_scores:
        st.plotly_chart(scores_figure(asked), config={"displayModeBar": False})
        st.caption(words.describe_scores(asked, False))
    with col_map:
        methods = words.methods(checkpoint.model)
        if not methods:
            st.caption("No map of a label reaches this model (its gradient does not pass back to its pixels); its "
                       "scores are beside, its attention above.")
            return
        for line in ask_in_words._apply_link(labels, methods):  # a link's label and method, once its labels are in
            st.caption(escape_markdown(line))
        if st.session_state.get(LABEL_KEY) not in range(len(labels)):
            st.session_state[LABEL_KEY] = 0
        if st.session_state.get(METHOD_KEY) not in methods:
            st.session_state.pop(METHOD_KEY, None)
        chosen = st.selectbox("Map for", range(len(labels)), key=LABEL_KEY, format_func=lambda i: labels[i])
        method = st.selectbox("Method", list(methods), format_func=methods.get, key=METHOD_KEY)
        st.session_state[PICKED_KEY] = {"wlabel": labels[chosen], "wmethod": method}
        if ask_in_words.link_is_stale():  # the page's link, drawn above, follows the label and method picked here
            st.rerun()
        try:
            label_map = ask_in_words.word_map(fingerprint, digest, size, tuple(labels), tuple(templates), chosen,
                                              method, asked, checkpoint, image)
        except ValueError as e:  # the cost model's refusal, a map this model's layers do not reach
            st.error(escape_markdown(" ".join(str(e).split())))
            return
        cmap, low, high = map_colours(method, label_map, "inferno")
        seen = drawing.model_input_image(image, checkpoint)
        st.image(overlay(seen, label_map, opacity, cmap, vmin=low, vmax=high), output_format="PNG")
        st.caption(words.describe_method(method, labels[chosen], kind=asked.prompts.kind)
                   + " Drawn over the image the model saw. " + drawing.describe_range(label_map))
