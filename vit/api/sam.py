"""SAM and SAM 2: prompts in, masks out (``vit.segment``); SAM 3: a concept in (a noun phrase, an exemplar box),
its instances out (``vit.open_sam3``, ``vit.segment(sam3, image, text=...)``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from vit.sources.sam3 import Sam3


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


@dataclass
class ConceptSegmentation:
    """SAM 3's answer to a concept on one image (``vit.segment(sam3, image, text=..., box=...)``): the instances
    transformers' ``Sam3Model`` and its processor keep over the threshold, in the decoder's query order: ``scores
    (N,)``, ``boxes (N, 4)`` (x0, y0, x1, y1 in the image's pixels), ``masks (N, H, W)`` bool on the image,
    ``queries (N,)`` (the decoder query of each); ``presence`` the concept's presence score; ``instance`` the
    explained one (the best scored unless chosen; None when none is kept), its ``attention`` ``{"decoder layer k":
    (heads, gh, gw)}`` (its object query's vision cross-attention on the DETR encoder's grid) and ``maps``
    ``{method: (h, w)}``, both over ``seen`` (the input the model saw)."""

    text: str | None
    box: tuple[float, float, float, float] | None
    scores: np.ndarray
    boxes: np.ndarray
    masks: np.ndarray
    queries: np.ndarray
    presence: float
    instance: int | None
    attention: dict[str, np.ndarray]
    maps: dict[str, np.ndarray]
    image: Image.Image
    seen: Image.Image

    def picture(self, instance: int | None = None, alpha: float = 0.5) -> Image.Image:
        """Instance ``instance`` (default the explained one) tinted over the image, its box outlined, the exemplar
        box dashed in yellow; the image alone when no instance is kept."""
        from PIL import ImageDraw

        shown = np.asarray(self.image.convert("RGB"), dtype=np.float32)
        index = self.instance if instance is None else checked_index(instance, len(self.scores), "instance",
                                                                     f"{len(self.scores)} instances")
        if index is not None:
            inside = self.masks[index]
            shown[inside] = (1 - alpha) * shown[inside] + alpha * np.array([30, 144, 255], dtype=np.float32)
        picture = Image.fromarray(shown.round().astype(np.uint8))
        draw = ImageDraw.Draw(picture)
        width = max(1, round(max(picture.size) / 200))
        if index is not None:
            draw.rectangle(tuple(float(v) for v in self.boxes[index]), outline=(30, 144, 255), width=width)
        if self.box is not None:
            draw.rectangle(self.box, outline=(255, 215, 0), width=width)
        return picture

    def overlay(self, name: str, head: int | None = None, alpha: float = 0.6, colormap: str = "inferno"
                ) -> Image.Image:
        """A map over the input the model saw: a decoder layer's attention (a key of ``attention``; ``head`` one
        of its heads, default their mean) or a key of ``maps``."""
        if name in self.attention:
            heads = self.attention[name]
            values = heads.mean(axis=0) if head is None else heads[checked_index(head, len(heads), "head",
                                                                                  f"{len(heads)} heads")]
        elif name in self.maps:
            values = self.maps[name]
        else:
            raise ValueError(f"no map {name!r} here; choose one of {', '.join([*self.attention, *self.maps])}")
        cmap, vmin, vmax = map_colours("attnlrp" if name == "attnlrp" else "", values, colormap)  # signed: around 0
        return draw_overlay(self.seen, values, opacity=alpha, colormap=cmap, vmin=vmin, vmax=vmax)

    def save(self, path: str | os.PathLike) -> Path:
        """``.png``: ``picture()``; ``.npz``: ``scores``, ``boxes``, ``masks``, ``queries``, ``presence``,
        ``instance`` (-1: none), ``text``, ``box``, each attention as ``attention/<layer>`` and each map as
        ``map/<method>``."""
        arrays = {"scores": self.scores, "boxes": self.boxes, "masks": self.masks, "queries": self.queries,
                  "presence": np.float64(self.presence),
                  "instance": np.int64(-1 if self.instance is None else self.instance),
                  "text": np.str_(self.text or ""),
                  "box": np.array(self.box if self.box is not None else (), dtype=np.float64),
                  **{f"attention/{k}": v for k, v in self.attention.items()},
                  **{f"map/{k}": v for k, v in self.maps.items()}}
        return save_as(path, self.picture(), arrays)

    def _repr_png_(self) -> bytes:
        return to_png_bytes(self.picture())


def open_sam3(source: str | os.PathLike, device: str | None = None) -> Sam3:
    """SAM 3 (transformers' ``Sam3Model`` with its processor) from a folder or Hub id, whole, as transformers builds
    it, offline: what ``vit.segment(sam3, image, text=...)`` asks. SourceError (one line) for another model, a
    missing file, a config past the bounds or weights that do not fit it."""
    from vit.sources.sam3 import open_sam3 as opened

    return opened(source, device)


def _segment_concept(sam3, image: Image.Image, text: str | None, box, threshold: float, mask_threshold: float,
                     instance: int | None, methods: Sequence[str]) -> ConceptSegmentation:
    from vit.explain.methods.concepts import make_concept, segment_concept

    concept = make_concept(text, box, image.size)
    done = segment_concept(sam3, image, concept, threshold, mask_threshold, instance, True, tuple(methods))
    return ConceptSegmentation(concept.text, concept.box, done.scores.numpy(), done.boxes.numpy(),
                               done.masks.numpy(), done.queries.numpy(), done.presence, done.instance,
                               {k: v.numpy() for k, v in done.attention.items()},
                               {k: v.numpy().astype(np.float32) for k, v in done.maps.items()}, image,
                               Image.fromarray(done.seen))


def segment(checkpoint: Checkpoint | Sam3, image: ImageLike, points: Sequence[Sequence[float]] | None = None,
            box: Sequence[float] | None = None, *, mask: int | None = None, token: str = "mask",
            methods: Sequence[str] = (), at: Sequence[float] | None = None, text: str | None = None,
            threshold: float = 0.5, mask_threshold: float = 0.5, instance: int | None = None
            ) -> Segmentation | ConceptSegmentation:
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
    (``PromptError``, ``PromptHalfError`` for a model without its prompt half, ``TooManyTokens``).

    SAM 3 (``checkpoint`` from ``vit.open_sam3``) takes a concept instead: ``text`` (a noun phrase) and / or an
    exemplar ``box``, and gives a ``ConceptSegmentation``: every instance scored over ``threshold`` (its mask's
    pixels over ``mask_threshold``), transformers' own; ``instance`` picks the one explained (its decoder attention,
    and ``methods`` ``"gradient_x_input"``). Points are SAM's and SAM 2's: refused for SAM 3 in one line."""
    from vit.sources.sam3 import Sam3

    if isinstance(checkpoint, Sam3):
        if points is not None or at is not None or mask is not None or token != "mask":
            raise ValueError("SAM 3 segments a concept: give text= and / or an exemplar box=; points, at, mask and "
                             "token are SAM's and SAM 2's")
        return _segment_concept(checkpoint, pil_image(image), text, box, threshold, mask_threshold, instance,
                                (methods,) if isinstance(methods, str) else methods)
    if text is not None:
        raise ValueError("a text concept is SAM 3's: open it with vit.open_sam3(folder) and segment with that; SAM "
                         "and SAM 2 take points and a box")
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
