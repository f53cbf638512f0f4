"""The Analyse page's faithfulness benchmarks: Chefer et al.'s segmentation and perturbation tests, ROAD and SaCo on
a folder of the data roots, as ``python -m vit.faithfulness --benchmark ...`` runs them
(``vit.explain.benchmarks.benchmark_run``:
the same batches, scores and report), here with progress and a Stop, or as that command's Ray job.
"""

import json
import os
import time
from functools import partial
from pathlib import Path

import streamlit as st

from app_pages.explorer_sections.long_work import long_work
from vit import api, faithfulness, registry
from vit.checkpoint import CheckpointError
from vit.core.progress import Progress
from vit.core.runfiles import default_runs_dir, parse_json, read_text_bounded
from vit.core.text import escape_markdown
from vit.explain.benchmarks import benchmark_run
from vit.explain.benchmarks import metrics as bench
from vit.predict import UsageError
from vit.runs import ray_analyze, ray_jobs
from vit.runs.launch import default_data_roots, folder_problem, resolve_dataset
from vit.sources.open import open_source

REQUEST_KEY, RESULT_KEY, FIGURE_KEY = "benchmark_request", "benchmark_result", "benchmark_figure"
BENCHMARK_HELP = {"segmentation": "Chefer et al.'s ImageNet-segmentation test: pixel accuracy, mIoU and mAP of each "
                                  "map against a mask per image (a PNG named by the image's stem)",
                  "perturbation": "Chefer et al.'s perturbation test: top-1 accuracy as 10 %-90 % of the pixels are "
                                  "made black, most relevant first (positive) and least relevant first (negative)",
                  "road": "ROAD: the class probability as the most or the least relevant pixels are imputed from "
                          "their neighbours",
                  "saco": "SaCo: do more salient pixel groups change the probability more?"}


def method_options() -> list[str]:
    """The methods offered: the benchmark's own, then every other map vit.methods() may draw (the registry's,
    the plugins' included; checked once the model opens)."""
    maps = [m.name for m in registry.methods() if m.group != "words"]
    return list(bench.METHODS) + [m for m in maps if m not in bench.METHODS]


def inside_roots(folder: str, what: str) -> Path:
    """``folder`` resolved, inside the data roots (the page's one rule for reading the server's folders)."""
    spec = resolve_dataset(f"folder:{folder.strip()}")
    problem = folder_problem(spec, default_data_roots())
    if problem:
        raise ValueError(problem.replace("folder datasets", what))
    return Path(spec[len("folder:"):])


def run_here(checkpoint, settings: benchmark_run.Settings, items: list, about: dict, progress: Progress) -> dict:
    """The benchmark on this server: its report (``vit.faithfulness --out``'s JSON) and the unreadable images."""
    batches = benchmark_run.score_items(checkpoint, settings, items, explain=api.explain, progress=progress)
    skipped = [line for batch in batches for line in batch.skipped]
    return {"result": benchmark_run.report(settings, batches, about), "skipped": skipped}


def run_on_ray(address: str, argv: list[str], total: int, progress: Progress) -> dict:
    """``python -m vit.faithfulness ... --ray``'s job into a folder of the runs folder (storage the nodes share),
    followed with ``progress`` (maps done, from its log); the page's Stop stops the job. Its report once done."""
    out = default_runs_dir() / ".benchmarks" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    progress(0, total)  # a Stop before the job is submitted submits nothing
    args = faithfulness.build_parser().parse_args([*argv, "--out", str(out), "--ray", address])
    faithfulness.check_args(args)
    jobs, sid = faithfulness.submit(args)
    status = ray_analyze.wait_for_job(jobs, sid, total, progress, desc=args.benchmark)
    if status == "FAILED":
        raise ValueError(ray_jobs.job_error(jobs, sid, "vit.faithfulness"))
    if status != "SUCCEEDED":
        raise ValueError(f"the Ray job {sid} was stopped on the cluster before it wrote its report")
    return {"result": parse_json(read_text_bounded(out / "faithfulness.json")), "skipped": []}


