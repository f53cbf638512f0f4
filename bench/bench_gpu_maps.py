"""Maps per second on a GPU: the rollout row, the class map, LeGrad and AttnLRP of ViT-B/16 and ViT-L/16 (random
weights) at several input sizes and batch sizes, beside LeGrad's authors' code and lxt's AttnLRP rules on the same
device and weights, and ``vit.analyze`` writing a dataset's maps.

Run from the repository root (the script puts its checkout first on the path)::

    python bench/bench_gpu_maps.py --budget-s 420 --out maps.md    # on a GPU: the cells that fit 7 minutes
    python bench/bench_gpu_maps.py --device cpu --models vit-b16 --sizes 32 --batches 1,2 --repeats 1   # seconds

Every side runs one model's weights, built as ``bench_relevance.build_pair`` builds them: HF transformers' ViT
(eager attention) with random weights plus noise, and ours converted from it. Everything runs in float32 with TF32
off (matrix products and cuDNN's convolution): the precision in which the maps are checked against the authors'
to 1e-4 of each map's peak; bf16 would be faster on both sides and is not measured here.

Ours (the engine's batched functions, as a script or the notebook would call them on a batch):

- ``rollout``: one forward keeping every layer's attention, ``attention.rollout_factor`` per layer and the CLS
  row of their product (``attention.rollout_rows``), on the patch grid.
- ``classmap``: the class-specific gradient rollout (Chefer et al. 2021): ``attention.class_gradients``,
  ``positive_gradient_attention`` per layer, the CLS row of the relevance (``relevance_rollout_row``).
- ``legrad``: ``relevance.legrad`` (the last two layers; memory bounded: chunks of ``CHUNK_BYTES``).
- ``attnlrp``: ``relevance.attnlrp``, the pixel map.

The authors' (``bench_relevance``'s, on HF's ViT):

- ``legrad-authors``: WalBouss/LeGrad's ``compute_legrad`` (vendored in tests/reference). It explains one image
  (its map is ``reshape(1, prompts, h, w)``): a batch of B is B calls, as its user would run a dataset.
- ``attnlrp-lxt``: lxt's AttnLRP rules patched into HF's ViT (vendored in tests/reference; the patches are
  undone after each cell), one forward and one backward of the sum of every image's class logit (the images are
  independent, so each image's input x gradient is its own map).

Each image of a batch explains its own class (``index % classes``); the inputs are random pixels.

Columns: ``maps/s``: batch x repeats / the seconds between ``torch.cuda.synchronize`` calls around the timed
repeats, after one untimed warm-up call (allocation, cuDNN's choice); ``peak MiB``: ``torch.cuda.max_memory_allocated``
during the cell less what was allocated before it (both models' weights and the input batch): the memory the maps
themselves take (n/a on the CPU); ``ours / authors``: on an authors' row, our method's maps/s over theirs and our
peak over theirs; ``agree``: every image's map of the warm-up call against ours (``bench_relevance.check_agree``:
LeGrad upsampled and min-max normalised as its authors return it; both maps divided by the authors' peak first, so
the tolerance, rtol = atol = 1e-4, is relative to the map); ``note``: ``OOM`` (the device ran out of memory),
``refused: ...`` (a method's own bound, its one-line message), ``failed: ...`` (another error of the device's,
e.g. a kernel's limit on a tensor's size), ``skipped: ...`` (over ``--budget-s``), or how many repeats were timed
when fewer than ``--repeats`` fitted ``--cell-s``.

The cells run in order of cost (ViT-B/16 at 224 px first, batch 1 before batch 64), so that ``--budget-s`` (the
whole run's seconds) cuts the costliest; a batch is skipped when batch 1's rate says it would not fit what is left.
``--out FILE`` rewrites the markdown table (FILE) and every cell as JSON (FILE with ``.json``) after each cell: a
killed run keeps what it measured.

The ``vit.analyze`` row: ``python -m vit.analyze`` on a folder of ``--analyze-images`` random JPEGs with ViT-B/16 at
224 px saved as a checkpoint, on the same device, ``--batch-size 64``: images (each one's rollout and attention
maps and statistics) per second of the whole command, start-up, decoding and the report included. It needs
plotly (the report's figures); without it the row says so.

Measured once, on an H100 (torch 2.11, 2026-11-24, ``--budget-s 330``): bench/results/h100-2026-11-24/gpu_maps.md,
summarised in the README (the device had no plotly: no ``vit.analyze`` row yet).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a clean checkout, or loaded by a test
sys.path.insert(0, str(ROOT / "bench"))
from bench_relevance import authors_attnlrp, authors_legrad, build_pair, check_agree  # noqa: E402

from vit.core.runfiles import atomic_write_text  # noqa: E402
from vit.costs.bounds import forward_flops  # noqa: E402
from vit.model import PRESETS, ViT  # noqa: E402

MODELS = {"vit-b16": "vit-base-16", "vit-l16": "vit-large-16"}  # any other preset name is taken as it is
OURS = ("rollout", "classmap", "legrad", "attnlrp")
AUTHORS = {"legrad-authors": "legrad", "attnlrp-lxt": "attnlrp"}  # the authors' side -> our method it checks
METHODS = (*OURS, *AUTHORS)
TOLERANCE = 1e-4  # check_agree's rtol and atol, on maps divided by the authors' peak


# --- the maps: each a run(images (B, C, H, W), classes (B,)) -> maps (B, ...) --------------------------------------

def _patches(model: ViT, tokens, images: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` per-token values -> ``(B, gh, gw)`` over the patches."""
    gh, gw = model.patch_grid(images.shape[2], images.shape[3])
    return tokens[:, model.num_prefix_tokens:].reshape(tokens.shape[0], gh, gw)


