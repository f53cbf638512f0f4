"""The engine from a notebook: what ``import vit`` exposes (``vit/__init__.py`` forwards to this module lazily).

    checkpoint = vit.load("google/vit-base-patch16-224")      # a path, a folder, an HF-cache name or a Hub id
    e = vit.explain(checkpoint, "photo.jpg", "legrad")        # any map the explorer draws (vit.methods())
    e.map, e.overlay(), e.figure()                            # the patch grid, over the pixels the model saw
    vit.ask(clip, "photo.jpg", ["a dog", "a cat"])            # CLIP / SigLIP zero-shot scores and maps
    vit.mechanism(checkpoint, "photo.jpg")                    # logit lens, head attribution, phenomena

Every function calls the explorer's own (``vit.explain.views.image_analysis``, ``attention_maps``, ``method_maps``,
``mechanism_views``, ``words``), so a map here is the map the explorer draws for the same settings. Layers,
heads, tokens and classes count from 0 and a negative one from the end, as Python indexes the arrays (``layer=-1``
is the last layer, ``head=-1`` the last head); token 0 is CLS, patch ``p`` (row-major) is token
``p + num_prefix_tokens``. An image is a PIL image, a file, an ``(H, W, 3)`` uint8 array or a ``(3, H, W)`` /
``(1, 3, H, W)`` tensor in [0, 1] (unnormalised: the checkpoint's own preprocessing resizes and normalises every
image, as it does a file's).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vit import registry
from vit.checkpoint import Checkpoint
from vit.core.images import ImageError, open_image
from vit.core.inference import TRAINING_SIZE, InputSize, Prediction, input_box, seen_region
from vit.core.runfiles import (
    DEFAULT_CHECKPOINT,
    atomic_write_text,
    atomic_write_with,
    default_checkpoints_dir,
    images_in,
)
from vit.costs import fits
from vit.explain.language import words
from vit.explain.language.vlm_answer import VLMAnswer
from vit.explain.mechanism import sink_diagnostics
from vit.explain.mechanism.components import check_ablation
from vit.explain.methods.stage_maps import cell_patch, on_patch_grid
from vit.explain.views import (
    attention_maps,
    dense_views,
    image_analysis,
    map_captions,
    mechanism_views,
    method_maps,
    video,
)
from vit.explain.views.overlay import (
    display_image,
    jpeg_data_uri,
    map_colours,
    pca_picture,
    to_png_bytes,
    write_png,
)
from vit.explain.views.overlay import overlay as draw_overlay

ImageLike = Image.Image | np.ndarray | torch.Tensor | str | os.PathLike
# Which arguments each map reads (the explorer's controls for it): others are refused rather than ignored.
_READS = {"query": "query", "layer": "layer", "end_layer": "layer", "start_layer": "layer", "head": "head",
          "class": "target"}


def load(source: str | os.PathLike, device: str | torch.device | None = None) -> Checkpoint:
    """Open any model the explorer opens: our ``.pt``, an HF / timm / torchvision / open_clip folder or file, or a
    Hub id (``ORG/NAME[@REVISION]``, ``hf-hub:ORG/NAME``, a timm name), downloaded into the HF cache first when
    needed. ``device`` defaults to a GPU when there is one. Raises ``CheckpointError`` with a one-line message."""
    from vit.sources.open import open_source

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return open_source(source, map_location=device)


def shipped(name: str | None = None) -> Path:
    """The path of a checkpoint shipped with the explorer (``cifar10-cifar-m-gpu``, the default the app opens;
    ``cifar10-cifar-s``, trained on 2 CPU cores; ``mnist-p4``), wherever it is installed."""
    return default_checkpoints_dir() / f"{name or Path(DEFAULT_CHECKPOINT).stem}.pt"


def samples(name: str | None = None) -> list[Path]:
    """The sample images shipped with checkpoint ``name`` (the default checkpoint's without one)."""
    return images_in(default_checkpoints_dir() / "samples" / (name or Path(DEFAULT_CHECKPOINT).stem))


def methods(checkpoint: Checkpoint | None = None) -> dict[str, str]:
    """The maps ``explain`` draws, ``{method: "what it is — which models it applies to"}``, in the explorer's order:
    every one, then the maps of typed labels alone (Grad-ECLIP and the training-free dense maps SCLIP, NACLIP,
    ClearCLIP, CLIP Surgery, which ``vit.ask(...).explain`` draws); or with ``checkpoint`` those ``explain`` draws
    for that model (the explorer's choice for it, its default first; a CLIP's or SigLIP's maps of typed labels are
    ``vit.ask_methods``). The arguments each reads are in ``explain``'s docstring."""
    every = {m.name: m for m in registry.methods()}  # the built-ins, then the plugins'
    kinds = [k for k, m in every.items() if m.group != "words"] if checkpoint is None else _drawn_for(checkpoint)
    drawn = {kind: f"{every[kind].title} — {every[kind].applies_to}" for kind in kinds}
    if checkpoint is None:  # the maps of typed labels, which vit.ask draws: vit.ask_methods(checkpoint) for a model
        drawn.update({m.name: f"{m.title} of a typed label — {m.applies_to}, through "
                              f"vit.ask(checkpoint, image, labels).explain(label, {m.name!r})"
                      for m in every.values() if m.group == "words"})
    return drawn


def _drawn_for(checkpoint: Checkpoint) -> list[str]:
    """The methods ``explain`` draws for ``checkpoint``'s model, as it decides: the explorer's map kinds for the
    model (``attention_maps.map_kinds``), less the class-specific ones without a classifier and Chefer's LRP where its
    rules do not reach."""
    from vit.explain.methods.relevance import lrp_rule_missing

    if not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"vit.methods takes a checkpoint (vit.load(...)), got a {type(checkpoint).__name__}")
    model = checkpoint.model
    shape = image_analysis.shape_of_input(checkpoint, checkpoint.preprocessing.image_hw)
    kinds = attention_maps.map_kinds(shape, bool(checkpoint.class_names))
    if model.head is None:
        kinds = [k for k in kinds if not attention_maps.is_class_map(k)]
    if not shape.staged and lrp_rule_missing(model.config):
        kinds = [k for k in kinds if k not in ("lrp", "lrp-partial", "lrp-full")]
    if model.cls_token is None:
        kinds = [k for k in kinds if k != "attn-gradcam"]
    return kinds


def _image(image: ImageLike) -> Image.Image:
    """A PIL image of ``image`` (see the module docstring for what an image may be); ImageError in one line."""
    if isinstance(image, Image.Image):
        return image
    if isinstance(image, torch.Tensor):
        return _tensor_image(image)
    if isinstance(image, np.ndarray):
        return _array_image(image)
    if isinstance(image, (str, os.PathLike, bytes, bytearray)) or hasattr(image, "read"):
        return open_image(image)
    raise ImageError(f"cannot read an image from a {type(image).__name__}; give a PIL image, a file, an (H, W, 3) "
                     "uint8 array or a (3, H, W) tensor in [0, 1]")


