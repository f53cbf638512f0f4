"""The run's probe images during training: the attention snapshots a run stored at each epoch (issue 12)."""

import streamlit as st

from app_pages.explorer_sections.caches import probe_overlays
from app_pages.explorer_sections.state import Shown
from vit.app import catalog
from vit.core.text import escape_markdown
from vit.training import snapshots

EPOCH_KEY = "explorer_snap_epoch"


def probe_snapshots(view: Shown, entry: catalog.CatalogEntry) -> None:
    """The snapshots of the run ``entry`` comes from, at an epoch picked here; nothing for other checkpoints."""
    kind, layer, head, fusion = view.settings.kind, view.layer, view.settings.head, view.settings.fusion
    opacity, colormap, mode = view.opacity, view.colormap, view.mode
    snapshot_run = catalog.run_folder(entry.path) if entry.source == "run" else None
    snapshot_epochs = snapshots.snapshot_epochs(snapshot_run) if snapshot_run is not None else []
    if snapshot_epochs:
        st.subheader("The run's probe images during training")
        if st.session_state.get(EPOCH_KEY) not in snapshot_epochs:
            st.session_state[EPOCH_KEY] = snapshot_epochs[-1]
        snap_epoch = st.select_slider("Epoch", snapshot_epochs, key=EPOCH_KEY,
                                      help="Stored while the run trained: no checkpoint of that epoch is needed.")
        snap_kind = "rollout" if kind == "rollout" else "attention"
        try:
            probes = probe_overlays(snapshot_run, snap_epoch, snap_kind, layer - 1, head, fusion, opacity, colormap,
                                    mode)
        except (snapshots.SnapshotError, ValueError) as e:
            st.warning(escape_markdown(e))
        else:
            st.image([p for p, _ in probes], caption=[escape_markdown(c) for _, c in probes], width=128,
                     output_format="PNG")
            st.caption("The CLS token's " + ("rollout (mean over heads)" if snap_kind == "rollout" else
                                             f"attention in layer {layer}") + f" at epoch {snap_epoch} on the run's "
                       "fixed validation images, with the sidebar's layer, head and overlay settings; under each, "
                       "true class → predicted class. Snapshots keep the CLS query only.")