def our_rollout(model: ViT):
    from vit.explain.methods.attention import rollout_factor, rollout_rows

    def run(x, classes):
        with torch.inference_mode():
            attentions = list(model(x, output_attentions=True)[1])  # (B, H, T, T) per layer
            factors = []
            for i in range(len(attentions)):  # each attention freed once its factor is formed
                factors.append(rollout_factor(attentions[i], num_prefix_tokens=model.num_prefix_tokens))
                attentions[i] = None
            return _patches(model, rollout_rows(factors, 0), x)

    return run


def our_classmap(model: ViT):
    from vit.explain.methods.attention import class_gradients, positive_gradient_attention, relevance_rollout_row

    def run(x, classes):
        _, attentions, gradients = class_gradients(model, x, classes)
        attentions, gradients = list(attentions), list(gradients)
        terms = []
        for i in range(len(attentions)):
            terms.append(positive_gradient_attention(attentions[i], gradients[i]))  # (B, T, T)
            attentions[i] = gradients[i] = None
        return _patches(model, relevance_rollout_row(terms, 0), x)

    return run


def our_legrad(model: ViT):
    from vit.explain.methods.relevance import legrad

    return lambda x, classes: legrad(model, x, classes)


def our_attnlrp(model: ViT):
    from vit.explain.methods.relevance import attnlrp

    return lambda x, classes: attnlrp(model, x, classes)


def legrad_each_image(hf: torch.nn.Module, model: ViT):
    """The authors' LeGrad (``bench_relevance.authors_legrad``) once per image: ``(B, 1, H, W)``."""
    one = authors_legrad(hf, model)
    return lambda x, classes: torch.cat([one(x[i:i + 1], classes[i:i + 1]) for i in range(x.shape[0])])


@contextlib.contextmanager
def lxt_rules(hf: torch.nn.Module, model: ViT):
    """lxt's rules patched into HF's ViT by ``bench_relevance.authors_attnlrp`` (which patches ``torch.nn.LayerNorm``
    for the whole process) for the length of the block, then undone: ours runs unpatched. Yields the batched run."""
    import transformers.models.vit.modeling_vit as modeling_vit
    from transformers.activations import GELUActivation

    saved = (torch.nn.LayerNorm.forward, GELUActivation.forward, modeling_vit.eager_attention_forward)
    authors_attnlrp(hf, model)  # the patches; its run reads image 0 only, the batched one is below

    def run(x, classes):
        with torch.enable_grad():
            x = x.clone().requires_grad_(True)
            hf(pixel_values=x).logits.gather(1, classes[:, None]).sum().backward()  # images independent
            return (x * x.grad).sum(1)  # (B, H, W)

    try:
        yield run
    finally:
        torch.nn.LayerNorm.forward, GELUActivation.forward, modeling_vit.eager_attention_forward = saved
        with contextlib.suppress(AttributeError):
            del GELUActivation.original_forward