def _array_image(array: np.ndarray) -> Image.Image:
    """An ``(H, W)``, ``(H, W, 1|3|4)`` uint8 array, as PIL reads one."""
    if array.dtype != np.uint8:
        raise ImageError(f"a numpy image must be uint8 (0 to 255), got {array.dtype}; for floats in [0, 1] pass "
                         "torch.from_numpy(array).permute(2, 0, 1)")
    if not (array.ndim == 2 or array.ndim == 3 and array.shape[2] in (1, 3, 4)):
        raise ImageError(f"a numpy image must be (height, width, channels) with 1, 3 or 4 channels, got shape "
                         f"{array.shape}")
    return Image.fromarray(array[..., 0] if array.ndim == 3 and array.shape[2] == 1 else array)


def _tensor_image(tensor: torch.Tensor) -> Image.Image:
    """A ``(C, H, W)`` or ``(1, C, H, W)`` tensor, floats in [0, 1] or uint8, as torchvision's ``to_pil_image``
    converts it (to 8 bits: the checkpoint's preprocessing then treats it as it treats a file)."""
    from torchvision.transforms.functional import to_pil_image

    if tensor.dim() == 4:
        if tensor.shape[0] != 1:
            raise ImageError(f"give one image at a time, got a batch of {tensor.shape[0]}; pass images[i]")
        tensor = tensor[0]
    if tensor.dim() != 3 or tensor.shape[0] not in (1, 3, 4):
        raise ImageError(f"an image tensor must be (channels, height, width) with 1, 3 or 4 channels, got shape "
                         f"{tuple(tensor.shape)}; for (height, width, channels) use tensor.permute(2, 0, 1)")
    tensor = tensor.detach().cpu()
    if tensor.is_floating_point():
        low, high = float(tensor.min()), float(tensor.max())
        if low < 0 or high > 1:
            raise ImageError(f"an image tensor's values must be in [0, 1], these run from {low:.3g} to {high:.3g}; "
                             "pass it unnormalised (the checkpoint's preprocessing normalises it)")
    elif tensor.dtype != torch.uint8:
        raise ImageError(f"an image tensor must hold floats in [0, 1] or uint8, got {tensor.dtype}")
    return to_pil_image(tensor)


def _size(size: int | InputSize | None) -> InputSize:
    if size is None:
        return TRAINING_SIZE
    return size if isinstance(size, InputSize) else InputSize(int(size))


def _index(value: int, count: int, what: str, has: str) -> int:
    """``value`` as an index from 0 into ``count`` things, a negative one counted from the end (as Python indexes);
    ValueError naming the valid range."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{what} must be a whole number, got {value!r}")
    if not -count <= value < count:
        raise ValueError(f"{what} {value} is out of range: {has}, numbered 0 to {count - 1} "
                         f"(or -{count} to -1 from the end)")
    return int(value) % count


def _class_index(checkpoint: Checkpoint, target: int | str | None) -> int | None:
    if target is None:
        return None
    names = list(checkpoint.class_names)
    if isinstance(target, str):
        if target not in names:
            raise ValueError(f"{target!r} is not one of this model's classes; checkpoint.class_names lists them")
        return names.index(target)
    return _index(target, len(names), "target", f"this model has {len(names)} classes")


def _needs_classifier(checkpoint: Checkpoint, what: str) -> None:
    if checkpoint.model.head is None:
        raise ValueError(f"{what} reads a classifier's logits and this model has none (an image encoder); "
                         "vit.explain draws its attention maps")


def _save(path: str | os.PathLike, picture: Image.Image, arrays: dict[str, np.ndarray]) -> Path:
    """``path``: ``.png`` writes ``picture``, ``.npz`` the arrays; anything else is refused. Written atomically: a
    kill mid-write leaves the earlier file whole."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".png":
        write_png(path, picture)
    elif suffix == ".npz":
        atomic_write_with(path, lambda f: np.savez_compressed(f, **arrays))
    else:
        raise ValueError(f"cannot save as {path.suffix or 'a file without a suffix'}; give a .png or .npz path")
    return path


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
    heads: np.ndarray | None = field(default=None, repr=False)  # (H, gh, gw): the query's row in each head
    heads_layer: int | None = None  # from 0: the layer of ``heads``
    settings: dict = field(default_factory=dict, repr=False)  # what made it, for ``to_html``
    # A model with stages (Swin, Hiera): ``map`` and ``grid`` are the layer's own grid, coarser than the image's patch
    # grid ``patch_grid``, over which each cell covers its 2**stage patches (the padding's part outside the image).
    patch_grid: tuple[int, int] | None = None

    def overlay(self, alpha: float = 0.6, colormap: str = "inferno", scale: int | None = None) -> Image.Image:
        """The map blended over the pixels the model saw, at the image's own resolution times ``scale``; signed maps
        (AttnLRP) on a diverging scale around 0. ``scale`` (a whole number; default: the smallest that brings the
        long side to 320 px, 1 for larger images) repeats each pixel, so a 32-px image is visible and exact."""
        if scale is None:
            scale = max(1, math.ceil(320 / max(self.seen.size)))
        if not isinstance(scale, (int, np.integer)) or scale < 1:
            raise ValueError(f"scale must be a whole number of at least 1, got {scale!r}")
        blended = self._overlay(self.seen, alpha, colormap)
        return blended if scale == 1 else blended.resize((blended.width * scale, blended.height * scale),
                                                         Image.Resampling.NEAREST)

    def _overlay(self, image: Image.Image, alpha: float, colormap: str) -> Image.Image:
        cmap, vmin, vmax = map_colours(self.method, self.map, colormap)
        values = self.map if self.patch_grid is None else on_patch_grid(self.map, self.patch_grid)
        return draw_overlay(image, values, opacity=alpha, colormap=cmap, vmin=vmin, vmax=vmax)

    def _shown(self, alpha: float = 0.6, colormap: str = "inferno") -> Image.Image:
        """The overlay as the explorer shows it: drawn over the seen pixels at display size (small images enlarged
        by a whole factor, large ones reduced)."""
        return self._overlay(display_image(self.seen), alpha, colormap)

    def figure(self, alpha: float = 0.6, colormap: str = "inferno"):
        """A Plotly figure of the overlay (zoom with the wheel); hovering names each patch (row, column, token)."""
        from vit.app.drawing import patch_picker_figure  # the explorer's own picker, as it draws it

        shown = self._shown(alpha, colormap)
        return patch_picker_figure(shown.size, jpeg_data_uri(shown), self.grid, self.query, self.num_prefix_tokens,
                                   show_grid=False, fit_width=shown.size[0], zoomable=True)

    def to_html(self, path: str | os.PathLike, alpha: float = 0.6, colormap: str = "inferno") -> Path:
        """Writes the explorer's export of this view to ``path``: one self-contained ``.html`` (the image, the map
        with its colour bar and caption, the heads grid, the prediction and the settings; hover a patch for its
        value) that opens offline. Returns the path."""
        from vit.app.export import View, view_html  # the explorer's export, as its Download button writes it

        cmap, vmin, vmax = map_colours(self.method, self.map, colormap)
        layer = "" if self.heads_layer is None else f"Layer {self.heads_layer + 1}: "
        method = registry.find_method(self.method)  # a typed label's map: its description is its title
        view = View(title=self.description if method is None or method.group == "words" else method.title,
                    seen=self.seen, map2d=self.map,
                    caption=self.description, colormap=cmap, vmin=vmin, vmax=vmax, opacity=alpha, heads=self.heads,
                    heads_caption=f"{layer}each head's attention of token {self.query}.",
                    prediction=self.prediction, settings=self.settings)
        path = Path(path)
        atomic_write_text(path, view_html(view))
        return path

    def save(self, path: str | os.PathLike) -> Path:
        """``.png``: the overlay (``overlay()``); ``.npz``: ``map`` (rows, cols), ``method``, ``query``,
        ``input_box`` (x0, y0, x1, y1: the seen pixels in the image's), and where there are some ``heads``
        (H, rows, cols) with ``heads_layer``, ``target`` (the explained class or label) and ``patch_grid``."""
        arrays = {"map": self.map, "method": np.str_(self.method), "query": np.int64(self.query),
                  "input_box": np.array(self.input_box, dtype=np.float64)}
        if self.heads is not None:
            arrays.update(heads=np.asarray(self.heads, dtype=np.float32), heads_layer=np.int64(self.heads_layer))
        if self.target is not None:
            arrays["target"] = np.str_(self.target)
        if self.patch_grid is not None:
            arrays["patch_grid"] = np.array(self.patch_grid, dtype=np.int64)
        return _save(path, self.overlay(), arrays)

    def _repr_png_(self) -> bytes:
        return to_png_bytes(self._shown())


