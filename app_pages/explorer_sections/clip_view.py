"""The explorer for a video model (VideoMAE): a clip in the sidebar (a video file, an animated GIF or a zip of
frames), its predicted classes, a map (attention by layer and head, rollout, norms, one class's class map, LeGrad or
AttnLRP) on the frame the time slider shows, a query patch picked by a click on that frame or by number, every
sampled frame with its map in a strip, and the frames overlaid as an animated GIF. The time slider has a Play
(``app_pages.player``, as the Train page's snapshots); the view follows in the URL and is offered as a link and as an
offline HTML file (``share_view``, ``vit.app.export.clip_html``), the clip named by its hash as image links name an
upload. The maps are ``vit.explain.views.video``'s, the clip's forward run once per upload; past ``PROGRESS_TOKENS``
tubelets the forward and a class's map are long work (progress by block and a Stop button, as on the image page)."""

from dataclasses import dataclass
from functools import partial

import streamlit as st

from app_pages import player
from app_pages.explorer_sections import caches, plotly_preload, share_view, view_link
from app_pages.explorer_sections.caches import (
    ANALYSIS_CACHE_BYTES,
    IMAGE_CACHE_BYTES,
    PROGRESS_TOKENS,
    byte_cache,
    computed,
)
from app_pages.explorer_sections.long_work import long_work
from app_pages.explorer_sections.uploader import file_upload
from vit.app import clip_view as clips
from vit.app import drawing, share
from vit.app import explorer_page as explorer
from vit.app.export import ClipView, clip_html
from vit.checkpoint import Checkpoint
from vit.core.clips import ClipError, SampledClip
from vit.core.text import escape_markdown, file_name_part, visible
from vit.explain.views import mechanism_views, video
from vit.explain.views.overlay import display_image
from vit.explain.views.video import CLIP_KIND_LABELS as MAP_KINDS

UPLOAD_KEY = "explorer_clip_upload"
MAP_KEY, OPACITY_KEY = "clip_map", "clip_opacity"  # PE video's clip page reads them too (library_clip_view)
UPLOAD_TYPES = caches.CLIP_UPLOAD_TYPES
FRAME_KEY = "clip_frame"  # the time slider: the shown sampled frame, counted from 1
PLAY_KEY = "clip_play"  # its Play toggle (``app_pages.player``)
PICKED_KEY = "clip_query_picked"  # a click on the frame picked a query: the whole page runs again for its maps
CLICKED_KEY = "clip_query_clicked"  # ... and the page's query is a patch (PE video's may be each frame's CLS)
PICKER_KEY = "clip_frame_picker"
PICKER_CONFIG = {"displayModeBar": False, "scrollZoom": False, "doubleClick": False}
# kept by the page while not drawn (a rejected upload stops the page before the sidebar's map settings)
KEPT = ("clip_map", "clip_layer-", "clip_legrad_from-", "clip_class-", "clip_head-", "clip_query_", "clip_opacity",
        "clip_pca", "clip_heads_off-")


def query_keys(model_key: str) -> tuple[str, str, str]:
    return tuple(f"clip_query_{axis}-{model_key}" for axis in ("frame", "row", "col"))


def _pick_query(model_key: str, frame: int, grid: tuple[int, int]) -> None:
    """A click on the shown frame made that frame's patch the query."""
    picked = clips.query_from_selection(st.session_state[PICKER_KEY].selection, frame, grid)
    if picked is not None:
        for key, value in zip(query_keys(model_key), picked, strict=True):
            st.session_state[key] = value + 1  # the number inputs count from 1
        st.session_state[PICKED_KEY] = True  # the picker is in the frame's fragment: its maps are the page's
        st.session_state[CLICKED_KEY] = True


def refuse(what: str, error: Exception) -> None:
    """One line, the user's text (file names) escaped, and the page stops."""
    st.error(f"{what}: {escape_markdown(visible(str(error).splitlines()[0] if str(error) else repr(error)))}")
    st.stop()


_refuse = refuse


