"""Ask the VLM (issue 80): a question about the image to the whole vision-language model (its language model too),
the answer streamed token by token under its progress, with Stop (a stopped answer keeps its tokens so far, and
their maps), each answer token clickable, the clicked token's attention over the
image at a layer and head of the language model, and every answer token's share of attention on the image. The
question may take more images after the page's, or a clip instead (a video, an animated GIF or a zip of frames):
the map is then drawn on the image or the clip's temporal slice picked.

The answer is the notebook API's own (``vit.open_vlm`` / ``vit.ask_vlm``: transformers' greedy ``generate``, the
prompt through the folder's processor and chat template) and each map is ``VLMAnswer.attention``: a notebook given
the same folder, image and question gets the map drawn here. The answer is kept per (model, image, question,
length), so a click on a token, a layer or a head only redraws. The question and the answer are data: shown as plain
text (``st.text``, a table), escaped where a label or caption reads Markdown. Inside the language model, on demand
(issue 115): ``ask_vlm_inside``. Not a fragment: its values are part of the page's link (``link_values``).
"""

from functools import partial

import numpy as np
import streamlit as st
from PIL import Image

from app_pages.explorer_sections import ask_vlm_inside as inside
from app_pages.explorer_sections import view_link
from app_pages.explorer_sections.ask_vlm_clip import CLIP_KEY, FPS_KEY, FRAMES_KEY, RATE_OF_KEY, asked_clip
from app_pages.explorer_sections.ask_vlm_inside import one_line as _one_line
from app_pages.explorer_sections.caches import UPLOAD_TYPES, decode_image, upload_store
from app_pages.explorer_sections.hub_download import snapshot_files_panel
from app_pages.explorer_sections.long_work import long_work
from app_pages.explorer_sections.state import Shown
from vit.app import drawing, share, vlm_ask, vlm_inside
from vit.app.export import View, view_html
from vit.checkpoint import CheckpointError
from vit.core.clips import SampledClip
from vit.core.images import ImageError
from vit.core.inference import seen_region
from vit.core.text import escape_markdown, file_name_part, visible
from vit.explain.language.vlm_answer import FUSIONS, MAP_METHODS, MAX_IMAGES, VLMAnswer, prepare
from vit.explain.views.overlay import display_image
from vit.sources.vlm.whole_vlm import missing_weights

KEPT = ("vlm_ask_",)  # the section's widget state, written back by the page on runs that do not draw it
QUESTION_KEY, LENGTH_KEY, TOKEN_KEY = "vlm_ask_question", "vlm_ask_length", "vlm_ask_token"
LAYER_KEY, HEAD_KEY, FUSION_KEY, METHOD_KEY = "vlm_ask_layer", "vlm_ask_head", "vlm_ask_fusion", "vlm_ask_method"
OVERVIEW_KEY, IMAGE_KEY = "vlm_ask_overview", "vlm_ask_image"
# The question's more images: the uploads' SHA-256s (the server's upload store holds their bytes, a link names them),
# and their uploader (not under KEPT's prefix: an uploader's value cannot be written back)
MORE_KEY, MORE_FILES_KEY, SEEN_FILES_KEY = "vlm_ask_more", "ask_vlm_more_files", "ask_vlm_more_seen"
LINKED_KEY = "ask_vlm_linked"  # a link's answer token, layer and head (from 1), until the answer they point into
# Link parameter -> the widget it sets at once (their range is the page's, not the answer's)
WIDGETS = {"question": QUESTION_KEY, "answer_length": LENGTH_KEY, "lm_fusion": FUSION_KEY, "lm_method": METHOD_KEY,
           "lm_overview": OVERVIEW_KEY, "lm_frames": FRAMES_KEY, "lm_fps": FPS_KEY}
PICKED = {"answer_token": TOKEN_KEY, "lm_layer": LAYER_KEY, "lm_head": HEAD_KEY, "lm_image": IMAGE_KEY}


