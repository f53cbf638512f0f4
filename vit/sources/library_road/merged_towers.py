"""Qwen 2.5-VL's and Qwen3-VL's vision towers opened alone from their own folder, as transformers builds them (issue
117, item 6): ``Qwen2_5_VisionTransformerPretrainedModel`` (``qwen2_5_vl_vision``) and ``Qwen3VLVisionModel``
(``qwen3_vl_vision``).

Each takes no image but its processor's flattened patches with their grid (``hidden_states``, ``grid_thw``): here
each image ``(C, H, W)`` of whole merge units is flattened by ``Qwen2VLImageProcessor``'s own ``patchify`` (what the
processor does after its resize and normalisation: both towers' processors are that class), every image of a batch
one entry of ``grid_thw`` (``[1, gh, gw]``: a still image, its frame repeated ``temporal_patch_size`` times, as the
processor repeats it). Its tokens run in merge order, and Qwen 2.5-VL's attend in windows over a sequence reordered
by window (transformers' ``get_vision_window_index``); both split each layer's attention at the images' (or windows')
boundaries (``cu_seqlens``) and call transformers' attention interface once a piece, so a layer is several calls of
its one attention module. The recorder here (``_Pieces``) places each call's block in the image's attention, every
entry outside its window exactly 0, its queries and keys on the grid (``placing.merge_order``: the order read from
the processor's ``patchify`` and the model's window index), and hands the layer to the view's recorder as one
``(B, H, rows, N)``: where the view asks some query rows, each call forms only the rows of its window that hold them
(none in a window that holds none), so a layer costs ``H x rows x N``, never ``H x N x N``. The tower's features
(``last_hidden_state``) come back on the grid too; its merger's output (``pooler_output``) is per merge unit,
row-major over the units.

The input size is the processor's: ``smart_resize`` of each image to whole merge units between its ``min_pixels`` and
``max_pixels`` (``Preprocessing``); a folder without a processor reads its config's patch and merge sizes and Qwen's
default pixel bounds. A processor whose patch, merge or temporal patch size is not its config's is refused in one
line. Only the asked rows are formed over SDPA (the cost model counts them, ``forms_asked_rows``), and no gradient map
is asked of a tower that has no classifier.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from vit.checkpoint import Checkpoint
from vit.core import recording_attention
from vit.model import ViTConfig
from vit.sources.files import SourceError, _one_line
from vit.sources.hf_preprocessing import hf_preprocessing
from vit.sources.library_road import transformers_models as tm
from vit.sources.library_road.library_model import LibraryLayout, LibraryModel, grid_of
from vit.sources.library_road.placing import merge_order
from vit.sources.library_road.whole_folders import built_tower, layer_attentions

MODEL_TYPES = ("qwen2_5_vl_vision", "qwen3_vl_vision")
MAX_ORDERS = 8  # grids whose merge order a tower keeps (an (N,) index each): a few sizes in turn, never unbounded


class _FlattenedPatches(torch.nn.Module):
    """A Qwen-VL tower fed images ``(B, C, H, W)``: each flattened by its processor's ``patchify``, the batch one
    sequence with its ``grid_thw``; out, its output with ``last_hidden_state`` ``(B, N, D)`` on the grid and
    ``pooler_output`` ``(B, N / merge², out)`` per merge unit, row-major."""

    def __init__(self, model: torch.nn.Module, patch: int, merge: int, temporal: int, window_px: int | None):
        super().__init__()
        from transformers import Qwen2VLImageProcessor

        self.__dict__["model"] = model  # the library's model, registered in the LibraryModel once
        self.patch, self.merge, self.temporal, self.window_px = patch, merge, temporal, window_px
        self.patchify = Qwen2VLImageProcessor().patchify
        self._orders: dict[tuple[int, int], torch.Tensor] = {}  # grid -> its ``order``, built once a grid

    def grid(self, image_hw) -> tuple[int, int]:
        """The patch grid of an ``image_hw`` input; ValueError (one line) for one of no whole merge units."""
        h, w = int(image_hw[0]), int(image_hw[1])
        unit = self.patch * self.merge
        if h % unit or w % unit:
            raise ValueError(f"a {h}x{w}-px image is no whole number of its {unit}-px merge units "
                             f"({self.merge}x{self.merge} patches of {self.patch} px)")
        return h // self.patch, w // self.patch

    def order(self, grid: tuple[int, int]) -> torch.Tensor:
        """``(N,)`` long: the grid index of each position of its sequence (``merge_order.tower_order``), built once a
        grid (a recorded forward asks it three times; the last ``MAX_ORDERS`` grids kept). Read it, never write it."""
        grid = (int(grid[0]), int(grid[1]))
        if grid not in self._orders:
            if len(self._orders) >= MAX_ORDERS:
                self._orders.pop(next(iter(self._orders)))
            self._orders[grid] = merge_order.tower_order(self.patchify, grid, self.patch, self.merge, self.temporal,
                                                         self.window_px)
        return self._orders[grid]

    def forward(self, pixel_values: torch.Tensor):
        b = pixel_values.shape[0]
        gh, gw = self.grid(pixel_values.shape[-2:])
        patches, _, _ = self.patchify(pixel_values, patch_size=self.patch, merge_size=self.merge,
                                      temporal_patch_size=self.temporal)  # (B, N, C * T * p * p)
        # on the pixels' device: transformers' vision position ids are built on grid_thw's (a CPU grid beside a GPU
        # tower's rotary frequencies fails)
        grid_thw = torch.tensor([[1, gh, gw]] * b, device=pixel_values.device)
        out = self.model(hidden_states=patches.reshape(b * gh * gw, -1), grid_thw=grid_thw)
        out.last_hidden_state = merge_order.to_grid(out.last_hidden_state, self.order((gh, gw)))
        out.pooler_output = out.pooler_output.reshape(b, -1, out.pooler_output.shape[-1])
        return out


class _Pieces:
    """The recorder the tower's attention calls are handed to: each asked layer's pieces (one call a window or image,
    ``(1, H, n, n)``, in the sequence's order) placed in each image's ``(B, H, rows, N)``, zero outside them, its
    query rows on the grid (the view's asked ``rows``, else every grid row), its keys moved onto the grid once a
    layer's pieces cover the sequence, and handed to ``view`` (the view's recorder: its heads and heads' mean applied
    there). Where the view asks some rows, a call forms only the rows of its piece that hold them (``rows_for``, an
    empty list where it holds none): ``H x rows x N`` a layer, never its whole ``N x N``."""

    gradient = False
    rows, rows_of, windows = None, {}, {}  # a piece's rows are not the grid's: named per call (``rows_for``)

    def __init__(self, view, order: torch.Tensor, images: int):
        self.view, self.order, self.images = view, order, images
        self.layers = view.layers
        tokens = len(order)
        self.back = torch.argsort(order)  # grid index -> tower position
        asked = getattr(view, "rows", None)
        if asked is not None and any(not 0 <= int(r) < tokens for r in asked):
            raise ValueError(f"a query row must be one of its {tokens} patches (0 to {tokens - 1})")
        self.asked = asked is not None
        grid_rows = torch.arange(tokens) if asked is None else torch.as_tensor(list(asked), dtype=torch.long)
        self.positions = self.back[grid_rows]  # (rows,) the tower position of each output row
        self.filled: dict[int, list] = {}  # layer -> [(B, H, rows, N), keys in the tower's order; tokens placed]

    def _piece(self, layer: int, n: int) -> tuple[int, int, torch.Tensor, torch.Tensor]:
        """The next piece of ``layer`` (``n`` tokens): its image, its first position, the output rows it holds and
        their rows within the piece."""
        tokens = len(self.order)
        start = self.filled[layer][1] if layer in self.filled else 0
        image, at = divmod(start, tokens)
        if at + n > tokens or image >= self.images:
            raise ValueError(f"layer {layer}'s attention pieces run past its images' {tokens} tokens each")
        held = ((self.positions >= at) & (self.positions < at + n)).nonzero().flatten()
        return image, at, held, self.positions[held] - at

    def rows_for(self, layer: int, n: int) -> list[int] | None:
        """The rows of ``layer``'s next call (``n`` queries) to form: those the view asks, in its order; None:
        every row (the view asks all)."""
        return self._piece(layer, n)[3].tolist() if self.asked else None

    def keep_probabilities(self, layer: int, probabilities: torch.Tensor, rows_formed: bool = False) -> None:
        n = probabilities.shape[-1]
        if probabilities.shape[0] != 1 or (not rows_formed and probabilities.shape[-2] != n):
            raise ValueError(f"layer {layer}'s attention came as {tuple(probabilities.shape)}, not one piece of the "
                             "sequence")
        image, at, held, local = self._piece(layer, n)
        if layer not in self.filled:
            self.filled[layer] = [probabilities.new_zeros(self.images, probabilities.shape[1], len(self.positions),
                                                          len(self.order)), 0]
        placed = self.filled[layer][0]
        block = probabilities[0] if rows_formed else probabilities[0][:, local.to(probabilities.device)]
        placed[image][:, held.to(placed.device), at:at + n] = block  # (H, held, n): its rows, its keys
        self.filled[layer][1] += n
        if self.filled[layer][1] == self.images * len(self.order):
            self.view.keep_probabilities(layer, placed[..., self.back.to(placed.device)], self.asked)
            del self.filled[layer]

    def output(self, layer, out) -> None:
        pass

    def check(self) -> None:
        """ValueError (one line) where an asked layer's pieces did not cover every image's tokens."""
        for layer, (_, placed) in self.filled.items():
            raise ValueError(f"layer {layer}'s attention covered {placed} of its {self.images * len(self.order)} "
                             "tokens")


class MergedTower(LibraryModel):
    """A Qwen-VL tower as transformers builds it (``LibraryModel``), fed images through ``_FlattenedPatches`` and
    its attention pieces placed on the grid (``_Pieces``)."""

    def _recorded_forward(self, pixels: torch.Tensor, recorder) -> object:
        if recorder.gradient and recorder.layers:
            raise ValueError("a gradient through a Qwen-VL tower's attention pieces is not placed; it has no "
                             "classifier to ask one of")
        order = self.entry.order(self.entry.grid(pixels.shape[-2:]))
        pieces = _Pieces(recorder, order, pixels.shape[0])
        with torch.set_grad_enabled(recorder.gradient), recording_attention.recording(self.part, pieces):
            out = self.entry(pixel_values=pixels)
        pieces.check()
        return out

    def _on_grid(self, layer: int, x: torch.Tensor, image_hw) -> torch.Tensor:
        """An attention module's input ``(B * N, D)`` in the tower's order -> ``(B, N, D)`` on the grid."""
        return merge_order.to_grid(x, self.entry.order(grid_of(self.layout, image_hw)))


def _whole(config, name: str) -> int:
    value = getattr(config, name, None)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= tm.MAX_SIDE:
        raise ValueError(f"its config's {name} {str(value)[:40]} is not a whole number from 1 to {tm.MAX_SIDE}")
    return value


def open_library(folder: Path, config_json: Mapping, image_processor: Mapping | None,
                 map_location: str | torch.device = "cpu") -> Checkpoint:
    """The folder's tower as transformers builds it, in a ``Checkpoint`` of the library road (``MergedTower``);
    SourceError (one line) for what it cannot build or place."""
    model_type = str(config_json.get("model_type"))
    model, origin = built_tower(folder, config_json, map_location)
    config, processor = model.config, dict(image_processor or {})
    try:
        patch, merge = _whole(config, "patch_size"), _whole(config, "spatial_merge_size")
        temporal, channels = _whole(config, "temporal_patch_size"), _whole(config, "in_channels")
        for name, own in (("patch_size", patch), ("merge_size", merge), ("temporal_patch_size", temporal)):
            if processor.get(name, own) != own:
                raise ValueError(f"its image processor's {name} {str(processor[name])[:20]} is not its config's "
                                 f"{own}; fix one of them")
        window = _whole(config, "window_size") if model_type == "qwen2_5_vl_vision" else None
        unit = patch * merge
        stand_in = ViTConfig(image_size=unit, patch_size=patch, num_channels=channels, num_classes=0,
                             class_token=False, pooling="avg", spatial_merge=merge)
        preprocessing = hf_preprocessing(processor or None, stand_in, type(model).__name__)
        side = preprocessing.image_hw  # the nominal size, as the port's (hf_preprocessing.qwen_nominal_size)
    except (ValueError, TypeError, AttributeError, ArithmeticError) as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None
    modules = layer_attentions(model, preprocessing, stand_in, folder, int(config.depth), f"{config.depth} layers")
    entry = _FlattenedPatches(model, patch, merge, temporal, window)
    layout = LibraryLayout(0, (patch, patch), (side[0], side[1]))
    wrapped = MergedTower(model, layout, modules, model, entry)
    return tm._finish_library(wrapped, [], preprocessing, folder, type(model).__name__, image_processor is None)

