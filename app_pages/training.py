"""Train: launch Vision Transformer runs, follow them live, stop, resume, compare and open them.

Widgets and layout only; launching, validation, states, table rows and curve data live in
``vit.runs.manager``, ``vit.runs.display``, ``vit.runs.launch`` and ``vit.runs.devices``. The runs panel is a
fragment that polls the runs folder every few seconds (which also starts queued runs whose device has become free),
so it never re-runs the form.
"""

import os
import time

import streamlit as st
from streamlit.logger import get_logger

from app_pages import player
from app_pages.explorer_sections.checkpoint_picker import open_from_hub
from app_pages.training_sections import attention_snapshots, runs_panel
from app_pages.training_sections import sae as sae_section
from vit.app import catalog
from vit.core.text import escape_markdown, visible
from vit.model import PRESETS
from vit.runs import access, devices, display, launch
from vit.runs import manager as runs
from vit.training.options import FINETUNE_MODES, PRECISIONS, RECIPES
from vit.training.specs import AUGMENTATIONS, BUILTIN_DATASETS

# -- who may use this page: vit.runs.access's one rule; the token entered here unlocks every page ------------

gate = access.server_access(st.get_option("server.address"), access.configured_token(st.secrets.get))
if gate.mode == "disabled":
    st.title("Train a Vision Transformer")
    st.warning(gate.message)
    st.stop()
if not gate.allows(st.session_state.get(access.UNLOCKED)):
    st.title("Train a Vision Transformer")
    st.info(gate.message)
    with st.form("unlock"):
        given = st.text_input("Training token", type="password", key="train_token_input")
        if st.form_submit_button("Unlock"):
            if gate.accepts(given):
                st.session_state[access.UNLOCKED] = True
                st.rerun()
            time.sleep(1.0)  # slows guessing down
            st.error("That is not the training token.")
    st.stop()

manager = runs.RunManager()
LOG = get_logger(__name__)


def private(text: str) -> str:
    """Text as this visitor may see it: behind a token (a visitor from the network) the data roots by name only,
    not where the server keeps them."""
    return launch.hide_data_roots(text, manager.data_roots) if gate.mode == "token" else text


def for_visitor(text: str) -> str:
    """A one-line message as this visitor may see it, run and folder names' control characters made visible."""
    return visible(private(text))


@st.cache_data(show_spinner=False)
def preset_label(name: str) -> str:
    return launch.preset_summary(name)


@st.cache_data(ttl=10, show_spinner=False)
def device_options(users: dict[str, list[str]], ray_address: str | None = None
                   ) -> list[tuple[tuple[str, ...], str]]:
    choices = devices.device_choices(devices.list_devices(), users)
    if ray_address:  # $VIT_RAY_ADDRESS, set by whoever started the server; a visitor never gives an address
        choices.append((launch.RAY, display.ray_cluster_label(ray_address, users.get("ray"))))
    return choices


def error_for(field: str) -> None:
    message = st.session_state.get("train_errors", {}).get(field)
    if message:
        st.error(escape_markdown(for_visitor(message)), icon=":material/error:")


def recipe_hint(field: str) -> str:
    recipe = st.session_state.get("train_recipe", "ours")
    return f"{recipe}: {RECIPES[recipe][field]:g}" if field in RECIPES[recipe] else "preset"


START_FROM = {"preset": "a preset (random weights)", "import": "an imported model"}
FINETUNE_LABELS = {"full": "full: every weight trains", "linear-probe": "linear probe: the classifier alone"}


def importable_models() -> dict[str, catalog.CatalogEntry]:
    """What a run can start from: the explorer's list (shipped checkpoints, completed runs, the HF cache),
    as the Analyse page offers it, less the files that cannot be opened."""
    entries = (catalog.describe_current(c) for c in catalog.model_candidates())
    return {str(e.path): e for e in entries if e.ok}


def start_model(models: dict[str, catalog.CatalogEntry]) -> tuple[str | None, str]:
    """(--init path or None for a preset, a short name for the run's default name); "" when none is chosen."""
    s = st.session_state
    if s.get("train_start") != "import":
        return None, s["train_preset"]
    typed = (s.get("train_init_path") or "").strip()  # past the gate, a visitor may give a path
    if typed:
        return typed, os.path.basename(typed.rstrip("/")) or "model"
    chosen = s.get("train_init") or ""
    return chosen, models[chosen].name if chosen in models else "model"


