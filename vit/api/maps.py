"""``vit.explain``: any map the explorer draws (``vit.methods()``), of an image or a video model's clip.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vit import registry
from vit.api.arguments import ImageLike, checked_index, input_size, pil_image, save_as, target_class
from vit.checkpoint import Checkpoint
from vit.core.inference import InputSize, Prediction, input_box, input_shape, seen_region
from vit.core.runfiles import (
    atomic_write_text,
)
from vit.core.text import escape_markdown, plain_text
from vit.explain.methods.stage_maps import cell_patch, on_patch_grid
from vit.explain.views import (
    attention_maps,
    image_analysis,
    map_captions,
    method_maps,
    video,
)
from vit.explain.views.overlay import (
    display_image,
    jpeg_data_uri,
    map_colours,
    to_png_bytes,
)
from vit.explain.views.overlay import overlay as draw_overlay

# Which arguments each map reads (the explorer's controls for it): others are refused rather than ignored.
_READS = {"query": "query", "layer": "layer", "end_layer": "layer", "start_layer": "layer", "head": "head",
          "class": "target"}

@dataclass
class Explanation:
    """One map of one image: ``map`` is the ``(rows, cols)`` patch grid (a pixel method's, ``pixels``: the model's
    ``(H, W)`` input pixels), drawn over ``seen`` (exactly the pixels the model saw: a centre crop for preprocessing
    that crops)."""

    method: str
    map: np.ndarray  # (gh, gw) float32; (H, W) where ``pixels``
    image: Image.Image  # the image as given
    seen: Image.Image  # the part of it the model saw, at the image's own resolution
    input_box: tuple[float, float, float, float]  # (x0, y0, x1, y1) of ``seen`` in ``image``
    grid: tuple[int, int]
    num_prefix_tokens: int
    prediction: Prediction | None = None
    target: str | None = None  # the explained class (class-specific maps) or label (vit.ask)
    query: int | None = 0  # None: rollout or the class map from the mean of the patch tokens (a pooled readout)
    description: str = field(default="", repr=False)  # plain text (the page's caption, its Markdown read)
    heads: np.ndarray | None = field(default=None, repr=False)  # (H, gh, gw): the query's row in each head
    heads_layer: int | None = None  # from 0: the layer of ``heads``
    settings: dict = field(default_factory=dict, repr=False)  # what made it, for ``to_html``
    # A model with stages (Swin, Hiera): ``map`` and ``grid`` are the layer's own grid, coarser than the image's patch
    # grid ``patch_grid``, over which each cell covers its 2**stage patches (the padding's part outside the image).
    patch_grid: tuple[int, int] | None = None
    # A pixel method's map (registry.Method.pixels: captum's Integrated Gradients, SmoothGrad, Input x Gradient) on the
    # model's input pixels, not summed over each patch: drawn at pixel resolution over ``seen``.
    pixels: bool = False

    def patch_sums(self) -> np.ndarray:
        """``map`` on the patch grid ``(rows, cols)``: a pixel map summed over each patch's pixels (the patches tile
        the model's input exactly), any other map as it is."""
        if not self.pixels:
            return self.map
        (gh, gw), (H, W) = self.grid, self.map.shape
        return self.map.reshape(gh, H // gh, gw, W // gw).sum(axis=(1, 3), dtype=np.float64).astype(np.float32)

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
        return patch_picker_figure(shown.size, jpeg_data_uri(shown), self.grid,
                                   -1 if self.query is None else self.query, self.num_prefix_tokens,
                                   show_grid=False, fit_width=shown.size[0], zoomable=True)

    def to_html(self, path: str | os.PathLike, alpha: float = 0.6, colormap: str = "inferno") -> Path:
        """Writes the explorer's export of this view to ``path``: one self-contained ``.html`` (the image, the map
        with its colour bar and caption, the heads grid, the prediction and the settings; hover a patch for its
        value) that opens offline. Returns the path."""
        path = Path(path)
        atomic_write_text(path, self.html(alpha, colormap))
        return path

    def html(self, alpha: float = 0.6, colormap: str = "inferno") -> str:
        """The text ``to_html`` writes: the view as one self-contained, offline ``.html``."""
        from vit.app.export import View, shown_settings, view_html  # the explorer's export, as its button writes it

        cmap, vmin, vmax = map_colours(self.method, self.map, colormap)
        layer = "" if self.heads_layer is None else f"Layer {self.heads_layer + 1}: "
        method = registry.find_method(self.method)  # a typed label's map: its description is its title
        view = View(title=self.description if method is None or method.group == "words" else method.title,
                    seen=self.seen, map2d=self.map, grid=self.grid if self.pixels else None,
                    caption=escape_markdown(self.description), colormap=cmap, vmin=vmin, vmax=vmax, opacity=alpha,
                    heads=self.heads,
                    heads_caption=f"{layer}each head's attention of token {self.query}.",
                    prediction=self.prediction, settings=shown_settings(self.settings))
        return view_html(view)

    def save(self, path: str | os.PathLike) -> Path:
        """``.png``: the overlay (``overlay()``); ``.npz``: ``map`` (rows, cols), ``method``, ``query`` (left out where
        the map starts from the mean of the patch tokens), ``input_box`` (x0, y0, x1, y1: the seen pixels in the
        image's), and where there are some ``heads``
        (H, rows, cols) with ``heads_layer``, ``target`` (the explained class or label), ``patch_grid`` and, for a
        pixel method, ``pixel_map`` (H, W): ``map`` then holds its patch sums (``patch_sums()``)."""
        arrays = {"map": self.patch_sums(), "method": np.str_(self.method),
                  "input_box": np.array(self.input_box, dtype=np.float64)}
        if self.query is not None:  # None: the map starts from the pooled readout, no one token
            arrays["query"] = np.int64(self.query)
        if self.pixels:
            arrays["pixel_map"] = self.map
        if self.heads is not None:
            arrays.update(heads=np.asarray(self.heads, dtype=np.float32), heads_layer=np.int64(self.heads_layer))
        if self.target is not None:
            arrays["target"] = np.str_(self.target)
        if self.patch_grid is not None:
            arrays["patch_grid"] = np.array(self.patch_grid, dtype=np.int64)
        return save_as(path, self.overlay(), arrays)

    def _repr_png_(self) -> bytes:
        return to_png_bytes(self._shown())


def explain(checkpoint: Checkpoint, image: ImageLike, method: str = "rollout", *, target: int | str | None = None,
            layer: int | None = None, head: int | None = None, query: int | None = None,
            size: int | InputSize | None = None, max_tokens: int | None = None, patch_sums: bool = False,
            **options: float | int | str) -> Explanation:
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
    A pixel method's map (``integrated_gradients``, ``smoothgrad``, ``input_x_gradient``: captum's attribution summed
    over the colour channels, signed) is on the model's input pixels ``(H, W)``; ``patch_sums`` sums it over each
    patch instead (the patch grid, as benchmarks read it; other maps are on the patch grid already).
    ``**options``: the parameters of captum's attributions and RISE, captum's names and defaults
    (``vit.explain.methods.captum_maps.Options``): ``integrated_gradients`` ``n_steps`` (50), ``baselines`` (0.0, in
    the model's input space: the normalisation's mean colour); ``smoothgrad`` ``nt_samples`` (5), ``stdevs`` (1.0),
    ``seed``; ``occlusion`` ``sliding_window_shapes`` and ``strides`` (px; default one patch), ``baselines``;
    ``feature_ablation`` ``baselines``; ``kernel_shap`` ``n_samples`` (25), ``baselines``, ``seed``; each method
    with ``baselines`` also takes ``baseline="black"`` (a black image, normalised, instead of that value); ``rise``
    ``n_masks`` (6000), ``s`` (8), ``p1`` (0.1), ``seed``; each ``batch`` (the forwards at once, default the most
    that fit the memory limit).
    Checked, with the forwards they imply, before any work.
    Raises ValueError with a message that says what to do.

    A video model (VideoMAE) takes a clip instead of ``image``: a GIF, a folder of frames or a list of PIL images,
    sampled uniformly to its ``num_frames``; ``method`` is attention, rollout, norms, or one class's (``target``)
    class, legrad or attnlrp, and ``query`` a token (time-major) or ``(frame, row, col)``; it returns a
    ``vit.explain.views.video.ClipExplanation`` whose ``map`` is ``(frames, rows, cols)``, a tubelet's value repeated
    over its frames (AttnLRP's: each frame's own pixels). TimeSformer: attention (the spatial one), temporal or norms,
    its CLS token 0 and the patches after it, and attnlrp; rollout, class and legrad are refused (two attentions per
    block). PE video (opened as transformers builds it) takes a clip too: attention and rollout (its trunk's, within
    each frame: ``query`` a frame's token, 0 its CLS, or ``(frame, row, col)``), probe (each frame's pooling head) or
    temporal (a temporal layer's, over the CLS (``query`` 0) and one token a frame (``1 + f``)),
    ``vit.explain.views.video.explain_library_clip``. The other methods are refused in one line saying why. """
    if getattr(checkpoint, "road", "port") == "library":  # transformers' own model, its attention recorded
        return _explain_library(checkpoint, image, method, target, layer, head, query, size, max_tokens, options)
    if video.is_video(checkpoint):
        return _explain_clip(checkpoint, image, method, target, layer, head, query, size, max_tokens)
    return explain_image(checkpoint, image, method, target=target, layer=layer, head=head, query=query, size=size,
                         max_tokens=max_tokens, patch_sums=patch_sums, **options)


def explain_image(checkpoint: Checkpoint, image: ImageLike, method: str, *, target: int | str | None = None,
                  layer: int | None = None, head: int | None = None, query: int | None = None,
                  size: int | InputSize | None = None, max_tokens: int | None = None, patch_sums: bool = False,
                  **options: float | int | str) -> Explanation:
    """``explain`` of an image model (every model but a video one): the method's map of one image."""
    chosen = registry.find_method(method)
    if chosen is not None and chosen.group == "words":
        raise ValueError(f"{method} maps a typed label: vit.ask(checkpoint, image, labels).explain(label, "
                         f"{method!r}) (it applies to {chosen.applies_to})")
    chosen = attention_maps.method_of(method)  # ValueError naming every map for an unknown one
    pixels = chosen.pixels and chosen.plugin is None and not patch_sums  # a built-in's (captum_maps.PIXEL_METHODS)
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
    layer_value = default if layer is None else checked_index(layer, L, "layer", f"this model has {L} layers")
    H = model.blocks[layer_value].attn.num_heads  # a stage's own in a model with stages (Swin, Hiera)
    heads_text = f"this layer has {H} heads" if model.config.stage_depths else f"this model has {H} heads per layer"
    head = None if head is None else checked_index(head, H, "head", heads_text)
    class_index = target_class(checkpoint, target)
    image, size = pil_image(image), input_size(size)
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
    T, patch_grid, readout = analysis.num_tokens, None, False
    if query is None and not analysis.staged:  # CLS; without one what the classifier reads, or the centre patch
        patch, readout = attention_maps.default_query(analysis, method, pools=model.config.pooling == "avg")
        query = None if readout else patch
    elif analysis.staged:  # query on layer l's own grid (row-major, no CLS): the page's query is the patch it covers
        lh, lw = grid = analysis.layer_grid(layer_value)
        query = 0 if query is None else checked_index(query, lh * lw, "query", f"layer {layer_value % L}'s grid has "
                                                                              f"{lh}x{lw} tokens (row-major, no CLS)")
        patch = cell_patch(query, analysis.grid, grid)
    else:
        query = patch = 0 if query is None else checked_index(query, T, "query", f"this input has {T} tokens")
    settings = attention_maps.MapSettings(kind=method, layer=layer_value, end_layer=layer_value, head=head,
                                          query=patch, class_index=class_index, start_layer=layer_value,
                                          readout=readout)
    class_index = attention_maps.resolved_class(settings, analysis)
    if method == "class":
        relevance = method_maps.class_relevance(checkpoint, image, class_index, size)
    elif chosen.own_pass and method_map is None:
        method_map = method_maps.model_method_map(checkpoint, image, method, class_index, settings.query,
                                                  settings.end_layer, settings.fusion, size,
                                                  start_layer=settings.start_layer, analysis=analysis,
                                                  options=options, pixels=pixels)
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
                       plain_text(map_captions.describe_map(settings, analysis, checkpoint.class_names, options,
                                                            pixels)),
                       None if readout else attention_maps.head_maps(analysis, settings.query, heads_layer),
                       None if readout else heads_layer,
                       {k: v for k, v in shown.items() if v is not None}, patch_grid, pixels)


