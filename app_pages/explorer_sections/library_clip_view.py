"""The explorer's clip view for a video model opened by the library road (PE video, issue 116): the same clip upload,
shown frame with its patch picker, time slider and Play, frame strip, link and HTML export as a port's video model
(``clip_view``), over the maps ``vit.explain`` draws for it (``vit.explain.views.video.LIBRARY_CLIP_KINDS``): each
frame's trunk attention or rollout of each frame's CLS or of one patch, the temporal encoder's row of the CLS or of a
frame, and each frame's pooling probe. The clip is sampled as its video processor samples (first frame to last) and
every map is ``vit.explain(checkpoint, frames, kind, ...)``'s, so what the page shows is what the notebook gives."""

import streamlit as st

import vit
from app_pages import player
from app_pages.explorer_sections import clip_view, plotly_preload, share_view
from app_pages.explorer_sections.caches import IMAGE_CACHE_BYTES, byte_cache
from app_pages.explorer_sections.uploader import file_upload
from vit.app import clip_view as clips
from vit.app import drawing, share
from vit.app import library_clip_view as views
from vit.checkpoint import Checkpoint
from vit.core.text import escape_markdown, file_name_part

QUERY_LINK_KEY = "clip_query_linked"  # a link's temporal token, until the map's tokens are known


def _keys(model_key: str) -> dict[str, str]:
    """The widgets' keys: the port's clip page's where they mean the same (a link and the patch picker set them)."""
    frame, row, col = clip_view.query_keys(model_key)
    return {"layer": f"clip_layer-{model_key}", "head": f"clip_head-{model_key}", "frame": frame, "row": row,
            "col": col, "kind": f"clip_query_kind-{model_key}", "token": f"clip_query_token-{model_key}"}


_refuse = clip_view.refuse


def _take_link(model, model_key: str, kinds: tuple[str, ...]) -> None:
    """A link's map, layer, head (from 1), opacity, upload, shown frame and query patch as the widgets' values, each
    checked against the model (``share_view.apply_clip_link``, with the linked map's own layers and heads), and its
    temporal token kept for ``_temporal_token``."""
    linked = st.session_state.get(share_view.LINKED_KEY)
    if st.session_state.get(share_view.PENDING_KEY) is None or not linked:
        return
    if "query" in linked:
        st.session_state[QUERY_LINK_KEY] = linked.pop("query")
    kind = linked.get("map") if linked.get("map") in kinds else kinds[0]
    share_view.apply_clip_link(model_key, kinds, views.layer_count(model, kind), views.head_count(model, kind))
    share_view.apply_clip_bounds(model_key, model.num_frames, model.layout.grid, 0)
    frame, row, col = linked.get("patch") or (0, 0, 0)
    if 1 <= frame <= model.num_frames and 1 <= row <= model.layout.grid[0] and 1 <= col <= model.layout.grid[1]:
        st.session_state[_keys(model_key)["kind"]] = "patch"  # a patch's query, not each frame's CLS


def _temporal_token(frames: int, key: str) -> int:
    """The temporal layers' query token (0 the CLS, ``1 + f`` frame ``f``), a link's checked against the clip's."""
    linked = st.session_state.pop(QUERY_LINK_KEY, None)
    if linked is not None and linked > frames:
        share_view.note([share.dropped("query", str(linked), f"the temporal layers read the CLS and {frames} frames, "
                                                             f"0 to {frames}")])
    elif linked is not None:
        st.session_state[key] = linked
    if st.session_state.get(key) not in range(frames + 1):
        st.session_state[key] = 0
    return st.selectbox("Query token", list(range(frames + 1)), key=key, format_func=views.temporal_token,
                        help="The temporal token whose row over the frames is drawn: the CLS, or a frame's token.")


@st.cache_resource(max_entries=8, show_spinner="Computing the map…")
def _explain(fingerprint: tuple, digest: str, kind: str, asked: tuple, _checkpoint: Checkpoint, _frames: list):
    """``vit.explain``'s clip map, once per (model, clip, settings)."""
    return vit.explain(_checkpoint, _frames, kind, **dict(asked))


