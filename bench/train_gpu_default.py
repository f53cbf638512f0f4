"""Train the GPU default inside a wall-clock budget on one GPU: decode, profile (optionally), run, collect.

    python bench/train_gpu_default.py --data data/cifar10/train --out OUT --deadline 570 --margin 15

(the whole lease in one command: ``bench/results/h100-2026-11-26b/README.md`` gives the call) [--profile 256,1024]

A lent GPU machine gives minutes, not hours, so the run is given what is left of them as ``vit.train
--time-budget``: the run itself plans its epochs at the end of its second one, from the time that epoch took on
this very machine, and its cosine ends at the last (no probe run spends the minutes first):

1. decode the image folder into ``vit.train``'s uint8 cache (once; before the run's launch);
2. with ``--profile B1,B2``: ``bench/profile_train_step.py`` at each batch size (``--profile-steps``: 30 timed and
   30 profiled steps after 10 of warm-up), its report in ``--out`` (``step-B.txt``), to see where a step's time goes
   (each compiles its own step: about a minute each);
3. run: ``python -m vit.train`` with the recipe and ``--time-budget`` = the seconds left before ``--deadline``
   (seconds after this script started) less ``--margin``, timed from its launch to its last epoch's line; a run
   still going half the margin past its budget is stopped with SIGTERM (it saves ``last.pt`` and marks itself
   cancelled);
4. evaluate each run's ``best.pt`` with ``python -m vit.evaluate`` on the held-out validation images, written
   losslessly (PNG) from the decoded split, so the figure comes from the checkpoint as it would ship, through the
   CLI's own preprocessing, not from the run's log;
5. collect into ``--out``: ``plan.json`` (the budget, each run's own plan from its ``config.json``, its measured
   wall time and evaluation, the device and library versions), the run's ``config.json``, ``metrics.jsonl``,
   ``train.log`` and ``best.pt``, the profiles' reports, and the run's console when it failed (a lent machine returns
   eight files). With ``--also NAME=ARGS`` (repeatable) more recipes train side by side on the same GPU, each with
   the same budget and its own ``ARGS`` on top of the recipe; each run's files then come back as one
   ``run-NAME.tar``. Side by side they share the GPU's time, and a 1,024-image step keeps it busy: three runs
   together trained 47,900 images/s in all, less than the 58,957 of one 1,024-image run alone
   (``bench/results/h100-2026-11-26b``). Use it to compare recipes at equal conditions, not to train the default.

The recipe is Lee et al. 2021's for small ViTs on CIFAR (their ViT baseline: 93.58 % on the test split in 100
epochs at batch 128), on the cifar-m preset (their depth-9, width-192, 12-head, patch-4 ViT, stochastic depth
0.1; github.com/aanna0701/SPT_LSA_ViT, main.py): AdamW, weight decay 0.05, warmup then cosine, label smoothing
0.1, mixup 1.0 or CutMix 1.0 on half the batches, random erasing 0.25; TrivialAugment for their AutoAugment (the
augmentation ``vit.train`` runs compiled on the GPU), an EMA of the weights, bf16 and a compiled step replayed as
CUDA graphs (``--compile-mode auto``). Here at batch 1,024 with the learning rate scaled by the square root of the
batch (their 1e-3 at 128 x 2.83 ~ 3e-3), a 15-epoch warmup and an EMA decay of 0.998 a step (~11 epochs, as 0.9995
at 256): a 1,024-image step is 2.06x the images a second of a 256-image one with CUDA graphs on an H100, and side
by side on one GPU for the same 491 s it reached 85.24 % against the 256-image recipe's 85.12 %
(``bench/results/h100-2026-11-26b``; the line-by-line comparison with Lee et al.'s code is in its README).

``--recipe lee`` trains Lee et al.'s own recipe instead (``LEE_RECIPE``: their 100 epochs of 3 passes, AutoAugment,
stochastic depth alike in every block, no EMA), and ``--recipe lee-ours`` the same passes with this project's
regularisation; ``scripts/gpu_session.sh record`` runs the two one after the other.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RECIPE = ["--preset", "cifar-m", "--batch-size", "1024", "--lr", "3e-3", "--min-lr", "1e-5",
          "--weight-decay", "0.05", "--label-smoothing", "0.1", "--grad-clip", "1.0", "--augment", "trivialaugment",
          "--mixup", "1.0", "--cutmix", "1.0", "--mix-prob", "0.5", "--random-erasing", "0.25",
          "--ema", "0.998", "--ema-warmup", "--compile", "--precision", "bf16",
          "--attention-every", "0", "--checkpoint-seconds", "600", "--eval-batch-size", "1000",
          "--log-every", "15", "--seed", "0", "--val-fraction", "0.1", "--warmup-epochs", "15"]




def overridden(recipe: list[str], changes: list[str]) -> list[str]:
    """``recipe`` with each option of ``changes`` taking its value there (added when new); a flag has no value."""
    def options(args: list[str]) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for arg in args:
            if arg.startswith("--"):
                found[arg] = []
            else:
                found[list(found)[-1]].append(arg)
        return found

    merged = {**options(recipe), **options(changes)}
    return [item for option, values in merged.items() for item in (option, *values)]


# Lee et al. 2021's recipe for their ViT on CIFAR (github.com/aanna0701/SPT_LSA_ViT at 54bd796, main.py's defaults and
# utils/scheduler.py; bench/results/h100-2026-11-26b/README.md, section 4): 100 epochs of 3 passes each (their
# RASampler(len, batch, 1, ra=3): --repeat-aug 3, Lee et al.'s order), a 10-epoch warmup, AdamW 1e-3 with weight decay
# 0.05 at batch 128, a cosine per step down to 1e-6, label smoothing 0.1, crop + flip + AutoAugment's CIFAR-10 policy,
# mixup 1 or CutMix 1 on half the batches, random erasing 0.25, stochastic depth 0.1 in every block (their one
# shared DropPath), no EMA, no clipping. Two things differ, for the GPU's pace: the batch is 1,024 with the learning
# rate x sqrt(8) (the square-root rule, as RECIPE's), since 300 passes of 45,000 images at 128 a step would not fit
# the budget (a 1,024-image step trained 58,957 images/s on an H100 alone, bench/results/h100-2026-11-26b: 300 passes
# in ~230 s), and the weight decay spares biases and norms (vit.train's rule; theirs decays every parameter).
LEE_RECIPE = ["--preset", "cifar-m", "--drop-path", "0.1", "--drop-path-schedule", "uniform", "--epochs", "100",
              "--repeat-aug", "3", "--repeat-aug-sampler", "passes", "--batch-size", "1024", "--lr", "2.83e-3",
              "--min-lr", "1e-6", "--weight-decay", "0.05", "--warmup-epochs", "10", "--label-smoothing", "0.1",
              "--grad-clip", "0", "--ema", "0", "--augment", "autoaugment", "--mixup", "1.0", "--cutmix", "1.0",
              "--mix-prob", "0.5", "--random-erasing", "0.25", "--compile", "--precision", "bf16",
              "--attention-every", "0", "--checkpoint-seconds", "600", "--eval-batch-size", "1000",
              "--log-every", "15", "--seed", "0", "--val-fraction", "0.1"]
# The same passes with the project's own regularisation (RECIPE's): TrivialAugment, drop path rising linearly to 0.1
# at the last block, clipping at norm 1 and the EMA of the weights.
LEE_OURS_RECIPE = overridden(LEE_RECIPE, ["--augment", "trivialaugment", "--drop-path-schedule", "linear",
                                          "--grad-clip", "1.0", "--ema", "0.998", "--ema-warmup"])
RECIPES = {"default": RECIPE, "lee": LEE_RECIPE, "lee-ours": LEE_OURS_RECIPE}


def launch(data: str, out: Path, budget: float, device: str, extra: list[str],
           recipe: list[str] = RECIPE) -> subprocess.Popen:
    """``python -m vit.train`` with the recipe and ``--time-budget``, its output in ``out``'s console log."""
    recipe = recipe if device != "cpu" else [a for a in recipe if a not in ("--compile", "--precision", "bf16")]
    command = [sys.executable, "-m", "vit.train", "--dataset", f"folder:{data}", "--out", str(out),
               "--device", device, "--time-budget", f"{budget:g}", *recipe, *extra]
    out.parent.mkdir(parents=True, exist_ok=True)
    console = open(out.parent / f"{out.name}-console.log", "w")
    print(" ".join(command), file=console, flush=True)
    return subprocess.Popen(command, cwd=ROOT, stdout=console, stderr=subprocess.STDOUT)


