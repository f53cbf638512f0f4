"""The explorer for a whole vision-language model whose vision tower no port reads (issue 92): GLM-4.1V / 4.5V /
4.6V, Mistral 3 and Pixtral-12B, Idefics3 and SmolVLM, Qwen3.5, Llama 4. Their towers run nowhere but in
transformers here, so the page's sections that read our own ViT (the maps of the tower, the analyses) are not drawn;
the page is the image and "Ask the VLM" (``ask_vlm``): the question, the answer, each token's map through the
language model, over the pixels the processor prepared (``ImageLayout.pixels``, its normalisation undone), with its
link and export. A VLM whose tower has a port keeps the whole page (``app_pages/explorer.py``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import streamlit as st
from PIL import Image

from app_pages.explorer_sections import ask_vlm, share_view
from app_pages.explorer_sections.concept_view import sidebar_image
from vit.app import catalog
from vit.sources.files import read_json

HINT = ("Upload an image in the sidebar, then ask a question about it: the model answers, and each word of the "
        "answer shows where it looked.")


def applies(path) -> bool:
    """Whether the picked checkpoint is a whole VLM's folder whose tower its config declares (no port reads it),
    judged from its config.json alone: read once per version of that file (every rerun of the page asks)."""
    if path is None:
        return False
    try:
        stamp = (Path(path) / "config.json").stat()
    except OSError:
        return False
    return _declares(str(path), (stamp.st_mtime_ns, stamp.st_size))


@functools.lru_cache(maxsize=16)
def _declares(path: str, stamp: tuple[int, int]) -> bool:
    """``applies`` for ``path`` whose config.json has ``stamp`` (its modification time and size)."""
    from vit.sources.vlm.declared import declared_tower
    from vit.sources.vlm.whole_vlm import can_answer

    if not can_answer(path):
        return False
    try:
        return declared_tower(read_json(Path(path) / "config.json")) is not None
    except ValueError:  # a declared tower of sizes past the bounds: opening it says so in one line
        return True


@dataclass
class _Opened:
    """What "Ask the VLM" reads of the model it asks: its folder."""

    path: Path


@dataclass
class VLMView:
    """The page's view for ``ask_vlm.ask_vlm``: the model and the image, and the map's drawing settings (the
    explorer's defaults: no sidebar map settings on this page). ``analysis`` None: the pixels drawn are always the
    processor's (``ImageLayout.pixels``)."""

    full_checkpoint: _Opened
    full_fingerprint: tuple
    image: Image.Image
    image_key: str
    analysis: None = None
    opacity: float = 0.6
    colormap: str = "inferno"
    mode: str = "bilinear"
    show_grid: bool = False


def vlm_view(entry: catalog.CatalogEntry, entries: dict, model_key: str, model_text: str, may_open: bool) -> None:
    """The page for a whole VLM whose tower no port reads: the image, then "Ask the VLM"."""
    fingerprint = catalog.Candidate(entry.path, entry.source, entry.name).fingerprint
    image, image_name, digest, is_sample = sidebar_image(entry, entries, model_key, HINT, "the model")
    st.caption("This model's vision tower runs as transformers builds it (no port of it here): the page asks the "
               "whole model, and draws each answer token's attention through its language model over the pixels its "
               "processor prepared.")
    st.image(image, width=320)
    view = VLMView(_Opened(Path(entry.path)), fingerprint, image, digest)
    shared = {"model": model_text,  # the image: a sample by name, an upload by the server's store's SHA-256
              **({"sample": image_name} if is_sample else {"upload": st.session_state.get(share_view.SHOWN_KEY)})}
    ask_vlm.ask_vlm(view, may_open, shared, entry.name, image_name)