def params_from_form(models: dict[str, catalog.CatalogEntry]) -> launch.RunParams:
    s = st.session_state
    dataset = launch.dataset_spec(s["train_dataset"], s["train_folder"])
    init, model_name = start_model(models)
    name = (s["train_name"] or "").strip() or launch.suggest_name(dataset, model_name)
    sizes = {f: s[f"train_{f}"] for f in launch.MODEL_SIZE_FIELDS}
    imported = init is not None
    return launch.RunParams(
        name=name, dataset=dataset, preset=None if imported else s["train_preset"], init=init,
        finetune=s.get("train_finetune") if imported else None,
        layer_decay=s.get("train_layer_decay") if imported else None, **sizes, recipe=s["train_recipe"],
        epochs=s["train_epochs"], time_budget=(s.get("train_time_budget") or "").strip() or None,
        batch_size=s["train_batch_size"], lr=s["train_lr"],
        weight_decay=s["train_weight_decay"], warmup_epochs=s["train_warmup_epochs"],
        label_smoothing=s["train_label_smoothing"], augment=s["train_augment"],
        aug_magnitude=s["train_aug_magnitude"], ema=s["train_ema"], drop_path=s["train_drop_path"],
        mixup=s["train_mixup"], cutmix=s["train_cutmix"], mix_prob=s["train_mix_prob"],
        random_erasing=s["train_random_erasing"], precision=s["train_precision"], compile=s["train_compile"],
        seed=s["train_seed"],
        devices=tuple(s["train_devices"]), threads=s["train_threads"] or machine_threads(),
        save_every=s.get("train_save_every"), attention_every=s.get("train_attention_every"),
        **({"workers": s["train_workers"], "gpus_per_worker": s["train_gpus_per_worker"]}
           if tuple(s["train_devices"]) == launch.RAY else {}))


@st.cache_data(ttl=60, show_spinner=False)
def machine_threads() -> int:
    return launch.default_threads()


# The form's values outlive a visit to another page: Streamlit drops a widget's state when a run does
# not draw it, so a plain copy (not a widget key) is kept and put back before the widgets are drawn.
FORM_KEYS = ("train_start", "train_preset", "train_init", "train_init_path", "train_finetune", "train_layer_decay",
             *(f"train_{f}" for f in launch.MODEL_SIZE_FIELDS), "train_dataset", "train_folder",
             "train_recipe", "train_epochs", "train_time_budget", "train_batch_size", "train_lr",
             "train_weight_decay",
             "train_warmup_epochs", "train_label_smoothing", "train_augment", "train_aug_magnitude", "train_ema",
             "train_drop_path", "train_mixup", "train_cutmix", "train_mix_prob", "train_random_erasing",
             "train_precision", "train_compile", "train_seed", "train_threads", "train_name", "train_devices",
             "train_share", "train_workers",
             "train_save_every", "train_attention_every",
             "train_gpus_per_worker")
FORM_MEMORY = "train_form_memory"
for key, value in st.session_state.get(FORM_MEMORY, {}).items():
    if key not in st.session_state:
        st.session_state[key] = value
st.session_state.setdefault("train_seed", 0)
st.session_state.setdefault("train_workers", 2)
st.session_state.setdefault("train_gpus_per_worker", 0.0)


# -- launching: on the rerun the submit button causes, before the form is drawn again -------------------------

models = importable_models()
for hub_model in st.session_state.get("train_hub_models", []):  # opened from the Hub on this page (below)
    models.setdefault(str(hub_model.path), catalog.describe_current(hub_model))
if st.session_state.get("train_init") not in models:
    st.session_state.pop("train_init", None)  # deleted since, or never chosen: the first one listed

if st.session_state.get("train_submit"):
    try:
        info = manager.launch(params_from_form(models), allow_sharing=st.session_state["train_share"])
    except launch.ValidationError as e:
        LOG.info("a launch was refused: %s", e)  # the whole messages, data roots included, for the server's owner
        st.session_state["train_errors"] = e.errors
        st.session_state.pop("train_notice", None)
    else:
        gpus = sum(1 for choice, _ in device_options({}) if len(choice) == 1 and choice[0] != "cpu")
        st.session_state["train_errors"] = {}
        st.session_state["train_notice"] = display.launch_notice(info, gpus)
        st.session_state["train_notice_run"] = info.name
        st.session_state["selected_runs"] = [info.name]

st.title("Train a Vision Transformer")

choices = device_options(manager.device_users(), launch.ray_address())
if choices == [choices[-1]] and choices[-1][0] == ("cpu",):
    st.caption("No CUDA GPU on this machine: runs train on the CPU.")
if st.session_state.get("train_devices") not in [c[0] for c in choices]:
    st.session_state.pop("train_devices", None)  # e.g. a GPU that has gone since



hub_text = st.text_input("Start from a model on the Hub", key="train_open_hub",
                         placeholder="google/vit-base-patch16-224",
                         help="ORG/NAME[@REVISION], hf-hub:ORG/NAME or a timm model name: downloaded into the Hugging "
                              "Face cache (its safetensors and configs, never code) when it is not there yet, then "
                              "chosen as the imported model below.").strip()
