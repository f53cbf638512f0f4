"""``Shown``: the one frozen value every section of the explorer reads (what the page settled this run)."""

from dataclasses import dataclass

import streamlit as st
from PIL import Image

from vit.checkpoint import Checkpoint
from vit.core.inference import InputSize
from vit.explain.views import attention_maps, image_analysis


@dataclass(frozen=True, eq=False)
class Shown:
    """The checkpoint and image of this run, the model's pass over them and the sidebar's map settings.

    ``checkpoint`` may be a copy with heads switched off "in every map" (Mechanism → Ablation); ``full_checkpoint``
    is the model as loaded. The fingerprints and ``image_key`` key the caches.
    """

    checkpoint: Checkpoint
    fingerprint: tuple
    full_checkpoint: Checkpoint
    full_fingerprint: tuple
    model_key: str  # names the widgets whose range depends on the model
    image: Image.Image
    image_key: str
    size: InputSize
    analysis: image_analysis.Analysis
    settings: attention_maps.MapSettings  # the main map's (0-based layer)
    layer: int  # 1-based, as the sidebar shows it; the heads grid and the matrix read it for every map
    tokens: list[int]  # the query tokens offered (registers hidden or not)
    outline: int | None  # the query's patch, outlined, where the map has a query
    shown: Image.Image  # the part of the image the model sees, at display size
    small: Image.Image  # the same, small, for grids of maps
    opacity: float
    colormap: str
    mode: str  # upsampling
    show_grid: bool
    scale: str  # colour scale: own, zero or shared
    mask_share: float | None  # the attention-mass contour's share, None when off
    word: str | None = None  # a word map's word (a VLM's tower), None for other maps or while no word is typed
    target: str = "all"  # a word's gradient map: "all" image tokens or the clicked "patch"'s

    @property
    def class_names(self) -> list[str]:
        return self.checkpoint.class_names


def keep_settings(prefixes: tuple[str, ...]) -> None:
    """Writes back the widget state under keys starting with ``prefixes``: Streamlit forgets the state of a widget
    a run does not draw (a closed tab's toggle, a page stopped early by a rejected upload), and a fragment's own
    rerun forgets its undrawn widgets the same way, so each fragment keeps its own."""
    for key in list(st.session_state):
        if isinstance(key, str) and key.startswith(prefixes):
            st.session_state[key] = st.session_state[key]
