"""The dataset analysis locally and on a Ray cluster, side by side on the same machine.

    python bench/bench_analyze_ray.py                  # 1,000 random 32x32 images, the shipped cifar-s model
    python bench/bench_analyze_ray.py --images 200 --mechanism

Writes ``--images`` random PNGs into 10 class folders of a temp folder, starts a local Ray cluster of
two nodes (``tests/ray_cluster.py``: a head and a second node, ``--cpus-per-node`` each) and times the
two commands a user types, from start to exit: ``vit.analyze`` in this process's machine, and
``vit.analyze --ray`` (submitting the job, uploading the code, starting the actors that each load the
model, the Ray Data pipeline, writing the report). The cluster's own start is not counted. Prints both
wall times, their ratio and the largest difference between the two ``analysis.json`` (they should agree
to 1e-6).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the test cluster: tests/ray_cluster.py

from ray_cluster import RayCluster  # noqa: E402

CHECKPOINT = ROOT / "checkpoints" / "cifar10-cifar-s.pt"
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def make_images(root: Path, count: int, size: int = 32) -> Path:
    """``count`` random RGB PNGs spread over the checkpoint's 10 class folders."""
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / CLASSES[i % len(CLASSES)]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return root


def timed(argv: list[str]) -> float:
    """Seconds ``python -m vit.analyze ARGV`` takes; its output is shown only when it fails."""
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "vit.analyze", *argv], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.monotonic() - began
    if done.returncode != 0:
        sys.exit(f"vit.analyze {' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                 f"{done.stderr[-3000:]}")
    return seconds


def largest_difference(a: object, b: object) -> float:
    """The largest absolute difference between the numbers of two JSON values of the same shape."""
    if isinstance(a, dict):
        return max((largest_difference(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, list):
        return max((largest_difference(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return abs(float(a) - float(b))
    return 0.0 if a == b else float("inf")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--cpus-per-node", type=int, default=1)
    p.add_argument("--mechanism", action="store_true", help="also the mechanism statistics (much slower)")
    args = p.parse_args()
    if args.images < 1 or args.batch_size < 1 or args.cpus_per_node < 1:
        sys.exit("--images, --batch-size and --cpus-per-node must be 1 or more")
    with tempfile.TemporaryDirectory(prefix="bench-analyze-ray-") as tmp:
        tmp = Path(tmp)
        # A home of its own, as the tests have: Ray turns token authentication on when it finds ~/.ray/auth_token
        # (another cluster's), and the cluster's own readiness check would then be refused.
        os.environ["HOME"] = str(tmp / "home")
        data = make_images(tmp / "data", args.images)
        common = [str(CHECKPOINT), "--data", str(data), "--batch-size", str(args.batch_size), "--device", "cpu",
                  *(["--mechanism"] if args.mechanism else [])]
        cluster = RayCluster(tmp / "ray", cpus_per_node=args.cpus_per_node)
        try:
            cluster.start()
            local = timed([*common, "--out", str(tmp / "local")])
            on_ray = timed([*common, "--out", str(tmp / "ray"), "--ray", cluster.address])
        finally:
            cluster.stop()
        a, b = (json.loads((tmp / name / "analysis.json").read_text()) for name in ("local", "ray"))
        difference = largest_difference(a, b)
    actors = 2 * args.cpus_per_node
    print(f"{args.images} images of 32x32, cifar-s ({CHECKPOINT.name}), batch {args.batch_size}"
          f"{', with --mechanism' if args.mechanism else ''}; {os.cpu_count()} CPU cores")
    print(f"local  vit.analyze:       {local:7.1f} s  ({args.images / local:6.1f} img/s)")
    print(f"ray    vit.analyze --ray: {on_ray:7.1f} s  ({args.images / on_ray:6.1f} img/s; 2 nodes x "
          f"{args.cpus_per_node} CPU, {actors} actors; cluster start {cluster.start_seconds:.1f} s not counted)")
    print(f"ratio ray / local: {on_ray / local:.2f}")
    print(f"largest difference between the two analysis.json: {difference:.2e}")


if __name__ == "__main__":
    main()
