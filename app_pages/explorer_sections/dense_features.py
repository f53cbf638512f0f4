"""What the patches represent (issue 48): the patch tokens' first three principal components as colours, a patch's
cosine similarity to every patch (on this image, a second image and the "Compare with" model) and the
correspondences of two images side by side. The computations are ``vit.explain.views.dense_views``'s; the tokens come
from
the cached analysis, so a click is one product and a redraw; the PCA fits and the matches are kept per settings
(``caches.pca_views``, ``caches.match_view``)."""

import streamlit as st

from app_pages.explorer_sections.caches import UPLOAD_TYPES, analyse, decode_image, load_model, match_view, pca_views
from app_pages.explorer_sections.compare_checkpoints import PICKER_KEY as COMPARE_KEY
from app_pages.explorer_sections.state import Shown
from app_pages.explorer_sections.uploader import file_upload
from vit.app import catalog, drawing
from vit.app import explorer_page as explorer
from vit.checkpoint import CheckpointError
from vit.core.images import ImageError
from vit.core.inference import seen_region
from vit.core.text import escape_markdown
from vit.costs.bounds import TooManyTokens
from vit.explain.views import dense_views
from vit.explain.views.map_captions import token_label
from vit.explain.views.overlay import display_image, jpeg_data_uri, overlay, pca_picture

TOGGLE_KEY = "dense_open"
LAYER_KEY, FOREGROUND_KEY, FLIP_KEY, THRESHOLD_KEY = "dense_layer", "dense_fg", "dense_flip", "dense_threshold"
QUERY_KEY, PICK_KEY, SECOND_KEY, TOP_KEY = "dense_query", "dense_pick", "dense_second", "dense_top"
MODEL_KEY = "dense_model"  # the model the layer and patch were chosen on: another one starts from its own defaults
# Written back each run (keep_settings); the upload and the picker are read-only to session state.
KEPT = (TOGGLE_KEY, LAYER_KEY, FOREGROUND_KEY, FLIP_KEY, THRESHOLD_KEY, QUERY_KEY, TOP_KEY)


def _picked(num_prefix_tokens: int) -> None:
    """A click on the picker selects that patch's token (before the rerun, so the selectbox may be set)."""
    # The chart's state holds its selection under ``.selection`` (as the main view and Features read it).
    token = drawing.token_from_selection(st.session_state[PICK_KEY].selection, num_prefix_tokens)
    if token is not None:
        st.session_state[QUERY_KEY] = token


def _second_image():
    """The second upload as ``(image, key)``, or None (an undecodable one said in one line)."""
    upload = file_upload(st, "Second image (similarity and correspondences on it)", SECOND_KEY, type=UPLOAD_TYPES)
    if upload is None:
        return None
    data = upload.getvalue()
    digest = explorer.image_digest(data)
    try:
        return decode_image(digest, upload.name, False, data), digest
    except ImageError as e:
        st.warning(f"The second image cannot be shown: {escape_markdown(e)}")
        return None


def _compare_model(view: Shown, entries: dict):
    """The "Compare with" checkpoint (one of ``entries``) as ``(checkpoint, its fingerprint, analysis of this
    image)``, or None."""
    entry = entries.get(st.session_state.get(COMPARE_KEY))
    if entry is None:
        return None
    if not entry.ok:
        raise CheckpointError(entry.error)
    fingerprint = catalog.Candidate(entry.path, entry.source, entry.name).fingerprint
    checkpoint = load_model(st.session_state[COMPARE_KEY], fingerprint)
    dense_views.check_dense_fits(checkpoint, view.image, view.size, "The compared model's views")
    return checkpoint, fingerprint, analyse(fingerprint, view.image_key, view.size, checkpoint, view.image)


