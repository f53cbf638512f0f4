"""Classifying images with a loaded checkpoint, and the attention behind each answer.

The app and the ``vit.predict`` / ``vit.evaluate`` CLIs call these functions; they know
nothing of Streamlit. Images go through ``vit.images.to_uint8`` and ``normalize`` with the
checkpoint's own preprocessing: the evaluation transform training's data cache uses.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vit.checkpoint import Checkpoint, Preprocessing
from vit.images import ImageError, normalize, open_image, to_uint8


def preprocess(images: Sequence[Image.Image], preprocessing: Preprocessing) -> torch.Tensor:
    """PIL images of any size and mode -> float32 ``(B, C, S, S)`` normalised model input."""
    p = preprocessing
    if not images:
        return torch.empty(0, p.num_channels, p.image_size, p.image_size)
    batch = torch.stack([to_uint8(image, p.image_size, p.num_channels, p.resize_size, p.resize_mode, p.resample)
                         for image in images])  # (B, C, S, S)
    return normalize(batch, p.mean, p.std)


@dataclass
class Prediction:
    """One image's answer; arrays are NumPy on the CPU."""

    top_k: list[tuple[str, float]]  # (label, probability), most probable first
    probabilities: np.ndarray  # (classes,) softmax of the logits
    logits: np.ndarray  # (classes,)
    attentions: tuple[np.ndarray, ...] | None  # per layer (heads, T, T) float32, when asked for
    class_index: int  # argmax of probabilities; -1 for a model without a classifier

    @property
    def label(self) -> str:
        """The most probable class name; empty for a model without a classifier."""
        return self.top_k[0][0] if self.top_k else ""


def predict(checkpoint: Checkpoint, images: Sequence[Image.Image], top_k: int = 5, output_attentions: bool = True,
            batch_size: int = 64) -> list[Prediction]:
    """Classify ``images`` in batches of ``batch_size``; one ``Prediction`` per image, in order.

    ``top_k`` is clamped to the number of classes; attentions are returned when
    ``output_attentions`` (they cost memory: layers x heads x T^2 floats per image).
    """
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a whole number of at least 1, got {top_k!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number of at least 1, got {batch_size!r}")
    model, names = checkpoint.model, checkpoint.class_names
    k = min(top_k, len(names))
    device = next(model.parameters()).device
    results: list[Prediction] = []
    with torch.inference_mode():
        for start in range(0, len(images), batch_size):
            chunk = images[start:start + batch_size]
            x = preprocess(chunk, checkpoint.preprocessing).to(device)  # (B, C, S, S)
            logits, attentions = model(x, output_attentions=output_attentions)
            if logits is None:  # a feature model without a classifier (e.g. DINO): maps, no prediction
                logits = x.new_zeros(x.shape[0], 0)
            logits = logits.float()
            probs = logits.softmax(dim=-1)  # (B, classes)
            top_p, top_i = probs.topk(k, dim=-1)  # (B, k) each, descending
            logits_np, probs_np = logits.cpu().numpy(), probs.cpu().numpy()
            top_p, top_i = top_p.cpu().tolist(), top_i.cpu().tolist()
            layers = [a.float().cpu().numpy() for a in attentions] if attentions is not None else None
            for i in range(len(chunk)):
                results.append(Prediction(
                    top_k=[(names[c], float(p)) for c, p in zip(top_i[i], top_p[i], strict=True)],
                    probabilities=probs_np[i].copy(),
                    logits=logits_np[i].copy(),
                    # copies, so one kept prediction does not keep its whole batch alive
                    attentions=tuple(layer[i].copy() for layer in layers) if layers is not None else None,
                    class_index=int(top_i[i][0]) if k else -1,
                ))
    return results


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
                  output_attentions: bool = False, batch_size: int = 64) -> Iterator[FileResult]:
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
        predictions = predict(checkpoint, [r.image for r in readable], top_k, output_attentions, batch_size)
        for result, prediction in zip(readable, predictions, strict=True):
            result.prediction = prediction
        yield from results


def classify_files(checkpoint: Checkpoint, paths: Sequence[str | os.PathLike], top_k: int = 5) -> list[dict]:
    """Top-k labels of each file as JSON-ready dicts (see ``FileResult.to_dict``), in the order given."""
    return [result.to_dict() for result in predict_files(checkpoint, paths, top_k)]
