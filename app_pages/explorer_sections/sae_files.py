"""The explorer's Features section, its SAE and files: the folder or Hub id typed (a missing Hub SAE offered for
download), the block a saev file reads, the SAE opened and checked against the model, its metrics line, and the runs
folder's completed SAE runs. Cached by each file's size and time, so an SAE rewritten in place is read again."""

from __future__ import annotations

import os
from pathlib import Path

import streamlit as st

from app_pages.explorer_sections.hub_download import download_panel
from vit.app import catalog
from vit.checkpoint import Checkpoint
from vit.core.runfiles import default_runs_dir, parse_json, read_text_bounded
from vit.features import explore, formats
from vit.features.autoencoder import CFG_FILE, WEIGHTS_FILE, SAEError, SparseAutoencoder, check_fits
from vit.sources import hub

FOLDER_KEY = "sae_folder"  # the SAE typed: a folder or file on the server, or a Hub id
LAYER_KEY = "sae_block"  # the block a saev file reads (its file does not say)
RUNS_TTL_S = 10  # a run that completes inside an unchanged runs folder is listed this much later at most


def folder_version(folder: Path) -> tuple:
    """What the caches of an SAE's files are keyed by: each file's size and time (None when missing), of the SAE
    file itself, or of a folder's SAELens, Prisma and our own files."""
    def stat(path: Path):
        try:
            info = path.stat()
            return info.st_mtime_ns, info.st_size
        except OSError:
            return None
    if folder.is_file():  # a saev or Prisma .pt (Prisma's config.json beside it)
        return stat(folder), stat(folder.parent / formats.PRISMA_CONFIG)
    names = (CFG_FILE, WEIGHTS_FILE, explore.FEATURES_FILE, "metrics.json", formats.PRISMA_CONFIG)
    prisma = sorted(folder.glob("*.pt")) if (folder / formats.PRISMA_CONFIG).is_file() else []
    return tuple(stat(folder / name) for name in names) + tuple((p.name, stat(p)) for p in prisma)


@st.cache_resource(max_entries=4, show_spinner="Loading the SAE…")
def open_sae(folder: str, version: tuple, device: str, layer: int | None = None) -> SparseAutoencoder:
    return formats.open_sae(folder, layer, device=device)


@st.cache_resource(ttl=300, max_entries=4, show_spinner="Asking the Hub for the SAE's files…")
def planned_sae(text: str) -> hub.Download:
    return hub.plan_sae(text)[0]  # a page reruns on every click: the Hub's file list is read again after 5 min


def sae_source() -> Path:
    """The local file or folder of the SAE typed (a Hub id's copy in the HF cache); SAEError in one line when there
    is none."""
    text = str(st.session_state.get(FOLDER_KEY) or "").strip()
    if not text:
        raise SAEError("type the folder or file of an SAE trained on this model (python -m vit.sae train … --out "
                       "FOLDER; a ViT-Prisma or saev SAE), or its Hub id")
    return formats.sae_path(text, cached_only=True)


def needs_layer(path: Path) -> bool:
    """Whether the SAE at ``path`` is a saev file, which does not say the block it reads."""
    return path.is_file() and formats.detect_format(path) == "saev"


def offer_download(text: str) -> bool:
    """For a Hub SAE the HF cache lacks: its files' size on a Download button and, once pressed, the download's
    progress (``hub_download``). True while it is still to download; HubError (one line) when the Hub refuses it or
    it is too large to download here."""
    wanted = planned_sae(text)
    if not wanted.files:
        return False
    hub.check_size(wanted)  # over the bound or the disk: said now, not after a click
    if not download_panel(wanted, "features_download"):
        return True
    planned_sae.clear()
    return False


@st.cache_resource(max_entries=4, show_spinner="Checking the SAE against the model…")
def fitting_layer(full_fingerprint: tuple, folder: str, version: tuple, _model, _sae: SparseAutoencoder) -> int:
    return check_fits(_sae, _model)  # hashes the model's weights: once per model and SAE



def chosen_sae(full_checkpoint: Checkpoint, full_fingerprint: tuple) -> tuple[SparseAutoencoder, str, tuple, int]:
    """(the SAE typed, its local folder or file, its files' version, the layer it reads); SAEError in one line when
    there is none or it does not fit the model."""
    folder = sae_source()
    version = folder_version(folder)
    device = str(next(full_checkpoint.model.parameters()).device)
    layer = st.session_state.get(LAYER_KEY) if needs_layer(folder) else None
    if needs_layer(folder) and layer is None:
        raise SAEError("saev's files do not say which block's output they read: give the block this SAE was trained on")
    sae = open_sae(str(folder), version, device, layer)
    layer = fitting_layer(full_fingerprint, str(folder), version, full_checkpoint.model, sae)
    return sae, str(folder), version, layer


def metrics_line(folder: str) -> str | None:
    try:
        metrics = parse_json(read_text_bounded(Path(folder) / "metrics.json"))
        return (f"Held-out explained variance {float(metrics['explained_variance']):.3f}, "
                f"L0 {float(metrics['l0']):.1f}, dead {float(metrics['dead_fraction']):.1%}.")
    except (OSError, ValueError, KeyError, TypeError):
        return None


@st.cache_data(ttl=RUNS_TTL_S, max_entries=8, show_spinner=False)
def _sae_runs(runs_dir: str, version: int | None) -> dict[str, str]:
    return {str(run): run.name for run in catalog.sae_runs(runs_dir)}


def sae_runs() -> dict[str, str]:
    """{folder: name} of the runs folder's completed SAE runs. Not scanned again on every rerun of the section: read
    again when the runs folder changes (a run added or deleted changes its time) or after ``RUNS_TTL_S`` (a run that
    completes changes only its own folder)."""
    runs_dir = default_runs_dir()
    try:
        version = os.stat(runs_dir).st_mtime_ns
    except OSError:
        version = None
    return _sae_runs(str(runs_dir), version)
