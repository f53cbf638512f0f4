"""What the patches represent (the explorer's section of that name): PCA colours, patch similarity, correspondences.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from vit.api.arguments import ImageLike, checked_index, input_size, pil_image, save_as
from vit.api.maps import Explanation
from vit.checkpoint import Checkpoint
from vit.core.inference import TRAINING_SIZE, InputSize, input_box, seen_region
from vit.explain.views import (
    dense_views,
    image_analysis,
)
from vit.explain.views.overlay import (
    display_image,
    jpeg_data_uri,
    pca_picture,
    to_png_bytes,
)


def _analysed(checkpoint: Checkpoint, image: ImageLike, size: int | InputSize | None):
    """``(image, size, analysis)``, the dense views' memory bound checked before the forward. A model opened as its
    library builds it: its own last hidden state at its own input size (``dense_views.library_analysis``)."""
    image, size = pil_image(image), input_size(size)
    if checkpoint.road == "library":
        if size != TRAINING_SIZE:
            raise ValueError("a model opened as its library builds it runs at its own input size "
                             f"({checkpoint.preprocessing.size_text}); leave out size")
        return image, size, dense_views.library_analysis(checkpoint, image)
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
        return save_as(path, self.picture(), {"map": self.map, "mask": mask, "layer": np.int64(self.layer)})

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
        return save_as(path, self.overlay(), {"map": self.map, "query": np.int64(self.query),
                                              "layer": np.int64(self.layer)})


def similarity(checkpoint: Checkpoint, image: ImageLike, query: int = 0, layer: int | None = None, *,
               target: ImageLike | None = None, size: int | InputSize | None = None) -> Similarity:
    """The cosine similarity of token ``query`` of ``image`` (0 is CLS, patch ``p`` is ``p + num_prefix_tokens``,
    as ``explain`` counts) at ``layer`` (default the last; tokens after the final norm) to every patch of
    ``target`` (default ``image`` itself) at the same layer: ``.map`` is ``(rows, cols)`` over ``target``."""
    image, size, analysis = _analysed(checkpoint, image, size)
    index = dense_views.layer_index(analysis, layer)
    T = analysis.num_tokens
    token = checked_index(query, T, "query", f"this input has {T} tokens")
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
        return save_as(path, self.picture(), {"matches": self.matches, "scores": self.scores,
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
