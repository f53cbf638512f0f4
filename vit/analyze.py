"""Attention over a whole dataset: ``python -m vit.analyze CHECKPOINT --data DIR [--limit N] [--out DIR]``.

For every image of ``DIR`` (one subfolder per class, as for ``vit.evaluate``; ``--limit N``
takes N images after a seeded shuffle): the mean attention distance and entropy of every
head by layer (the ViT paper's Fig. 7), averaged over the images; per true class, the mean
CLS attention of the last layer (heads averaged) and the mean CLS rollout map; the confusion
matrix; and the most confident mistakes. ``--mechanism`` adds, per true class, the mean direct logit
attribution of every head, the logit change when each head alone is zeroed (averaged over images), the
high-norm token rate per layer and position (``--norm-threshold``), massive activations per layer and attention
sinks per head (``vit.explain.mechanism.components``). ``--pca`` adds each image's PCA colours as a PNG and an .npz
under ``pca/`` and a grid of the pictures, a few per class, to the report (``--pca-layer``, ``--pca-joint``:
``vit.explain.views.dataset_pca``). Writes ``analysis.json``, PNG plots and one self-contained ``report.html`` into
``--out`` (default ``analysis/<checkpoint name>``) and prints the JSON's path. A progress bar is drawn on stderr.

With ``--ray ADDRESS`` (a Ray dashboard, http://HEAD:8265) the analysis is submitted to a Ray cluster as
a job and its log followed until it ends; Ctrl-C stops it. Inside the cluster Ray Data maps batches of
``--batch-size`` images through ``--workers`` actors that each load the model once (a GPU each when the
cluster has GPUs) and return per-image summaries; the job writes the same files as a local run. The
checkpoint, ``--data`` and ``--out`` must be on storage every node mounts (``vit.runs.ray_analyze``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROG = "vit.analyze"



def build_parser() -> argparse.ArgumentParser:
    from vit.core.cli import OneLineParser, command_name, positive_int

    summary, details = __doc__.split("\n\n", 1)
    p = OneLineParser(prog=command_name(PROG), description=summary, epilog=details,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a .pt checkpoint written by vit.train, any model vit.convert opens,"
                                      " or a Hub id: ORG/NAME[@REV], hf-hub:ORG/NAME, a timm name")
    p.add_argument("--data", required=True, metavar="DIR", help="a folder with one subfolder of images per class")
    p.add_argument("--limit", type=positive_int, default=None, metavar="N", help="analyse N images (seeded shuffle)")
    p.add_argument("--out", default=None, metavar="DIR", help="output folder (default analysis/<checkpoint name>)")
    p.add_argument("--top-mistakes", type=positive_int, default=20, help="how many mistakes to list (default 20)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="images per forward pass (default 64)")
    p.add_argument("--seed", type=int, default=0, help="for the --limit shuffle (default 0)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="where the model runs")
    p.add_argument("--mechanism", action="store_true",
                   help="also head attribution, ablation, high-norm tokens, massive activations and sinks (slower)")
    p.add_argument("--norm-threshold", type=float, default=None, metavar="T",
                   help="with --mechanism: a token norm over T is high (default: twice the median patch norm)")
    p.add_argument("--pca", action="store_true", help="also each image's PCA colours (the explorer's 'What the "
                   "patches represent') as pca/<class>/<file name>.png and .npz in the output folder")
    p.add_argument("--pca-layer", type=positive_int, default=None, metavar="L",
                   help="with --pca: the tokens after block L, counted from 1 (default: the last)")
    p.add_argument("--pca-joint", action="store_true", help="with --pca: one PCA fitted on every image's tokens "
                   "together, so a colour means the same across them (a second forward per image)")
    p.add_argument("--ray", metavar="ADDRESS", help="run on a Ray cluster: submit the analysis as a job to its "
                   "dashboard address (http://HEAD:8265) and follow it")
    p.add_argument("--workers", type=positive_int, default=None, metavar="N", help="with --ray: N actors, each "
                   "loading the model once (default: one per GPU of the cluster, else one per CPU)")
    p.add_argument("--ray-job", action="store_true", help=argparse.SUPPRESS)  # this command inside the Ray job
    return p



def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from vit.evaluate import labelled_files
    from vit.explain.views.dataset import check_forward_fits, sample_files, summarize_files, write_outputs
    from vit.predict import UsageError, open_checkpoint, resolve_device

    if (args.pca_layer is not None or args.pca_joint) and not args.pca:
        raise UsageError("--pca-layer and --pca-joint go with --pca")
    if args.pca and (args.ray or args.ray_job):
        raise UsageError("--pca runs locally only: leave out --ray, or run vit.analyze --pca where DIR is mounted")
    if args.ray:
        return submit_and_follow(args)
    if args.workers is not None and not args.ray_job:
        raise UsageError("--workers needs --ray ADDRESS: locally the analysis runs in this process")
    # In the cluster's job this process only lists files and aggregates: the actors run the model.
    checkpoint = open_checkpoint(args.checkpoint, torch.device("cpu") if args.ray_job else resolve_device(args.device),
                                 port_only="vit-analyze reads every layer's attention and hidden states of our own ViT")
    try:
        check_forward_fits(checkpoint)  # before the first image: the cost model's answer (TooManyTokens)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.mechanism and checkpoint.model.config.stage_depths:  # before the first image, not after the pass
        raise UsageError("--mechanism stacks every layer's hidden states on one grid of one width, and this model's "
                         "stages (Swin, Hiera) change both: leave out --mechanism (the other summaries are each "
                         "layer's on its own grid)")
    if args.mechanism:
        from vit.explain.mechanism.components import check_supported

        try:
            check_supported(checkpoint.model, needs_head=True)  # before the first image, not after the pass
        except ValueError as e:  # MechanismError: a model option the analyses do not support
            raise UsageError(f"--mechanism: {e}") from None
    if args.pca:
        from vit.explain.views.dataset_pca import check_pca

        try:
            check_pca(checkpoint, args.pca_layer)  # before the first image, not after the pass
        except ValueError as e:  # TooManyTokens too
            raise UsageError(str(e)) from None
    files = sample_files(labelled_files(Path(args.data), checkpoint.class_names), args.limit, args.seed)
    bar = tqdm(total=len(files), unit="img", desc="analysing", file=sys.stderr, dynamic_ncols=True)
    try:
        if args.ray_job:
            from vit.runs.ray_analyze import analyze_on_cluster

            analysis = analyze_on_cluster(args.checkpoint, checkpoint, files, args.batch_size, args.top_mistakes,
                                          args.mechanism, args.norm_threshold, args.workers, args.device,
                                          progress=lambda done, total: bar.update(done - bar.n))
        else:
            analysis = summarize_files(checkpoint, files, args.batch_size, args.top_mistakes,  # asked above
                                       progress=lambda done, total: bar.update(1))
    except ValueError as e:
        raise UsageError(str(e)) from None
    finally:
        bar.close()
    if args.mechanism and not args.ray_job:
        from vit.explain.views.dataset import analyze_mechanism

        bar = tqdm(total=len(files), unit="img", desc="mechanism", file=sys.stderr, dynamic_ncols=True)
        try:
            analysis.mechanism = analyze_mechanism(checkpoint, files, args.norm_threshold,
                                                   progress=lambda done, total: bar.update(1))
        finally:
            bar.close()
    for error in analysis.skipped:
        print(f"{PROG}: skipped: {error}", file=sys.stderr)
    out = Path(args.out) if args.out else default_out(args.checkpoint)
    extra, sections = {"checkpoint": str(args.checkpoint), "data": str(args.data)}, []
    if args.pca:
        from vit.explain.views.dataset_pca import report_section, write_pca

        bar = tqdm(total=len(files) * (2 if args.pca_joint else 1), unit="img", desc="pca", file=sys.stderr,
                   dynamic_ncols=True)
        try:
            extra["pca"] = write_pca(checkpoint, files, Path(args.data), out, args.pca_layer, args.pca_joint,
                                     progress=lambda done, total: bar.update(1))
        except ValueError as e:
            raise UsageError(str(e)) from None
        finally:
            bar.close()
        sections.append(report_section(files, checkpoint.class_names, Path(args.data), out, extra["pca"]))
    written = write_outputs(analysis, out, extra, sections)
    print(json.dumps({"count": analysis.count, "accuracy": analysis.accuracy, "out": str(out),
                      "files": [p.name for p in written] + ([f"{extra['pca']['folder']}/"] if args.pca else [])},
                     indent=2))
    if analysis.skipped:  # last, so that it is the line the client of a Ray job shows
        print(f"{PROG}: {len(analysis.skipped)} of {len(files)} images could not be read (named above); the "
              f"analysis in {out} covers the other {analysis.count}", file=sys.stderr)
        return 1
    return 0


def default_out(checkpoint: str) -> Path:
    """Where the files go without ``--out``."""
    return Path("analysis") / Path(checkpoint).stem


def submit_and_follow(args: argparse.Namespace) -> int:
    """``--ray ADDRESS``: this command with absolute paths, run as a Ray job; its log followed until it ends."""
    from vit.runs import ray_jobs

    jobs, sid = submit(args)
    print(f"{PROG}: submitted job {sid} to {args.ray}; Ctrl-C stops it", flush=True)
    return ray_jobs.follow_to_the_end(jobs, sid, PROG, "the analysis ends without writing its report")


def submit(args: argparse.Namespace) -> tuple[object, str]:
    """Submit ``args`` (with ``--ray ADDRESS``) as a Ray job that runs this command with ``--ray-job``: (the job
    client, the submission id). UsageError in one line for a missing path or a cluster that refuses it."""
    import shlex

    from vit.predict import UsageError
    from vit.runs import ray_analyze, ray_jobs

    if args.ray_job:
        raise UsageError("--ray and --ray-job exclude each other")
    # The job runs in a copy of the code elsewhere: every path absolute, checked here before submitting.
    from vit.sources.hub import looks_like_name

    checkpoint, data = Path(args.checkpoint).expanduser().resolve(), Path(args.data).expanduser().resolve()
    out = Path(args.out or default_out(args.checkpoint)).expanduser().resolve()
    if looks_like_name(args.checkpoint):
        checkpoint = args.checkpoint  # a Hub id: the job fetches it into the cluster's HF cache
    elif not checkpoint.exists():
        raise UsageError(f"{args.checkpoint} does not exist")
    if not data.is_dir():
        raise UsageError(f"--data {args.data} is not a folder; give a folder with one subfolder per class")
    job = argparse.Namespace(**{**vars(args), "checkpoint": str(checkpoint), "data": str(data), "out": str(out),
                                "ray": None, "ray_job": True})
    sid = ray_analyze.job_id(out)
    entrypoint = shlex.join(["python", "-m", PROG, *command_line(build_parser(), job)])
    try:
        jobs = ray_jobs.submit_job(args.ray, entrypoint, sid, {"vit_analysis": str(out)}, what="analysis")
    except ray_jobs.RayRunError as e:
        raise UsageError(str(e)) from None
    return jobs, sid


def command_line(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The arguments that ``parser`` reads back as ``args`` (every option it has, but the ones left at None)."""
    argv: list[str] = []
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if value is None or value is False:  # also --help, which has no value
            continue
        if not action.option_strings:
            argv.append(str(value))
        elif value is True and action.nargs == 0:
            argv.append(action.option_strings[-1])
        else:
            argv += [action.option_strings[-1], str(value)]
    return argv


def check_paths(args: argparse.Namespace) -> None:
    """Before torch loads: the model exists (or is a Hub id) and ``--data`` is a folder (here: a Ray job's paths
    are the ones every node mounts)."""
    from vit.core.cli import check_folder
    from vit.predict import check_model_path

    check_model_path(args.checkpoint)
    check_folder(args.data, "--data", "a folder with one subfolder per class")


def main(argv: list[str] | None = None) -> int:
    from vit.predict import run_cli

    return run_cli(PROG, build_parser(), run, argv, check_paths)


def command() -> None:
    """The console command (pyproject.toml) and ``python -m``: ``main()``'s status, with a fast, quiet exit."""
    from vit.core.cli import run_command

    run_command(main)


if __name__ == "__main__":
    command()
