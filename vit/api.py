"""The engine from a notebook: what ``import vit`` exposes (``vit/__init__.py`` forwards to this module lazily).

    checkpoint = vit.load("google/vit-base-patch16-224")      # a path, a folder, an HF-cache name or a Hub id
    e = vit.explain(checkpoint, "photo.jpg", "legrad")        # any map the explorer draws (vit.methods())
    e.map, e.overlay(), e.figure()                            # the patch grid, over the pixels the model saw
    vit.ask(clip, "photo.jpg", ["a dog", "a cat"])            # CLIP / SigLIP zero-shot scores and maps
    vit.mechanism(checkpoint, "photo.jpg")                    # logit lens, head attribution, phenomena

Every function calls the explorer's own (``vit.app.explorer``, ``vit.app.words``), so a map here is the map the
explorer draws for the same settings. Layers, heads and tokens count from 0 (negative layers from the end), as in
the arrays; token 0 is CLS, patch ``p`` (row-major) is token ``p + num_prefix_tokens``.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vit.app import catalog, drawing, explorer, words
from vit.checkpoint import Checkpoint
from vit.explain.overlay import overlay as draw_overlay
from vit.images import open_image
from vit.inference import TRAINING_SIZE, InputSize, Prediction, input_box, seen_region

ImageLike = Image.Image | str | os.PathLike
# Which arguments each map reads (the explorer's controls for it): others are refused rather than ignored.
_READS = {"query": "query", "layer": "layer", "end_layer": "layer", "head": "head", "class": "target"}
_APPLIES_TO = {
    "attention": "every model",
    "rollout": "every model",
    "class": "classifiers (a model with a head, or a CLIP / SigLIP after vit.ask)",
    "legrad": "classifiers; CLIP / SigLIP through vit.ask",
    "lrp": "classifiers with a CLS token",
    "attnlrp": "classifiers",
    "flow": "every model (seconds: a max-flow per patch)",
    "norms": "every model",
    "probe": "models with an attention-pooling head (SigLIP)",
    "probe_rollout": "models with an attention-pooling head (SigLIP)",
}


def load(source: str | os.PathLike, device: str | torch.device | None = None) -> Checkpoint:
    """Open any model the explorer opens: our ``.pt``, an HF / timm / torchvision / open_clip folder or file, or a
    Hub id (``ORG/NAME[@REVISION]``, ``hf-hub:ORG/NAME``, a timm name), downloaded into the HF cache first when
    needed. ``device`` defaults to a GPU when there is one. Raises ``CheckpointError`` with a one-line message."""
    from vit.sources.open import open_source

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return open_source(source, map_location=device)


def shipped(name: str = "cifar10-cifar-s") -> Path:
    """The path of a checkpoint shipped with the explorer (``cifar10-cifar-s``, ``mnist-p4``), wherever it is
    installed."""
    return catalog.default_checkpoints_dir() / f"{name}.pt"


def samples(name: str = "cifar10-cifar-s") -> list[Path]:
    """The sample images shipped with checkpoint ``name``."""
    folder = catalog.default_checkpoints_dir() / "samples" / name
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in catalog.SAMPLE_EXTENSIONS) \
        if folder.is_dir() else []


def methods() -> dict[str, str]:
    """Every map ``explain`` draws, ``{method: "what it is — which models it applies to"}``, in the explorer's
    order; the arguments each reads are in ``explain``'s docstring."""
    return {kind: f"{name} — {_APPLIES_TO[kind]}" for kind, name in explorer.MAP_KINDS.items()}


def _image(image: ImageLike) -> Image.Image:
    return image if isinstance(image, Image.Image) else open_image(image)


def _size(size: int | InputSize | None) -> InputSize:
    if size is None:
        return TRAINING_SIZE
    return size if isinstance(size, InputSize) else InputSize(int(size))


def _class_index(checkpoint: Checkpoint, target: int | str | None) -> int | None:
    if target is None or isinstance(target, (int, np.integer)):
        return None if target is None else int(target)
    try:
        return list(checkpoint.class_names).index(target)
    except ValueError:
        raise ValueError(f"{target!r} is not one of this model's classes") from None


