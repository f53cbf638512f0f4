"""Train the GPU default inside a wall-clock budget on one GPU: decode, profile (optionally), run, collect.

    python bench/train_gpu_default.py --data data/cifar10/train --out OUT --deadline 560 [--profile 256,1024]

A lent GPU machine gives minutes, not hours, so the run is given what is left of them as ``vit.train
--time-budget``: the run itself plans its epochs at the end of its second one, from the time that epoch took on
this very machine, and its cosine ends at the last (no probe run spends the minutes first):

1. decode the image folder into ``vit.train``'s uint8 cache (once; before the run's launch);
2. with ``--profile B1,B2``: ``bench/profile_train_step.py`` at each batch size, its report in ``--out``
   (``step-B.txt``), to see where a step's time goes (each compiles its own step: about a minute each);
3. run: ``python -m vit.train`` with the recipe and ``--time-budget`` = the seconds left before ``--deadline``
   (seconds after this script started) less ``--margin``, timed from its launch to its last epoch's line; a run
   still going half the margin past its budget is stopped with SIGTERM (it saves ``last.pt`` and marks itself
   cancelled);
4. collect into ``--out``: ``plan.json`` (the budget, the run's own plan from its ``config.json``, its measured
   wall time, the device and library versions), the run's ``config.json``, ``metrics.jsonl``, ``train.log`` and
   ``best.pt``, the profiles' reports, and the run's console when it failed (a lent machine returns eight files).

The recipe is Lee et al. 2021's for small ViTs on CIFAR (their ViT baseline: 93.58 % on the test split in 100
epochs at batch 128), on the cifar-m preset (their depth-9, width-192, 12-head, patch-4 ViT, stochastic depth
0.1; github.com/aanna0701/SPT_LSA_ViT, main.py): AdamW, weight decay 0.05, warmup then cosine, label smoothing
0.1, mixup 1.0 or CutMix 1.0 on half the batches, random erasing 0.25; TrivialAugment for their AutoAugment (the
augmentation ``vit.train`` runs compiled on the GPU), and here at batch 256 with the learning rate scaled by the
square root of the batch (their 1e-3 at 128 x 1.5), an EMA of the weights, bf16 and a compiled step.
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RECIPE = ["--preset", "cifar-m", "--batch-size", "256", "--lr", "1.5e-3", "--min-lr", "1e-5",
          "--weight-decay", "0.05", "--label-smoothing", "0.1", "--grad-clip", "1.0", "--augment", "trivialaugment",
          "--mixup", "1.0", "--cutmix", "1.0", "--mix-prob", "0.5", "--random-erasing", "0.25",
          "--ema", "0.9995", "--ema-warmup", "--compile", "--precision", "bf16",
          "--attention-every", "0", "--checkpoint-seconds", "600", "--eval-batch-size", "1000",
          "--log-every", "15", "--seed", "0", "--val-fraction", "0.1", "--warmup-epochs", "5"]


def launch(data: str, out: Path, budget: float, device: str, extra: list[str]) -> subprocess.Popen:
    """``python -m vit.train`` with the recipe and ``--time-budget``, its output in ``out``'s console log."""
    recipe = RECIPE if device != "cpu" else [a for a in RECIPE if a not in ("--compile", "--precision", "bf16")]
    command = [sys.executable, "-m", "vit.train", "--dataset", f"folder:{data}", "--out", str(out),
               "--device", device, "--time-budget", f"{budget:g}", *recipe, *extra]
    out.parent.mkdir(parents=True, exist_ok=True)
    console = open(out.parent / f"{out.name}-console.log", "w")
    print(" ".join(command), file=console, flush=True)
    return subprocess.Popen(command, cwd=ROOT, stdout=console, stderr=subprocess.STDOUT)


