"""The explorer for SAM 3 (issue 94, item 3): a concept typed as a noun phrase, with an exemplar box or alone, and
the instances transformers' ``Sam3Model`` finds of it on the image (``vit.segment(vit.open_sam3(folder), ...)``):
each kept instance tinted with its box and score, and for the picked one which image tokens its object query
attended to in a layer of the DETR decoder's vision cross-attention (one head or their mean), drawn over the input
the model saw. SAM 3 runs nowhere but in transformers here, so the page's other sections (which read our own ViT)
are not drawn. The view is a link (the upload named by its hash) and an offline HTML file; the concept is data:
shown as plain text, escaped where a caption reads Markdown."""

from functools import partial

import numpy as np
import streamlit as st
from PIL import Image

import vit
from app_pages.explorer_sections import share_view, view_link
from app_pages.explorer_sections.caches import UPLOAD_TYPES, decode_image
from app_pages.explorer_sections.image_picker import UPLOAD_KEY
from app_pages.explorer_sections.uploader import file_upload
from vit.app import catalog, drawing
from vit.app import explorer_page as explorer
from vit.app.export import View, view_html
from vit.app.sam_prompt_view import box_text, parse_box
from vit.core.images import ImageError
from vit.core.text import escape_markdown, file_name_part, visible
from vit.explain.views.overlay import display_image, map_colours

TEXT_KEY, BOX_KEY, THRESHOLD_KEY = "concept_text", "concept_box", "concept_threshold"
INSTANCE_KEY, LAYER_KEY, HEAD_KEY = "concept_instance", "concept_layer", "concept_head"
METHOD_KEY, PIXELS_KEY = "concept_method", "concept_pixels"  # the map drawn; the last pixel map, kept
# The maps of the picked instance: its query's decoder attention, or which pixels made its mask
METHODS = {"attention": "decoder attention", "gradient_x_input": "gradient × input", "attnlrp": "AttnLRP (signed)"}
RESULT_KEY = "concept_result"  # the last answer: (its key, the ConceptSegmentation)
ASKED_KEY = "concept_asked"  # the (image, concept, box, threshold) the instance was picked among
KEPT = ("concept_text", "concept_box", "concept_threshold", "concept_instance", "concept_layer", "concept_head",
        "concept_method")
# Link parameter -> the widget it sets (the instance, layer and head from 1; head 0: the heads' mean)
LINKED = {"concept": TEXT_KEY, "cbox": BOX_KEY, "cthreshold": THRESHOLD_KEY, "instance": INSTANCE_KEY,
          "clayer": LAYER_KEY, "chead": HEAD_KEY, "cmethod": METHOD_KEY}
MEAN = -1  # the head picker's "the heads' mean"


def applies(path) -> bool:
    """Whether the picked checkpoint is a SAM 3 folder (its config.json's model_type)."""
    from vit.sources.sam3 import is_sam3

    return path is not None and is_sam3(path)


@st.cache_resource(max_entries=1, show_spinner="Opening SAM 3 as transformers builds it…")
def _opened(folder: str, fingerprint: tuple):
    return vit.open_sam3(folder)


def _one_line(error: Exception) -> str:
    return escape_markdown(visible(str(error).splitlines()[0] if str(error) else repr(error)))


def _take_link() -> None:
    """The link's concept, box, threshold, instance, layer and head as the widgets' values, once."""
    pending = st.session_state.get(share_view.PENDING_KEY) or {}
    for name, key in LINKED.items():
        if name in pending:
            value = pending.pop(name)
            st.session_state[key] = (box_text(value) if name == "cbox" else
                                     value - 1 if name in ("instance", "clayer") else
                                     (MEAN if value == 0 else value - 1) if name == "chead" else value)


SAM3_HINT = ("Upload an image in the sidebar, then type a concept (a noun phrase such as “a red dog”): SAM 3 finds "
             "every instance of it.")


