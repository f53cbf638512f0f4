"""The two roads side by side (issue 91, item 5): a family that has a port, opened by its port (our ``ViT``, the
weights mapped onto it) and by the library road (the library's own modules, their attention recorded), drawing the
same maps of the same image: time and peak memory, the library road's as a ratio of the port's.

Families: every family with both roads whose library builds it at a published size with random weights (``HF``
and ``TIMM`` below: HF ViT, DINOv2 with and without registers, distilled DeiT, BEiT, CLIP's and SigLIP's vision
towers, each through transformers' attention interface; timm ViT, distilled DeiT, DINOv2 at 518 px and EVA02, timm's
explicit path for the asked layers). Each is saved natively, so both roads read the same weights. Maps:
``attention`` (the last layer, CLS's row), ``rollout`` (every layer) and ``class`` (the gradient rollout, a forward
and a backward), each through ``vit.explain`` as a notebook calls it. A road that refuses a family, or a map, is not
forced: its one-line refusal stands in the row, and the two maps are compared ("map gap", the largest difference as
a share of the port map's largest value) wherever both are drawn.

Time: one process, ``--threads`` torch threads, calls interleaved A B B A ... so background load slows both alike;
the median of each road and the median of each call pair's ratio ("pairs", steadier under load). Memory: each
(family, road, map) in a fresh process forked for it, its resident-set peak over what it held just before the map
(``tests/peak_memory``: VmHWM reset through clear_refs, glibc returning freed blocks at once), after one warm-up
call of the same map. Run from the repository root::

    python -m bench.bench_roads --threads 1 --repeats 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# family: (its transformers model class and config, its image processor) at the published size named beside it
HF = {
    "hf-vit": ("ViTForImageClassification", "ViTConfig", {"num_labels": 1000},  # google/vit-base-patch16-224
               "ViTImageProcessor", {"size": {"height": 224, "width": 224}}),
    "hf-dinov2": ("Dinov2ForImageClassification", "Dinov2Config",  # facebook/dinov2-base-imagenet1k-1-layer
                  {"num_labels": 1000, "image_size": 518, "patch_size": 14},
                  "BitImageProcessor", {"size": {"shortest_edge": 256}, "crop_size": {"height": 224, "width": 224}}),
    "hf-dinov2-reg": ("Dinov2WithRegistersForImageClassification", "Dinov2WithRegistersConfig",  # with-registers-base
                      {"num_labels": 1000, "image_size": 518, "patch_size": 14, "num_register_tokens": 4},
                      "BitImageProcessor", {"size": {"shortest_edge": 256},
                                            "crop_size": {"height": 224, "width": 224}}),
    "hf-deit": ("DeiTForImageClassificationWithTeacher", "DeiTConfig", {"num_labels": 1000},  # deit-base-distilled-p16
                "DeiTImageProcessor", {"size": {"height": 256, "width": 256},
                                       "crop_size": {"height": 224, "width": 224}}),
    "hf-beit": ("BeitForImageClassification", "BeitConfig", {"num_labels": 1000,  # microsoft/beit-base-patch16-224
                                                             "use_relative_position_bias": True},
                "BeitImageProcessor", {"size": {"height": 224, "width": 224}}),
    "hf-clip": ("CLIPVisionModel", "CLIPVisionConfig", {"patch_size": 16},  # openai/clip-vit-base-patch16's tower
                "CLIPImageProcessor", {"size": {"shortest_edge": 224}, "crop_size": {"height": 224, "width": 224}}),
    "hf-siglip": ("SiglipVisionModel", "SiglipVisionConfig", {},  # google/siglip-base-patch16-224's tower
                  "SiglipImageProcessor", {"size": {"height": 224, "width": 224}}),
}
# family: timm's model name (its published pretrained_cfg travels in the saved config.json)
TIMM = {"timm-vit": "vit_base_patch16_224", "timm-deit": "deit_base_distilled_patch16_224",
        "timm-dinov2": "vit_base_patch14_dinov2", "timm-eva02": "eva02_base_patch14_224"}
FAMILIES = (*HF, *TIMM)
MAPS = ("attention", "rollout", "class")


def save(family: str, folder: Path) -> None:
    """The family's model at its real size, random weights, saved by its own library."""
    import torch

    torch.manual_seed(0)
    if family in HF:
        import transformers

        model, config, fields, processor, settings = HF[family]
        getattr(transformers, model)(getattr(transformers, config)(**fields)).save_pretrained(folder)
        getattr(transformers, processor)(**settings).save_pretrained(folder)
    else:
        import timm
        from timm.models import _hub

        _hub.save_for_hf(timm.create_model(TIMM[family], pretrained=False), folder, safe_serialization=True)


def open_road(family: str, folder: Path, road: str):
    """The checkpoint of ``folder`` by ``road``: "port" (what ``vit.load`` opens for a family with a port) or
    "library" (the library road's own opening, called directly: ``vit.load`` keeps the port where there is one)."""
    import vit

    if road == "port":
        return vit.load(folder, device="cpu")
    from vit.sources import open as opening

    config_json = opening.read_json(folder / "config.json")
    if family in HF:
        from vit.sources.library_road import transformers_models

        return transformers_models.open_library(folder, config_json, opening.hf_image_processor(folder))
    from safetensors.torch import load_file

    from vit.sources.library_road import timm_models
    from vit.sources.ports.libraries import import_timm

    name, args = config_json["architecture"], opening.timm_model_args(config_json)
    return timm_models.open_timm_library(
        folder, load_file(folder / "model.safetensors"), name, config_json, args,
        lambda stand_in: import_timm.preprocessing_from_timm(name, stand_in, config_json.get("pretrained_cfg") or {},
                                                             args))