def follow(process: subprocess.Popen, run_dir: Path, started: float, stop_at: float) -> list[float]:
    """Seconds from ``started`` at which each epoch's metrics line appeared; SIGTERM past ``stop_at``."""
    metrics = run_dir / "metrics.jsonl"
    seen: list[float] = []
    stopped = False
    while process.poll() is None:
        lines = metrics.read_text().count("\n") if metrics.exists() else 0
        now = time.monotonic()
        seen.extend([now - started] * (lines - len(seen)))
        if now > stop_at and not stopped:
            print(f"deadline: stopping {run_dir.name} at epoch {len(seen)}", flush=True)
            process.send_signal(signal.SIGTERM)
            stopped = True
        time.sleep(0.05)
    lines = metrics.read_text().count("\n") if metrics.exists() else 0
    seen.extend([time.monotonic() - started] * (lines - len(seen)))
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


def profile(batch_sizes: list[int], data: str, out: Path, extra: list[str]) -> None:
    """``bench/profile_train_step.py`` at each batch size, its report as ``out/step-B.txt``."""
    for batch in batch_sizes:
        t = time.monotonic()
        command = [sys.executable, str(ROOT / "bench" / "profile_train_step.py"), "--data", data, "--batch-size",
                   str(batch), "--steps", "30", "--warmup", "10", "--out", str(out / f"step-{batch}.txt"), "--",
                   *extra]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        print(f"profile at batch {batch}: exit {done.returncode} in {time.monotonic() - t:.1f} s", flush=True)
        if done.returncode != 0:
            print(done.stdout[-2000:] + done.stderr[-2000:], flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="image folder: DATA/<class>/<image>")
    parser.add_argument("--out", required=True, type=Path, help="where the collected files go")
    parser.add_argument("--work", default=ROOT / "runs" / "gpu-default", type=Path, help="run folders")
    parser.add_argument("--deadline", type=float, default=560, help="seconds after start by which all is collected")
    parser.add_argument("--margin", type=float, default=20, help="seconds kept for collecting after the run")
    parser.add_argument("--max-run-seconds", type=float, default=600, help="the run's own cap (10 minutes)")
    parser.add_argument("--profile", default="", metavar="B1,B2", help="profile a step at these batch sizes first")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more vit.train arguments")
    args = parser.parse_args()
    start = time.monotonic()
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
    del data
    if args.profile:
        profile([int(b) for b in args.profile.split(",")], args.data, args.out, args.extra)

    budget = math.floor(min(args.max_run_seconds, args.deadline - (time.monotonic() - start) - args.margin))
    plan = {"device": device.strip().splitlines(), "decode_seconds": round(decode_seconds, 1),
            "time_budget_seconds": budget, "recipe": RECIPE + args.extra}
    print(f"plan: {json.dumps(plan)}", flush=True)
    if budget < 60:
        print(f"only {budget} s left for the run; not started", flush=True)
        return 1
    run_dir = args.work / "run"
    launched = time.monotonic()
    run = launch(args.data, run_dir, budget, args.device, args.extra)
    seen = follow(run, run_dir, launched, launched + budget + args.margin / 2)  # half the margin for an overrun
    config = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").exists() else {}
    plan.update(run_exit=run.returncode, run_plan=config.get("budget_plan"), run_epochs_done=len(seen),
                run_launch_to_last_epoch_seconds=round(seen[-1], 2) if seen else None,
                run_launch_to_exit_seconds=round(time.monotonic() - launched, 2),
                run_epoch_times=[round(s, 2) for s in seen])
    (args.out / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    for name in ("config.json", "metrics.jsonl", "train.log", "best.pt"):
        if (run_dir / name).exists():
            shutil.copy(run_dir / name, args.out / name)
    if run.returncode != 0:  # its train.log holds the rest; a lease returns eight files
        shutil.copy(run_dir.parent / "run-console.log", args.out / "run-console.log")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()] if seen else [{}]
    print(f"run: exit {run.returncode}, {len(seen)} epochs (planned {config.get('args', {}).get('epochs')}), "
          f"launch to last epoch {plan['run_launch_to_last_epoch_seconds']} s, last val_acc "
          f"{rows[-1].get('val_acc')}, best {max(r.get('val_acc', 0) for r in rows)}", flush=True)
    return 0 if run.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