@st.cache_resource(max_entries=1, show_spinner="Opening the whole vision-language model (its language model too)…")
def whole_vlm(fingerprint: tuple, folder: str):
    """``vit.open_vlm`` of the folder, once per model (one at a time: a language model is large)."""
    from vit.sources.vlm.whole_vlm import open_whole_vlm

    return open_whole_vlm(folder)


def take_link(values: dict) -> None:
    """Once per session, before the widgets are drawn (``share_view.read_link``): the link's question, length and
    fusion as the widgets' values; its answer token, layer and head wait for the answer (``_apply_link``)."""
    for name, key in WIDGETS.items():
        if name in values:
            st.session_state[key] = values.pop(name)
    if "more" in values:
        st.session_state[MORE_KEY] = list(values.pop("more"))
    if "lm_clip" in values:
        st.session_state[CLIP_KEY] = values.pop("lm_clip")
    inside.take_link(values)
    picked = {name: values.pop(name) for name in PICKED if name in values}
    if picked:
        st.session_state[LINKED_KEY] = picked


def link_values() -> dict[str, object]:
    """The section's part of the page's link (``vit.app.share``'s values): the question asked, the answer's length
    and the clicked token, layer and head (from 1) while a question is asked."""
    question = str(st.session_state.get(QUESTION_KEY) or "")
    if not question.strip():
        return {}
    linked = st.session_state.get(LINKED_KEY) or {}
    clip = st.session_state.get(CLIP_KEY)
    values: dict[str, object] = {"question": question, "answer_length": st.session_state.get(LENGTH_KEY),
                                 "more": tuple(st.session_state.get(MORE_KEY) or ()) or None, "lm_clip": clip,
                                 "lm_frames": st.session_state.get(FRAMES_KEY) if clip else None,
                                 "lm_fps": st.session_state.get(FPS_KEY) if clip and clip == st.session_state.get(
                                     RATE_OF_KEY) else None}
    for name, key in PICKED.items():
        value = st.session_state.get(key)
        values[name] = linked.get(name, None if value is None else value + 1)
    if values.get("lm_image") == 1:  # the page's image (a clip's first slice): the default, left out
        values["lm_image"] = None
    values["lm_fusion"] = st.session_state.get(FUSION_KEY) if values.get("lm_head") is None else None
    method = st.session_state.get(METHOD_KEY)
    values["lm_method"] = method if method in MAP_METHODS[1:] else None  # attention: the default, left out
    values["lm_overview"] = True if st.session_state.get(OVERVIEW_KEY) else None  # the tiles' canvas: the default
    values.update(inside.link_values(method))
    return {k: v for k, v in values.items() if v is not None}


def _apply_link(answer: VLMAnswer) -> list[str]:
    """The link's answer token, layer and head, checked against the answer; one line for each dropped."""
    linked = st.session_state.pop(LINKED_KEY, None) or {}
    images = len(answer.layouts)
    bounds = {"answer_token": (len(answer.tokens), f"the answer has {len(answer.tokens)} tokens"),
              "lm_image": (images, f"the clip has {images} slices" if answer.clip else
                           f"the question has {images} image{'s' if images > 1 else ''}"),
              "lm_layer": (answer.layers, f"the language model has {answer.layers} layers"),
              "lm_head": (answer.heads, f"the language model has {answer.heads} heads")}
    notes = []
    for name, value in linked.items():
        high, why = bounds[name]
        if value > high:
            notes.append(share.dropped(name, str(value), why))
        else:
            st.session_state[PICKED[name]] = value - 1
    return notes