def follow(processes: dict[str, subprocess.Popen], work: Path, started: float,
           stop_at: float) -> dict[str, list[float]]:
    """Per run: seconds from ``started`` at which each epoch's metrics line appeared; SIGTERM past ``stop_at``."""
    seen: dict[str, list[float]] = {name: [] for name in processes}
    stopped: set[str] = set()

    def count(name: str) -> None:
        metrics = work / name / "metrics.jsonl"
        lines = metrics.read_text().count("\n") if metrics.exists() else 0
        seen[name].extend([time.monotonic() - started] * (lines - len(seen[name])))

    while any(p.poll() is None for p in processes.values()):
        for name, process in processes.items():
            if process.poll() is not None:
                continue
            count(name)
            if time.monotonic() > stop_at and name not in stopped:
                print(f"deadline: stopping {name} at epoch {len(seen[name])}", flush=True)
                process.send_signal(signal.SIGTERM)
                stopped.add(name)
        time.sleep(0.05)
    for name in processes:
        count(name)
    return seen


def device_report() -> str:
    import torch

    lines = [f"python {platform.python_version()}, torch {torch.__version__}"]
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        lines.append(f"{props.name}, {props.total_memory / 2**30:.1f} GiB, {props.multi_processor_count} SMs, "
                     f"CUDA {torch.version.cuda}")
    try:
        lines.append(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        lines.append("nvidia-smi: not available")
    lines.append(f"cpus {os.cpu_count()}")
    return "\n".join(lines) + "\n"


def profile(batch_sizes: list[int], data: str, out: Path, extra: list[str], steps: int = 30, warmup: int = 10) -> None:
    """``bench/profile_train_step.py`` at each batch size, ``steps`` steps after ``warmup``, its report as
    ``out/step-B.txt``."""
    for batch in batch_sizes:
        t = time.monotonic()
        command = [sys.executable, str(ROOT / "bench" / "profile_train_step.py"), "--data", data, "--batch-size",
                   str(batch), "--steps", str(steps), "--warmup", str(warmup), "--out", str(out / f"step-{batch}.txt"),
                   "--", *extra]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        print(f"profile at batch {batch}: exit {done.returncode} in {time.monotonic() - t:.1f} s", flush=True)
        if done.returncode != 0:
            print(done.stdout[-2000:] + done.stderr[-2000:], flush=True)


def write_val_folder(data, folder: Path) -> int:
    """The held-out validation split as ``folder/<class>/NNNNN.png``: the decoded pixels, losslessly."""
    from PIL import Image

    shutil.rmtree(folder, ignore_errors=True)
    for name in data.class_names:
        (folder / name).mkdir(parents=True)
    images = data.val.images.permute(0, 2, 3, 1).numpy()
    for i, (image, label) in enumerate(zip(images, data.val.labels.tolist(), strict=True)):
        Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image).save(
            folder / data.class_names[label] / f"{i:05d}.png")
    return len(images)


