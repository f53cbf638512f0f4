"""Explore a ViT's attention: a checkpoint and an image in the sidebar, any layer, head, query or map.

The model runs once per (checkpoint, image); changing a layer, head, query or overlay setting
only redraws. The computations are plain functions in ``vit/`` (mostly ``vit.explorer``).
Other pages open a checkpoint here by setting ``st.session_state["explorer_checkpoint"]``
to its path before ``st.switch_page("pages/explorer.py")``, and an image file by setting
``st.session_state["explorer_image"]`` to its path.
"""

from functools import partial
from pathlib import Path

import streamlit as st

from pages.explorer_sections import ask_in_words, mechanism
from pages.explorer_sections.analyses import analyses
from pages.explorer_sections.caches import (
    UPLOAD_TYPES,
    analyse,
    class_relevance,
    display_images,
    load_model,
    method_map,
    model_input_preview,
)
from pages.explorer_sections.checkpoint_picker import pick_checkpoint
from pages.explorer_sections.compare_checkpoints import compare_checkpoints
from pages.explorer_sections.image_picker import pick_image
from pages.explorer_sections.probe_snapshots import probe_snapshots
from pages.explorer_sections.state import Shown
from vit.app import catalog, drawing, explorer, words
from vit.checkpoint import Checkpoint, CheckpointError
from vit.explain.attention import HEAD_FUSIONS
from vit.explain.overlay import UPSAMPLE_MODES, draw_mask_contours, overlay
from vit.images import MAX_SIDE, ImageError
from vit.inference import NonFiniteOutput, input_box, seen_region
from vit.sources.text_tower import has_text_tower
from vit.text import escape_markdown

PICKER_CONFIG = {"displayModeBar": False, "scrollZoom": False, "doubleClick": False}
# Settings that must survive a run in which their widget is not drawn (a rejected upload stops the page
# early; a closed tab hides its toggle): Streamlit forgets such widget state unless it is written back.
KEPT_SETTINGS = ("map_kind", "fusion", "opacity", "colormap", "upsample", "show_grid", "every_layer", "discard_ratio",
                 "colour_scale", "mass_mask", "mask_share", "hide_registers", "invert", "input_side", "keep_aspect",
                 "npz_precision", "npz_layers", "method_kind", "faithfulness_curves", "layer-", "head-", "query-",
                 "class-query-", "end-", "class-", "sample-", "words_",
                 # the Mechanism tabs': heads switched off "in every map" came back on after opening another tab
                 "ablation_mode", "ablation_grid", "ablate", "corrupted-", "patch_positions", "norm_threshold",
                 "tt_register")
for _key in list(st.session_state):
    if isinstance(_key, str) and _key.startswith(KEPT_SETTINGS):
        st.session_state[_key] = st.session_state[_key]


def pick_query(chart_key: str, query_key: str, num_prefix_tokens: int) -> None:
    """A click on the image or the overlay made a patch the query."""
    token = drawing.token_from_selection(st.session_state[chart_key].selection, num_prefix_tokens)
    if token is not None:
        st.session_state[query_key] = token


# -- checkpoint -----------------------------------------------------------------------------------------------

entries, choice, may_open = pick_checkpoint()
entry = entries[choice]
st.title("ViT Attention Explorer")
if not entry.ok:
    st.error(f"This checkpoint cannot be loaded: {escape_markdown(entry.error)}")
    st.stop()
fingerprint = catalog.Candidate(entry.path, entry.source, entry.name).fingerprint
try:
    checkpoint = load_model(choice, fingerprint)
except CheckpointError as e:
    st.error(f"This checkpoint cannot be loaded: {escape_markdown(e)}")
    st.stop()
class_names = checkpoint.class_names
model_key = explorer.image_digest(choice.encode())[:10]  # widgets whose range depends on the model
if checkpoint.metadata.get("preprocessing_guessed"):  # bare weights: say what the images are prepared with
    st.sidebar.warning(escape_markdown(checkpoint.metadata["preprocessing_guessed"]))


@st.cache_resource(max_entries=2, show_spinner="Switching the heads off…")
def ablated_checkpoint(fingerprint: tuple, heads: tuple[tuple[int, int], ...], mode: str, means_key: tuple | None,
                       _checkpoint: Checkpoint, _means) -> Checkpoint:
    return explorer.ablated_checkpoint(_checkpoint, list(heads), mode, _means)


full_checkpoint, full_fingerprint = checkpoint, fingerprint

# -- image ----------------------------------------------------------------------------------------------------

