"""A feature's exemplars (issue 36): its strongest held-out patches, cropped from the images the SAE's
``features.npz`` names, in the explorer's Features section; the Analyse page's feature browser crops them alike."""

from pathlib import Path

import streamlit as st
from PIL import Image

from app_pages.explorer_sections.caches import IMAGE_CACHE_BYTES, byte_cache
from app_pages.explorer_sections.state import Shown
from vit.app import explorer_page as explorer
from vit.checkpoint import Checkpoint
from vit.core.images import UPLOAD_MAX_PIXELS, ImageError, open_image
from vit.core.runfiles import parse_json, read_text_bounded
from vit.core.text import escape_markdown, visible
from vit.features import explore
from vit.features.autoencoder import SAEError, SparseAutoencoder, stream_shape

IMAGES_KEY = "sae_exemplar_folder"  # the folder the exemplars' images are read from
EXEMPLARS_SHOWN = 8
DRIVER_EXEMPLARS = 6  # each driving feature's, in a row under its share
THUMBNAIL_SIDE = 96


@st.cache_resource(max_entries=2, show_spinner="Reading the features' exemplars…")
def feature_table(folder: str, version: tuple, d_sae: int) -> explore.FeatureTable:
    return explore.read_features(Path(folder) / explore.FEATURES_FILE, d_sae)


def exemplar_thumbnail(images_folder: str, name: str, token: int, checkpoint: Checkpoint, grid: tuple[int, int],
                       prefix: int) -> Image.Image:
    """An exemplar's crop from its image file, a regular file inside ``images_folder`` of bounded size, read once."""
    def make() -> Image.Image:
        path = Path(images_folder) / name
        data = explorer.read_image_file(path, images_folder, st.get_option("server.maxUploadSize") * 2**20)
        image = open_image(data, name=path.name, max_pixels=UPLOAD_MAX_PIXELS)
        return explore.exemplar_thumbnail(image, checkpoint.preprocessing, grid, prefix, token, THUMBNAIL_SIDE)
    key = ("exemplar", images_folder, name, token, grid, prefix, checkpoint.preprocessing)
    return byte_cache("images", IMAGE_CACHE_BYTES).get_or_compute(key, make)


def short_name(name: str, length: int = 12) -> str:
    """An exemplar's image name as shown under it: its end (the class folder and the file), control characters as
    escapes."""
    name = visible(name)
    return name if len(name) <= length else "…" + name[-(length - 1):]


def metrics_data(folder: str) -> str:
    """The folder the SAE was trained from, as its metrics.json says ("" when it does not)."""
    try:
        data = parse_json(read_text_bounded(Path(folder) / "metrics.json")).get("data")
        return data if isinstance(data, str) else ""
    except (OSError, ValueError, AttributeError):
        return ""


def harvested(view: Shown, sae: SparseAutoencoder, folder: str, version: tuple, layer: int
              ) -> tuple[explore.FeatureTable, tuple[int, int], int]:
    """The SAE's features.npz with the grid and prefix tokens its exemplars' tokens lie on (``layer``: the block, from
    1, whose output the SAE reads); SAEError in one line where there are none or they cannot be placed."""
    if not Path(folder).is_dir():
        raise SAEError("Exemplars come from the features.npz python -m vit.sae train writes into its SAE folder; "
                       "this SAE is a single file.")
    table = feature_table(folder, version, sae.d_sae)
    grid, prefix, _ = stream_shape(view.full_checkpoint.model, layer)
    if table.tokens_per_image != prefix + grid[0] * grid[1]:
        raise SAEError(f"features.npz describes images of {table.tokens_per_image} tokens; the model reads "
                       f"{prefix + grid[0] * grid[1]} at its own size: no crops can be placed.")
    return table, grid, prefix


def images_folder(folder: str) -> str:
    """The folder the exemplars' images are read from: as typed under the shown feature's exemplars, at first the
    one the SAE's metrics.json names (read once, not on every rerun)."""
    if IMAGES_KEY not in st.session_state:
        st.session_state[IMAGES_KEY] = metrics_data(folder)
    return str(st.session_state[IMAGES_KEY] or "").strip()


def exemplars(view: Shown, sae: SparseAutoencoder, folder: str, version: tuple, latent: int, layer: int) -> None:
    """The feature's top activating held-out patches, cropped from the images features.npz names (``layer``: the
    block, from 1, whose output the SAE reads)."""
    st.markdown(f"**Feature {latent}'s exemplars** (its strongest patches on the SAE's held-out images)")
    try:
        table, grid, prefix = harvested(view, sae, folder, version, layer)
    except SAEError as e:
        st.caption(escape_markdown(e))
        return
    images_folder(folder)
    typed = st.text_input("Exemplar images folder", key=IMAGES_KEY,
                          help="The folder the SAE was trained from (python -m vit.sae train --data): "
                               "features.npz names its images relative to it.").strip()
    found = table.exemplars(latent, distinct=True)[:EXEMPLARS_SHOWN]
    st.caption(f"Fires on {float(table.frequency[latent]):.2%} of the held-out tokens.")
    if not found or not typed:
        return
    exemplar_row(found, typed, view.full_checkpoint, EXEMPLARS_SHOWN, grid, prefix)


def drivers_exemplars(view: Shown, sae: SparseAutoencoder, folder: str, version: tuple, layer: int,
                      drivers: list[tuple[int, float]]) -> None:
    """Each feature that drives the prediction ``(latent, share)`` with its strongest held-out patches, where the
    SAE has harvested them (its folder's features.npz); else nothing: the shown feature's exemplars say why."""
    try:
        table, grid, prefix = harvested(view, sae, folder, version, layer)
    except SAEError:
        return
    typed = images_folder(folder)
    with st.expander("Their exemplars", expanded=True):
        if not typed:
            st.caption("Name the folder the SAE was trained from under the shown feature's exemplars below to see "
                       "these features' strongest patches.")
        for latent, share in drivers:
            st.text(f"Feature {latent} · {share:+.3g} of the logit · fires on "
                    f"{float(table.frequency[latent]):.2%} of the held-out tokens")
            found = table.exemplars(latent, distinct=True)[:DRIVER_EXEMPLARS]
            if found and typed:
                exemplar_row(found, typed, view.full_checkpoint, DRIVER_EXEMPLARS, grid, prefix)


def exemplar_row(found: list, images_folder: str, checkpoint: Checkpoint, columns: int, grid: tuple[int, int],
                 prefix: int) -> None:
    """Exemplars ``(name, token, value)`` as crops in ``columns`` columns, each with its short name and value
    (``grid``, ``prefix``: the SAE layer's tokens at the model's size, ``stream_shape``)."""
    for column, (name, token, value) in zip(st.columns(columns), found, strict=False):
        with column:
            try:
                st.image(exemplar_thumbnail(images_folder, name, token, checkpoint, grid, prefix),
                         output_format="PNG")
            except (ImageError, ValueError, OSError) as e:
                st.text(visible(str(e))[:120])
            # Unwrapped and short enough for an eighth of the page (a path wrapped at any character, mid-word); the
            # whole name on hover.
            st.text(f"{short_name(name)}\n{value:.3g}", wrap=False, help=visible(name))