def evaluate(checkpoints: dict[str, Path], folder: Path, device: str) -> dict[str, dict]:
    """``python -m vit.evaluate`` on ``folder`` for each checkpoint, side by side: its JSON, or the failure's end."""
    where = "cuda" if device.startswith("cuda") else "cpu"
    commands = {name: [sys.executable, "-m", "vit.evaluate", str(path), "--data", str(folder), "--batch-size", "500",
                       "--device", where] for name, path in checkpoints.items()}
    running = {name: subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name, command in commands.items()}
    results = {}
    for name, process in running.items():
        try:
            stdout, stderr = process.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        if process.returncode != 0:
            results[name] = {"exit": process.returncode, "error": (stdout + stderr)[-1500:]}
            continue
        result = json.loads(stdout)
        results[name] = {"accuracy": result["accuracy"], "count": result["count"],
                         "command": " ".join(commands[name][1:])}
    return results


def parse_also(values: list[str]) -> list[tuple[str, list[str]]]:
    runs = []
    for value in values:
        name, _, extra = value.partition("=")
        if not name.replace("-", "").replace("_", "").isalnum() or name == "run":
            raise SystemExit(f"--also {value!r}: give NAME=ARGS with NAME in letters, digits, - and _ (not 'run')")
        runs.append((name, extra.split()))
    return runs


