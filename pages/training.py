"""Train: launch Vision Transformer runs, follow them live, stop, resume, compare and open them.

Widgets and layout only; launching, validation, states, table rows and curve data live in
``vit.runs``, ``vit.launch`` and ``vit.devices``. The runs panel is a fragment that polls the runs
folder every few seconds (which also starts queued runs whose device has become free), so it never
re-runs the form.
"""

import os
import time

import pandas as pd
import plotly.express as px
import streamlit as st

from vit import access, devices, launch, runs
from vit.data import AUGMENTATIONS, BUILTIN_DATASETS
from vit.model import PRESETS
from vit.text import escape_markdown, escape_plotly
from vit.train import RECIPES

REFRESH_SECONDS = 3
EXPLORER_PAGE = "pages/explorer.py"


# -- who may use this page: anyone on this machine; from the network only with the token (see vit.access) -----

def configured_token() -> str | None:
    try:
        return os.environ.get(access.TOKEN_ENV) or st.secrets.get(access.TOKEN_SECRET)
    except Exception:  # no secrets.toml, or an unreadable one: no token
        return None


gate = access.train_access(st.get_option("server.address"), configured_token())
if gate.mode == "disabled":
    st.title("Train a Vision Transformer")
    st.warning(gate.message)
    st.stop()
if gate.mode == "token" and not st.session_state.get("train_unlocked"):
    st.title("Train a Vision Transformer")
    st.info(gate.message)
    with st.form("unlock"):
        given = st.text_input("Training token", type="password", key="train_token_input")
        if st.form_submit_button("Unlock"):
            if gate.accepts(given):
                st.session_state["train_unlocked"] = True
                st.rerun()
            time.sleep(1.0)  # slows guessing down
            st.error("That is not the training token.")
    st.stop()

manager = runs.RunManager()


@st.cache_data(show_spinner=False)
def preset_label(name: str) -> str:
    return launch.preset_summary(name)


@st.cache_data(ttl=10, show_spinner=False)
def device_options(users: dict[str, list[str]]) -> list[tuple[tuple[str, ...], str]]:
    return devices.device_choices(devices.list_devices(), users)


def error_for(field: str) -> None:
    message = st.session_state.get("train_errors", {}).get(field)
    if message:
        st.error(escape_markdown(message), icon=":material/error:")


def recipe_hint(field: str) -> str:
    recipe = st.session_state.get("train_recipe", "ours")
    return f"{recipe}: {RECIPES[recipe][field]:g}" if field in RECIPES[recipe] else "preset"


def params_from_form() -> launch.RunParams:
    s = st.session_state
    dataset = launch.dataset_spec(s["train_dataset"], s["train_folder"])
    name = (s["train_name"] or "").strip() or launch.suggest_name(dataset, s["train_preset"])
    sizes = {f: s[f"train_{f}"] for f in launch.MODEL_SIZE_FIELDS}
    return launch.RunParams(
        name=name, dataset=dataset, preset=s["train_preset"], **sizes, recipe=s["train_recipe"],
        epochs=s["train_epochs"], batch_size=s["train_batch_size"], lr=s["train_lr"],
        weight_decay=s["train_weight_decay"], warmup_epochs=s["train_warmup_epochs"],
        label_smoothing=s["train_label_smoothing"], augment=s["train_augment"],
        aug_magnitude=s["train_aug_magnitude"], ema=s["train_ema"], seed=s["train_seed"],
        devices=s["train_devices"])


# -- launching: on the rerun the submit button causes, before the form is drawn again -------------------------

if st.session_state.get("train_submit"):
    try:
        info = manager.launch(params_from_form(), allow_sharing=st.session_state["train_share"])
    except launch.ValidationError as e:
        st.session_state["train_errors"] = e.errors
        st.session_state.pop("train_notice", None)
    else:
        gpus = sum(1 for choice, _ in device_options({}) if len(choice) == 1 and choice[0] != "cpu")
        st.session_state["train_errors"] = {}
        st.session_state["train_notice"] = runs.launch_notice(info, gpus)
        st.session_state["selected_runs"] = [info.name]

