"""Several CIFAR-10 recipes trained side by side on one lent GPU, each ending at one wall-clock deadline.

    python scripts/gpu_sweep.py launch BENCH_JSONL SECONDS   # start every recipe, planned to end in SECONDS
    python scripts/gpu_sweep.py replan                        # re-plan each run's epochs on its measured pace
    python scripts/gpu_sweep.py status                        # one line per run
    python scripts/gpu_sweep.py collect OUT                   # the runs' files into OUT (8 files at most)

Why side by side: a 2.7 M-parameter ViT at 32 px uses a few per cent of an H100 (bench_gpu's MFU column), so
four runs in four processes cost each little of its own pace, and one lease compares four recipes instead of
betting it on one. Why a deadline: the lease is three calls of at most ten minutes and the runs' pace on a
shared GPU is known only once they run, so ``launch`` plans the epochs from the bench's single-run rates and
``replan`` (at the next call) stops each run (SIGTERM: last.pt) and resumes it with ``--epochs`` re-planned to
end at the deadline (the trainer re-plans its cosine from that step, as for the shipped CPU model).
Each run trains in its own process session, so it outlives the call that started it while the machine is warm.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere in the repo

from vit.core.runfiles import pid_alive, read_json, read_metrics, write_json  # noqa: E402

ROOT = Path("runs/sweep")
TRAIN_IMAGES = 45_000
# Starting a process, compiling, and its first epoch's warm-up, paid again by each resume.
RESTART_SECONDS = 75
# The bench's single-run rate over a run's pace beside three others (second lease: 2.1 for 4-px patches, 4.1 for
# 2-px ones); replan corrects it from the runs' own pace.
SHARED_SLOWDOWN = 3.0

COMMON = ["--dataset", "folder:data/cifar10/train", "--device", "cuda", "--preset", "cifar-m", "--min-lr", "1e-5",
          "--weight-decay", "0.05", "--label-smoothing", "0.1", "--augment", "trivialaugment", "--compile",
          "--seed", "0", "--attention-every", "25", "--ema-warmup"]
# name: (bench model whose rate plans it, its rate's divisor for a larger model, batch, lr, extra arguments, which
# override the planned ones).
LEE = ["--mixup", "1.0", "--cutmix", "1.0", "--mix-prob", "0.5", "--random-erasing", "0.25", "--warmup-epochs", "10"]
RECIPES = {
    # Lee et al. 2021's ViT is cifar-m on 4-px patches: 93.6 % in 100 epochs of their recipe (github.com/aanna0701/
    # SPT_LSA_ViT, main.py: AdamW 1e-3 at batch 128, 10 warm-up epochs, mixup or cutmix on half the batches, random
    # erasing 0.25; TrivialAugment for their AutoAugment; their repeated augmentation is not in vit.train), 4x our
    # steps per epoch.
    "p4-lee": ("cifar-m", 1.0, 128, 1e-3, ["--patch-size", "4", *LEE]),
    "p2-lee": ("cifar-m:p2", 1.0, 128, 1e-3, ["--patch-size", "2", *LEE]),
    # Ours at batch 512, DeiT's mixup/cutmix on every batch: the second lease's best.
    "p4-mix": ("cifar-m", 1.0, 512, 2e-3, ["--patch-size", "4", "--mixup", "0.8", "--cutmix", "1.0"]),
    # ViT-Lite-7 (Hassani et al. 2021: width 256, 7 layers, 4 heads, MLP 512) on 2 px patches: head dim 64.
    "lite7-p2": ("cifar-m:p2", 1.4, 256, 1.5e-3, ["--patch-size", "2", "--hidden-size", "256", "--num-layers",
                                                   "7", "--num-heads", "4", "--mlp-size", "512"]),
}
# The second lease (bench/results/h100-2026-11-24b, compiled with a graph break at every block, 19 minutes shared by
# four): p4-mix 84.0 % at 162 epochs, lite7-p2 80.1 % at 79, p2-ta 79.0 % at 55, p2 with mixup/cutmix 75.7 % at 55
# (dropped). All were still rising, with far fewer steps than Lee et al.'s.


def now() -> float:
    return time.time()


def state() -> dict:
    return read_json(ROOT / "sweep.json")


def save_state(s: dict) -> None:
    write_json(ROOT / "sweep.json", s)


def spawn(name: str, args: list[str]) -> int:
    log = open(ROOT / f"{name}.console.log", "a")
    log.write(f"\n$ {' '.join(args)}\n")
    log.flush()
    proc = subprocess.Popen([sys.executable, "-m", "vit.train", *args], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    return proc.pid


def metrics(name: str) -> list[dict]:
    """The run's finished epochs (those with a validation accuracy)."""
    return [row for row in read_metrics(ROOT / name / "metrics.jsonl") if "val_acc" in row]