def _seen(view: Shown, answer: VLMAnswer, overview: bool = False, image: int = 0, picture: Image.Image | None = None):
    """The pixels the model saw of the question's ``image``-th image (``picture``; the page's for the first), at
    display size: a tiled image's as the model read them (the tiles' canvas or the overview); else the page's own
    where the tower's grid is the answer's (the processor prepares the image as the tower's preprocessing does), else
    the tower's preprocessing at its own size."""
    pixels = vlm_ask.seen_pixels(answer, overview, image)
    if pixels is not None:
        return display_image(Image.fromarray(pixels), max_side=480)
    if view.analysis is None:  # a tower no port reads (``vlm_view``): its layouts always carry their pixels
        raise ValueError("the pixels this image was read as are not known here; ask it in a notebook (vit.ask_vlm)")
    if image == 0 and tuple(view.analysis.grid) == tuple(answer.layouts[0].grid):
        return view.shown
    return drawing.display_images(seen_region(view.image if picture is None else picture,
                                              view.checkpoint.preprocessing))[0]


def _more_images() -> tuple[list[Image.Image], list[str], tuple[str, ...]]:
    """The uploader of the question's more images and what it (or the link) holds: (the images, their names, their
    SHA-256s), each decoded within the uploads' bounds; a file that is no image, or a link's upload the server no
    longer holds, is left out with one line; past ``MAX_IMAGES`` - 1 files, the first are taken and it is said."""
    files = st.file_uploader(
        "More images for the question (optional)", type=UPLOAD_TYPES, accept_multiple_files=True,
        key=MORE_FILES_KEY, help=f"Asked about after the page's image, in this order (up to {MAX_IMAGES - 1} more); "
                                 "each answer token's map is drawn on the image you pick below.")
    seen = tuple(f.file_id for f in files or ())
    if seen != st.session_state.get(SEEN_FILES_KEY, ()):  # the uploader changed: its files replace the link's
        st.session_state[SEEN_FILES_KEY] = seen
        if len(seen) > MAX_IMAGES - 1:
            st.warning(f"A question takes at most {MAX_IMAGES} images: the first {MAX_IMAGES - 1} uploads are asked "
                       "about after the page's image.")
        st.session_state[MORE_KEY] = [upload_store().put(f.getvalue(), f.name) for f in files[:MAX_IMAGES - 1]]
    images, names, kept = [], [], []
    for digest in st.session_state.get(MORE_KEY) or ():
        found = upload_store().upload(digest)
        if found is None:
            st.warning("An image the link asks about was an upload the server no longer holds: upload it again (the "
                       "same file) to ask about it.", icon=":material/link_off:")
            continue
        try:
            images.append(decode_image(digest, found.name, False, found.data))
        except ImageError as e:
            st.error(f"Cannot use {escape_markdown(visible(found.name))}: {_one_line(e)}")
            continue
        names.append(found.name or f"image {len(names) + 2}")
        kept.append(digest)
    return images, names, tuple(kept)


def _answer(view: Shown, may_open: bool, question: str, length: int, more: list[Image.Image],
            digests: tuple[str, ...], clip: tuple[SampledClip, str, str] | None) -> VLMAnswer | None:
    """The answer, kept per (model, images or clip, question, length); None while it is generated (its progress, the
    answer so far and Stop are drawn); after a Stop, the answer so far (for this page only). Raises what a refusal
    raises (one line). ``more``: the images asked about after the page's (``digests``: theirs); ``clip``: a clip's
    frames asked about instead (``_clip``)."""
    vlm = whole_vlm(view.full_fingerprint, str(view.full_checkpoint.path))
    if clip is not None:
        prepared = prepare(vlm, None, question, max_new_tokens=length, clip=clip[0])  # with a video's times
        asked = ("clip", clip[2], len(clip[0].frames), clip[0].fps)
    else:
        prepared = prepare(vlm, [view.image, *more] if more else view.image, question, max_new_tokens=length)
        asked = (view.image_key, digests)
    vlm_ask.check_visitor(prepared, may_open)  # counted, refused over the limit, before the work
    return long_work(("vlm answer", view.full_fingerprint, *asked, question, length),
                     f"Answering in at most {length} tokens", partial(vlm_ask.generate, vlm, prepared), "ask_vlm",
                     unit="tokens")


