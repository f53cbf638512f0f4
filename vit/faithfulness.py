"""Is a map faithful? Deletion, insertion and Chefer et al.'s tests; what each measures:
``vit.explain.benchmarks.metrics``.

``DIR`` holds one subfolder per class as for ``vit.evaluate``. ``--limit N`` takes N images
after a seeded shuffle, so a limit samples every class. Prints JSON: per method,
``deletion_auc`` and ``insertion_auc`` as ``{"mean", "std"}`` over the images, with a
progress bar on stderr.

``--benchmark segmentation --masks MASKS``: ``DIR`` a folder of images, ``MASKS`` a 0/non-0 PNG for each, of the same
file stem; or ``--data gtsegs_ijcv.mat`` alone, the paper's file of images and masks (MATLAB v7.3, read as their
``Imagenet_Segmentation``). ``--benchmark perturbation``: ``DIR`` as for deletion. ``--benchmark road`` and
``--benchmark saco`` (``--groups K``): ``DIR`` any folder of images. All print ``images_per_s`` per method, a table on
stderr, and with ``--out DIR`` write ``DIR/faithfulness.json``, ``DIR/faithfulness.md`` and ``DIR/faithfulness.png``.
Besides their own methods (``METHOD_NAMES``) they score any map ``vit.methods()`` draws for the model (the CAMs,
``lrp``, ...), image by image. Chefer et al.'s baselines are methods too: ``attn-gradcam`` (GradCAM on the last
attention), ``lrp-partial`` (the last attention's LRP relevance) and ``lrp-full`` (LRP to the pixels; read as pixels
by the segmentation and perturbation tests, as their full_lrp).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from vit.core.cli import UsageError
from vit.costs.bounds import MAX_TOKENS

PROG = "vit.faithfulness"
# vit.explain.benchmarks.metrics's METHODS and REPLACEMENTS by name, for --help without torch
# (tests/test_faithfulness.py
# checks they are the same), so that an unknown method is refused before torch loads.
METHOD_NAMES = ("random", "attention", "rollout", "class", "legrad", "transformer_attribution", "attnlrp", "flow",
                "attn-gradcam", "lrp-full", "lrp-partial")
REPLACEMENTS = ("blur", "mean", "zero")
BENCHMARKS = ("deletion", "segmentation", "perturbation", "road", "saco")
# vit.explain.benchmarks.benchmark_run.REPORT_FILES (what --out receives), for checking --out before torch loads
REPORT_FILES = ("faithfulness.png", "faithfulness.md", "faithfulness.json")
# A fixed number of curve points whatever the patch grid: Chefer et al. (2021)'s perturbation tests remove the
# patches in 10 % steps; 5 % steps here draw the curve twice as finely at a cost that does not grow with the grid.
DEFAULT_STEPS = 20
# Past one step per patch a curve has no new point; no input has more patches than the token gate lets through.
MAX_STEPS = MAX_TOKENS
# SaCo's K: each group is one more forward of every image (the paper's K is 10); 100 keeps a batch's SaCo under a
# minute and a half of ViT-B/16 on a CPU between two checks of a page's Stop.
MAX_GROUPS = 100
# Why a model opened as its library builds it is refused (vit.predict.open_checkpoint's one line)
PORT_ONLY = "vit-faithfulness computes its maps and perturbation curves on our own ViT's forward (its hook points)"



def registry_maps() -> list[str]:
    """Every map of an image that ``vit.explain`` draws (``vit.registry``'s, the plugins' included), no torch
    loaded."""
    from vit import registry

    return [m.name for m in registry.methods() if m.group != "words"]


def build_parser() -> argparse.ArgumentParser:
    from vit.core.cli import OneLineParser, command_name, int_between, positive_int

    summary, details = __doc__.split("\n\n", 1)
    p = OneLineParser(prog=command_name(PROG), description=summary, epilog=details,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a .pt checkpoint written by vit.train, any model vit.convert opens,"
                                      " or a Hub id: ORG/NAME[@REV], hf-hub:ORG/NAME, a timm name")
    p.add_argument("--data", required=True, metavar="DIR",
                   help="a folder with one subfolder of images per class (segmentation, road, saco: a folder of "
                        "images; segmentation: or gtsegs_ijcv.mat)")
    p.add_argument("--benchmark", choices=BENCHMARKS, default="deletion",
                   help="deletion and insertion curves (default), Chefer et al.'s segmentation or perturbation test, "
                        "ROAD or SaCo")
    p.add_argument("--masks", metavar="DIR", help="segmentation: a 0/non-0 PNG per image, named by the image's stem")
    p.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                   help=f"maps to score, spaces or commas between (default: all but flow); any of: "
                        f"{', '.join(METHOD_NAMES)}, and (but for deletion) any map vit.methods() draws for the model: "
                        f"{', '.join(m for m in registry_maps() if m not in METHOD_NAMES)}")
    p.add_argument("--option", nargs="+", default=None, metavar="NAME=VALUE",
                   help="a parameter of captum's attributions and RISE (segmentation, perturbation, road, saco), "
                        "captum's names: n_steps, baselines, nt_samples, stdevs, sliding_window_shapes, strides, "
                        "n_samples; RISE's n_masks, s, p1; seed, batch; spaces or commas between; each given to the "
                        "methods that take it")
    p.add_argument("--out", metavar="DIR",
                   help="also write DIR/faithfulness.json, .md (a table) and, for Chefer's tests, .png (a plot)")
    p.add_argument("--limit", type=positive_int, default=None, metavar="N", help="score N images (seeded shuffle)")
    p.add_argument("--replacement", choices=REPLACEMENTS, default="blur", help="what removed patches become")
    p.add_argument("--steps", type=int_between(1, MAX_STEPS), default=DEFAULT_STEPS,
                   help=f"steps per curve, each changing an equal share of the patches (default {DEFAULT_STEPS}: "
                        "5 %% each, whatever the grid; one per patch made ViT-S/16 take 196 steps x 14 curves per "
                        f"image; at most {MAX_STEPS:,})")
    p.add_argument("--groups", type=int_between(2, MAX_GROUPS), default=10, metavar="K",
                   help=f"saco: groups of pixels (default 10, the paper's; 2 to {MAX_GROUPS})")
    p.add_argument("--batch-size", type=positive_int, default=16, help="images per step (default 16)")
    p.add_argument("--seed", type=int, default=0, help="for the shuffle and the random baseline (default 0)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="where the model runs")
    p.add_argument("--ray", metavar="ADDRESS", help="segmentation, perturbation, road, saco: run on a Ray cluster, "
                   "submitted as a job to its dashboard address (http://HEAD:8265) and followed; needs --out")
    p.add_argument("--workers", type=positive_int, default=None, metavar="N", help="with --ray: N actors, each "
                   "loading the model once (default: one per GPU of the cluster, else one per CPU)")
    p.add_argument("--ray-job", action="store_true", help=argparse.SUPPRESS)  # this command inside the Ray job
    return p



def _summary(values: list[float]) -> dict:
    import numpy as np

    array = np.asarray(values, dtype=np.float64)
    return {"mean": float(array.mean()), "std": float(array.std())}



def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from vit.core.images import ImageError, open_image
    from vit.core.inference import preprocess
    from vit.evaluate import labelled_files
    from vit.explain.benchmarks.metrics import DEFAULT_METHODS, auc, method_maps, perturbation_curves
    from vit.explain.views.dataset import sample_files
    from vit.predict import UsageError, open_checkpoint, resolve_device

    if args.ray:
        return submit_and_follow(args)
    if args.benchmark != "deletion":
        return run_benchmark(args)
    if args.methods is None:
        args.methods = list(DEFAULT_METHODS)
    checkpoint = open_checkpoint(args.checkpoint, resolve_device(args.device), port_only=PORT_ONLY)
    model = checkpoint.model.eval()
    device = next(model.parameters()).device
    files = sample_files(labelled_files(Path(args.data), checkpoint.class_names), args.limit, args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    scores = {m: {"deletion": [], "insertion": []} for m in args.methods}
    skipped = 0
    # Progress per image and method (a batch of 16 ViT-B images can take minutes per method).
    bar = tqdm(total=len(files) * len(args.methods), unit="map", desc="faithfulness", file=sys.stderr,
               dynamic_ncols=True)
    for start in range(0, len(files), args.batch_size):
        chunk, images = files[start:start + args.batch_size], []
        for path, _ in chunk:
            try:
                images.append(open_image(path))
            except ImageError as e:
                print(f"{PROG}: skipped: {e}", file=sys.stderr)
                skipped += 1
        if images:
            x = preprocess(images, checkpoint.preprocessing).to(device)
            with torch.no_grad():
                predicted = model(x)[0].argmax(dim=-1)
            for method in args.methods:
                maps = method_maps(model, x, method, predicted, generator)
                fractions, deletion, insertion = perturbation_curves(model, x, maps, predicted, args.replacement,
                                                                     args.steps)
                scores[method]["deletion"] += auc(fractions, deletion).tolist()
                scores[method]["insertion"] += auc(fractions, insertion).tolist()
                bar.update(len(images))
        bar.update((len(chunk) - len(images)) * len(args.methods))  # skipped images
    bar.close()
    count = len(files) - skipped
    if count == 0:
        raise UsageError(f"none of the {len(files)} images in {args.data} could be read")
    result = {"checkpoint": str(args.checkpoint), "data": str(args.data), "images": count,
              "replacement": args.replacement, "explained_class": "predicted",
              "methods": {m: {"deletion_auc": _summary(s["deletion"]), "insertion_auc": _summary(s["insertion"])}
                          for m, s in scores.items()}}
    print(json.dumps(result, indent=2))
    write_out(args.out, result, table(result))
    return 1 if skipped else 0


def matched_masks(data: Path, masks: Path) -> list[tuple[Path, Path]]:
    """``(image, mask)`` for every image under ``data``, its mask the PNG of its stem under ``masks``; UsageError
    in one line when a stem repeats or an image has no mask."""
    from vit.explain.benchmarks.benchmark_run import BenchmarkError
    from vit.explain.benchmarks.benchmark_run import matched_masks as matched
    from vit.training.specs import image_files

    try:
        return matched(image_files(data), masks, data)
    except BenchmarkError as e:
        raise UsageError(str(e)) from None


def open_mask(mask, hw: tuple[int, int]):
    """``vit.explain.benchmarks.benchmark_run.open_mask``; UsageError in one line for a mask it cannot read."""
    from vit.explain.benchmarks.benchmark_run import BenchmarkError
    from vit.explain.benchmarks.benchmark_run import open_mask as opened

    try:
        return opened(mask, hw)
    except BenchmarkError as e:
        raise UsageError(str(e)) from None


def check_methods(methods: list[str], checkpoint) -> None:
    """After the model loads: each method is the benchmark's own (``METHOD_NAMES``) or a map ``vit.methods()`` draws
    for this model; UsageError in one line otherwise."""
    others = [m for m in methods if m not in METHOD_NAMES]
    if not others:
        return
    from vit.api import methods as drawn

    available = [m for m in drawn(checkpoint) if m not in METHOD_NAMES]
    unknown = [m for m in others if m not in available]
    if unknown:
        raise UsageError(f"unknown method(s) {', '.join(unknown)} for this model; choose from: "
                         f"{', '.join([*METHOD_NAMES, *available])}")


def benchmark_items(args: argparse.Namespace, checkpoint, command: bool = True) -> tuple[list[tuple], object]:
    """``(items, gtsegs)``: the seeded sample of ``(source, target)`` the benchmark scores (``--data``, ``--masks``,
    ``--limit``, ``--seed``) and, for ``--data gtsegs_ijcv.mat``, the open file the sources index (else None).
    ``command`` False for a caller with no ``--data`` option that reads files only (the Analyse page): ``--data`` is
    then a folder even for segmentation, and the messages written here name no option."""
    from vit.evaluate import labelled_files
    from vit.explain.views.dataset import sample_files
    from vit.training.specs import image_files

    if command and args.benchmark == "segmentation" and Path(args.data).is_file():  # gtsegs_ijcv.mat: both in one
        from vit.explain.benchmarks.gtsegs import GtSegs, GtSegsError

        try:
            gtsegs = GtSegs(args.data)
        except GtSegsError as e:
            raise UsageError(str(e)) from None
        try:
            gtsegs.check()  # every declared size before the work
        except GtSegsError as e:
            gtsegs.close()
            raise UsageError(str(e)) from None
        return sample_files([(i, None) for i in range(len(gtsegs))], args.limit, args.seed), gtsegs
    if args.benchmark == "segmentation":
        return sample_files(matched_masks(Path(args.data), Path(args.masks)), args.limit, args.seed), None
    if args.benchmark == "perturbation":
        return sample_files(labelled_files(Path(args.data), checkpoint.class_names), args.limit, args.seed), None
    files = [(path, None) for path in image_files(Path(args.data))]  # ROAD and SaCo explain the predicted class
    if not files:
        raise UsageError(f"no images in {args.data}; give a folder of images" + (" (--data)" if command else ""))
    return sample_files(files, args.limit, args.seed), None


def explain_any(checkpoint, image, method: str, target: int | None = None, options: dict | None = None,
                patch_sums: bool = False):
    """``vit.api.explain``: every map ``vit.methods()`` draws, for the benchmark's methods beyond its own; of
    ``options`` (``--option``: name -> value), those ``method`` takes; ``patch_sums`` as there (a pixel method's map
    summed over each patch, which ``benchmark_run.method_maps`` asks for)."""
    from vit import api
    from vit.explain.methods.captum_maps import OPTIONS

    taken = {k: v for k, v in (options or {}).items() if k in OPTIONS.get(method, ())}
    return api.explain(checkpoint, image, method, target=target, patch_sums=patch_sums, **taken)


def method_options(args: argparse.Namespace, methods: list[str]) -> dict[str, str]:
    """``--option NAME=VALUE``s as a dict, each taken by one of ``methods`` at least and within its bounds
    (``captum_maps.Options.of``); UsageError in one line otherwise."""
    from vit.explain.methods.captum_maps import OPTIONS, Options

    options = {}
    for given in (part for option in args.option or () for part in option.split(",") if part):
        name, equals, value = given.partition("=")
        if not equals or not name:
            raise UsageError(f"--option {given}: write NAME=VALUE, e.g. --option n_steps=20")
        options[name] = value
    for name in options:
        if not any(name in OPTIONS.get(m, ()) for m in methods):
            raise UsageError(f"--option {name}: none of the methods scored takes it (captum's attributions and RISE "
                             f"do: {', '.join(m for m, takes in OPTIONS.items() if name in takes) or 'none'})")
    for method in methods:
        try:
            Options.of(method, {k: v for k, v in options.items() if k in OPTIONS.get(method, ())})
        except ValueError as e:
            raise UsageError(str(e)) from None
    return options


def run_benchmark(args: argparse.Namespace) -> int:
    """``--benchmark segmentation``, ``perturbation``, ``road`` or ``saco`` (the module docstring)."""
    import torch
    from PIL import Image
    from tqdm import tqdm

    from vit.explain.benchmarks import benchmark_run as run_
    from vit.explain.benchmarks import metrics as bench
    from vit.predict import open_checkpoint, resolve_device

    # In the cluster's job this process only lists the items and joins the scores: the actors run the model.
    checkpoint = open_checkpoint(args.checkpoint, torch.device("cpu") if args.ray_job else resolve_device(args.device),
                                 port_only=PORT_ONLY)
    settings = run_.Settings(args.benchmark, tuple(args.methods or bench.DEFAULT_METHODS), args.groups,
                             args.batch_size, args.seed)
    check_methods(list(settings.methods), checkpoint)
    explain = functools.partial(explain_any, options=method_options(args, list(settings.methods)))
    items, gtsegs = benchmark_items(args, checkpoint)
    try:
        run_.check_batch(checkpoint, settings, len(items))  # before the work: what a batch holds
    except ValueError as e:
        if gtsegs is not None:
            gtsegs.close()
        raise UsageError(str(e)) from None
    read = run_.read_file
    if gtsegs is not None:
        from vit.explain.benchmarks.gtsegs import GtSegsError

        def read(item: tuple):  # the image and its mask, from the file
            try:
                image, mask = gtsegs.item(item[0])
            except GtSegsError as e:
                raise UsageError(str(e)) from None
            return image, Image.fromarray(mask)

    bar = tqdm(total=len(items) * len(settings.methods), unit="map", desc=args.benchmark, file=sys.stderr,
               dynamic_ncols=True)
    try:
        if args.ray_job:
            from vit.runs.ray_faithfulness import score_on_cluster

            batches, workers = score_on_cluster(args.checkpoint, settings, items, args.workers, args.device,
                                                str(args.data) if gtsegs is not None else None, explain,
                                                progress=lambda done, total: bar.update(done - bar.n))
        else:
            batches, workers = run_.score_items(checkpoint, settings, items, read, explain,
                                                progress=lambda done, total: bar.update(done - bar.n)), None
    except run_.BenchmarkError as e:
        raise UsageError(str(e)) from None
    finally:
        bar.close()
        if gtsegs is not None:
            gtsegs.close()
    skipped = [line for batch in batches for line in batch.skipped]
    for line in skipped:
        print(f"{PROG}: skipped: {line}", file=sys.stderr)
    about = {"checkpoint": str(args.checkpoint), "data": str(args.data)}
    if args.benchmark == "segmentation":
        about["masks"] = str(args.masks)
    try:
        result = run_.report(settings, batches, about, workers)
    except run_.BenchmarkError:
        raise UsageError(f"none of the {len(items)} images in {args.data} could be read") from None
    print(json.dumps(result, indent=2))
    text = run_.table(result)
    print(text, file=sys.stderr)
    run_.write_out(args.out, result, text)
    return 1 if skipped else 0


def table(result: dict) -> str:
    """A Markdown table of ``result``'s scalar scores per method (``vit.explain.benchmarks.benchmark_run.table``)."""
    from vit.explain.benchmarks.benchmark_run import table as markdown_table

    return markdown_table(result)