def launch(bench_jsonl: str, seconds: float) -> None:
    ROOT.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in Path(bench_jsonl).read_text().splitlines() if line.strip()]
    rate = {r["model"]: r["images_per_s"] for r in rows if r.get("compile")} or \
        {r["model"]: r["images_per_s"] for r in rows}
    end = now() + seconds
    s = {"end": end, "runs": {}}
    for name, (model, divisor, batch, lr, extra) in RECIPES.items():
        per_run = rate.get(model, 8000.0) / divisor / SHARED_SLOWDOWN
        epochs = max(30, int((seconds - RESTART_SECONDS) * per_run / TRAIN_IMAGES / 1.1))
        steps = epochs * -(-TRAIN_IMAGES // batch)
        ema = round(1 - 1 / (0.05 * steps), 6)  # an average over the last ~5 % of the steps
        warmup = max(5, epochs // 30)
        args = [*COMMON, "--batch-size", str(batch), "--lr", str(lr), "--epochs", str(epochs), "--ema", str(ema),
                "--warmup-epochs", str(warmup), *extra, "--out", str(ROOT / name)]
        s["runs"][name] = {"pid": spawn(name, args), "epochs": epochs, "args": args}
        print(f"{name}: {epochs} epochs at batch {batch}, lr {lr}, EMA {ema} (planned at {per_run:,.0f} img/s)")
    save_state(s)


def replan() -> None:
    s = state()
    left = s["end"] - now()
    stopping = {}
    for name, run in s["runs"].items():
        rows = metrics(name)
        if not pid_alive(run["pid"]) or len(rows) < 3:
            print(f"{name}: {'not running' if not pid_alive(run['pid']) else 'too few epochs'}; left as it is")
            continue
        pace = statistics.median(r["epoch_seconds"] for r in rows[-3:])
        done = rows[-1]["epoch"]
        epochs = done + max(1, int((left - RESTART_SECONDS) / pace))
        if abs(epochs - run["epochs"]) <= 0.05 * run["epochs"]:
            print(f"{name}: {done} epochs at {pace:.2f} s each; {run['epochs']} still fit")
            continue
        print(f"{name}: {done} epochs at {pace:.2f} s each; re-planned {run['epochs']} -> {epochs}")
        os.kill(run["pid"], signal.SIGTERM)
        stopping[name] = epochs
    deadline = now() + 90
    for name in stopping:
        while pid_alive(s["runs"][name]["pid"]) and now() < deadline:
            time.sleep(1)
    for name, epochs in stopping.items():
        if pid_alive(s["runs"][name]["pid"]):
            print(f"{name}: did not stop within 90 s; left running")
            continue
        s["runs"][name]["pid"] = spawn(name, ["--resume", str(ROOT / name), "--epochs", str(epochs)])
        s["runs"][name]["epochs"] = epochs
    save_state(s)


def status() -> None:
    s = state()
    print(f"{max(0.0, s['end'] - now()):.0f} s to the deadline")
    for name, run in s["runs"].items():
        rows = metrics(name)
        last = rows[-1] if rows else {}
        best = max((r["val_acc"] for r in rows), default=float("nan"))
        print(f"{name:9s} {'running' if pid_alive(run['pid']) else 'ended  '} epoch {last.get('epoch', 0)}/"
              f"{run['epochs']} val {last.get('val_acc', float('nan')):.4f} best {best:.4f} "
              f"{last.get('epoch_seconds', float('nan')):.2f} s/epoch {last.get('images_per_second', 0):,.0f} img/s")


def stop(grace: float) -> None:
    s = state()
    for run in s["runs"].values():
        if pid_alive(run["pid"]):
            os.kill(run["pid"], signal.SIGTERM)
    deadline = now() + grace
    while any(pid_alive(r["pid"]) for r in s["runs"].values()) and now() < deadline:
        time.sleep(1)


def collect(out: str) -> None:
    """One archive of every run's small files; the best checkpoints whole while they fit 16 MiB each."""
    s = state()
    with tarfile.open(Path(out) / "sweep-runs.tar.gz", "w:gz") as tar:
        tar.add(ROOT / "sweep.json", arcname="sweep.json")
        for name in s["runs"]:
            for f in ("metrics.jsonl", "status.json", "config.json", "train.log"):
                if (ROOT / name / f).exists():
                    tar.add(ROOT / name / f, arcname=f"{name}/{f}")
            if (ROOT / f"{name}.console.log").exists():
                tar.add(ROOT / f"{name}.console.log", arcname=f"{name}/console.log")
    ranked = sorted(s["runs"], key=lambda n: -max((r["val_acc"] for r in metrics(n)), default=0.0))
    for name in ranked[:3]:
        best = ROOT / name / "best.pt"
        if best.exists() and best.stat().st_size < 16 * 2**20:
            shutil.copy(best, Path(out) / f"best-{name}.pt")
    print("ranked by best validation accuracy:", ", ".join(ranked))


if __name__ == "__main__":
    verb = sys.argv[1]
    if verb == "launch":
        launch(sys.argv[2], float(sys.argv[3]))
    elif verb == "replan":
        replan()
    elif verb == "status":
        status()
    elif verb == "stop":
        stop(float(sys.argv[2]) if len(sys.argv) > 2 else 60)
    elif verb == "collect":
        collect(sys.argv[2])
    else:
        sys.exit(f"usage: {sys.argv[0]} launch BENCH_JSONL SECONDS | replan | status | stop [GRACE] | collect OUT")
