"""What the sidebar chose for the main map (``MapChoice``) and the main map drawn from it (``MainMap``): read by the
map settings, the word maps, the main view and the share view alike."""

from dataclasses import dataclass

import numpy as np
from streamlit.delta_generator import DeltaGenerator

from vit.explain.views import attention_maps, method_maps


@dataclass(frozen=True, eq=False)
class MapChoice:
    """What the sidebar set: the map (``settings``, 0-based layer) and how every map is drawn."""

    settings: attention_maps.MapSettings
    layer: int  # 1-based, as the sidebar shows it; the heads grid and the matrix read it for every map
    tokens: list[int]  # the query tokens offered (registers hidden or not)
    query_key: str  # the query's widget key: a click on a patch sets it
    outline: int | None  # the query's patch, outlined, where the map has a query
    opacity: float
    colormap: str
    scale: str
    mode: str
    show_grid: bool
    mask_share: float | None  # the attention-mass contour's share, None when off
    class_slot: DeltaGenerator | None = None  # the class picker's place, filled after the forward (``choose_class``)
    word: str | None = None  # a word map's word (``vlm_words.KINDS``), None while no word is typed
    target: str = "all"  # a word's gradient map: "all" image tokens or the clicked "patch"'s (``vlm_words.TARGETS``)


@dataclass(frozen=True, eq=False)
class MainMap:
    """The main map (grid_h, grid_w), a pixel method's on the model's input pixels (H, W) (``grid``: its patch grid),
    and its colours: signed maps diverge around 0."""

    map2d: np.ndarray
    colormap: str
    vmin: float | None
    vmax: float | None
    mask: np.ndarray | None
    caption: str | None = None  # a word map's (Markdown; the others' is ``map_captions.describe_map``'s)
    error: str | None = None  # why a word map is not drawn (one line), shown where its caption goes
    word_parts: tuple | None = None  # a word map's (kind, word, patch or None), which name its download
    grid: tuple[int, int] | None = None  # the patch grid of a pixel method's (H, W) map2d; None: map2d is on it

    def patch_sums(self):
        """``map2d`` on the patch grid (what reads patches: the faithfulness curves, the mass contour): a pixel
        map summed over each patch's pixels, any other as it is."""
        return self.map2d if self.grid is None else method_maps.pixel_patch_sums(self.map2d, self.grid)
