"""The Train page's runs panel: every run in a table, polled every few seconds without re-running the launch form
(the poll also starts queued runs whose device has become free); the selected runs' curves overlaid, the settings
that differ between them, and each one's Stop / Resume / Open / Delete with its log's tail. Widgets only: states,
rows and curves are ``vit.runs.manager``'s and ``vit.runs.display``'s."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pandas as pd
import plotly.express as px
import streamlit as st

from app_pages import open_in_explorer
from app_pages.training_sections import sae as sae_section
from vit.core.text import escape_markdown, escape_plotly, visible, visible_lines
from vit.explain.views import compare
from vit.runs import display
from vit.runs import manager as runs
from vit.runs.weights import saved_weights

REFRESH_SECONDS = 3


def run_controls(manager: runs.RunManager, info: display.RunInfo, private: Callable[[str], str],
                 for_visitor: Callable[[str], str]) -> None:
    # Names and details (which quote log lines) are shown as written, never as Markdown.
    state = f"**{escape_markdown(visible(info.name))}** · {info.state}"
    state += f" · {escape_markdown(for_visitor(info.detail))}" if info.detail else ""
    if info.state in ("failed", "crashed", "damaged"):
        st.error(state)
    else:
        st.markdown(state)
    stop, resume, delete = st.columns(3)
    # Callbacks act before the fragment redraws, so the table already shows the result.
    stop.button("Stop", key=f"stop-{info.name}", disabled=not info.active, on_click=runs_action,
                args=(manager.stop, info.name))
    # "Restart" only where pressing it restarts: a running run read "Restart" (greyed), which it can never be.
    resume.button("Restart" if info.restarts else "Resume", key=f"resume-{info.name}",
                  disabled=not info.can_resume, on_click=runs_action, args=(manager.resume, info.name),
                  help=resume_help(info))
    with delete.popover("Delete", disabled=info.state == "running"):
        st.markdown(f"Delete {escape_markdown(visible(info.name))} and its checkpoints? This cannot be undone.")
        st.button("Delete for good", key=f"delete-{info.name}", type="primary", on_click=runs_action,
                  args=(manager.delete, info.name))
    open_links(info)
    output = visible_lines(private(manager.log_tail(info.name, lines=15)))
    if not output and not info.managed:  # its output went to the terminal that started it, not to a file of ours
        output = "(started outside this page, e.g. python -m vit.train: its output is in the terminal that started it)"
    st.code(output or "(no output yet)", language=None)


def open_links(info: display.RunInfo) -> None:
    """"Open in explorer" for the run's best and its last weights, each saying which epoch and accuracy it is (best.pt
    alone, unnamed, was epoch 1's weights after 60 epochs on a tiny validation split)."""
    if info.kind != "vit":  # an SAE's run: its own section opens it with its model
        return
    saved = saved_weights(info.run_dir)
    if not saved:
        open_in_explorer.link(st, "Open in explorer", {"explorer_checkpoint": str(info.best_checkpoint)}, disabled=True,
                              help="No weights saved yet: best.pt is written after the first epoch.")
        return
    for column, weights in zip(st.columns(len(saved)), saved, strict=True):
        # A link, not st.switch_page: this panel refreshes itself (app_pages/open_in_explorer.py says why).
        open_in_explorer.link(column, f"Open in explorer ({weights.label})",
                              {"explorer_checkpoint": str(weights.path)}, help=weights.help)


def resume_help(info: display.RunInfo) -> str:
    """What the Resume button does for this run, or why it does nothing now."""
    if info.active:
        return f"It is {info.state}: stop it first, then Resume continues from its last saved epoch"
    if info.restarts:
        return "Start again from scratch: it ended before it saved a last.pt"
    if info.can_resume:
        return "Continue from last.pt"
    return "Nothing to resume: it is " + ("complete" if info.state == "completed" else info.state)


def mark_resumes(figure, marks: list[dict], x: str) -> None:
    """A dashed vertical line where each run was resumed (``x``: "epoch" or "step", the chart's axis), labelled
    "resumed" with the run and the time on hover: a stop and a resume leave a mark on the curves."""
    for mark in marks:
        if mark[x] is None:
            continue
        when = f" ({mark['time']})" if mark["time"] else ""
        figure.add_vline(x=mark[x], line_dash="dash", line_width=1, line_color="grey", opacity=0.7,
                         annotation_text="resumed", annotation_position="top right", annotation_font_size=10,
                         annotation_hovertext=f"{legend(mark['run'])}: resumed at {x} {mark[x]:g}{when}")


def legend(run: str) -> str:
    """A run's name in a chart legend: no HTML, no invisible characters."""
    return escape_plotly(run)


def runs_action(action, name: str) -> None:
    try:
        action(name)
    except runs.RunError as e:
        st.session_state["runs_message"] = str(e)
    else:
        st.session_state.pop("runs_message", None)


