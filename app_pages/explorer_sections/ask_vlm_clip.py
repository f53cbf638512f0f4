"""Ask the VLM's clip (``ask_vlm``): the uploader of a clip to ask about instead of the images, its frames sampled
("Clip frames"), and for a zip of frames, whose file says no rate, its frame rate (issue 116), which takes
``vit.ask_vlm(video=..., fps=...)``'s path (``vit.core.clips.at_rate``) so the frames keep their times."""

import streamlit as st

from app_pages.explorer_sections.ask_vlm_inside import one_line as _one_line
from app_pages.explorer_sections.caches import CLIP_UPLOAD_TYPES, sampled_clip, upload_store
from vit.app import share
from vit.core.clips import DEFAULT_FPS, MAX_FPS, SampledClip, at_rate
from vit.core.images import ImageError
from vit.core.text import escape_markdown, visible
from vit.explain.language.vlm_answer import MAX_CLIP_FRAMES

# A clip instead of the images: its upload's SHA-256, its uploader, what the uploader last held, the frames sampled
CLIP_KEY, CLIP_FILE_KEY, CLIP_SEEN_KEY, FRAMES_KEY = "vlm_ask_clip", "ask_vlm_clip_file", "ask_vlm_clip_seen", \
    "vlm_ask_frames"
DEFAULT_FRAMES = 8
# A zip of frames' rate, which its file does not say (a video's and a GIF's do): the field, and the clip it is shown for
FPS_KEY, RATE_OF_KEY = "vlm_ask_fps", "ask_vlm_rate_of"


def asked_clip() -> tuple[SampledClip, str, str] | None:
    """The uploader of a clip to ask about instead of the images, and what it (or the link) holds: (its sampled
    frames, its name, its SHA-256), the frames' count from "Clip frames"; None without one, or (one line said) for
    a file that is no clip or a link's upload the server no longer holds."""
    file = st.file_uploader(
        "Or a clip to ask about instead (optional)", type=CLIP_UPLOAD_TYPES, key=CLIP_FILE_KEY,
        help="A video, an animated GIF or a zip of its frames, sampled uniformly: the question is about the clip, "
             "not the images, and each answer token's map is drawn on the temporal slice you pick below.")
    seen = None if file is None else file.file_id
    if seen != st.session_state.get(CLIP_SEEN_KEY):  # the uploader changed: its file replaces the link's
        st.session_state[CLIP_SEEN_KEY] = seen
        st.session_state[CLIP_KEY] = None if file is None else upload_store().put(file.getvalue(), file.name)
    digest = st.session_state.get(CLIP_KEY)
    if digest is None:
        return None
    found = upload_store().upload(digest)
    if found is None:
        st.warning("The clip the link asks about was an upload the server no longer holds: upload it again (the same "
                   "file) to ask about it.", icon=":material/link_off:")
        return None
    if not 1 <= (st.session_state.get(FRAMES_KEY) or 0) <= MAX_CLIP_FRAMES:
        st.session_state[FRAMES_KEY] = DEFAULT_FRAMES
    wanted = st.number_input("Clip frames", min_value=1, max_value=MAX_CLIP_FRAMES, step=1, key=FRAMES_KEY,
                             help="Frames sampled uniformly from the clip and given to the model as they are (its "
                                  "processor samples none): each is a tower's view and its tokens in the prompt.")
    name = found.name or "the clip"
    try:
        sampled = sampled_clip(digest, name, found.data, int(wanted), once=True)  # a short one's frames once
    except ImageError as e:  # ClipError: not a clip, too large, too few frames
        st.error(f"Cannot use {escape_markdown(visible(name))}: {_one_line(e)}")
        return None
    if sampled.fps:  # a video's or a GIF's own rate: its frames keep their times
        st.session_state.pop(RATE_OF_KEY, None)
        return sampled, name, digest
    st.session_state[RATE_OF_KEY] = digest
    st.session_state.setdefault(FPS_KEY, DEFAULT_FPS)
    fps = st.number_input(
        share.LABELS["lm_fps"], min_value=share.MIN_FPS, max_value=float(MAX_FPS), step=1.0, format="%.2f", key=FPS_KEY,
        help=f"The rate the frames were taken at, which a zip of frames does not say: each sampled frame's time is its "
             f"place over it, which the model's processor writes into the prompt ({DEFAULT_FPS:g}: transformers' own "
             "assumption for a clip of unknown rate).")
    try:
        return at_rate(sampled, round(float(fps), 2)), name, digest  # vit.ask_vlm(video=..., fps=...)'s path
    except ValueError as e:
        st.error(_one_line(e))
        return None
