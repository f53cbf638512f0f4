"""The explorer's caches: the model once per checkpoint file, the forward pass once per (checkpoint, image, size).

Server-wide and bounded by bytes, not entries: one entry may be a 2-MB model or a 1-GB one. An analysis also keeps
what its views recompute within fits.LAYER_CACHE_BYTES, under fits.ANALYSIS_MEMORY_LIMIT.
"""

import math
from dataclasses import replace
from functools import partial
from pathlib import Path

import streamlit as st
from PIL import Image

from app_pages.explorer_sections.long_work import long_work
from vit.app import catalog, drawing
from vit.app import explorer_page as explorer
from vit.app.uploads import UploadStore
from vit.checkpoint import Checkpoint
from vit.core.cache import ByteCache
from vit.core.clips import VIDEO_SUFFIXES, SampledClip, read_clip_bytes
from vit.core.images import UPLOAD_MAX_PIXELS, open_image
from vit.core.inference import InputSize, input_shape
from vit.core.progress import Progress
from vit.core.text import visible
from vit.core.threads import use_free_cores
from vit.explain.methods.captum_maps import ATTRIBUTION_METHODS
from vit.explain.views import attention_maps, dense_views, image_analysis, method_maps
from vit.explain.views.overlay import display_image
from vit.sources.open import open_source
from vit.training import snapshots

# Everything open_image reads (its error message lists these), so the uploader never refuses a format it names.
UPLOAD_TYPES = ["jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff"]
# A clip: a video file, an animated GIF or a zip of its frames (``read_clip_bytes``)
CLIP_UPLOAD_TYPES = [suffix[1:] for suffix in VIDEO_SUFFIXES] + ["gif", "zip"]
MODEL_CACHE_BYTES = 1536 * 2**20
IMAGE_CACHE_BYTES = 256 * 2**20  # decoded images are at most 2048 px on their long side (12 MB)
ANALYSIS_CACHE_BYTES = 512 * 2**20
RELEVANCE_CACHE_BYTES = 256 * 2**20
DENSE_CACHE_BYTES = 64 * 2**20  # PCA colours and matches: (gh, gw, 3) floats and a few hundred indices each
PROGRESS_TOKENS = 1025  # above (e.g. 512 px at patch 16), a forward takes seconds: progress and a Stop button


@st.cache_data(ttl=30, show_spinner=False)
def hf_cache_models(cache_dirs: tuple[str, ...], contains: str, library_road: bool = False
                    ) -> catalog.HfCacheListing:
    """The supported models of a bounded first part of the HF cache (``library_road``: the library road's too);
    its config files are read at most every 30 s, not on every rerun."""
    return catalog.hf_cache_listing([Path(d) for d in cache_dirs], contains, library_road=library_road)


@st.cache_resource(show_spinner=False)
def byte_cache(name: str, max_bytes: int) -> ByteCache:
    return ByteCache(max_bytes)


def computed(cache: ByteCache, key, compute, spinner: str):
    """``cache.get_or_compute(key, compute)``, ``spinner`` shown while it computes. The spinner goes around the
    cache, never inside ``compute``: its end sends the browser a message, where Streamlit stops the run for a
    message the browser sent meanwhile (an upload, a click), and inside ``compute`` that threw the result away (a
    model loaded for a minute, a forward), to be computed again by the next run and lost again at the next click."""
    if key in cache:  # no spinner's messages for what is kept
        return cache.get_or_compute(key, compute)
    with st.spinner(spinner):
        return cache.get_or_compute(key, compute)


def load_model(path: str, fingerprint: tuple, library_road: bool = False) -> Checkpoint:
    """The model at ``path`` once per version of its file; ``library_road`` (the explorer's own checkpoint, which
    ``library_view`` shows): a model no port reads, as its library builds it (``Checkpoint.road == "library"``)."""
    def load() -> Checkpoint:
        use_free_cores()  # once per server: torch's threads from the cores free at its first model
        # our .pt files, HF / timm folders, timm / torchvision weights
        checkpoint = open_source(path, library_road=library_road)
        # Class names come from the file: one with U+202E would turn every label and caption showing it around.
        # This page only shows them, so it holds them with such characters written as their escapes.
        return replace(checkpoint, class_names=[visible(name) for name in checkpoint.class_names])
    return computed(byte_cache("models", MODEL_CACHE_BYTES), (path, fingerprint, library_road), load,
                    "Loading the checkpoint…")


def decode_image(digest: str, name: str, invert: bool, data: bytes) -> Image.Image:
    def decode() -> Image.Image:
        image = open_image(data, name=name, max_pixels=UPLOAD_MAX_PIXELS)
        return explorer.invert_image(image) if invert else image
    return byte_cache("images", IMAGE_CACHE_BYTES).get_or_compute(("decoded", digest, name, invert), decode)


def display_images(digest: str, image: Image.Image) -> tuple[Image.Image, str, Image.Image]:
    """The image at display size (and as a data URI for the patch picker), and small for the heads grid."""
    return byte_cache("images", IMAGE_CACHE_BYTES).get_or_compute(("display", digest),
                                                                  partial(drawing.display_images, image))


