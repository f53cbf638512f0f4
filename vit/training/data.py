"""Datasets as uint8 tensors in memory, and augmentation done on whole batches of them.

Each dataset is decoded once (through the same evaluation transform as inference, see
``vit.core.images``) into a cached ``(N, C, S, S)`` uint8 tensor, so later runs and every epoch
skip PIL entirely. Augmentation then works on batches of tensors, on the GPU when there is
one, which keeps two CPU cores busy with the model rather than with image decoding.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from vit.checkpoint import atomic_torch_save, check_archive
from vit.core.images import ImageError, open_image, to_uint8
from vit.training.autoaugment import apply_autoaugment, autoaugment_table, draw_autoaugment
from vit.training.image_ops import OpSpace, apply_ops, draw_ops, op_space
from vit.training.specs import AUGMENTATIONS, MAX_MAGNITUDE, DataError, folder_layout, image_files, parse_dataset

log = logging.getLogger(__name__)

CACHE_VERSION = 1


@dataclass
class Split:
    images: torch.Tensor  # (N, C, S, S) uint8
    labels: torch.Tensor  # (N,) int64

    def __len__(self) -> int:
        return len(self.labels)

    def to(self, device: torch.device | str) -> Split:
        return Split(self.images.to(device), self.labels.to(device))


@dataclass
class Dataset:
    name: str  # as given to --dataset
    class_names: list[str]
    train: Split
    val: Split
    mean: tuple[float, ...]  # per channel, of the training images scaled to [0, 1]
    std: tuple[float, ...]
    from_cache: bool  # True when nothing had to be decoded


def check_dataset(spec: str, data_dir: str | os.PathLike = "data") -> list[str] | None:
    """Cheap check before a run starts; returns class names when known without decoding."""
    kind, value = parse_dataset(spec)
    if kind == "folder":
        return folder_layout(value)[2]
    return None


# A folder of at least this many images is decoded by processes of vit.training.decoding, one per thread torch may
# use (--threads, VIT_THREADS, else the free cores), each at least SHARE_MIN_FILES: each process imports torch first
# (a second or two), which fewer images would not repay. Measured: 50,000 CIFAR-10 JPEGs took 26 s in one process on
# an H200 machine's CPU, and 0.2 ms an image here.
POOL_MIN_FILES = 2_000
SHARE_MIN_FILES = 1_000
DECODE_WORKER = "vit.training.decoding"


def decode_file(file: Path, image_size: int, num_channels: int) -> torch.Tensor | str:
    """One image through the evaluation transform as ``(C, S, S)`` uint8, or its one-line error."""
    try:
        return to_uint8(open_image(file), image_size, num_channels)
    except ImageError as e:
        return str(e)


def _decode_files(files: list[Path], image_size: int, num_channels: int, scratch: Path) -> list[torch.Tensor | str]:
    """``_decode_file`` of every file, in order: here, or for many files in several processes that write their
    shares into a temporary folder under ``scratch``. A share whose process fails is decoded here instead."""
    workers = min(torch.get_num_threads(), len(files) // SHARE_MIN_FILES)
    if len(files) < POOL_MIN_FILES or workers < 2:
        return [decode_file(file, image_size, num_channels) for file in files]
    import json
    import subprocess
    import sys
    import tempfile

    bounds = [len(files) * k // workers for k in range(workers + 1)]
    shares = [files[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        folder = tempfile.TemporaryDirectory(prefix=".decoding-", dir=scratch)
    except OSError:  # nowhere to write the shares: one process does it all
        return [decode_file(file, image_size, num_channels) for file in files]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VIT_THREADS": "1"}
    processes: list[subprocess.Popen] = []
    with folder as tmp:
        try:
            for k, share in enumerate(shares):
                request = Path(tmp) / f"share{k}.request"
                request.write_text(json.dumps({"files": [str(f) for f in share], "image_size": image_size,
                                               "num_channels": num_channels, "out": str(Path(tmp) / f"share{k}")}))
                with open(Path(tmp) / f"share{k}.log", "wb") as err:
                    processes.append(subprocess.Popen([sys.executable, "-m", DECODE_WORKER, str(request)], env=env,
                                                      stdin=subprocess.DEVNULL, stdout=err, stderr=err))
            decoded: list[torch.Tensor | str] = []
            for k, (share, process) in enumerate(zip(shares, processes, strict=True)):
                decoded += _read_share(Path(tmp) / f"share{k}", share, process.wait(), image_size, num_channels)
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
    return decoded


def _read_share(prefix: Path, share: list[Path], exit_code: int, image_size: int,
                num_channels: int) -> list[torch.Tensor | str]:
    """A worker's share as ``_decode_file`` gives it; decoded here when the worker failed or left no whole result."""
    import json

    import numpy as np

    try:
        if exit_code != 0:
            raise ValueError(f"exit status {exit_code}")
        errors = json.loads(prefix.with_suffix(".json").read_text())["errors"]
        images = np.load(prefix.with_suffix(".npy"), allow_pickle=False)
        if len(errors) != len(share) or len(images) != errors.count(None) or \
                images.shape[1:] != (num_channels, image_size, image_size) or images.dtype != np.uint8:
            raise ValueError("its result does not match its files")
    except (OSError, ValueError, KeyError, TypeError) as e:
        tail = prefix.with_suffix(".log").read_text(errors="replace").strip().splitlines()[-1:] \
            if prefix.with_suffix(".log").is_file() else []
        log.warning("a decoding process failed (%s%s); its %d images are decoded here", e,
                    f": {tail[0]}" if tail else "", len(share))
        return [decode_file(file, image_size, num_channels) for file in share]
    pixels = iter(torch.from_numpy(images))
    return [next(pixels) if error is None else error for error in errors]