def write_out(out: str | None, result: dict, text: str) -> None:
    """``--out DIR``: the JSON, the Markdown table and (but for deletion) the plot."""
    from vit.explain.benchmarks.benchmark_run import write_out as written

    written(out, result, text)


def submit_and_follow(args: argparse.Namespace) -> int:
    """``--ray ADDRESS``: this command with absolute paths, run as a Ray job; its log followed until it ends."""
    from vit.runs import ray_jobs

    jobs, sid = submit(args)
    print(f"{PROG}: submitted job {sid} to {args.ray}; Ctrl-C stops it", flush=True)
    return ray_jobs.follow_to_the_end(jobs, sid, PROG, "the benchmark ends without writing its report")


def submit(args: argparse.Namespace) -> tuple[object, str]:
    """Submit ``args`` (with ``--ray ADDRESS``) as a Ray job that runs this command with ``--ray-job``: (the job
    client, the submission id). UsageError in one line for a cluster that refuses it."""
    import shlex

    from vit.analyze import command_line
    from vit.runs import ray_analyze, ray_jobs
    from vit.sources.hub import looks_like_name

    # The job runs in a copy of the code elsewhere: every path absolute (check_args has checked they exist).
    absolute = {key: str(Path(getattr(args, key)).expanduser().resolve()) for key in ("data", "masks", "out")
                if getattr(args, key) is not None}
    if not looks_like_name(args.checkpoint):  # a Hub id: the job fetches it into the cluster's HF cache
        absolute["checkpoint"] = str(Path(args.checkpoint).expanduser().resolve())
    job = argparse.Namespace(**{**vars(args), **absolute, "ray": None, "ray_job": True,
                                "methods": ",".join(args.methods) if args.methods else None,
                                "option": ",".join(args.option) if args.option else None})
    out = Path(absolute["out"])
    sid = ray_analyze.job_id(out).replace("analyze-", "faithfulness-", 1)
    entrypoint = shlex.join(["python", "-m", PROG, *command_line(build_parser(), job)])
    try:
        jobs = ray_jobs.submit_job(args.ray, entrypoint, sid, {"vit_faithfulness": str(out)}, what="benchmark")
    except ray_jobs.RayRunError as e:
        raise UsageError(str(e)) from None
    return jobs, sid


