"""The Train page's sparse autoencoder runs: the launch form, the live curves (explained variance, L0, dead
fraction per step) and the finished SAE's folder for the explorer. Widgets only: the run is ``vit.runs.manager``'s
(``launch_sae``, ``sae_curves``), started, stopped and resumed as any other run."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import plotly.express as px
import streamlit as st

from app_pages import open_in_explorer
from vit.core.text import escape_markdown, escape_plotly, visible
from vit.runs import devices, display, launch
from vit.runs import manager as runs

FORM_KEYS = ("sae_model", "sae_model_path", "sae_data", "sae_layer", "sae_size", "sae_expansion", "sae_width",
             "sae_k", "sae_epochs", "sae_images", "sae_seed", "sae_devices", "sae_workers", "sae_name")
SIZES = {"expansion": "expansion × the model's width", "width": "a number of latents"}


def params_from_form() -> launch.SAEParams:
    s = st.session_state
    model = (s.get("sae_model_path") or "").strip() or s.get("sae_model") or ""
    size = s.get("sae_size", "expansion")
    name = (s.get("sae_name") or "").strip() or launch.suggest_name(
        f"sae-L{s.get('sae_layer') or ''}", model.rstrip("/").split("/")[-1].split(".")[0] or "model")
    ray = tuple(s["sae_devices"]) == launch.RAY
    return launch.SAEParams(
        name=name, model=model, data=s.get("sae_data") or "", layer=s.get("sae_layer"), k=s.get("sae_k"),
        expansion=s.get("sae_expansion") if size == "expansion" else None,
        width=s.get("sae_width") if size == "width" else None, epochs=s.get("sae_epochs"),
        images=s.get("sae_images"), seed=s.get("sae_seed") or 0, devices=tuple(s["sae_devices"]),
        workers=s.get("sae_workers") if ray else None)


def launch_form(manager: runs.RunManager, models: dict, choices: list[tuple[tuple[str, ...], str]],
                for_visitor: Callable[[str], str]) -> None:
    """The form that starts ``python -m vit.sae train`` as a run; its errors per field, its notice above the runs."""
    s = st.session_state
    for key, value in s.get("sae_form_memory", {}).items():  # kept across pages, as the ViT form's
        s.setdefault(key, value)
    s.setdefault("sae_layer", 1)
    s.setdefault("sae_k", 16)
    s.setdefault("sae_expansion", 8)
    s.setdefault("sae_epochs", 5)
    s.setdefault("sae_workers", 2)
    s.setdefault("sae_seed", 0)
    single = [c for c in choices if len(c[0]) == 1]
    if s.get("sae_devices") not in [c[0] for c in single]:
        s.pop("sae_devices", None)
    if s.get("sae_model") not in models:
        s.pop("sae_model", None)
    errors = s.get("sae_errors", {})

    def error_for(field: str) -> None:
        if errors.get(field):
            st.error(escape_markdown(for_visitor(errors[field])), icon=":material/error:")

    with st.expander("Train a sparse autoencoder on a layer (features)", expanded=bool(errors)):
        st.caption("A TopK SAE on the residual stream after one block (python -m vit.sae train): its curves "
                   "below, its folder (SAELens's format, metrics.json, features.npz) for the explorer's Features.")
        with st.form("launch_sae"):
            left, right = st.columns(2)
            with left:
                st.selectbox("Model", list(models), key="sae_model", format_func=lambda p: models[p].label,
                             placeholder="no model found: give a path")
                st.text_input("Or the model by its path on the server", key="sae_model_path",
                              placeholder="/path/to/model folder or file")
                error_for("model")
                st.text_input("Image folder", key="sae_data", placeholder="data/my-images",
                              help="Images at any depth; a fifth (at most 500) is held out for metrics.json and "
                              "features.npz. Relative to the repository.")
                error_for("data")
                st.number_input("Layer (block, from 1)", min_value=1, step=1, key="sae_layer",
                                help="The residual stream after this block, every token (prefix and patches)")
                error_for("layer")
                st.number_input("Training images", value=None, min_value=1, step=100, key="sae_images",
                                placeholder="2,000")
                error_for("images")
            with right:
                st.radio("Width as", list(SIZES), key="sae_size", format_func=SIZES.get, horizontal=True)
                size_left, size_right = st.columns(2)
                size_left.number_input("Expansion", min_value=1, step=1, key="sae_expansion")
                size_right.number_input("Latents", value=None, min_value=1, step=256, key="sae_width",
                                        placeholder="with 'a number of latents'")
                error_for("expansion")
                error_for("width")
                st.number_input("k (latents kept per token)", min_value=1, step=1, key="sae_k")
                error_for("k")
                st.number_input("SAE epochs", min_value=1, step=1, key="sae_epochs")
                error_for("epochs")
                st.number_input("SAE seed", step=1, key="sae_seed")
                st.selectbox("SAE device", [c[0] for c in single], key="sae_devices", format_func=devices.device_label)
                error_for("devices")
                if launch.ray_address():
                    st.number_input("Harvesting actors (Ray)", min_value=1, max_value=launch.MAX_RAY_WORKERS, step=1,
                                    key="sae_workers", help="With the Ray cluster: Ray Data harvests on this many "
                                    "actors and Ray Train trains the SAE")
                    error_for("workers")
                st.text_input("SAE run name", key="sae_name", placeholder="sae-L<layer>-model-date when empty")
                error_for("name")
            submitted = st.form_submit_button("Launch SAE run", type="primary", key="sae_submit")
    s["sae_form_memory"] = {key: s[key] for key in FORM_KEYS if key in s}
    if not submitted:
        return
    try:
        info = manager.launch_sae(params_from_form(), allow_sharing=bool(s.get("train_share")))
    except launch.ValidationError as e:
        s["sae_errors"] = e.errors
        st.error("The SAE run was not launched: fix the fields marked above.")
        st.rerun()
    else:
        s["sae_errors"] = {}
        gpus = sum(1 for choice, _ in choices if len(choice) == 1 and choice[0].startswith("cuda"))
        s["train_notice"] = display.launch_notice(info, gpus)
        s["train_notice_run"] = info.name
        s["selected_runs"] = [info.name]


def curves(manager: runs.RunManager, selected: list[str], mark_resumes: Callable = lambda figure: None) -> None:
    """The selected SAE runs' explained variance, L0 and dead fraction per step, as they train; ``mark_resumes``
    draws where they were resumed on a chart."""
    charts = manager.sae_curves(selected)
    if not any(charts.values()):
        return
    columns = st.columns(3)
    for i, (chart, rows) in enumerate(charts.items()):
        with columns[i]:
            if rows:
                data = pd.DataFrame(rows).assign(run=lambda d: d["run"].map(escape_plotly))
                figure = px.line(data, x="step", y="value", color="run", title=f"SAE {chart}",
                                 labels={"value": chart})
                figure.update_layout(height=260, margin=dict(l=10, r=10, t=40, b=10), showlegend=i == 2)
                mark_resumes(figure)
                st.plotly_chart(figure, key=f"chart-sae-{chart}")


def folder(info: display.RunInfo, show_path: bool) -> None:
    """A finished SAE run's folder: its path (to the server's own visitors) and a button that opens the explorer
    on the model it reads with this SAE chosen (``explorer_sae``)."""
    sae = info.sae_folder
    if sae is None:
        return
    if show_path:
        st.caption("SAE folder (SAELens's format, metrics.json, features.npz):")
        st.code(visible(str(sae)), language=None)
    model = info.settings.get("model")
    open_in_explorer.link(st, "Open with this SAE in the explorer",
                          {"explorer_checkpoint": str(model), "explorer_sae": str(sae)}, disabled=not model)