def explain(checkpoint: Checkpoint, image: ImageLike, method: str = "rollout", *, target: int | str | None = None,
            layer: int | None = None, head: int | None = None, query: int | None = None,
            size: int | InputSize | None = None, max_tokens: int | None = None, **options: float | int) -> Explanation:
    """The ``method`` map (a key of ``methods()``) of ``image`` (a PIL image, a file, an array or a tensor: see the
    module docstring), as the explorer draws it.

    Arguments a method does not read are refused: ``layer`` (the layer of ``attention`` and ``norms``; the last
    layer included for ``rollout``, ``class``, ``lrp``, ``flow``, ``probe_rollout``; default the last; the first
    layer explained for ``legrad``, default the last but one, its authors' ``layer_index``; the block whose first
    norm the CAMs read, ``gradcam``, ``gradcam++``, ``xgradcam``, ``eigencam``, ``layercam``, ``scorecam``, default
    the last, as pytorch-grad-cam's ViT tutorial), ``head``
    (``attention``, ``probe``; default the heads averaged), ``query`` (the token whose map it is: ``attention``,
    ``rollout``, ``class``, ``lrp``, ``flow``; default 0, CLS), ``target`` (the explained class, an index or a name:
    ``class``, ``legrad``, ``lrp``, ``attnlrp``, the CAMs but ``eigencam`` and Chefer's baselines ``attn-gradcam``,
    ``lrp-partial``, ``lrp-full``; default the predicted one).
    ``size``: the input side in pixels (default the model's own), rounded to whole patches. ``max_tokens``: the
    explorer's token gate in patches (default env VIT_MAX_TOKENS, else 16,384; the prefix tokens come on top),
    checked before any work; a larger input is refused with the work it would be.
    ``**options``: the parameters of captum's attributions and RISE, captum's names and defaults
    (``vit.explain.methods.captum_maps.Options``): ``integrated_gradients`` ``n_steps`` (50), ``baselines`` (0.0, in the
    model's input space); ``smoothgrad`` ``nt_samples`` (5), ``stdevs`` (1.0), ``seed``; ``occlusion``
    ``sliding_window_shapes`` and ``strides`` (px; default one patch), ``baselines``; ``feature_ablation``
    ``baselines``; ``kernel_shap`` ``n_samples`` (25), ``baselines``, ``seed``; ``rise`` ``n_masks`` (6000), ``s``
    (8), ``p1`` (0.1), ``seed``; each ``batch`` (the forwards at once, default the most that fit the memory limit).
    Checked, with the forwards they imply, before any work.
    Raises ValueError with a message that says what to do.

    A video model (VideoMAE) takes a clip instead of ``image``: a GIF, a folder of frames or a list of PIL images,
    sampled uniformly to its ``num_frames``; ``method`` is attention, rollout, norms, or one class's (``target``)
    class, legrad or attnlrp, and ``query`` a token (time-major) or ``(frame, row, col)``; it returns a
    ``vit.explain.views.video.ClipExplanation`` whose ``map`` is ``(frames, rows, cols)``, a tubelet's value repeated
    over its frames (AttnLRP's: each frame's own pixels). TimeSformer: attention (the spatial one), temporal or norms,
    its CLS token 0 and the patches after it, and attnlrp; rollout, class and legrad are refused (two attentions per
    block). The other methods are refused in one line saying why. """
    if video.is_video(checkpoint):
        return _explain_clip(checkpoint, image, method, target, layer, head, query, size, max_tokens)
    return _explain_image(checkpoint, image, method, target=target, layer=layer, head=head, query=query, size=size,
                          max_tokens=max_tokens, **options)