def model_input_preview(fingerprint: tuple, digest: str, size: InputSize, checkpoint: Checkpoint,
                        image: Image.Image) -> Image.Image:
    """The image as the model sees it, small: resized once per (checkpoint, image, size), not on every rerun."""
    def make() -> Image.Image:
        return display_image(drawing.model_input_image(image, checkpoint, size), min_side=96, max_side=160)
    return byte_cache("images", IMAGE_CACHE_BYTES).get_or_compute(("model input", fingerprint, digest, size), make)


def input_tokens(checkpoint: Checkpoint, image: Image.Image, size: InputSize) -> int:
    """How many tokens ``image`` gives at ``size``; 0 when its size is unusable (the computation says why)."""
    model = checkpoint.model
    try:
        return model.num_prefix_tokens + math.prod(model.patch_grid(*input_shape(
            image, checkpoint.preprocessing, model.config.patch_size, size)))
    except ValueError:
        return 0


def analyse(fingerprint: tuple, digest: str, size: InputSize, checkpoint: Checkpoint,
            image: Image.Image) -> image_analysis.Analysis:
    """The forward pass, once per (checkpoint, image, size). An input of more than ``PROGRESS_TOKENS`` tokens
    (seconds to minutes at high resolution) is long work: its progress by layer and a Stop button are drawn here,
    and the page stops below them until it is done."""
    cache, key = byte_cache("analyses", ANALYSIS_CACHE_BYTES), (fingerprint, digest, size)
    tokens = input_tokens(checkpoint, image, size)
    if key in cache or tokens <= PROGRESS_TOKENS:
        return computed(cache, key, lambda: image_analysis.analyse(checkpoint, image, size), "Running the model…")
    analysis = long_work(key, f"Running the model on {tokens:,} tokens",
                         lambda progress: image_analysis.analyse(checkpoint, image, size, progress=progress), "analyse",
                         unit="layers", kept=cache)
    if analysis is None:
        st.stop()
    return analysis


def class_relevance(fingerprint: tuple, digest: str, size: InputSize, class_index: int, checkpoint: Checkpoint,
                    image: Image.Image, tokens: int) -> attention_maps.ClassRelevance:
    """The class map's gradients, once per (checkpoint, image, size, class); above ``PROGRESS_TOKENS`` long work
    (progress by block, Stop, the server's bound), the page stopping below it until it is done. ``tokens``: the
    input's (its analysis's ``num_tokens``)."""
    def compute(progress: Progress | None = None) -> attention_maps.ClassRelevance:
        return method_maps.class_relevance(checkpoint, image, class_index, size, progress)

    cache, key = byte_cache("relevance", RELEVANCE_CACHE_BYTES), (fingerprint, digest, size, class_index)
    if key in cache or tokens <= PROGRESS_TOKENS:
        return computed(cache, key, compute, "Computing the class-specific map (one backward pass)…")
    relevance = long_work(key, "Computing the class-specific map (a forward and a backward pass)", compute,
                          "class map", unit="blocks", kept=cache)
    if relevance is None:
        st.stop()
    return relevance


def pca_views(fingerprint: tuple, digests: tuple[str, ...], size: InputSize, layer: int, foreground: float | None,
              flip: bool, checkpoint: Checkpoint, analyses: list[image_analysis.Analysis]) -> list[dense_views.PCAView]:
    """The PCA colours of the images ``digests`` (their ``analyses`` by one checkpoint), fitted together once per
    (checkpoint, images, size, layer, foreground settings), not on every rerun (a click on a patch redraws only the
    similarity)."""
    return byte_cache("dense", DENSE_CACHE_BYTES).get_or_compute(
        ("pca", fingerprint, digests, size, layer, foreground, flip),
        lambda: dense_views.pca_views([checkpoint] * len(analyses), analyses, layer, foreground, flip))


def match_view(a: tuple[tuple, str], b: tuple[tuple, str], size: InputSize, top: int, layer: int,
               layer_b: int | None, checkpoint_a: Checkpoint, analysis_a: image_analysis.Analysis,
               checkpoint_b: Checkpoint, analysis_b: image_analysis.Analysis) -> dense_views.MatchView:
    """The mutual matches of two analyses (``a``, ``b``: each one's ``(checkpoint fingerprint, image digest)``), once
    per (both, size, top, layers), not on every rerun."""
    return byte_cache("dense", DENSE_CACHE_BYTES).get_or_compute(
        ("matches", a, b, size, top, layer, layer_b),
        lambda: dense_views.match_view(checkpoint_a, analysis_a, checkpoint_b, analysis_b, top, layer, layer_b))


