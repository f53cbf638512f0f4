"""Explore a ViT's attention: a checkpoint and an image in the sidebar, any layer, head, query or map.

The model runs once per (checkpoint, image); changing a layer, head, query or overlay setting
only redraws. The computations are plain functions in ``vit/`` (mostly ``vit.explorer``).
Other pages open a checkpoint here by setting ``st.session_state["explorer_checkpoint"]``
to its path before ``st.switch_page("pages/explorer.py")``, and an image file by setting
``st.session_state["explorer_image"]`` to its path.
"""

import math
from functools import partial
from pathlib import Path

import streamlit as st
from PIL import Image

from vit import access, catalog, compare, explorer, snapshots
from vit.attention import HEAD_FUSIONS
from vit.cache import ByteCache
from vit.checkpoint import Checkpoint, CheckpointError
from vit.images import MAX_SIDE, UPLOAD_MAX_PIXELS, ImageError, open_image
from vit.overlay import UPSAMPLE_MODES, overlay
from vit.sources import open_source
from vit.text import escape_markdown

UPLOAD_TYPES = ["jpg", "jpeg", "png", "webp", "bmp", "gif"]
PICKER_CONFIG = {"displayModeBar": False, "scrollZoom": False, "doubleClick": False}


# -- caches: the model once per checkpoint file, the forward pass once per (checkpoint, image) ----------------
# Server-wide and bounded by bytes, not entries: one entry may be a 2-MB model or a 1-GB one.
MODEL_CACHE_BYTES = 1536 * 2**20
IMAGE_CACHE_BYTES = 256 * 2**20  # decoded images are at most 2048 px on their long side (12 MB)
ANALYSIS_CACHE_BYTES = 512 * 2**20
RELEVANCE_CACHE_BYTES = 256 * 2**20


@st.cache_resource(show_spinner=False)
def byte_cache(name: str, max_bytes: int) -> ByteCache:
    return ByteCache(max_bytes)


@st.cache_data(show_spinner=False, max_entries=256)
def describe_checkpoint(path: str, source: str, name: str, fingerprint: tuple) -> catalog.CatalogEntry:
    return catalog.describe(catalog.Candidate(Path(path), source, name))


def load_model(path: str, fingerprint: tuple) -> Checkpoint:
    def load() -> Checkpoint:
        with st.spinner("Loading the checkpoint…"):
            return open_source(path)  # our .pt files, HF / timm folders, timm / torchvision weights
    return byte_cache("models", MODEL_CACHE_BYTES).get_or_compute((path, fingerprint), load)


def decode_image(digest: str, name: str, data: bytes) -> Image.Image:
    return byte_cache("images", IMAGE_CACHE_BYTES).get_or_compute(
        ("decoded", digest, name), lambda: open_image(data, name=name, max_pixels=UPLOAD_MAX_PIXELS))


def display_images(digest: str, image: Image.Image) -> tuple[Image.Image, str, Image.Image]:
    """The image at display size (and as a data URI for the patch picker), and small for the heads grid."""
    def make() -> tuple[Image.Image, str, Image.Image]:
        shown = explorer.display_image(image)
        return shown, explorer.png_data_uri(shown), explorer.display_image(image, min_side=96, max_side=144)
    return byte_cache("images", IMAGE_CACHE_BYTES).get_or_compute(("display", digest), make)


def analyse(fingerprint: tuple, digest: str, checkpoint: Checkpoint, image: Image.Image) -> explorer.Analysis:
    def run() -> explorer.Analysis:
        with st.spinner("Running the model…"):
            return explorer.analyse(checkpoint, image)
    return byte_cache("analyses", ANALYSIS_CACHE_BYTES).get_or_compute((fingerprint, digest), run)


def class_relevance(fingerprint: tuple, digest: str, class_index: int, checkpoint: Checkpoint,
                    image: Image.Image) -> explorer.ClassRelevance:
    def run() -> explorer.ClassRelevance:
        with st.spinner("Computing the class-specific map (one backward pass)…"):
            return explorer.class_relevance(checkpoint, image, class_index)
    return byte_cache("relevance", RELEVANCE_CACHE_BYTES).get_or_compute((fingerprint, digest, class_index), run)


