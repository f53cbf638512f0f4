"""Sparse autoencoders on a layer's residual stream: ``python -m vit.sae train MODEL --data DIR --layer L --out OUT``.

``train`` reads every token's activation after block L (counted from 1) through the model's own forward, streams
them from the images of DIR (any depth) through a bounded shuffle buffer, trains a TopK SAE (Gao et al. 2024:
the k largest pre-activations, unit-norm decoder rows, the AuxK loss against dead latents) and writes OUT/cfg.json
and OUT/sae_weights.safetensors in SAELens's format, OUT/metrics.json (held-out explained variance, L0, dead
fraction, and for a classifier the cross-entropy and top-1 agreement with the layer's output replaced by the
reconstruction), OUT/features.npz (per latent: top activating held-out (image, token) pairs and an activation
histogram) and OUT/steps.jsonl (per step: EV, L0, dead fraction). Every file is written atomically.

OUT is a run folder as ``vit.train``'s (the Train page lists, stops and resumes it): config.json (the arguments,
``"kind": "sae"``), files.json (the training and held-out images, read again by a resume), status.json (state,
step, progress and a heartbeat) and last.pt (everything a resume needs, rewritten every --checkpoint-seconds and
on a stop). SIGTERM or Ctrl-C finishes the step, saves last.pt and ends the run ``cancelled``; ``train --resume
OUT`` continues at the same step with the same result as a run that was never stopped (``--epochs`` may raise the
total).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

PROG = "vit.sae"
CHECKPOINT_SECONDS = 60.0  # a run's default, and that of a run saved before config.json kept it
FILES_FILE = "files.json"  # the run's training and held-out images: a resume reads these, not what DIR holds now


def build_parser() -> argparse.ArgumentParser:
    from vit.core.cli import OneLineParser, command_name, positive_int

    summary, details = __doc__.split("\n\n", 1)
    p = OneLineParser(prog=command_name(PROG), description=summary, epilog=details,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    t = commands.add_parser("train", help="train a TopK SAE on one layer's residual stream")
    t.add_argument("model", metavar="MODEL", nargs="?", default=None,
                   help="anything the project opens (a .pt, an HF/timm folder, ...)")
    t.add_argument("--resume", metavar="OUT", default=None,
                   help="continue the stopped run in OUT with its own arguments (no MODEL, --data or --layer)")
    t.add_argument("--arch", default=None, help="for bare weights files, as vit.predict takes it")
    t.add_argument("--data", metavar="DIR", help="a folder of images (any depth)")
    t.add_argument("--layer", type=positive_int, metavar="L",
                   help="the residual stream after block L, counted from 1")
    width = t.add_mutually_exclusive_group()
    width.add_argument("--expansion", type=positive_int, default=None, metavar="E",
                       help="E x the model's width latents (default 8)")
    width.add_argument("--width", type=positive_int, default=None, metavar="N", help="N latents")
    t.add_argument("--k", type=positive_int, default=16, help="latents kept per token (default 16)")
    t.add_argument("--epochs", type=positive_int, default=None,
                   help="passes over the training images (default 5; with --resume, a new total)")
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
    t.add_argument("--out", metavar="OUT", help="the SAE folder to write")
    t.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="where the model and SAE run")
    t.add_argument("--checkpoint-seconds", type=float, default=None,
                   help=f"rewrite last.pt at least this often (default {CHECKPOINT_SECONDS:g}; a resume keeps the "
                   "run's, or takes this as its new one)")
    t.add_argument("--ray", metavar="ADDRESS", default=None,
                   help="run on a Ray cluster (its dashboard, http://HEAD:8265): Ray Data harvests on N actors, Ray "
                   "Train trains (on a GPU when the cluster has one); MODEL, --data and OUT on storage every node "
                   "mounts")
    t.add_argument("--workers", type=positive_int, default=None, metavar="N",
                   help="with --ray: harvesting actors, one CPU each (default 1)")
    t.add_argument("--ray-job", action="store_true", help=argparse.SUPPRESS)  # this command inside the Ray job
    return p


def job_argv(args: argparse.Namespace) -> list[str]:
    """``vit.sae``'s arguments for ``args`` with every path absolute and no Ray option: what the Ray job runs."""
    from vit.predict import UsageError
    from vit.sources.hub import looks_like_name

    if args.resume is not None:
        argv = ["train", "--resume", str(Path(args.resume).expanduser().resolve())]
        for flag, value in (("--epochs", args.epochs), ("--checkpoint-seconds", args.checkpoint_seconds)):
            if value is not None:
                argv += [flag, f"{value:g}"]
        return argv
    model = Path(args.model).expanduser().resolve() if args.model else None
    if model is not None and not model.exists() and looks_like_name(args.model):
        model = args.model  # a Hub id: the job fetches it into the cluster's HF cache
    elif model is not None and not model.exists():
        raise UsageError(f"{args.model} does not exist")
    argv = ["train", *([str(model)] if model else [])]
    paths = {"data": args.data, "out": args.out}
    for name in ("arch", "data", "layer", "expansion", "width", "k", "epochs", "images", "holdout", "batch_size",
                 "image_batch", "buffer_tokens", "lr", "seed", "out", "checkpoint_seconds"):
        value = getattr(args, name)
        if value is None:
            continue
        if name in paths:
            value = Path(value).expanduser().resolve()
        argv += ["--" + name.replace("_", "-"), f"{value:g}" if isinstance(value, float) else str(value)]
    return argv


