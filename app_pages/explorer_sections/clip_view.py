"""The explorer for a video model (VideoMAE): a clip in the sidebar (a video file, an animated GIF or a zip of
frames), its predicted classes, a map (attention by layer and head, rollout, norms, one class's class map, LeGrad or
AttnLRP) on the frame the time slider shows, a query patch picked by a click on that frame or by number, every
sampled frame with its map in a strip, and the frames overlaid as an animated GIF. The maps are
``vit.explain.video``'s, the clip's forward run once per upload; past ``PROGRESS_TOKENS`` tubelets the forward and a
class's map are long work (progress by block and a Stop button, as on the image page)."""

from functools import partial

import streamlit as st

from app_pages.explorer_sections import plotly_preload
from app_pages.explorer_sections.caches import ANALYSIS_CACHE_BYTES, IMAGE_CACHE_BYTES, PROGRESS_TOKENS, byte_cache
from app_pages.explorer_sections.long_work import long_work
from app_pages.explorer_sections.uploader import file_upload
from vit.app import clips, drawing, explorer
from vit.checkpoint import Checkpoint
from vit.clips import VIDEO_SUFFIXES, ClipError, read_clip_bytes
from vit.explain import mechanism_views, video
from vit.explain.overlay import display_image
from vit.explain.video import CLIP_KIND_LABELS as MAP_KINDS
from vit.text import escape_markdown, visible

UPLOAD_KEY = "explorer_clip_upload"
UPLOAD_TYPES = [suffix[1:] for suffix in VIDEO_SUFFIXES] + ["gif", "zip"]
FRAME_KEY = "clip_frame"  # the time slider: the shown sampled frame, counted from 1
PICKER_KEY = "clip_frame_picker"
PICKER_CONFIG = {"displayModeBar": False, "scrollZoom": False, "doubleClick": False}
# kept by the page while not drawn (a rejected upload stops the page before the sidebar's map settings)
KEPT = ("clip_map", "clip_layer-", "clip_legrad_from-", "clip_class-", "clip_head-", "clip_query_", "clip_opacity",
        "clip_pca", "clip_heads_off-")


def _query_keys(model_key: str) -> tuple[str, str, str]:
    return tuple(f"clip_query_{axis}-{model_key}" for axis in ("frame", "row", "col"))


def _pick_query(model_key: str, frame: int, grid: tuple[int, int]) -> None:
    """A click on the shown frame made that frame's patch the query."""
    picked = clips.query_from_selection(st.session_state[PICKER_KEY].selection, frame, grid)
    if picked is not None:
        for key, value in zip(_query_keys(model_key), picked, strict=True):
            st.session_state[key] = value + 1  # the number inputs count from 1


def _refuse(what: str, error: Exception) -> None:
    """One line, the user's text (file names) escaped, and the page stops."""
    st.error(f"{what}: {escape_markdown(visible(str(error).splitlines()[0] if str(error) else repr(error)))}")
    st.stop()


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
        with st.spinner("Running the model on the clip…"):
            return cache.get_or_compute(key, lambda: video.analyse_clip(checkpoint, frames))
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


def clip_view(checkpoint: Checkpoint, fingerprint: tuple, model_key: str) -> None:
    """The whole page for a video checkpoint; stops the page, saying what to do, without a usable clip."""
    model, class_names = checkpoint.model, checkpoint.class_names
    wanted, L, H = model.config.num_frames, len(model.blocks), model.config.num_heads
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
        kind = st.radio("Map", kinds, key="clip_map", format_func=MAP_KINDS.get,
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
        opacity = st.slider("Opacity", 0.0, 1.0, step=0.05, key="clip_opacity")
        off_labels = []
        if not video.is_divided(checkpoint):  # TimeSformer: a head names one of a block's two attentions
            off_labels = st.multiselect(
                "Heads off (zero ablation)", [f"{i + 1}.{h + 1}" for i in range(L) for h in range(H)],
                key=f"clip_heads_off-{model_key}",
                help="Layer.head, counted from 1: these heads' outputs are set to zero (their columns of the output "
                     "projection), and the prediction and every map are the model's without them.")

    if uploaded is None:
        st.info("Upload a clip in the sidebar (a video, an animated GIF, or a zip of its frames) to see what this "
                "video model attends to over space and time.")
        st.stop()
    if off_labels:
        heads_off = tuple(explorer.parse_head_labels(off_labels))
        checkpoint = _heads_off(fingerprint, heads_off, checkpoint)
        fingerprint = (fingerprint, "zero-ablated", heads_off)
        st.info(f"Heads {escape_markdown(', '.join(off_labels))} are switched off (zero ablation) in the prediction "
                "and in every map on this page.")
    data, name = uploaded.getvalue(), uploaded.name
    digest = explorer.image_digest(data)
    try:
        sampled = byte_cache("images", IMAGE_CACHE_BYTES).get_or_compute(
            ("clip", digest, name, wanted), lambda: read_clip_bytes(data, name, wanted))
    except ClipError as e:
        _refuse("Cannot use this clip", e)
    try:
        clip = _analysed(checkpoint, sampled.frames, (fingerprint, "clip", digest, name))
    except ValueError as e:  # too many tokens; frames the model does not take
        _refuse("Cannot run the model on this clip", e)
    frames, (t, gh, gw) = clip.num_frames, clip.grid
    grid = (gh, gw)

    # -- the query, now that the grid is known -------------------------------------------------------------------
    class_index = None
    if class_slot is not None:
        chosen = class_slot.selectbox(
            "Class", [-1, *range(len(class_names))], key=f"clip_class-{model_key}",
            format_func=lambda c: drawing.class_option(c, class_names, clip.analysis.prediction.class_index))
        class_index = None if chosen == -1 else chosen
    if reads_query:
        keys = _query_keys(model_key)
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
    with col_frame:
        shown_place = st.empty()  # the frame the slider below chooses
        if not 1 <= st.session_state.get(FRAME_KEY, 1) <= frames:  # another model's clip was longer
            st.session_state[FRAME_KEY] = 1
        st.session_state.setdefault(FRAME_KEY, 1)
        position = st.slider("Frame", 1, frames, key=FRAME_KEY,
                             help="The sampled frame shown above; a tubelet's value covers its "
                                  f"{clip.tubelet} frames.") - 1
        query_patch = None
        if query is not None and query[0] // clip.tubelet == position // clip.tubelet:
            query_patch = query[1] * gw + query[2]
        shown_place.plotly_chart(
            clips.frame_picker_figure(display_image(overlays[position]), explained.map[position], position,
                                     query_patch),
            key=PICKER_KEY, on_select=partial(_pick_query, model_key, position, grid), selection_mode="points",
            config=PICKER_CONFIG, width="stretch")
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
        low, high = float(explained.map.min()), float(explained.map.max())
        st.caption(escape_markdown(
            f"{what}. Sampled frame {position + 1} of {frames} (frame {sampled.indices[position]} of "
            f"{visible(name)}); {t} × {gh} × {gw} tubelets of {clip.tubelet} frames; one colour scale "
            f"over the clip, {low:.4g} to {high:.4g}. Click a patch to make it the query."))
    with col_prediction:
        if class_names:
            st.plotly_chart(drawing.predictions_figure(clip.analysis.prediction), config={"displayModeBar": False})
        else:
            st.info("No prediction: this model has no classifier. Its attention maps are shown all the same.")
        st.download_button(
            "Export as animated GIF", mime="image/gif", on_click="ignore",
            file_name=f"{drawing.file_name_part(name.rsplit('.', 1)[0])}-{kind}"
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
