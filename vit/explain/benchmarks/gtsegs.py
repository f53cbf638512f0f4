"""The ImageNet-segmentation file of Chefer et al.'s test: ``gtsegs_ijcv.mat`` (Guillaumin et al., IJCV 2014).

A MATLAB v7.3 file, so HDF5, read as their ``Imagenet_Segmentation`` (``data/Imagenet.py`` of
github.com/hila-chefer/Transformer-Explainability) reads it: ``/value/img`` and ``/value/gt`` are ``(N, 1)``
datasets of object references; image ``i`` is the ``(3, W, H)`` uint8 dataset ``/value/img[i, 0]`` points at
(MATLAB's column-major ``(H, W, 3)``), its mask the ``(W, H)`` dataset that the first cell of the reference array
``/value/gt[i, 0]`` points at. Every size the file declares is checked before the data is read, so a file that
declares a huge array is refused in one line instead of allocating it; and every dataset read must be stored in the
file itself: HDF5 lets a dataset's bytes live in other files (external storage, virtual datasets) and a group be a
link into another file, which would read whatever they name (/etc/hostname, /dev/zero, a FIFO that never answers).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from vit.core.images import MAX_SIDE, UPLOAD_MAX_PIXELS, reduce_to_side
from vit.core.runfiles import open_regular

MAX_ITEMS = 100_000  # the paper's file holds 4,276
# per image or mask, the uploads' bound: 120 MB of RGB while it is read; the file's images are ImageNet photographs
# (~500 px)
MAX_PIXELS = UPLOAD_MAX_PIXELS


class GtSegsError(ValueError):
    """A file that is not laid out as gtsegs_ijcv.mat, with a one-line message."""


class GtSegs:
    """An open ``gtsegs_ijcv.mat``: ``len(file)`` items, ``file.item(i)`` -> ``(RGB image, (H, W) 0/1 uint8 mask)``.
    Use as a context manager (or call ``close``). GtSegsError in one line for a file that is not so laid out."""

    def __init__(self, path: str | Path):
        import h5py

        self.path = Path(path)
        try:  # a regular file only, handed to HDF5 open: a FIFO would block the open
            self._stream = open_regular(self.path)
        except OSError as e:
            raise GtSegsError(f"cannot read {self.path}: {e.strerror or e}") from None
        try:
            self.file = h5py.File(self._stream, "r")
        except OSError as e:
            self._stream.close()
            raise GtSegsError(f"{self.path} is not an HDF5 file (MATLAB v7.3, as gtsegs_ijcv.mat): {e}") from None
        try:
            self.images = self._references("/value/img")
            self.masks = self._references("/value/gt")
        except GtSegsError:
            self.close()
            raise
        if len(self.images) != len(self.masks):
            self.file.close()
            raise GtSegsError(f"{self.path} has {len(self.images)} images but {len(self.masks)} masks")

    def _references(self, name: str):
        """The ``(N, 1)`` reference dataset ``name``, its size checked."""
        import h5py

        parts = name.strip("/").split("/")
        for depth in range(1, len(parts) + 1):  # each link on the way, before it is followed
            path = "/" + "/".join(parts[:depth])
            if isinstance(self.file.get(path, getlink=True), h5py.ExternalLink):
                raise GtSegsError(f"{self.path}: {path} is a link into another file; only what the file itself "
                                  "holds is read")
        data = self.file.get(name)
        if not isinstance(data, h5py.Dataset) or h5py.check_dtype(ref=data.dtype) is not h5py.Reference:
            raise GtSegsError(f"{self.path} has no {name} dataset of references: not laid out as gtsegs_ijcv.mat")
        if data.ndim != 2 or data.shape[1] < 1 or data.shape[0] > MAX_ITEMS:
            raise GtSegsError(f"{self.path}: {name} has shape {data.shape}, expected (N, 1) with N at most {MAX_ITEMS}")
        return self._stored_here(data, name)

    def _stored_here(self, data, what: str):
        """``data`` once it is known to keep its bytes in this file: no external storage, not a virtual dataset."""
        if data.external or data.is_virtual:
            kind = "external storage" if data.external else "a virtual dataset"
            raise GtSegsError(f"{self.path}: {what} keeps its data in other files ({kind}); only data stored in the "
                              "file itself is read")
        return data

    def __len__(self) -> int:
        return self.images.shape[0]

    def _target(self, reference, what: str):
        import h5py

        try:
            target = self.file[reference]
        except (ValueError, KeyError, TypeError) as e:  # a null or dangling reference
            raise GtSegsError(f"{self.path}: {what} is not a valid reference ({e})") from None
        if not isinstance(target, h5py.Dataset):
            raise GtSegsError(f"{self.path}: {what} points at a group, not a dataset")
        return self._stored_here(target, what)

    def _checked(self, data, ndim: int, what: str):
        """``data`` once its declared shape and type are checked (nothing read yet)."""
        shape = data.shape
        if data.ndim != ndim or data.dtype.kind not in "biuf":
            raise GtSegsError(f"{self.path}: {what} has shape {shape} and type {data.dtype}, expected {ndim} "
                              "dimensions of numbers")
        if int(np.prod(shape[-2:], dtype=np.int64)) > MAX_PIXELS:
            raise GtSegsError(f"{self.path}: {what} declares {shape[-2]} x {shape[-1]} pixels, more than "
                              f"{MAX_PIXELS:,}")
        return data

    def _datasets(self, index: int):
        """Image ``index``'s picture and mask datasets, their layout and sizes checked."""
        import h5py

        picture = self._checked(self._target(self.images[index, 0], f"/value/img[{index}]"), 3, f"image {index}")
        if picture.shape[0] != 3 or picture.dtype != np.uint8:
            raise GtSegsError(f"{self.path}: image {index} has shape {picture.shape} and type {picture.dtype}, "
                              "expected (3, width, height) uint8")
        cell = self._target(self.masks[index, 0], f"/value/gt[{index}]")
        if h5py.check_dtype(ref=cell.dtype) is not h5py.Reference or cell.ndim != 2 or 0 in cell.shape:
            raise GtSegsError(f"{self.path}: /value/gt[{index}] points at {cell.shape} {cell.dtype}, expected an "
                              "array of references to masks")
        return picture, self._checked(self._target(cell[0, 0], f"mask {index}"), 2, f"mask {index}")

    def check(self) -> None:
        """Every item's layout and declared sizes (metadata only: a second for the paper's 4,276), before any work;
        GtSegsError in one line for the first wrong one."""
        for index in range(len(self)):
            self._datasets(index)

    def item(self, index: int) -> tuple[Image.Image, np.ndarray]:
        """Image ``index`` as an RGB PIL image and its mask as ``(H, W)`` uint8, 1 where it is not 0, both reduced as
        every decoded image is (``vit.core.images.reduce_to_side``: a long side of at most ``MAX_SIDE``; the mask
        nearest,
        to the same size): a 6,000-px picture holds 12 MB, not 108."""
        picture, mask = self._datasets(index)
        image = reduce_to_side(Image.fromarray(np.ascontiguousarray(picture[()].transpose(2, 1, 0))))  # (H, W, 3)
        cut = Image.fromarray((mask[()].transpose(1, 0) != 0).astype(np.uint8))
        cut.thumbnail((MAX_SIDE, MAX_SIDE), Image.NEAREST, reducing_gap=None)  # the image's size, for the same side
        return image, np.asarray(cut)

    def close(self) -> None:
        self.file.close()
        self._stream.close()

    def __enter__(self) -> GtSegs:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
