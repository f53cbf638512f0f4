"""Sink diagnostics under the Mechanism view's attention sinks (Phenomena tab): NOP or broadcast, per layer and head
(``vit.explain.mechanism.sink_diagnostics``), as a table and a caption."""

from collections.abc import Sequence

import streamlit as st
from PIL import Image

from vit.app import drawing
from vit.checkpoint import Checkpoint
from vit.core.images import ImageError
from vit.core.inference import InputSize
from vit.core.text import escape_markdown
from vit.explain.mechanism import sink_diagnostics

KEY = "sink_diagnostics"


@st.cache_resource(max_entries=4, show_spinner="Diagnosing the sinks…")
def sink_table(fingerprint: tuple, digest: str, size: InputSize, _checkpoint: Checkpoint, _image: Image.Image
               ) -> sink_diagnostics.SinkTable:
    return sink_diagnostics.sink_table(_checkpoint, _image, size)


def section(checkpoint: Checkpoint, fingerprint: tuple, image: Image.Image, image_key: str, size: InputSize,
            grid: tuple[int, int], prefix: int, names: Sequence[str]) -> None:
    """A toggle, and while it is on the table of every layer and head with a caption (a refusal: one warning)."""
    if not st.toggle("Sink diagnostics: NOP or broadcast (Kempner Institute 2026)", key=KEY,
                     help="Per head, whether its most attended key is a sink (at least 90 % of the queries put half "
                          "their attention on it), and whether that sink is a NOP (its value, after the output "
                          "projection, is small) or a broadcast (the head writes one vector to every token: its "
                          "update has a stable rank near 1)."):
        return
    try:
        table = sink_table(fingerprint, image_key, size, checkpoint, image)
    except (ValueError, ImageError) as e:  # TooManyTokens, MechanismError: one line
        st.warning(escape_markdown(e))
        return
    st.dataframe(table.rows(lambda t: drawing.short_token_label(t, grid, prefix, names), first=1), hide_index=True,
                 key="sink_table")
    counts = table.diagnostics.counts()
    layers, heads = table.diagnostics.token.shape[1:]
    st.caption(f"{counts['NOP sink']} NOP and {counts['broadcast sink']} broadcast sinks, {counts['other sink']} "
               f"other, among {layers} layers × {heads} heads. A sink: its key token gets at least 0.5 of the "
               "attention of 90 % of the queries; NOP: its value norm after the output projection is at most 0.2 of "
               "the other tokens' mean (value ratio); broadcast: at least 0.5, and the head's update has a stable "
               "rank of at most 1.5 (Fesser et al. 2026). Layers and heads count from 1 here, as in the sidebar; "
               "vit.sinks(...).rows() counts them from 0, as vit.ablate.")