def submit_and_follow(args: argparse.Namespace) -> int:
    """``--ray ADDRESS``: this run as a Ray job (``vit.runs.ray_sae``); its log followed until it ends, Ctrl-C or
    SIGTERM stopping it gracefully."""
    import copy
    import shlex

    from vit.predict import UsageError
    from vit.runs import ray_jobs, ray_sae

    if args.ray_job:
        raise UsageError("--ray and --ray-job exclude each other")
    workers = args.workers or 1
    argv = job_argv(args)
    resolve_args(copy.copy(args))  # the run's own checks (a folder holding a run, a resume of no run) first
    try:
        have = ray_jobs.cluster_resources(args.ray)
        ray_sae.plan({"CPU": have["CPU"][1], "GPU": have["GPU"][1]}, workers)
        out = Path(args.resume or args.out).expanduser().resolve()
        sid = ray_sae.job_id(out)
        entrypoint = shlex.join(["python", "-m", PROG, *argv, "--ray-job", "--workers", str(workers)])
        jobs = ray_jobs.submit_job(args.ray, entrypoint, sid, {"vit_run": str(out), "vit_workers": str(workers),
                                                              "vit_gpus_per_worker": "0"}, what="SAE run")
    except ray_jobs.RayRunError as e:
        raise UsageError(str(e)) from None
    print(f"{PROG}: submitted job {sid} to {args.ray} ({workers} harvesting actor(s)); Ctrl-C stops it", flush=True)
    return ray_jobs.follow_to_the_end(jobs, sid, PROG, "the run writes last.pt and ends cancelled")


RESUMED_ARGS = ("model", "arch", "data", "layer", "expansion", "width", "k", "epochs", "images", "holdout",
                "batch_size", "image_batch", "buffer_tokens", "lr", "seed", "device",
                "checkpoint_seconds")  # what config.json keeps
RENEWED_ARGS = ("epochs", "checkpoint_seconds")  # what a resume may give anew (config.json then keeps that)


SAVED_TYPES = {**{name: int for name in ("layer", "expansion", "width", "k", "epochs", "images", "holdout",
                                        "batch_size", "image_batch", "buffer_tokens", "seed")},
               "model": str, "arch": str, "data": str, "device": str, "lr": (int, float),
               "checkpoint_seconds": (int, float)}  # config.json's args