def library_clip_view(checkpoint: Checkpoint, fingerprint: tuple, model_key: str, model_link: str,
                      model_name: str) -> None:
    """The whole page for a library-road video model (``checkpoint.model.takes_clips``); stops the page, saying what to
    do, without a usable clip. ``model_link``: what a link names the model by; ``model_name`` its name."""
    model, keys = checkpoint.model, _keys(model_key)
    wanted, (gh, gw) = model.num_frames, model.layout.grid
    kinds = views.map_kinds(model)
    if st.session_state.pop(clip_view.CLICKED_KEY, False):  # a click on the frame picked a patch as the query
        st.session_state[keys["kind"]] = "patch"
    _take_link(model, model_key, kinds)
    st.sidebar.header("Clip")
    uploaded = file_upload(st.sidebar, "Upload a clip", clip_view.UPLOAD_KEY, type=clip_view.UPLOAD_TYPES,
                           help=f"A video (MP4, WebM, MKV, MOV, AVI, MPEG), an animated GIF, or a zip of its frames "
                                f"(png, jpg, webp, … in the order of their names); {wanted} frames are sampled from "
                                "its first frame to its last, as the model's video processor does. Its declared size "
                                "is checked before any frame is decoded.")
    with st.sidebar:
        st.header("Map")
        if st.session_state.get(clip_view.MAP_KEY) not in kinds:  # a kept choice another video model draws
            st.session_state.pop(clip_view.MAP_KEY, None)
        kind = st.radio("Map", kinds, key=clip_view.MAP_KEY, format_func=views.KIND_LABELS.get,
                        help="The maps vit.explain draws for this model opened as its library builds it.")
        layers, heads = views.layer_count(model, kind), views.head_count(model, kind)
        layer = None
        if layers:
            if not 1 <= st.session_state.get(keys["layer"], layers) <= layers:  # another map's layers
                st.session_state[keys["layer"]] = layers
            st.session_state.setdefault(keys["layer"], layers)  # the last layer first, as vit.explain's
            label = "Up to layer" if kind == "rollout" else "Temporal layer" if kind == "temporal" else "Layer"
            layer = st.slider(label, 1, layers, key=keys["layer"]) if layers > 1 else 1
        head = None
        if heads:
            if st.session_state.get(keys["head"], -1) not in range(-1, heads):
                st.session_state.pop(keys["head"], None)
            chosen = st.selectbox("Head", [-1, *range(heads)], key=keys["head"], format_func=drawing.head_option)
            head = None if chosen == -1 else chosen
        query = None
        if kind == "temporal":
            query = _temporal_token(wanted, keys["token"])
        elif kind in views.PATCH_KINDS:
            patch = st.radio("Query", ["cls", "patch"], key=keys["kind"], horizontal=True,
                             format_func={"cls": "each frame's CLS", "patch": "one patch"}.get,
                             help="Each frame's CLS row over its own patches, or one patch's row over its own frame "
                                  "(click one on the shown frame, or type it).") == "patch"
            if patch:
                columns = st.columns(3)
                values = []
                for column, label, top, key in zip(columns, ("Frame", "Row", "Col"), (wanted, gh, gw),
                                                   (keys["frame"], keys["row"], keys["col"]), strict=True):
                    if not 1 <= st.session_state.get(key, 1) <= top:
                        st.session_state[key] = 1
                    values.append(int(column.number_input(label, 1, top, key=key)) - 1)
                query = tuple(values)
        st.session_state.setdefault(clip_view.OPACITY_KEY, 0.5)
        opacity = st.slider("Opacity", 0.0, 1.0, step=0.05, key=clip_view.OPACITY_KEY)

    st.session_state.pop(share_view.SHOWN_KEY, None)
    linked = share_view.linked_upload("clip") if uploaded is None else None  # a link's clip
    if uploaded is None and linked is None:
        st.info("Upload a clip in the sidebar (a video, an animated GIF, or a zip of its frames) to see what this "
                "video model attends to within each frame and over time.")
        st.stop()
    name, digest, sampled = clip_view.given_clip(uploaded, linked, wanted, ends=getattr(model, "samples_ends", False))
    asked = views.explain_arguments(kind, layer, head, query)
    try:
        explained = _explain(fingerprint, digest, kind, tuple(sorted(asked.items())), checkpoint, sampled.frames)
    except ValueError as e:  # the cost model's refusal, a setting the map does not read
        _refuse("This map cannot be drawn", e)
    overlays = byte_cache("images", IMAGE_CACHE_BYTES).get_or_compute(
        ("library clip overlays", fingerprint, digest, kind, tuple(sorted(asked.items())), opacity),
        lambda: explained.overlays(opacity))

    plotly_preload.clear()  # app.py's blank chart, before the page's own
    st.caption(escape_markdown(clips.sampling_caption(sampled.indices, sampled.total)))
    patch = query if isinstance(query, tuple) else None
    values = {"model": model_link, "upload": st.session_state.get(share_view.SHOWN_KEY), "map": kind,
              "layer": layer, "head": None if head is None else head + 1,
              "query": query if kind == "temporal" and query else None,  # the CLS: the default, left out
              "patch": None if patch is None else tuple(v + 1 for v in patch), "opacity": opacity}
    shown = {k: v for k, v in values.items() if k != "query"}  # a temporal token is named in the caption
    if heads and head is None:
        shown["head"] = 0  # every head fused
    count = len(sampled.frames)
    frame_view = clip_view.FrameView(model_key, (gh, gw), 1, patch, overlays, explained, sampled, name,
                                     views.describe(kind, layer, layers, head, query),
                                     f"{count} frames of {gh} × {gw} patches", values, shown, model_name, None, [],
                                     checkpoint)
    col_frame, col_side = st.columns([1.2, 1], gap="medium")
    with col_frame:
        player.play_fragment(clip_view.frame_view_part, clip_view.PLAY_KEY, frame_view)
    with col_side:
        st.info("No prediction: PE video embeds a clip (it has no classifier). Its maps are drawn all the same.")
        st.download_button(
            "Export as animated GIF", mime="image/gif", on_click="ignore",
            file_name=f"{file_name_part(name.rsplit('.', 1)[0])}-{kind}.gif",
            data=lambda: clips.animated_gif(overlays),
            help=f"The {count} sampled frames with their maps, looping, at most {clips.GIF_MAX_SIDE} px on a side.")
    st.subheader("Every sampled frame")
    st.image([clips.fit(o, clips.STRIP_SIDE) for o in overlays],
             caption=[clips.frame_label(i, sampled.indices) for i in range(count)], output_format="PNG")
