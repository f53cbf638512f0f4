"""Analyse a dataset: attention statistics, per-class maps, the confusion matrix and the most confident mistakes.

A short script over ``vit.analyze`` (the same computation as ``python -m vit.analyze``). A
mistake opens in the explorer through ``st.session_state["explorer_checkpoint"]`` and
``["explorer_image"]`` (a file path), handed over by a link (``app_pages/open_in_explorer.py``).
"""

import os
import time
from functools import partial
from pathlib import Path

import streamlit as st

from app_pages import open_in_explorer
from app_pages.analyze_sections.benchmark import benchmark_section
from app_pages.analyze_sections.feature_browser import feature_browser
from app_pages.explorer_sections.checkpoint_picker import choose, open_from_hub, picker, server_gate
from app_pages.explorer_sections.long_work import long_work
from vit.analyze import build_parser as analyze_parser
from vit.analyze import submit as submit_analysis
from vit.app import catalog
from vit.app import explorer_page as explorer
from vit.checkpoint import CheckpointError
from vit.core.images import ImageError, open_image
from vit.core.progress import Progress, in_parts
from vit.core.runfiles import default_checkpoints_dir, default_runs_dir, parse_json, read_text_bounded
from vit.core.text import escape_markdown, visible
from vit.evaluate import labelled_files
from vit.explain.views import dataset
from vit.explain.views.dataset import sample_files
from vit.predict import UsageError
from vit.runs import access, launch, ray_analyze, ray_jobs
from vit.runs.launch import default_data_roots, folder_problem, hide_data_roots, resolve_dataset
from vit.sources.open import open_source

SHOWN_MISTAKES = 12
# One page's analysis holds a core for minutes at most (100,000 images took ~10 minutes); the CLI has no cap.
MAX_PAGE_IMAGES = int(os.environ.get("VIT_ANALYSE_MAX_IMAGES", "20000"))
REQUEST_KEY = "analyze_request"  # (key, compute, checkpoint, folder) of the pass this session asked for

st.title("Analyse a dataset")
st.caption("Every image of a folder through one checkpoint: how far and how evenly each head attends (the ViT "
           "paper's Fig. 7), the mean CLS attention and rollout per class, the confusion matrix and the mistakes "
           "the model is most sure of.")

# Reading the server's folders (and models by path, and the Ray cluster) follows vit.runs.access's one rule.
gate = server_gate()
if not gate.allows(st.session_state.get(access.UNLOCKED)):
    st.warning(gate.message + (" Enter the token on the Train page." if gate.mode == "token" else ""))
    st.stop()


# The explorer's choice of models: shipped checkpoints and runs, the HF cache, a path on the server, the Hub.
HF_FILTER, OPEN_PATH = "Find in the HF cache", "Or open a path"
hf_filter = ""
if len(catalog.hf_cache_folders()) > catalog.MAX_HF_CACHE_EXAMINED:  # folder names only: cheap
    hf_filter = st.text_input(HF_FILTER, key="analyze_hf_filter", placeholder="part of a model's name",
                              help="The Hugging Face cache holds more models than the picker lists: only those "
                                   "whose name holds this are looked at.")
hf_listing = catalog.hf_cache_listing(contains=hf_filter)
candidates = catalog.find_checkpoints() + list(hf_listing.candidates)
opened = st.text_input(OPEN_PATH, key="analyze_open_path", placeholder="/path/to/model folder or file",
                       help="A model file or folder on the server: our .pt, an HF or timm folder, timm / "
                            "torchvision weights.").strip()
hub_text = st.text_input("Or open from the Hub", key="analyze_open_hub", placeholder="google/vit-base-patch16-224",
                         help="ORG/NAME[@REVISION], hf-hub:ORG/NAME or a timm model name; downloaded into the Hugging "
                              "Face cache (its safetensors and configs, never code) when it is not there yet.").strip()
from_hub = open_from_hub(hub_text, True, st, "analyze_hub_download") if hub_text else None  # past the gate
if from_hub is not None:
    candidates.append(from_hub)
    if str(from_hub.path) != st.session_state.get("analyze_opened_hub"):
        choose("analyze_checkpoint", str(from_hub.path))  # what was just opened is what is analysed
st.session_state["analyze_opened_hub"] = str(from_hub.path) if from_hub is not None else None
described = {str(c.path): catalog.describe_current(c) for c in candidates}
if opened:
    wanted = catalog.candidate_for(opened, candidates)
    described.setdefault(str(wanted.path), catalog.describe_current(wanted))
    if not described[str(wanted.path)].ok:
        st.error(escape_markdown(described[str(wanted.path)].error))
    elif opened != st.session_state.get("analyze_opened"):
        choose("analyze_checkpoint", str(wanted.path))  # what was just opened is what is analysed
