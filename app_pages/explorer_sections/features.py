"""Features: a sparse autoencoder's features of this image, beside the attention maps (issue 36).

An SAE trained on this model's layer opens under the access rule of "Open a path": whatever
``vit.features.formats.open_sae`` opens (a SAELens folder, what ``python -m vit.sae train`` writes; a ViT-Prisma
folder or ``.pt``; a saev ``.pt``, whose block is asked since its file does not say it), by its path on the server or
by Hub id from the server's Hugging Face cache (a missing one downloaded on a button, after its size is shown, as the
sidebar's "Open from the Hub" does). The image's strongest features each have a map over exactly the pixels the model
saw; a click on a patch lists the features active there; the features that drive the shown class are listed by their
share of its logit (``vit.features.attribution``), each with its map of that share per patch and its exemplars; a
feature's exemplars are cropped from the images its ``features.npz`` names. Scaling a feature replaces the layer's
output by the reconstruction with that latent scaled plus the reconstruction error (``vit.features.explore``).

A fragment: picking a feature or a patch, or scaling one for this section alone, reruns this section only. Features
scaled "in every map on this page" change what every section shows: the page is then drawn from a copy of the model
that scales them (``with_features_edited``), and a change of them reruns the page.
"""

from dataclasses import replace
from functools import partial

import streamlit as st
from PIL import Image

from app_pages.explorer_sections import sae_files, view_link
from app_pages.explorer_sections.feature_exemplars import IMAGES_KEY, drivers_exemplars, exemplars
from app_pages.explorer_sections.main_view import PICKER_CONFIG
from app_pages.explorer_sections.sae_files import FOLDER_KEY, LAYER_KEY
from app_pages.explorer_sections.state import Shown, keep_settings
from vit.app import drawing, share
from vit.checkpoint import Checkpoint
from vit.core.images import ImageError
from vit.core.inference import InputSize, predictions_from_logits
from vit.core.text import escape_markdown, visible
from vit.explain.language import words
from vit.explain.views import attention_maps
from vit.explain.views.map_captions import token_label
from vit.explain.views.overlay import jpeg_data_uri, overlay
from vit.features import attribution, explore
from vit.features.autoencoder import SAEError, SparseAutoencoder
from vit.sources import hub

TOGGLE_KEY, COUNT_KEY = "sae_view", "sae_count"
RUN_KEY = "sae_run"  # the SAE run picked, which fills the folder field
KEPT = ("sae_",)  # every key of this section but the chart's and the button's (read-only)
HANDED_KEY = "explorer_sae"  # an SAE folder another page hands over (with ``explorer_checkpoint``, its model)
FEATURE_KEY, TOKEN_KEY, EVERYWHERE_KEY = "sae_feature", "sae_token", "sae_everywhere"
# The chart and the button are not "sae_" keys: keep_settings writes those back, and theirs are read-only.
STRONGEST_KEY, ACTIVE_KEY, PICKER_KEY = "sae_strongest", "sae_active", "features_picker"
DRIVERS_KEY = "sae_drivers"
LINKED_KEY = "sae_linked_feature"  # a link's feature, shown once its SAE is open (opening one resets the feature)
FACTOR_PREFIX = "sae_factor-"  # + latent: the factor that latent is scaled by (1: left as it is)
_OPENED, _RERUN = "sae_opened", "sae_rerun_page"
# (the page's fingerprint, the checkpoint and fingerprint before the features were scaled in every map): the section
# reads the latents and scales them on the model as it was, not on the copy that already scales them.
_BASE = "features_base"
MAX_FACTOR = 100.0


def scales_typed() -> dict[int, float]:
    """{latent: factor} of the features scaled (those left at 1 are not)."""
    return {int(key[len(FACTOR_PREFIX):]): float(value) for key, value in st.session_state.items()
            if isinstance(key, str) and key.startswith(FACTOR_PREFIX) and value is not None and float(value) != 1.0}


