"""Is SAE attribution faithful? Deleting an image's top-k attributed latents against deleting k random active ones.

For each image, ``vit.features.attribution.feature_attribution`` splits the predicted class's logit among the SAE's
latents at its layer (with the SAE spliced in as reconstruction plus error). Then the same splice runs with latents
zeroed (``vit.features.explore.intervene``: the layer's output becomes ``decode(f with them zeroed) + error``, at every
token, through the model's own hook point), once for the k latents of the largest share (``.top(k)``) and ``--draws``
times for k latents drawn at random among those active anywhere in the image, for each k of ``--ks``. A faithful
attribution drops the target logit (and its probability) more when its top latents go than when random ones do; the
k latents of the largest activation summed over the image's tokens are a second, harder control (is the gradient
worth more than the activation alone?).

    python scripts/prepare_data.py --shared ../shared/data --out data
    python scripts/held_out.py --dataset folder:data/cifar10 --val-fraction 0.1 --seed 0 --per-class 20 \\
        --out data/cifar10-heldout
    python -m vit.sae train checkpoints/cifar10-cifar-s.pt --data data/cifar10/train --layer 4 \\
        --expansion 8 --k 16 --epochs 5 --out runs/sae-cifar-s-l4
    python bench/bench_sae_attribution.py --sae runs/sae-cifar-s-l4 --images data/cifar10-heldout \\
        --out bench/results/cpu-2026-11-25/sae-attribution-deletion.txt

``--images``: the shipped classifier's own validation images (``held_out.py``), which it never trained on; any of
them the SAE trained on (its ``files.json``, compared by content) are left out and counted. Rows (one per image and
k) and the summary go to stdout and ``--out``. Not timed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vit.features.attribution import feature_attribution  # noqa: E402
from vit.features.autoencoder import SparseAutoencoder  # noqa: E402
from vit.features.explore import intervene  # noqa: E402

COLUMNS = ("image", "target", "logit", "prob", "k", "deleted", "active", "share_top", "drop_top", "pdrop_top",
           "drop_random", "drop_random_sd", "pdrop_random", "drop_strongest", "pdrop_strongest", "flip_top",
           "flip_random")


def deleted_logits(model: nn.Module, sae: SparseAutoencoder, image: Tensor, latents: Sequence[int]) -> Tensor:
    """``image`` ``(1, C, H, W)``'s logits ``(classes,)`` with ``latents`` zeroed at the SAE's layer, at every token,
    the reconstruction error kept (none zeroed: the model's own logits)."""
    return intervene(model, sae, image, dict.fromkeys(map(int, latents), 0.0), output_attentions=False).logits[0]


def random_latents(active: Tensor, count: int, generator: torch.Generator) -> list[int]:
    """``count`` of the ``active`` latents' indices drawn without replacement (all of them when fewer)."""
    return active[torch.randperm(len(active), generator=generator)[:count]].tolist()


def image_rows(model: nn.Module, sae: SparseAutoencoder, image: Tensor, name: str, ks: Sequence[int], draws: int,
               generator: torch.Generator) -> tuple[list[dict], float, float]:
    """One row per k for ``image`` (see ``COLUMNS``), and the splice's and the attribution's own errors: the largest
    logit change with nothing deleted, and |latents + bias + error - gradient times the stream|."""
    result = feature_attribution(model, sae, image)
    target = result.target
    with torch.no_grad():
        clean = model(image)[0][0]  # (classes,): the model without the SAE
        kept = deleted_logits(model, sae, image, [])
    splice_error = float((kept - clean).abs().max())
    totals = result.totals()
    sum_error = abs(totals["latents"] + totals["bias"] + totals["error"] - totals["total"])
    prob = clean.softmax(-1)[target]
    active = (result.latents > 0).any(dim=0).nonzero()[:, 0]  # latents active at some token of the image
    share = result.per_image()
    mass = result.latents.sum(dim=0)  # (d_sae,): each latent's activation summed over the tokens
    rows = []
    for k in ks:
        top = [latent for latent, _ in result.top(k)]  # the largest positive shares (fewer when fewer are positive)
        after = deleted_logits(model, sae, image, top)
        strongest = deleted_logits(model, sae, image, mass.topk(len(top)).indices.tolist())
        drops, pdrops, flips = [], [], []
        for _ in range(draws):
            other = deleted_logits(model, sae, image, random_latents(active, len(top), generator))
            drops.append(float(clean[target] - other[target]))
            pdrops.append(float(prob - other.softmax(-1)[target]))
            flips.append(int(other.argmax()) != target)
        rows.append({
            "image": name, "target": target, "logit": float(clean[target]), "prob": float(prob), "k": k,
            "deleted": len(top), "active": len(active), "share_top": float(share[top].sum()),
            "drop_top": float(clean[target] - after[target]), "pdrop_top": float(prob - after.softmax(-1)[target]),
            "drop_random": statistics.fmean(drops), "drop_random_sd": statistics.pstdev(drops),
            "pdrop_random": statistics.fmean(pdrops), "drop_strongest": float(clean[target] - strongest[target]),
            "pdrop_strongest": float(prob - strongest.softmax(-1)[target]),
            "flip_top": int(int(after.argmax()) != target), "flip_random": statistics.fmean(flips)})
    return rows, splice_error, sum_error


def sae_training_hashes(sae_folder: Path) -> set[str] | None:
    """SHA-256 of every image the SAE run trained on (its files.json under config.json's --data), None without them."""
    try:
        files = json.loads((sae_folder / "files.json").read_text())["train"]
        data = Path(json.loads((sae_folder / "config.json").read_text())["args"]["data"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not data.is_absolute():
        data = ROOT / data if not data.exists() else data
    return {hashlib.sha256((data / name).read_bytes()).hexdigest() for name in files if (data / name).is_file()}


def sae_metrics(sae_folder: Path) -> str:
    """The SAE's own held-out figures from its metrics.json, as one line ("" without them)."""
    try:
        m = json.loads((sae_folder / "metrics.json").read_text())
        return (f"the SAE on its {m['images']} held-out images: explained variance {m['explained_variance']:.3f}, "
                f"L0 {m['l0']:.1f}, top-1 agreement with the layer replaced by the reconstruction "
                f"{m['top1_agreement']:.3f}")
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def mean_sd_se(values: Sequence[float]) -> str:
    mean, sd = statistics.fmean(values), statistics.pstdev(values)
    return f"{mean:+.3f} (sd {sd:.3f}, se {sd / math.sqrt(len(values)):.3f})"


def mean_of(rows: list[dict], column: str) -> float:
    return statistics.fmean(r[column] for r in rows)


def summary(rows: list[dict], ks: Sequence[int]) -> list[str]:
    """Per k: the three deletions' logit drops (mean, sd and se over images), top-k minus random-k paired per image
    and how often it is positive, the probability drops and how often the predicted class changes."""
    lines = ["k | images | logit drop: top-k | random-k | strongest-k | top-k - random-k (paired) | top-k > random-k "
             "| top-k's summed share (the first-order drop) | probability drop: top-k / random-k / strongest-k "
             "| top-1 changed: top-k / random-k | deleted (mean)"]
    for k in ks:
        mine = [r for r in rows if r["k"] == k]
        diff = [r["drop_top"] - r["drop_random"] for r in mine]
        lines.append(
            f"{k} | {len(mine)} | {mean_sd_se([r['drop_top'] for r in mine])} | "
            f"{mean_sd_se([r['drop_random'] for r in mine])} | {mean_sd_se([r['drop_strongest'] for r in mine])} | "
            f"{mean_sd_se(diff)} | {sum(d > 0 for d in diff) / len(diff):.1%} | {mean_of(mine, 'share_top'):+.3f} | "
            f"{mean_of(mine, 'pdrop_top'):+.3f} / {mean_of(mine, 'pdrop_random'):+.3f} / "
            f"{mean_of(mine, 'pdrop_strongest'):+.3f} | "
            f"{mean_of(mine, 'flip_top'):.1%} / {mean_of(mine, 'flip_random'):.1%} | {mean_of(mine, 'deleted'):.2f}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="checkpoints/cifar10-cifar-s.pt", help="(relative: to the repo)")
    parser.add_argument("--sae", type=Path, required=True, help="an SAE folder of the checkpoint (vit.sae train's)")
    parser.add_argument("--images", type=Path, required=True, help="a folder of images (any depth)")
    parser.add_argument("--ks", default="1,2,4,8,16", help="latent counts deleted, comma-separated")
    parser.add_argument("--draws", type=int, default=10, help="random draws of k latents per image and k")
    parser.add_argument("--limit", type=int, default=None, help="at most this many images (in file order)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="also write the rows and the summary here")
    args = parser.parse_args(argv)
    ks = [int(k) for k in args.ks.split(",")]
    torch.set_num_threads(args.threads)

    from vit.core.images import open_image
    from vit.core.inference import preprocess
    from vit.features.formats import open_sae
    from vit.sources.open import open_source
    from vit.training.data import image_files

    checkpoint = open_source(ROOT / args.checkpoint)
    model = checkpoint.model.eval()
    sae = open_sae(str(args.sae)).eval().requires_grad_(False)
    files = image_files(args.images)
    seen = sae_training_hashes(args.sae)
    excluded = [f for f in files if seen and hashlib.sha256(f.read_bytes()).hexdigest() in seen]
    files = [f for f in files if f not in excluded][:args.limit]
    generator = torch.Generator().manual_seed(args.seed)
    rows, splice_errors, sum_errors = [], [], []
    start = time.perf_counter()
    for path in files:
        image = preprocess([open_image(path)], checkpoint.preprocessing)  # (1, C, H, W)
        mine, splice_error, sum_error = image_rows(model, sae, image, path.relative_to(args.images).as_posix(), ks,
                                                   args.draws, generator)
        rows += mine
        splice_errors.append(splice_error)
        sum_errors.append(sum_error)
    seconds = time.perf_counter() - start

    out = [f"bench/bench_sae_attribution.py --sae {args.sae} --images {args.images} --ks {args.ks} "
           f"--draws {args.draws} --seed {args.seed}" + (f" --limit {args.limit}" if args.limit else ""),
           f"checkpoint {args.checkpoint}; SAE {sae.d_sae} latents ({sae.architecture}"
           + (f", k {sae.k}" if sae.k else "") + f") at {sae.info.hook_name}; {len(files)} images"
           + ("" if seen is not None else " (the SAE's training images unknown: none left out)")
           + (f", {len(excluded)} left out as the SAE trained on them" if excluded else "")
           + f"; target: the predicted class; {seconds:.0f} s",
           sae_metrics(args.sae),
           f"the splice with nothing deleted changes a logit by at most {max(splice_errors):.2e}; latents + bias + "
           f"error - gradient x stream: at most {max(sum_errors):.2e}",
           "", *summary(rows, ks), "",
           "drops are the target's clean logit (probability) minus that with the latents zeroed at the SAE's layer, "
           "every token, the reconstruction error kept; random-k: the mean over the draws; strongest-k: the k "
           "latents of the largest activation summed over the image; mean (sd, se) over images",
           "", "\t".join(COLUMNS)]
    out += ["\t".join(f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in COLUMNS) for r in rows]
    text = "\n".join(out) + "\n"
    print("\n".join(out[:len(ks) + 8]))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