@st.cache_resource(max_entries=64, show_spinner="Computing the map (attention flow: seconds, minutes on ViT-B)…")
def method_map(fingerprint: tuple, digest: str, kind: str, class_index: int, query: int, end_layer: int, fusion: str,
               _checkpoint: Checkpoint, _image: Image.Image):
    return explorer.model_method_map(_checkpoint, _image, kind, class_index, query, end_layer, fusion)


def pick_query(query_key: str, num_prefix_tokens: int) -> None:
    """A click on the image made a patch the query."""
    token = explorer.token_from_selection(st.session_state["patch_picker"].selection, num_prefix_tokens)
    if token is not None:
        st.session_state[query_key] = token


# -- checkpoint -----------------------------------------------------------------------------------------------

candidates = catalog.find_checkpoints() + catalog.find_hf_cache_models()
extra = st.session_state.setdefault("explorer_extra_checkpoints", [])  # opened by path here or from another page
opened = st.sidebar.text_input("Open a path", key="explorer_open_path", placeholder="/path/to/model folder or file",
                               help="A file or folder on the server: one of our .pt checkpoints, a Hugging Face "
                                    "or timm model folder, or timm / torchvision weights.").strip()
if not access.is_local_address(st.get_option("server.address")):
    opened = ""  # a visitor from the network may not read files of the server by path
requested = st.session_state.pop("explorer_checkpoint", None) or (opened if opened != st.session_state.get(
    "explorer_opened_path") else None)
st.session_state["explorer_opened_path"] = opened
if requested:
    wanted = catalog.candidate_for(requested, candidates + extra)
    if wanted not in candidates + extra:
        extra.append(wanted)
    st.session_state["explorer_checkpoint_choice"] = str(wanted.path)
candidates = candidates + [c for c in extra if c not in candidates]
entries = {str(c.path): describe_checkpoint(str(c.path), c.source, c.name, c.fingerprint) for c in candidates}

st.sidebar.header("Checkpoint")
if not entries:
    st.title("ViT Attention Explorer")
    st.info(f"No checkpoints yet: put a .pt file in {escape_markdown(catalog.default_checkpoints_dir())} or train "
            "a model on the Train page.")
    st.stop()
default = catalog.default_entry(list(entries.values())) or next(iter(entries.values()))
if st.session_state.get("explorer_checkpoint_choice") not in entries:
    # Remembered across pages (widget state is not) and reset when its file disappears.
    st.session_state["explorer_checkpoint_choice"] = st.session_state.get("explorer_last_checkpoint", "")
    if st.session_state["explorer_checkpoint_choice"] not in entries:
        st.session_state["explorer_checkpoint_choice"] = str(default.path)
choice = st.sidebar.selectbox("Checkpoint", list(entries), format_func=lambda p: entries[p].label,
                              key="explorer_checkpoint_choice",
                              help="Shipped checkpoints, completed training runs, the supported models of the "
                                   "local Hugging Face cache and models opened by path.")
st.session_state["explorer_last_checkpoint"] = choice
entry = entries[choice]
st.sidebar.caption(entry.description)

st.title("ViT Attention Explorer")
if not entry.ok:
    st.error(f"This checkpoint cannot be loaded: {escape_markdown(entry.error)}")
    st.stop()
fingerprint = catalog.Candidate(entry.path, entry.source, entry.name).fingerprint
try:
    checkpoint = load_model(choice, fingerprint)
except CheckpointError as e:
    st.error(f"This checkpoint cannot be loaded: {escape_markdown(e)}")
    st.stop()
class_names = checkpoint.class_names
model_key = explorer.image_digest(choice.encode())[:10]  # widgets whose range depends on the model

# -- image ----------------------------------------------------------------------------------------------------

st.sidebar.header("Image")
uploaded = st.sidebar.file_uploader("Upload an image", type=UPLOAD_TYPES,
                                    help="jpg, png, webp, bmp or gif; any size and aspect ratio.")
