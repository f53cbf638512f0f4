"""Compare: the same map from a second checkpoint (another run, or an epoch saved with --save-every) and the
difference of the two (issue 12). Its picker sits in the sidebar, so a change of it reruns the page."""

import streamlit as st

from app_pages.explorer_sections.caches import analyse, class_relevance, load_model, method_map
from app_pages.explorer_sections.state import Shown
from vit.app import catalog, drawing, vlm_words
from vit.checkpoint import CheckpointError
from vit.core.text import escape_markdown
from vit.explain.views import attention_maps, compare
from vit.explain.views.overlay import overlay

PICKER_KEY = "compare_with"
NOTHING = ""  # the picker's first choice: a value, not None (a None selection shows "Choose an option")


def compare_checkpoints(view: Shown, entries: dict, choice: str, map2d, error: str | None = None,
                        grid: tuple[int, int] | None = None) -> None:
    """The picker of a second checkpoint among ``entries`` (and the runs' epochs) but ``choice``, and, with one
    picked, its map of ``view.settings`` beside ``map2d`` and their difference; ``error``: why this checkpoint's
    map is not drawn (``MainMap.error``), said here in one line instead; ``grid``: the patch grid of a pixel
    method's ``(H, W)`` ``map2d`` (``MainMap.grid``), B's then drawn on its own input pixels too."""
    entry = entries[choice]
    image_key, size, image, settings, analysis = view.image_key, view.size, view.image, view.settings, view.analysis
    class_names, kind, fusion, L = view.class_names, settings.kind, settings.fusion, analysis.num_layers
    shown, opacity, colormap, mode = view.shown, view.opacity, view.colormap, view.mode
    show_grid, outline = view.show_grid, view.outline
    compare_entries = {p: e for p, e in entries.items() if p != choice}
    for c in catalog.epoch_candidates():  # per-epoch checkpoints of runs trained with --save-every
        if str(c.path) != choice:
            compare_entries[str(c.path)] = catalog.describe_current(c)
    if st.session_state.get(PICKER_KEY) not in compare_entries:
        st.session_state[PICKER_KEY] = NOTHING
    other = st.sidebar.selectbox(
        "Compare with (a second checkpoint)", [NOTHING, *compare_entries], key=PICKER_KEY,
        format_func=lambda p: "nothing: one checkpoint" if p == NOTHING else compare_entries[p].label,
        help="Another checkpoint (another run, or another epoch of this one saved with --save-every) on the same "
             "image with the same settings, and the difference of the two maps.")
    if other != NOTHING:
        st.subheader("Compare")
        entry_b = compare_entries[other]
        if error is not None:
            st.warning(f"A cannot show this map: {error}")
            return
        try:
            if not entry_b.ok:
                raise CheckpointError(entry_b.error)
            fingerprint_b = catalog.Candidate(entry_b.path, entry_b.source, entry_b.name).fingerprint
            checkpoint_b = load_model(other, fingerprint_b)
            analysis_b = analyse(fingerprint_b, image_key, size, checkpoint_b, image)
            settings_b = compare.settings_for_other(settings, analysis, analysis_b, class_names,
                                                    checkpoint_b.class_names)
            relevance_b = method_map_b = None
            if kind in vlm_words.KINDS:
                raise ValueError("a word's map is drawn for this model alone; its attention, rollout and token-norm "
                                 "maps compare")
            if attention_maps.is_class_map(kind) and not checkpoint_b.class_names:
                raise ValueError("it has no classifier (a feature model), so it has no class-specific map; its "
                                 "attention, rollout, token-norm and flow maps compare")
            class_b = attention_maps.resolved_class(settings_b, analysis_b)
            if kind == "class":
                relevance_b = class_relevance(fingerprint_b, image_key, size, class_b, checkpoint_b, image,
                                              analysis_b.num_tokens)
            if attention_maps.is_method_map(kind):
                method_map_b = method_map(fingerprint_b, image_key, size, kind, class_b, settings_b.query,
                                          settings_b.end_layer, fusion, checkpoint_b, image, settings_b.start_layer,
                                          analysis_b, settings_b.options)  # B with A's sidebar options
            map_b = attention_maps.attention_map(analysis_b, settings_b, relevance_b, method_map_b)
        except (CheckpointError, ValueError) as e:
            st.warning(f"B cannot show this map: {escape_markdown(e)}")
        else:
            col_a, col_b, col_diff = st.columns(3)
            grid_b = None if grid is None else tuple(analysis_b.grid)  # a pixel method's: on B's input pixels
            for column, label, one_entry, one_analysis, one_map, one_grid in (
                    (col_a, "A", entry, analysis, map2d, grid), (col_b, "B", entry_b, analysis_b, map_b, grid_b)):
                top_k = one_analysis.prediction.top_k
                column.image(overlay(shown, one_map, opacity, colormap, mode, show_grid=show_grid,
                                     outline_patch=outline, grid=one_grid), output_format="PNG")
                predicts = (f"Predicts {escape_markdown(top_k[0][0])} ({top_k[0][1]:.0%}). " if top_k
                            else "No classifier (a feature model). ")
                depth = compare.depth_note(settings, settings_b, L, analysis_b.num_layers) if label == "B" else ""
                column.caption(f"{label}: {escape_markdown(one_entry.label)}. {predicts}{depth} "
                               + drawing.describe_range(one_map))
            col_diff.image(compare.difference_overlay(shown, map2d, map_b, opacity, mode), output_format="PNG")
            col_diff.caption(compare.describe_difference(map2d, map_b, (shown.height, shown.width), mode))