st.session_state["analyze_opened"] = opened
entries = [e for e in described.values() if e.ok]
if not entries:
    st.info(f"No checkpoints yet: put a .pt file in {escape_markdown(default_checkpoints_dir())} or train one.")
    st.stop()
labels = {str(e.path): e.label for e in entries}
if st.session_state.get("analyze_checkpoint") not in labels:
    default = catalog.default_entry(entries)
    choose("analyze_checkpoint", str(default.path) if default else next(iter(labels)))
choice = picker(st, "Checkpoint", list(labels), "analyze_checkpoint", format_func=labels.get)
hf_note = catalog.hf_cache_note(hf_listing, HF_FILTER, OPEN_PATH)
if hf_note:
    st.caption(escape_markdown(hf_note))
ray_address = launch.ray_address()  # $VIT_RAY_ADDRESS, set by whoever started the server, never by a visitor


def shown(text: str) -> str:
    """Text as this visitor may see it: behind the token (maybe from the network), the data roots by name only."""
    return hide_data_roots(text, default_data_roots()) if gate.mode == "token" else text


BENCHMARKS = "Which map to trust: faithfulness benchmarks"
if st.radio("Run", ["The dataset analysis", BENCHMARKS], key="analyze_mode", horizontal=True) == BENCHMARKS:
    benchmark_section(choice, ray_address, shown, MAX_PAGE_IMAGES)  # python -m vit.faithfulness --benchmark ...
    st.stop()
folder = st.text_input("Image folder", key="analyze_folder", placeholder="data/cifar10/val",
                       help="One subfolder per class, named as the checkpoint names its classes, inside the data "
                            "folders (as the Train page's folder datasets); relative to the repository.")
limit = st.number_input(f"Images (0 = all of them, at most {MAX_PAGE_IMAGES:,} here)", min_value=0, value=500,
                        step=100, key="analyze_limit",
                        help="A seeded random sample of the folder, so every class is represented.")
on_ray = bool(ray_address) and st.checkbox(
    "Run on the Ray cluster", key="analyze_on_ray",
    help="python -m vit.analyze --ray: Ray Data maps the images over actors on the cluster's nodes, each loading the "
         "model once; the model, the folder and the runs folder must be on storage every node mounts.")
with_mechanism = st.checkbox("Also the mechanism: head attribution, ablation, high-norm tokens, sinks (slower)",
                             key="analyze_mechanism", disabled=on_ray,
                             help="Runs each layer again per image to ablate its heads one at a time (on this "
                                  "machine only: not on the cluster from this page).") and not on_ray


def analyze_on_ray(model: str, data: Path, limit: int, progress: Progress) -> tuple:
    """``python -m vit.analyze --ray``'s job into a folder of the runs folder (storage the nodes share), followed
    with ``progress`` (images done, from its log): the page's Stop stops the job (``ray_analyze.wait_for_job``) and
    nothing is read back. Done, its analysis and figures (once per analysis, as ``analyze_here``)."""
    out = default_runs_dir() / ".analyses" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    progress(0, limit)  # a Stop before the job is submitted submits nothing
    jobs, sid = submit_analysis(analyze_parser().parse_args(
        [model, "--data", str(data), "--out", str(out), "--ray", ray_address, "--limit", str(limit)]))
    status = ray_analyze.wait_for_job(jobs, sid, limit, progress)
    if status == "FAILED":
        raise ValueError(ray_jobs.job_error(jobs, sid, "vit.analyze"))
    if status != "SUCCEEDED":  # stopped on the cluster (ray job stop): no report
        raise ValueError(f"the Ray job {sid} was stopped on the cluster before it wrote its report")
    # Its mistakes must lie in the folder: the file is written on shared storage, and each opens in the explorer.
    analysis = dataset.DatasetAnalysis.from_json(parse_json(read_text_bounded(out / "analysis.json")), folder=data)
    return analysis, dataset.figures(analysis)


def analyze_here(checkpoint, files: list, with_mechanism: bool, progress: Progress) -> tuple:
    """The dataset pass on this server (and the mechanism's, with ``with_mechanism``), then its figures (once per
    analysis, not on every rerun: each mistake's button reruns the page); ``progress`` counts the images."""
    first, second = in_parts(progress, [len(files), len(files) if with_mechanism else 0])
    analysis = dataset.analyze_files(checkpoint, files, progress=first)
    if with_mechanism:
        analysis.mechanism = dataset.analyze_mechanism(checkpoint, files, progress=second)
    return analysis, dataset.figures(analysis)


def mistake_image(path: str, data: str):
    """A mistake's image: a regular file inside the analysed folder, read with the uploads' bound."""
    return open_image(explorer.read_image_file(path, data, st.get_option("server.maxUploadSize") * 2**20),
                      name=Path(path).name)