def _explain_library(checkpoint: Checkpoint, image: ImageLike, method: str, target, layer, head, query, size,
                     max_tokens, options) -> Explanation:
    """``explain`` of a model opened by the library road (``vit.explain.views.library.road_maps``): each map it draws
    (``library_maps.methods()``: ``attention``, ``rollout`` and its wings') at the model's own input size, reading
    the arguments its ``LibraryMethod.reads`` names; any other map or argument is refused in one line."""
    from vit.explain.views.library import road_maps as library_maps

    if getattr(checkpoint.model, "takes_clips", False):  # PE video: a clip in, its maps over the frames
        return _explain_library_clip(checkpoint, image, method, layer, head, query,
                                     {"target": target, "size": size, "max_tokens": max_tokens, **options})
    problem = library_maps.refusal(method, bool(checkpoint.class_names), checkpoint.model)
    if problem:
        raise ValueError(problem)
    chosen = library_maps.methods()[method]
    given = {"target": target, "layer": layer, "head": head, "query": query, "size": size, "max_tokens": max_tokens,
             **options}
    unread = [name for name, value in given.items() if value is not None and name not in chosen.reads]
    if unread:
        raise ValueError(f"{method} of a model opened as its library builds it does not read {', '.join(unread)}; "
                         f"it reads {', '.join(chosen.reads) or 'none'}")
    model = checkpoint.model
    image = pil_image(image)
    shape = input_shape(image, checkpoint.preprocessing, model.layout.patch_hw)  # the image's own where it has one
    grid = (shape[0] // model.layout.patch_hw[0], shape[1] // model.layout.patch_hw[1])
    L, H, T = (model.num_layers, model.num_heads,
               model.layout.num_prefix_tokens + grid[0] * grid[1] + model.layout.num_suffix_tokens)
    layer = (max(chosen.default_layer, -L) if layer is None else checked_index(layer, L, "layer",
                                                                              f"this model has {L} layers")) % L
    head = None if head is None else checked_index(head, H, "head", f"this model has {H} heads per layer") % H
    query = library_maps.default_query(method, None if query is None else checked_index(
        query, T, "query", f"this input has {T} tokens") % T, grid, model.layout.num_prefix_tokens)
    class_index = target_class(checkpoint, target) if chosen.classifier else None
    drawn = library_maps.library_map(checkpoint, image, method, layer, head, query, class_index,
                                     {k: v for k, v in options.items() if v is not None})
    shown = {"method": method, "layer": layer if "layer" in chosen.reads else None,
             "head": head if "head" in chosen.reads else None, "query": query if "query" in chosen.reads else None,
             "target": class_index, **options}
    settings = {k: v for k, v in options.items() if v is not None and k in chosen.reads}  # an attribution's, named
    description = plain_text(chosen.describe(layer, head, query, drawn.target, **settings))
    return Explanation(method, drawn.map, image, seen_region(image, checkpoint.preprocessing),
                       input_box(image.size, checkpoint.preprocessing), drawn.grid, drawn.num_prefix_tokens,
                       drawn.prediction, drawn.target, query, description,
                       drawn.heads, drawn.heads_layer, {k: v for k, v in shown.items() if v is not None},
                       pixels=drawn.pixels)


def _refuse_one_image(clip) -> None:
    """ValueError (one line) for one image given to a video model (ViViT, VideoMAE, PE video)."""
    if isinstance(clip, Image.Image):
        raise ValueError("this video model takes a clip, not one image: give a video file, a GIF, a folder of frames "
                         "or a list of PIL images")


def _explain_library_clip(checkpoint: Checkpoint, clip, method: str, layer, head, query, unread: dict
                          ) -> video.ClipExplanation:
    """``explain`` for a video model opened as its library builds it (PE video:
    ``vit.explain.views.video.explain_library_clip``); the arguments in ``unread`` are refused where given."""
    from vit.core.clips import read_clip

    given = [name for name, value in unread.items() if value is not None]
    if given:
        raise ValueError(f"{method} of this clip model reads layer, head and query; leave out {', '.join(given)}")
    _refuse_one_image(clip)
    video.check_library_clip_settings(checkpoint, method, layer, head, query)  # before the clip is decoded
    frames = read_clip(clip, checkpoint.model.num_frames, getattr(checkpoint.model, "samples_ends", False)).frames
    return video.explain_library_clip(checkpoint, frames, method, layer, head, query)


def _explain_clip(checkpoint: Checkpoint, clip, method: str, target, layer, head, query, size, max_tokens
                  ) -> video.ClipExplanation:
    """``explain`` for a video model (``vit.explain.views.video.explain_clip``)."""
    from vit.core.clips import read_clip

    _refuse_one_image(clip)
    if size is not None:
        raise ValueError("a clip's maps read layer, head, query and target; size is for image models")
    class_index = target_class(checkpoint, target)
    video.check_clip_settings(checkpoint, method, layer, head, query, class_index)  # before the clip is decoded
    frames = read_clip(clip, checkpoint.model.config.num_frames).frames
    return video.explain_clip(checkpoint, frames, method, layer, head, query, max_tokens, class_index)
