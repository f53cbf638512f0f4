"""SAM and SAM 2: prompts in, masks out (``vit.segment``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from vit.api.arguments import ImageLike, checked_index, pil_image, save_as
from vit.checkpoint import Checkpoint
from vit.core.inference import input_box, seen_region
from vit.explain.views.overlay import (
    map_colours,
    to_png_bytes,
)
from vit.explain.views.overlay import overlay as draw_overlay


@dataclass
class Segmentation:
    """SAM's answer to one prompt on one image: ``scores (M,)`` (the predicted IoU of each mask: transformers'
    ``iou_scores``), ``mask_logits (M, 4gh, 4gw)`` (the decoder's low-resolution logits over the input it saw:
    ``pred_masks``), ``masks (M, H, W)`` bool on the image (the processor's ``post_process_masks``); ``mask`` the
    explained one (the best scored unless chosen). ``attention``: each decoder cross-attention of output ``token``
    of that mask, ``{module: (heads, gh, gw)}`` on the image embedding's grid (``gh x gw``, SAM's 64 x 64), over
    ``seen``; ``maps``: ``{method: (rows, cols)}`` over ``seen`` (pixels of the input the model saw; ``patch_maps``:
    summed over each patch of the image encoder's grid)."""

    scores: np.ndarray
    mask_logits: np.ndarray
    masks: np.ndarray
    mask: int
    token: str
    attention: dict[str, np.ndarray]
    maps: dict[str, np.ndarray]
    patch_maps: dict[str, np.ndarray]
    image: Image.Image
    seen: Image.Image
    input_box: tuple[float, float, float, float]
    points: tuple[tuple[float, float, int], ...] = ()
    box: tuple[float, float, float, float] | None = None
    embedding_reused: bool = False  # the image's embedding was kept from an earlier prompt: the decoder alone ran

    def picture(self, mask: int | None = None, alpha: float = 0.5) -> Image.Image:
        """Mask ``mask`` (default the explained one) tinted over the image, the prompt's points
        (green on the object, red off it) and box marked."""
        from PIL import ImageDraw

        count = len(self.scores)
        index = self.mask if mask is None else checked_index(mask, count, "mask", f"{count} masks")
        shown = np.asarray(self.image.convert("RGB"), dtype=np.float32)
        inside = self.masks[index]
        shown[inside] = (1 - alpha) * shown[inside] + alpha * np.array([30, 144, 255], dtype=np.float32)
        picture = Image.fromarray(shown.round().astype(np.uint8))
        draw = ImageDraw.Draw(picture)
        radius = max(2, round(max(picture.size) / 100))
        for x, y, label in self.points:
            draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=(0, 200, 0) if label else (220, 0, 0),
                         outline=(255, 255, 255))
        if self.box is not None:
            draw.rectangle(self.box, outline=(255, 215, 0), width=max(1, radius // 2))
        return picture

    def overlay(self, name: str, head: int | None = None, alpha: float = 0.6, colormap: str = "inferno"
                ) -> Image.Image:
        """A map over the pixels the model saw: a decoder attention (a key of ``attention``; ``head`` one of its
        heads, default their mean) or a key of ``maps``."""
        if name in self.attention:
            heads = self.attention[name]
            values = heads.mean(axis=0) if head is None else heads[checked_index(head, len(heads), "head",
                                                                                  f"{len(heads)} heads")]
        elif name in self.maps:
            values = self.maps[name]
        else:
            raise ValueError(f"no map {name!r} here; choose one of {', '.join([*self.attention, *self.maps])}")
        from vit.explain.methods.segment import SIGNED_MAPS

        kind = "attnlrp" if name in SIGNED_MAPS else ""  # signed maps on a scale around 0
        cmap, vmin, vmax = map_colours(kind, values, colormap)
        return draw_overlay(self.seen, values, opacity=alpha, colormap=cmap, vmin=vmin, vmax=vmax)

    def save(self, path: str | os.PathLike) -> Path:
        """``.png``: ``picture()``; ``.npz``: ``scores``, ``mask_logits``, ``masks``, ``mask``, ``points`` (n, 3),
        ``box``, ``input_box``, each attention as ``attention/<module>`` and each map as ``map/<method>`` (with
        ``patch_map/<method>``)."""
        arrays = {"scores": self.scores, "mask_logits": self.mask_logits, "masks": self.masks,
                  "mask": np.int64(self.mask), "token": np.str_(self.token),
                  "points": np.array(self.points, dtype=np.float64).reshape(-1, 3),
                  "box": np.array(self.box if self.box is not None else (), dtype=np.float64),
                  "input_box": np.array(self.input_box, dtype=np.float64),
                  **{f"attention/{k}": v for k, v in self.attention.items()},
                  **{f"map/{k}": v for k, v in self.maps.items()},
                  **{f"patch_map/{k}": v for k, v in self.patch_maps.items()}}
        return save_as(path, self.picture(), arrays)

    def _repr_png_(self) -> bytes:
        return to_png_bytes(self.picture())


def segment(checkpoint: Checkpoint, image: ImageLike, points: Sequence[Sequence[float]] | None = None,
            box: Sequence[float] | None = None, *, mask: int | None = None, token: str = "mask",
            methods: Sequence[str] = (), at: Sequence[float] | None = None) -> Segmentation:
    """SAM's or SAM 2's masks for a prompt: ``points`` ``[(x, y), (x, y, label), ...]`` (label 1 on the object, the
    default; 0 off it) and / or ``box`` ``(x0, y0, x1, y1)``, in the image's own pixels (x from the left, y from the
    top), mapped as the library's processor maps them. ``checkpoint`` is a whole SAM / SAM 2 (an HF ``SamModel`` /
    ``Sam2Model`` folder or Hub id opened by ``vit.load``): our image encoder, then transformers' own neck, prompt
    encoder and mask decoder with the folder's weights. The image's embedding is kept (the last few images), so
    another prompt on the same image runs the decoder alone.

    ``mask``: which of the three masks the attention and maps explain (default the best scored); ``token``:
    ``"mask"`` (that mask's output token) or ``"iou"`` (the IoU token) for the decoder attention; ``methods``:
    ``"gradient_x_input"``, ``"attnlrp"`` (AttnLRP, lxt's rules through the decoder, the neck and the encoder) or
    ``"legrad"`` (LeGrad on SAM's encoder, the neck and decoder reading each of its last two layers; on the patch
    grid, each patch's value on its pixels in ``maps``) of the mask's logits, summed over the mask or at image pixel
    ``at = (x, y)`` (their memory checked first by the cost model: the encoder's gradient at 1,024 px is the costly
    part). ValueError in one line
    (``PromptError``, ``PromptHalfError`` for a model without its prompt half, ``TooManyTokens``)."""
    from vit.explain.methods.relevance import patch_sums
    from vit.explain.methods.segment import make_prompt, segmenter
    from vit.sources.sam_prompts import open_prompt_half

    image = pil_image(image)
    prompt = make_prompt(points, box, image.size)
    if isinstance(methods, str):
        methods = (methods,)
    where = None
    if at is not None:
        if not isinstance(at, (tuple, list)) or len(at) != 2:
            raise ValueError(f"at must be an image pixel (x, y), got {at!r}")
        where = (float(at[0]), float(at[1]))
    p = checkpoint.preprocessing
    done = segmenter(checkpoint, open_prompt_half).segment(image, prompt, mask, token, tuple(methods), where)
    grid = checkpoint.model.patch_grid(*p.image_hw)
    seen = seen_region(image, p)
    maps, patch_maps = {}, {}
    for name, values in done.maps.items():
        if tuple(values.shape) == tuple(grid):  # LeGrad's, on the patch grid: each patch's value on its pixels
            ph, pw = (side // g for side, g in zip(p.image_hw, grid, strict=True))
            patch_maps[name] = values.numpy().astype(np.float32)
            maps[name] = values.repeat_interleave(ph, 0).repeat_interleave(pw, 1).numpy().astype(np.float32)
        else:  # a pixel map, summed over each patch
            maps[name] = values.numpy().astype(np.float32)
            patch_maps[name] = patch_sums(values[None], grid)[0].numpy().astype(np.float32)
    return Segmentation(done.scores.numpy(), done.mask_logits.numpy(), done.masks.numpy(), done.mask, done.token,
                        {k: v.numpy() for k, v in done.attention.items()}, maps, patch_maps, image, seen,
                        input_box(image.size, p), prompt.points, prompt.box, done.embedding_reused)