def check_args(args: argparse.Namespace) -> None:
    """Before torch loads: the methods are known, the model exists (or is a Hub id), ``--data`` is a folder and
    ``--out`` a folder the report can be written to."""
    from vit.core.cli import UsageError, check_folder, check_out_folder
    from vit.predict import check_model_path

    if args.methods is not None:  # --methods a,b and --methods a b alike
        args.methods = list(dict.fromkeys(m for part in args.methods for m in part.split(",") if m))  # each once
    unknown = [m for m in args.methods or () if m not in METHOD_NAMES]
    if unknown and args.benchmark == "deletion":  # the others also take vit.methods()' maps, checked once it loads
        raise UsageError(f"unknown method(s) {', '.join(unknown)}; choose from: {', '.join(METHOD_NAMES)} (the maps "
                         "of vit.methods() are scored by --benchmark segmentation, perturbation, road and saco)")
    maps = registry_maps()
    nowhere = [m for m in unknown if m not in maps]  # no model draws it: refused before the model loads
    if nowhere:
        raise UsageError(f"unknown method(s) {', '.join(nowhere)}; choose from: "
                         f"{', '.join(dict.fromkeys((*METHOD_NAMES, *maps)))}")
    if args.benchmark == "segmentation" and args.masks is None and not Path(args.data).is_file():
        raise UsageError("--benchmark segmentation needs --masks DIR: a PNG per image, named by the image's stem (or "
                         "--data gtsegs_ijcv.mat alone)")
    if args.option and args.benchmark == "deletion":
        raise UsageError("--option is for the maps of vit.methods() (captum's attributions, RISE), scored by "
                         "--benchmark segmentation, perturbation, road and saco")
    if (args.ray or args.ray_job) and args.benchmark == "deletion":
        raise UsageError("--ray runs --benchmark segmentation, perturbation, road or saco; deletion runs here only")
    if args.ray and args.ray_job:
        raise UsageError("--ray and --ray-job exclude each other")
    if args.ray and args.out is None:
        raise UsageError("--ray needs --out DIR, on storage every node of the cluster mounts: the job writes the "
                         "report there")
    if args.workers is not None and not (args.ray or args.ray_job):
        raise UsageError("--workers needs --ray ADDRESS: locally the benchmark runs in this process")
    if args.benchmark != "segmentation" and args.masks is not None:
        raise UsageError(f"--masks is for --benchmark segmentation, not {args.benchmark}")
    check_model_path(args.checkpoint)
    if args.benchmark == "segmentation" and Path(args.data).is_file():
        if args.masks is not None:
            raise UsageError(f"--data {args.data} is a file (gtsegs_ijcv.mat holds the masks too): leave --masks out")
    else:
        check_folder(args.data, "--data", "a folder of images" if args.benchmark != "perturbation"
                     else "a folder with one subfolder per class")
    check_folder(args.masks, "--masks", "a folder with a PNG mask per image")
    check_out_folder(args.out, "--out", REPORT_FILES, "a writable folder for the report's files")


def main(argv: list[str] | None = None) -> int:
    from vit.predict import run_cli

    return run_cli(PROG, build_parser(), run, argv, check_args)


def command() -> None:
    """The console command (pyproject.toml) and ``python -m``: ``main()``'s status, with a fast, quiet exit."""
    from vit.core.cli import run_command

    run_command(main)


if __name__ == "__main__":
    command()