if "explorer_image" in st.session_state:  # a file another page (Analyse a dataset) asked for
    st.session_state["explorer_opened_image"] = st.session_state.pop("explorer_image")
opened_image = st.session_state.get("explorer_opened_image")
if opened_image is not None and st.sidebar.button(f"Close {escape_markdown(Path(opened_image).name)}",
                                                  help="Back to the sample images."):
    opened_image = st.session_state["explorer_opened_image"] = None
samples = catalog.sample_images(entry, list(entries.values()))
sample = None
if samples and opened_image is None:
    sample = st.sidebar.selectbox("…or a sample image", samples, format_func=explorer.sample_label,
                                  key=f"sample-{model_key}", disabled=uploaded is not None,
                                  help="Remove the upload to use the samples again.")
if uploaded is not None:
    data, image_name = uploaded.getvalue(), uploaded.name
elif opened_image is not None:
    try:
        data, image_name = Path(opened_image).read_bytes(), Path(opened_image).name
    except OSError as e:
        st.error(f"Cannot read {opened_image}: {e.strerror or e}")
        st.stop()
elif sample is not None:
    data, image_name = sample.read_bytes(), sample.name
else:
    st.info("Upload an image in the sidebar to see what the model attends to.")
    st.stop()
digest = explorer.image_digest(data)
try:
    image = decode_image(digest, image_name, data)
except ImageError as e:
    st.error(f"Cannot use this upload: {escape_markdown(e)}")
    st.stop()

analysis = analyse(fingerprint, digest, checkpoint, image)
prediction, grid, prefix = analysis.prediction, analysis.grid, analysis.num_prefix_tokens
L, H, T = analysis.num_layers, analysis.num_heads, analysis.num_tokens
names = analysis.prefix_names  # CLS, DIST, REG 1…R

# -- map settings -----------------------------------------------------------------------------------------------

with st.sidebar:
    st.header("Attention map")
    kinds = [k for k in explorer.MAP_KINDS if class_names or k != "class"]  # a feature model has no classes
    # The newer methods share one entry (a second picker), which keeps the sidebar short.
    choices = [k for k in kinds if k not in explorer.METHOD_MAP_KINDS] + [explorer.MORE_METHODS]
    kind = st.radio("Map", choices, key="map_kind",
                    format_func=lambda k: explorer.MAP_KINDS.get(k, explorer.MORE_METHODS_LABEL))
    if kind == explorer.MORE_METHODS:
        methods = [k for k in explorer.METHOD_MAP_KINDS if class_names or k not in explorer.CLASS_MAP_KINDS]
        kind = st.selectbox("Method", methods, format_func=explorer.MAP_KINDS.get, key="method_kind",
                            help="LeGrad, LRP and AttnLRP explain a class; attention flow, like rollout, "
                                 "follows attention and the residual, as a max-flow (slow).")
    query_key = f"query-{model_key}"
    st.session_state.setdefault(query_key, 0)
    query = st.selectbox("Query token", range(T), key=query_key,
                         format_func=lambda t: explorer.token_option(t, grid, prefix, names),
                         help="Whose attention to show: CLS (token 0), another prefix token (DIST, REG) or a "
                              "patch, numbered row by row. "
                              "Clicking a patch on the image selects it too.")
    st.session_state.setdefault(f"layer-{model_key}", L)
    layer = st.select_slider("Layer", range(1, L + 1), key=f"layer-{model_key}",
                             help="For the one-layer map, the heads grid and the matrix; 1 is the first block.")
    head = st.selectbox("Head", [None, *range(H)], key=f"head-{model_key}",
                        format_func=lambda h: "all heads, fused" if h is None else f"head {h + 1}")
    fusion = st.radio("Head fusion", HEAD_FUSIONS, horizontal=True, key="fusion",
                      help="How heads combine: for 'all heads, fused' and in the rollout.")
    discard_ratio, end_layer, class_index = 0.0, L, None
    if kind in ("rollout", "class", "lrp", "flow"):
        st.session_state.setdefault(f"end-{model_key}", L)
        end_layer = st.select_slider("Up to layer", range(1, L + 1), key=f"end-{model_key}",
                                     help="Roll out from layer 1 through this layer.")
    if kind == "rollout":
        discard_ratio = st.slider("Discard ratio", 0.0, 0.95, 0.0, 0.05, key="discard_ratio",
                                  help="Share of each row's weakest patch attentions set to zero before "
                                       "rolling out; higher values keep only the strongest paths.")
    if kind in explorer.CLASS_MAP_KINDS:
        class_index = st.selectbox(
            "Class", [None, *range(len(class_names))], key=f"class-{model_key}",
            format_func=lambda c: f"predicted: {class_names[prediction.class_index]}" if c is None else class_names[c])

    st.header("Overlay")
    opacity = st.slider("Opacity", 0.0, 1.0, 0.6, 0.05, key="opacity")
    colormap = st.selectbox("Colour map", explorer.COLORMAPS, key="colormap")
    mode = st.radio("Upsampling", UPSAMPLE_MODES[::-1], horizontal=True, key="upsample",
                    help="bilinear: smooth between patch centres; nearest: one flat block per patch (exact values).")
    show_grid = st.checkbox("Show the patch grid", key="show_grid")