def _explain_image(checkpoint: Checkpoint, image: ImageLike, method: str, *, target: int | str | None = None,
                   layer: int | None = None, head: int | None = None, query: int | None = None,
                   size: int | InputSize | None = None, max_tokens: int | None = None,
                   **options: float | int) -> Explanation:
    """``explain`` of an image model (every model but a video one): the method's map of one image."""
    chosen = registry.find_method(method)
    if chosen is not None and chosen.group == "words":
        raise ValueError(f"{method} maps a typed label: vit.ask(checkpoint, image, labels).explain(label, "
                         f"{method!r}) (it applies to {chosen.applies_to})")
    chosen = attention_maps.method_of(method)  # ValueError naming every map for an unknown one
    reads = {_READS[c] for c in chosen.reads if c in _READS}
    given = {"target": target, "layer": layer, "head": head, "query": query}
    unread = [name for name, value in given.items() if value is not None and name not in reads]
    if unread:
        raise ValueError(f"{method} does not read {', '.join(unread)}; it reads {', '.join(sorted(reads)) or 'none'}")
    if options:  # captum's and RISE's parameters, checked before the image is analysed
        from vit.explain.methods.captum_maps import ATTRIBUTION_METHODS, Options

        if method not in ATTRIBUTION_METHODS:
            raise ValueError(f"{method} takes no options ({', '.join(options)}); captum's attributions and RISE do: "
                             f"{', '.join(ATTRIBUTION_METHODS)}")
        Options.of(method, options)
    model = checkpoint.model
    if model.config.stage_depths and method not in attention_maps.STAGE_MAP_KINDS:
        raise ValueError(attention_maps.stage_refusal(method))
    if model.config.stage_depths and method == "class" and query is not None:
        raise ValueError("a Swin's class map starts from what its average pooling reads (every token of the layer); "
                         "leave query out")
    if chosen.class_specific and model.head is None:
        from vit.explain.language.prompts import methods_for
        from vit.sources.vlm.text_tower import has_text_tower

        if has_text_tower(checkpoint) and method in methods_for(model):
            raise ValueError(f"a CLIP / SigLIP has no classes of its own: map a typed label with "
                             f"vit.ask(checkpoint, image, labels).explain(label, {method!r})")
        raise ValueError(f"{method} does not apply to this model ({chosen.applies_to})")
    L = len(model.blocks)
    default = -2 if method == "legrad" else -1  # LeGrad from the last two layers, as its authors
    layer_value = default if layer is None else _index(layer, L, "layer", f"this model has {L} layers")
    H = model.blocks[layer_value].attn.num_heads  # a stage's own in a model with stages (Swin, Hiera)
    heads_text = f"this layer has {H} heads" if model.config.stage_depths else f"this model has {H} heads per layer"
    head = None if head is None else _index(head, H, "head", heads_text)
    class_index = _class_index(checkpoint, target)
    image, size = _image(image), _size(size)
    relevance = method_map = forward = None
    if method in attention_maps.CAM_KINDS and method != "scorecam" and not model.config.stage_depths:
        def forward(x: torch.Tensor, hooks: list) -> None:  # the CAM's one forward, the analysis read off it
            nonlocal method_map
            method_map = method_maps.model_method_map(checkpoint, image, method, class_index, 0, layer_value,
                                                      size=size, hooks=[*hooks, ("hook_logits", keep_logits)])
            return logits.pop() if logits else None

        logits: list[torch.Tensor] = []

        def keep_logits(t: torch.Tensor, hook) -> None:
            logits.append(t.detach())
    analysis = image_analysis.analyse(checkpoint, image, size, max_tokens=max_tokens,
                                      allow="pass vit.explain a larger max_tokens (or set VIT_MAX_TOKENS)",
                                      forward=forward)
    if method not in attention_maps.map_kinds(analysis, bool(checkpoint.class_names)):
        raise ValueError(f"{method} does not apply to this model ({chosen.applies_to})")
    T, patch_grid = analysis.num_tokens, None
    if analysis.staged:  # query on layer l's own grid (row-major, no CLS): the page's query is the patch it covers
        lh, lw = grid = analysis.layer_grid(layer_value)
        query = 0 if query is None else _index(query, lh * lw, "query", f"layer {layer_value % L}'s grid has "
                                                                         f"{lh}x{lw} tokens (row-major, no CLS)")
        patch = cell_patch(query, analysis.grid, grid)
    else:
        query = patch = 0 if query is None else _index(query, T, "query", f"this input has {T} tokens")
    settings = attention_maps.MapSettings(kind=method, layer=layer_value, end_layer=layer_value, head=head,
                                          query=patch, class_index=class_index, start_layer=layer_value)
    class_index = attention_maps.resolved_class(settings, analysis)
    if method == "class":
        relevance = method_maps.class_relevance(checkpoint, image, class_index, size)
    elif chosen.own_pass and method_map is None:
        method_map = method_maps.model_method_map(checkpoint, image, method, class_index, settings.query,
                                                  settings.end_layer, settings.fusion, size,
                                                  start_layer=settings.start_layer, analysis=analysis,
                                                  options=options)
    map2d = np.asarray(attention_maps.attention_map(analysis, settings, relevance, method_map), dtype=np.float32)
    if analysis.staged and map2d.shape != analysis.grid:  # on the layer's own grid, drawn over the image's
        patch_grid = analysis.grid
    explained = checkpoint.class_names[class_index] if chosen.class_specific else None
    heads_layer = settings.layer % L
    shown = {"method": method, "layer": layer, "head": head, "query": query, "target": explained,
             "size": "the model's" if size.side is None else size.side, **options}
    return Explanation(method, map2d, image, seen_region(image, checkpoint.preprocessing, size),
                       input_box(image.size, checkpoint.preprocessing, size), map2d.shape if patch_grid else
                       analysis.grid, analysis.num_prefix_tokens,
                       analysis.prediction if checkpoint.class_names else None, explained, query,
                       map_captions.describe_map(settings, analysis, checkpoint.class_names, options),
                       attention_maps.head_maps(analysis, settings.query, heads_layer), heads_layer,
                       {k: v for k, v in shown.items() if v is not None}, patch_grid)