from_hub = open_from_hub(hub_text, True, st, "train_hub_download") if hub_text else None  # past the gate
if from_hub is not None and str(from_hub.path) not in models:
    st.session_state.setdefault("train_hub_models", []).append(from_hub)
    models[str(from_hub.path)] = catalog.describe_current(from_hub)
if from_hub is not None and str(from_hub.path) != st.session_state.get("train_opened_hub"):
    st.session_state["train_init"], st.session_state["train_start"] = str(from_hub.path), "import"
st.session_state["train_opened_hub"] = str(from_hub.path) if from_hub is not None else None

with st.form("launch"):
    left, middle, right = st.columns(3)
    with left:
        st.markdown("**Model**")
        st.radio("Start from", list(START_FROM), key="train_start", format_func=START_FROM.get, horizontal=True,
                 help="A preset trains from random weights; an imported model is fine-tuned (python -m vit.train "
                 "--init): its classifier is kept when the dataset has its classes, else replaced, and images are "
                 "normalised with its own mean and std.")
        st.selectbox("Preset", list(PRESETS), key="train_preset", format_func=preset_label,
                     help="Classes and channels follow the dataset. The seed figures are what the seed "
                     "reached with its own recipe.")
        error_for("preset")
        with st.expander("Custom sizes (override the preset)"):
            for field in launch.MODEL_SIZE_FIELDS:
                st.number_input(field.replace("_", " ").capitalize(), value=None, step=1, key=f"train_{field}",
                                placeholder="preset")
                error_for(field)
        st.selectbox("Imported model", list(models), key="train_init", format_func=lambda p: models[p].label,
                     placeholder="no model found: give a path", help="With 'an imported model': the explorer's "
                     "list: shipped checkpoints, completed runs and the supported models of the local Hugging Face "
                     "cache. Only the image size (custom sizes) and dropout may change.")
        st.text_input("Or a path on the server", key="train_init_path", placeholder="/path/to/model folder or file",
                      help="Used instead of the list when given: our .pt, an HF or timm folder, timm / "
                      "torchvision weights; relative to the repository.")
        error_for("init")
        st.radio("Fine-tune", FINETUNE_MODES, key="train_finetune", format_func=FINETUNE_LABELS.get,
                 help="With an imported model. A linear probe trains the classifier alone on the frozen model's "
                 "features (as MAE's and DINO's linear evaluation); the frozen part runs without dropout.")
        error_for("finetune")
        st.number_input("Layer-wise LR decay", value=None, step=0.05, format="%g", key="train_layer_decay",
                        placeholder="off (1); MAE's ViT-B: 0.65",
                        help="Full fine-tuning of an imported model (BEiT, MAE): of L blocks, block i trains at "
                        "the learning rate × decay^(L − i), the embeddings at decay^(L + 1), the final norm and "
                        "classifier at the full rate. Empty: off. MAE's FINETUNE.md uses 0.65 for ViT-B and 0.75 for "
                        "ViT-L/H; BEiT 0.65 for ViT-B.")
        error_for("layer_decay")
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
        st.text_input("Time budget", key="train_time_budget", placeholder="off; e.g. 10m or 1.5h",
                      help="Train as many epochs as fit in this wall time (600, 10m, 1.5h): the run plans them at "
                      "the end of its second epoch, and its cosine ends at the last. Epochs is then the most it "
                      f"may plan (at most {launch.MAX_EPOCHS} from this page); the warmup must be 2 epochs or more.")
        error_for("time_budget")
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
        st.markdown("**Speed**")
        st.selectbox("Precision", PRECISIONS, key="train_precision",
                     help="auto: bf16 autocast on a GPU, fp32 on the CPU")
        error_for("precision")
        st.checkbox("Compile the model (torch.compile)", key="train_compile",
                    help="Faster steps on a GPU after slower first ones (the augmentation and validation are "
                    "compiled too); on the CPU it seldom pays.")
        error_for("compile")
    with right:
        st.markdown("**Regularisation**")
        st.number_input("Label smoothing", value=None, step=0.05, format="%g", key="train_label_smoothing",
                        placeholder=recipe_hint("label_smoothing"))
        error_for("label_smoothing")
        st.selectbox("Augmentation", [None, *AUGMENTATIONS], key="train_augment", placeholder="recipe's",
                     format_func=lambda a: "recipe's" if a is None else a,
                     help="none < flip-crop < trivialaugment < randaugment (strength below); autoaugment: "
                     "AutoAugment's CIFAR-10 policy (Lee et al. 2021's); seed: flip + RandomResizedCrop")
        error_for("augment")
        st.number_input("RandAugment strength (magnitude)", value=None, step=1, key="train_aug_magnitude",
                        placeholder="9")
        error_for("aug_magnitude")
        st.number_input("EMA decay of the weights", value=None, step=0.001, format="%g", key="train_ema",
                        placeholder="0 = off")
        error_for("ema")
        st.number_input("Drop path (stochastic depth)", value=None, step=0.05, format="%g", key="train_drop_path",
                        placeholder="preset's",
                        help="The last block's rate, linear from 0 at the first (DeiT: 0.1 for ViT-S and ViT-B).")
        error_for("drop_path")
        mix_left, mix_right = st.columns(2)
        mix_left.number_input("Mixup alpha", value=None, step=0.1, format="%g", key="train_mixup",
                              placeholder=recipe_hint("mixup"), help="0 = off; DeiT: 0.8")
        mix_right.number_input("CutMix alpha", value=None, step=0.1, format="%g", key="train_cutmix",
                               placeholder=recipe_hint("cutmix"),
                               help="0 = off; DeiT: 1.0. With mixup too, each mixed batch uses one of the two.")
        error_for("mixup")
        error_for("cutmix")
        mix_left, mix_right = st.columns(2)
        mix_left.number_input("Share of batches mixed", value=None, step=0.1, format="%g", key="train_mix_prob",
                              placeholder=recipe_hint("mix_prob"),
                              help="With mixup or CutMix: DeiT mixes every batch (1), Lee et al. (2021) half (0.5).")
        mix_right.number_input("Random erasing", value=None, step=0.05, format="%g", key="train_random_erasing",
                               placeholder=recipe_hint("random_erasing"),
                               help="The probability an image loses a box of 2-33 % of its area (DeiT: 0.25).")
        error_for("mix_prob")
        error_for("random_erasing")
        st.number_input("Seed", step=1, key="train_seed")
        error_for("seed")
        st.number_input("Training threads", value=None, min_value=1, step=1, key="train_threads",
                        placeholder=f"this machine: {machine_threads()}",
                        help="CPU threads of the training process. Empty: 1 on two cores or fewer, else the "
                        "idle cores minus one (at most 8); threads waiting for a busy core slow every step.")
        error_for("threads")
        snap_left, snap_right = st.columns(2)
        snap_left.number_input("Attention every N epochs", value=None, min_value=0, step=1,
                               key="train_attention_every", placeholder="1",
                               help="The probe images' attention maps and every head's distance and entropy, "
                               "recorded every N epochs (and before training and at the end); 0 = off.")
        snap_right.number_input("Keep weights every N epochs", value=None, min_value=0, step=1,
                                key="train_save_every", placeholder="0 = off",
                                help="Keeps checkpoints/epoch_NNNN.pt every N epochs, to compare epochs in the "
                                "explorer.")
        error_for("attention_every")
        error_for("save_every")
        st.markdown("**Run**")
        st.text_input("Run name", key="train_name", placeholder="dataset-preset-date when empty")
        error_for("name")
        # The options' text must not change while the page is open (memory in use, runs using the device):
        # the browser sends the text back, and text it no longer finds came back as the value itself.
        st.selectbox("Device", [c[0] for c in choices], key="train_devices", format_func=devices.device_label)
        st.caption("  \n".join(label for _, label in choices))
        error_for("devices")
        if launch.ray_address():
            ray_left, ray_right = st.columns(2)
            ray_left.number_input("Ray workers", min_value=1, max_value=launch.MAX_RAY_WORKERS, step=1,
                                  key="train_workers", help="With the Ray cluster as the device: Ray Train workers, "
                                  "one CPU each; the run's folder must be on storage every node sees.")
            ray_right.number_input("GPUs per worker", min_value=0.0, max_value=float(launch.MAX_GPUS_PER_WORKER),
                                   step=1.0, key="train_gpus_per_worker",
                                   help="0 trains on the workers' CPUs (gloo); more uses NCCL on the GPUs.")
            error_for("workers")
            error_for("gpus_per_worker")
        st.checkbox("Share the device with running runs", key="train_share",
                    help="Otherwise the run waits (queued) until no other run of ours uses its device")
    error_for("form")
    st.form_submit_button("Launch", type="primary", key="train_submit")

st.session_state[FORM_MEMORY] = {key: st.session_state[key] for key in FORM_KEYS if key in st.session_state}

if st.session_state.get("train_errors"):
    st.error("The run was not launched: fix the fields marked above.")

sae_section.launch_form(manager, models, choices, for_visitor)


# -- the runs: polled every few seconds, without re-running the form (app_pages/training_sections/runs_panel.py) -----

runs_panel.runs_panel(manager, gate.mode == "token", private, for_visitor)


# -- attention during training: probe images per epoch, head statistics (training_sections/attention_snapshots.py)

# Refreshes on its own: every 5 s to pick up new epochs, every second while playing.
player.play_fragment(attention_snapshots.attention_panel, "snap_play", manager, idle_seconds=5)