def ask_vlm(view: Shown, may_open: bool, shared: dict[str, object], model_name: str, image_name: str) -> None:
    """The section: the question, the answer, its tokens to click, the clicked token's map and every token's share
    of attention on the image, with a link and an HTML export of the view."""
    st.subheader("Ask the VLM")
    folder = view.full_checkpoint.path
    if folder is not None and not snapshot_files_panel(
            folder, missing_weights(folder), may_open, "ask_vlm_download",
            "Answering reads the language model too, whose shards were left on the Hub when the model was opened "
            "(its tower's alone were downloaded, for the maps above)."):
        return
    limit = vlm_ask.max_new_tokens(may_open)
    notes = []
    if (st.session_state.get(LENGTH_KEY) or 0) > limit:  # a link's, past what this visitor may ask
        notes.append(share.dropped("answer_length", str(st.session_state[LENGTH_KEY]),
                                   f"a visitor may ask for at most {limit} tokens here"))
        st.session_state[LENGTH_KEY] = limit
    st.session_state.setdefault(LENGTH_KEY, min(vlm_ask.DEFAULT_NEW_TOKENS, limit))
    col_question, col_length = st.columns([4, 1])
    # No max_chars: Streamlit would show a counter; ``prepare`` bounds the text (one line if over).
    question = col_question.text_input(
        "Question", key=QUESTION_KEY, placeholder="What is in this image?",
        help="Asked through the model's own processor and chat template, exactly as typed (plain text); the answer "
             "is transformers' greedy generate.")
    length = col_length.number_input("Answer length", min_value=1, max_value=limit, step=1, key=LENGTH_KEY,
                                     help=f"Tokens at most (a visitor without a token: {vlm_ask.VISITOR_NEW_TOKENS}).")
    more, names, digests = _more_images()
    clip = asked_clip()
    if clip is not None and more:
        st.error("A question is about images or a clip, not both: remove the more images or the clip.")
        return
    if not question.strip():
        st.caption("Ask a question about the image: the model answers, and each word of the answer shows where it "
                   "looked in the image (its attention through the language model).")
        return
    try:
        answer = _answer(view, may_open, question, int(length), more, digests, clip)
    except (ValueError, CheckpointError, ImageError) as e:  # no whole model, too large, too long for a visitor
        st.error(_one_line(e))
        return
    if answer is None:
        return
    notes += _apply_link(answer)
    if notes:
        st.warning("  \n".join(escape_markdown(n) for n in notes), icon=":material/link_off:")
    st.text(f"Answer: {visible(answer.text)}")  # plain text: the model's words are data
    if st.session_state.get(TOKEN_KEY) not in range(len(answer.tokens)):
        st.session_state[TOKEN_KEY] = 0
    token = st.pills("Answer token", list(range(len(answer.tokens))), key=TOKEN_KEY,
                     format_func=vlm_ask.token_labels(answer).__getitem__,
                     help="Click a token of the answer: the map shows where the query that predicted it looked.")
    token = 0 if token is None else token
    col_map, col_controls, col_strip = st.columns([1.2, 0.8, 1], gap="medium")
    with col_controls:
        image, frames = 0, None if clip is None else len(clip[0].frames)
        if answer.clip and len(answer.layouts) > 1:
            if st.session_state.get(IMAGE_KEY) not in range(len(answer.layouts)):
                st.session_state[IMAGE_KEY] = 0
            image = st.select_slider("Slice of the clip", list(range(len(answer.layouts))), key=IMAGE_KEY,
                                     format_func=partial(vlm_ask.slice_label, answer, frames),
                                     help="The temporal slice of the clip the map is drawn on: the frames the model "
                                          "read as one (Qwen-VL and GLM two at a time), drawn over the first.")
        elif len(answer.layouts) > 1:
            if st.session_state.get(IMAGE_KEY) not in range(len(answer.layouts)):
                st.session_state[IMAGE_KEY] = 0
            labels = [image_name, *names]
            image = st.radio("Image", list(range(len(answer.layouts))), key=IMAGE_KEY,
                             format_func=lambda k: f"{k + 1}: {escape_markdown(visible(labels[k]))}",
                             help="Which of the question's images the map is drawn on (the page's image first).")
        if st.session_state.get(METHOD_KEY) not in MAP_METHODS:
            st.session_state[METHOD_KEY] = "attention"
        method = st.radio("Map", MAP_METHODS, key=METHOD_KEY, format_func=vlm_ask.METHOD_LABELS.get,
                          help="The query's attention to the image at a layer and head; or gradient × attention "
                               "(Chefer et al. 2021b) of the token's logit, at a layer or rolled out over every "
                               "layer: one forward and backward of the model; or TAM (Li et al., ICCV 2025), the "
                               "token's logit on each image token's last hidden state, the earlier words' share "
                               "removed: one forward; or AttnLRP (Achtibat et al. 2024) of the token's logit through "
                               "the language model, the projector and the tower to the pixels, red for and blue "
                               "against: one forward and backward.")
        if st.session_state.get(LAYER_KEY) not in range(answer.layers):
            st.session_state[LAYER_KEY] = answer.layers - 1
        layer = st.selectbox("Layer", list(range(answer.layers)), key=LAYER_KEY, format_func=lambda v: str(v + 1),
                             help="A layer of the language model (the last one by default).")
        if st.session_state.get(HEAD_KEY) not in (None, *range(answer.heads)):
            st.session_state[HEAD_KEY] = None
        head, fusion = None, "mean"
        if method == "attention":  # gradient x attention averages the heads, by its rule
            # None (the heads fused) is Streamlit's "no choice": its placeholder is what it shows for it
            fused = st.session_state.get(FUSION_KEY)
            every = f"all heads ({fused if fused in FUSIONS else 'mean'})"
            head = st.selectbox("Head", [None, *range(answer.heads)], key=HEAD_KEY, placeholder=every,
                                format_func=lambda v: every if v is None else f"head {v + 1}")
        if method == "attention" and head is None:
            if st.session_state.get(FUSION_KEY) not in FUSIONS:
                st.session_state[FUSION_KEY] = "mean"
            fusion = st.radio("Heads fused by", FUSIONS, key=FUSION_KEY, horizontal=True,
                              format_func=vlm_ask.FUSION_LABELS.get)
        without_sinks = method == "attention" and inside.sinks_toggle()
        overview = False
        if vlm_ask.tiled(answer, image):  # InternVL's thumbnail, LLaVA-NeXT's base image beside the tiles
            overview = st.toggle("The whole image's view", key=OVERVIEW_KEY,
                                 help="The processor cut the image into tiles and gave the model one more view of "
                                      "the whole image: off, the map over the tiles' canvas; on, over that view.")
    try:
        sinks = inside.kept(answer, ("sinks",), answer.sinks) if without_sinks else None
        map2d = vlm_ask.token_map(answer, token, layer, head, fusion, method, overview, image, sinks)
    except ValueError as e:  # over the memory limit; TAM for several images; every image token a sink
        st.error(_one_line(e))
        return
    try:
        seen = _seen(view, answer, overview, image, more[image - 1] if image and not answer.clip else None)
    except ValueError as e:
        st.error(_one_line(e))
        return
    caption = vlm_ask.describe(answer, token, layer, head, fusion, method, overview, image, frames)
    if sinks is not None:
        caption += " " + escape_markdown(vlm_inside.sinks_caption(answer, sinks, token, layer, image))
    colormap, vmin, vmax = vlm_ask.colours(method, map2d, view.colormap)  # AttnLRP's: around 0
    with col_map:
        drawn = drawing.overlay_image(seen, map2d, view.opacity, colormap, view.mode, view.show_grid, None, vmin, vmax)
        st.image(drawn, output_format="PNG")
        low, high = drawing.map_range(map2d, vmin, vmax)
        st.html(drawing.colorbar_html(low, high, colormap))
        st.caption(caption + " " + drawing.describe_range(map2d))
    with col_strip:
        several = len(answer.layouts) > 1
        shares = vlm_ask.image_shares(answer, layer, image if several else None)
        st.dataframe([{"#": i + 1, "token": visible(answer.pieces[i]), "on the image": 100 * s}
                      for i, s in enumerate(shares)], hide_index=True, width="stretch",
                     column_config={"on the image": st.column_config.ProgressColumn(
                         "on the image", min_value=0.0, max_value=100.0, format="%.1f%%")})
        where = (f"slice {image + 1} of the clip" if answer.clip else f"image {image + 1}") if several else \
            ("the clip" if answer.clip else "the image")
        st.caption(f"How much each answer token looked at {where}: the share of its attention row on "
                   f"{'its' if several else 'the'} image tokens at layer {layer + 1}, mean over heads.")
        inside.logit_lens(answer, token)
    lines = {"Map": "without the visual sinks"} if sinks is not None else {}
    lines.update(inside.knockout(answer, token, image, overview))
    lines.update(inside.heads(answer, token, image, _pick_head))
    if clip is not None and clip[2] == st.session_state.get(RATE_OF_KEY):  # a rate given on the page, not the file's
        lines[share.LABELS["lm_fps"]] = f"{clip[0].fps:g}"
    values = {**shared, **link_values()}
    _share(values, view, answer, seen, map2d, caption, model_name, image_name if clip is None else clip[1],
           dict(question=question, length=int(length), token=token, layer=layer, head=head, fusion=fusion,
                method=method, overview=overview, image=image, frames=frames), lines)