feature_browser(choice)  # issue 36: an SAE of this checkpoint, its features by their exemplars

if st.button("Analyse", type="primary", disabled=not folder.strip()):
    try:
        # Images from the data roots only, links resolved, as the Train page's datasets; the same answer
        # for a folder outside them whether or not it exists.
        spec = resolve_dataset(f"folder:{folder.strip()}")
        problem = folder_problem(spec, default_data_roots())
        if problem:
            raise ValueError(problem.replace("folder datasets", "image folders"))
        data_folder = Path(spec[len("folder:"):])
        checkpoint = open_source(choice)  # our .pt files and every format the explorer opens
        if not checkpoint.class_names:
            raise ValueError("this model has no classifier (a feature model): there are no classes to analyse")
        everything = labelled_files(data_folder, checkpoint.class_names)
        if len(everything) > MAX_PAGE_IMAGES and (not limit or limit > MAX_PAGE_IMAGES):
            st.info(f"The folder has {len(everything):,} images; this page analyses a seeded sample of "
                    f"{MAX_PAGE_IMAGES:,} (python -m vit.analyze takes them all).")
        files = sample_files(everything, min(limit or MAX_PAGE_IMAGES, MAX_PAGE_IMAGES), seed=0)
        # Long work either way: progress, a Stop button (on Ray it stops the job), the server-wide bound (long_work).
        compute = partial(analyze_on_ray, choice, data_folder, len(files)) if on_ray else \
            partial(analyze_here, checkpoint, files, with_mechanism)
        st.session_state[REQUEST_KEY] = ((choice, str(data_folder), len(files), with_mechanism, time.time(), on_ray),
                                         compute, choice, str(data_folder))
        st.session_state.pop("analyze_result", None)  # the report shown is the one asked for last, or none
    except (UsageError, CheckpointError, ValueError) as e:
        st.error(escape_markdown(shown(str(e))))

if REQUEST_KEY in st.session_state:  # asked for in this run or an earlier one: shown until it is done
    key, compute, analysed_checkpoint, analysed_data = st.session_state[REQUEST_KEY]
    try:
        label = f"Analysing {key[2]:,} images" + (" and their mechanism" if key[3] else "") + (
            " on the Ray cluster" if key[5] else "")
        done = long_work(key, label, compute, "analyse", unit="images", heavy=not key[5])
    except (CheckpointError, ValueError, OSError) as e:
        st.session_state.pop(REQUEST_KEY)
        st.error(escape_markdown(shown(str(e))))
    else:
        if done is not None:
            st.session_state.pop(REQUEST_KEY)
            st.session_state["analyze_result"] = (analysed_checkpoint, analysed_data, *done)

result = st.session_state.get("analyze_result")
if result is None:
    st.stop()
checkpoint_path, analysed_folder, analysis, figures = result
accuracy = f"{analysis.accuracy:.1%}" if analysis.accuracy is not None else "–"
left, middle, right = st.columns(3)
left.metric("Images", analysis.count)
middle.metric("Accuracy", accuracy)
right.metric("Unreadable", len(analysis.skipped))

left, right = st.columns(2)
# theme=None: Streamlit's theme recolours Plotly's colour scales (the maps' lowest values came out pink).
left.plotly_chart(figures["distance"], theme=None)
right.plotly_chart(figures["entropy"], theme=None)
st.plotly_chart(figures["class_attention"], theme=None)
st.plotly_chart(figures["class_rollout"], theme=None)
st.plotly_chart(figures["confusion"], theme=None)
for stem in [s for s in figures if s.startswith("mechanism_")]:  # with "Also the mechanism"
    st.plotly_chart(figures[stem], theme=None, key=stem)
if analysis.mechanism is not None:
    st.caption(f"High-norm tokens: norm over {analysis.mechanism.norm_threshold:.3g} (twice the median patch norm "
               "after the last layer). Attribution and ablation are for each image's true class.")

st.subheader("Most confident mistakes")
if not analysis.mistakes:
    st.write("No mistakes.")
columns = st.columns(4)
for i, mistake in enumerate(analysis.mistakes[:SHOWN_MISTAKES]):
    with columns[i % 4]:
        try:
            st.image(mistake_image(mistake.path, analysed_folder), width=128)
        except ImageError as e:
            st.text(shown(str(e)))
        # File and class names come from the folder and the checkpoint: their control characters as escapes.
        st.text(f"{visible(Path(mistake.path).name)}\ntrue: {visible(mistake.label)}\n"
                f"predicted: {visible(mistake.predicted)} ({mistake.confidence:.0%})")
        # The explorer checks that the image lies inside the folder handed over with it.
        open_in_explorer.link(st, "Open in the explorer", {"explorer_checkpoint": checkpoint_path,
                                                            "explorer_image": mistake.path,
                                                            "explorer_image_folder": analysed_folder})
