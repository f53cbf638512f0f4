"""Attention snapshots taken while a model trains: a fixed probe set, per-epoch maps and head statistics.

The trainer writes them into the run folder; the Train page and the explorer read them back,
also while the run is still writing::

    probe/probe.json           the probe set: validation indices, labels, class names, and the
                               validation indices of the statistics sample
    probe/00.png, 01.png, …    the probe images as the model sees them (model-input size, lossless)
    attention/epoch_0003.npz   one file per snapshot (epoch 0 is the initialisation), each written
                               to a temporary file and renamed into place, so a reader or a
                               SIGKILL never meets half a file

Keys of an epoch's ``.npz`` (``P`` probe images, ``L`` layers, ``H`` heads, ``gh x gw`` patches):
``epoch``; ``logits`` ``(P, classes)``; ``cls_attention`` ``(L, P, H, gh, gw)``, each head's
attention from the first prefix token (CLS) to the patches (DINO's ``attn[:, :, 0, 1:]``);
``rollout`` ``(P, gh, gw)``, the CLS row of the attention rollout over all layers (mean over
heads, nothing discarded); ``distance`` and ``entropy`` ``(L, H)``, each head's mean attention
distance (pixels) and entropy (nats) averaged over the statistics sample; ``sample_size``;
``patch_size``; ``num_prefix_tokens``; ``seconds`` (the time the snapshot took).

Everything here works for any number of prefix tokens and any patch grid (non-square too):
the grid follows from the input's height and width and the patch size.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vit.core.cache import ByteCache
from vit.core.images import ImageError, open_image
from vit.core.runfiles import ATTENTION_DIR, PROBE_DIR, atomic_write_bytes, parse_json, read_text_bounded
from vit.explain.methods.attention import fuse_heads, layer_stats, rollout, token_map

PROBE_FILE = "probe.json"
PROBE_SIZE = 8  # images shown per epoch on the Train page
SAMPLE_SIZE = 256  # validation images behind each epoch's distance and entropy
_EPOCH_FILE = re.compile(r"^epoch_(\d{4,})\.npz$")
STATISTICS = {"distance": "mean attention distance (px)", "entropy": "attention entropy (nats)"}
SNAPSHOT_ARRAYS = ("logits", "cls_attention", "rollout", "distance", "entropy")
# Bounds on what a run folder may make a reader decompress or decode (it may come from anyone). A ViT-L/14 at
# 518 px with 8 probe images declares 24 x 8 x 16 x 37 x 37 = 4.2 M values.
MAX_SNAPSHOT_ELEMENTS = 16 * 2**20
# Read files are kept by the bytes their arrays hold, not by count: a file may hold 16 M float64 values (128 MB),
# and 16 kept epochs of 129 KB files held 2.5 GB.
SNAPSHOT_CACHE_BYTES = 256 * 2**20
STATISTICS_CACHE_BYTES = 32 * 2**20  # (L, H) per file: 1 kB for a ViT-B, 256 kB at ViTConfig's bounds
_SNAPSHOTS = ByteCache(SNAPSHOT_CACHE_BYTES)
_STATISTICS = ByteCache(STATISTICS_CACHE_BYTES)
MAX_SNAPSHOT_LAYERS, MAX_SNAPSHOT_HEADS = 256, 256  # ViTConfig's own bounds
MAX_PROBE_IMAGES = 64
MAX_PROBE_SIDE, MAX_PROBE_PIXELS = 1024, 1024 * 1024  # probe images are stored at the model's input size


class SnapshotError(ValueError):
    """Snapshots that cannot be read or written as asked; the message says what to do."""


# ---------------------------------------------------------------------------------------------
# Choosing the probe set and the statistics sample


def choose_probe(labels: Sequence[int] | torch.Tensor, count: int = PROBE_SIZE, seed: int = 0) -> list[int]:
    """``count`` indices of ``labels`` spread over the classes: the classes (in a seeded order) take turns,
    each giving its next image in a seeded order, so every class gets ``count // classes`` or one more
    while it has images. The same labels and seed always give the same indices."""
    labels = [int(v) for v in (labels.tolist() if isinstance(labels, torch.Tensor) else labels)]
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    generator = torch.Generator().manual_seed(seed)
    classes = sorted(set(labels))
    order = [classes[i] for i in torch.randperm(len(classes), generator=generator).tolist()]
    queues = {}
    for c in classes:
        members = [i for i, label in enumerate(labels) if label == c]
        queues[c] = [members[j] for j in torch.randperm(len(members), generator=generator).tolist()]
    chosen: list[int] = []
    while len(chosen) < min(count, len(labels)):
        for c in order:
            if queues[c] and len(chosen) < count:
                chosen.append(queues[c].pop(0))
    return chosen


def choose_sample(size: int, count: int = SAMPLE_SIZE, seed: int = 0) -> list[int]:
    """``min(count, size)`` distinct indices of ``range(size)``, seeded, in increasing order."""
    generator = torch.Generator().manual_seed(seed + 1)  # + 1: not the same stream as the probe's
    return sorted(torch.randperm(size, generator=generator)[:count].tolist())


@dataclass
class Probe:
    """The probe set of a run: its images (model-input size, uint8) and where they came from."""

    images: torch.Tensor  # (P, C, S, S) uint8
    labels: list[int]
    indices: list[int]  # in the validation split
    class_names: list[str]
    sample_indices: list[int]  # the validation images behind the head statistics

    def pil_images(self) -> list[Image.Image]:
        """The probe images as PIL images (RGB or L)."""
        return [_to_pil(image) for image in self.images]


def _to_pil(image: torch.Tensor) -> Image.Image:
    array = image.detach().cpu().permute(1, 2, 0).numpy()  # (S, S, C)
    return Image.fromarray(array[:, :, 0], "L") if array.shape[2] == 1 else Image.fromarray(array, "RGB")


def make_probe(val_images: torch.Tensor, val_labels: torch.Tensor, class_names: Sequence[str], seed: int = 0,
               count: int = PROBE_SIZE, sample_count: int = SAMPLE_SIZE) -> Probe:
    """The probe set and statistics sample of a validation split: ``(N, C, S, S)`` uint8 images, ``(N,)`` labels."""
    indices = choose_probe(val_labels, count, seed)
    index = torch.tensor(indices, dtype=torch.long)
    return Probe(images=val_images[index.to(val_images.device)].cpu(), labels=[int(val_labels[i]) for i in indices],
                 indices=indices, class_names=list(class_names),
                 sample_indices=choose_sample(len(val_labels), sample_count, seed))


def save_probe(run_dir: str | os.PathLike, probe: Probe) -> None:
    """Write the probe PNGs, then probe.json (last, atomically: its presence means the set is complete)."""
    folder = Path(run_dir) / PROBE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for i, image in enumerate(probe.pil_images()):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        atomic_write_bytes(folder / f"{i:02d}.png", buffer.getvalue())
    record = {"indices": probe.indices, "labels": probe.labels, "class_names": probe.class_names,
              "files": [f"{i:02d}.png" for i in range(len(probe.indices))], "sample_indices": probe.sample_indices}
    atomic_write_bytes(folder / PROBE_FILE, (json.dumps(record, indent=2) + "\n").encode())


def has_probe(run_dir: str | os.PathLike) -> bool:
    """Whether the run folder holds a complete probe set."""
    return (Path(run_dir) / PROBE_DIR / PROBE_FILE).is_file()


def load_probe(run_dir: str | os.PathLike) -> Probe:
    """The probe set stored in a run folder; SnapshotError when it is missing or damaged."""
    folder = Path(run_dir) / PROBE_DIR
    try:
        record = parse_json(read_text_bounded(folder / PROBE_FILE))
        files, labels = list(record["files"]), [int(v) for v in record["labels"]]
        images = []
        for name in files:
            if Path(name).name != name:  # never read outside the probe folder
                raise ValueError(f"bad file name {name!r}")
            if len(images) >= MAX_PROBE_IMAGES:
                raise ValueError(f"more than {MAX_PROBE_IMAGES} probe images")
            # The upload path's decoder and bounds: a probe PNG comes from a run folder, which may come from anyone.
            image = open_image(folder / name, max_pixels=MAX_PROBE_PIXELS, max_side=MAX_PROBE_SIDE)
            array = np.asarray(image.convert("L") if image.mode not in ("L", "RGB") else image, dtype=np.uint8)
            images.append(torch.from_numpy(array.copy()).reshape(array.shape[0], array.shape[1], -1).permute(2, 0, 1))
        return Probe(images=torch.stack(images) if images else torch.empty(0, 1, 1, 1, dtype=torch.uint8),
                     labels=labels, indices=[int(v) for v in record["indices"]],
                     class_names=[str(c) for c in record["class_names"]],
                     sample_indices=[int(v) for v in record.get("sample_indices", [])])
    except FileNotFoundError:
        raise SnapshotError(f"{folder} holds no probe set; the run was trained without attention snapshots") from None
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, ImageError) as e:
        raise SnapshotError(f"the probe set in {folder} is damaged ({type(e).__name__}: {e}); "
                            "delete the folder and resume the run to write it again") from None


# ---------------------------------------------------------------------------------------------
# Taking a snapshot


def cls_attention_maps(attentions: Sequence[torch.Tensor], grid: tuple[int, int],
                       num_prefix_tokens: int = 1) -> torch.Tensor:
    """Each layer's and head's attention from token 0 (CLS) to the patches: per layer ``(B, H, T, T)``
    -> ``(L, B, H, gh, gw)``."""
    return torch.stack([token_map(a, 0, grid, num_prefix_tokens) for a in attentions])


@torch.no_grad()
def take_snapshot(model: torch.nn.Module, probe_inputs: torch.Tensor, sample_inputs: torch.Tensor, patch_size: int,
                  num_prefix_tokens: int = 1, batch_size: int = 64) -> dict[str, np.ndarray]:
    """The snapshot arrays (see the module docstring) of ``model`` on normalised inputs ``(B, C, H, W)``.

    ``model`` follows ``logits, attentions = model(x, output_attentions=True)``; it is run in eval mode
    and float32 (its mode is restored afterwards), one batch of ``batch_size`` at a time, so memory stays
    at one batch's attentions whatever the sample size.
    """
    if probe_inputs.dim() != 4 or sample_inputs.dim() != 4:
        raise ValueError(f"expected image batches (B, C, H, W), got {tuple(probe_inputs.shape)} and "
                         f"{tuple(sample_inputs.shape)}")
    was_training = model.training
    model.eval()
    try:
        grid = (probe_inputs.shape[-2] // patch_size, probe_inputs.shape[-1] // patch_size)
        logits, attentions = model(probe_inputs.float(), output_attentions=True)
        arrays = {
            "logits": logits.float().cpu().numpy(),
            "cls_attention": cls_attention_maps(attentions, grid, num_prefix_tokens).float().cpu().numpy(),
            "rollout": token_map(rollout(attentions, "mean", 0.0, None, num_prefix_tokens), 0, grid,
                                 num_prefix_tokens).float().cpu().numpy(),
        }
        totals: dict[str, torch.Tensor] = {}
        sample_grid = (sample_inputs.shape[-2] // patch_size, sample_inputs.shape[-1] // patch_size)
        for chunk in sample_inputs.split(batch_size):
            _, attentions = model(chunk.float(), output_attentions=True)
            stats = layer_stats(attentions, sample_grid, patch_size, num_prefix_tokens)  # each (L, B, H)
            for name, values in stats.items():
                summed = values.double().sum(dim=1)  # (L, H); float64: 256 images add up exactly enough
                totals[name] = summed if name not in totals else totals[name] + summed
        count = len(sample_inputs)
        for name in STATISTICS:
            num_layers, _, num_heads = arrays["cls_attention"].shape[:3]
            arrays[name] = ((totals[name] / count).float().cpu().numpy() if count
                            else np.full((num_layers, num_heads), np.nan, dtype=np.float32))
        arrays.update(sample_size=np.int64(count), patch_size=np.int64(patch_size),
                      num_prefix_tokens=np.int64(num_prefix_tokens))
        return arrays
    finally:
        model.train(was_training)


# ---------------------------------------------------------------------------------------------
# Storing and reading


def snapshot_path(run_dir: str | os.PathLike, epoch: int) -> Path:
    """Where the snapshot of ``epoch`` lives (epoch 0: before training)."""
    return Path(run_dir) / ATTENTION_DIR / f"epoch_{epoch:04d}.npz"


def write_snapshot(run_dir: str | os.PathLike, epoch: int, arrays: dict[str, np.ndarray],
                   seconds: float | None = None) -> Path:
    """Store one epoch's arrays atomically (temporary file, fsync, rename); returns the path."""
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    buffer = io.BytesIO()
    extra = {"seconds": np.float64(seconds)} if seconds is not None else {}
    np.savez_compressed(buffer, epoch=np.int64(epoch), **arrays, **extra)
    path = snapshot_path(run_dir, epoch)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def snapshot_epochs(run_dir: str | os.PathLike) -> list[int]:
    """The epochs with a snapshot, in increasing order (empty when there are none)."""
    folder = Path(run_dir) / ATTENTION_DIR
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _EPOCH_FILE.match(p.name)))