def given_clip(uploaded, linked, wanted: int, ends: bool = False) -> tuple[str, str, SampledClip]:
    """The clip a video page reads: the upload (kept for this view's link) or else the link's, its digest, and
    ``wanted`` frames sampled from it (``ends``: its first and last among them); one line and the page stops for a
    clip it cannot use. Every video page (ours and the library road's) reads its clip here."""
    if uploaded is not None:
        data, name = uploaded.getvalue(), uploaded.name
        share_view.keep_upload(data, name)  # a link to this view names it
    else:
        data, name = linked.data, linked.name or "the linked clip"
    digest = explorer.image_digest(data)
    try:
        return name, digest, caches.sampled_clip(digest, name, data, wanted, ends=ends)
    except ClipError as e:
        refuse("Cannot use this clip", e)


@dataclass(frozen=True, eq=False)
class FrameView:
    """What the shown frame's part of the page draws (a fragment: the time slider and Play redraw it alone)."""

    model_key: str
    grid: tuple[int, int]
    tubelet: int
    query: tuple[int, int, int] | None
    overlays: list
    explained: video.ClipExplanation
    sampled: object  # vit.core.clips.SampledClip
    name: str  # the clip's file name
    what: str  # the map's description, for the caption
    tubelets: str  # "4 × 14 × 14 tubelets of 2 frames"
    values: dict  # the view as ``vit.app.share``'s values, but the frame
    shown: dict  # those and the pickers' first options, for the export's settings
    model_name: str
    prediction: object | None
    class_names: list
    checkpoint: Checkpoint


def frame_view_part(view: FrameView) -> None:
    """The shown frame as a patch picker, the time slider and its Play, the caption, and the view's link and HTML
    export (both name the shown frame); the URL follows the view."""
    if st.session_state.pop(PICKED_KEY, False):
        st.rerun()  # a clicked query: every frame's map changes, and the sidebar's query
    frames, gw = len(view.overlays), view.grid[1]
    shown_place = st.empty()  # the frame the slider below chooses
    if not 1 <= st.session_state.get(FRAME_KEY, 1) <= frames:  # another model's clip was longer
        st.session_state[FRAME_KEY] = 1
    st.session_state.setdefault(FRAME_KEY, 1)
    player.advance(FRAME_KEY, range(1, frames + 1), PLAY_KEY)
    slider, play = st.columns([5, 1], vertical_alignment="bottom")
    position = slider.slider("Frame", 1, frames, key=FRAME_KEY,
                             help=f"The sampled frame shown above; a tubelet's value covers its {view.tubelet} "
                                  "frames.") - 1
    player.play_toggle(play, PLAY_KEY, help="Step through the sampled frames, one per second.")
    query, query_patch = view.query, None
    if query is not None and query[0] // view.tubelet == position // view.tubelet:
        query_patch = query[1] * gw + query[2]
    shown_place.plotly_chart(
        clips.frame_picker_figure(display_image(view.overlays[position]), view.explained.map[position], position,
                                  query_patch),
        key=PICKER_KEY, on_select=partial(_pick_query, view.model_key, position, view.grid),
        selection_mode="points", config=PICKER_CONFIG, width="stretch")
    low, high = float(view.explained.map.min()), float(view.explained.map.max())
    sampled = view.sampled
    caption = (f"{view.what}. Sampled frame {position + 1} of {frames} (frame {sampled.indices[position]} of "
               f"{visible(view.name)}); {view.tubelets}; one colour scale over the clip, {low:.4g} to {high:.4g}.")
    st.caption(escape_markdown(caption + " Click a patch to make it the query."))
    values = {**view.values, "frame": position + 1}
    view_link.follow({k: v for k, v in values.items() if v is not None})
    link, export = st.columns(2)
    view_link.link_popover(link, {k: v for k, v in values.items() if v is not None}, what="clip")
    export.download_button(
        "Export this view (HTML)", on_click="ignore", mime="text/html",
        file_name=f"{file_name_part(view.name.rsplit('.', 1)[0])}-view.html",
        data=partial(_export, view, position, query_patch, caption, (low, high)),
        help="One self-contained .html file: every sampled frame with its map (a player with Play), the shown frame "
             "(hover a patch for its value) with its colour bar and caption, the prediction and these settings. "
             "Opens offline.")


