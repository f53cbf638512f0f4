"""Sparse autoencoders on a layer's residual stream: ``python -m vit.sae train MODEL --data DIR --layer L --out OUT``.

``train`` reads every token's activation after block L (counted from 1) through the model's own forward, streams
them from the images of DIR (any depth) through a bounded shuffle buffer, trains a TopK SAE (Gao et al. 2024:
the k largest pre-activations, unit-norm decoder rows, the AuxK loss against dead latents) and writes OUT/cfg.json
and OUT/sae_weights.safetensors in SAELens's format, OUT/metrics.json (held-out explained variance, L0, dead
fraction, and for a classifier the cross-entropy and top-1 agreement with the layer's output replaced by the
reconstruction), OUT/features.npz (per latent: top activating held-out (image, token) pairs and an activation
histogram) and OUT/steps.jsonl (per step: EV, L0, dead fraction). Every file is written atomically.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

PROG = "vit.sae"


def build_parser() -> argparse.ArgumentParser:
    from vit.predict import OneLineParser, positive_int

    summary, details = __doc__.split("\n\n", 1)
    p = OneLineParser(prog=f"python -m {PROG}", description=summary, epilog=details,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    t = commands.add_parser("train", help="train a TopK SAE on one layer's residual stream")
    t.add_argument("model", metavar="MODEL", help="anything the project opens (a .pt, an HF/timm folder, ...)")
    t.add_argument("--arch", default=None, help="for bare weights files, as vit.predict takes it")
    t.add_argument("--data", required=True, metavar="DIR", help="a folder of images (any depth)")
    t.add_argument("--layer", type=positive_int, required=True, metavar="L",
                   help="the residual stream after block L, counted from 1")
    width = t.add_mutually_exclusive_group()
    width.add_argument("--expansion", type=positive_int, default=None, metavar="E",
                       help="E x the model's width latents (default 8)")
    width.add_argument("--width", type=positive_int, default=None, metavar="N", help="N latents")
    t.add_argument("--k", type=positive_int, default=16, help="latents kept per token (default 16)")
    t.add_argument("--epochs", type=positive_int, default=5, help="passes over the training images (default 5)")
    t.add_argument("--images", type=positive_int, default=2000, help="training images (default 2,000)")
    t.add_argument("--holdout", type=positive_int, default=500, help="held-out images for metrics.json and "
                   "features.npz (default 500; a fifth of DIR when it is smaller)")
    t.add_argument("--batch-size", type=positive_int, default=512, help="tokens per step (default 512)")
    t.add_argument("--image-batch", type=positive_int, default=64, help="images per forward (default 64)")
    t.add_argument("--buffer-tokens", type=positive_int, default=65536,
                   help="rows of the shuffle buffer (default 65,536)")
    t.add_argument("--lr", type=float, default=None,
                   help="Adam's rate (default 6e-3 / sqrt(width / 768))")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", required=True, metavar="OUT", help="the SAE folder to write")
    t.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="where the model and SAE run")
    return p


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from vit.features.harvest import ShuffleBuffer, activation_batches, image_batches, image_files, split_files
    from vit.features.sae import SAEError, SAEInfo, model_fingerprint, resid_hook_name, save_sae
    from vit.features.train import SAESettings, check_settings, held_out_pass, settings_record, train_sae
    from vit.predict import UsageError, open_checkpoint, resolve_device
    from vit.runfiles import atomic_write_bytes, now_iso, write_json, write_metrics

    if args.lr is not None and not 0 < args.lr < 1:
        raise UsageError(f"--lr must be between 0 and 1, got {args.lr}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a folder")
    device = resolve_device(args.device)
    checkpoint = open_checkpoint(args.model, device, args.arch)
    model = checkpoint.model.eval()
    d_in = model.config.hidden_size
    settings = SAESettings(layer=args.layer, width=args.width or d_in * (args.expansion or 8), k=args.k,
                           epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                           buffer_tokens=args.buffer_tokens, seed=args.seed)
    tokens_per_image = model.config.num_prefix_tokens + model.config.num_patches
    try:
        check_settings(settings, d_in, model.config.num_layers, device, args.image_batch * tokens_per_image)
        train_files, held_files = split_files(image_files(Path(args.data)), args.images, args.holdout, args.seed)
    except ValueError as e:  # SAEError too
        raise UsageError(str(e)) from None
    hook = resid_hook_name(args.layer)
    print(f"{PROG}: {len(train_files)} training and {len(held_files)} held-out images, {hook}, "
          f"{settings.width:,} latents, k {settings.k}", file=sys.stderr)

    generator = torch.Generator().manual_seed(args.seed)
    mean_sum, mean_count = torch.zeros(d_in, dtype=torch.float64), 0

    def epoch_batches(epoch: int):
        nonlocal mean_sum, mean_count
        buffer = ShuffleBuffer(settings.buffer_tokens, d_in, settings.batch_size, generator, device)
        images = image_batches(checkpoint, train_files, args.image_batch, device)
        for x in activation_batches(model, images, hook, buffer):
            if epoch == 1:  # the training mean: the mean-ablation baseline of metrics.json
                mean_sum += x.sum(dim=0).double().cpu()
                mean_count += len(x)
            yield x

    steps: list[dict] = []
    per_epoch = -(-len(train_files) * tokens_per_image // settings.batch_size)
    bar = tqdm(total=per_epoch * settings.epochs, desc="train", unit="step", file=sys.stderr)
    started = time.monotonic()

    def on_step(record) -> None:
        bar.update(1)
        if record.step % 10 == 0 or record.step == 1:
            steps.append({**record.__dict__, "seconds": round(time.monotonic() - started, 3)})
            bar.set_postfix(ev=f"{record.explained_variance:.3f}", l0=f"{record.l0:.1f}",
                            dead=f"{record.dead_fraction:.3f}")

    try:
        sae = train_sae(epoch_batches, d_in, settings, device, on_step, total_steps=per_epoch * settings.epochs)
    finally:
        bar.close()
    train_seconds = time.monotonic() - started
    sae.info = SAEInfo(model_name=Path(args.model).stem if Path(args.model).suffix else Path(args.model).name,
                       hook_name=hook, model_fingerprint=model_fingerprint(model))
    started = time.monotonic()
    held = held_out_pass(model, sae, args.layer,
                         tqdm(image_batches(checkpoint, held_files, args.image_batch, device), desc="held out",
                              total=-(-len(held_files) // args.image_batch), file=sys.stderr, unit="batch"),
                         (mean_sum / max(mean_count, 1)).float())
    metrics = {**held.metrics(), "train_images": len(train_files), "train_seconds": round(train_seconds, 2),
               "held_out_seconds": round(time.monotonic() - started, 2), "settings": settings_record(settings),
               "model": str(args.model), "hook_name": hook, "created": now_iso()}
    try:
        out.mkdir(parents=True, exist_ok=True)
        save_sae(sae, out)
        write_json(out / "metrics.json", metrics)
        data_root = Path(args.data)
        atomic_write_bytes(out / "features.npz", held.features([str(p.relative_to(data_root)) for p in held_files]))
        write_metrics(out / "steps.jsonl", steps)
    except SAEError as e:
        raise UsageError(str(e)) from None
    print(f"{PROG}: held-out explained variance {metrics['explained_variance']:.4f}, L0 {metrics['l0']:.2f}, "
          f"dead {metrics['dead_fraction']:.3f}" + (f", top-1 agreement {metrics['top1_agreement']:.3f}"
                                                    if "top1_agreement" in metrics else ""), file=sys.stderr)
    print(out / "cfg.json")
    return 0


def main(argv: list[str] | None = None) -> int:
    from vit.predict import run_cli

    return run_cli(PROG, build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