def sidebar_image(entry: catalog.CatalogEntry, entries: dict, model_key: str, hint: str = SAM3_HINT,
                  model: str = "SAM 3") -> tuple[Image.Image, str, str, bool]:
    """The sidebar's image (an upload, a link's upload, else a sample) as (image, name, digest, a sample's), for a
    page whose model runs as its library builds it (SAM 3's, a VLM's whose tower no port reads); stops the page,
    saying what to do (``hint``), without one."""
    st.sidebar.header("Image")
    uploaded = file_upload(st.sidebar, "Upload an image", UPLOAD_KEY, type=UPLOAD_TYPES,
                           help=f"jpg, png, webp, bmp, gif or tiff; {model} sees it as its own processor prepares "
                                "it.")
    linked = share_view.linked_upload() if uploaded is None else None
    samples = catalog.sample_images(entry, list(entries.values()))
    named = (st.session_state.get(share_view.PENDING_KEY) or {}).pop("sample", None)  # a link's sample
    if named is not None:
        st.session_state[f"sample-{model_key}"] = next((p for p in samples or [] if p.name == named), None)
    sample = None
    if samples and uploaded is None and linked is None:
        sample = st.sidebar.selectbox("…or a sample image", samples, format_func=explorer.sample_label,
                                      key=f"sample-{model_key}")
    if uploaded is not None:
        data, name = uploaded.getvalue(), uploaded.name
        share_view.keep_upload(data, name)  # a link to this view names it
    elif linked is not None:
        data, name = linked.data, linked.name or "the linked image"
    elif sample is not None:
        data, name = sample.read_bytes(), sample.name
    else:
        st.info(hint)
        st.stop()
    digest = explorer.image_digest(data)
    try:
        return decode_image(digest, name, False, data), name, digest, sample is not None and uploaded is None
    except ImageError as e:
        st.error(f"Cannot use this image: {_one_line(e)}")
        st.stop()


def _segmented(sam3, fingerprint: tuple, image: Image.Image, digest: str, text: str | None,
               box: tuple | None, threshold: float, instance: int | None) -> vit.ConceptSegmentation:
    """``vit.segment``'s answer, kept for the last (image, concept, threshold, instance): a click on a layer or a
    head only redraws."""
    key = (fingerprint, digest, text, box, threshold, instance)
    kept = st.session_state.get(RESULT_KEY)
    if kept is None or kept[0] != key:
        with st.spinner("Finding the concept…"):  # kept before the spinner's end, where a run may be stopped
            kept = st.session_state[RESULT_KEY] = (key, vit.segment(sam3, image, text=text, box=box,
                                                                     threshold=threshold, instance=instance))
    return kept[1]


def concept_view(entry: catalog.CatalogEntry, entries: dict, model_key: str, model_text: str) -> None:
    """The page for a SAM 3 folder: the image, the concept, its instances and the picked one's decoder attention,
    with a link and an HTML export of the view."""
    _take_link()
    fingerprint = catalog.Candidate(entry.path, entry.source, entry.name).fingerprint
    try:
        sam3 = _opened(str(entry.path), fingerprint)
    except ValueError as e:  # SourceError: a file missing, weights that do not fit, a config past the bounds
        st.error(f"This checkpoint cannot be loaded: {_one_line(e)}")
        st.stop()
    image, image_name, digest, is_sample = sidebar_image(entry, entries, model_key)
    st.subheader("Find a concept (SAM 3)")
    col_text, col_box, col_threshold = st.columns([2, 1.4, 1])
    # No max_chars: Streamlit would show a counter; the concept's bound is checked by vit.segment (one line if over).
    text = col_text.text_input("Concept", key=TEXT_KEY, placeholder="a red dog",
                               help="A noun phrase, read by SAM 3's text encoder exactly as typed (plain text).")
    box_typed = col_box.text_input("Exemplar box (optional)", key=BOX_KEY, placeholder="x0,y0,x1,y1",
                                   help="One instance of the concept, a box in the image's own pixels (x from the "
                                        "left, y from the top).")
    threshold = col_threshold.slider("Score threshold", 0.0, 0.95, 0.5, 0.05, key=THRESHOLD_KEY,
                                     help="Instances scored over it are kept (the query's score times the "
                                          "concept's presence score), as transformers' post-processing keeps them.")
    box = None
    if box_typed.strip():
        try:
            box = parse_box(box_typed.strip())
        except ValueError as e:
            st.error(_one_line(e))
            return
    view_link.follow(_asked_values(model_text, image_name, is_sample, text.strip() or None, box))  # the found
    if not text.strip() and box is None:  # instance's view (``_draw``) adds to it
        st.image(display_image(image, max_side=480), output_format="PNG")  # the image the concept will be found in
        st.caption("Type a concept (a noun phrase), or give an exemplar box: SAM 3 finds every instance of it, and "
                   "the page shows which image tokens each instance's object query looked at.")
        return
    asked = (digest, text.strip(), box, float(threshold))
    if st.session_state.get(ASKED_KEY, asked) != asked:  # another concept: its instances are others
        st.session_state.pop(INSTANCE_KEY, None)
    st.session_state[ASKED_KEY] = asked
    picked = st.session_state.get(INSTANCE_KEY)
    try:
        found = _segmented(sam3, fingerprint, image, digest, text.strip() or None, box, float(threshold),
                           picked if isinstance(picked, int) and picked >= 0 else None)
    except ValueError as e:  # PromptError, the cost model's: one line
        st.error(_one_line(e))
        return
    def pixel_map(method: str) -> np.ndarray:  # which pixels made the instance's mask: one forward and backward
        key = (fingerprint, digest, text.strip() or None, box, float(threshold), found.instance, method)
        kept = st.session_state.get(PIXELS_KEY)
        if kept is None or kept[0] != key:
            with st.spinner(f"Computing {METHODS[method]} of the instance's mask…"):  # kept before its end
                done = vit.segment(sam3, image, text=key[2], box=box, threshold=key[4], instance=found.instance,
                                   methods=[method])
                kept = st.session_state[PIXELS_KEY] = (key, done.maps[method])
        return kept[1]

    patch = int(sam3.model.config.vision_config.backbone_config.patch_size)
    _draw(found, image_name, model_text, entry.name, is_sample, pixel_map, patch)