BUILD = {"rollout": our_rollout, "classmap": our_classmap, "legrad": our_legrad, "attnlrp": our_attnlrp}


# --- one cell -------------------------------------------------------------------------------------------------------

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def is_oom(error: BaseException) -> bool:
    return isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)) or (
        isinstance(error, RuntimeError) and any(s in str(error) for s in ("out of memory", "ALLOC_FAILED")))


def first_line(error: BaseException, limit: int = 160) -> str:
    line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return line if len(line) <= limit else line[:limit - 1] + "…"


def measure(run, x: torch.Tensor, classes: torch.Tensor, repeats: int, cell_s: float, device: torch.device
            ) -> dict:
    """One warm-up call (its maps kept for the check), then up to ``repeats`` timed calls, as many as fit
    ``cell_s`` seconds at the warm-up's pace (at least one)."""
    sync(device)
    if device.type == "cuda":
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    maps = run(x, classes)
    sync(device)
    warm = time.perf_counter() - start
    maps = maps.detach().float().cpu()
    timed = max(1, min(repeats, int(cell_s / max(warm, 1e-9))))
    sync(device)
    start = time.perf_counter()
    for _ in range(timed):
        run(x, classes)
    sync(device)
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20 if device.type == "cuda" else None
    return {"maps_per_s": x.shape[0] * timed / seconds, "peak_mib": peak, "repeats": timed, "warmup_s": warm,
            "maps": maps}


def agreement(method: str, ours: torch.Tensor, theirs: torch.Tensor, patch_size: int) -> tuple[bool, str]:
    """Every image's map against the authors' (``check_agree``), both divided by the authors' map's peak."""
    against = next(a for a, o in AUTHORS.items() if o == method)
    for i in range(theirs.shape[0]):
        scale = theirs[i].abs().max().clamp_min(1e-30)
        try:
            check_agree(method, against, ours[i:i + 1] / scale, theirs[i] / scale, patch_size)
        except AssertionError as e:
            greatest = next((line.strip() for line in str(e).splitlines() if "Greatest absolute" in line), "")
            return False, f"image {i}: {greatest or first_line(e)}"
    return True, f"{theirs.shape[0]} map(s) within {TOLERANCE:g} of the peak"


# --- the table ------------------------------------------------------------------------------------------------------

def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def markdown(header: list[str], cells: list[dict]) -> str:
    lines = [*header, "", "| model | px | batch | method | maps/s | peak MiB | ours / authors (maps/s, peak) | agree "
             "| note |", "|---|---:|---:|---|---:|---:|---|---|---|"]
    for c in cells:
        rate = fmt(c.get("maps_per_s"), ",.1f") if "maps_per_s" in c else "—"
        peak = fmt(c.get("peak_mib"), ",.0f") if "maps_per_s" in c else "—"
        ratio = ""
        if c.get("speedup") is not None:
            ratio = f"{c['speedup']:.2f}x, " + (f"{c['memory_ratio']:.2f}x" if c.get("memory_ratio") else "n/a")
        agree = {True: "yes", False: "NO", None: ""}[c.get("agree")]
        note = "; ".join(x for x in (c.get("note", ""), c.get("agree_detail", "") if c.get("agree") is False else "")
                         if x)
        lines.append(f"| {c['model']} | {c.get('px', '')} | {c.get('batch', '')} | {c['method']} | {rate} | {peak} "
                     f"| {ratio} | {agree} | {note} |")
    return "\n".join(lines) + "\n"


def write(out: Path | None, header: list[str], cells: list[dict]) -> None:
    if out is None:
        return
    atomic_write_text(out, markdown(header, cells))
    atomic_write_text(out.with_suffix(".json"), json.dumps({"header": header, "cells": cells}, indent=1) + "\n")


# --- vit.analyze ------------------------------------------------------------------------------------------------------