@dataclass
class Snapshot:
    """One epoch's snapshot; arrays as described in the module docstring."""

    epoch: int
    logits: np.ndarray  # (P, classes)
    cls_attention: np.ndarray  # (L, P, H, gh, gw)
    rollout: np.ndarray  # (P, gh, gw)
    distance: np.ndarray  # (L, H)
    entropy: np.ndarray  # (L, H)
    sample_size: int
    patch_size: int
    num_prefix_tokens: int
    seconds: float | None = None

    @property
    def probabilities(self) -> np.ndarray:
        """Softmax of the logits: ``(P, classes)``."""
        shifted = self.logits - self.logits.max(axis=1, keepdims=True)
        e = np.exp(shifted)
        return e / e.sum(axis=1, keepdims=True)

    @property
    def predictions(self) -> np.ndarray:
        """The predicted class of each probe image: ``(P,)``."""
        return self.logits.argmax(axis=1)

    @property
    def num_layers(self) -> int:
        return self.cls_attention.shape[0]

    @property
    def num_heads(self) -> int:
        return self.cls_attention.shape[2]

    @property
    def grid(self) -> tuple[int, int]:
        return self.cls_attention.shape[3], self.cls_attention.shape[4]


def load_snapshot(run_dir: str | os.PathLike, epoch: int) -> Snapshot:
    """The snapshot of ``epoch``; SnapshotError when it is missing or not a snapshot."""
    path = snapshot_path(run_dir, epoch)
    try:
        stat = path.stat()
        return _SNAPSHOTS.get_or_compute((str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size),
                                         lambda: _read_snapshot(str(path)))
    except FileNotFoundError:
        raise SnapshotError(f"no attention snapshot of epoch {epoch} in {Path(run_dir)}; "
                            f"epochs with one: {_epochs_text(run_dir)}") from None
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise SnapshotError(f"{path} is not a readable attention snapshot ({type(e).__name__}); "
                            "delete it and resume the run to write it again") from None