settings = explorer.MapSettings(kind=kind, layer=layer - 1, head=head, fusion=fusion, query=query,
                                discard_ratio=discard_ratio, end_layer=end_layer - 1, class_index=class_index)
relevance = None
if kind == "class":
    relevance = class_relevance(fingerprint, digest, explorer.resolved_class(settings, analysis), checkpoint, image)
method_map2d = None
if kind in explorer.METHOD_MAP_KINDS:
    try:
        method_map2d = method_map(fingerprint, digest, kind, explorer.resolved_class(settings, analysis), query,
                                  end_layer - 1, fusion, checkpoint, image)
    except ValueError as e:  # a model option the method does not support, too many tokens for a max-flow
        st.error(str(e))
        st.stop()
map2d = explorer.attention_map(analysis, settings, relevance, method_map2d)
map_colormap, vmin, vmax = explorer.map_colours(kind, map2d, colormap)
outline = explorer.patch_of(query, prefix)

# -- image, overlay and prediction ----------------------------------------------------------------------------------

shown, shown_uri, small = display_images(digest, image)
col_image, col_overlay, col_prediction = st.columns([1, 1, 0.9], gap="medium")
with col_image:
    st.subheader("Image")
    st.plotly_chart(explorer.patch_picker_figure(shown.size, shown_uri, grid, query, prefix), key="patch_picker",
                    on_select=partial(pick_query, query_key, prefix), selection_mode="points",
                    config=PICKER_CONFIG, width="content")
    st.caption(f"**Click a patch** to make it the query. {escape_markdown(image_name)}, {image.width}×{image.height} "
               f"px; the model sees it as {analysis.image_size}×{analysis.image_size} px in {grid[0]}×{grid[1]} "
               f"patches of {analysis.patch_size} px.")
with col_overlay:
    st.subheader("Attention")
    st.image(overlay(shown, map2d, opacity, map_colormap, mode, show_grid=show_grid, outline_patch=outline,
                     vmin=vmin, vmax=vmax), output_format="PNG")
    st.caption(explorer.describe_map(settings, analysis, class_names) + " " + explorer.describe_range(map2d))
    stem = Path(image_name).stem
    download_png, download_npz = st.columns(2)
    download_png.download_button(
        "Overlay (PNG)", on_click="ignore", mime="image/png", file_name=f"{stem}-{kind}-overlay.png",
        data=partial(explorer.overlay_png, image, map2d, opacity, colormap, mode, show_grid, outline),
        help=f"At the image's size as decoded (at most {MAX_SIDE:,} px on its long side), "
             f"{image.width}×{image.height} px.")
    download_npz.download_button(
        "Attentions (.npz)", on_click="ignore", mime="application/octet-stream", file_name=f"{stem}-attentions.npz",
        data=partial(explorer.attentions_npz, analysis, class_names),
        help="layer_0 … layer_N: heads × tokens × tokens (token 0 is CLS), with logits and class names.")
    if st.toggle("Deletion and insertion curves", key="faithfulness_curves",
                 help="Is this map faithful? Patches are blurred away (deletion) or restored onto a blurred image "
                      "(insertion), most relevant first, and the class probability is tracked: a faithful map "
                      "makes deletion fall and insertion rise fast."):
        st.plotly_chart(explorer.faithfulness_figure(checkpoint, image, map2d,
                                                     explorer.resolved_class(settings, analysis)),
                        config={"displayModeBar": False})