def _asked_values(model_text: str, image_name: str, is_sample: bool, text: str | None,
                  box: tuple | None) -> dict[str, object]:
    """The view's part that a concept's answer does not decide, as ``vit.app.share``'s values: the model, the image
    (a sample by name, an upload by the server's store's SHA-256), the concept, its box and the threshold."""
    values = {"model": model_text,
              **({"sample": image_name} if is_sample else {"upload": st.session_state.get(share_view.SHOWN_KEY)}),
              "concept": text, "cbox": box, "cthreshold": st.session_state.get(THRESHOLD_KEY)}
    return {k: v for k, v in values.items() if v is not None}


def scores_caption(presence: float) -> str:
    """What the presence score beside the instances is, and which score the threshold reads."""
    return (f"The concept's presence score, {presence:.3f}, is how sure SAM 3 is that the concept is in the image at "
            "all; each instance's score, which the threshold keeps or drops, is its object query's own score times "
            "that presence score.")


def _draw(found, image_name: str, model_text: str, model_name: str, is_sample: bool, pixel_map, patch: int) -> None:
    """The instances and the picked one's map, with the view's link (``model_text``: the model as a link names it)
    and export (``model_name``: its name, never the server's path)."""
    count = len(found.scores)
    col_picture, col_instances = st.columns([1.2, 1], gap="medium")
    col_picture.image(display_image(found.picture(), max_side=480), output_format="PNG")
    col_picture.caption(scores_caption(found.presence))
    if found.instance is None:
        col_instances.info(f"No instance scored over the threshold ({count} kept): lower it, or change the concept.")
        return
    with col_instances:
        st.dataframe([{"#": i + 1, "score": float(s), "box (x0, y0, x1, y1)": ", ".join(f"{v:.0f}" for v in b)}
                      for i, (s, b) in enumerate(zip(found.scores, found.boxes, strict=True))],
                     hide_index=True, width="stretch")
        st.session_state[INSTANCE_KEY] = found.instance
        st.selectbox("Instance", list(range(count)), key=INSTANCE_KEY,
                     format_func=lambda i: f"{i + 1}: score {found.scores[i]:.3f}",
                     help="The instance explained: tinted on the image, its object query's attention below. "
                          "Instances, layers and heads count from 1 here and in the page's link; "
                          "vit.segment(instance=) counts from 0, as the rest of the API.")
        if st.session_state.get(METHOD_KEY) not in METHODS:
            st.session_state[METHOD_KEY] = "attention"
        method = st.radio("Map", list(METHODS), key=METHOD_KEY, format_func=METHODS.get, horizontal=True,
                          help="Which image tokens the instance's object query attended to in the DETR decoder; "
                               "or which input pixels made its mask: the gradient of its mask's logits (summed "
                               "over the mask) times the input, or AttnLRP (lxt's rules), red for and blue against "
                               "(one forward and backward each).")
        layer = head = None
        if method == "attention":
            names = list(found.attention)
            if st.session_state.get(LAYER_KEY) not in range(len(names)):
                st.session_state[LAYER_KEY] = len(names) - 1
            layer = st.selectbox("Decoder layer", list(range(len(names))), key=LAYER_KEY,
                                 format_func=lambda k: str(k + 1),
                                 help="A layer of the DETR decoder: its vision cross-attention, from the instance's "
                                      "object query to the image tokens.")
            heads = found.attention[names[layer]]
            if st.session_state.get(HEAD_KEY) not in (MEAN, *range(len(heads))):
                st.session_state[HEAD_KEY] = MEAN
            head = st.selectbox("Head", [MEAN, *range(len(heads))], key=HEAD_KEY,
                                format_func=lambda h: "all heads (mean)" if h == MEAN else f"head {h + 1}")
    title = f"**Instance {found.instance + 1}** (score {found.scores[found.instance]:.3f})"
    grid, colormap, vmin, vmax = None, "inferno", None, None
    if method == "attention":
        map2d = heads.mean(axis=0) if head == MEAN else heads[head]
        which = "the heads' mean" if head == MEAN else f"head {head + 1}"
        caption = (f"{title}, decoder layer {layer + 1}, {which}: each patch holds the attention of the instance's "
                   "object query to the image token covering it, in the DETR decoder's vision cross-attention, as "
                   "transformers' eager attention forms it (the box's relative position bias included), over the "
                   "input SAM 3 saw.")
    else:
        try:
            map2d = pixel_map(method)
        except ValueError as e:  # the cost model's refusal: one line
            st.error(_one_line(e))
            return
        grid = (map2d.shape[0] // patch, map2d.shape[1] // patch)
        colormap, vmin, vmax = map_colours(method, map2d, "inferno")  # AttnLRP's: around 0
        caption = (f"{title}, {METHODS[method]}: each input pixel holds the gradient of the instance's mask logits "
                   "(summed over its mask) times the pixel, summed over the colour channels"
                   + (", under lxt's AttnLRP rules: red for the mask, blue against it" if method == "attnlrp" else "")
                   + ", over the input SAM 3 saw.")
    drawn = drawing.overlay_image(found.seen, map2d, 0.6, colormap, "bilinear", False, None, vmin, vmax, grid=grid)
    col_map, col_bar = st.columns([1.2, 1], gap="medium")
    col_map.image(display_image(drawn, max_side=480), output_format="PNG")
    low, high = drawing.map_range(map2d, vmin, vmax)
    with col_bar:
        st.html(drawing.colorbar_html(low, high, colormap))
        st.caption(caption + " " + drawing.describe_range(map2d, vmin, vmax))
    values = {**_asked_values(model_text, image_name, is_sample, found.text, found.box),
              "instance": found.instance + 1, "cmethod": None if method == "attention" else method,
              "clayer": None if layer is None else layer + 1,
              "chead": None if head is None else 0 if head == MEAN else head + 1}
    values = {k: v for k, v in values.items() if v is not None}
    view_link.follow(values)
    col_link, col_export = st.columns(2)
    view_link.link_popover(col_link, values)
    settings = {"Model": model_name, "Image": image_name, "Concept": found.text or "(an exemplar box alone)",
                "Exemplar box": box_text(found.box) if found.box else "none",
                "Score threshold": f"{st.session_state.get(THRESHOLD_KEY):g}",
                "Instance": f"{found.instance + 1} of {count}", "Map": METHODS[method],
                **({"Decoder layer": str(layer + 1), "Head": "all (mean)" if head == MEAN else str(head + 1)}
                   if method == "attention" else {})}
    page = View(title=f"{image_name} — SAM 3: {found.text or 'an exemplar'}", seen=found.seen,
                map2d=np.asarray(map2d), caption=caption, colormap=colormap, vmin=vmin, vmax=vmax, grid=grid,
                settings=settings)
    col_export.download_button("Export this view (HTML)", on_click="ignore", mime="text/html",
                               file_name=f"{file_name_part(image_name.rsplit('.', 1)[0]) or 'image'}-concept.html",
                               data=partial(_export, page),
                               help="One self-contained .html file: the input, the instance's map with its colour "
                                    "bar and caption, and these settings. Opens offline.")


def _export(page: View) -> bytes:
    return view_html(page).encode("utf-8")