def draw(checkpoint, image, method: str):
    import vit

    if method == "attention":
        return vit.explain(checkpoint, image, "attention", layer=-1, query=0)
    if method == "class":
        return vit.explain(checkpoint, image, "class", target=0)
    return vit.explain(checkpoint, image, "rollout")


def the_image():
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8))


MEASURE = r'''
import sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import torch
torch.set_num_threads(int(sys.argv[6]))
import peak_memory
from bench import bench_roads
from pathlib import Path
checkpoint = bench_roads.open_road(sys.argv[3], Path(sys.argv[4]), sys.argv[5])
image = bench_roads.the_image()
bench_roads.draw(checkpoint, image, sys.argv[7])  # warm: what a first call allocates once (threads, caches)
before = peak_memory.start()
bench_roads.draw(checkpoint, image, sys.argv[7])
print(peak_memory.peak() - before)
'''


def peak_bytes(family: str, folder: Path, road: str, method: str, threads: int) -> int:
    """The map's resident-set peak over what the process held before it, in a fresh process."""
    sys.path.insert(0, str(ROOT / "tests"))
    import peak_memory

    done = subprocess.run([sys.executable, "-c", MEASURE, str(ROOT), str(ROOT / "tests"), family, str(folder), road,
                           str(threads), method], capture_output=True, text=True, env=peak_memory.environment(),
                          cwd=ROOT, timeout=1800)
    if done.returncode:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "the measurement failed")
    return int(done.stdout.split()[-1])


def measure(roads: dict, maps: dict, family: str, folder: Path, method: str, image, args) -> dict:
    """One (family, map) row: both roads timed, interleaved, their memory each in a fresh process."""
    import numpy as np

    gap = float(np.abs(maps["port"] - maps["library"]).max() / max(np.abs(maps["port"]).max(), 1e-30))
    times = {"port": [], "library": []}
    for i in range(args.repeats):
        for road in (("port", "library") if i % 2 == 0 else ("library", "port")):
            start = time.perf_counter()
            draw(roads[road], image, method)
            times[road].append(time.perf_counter() - start)
    pairs = statistics.median(lib / port for lib, port in zip(times["library"], times["port"], strict=True))
    row = {"family": family, "map": method, "port_ms": 1000 * statistics.median(times["port"]),
           "library_ms": 1000 * statistics.median(times["library"]), "pairs": pairs,
           "map_gap": gap, "load": os.getloadavg()[0]}
    if not args.no_memory:
        for road in ("port", "library"):
            row[f"{road}_mb"] = peak_bytes(family, folder, road, method, args.threads) / 2**20
    memory = ("" if args.no_memory else f" | {row['port_mb']:7.1f} MB | {row['library_mb']:7.1f} MB | "
                                        f"{row['library_mb'] / max(row['port_mb'], 1e-9):5.2f}x")
    print(f"| {family:13} | {method:9} | {row['port_ms']:7.0f} ms | {row['library_ms']:7.0f} ms | "
          f"{row['library_ms'] / row['port_ms']:5.2f}x | pairs {pairs:5.2f}x{memory} | map gap "
          f"{gap:.1e} | load {row['load']:.1f} |", flush=True)
    return row


def one_line(error: Exception) -> str:
    """An error's first line, its kind named, for a row."""
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7, help="calls of each road per map (interleaved)")
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    p.add_argument("--maps", nargs="+", default=list(MAPS), choices=MAPS)
    p.add_argument("--no-memory", action="store_true", help="times only")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    rows = []
    print("| family | map | port | library | library/port | pairs | port peak | library peak | library/port | "
          "map gap (share of max) | load |", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families:
            folder = Path(tmp) / family
            save(family, folder)
            roads, refused = {}, {}
            for road in ("port", "library"):
                try:
                    roads[road] = open_road(family, folder, road)
                except Exception as e:  # a road that refuses the family is a finding: its one line goes in the row
                    refused[road] = one_line(e)
            image = the_image()
            for method in args.maps:
                maps, failed = {}, dict(refused)
                for road, checkpoint in roads.items():  # warm, and the maps compared
                    try:
                        maps[road] = draw(checkpoint, image, method).map
                    except Exception as e:  # a map one road refuses: said in the row, the other road not timed
                        failed[road] = one_line(e)
                if failed:
                    rows.append({"family": family, "map": method, "refused": failed, "load": os.getloadavg()[0]})
                    said = "; ".join(f"{road} road refuses: {line}" for road, line in failed.items())
                    print(f"| {family:13} | {method:9} | {said} | load {rows[-1]['load']:.1f} |", flush=True)
                else:
                    rows.append(measure(roads, maps, family, folder, method, image, args))
                if args.json:  # after each row, so a long run stopped early keeps what it measured
                    args.json.write_text(json.dumps(rows, indent=1))
            del roads
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))



if __name__ == "__main__":
    main()