chosen = pick_image(entry, entries, checkpoint, model_key, may_open)
image, image_name, image_key, size, invert = chosen.image, chosen.name, chosen.key, chosen.size, chosen.invert
samples, sample, pre = chosen.samples, chosen.sample, checkpoint.preprocessing

# Mean ablation and test-time registers average over reference images: the ones uploaded here, else the samples.
reference_uploads = []
if st.session_state.get(mechanism.TOGGLE_KEY):
    reference_uploads = st.sidebar.file_uploader(
        "Reference images (mean ablation, test-time registers)", type=UPLOAD_TYPES, accept_multiple_files=True,
        key=mechanism.REFERENCES_KEY,
        help=f"Up to {explorer.MAX_REFERENCE_IMAGES} images a head's mean output is taken over; without them, the "
             "checkpoint's sample images.") or []
refs = mechanism.references(reference_uploads, samples, invert)

# Heads switched off under Mechanism → Ablation, with "every map" on: the whole page is drawn from a copy of the
# model with those heads ablated in its weights; the Ablation tab keeps comparing with the full model.
everywhere = mechanism.heads_off_everywhere(model_key)
mean_ablated = None  # (the full checkpoint, the heads) while heads are mean-ablated everywhere
if everywhere is not None:
    heads_off_labels, everywhere_mode = everywhere
    try:
        heads_off = tuple(explorer.parse_head_labels(heads_off_labels))
        means_key, means_off = mechanism.means_for(everywhere_mode, full_fingerprint, full_checkpoint, image, size,
                                                   refs)
        checkpoint = ablated_checkpoint(fingerprint, heads_off, everywhere_mode, means_key, checkpoint, means_off)
    except (ValueError, ImageError, OSError, explorer.TooManyTokens) as e:
        st.warning(escape_markdown(e))
    else:
        fingerprint = (fingerprint, f"{everywhere_mode}-ablated", heads_off, means_key)
        mean_ablated = (full_checkpoint, heads_off) if everywhere_mode == "mean" else None
        over = f" over {escape_markdown(refs.label)}" if everywhere_mode == "mean" else ""
        st.info(f"Heads {escape_markdown(', '.join(heads_off_labels))} are switched off ({everywhere_mode} "
                f"ablation{over}) in the prediction and in every map on this page. Switch them on again under "
                "Mechanism → Ablation.")

try:
    analysis = analyse(fingerprint, image_key, size, checkpoint, image)
except (explorer.TooManyTokens, ImageError, NonFiniteOutput) as e:
    st.error(escape_markdown(e))
    st.stop()
prediction, grid, prefix = analysis.prediction, analysis.grid, analysis.num_prefix_tokens
L, H, T = analysis.num_layers, analysis.num_heads, analysis.num_tokens
names = analysis.prefix_names  # CLS, DIST, REG 1…R

# -- map settings (only the controls the chosen map uses) ---------------------------------------------------------