def _decode_folder(root: Path, classes: list[str], image_size: int, num_channels: int, scratch: Path) -> Split:
    listed = [(file, label) for label, name in enumerate(classes) for file in image_files(root / name, root)]
    images, labels, bad = [], [], []
    for (_, label), image in zip(listed, _decode_files([f for f, _ in listed], image_size, num_channels, scratch),
                                 strict=True):
        if isinstance(image, str):
            bad.append(image)
        else:
            images.append(image)
            labels.append(label)
    if bad:
        log.warning("skipped %d unreadable image(s) in %s, e.g. %s", len(bad), root, bad[0])
    if not images:
        raise DataError(f"no readable images in {root}")
    return Split(torch.stack(images), torch.tensor(labels, dtype=torch.int64))


def _folder_fingerprint(roots: list[Path]) -> str:
    digest = hashlib.sha1()
    for root in roots:
        digest.update(str(root.resolve()).encode())
        for file in image_files(root):
            stat = file.stat()
            digest.update(f"{file.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


_TORCHVISION = {  # name -> (torchvision class, folder under the data dir, what torchvision expects in it)
    "cifar10": ("CIFAR10", "cifar10", "cifar-10-batches-py/"),
    "cifar100": ("CIFAR100", "cifar100", "cifar-100-python/"),
    "mnist": ("MNIST", "mnist", "MNIST/raw/"),
    "fashion-mnist": ("FashionMNIST", "fashion-mnist", "FashionMNIST/raw/"),
}


def _torchvision_dataset(name: str, data_dir: Path, train: bool):
    import torchvision.datasets

    cls_name, folder, expected = _TORCHVISION[name]
    cls = getattr(torchvision.datasets, cls_name)
    root = data_dir / folder
    try:
        return cls(root=str(root), train=train, download=False)
    except RuntimeError:  # torchvision's "Dataset not found or corrupted"
        pass
    try:
        log.info("downloading %s into %s", name, root)
        return cls(root=str(root), train=train, download=True)
    except Exception as e:  # offline: URLError, socket errors, checksum failures
        raise DataError(f"{name} is not in {root} and could not be downloaded ({type(e).__name__}); put "
                        f"torchvision's {cls_name} files there ({root / expected}) or run once on a connected "
                        f"machine with --data-dir {data_dir}") from None


def _decode_torchvision(name: str, data_dir: Path, train: bool, image_size: int,
                        num_channels: int) -> tuple[Split, list[str]]:
    dataset = _torchvision_dataset(name, data_dir, train)
    images = [to_uint8(image, image_size, num_channels) for image, _ in dataset]
    labels = torch.as_tensor(dataset.targets, dtype=torch.int64)
    return Split(torch.stack(images), labels), list(dataset.classes)


def stratified_split(labels: torch.Tensor, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted indices (train, val) holding out ``round(val_fraction * n_c)`` images of every class c.

    Every class with at least two images keeps at least one image on each side, so a small
    dataset never gets an empty validation split. The draw depends only on ``seed``.
    """
    generator = torch.Generator().manual_seed(seed)
    train_idx, val_idx = [], []
    for c in torch.unique(labels).tolist():
        idx = torch.nonzero(labels == c).flatten()
        idx = idx[torch.randperm(len(idx), generator=generator)]
        n_val = int(round(val_fraction * len(idx)))
        if len(idx) >= 2:
            n_val = min(max(n_val, 1), len(idx) - 1)
        val_idx.append(idx[:n_val])
        train_idx.append(idx[n_val:])
    return torch.cat(train_idx).sort().values, torch.cat(val_idx).sort().values


def load_dataset(spec: str, image_size: int, num_channels: int, data_dir: str | os.PathLike = "data",
                 cache_dir: str | os.PathLike | None = None, val_fraction: float = 0.1,
                 seed: int = 0) -> Dataset:
    """Load (from the uint8 cache when possible) the train and validation splits of ``spec``."""
    kind, value = parse_dataset(spec)
    data_dir = Path(data_dir)
    cache_dir = Path(cache_dir) if cache_dir is not None else data_dir / "cache"
    if kind == "folder":
        train_root, val_root, classes = folder_layout(value)
        roots = [train_root] + ([val_root] if val_root else [])
        key = f"folder-{_folder_fingerprint(roots)}"
    else:
        key = f"{value}"
    cache_file = cache_dir / f"{key}-{image_size}px-{num_channels}ch-v{CACHE_VERSION}.pt"

    cached = _read_cache(cache_file, image_size, num_channels)
    from_cache = cached is not None
    if cached is None:
        if kind == "folder":
            train = _decode_folder(train_root, classes, image_size, num_channels, cache_dir)
            val = _decode_folder(val_root, classes, image_size, num_channels, cache_dir) if val_root else None
        else:
            train, classes = _decode_torchvision(value, data_dir, True, image_size, num_channels)
            val, _ = _decode_torchvision(value, data_dir, False, image_size, num_channels)
        cached = {"class_names": classes, "train": _split_dict(train), "val": _split_dict(val)}
        atomic_torch_save(cached, cache_file)
        log.info("cached %s as %s", spec, cache_file)

    classes = list(cached["class_names"])
    train = Split(cached["train"]["images"], cached["train"]["labels"])
    if cached["val"] is not None:
        val = Split(cached["val"]["images"], cached["val"]["labels"])
    else:
        if not 0 < val_fraction < 1:
            raise DataError(f"{spec} has no validation folder; --val-fraction must be in (0, 1), "
                            f"got {val_fraction}")
        train_idx, val_idx = stratified_split(train.labels, val_fraction, seed)
        train, val = (Split(train.images[train_idx], train.labels[train_idx]),
                      Split(train.images[val_idx], train.labels[val_idx]))
    mean, std = channel_stats(train.images)
    return Dataset(spec, classes, train, val, mean, std, from_cache)


def _split_dict(split: Split | None) -> dict | None:
    return None if split is None else {"images": split.images, "labels": split.labels}


def _read_cache(path: Path, image_size: int, num_channels: int) -> dict | None:
    """The cached splits, or None when missing or not what this version writes (then rebuilt)."""
    if not path.exists():
        return None
    try:
        check_archive(path)  # the same bounds as every torch file read: a planted cache never stalls the reader
        cached = torch.load(path, weights_only=True)
        shape = (num_channels, image_size, image_size)
        for name in ("train", "val"):
            split = cached[name]
            if split is None and name == "val":
                continue
            images, labels = split["images"], split["labels"]
            if images.dtype != torch.uint8 or tuple(images.shape[1:]) != shape or len(images) != len(labels):
                raise ValueError(f"its {name} split is not uint8 images of shape {shape}")
        if not all(isinstance(n, str) for n in cached["class_names"]):
            raise ValueError("its class names are not strings")
    except Exception as e:  # a damaged cache is rebuilt, never trusted
        log.warning("ignoring unreadable data cache %s (%s)", path, str(e).splitlines()[0] if str(e) else e)
        return None
    return cached


def channel_stats(images: torch.Tensor, chunk: int = 4096) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 images ``(N, C, H, W)`` scaled to [0, 1]."""
    total = torch.zeros(images.shape[1], dtype=torch.float64)
    squares = torch.zeros_like(total)
    for start in range(0, len(images), chunk):
        x = images[start:start + chunk].double() / 255.0
        total += x.sum(dim=(0, 2, 3))
        squares += (x * x).sum(dim=(0, 2, 3))
    count = images.shape[0] * images.shape[2] * images.shape[3]
    mean = total / count
    std = (squares / count - mean * mean).clamp_min(1e-12).sqrt()
    return tuple(round(m, 4) for m in mean.tolist()), tuple(round(s, 4) for s in std.tolist())


# ---------------------------------------------------------------------------------------------
# Batched augmentation on uint8 tensors


def _reflect(index: torch.Tensor, size: int) -> torch.Tensor:
    """Indices into a side of ``size`` pixels for positions up to ``size - 1`` beyond it, mirrored
    without repeating the edge pixel (``F.pad``'s reflect mode)."""
    index = index.abs()
    return torch.where(index > size - 1, 2 * (size - 1) - index, index)


def random_crop_flip(images: torch.Tensor, padding: int, flip: bool, generator: torch.Generator | None = None
                     ) -> torch.Tensor:
    """Per-image random crop after reflect padding, and random horizontal flip, for a batch.

    Each output image is an ``H x W`` window of its image reflect-padded by ``padding`` pixels
    (at most side - 1, which reflection allows), mirrored left-right with probability 0.5 when
    ``flip``. dtype and shape are kept. Done as two gathers of source rows and columns, without
    building the padded batch.
    """
    B, C, H, W = images.shape
    device = images.device
    padding = min(padding, H - 1, W - 1)
    if padding <= 0 and not flip:
        return images
    rows = torch.arange(H, device=device).expand(B, H)
    cols = torch.arange(W, device=device).expand(B, W)
    if padding > 0:
        dy = torch.randint(0, 2 * padding + 1, (B,), generator=generator, device=device)
        dx = torch.randint(0, 2 * padding + 1, (B,), generator=generator, device=device)
        rows = _reflect(rows + dy[:, None] - padding, H)  # (B, H) source row of each output row
        cols = _reflect(cols + dx[:, None] - padding, W)  # (B, W)
    if flip:
        mirrored = torch.rand(B, generator=generator, device=device) < 0.5
        cols = torch.where(mirrored[:, None], cols.flip(-1), cols)
    out = images.gather(2, rows[:, None, :, None].expand(B, C, H, W)) if padding > 0 else images
    return out.gather(3, cols[:, None, None, :].expand(B, C, H, W))  # (B, C, H, W)


def _box_sides(batch: int, pixels: int, scale: tuple[float, float], ratio: tuple[float, float], attempts: int,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """torchvision's random box rule, ``attempts`` tries per image: an area fraction uniform in ``scale``, an aspect
    log-uniform in ``ratio``; the sides ``round(sqrt(area * aspect))`` and ``round(sqrt(area / aspect))``, each
    (batch, attempts)."""
    area = torch.empty(batch, attempts, device=device).uniform_(*scale) * pixels
    aspect = torch.exp(torch.empty(batch, attempts, device=device).uniform_(math.log(ratio[0]), math.log(ratio[1])))
    return torch.sqrt(area * aspect).round(), torch.sqrt(area / aspect).round()


def random_resized_crop(images: torch.Tensor, scale: tuple[float, float] = (0.8, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3), attempts: int = 10) -> torch.Tensor:
    """torchvision's RandomResizedCrop parameter rule, applied per image of a batch at once.

    Boxes are drawn as in ``v2.RandomResizedCrop.get_params`` (area fraction in ``scale``,
    log-uniform aspect ratio, up to ``attempts`` tries, else the whole image, which is
    torchvision's fallback too for square images when ``ratio`` contains 1) and resampled
    bilinearly to the input size with one ``grid_sample``. dtype and shape are kept.
    """
    B, C, H, W = images.shape
    device = images.device
    w, h = _box_sides(B, H * W, scale, ratio, attempts, device)
    ok = (w > 0) & (w <= W) & (h > 0) & (h <= H)
    pick = ok.float().argmax(1, keepdim=True)  # the first attempt that fits, (B, 1)
    found = ok.any(1)
    w = torch.where(found, w.gather(1, pick).squeeze(1), float(W))  # (B,)
    h = torch.where(found, h.gather(1, pick).squeeze(1), float(H))
    top = torch.floor(torch.rand(B, device=device) * (H - h + 1))
    left = torch.floor(torch.rand(B, device=device) * (W - w + 1))
    # Affine map from output [-1, 1] to the box, in align_corners=False coordinates.
    theta = torch.zeros(B, 2, 3, device=device)
    theta[:, 0, 0] = w / W
    theta[:, 0, 2] = (2 * left + w) / W - 1
    theta[:, 1, 1] = h / H
    theta[:, 1, 2] = (2 * top + h) / H - 1
    grid = F.affine_grid(theta, [B, C, H, W], align_corners=False)  # (B, H, W, 2) as (x, y)
    # Sample no closer to the box edge than its outer pixel centres, as cropping and then
    # resizing does: pixels outside the box must not bleed into its border.
    low = torch.stack([(2 * left + 1) / W - 1, (2 * top + 1) / H - 1], dim=1)[:, None, None, :]  # (B, 1, 1, 2)
    high = torch.stack([(2 * (left + w) - 1) / W - 1, (2 * (top + h) - 1) / H - 1], dim=1)[:, None, None, :]
    grid = torch.maximum(torch.minimum(grid, high), low)
    out = F.grid_sample(images.float(), grid, mode="bilinear", padding_mode="border", align_corners=False)
    return out.round().clamp(0, 255).to(images.dtype)


def random_erasing(images: torch.Tensor, probability: float, scale: tuple[float, float] = (0.02, 0.33),
                   ratio: tuple[float, float] = (0.3, 3.3), attempts: int = 10) -> torch.Tensor:
    """torchvision's RandomErasing (Zhong et al. 2017) per image of a normalised batch at once: with
    ``probability`` a box is set to 0, the data's mean after normalisation (timm's ``mode="const"``).

    Boxes are drawn as in ``v2.RandomErasing.get_params``: area fraction in ``scale``, log-uniform aspect ratio,
    up to ``attempts`` tries for one smaller than the image on both sides, else none. dtype and shape are kept.
    """
    B, _, H, W = images.shape
    device = images.device
    h, w = _box_sides(B, H * W, scale, ratio, attempts, device)  # torchvision's erasing: height first
    ok = (h < H) & (w < W)
    pick = ok.float().argmax(1, keepdim=True)  # the first attempt that fits, (B, 1)
    erase = ok.any(1) & (torch.rand(B, device=device) < probability)
    h, w = h.gather(1, pick).squeeze(1), w.gather(1, pick).squeeze(1)  # (B,)
    top = torch.floor(torch.rand(B, device=device) * (H - h + 1))
    left = torch.floor(torch.rand(B, device=device) * (W - w + 1))
    rows = torch.arange(H, device=device)[None, :]
    cols = torch.arange(W, device=device)[None, :]
    inside_rows = (rows >= top[:, None]) & (rows < (top + h)[:, None])  # (B, H)
    inside_cols = (cols >= left[:, None]) & (cols < (left + w)[:, None])  # (B, W)
    box = inside_rows[:, :, None] & inside_cols[:, None, :] & erase[:, None, None]  # (B, H, W)
    return images.masked_fill(box[:, None], 0)


# The policies' names and RandAugment's largest magnitude are vit.train's options (vit.training.options); their
# ops, vectorised, are vit.training.image_ops's.


class BatchAugment:
    """The training transform of a recipe, applied to uint8 batches ``(B, C, H, W)``.

    ``policy``: ``none``; ``crop`` (reflect-pad 4 px, random crop: for digits and text,
    which must not be mirrored); ``flip-crop`` (reflect-pad 4 px, random crop, flip); ``trivialaugment``
    or ``randaugment`` (torchvision's, on top of flip-crop, with an op and magnitude drawn per image); ``autoaugment``
    (torchvision's CIFAR-10 policy on top of flip-crop, a sub-policy drawn per image: ``vit.training.autoaugment``);
    ``seed`` (the seed blog's flip + RandomResizedCrop 0.8-1.0).
    """

    def __init__(self, policy: str, magnitude: int = 9, num_ops: int = 2, padding: int = 4) -> None:
        if policy not in AUGMENTATIONS:
            raise ValueError(f"unknown augmentation {policy!r}; choose one of {', '.join(AUGMENTATIONS)}")
        if not 0 <= magnitude <= MAX_MAGNITUDE:
            raise ValueError(f"RandAugment magnitude must be in 0..{MAX_MAGNITUDE}, got {magnitude}")
        self.policy, self.padding = policy, padding
        self.magnitude_bin = None if policy == "trivialaugment" else magnitude  # TrivialAugment draws the bin
        self.num_ops = num_ops if policy == "randaugment" else 1
        self._spaces: dict[tuple, OpSpace] = {}  # or AutoAugment's tables

    def prepare(self, height: int, width: int, device: torch.device | str) -> OpSpace | None:
        """The op space for images of this size on ``device``, built once (RandAugment's translations depend on the
        size). A compiled augmentation must find it built: tensors made inside a CUDA-graph replay
        (``--compile-mode reduce-overhead``) are overwritten by the next replay, so the trainer prepares it first."""
        if self.policy not in ("trivialaugment", "randaugment", "autoaugment"):
            return None
        key = (height, width, torch.device(device))
        if key not in self._spaces and self.policy == "autoaugment":
            self._spaces[key] = autoaugment_table(*key)
        elif key not in self._spaces:
            self._spaces[key] = op_space(self.policy, *key)
        return self._spaces[key]

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if self.policy == "none":
            return images
        if self.policy == "seed":
            images = random_resized_crop(images, scale=(0.8, 1.0))
            return random_crop_flip(images, padding=0, flip=True)
        images = random_crop_flip(images, self.padding, flip=self.policy != "crop")
        if self.policy in ("trivialaugment", "randaugment"):
            space = self.prepare(*images.shape[-2:], images.device)
            for _ in range(self.num_ops):
                op, magnitude = draw_ops(space, len(images), images.device, self.magnitude_bin)
                images = apply_ops(images, space, op, magnitude)
        if self.policy == "autoaugment":
            table = self.prepare(*images.shape[-2:], images.device)
            images = apply_autoaugment(images, table, *draw_autoaugment(table, len(images), images.device))
        return images
