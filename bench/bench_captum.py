"""captum's Integrated Gradients at 50 steps and SmoothGrad at 50 samples through the project's dispatcher, next to
captum's default call on the same model (issue 82): one image, CPU time.

- ``theirs``: captum's default call on the model's logits, on the preprocessed tensor:
  ``IntegratedGradients(f).attribute(x, target=c)`` (50 steps, ``internal_batch_size=None``: every step in one
  batch) and ``NoiseTunnel(Saliency(f)).attribute(x, nt_type="smoothgrad", nt_samples=50, target=c, abs=False)``
  (``nt_samples_batch_size=None``: every sample in one batch);
- ``ours``: ``vit.explain.views.method_maps.model_method_map(checkpoint, image, method, c)`` from the PIL image: its
  preprocessing, its options and cost checked (``vit.costs.plan.attribution``), the batch it chooses (the most that
  fit the memory limit, at most 64), captum's call, the patch sums.

Both on the same model: timm's ``vit_tiny_patch16_224`` (random weights, ``--model`` for another) opened by
``vit.load``. Calls interleaved, their order alternating each round; the table gives each call's median CPU seconds
(this machine, this load only) and the median of the per-round ratios theirs / ours (portable; >= 1: ours at least as
fast). Run from the repository root::

    python -m bench.bench_captum --threads 2 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script too: python bench/bench_captum.py

from bench.bench_cam_explain import cpu_seconds, machine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="vit_tiny_patch16_224")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import timm
    from captum.attr import IntegratedGradients, NoiseTunnel, Saliency
    from PIL import Image

    import vit
    from vit.core.inference import preprocess
    from vit.costs import plan
    from vit.explain.views.method_maps import model_method_map

    torch.manual_seed(0)
    reference = timm.create_model(args.model, pretrained=False, num_classes=1000).eval()
    folder = Path(tempfile.mkdtemp()) / "timm"
    timm.models.save_for_hf(reference, folder, safe_serialization=True)
    checkpoint = vit.load(folder, device="cpu")
    model = checkpoint.model
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (240, 320, 3), dtype=np.uint8))
    x = preprocess([image], checkpoint.preprocessing)  # (1, 3, 224, 224)
    grid = model.patch_grid(*x.shape[2:])
    with torch.no_grad():
        target = int(model(x)[0].argmax())

    def forward(images: torch.Tensor) -> torch.Tensor:
        return model(images)[0]

    def integrated_gradients():
        return IntegratedGradients(forward).attribute(x.clone().requires_grad_(True), target=target)

    def smoothgrad():
        return NoiseTunnel(Saliency(forward)).attribute(x.clone().requires_grad_(True), nt_type="smoothgrad",
                                                        nt_samples=50, target=target, abs=False)

    runs = {"integrated_gradients": (integrated_gradients, {}), "smoothgrad": (smoothgrad, {"nt_samples": 50})}
    print(f"# machine: {machine()}; torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
          f"captum {version('captum')}, timm {version('timm')}; {args.model} at 224 px, random weights")
    print(f"# load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"# command: python -m bench.bench_captum --threads {args.threads} --repeats {args.repeats} "
          f"--model {args.model}")
    print("| method | passes | our batch | theirs CPU s | ours CPU s | theirs / ours |")
    print("|---|---|---|---|---|---|")
    for method, (theirs, options) in runs.items():
        calls = {"theirs": theirs,
                 "ours": lambda m=method, o=options: model_method_map(checkpoint, image, m, target, options=o)}
        for fn in calls.values():  # warm-up
            fn()
        times: dict[str, list[float]] = {name: [] for name in calls}
        names = list(calls)
        for r in range(args.repeats):
            for name in names[r % 2:] + names[:r % 2]:
                times[name].append(cpu_seconds(calls[name]))
        ratio = statistics.median(t / o for t, o in zip(times["theirs"], times["ours"], strict=True))
        med = {name: statistics.median(v) for name, v in times.items()}
        batch = plan.attribution_batch(model, grid, 50, gradient=True)
        print(f"| {method} | 50 | {batch} | {med['theirs']:.2f} | {med['ours']:.2f} | {ratio:.2f} |", flush=True)
    print(f"# load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