def _explain_clip(checkpoint: Checkpoint, clip, method: str, target, layer, head, query, size, max_tokens
                  ) -> video.ClipExplanation:
    """``explain`` for a video model (``vit.explain.views.video.explain_clip``)."""
    from vit.core.clips import read_clip

    if size is not None:
        raise ValueError("a clip's maps read layer, head, query and target; size is for image models")
    class_index = _class_index(checkpoint, target)
    video.check_clip_settings(checkpoint, method, layer, head, query, class_index)  # before the clip is decoded
    frames = read_clip(clip, checkpoint.model.config.num_frames).frames
    return video.explain_clip(checkpoint, frames, method, layer, head, query, max_tokens, class_index)


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
        ``grad_eclip``, ``sclip``, ``naclip``, ``clearclip``, ``clipsurgery``, where it applies:
        ``vit.ask_methods(checkpoint)``)."""
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
                           labels[index],
                           description=words.describe_method(method, labels[index], kind=self.answer.prompts.kind))

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
    from vit.explain.language.prompts import DEFAULT_TEMPLATE
    from vit.sources.vlm.text_tower import check_labels, open_text_tower, split_labels

    labels = split_labels(labels) if isinstance(labels, str) else check_labels(list(labels))
    ensemble = template is not None and template.strip().lower() == words.ENSEMBLE
    templates = words.templates_for(template or DEFAULT_TEMPLATE, ensemble)
    image, size = _image(image), _size(size)
    return Answer(checkpoint, image, size, words.answer(checkpoint, open_text_tower(checkpoint), image, labels,
                                                        templates, size))


def ask_methods(checkpoint: Checkpoint) -> dict[str, str]:
    """The map methods ``Answer.explain`` offers for this CLIP / SigLIP."""
    from vit.explain.language.prompts import methods_for

    return methods_for(checkpoint.model)


# -- the mechanism (the explorer's Mechanism view) --------------------------------------------------------------

def mechanism(checkpoint: Checkpoint, image: ImageLike, target: int | str | None = None,
              size: int | InputSize | None = None) -> mechanism_views.MechanismView:
    """Logit lens (each layer's patches read through the classifier), direct logit attribution of every head and
    MLP to ``target`` (default the predicted class), token norms, massive activations and attention sinks. Needs a
    classifier."""
    _needs_classifier(checkpoint, "vit.mechanism")
    return mechanism_views.mechanism_view(checkpoint, _image(image), _class_index(checkpoint, target), _size(size))


def reference_means(checkpoint: Checkpoint, references: Sequence[ImageLike], image: ImageLike,
                    size: int | InputSize | None = None) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Each head's output averaged over ``references`` at every token position of ``image``'s input at ``size``,
    ``(layers, tokens, heads, head_dim)`` (a model with stages, Swin or Hiera: one ``(tokens, heads, head_dim)`` per
    layer, on its own grid with its stage's heads): what ``mode="mean"`` of ``ablate`` and ``head_effects`` puts in
    place of an ablated head (the references are resized to ``image``'s input shape)."""
    return mechanism_views.reference_means(checkpoint, (_image(r) for r in references), _image(image), _size(size))


def head_effects(checkpoint: Checkpoint, image: ImageLike, target: int | str | None = None, mode: str = "zero",
                 size: int | InputSize | None = None, *, means: torch.Tensor | None = None) -> np.ndarray:
    """``(layers, heads)``: how much ``target``'s logit (default the predicted class) changes when each head alone
    is ablated (one pass per layer): ``mode`` "zero", or "mean" with ``means`` from ``reference_means`` for this
    image at this ``size``. With stages ``heads`` is the most of any layer, NaN where a layer has fewer."""
    _needs_classifier(checkpoint, "vit.head_effects")
    check_ablation(checkpoint.model, mode, means)
    index = _class_index(checkpoint, target)
    image, size = _image(image), _size(size)
    if index is None:
        index = image_analysis.analyse(checkpoint, image, size).prediction.class_index
    return mechanism_views.ablation_effects(checkpoint, image, index, mode, means, size)


def _heads(checkpoint: Checkpoint, heads: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(layer, head)`` pairs checked and counted from 0 (negative ones from the end); each layer has its own
    heads (a stage's, in a model with stages)."""
    blocks = checkpoint.model.blocks
    L, pairs = len(blocks), []
    for pair in heads:
        if not isinstance(pair, Sequence) or len(pair) != 2:
            raise ValueError(f"heads must be (layer, head) pairs, e.g. [(0, 1)]; got {pair!r} among them")
        layer = _index(pair[0], L, "layer", f"this model has {L} layers")
        H = blocks[layer].attn.num_heads
        has = (f"layer {layer} has {H} heads (its stage's)" if checkpoint.model.config.stage_depths
               else f"this model has {H} heads per layer")
        pairs.append((layer, _index(pair[1], H, "head", has)))
    return pairs


def ablate(checkpoint: Checkpoint, heads: Sequence[tuple[int, int]], mode: str = "zero", *,
           means: torch.Tensor | None = None) -> Checkpoint:
    """A copy of ``checkpoint`` whose ``heads`` ((layer, head) pairs) are ablated in the weights: zeroed, or with
    ``mode="mean"`` replaced by their mean output ``means`` from ``reference_means`` (per token position, so the
    copy runs at that input size only). Everything above (``explain``, ``predict``) then runs without them."""
    pairs = _heads(checkpoint, heads)
    check_ablation(checkpoint.model, mode, means)
    return mechanism_views.ablated_checkpoint(checkpoint, pairs, mode, means)


def patching(checkpoint: Checkpoint, clean: ImageLike, corrupted: ImageLike, residual: bool = False,
             size: int | InputSize | None = None) -> mechanism_views.PatchingView:
    """Activation patching of ``clean``'s head outputs (and with ``residual`` each layer's input at each token)
    into ``corrupted``: the share of the logit difference between their predicted classes each recovers."""
    _needs_classifier(checkpoint, "vit.patching")
    return mechanism_views.patching_view(checkpoint, _image(clean), _image(corrupted), _size(size), residual)


def registers(checkpoint: Checkpoint, image: ImageLike, references: Sequence[ImageLike], threshold: float,
              top_k: int = 10, size: int | InputSize | None = None) -> mechanism_views.RegisterView:
    """Test-time registers (Jiang et al. 2025): the register neurons found on ``references`` and ``image`` (tokens
    whose last-layer norm is over ``threshold``), and the last layer's CLS attention and patch norms before and
    after one register is added to ``image``."""
    return mechanism_views.registers_view(checkpoint, _image(image), [_image(r) for r in references], threshold, top_k,
                                          _size(size))



def sinks(checkpoint: Checkpoint, image: ImageLike, size: int | InputSize | None = None
          ) -> sink_diagnostics.SinkTable:
    """Sink diagnostics (Kempner Institute 2026) of every layer and head: the key all queries attend to, its value
    norm after the output projection, the stable rank of the head's update, and the verdict (not a sink, NOP sink,
    broadcast sink, other sink); ``.rows()`` gives one row per layer and head. Any model but one with stages."""
    return sink_diagnostics.sink_table(checkpoint, _image(image), _size(size))

# -- TextSpan (the explorer's Mechanism section) ---------------------------------------------------------------------

@dataclass
class TextSpan:
    """A CLIP's late heads described by texts (Gandelsman et al. 2024): ``heads``, one ``HeadSpan`` per head
    (``layer``, ``head``, ``texts`` best first, ``variance_explained`` after each), over ``images`` images;
    ``map(image, layer, head)`` the head's map of an image along one of its texts."""

    checkpoint: Checkpoint
    heads: list
    features: dict[str, torch.Tensor]  # each chosen text's embedding
    images: int

    def head(self, layer: int | str, head: int):
        """The ``HeadSpan`` of ``head`` of ``layer`` (counted from 0; negative from the end); a SigLIP's: ``layer``
        ``"probe"``, its attention-pooling probe."""
        if self.heads[0].probe or layer == "probe":
            if layer != "probe":
                raise ValueError("this model's described heads are its pooling probe's: ask for layer='probe'")
            H = len(self.heads)
            return self.heads[_index(head, H, "head", f"the probe has {H} heads")]
        layer, head = _heads(self.checkpoint, [(layer, head)])[0]
        for span in self.heads:
            if (span.layer, span.head) == (layer, head):
                return span
        described = sorted({s.layer for s in self.heads})
        raise ValueError(f"layer {layer} was not described; these were: {', '.join(map(str, described))}")

    def map(self, image: ImageLike, layer: int | str, head: int, text: str | None = None,
            size: int | InputSize | None = None) -> np.ndarray:
        """``(gh, gw)``: what the head writes into ``image``'s embedding from each patch along ``text``'s embedding
        (one of its texts; default its first)."""
        from vit.explain.mechanism import textspan_run as spans

        span = self.head(layer, head)
        text = span.texts[0] if text is None else text
        if text not in span.texts:
            raise ValueError(f"{text!r} is not one of head {span.label}'s texts (layer.head from 1): "
                             f"{'; '.join(span.texts)}")
        return spans.head_map(self.checkpoint, _image(image), span.layer, span.head, self.features[text],
                              _size(size))

    def __str__(self) -> str:
        return "\n".join(f"{s.label} ({s.variance_explained[-1]:.0%}): {'; '.join(s.texts)}" for s in self.heads)


def textspan(checkpoint: Checkpoint, images: Sequence[ImageLike] | str | os.PathLike, texts: Sequence[str] | str |
             os.PathLike | None = None, layers: int = 8, texts_per_head: int = 10, rank: int | None = None
             ) -> TextSpan:
    """TextSpan (Gandelsman, Efros & Steinhardt 2024; yossigandelsman/clip_text_span): each head of a CLIP's last
    ``layers`` layers described by the ``texts_per_head`` texts (of ``texts``: a list, a file with one a line, or by
    default the authors' 3,497 general image descriptions; each no longer than a text tower reads, 2,464 characters)
    that best span its outputs over ``images`` (a list or a folder; the authors use ImageNet's validation set), each
    at the model's own size. ``rank``: the span the texts
    are projected on (their ``--w_ov_rank``; default theirs, 80). A SigLIP's (any model read by an attention-pooling
    probe): the probe's heads, as the authors' compute_siglip.py (``layer="probe"``; rank default the width). Raises
    ``MechanismError`` / ``TextTowerError`` in one line where it does not apply (a classifier, no text tower)."""
    from vit.explain.mechanism import textspan_run as spans
    from vit.explain.mechanism.textspan import read_texts
    from vit.sources.vlm.text_tower import open_text_tower

    spans.check_model(checkpoint)
    tower = open_text_tower(checkpoint)
    if isinstance(images, (str, os.PathLike)):
        from vit.training.data import image_files

        files = image_files(Path(images)) if Path(images).is_dir() else []
        if not files:
            raise ValueError(f"{images} is not a folder of images; give one, or a list of images")
        images = files
    images = list(images)
    bank = read_texts(texts) if texts is None or isinstance(texts, (str, os.PathLike)) else [
        t.strip() for t in texts if t.strip()]
    if not bank:
        raise ValueError("no texts to describe the heads with; give a list, a file with one text a line, or None")
    described, kept = spans.run(checkpoint, tower.encode, (_image(i) for i in images), len(images), bank, layers,
                                texts_per_head, rank)
    return TextSpan(checkpoint, described, kept, len(images))


# -- SAE features (the explorer's Features section) ------------------------------------------------------------------

def feature_attribution(checkpoint: Checkpoint, image: ImageLike, sae, target: int | str | None = None,
                        size: int | InputSize | None = None):
    """Which of an SAE's features drive ``target``'s logit (default the predicted class) on ``image``: with the SAE
    spliced in at its layer as reconstruction plus error, each latent's share ``f_i · (∂y/∂x · W_dec[i])`` per token
    (``.attributions (T, d_sae)``, ``.patch_map(i)``, ``.per_image()``, ``.top(k)``), the decoder bias's and the
    error's, which sum to ``∂y/∂x · x`` there (``vit.features.attribution``). ``sae``: a ``SparseAutoencoder`` or
    what ``vit.features.formats.open_sae`` opens (a SAELens or ViT-Prisma folder, a saev file, a Hub id). Needs a
    classifier; SAEError in one line for an SAE of another model or layer."""
    from vit.core.inference import input_shape, preprocess
    from vit.features.attribution import feature_attribution as attribute
    from vit.features.autoencoder import SparseAutoencoder
    from vit.features.formats import open_sae

    _needs_classifier(checkpoint, "vit.feature_attribution")
    index = _class_index(checkpoint, target)
    model, p = checkpoint.model, checkpoint.preprocessing
    device = next(model.parameters()).device
    sae = (sae if isinstance(sae, SparseAutoencoder) else open_sae(sae)).to(device)
    image, size = _image(image), _size(size)
    shape = input_shape(image, p, model.config.patch_size, size)
    fits.check_input_fits(checkpoint, model.patch_grid(*shape), f"A {shape[1]}×{shape[0]} px input")
    x = preprocess([image], p, size, model.config.patch_size).to(device)  # (1, C, H, W)
    return attribute(model, sae, x, index)


# -- dense features: PCA colours, patch similarity, correspondences (the explorer's "What the patches represent") --

def _analysed(checkpoint: Checkpoint, image: ImageLike, size: int | InputSize | None):
    """``(image, size, analysis)``, the dense views' memory bound checked before the forward."""
    image, size = _image(image), _size(size)
    dense_views.check_dense_fits(checkpoint, image, size)
    return image, size, image_analysis.analyse(checkpoint, image, size)


@dataclass
class PCA:
    """The first three principal components of one layer's patch tokens as RGB: ``map (rows, cols, 3)`` in [0, 1],
    ``mask (rows, cols)`` the foreground (None without one), drawn over ``seen``, the pixels the model saw."""

    map: np.ndarray
    mask: np.ndarray | None
    image: Image.Image
    seen: Image.Image
    grid: tuple[int, int]
    layer: int
    num_prefix_tokens: int

    def picture(self, opacity: float = 1.0) -> Image.Image:
        """The colours as flat patches over the seen pixels at the image's resolution (``opacity`` < 1 blends)."""
        return pca_picture(self.seen, self.map, opacity)

    def figure(self, opacity: float = 1.0):
        """A Plotly figure of the picture at display size (zoom with the wheel); hovering names each patch."""
        from vit.app.drawing import patch_picker_figure  # the explorer's own picker, as it draws it

        shown = pca_picture(display_image(self.seen), self.map, opacity)
        return patch_picker_figure(shown.size, jpeg_data_uri(shown), self.grid, -1, self.num_prefix_tokens,
                                   show_grid=False, fit_width=shown.size[0], zoomable=True)

    def save(self, path: str | os.PathLike) -> Path:
        """``.png``: the picture; ``.npz``: ``map``, ``mask`` (all True without one), ``layer``."""
        mask = np.ones(self.grid, dtype=bool) if self.mask is None else self.mask
        return _save(path, self.picture(), {"map": self.map, "mask": mask, "layer": np.int64(self.layer)})

    def _repr_png_(self) -> bytes:
        return to_png_bytes(self.picture())


def pca(checkpoint: Checkpoint, image: ImageLike | Sequence[ImageLike], layer: int | None = None, *,
        foreground: float | None = None, flip: bool = False, size: int | InputSize | None = None
        ) -> PCA | list[PCA]:
    """The first three principal components of ``layer``'s patch tokens (default the last, after the final norm,
    as DINOv3's PCA notebook; CLS and registers left out) as RGB colours ``sigmoid(2 x whitened projection)``.

    A list of images is fitted together (a colour means the same in all) and gives a list. ``foreground``: a
    threshold on the first component; the patches above it (below with ``flip``) are fitted again alone and the
    rest is black. Raises ``TooManyTokens`` (the largest size that fits) past the analysis memory bound."""
    images = list(image) if isinstance(image, (list, tuple)) else [image]
    if not images:
        raise ValueError("give at least one image")
    analysed = [_analysed(checkpoint, i, size) for i in images]
    index = dense_views.layer_index(analysed[0][2], layer)
    views = dense_views.pca_views([checkpoint] * len(analysed), [a for _, _, a in analysed], index, foreground, flip)
    results = [PCA(v.colours.astype(np.float32), v.mask, i, seen_region(i, checkpoint.preprocessing, s), a.grid,
                   index, a.num_prefix_tokens) for v, (i, s, a) in zip(views, analysed, strict=True)]
    return results if isinstance(image, (list, tuple)) else results[0]


@dataclass
class Similarity(Explanation):
    """The cosine similarity of one token to every patch: ``map (rows, cols)`` over ``seen`` (of the image the map
    is of), ``query`` the token (of the query image)."""

    layer: int = -1

    def save(self, path: str | os.PathLike) -> Path:
        """``.png``: the overlay; ``.npz``: ``map``, ``query``, ``layer``."""
        return _save(path, self.overlay(), {"map": self.map, "query": np.int64(self.query),
                                            "layer": np.int64(self.layer)})


def similarity(checkpoint: Checkpoint, image: ImageLike, query: int = 0, layer: int | None = None, *,
               target: ImageLike | None = None, size: int | InputSize | None = None) -> Similarity:
    """The cosine similarity of token ``query`` of ``image`` (0 is CLS, patch ``p`` is ``p + num_prefix_tokens``,
    as ``explain`` counts) at ``layer`` (default the last; tokens after the final norm) to every patch of
    ``target`` (default ``image`` itself) at the same layer: ``.map`` is ``(rows, cols)`` over ``target``."""
    image, size, analysis = _analysed(checkpoint, image, size)
    index = dense_views.layer_index(analysis, layer)
    T = analysis.num_tokens
    token = _index(query, T, "query", f"this input has {T} tokens")
    vector = dense_views.query_vector(checkpoint, analysis, token, index)
    shown, shown_analysis = image, analysis
    if target is not None:
        shown, _, shown_analysis = _analysed(checkpoint, target, size)
    map2d = dense_views.similarity_map(checkpoint, shown_analysis, vector, index)
    p = checkpoint.preprocessing
    return Similarity("similarity", map2d.astype(np.float32), shown, seen_region(shown, p, size),
                      input_box(shown.size, p, size), shown_analysis.grid, shown_analysis.num_prefix_tokens,
                      query=token if target is None else -1, layer=index,
                      description=f"cosine similarity to token {token} at layer {index + 1}")


@dataclass
class Correspondences:
    """Matched patches of two images, best first: ``matches (M, 2)`` row-major patch indices ``(in A, in B)``,
    ``scores (M,)`` their cosine similarity, ``points_a`` / ``points_b`` ``(M, 2)`` the patch centres ``(x, y)`` in
    each image's own pixels."""

    matches: np.ndarray
    scores: np.ndarray
    points_a: np.ndarray
    points_b: np.ndarray
    seen_a: Image.Image
    seen_b: Image.Image
    grid_a: tuple[int, int]  # the grids ``matches`` index: each image's patch grid, or a stage layer's own
    grid_b: tuple[int, int]
    image_grids: tuple[tuple[int, int] | None, tuple[int, int] | None] = (None, None)  # the images' own, for stages

    def picture(self, height: int = 320) -> Image.Image:
        """The two images side by side, each match a line between its patches."""
        return dense_views.matches_picture(self.seen_a, self.seen_b, self.grid_a, self.grid_b, self.matches[:, 0],
                                           self.matches[:, 1], height, self.image_grids)

    def figure(self, height: int = 320):
        """A Plotly figure of the picture (zoom with the wheel)."""
        import plotly.graph_objects as go

        shown = self.picture(height)
        return go.Figure(layout=dict(
            width=shown.width, height=shown.height, margin=dict(l=0, r=0, t=0, b=0),
            images=[dict(source=jpeg_data_uri(shown), xref="x", yref="y", x=0, y=0, sizex=shown.width,
                         sizey=shown.height, sizing="stretch", layer="below")],
            xaxis=dict(range=[0, shown.width], visible=False), yaxis=dict(range=[shown.height, 0], visible=False,
                                                                          scaleanchor="x")))

    def save(self, path: str | os.PathLike) -> Path:
        """``.png``: the picture; ``.npz``: ``matches``, ``scores``, ``points_a``, ``points_b``."""
        return _save(path, self.picture(), {"matches": self.matches, "scores": self.scores,
                                            "points_a": self.points_a, "points_b": self.points_b})

    def _repr_png_(self) -> bytes:
        return to_png_bytes(self.picture())


def correspondences(checkpoint_a: Checkpoint, image_a: ImageLike, checkpoint_b: Checkpoint, image_b: ImageLike,
                    top: int | None = 50, layer: int | None = None, *, mutual: bool = True,
                    size: int | InputSize | None = None) -> Correspondences:
    """Mutual nearest neighbours of two images' patch tokens (each model's ``layer``, default the last, after the
    final norm; the two models' tokens must have one width) by cosine similarity, the ``top`` most similar first:
    each A patch's most similar B patch, as DINOv3's dense-matching notebook, kept when that B patch's most
    similar A patch is it (``mutual``)."""
    if top is not None and (isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 1):
        raise ValueError(f"top must be a whole number of at least 1 (or None for every match), got {top!r}")
    image_a, size, analysis_a = _analysed(checkpoint_a, image_a, size)
    image_b, _, analysis_b = _analysed(checkpoint_b, image_b, size)
    layers = dense_views.layer_index(analysis_a, layer), dense_views.layer_index(analysis_b, layer)
    view = dense_views.match_view(checkpoint_a, analysis_a, checkpoint_b, analysis_b, top, *layers, mutual)
    seen_a = seen_region(image_a, checkpoint_a.preprocessing, size)
    seen_b = seen_region(image_b, checkpoint_b.preprocessing, size)
    return Correspondences(np.stack([view.a, view.b], axis=-1), view.score.astype(np.float32),
                           dense_views.patch_centres(view.a, view.grid_a, seen_a.size, analysis_a.grid),
                           dense_views.patch_centres(view.b, view.grid_b, seen_b.size, analysis_b.grid), seen_a, seen_b,
                           view.grid_a, view.grid_b, (analysis_a.grid, analysis_b.grid))


# -- vision-language models: the visual logit lens ----------------------------------------------------------------

@dataclass
class WordMap(Explanation):
    """The visual logit lens of one word: ``map (rows, cols)`` on the patch grid, each patch holding the score of
    the projected token whose unit covers it (Qwen-VL's and InternVL's 2 x 2, Gemma 3's 4 x 4 patches share one);
    ``units`` the scores on the projector's own grid, one per image token the language model reads."""

    word: str = ""
    tokens: tuple[str, ...] = ()  # the word's tokens as the tokenizer writes them
    token_ids: tuple[int, ...] = ()
    units: np.ndarray | None = field(default=None, repr=False)  # (rows / unit, cols / unit)
    embedding: str = ""  # which LM tensor was read, and its size

    def save(self, path: str | os.PathLike) -> Path:
        """``.png``: the overlay; ``.npz``: ``map``, ``units``, ``word``, ``token_ids``."""
        return _save(path, self.overlay(), {"map": self.map, "units": self.units, "word": np.str_(self.word),
                                            "token_ids": np.array(self.token_ids, dtype=np.int64)})


LENS_TARGET_METHODS = ("legrad", "class", "attnlrp")  # the gradient maps a word's lens score is a target of


def _lens_words(checkpoint: Checkpoint, image: ImageLike, words: str | Sequence[str], size: int | InputSize | None):
    """What the lens needs of a VLM folder, in order of cost: the embedding's place and size (its shard's header),
    the words' tokens, the input's grid checked against the memory bound, then the words' rows read."""
    from vit.core.inference import input_shape
    from vit.sources.vlm import word_embeddings

    folder, _ = word_embeddings.vlm_folder(checkpoint)
    table = word_embeddings.embedding_table(folder)  # from the shard's header: its size known before a row is read
    model = checkpoint.model
    if table.width != model.config.projector_dim:
        raise word_embeddings.WordEmbeddingError(
            f"{table.name} is {table.width} wide and the projector gives {model.config.projector_dim}; the folder's "
            "language model is not the one its projector feeds")
    encoded = word_embeddings.encode_words(folder, words, table.rows)
    image, size = _image(image), _size(size)
    shape = input_shape(image, checkpoint.preprocessing, model.config.patch_size, size)
    grid = model.patch_grid(*shape)
    # the lens is one forward without a graph, within the analysis's path in chunks (its states every k-th layer)
    fits.check_input_fits(checkpoint, grid, f"A {shape[1]}×{shape[0]} px input", chunks=True)
    rows = word_embeddings.read_rows(table, [i for w in encoded for i in w.ids])  # (tokens, E)
    vectors = torch.stack([r.mean(0) for r in rows.split([len(w.ids) for w in encoded])])  # (W, E)
    return image, size, grid, table, encoded, vectors


def visual_logit_lens(checkpoint: Checkpoint, image: ImageLike, words: str | Sequence[str],
                      size: int | InputSize | None = None) -> list[WordMap]:
    """Where in ``image`` a vision-language model's image tokens point at each of ``words``, without running its
    language model: each projected token's (``ViT.project``, HF ``get_image_features``) dot product with the word's
    input embedding, a row of the LM's ``embed_tokens.weight``, the one LM tensor read (only the words' rows; its
    size is in ``.embedding``). A word is tokenised as typed by the folder's own tokenizer, without special tokens
    (BPE tokenizers read ``" dog"`` and ``"dog"`` apart); a word of several tokens scores by the mean of their
    embeddings, which is the mean of their maps. ``checkpoint`` is a LLaVA, PaliGemma, Gemma 3, InternVL, Qwen2.5-VL
    or Qwen3-VL folder opened by ``vit.load``. One ``WordMap`` per word, in order; ValueError or CheckpointError in one
    line (not a VLM, a word the tokenizer cannot encode, a folder without its tokenizer or embedding)."""
    from vit.core.inference import preprocess
    from vit.explain.methods.visual_lens import leading_rows, lens_maps
    from vit.sources.vlm import word_embeddings

    image, size, grid, table, encoded, vectors = _lens_words(checkpoint, image, words, size)
    model, p = checkpoint.model, checkpoint.preprocessing
    device = next(model.parameters()).device
    x = preprocess([image], p, size, model.config.patch_size).to(device)  # (1, C, H, W)
    unit, lead = word_embeddings.projector_unit(checkpoint), leading_rows(model)
    with torch.inference_mode():
        projected = model.project(model.tokens(x)[0], grid)[0].float()  # (lead + N, E), units row-major
        maps = lens_maps(projected, vectors.to(device), grid, unit, lead).cpu().numpy()  # (W, gh, gw)
    seen, box = seen_region(image, p, size), input_box(image.size, p, size)
    # LLaVA's "full" strategy: the CLS's projection is an image token too, though no patch's
    kept = "; the CLS's image token, which the language model reads too, covers no patch" if lead else ""
    results = []
    for word, map2d in zip(encoded, maps, strict=True):
        how = f"the mean of its {len(word.ids)} tokens' embeddings" if len(word.ids) > 1 else "its embedding"
        results.append(WordMap(
            "visual_lens", map2d.astype(np.float32), image, seen, box, grid, model.num_prefix_tokens,
            target=word.text, query=-1,
            description=(f"visual logit lens of {word.text!r} ({' '.join(word.tokens)}): each image token's dot "
                         f"product with {how}{kept}"),
            settings={"method": "visual_lens", "word": word.text}, word=word.text, tokens=word.tokens,
            token_ids=word.ids, units=map2d[::unit, ::unit].copy(), embedding=table.note))
    return results


def explain_word(checkpoint: Checkpoint, image: ImageLike, word: str, method: str = "legrad", *,
                 patch: int | None = None, size: int | InputSize | None = None) -> Explanation:
    """A gradient map of a VLM's tower whose target is ``word``'s visual logit lens score (``visual_logit_lens``):
    at the projected token that covers patch ``patch`` (row-major on the patch grid; the merge unit under it in
    Qwen-VL, InternVL and Gemma 3), or summed over every projected token (None). ``method``: ``legrad``, ``class``
    (gradient rollout: the row of ``patch``'s token) or ``attnlrp``, each run as for a classifier whose one logit is
    that score (through Qwen2.5-VL's windows, each placed by its window index). ValueError or CheckpointError in
    one line."""
    from vit.explain.methods.visual_lens import leading_rows
    from vit.explain.methods.vlm_targets import lens_model, unit_of_patch
    from vit.sources.vlm import word_embeddings

    if method not in LENS_TARGET_METHODS:
        raise ValueError(f"a word's lens score is a target of {', '.join(LENS_TARGET_METHODS)}, not {method!r}")
    if not isinstance(word, str):
        raise ValueError(f"give one word (a string), got a {type(word).__name__}; vit.visual_logit_lens maps several")
    if method == "class" and patch is None:
        raise ValueError("gradient rollout draws one token's row: give the patch whose image token is the target "
                         "(patch=...), or use legrad or attnlrp for every token")
    image, size, grid, _, [encoded], vectors = _lens_words(checkpoint, image, [word], size)
    unit = word_embeddings.projector_unit(checkpoint)
    units = None
    if patch is not None:  # its unit's row, after the prefix tokens the projector keeps (LLaVA "full": the CLS)
        count = grid[0] * grid[1]
        units = torch.tensor([unit_of_patch(_index(patch, count, "patch", f"this input has {count} patches"),
                                            grid, unit) + leading_rows(checkpoint.model)])
    wrapped = replace(checkpoint, model=lens_model(checkpoint.model, vectors, grid, units), class_names=[word],
                      training_state=None)
    query = None if method != "class" else patch % (grid[0] * grid[1]) + checkpoint.model.num_prefix_tokens
    shown = _explain_image(wrapped, image, method, target=0, query=query, size=size)  # a tower sees images
    spans = f" ({unit}x{unit} patches)" if unit > 1 else ""
    where = ("summed over every image token" if units is None
             else f"at the image token over patch {patch % (grid[0] * grid[1])}{spans}")
    shown.description = f"{shown.description} Target: the visual logit lens score of {word!r} {where}."
    shown.target, shown.prediction = word, None
    return shown


def open_vlm(model: str | os.PathLike | Checkpoint, device: str | torch.device | None = None, *,
             pan_and_scan: bool = False):
    """A vision-language model opened whole from its folder, its Hub id (``org/name[@revision]``: the HF cache's
    snapshot, downloaded whole when it is not there, its size checked first) or ``vit.load``'s checkpoint of its
    tower opened from a folder, to ask it questions (``ask_vlm``): transformers' own model class and processor, no
    remote code. Open it once and
    ask it many times; VLMError (one line) for a folder that cannot be. ``pan_and_scan``: Gemma 3's processor cuts
    a long image into crops, each its own image beside the whole one (its maps on the crops' canvas, the whole as
    the overview); VLMError for another family."""
    from vit.sources.vlm.whole_vlm import open_whole_vlm

    return open_whole_vlm(model, device, pan_and_scan)


def ask_vlm(model, image: ImageLike, question: str | None = None, *, prompt: str | None = None,
            max_new_tokens: int = 32, on_token=None) -> VLMAnswer:
    """A vision-language model's greedy answer to ``question`` about ``image`` (through its processor's chat
    template; ``prompt=`` instead: raw text with the model's image placeholder, the template bypassed), token for
    token transformers' ``generate``. ``model``: ``open_vlm``'s model, or a folder / ``vit.load`` checkpoint opened
    for this call. Returns a ``VLMAnswer``: ``.tokens``, ``.text``, ``.pieces`` and ``.attention(i, layer,
    head=None)``, answer token ``i``'s attention to the image tokens on the tower's patch grid (heads averaged when
    ``head`` is None) from the query that predicted it, computed from the KV cache when asked. What it holds is
    counted first and refused in one line over the memory bound (VIT_ANALYSIS_MEMORY_MB). ``on_token(tokens, text)``:
    given the answer so far (its ids and text) as each token is chosen, to stream it."""
    from vit.explain.language.vlm_answer import answer

    return answer(open_vlm(model), _image(image), question, prompt=prompt, max_new_tokens=max_new_tokens,
                  on_token=on_token)


# -- SAM and SAM 2: prompts in, masks out ---------------------------------------------------------------------------

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

        index = self.mask if mask is None else _index(mask, len(self.scores), "mask", f"{len(self.scores)} masks")
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
            values = heads.mean(axis=0) if head is None else heads[_index(head, len(heads), "head",
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
        return _save(path, self.picture(), arrays)

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

    image = _image(image)
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