# The Train page and the explorer redraw a snapshot every second while playing and every few seconds
# otherwise: each file is decompressed once (load_snapshot keeps it in _SNAPSHOTS), and again only when
# rewritten (new inode and mtime).
def _read_snapshot(path: str) -> Snapshot:
    with np.load(path, allow_pickle=False) as npz:  # no pickles: a run folder may come from anyone
        shapes = _declared_shapes(npz, SNAPSHOT_ARRAYS)  # from the headers: nothing decompressed yet
        L, B, H, gh, gw = _snapshot_dims(shapes)
        expected = {"logits": (B, None), "cls_attention": (L, B, H, gh, gw), "rollout": (B, gh, gw),
                    "distance": (L, H), "entropy": (L, H)}
        for key, want in expected.items():
            got = shapes[key]
            if len(got) != len(want) or any(w is not None and g != w for g, w in zip(got, want, strict=True)):
                raise ValueError(f"{key} has the shape {got}, which does not fit the others")
        arrays = {key: npz[key] for key in SNAPSHOT_ARRAYS}
        seconds = float(npz["seconds"]) if "seconds" in npz.files else None
        scalars = {key: int(npz[key]) for key in ("epoch", "sample_size", "patch_size", "num_prefix_tokens")}
    for array in arrays.values():
        array.flags.writeable = False  # shared by every later call
    return Snapshot(**scalars, **arrays, seconds=seconds)


