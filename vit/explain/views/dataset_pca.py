"""PCA colours of every image of a dataset (``python -m vit.analyze ... --pca``): one layer's patch tokens (after
the final norm, CLS and registers left out) of each image at the checkpoint's size, their first three principal
components as RGB, written as ``pca/<class>/<file name>.png`` and ``.npz``: the picture and the arrays
``vit.pca(checkpoint, image, layer)`` gives for that image; ``report.html`` shows a grid of them, a few per class.

Fitted on each image alone, or with ``joint`` on the tokens of every image together, so a colour means the same
across them (``vit.pca`` of the list of all the images). The joint fit streams the tokens' mean and scatter
(``dense.PCAMoments``: ``D x D`` numbers) through a first pass and colours them in a second, so it holds one
image's tokens, whatever the folder holds, for twice the forwards. Each forward stops after the layer asked for.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from urllib.parse import quote

import numpy as np
import torch
from PIL import Image

from vit.checkpoint import Checkpoint
from vit.core.images import ImageError, open_image
from vit.core.inference import TRAINING_SIZE, preprocess, seen_region
from vit.core.runfiles import atomic_write_with
from vit.costs import bounds, memory
from vit.explain.methods import dense
from vit.explain.methods.stage_maps import on_patch_grid
from vit.explain.views.overlay import pca_picture, write_png

FOLDER = "pca"  # inside the analysis folder
# report.html's grid of the pictures: a few of each class, every one a link to its file (all of them are in pca/)
REPORT_PER_CLASS = 8
REPORT_MOST = 64
REPORT_SIDE = 128  # px, a picture's long side there: a 32-px one enlarged 4x pixel for pixel, a larger one reduced




def image_bytes(checkpoint: Checkpoint) -> int:
    """Bytes one image's pass to a layer holds at most (``memory.pass_bytes``) with the PCA's copies of the patch
    tokens (``dense.DENSE_COPIES``)."""
    model = checkpoint.model
    size = checkpoint.preprocessing.image_size
    grid = model.patch_grid(size, size)
    return memory.pass_bytes(model.config, model.num_prefix_tokens + grid[0] * grid[1], dense.DENSE_COPIES)


def check_pca(checkpoint: Checkpoint, layer: int | None) -> int:
    """The block ``layer`` (counted from 1; None: the last) as an index from 0, checked before any work, with the
    bounds every analysed image has (``vit.costs.bounds``): the token gate (VIT_MAX_TOKENS) at the checkpoint's size and
    the memory one image's pass needs. ValueError or ``bounds.TooManyTokens``, in one line."""
    model = checkpoint.model
    L = len(model.blocks)
    if layer is not None and not 1 <= layer <= L:
        raise ValueError(f"--pca-layer {layer} is out of range: this model has {L} layers, counted from 1")
    size = checkpoint.preprocessing.image_size
    grid = model.patch_grid(size, size)
    if grid[0] * grid[1] < 2:
        raise ValueError(f"--pca: a {size}×{size} px image is one patch for this model; a PCA needs at least 2")
    bounds.check_tokens(model.config, grid[0] * grid[1], f"--pca at the checkpoint's {size}×{size} px",
                        bounds.max_tokens(), f"raise {bounds.MAX_TOKENS_ENV}, or leave out --pca")
    need, limit = image_bytes(checkpoint), bounds.memory_limit()
    if need > limit:
        raise bounds.TooManyTokens(f"--pca: one {size}×{size} px image needs about {need / 2**20:,.0f} MB (one "
                                   f"block's work and the PCA's copies of its tokens), over the "
                                   f"{limit / 2**20:,.0f} MB limit per image ({bounds.ANALYSIS_MEMORY_ENV}); raise "
                                   "it, or leave out --pca")
    return L - 1 if layer is None else layer - 1


def layer_tokens(checkpoint: Checkpoint, image, index: int) -> torch.Tensor:
    """Block ``index``'s output after the final norm, patch tokens only: ``(gh * gw, D)`` float32, as the explorer
    reads them (one forward at the checkpoint's size that stops after block ``index``: the blocks after it are not
    run)."""
    model = checkpoint.model
    parameter = next(model.parameters())
    x = preprocess([image], checkpoint.preprocessing, TRAINING_SIZE, model.config.patch_size).to(parameter.device)
    with torch.inference_mode():
        stream, _ = model.run_blocks(model.embed(x), model.patch_grid(*x.shape[2:]), 0, index + 1)  # (1, T, D)
        if model.config.stage_depths:  # a stage layer's own grid and width (Swin, Hiera)
            return dense.stage_tokens(model, stream, index)[0]
        tokens = model.norm(stream)[0]  # (T, D)
    return tokens[model.num_prefix_tokens:].float().cpu()


def _open(path: Path):
    """The image at ``path``, or None when it cannot be read (the analysis names such files)."""
    try:
        return open_image(Path(path).read_bytes(), name=Path(path).name)
    except (OSError, ImageError):
        return None


def _target(out: Path, root: Path, path: Path) -> Path:
    """Where ``path``'s files go: its path under ``root`` with the suffix kept (``cat/0.jpg`` -> ``pca/cat/0.jpg``
    + ``.png``), so ``0.jpg`` and ``0.png`` of one class do not overwrite each other."""
    try:
        relative = Path(path).relative_to(root)
    except ValueError:
        relative = Path(Path(path).parent.name, Path(path).name)
    return out / FOLDER / relative


