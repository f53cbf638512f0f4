"""The main view: the image (click a patch to make it the query), the map over it with its downloads and
curves, and the prediction."""

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import streamlit as st
from PIL import Image
from streamlit.delta_generator import DeltaGenerator

from app_pages.explorer_sections.caches import model_input_preview
from app_pages.explorer_sections.long_work import long_work
from app_pages.explorer_sections.map_choice import MainMap
from app_pages.explorer_sections.state import Shown
from vit.app import drawing, vlm_words
from vit.app import explorer_page as explorer
from vit.core.images import MAX_SIDE
from vit.core.sizes import describe_size
from vit.core.text import escape_markdown
from vit.explain.views import attention_maps, map_captions
from vit.explain.views.overlay import jpeg_data_uri

PICKER_CONFIG = {"displayModeBar": False, "scrollZoom": False, "doubleClick": False}
FIT_WIDTH, ENLARGED_WIDTH = 300, 520  # the image's and the map's width in px: in three columns, enlarged
ENLARGE_KEY = "enlarge_view"
LINKED_KEY = "linked_pickers"  # the enlarged image and overlay, one figure
KEPT = ("npz_precision", "npz_layers", "faithfulness_curves")  # kept by the page while not drawn (a closed popover)


def pick_query(chart_key: str, query_key: str, num_prefix_tokens: int) -> None:
    """A click on the image or the overlay made a patch the query."""
    token = drawing.token_from_selection(st.session_state[chart_key].selection, num_prefix_tokens)
    if token is not None:
        st.session_state[query_key] = token


@dataclass(frozen=True, eq=False)
class Places:
    """The main view's columns, laid out with the image before the model runs (``lay_out``); none when enlarged."""

    enlarge: bool
    image: DeltaGenerator | None = None
    overlay: DeltaGenerator | None = None
    prediction: DeltaGenerator | None = None


def lay_out(shown: Image.Image, shown_uri: str, grid: tuple[int, int], query: int, prefix: int,
            query_key: str, heading: str) -> Places:
    """The view's toggle, its three columns and the image in the first, drawn while the model runs: the browser
    draws them meanwhile rather than after the forward. Enlarged, the image and the map are one figure, drawn
    after. ``heading``: the map's column's (``drawing.map_heading``)."""
    # Enlarged: the image and the map share the page's width (the prediction goes below) and zoom with the wheel,
    # so a patch of a 34 x 46 grid is more than the ~6 px it is in the three-column layout; they are one figure
    # whose axes match, so zooming or panning one zooms the other to the same window.
    enlarge = st.toggle("Enlarge the image and the map (wheel to zoom, drag to pan, double-click for the whole image)",
                        key=ENLARGE_KEY)
    if enlarge:
        return Places(True)
    col_image, col_overlay, col_prediction = st.columns([1, 1, 0.8], gap="medium")
    with col_image:
        st.subheader("Image")
        st.plotly_chart(drawing.patch_picker_figure(shown.size, shown_uri, grid, query, prefix, fit_width=FIT_WIDTH),
                        key="patch_picker", on_select=partial(pick_query, "patch_picker", query_key, prefix),
                        selection_mode="points", config=PICKER_CONFIG, width="stretch")
    col_overlay.subheader(heading)
    col_prediction.subheader("Prediction")
    return Places(False, col_image, col_overlay, col_prediction)


def map_caption(view: Shown, main: MainMap) -> str:
    """The main map's caption, as Markdown: what it shows (a word map's own, else ``map_captions.describe_map``'s), then
    its colours' range."""
    what = main.caption if main.caption is not None else map_captions.describe_map(
        view.settings, view.analysis, view.class_names, dict(view.settings.options), main.grid is not None)
    return what + " " + drawing.describe_range(main.map2d, main.vmin, main.vmax)