def describe_scales(scales: dict[int, float]) -> str:
    return ", ".join(f"feature {latent} × {factor:g}" for latent, factor in sorted(scales.items()))


@st.cache_resource(max_entries=2, show_spinner="Scaling the features in the model…")
def edited_checkpoint(fingerprint: tuple, folder: str, version: tuple, scales: tuple, _checkpoint: Checkpoint,
                      _full_model, _sae: SparseAutoencoder) -> Checkpoint:
    return replace(_checkpoint, model=explore.edited_copy(_checkpoint.model, _sae, dict(scales), fits=_full_model))


def with_features_edited(checkpoint: Checkpoint, fingerprint: tuple, full_checkpoint: Checkpoint,
                         full_fingerprint: tuple, may_open: bool) -> tuple[Checkpoint, tuple]:
    """(checkpoint, fingerprint) the page is drawn with: while features are scaled "in every map on this page", a
    copy of the model that scales them at the SAE's layer, said on the page; else the model as it came."""
    keep_settings(KEPT)  # drawn in the Features section only, which may be closed
    st.session_state.pop(_BASE, None)
    scales = scales_typed()
    if not (may_open and scales and st.session_state.get(TOGGLE_KEY) and st.session_state.get(EVERYWHERE_KEY)):
        return checkpoint, fingerprint
    try:
        sae, folder, version, layer = sae_files.chosen_sae(full_checkpoint, full_fingerprint)
        key = tuple(sorted(scales.items()))
        edited = edited_checkpoint(fingerprint, folder, version, key, checkpoint, full_checkpoint.model, sae)
    except (SAEError, ValueError) as e:
        st.warning(escape_markdown(e))
        return checkpoint, fingerprint
    st.info(f"{escape_markdown(describe_scales(scales))}: scaled at layer {layer}'s output in the prediction and in "
            "every map on this page. Set them back to 1 under Features.")
    edited_fingerprint = (fingerprint, "features-scaled", folder, version, key)
    st.session_state[_BASE] = (edited_fingerprint, checkpoint, fingerprint)
    return edited, edited_fingerprint


# -- what the section computes, once per image and setting ----------------------------------------------------------

@st.cache_resource(max_entries=16, show_spinner="Reading the image's features…")
def image_latents(fingerprint: tuple, digest: str, size: InputSize, folder: str, version: tuple,
                  _checkpoint: Checkpoint, _full_model, _sae: SparseAutoencoder, _image: Image.Image
                  ) -> explore.ImageFeatures:
    x = words.model_input(_checkpoint, _image, size)
    return explore.image_features(_checkpoint.model, _sae, x, fits=_full_model)


@st.cache_resource(max_entries=8, show_spinner="Scaling the features…")
def intervention(fingerprint: tuple, digest: str, size: InputSize, folder: str, version: tuple, scales: tuple,
                 _checkpoint: Checkpoint, _full_model, _sae: SparseAutoencoder, _image: Image.Image
                 ) -> explore.InterventionView:
    x = words.model_input(_checkpoint, _image, size)
    return explore.intervention_view(_checkpoint.model, _sae, x, dict(scales), fits=_full_model)


@st.cache_resource(max_entries=8, show_spinner="Attributing the prediction to the features…")
def prediction_drivers(fingerprint: tuple, digest: str, size: InputSize, folder: str, version: tuple, target: int,
                       _checkpoint: Checkpoint, _full_model, _sae: SparseAutoencoder, _image: Image.Image
                       ) -> attribution.FeatureAttribution:
    x = words.model_input(_checkpoint, _image, size)
    return attribution.feature_attribution(_checkpoint.model, _sae, x, target, fits=_full_model)