def collect(run_dir: Path, out: Path, returncode: int, as_tar: bool) -> None:
    """The run's files into ``out``: one by one, or as ``run-NAME.tar`` when several runs share the eight files."""
    names = ["config.json", "metrics.jsonl", "train.log", "best.pt"]
    console = run_dir.parent / f"{run_dir.name}-console.log"
    if not as_tar:
        for name in names:
            if (run_dir / name).exists():
                shutil.copy(run_dir / name, out / name)
        if returncode != 0:  # its train.log holds the rest; a lease returns eight files
            shutil.copy(console, out / "run-console.log")
        return
    with tarfile.open(out / f"run-{run_dir.name}.tar", "w") as tar:
        for name in names:
            if (run_dir / name).exists():
                tar.add(run_dir / name, arcname=f"{run_dir.name}/{name}")
        if console.exists():
            tar.add(console, arcname=f"{run_dir.name}/console.log")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="image folder: DATA/<class>/<image>")
    parser.add_argument("--out", required=True, type=Path, help="where the collected files go")
    parser.add_argument("--work", default=ROOT / "runs" / "gpu-default", type=Path, help="run folders")
    parser.add_argument("--deadline", type=float, default=560, help="seconds after start by which all is collected")
    parser.add_argument("--margin", type=float, default=20, help="seconds kept for collecting after the run")
    parser.add_argument("--max-run-seconds", type=float, default=600, help="the run's own cap (10 minutes)")
    parser.add_argument("--profile", default="", metavar="B1,B2", help="profile a step at these batch sizes first")
    parser.add_argument("--profile-steps", default="30,10", metavar="STEPS,WARMUP",
                        help="the profile's timed (and then profiled) steps and its warm-up steps")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--recipe", choices=tuple(RECIPES), default="default",
                        help="default (RECIPE, the app's GPU default), lee (Lee et al. 2021's) or lee-ours (theirs "
                        "with the project's regularisation)")
    parser.add_argument("--also", action="append", default=[], metavar="NAME=ARGS",
                        help="another run side by side: the recipe with ARGS on top (repeatable)")
    parser.add_argument("--no-evaluate", action="store_true", help="skip vit.evaluate on the validation images")
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more vit.train arguments")
    args = parser.parse_args()
    start = time.monotonic()
    others = parse_also(args.also)
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.work, ignore_errors=True)
    device = device_report()
    print(device, flush=True)

    sys.path.insert(0, str(ROOT))
    from vit.training.data import load_dataset

    t = time.monotonic()
    data = load_dataset(f"folder:{args.data}", 32, 3, val_fraction=0.1, seed=0)
    decode_seconds = time.monotonic() - t
    print(f"data: {len(data.train)} train, {len(data.val)} val, {decode_seconds:.1f} s "
          f"({'cache' if data.from_cache else 'decoded'})", flush=True)
    val_folder = args.work / "val-images"
    if not args.no_evaluate:
        print(f"validation images written for vit.evaluate: {write_val_folder(data, val_folder)}", flush=True)
    del data
    if args.profile:
        steps, warmup = (int(n) for n in args.profile_steps.split(","))
        profile([int(b) for b in args.profile.split(",")], args.data, args.out, args.extra, steps, warmup)

    budget = math.floor(min(args.max_run_seconds, args.deadline - (time.monotonic() - start) - args.margin))
    runs = [("run", list(args.extra))] + [(name, [*args.extra, *extra]) for name, extra in others]
    plan = {"device": device.strip().splitlines(), "decode_seconds": round(decode_seconds, 1),
            "time_budget_seconds": budget, "recipe_name": args.recipe, "recipe": RECIPES[args.recipe] + args.extra,
            "side_by_side": dict(others)}
    print(f"plan: {json.dumps(plan)}", flush=True)
    if budget < 60:
        print(f"only {budget} s left for the run; not started", flush=True)
        return 1
    launched = time.monotonic()
    processes = {name: launch(args.data, args.work / name, budget, args.device, extra, RECIPES[args.recipe])
                 for name, extra in runs}
    seen = follow(processes, args.work, launched, launched + budget + args.margin / 2)  # half the margin: overrun
    evaluated = {} if args.no_evaluate else evaluate(
        {name: args.work / name / "best.pt" for name in processes if (args.work / name / "best.pt").exists()},
        val_folder, args.device)
    results = {}
    for name, process in processes.items():
        run_dir = args.work / name
        config = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").exists() else {}
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()] if seen[name] else []
        result = {"run_exit": process.returncode, "run_plan": config.get("budget_plan"),
                  "compile_mode": config.get("compile_mode"), "run_epochs_done": len(seen[name]),
                  "run_launch_to_last_epoch_seconds": round(seen[name][-1], 2) if seen[name] else None,
                  "run_epoch_times": [round(s, 2) for s in seen[name]],
                  "val_acc_last": rows[-1].get("val_acc") if rows else None,
                  "val_acc_best": max((r.get("val_acc", 0) for r in rows), default=None)}
        if name in evaluated:
            result["evaluate_best"] = evaluated[name]
        results[name] = result
        print(f"{name}: exit {process.returncode}, {len(seen[name])} epochs (planned "
              f"{config.get('args', {}).get('epochs')}), launch to last epoch "
              f"{result['run_launch_to_last_epoch_seconds']} s, last val_acc {result['val_acc_last']}, best "
              f"{result['val_acc_best']}, vit.evaluate {result.get('evaluate_best')}", flush=True)
    plan.update(results.pop("run"))
    plan["run_launch_to_exit_seconds"] = round(time.monotonic() - launched, 2)
    if results:
        plan["side_by_side_results"] = results
    (args.out / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    for name, process in processes.items():
        collect(args.work / name, args.out, process.returncode, as_tar=len(processes) > 1)
    return 0 if all(p.returncode == 0 for p in processes.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