def resolve_args(args: argparse.Namespace) -> tuple[argparse.Namespace, dict | None]:
    """The arguments of a new run (checked), or of the run ``--resume OUT`` continues with its last.pt's state."""
    from vit.core.runfiles import (
        CONFIG_FILE,
        LAST_CHECKPOINT,
        STATUS_FILE,
        RunFileError,
        check_fields,
        read_config,
        read_status,
        still_running,
    )
    from vit.predict import UsageError

    if args.resume is None:
        missing = [flag for flag, value in (("MODEL", args.model), ("--data", args.data), ("--layer", args.layer),
                                            ("--out", args.out)) if value is None]
        if missing:
            raise UsageError(f"{', '.join(missing)} required (or --resume OUT to continue a run)")
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {out} is a file; give a folder")
        if (out / LAST_CHECKPOINT).exists() or (out / STATUS_FILE).exists():
            raise UsageError(f"--out {out} holds a run; continue it with --resume {out}, or choose another folder")
        args.epochs = args.epochs or 5
        if args.checkpoint_seconds is None:
            args.checkpoint_seconds = CHECKPOINT_SECONDS
        return args, None
    if args.model is not None or args.data is not None or args.layer is not None:
        raise UsageError("--resume OUT takes the run's own model, data and layer; give no MODEL, --data or --layer")
    out = Path(args.resume)
    try:
        config = read_config(out / CONFIG_FILE)
        status = read_status(out / STATUS_FILE)
    except RunFileError as e:
        raise UsageError(f"--resume {out}: {e}") from None
    if config is None or config.get("kind") != "sae" or not (out / LAST_CHECKPOINT).is_file():
        raise UsageError(f"--resume {out}: not an SAE run folder with a last.pt; start a new run instead")
    running = still_running(status)
    if running:
        raise UsageError(f"--resume {out}: the run is still running ({running}); stop it first (SIGTERM) or wait "
                         "for it to end")
    saved = config["args"]
    try:  # a run folder may come from anywhere: every argument of its own type before it is used
        check_fields(saved, SAVED_TYPES, "config.json args", required=("model", "data", "layer", "k", "epochs"))
    except RunFileError as e:
        raise UsageError(f"--resume {out}: {e}") from None
    epochs, seconds = args.epochs, args.checkpoint_seconds
    for name in RESUMED_ARGS:
        setattr(args, name, saved.get(name))
    if epochs is not None:
        if epochs < saved["epochs"]:
            raise UsageError(f"--epochs {epochs} is fewer than the run's {saved['epochs']}; give a larger total")
        args.epochs = epochs
    if seconds is not None:
        args.checkpoint_seconds = seconds
    elif args.checkpoint_seconds is None:
        args.checkpoint_seconds = CHECKPOINT_SECONDS
    args.out = str(out)
    return args, config


def load_last(out: Path, training) -> dict:
    """last.pt read into ``training`` (an SAETraining); returns the rest of what it holds. Its size is checked
    against what the run's SAE can need before it is read."""
    import torch

    from vit.core.runfiles import LAST_CHECKPOINT
    from vit.features.autoencoder import SAEError
    from vit.predict import UsageError

    path = out / LAST_CHECKPOINT
    s = training.settings
    bound = 4 * (4 * (2 * training.d_in * s.width + s.width + training.d_in) + s.width) + 64 * 2**20
    if path.stat().st_size > bound:
        raise UsageError(f"--resume {out}: last.pt is larger than this run's SAE can need; it is not this run's")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(payload, dict) or payload.get("kind") != "sae":
            raise SAEError("last.pt is not an SAE run's checkpoint")
        training.load_state_dict(payload["state"])
    except (SAEError, RuntimeError, OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"--resume {out}: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}") from None
    return payload


def train_in_worker(argv: list[str], device: str, stop, harvest) -> None:
    """The Ray Train worker's run of this command (``vit.runs.ray_sae``): ``argv`` on ``device``, stopped through
    ``stop``, its activations from ``harvest``; raises with the one-line ``vit.sae: error: ...`` it would print."""
    from vit.predict import UsageError

    args = build_parser().parse_args(argv)
    args.device = device
    try:
        run(args, stop=stop, harvest=harvest)
    except UsageError as e:
        raise RuntimeError(f"{PROG}: error: {e}") from None


