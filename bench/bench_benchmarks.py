"""Chefer et al.'s segmentation test: our one command against the authors' script, one method per run, side by side.

    python bench/bench_benchmarks.py                       # 16 images, ViT-Ti/16-shaped random model, 224 px
    python bench/bench_benchmarks.py --images 32 --width 384 --heads 6 --out bench/results/cpu-2026-11-25/benchmarks.txt

The authors' side is their ``imagenet_seg_eval.py`` (tests/reference/chefer_eval, verbatim): its ``eval_batch`` and
totals loop, run once per method as their script runs (``--method rollout``, ``full_lrp``, ``transformer_attribution``,
``lrp_last_layer``, ``attn_gradcam``; batch size 1, their evaluator's forward per image), with their generators on
their models (tests/reference/chefer) holding our random weights. Their ``get_f1_scores`` (mF1, which neither side
reports here; seconds per image) is left out, as in tests/test_faithfulness_chefer.py. Our side is
``vit.explain.benchmarks.benchmark_run.score_items``, what ``python -m vit.faithfulness --benchmark segmentation`` runs:
every method in one pass over the set, ``--batch-size`` images per forward. Both read the same normalised 224 px images
and masks already in memory (no file reading timed on either side) and take the model as built (no start-up timed).
Prints images/s per method on each side, the ratio, the totals and the largest score difference (pixel accuracy, mIoU,
mAP), which should be ~1e-5 (float32 sums in another order) for every method: rollout and transformer_attribution start
at the second layer on both sides (their ``start_layer=1``, ``faithfulness.CHEFER_START_LAYER``). The result file of
2026-11-25 was taken before that, when ours started at the first (its two gaps of 1e-2 and 2e-3). """

from __future__ import annotations

import argparse
import ast
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.reference.chefer_eval import metrices  # noqa: E402
from vit.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from vit.core.images import normalize, to_uint8  # noqa: E402
from vit.explain.benchmarks import benchmark_run  # noqa: E402
from vit.model import ViT, ViTConfig  # noqa: E402

METHODS = {"rollout": "rollout", "lrp-full": "full_lrp", "transformer_attribution": "transformer_attribution",
           "lrp-partial": "lrp_last_layer", "attn-gradcam": "attn_gradcam"}  # ours: their --method
SCRIPT = ROOT / "tests" / "reference" / "chefer_eval" / "imagenet_seg_eval.py"


def script_parts(names: tuple[str, ...]) -> str:
    """Their script's top-level statements that define or run ``names`` (the loop: "for"), unchanged."""
    text = SCRIPT.read_text()

    def keep(node) -> bool:
        if isinstance(node, ast.FunctionDef):
            return node.name in names
        if isinstance(node, ast.Assign):
            return any(isinstance(t, ast.Tuple) and any(getattr(e, "id", None) in names for e in t.elts)
                       for t in node.targets)
        return isinstance(node, ast.For) and "for" in names

    return "\n\n".join(ast.get_source_segment(text, node) for node in ast.parse(text).body if keep(node))


class Progress(list):
    """Their loop's tqdm: iterable, with set_description."""

    def set_description(self, text: str) -> None:
        self.description = text