def benchmark_section(choice: str, ray_address: str | None, shown, max_images: int) -> None:
    """The form, the run and its report; ``shown(text)`` is a message as this visitor may see it."""
    benchmark = st.selectbox("Benchmark", benchmark_run.BENCHMARKS, key="bench_benchmark",
                             format_func=lambda b: f"{b}: {BENCHMARK_HELP[b]}")
    folder = st.text_input("Image folder", key="bench_folder", placeholder="data/cifar10/val",
                           help="Inside the data folders; perturbation: one subfolder per class, named as the "
                                "checkpoint names its classes (it scores top-1 accuracy).")
    masks = st.text_input("Masks folder", key="bench_masks", placeholder="data/masks",
                          help="A 0/non-0 PNG per image, named by the image's stem.") \
        if benchmark == "segmentation" else ""
    methods = st.multiselect("Methods", method_options(), default=bench.DEFAULT_METHODS, key="bench_methods",
                             help="The benchmark's own maps (batched), and any other map the explorer draws for "
                                  "the model (image by image).")
    limit = st.number_input(f"Images (0 = all of them, at most {max_images:,} here)", min_value=0, value=100,
                            step=50, key="bench_limit", help="A seeded random sample of the folder (seed 0, as the "
                                                             "command's --limit).")
    groups = st.number_input("SaCo's groups K", min_value=2, max_value=faithfulness.MAX_GROUPS,
                             value=bench.SACO_GROUPS, key="bench_groups") \
        if benchmark == "saco" else bench.SACO_GROUPS
    batch_size = st.number_input("Images per batch", min_value=1, max_value=256, value=16, key="bench_batch_size")
    on_ray = bool(ray_address) and st.checkbox(
        "Run on the Ray cluster", key="bench_on_ray",
        help="python -m vit.faithfulness --ray: Ray Data scores batches on actors on the cluster's nodes, each "
             "loading the model once; the model, the folders and the runs folder must be on storage every node "
             "mounts.")
    ready = folder.strip() and methods and (benchmark != "segmentation" or masks.strip())
    if st.button("Run the benchmark", type="primary", disabled=not ready):
        try:
            data = inside_roots(folder, "image folders")
            mask_folder = inside_roots(masks, "mask folders") if benchmark == "segmentation" else None
            checkpoint = open_source(choice)
            if not checkpoint.class_names:
                raise ValueError("this model has no classifier (a feature model): the benchmarks explain a class")
            drawn = api.methods(checkpoint)
            unknown = [m for m in methods if m not in bench.METHODS and m not in drawn]
            if unknown:
                raise ValueError(f"{', '.join(unknown)} does not apply to this model; leave it out")
            count = min(limit or max_images, max_images)
            # The command's own sample of the folder (its --limit and --seed 0), on the command's own arguments
            argv = [choice, "--benchmark", benchmark, "--data", str(data),
                    *(["--masks", str(mask_folder)] if mask_folder else [])]
            args = faithfulness.build_parser().parse_args([*argv, *(["--limit", str(count)] if count else [])])
            items, _ = faithfulness.benchmark_items(args, checkpoint, command=False)
            settings = benchmark_run.Settings(benchmark, tuple(methods), int(groups), int(batch_size))
            about = {"checkpoint": choice, "data": str(data), **({"masks": str(mask_folder)} if mask_folder else {})}
            if on_ray:
                argv += ["--methods", ",".join(methods), "--limit", str(len(items)), "--groups", str(int(groups)),
                         "--batch-size", str(int(batch_size))]
                compute = partial(run_on_ray, ray_address, argv, len(items) * len(methods))
            else:
                benchmark_run.check_batch(checkpoint, settings, len(items))  # what a batch holds, before the work
                compute = partial(run_here, checkpoint, settings, items, about)
            st.session_state[REQUEST_KEY] = ((choice, benchmark, str(data), str(mask_folder), tuple(methods),
                                              len(items), int(groups), int(batch_size), on_ray, time.time()), compute)
            st.session_state.pop(RESULT_KEY, None)  # the report shown is the one asked for last, or none
            st.session_state.pop(FIGURE_KEY, None)
        except (UsageError, CheckpointError, ValueError) as e:
            st.error(escape_markdown(shown(str(e))))

    if REQUEST_KEY in st.session_state:
        key, compute = st.session_state[REQUEST_KEY]
        try:
            label = f"{key[1]}: {key[5]:,} images x {len(key[4])} methods" + (" on the Ray cluster" if key[8] else "")
            done = long_work(key, label, compute, "benchmark", unit="maps", heavy=not key[8])
        except (UsageError, CheckpointError, ValueError, OSError) as e:
            st.session_state.pop(REQUEST_KEY)
            st.error(escape_markdown(shown(str(e))))
        else:
            if done is not None:
                st.session_state.pop(REQUEST_KEY)
                st.session_state[RESULT_KEY] = done

    done = st.session_state.get(RESULT_KEY)
    if done is not None:
        show_report(done["result"], done["skipped"], shown)


def show_report(result: dict, skipped: list[str], shown) -> None:
    """The scores per method as a table, the plot, and the report's JSON and Markdown to download."""
    import pandas as pd

    st.subheader(f"{result['benchmark']} on {result['images']:,} images")
    if skipped:
        st.warning(f"{len(skipped)} image(s) could not be read and were left out.")
        st.text("\n".join(shown(line) for line in skipped[:10]))
    columns = [k for k, v in next(iter(result["methods"].values())).items() if not isinstance(v, (list, dict))]
    table = pd.DataFrame([[scores[c] for c in columns] for scores in result["methods"].values()],
                         index=list(result["methods"]), columns=[benchmark_run.header(c) for c in columns])
    st.dataframe(table)  # cells as text, never Markdown
    st.caption(benchmark_run.legend(columns))
    if "model_accuracy" in result:
        st.caption(f"Top-1 accuracy of the intact images: {result['model_accuracy']:.4f}")
    if "maps_per_s_per_worker" in result:
        st.caption(f"{result['workers']} workers, {result['maps_per_s_per_worker']:.2f} maps/s per worker")
    st.image(report_plot(result), width="stretch", output_format="PNG")  # as st.pyplot shows a figure
    left, right = st.columns(2)
    report = benchmark_run.shared(result)  # the model and folders by name: no path of the server in a download
    left.download_button("The report (JSON)", json.dumps(report, indent=2) + "\n", "faithfulness.json",
                         "application/json", key="bench_download_json")
    right.download_button("The table (Markdown)", benchmark_run.markdown(report), "faithfulness.md",
                          "text/markdown", key="bench_download_md")


def report_plot(result: dict) -> bytes:
    """``benchmark_run.figure(result)`` as the PNG ``st.pyplot`` would show (its savefig options), drawn once per
    report and kept with it: a rerun that changes nothing (a download, a widget elsewhere) draws no plot again."""
    kept = st.session_state.get(FIGURE_KEY)
    if kept is None or kept[0] is not result:  # the report itself, not its id (a new report may reuse a freed id)
        import io

        import matplotlib.pyplot as plt

        figure = benchmark_run.figure(result)
        png = io.BytesIO()
        figure.savefig(png, bbox_inches="tight", dpi=200, format="png")
        plt.close(figure)
        kept = st.session_state[FIGURE_KEY] = (result, png.getvalue())
    return kept[1]