def dense_features(view: Shown, entries: dict) -> None:
    """The section, under its toggle; ``entries``: the checkpoints the page lists ("Compare with" picks one)."""
    if not st.toggle("What the patches represent: PCA colours, patch similarity, correspondences", key=TOGGLE_KEY,
                     help="The patch tokens of one layer (after the model's final norm, CLS and registers left out): "
                          "their first three principal components as colours, a patch's cosine similarity to every "
                          "patch, and the patches two images match."):
        return
    checkpoint, analysis, shown = view.checkpoint, view.analysis, view.shown
    L, prefix = analysis.num_layers, analysis.num_prefix_tokens
    if st.session_state.get(MODEL_KEY, view.model_key) != view.model_key:  # another model: its own defaults
        for key in (LAYER_KEY, QUERY_KEY):
            st.session_state.pop(key, None)
    st.session_state[MODEL_KEY] = view.model_key
    try:
        dense_views.check_dense_fits(checkpoint, view.image, view.size)
    except TooManyTokens as e:
        st.error(escape_markdown(e))
        return
    if st.session_state.get(LAYER_KEY) not in range(L):
        st.session_state[LAYER_KEY] = L - 1
    layer = st.selectbox("Layer (its output after the final norm)", range(L), key=LAYER_KEY,
                         format_func=lambda i: f"{i + 1}" + (" (last)" if i == L - 1 else ""))
    second = _second_image()
    analysis_2 = None
    if second is not None:
        try:
            dense_views.check_dense_fits(checkpoint, second[0], view.size, "The second image's views")
            analysis_2 = analyse(view.fingerprint, second[1], view.size, checkpoint, second[0])
        except (TooManyTokens, ImageError, ValueError) as e:
            st.warning(f"The second image cannot be shown: {escape_markdown(e)}")
    seen_2 = None if analysis_2 is None else seen_region(second[0], checkpoint.preprocessing, view.size)

    st.markdown("**PCA colours**")
    fg = st.toggle("Foreground only (first component's threshold; refit on it)", key=FOREGROUND_KEY)
    st.session_state.setdefault(THRESHOLD_KEY, 0.0)
    threshold = st.number_input("Threshold on the first component", step=0.1, key=THRESHOLD_KEY, disabled=not fg)
    flip = st.checkbox("Foreground below the threshold", key=FLIP_KEY, disabled=not fg)
    analyses_shown = [analysis] + ([analysis_2] if analysis_2 is not None else [])
    digests = (view.image_key,) + ((second[1],) if analysis_2 is not None else ())
    try:
        views = pca_views(view.fingerprint, digests, view.size, layer, threshold if fg else None, fg and flip,
                          checkpoint, analyses_shown)
    except ValueError as e:
        st.warning(escape_markdown(e))
    else:
        columns = st.columns(len(views))
        for column, pca_view, seen in zip(columns, views, [shown, seen_2], strict=False):
            column.image(pca_picture(display_image(seen), pca_view.colours), output_format="PNG")
        st.caption("Fitted on " + ("both images together, so a colour means the same in both" if len(views) > 1
                                   else "this image") + f"; layer {layer + 1}"
                   + (f", on its own {'×'.join(map(str, dense_views.layer_grid(analysis, layer)))} grid "
                      "(its stage's; through the final norm in the last stage only)." if analysis.staged else "."))

    st.markdown("**Patch similarity** (click a patch)")
    tokens = list(range(prefix, analysis.num_tokens))
    if st.session_state.get(QUERY_KEY) not in tokens:
        st.session_state[QUERY_KEY] = tokens[len(tokens) // 2]
    query = st.selectbox("Patch", tokens, key=QUERY_KEY,
                         format_func=lambda t: drawing.token_option(t, analysis.grid, prefix))
    vector = dense_views.query_vector(checkpoint, analysis, query, layer)
    map2d = dense_views.similarity_map(checkpoint, analysis, vector, layer)
    picture = overlay(shown, map2d, view.opacity, view.colormap, outline_patch=query - prefix)
    figure = drawing.patch_picker_figure(picture.size, jpeg_data_uri(picture), analysis.grid, query, prefix,
                                         show_grid=False, fit_width=picture.size[0])
    st.plotly_chart(figure, key=PICK_KEY, on_select=lambda: _picked(prefix), selection_mode="points",
                    config={"displayModeBar": False})
    st.caption(f"Cosine similarity to {escape_markdown(token_label(query, analysis.grid, prefix))}: "
               + drawing.describe_range(map2d))
    if analysis_2 is not None:
        map_2 = dense_views.similarity_map(checkpoint, analysis_2, vector, layer)
        st.image(overlay(display_image(seen_2), map_2, view.opacity, view.colormap), output_format="PNG")
        st.caption("The same patch's token against every patch of the second image: " + drawing.describe_range(map_2))
    try:
        other = _compare_model(view, entries)
    except (CheckpointError, TooManyTokens, ValueError) as e:
        st.warning(f"The compared model cannot be shown: {escape_markdown(e)}")
        other = None
    if other is not None:
        checkpoint_b, _, analysis_b = other
        place = dense_views.same_place(query - prefix, analysis.grid, analysis_b.grid)
        vector_b = dense_views.query_vector(checkpoint_b, analysis_b, place + analysis_b.num_prefix_tokens)
        map_b = dense_views.similarity_map(checkpoint_b, analysis_b, vector_b)
        st.image(overlay(shown, map_b, view.opacity, view.colormap, outline_patch=place), output_format="PNG")
        st.caption("The compared model (its last layer), the same place on its own grid: "
                   + drawing.describe_range(map_b))

    st.markdown("**Correspondences** (mutual nearest neighbours)")
    if analysis_2 is None and other is None:
        st.caption("Upload a second image above, or pick a model under Compare with, to match patches.")
        return
    st.session_state.setdefault(TOP_KEY, 30)
    top = st.slider("Matches shown (the most similar)", 1, 200, key=TOP_KEY)
    if analysis_2 is not None:
        pair = (checkpoint, analysis_2, seen_2, layer, (view.fingerprint, second[1]))
    else:
        pair = (other[0], other[2], seen_region(view.image, other[0].preprocessing, view.size), None,
                (other[1], view.image_key))
    try:
        matches = match_view((view.fingerprint, view.image_key), pair[4], view.size, top, layer, pair[3],
                             checkpoint, analysis, pair[0], pair[1])
    except ValueError as e:
        st.warning(escape_markdown(e))
        return
    seen_a = seen_region(view.image, checkpoint.preprocessing, view.size)
    st.image(dense_views.matches_picture(seen_a, pair[2], matches.grid_a, matches.grid_b, matches.a, matches.b,
                                   image_grids=(analysis.grid, pair[1].grid)), output_format="PNG")
    st.caption(f"{len(matches.a)} mutual matches shown, cosine {matches.score.min():.2f} to {matches.score.max():.2f}"
               if len(matches.a) else "No mutual matches.")
