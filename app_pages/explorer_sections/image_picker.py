"""The sidebar's image: an upload, a sample of the checkpoint or a file another page opened, and the input size."""

from dataclasses import dataclass
from pathlib import Path

import streamlit as st
from PIL import Image

from app_pages.explorer_sections import share_view
from app_pages.explorer_sections.caches import UPLOAD_TYPES, decode_image
from app_pages.explorer_sections.uploader import file_upload
from vit.app import catalog, drawing, share
from vit.app import explorer_page as explorer
from vit.checkpoint import Checkpoint
from vit.core.images import ImageError
from vit.core.inference import MAX_INPUT_SIDE, InputSize
from vit.core.text import escape_markdown, visible

INPUT_SIDES = (224, 256, 320, 384, 448, 480, 518, 640, 768, 1024)
UPLOAD_KEY = "explorer_upload"
KEPT = ("sample-", "input_side", "keep_aspect", "invert")  # kept by the page while not drawn (a rejected upload)


@dataclass(frozen=True, eq=False)
class ChosenImage:
    """The image decoded (inverted when asked), its file name, its cache key and the size the model sees it at."""

    image: Image.Image
    name: str
    key: str
    size: InputSize
    invert: bool
    samples: list[Path] | None  # the checkpoint's sample images
    sample: Path | None  # the one picked, when no upload or opened file replaces it


def pick_image(entry: catalog.CatalogEntry, entries: dict[str, catalog.CatalogEntry], checkpoint: Checkpoint,
               model_key: str, may_open: bool) -> ChosenImage:
    """The sidebar's image controls; stops the page, saying what to do, without a usable image."""
    st.sidebar.header("Image")
    uploaded = file_upload(st.sidebar, "Upload an image", UPLOAD_KEY, type=UPLOAD_TYPES,
                           help="jpg, png, webp, bmp, gif or tiff; any size and aspect ratio.")
    if "explorer_image" in st.session_state:  # a file another page (Analyse a dataset) asked for, and its folder
        st.session_state["explorer_opened_image"] = st.session_state.pop("explorer_image")
        st.session_state["explorer_opened_image_folder"] = st.session_state.pop("explorer_image_folder", None)
    opened_image = st.session_state.get("explorer_opened_image")
    if opened_image is not None and st.sidebar.button(f"Close {escape_markdown(Path(opened_image).name)}",
                                                      help="Back to the sample images."):
        opened_image = st.session_state["explorer_opened_image"] = None
    samples = catalog.sample_images(entry, list(entries.values()))
    share_view.apply_sample(model_key, samples)
    st.session_state.pop(share_view.SHOWN_KEY, None)
    linked = share_view.linked_upload() if uploaded is None and opened_image is None else None  # a link's upload
    sample = None
    if samples and opened_image is None and linked is None:
        sample = st.sidebar.selectbox("…or a sample image", samples, format_func=explorer.sample_label,
                                      key=f"sample-{model_key}", disabled=uploaded is not None,
                                      help="Remove the upload to use the samples again.")
    pre = checkpoint.preprocessing
    own = max(pre.image_hw)  # the long side of a rectangular training size
    sides = sorted(s for s in {own, 2 * own, 4 * own, *INPUT_SIDES}
                   if s <= MAX_INPUT_SIDE)
    share_view.apply_size([0, *sides])
    # Options are never None: Streamlit shows a None option as an empty "Choose an option" box.
    side = st.sidebar.selectbox(
        share.LABELS["size"], [0, *sides], key="input_side",
        format_func=lambda s: drawing.size_option(s, pre.size_label, pre.own_size_rule),
        help="The size the model sees the image at. Other sizes than the training size interpolate the position "
             "embeddings (as DINO's visualisation does): finer maps, but the predictions may change.")
    keep_aspect = st.sidebar.checkbox(share.LABELS["aspect"], key="keep_aspect",
                                      help="Off: the image is resized to a square, as in training.")
    size = InputSize(side or None, keep_aspect)
    invert = False
    if pre.num_channels == 1:
        invert = st.sidebar.checkbox(
            share.LABELS["invert"], key="invert",
            help="Greyscale models trained on light digits on black (MNIST) need them that way.")
    if uploaded is not None:
        data, image_name = uploaded.getvalue(), uploaded.name
        share_view.keep_upload(data, image_name)
    elif linked is not None:
        data, image_name = linked.data, linked.name or "the linked upload"
    elif opened_image is not None:
        # A path from an analysis.json: read only by a visitor the access rule allows, only a regular file inside the
        # analysed folder, and no more of it than an upload may hold (a mistake named /dev/zero filled the memory).
        folder = st.session_state.get("explorer_opened_image_folder")
        try:
            if not may_open or not folder:
                raise ImageError(f"{Path(opened_image).name} is not an image of a folder this visit analysed")
            data = explorer.read_image_file(opened_image, folder, st.get_option("server.maxUploadSize") * 2**20)
        except ImageError as e:
            st.error(f"Cannot open this image: {escape_markdown(visible(str(e)))}")
            st.stop()
        image_name = Path(opened_image).name
    elif sample is not None:
        data, image_name = sample.read_bytes(), sample.name
    else:
        st.info("Upload an image in the sidebar to see what the model attends to.")
        drawing.warm_up()  # once per server, while the user picks a file: the first upload then costs what others do
        st.stop()
    digest = explorer.image_digest(data)
    try:
        image = decode_image(digest, image_name, invert, data)
    except ImageError as e:
        st.error(f"Cannot use this upload: {escape_markdown(e)}")
        st.stop()
    patch_px = max(checkpoint.model.config.patch_hw)
    if min(image.size) < patch_px:  # e.g. a 1x1 upload: accepted (the views handle it), but said
        st.sidebar.warning(f"This image is {image.width}×{image.height} px, less than one {patch_px}-px patch on a "
                           "side: the model sees it enlarged, and its maps say little about it.")
    if explorer.looks_inverted(image, pre):
        st.sidebar.warning("This image is light where the training images were dark: try "
                           + ("turning Invert off." if invert else "Invert."))
    image_key = f"{digest}-inverted" if invert else digest
    return ChosenImage(image, image_name, image_key, size, invert, samples, sample)