def world(count: int, width: int, depth: int, heads: int, folder: Path):
    """Our checkpoint of a random ViT-B/16-shaped model (224 px, 16 px patches, ``width`` wide) and ``count`` smooth
    random images with blob masks."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_chefer_baselines import random_vit

    config = ViTConfig(image_size=224, patch_size=16, num_classes=10, hidden_size=width, num_layers=depth,
                       num_heads=heads, mlp_size=4 * width)
    checkpoint = load_checkpoint(save_checkpoint(folder / "m.pt", random_vit(config), [str(i) for i in range(10)]))
    g = torch.Generator().manual_seed(0)
    small = torch.rand(count, 3, 7, 7, generator=g)
    pixels = (torch.nn.functional.interpolate(small, size=224, mode="bilinear") * 255).round().to(torch.uint8)
    images = [Image.fromarray(p.permute(1, 2, 0).numpy()) for p in pixels]
    ys, xs = torch.meshgrid(torch.arange(224.0), torch.arange(224.0), indexing="ij")
    centres, radii = torch.rand(count, 2, generator=g) * 224, 30 + torch.rand(count, generator=g) * 60
    masks = ((ys - centres[:, None, None, 0]) ** 2 + (xs - centres[:, None, None, 1]) ** 2
             < radii[:, None, None] ** 2).long()
    return checkpoint, images, masks


def theirs(model: ViT, x: torch.Tensor, masks: torch.Tensor, method: str) -> tuple[dict, float]:
    """Their script's loop for one ``--method`` over ``x`` (normalised, one image per batch as theirs): the scores
    and the seconds."""
    from test_chefer_baselines import reference

    from tests.reference.chefer import ViT_LRP, ViT_new, ViT_orig_LRP
    from tests.reference.chefer.ViT_explanation_generator import LRP, Baselines

    evaluator = reference(model, ViT_new)
    namespace = {name: getattr(metrices, name) for name in metrices.__all__}
    namespace.update(np=np, torch=torch, F=torch.nn.functional, batch_size=1, baselines=Baselines(evaluator),
                     lrp=LRP(reference(model, ViT_LRP)), orig_lrp=LRP(reference(model, ViT_orig_LRP)),
                     args=argparse.Namespace(method=method, save_img=False, thr=0.0, is_ablation=False),
                     iterator=Progress((image[None].clone(), m[None]) for image, m in zip(x, masks, strict=True)))
    namespace["get_f1_scores"] = lambda predict, target: 0.0  # mF1: not reported by either side
    namespace["model"] = evaluator
    code = compile(script_parts(("eval_batch", "total_inter", "total_ap", "predictions", "for")), str(SCRIPT), "exec")
    began = time.perf_counter()
    exec(code, namespace)  # noqa: S102 - the authors' script, verbatim
    seconds = time.perf_counter() - began
    return {"pixel_accuracy": float(namespace["pixAcc"]), "mIoU": float(namespace["mIoU"]),
            "mAP": float(namespace["mAp"])}, seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=16)
    p.add_argument("--width", type=int, default=192, help="hidden size (ViT-Ti 192, ViT-S 384, ViT-B 768)")
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--heads", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16, help="our images per forward")
    p.add_argument("--out", type=Path, help="also write the table here")
    args = p.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint, images, masks = world(args.images, args.width, args.depth, args.heads, Path(tmp))
    model = checkpoint.model.eval()
    pre = checkpoint.preprocessing
    x = normalize(torch.stack([to_uint8(im, (224, 224), 3, resample=pre.resample, backend=pre.backend)
                               for im in images]), pre.mean, pre.std)

    settings = benchmark_run.Settings("segmentation", tuple(METHODS), batch_size=args.batch_size)
    items = list(zip(images, [Image.fromarray((m.numpy() * 255).astype(np.uint8)) for m in masks], strict=True))
    began = time.perf_counter()
    batches = benchmark_run.score_items(checkpoint, settings, items, read=lambda item: item)
    ours_total = time.perf_counter() - began
    ours = benchmark_run.report(settings, batches, {"checkpoint": "random", "data": "memory"})["methods"]

    torch.Tensor.cuda = lambda self, *a, **k: self  # their script's .cuda() on a CPU: the tensor itself
    lines = [f"# Chefer's segmentation test, {args.images} images at 224 px, random ViT ({args.depth} layers, width "
             f"{args.width}, {args.heads} heads, patch 16), torch threads {torch.get_num_threads()}, "
             f"{os.cpu_count()} CPUs; ours batch {args.batch_size}, theirs batch 1 (their script), one method per "
             "run", "",
             "| method | ours images/s | theirs images/s | ours / theirs | largest score difference |",
             "|---|---|---|---|---|"]
    their_total = 0.0
    for ours_name, their_name in METHODS.items():
        scores, seconds = theirs(model, x, masks, their_name)
        their_total += seconds
        gap = max(abs(scores[k] - ours[ours_name][k]) for k in scores)
        rate = ours[ours_name]["images_per_s"]
        lines.append(f"| {ours_name} ({their_name}) | {rate:.2f} | {args.images / seconds:.2f} | "
                     f"{rate * seconds / args.images:.2f} | {gap:.1e} |")
    lines += ["", f"every method, one command: {ours_total:.1f} s; their script once per method: {their_total:.1f} s "
                  f"({their_total / ours_total:.2f} x)"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