with st.sidebar:
    st.header("Attention map")
    kinds = explorer.map_kinds(analysis, bool(class_names))  # no class map without classes; the probe's for SigLIP
    # The newer methods share one entry (a second picker), which keeps the sidebar short.
    choices = [k for k in kinds if k not in explorer.METHOD_MAP_KINDS] + [explorer.MORE_METHODS]
    st.session_state["map_kind"] = explorer.map_choice(  # a model change resets what no longer fits
        st.session_state.get("map_kind"), st.session_state.get("map_default"), choices,
        st.session_state.get("map_model") != model_key)
    st.session_state["map_model"], st.session_state["map_default"] = model_key, choices[0]
    kind = st.radio("Map", choices, key="map_kind",
                    format_func=lambda k: explorer.MAP_KINDS.get(k, explorer.MORE_METHODS_LABEL))
    if kind == explorer.MORE_METHODS:
        methods = [k for k in explorer.METHOD_MAP_KINDS if class_names or k not in explorer.CLASS_MAP_KINDS]
        kind = st.selectbox("Method", methods, format_func=explorer.MAP_KINDS.get, key="method_kind",
                            help="LeGrad, LRP and AttnLRP explain a class; attention flow, like rollout, "
                                 "follows attention and the residual, as a max-flow (slow).")
    controls = explorer.MAP_CONTROLS[kind]
    hide_registers = False
    if prefix > 1:
        hide_registers = st.checkbox(f"Hide the {prefix - 1} register/extra prefix token(s)", key="hide_registers",
                                     help="Leaves them out of the query list and the attention matrix.")
    tokens = explorer.visible_tokens(T, prefix, hide_registers)
    # The class-specific map reads from CLS unless a query is picked for it here: a patch clicked for
    # another map would make it a self-blob.
    query_key = f"class-query-{model_key}" if kind in explorer.CLASS_MAP_KINDS else f"query-{model_key}"
    st.session_state.setdefault(query_key, 0)
    grid_key = f"{query_key}-grid"  # the grid the query was picked on: keep its place when the grid changes
    if st.session_state.get(grid_key) not in (None, tuple(grid)):
        st.session_state[query_key] = explorer.remap_query(st.session_state[query_key], st.session_state[grid_key],
                                                           tuple(grid), prefix)
    st.session_state[grid_key] = tuple(grid)
    if st.session_state[query_key] not in tokens:
        st.session_state[query_key] = 0
    query, layer, head, fusion, discard_ratio, end_layer, class_index = 0, L, None, "mean", 0.0, L, None
    if "class" in controls:
        class_index = st.selectbox(
            "Class", [-1, *range(len(class_names))], key=f"class-{model_key}",
            format_func=lambda c: f"predicted: {class_names[prediction.class_index]}" if c == -1 else class_names[c])
        class_index = None if class_index == -1 else class_index
    if "query" in controls:
        query = st.selectbox("Query token" + (" (for the class map)" if kind in explorer.CLASS_MAP_KINDS else ""),
                             tokens,
                             key=query_key, format_func=lambda t: drawing.token_option(t, grid, prefix, names),
                             help="Whose attention to show: CLS (token 0), another prefix token (DIST, REG) or a "
                                  "patch, numbered row by row. "
                                  "Clicking a patch on the image selects it too.")
    if "layer" in controls:
        st.session_state.setdefault(f"layer-{model_key}", L)
        layer = st.select_slider("Layer", range(1, L + 1), key=f"layer-{model_key}",
                                 help="1 is the first block. Also for the heads grid and the matrix.")
    if "head" in controls:
        head = st.selectbox("Head", [-1, *range(H)], key=f"head-{model_key}",
                            format_func=lambda h: "all heads, fused" if h == -1 else f"head {h + 1}")
        head = None if head == -1 else head
    if "fusion" in controls and (kind not in ("attention", "probe") or head is None):
        fusion = st.radio("Head fusion", HEAD_FUSIONS, horizontal=True, key="fusion",
                          help="How heads combine: for 'all heads, fused' and in the rollout.")
    if "end_layer" in controls:
        st.session_state.setdefault(f"end-{model_key}", L)
        end_layer = st.select_slider("Up to layer", range(1, L + 1), key=f"end-{model_key}",
                                     help="Roll out from layer 1 through this layer.")
    if "discard_ratio" in controls:
        st.session_state.setdefault("discard_ratio", 0.0)
        discard_ratio = st.slider("Discard ratio", 0.0, 0.95, step=0.05, key="discard_ratio",
                                  help="Share of each row's weakest patch attentions set to zero before "
                                       "rolling out; higher values keep only the strongest paths.")
    if "layer" not in controls:  # the heads grid and the matrix still need a layer
        layer = st.session_state.get(f"layer-{model_key}", L)

    st.header("Overlay")
    st.session_state.setdefault("opacity", 0.6)
    opacity = st.slider("Opacity", 0.0, 1.0, step=0.05, key="opacity")
    colormap = st.selectbox("Colour map", drawing.COLORMAPS, key="colormap")
    scale = st.radio("Colour scale", list(drawing.COLOUR_SCALES), format_func=drawing.COLOUR_SCALES.get,
                     key="colour_scale", help="Each map stretched to its own range makes a near-uniform map look "
                                              "structured; 0 to max, or one range for all heads, compares them.")
    mode = st.radio("Upsampling", UPSAMPLE_MODES[::-1], horizontal=True, key="upsample",
                    help="bilinear: smooth between patch centres; nearest: one flat block per patch (exact values).")
    show_grid = st.checkbox("Show the patch grid", key="show_grid")
    masked = st.checkbox("Attention-mass contour (DINO)", key="mass_mask",
                         help="Outline the patches that hold the chosen share of the map's mass, per head in the "
                              "heads grid (Caron et al. 2021).")
    st.session_state.setdefault("mask_share", 0.6)
    share = st.slider("Share of the mass", 0.05, 0.95, step=0.05, key="mask_share", disabled=not masked)

