"""Classifying images with a loaded checkpoint, and the attention behind each answer.

The app and the ``vit.predict`` / ``vit.evaluate`` CLIs call these functions; they know
nothing of Streamlit. Images go through ``vit.core.images.to_uint8`` and ``normalize`` with the
checkpoint's own preprocessing: the evaluation transform training's data cache uses.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vit.checkpoint import Checkpoint, Preprocessing
from vit.core.cli import MAX_INPUT_SIDE, ModelError
from vit.core.images import (
    ImageError,
    border_start,
    crop_start,
    keep_aspect_multiple,
    naflex_size,
    normalize,
    on_padded_canvas,
    open_image,
    pad_normalized,
    resized_size,
    smart_resize,
    to_mode,
    to_uint8,
)


@dataclass(frozen=True)
class InputSize:
    """The size the model sees, instead of the checkpoint's ``preprocessing.image_size``.

    ``side`` None keeps the checkpoint's size. Otherwise the input is a square of ``side`` px,
    or with ``keep_aspect`` the image's long side at ``side`` px and the short side in proportion.
    Sides are rounded to whole patches; the model interpolates its position embeddings to the
    new grid (as DINO's visualisation does).
    """

    side: int | None = None
    keep_aspect: bool = False

    def __post_init__(self) -> None:
        if self.side is not None and (isinstance(self.side, bool) or not isinstance(self.side, int)
                                      or not 1 <= self.side <= MAX_INPUT_SIDE):
            raise ValueError(f"input size must be a whole number of pixels from 1 to {MAX_INPUT_SIDE}, "
                             f"got {self.side!r}")

    def shape(self, image_size: tuple[int, int], preprocessing: Preprocessing,
              patch_size: int | tuple[int, int]) -> tuple[int, int]:
        """``(height, width)`` of the model input for an image of ``image_size = (width, height)``; ``patch_size``
        is the model's (``ViTConfig.patch_size``: an int, or ``(height, width)``)."""
        ph, pw = (patch_size, patch_size) if isinstance(patch_size, int) else patch_size
        if self.side is None and not self.keep_aspect:
            return preprocessing.image_hw
        side = max(preprocessing.image_hw) if self.side is None else self.side
        if not self.keep_aspect:
            return max(1, round(side / ph)) * ph, max(1, round(side / pw)) * pw  # whole patches, at least one
        width, height = image_size
        ratio = min(width, height) / max(width, height)
        if height >= width:
            long = max(1, round(side / ph)) * ph
            return long, max(1, round(long * ratio / pw)) * pw
        long = max(1, round(side / pw)) * pw
        return max(1, round(long * ratio / ph)) * ph, long


TRAINING_SIZE = InputSize()


def input_shape(image: Image.Image, preprocessing: Preprocessing, patch_size: int | tuple[int, int],
                size: InputSize = TRAINING_SIZE) -> tuple[int, int]:
    """``(height, width)`` the model sees ``image`` at; the checkpoint's own unless ``size`` says otherwise. A NaFlex
    model's own is the image's: its aspect ratio within ``max_num_patches`` patches
    (``vit.core.images.naflex_size``)."""
    if size == TRAINING_SIZE:
        p = preprocessing
        if p.max_num_patches:
            return naflex_size(image.height, image.width, p.patch_size, p.max_num_patches)
        if p.max_pixels:
            return smart_resize(image.height, image.width, p.patch_size, p.min_pixels, p.max_pixels)
        if p.multiple_of:
            return keep_aspect_multiple(image.height, image.width, p.image_hw, p.multiple_of)
        return preprocessing.image_hw
    return size.shape(image.size, preprocessing, patch_size)


def input_box(image_size: tuple[int, int], preprocessing: Preprocessing,
              size: InputSize = TRAINING_SIZE) -> tuple[float, float, float, float]:
    """``(x0, y0, x1, y1)``: the part of an image of ``image_size = (width, height)`` that the model sees.

    A checkpoint whose evaluation transform resizes and centre-crops (HF DINOv2: shortest edge 256,
    crop 224; timm: ``crop_pct``, a non-square input's too) sees only the middle of the image, so every map of it
    belongs over this box, not over the whole image. The same arithmetic as ``vit.core.images.to_uint8``: the crop's
    offsets in the resized image, scaled back to the original's pixels. Other input sizes, and
    checkpoints that only resize, see the whole image. SAM's ``"longest_edge_pad"`` sees more than the image: the
    padded input, the image at its top left, so the box reaches past the right or bottom edge by the padding
    (in the image's pixels: a 640x480 image padded to a square is seen as (0, 0, 640, 640)); timm's ``"border"``
    pads on both sides, so its box starts before the image (negative) where it pads.
    """
    width, height = image_size
    p = preprocessing
    if size != TRAINING_SIZE or p.resize_size is None:
        return 0.0, 0.0, float(width), float(height)
    resized = resized_size(image_size, p.resize_size, p.resize_mode)
    if p.resize_mode == "longest_edge_pad":
        pad_h, pad_w = p.image_hw
        return 0.0, 0.0, pad_w * width / resized[0], pad_h * height / resized[1]
    crop_h, crop_w = p.image_hw
    if p.resize_mode == "border":
        left, top = border_start(resized[0], crop_w), border_start(resized[1], crop_h)
    else:
        left, top = crop_start(resized[0], crop_w, p.crop_rule), crop_start(resized[1], crop_h, p.crop_rule)
    sx, sy = width / resized[0], height / resized[1]
    return left * sx, top * sy, (left + crop_w) * sx, (top + crop_h) * sy


@dataclass(frozen=True)
class ModelInput:
    """One image at one input size as a checkpoint's model sees it: its ``shape`` first (what every cost check reads,
    before the work), its ``pixels`` when the work starts. Made once by the view that draws a map and handed down,
    so the methods do not each size and preprocess the image again."""

    image: Image.Image
    preprocessing: Preprocessing
    patch_size: int | tuple[int, int]
    size: InputSize = TRAINING_SIZE

    @classmethod
    def of(cls, checkpoint: Checkpoint, image: Image.Image, size: InputSize = TRAINING_SIZE) -> ModelInput:
        return cls(image, checkpoint.preprocessing, checkpoint.model.config.patch_size, size)

    @functools.cached_property
    def shape(self) -> tuple[int, int]:
        """``(height, width)`` of the model's input (``input_shape``)."""
        return input_shape(self.image, self.preprocessing, self.patch_size, self.size)

    def pixels(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The normalised ``(1, C, H, W)`` input on ``device`` (``preprocess``)."""
        return preprocess([self.image], self.preprocessing, self.size, self.patch_size).to(device)


def seen_region(image: Image.Image, preprocessing: Preprocessing, size: InputSize = TRAINING_SIZE) -> Image.Image:
    """The part of ``image`` the model sees (``input_box`` rounded to whole pixels): what maps are drawn over.
    Padding beyond the image (SAM's, timm's crop_mode "border") is shown as the colour it stands for
    (``Preprocessing.fill_colour``)."""
    x0, y0, x1, y1 = input_box(image.size, preprocessing, size)
    box = (round(x0), round(y0), round(x1), round(y1))
    if box == (0, 0, image.width, image.height):
        return image
    if min(box[:2]) < 0 or box[2] > image.width or box[3] > image.height:  # padded: the image on a canvas
        return on_padded_canvas(to_mode(image, 3), (box[2] - box[0], box[3] - box[1]), preprocessing.fill_colour,
                                (-box[0], -box[1]))
    return image.crop(box)


def evaluation_uint8(image: Image.Image, preprocessing: Preprocessing) -> torch.Tensor:
    """``image`` through the checkpoint's own evaluation transform (``vit.core.images.to_uint8`` with every setting of
    ``preprocessing``), before normalisation: ``(C, H, W)`` uint8; SAM's ``(C, h, w)`` before its padding."""
    p = preprocessing
    return to_uint8(image, p.image_size, p.num_channels, p.resize_size, p.resize_mode, p.resample, p.crop_rule,
                    p.backend, p.fill_colour)


def preprocess(images: Sequence[Image.Image], preprocessing: Preprocessing, size: InputSize = TRAINING_SIZE,
               patch_size: int | tuple[int, int] | None = None) -> torch.Tensor:
    """PIL images of any size and mode -> float32 ``(B, C, H, W)`` normalised model input.

    By default ``(H, W) = preprocessing.image_hw``; another ``size`` needs the model's
    ``patch_size`` to round to, and all images must then come out at the same shape. Another size resizes
    the whole image to it, without a crop or SAM's padding (``InputSize``'s square stretches a non-square image).
    """
    p = preprocessing
    if not images:
        return torch.empty(0, p.num_channels, *p.image_hw)
    if size == TRAINING_SIZE and not p.own_size:  # the checkpoint's own evaluation transform (with its crop)
        resized = [evaluation_uint8(image, p) for image in images]  # each (C, H, W); SAM's (C, h, w) unpadded
        if p.resize_mode == "longest_edge_pad":  # SamImageProcessor: normalised, then 0 below and to the right
            return torch.stack([pad_normalized(normalize(x[None], p.mean, p.std)[0], p.image_hw) for x in resized])
        return normalize(torch.stack(resized), p.mean, p.std)
    if patch_size is None and size != TRAINING_SIZE:
        raise ValueError("an input size other than the checkpoint's needs the model's patch_size")
    # Another size, or NaFlex's own: the whole image resized to it (no crop), as DINO's visualisation does.
    shapes = {input_shape(image, p, patch_size, size) for image in images}
    if len(shapes) > 1:
        raise ValueError(f"images come out at different input sizes {sorted(shapes)}; "
                         "preprocess them one at a time")
    return preprocess_at(images, p, shapes.pop())


def preprocess_at(images: Sequence[Image.Image], preprocessing: Preprocessing, shape: tuple[int, int]) -> torch.Tensor:
    """Every image resized to exactly ``shape = (height, width)`` (no crop) -> normalised ``(B, C, H, W)``: e.g.
    reference images brought to the grid of the image they are compared with, whatever their own aspect."""
    p = preprocessing
    batch = torch.stack([to_uint8(image, shape, p.num_channels, resample=p.resample, backend=p.backend)
                         for image in images])  # (B, C, H, W)
    return normalize(batch, p.mean, p.std)


@dataclass
class Prediction:
    """One image's answer; arrays are NumPy on the CPU."""

    top_k: list[tuple[str, float]]  # (label, probability), most probable first
    probabilities: np.ndarray  # (classes,) softmax of the logits (a sigmoid each for SigLIP's prompts)
    logits: np.ndarray  # (classes,)
    attentions: tuple[np.ndarray, ...] | None  # per layer (heads, T, T) float32 (windowed: (nw, heads, nq, nk))
    class_index: int  # argmax of probabilities; -1 for a model without a classifier

    @property
    def label(self) -> str:
        """The most probable class name; empty for a model without a classifier."""
        return self.top_k[0][0] if self.top_k else ""


def predict(checkpoint: Checkpoint, images: Sequence[Image.Image], top_k: int = 5, output_attentions: bool = True,
            batch_size: int = 64, size: InputSize = TRAINING_SIZE) -> list[Prediction]:
    """Classify ``images`` in batches of ``batch_size``; one ``Prediction`` per image, in order.

    ``top_k`` is clamped to the number of classes; attentions are returned when
    ``output_attentions`` (they cost memory: layers x heads x T^2 floats per image).
    ``size`` sets the input size; images that come out at different shapes (``keep_aspect``)
    go through the model in separate batches, except on a NaFlex model, whose images on different grids share one
    padded forward (``ViT.encode_padded``: 0.58x the time of one forward each, ``bench/bench_naflex_predict.py``),
    each image's attentions over its real tokens alone.
    """
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a whole number of at least 1, got {top_k!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number of at least 1, got {batch_size!r}")
    model, names = checkpoint.model, checkpoint.class_names
    k = min(top_k, len(names))
    device = next(model.parameters()).device
    library = checkpoint.road == "library"
    if library and size != TRAINING_SIZE:
        raise ValueError(f"a model opened as its library builds it runs at its own input size "
                         f"({checkpoint.preprocessing.size_text}); leave out the other size")
    results: list[Prediction] = []
    with torch.inference_mode():
        for chunk in _batches(images, checkpoint, size, batch_size):
            patch = _patch_size(checkpoint)
            per_image = None  # each image's attentions, per layer (nh, T_i, T_i)
            if len({input_shape(image, checkpoint.preprocessing, patch, size) for image in chunk}) == 1:
                x = preprocess(chunk, checkpoint.preprocessing, size, patch).to(device)  # (B, C, H, W)
                if library:
                    logits, attentions = _library_forward(model, x, output_attentions)
                else:
                    logits, attentions = model(x, output_attentions=output_attentions)
                if attentions is not None:
                    # A windowed layer (Swin, Hiera, SAM) returns (B * nw, H, nq, nk): each image's nw windows.
                    layers = [a.float().cpu().numpy() for a in attentions]
                    layers = [layer if len(layer) == len(chunk) else layer.reshape(len(chunk), -1, *layer.shape[1:])
                              for layer in layers]
                    # copies, so one kept prediction does not keep its whole batch alive
                    per_image = [tuple(layer[i].copy() for layer in layers) for i in range(len(chunk))]
            else:  # a NaFlex model's images on their own grids: one forward, padded and masked
                xs = [preprocess([image], checkpoint.preprocessing, size, patch)[0].to(device)
                      for image in chunk]  # each (C, H_i, W_i)
                encodings = model.encode_padded(xs, output_attentions)
                logits = None if encodings[0].logits is None else torch.cat([e.logits for e in encodings])
                if output_attentions:
                    per_image = [tuple(a[0].float().cpu().numpy().copy() for a in e.attentions) for e in encodings]
            if logits is None:  # a feature model without a classifier (e.g. DINO): maps, no prediction
                logits = torch.zeros(len(chunk), 0, device=device)
            kind = checkpoint.metadata.get("probabilities", "softmax")  # "sigmoid": SigLIP's prompts
            for i, prediction in enumerate(predictions_from_logits(logits, names, k, kind, model)):
                prediction.attentions = None if per_image is None else per_image[i]
                results.append(prediction)
    return results


class NonFiniteOutput(ModelError):
    """The model's logits hold NaN or infinite values, so it has no probabilities to give; the message says why
    when the model is known (its weights, or an overflow)."""


def non_finite_message(model: torch.nn.Module | None = None) -> str:
    """One line on why a model's output is not finite: which of its weights hold NaN or infinite values, if any."""
    if model is None:
        return "the model's output is not finite (NaN or infinite logits), so it has no probabilities to show"
    bad = [name for name, t in (*model.named_parameters(), *model.named_buffers())
           if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        return (f"the model's output is not finite: its weights hold NaN or infinite values ({len(bad)} "
                f"tensor{'s' if len(bad) > 1 else ''}, e.g. {bad[0]}), as after a training run that diverged; "
                "use another checkpoint")
    return ("the model's output is not finite (NaN or infinite logits) although its weights are finite: the "
            "numbers overflowed, e.g. in half precision; try float32")


def predictions_from_logits(logits: torch.Tensor, class_names: Sequence[str], top_k: int,
                            kind: str = "softmax", model: torch.nn.Module | None = None) -> list[Prediction]:
    """One ``Prediction`` (without attentions) per row of ``logits (B, classes)``; ``top_k`` at most the classes.

    Probabilities are a softmax over the classes, or with ``kind="sigmoid"`` each logit's own sigmoid (SigLIP's
    zero-shot labels, which do not compete). ``NonFiniteOutput`` when a logit is NaN or infinite (NaN
    probabilities would look like an answer); ``model``, the one that gave them, lets its message say why."""
    if kind not in ("softmax", "sigmoid"):
        raise ValueError(f"kind must be softmax or sigmoid, got {kind!r}")
    logits = logits.detach().float()
    if not bool(torch.isfinite(logits).all()):
        raise NonFiniteOutput(non_finite_message(model))
    probs = logits.softmax(dim=-1) if kind == "softmax" else logits.sigmoid()  # (B, classes)
    top_p, top_i = probs.topk(min(top_k, logits.shape[-1]), dim=-1)  # (B, k) each, descending
    logits_np, probs_np = logits.cpu().numpy(), probs.cpu().numpy()
    top_p, top_i = top_p.cpu().tolist(), top_i.cpu().tolist()
    return [Prediction(top_k=[(class_names[c], float(p)) for c, p in zip(top_i[i], top_p[i], strict=True)],
                       probabilities=probs_np[i].copy(), logits=logits_np[i].copy(), attentions=None,
                       class_index=int(top_i[i][0]) if top_i[i] else -1)  # -1: a model without classes
            for i in range(logits.shape[0])]


def _library_forward(model: torch.nn.Module, x: torch.Tensor, output_attentions: bool
                     ) -> tuple[torch.Tensor | None, tuple[torch.Tensor, ...] | None]:
    """A model opened as its library builds it (``Checkpoint.road == "library"``: it offers ``run``,
    ``num_layers``, ``is_classifier``): the library's own logits of ``x`` (None without a classifier) and, when
    asked, every layer's recorded attention ``(B, H, T, T)``, as the library's eager ``output_attentions``."""
    out, kept = model.run(x, layers=range(model.num_layers) if output_attentions else ())
    return (out.logits if model.is_classifier else None), (tuple(kept.values()) if output_attentions else None)


def _patch_size(checkpoint: Checkpoint) -> int | tuple[int, int]:
    """The patch size inputs are rounded to: our ViT's config's, a library model's layout's."""
    model = checkpoint.model
    return model.layout.patch_hw if checkpoint.road == "library" else model.config.patch_size


def _padded(model: torch.nn.Module) -> bool:
    """Whether ``model`` runs images of different grids in one padded forward: a NaFlex ``ViT`` whose attention
    does not depend on the grid (``ViT.encode_padded``)."""
    from vit.model import ViT

    c = getattr(model, "config", None)
    return (isinstance(model, ViT) and bool(c.max_num_patches) and c.rope == "none" and c.rel_pos == "none"
            and not c.window_size and not c.stage_depths)


def _batches(images: Sequence[Image.Image], checkpoint: Checkpoint, size: InputSize,
             batch_size: int) -> Iterator[Sequence[Image.Image]]:
    """Consecutive runs of at most ``batch_size`` images: any shapes on a NaFlex model (one padded forward), else
    those that come out at the same input shape."""
    if _padded(checkpoint.model):
        for start in range(0, len(images), batch_size):
            yield images[start:start + batch_size]
        return
    patch = _patch_size(checkpoint)
    start = 0
    while start < len(images):
        shape = input_shape(images[start], checkpoint.preprocessing, patch, size)
        end = start + 1
        while (end < len(images) and end - start < batch_size
               and input_shape(images[end], checkpoint.preprocessing, patch, size) == shape):
            end += 1
        yield images[start:end]
        start = end


@dataclass
class FileResult:
    """One file's outcome: its decoded image and prediction, or why it could not be read."""

    path: Path
    image: Image.Image | None = None  # as decoded (EXIF orientation applied), None when unreadable
    prediction: Prediction | None = None
    error: str | None = None  # one line, naming the file

    def to_dict(self) -> dict:
        """``{"image", "predictions": [{"label", "probability"}]}``, or ``{"image", "error"}``."""
        if self.prediction is None:
            return {"image": str(self.path), "error": self.error}
        return {"image": str(self.path),
                "predictions": [{"label": label, "probability": p} for label, p in self.prediction.top_k]}


def predict_files(checkpoint: Checkpoint, paths: Sequence[str | os.PathLike], top_k: int = 5,
                  output_attentions: bool = False, batch_size: int = 64,
                  size: InputSize = TRAINING_SIZE) -> Iterator[FileResult]:
    """Open and classify image files a batch at a time, yielding one result per path in order.

    An unreadable file yields its ``ImageError`` message instead of stopping the others; only
    one batch of decoded images is held at a time.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number of at least 1, got {batch_size!r}")
    paths = [Path(p) for p in paths]
    for start in range(0, len(paths), batch_size):
        results = []
        for path in paths[start:start + batch_size]:
            try:
                results.append(FileResult(path, image=open_image(path)))
            except ImageError as e:
                results.append(FileResult(path, error=str(e)))
        readable = [r for r in results if r.image is not None]
        predictions = predict(checkpoint, [r.image for r in readable], top_k, output_attentions, batch_size, size)
        for result, prediction in zip(readable, predictions, strict=True):
            result.prediction = prediction
        yield from results


def classify_files(checkpoint: Checkpoint, paths: Sequence[str | os.PathLike], top_k: int = 5) -> list[dict]:
    """Top-k labels of each file as JSON-ready dicts (see ``FileResult.to_dict``), in the order given."""
    return [result.to_dict() for result in predict_files(checkpoint, paths, top_k)]