@dataclass
class Explanation:
    """One map of one image: ``map`` is the ``(rows, cols)`` patch grid, drawn over ``seen`` (exactly the pixels
    the model saw: a centre crop for preprocessing that crops)."""

    method: str
    map: np.ndarray  # (gh, gw) float32
    image: Image.Image  # the image as given
    seen: Image.Image  # the part of it the model saw, at the image's own resolution
    input_box: tuple[float, float, float, float]  # (x0, y0, x1, y1) of ``seen`` in ``image``
    grid: tuple[int, int]
    num_prefix_tokens: int
    prediction: Prediction | None = None
    target: str | None = None  # the explained class (class-specific maps) or label (vit.ask)
    query: int = 0
    description: str = field(default="", repr=False)

    def overlay(self, alpha: float = 0.6, colormap: str = "inferno") -> Image.Image:
        """The map blended over the pixels the model saw, at the image's own resolution; signed maps (AttnLRP) on
        a diverging scale around 0."""
        return self._overlay(self.seen, alpha, colormap)

    def _overlay(self, image: Image.Image, alpha: float, colormap: str) -> Image.Image:
        cmap, vmin, vmax = drawing.map_colours(self.method if self.method in drawing.SIGNED_MAP_KINDS else "",
                                               self.map, colormap)
        return draw_overlay(image, self.map, opacity=alpha, colormap=cmap, vmin=vmin, vmax=vmax)

    def _shown(self, alpha: float = 0.6, colormap: str = "inferno") -> Image.Image:
        """The overlay as the explorer shows it: drawn over the seen pixels at display size (small images enlarged
        by a whole factor, large ones reduced)."""
        return self._overlay(drawing.display_image(self.seen), alpha, colormap)

    def figure(self, alpha: float = 0.6, colormap: str = "inferno"):
        """A Plotly figure of the overlay (zoom with the wheel); hovering names each patch (row, column, token)."""
        shown = self._shown(alpha, colormap)
        return drawing.patch_picker_figure(shown.size, drawing.jpeg_data_uri(shown), self.grid, self.query,
                                           self.num_prefix_tokens, show_grid=False, fit_width=shown.size[0],
                                           zoomable=True)

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self._shown().save(buffer, format="PNG")
        return buffer.getvalue()


def explain(checkpoint: Checkpoint, image: ImageLike, method: str = "rollout", *, target: int | str | None = None,
            layer: int | None = None, head: int | None = None, query: int | None = None,
            size: int | InputSize | None = None, max_tokens: int | None = None) -> Explanation:
    """The ``method`` map (a key of ``methods()``) of ``image`` (a PIL image or a file), as the explorer draws it.

    Arguments a method does not read are refused: ``layer`` (the layer of ``attention`` and ``norms``; the last
    layer included for ``rollout``, ``class``, ``lrp``, ``flow``, ``probe_rollout``; default the last), ``head``
    (``attention``, ``probe``; default the heads averaged), ``query`` (the token whose map it is: ``attention``,
    ``rollout``, ``class``, ``lrp``, ``flow``; default 0, CLS), ``target`` (the explained class, an index or a name:
    ``class``, ``legrad``, ``lrp``, ``attnlrp``; default the predicted one). ``size``: the input side in pixels
    (default the model's own), rounded to whole patches. ``max_tokens``: the explorer's token gate (default env
    VIT_MAX_TOKENS, else 16,384), checked before any work; a larger input is refused with the work it would be.
    Raises ValueError with a message that says what to do.
    """
    if method not in explorer.MAP_KINDS:
        raise ValueError(f"unknown method {method!r}; choose one of: {', '.join(explorer.MAP_KINDS)}")
    reads = {_READS[c] for c in explorer.MAP_CONTROLS[method] if c in _READS}
    given = {"target": target, "layer": layer, "head": head, "query": query}
    unread = [name for name, value in given.items() if value is not None and name not in reads]
    if unread:
        raise ValueError(f"{method} does not read {', '.join(unread)}; it reads {', '.join(sorted(reads)) or 'none'}")
    image, size = _image(image), _size(size)
    analysis = explorer.analyse(checkpoint, image, size, max_tokens=max_tokens,
                                allow="pass vit.explain a larger max_tokens (or set VIT_MAX_TOKENS)")
    if method not in explorer.map_kinds(analysis, bool(checkpoint.class_names)):
        raise ValueError(f"{method} does not apply to this model ({_APPLIES_TO[method]})")
    layer_value = -1 if layer is None else layer
    settings = explorer.MapSettings(kind=method, layer=layer_value, end_layer=layer_value, head=head,
                                    query=query or 0, class_index=_class_index(checkpoint, target))
    class_index = explorer.resolved_class(settings, analysis)
    relevance = method_map = None
    if method == "class":
        relevance = explorer.class_relevance(checkpoint, image, class_index, size)
    elif method in explorer.METHOD_MAP_KINDS:
        method_map = explorer.model_method_map(checkpoint, image, method, class_index, settings.query,
                                               settings.end_layer, settings.fusion, size)
    map2d = explorer.attention_map(analysis, settings, relevance, method_map)
    explained = checkpoint.class_names[class_index] if method in explorer.CLASS_MAP_KINDS else None
    return Explanation(method, np.asarray(map2d, dtype=np.float32), image, seen_region(image, checkpoint.preprocessing,
                       size), input_box(image.size, checkpoint.preprocessing, size), analysis.grid,
                       analysis.num_prefix_tokens, analysis.prediction if checkpoint.class_names else None,
                       explained, settings.query, drawing.describe_map(settings, analysis, checkpoint.class_names))


