"""Opening an imported model: load + first attention map for a random ViT-B/16 saved as an HF folder.

A ``ViTForImageClassification`` with the ViT-B/16 config (86 M parameters, random weights,
nothing downloaded) is written with ``save_pretrained``. Timed, alternating over ``--repeats``
rounds so background load hits both alike, medians shown:

- ours: ``vit.sources.open.open_source(folder)`` (safetensors read, key mapping, shape checks on
  the meta device) and the explorer's first map (``vit.explain.views.image_analysis.analyse``: preprocessing and one
  forward pass keeping every layer's input, then ``attention_map``: the last layer's CLS map
  recomputed from it, on a 640x480 image);
- the baseline: ``transformers.ViTForImageClassification.from_pretrained(folder)`` (eager
  attention) and one forward pass with ``output_attentions=True`` on the same model input.

Run from the repository root::

    python -m bench.bench_import --threads 2 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script too: python bench/bench_import.py
from vit.core.inference import preprocess  # noqa: E402
from vit.explain.views.attention_maps import MapSettings, attention_map  # noqa: E402
from vit.explain.views.image_analysis import analyse  # noqa: E402
from vit.sources.open import open_source  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "vit-base-patch16-224"
        config = transformers.ViTConfig()  # the ViT-B/16 defaults: 224 px, 16-px patches, 12 x 768, 1000 classes
        torch.manual_seed(0)
        transformers.ViTForImageClassification(config).save_pretrained(folder)
        times: dict[str, list[float]] = {"ours load": [], "ours first map": [], "HF load": [], "HF forward": []}
        for _ in range(args.repeats):
            start = time.perf_counter()
            checkpoint = open_source(folder)
            times["ours load"].append(time.perf_counter() - start)
            start = time.perf_counter()
            attention_map(analyse(checkpoint, image), MapSettings())  # last layer, CLS, mean over heads
            times["ours first map"].append(time.perf_counter() - start)
            x = preprocess([image], checkpoint.preprocessing)
            del checkpoint
            start = time.perf_counter()
            hf = transformers.ViTForImageClassification.from_pretrained(folder, attn_implementation="eager").eval()
            times["HF load"].append(time.perf_counter() - start)
            start = time.perf_counter()
            with torch.inference_mode():
                hf(pixel_values=x, output_attentions=True)
            times["HF forward"].append(time.perf_counter() - start)
            del hf
    median = {k: statistics.median(v) for k, v in times.items()}
    print(f"threads {args.threads}, {args.repeats} rounds, medians (s)")
    for key, value in median.items():
        print(f"  {key:15s} {value:7.3f}")
    ours, theirs = median["ours load"] + median["ours first map"], median["HF load"] + median["HF forward"]
    print(f"  load + first map: ours {ours:.3f} s, HF from_pretrained + forward {theirs:.3f} s, "
          f"ratio {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