def _declared_shapes(npz, keys: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Each member's shape from its .npy header, checked before anything is decompressed: ValueError past
    ``MAX_SNAPSHOT_ELEMENTS`` in all (a 1 MB file decompressed to 1 GB) or for a member that is not a number
    array."""
    shapes, total = {}, 0
    for key in keys:
        with npz.zip.open(f"{key}.npy") as member:
            major, _ = np.lib.format.read_magic(member)
            read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(member)  # numpy bounds the header's own length
        if dtype.hasobject or dtype.kind not in "fiub":
            raise ValueError(f"{key} holds {dtype}, not numbers")
        shapes[key] = tuple(int(n) for n in shape)
        total += math.prod(shapes[key])
        if total > MAX_SNAPSHOT_ELEMENTS:
            raise ValueError(f"its arrays declare more than {MAX_SNAPSHOT_ELEMENTS:,} values")
    return shapes


def _snapshot_dims(shapes: dict[str, tuple[int, ...]]) -> tuple[int, int, int, int, int]:
    """(layers, probe images, heads, grid rows, grid cols) that ``cls_attention`` declares."""
    if len(shapes["cls_attention"]) != 5:
        raise ValueError(f"cls_attention has the shape {shapes['cls_attention']}, not (L, B, H, gh, gw)")
    return shapes["cls_attention"]


def _epochs_text(run_dir: str | os.PathLike) -> str:
    epochs = snapshot_epochs(run_dir)
    return ", ".join(map(str, epochs)) if epochs else "none"


def statistics_over_epochs(run_dir: str | os.PathLike, statistic: str = "distance", head: int | None = None
                           ) -> tuple[list[int], np.ndarray]:
    """(epochs, values ``(L, E)``): one head's ``statistic`` per layer and epoch, or the mean over heads
    when ``head`` is None. Reads only that array of each file; unreadable files are skipped (a reader
    may race a run that is writing the next one)."""
    if statistic not in STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r}; choose one of: {', '.join(STATISTICS)}")
    epochs, columns = [], []
    for epoch in snapshot_epochs(run_dir):
        path = snapshot_path(run_dir, epoch)
        try:
            stat = path.stat()
            values = _STATISTICS.get_or_compute((str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size, statistic),
                                                partial(_statistic_of_file, str(path), statistic))  # (L, H)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            continue
        if head is not None and not 0 <= head < values.shape[1]:
            raise ValueError(f"head {head} is out of range for {values.shape[1]} heads")
        columns.append(values.mean(axis=1) if head is None else values[:, head])
        epochs.append(epoch)
    if not columns:
        return [], np.zeros((0, 0), dtype=np.float32)
    return epochs, np.stack(columns, axis=1)  # (L, E)


# The Train page redraws these curves every few seconds while a run adds one file per epoch: each file
# is read once (kept in _STATISTICS), and again only when rewritten (a rename gives it a new inode and mtime).
def _statistic_of_file(path: str, statistic: str) -> np.ndarray:
    with np.load(path, allow_pickle=False) as npz:
        shape = _declared_shapes(npz, [statistic])[statistic]
        if len(shape) != 2 or shape[0] > MAX_SNAPSHOT_LAYERS or shape[1] > MAX_SNAPSHOT_HEADS:
            raise ValueError(f"{statistic} has the shape {shape}, not (layers, heads)")
        values = np.asarray(npz[statistic], dtype=np.float32)  # (L, H)
    values.flags.writeable = False  # shared by every later call
    return values


# ---------------------------------------------------------------------------------------------
# Maps for display and export


MAP_CHOICES = ("attention", "rollout")


def probe_map(snapshot: Snapshot, probe_index: int, kind: str = "attention", layer: int = -1,
              head: int | None = None, fusion: str = "mean") -> np.ndarray:
    """One probe image's ``(gh, gw)`` CLS map: a layer's head, or its heads fused by mean, max or min
    (exact for CLS rows: fusing heads then taking the row is taking the rows then fusing); or the rollout."""
    if not 0 <= probe_index < snapshot.logits.shape[0]:
        raise ValueError(f"probe image {probe_index} is out of range for {snapshot.logits.shape[0]} images")
    if kind == "rollout":
        return snapshot.rollout[probe_index].copy()  # the snapshot's arrays are cached and read-only
    if kind != "attention":
        raise ValueError(f"unknown map kind {kind!r}; choose one of: {', '.join(MAP_CHOICES)}")
    if not -snapshot.num_layers <= layer < snapshot.num_layers:
        raise ValueError(f"layer {layer} is out of range for {snapshot.num_layers} layers")
    maps = snapshot.cls_attention[layer, probe_index]  # (H, gh, gw)
    if head is not None:
        if not 0 <= head < maps.shape[0]:
            raise ValueError(f"head {head} is out of range for {maps.shape[0]} heads")
        return maps[head].copy()
    return fuse_heads(torch.tensor(maps)[None], fusion)[0].numpy()  # (1, H, gh, gw) -> (gh, gw)


def prediction_caption(probe: Probe, snapshot: Snapshot, probe_index: int) -> str:
    """'cat → dog 71 % ✗': the probe image's true class, the epoch's prediction and its probability."""
    predicted = int(snapshot.predictions[probe_index])
    truth = probe.labels[probe_index]
    names = probe.class_names
    mark = "✓" if predicted == truth else "✗"
    return f"{names[truth]} → {names[predicted]} {snapshot.probabilities[probe_index, predicted]:.0%} {mark}"


def probe_overlays(run_dir: str | os.PathLike, epoch: int, kind: str = "attention", layer: int = -1,
                   head: int | None = None, fusion: str = "mean", opacity: float = 0.6, colormap: str = "inferno",
                   mode: str = "bilinear", size: int = 128) -> list[tuple[Image.Image, str]]:
    """Every probe image at ``size`` px with its map of ``epoch`` overlaid, and its prediction caption."""
    from vit.explain.views.overlay import overlay

    probe, snapshot = load_probe(run_dir), load_snapshot(run_dir, epoch)
    shown = []
    for i, image in enumerate(probe.pil_images()):
        base = image.convert("RGB").resize((size, size), Image.Resampling.NEAREST)  # keep the pixels of small inputs
        shown.append((overlay(base, probe_map(snapshot, i, kind, layer, head, fusion), opacity, colormap, mode),
                      prediction_caption(probe, snapshot, i)))
    return shown


def animation_frames(run_dir: str | os.PathLike, probe_index: int, kind: str = "attention", layer: int = -1,
                     head: int | None = None, fusion: str = "mean", opacity: float = 0.6,
                     colormap: str = "inferno", mode: str = "bilinear", size: int = 256,
                     epochs: Sequence[int] | None = None) -> list[Image.Image]:
    """One overlay per snapshotted epoch of a probe image, at ``size`` px, each labelled with its epoch."""
    from PIL import ImageDraw

    from vit.explain.views.overlay import overlay

    probe = load_probe(run_dir)
    if not 0 <= probe_index < len(probe.indices):
        raise ValueError(f"probe image {probe_index} is out of range for {len(probe.indices)} images")
    base = probe.pil_images()[probe_index].convert("RGB").resize((size, size), Image.Resampling.NEAREST)
    frames = []
    for epoch in epochs if epochs is not None else snapshot_epochs(run_dir):
        snapshot = load_snapshot(run_dir, epoch)
        frame = overlay(base, probe_map(snapshot, probe_index, kind, layer, head, fusion), opacity, colormap, mode)
        predicted = probe.class_names[int(snapshot.predictions[probe_index])]
        ImageDraw.Draw(frame).text((4, 4), f"epoch {epoch}: {predicted}", fill=(255, 255, 255),
                                   stroke_width=2, stroke_fill=(0, 0, 0))
        frames.append(frame)
    if not frames:
        raise SnapshotError(f"{Path(run_dir)} has no attention snapshots to animate yet")
    return frames


def gif_bytes(frames: Sequence[Image.Image], seconds_per_frame: float = 0.5, loop: bool = True) -> bytes:
    """An animated GIF of ``frames`` (PIL), ``seconds_per_frame`` each."""
    if not frames:
        raise ValueError("no frames to animate")
    buffer = io.BytesIO()
    first, *rest = [f.convert("RGB") for f in frames]
    first.save(buffer, format="GIF", save_all=True, append_images=rest, duration=int(seconds_per_frame * 1000),
               loop=0 if loop else 1, optimize=False)
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------


def statistics_figure(epochs: Sequence[int], values: np.ndarray, statistic: str, title: str = ""):
    """A layers × epochs heatmap (plotly) of ``values`` ``(L, E)`` from ``statistics_over_epochs``."""
    import plotly.graph_objects as go

    values = np.asarray(values, dtype=np.float64)
    figure = go.Figure(go.Heatmap(
        z=values, x=list(epochs), y=[f"L{i + 1}" for i in range(values.shape[0])], colorscale="Viridis",
        colorbar=dict(title=dict(text=STATISTICS[statistic].split(" (")[0].replace(" ", "<br>"))),
        hovertemplate="epoch %{x}, layer %{y}: %{z:.3f}<extra></extra>"))
    figure.update_layout(title=title or STATISTICS[statistic].capitalize(), height=280,
                         margin=dict(l=10, r=10, t=40, b=10), xaxis_title="epoch", yaxis_title="layer")
    figure.update_yaxes(autorange="reversed")  # the first layer on top, as in the explorer
    return figure
