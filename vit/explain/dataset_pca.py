"""PCA colours of every image of a dataset (``python -m vit.analyze ... --pca``): one layer's patch tokens (after
the final norm, CLS and registers left out) of each image at the checkpoint's size, their first three principal
components as RGB, written as ``pca/<class>/<file name>.png`` and ``.npz``: the picture and the arrays
``vit.pca(checkpoint, image, layer)`` gives for that image.

Fitted on each image alone, or with ``joint`` on the tokens of every image together, so a colour means the same
across them (``vit.pca`` of the list of all the images). The joint fit streams the tokens' mean and scatter
(``dense.PCAMoments``: ``D x D`` numbers) through a first pass and colours them in a second, so it holds one
image's tokens, whatever the folder holds, for twice the forwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from vit import bounds
from vit.checkpoint import Checkpoint
from vit.explain import dense
from vit.explain.hidden import forward_with_hidden_states
from vit.explain.overlay import pca_picture
from vit.images import ImageError, open_image
from vit.inference import TRAINING_SIZE, preprocess, seen_region

FOLDER = "pca"  # inside the analysis folder


def image_bytes(checkpoint: Checkpoint) -> int:
    """Bytes one image's pass holds at most: every layer's states (as the explorer's analysis keeps them) and the
    PCA's copies of the patch tokens (``dense.DENSE_COPIES``)."""
    config, model = checkpoint.model.config, checkpoint.model
    size = checkpoint.preprocessing.image_size
    grid = model.patch_grid(size, size)
    tokens = model.num_prefix_tokens + grid[0] * grid[1]
    return (config.num_layers + 1) * tokens * config.hidden_size * 4 + dense.DENSE_COPIES * tokens * config.hidden_size


def check_pca(checkpoint: Checkpoint, layer: int | None) -> int:
    """The block ``layer`` (counted from 1; None: the last) as an index from 0, checked before any work, with the
    memory one image's pass needs: ValueError or ``bounds.TooManyTokens``, in one line."""
    L = len(checkpoint.model.blocks)
    if layer is not None and not 1 <= layer <= L:
        raise ValueError(f"--pca-layer {layer} is out of range: this model has {L} layers, counted from 1")
    size = checkpoint.preprocessing.image_size
    if np.prod(checkpoint.model.patch_grid(size, size)) < 2:
        raise ValueError(f"--pca: a {size}×{size} px image is one patch for this model; a PCA needs at least 2")
    need, limit = image_bytes(checkpoint), bounds.memory_limit()
    if need > limit:
        size = checkpoint.preprocessing.image_size
        raise bounds.TooManyTokens(f"--pca: one {size}×{size} px image needs about {need / 2**20:,.0f} MB (every "
                                   f"layer's tokens and the PCA's copies), over the {limit / 2**20:,.0f} MB limit "
                                   f"per image ({bounds.ANALYSIS_MEMORY_ENV}); raise it, or leave out --pca")
    return L - 1 if layer is None else layer - 1


def layer_tokens(checkpoint: Checkpoint, image, index: int) -> torch.Tensor:
    """Block ``index``'s output after the final norm, patch tokens only: ``(gh * gw, D)`` float32, as the explorer
    reads them (one forward at the checkpoint's size)."""
    model = checkpoint.model
    parameter = next(model.parameters())
    x = preprocess([image], checkpoint.preprocessing, TRAINING_SIZE, model.config.patch_size).to(parameter.device)
    with torch.inference_mode():
        _, hidden = forward_with_hidden_states(model, x)  # (1, L + 1, T, D)
        state = hidden[0, index + 1].float().cpu()  # (T, D)
        tokens = model.norm(state[None].to(parameter.device, parameter.dtype))[0]
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
            colours = colours.reshape(*grid, 3).numpy()
            target = _target(out, root, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            seen = seen_region(image, checkpoint.preprocessing)
            pca_picture(seen, colours).save(target.with_name(target.name + ".png"), format="PNG")
            np.savez_compressed(target.with_name(target.name + ".npz"), map=colours,
                                mask=np.ones(colours.shape[:2], dtype=bool), layer=np.int64(index))
            written += 1
        done += 1
        if progress is not None:
            progress(done, total)
    return {"folder": FOLDER, "images": written, "layer": index + 1,
            "fit": "all the images together" if joint else "each image alone"}
