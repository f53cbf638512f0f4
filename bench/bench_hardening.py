"""Time and peak memory of the hostile inputs of issue 20, run against two source trees side by side.

    python bench/bench_hardening.py OLD_TREE NEW_TREE [SCENARIO ...]

Each scenario runs in a fresh Python process (``cwd`` and ``PYTHONPATH`` = the tree) and reports its wall
time, its peak resident memory over the same process that only imports what the scenario imports, and how it
ended (the first line of what it raised, or what it returned). Get an old tree with
``git archive COMMIT | tar -x -C /tmp/old``. The inputs are built in a temporary folder; the sparse ones take
a few kB of disk whatever they declare.

Scenarios (the issue's sizes, scaled where the old code would exhaust the machine, as noted):
- ``config_labels``: the HF-cache picker lists and describes a model whose config.json declares num_labels
  10**7 without id2label (the issue's 10**12 would exhaust any machine on the old code).
- ``config_overflow``: the same with DINOv2's mlp_ratio 1e308.
- ``png_40000x1``: the 197-byte 40000x1 PNG opened as an upload and preprocessed by a model whose
  preprocessing resizes the short side to 256 and crops 224 (DINOv2's).
- ``run_nested``: RunManager.poll over a run folder whose status.json is 200 kB of nested lists.
- ``sparse_1gb``: open_source on an HF folder whose model.safetensors declares one 1 GB bfloat16 tensor (a
  sparse file of a few kB; the issue's was 3 GB, which peaked at 9.1 GB on the old code).
- ``header_100k``, ``header_1m``: open_source on a safetensors file whose header lists 100,000 (6.6 MB) or
  1,000,000 (the issue's 58 MB) empty tensors.
- ``timm_vit_b``: what a healthy file costs: open_source on a random timm ViT-B/16 (346 MB of safetensors).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GIB = 2**30


def sparse_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = 2 if dtype in ("BF16", "F16") else 4
        for n in shape:
            size *= n
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)


def hf_cache_model(cache: Path, name: str, config: dict) -> None:
    snapshot = cache / f"models--org--{name}" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    (snapshot / "model.safetensors").write_bytes(b"")


DINOV2 = {"architectures": ["Dinov2Model"], "model_type": "dinov2", "image_size": 224, "patch_size": 14,
          "hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6, "mlp_ratio": 4}
VIT = {"architectures": ["ViTForImageClassification"], "model_type": "vit", "image_size": 224, "patch_size": 16,
       "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}

def timm_vit_b(folder: Path) -> None:
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model("vit_base_patch16_224", pretrained=False)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "vit_b.safetensors")


PREPARE = {
    "config_labels": lambda d: hf_cache_model(d / "hub", "labels", {**VIT, "num_labels": 10**7}),
    "config_overflow": lambda d: hf_cache_model(d / "hub", "overflow", {**DINOV2, "mlp_ratio": 1e308}),
    "png_40000x1": lambda d: __import__("PIL.Image").Image.new("L", (40000, 1)).save(d / "line.png", optimize=True),
    "run_nested": lambda d: ((d / "runs" / "nested").mkdir(parents=True),
                             (d / "runs" / "nested" / "config.json").write_text('{"args": {"dataset": "x"}}'),
                             (d / "runs" / "nested" / "status.json").write_text("[" * 100_000 + "]" * 100_000)),
    "sparse_1gb": lambda d: ((d / "hf").mkdir(), (d / "hf" / "config.json").write_text(json.dumps(VIT)),
                             sparse_safetensors(d / "hf" / "model.safetensors", {"x": ("BF16", [GIB // 2])})),
    "header_100k": lambda d: sparse_safetensors(d / "many.safetensors",
                                                {f"t{i}": ("F32", [0]) for i in range(100_000)}),
    "header_1m": lambda d: sparse_safetensors(d / "many.safetensors",
                                              {f"t{i}": ("F32", [0]) for i in range(1_000_000)}),
    "timm_vit_b": timm_vit_b,
}

IMPORTS = {
    "config_labels": "from vit.app import catalog",
    "config_overflow": "from vit.app import catalog",
    "png_40000x1": "from vit import images, inference; from vit.checkpoint import Preprocessing",
    "run_nested": "from vit.runs.manager import RunManager",
    "sparse_1gb": "from vit.sources.open import open_source",
    "header_100k": "from vit.sources.open import open_source",
    "header_1m": "from vit.sources.open import open_source",
    "timm_vit_b": "from vit.sources.open import open_source",
}

WORK = {
    "config_labels": "[(e.error or f'{len(e.class_names):,} classes')[-80:] for e in "
                     "map(catalog.describe, catalog.find_hf_cache_models([D / 'hub']))]",
    "config_overflow": "[(e.error or 'described')[-80:] for e in "
                       "map(catalog.describe, catalog.find_hf_cache_models([D / 'hub']))]",
    "png_40000x1": ("inference.preprocess([images.open_image((D / 'line.png').read_bytes(), name='line.png')], "
                    "Preprocessing(224, 3, (0.5,) * 3, (0.5,) * 3, resize_size=256, resize_mode='shortest_edge'))"
                    ".shape"),
    "run_nested": "[i.name for i in RunManager(D / 'runs').poll()]",
    "sparse_1gb": "open_source(D / 'hf')",
    "header_100k": "open_source(D / 'many.safetensors')",
    "header_1m": "open_source(D / 'many.safetensors')",
    "timm_vit_b": "open_source(D / 'vit_b.safetensors', 'timm:vit_base_patch16_224').config.hidden_size",
}

SCRIPT = """
import sys, time
from pathlib import Path
import torch  # in the baseline too: the scenarios' own imports load it lazily
D = Path(sys.argv[1])
{imports}
start = time.perf_counter()
outcome = "ok"
if {work!r} != "None":
    try:
        result = {work}
        outcome = "returned " + repr(result)[:150]
    except BaseException as e:
        outcome = f"{{type(e).__name__}}: " + (str(e).splitlines() or [""])[0][:110]
