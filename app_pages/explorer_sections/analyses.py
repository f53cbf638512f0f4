"""Heads / Attention matrix / Distance & entropy: three tabs over the model's attentions, only the open one drawn.

A fragment: switching tabs or showing every layer reruns these tabs alone. A click on a head thumbnail picks the
sidebar's layer and head (what the main map shows), so it reruns the whole page.
"""

import math
from functools import partial

import numpy as np
import streamlit as st

from app_pages.explorer_sections.main_view import PICKER_CONFIG
from app_pages.explorer_sections.state import Shown, keep_settings
from vit.app import drawing
from vit.core.sizes import describe_size
from vit.core.text import escape_markdown
from vit.explain.methods.stage_maps import on_patch_grid
from vit.explain.views import attention_maps, figures
from vit.explain.views.map_captions import token_label
from vit.explain.views.overlay import jpeg_data_uri

TABS_KEY, EVERY_LAYER_KEY, GRID_KEY = "analysis_tab", "every_layer", "heads_grid"
TABS = ("Heads", "Attention matrix", "Distance & entropy")
KEPT = (EVERY_LAYER_KEY,)  # drawn in the Heads tab only
_PICKED = "heads_grid_picked"  # set by a thumbnail click: the page, not this fragment, must rerun


def pick_head(layers: list[int], num_heads: int, layer_key: str, head_key: str, grid_key: str = GRID_KEY) -> None:
    """A click on a head thumbnail shows that layer and head as the one-layer map."""
    cell = drawing.cell_from_selection(st.session_state[grid_key].selection, layers, num_heads)
    if cell is not None:
        st.session_state[layer_key], st.session_state[head_key] = cell[0] + 1, cell[1]
        st.session_state["map_kind"] = "attention"
        st.session_state[_PICKED] = True