settings = explorer.MapSettings(kind=kind, layer=layer - 1, head=head, fusion=fusion, query=query,
                                discard_ratio=discard_ratio, end_layer=end_layer - 1, class_index=class_index)
relevance = None
if kind == "class":
    try:
        relevance = class_relevance(fingerprint, image_key, size, explorer.resolved_class(settings, analysis),
                                    checkpoint, image)
    except explorer.TooManyTokens as e:
        st.error(str(e))
        st.stop()
method_map2d = None
if kind in explorer.METHOD_MAP_KINDS:
    try:
        method_map2d = method_map(fingerprint, image_key, size, kind, explorer.resolved_class(settings, analysis),
                                  query, end_layer - 1, fusion, checkpoint, image)
    except ValueError as e:  # a model option the method does not support, too many tokens for a max-flow
        st.error(str(e))
        st.stop()
map2d = explorer.attention_map(analysis, settings, relevance, method_map2d)
outline = explorer.patch_of(query, prefix) if "query" in controls else None
map_colormap, vmin, vmax = drawing.map_colours(kind, map2d, colormap)  # signed maps: diverging, around 0
signed = kind in drawing.SIGNED_MAP_KINDS  # their symmetric range is kept whatever the colour scale
if scale == "zero" and not signed:
    vmin, vmax = drawing.colour_range(map2d, scale)
elif scale == "shared" and kind == "attention":  # the range of this layer's heads, as in the heads grid
    vmin, vmax = drawing.colour_range(explorer.head_maps(analysis, query, layer=layer - 1), scale)
mask = explorer.map_mask(map2d, share) if masked else None

# -- image, overlay and prediction ----------------------------------------------------------------------------------

# A model whose preprocessing crops (DINOv2, timm's crop_pct) sees only the centre: everything is drawn over that.
box = input_box(image.size, pre, size)
seen = seen_region(image, pre, size)
shown, shown_uri, small = display_images(f"{image_key}-{tuple(round(v) for v in box)}", seen)
state = Shown(checkpoint=checkpoint, fingerprint=fingerprint, full_checkpoint=full_checkpoint,
              full_fingerprint=full_fingerprint, model_key=model_key, image=image, image_key=image_key, size=size,
              analysis=analysis, settings=settings, layer=layer, tokens=tokens, outline=outline, shown=shown,
              small=small, opacity=opacity, colormap=colormap, mode=mode, show_grid=show_grid, scale=scale,
              mask_share=share if masked else None)
drawn = overlay(shown, map2d, opacity, map_colormap, mode, show_grid=show_grid, outline_patch=outline, vmin=vmin,
                vmax=vmax)
if mask is not None:
    drawn = draw_mask_contours(drawn, mask)
# Enlarged: the image and the map share the page's width (the prediction goes below) and zoom with the wheel,
# so a patch of a 34 x 46 grid is more than the ~6 px it is in the three-column layout.
enlarge = st.toggle("Enlarge the image and the map (wheel to zoom, drag to pan, double-click for the whole image)",
                    key="enlarge_view")
picker_config = drawing.ZOOM_CONFIG if enlarge else PICKER_CONFIG
picker = partial(drawing.patch_picker_figure, fit_width=520 if enlarge else 300, zoomable=enlarge)
if enlarge:
    col_image, col_overlay = st.columns(2, gap="medium")
    col_prediction = st.container()
else:
    col_image, col_overlay, col_prediction = st.columns([1, 1, 0.8], gap="medium")
with col_image:
    st.subheader("Image")
    st.plotly_chart(picker(shown.size, shown_uri, grid, query, prefix), key="patch_picker",
                    on_select=partial(pick_query, "patch_picker", query_key, prefix), selection_mode="points",
                    config=picker_config, width="stretch")
    st.caption(f"**Click a patch** to make it the query. {escape_markdown(image_name)}, {image.width}×{image.height} "
               "px; "
               + drawing.describe_input(analysis, image.size, box))