def _export(view: FrameView, position: int, query_patch: int | None, caption: str,
            span: tuple[float, float]) -> bytes:
    settings = {"Model": view.model_name, "Clip": view.name,
                **share.describe({**view.shown, "frame": position + 1},
                                 size_label=view.checkpoint.preprocessing.size_label, grid=view.grid,
                                 num_prefix_tokens=0, prefix_names=[], class_names=view.class_names,
                                 predicted=0 if view.prediction is None else view.prediction.class_index)}
    layer = {"rollout": "Up to layer", "class": "Up to layer", "legrad": "From layer"}.get(view.values["map"])
    if layer is not None and share.LABELS["layer"] in settings:  # as the clip's sidebar names its slider
        settings = {layer if k == share.LABELS["layer"] else k: v for k, v in settings.items()}
    labels = [clips.frame_label(i, view.sampled.indices) for i in range(len(view.overlays))]
    page = clip_html(ClipView(
        title=f"{view.name} — {view.model_name}", overlays=view.overlays, maps=view.explained.map, labels=labels,
        caption=caption, shown=position, query_patch=query_patch, vmin=span[0], vmax=span[1],
        prediction=view.prediction, settings=settings))
    return page.encode("utf-8")


@st.cache_resource(max_entries=2, show_spinner="Switching the heads off…")
def _heads_off(fingerprint: tuple, heads: tuple[tuple[int, int], ...], _checkpoint: Checkpoint) -> Checkpoint:
    """The checkpoint with a copy of its model whose ``heads`` (layer, head from 0) are zero-ablated in the weights
    (``mechanism_views.ablated_checkpoint``): the clip's prediction and every map are drawn from it."""
    return mechanism_views.ablated_checkpoint(_checkpoint, list(heads))


def _analysed(checkpoint: Checkpoint, frames: list, key: tuple) -> video.ClipAnalysis:
    """The clip's one forward, kept per (checkpoint, clip); past ``PROGRESS_TOKENS`` tokens long work (progress by
    block, Stop), the page stopping until it is done."""
    cache, tokens = byte_cache("analyses", ANALYSIS_CACHE_BYTES), video.clip_tokens(checkpoint, len(frames))
    if key in cache or tokens <= PROGRESS_TOKENS:
        return computed(cache, key, lambda: video.analyse_clip(checkpoint, frames), "Running the model on the clip…")
    clip = long_work(key, f"Running the model on {tokens:,} tubelets",
                     lambda progress: video.analyse_clip(checkpoint, frames, progress=progress), "clip forward",
                     unit="blocks", kept=cache)
    if clip is None:
        st.stop()
    return clip


def _explained(checkpoint: Checkpoint, clip: video.ClipAnalysis, key: tuple, kind: str, layer: int | None,
               head: int | None, query: tuple | None, class_index: int | None) -> video.ClipExplanation:
    """The chosen map; a class's (a forward and a backward) past ``PROGRESS_TOKENS`` tokens as long work."""
    def run(progress=None) -> video.ClipExplanation:
        return video.explain_analysed(checkpoint, clip, kind, layer, head, query, class_index, progress)

    if kind not in video.CLASS_CLIP_KINDS + video.CLIP_CAM_KINDS:
        return run()
    tokens = clip.analysis.num_tokens
    if tokens <= PROGRESS_TOKENS:
        with st.spinner(f"Computing {MAP_KINDS[kind]} (a forward and a backward pass)…"):
            return run()
    explained = long_work((*key, kind, layer, query, class_index), f"Computing {MAP_KINDS[kind]} on {tokens:,} "
                          "tubelets", run, "clip map", unit="blocks")
    if explained is None:
        st.stop()
    return explained