with col_prediction:
    st.subheader("Prediction")
    if class_names:
        st.plotly_chart(explorer.predictions_figure(prediction), config={"displayModeBar": False})
    else:
        st.info("No prediction: this model has no classifier (a feature model such as DINO). Its attention maps "
                "are shown all the same.")
    st.image(explorer.display_image(explorer.model_input_image(image, checkpoint), min_side=96, max_side=160),
             output_format="PNG")
    st.caption("The model's input: resized to its square size"
               + (", greyscale." if checkpoint.preprocessing.num_channels == 1 else "."))

# -- analyses (only the open tab is computed) -------------------------------------------------------------------

heads_tab, matrix_tab, stats_tab = st.tabs(["Heads", "Attention matrix", "Distance & entropy"], key="analysis_tab",
                                           on_change="rerun")
query_text = explorer.token_label(query, grid, prefix, names)
if heads_tab.open:
    with heads_tab:
        every = st.toggle(f"Every layer ({L} × {H} = {L * H} maps)", key="every_layer",
                          help="Off: the heads of the layer chosen in the sidebar.")
        st.caption(f"What {query_text} attends to in each head; each map on its own colour scale, with the "
                   "sidebar's overlay settings.")
        shown_layers = range(L) if every else [layer - 1]
        for i in shown_layers:
            maps = explorer.head_maps(analysis, query, layer=i)  # (H, gh, gw)
            st.markdown(f"**Layer {i + 1}**")
            st.image(explorer.small_multiples(small, maps, opacity, colormap, mode, outline),
                     caption=[f"L{i + 1} · head {h + 1}" for h in range(H)], width=small.width, output_format="PNG")
if matrix_tab.open:
    with matrix_tab:
        heads_text = f"head {head + 1}" if head is not None else f"{fusion} over heads"
        matrix = explorer.layer_attention(analysis, layer - 1, head, fusion)[0].numpy()  # (T, T)
        st.plotly_chart(explorer.attention_matrix_figure(matrix, grid, prefix, colormap, query=query,
                                                         title=f"Layer {layer}, {heads_text}", prefix_names=names),
                        theme=None)  # Streamlit's chart theme recolours the low end of the colour scale
        st.caption(f"Row i is what token i attends to (each row sums to 1); "
                   f"{explorer.tokens_caption(grid, prefix, names)}. The outlined row is the query, {query_text}.")
if stats_tab.open:
    with stats_tab:
        left, right = st.columns(2)
        left.plotly_chart(explorer.layer_stats_figure(analysis.distance, "mean attention distance (px)",
                                                      "Mean attention distance"))
        left.caption(f"Per head, the attention-weighted distance between a patch and the patches it attends to, "
                     f"in pixels of the {analysis.image_size}-px input, averaged over patch queries (ViT paper, "
                     "Fig. 7). Low: local heads, like convolutions; high: heads that integrate the whole image.")
        right.plotly_chart(explorer.layer_stats_figure(analysis.entropy, "attention entropy (nats)",
                                                       "Attention entropy"))
        right.caption(f"Per head, the entropy of each token's attention averaged over all {T} tokens: 0 when every "
                      f"token attends to one token only, ln {T} ≈ {math.log(T):.2f} when attention is "
                      "spread evenly.")

# -- compare two checkpoints; the run's attention snapshots at any epoch (issue 12) -------------------------------

