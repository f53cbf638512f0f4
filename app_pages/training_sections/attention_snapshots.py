"""The Train page's attention during training (issue 12): a run's probe images at one epoch (slider, play), head
statistics over epochs and an animated GIF of one probe image. Widgets only: the snapshots are
``vit.training.snapshots``'."""

from __future__ import annotations

import streamlit as st

from app_pages import player
from vit.app.drawing import COLORMAPS
from vit.core.text import escape_markdown, visible
from vit.explain.methods.attention import HEAD_FUSIONS
from vit.explain.views.overlay import UPSAMPLE_MODES
from vit.runs import manager as runs
from vit.training import snapshots

SNAPSHOT_KINDS = {"attention": "One layer's attention (CLS)", "rollout": "Attention rollout"}


def snapshot_section(manager: runs.RunManager, runs_with_snapshots: list[str]) -> None:
    """The chosen run's snapshots: probe maps at one epoch (slider, play), statistics over epochs, GIF export."""
    s = st.session_state
    if s.get("snap_run") not in runs_with_snapshots:
        s.pop("snap_run", None)  # deleted or unselected since
    name = st.selectbox("Run", runs_with_snapshots, key="snap_run", format_func=visible)
    run_dir = manager.run_dir(name)
    epochs = snapshots.snapshot_epochs(run_dir)
    if not epochs:
        st.caption("No snapshot yet: the first is taken before the first step.")
        return
    try:
        first = snapshots.load_snapshot(run_dir, epochs[-1])
    except snapshots.SnapshotError as e:
        st.warning(escape_markdown(e))
        return
    L, H = first.num_layers, first.num_heads
    controls, maps = st.columns([1, 3])
    with controls:
        kind = st.radio("Map", list(SNAPSHOT_KINDS), format_func=SNAPSHOT_KINDS.get, key="snap_kind")
        if s.get("snap_layer", L) > L:  # another run with fewer layers was chosen
            s["snap_layer"] = L
        s.setdefault("snap_layer", L)
        layer = st.select_slider("Layer", range(1, L + 1), key="snap_layer", disabled=kind != "attention")
        head = st.selectbox("Head", [None, *range(H)], key="snap_head", disabled=kind != "attention",
                            placeholder="all heads, fused",  # what Streamlit shows for None
                            format_func=lambda h: "all heads, fused" if h is None else f"head {h + 1}")
        fusion = st.radio("Head fusion", HEAD_FUSIONS, horizontal=True, key="snap_fusion",
                          disabled=kind != "attention" or head is not None)
        opacity = st.slider("Opacity", 0.0, 1.0, 0.6, 0.05, key="snap_opacity")
        colormap = st.selectbox("Colour map", COLORMAPS, key="snap_colormap")
        mode = st.radio("Upsampling", UPSAMPLE_MODES[::-1], horizontal=True, key="snap_upsample")
    # The newest epoch is followed while the run trains, unless the slider was moved back to an older one.
    if s.get("snap_epoch") not in epochs or s.get("snap_epoch") == s.get("snap_newest", epochs[-1]):
        s["snap_epoch"] = epochs[-1]
    s["snap_newest"] = epochs[-1]
    player.advance("snap_epoch", epochs, "snap_play")  # each refresh of the fragment, while playing
    with maps:
        slider, play = st.columns([5, 1], vertical_alignment="bottom")
        epoch = slider.select_slider("Epoch", epochs, key="snap_epoch",
                                     help="0 is the initialisation; new epochs appear while the run trains.")
        player.play_toggle(play, "snap_play", help="Step through the epochs, one per second.")
        head_index = None if kind != "attention" else head
        try:
            shown = snapshots.probe_overlays(run_dir, epoch, kind, layer - 1, head_index, fusion, opacity,
                                             colormap, mode, size=128)
        except (snapshots.SnapshotError, ValueError) as e:
            st.warning(escape_markdown(e))
            return
        st.image([image for image, _ in shown], caption=[escape_markdown(caption) for _, caption in shown], width=128,
                 output_format="PNG")
        what = f"rollout over {L} layers" if kind == "rollout" else (
            f"layer {layer}, " + (f"head {head + 1}" if head is not None else f"{fusion} over heads"))
        st.caption(f"Epoch {epoch} of {escape_markdown(visible(name))}: CLS attention ({what}) on the run's "
                   f"{len(shown)} probe images (fixed validation images); under each, true class → predicted class "
                   "and its probability.")
        probe_index = st.selectbox("Export one probe image across epochs", range(len(shown)), key="snap_probe",
                                   format_func=lambda i: f"image {i + 1}: {shown[i][1].split(' → ')[0]}")
        st.download_button(
            "Animated GIF", on_click="ignore", mime="image/gif", file_name=f"{name}-probe{probe_index + 1}-{kind}.gif",
            data=lambda: snapshots.gif_bytes(snapshots.animation_frames(
                run_dir, probe_index, kind, layer - 1, head_index, fusion, opacity, colormap, mode, size=256)),
            help="One frame per snapshotted epoch, half a second each, with the sidebar's overlay settings.")
    stat_head = st.selectbox("Statistics of", [None, *range(H)], key="snap_stat_head",
                             placeholder="the mean over heads",  # what Streamlit shows for None
                             format_func=lambda h: "the mean over heads" if h is None else f"head {h + 1}")
    left, right = st.columns(2)
    for column, statistic in ((left, "distance"), (right, "entropy")):
        stat_epochs, values = snapshots.statistics_over_epochs(run_dir, statistic, stat_head)
        column.plotly_chart(snapshots.statistics_figure(stat_epochs, values, statistic),
                            key=f"snap-stat-{statistic}")
    st.caption(f"Per layer and epoch, over {first.sample_size} fixed validation images: mean attention distance "
               "(pixels between a patch and the patches it attends to) and attention entropy (nats; 0 when "
               "each token attends to one token).")


def attention_panel(manager: runs.RunManager) -> None:
    """The panel, run as a fragment by ``player.play_fragment`` (training.py): its Play steps through the epochs."""
    names = [n for n in st.session_state.get("selected_runs", []) if snapshots.snapshot_epochs(manager.run_dir(n))]
    st.subheader("Attention during training")
    if not names:
        st.caption("Select a run with attention snapshots above (runs take one every epoch unless launched with "
                   "--attention-every 0).")
        return
    snapshot_section(manager, names)