def clip_view(checkpoint: Checkpoint, fingerprint: tuple, model_key: str, model_link: str, model_name: str) -> None:
    """The whole page for a video checkpoint; stops the page, saying what to do, without a usable clip.
    ``model_link``: what a link to the view names the model by (``share.model_text``); ``model_name`` its name."""
    model, class_names = checkpoint.model, checkpoint.class_names
    st.session_state.pop(CLICKED_KEY, None)  # its query is always a patch
    wanted, L, H = model.config.num_frames, len(model.blocks), model.config.num_heads
    share_view.apply_clip_link(model_key, video.clip_map_kinds(checkpoint), L, H)  # a link's view, once
    st.sidebar.header("Clip")
    uploaded = file_upload(st.sidebar, "Upload a clip", UPLOAD_KEY, type=UPLOAD_TYPES,
                           help=f"A video (MP4, WebM, MKV, MOV, AVI, MPEG), an animated GIF, or a zip of its "
                                f"frames (png, jpg, webp, … in the order of their names); {wanted} frames are sampled "
                                "uniformly over it, as the model's processor does. Its declared size is checked before "
                                "any frame is decoded.")

    # -- the map (sidebar) ---------------------------------------------------------------------------------------
    with st.sidebar:
        st.header("Attention map")
        kinds = video.clip_map_kinds(checkpoint)
        if st.session_state.get("clip_map") not in kinds:  # a kept choice another video model does not draw
            st.session_state.pop("clip_map", None)
        kind = st.radio("Map", kinds, key=MAP_KEY, format_func=MAP_KINDS.get,
                        help="The maps drawn for clips (a class's run the clip's forward again, with a backward); the "
                             "others are refused in one line, each for its reason.")
        st.session_state.setdefault(f"clip_layer-{model_key}", L)  # the last layer first, as on the image page
        layer = None  # AttnLRP reads every layer
        if kind == "legrad":
            st.session_state.setdefault(f"clip_legrad_from-{model_key}", max(1, L - 1))  # the authors' last two
            layer = st.slider("From layer", 1, L, key=f"clip_legrad_from-{model_key}",
                              help="LeGrad reads the classifier at each layer from this one to the last.")
        elif kind != "attnlrp":
            layer = st.slider("Up to layer" if kind in ("rollout", "class") else "Layer", 1, L,
                              key=f"clip_layer-{model_key}")
        class_slot = st.empty() if kind in video.CLASS_READ_KINDS and class_names else None
        head = None
        if kind in ("attention", "temporal"):
            chosen = st.selectbox("Head", [-1, *range(H)], key=f"clip_head-{model_key}",
                                  format_func=drawing.head_option)
            head = None if chosen == -1 else chosen
        grid = None  # known once the clip is read
        query_values = None
        reads_query = kind not in ("norms", "legrad", "attnlrp", "lens", *video.CLIP_CAM_KINDS)
        if reads_query:
            st.caption("Query patch (click one on the shown frame, or type it): its attention over every frame.")
            query_columns = st.columns(3)
        st.session_state.setdefault("clip_opacity", 0.5)
        opacity = st.slider("Opacity", 0.0, 1.0, step=0.05, key=OPACITY_KEY)
        off_labels = []
        if not video.is_divided(checkpoint):  # TimeSformer: a head names one of a block's two attentions
            off_labels = st.multiselect(
                "Heads off (zero ablation)", [f"{i + 1}.{h + 1}" for i in range(L) for h in range(H)],
                key=f"clip_heads_off-{model_key}",
                help="Layer.head, counted from 1: these heads' outputs are set to zero (their columns of the output "
                     "projection), and the prediction and every map are the model's without them.")

    st.session_state.pop(share_view.SHOWN_KEY, None)
    linked = share_view.linked_upload("clip") if uploaded is None else None  # a link's clip
    if uploaded is None and linked is None:
        st.info("Upload a clip in the sidebar (a video, an animated GIF, or a zip of its frames) to see what this "
                "video model attends to over space and time.")
        st.stop()
    if off_labels:
        heads_off = tuple(explorer.parse_head_labels(off_labels))
        checkpoint = _heads_off(fingerprint, heads_off, checkpoint)
        fingerprint = (fingerprint, "zero-ablated", heads_off)
        st.info(f"Heads {escape_markdown(', '.join(off_labels))} are switched off (zero ablation) in the prediction "
                "and in every map on this page.")
    name, digest, sampled = given_clip(uploaded, linked, wanted)
    try:
        clip = _analysed(checkpoint, sampled.frames, (fingerprint, "clip", digest, name))
    except ValueError as e:  # too many tokens; frames the model does not take
        _refuse("Cannot run the model on this clip", e)
    frames, (t, gh, gw) = clip.num_frames, clip.grid
    grid = (gh, gw)
    share_view.apply_clip_bounds(model_key, frames, grid, len(class_names))

    # -- the query, now that the grid is known -------------------------------------------------------------------
    class_index = None
    if class_slot is not None:
        chosen = class_slot.selectbox(
            "Class", [-1, *range(len(class_names))], key=f"clip_class-{model_key}",
            format_func=lambda c: drawing.class_option(c, class_names, clip.analysis.prediction.class_index))
        class_index = None if chosen == -1 else chosen
    if reads_query:
        keys = query_keys(model_key)
        for key, top in zip(keys, (frames, gh, gw), strict=True):
            if not 1 <= st.session_state.get(key, 1) <= top:
                st.session_state[key] = 1
        query_values = [column.number_input(label, 1, top, key=key) for column, label, top, key in zip(
            query_columns, ("Frame", "Row", "Col"), (frames, gh, gw), keys, strict=True)]
    query = None if query_values is None else tuple(int(v) - 1 for v in query_values)

    try:
        explained = _explained(checkpoint, clip, (fingerprint, "clip", digest, name), kind,
                               None if layer is None else layer - 1, head, query, class_index)
    except ValueError as e:
        _refuse("This map cannot be drawn", e)
    overlays = byte_cache("images", IMAGE_CACHE_BYTES).get_or_compute(
        ("clip overlays", fingerprint, digest, name, kind, layer, head, query, class_index, opacity),
        lambda: explained.overlays(opacity))

    plotly_preload.clear()  # app.py's blank chart, before the page's own
    # -- the view ------------------------------------------------------------------------------------------------
    st.caption(escape_markdown(clips.sampling_caption(sampled.indices, sampled.total)))
    col_frame, col_prediction = st.columns([1.2, 1], gap="medium")
    what = MAP_KINDS[kind]
    if kind in ("rollout", "class"):
        what += f", layers 1–{layer}"
    elif kind == "legrad":
        what += f", layers {layer}–{L}"
    elif layer is not None:
        what += f", layer {layer} of {L}"
    if kind in video.CLASS_READ_KINDS and class_names:
        shown_class = clip.analysis.prediction.class_index if class_index is None else class_index
        what += f", class {class_names[shown_class]}"
    if kind in ("attention", "temporal"):
        what += ", the mean over its heads" if head is None else f", head {head + 1}"
    if query is not None:
        what += f", query frame {query[0] + 1}, row {query[1] + 1}, col {query[2] + 1}"
    values = {"model": model_link, "upload": st.session_state.get(share_view.SHOWN_KEY), "map": kind, "layer": layer,
              "head": None if head is None else head + 1, "class": class_index,
              "patch": None if query is None else tuple(v + 1 for v in query), "opacity": opacity,
              "ablate": tuple(off_labels) or None}
    shown = dict(values)  # and the pickers' first options, which a link leaves out but the sidebar shows
    if kind in ("attention", "temporal") and head is None:
        shown["head"] = 0  # every head fused
    if kind in video.CLASS_READ_KINDS and class_names and class_index is None:
        shown["class"] = -1  # the predicted class
    frame_view = FrameView(model_key, grid, clip.tubelet, query, overlays, explained, sampled, name, what,
                           f"{t} × {gh} × {gw} tubelets of {clip.tubelet} frames", values, shown, model_name,
                           clip.analysis.prediction if class_names else None, class_names, checkpoint)
    with col_frame:
        player.play_fragment(frame_view_part, PLAY_KEY, frame_view)
    with col_prediction:
        if class_names:
            st.plotly_chart(drawing.predictions_figure(clip.analysis.prediction), config={"displayModeBar": False})
        else:
            st.info("No prediction: this model has no classifier. Its attention maps are shown all the same.")
        st.download_button(
            "Export as animated GIF", mime="image/gif", on_click="ignore",
            file_name=f"{file_name_part(name.rsplit('.', 1)[0])}-{kind}"
                      f"{'' if layer is None else f'-L{layer}'}.gif",
            data=partial(clips.animated_gif, overlays),
            help=f"The {frames} sampled frames with their maps, looping, at most {clips.GIF_MAX_SIDE} px on a side.")

    st.subheader("Every sampled frame")
    st.image([clips.fit(o, clips.STRIP_SIDE) for o in overlays],
             caption=[clips.frame_label(i, sampled.indices) for i in range(frames)], output_format="PNG")
    pca_layer = L if layer is None else layer
    if st.toggle(f"PCA colours of layer {pca_layer}'s tubelets", key="clip_pca",
                 help="The first three principal components of the layer's tokens, fitted on the whole clip, as "
                      "red, green and blue: one colour is one direction in every frame."):
        colours = video.clip_pca(checkpoint, clip, pca_layer - 1)  # (frames, gh, gw, 3)
        st.image([clips.colour_frame(c, clips.fit(f, clips.STRIP_SIDE).size) for c, f in zip(
            colours, explained.seen, strict=True)], caption=[clips.frame_label(i, sampled.indices)
                                                             for i in range(frames)], output_format="PNG")
