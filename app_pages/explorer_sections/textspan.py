"""Mechanism → TextSpan: a CLIP's late heads described by a text bank's texts over the reference images
(Gandelsman et al. 2024), and one head's map of this image along one of its texts."""

import hashlib

import streamlit as st

from app_pages.explorer_sections.long_work import long_work
from app_pages.explorer_sections.state import Shown
from vit.core.images import ImageError
from vit.core.text import escape_markdown
from vit.explain.mechanism import textspan_run as textspan
from vit.explain.mechanism.textspan import MechanismError, read_texts, reads_probe, texts_from_bytes
from vit.explain.views.overlay import overlay
from vit.sources.vlm.text_tower import TextTowerError, has_text_tower, open_text_tower


def applies(checkpoint) -> bool:
    """Whether the tab is offered: a model with a text tower and no classifier (a CLIP or SigLIP)."""
    return checkpoint.model.head is None and has_text_tower(checkpoint)


@st.cache_data(show_spinner=False, max_entries=8)
def uploaded_bank(data: bytes) -> list[str]:
    return texts_from_bytes(data, "the uploaded text bank")


def textspan_tab(view: Shown, refs) -> None:
    """The tab: settings, a button, the heads' table and a head's map (``refs``: the Mechanism references)."""
    checkpoint, L = view.checkpoint, view.analysis.num_layers
    try:
        textspan.check_model(checkpoint)
        encode = open_text_tower(checkpoint).encode
    except (MechanismError, TextTowerError) as e:
        st.info(escape_markdown(e))
        return
    probe = reads_probe(checkpoint.model)
    if probe:
        st.caption("A SigLIP reads its embedding through an attention-pooling probe, which mixes every layer's tokens "
                   "again: as the authors' compute_siglip.py, the probe's own heads are described.")
    upload = st.file_uploader("Text bank (one description a line; default: the authors' 3,497)", type=["txt"],
                              key="textspan_bank")
    left, middle, right = st.columns(3)
    layers = left.number_input("Last layers", 1, L, min(4, L), key="textspan_layers")
    per_head = middle.number_input("Texts per head", 1, 50, 5, key="textspan_texts")
    rank = right.number_input("Rank of the span", 1, 4096, checkpoint.model.config.hidden_size
                              if probe else 80, key="textspan_rank",
                              help="The texts are projected on the span of each head's top right singular vectors "
                                   "over the images (the authors' --w_ov_rank; the width for a SigLIP's probe).")
    st.caption(f"Over {escape_markdown(refs.label)} (upload reference images in the sidebar: the authors use "
               "ImageNet's 50,000 validation images; a few dozen give a rough description).")
    try:
        texts = uploaded_bank(upload.getvalue()) if upload is not None else read_texts()
    except MechanismError as e:
        st.warning(escape_markdown(e))
        return
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()
    key = ("textspan", view.full_fingerprint, refs.keys, refs.invert, digest, int(layers), int(per_head), int(rank))
    if not st.toggle("Describe the heads", key="textspan_on"):
        return
    try:
        images = list(refs.images())
        result = long_work(key, f"TextSpan: {len(images)} images, then {len(texts):,} texts",
                           lambda progress: textspan.run(checkpoint, encode, images, len(images), texts, int(layers),
                                                         int(per_head), int(rank), progress),
                           "textspan", unit="images and texts")
    except (ValueError, ImageError) as e:  # MechanismError and TextTowerError are ValueErrors
        st.warning(escape_markdown(e))
        return
    if result is None:
        return
    spans, features = result
    st.dataframe({"layer.head": [s.label for s in spans],
                  "variance explained": [f"{s.variance_explained[-1]:.1%}" for s in spans],
                  "texts, best first": ["; ".join(s.texts) for s in spans]}, hide_index=True)
    which = st.selectbox("Head", range(len(spans)), key="textspan_head",
                         format_func=lambda i: spans[i].label)
    chosen = spans[which]
    text = st.selectbox("Along the text", chosen.texts, key="textspan_text")
    try:
        values = textspan.head_map(checkpoint, view.image, chosen.layer, chosen.head, features[text], view.size)
    except (ValueError, MechanismError) as e:
        st.warning(escape_markdown(e))
        return
    st.image(overlay(view.shown, values, view.opacity, view.colormap, view.mode), output_format="PNG")
    how = ("the probe's head output from each token" if chosen.probe else "the final norm frozen at this image, "
           "each share divided by the embedding's norm")
    st.caption(f"What head {chosen.label} writes into this image's embedding from each patch, along the chosen "
               f"text's embedding (the authors' decomposition: {how}): {values.min():.3g} to {values.max():.3g}.")