@st.fragment
def analyses(view: Shown) -> None:
    """The three analysis tabs of the page's layer (``view.layer``) and query."""
    if st.session_state.pop(_PICKED, False):
        st.rerun(scope="app")  # the sidebar's layer and head changed: every section shows them
    keep_settings(KEPT)
    analysis, settings = view.analysis, view.settings
    grid, prefix, names = analysis.grid, analysis.num_prefix_tokens, analysis.prefix_names
    L, H, T = analysis.num_layers, analysis.num_heads, analysis.num_tokens
    layer, head, query = view.layer, settings.head, settings.query
    heads_tab, matrix_tab, stats_tab = st.tabs(list(TABS), key=TABS_KEY, on_change="rerun")
    query_text = token_label(query, grid, prefix, names)
    if heads_tab.open:
        with heads_tab:
            if analysis.staged:  # a Swin: each stage's heads on its own grid, drawn over the image's patches
                config = view.checkpoint.model.config
                stages = [list(range(config.stage_start(s), config.stage_start(s) + depth))
                          for s, depth in enumerate(config.stage_depths)]
                total = sum(analysis.heads_in(i) for i in range(L))
                every = st.toggle(f"Every layer ({L} layers in {len(stages)} stages, {total} maps)",
                                  key=EVERY_LAYER_KEY, help="Off: the heads of the layer chosen in the sidebar. On: "
                                  "each stage's layers by its heads, a grid per stage.")
                groups = stages if every else [[layer - 1]]
                maps = [on_patch_grid(attention_maps.head_maps(analysis, query, i), grid)  # (H_l, gh, gw) each
                        for rows in groups for i in rows]
            else:
                every = st.toggle(f"Every layer ({L} × {H} = {L * H} maps)", key=EVERY_LAYER_KEY,
                                  help="Off: the heads of the layer chosen in the sidebar.")
                groups = [list(range(L)) if every else [layer - 1]]
                maps = list(attention_maps.head_maps(analysis, query)[groups[0]])  # per layer (H, gh, gw)
            # One call for every map drawn: "all on one colour scale" spans the stages' grids too.
            cells = drawing.small_multiples(view.small, np.concatenate(maps), view.opacity, view.colormap,
                                             view.mode, view.outline, scale=view.scale, mask_share=view.mask_share)
            selected = (layer - 1, head) if settings.kind == "attention" and head is not None else None
            for g, rows in enumerate(groups):
                count = analysis.heads_in(rows[0])  # the stage's heads
                if len(groups) > 1:
                    lh, lw = analysis.layer_grid(rows[0])
                    which = f"layers {rows[0] + 1}–{rows[-1] + 1}" if len(rows) > 1 else f"layer {rows[0] + 1}"
                    st.markdown(f"**Stage {g + 1}**: {which}, {count} heads, on a {lh}×{lw} grid")
                start = sum(analysis.heads_in(i) for group in groups[:g] for i in group)
                sheet = drawing.heads_grid_image(cells[start:start + len(rows) * count], columns=count)
                key = GRID_KEY if len(groups) == 1 else f"{GRID_KEY}_stage{g + 1}"
                st.plotly_chart(drawing.heads_grid_figure(jpeg_data_uri(sheet, quality=85), sheet.size,
                                                           rows, count, selected),
                                key=key, on_select=partial(pick_head, rows, count, f"layer-{view.model_key}",
                                                           f"head-{view.model_key}", key),
                                selection_mode="points", config=PICKER_CONFIG, width="stretch", theme=None)
            scale_text = {"own": "each map on its own colour scale", "zero": "each from 0 to its own max",
                          "shared": "all on one colour scale"}[view.scale]
            st.caption(f"What {query_text} attends to in each head, {scale_text}. **Click a head** to show it "
                       "above (outlined when shown).")
    if matrix_tab.open:
        with matrix_tab:
            heads_text = f"head {head + 1}" if head is not None else f"{settings.fusion} over heads"
            try:
                matrix = attention_maps.layer_attention(analysis, layer - 1, head, settings.fusion)[0].numpy()  # (T, T)
            except ValueError as e:  # past the memory bound even one T x T matrix is not drawn; a Swin's stages
                st.warning(escape_markdown(e))
                matrix = None
            if matrix is not None:
                figure = drawing.attention_matrix_figure(matrix, grid, prefix, view.colormap, query=query,
                                                         tokens=view.tokens, title=f"Layer {layer}, {heads_text}",
                                                         prefix_names=names)
                st.plotly_chart(figure, theme=None)  # Streamlit's chart theme recolours the low end of the colour scale
                pooled = len(view.tokens) > drawing.MATRIX_MAX_CELLS
                st.caption(f"Row i is what token i attends to (each row sums to 1); "
                           f"{drawing.tokens_caption(grid, prefix, names)}. The outlined row is the query, "
                           f"{query_text}." + (f" {len(view.tokens):,} tokens are shown as block averages; hover for "
                                               "the token ranges." if pooled else ""))
    if stats_tab.open:
        with stats_tab:
            distance, entropy = analysis.stats()
            left, right = st.columns(2)
            left.plotly_chart(figures.layer_stats_figure(distance, "mean attention distance (px)",
                                                          "Mean attention distance"))
            left.caption(f"Per head, the attention-weighted distance between a patch and the patches it attends "
                         f"to, in pixels of the {describe_size(*analysis.input_size[::-1])} input, averaged "
                         "over patch queries (ViT paper, Fig. 7). Low: local heads, like convolutions; high: heads "
                         "that integrate the whole image.")
            right.plotly_chart(figures.layer_stats_figure(entropy, "attention entropy (nats)", "Attention entropy"))
            right.caption(f"Per head, the entropy of each token's attention averaged over all {T} tokens: 0 when "
                          f"every token attends to one token only, ln {T} ≈ {math.log(T):.2f} when attention is "
                          "spread evenly." if not analysis.staged else
                          "Per head, the entropy of each token's attention over its window's keys, averaged over the "
                          "layer's own tokens: each stage has its own grid and heads (a missing head is left out).")
