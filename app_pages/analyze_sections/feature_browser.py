"""The Analyse page's feature browser (issue 36): an SAE's features as grids of their dataset exemplars, ordered by
how often they fire or by the class their exemplars come from.

It reads what ``python -m vit.sae train`` wrote (the SAE, ``features.npz``) and crops each exemplar from its image in
the folder the SAE was trained from, which must lie in the data folders as the page's image folders do. The SAE must
fit the checkpoint chosen above (its model, layer and width): the crops are placed with that model's preprocessing.
"""

from pathlib import Path

import streamlit as st

from app_pages.explorer_sections import feature_exemplars, sae_files
from vit.core.text import escape_markdown, visible
from vit.features import explore
from vit.features.autoencoder import SAEError, check_fits, stream_shape
from vit.runs.launch import default_data_roots, folder_problem, resolve_dataset
from vit.sources.open import open_source

TOGGLE_KEY, FOLDER_KEY, IMAGES_KEY = "browse_features", "browse_sae_folder", "browse_sae_images"
ORDER_KEY, CLASS_KEY, PAGE_KEY = "browse_order", "browse_class", "browse_page"
ORDERS = {"frequency": "most frequent first", "rare": "rarest first", "class": "by class (purest first)"}
ALL_CLASSES = "(every class)"
FEATURES_PER_PAGE = 10
EXEMPLARS_PER_FEATURE = 8


@st.cache_resource(max_entries=1, show_spinner="Loading the checkpoint…")
def browsed_model(path: str, version: tuple):
    return open_source(path)


@st.cache_resource(max_entries=2, show_spinner="Reading the features…")
def table_and_fit(folder: str, version: tuple, model_path: str, model_version: tuple, _checkpoint
                  ) -> tuple[explore.FeatureTable, int]:
    sae = sae_files.open_sae(folder, version, "cpu")
    layer = check_fits(sae, _checkpoint.model)
    return explore.read_features(Path(folder) / explore.FEATURES_FILE, sae.d_sae), layer


def _stat(path: str) -> tuple:
    try:
        info = Path(path).stat()
        return info.st_mtime_ns, info.st_size
    except OSError:
        return ()


def feature_browser(model_path: str) -> None:
    """The browser of an SAE trained on the checkpoint at ``model_path``, behind a toggle."""
    if not st.toggle("Browse a sparse autoencoder's features", key=TOGGLE_KEY,
                     help="The features of an SAE trained on this checkpoint (python -m vit.sae train), each with "
                          "the held-out patches it fires on most."):
        return
    folder = st.text_input("SAE folder", key=FOLDER_KEY, placeholder="/path/to/sae folder",
                           help="What python -m vit.sae train --out wrote: cfg.json, sae_weights.safetensors and "
                                "features.npz.").strip()
    if not folder:
        return
    try:
        checkpoint = browsed_model(model_path, _stat(model_path))
        table, layer = table_and_fit(folder, sae_files.folder_version(Path(folder)), model_path, _stat(model_path),
                                     checkpoint)
    except (SAEError, ValueError, OSError) as e:
        st.error(escape_markdown(e))
        return
    grid, prefix, _ = stream_shape(checkpoint.model, layer)  # a stage layer's own grid (Swin, Hiera)
    if table.tokens_per_image != prefix + grid[0] * grid[1]:
        st.error(f"features.npz describes images of {table.tokens_per_image} tokens; this model reads "
                 f"{prefix + grid[0] * grid[1]}: choose the checkpoint the SAE was trained on")
        return
    st.caption(f"{len(table.frequency):,} features of layer {layer}'s output. "
               + (sae_files.metrics_line(folder) or ""))
    if IMAGES_KEY not in st.session_state:  # metrics.json read once, not on every rerun
        st.session_state[IMAGES_KEY] = feature_exemplars.metrics_data(folder)
    images = st.text_input("Exemplar images folder", key=IMAGES_KEY,
                           help="The folder the SAE was trained from (--data): features.npz names its images "
                                "relative to it. It must lie in the data folders.").strip()
    problem = folder_problem(resolve_dataset(f"folder:{images}"), default_data_roots()) if images else None
    if problem:
        st.error(escape_markdown(problem.replace("folder datasets", "image folders")))
        images = ""
    left, middle, right = st.columns(3)
    order = left.radio("Order", list(ORDERS), format_func=ORDERS.get, key=ORDER_KEY, horizontal=True)
    classes = sorted({c for latent in range(len(table.frequency)) if table.images[latent, 0] >= 0
                      for c in [table.dominant_class(latent)] if c is not None}, key=lambda c: c[0])
    names = [ALL_CLASSES] + sorted({name for name, _ in classes})
    chosen = middle.selectbox("Class of the exemplars", names, key=CLASS_KEY, format_func=visible,
                              help="A feature's class: the folder most of its exemplar images lie in.")
    latents = explore.browse_order(table, order, None if chosen == ALL_CLASSES else chosen)
    pages = max(1, -(-len(latents) // FEATURES_PER_PAGE))
    page = right.number_input(f"Page (of {pages})", 1, pages, 1, key=PAGE_KEY)
    st.caption(f"{len(latents):,} features with exemplars, {FEATURES_PER_PAGE} a page.")
    for latent in latents[(page - 1) * FEATURES_PER_PAGE:page * FEATURES_PER_PAGE]:
        dominant = table.dominant_class(latent)
        mostly = f" · mostly {visible(dominant[0])} ({dominant[1]:.0%})" if dominant else ""
        st.text(f"Feature {latent} · fires on {float(table.frequency[latent]):.2%} of tokens{mostly}")
        found = table.exemplars(latent, distinct=True)[:EXEMPLARS_PER_FEATURE]
        if not images:
            continue
        feature_exemplars.exemplar_row(found, images, checkpoint, EXEMPLARS_PER_FEATURE, grid, prefix)