@st.cache_resource(max_entries=8, show_spinner=False)
def words_near(fingerprint: tuple, folder: str, version: tuple, labels: tuple, templates: tuple, latents: tuple,
               _checkpoint, _full_model, _sae, _embeddings) -> dict[int, list[tuple[int, float]]]:
    return explore.nearest_words(_checkpoint.model, _sae, _embeddings, list(latents), count=3, fits=_full_model)


# -- the section ------------------------------------------------------------------------------------------------

def _show(key: str) -> None:
    """A feature picked in one of the lists is the one shown."""
    if st.session_state.get(key) is not None:
        st.session_state[FEATURE_KEY] = st.session_state[key]


def _pick_patch(prefix: int) -> None:
    token = drawing.token_from_selection(st.session_state[PICKER_KEY].selection, prefix)
    if token is not None:
        st.session_state[TOKEN_KEY] = token


def _run_picked() -> None:
    if st.session_state.get(RUN_KEY):
        st.session_state[FOLDER_KEY] = st.session_state[RUN_KEY]
    _page_rerun()


def _page_rerun() -> None:
    if st.session_state.get(EVERYWHERE_KEY):
        st.session_state[_RERUN] = True


def _everywhere_changed() -> None:
    st.session_state[_RERUN] = True


def _reset_scales() -> None:
    for key in [k for k in st.session_state if isinstance(k, str) and k.startswith(FACTOR_PREFIX)]:
        del st.session_state[key]
    _page_rerun()


def feature_label(latent: int, value: float) -> str:
    return f"feature {latent} · {value:.3g}"


def link_values() -> dict[str, object]:
    """The section's part of the page's link (``vit.app.share``'s values): the SAE typed, its block, the feature."""
    folder = str(st.session_state.get(FOLDER_KEY) or "").strip()
    if not (st.session_state.get(TOGGLE_KEY) and folder):
        return {}
    feature = st.session_state.get(LINKED_KEY, st.session_state.get(FEATURE_KEY))
    return {"sae": folder, "sae_layer": st.session_state.get(LAYER_KEY) or None,
            "feature": None if feature is None else int(feature)}


def follow_link() -> None:
    """The URL follows the section's SAE, block and feature (this fragment's clicks rerun it alone)."""
    view_link.follow_part(link_values(), ("sae", "sae_layer", "feature"))


def show_linked(d_sae: int) -> None:
    """A link's feature is the one shown, once its SAE is open; one line when the SAE has no such feature."""
    linked = st.session_state.pop(LINKED_KEY, None)
    if linked is not None and linked < d_sae:
        st.session_state[FEATURE_KEY] = linked
    elif linked is not None:
        st.caption(escape_markdown(share.dropped("feature", str(linked), f"this SAE has {d_sae:,} features")))


@st.fragment
def features(view: Shown, may_open: bool, asked: words.Answer | None = None) -> None:
    """The Features section: toggled on, an SAE folder, the image's features and their intervention; the URL
    follows its SAE and feature."""
    section(view, may_open, asked)
    follow_link()