def write_pca(checkpoint: Checkpoint, files: Sequence[tuple[Path, int]], root: Path, out: Path,
              layer: int | None = None, joint: bool = False,
              progress: Callable[[int, int], None] | None = None) -> dict:
    """Write the PCA picture (``.png``) and arrays (``.npz``: ``map (gh, gw, 3)``, ``mask``, ``layer`` from 0, as
    ``vit.pca``'s ``.save``) of every readable image of ``files`` (under ``root``) into ``out/pca``;
    ``progress(done, total)`` after each image's forward (two per image with ``joint``). Returns what
    ``analysis.json`` records of it."""
    index = check_pca(checkpoint, layer)
    total, done = len(files) * (2 if joint else 1), 0
    size = checkpoint.preprocessing.image_size
    grid = checkpoint.model.patch_grid(size, size)
    model = checkpoint.model
    layer_grid = model.layer_layouts(grid)[index].grid if model.config.stage_depths else grid
    fit = None
    if joint:
        moments = dense.PCAMoments()
        for path, _ in files:
            image = _open(path)
            if image is not None:
                moments.add(layer_tokens(checkpoint, image, index))
            done += 1
            if progress is not None:
                progress(done, total)
        if moments.count < 2:
            raise ValueError("a PCA over the images needs at least 2 patch tokens; none of the images could be read")
        fit = moments.fit()
    written = 0
    for path, _ in files:
        image = _open(path)
        if image is not None:
            tokens = layer_tokens(checkpoint, image, index)
            colours = dense.pca_colours(tokens, fit if fit is not None else dense.fit_pca(tokens))  # (gh * gw, 3)
            colours = colours.reshape(*layer_grid, 3).numpy()
            if layer_grid != grid:  # a stage layer's cells, each over the patches it covers
                colours = np.moveaxis(on_patch_grid(np.moveaxis(colours, -1, 0), grid), 0, -1)
            target = _target(out, root, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            seen = seen_region(image, checkpoint.preprocessing)
            write_png(target.with_name(target.name + ".png"), pca_picture(seen, colours))
            atomic_write_with(target.with_name(target.name + ".npz"), partial(
                np.savez_compressed, map=colours, mask=np.ones(colours.shape[:2], dtype=bool), layer=np.int64(index)))
            written += 1
        done += 1
        if progress is not None:
            progress(done, total)
    return {"folder": FOLDER, "images": written, "layer": index + 1,
            "fit": "all the images together" if joint else "each image alone"}


def report_section(files: Sequence[tuple[Path, int]], class_names: Sequence[str], root: Path, out: Path,
                   record: dict) -> str:
    """``report.html``'s section of the pictures ``write_pca`` wrote (``record``: what it returned) for ``files``
    (under ``root``) into ``out``: up to ``REPORT_PER_CLASS`` per class, ``REPORT_MOST`` in all, in a grid under
    each class's name, each embedded (the report stays one file) with ``REPORT_SIDE`` px on its long side (a
    small picture enlarged by a whole factor, its pixels kept sharp), linked to its file and captioned with it."""
    chosen: dict[int, list[Path]] = {}
    for path, label in files:
        picture = _target(out, root, path)
        picture = picture.with_name(picture.name + ".png")
        if (len(chosen.get(label, ())) < REPORT_PER_CLASS and sum(map(len, chosen.values())) < REPORT_MOST
                and picture.is_file()):
            chosen.setdefault(label, []).append(picture)
    shown = sum(map(len, chosen.values()))
    parts = [f"<section><h2>PCA colours</h2><p>Block {record['layer']}'s patch tokens, their first three principal "
             f"components as RGB, fitted on {html.escape(record['fit'])}: {shown} of the {record['images']} "
             f"pictures, every one in {FOLDER}/ (.png, and the arrays as .npz).</p>"]
    for label in sorted(chosen):
        name = class_names[label] if 0 <= label < len(class_names) else str(label)
        parts.append(f"<h3>{html.escape(name)}</h3><div style='display:flex;flex-wrap:wrap;gap:12px'>")
        for picture in chosen[label]:
            with Image.open(picture) as opened:
                image = opened.convert("RGB")
            long = max(image.size)
            if long > REPORT_SIDE:  # reduced for the page; nearest keeps each patch's own colour
                factor = REPORT_SIDE / long
                image = image.resize((max(1, round(image.width * factor)), max(1, round(image.height * factor))),
                                     Image.Resampling.NEAREST)
                width, height = image.size
            else:
                width, height = (side * (REPORT_SIDE // long) for side in image.size)
            data = io.BytesIO()
            image.save(data, format="PNG")
            relative = picture.relative_to(out).as_posix()
            caption = html.escape(picture.relative_to(out / FOLDER).as_posix().removesuffix(".png"))
            parts.append(f"<figure style='margin:0'><a href='{quote(relative)}'><img alt='{caption}' "
                         f"width='{width}' height='{height}' style='image-rendering:pixelated' "
                         f"src='data:image/png;base64,{base64.b64encode(data.getvalue()).decode()}'></a>"
                         f"<figcaption style='font:12px sans-serif'>{caption}</figcaption></figure>")
        parts.append("</div>")
    return "".join(parts) + "</section>"
