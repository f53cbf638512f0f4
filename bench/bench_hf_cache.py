"""What a large Hugging Face cache costs the explorer's checkpoint picker (issue 20, item 9):
``python bench/bench_hf_cache.py [--models 2000 10000] [--reruns 2]``.

For each size it builds a synthetic cache of that many supported model folders (``models--org--vit-N`` with a
tiny ViT config.json and an empty model.safetensors, as huggingface_hub lays them out), then times the explorer
through Streamlit's AppTest: the first page load (the listing and the picker's labels are computed) and a rerun
(what every widget change costs), with one tiny shipped checkpoint as the page's default. It also counts the
config.json files the page opened. Run it on two trees to compare (``git archive COMMIT | tar -x -C /tmp/old``;
``PYTHONPATH=/tmp/old python /tmp/old/bench/bench_hf_cache.py`` uses the old tree's code).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TINY_VIT = {"architectures": ["ViTForImageClassification"], "model_type": "vit", "image_size": 16, "patch_size": 4,
            "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16}


def synthetic_cache(root: Path, count: int) -> Path:
    """``count`` supported models in an HF cache layout, a few kB each."""
    config = json.dumps(TINY_VIT)
    for i in range(count):
        model_dir = root / f"models--org--vit-{i:05d}"
        snapshot = model_dir / "snapshots" / "rev1"
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text(config)
        (snapshot / "model.safetensors").write_bytes(b"")
        (model_dir / "refs").mkdir()
        (model_dir / "refs" / "main").write_text("rev1")
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, nargs="+", default=[10, 2000, 10000])  # the first also imports
    parser.add_argument("--reruns", type=int, default=2)
    args = parser.parse_args()

    import streamlit as st
    import torch
    from streamlit.testing.v1 import AppTest

    from vit.checkpoint import save_checkpoint
    from vit.core.runfiles import DEFAULT_CHECKPOINT
    from vit.model import ViT, ViTConfig

    opened: list[str] = []
    real_read_text = Path.read_text

    def counting_read_text(self, *a, **k):
        if self.name == "config.json":
            opened.append(str(self))
        return real_read_text(self, *a, **k)

    Path.read_text = counting_read_text
    print(f"{'models':>7} {'first load s (cpu)':>19} {'rerun s (cpu)':>14} {'configs read (load, rerun)':>27} "
          f"{'options':>8}")
    for count in args.models:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            (tmp / "checkpoints").mkdir()
            (tmp / "runs").mkdir()
            torch.manual_seed(0)
            save_checkpoint(tmp / "checkpoints" / DEFAULT_CHECKPOINT,
                            ViT(ViTConfig(image_size=16, patch_size=4, num_channels=3, num_classes=2, hidden_size=8,
                                          num_layers=1, num_heads=2, mlp_size=16)), ["a", "b"])
            synthetic_cache(tmp / "hub", count)
            os.environ.update(VIT_CHECKPOINTS_DIR=str(tmp / "checkpoints"), VIT_RUNS_DIR=str(tmp / "runs"),
                              HF_HUB_CACHE=str(tmp / "hub"))
            st.cache_data.clear()
            st.cache_resource.clear()
            from vit.app import catalog
            catalog._describe_version.cache_clear()
            at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
            opened.clear()
            start, cpu = time.perf_counter(), time.process_time()
            at.run()
            first, first_cpu, first_reads = time.perf_counter() - start, time.process_time() - cpu, len(opened)
            assert not at.exception, [e.message for e in at.exception]
            reruns = []
            opened.clear()
            for _ in range(args.reruns):
                start, cpu = time.perf_counter(), time.process_time()
                at.run()
                reruns.append((time.perf_counter() - start, time.process_time() - cpu))
            picker = [w for w in at.sidebar.selectbox if w.label == "Checkpoint"][0]
            rerun, rerun_cpu = min(reruns)
            print(f"{count:>7} {f'{first:.2f} ({first_cpu:.2f})':>19} {f'{rerun:.2f} ({rerun_cpu:.2f})':>14} "
                  f"{f'{first_reads}, {len(opened) // args.reruns}':>27} {len(picker.options):>8}", flush=True)


if __name__ == "__main__":
    main()