def epoch_seed(seed: int, epoch: int) -> int:
    """The shuffle buffer's seed in ``epoch``: each epoch's batches are the same whenever they are asked for
    again, so a resumed run trains on exactly the rows an uninterrupted one would."""
    return seed * 1_000_003 + epoch


def run(args: argparse.Namespace, stop=None, harvest=None) -> int:
    """The command; ``stop`` (a ``StopRequest``) lets a caller that is not the main thread (the Ray Train worker)
    request what SIGTERM requests here, and ``harvest(model, arch, hook, files, image_batch)`` gives an epoch's
    ``(B, T, D)`` tokens in file order from elsewhere (``vit.runs.ray_sae.harvest_on_cluster``)."""
    if args.ray:
        return submit_and_follow(args)
    if args.ray_job:
        from vit.runs import ray_sae

        return ray_sae.run_job(train_in_worker, job_argv(args), args.workers or 1,
                               ray_sae.job_id(Path(args.resume or args.out)))
    if args.workers is not None and harvest is None:
        from vit.predict import UsageError

        raise UsageError("--workers needs --ray ADDRESS: locally the harvest runs in this process")
    import os
    import signal
    import socket
    import threading

    import torch
    from tqdm import tqdm

    from vit.core.runfiles import (
        CONFIG_FILE,
        LAST_CHECKPOINT,
        STATUS_FILE,
        STEPS_FILE,
        Status,
        atomic_write_bytes,
        now_iso,
        read_json,
        read_metrics,
        record_resume,
        write_json,
        write_metrics,
    )
    from vit.costs import plan
    from vit.features.autoencoder import SAEError, SAEInfo, model_fingerprint, resid_hook_name, save_sae, stream_shape
    from vit.features.autoencoder_training import (
        SAESettings,
        SAETraining,
        Stopped,
        check_settings,
        held_out_pass,
        settings_record,
    )
    from vit.features.harvest import (
        ShuffleBuffer,
        activation_batches,
        image_batches,
        image_files,
        read_split,
        split_files,
        split_record,
        token_rows,
    )
    from vit.predict import UsageError, open_checkpoint, resolve_device
    from vit.training.session import StopRequest

    asked_device = args.device if harvest is not None else None  # the Ray worker's, whatever the run had
    args, config = resolve_args(args)
    args.device = asked_device or args.device
    if args.lr is not None and not 0 < args.lr < 1:
        raise UsageError(f"--lr must be between 0 and 1, got {args.lr}")
    out = Path(args.out)
    device = resolve_device(args.device)
    checkpoint = open_checkpoint(args.model, device, args.arch,
                                 port_only="vit-sae reads a layer's tokens at our own ViT's hook points")
    model = checkpoint.model.eval()
    try:
        grid, prefix, d_in = stream_shape(model, args.layer) if 1 <= args.layer <= model.config.num_layers else (
            model.config.grid_size, model.config.num_prefix_tokens, model.config.hidden_size)  # else refused below
    except ValueError as e:  # a stage's windows do not tile the training size
        raise UsageError(str(e)) from None
    settings = SAESettings(layer=args.layer, width=args.width or d_in * (args.expansion or 8), k=args.k,
                           epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                           buffer_tokens=args.buffer_tokens, seed=args.seed)
    tokens_per_image = prefix + grid[0] * grid[1]  # block --layer's output: a stage layer's own grid (Swin, Hiera)
    try:
        check_settings(settings, d_in, model.config.num_layers, device, args.image_batch * tokens_per_image)
        h, w = checkpoint.preprocessing.image_hw  # the harvest's forward of one image: the cost model's answer
        plan.decide(plan.forward(model, model.patch_grid(h, w), f"The model's {w}×{h} px input"))
    except ValueError as e:  # SAEError, TooManyTokens
        raise UsageError(str(e)) from None
    if config is not None and (out / FILES_FILE).exists():  # runs from before it was written list DIR again
        try:
            train_files, held_files = read_split(read_json(out / FILES_FILE), Path(args.data))
        except ValueError as e:
            raise UsageError(f"--resume {out}: {FILES_FILE} {e}") from None
    else:
        try:
            train_files, held_files = split_files(image_files(Path(args.data)), args.images, args.holdout, args.seed)
        except ValueError as e:
            raise UsageError(str(e)) from None
    hook = resid_hook_name(args.layer)
    per_epoch = -(-len(train_files) * tokens_per_image // settings.batch_size)
    total_steps = per_epoch * settings.epochs
    training = SAETraining(d_in, settings, device, total_steps)
    steps: list[dict] = []
    seconds_before = 0.0  # training seconds of earlier sessions
    if config is not None:
        payload = load_last(out, training)
        seconds_before = float(payload.get("train_seconds") or 0.0)
        steps = [row for row in read_metrics(out / STEPS_FILE)
                 if isinstance(row.get("step"), int) and row["step"] <= training.step]
        record_resume(out / CONFIG_FILE, {name: getattr(args, name) for name in RENEWED_ARGS},
                      {"time": now_iso(), "step": training.step, "epochs": settings.epochs})
    else:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / CONFIG_FILE, {
            "kind": "sae", "args": {**{name: getattr(args, name) for name in RESUMED_ARGS}, "out": str(out),
                                    "dataset": f"folder:{args.data}"},
            "model": {"hidden_size": d_in, "num_layers": model.config.num_layers, "hook_name": hook},
            "device": str(device), "created": now_iso(), "command": ["vit.sae", "train"]})
        write_json(out / FILES_FILE, split_record(train_files, held_files, Path(args.data)))
    print(f"{PROG}: {len(train_files)} training and {len(held_files)} held-out images, {hook}, "
          f"{settings.width:,} latents, k {settings.k}" + (f"; resuming at step {training.step}" if config else ""),
          file=sys.stderr)

    def until_stopped(batches):  # a stop asked for while the buffer fills ends the run before the next step
        for batch in batches:
            if stop.requested:
                raise Stopped
            yield batch

    def epoch_batches(epoch: int):
        generator = torch.Generator().manual_seed(epoch_seed(settings.seed, epoch))
        buffer = ShuffleBuffer(settings.buffer_tokens, d_in, settings.batch_size, generator, device)
        if harvest is not None:
            tokens = harvest(args.model, args.arch, hook, train_files, args.image_batch)
            yield from token_rows(until_stopped(tokens), buffer)
            return
        images = image_batches(checkpoint, train_files, args.image_batch, device)
        yield from activation_batches(model, until_stopped(images), hook, buffer)

    stride = max(1, total_steps // 2000)  # steps.jsonl keeps every step of a short run, ~2,000 rows of a long one
    started = time.monotonic()
    status = Status(out / STATUS_FILE, {
        "state": "running", "epoch": min(training.epoch, settings.epochs), "step": training.step,
        "total_epochs": settings.epochs, "total_steps": total_steps, "progress": min(1.0, training.step / total_steps),
        "pid": os.getpid(), "host": socket.gethostname(), "start_time": now_iso(), "device": str(device),
        "elapsed_seconds": seconds_before})
    last_save = [time.monotonic()]

    def elapsed() -> float:
        return seconds_before + time.monotonic() - started

    def save_last() -> None:
        import io

        buffer = io.BytesIO()
        torch.save({"kind": "sae", "state": training.state_dict(), "train_seconds": elapsed()}, buffer)
        atomic_write_bytes(out / LAST_CHECKPOINT, buffer.getvalue())
        write_metrics(out / STEPS_FILE, steps)
        last_save[0] = time.monotonic()

    bar = tqdm(total=total_steps, initial=training.step, desc="train", unit="step", file=sys.stderr)
    session_steps = [0]

    def on_step(record) -> None:
        bar.update(1)
        session_steps[0] += 1
        if record.step % stride == 0 or record.step in (1, total_steps):
            steps.append({**record.__dict__, "seconds": round(elapsed(), 3)})
            bar.set_postfix(ev=f"{record.explained_variance:.3f}", l0=f"{record.l0:.1f}",
                            dead=f"{record.dead_fraction:.3f}")
        rate = (time.monotonic() - started) / session_steps[0]
        status.values.update(epoch=record.epoch, step=record.step, progress=min(1.0, record.step / total_steps),
                             elapsed_seconds=round(elapsed(), 1),
                             eta_seconds=round(rate * (total_steps - record.step), 1))
        if time.monotonic() - last_save[0] >= args.checkpoint_seconds:
            save_last()
            status.update()

    stop = stop or StopRequest()
    is_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)} if is_main else {}
    status.start()
    try:
        stop.armed = True
        finished = training.done or training.run(epoch_batches, on_step, lambda: stop.requested)
        bar.close()
        save_last()
        if not finished:
            status.update(state="cancelled", eta_seconds=None)
            print(f"{PROG}: stopped at step {training.step} of {total_steps}; continue with --resume {out}",
                  file=sys.stderr)
            return 0
        stop.armed = False  # a signal during the held-out pass ends the run: a resume redoes only that pass
        train_seconds = elapsed()
        sae = training.finished()
        sae.info = SAEInfo(model_name=Path(args.model).stem if Path(args.model).suffix else Path(args.model).name,
                           hook_name=hook, model_fingerprint=model_fingerprint(model))
        held_started = time.monotonic()
        held = held_out_pass(model, sae, args.layer,
                             tqdm(image_batches(checkpoint, held_files, args.image_batch, device), desc="held out",
                                  total=-(-len(held_files) // args.image_batch), file=sys.stderr, unit="batch"),
                             training.mean)
        metrics = {**held.metrics(), "train_images": len(train_files), "train_seconds": round(train_seconds, 2),
                   "held_out_seconds": round(time.monotonic() - held_started, 2),
                   "settings": settings_record(settings), "model": str(args.model), "hook_name": hook,
                   "created": now_iso(), "data": str(Path(args.data).resolve())}  # features.npz names its images in it
        try:
            save_sae(sae, out)
            write_json(out / "metrics.json", metrics)
            data_root = Path(args.data)
            atomic_write_bytes(out / "features.npz",
                               held.features([str(p.relative_to(data_root)) for p in held_files]))
        except SAEError as e:
            raise UsageError(str(e)) from None
        status.update(state="completed", progress=1.0, eta_seconds=None)
    except KeyboardInterrupt:
        status.update(state="cancelled", eta_seconds=None)
        raise
    except BaseException as e:
        status.update(state="failed", error=str(e).splitlines()[0][:300] if str(e) else type(e).__name__)
        raise
    finally:
        bar.close()
        status.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(f"{PROG}: held-out explained variance {metrics['explained_variance']:.4f}, L0 {metrics['l0']:.2f}, "
          f"dead {metrics['dead_fraction']:.3f}" + (f", top-1 agreement {metrics['top1_agreement']:.3f}"
                                                    if "top1_agreement" in metrics else ""), file=sys.stderr)
    print(out / "cfg.json")
    return 0


def check_paths(args: argparse.Namespace) -> None:
    """Before torch loads: the model exists (or is a Hub id) and ``--data`` is a folder, where given."""
    from vit.core.cli import check_folder
    from vit.predict import check_model_path

    if args.model is not None:
        check_model_path(args.model)
    check_folder(args.data, "--data", "a folder of images (any depth)")


def main(argv: list[str] | None = None) -> int:
    from vit.predict import run_cli

    return run_cli(PROG, build_parser(), run, argv, check_paths)


def command() -> None:
    """The console command (pyproject.toml) and ``python -m``: ``main()``'s status, with a fast, quiet exit."""
    from vit.core.cli import run_command

    run_command(main)


if __name__ == "__main__":
    command()