def probe_overlays(run: Path, epoch: int, kind: str, layer: int, head: int | None, fusion: str, opacity: float,
                   colormap: str, mode: str) -> list[tuple[Image.Image, str]]:
    """The run's probe overlays of ``epoch``, read and drawn once per settings, not on every rerun; keyed by the
    snapshot file's stat so that a rewritten snapshot is read again."""
    try:
        stat = snapshots.snapshot_path(run, epoch).stat()
        version = (stat.st_mtime_ns, stat.st_size)
    except OSError:
        version = None  # missing: probe_overlays says so
    settings = (kind, layer, head, fusion, opacity, colormap, mode)
    return byte_cache("images", IMAGE_CACHE_BYTES).get_or_compute(
        ("probes", str(run), epoch, version, *settings),
        lambda: snapshots.probe_overlays(run, epoch, *settings, size=128))


@st.cache_resource(max_entries=16, show_spinner="Computing the map…")
def _method_map(fingerprint: tuple, digest: str, size: InputSize, kind: str, class_index: int, query: int,
                end_layer: int, fusion: str, start_layer: int, _checkpoint: Checkpoint, _image: Image.Image,
                _analysis: image_analysis.Analysis | None, options: tuple = (), pixels: bool = False):
    return method_maps.model_method_map(_checkpoint, _image, kind, class_index, query, end_layer, fusion, size,
                                        start_layer=start_layer, analysis=_analysis, options=dict(options),
                                        pixels=pixels)


def method_map(fingerprint: tuple, digest: str, size: InputSize, kind: str, class_index: int, query: int,
               end_layer: int, fusion: str, checkpoint: Checkpoint, image: Image.Image, start_layer: int,
               analysis: image_analysis.Analysis, options: tuple = ()):
    """A method's map, once per settings. Attention flow (seconds, minutes on ViT-B), the attributions (captum's and
    RISE: tens to thousands of forwards) and the other methods above ``PROGRESS_TOKENS`` are long work: its
    progress and a Stop button are drawn here, the server's bound holds, and the page stops below them until it is
    done. ``analysis``: the page's of this image and size (its tokens decide whether the work is long; a CAM starts
    from the explained block's input it kept: ``method_maps.model_method_map``); ``options``: an attribution's
    (``MapSettings.options``). A pixel method's map (``method_maps.draws_pixels``) is on the model's input pixels
    ``(H, W)``, as ``vit.explain`` gives it, not its patch sums."""
    pixels = method_maps.draws_pixels(kind)
    if kind == "flow":
        key, label, unit = ((kind, fingerprint, digest, size, query, end_layer, fusion),
                            "Computing the attention flow (one max-flow problem per token)", "passes")
    elif kind in ATTRIBUTION_METHODS:
        key, label, unit = ((kind, fingerprint, digest, size, class_index, options, pixels),
                            f"Computing the {attention_maps.method_of(kind).title.split(' (')[0]} map",
                            "masks" if kind == "rise" else "blocks")
    elif analysis.num_tokens > PROGRESS_TOKENS:
        key, label, unit = ((kind, fingerprint, digest, size, class_index, query, end_layer, start_layer),
                            f"Computing the {attention_maps.method_of(kind).title.split(' (')[0]} map", "blocks")
    else:
        return _method_map(fingerprint, digest, size, kind, class_index, query, end_layer, fusion, start_layer,
                           checkpoint, image, analysis, options, pixels)
    result = long_work(key, label, lambda progress: method_maps.model_method_map(
        checkpoint, image, kind, class_index, query, end_layer, fusion, size, progress, start_layer, analysis,
        options=dict(options), pixels=pixels), kind, unit=unit)
    if result is None:
        st.stop()
    return result


def rollout_map(fingerprint: tuple, digest: str, size: InputSize, analysis: image_analysis.Analysis,
                settings: attention_maps.MapSettings):
    """A rollout map (``rollout``, ``probe_rollout``) built from chunks, every layer recomputed (its factors do
    not fit the cache: seconds to minutes), as long work; the page stops below its progress until it is done."""
    s = settings
    result = long_work(("rollout", fingerprint, digest, size, s.kind, s.query, s.fusion, s.discard_ratio, s.end_layer),
                       f"Computing the rollout layer by layer ({analysis.num_tokens:,} tokens)",
                       lambda progress: attention_maps.rollout_map(analysis, settings, progress), "rollout",
                       unit="layers")
    if result is None:
        st.stop()
    return result


@st.cache_resource(show_spinner=False)
def upload_store() -> UploadStore:
    """The server's recent uploads, shared by every session (a link names one by its hash)."""
    return UploadStore()


def sampled_clip(digest: str, name: str, data: bytes, wanted: int, once: bool = False,
                 ends: bool = False) -> SampledClip:
    """``wanted`` frames sampled from an uploaded clip (``read_clip_bytes``: ClipError, one line, for one it cannot
    use; ``once``: a shorter clip's frames each once, for a VLM; ``ends``: its first and last frame among them, as PE
    video's processor samples), decoded once per (upload, frames) in the images' byte cache."""
    return byte_cache("images", IMAGE_CACHE_BYTES).get_or_compute(
        ("clip", digest, name, wanted, once, ends), lambda: read_clip_bytes(data, name, wanted, ends=ends, once=once))