def analyze_row(model: ViT, count: int, device: torch.device, timeout: float) -> dict:
    """``python -m vit.analyze`` on ``count`` random 256 px JPEGs in 4 class folders, ``model`` saved as a
    checkpoint: images per second of the whole command."""
    import numpy as np
    from PIL import Image

    from vit.checkpoint import save_checkpoint

    cell = {"model": "vit.analyze", "method": f"{count} JPEGs, whole command", "batch": 64,
            "px": model.config.image_size}
    if importlib.util.find_spec("plotly") is None:
        return {**cell, "note": "skipped: plotly is not installed here (vit.analyze draws its report with it)"}
    with tempfile.TemporaryDirectory(prefix="bench-maps-") as tmp:
        tmp = Path(tmp)
        classes = [f"class{i}" for i in range(model.config.num_classes)]
        save_checkpoint(tmp / "model.pt", model, classes)
        rng = np.random.default_rng(0)
        for i in range(count):
            folder = tmp / "data" / classes[i % 4]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)).save(folder / f"{i}.jpg", quality=90)
        command = [sys.executable, "-m", "vit.analyze", str(tmp / "model.pt"), "--data", str(tmp / "data"),
                   "--out", str(tmp / "out"), "--batch-size", "64", "--device", device.type]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        start = time.perf_counter()
        try:
            proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=None if math.isinf(timeout) else timeout)
        except subprocess.TimeoutExpired:
            return {**cell, "note": f"skipped: over the {timeout:.0f} s left of --budget-s"}
        seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return {**cell, "note": f"failed ({proc.returncode}): {tail[:200]}"}
    return {**cell, "maps_per_s": count / seconds, "peak_mib": None, "note": f"{seconds:.1f} s in all"}


# --- the run ----------------------------------------------------------------------------------------------------------