def pick_head(state, cells) -> None:
    """The heads grid's clicked ``cells`` (``(row, column)``; the first): its layer and head become the map's in
    ``state`` (the session's), drawn as the attention at that head."""
    picked = vlm_inside.head_at(tuple(cells[0]) if cells else None)
    if picked is not None:
        state[METHOD_KEY] = "attention"
        state[LAYER_KEY], state[HEAD_KEY] = picked


def _pick_head() -> None:
    """The heads grid's selection callback (``pick_head``)."""
    pick_head(st.session_state, st.session_state[inside.GRID_KEY].selection.cells)


def _share(values: dict[str, object], view: Shown, answer: VLMAnswer, seen, map2d: np.ndarray, caption: str,
           model_name: str, image_name: str, picked: dict, lines: dict[str, str]) -> None:
    """"Copy link to this view" and "Export this answer (HTML)"; the URL follows the clicked token. ``lines``: the
    settings' more lines (inside the language model: the knockout curve, the heads grid)."""
    view_link.follow(values)
    col_link, col_export = st.columns(2)
    view_link.link_popover(col_link, values)
    settings = {"Model": model_name, "Clip" if answer.clip else "Image": image_name,
                **vlm_ask.settings(picked["question"], answer, picked["length"], picked["token"], picked["layer"],
                                   picked["head"], picked["fusion"], picked["method"], picked["overview"],
                                   picked["image"], picked["frames"]), **lines}
    colormap, vmin, vmax = vlm_ask.colours(picked["method"], map2d, view.colormap)  # as the page draws it
    page = View(title=f"{image_name} — {model_name}: where the answer looked", seen=seen, map2d=np.asarray(map2d),
                caption=caption, colormap=colormap, vmin=vmin, vmax=vmax, opacity=view.opacity, mode=view.mode,
                query=0, num_prefix_tokens=1, show_grid=view.show_grid, settings=settings)
    col_export.download_button("Export this answer (HTML)", on_click="ignore", mime="text/html",
                               file_name=f"{file_name_part(image_name.rsplit('.', 1)[0]) or 'image'}-answer.html",
                               data=partial(_export, page),
                               help="One self-contained .html file: the image, the clicked token's map with its "
                                    "colour bar and caption, the question, the answer and these settings. Opens "
                                    "offline.")


def _export(page: View) -> bytes:
    return view_html(page).encode("utf-8")