print(time.perf_counter() - start)
print(outcome)
"""


def measure(tree: Path, scenario: str, data: Path, work: bool) -> tuple[float, float, str]:
    code = SCRIPT.format(imports=IMPORTS[scenario], work=WORK[scenario] if work else "None")
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_CACHE": str(data / "hub"), "HOME": str(data),
           "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", code, str(data)], cwd=tree, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(process.pid, 0)
    out, err = process.stdout.read(), process.stderr.read()
    process.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    lines = out.strip().splitlines()
    if process.returncode != 0 or len(lines) < 2:
        tail = (err.strip().splitlines() or ["?"])[-1][:110]
        return wall, usage.ru_maxrss / 1024, f"process died ({process.returncode}): {tail}"
    return float(lines[0]), usage.ru_maxrss / 1024, lines[1]


def main() -> None:
    if sys.argv[1] == "--prepare":
        PREPARE[sys.argv[2]](Path(sys.argv[3]))
        return
    old, new, *names = sys.argv[1:]
    for scenario in names or list(PREPARE):
        with tempfile.TemporaryDirectory() as folder:
            data = Path(folder)
            # In its own process: Linux counts a parent's resident memory at fork in the child's peak.
            subprocess.run([sys.executable, __file__, "--prepare", scenario, folder], check=True)
            print(f"{scenario}:")
            for label, tree in (("before", Path(old)), ("after", Path(new))):
                _, base, _ = measure(tree, scenario, data, work=False)
                seconds, peak, outcome = measure(tree, scenario, data, work=True)
                print(f"  {label:6} {seconds:7.2f} s  peak {peak:7.0f} MiB (+{peak - base:6.0f} over imports)  "
                      f"{outcome}")


if __name__ == "__main__":
    main()