compare_entries = {p: e for p, e in entries.items() if p != choice}
for c in catalog.epoch_candidates():  # per-epoch checkpoints of runs trained with --save-every
    if str(c.path) != choice:
        compare_entries[str(c.path)] = describe_checkpoint(str(c.path), c.source, c.name, c.fingerprint)
if st.session_state.get("compare_with") not in compare_entries:
    st.session_state["compare_with"] = None
other = st.sidebar.selectbox(
    "Compare with", [None, *compare_entries], key="compare_with",
    format_func=lambda p: "nothing: one checkpoint" if p is None else compare_entries[p].label,
    help="Another checkpoint (another run, or another epoch of this one saved with --save-every) on the same "
         "image with the same settings, and the difference of the two maps.")
if other is not None:
    st.subheader("Compare")
    entry_b = compare_entries[other]
    try:
        if not entry_b.ok:
            raise CheckpointError(entry_b.error)
        fingerprint_b = catalog.Candidate(entry_b.path, entry_b.source, entry_b.name).fingerprint
        checkpoint_b = load_model(other, fingerprint_b)
        analysis_b = analyse(fingerprint_b, digest, checkpoint_b, image)
        settings_b = compare.settings_for_other(settings, analysis, analysis_b, class_names, checkpoint_b.class_names)
        relevance_b = None
        if kind == "class":
            relevance_b = class_relevance(fingerprint_b, digest, explorer.resolved_class(settings_b, analysis_b),
                                          checkpoint_b, image)
        map_b = explorer.attention_map(analysis_b, settings_b, relevance_b)
    except (CheckpointError, ValueError) as e:
        st.warning(f"B cannot show this map: {escape_markdown(e)}")
    else:
        col_a, col_b, col_diff = st.columns(3)
        for column, label, one_entry, one_analysis, one_map in ((col_a, "A", entry, analysis, map2d),
                                                                (col_b, "B", entry_b, analysis_b, map_b)):
            top = one_analysis.prediction.top_k[0]
            column.image(overlay(shown, one_map, opacity, colormap, mode, show_grid=show_grid, outline_patch=outline),
                         output_format="PNG")
            column.caption(f"{label}: {escape_markdown(one_entry.label)}. Predicts {escape_markdown(top[0])} "
                           f"({top[1]:.0%}). "
                           + explorer.describe_range(one_map))
        col_diff.image(compare.difference_overlay(shown, map2d, map_b, opacity, mode), output_format="PNG")
        col_diff.caption(compare.describe_difference(map2d, map_b, (shown.height, shown.width), mode))

snapshot_run = catalog.run_folder(entry.path) if entry.source == "run" else None
snapshot_epochs = snapshots.snapshot_epochs(snapshot_run) if snapshot_run is not None else []
if snapshot_epochs:
    st.subheader("The run's probe images during training")
    if st.session_state.get("explorer_snap_epoch") not in snapshot_epochs:
        st.session_state["explorer_snap_epoch"] = snapshot_epochs[-1]
    snap_epoch = st.select_slider("Epoch", snapshot_epochs, key="explorer_snap_epoch",
                                  help="Stored while the run trained: no checkpoint of that epoch is needed.")
    snap_kind = "rollout" if kind == "rollout" else "attention"
    try:
        probes = snapshots.probe_overlays(snapshot_run, snap_epoch, snap_kind, layer - 1, head, fusion, opacity,
                                          colormap, mode, size=128)
    except (snapshots.SnapshotError, ValueError) as e:
        st.warning(escape_markdown(e))
    else:
        st.image([p for p, _ in probes], caption=[escape_markdown(c) for _, c in probes], width=128,
                 output_format="PNG")
        st.caption("The CLS token's " + ("rollout (mean over heads)" if snap_kind == "rollout" else
                                         f"attention in layer {layer}") + f" at epoch {snap_epoch} on the run's "
                   "fixed validation images, with the sidebar's layer, head and overlay settings; under each, "
                   "true class → predicted class. Snapshots keep the CLS query only.")