st.title("Train a Vision Transformer")

choices = device_options(manager.device_users())
if choices == [choices[-1]] and choices[-1][0] == ("cpu",):
    st.caption("No CUDA GPU on this machine: runs train on the CPU.")

with st.form("launch"):
    left, middle, right = st.columns(3)
    with left:
        st.markdown("**Model**")
        st.selectbox("Preset", list(PRESETS), key="train_preset", format_func=preset_label,
                     help="Classes and channels follow the dataset. The seed figures are what the seed "
                     "reached with its own recipe.")
        error_for("preset")
        with st.expander("Custom sizes (override the preset)"):
            for field in launch.MODEL_SIZE_FIELDS:
                st.number_input(field.replace("_", " ").capitalize(), value=None, step=1, key=f"train_{field}",
                                placeholder="preset")
                error_for(field)
        st.markdown("**Data**")
        st.selectbox("Dataset", [*BUILTIN_DATASETS, "folder"], key="train_dataset",
                     format_func=lambda d: "Image folder…" if d == "folder" else d)
        st.text_input("Folder (for an image folder)", key="train_folder", placeholder="data/my-images",
                      help="PATH/train/<class>/… with optional PATH/val/<class>/…, or PATH/<class>/…; "
                      "relative to the repository")
        error_for("dataset")
    with middle:
        st.markdown("**Recipe**")
        st.selectbox("Recipe", list(RECIPES), key="train_recipe",
                     help="Fills every field left empty: ours (warmup + cosine, label smoothing, "
                     "TrivialAugment) or seed (the seed blog's constant-lr AdamW)")
        error_for("recipe")
        st.number_input("Epochs", value=None, step=1, key="train_epochs", placeholder=recipe_hint("epochs"))
        error_for("epochs")
        st.number_input("Batch size", value=None, step=1, key="train_batch_size",
                        placeholder=recipe_hint("batch_size"))
        error_for("batch_size")
        st.number_input("Learning rate", value=None, step=1e-4, format="%g", key="train_lr",
                        placeholder=recipe_hint("lr"))
        error_for("lr")
        st.number_input("Weight decay", value=None, step=0.01, format="%g", key="train_weight_decay",
                        placeholder=recipe_hint("weight_decay"))
        error_for("weight_decay")
        st.number_input("Warmup epochs", value=None, step=1.0, format="%g", key="train_warmup_epochs",
                        placeholder="ours: 5, at most a tenth of the epochs")
        error_for("warmup_epochs")
    with right:
        st.markdown("**Regularisation**")
        st.number_input("Label smoothing", value=None, step=0.05, format="%g", key="train_label_smoothing",
                        placeholder=recipe_hint("label_smoothing"))
        error_for("label_smoothing")
        st.selectbox("Augmentation", [None, *AUGMENTATIONS], key="train_augment",
                     format_func=lambda a: "recipe's" if a is None else a,
                     help="none < flip-crop < trivialaugment < randaugment (strength below); seed: flip + "
                     "RandomResizedCrop")
        error_for("augment")
        st.number_input("RandAugment strength (magnitude)", value=None, step=1, key="train_aug_magnitude",
                        placeholder="9")
        error_for("aug_magnitude")
        st.number_input("EMA decay of the weights", value=None, step=0.001, format="%g", key="train_ema",
                        placeholder="0 = off")
        error_for("ema")
        st.number_input("Seed", value=0, step=1, key="train_seed")
        error_for("seed")
        st.markdown("**Run**")
        st.text_input("Run name", key="train_name", placeholder="dataset-preset-date when empty")
        error_for("name")
        st.selectbox("Device", [c[0] for c in choices], key="train_devices",
                     format_func=dict(choices).get)
        error_for("devices")
        st.checkbox("Share the device with running runs", key="train_share",
                    help="Otherwise the run waits (queued) until no other run of ours uses its device")
    error_for("form")
    st.form_submit_button("Launch", type="primary", key="train_submit")