def image_flops(model_name: str, size: int) -> int:
    """One image's forward FLOP (``vit.costs.bounds.forward_flops``): the cost the cells are ordered and estimated
    by."""
    config = PRESETS[MODELS.get(model_name, model_name)]
    return forward_flops(config, 1 + (size // config.patch_size) ** 2)


def groups(models: list[str], sizes: list[int]) -> list[tuple[str, int]]:
    """(model, size) pairs, cheapest forward first."""
    return sorted(((m, s) for m in models for s in sizes), key=lambda pair: image_flops(*pair))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", default="vit-b16,vit-l16", help="comma-separated: vit-b16, vit-l16 or a preset name")
    p.add_argument("--sizes", default="224,448,1024", help="input sides in px (the models are built at each)")
    p.add_argument("--batches", default="1,64")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of: {', '.join(METHODS)}")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per cell, after one warm-up (default 5)")
    p.add_argument("--cell-s", type=float, default=3.0, help="fewer repeats when these would take longer than "
                   "this many seconds at the warm-up's pace (default 3)")
    p.add_argument("--budget-s", type=float, default=None, help="the whole run's seconds: the cells that would go "
                   "past it are skipped with a note (default: no limit)")
    p.add_argument("--analyze-images", type=int, default=512, help="images for the vit.analyze row (0: leave out)")
    p.add_argument("--out", type=Path, help="rewrite the markdown table here and the cells as JSON beside it "
                   "(.json) after every cell")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    args = p.parse_args(argv)
    start = time.perf_counter()
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in METHODS] + [m for m in args.models.split(",")
                                                           if MODELS.get(m, m) not in PRESETS]
    if unknown:
        p.error(f"unknown method or model: {', '.join(unknown)}")
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 on both sides: the precision of the check
    torch.backends.cudnn.allow_tf32 = False
    if device.type == "cuda":
        name = f"{torch.cuda.get_device_name(device)}, " \
            f"{torch.cuda.get_device_properties(device).total_memory / 2**30:.0f} GiB"
    else:
        name = f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"
    header = [f"# Maps per second: {name}",
              "", f"torch {torch.__version__}, float32 (TF32 off), load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, {time.strftime('%Y-%m-%d %H:%M')}",
              "", "`python bench/bench_gpu_maps.py " + " ".join(argv if argv is not None else sys.argv[1:]) + "`"]
    print("\n".join(header), flush=True)

    def left() -> float:
        return math.inf if args.budget_s is None else args.budget_s - (time.perf_counter() - start)

    cells: list[dict] = []
    batches = sorted(int(b) for b in args.batches.split(","))
    # method -> (maps/s at batch 1, forward FLOP per image then): a cell's seconds estimated before it runs
    rate_one: dict[str, tuple[float, int]] = {}
    for n, (model_name, size) in enumerate(groups(args.models.split(","), [int(s) for s in args.sizes.split(",")])):
        base = {"model": model_name, "px": size}
        flops = image_flops(model_name, size)
        if left() <= 0:
            cells += [{**base, "batch": b, "method": m, "note": "skipped: over --budget-s"}
                      for b in batches for m in methods]
            write(args.out, header, cells)
            continue
        hf, model = build_pair(MODELS.get(model_name, model_name), size)
        hf, model = hf.to(device), model.to(device)
        c = model.config
        for batch in batches:
            g = torch.Generator().manual_seed(batch)
            x = torch.randn(batch, c.num_channels, size, size, generator=g).to(device)
            classes = (torch.arange(batch) % c.num_classes).to(device)
            ours: dict[str, dict] = {}
            for method in methods:
                cell = {**base, "batch": batch, "method": method}
                estimate = 0.0  # a warm-up and one repeat at batch 1's last rate, scaled by the forward's FLOP
                if method in rate_one:
                    rate, then = rate_one[method]
                    estimate = 2 * batch * flops / then / rate
                if left() <= estimate:
                    cell["note"] = "skipped: over --budget-s" + (
                        f" (about {estimate:.1f} s at batch 1's last rate, {left():.1f} s left)" if left() > 0 else "")
                else:
                    cell.update(run_cell(method, hf, model, x, classes, args.repeats,
                                         min(args.cell_s, max(left(), 0.0)), device))
                maps = cell.pop("maps", None)
                if method in OURS and maps is not None:
                    ours[method] = {"maps": maps, **cell}
                if method in AUTHORS and maps is not None and AUTHORS[method] in ours:
                    mine = ours[AUTHORS[method]]
                    cell["agree"], cell["agree_detail"] = agreement(AUTHORS[method], mine["maps"], maps, c.patch_size)
                    cell["speedup"] = mine["maps_per_s"] / cell["maps_per_s"]
                    if mine["peak_mib"] and cell["peak_mib"]:
                        cell["memory_ratio"] = mine["peak_mib"] / cell["peak_mib"]
                if batch == 1 and "maps_per_s" in cell:
                    rate_one[method] = (cell["maps_per_s"], flops)
                cells.append(cell)
                print(markdown([], [cell]).splitlines()[-1], flush=True)
                write(args.out, header, cells)
                free(device)
            del x, classes, ours
        del hf
        if n == 0 and args.analyze_images > 0:  # after the most important cells, with their model
            try:
                row = analyze_row(model.cpu(), args.analyze_images, device, max(left(), 1.0))
            except Exception as e:  # noqa: BLE001 - the row's note; the table goes on
                row = {"model": "vit.analyze", "method": "whole command", "note": f"failed: {first_line(e)}"}
            cells.append(row)
            print(markdown([], cells[-1:]).splitlines()[-1], flush=True)
            write(args.out, header, cells)
        del model
        free(device)
    print()
    print(markdown(header, cells))
    return 0


def run_cell(method: str, hf: torch.nn.Module, model: ViT, x: torch.Tensor, classes: torch.Tensor, repeats: int,
             cell_s: float, device: torch.device) -> dict:
    """``measure`` one method; an OOM, a method's refusal (its ValueError) or another error of the device (a kernel's
    limit on a tensor's elements at thousands of tokens, say) becomes the cell's note, and the run goes on."""
    note = None
    try:
        if method == "attnlrp-lxt":
            with lxt_rules(hf, model) as run:
                result = measure(run, x, classes, repeats, cell_s, device)
        else:
            run = legrad_each_image(hf, model) if method == "legrad-authors" else BUILD[method](model)
            result = measure(run, x, classes, repeats, cell_s, device)
    except ValueError as e:
        note = f"refused: {first_line(e)}"
    except (RuntimeError, MemoryError) as e:
        note = "OOM" if is_oom(e) else f"failed: {type(e).__name__}: {first_line(e)}"
    if note is not None:  # the exception's frames (and their tensors) are gone here
        free(device)
        return {"note": note}
    if result["repeats"] < repeats:
        result["note"] = f"{result['repeats']} repeat(s)"
    return result


if __name__ == "__main__":
    raise SystemExit(main())
