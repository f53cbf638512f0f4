"""The CAMs through the notebook API next to pytorch-grad-cam (issue 83, item 2): EigenCAM, Grad-CAM and LayerCAM of
ViT-B/16's last block's first norm (pytorch-grad-cam's ViT tutorial), one image, one thread, CPU time. One thread
for torch and for numpy's BLAS alike (threadpoolctl): both EigenCAMs project with numpy's SVD, whose OpenBLAS threads
spin on a loaded machine (0.65 s of CPU for one 196 x 768 SVD on two busy cores, 0.04 s on one thread).

Three calls per method, interleaved (their order rotates each round, so background load slows all alike):

- ``theirs``: pytorch-grad-cam 1.5.7 (``pip install grad-cam==1.5.7``) on timm's ``vit_base_patch16_224`` (random
  weights), ``target_layers=[model.blocks[-1].norm1]`` and the tutorial's ``reshape_transform``, the CAM object built
  once (its hooks registered), timed per call on the preprocessed tensor;
- ``explain``: ``vit.explain(checkpoint, image, method)`` on the same weights (timm's folder opened by ``vit.load``),
  from the PIL image: its preprocessing, the analysis (the prediction, the heads grid), the caption and the CAM;
- ``alone``: ``vit.explain.methods.cam.cam(model, x, method)`` on the preprocessed tensor, the CAM function by itself.

The table gives each call's median CPU seconds (this machine, this load only) and the medians of the per-round
ratios (portable): theirs / explain (>= 1: the API as cheap as pytorch-grad-cam) and alone / explain (>= 0.91:
the API within 10 % of the CAM alone). Run from the repository root::

    python -m bench.bench_cam_explain --threads 1 --repeats 7
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script too: python bench/bench_cam_explain.py

METHODS = ("eigencam", "gradcam", "layercam")


def cpu_seconds(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return f"{model}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=args.threads)  # numpy's BLAS (the SVD of both EigenCAMs)

    import timm
    from PIL import Image
    from pytorch_grad_cam import EigenCAM, GradCAM, LayerCAM

    import vit
    from vit.core.inference import preprocess
    from vit.explain.methods.cam import cam

    torch.manual_seed(0)
    reference = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=1000).eval()
    folder = Path(tempfile.mkdtemp()) / "timm"
    timm.models.save_for_hf(reference, folder, safe_serialization=True)
    checkpoint = vit.load(folder, device="cpu")
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (240, 320, 3), dtype=np.uint8))
    x = preprocess([image], checkpoint.preprocessing)  # (1, 3, 224, 224): theirs and the CAM alone read this

    def reshape_transform(tensor, height=14, width=14):  # the tutorial's
        result = tensor[:, 1:, :].reshape(tensor.size(0), height, width, tensor.size(2))
        return result.transpose(2, 3).transpose(1, 2)

    classes = {"eigencam": EigenCAM, "gradcam": GradCAM, "layercam": LayerCAM}
    print(f"# machine: {machine()}; torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
          f"grad-cam {version('grad-cam')}, timm {version('timm')}")
    print(f"# load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"# command: python -m bench.bench_cam_explain --threads {args.threads} --repeats {args.repeats} "
          f"--methods {' '.join(args.methods)}")
    print("| method | theirs CPU s | explain CPU s | alone CPU s | theirs / explain | alone / explain |")
    print("|---|---|---|---|---|---|")
    for method in args.methods:
        theirs_cam = classes[method](model=reference, target_layers=[reference.blocks[-1].norm1],
                                     reshape_transform=reshape_transform)
        calls = {"theirs": lambda c=theirs_cam: c(input_tensor=x, targets=None),
                 "explain": lambda m=method: vit.explain(checkpoint, image, m),
                 "alone": lambda m=method: cam(checkpoint.model, x, m)}
        for fn in calls.values():  # warm-up
            fn()
        times: dict[str, list[float]] = {name: [] for name in calls}
        names = list(calls)
        for r in range(args.repeats):
            for name in names[r % 3:] + names[:r % 3]:
                times[name].append(cpu_seconds(calls[name]))
        theirs_cam.activations_and_grads.release()
        ratio_theirs = statistics.median(t / e for t, e in zip(times["theirs"], times["explain"], strict=True))
        ratio_alone = statistics.median(a / e for a, e in zip(times["alone"], times["explain"], strict=True))
        med = {name: statistics.median(v) for name, v in times.items()}
        print(f"| {method} | {med['theirs']:.3f} | {med['explain']:.3f} | {med['alone']:.3f} | "
              f"{ratio_theirs:.2f} | {ratio_alone:.2f} |", flush=True)
    print(f"# load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