def section(view: Shown, may_open: bool, asked: words.Answer | None) -> None:
    if st.session_state.pop(_RERUN, False):
        st.rerun(scope="app")  # features scaled in every map changed: every section shows them
    keep_settings(KEPT)
    handed = st.session_state.pop(HANDED_KEY, None)  # the Train page's "Open with this SAE in the explorer"
    if handed:
        st.session_state[TOGGLE_KEY], st.session_state[FOLDER_KEY] = True, handed
    if not st.toggle("Features: a sparse autoencoder's features of this image", key=TOGGLE_KEY, on_change=_page_rerun,
                     help="What the model represents at one layer, split into sparse features by an SAE trained on "
                          "it (python -m vit.sae train): each feature's map, its dataset exemplars, and what the "
                          "prediction does when a feature is switched off or scaled."):
        return
    if not may_open:  # vit.runs.access: the rule of "Open a path"
        st.caption("An SAE opens from a folder on the server, as a model by its path does: this server does not let "
                   "this session read its files by path (with a token: enter it on the Train page).")
        return
    st.subheader("Features")
    runs = sae_files.sae_runs()
    if st.session_state.get(RUN_KEY) not in runs or st.session_state[RUN_KEY] != st.session_state.get(FOLDER_KEY):
        st.session_state[RUN_KEY] = None  # another folder typed since, or the run deleted
    if runs:  # an SAE run is no model: listed here, not in the checkpoint picker
        st.selectbox("SAE runs", list(runs), index=None, key=RUN_KEY, format_func=lambda p: f"run {visible(runs[p])}",
                     on_change=_run_picked, placeholder="a completed python -m vit.sae train run",
                     help="The runs folder's completed SAE runs (the Train page's): one picked fills the SAE folder.")
    text = st.text_input(
        "SAE folder", key=FOLDER_KEY, placeholder="/path/to/sae folder or file, or ORG/NAME[/PATH/IN/REPO]",
        on_change=_page_rerun,
        help="An SAE trained on this model, on the server: a SAELens folder (what python -m vit.sae train writes, "
             "with its metrics.json and features.npz for the exemplars), a ViT-Prisma folder (config.json and a .pt) "
             "or .pt, or a saev .pt; or one on the Hugging Face Hub, ORG/NAME[/PATH/IN/REPO][@REVISION], from the "
             "server's Hugging Face cache (downloaded on a button when it is not there yet).").strip()
    base = st.session_state.get(_BASE)
    checkpoint, fingerprint = (base[1], base[2]) if base and base[0] == view.fingerprint else (view.checkpoint,
                                                                                               view.fingerprint)
    try:
        if hub.looks_like_sae_name(text) and hub.cached_sae(text) is None and sae_files.offer_download(text):
            return
        if sae_files.needs_layer(sae_files.sae_source()):
            blocks = view.full_checkpoint.model.config.num_layers
            if not 1 <= (st.session_state.get(LAYER_KEY) or 1) <= blocks:  # typed for a deeper model opened before
                st.session_state.pop(LAYER_KEY)
            st.number_input("Block it reads", 1, blocks, value=None,
                            key=LAYER_KEY, on_change=_page_rerun, placeholder="the block this SAE was trained on",
                            help="saev's files do not say which block's output they were trained on: the residual "
                                 "stream after this block, counted from 1.")
        sae, folder, version, layer = sae_files.chosen_sae(view.full_checkpoint, view.full_fingerprint)
        latents = image_latents(fingerprint, view.image_key, view.size, folder, version, checkpoint,
                                view.full_checkpoint.model, sae, view.image)
    except (SAEError, ValueError, ImageError) as e:
        if st.session_state.get(FOLDER_KEY):
            st.error(escape_markdown(e))
        else:
            st.caption(escape_markdown(e))
        return
    if st.session_state.get(_OPENED) != folder:  # another SAE: its features are others
        for key in [k for k in st.session_state if isinstance(k, str) and k.startswith(FACTOR_PREFIX)]:
            del st.session_state[key]
        for key in (FEATURE_KEY, TOKEN_KEY, STRONGEST_KEY, ACTIVE_KEY, DRIVERS_KEY, IMAGES_KEY):
            st.session_state.pop(key, None)
        st.session_state[_OPENED] = folder
    show_linked(sae.d_sae)
    described = sae_files.metrics_line(folder)
    kind = {"vit-prisma": "ViT-Prisma", "saev": "saev"}.get(sae.info.extra.get("format"), "SAELens")
    st.caption(f"{sae.d_sae:,} features of layer {layer}'s output ({kind}" + (f", k {sae.k}" if sae.k else "")
               + "). " + (described or ""))

    analysis, grid, prefix = view.analysis, latents.patch_grid, latents.num_prefix_tokens  # the image's patches
    count = st.slider("Strongest features shown", 1, 24, 8, key=COUNT_KEY)
    strongest = latents.strongest(count)
    if not strongest:
        st.info("No feature fires on any patch of this image.")
        return
    if st.session_state.get(FEATURE_KEY) is None or not 0 <= st.session_state[FEATURE_KEY] < sae.d_sae:
        st.session_state[FEATURE_KEY] = strongest[0][0]
    shown = int(st.session_state[FEATURE_KEY])
    peaks = dict(strongest)

    cells = drawing.small_multiples(view.small, latents.patch_maps([i for i, _ in strongest]), view.opacity,
                                    view.colormap, view.mode, scale="zero")
    st.image(drawing.heads_grid_image(cells, columns=min(len(cells), 8)), output_format="PNG")
    st.caption("The strongest features' maps, each from 0 to its own peak, in the order of the list below: "
               + ", ".join(str(i) for i, _ in strongest) + ". Pick one to see it large.")
    col_list, col_map, col_effect = st.columns([0.7, 1, 0.9], gap="medium")
    with col_list:
        options = [latent for latent, _ in strongest]
        st.session_state[STRONGEST_KEY] = shown if shown in options else None
        st.radio("The image's strongest features (peak on a patch)", options, key=STRONGEST_KEY,
                 format_func=lambda i: feature_label(i, peaks[i]), on_change=_show, args=(STRONGEST_KEY,))
        token = st.session_state.get(TOKEN_KEY)
        if token is not None and not 0 <= token < prefix + grid[0] * grid[1]:
            token = None
        if token is None:
            st.caption("**Click a patch** of the map to list the features active there.")
        else:
            active = latents.active_at(latents.cell(token))  # a stage layer's cell over the patch
            place = token_label(token, grid, prefix, analysis.prefix_names)
            if not active:
                st.caption(f"No feature is active at {place}.")
            else:
                values = dict(active)
                st.session_state[ACTIVE_KEY] = shown if shown in values else None
                st.radio(f"Active at {place}", list(values), key=ACTIVE_KEY,
                         format_func=lambda i: feature_label(i, values[i]), on_change=_show, args=(ACTIVE_KEY,))
    map2d = latents.patch_maps([shown])[0]  # (gh, gw)
    with col_map:
        drawn = overlay(view.shown, map2d, view.opacity, view.colormap, view.mode, show_grid=view.show_grid,
                        outline_patch=None if token is None or token < prefix else token - prefix, vmin=0.0)
        st.plotly_chart(drawing.patch_picker_figure(view.shown.size, jpeg_data_uri(drawn), grid,
                                                    token if token is not None else -1, prefix, show_grid=False),
                        key=PICKER_KEY, on_select=partial(_pick_patch, prefix), selection_mode="points",
                        config=PICKER_CONFIG, width="stretch")
        st.caption(f"Feature {shown}'s activation on each patch at layer {layer}'s output, from 0 (transparent) to "
                   f"its peak here, {float(map2d.max()):.3g}; over the part of the image the model sees"
                   + (f" (the layer's own {latents.grid[0]}×{latents.grid[1]} grid, each cell over the patches it "
                      "covers)." if latents.image_grid else "."))
        if asked is not None:
            near = words_near(view.full_fingerprint, folder, version, tuple(asked.labels),
                              tuple(asked.prompts.templates), (shown,), checkpoint, view.full_checkpoint.model, sae,
                              asked.prompts.embeddings)[shown]
            st.text("Nearest typed labels: " + ", ".join(f"{asked.labels[i]} ({c:+.2f})" for i, c in near))
            st.caption("The feature's decoder direction read through the model's final norm and projection, its "
                       "cosine with each label's text embedding.")
    with col_effect:
        st.number_input(f"Scale feature {shown} by", -MAX_FACTOR, MAX_FACTOR, value=1.0, step=0.5,
                        key=f"{FACTOR_PREFIX}{shown}", on_change=_page_rerun,
                        help="0 switches it off. The layer's output becomes the SAE's reconstruction with the "
                             "feature scaled plus the reconstruction error, so nothing else changes.")
        scales = scales_typed()
        st.checkbox("In every map on this page", key=EVERYWHERE_KEY, on_change=_everywhere_changed,
                    help="The prediction and every map above and below are drawn from the model with these features "
                         "scaled.")
        if scales:
            st.button("Set every feature back to 1", key="features_reset", on_click=_reset_scales)
            try:
                effect = intervention(fingerprint, view.image_key, view.size, folder, version,
                                      tuple(sorted(scales.items())), checkpoint, view.full_checkpoint.model, sae,
                                      view.image)
            except ValueError as e:
                st.error(escape_markdown(e))
                effect = None
            if effect is not None:
                st.text(f"Scaled: {describe_scales(scales)}")
                if effect.logits_after is not None and view.class_names:
                    [after] = predictions_from_logits(effect.logits_after[None], view.class_names, 5)
                    st.plotly_chart(drawing.predictions_figure(after), config={"displayModeBar": False},
                                    key="sae_prediction")
                    st.caption("The prediction with the features scaled (the page's Prediction shows it as it was, "
                               "unless they are scaled in every map).")
                cells = drawing.small_multiples(view.small, effect.rollouts(), view.opacity, view.colormap,
                                                view.mode, scale="shared")
                st.image(drawing.heads_grid_image(cells, columns=2), output_format="PNG")
                st.caption("The CLS token's attention rollout as it was (left) and with the features scaled (right), "
                           "on one colour scale: every layer after the SAE's attends differently.")
    drivers(view, checkpoint, fingerprint, sae, folder, version, layer, shown, count)
    exemplars(view, sae, folder, version, shown, layer)