with col_overlay:
    st.subheader("Attention")
    st.plotly_chart(picker(shown.size, drawing.jpeg_data_uri(drawn), grid, query, prefix, show_grid=False),
                    key="overlay_picker", on_select=partial(pick_query, "overlay_picker", query_key, prefix),
                    selection_mode="points", config=picker_config, width="stretch")
    low, high = drawing.map_range(map2d, vmin, vmax)
    st.plotly_chart(drawing.colorbar_figure(low, high, map_colormap), config={"displayModeBar": False},
                    theme=None, key="colorbar")
    st.caption(drawing.describe_map(settings, analysis, class_names) + " " + drawing.describe_range(map2d, vmin,
                                                                                                    vmax))
    stem = Path(image_name).stem
    download_png, download_npz = st.columns(2)
    download_png.download_button(
        "Overlay (PNG)", on_click="ignore", mime="image/png",
        file_name=drawing.map_file_name(stem, settings, analysis, "overlay.png"),
        data=partial(drawing.overlay_png, seen, map2d, opacity, map_colormap, mode, show_grid, outline, vmin, vmax,
                     mask),
        help=f"At the image's size as decoded (at most {MAX_SIDE:,} px on its long side), over the part the model "
             f"sees: {seen.width}×{seen.height} px.")
    with download_npz.popover("Attentions (.npz)"):
        npz_layers = st.radio("Layers", ["all", "this"], key="npz_layers", horizontal=True,
                              format_func=lambda v: "every layer" if v == "all" else f"layer {layer} only")
        precision = st.radio("Precision", explorer.NPZ_PRECISIONS, key="npz_precision", horizontal=True)
        chosen_layers = None if npz_layers == "all" else [layer - 1]
        mb = (L if chosen_layers is None else 1) * H * T * T * (4 if precision == "float32" else 2) / 2**20
        st.download_button(
            f"Download (~{mb:,.1f} MB raw)", on_click="ignore", mime="application/octet-stream",
            file_name=f"{stem}-attentions-{'all' if chosen_layers is None else f'L{layer}'}-{precision}.npz",
            data=partial(explorer.attentions_npz, analysis, class_names, chosen_layers, precision),
            help="layer_i: heads × tokens × tokens (token 0 is CLS), with logits and class names.")
    if st.toggle("Deletion and insertion curves", key="faithfulness_curves",
                 help="Is this map faithful? Patches are blurred away (deletion) or restored onto a blurred image "
                      "(insertion), most relevant first, and the class probability is tracked: a faithful map "
                      "makes deletion fall and insertion rise fast."):
        st.plotly_chart(drawing.faithfulness_figure(checkpoint, image, map2d,
                                                     explorer.resolved_class(settings, analysis), size=size),
                        config={"displayModeBar": False}, width="stretch")  # the column's width: never clipped
with col_prediction:
    st.subheader("Prediction")
    prediction_box = st.empty()  # a CLIP's: the labels asked in words, which are read further down the page
    if class_names:
        prediction_box.plotly_chart(drawing.predictions_figure(prediction), config={"displayModeBar": False})
    else:
        prediction_box.info("No prediction: this model has no classifier (a feature model such as DINO). Its "
                            "attention maps are shown all the same." + drawing.describe_embedding(analysis))
    note = drawing.prediction_note(analysis)
    if note and class_names:
        st.caption(f":orange[{note}]")
    st.image(model_input_preview(fingerprint, image_key, size, checkpoint, image), output_format="PNG")
    st.caption("The model's input" + (", greyscale" if pre.num_channels == 1 else "")
               + (", inverted." if invert else "."))

# -- ask a CLIP or SigLIP in words (issue 22) ----------------------------------------------------------------------


asked = None  # the labels typed into "Ask in words" (a CLIP's logit lens reads them too)
if has_text_tower(checkpoint):
    st.session_state.pop(ask_in_words.DRAWN_KEY, None)  # drawn below: the section compares what it asks with it
    asked = ask_in_words.ask_in_words(state)
    if asked is not None and not class_names:  # scored labels are this model's prediction: not "no classifier"
        prediction_box.markdown(words.describe_prediction(asked))

# -- analyses (only the open tab is computed) -------------------------------------------------------------------

analyses(state)

# -- mechanism: logit lens, head attribution, ablation, phenomena (issue 24) ------------------------------------

if st.toggle("Mechanism: logit lens, head attribution, ablation, phenomena", key=mechanism.TOGGLE_KEY,
             help="Which component does what: each layer read through the model's own head, each head's direct "
                  "contribution to the class logit, heads switched off, high-norm tokens, massive activations "
                  "and attention sinks."):
    mechanism.mechanism(state, refs, samples, sample, everywhere, mean_ablated, asked)

# -- compare two checkpoints; the run's attention snapshots at any epoch (issue 12) -------------------------------

compare_checkpoints(state, entries, choice, map2d)
probe_snapshots(state, entry)

# Room below the tabs: while a newly opened tab is computed its old content is gone, and a page that
# shrank for that moment made the browser jump up (clicking a tab seemed to scroll to the top).
st.html('<div style="height: 70vh"></div>')