@dataclass
class Answer:
    """A CLIP's or SigLIP's answer for typed labels: ``scores`` (label -> probability: a softmax over the labels
    for CLIP, each label's own sigmoid for SigLIP) and ``explain(label, method)`` for its map."""

    checkpoint: Checkpoint
    image: Image.Image
    size: InputSize
    answer: words.Answer

    @property
    def scores(self) -> dict[str, float]:
        """Label -> probability, most probable first."""
        return dict(self.answer.ranked())

    def explain(self, label: str | int, method: str = "legrad") -> Explanation:
        """The map of ``label`` (typed text or its index) by ``method`` (``rollout``, ``legrad``, ``attnlrp``,
        ``grad_eclip``, where it applies: ``vit.ask_methods(checkpoint)``)."""
        labels = self.answer.labels
        index = label if isinstance(label, int) else labels.index(label) if label in labels else -1
        if not 0 <= index < len(labels):
            raise ValueError(f"{label!r} is not one of the labels asked: {', '.join(labels)}")
        map2d = words.word_map(self.checkpoint, self.answer, self.image, index, method, self.size)
        model = self.checkpoint.model
        p = self.checkpoint.preprocessing
        grid = (map2d.shape[0], map2d.shape[1])
        return Explanation(method, map2d, self.image, seen_region(self.image, p, self.size),
                           input_box(self.image.size, p, self.size), grid, model.num_prefix_tokens, None,
                           labels[index], description=words.describe_method(method, labels[index]))

    def _repr_html_(self) -> str:
        from html import escape

        rows = "".join(f"<tr><td>{escape(label)}</td><td>{p:.1%}</td></tr>" for label, p in self.scores.items())
        return f"<table>{rows}</table>"


def ask(checkpoint: Checkpoint, image: ImageLike, labels: Sequence[str] | str, template: str | None = None,
        *, size: int | InputSize | None = None) -> Answer:
    """Ask a CLIP or SigLIP which of ``labels`` (a list, or one string separated by commas, semicolons or line
    breaks) ``image`` shows: each label filled into ``template`` (default "a photo of a {}."; "{}" uses the labels
    as typed; "imagenet" averages open_clip's 80 ImageNet templates). The text side comes from the model's own
    library (its tokenizer and text transformer, beside the weights)."""
    from vit.explain.prompts import DEFAULT_TEMPLATE
    from vit.sources.text_tower import check_labels, open_text_tower, split_labels

    labels = split_labels(labels) if isinstance(labels, str) else check_labels(list(labels))
    ensemble = template is not None and template.strip().lower() == words.ENSEMBLE
    templates = words.templates_for(template or DEFAULT_TEMPLATE, ensemble)
    image, size = _image(image), _size(size)
    return Answer(checkpoint, image, size, words.answer(checkpoint, open_text_tower(checkpoint), image, labels,
                                                        templates, size))


def ask_methods(checkpoint: Checkpoint) -> dict[str, str]:
    """The map methods ``Answer.explain`` offers for this CLIP / SigLIP."""
    from vit.explain.prompts import methods_for

    return methods_for(checkpoint.model)


# -- the mechanism (the explorer's Mechanism view) --------------------------------------------------------------

def mechanism(checkpoint: Checkpoint, image: ImageLike, target: int | str | None = None,
              size: int | InputSize | None = None) -> explorer.MechanismView:
    """Logit lens (each layer's patches read through the classifier), direct logit attribution of every head and
    MLP to ``target`` (default the predicted class), token norms, massive activations and attention sinks."""
    return explorer.mechanism_view(checkpoint, _image(image), _class_index(checkpoint, target), _size(size))


def head_effects(checkpoint: Checkpoint, image: ImageLike, target: int | str | None = None, mode: str = "zero",
                 size: int | InputSize | None = None) -> np.ndarray:
    """``(layers, heads)``: how much ``target``'s logit (default the predicted class) changes when each head alone
    is ablated (``mode`` "zero"; one pass per layer)."""
    image, size = _image(image), _size(size)
    index = _class_index(checkpoint, target)
    if index is None:
        index = explorer.analyse(checkpoint, image, size).prediction.class_index
    return explorer.ablation_effects(checkpoint, image, index, mode, None, size)


def ablate(checkpoint: Checkpoint, heads: Sequence[tuple[int, int]], mode: str = "zero") -> Checkpoint:
    """A copy of ``checkpoint`` whose ``heads`` ((layer, head) pairs from 0) are zero-ablated in the weights:
    everything above (``explain``, ``predict``) then runs without them."""
    return explorer.ablated_checkpoint(checkpoint, [tuple(h) for h in heads], mode)


def patching(checkpoint: Checkpoint, clean: ImageLike, corrupted: ImageLike, residual: bool = False,
             size: int | InputSize | None = None) -> explorer.PatchingView:
    """Activation patching of ``clean``'s head outputs (and with ``residual`` each layer's input at each token)
    into ``corrupted``: the share of the logit difference between their predicted classes each recovers."""
    return explorer.patching_view(checkpoint, _image(clean), _image(corrupted), _size(size), residual)


def registers(checkpoint: Checkpoint, image: ImageLike, references: Sequence[ImageLike], threshold: float,
              top_k: int = 10, size: int | InputSize | None = None) -> explorer.RegisterView:
    """Test-time registers (Jiang et al. 2025): the register neurons found on ``references`` and ``image`` (tokens
    whose last-layer norm is over ``threshold``), and the last layer's CLS attention and patch norms before and
    after one register is added to ``image``."""
    return explorer.registers_view(checkpoint, _image(image), [_image(r) for r in references], threshold, top_k,
                                   _size(size))