def drivers(view: Shown, checkpoint: Checkpoint, fingerprint: tuple, sae: SparseAutoencoder, folder: str,
            version: tuple, layer: int, shown: int, count: int) -> None:
    """The features that drive the shown class: the largest shares of its logit, their maps, one to pick, and each
    one's exemplars."""
    if checkpoint.model.head is None or not view.class_names:
        return
    target = attention_maps.resolved_class(view.settings, view.analysis)
    try:
        result = prediction_drivers(fingerprint, view.image_key, view.size, folder, version, target, checkpoint,
                                    view.full_checkpoint.model, sae, view.image)
    except (SAEError, ValueError) as e:
        st.error(escape_markdown(e))
        return
    name = escape_markdown(visible(view.class_names[target]))
    st.markdown(f"**Features that drive this prediction** ({name})")
    top = result.top(count)
    if not top:
        st.caption(f"No feature raises the {name} logit on this image.")
        return
    shares = dict(top)
    cells = drawing.small_multiples(view.small, result.patch_maps(list(shares)), view.opacity, view.colormap,
                                    view.mode, scale="shared")
    st.image(drawing.heads_grid_image(cells, columns=min(len(cells), 8)), output_format="PNG")
    st.session_state[DRIVERS_KEY] = shown if shown in shares else None
    st.radio("By their share of the logit", list(shares), key=DRIVERS_KEY, horizontal=True,
             format_func=lambda i: f"feature {i} · {shares[i]:+.3g}", on_change=_show, args=(DRIVERS_KEY,))
    totals = result.totals()
    st.caption(f"Each feature's share of the {name} logit ({result.logit:.3g}) at layer {layer}'s output: its "
               "activation times the logit's gradient along its decoder direction, summed over the image's tokens; "
               "the maps, in the order of the list, show it patch by patch on one colour scale. All features "
               f"together {totals['latents']:+.3g}, the decoder bias {totals['bias']:+.3g}, the reconstruction error "
               f"{totals['error']:+.3g}: their sum, {totals['total']:+.3g}, is the gradient times the layer's "
               "output. Pick one to see its map large.")
    drivers_exemplars(view, sae, folder, version, layer, top)