def main_view(view: Shown, main: MainMap, places: Places, query_key: str, image_name: str, seen: Image.Image,
              shown_uri: str, box: tuple[float, ...], invert: bool):
    """Draws the view into ``places``; returns the Prediction box, which a CLIP's labels asked in words fill further
    down."""
    checkpoint, fingerprint, image, image_key, size = (view.checkpoint, view.fingerprint, view.image, view.image_key,
                                                       view.size)
    analysis, settings, class_names, layer = view.analysis, view.settings, view.class_names, view.layer
    prediction, grid, prefix = analysis.prediction, analysis.grid, analysis.num_prefix_tokens
    L, H, T = analysis.num_layers, analysis.num_heads, analysis.num_tokens
    shown, opacity, mode, show_grid, outline, query = (view.shown, view.opacity, view.mode, view.show_grid,
                                                       view.outline, settings.query)
    map2d, map_colormap, vmin, vmax, mask = main.map2d, main.colormap, main.vmin, main.vmax, main.mask
    pre = checkpoint.preprocessing
    # A pixel method's map (main.grid: its patch grid) is drawn at the model's input pixels, the grid's lines over it
    drawn = drawing.overlay_image(shown, map2d, opacity, map_colormap, mode, show_grid, outline, vmin, vmax, mask,
                                  main.grid)
    picker = partial(drawing.patch_picker_figure, fit_width=ENLARGED_WIDTH if places.enlarge else FIT_WIDTH,
                     zoomable=places.enlarge)
    overlay_figure = picker(shown.size, jpeg_data_uri(drawn), grid, query, prefix, show_grid=False)
    if places.enlarge:
        col_image, col_overlay = st.columns(2, gap="medium")
        col_image.subheader("Image")
        col_overlay.subheader(drawing.map_heading(settings.kind))
        st.plotly_chart(drawing.linked_pickers_figure(picker(shown.size, shown_uri, grid, query, prefix),
                                                      overlay_figure), key=LINKED_KEY,
                        on_select=partial(pick_query, LINKED_KEY, query_key, prefix), selection_mode="points",
                        config=drawing.ZOOM_CONFIG, width="content")  # its own width: each side the image's aspect
        col_image, col_overlay = st.columns(2, gap="medium")
        col_prediction = st.container()
        col_prediction.subheader("Prediction")
    else:
        col_image, col_overlay, col_prediction = places.image, places.overlay, places.prediction
        with col_overlay:
            st.plotly_chart(overlay_figure, key="overlay_picker",
                            on_select=partial(pick_query, "overlay_picker", query_key, prefix),
                            selection_mode="points", config=PICKER_CONFIG, width="stretch")
    with col_image:
        st.caption(f"**Click a patch** to make it the query. {escape_markdown(image_name)}, "
                   f"{describe_size(image.width, image.height)}; " + drawing.describe_input(analysis, image.size, box))
    with col_overlay:
        if main.error is not None:  # a map the model cannot give (a word's, a bound's refusal): why, in one line
            st.error(main.error)
        else:
            low, high = drawing.map_range(map2d, vmin, vmax)
            st.html(drawing.colorbar_html(low, high, map_colormap))
            st.caption(map_caption(view, main))
        stem = Path(image_name).stem
        download_png, download_npz = st.columns(2)
        download_png.download_button(
            f"{drawing.map_heading(settings.kind)} overlay (PNG)", on_click="ignore", mime="image/png",
            file_name=vlm_words.file_name(stem, *main.word_parts) if main.word_parts is not None
            else drawing.map_file_name(stem, settings, analysis, "overlay.png", class_names),
            data=partial(drawing.overlay_png, seen, map2d, opacity, map_colormap, mode, show_grid, outline, vmin, vmax,
                         mask, main.grid), disabled=main.error is not None,
            help=f"At the image's size as decoded (at most {MAX_SIDE:,} px on its long side), over the part the model "
                 f"sees: {describe_size(seen.width, seen.height)}.")
        # The model's attention weights whatever the map is: named so, beside a Grad-CAM's or a lens's overlay
        with download_npz.popover("Attention weights (.npz)",
                                  help="Every head's attention matrix, as the model computed it for this image; not "
                                       "the map shown, unless it is one layer's attention (its values: the overlay, "
                                       "or the exported view, which hovers them)."):
            npz_layers = st.radio("Layers", ["all", "this"], key="npz_layers", horizontal=True,
                                  format_func=lambda v: "every layer" if v == "all"
                                  else drawing.npz_layer_label(layer))
            precision = st.radio("Precision", attention_maps.NPZ_PRECISIONS, key="npz_precision", horizontal=True)
            chosen_layers = None if npz_layers == "all" else [layer - 1]
            mb = (L if chosen_layers is None else 1) * H * T * T * (4 if precision == "float32" else 2) / 2**20
            try:
                attention_maps.check_npz_fits(analysis, chosen_layers, precision)
            except ValueError as e:  # refused before the button, not when its data is built (too big; Swin)
                st.caption(escape_markdown(e))
            else:
                st.download_button(
                    f"Download (~{mb:,.1f} MB raw)", on_click="ignore", mime="application/octet-stream",
                    file_name=f"{stem}-attentions-{'all' if chosen_layers is None else f'L{layer}'}-{precision}.npz",
                    data=partial(attention_maps.attentions_npz, analysis, class_names, chosen_layers, precision),
                    help="layer_i: heads × tokens × tokens (token 0 is CLS) of layer i + 1 as counted here "
                         "(the file counts from 0), with logits and class names.")
        if class_names and main.error is None and st.toggle("Deletion and insertion curves", key="faithfulness_curves",
                     help="Is this map faithful? Patches are blurred away (deletion) or restored onto a blurred image "
                          "(insertion), most relevant first, and the class probability is tracked: a faithful map "
                          "makes deletion fall and insertion rise fast."):
            chosen_class = attention_maps.resolved_class(settings, analysis)
            patches = main.patch_sums()  # the curves remove and restore patches, most relevant first
            curves = long_work(("curves", fingerprint, image_key, size, chosen_class,
                                explorer.image_digest(patches.tobytes())), "Deletion and insertion curves",
                               lambda progress: drawing.faithfulness_figure(checkpoint, image, patches, chosen_class,
                                                                            size=size, progress=progress), "curves")
            if curves is not None:  # else its progress and a Stop button are drawn
                st.plotly_chart(curves, config={"displayModeBar": False}, width="stretch")  # the column's width
    with col_prediction:
        prediction_box = st.empty()  # a CLIP's: the labels asked in words, which are read further down the page
        if class_names:
            prediction_box.plotly_chart(drawing.predictions_figure(prediction), config={"displayModeBar": False})
        elif vlm_words.no_prediction(checkpoint):  # a VLM's tower: its words are asked below, not classes here
            prediction_box.info(vlm_words.no_prediction(checkpoint))
        else:
            prediction_box.info("No prediction: this model has no classifier (a feature model such as DINO). Its "
                                "attention maps are shown all the same." + drawing.describe_embedding(analysis))
        note = drawing.prediction_note(analysis)
        if note and class_names:
            st.caption(f":orange[{note}]")
        st.image(model_input_preview(fingerprint, image_key, size, checkpoint, image), output_format="PNG")
        st.caption("The model's input" + (", greyscale" if pre.num_channels == 1 else "")
                   + (", inverted." if invert else "."))
    return prediction_box