@st.fragment(run_every=REFRESH_SECONDS)
def runs_panel(manager: runs.RunManager, token_mode: bool, private: Callable[[str], str],
               for_visitor: Callable[[str], str]) -> None:
    """The runs table, the selected runs' curves, settings that differ and controls; ``token_mode``: the visitor came
    through the training token (from the network), who sees no server paths."""
    all_runs = manager.poll()
    # Here, not above the fragment: it redraws every few seconds, so the notice goes once its run has ended (or was
    # deleted): "Started …" beside a completed run read as a new start.
    if st.session_state.get("train_notice") and st.session_state.get("train_notice_run") in {
            r.name for r in all_runs if r.active}:
        st.success(escape_markdown(for_visitor(st.session_state["train_notice"])))
    st.subheader("Runs")
    if not all_runs:
        # Where the server keeps its runs is for its own visitors only, as the data roots' paths are.
        st.info("No runs yet." if token_mode else f"No runs yet in {escape_markdown(manager.runs_dir)}.")
        return
    if st.session_state.get("runs_message"):
        st.warning(escape_markdown(for_visitor(st.session_state["runs_message"])))
    # Only what tells runs apart (the duplicate "Epochs", batch size and weight decay stay in "Settings that differ"
    # below), each column as wide as what it shows (set widths cut names and headers short); a table wider than the
    # page scrolls.
    rows = display.table_rows(all_runs)
    widths = display.table_widths(rows)
    st.dataframe(
        pd.DataFrame(rows), hide_index=True, width="stretch", placeholder="", column_order=list(display.TABLE_HEADERS),
        column_config={
            **{name: st.column_config.Column(header, width=widths[name])
               for name, header in display.TABLE_HEADERS.items()},
            "Progress": st.column_config.ProgressColumn("Progress", min_value=0.0, max_value=1.0, format="percent",
                                                        width=widths["Progress"]),
            "Best val acc": st.column_config.NumberColumn(display.TABLE_HEADERS["Best val acc"], format="percent",
                                                          width=widths["Best val acc"],
                                                          help="best validation accuracy"),
            "LR": st.column_config.NumberColumn("LR", format="%g", width=widths["LR"]),
            "Started": st.column_config.DatetimeColumn("Started", format="MM-DD HH:mm", width=widths["Started"]),
        })
    names = [r.name for r in all_runs]
    by_name = {r.name: r for r in all_runs}
    selected = [n for n in st.session_state.get("selected_runs", names[:1]) if n in names]
    st.session_state["selected_runs"] = selected
    selected = st.multiselect("Selected runs (curves overlaid)", names, key="selected_runs", format_func=visible)
    if not selected:
        return
    steps = manager.step_curves(selected)
    resumes = manager.resumes(selected)
    if steps:  # every few seconds of training: the curve moves before the first epoch ends
        live = pd.DataFrame(steps).assign(run=lambda d: d["run"].map(legend))
        figure = px.line(live, x="epoch", y="value", color="run", title="Training loss, every few seconds",
                         labels={"value": "train loss", "epoch": "epoch (fractional)"})
        figure.update_layout(height=260, margin=dict(l=10, r=10, t=40, b=10))
        mark_resumes(figure, resumes, "epoch")
        st.plotly_chart(figure, key="chart-steps")
    sae_section.curves(manager, selected, partial(mark_resumes, marks=resumes, x="step"))
    charts = manager.curves(selected) if any(by_name[n].kind == "vit" for n in selected) else {}
    columns = st.columns(2)
    for i, (chart, rows) in enumerate(charts.items()):
        with columns[i % 2]:
            if rows:
                curves = pd.DataFrame(rows).assign(run=lambda d: d["run"].map(legend))
                figure = px.line(curves, x="epoch", y="value", color="run", line_dash="split",
                                 markers=True, title=chart.capitalize(), labels={"value": chart})
                figure.update_layout(height=300, margin=dict(l=10, r=10, t=40, b=10))
                mark_resumes(figure, resumes, "epoch")
                st.plotly_chart(figure, key=f"chart-{chart}")
            else:
                st.caption(f"{chart.capitalize()}: no finished epoch yet.")
    if len(selected) > 1:  # issue 12: what differs between the compared runs
        diff = compare.config_diff({visible(name): by_name[name].settings for name in selected})
        st.markdown("**Settings that differ**")
        if diff:
            st.dataframe(pd.DataFrame(diff), hide_index=True, width="stretch", key="config_diff")
        else:
            st.caption("The selected runs have the same settings.")
    for name in selected:
        with st.container(border=True):
            run_controls(manager, by_name[name], private, for_visitor)
            sae_section.folder(by_name[name], show_path=not token_mode)