if st.session_state.get("train_errors"):
    st.error("The run was not launched: fix the fields marked above.")
if st.session_state.get("train_notice"):
    st.success(escape_markdown(st.session_state["train_notice"]))


# -- the runs: polled every few seconds, without re-running the form ------------------------------------------

def run_controls(info: runs.RunInfo) -> None:
    # Names and details (which quote log lines) are shown as written, never as Markdown.
    state = f"**{escape_markdown(info.name)}** · {info.state}"
    state += f" · {escape_markdown(info.detail)}" if info.detail else ""
    if info.state in ("failed", "crashed", "damaged"):
        st.error(state)
    else:
        st.markdown(state)
    stop, resume, open_, delete = st.columns(4)
    # Callbacks act before the fragment redraws, so the table already shows the result.
    stop.button("Stop", key=f"stop-{info.name}", disabled=not info.active, on_click=runs_action,
                args=(manager.stop, info.name))
    resume.button("Resume" if info.resumable else "Restart", key=f"resume-{info.name}",
                  disabled=not info.can_resume, on_click=runs_action, args=(manager.resume, info.name),
                  help="Continue from last.pt" if info.resumable else "Start again from scratch")
    if open_.button("Open in explorer", key=f"open-{info.name}", disabled=not info.can_open):
        st.session_state["explorer_checkpoint"] = str(info.best_checkpoint)
        st.switch_page(EXPLORER_PAGE)
    with delete.popover("Delete", disabled=info.state == "running"):
        st.markdown(f"Delete {escape_markdown(info.name)} and its checkpoints? This cannot be undone.")
        st.button("Delete for good", key=f"delete-{info.name}", type="primary", on_click=runs_action,
                  args=(manager.delete, info.name))
    st.code(manager.log_tail(info.name, lines=15) or "(no output yet)", language=None)


def runs_action(action, name: str) -> None:
    try:
        action(name)
    except runs.RunError as e:
        st.session_state["runs_message"] = str(e)
    else:
        st.session_state.pop("runs_message", None)


@st.fragment(run_every=REFRESH_SECONDS)
def runs_panel() -> None:
    all_runs = manager.poll()
    st.subheader("Runs")
    if not all_runs:
        st.info(f"No runs yet in {escape_markdown(manager.runs_dir)}.")
        return
    if st.session_state.get("runs_message"):
        st.warning(escape_markdown(st.session_state["runs_message"]))
    st.dataframe(
        pd.DataFrame(runs.table_rows(all_runs)), hide_index=True, width="stretch",
        column_config={
            "Progress": st.column_config.ProgressColumn("Progress", min_value=0.0, max_value=1.0, format="percent"),
            "Best val acc": st.column_config.NumberColumn("Best val acc", format="percent"),
            "LR": st.column_config.NumberColumn("LR", format="%g"),
            "Started": st.column_config.DatetimeColumn("Started", format="YYYY-MM-DD HH:mm"),
        })
    names = [r.name for r in all_runs]
    selected = [n for n in st.session_state.get("selected_runs", names[:1]) if n in names]
    st.session_state["selected_runs"] = selected
    selected = st.multiselect("Selected runs (curves overlaid)", names, key="selected_runs")
    if not selected:
        return
    charts = manager.curves(selected)
    columns = st.columns(2)
    for i, (chart, rows) in enumerate(charts.items()):
        with columns[i % 2]:
            if rows:
                curves = pd.DataFrame(rows).assign(run=lambda d: d["run"].map(escape_plotly))  # legend: no HTML
                figure = px.line(curves, x="epoch", y="value", color="run", line_dash="split",
                                 markers=True, title=chart.capitalize(), labels={"value": chart})
                figure.update_layout(height=300, margin=dict(l=10, r=10, t=40, b=10))
                st.plotly_chart(figure, key=f"chart-{chart}")
            else:
                st.caption(f"{chart.capitalize()}: no finished epoch yet.")
    by_name = {r.name: r for r in all_runs}
    for name in selected:
        with st.container(border=True):
            run_controls(by_name[name])


runs_panel()
