"""The recorder's road: any module whose attention the recorder at the attention function sees
(``vit.core.attention_recorder``), its tokens placed by a traced forward (``infer_layout``), in a ``Checkpoint`` of
the library road (``ModuleModel``). ``module_road`` opens a module in hand by it, and ``timm_models`` and
``recorded_folder`` a timm or transformers model whose attention runs off the library's own attention; this module
imports neither, so each may open a model by it.

Where the tokens sit is inferred from one forward traced on the meta device (no data, no memory of the input's size):
the patch embedding (a convolution or unfold over the whole input whose stride is its kernel, or a convolution over a
resized copy of it: Depth Pro's encoders) and the input size give the grid, and each call's token count less the patches
the prefix tokens, which the module's own token parameters (``cls_token``, ``register_tokens``, ``class_embedding``,
``dist_token`` ...; where it holds several ViTs, those of the call's own) must account for (a forward that reads a
value, which the meta device has none of, is traced on one real image of zeros instead, its every allocation counted
first: ``bounded_forward``). Calls among learnt queries (DETR's decoder) are set aside by name, no layer
(``image_tokens``). Every call must run over the same tokens; a layout that leaves a token unplaced is refused in one
line, never guessed, and one over several sets of tokens is refused naming what it lacks (``missing_layout``: pooled
stages, pooled keys, two token sets, class-attention layers, attention over channels). The module is a classifier when
its output is a ``(B, classes)`` tensor from a linear layer; else its features are the last block's hidden tokens.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from vit.checkpoint import Checkpoint, Preprocessing, preprocessing_problem
from vit.core.attention_recorder import AttentionCall, AttentionRecording
from vit.core.threads import this_thread_only
from vit.costs.bounds import TooManyTokens
from vit.model import ViTConfig
from vit.sources.files import _one_line
from vit.sources.library_road import transformers_models
from vit.sources.library_road.placing import image_tokens
from vit.sources.library_road.placing.bounded_forward import probe_forward
from vit.sources.library_road.placing.layer_kinds import declared_patch, no_rows, noting_grids, split_layers
from vit.sources.library_road.transformers_models import (
    PREFIX_PARAMETERS,
    ROAD,
    LibraryLayout,
    LibraryModel,
    _AttentionRecorder,
    _pair,
    grid_of,
)

# The names (a parameter's last part) of a module's tokens before its patches: the library road's, and the
# authors' DINOv2 / DINOv3 (its "storage tokens") and timm spellings of registers and a distillation token
TOKEN_PARAMETERS = (*PREFIX_PARAMETERS, "reg_token", "dist_token", "class_token", "registers", "storage_tokens")


class ModuleModel(LibraryModel):
    """A module in the user's hands, its attention recorded where it is computed. ``calls`` is the module that
    makes each attention call, in the forward's order (one per layer); ``names`` their paths in the model."""

    forms_asked_rows = True  # the recorder forms only the asked query rows (``plan.library_attention``)
    call_layers: list[int] | None = None  # the attention call each layer is, where some calls are no layer
    total_calls: int | None = None  # (DETR's decoder: ``image_tokens``), and how many calls its forward makes

    def __init__(self, model: torch.nn.Module, layout: LibraryLayout, calls: list[torch.nn.Module],
                 names: list[str], classifier: bool, heads: int, width: int, channels: int):
        super().__init__(model, layout, calls)
        self.names, self.classifier, self.channels = list(names), classifier, channels
        self._heads, self._width = heads, width
        self.layer_heads = [heads] * len(calls)  # each layer's own (stages differ: ``_open_recorded`` sets them)
        self.skipped: frozenset = frozenset()  # modules whose attention is no layer (over channels): run, not kept
        self.attention_kinds: tuple[str, ...] = ()  # what computed each layer's attention (``_open_recorded``)

    @property
    def config(self):
        """What the cost model and the pages read of it (the module has no config of its own)."""
        return SimpleNamespace(num_heads=self._heads, num_attention_heads=self._heads, hidden_size=self._width,
                               num_layers=self.num_layers, num_hidden_layers=self.num_layers,
                               mlp_size=4 * self._width, patch_size=self.layout.patch_hw,
                               num_channels=self.channels, image_size=self.layout.image_hw)

    @property
    def vision_config(self):
        return self.config

    @property
    def num_heads(self) -> int:
        return self._heads

    @property
    def is_classifier(self) -> bool:
        return self.classifier

    def cost_shape(self):
        from vit.costs.plan import LibraryShape

        return LibraryShape(self.num_layers, self._heads, self._width, 4 * self._width, self.layout.num_prefix_tokens,
                            self.layout.patch_hw, self.channels)

    @property
    def places(self) -> tuple:
        """Each layer's ``layer_places.LayerPlace`` where its layers run over different tokens, else empty."""
        return getattr(self.layout, "places", ())

    def run(self, pixels: torch.Tensor, layers=(), heads: list[int] | None = None, rows: list[int] | None = None,
            heads_mean: bool = False):
        """As ``LibraryModel.run``; where the layers run over different tokens (``places``), each layer's
        ``(B, H, rows, keys)`` over its own keys (``LayerPlace``: its prefix, then its key grid's patches), a row
        asked by the layout's token (its prefix, then ``grid_of``'s patches) being the layer's token that covers
        it."""
        from vit.costs import plan

        places = self.places
        if not places:
            return super().run(pixels, layers, heads, rows, heads_mean)
        if tuple(pixels.shape[-2:]) != tuple(self.layout.image_hw):
            h, w = self.layout.image_hw
            raise ValueError(f"its layers were placed at its {h}x{w}-px input; give it that size")
        L = self.num_layers
        asked = sorted({layer % L for layer in layers})
        if heads is not None and asked and max(heads) >= min(self.layer_heads[i] for i in asked):
            raise ValueError(f"layer {asked[0] + 1} has {self.layer_heads[asked[0]]} heads; ask one of those")
        if asked:
            most = max(places[i].keys for i in asked)
            plan.decide(plan.library_attention(pixels.shape[0], max(self.layer_heads[i] for i in asked)
                                               if heads is None else len(heads), most, len(asked),
                                               None if rows is None else len(rows), heads_mean, True))
        grid = grid_of(self.layout, pixels.shape[-2:])
        recorder = _AttentionRecorder({layer: self._attention[layer] for layer in asked}, heads, None)
        recorder.heads_mean = heads_mean
        rows_of = {} if rows is None else {
            layer: [places[layer].row(q, self.layout.num_prefix_tokens, grid, layer) for q in rows] for layer in asked}
        recorder.rows_of = rows_of  # a windowed layer's rows read from each query's own window, never its T x T
        out = self._recorded_forward(pixels, recorder)
        kept = {}
        for layer, probabilities in recorder.kept.items():
            if probabilities.shape[-1] != places[layer].keys:
                raise ValueError(f"layer {layer + 1}'s attention has {probabilities.shape[-1]} keys, not the "
                                 f"{places[layer].describe()} it was placed over")
            kept[layer] = probabilities
        return out, dict(sorted(kept.items()))

    def _recorded_forward(self, pixels: torch.Tensor, recorder: _AttentionRecorder) -> SimpleNamespace:
        """The module's own forward of ``pixels``, the layers ``recorder`` lists recorded: ``logits`` of a
        classifier, else ``last_hidden_state``, the last block's output tokens ``(B, T, D)``, and ``image_embeds``,
        the module's own output where it is one vector an image past its blocks (an open_clip tower's embedding;
        None elsewhere)."""
        recorder.windows = {layer: self.places[layer].windows for layer in recorder.modules
                            if self.places and self.places[layer].windows is not None}
        hidden = {}
        hook = None
        last = None if self.classifier else self._last_block()
        if last is not None:
            def keep(module, args, output):
                hidden["x"] = output[0] if isinstance(output, (tuple, list)) else output
            hook = last.register_forward_hook(this_thread_only(keep))
        try:
            with torch.set_grad_enabled(recorder.gradient), AttentionRecording(
                self.model, recorder, skip=self.skipped, layers=self.call_layers) as mode:
                out = self.model(pixels)
        finally:
            if hook is not None:
                hook.remove()
        made = self.num_layers if self.total_calls is None else self.total_calls
        if mode.calls != made:
            raise ValueError(f"its forward made {mode.calls} attention calls, not the {made} it made when "
                             "it was opened: its layers change with the input, which this road cannot place")
        if self.classifier:
            return SimpleNamespace(logits=out)
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        # the module's own (B, E) output: an open_clip tower's image embedding (CoCa's pooled query, a ResNet's)
        embedding = first if isinstance(first, torch.Tensor) and first.dim() == 2 else None
        tokens = hidden.get("x", first)
        batch = pixels.shape[0]
        if hasattr(self.layout, "join_tokens"):  # windows folded into the batch: back in the layout's order
            tokens = self.layout.join_tokens(tokens, batch)
        if tokens.dim() == 3 and tokens.shape[0] != batch and tokens.shape[1] == batch:  # (T, B, D): OpenAI CLIP's
            tokens = tokens.transpose(0, 1)
        return SimpleNamespace(last_hidden_state=tokens, image_embeds=embedding)

    def _last_block(self) -> torch.nn.Module | None:
        """The block of the last layer (``blocks``), or None where its attention is in no list of blocks (a
        single attention module): then its output is its features."""
        try:
            return self.blocks()[-1]
        except ValueError:
            return None


def _trace(model: torch.nn.Module, image_hw: tuple[int, int], channels: int, meta: bool = True
           ) -> tuple[list[AttentionCall], AttentionRecording, object]:
    """One forward of a ``(1, channels, *image_hw)`` input, its attention calls and patch embedding noted. ``meta``:
    on the meta device (the module's parameters and buffers swapped for meta tensors of their shapes while it runs:
    no data read, no memory of the input's size taken); else one image of zeros on the module's own device (a
    forward that reads a value, which the meta device has none of: ``bounded_forward.probe_forward``, every allocation
    counted before it is made, zeros standing in for parameters still on the meta device)."""
    trace: list[AttentionCall] = []
    with noting_grids(model):
        return _traced(model, image_hw, channels, meta, trace)


def _traced(model, image_hw, channels, meta, trace):
    if meta:
        swapped = {name: torch.empty_like(t, device="meta")
                   for name, t in [*model.named_parameters(remove_duplicate=False),
                                   *model.named_buffers(remove_duplicate=False)]}
        pixels = torch.empty(1, channels, *image_hw, device="meta")
        with torch.no_grad(), AttentionRecording(model, trace=trace, image_hw=image_hw) as mode:
            out = torch.func.functional_call(model, swapped, (pixels,), tie_weights=False)
        return trace, mode, out
    what = f"its forward of one {image_hw[0]}x{image_hw[1]}-px image (the meta device cannot trace it)"
    with AttentionRecording(model, trace=trace, image_hw=image_hw) as mode:
        out = probe_forward(model, (1, channels, *image_hw), what)
    return trace, mode, out


def token_parameters(model: torch.nn.Module) -> tuple[int, list[str]]:
    """The tokens the module's own parameters add before its patches (``TOKEN_PARAMETERS``: ``(1, n, D)`` or
    ``(n, D)`` each, CLIP's ``class_embedding`` ``(D,)`` one; a list of them, one a branch, CrossViT's
    ``cls_token_0``), and their names."""
    count, names = 0, []
    for name, parameter in model.named_parameters():
        parts = name.split(".")
        last = parts[-1].rstrip("0123456789").removesuffix("_") if parts[-1][-1:].isdigit() else parts[-1]
        if last in TOKEN_PARAMETERS or len(parts) > 1 and parts[-1].isdigit() and parts[-2] in TOKEN_PARAMETERS:
            count += 1 if parameter.dim() == 1 else int(parameter.shape[-2])
            names.append(name)
    return count, names


def tower_tokens(model: torch.nn.Module, calls: list[AttentionCall]) -> tuple[int, list[str]] | None:
    """The token parameters of the ViT each of ``calls`` runs in (the nearest module around its attention that holds
    any: Depth Pro's image and FOV encoders, each with its own CLS token beside its patch encoder's), where every
    call's holds as many; else None."""
    modules = dict(model.named_modules())
    found = set()
    for call in calls:
        parts = call.name.split(".")
        for i in range(len(parts) - 1, 0, -1):
            name = ".".join(parts[:i])
            count, names = token_parameters(modules[name]) if name in modules else (0, [])
            if names:
                found.add((count, tuple(f"{name}.{n}" for n in names)))
                break
        else:  # its tokens are the whole model's
            return None
    counts = {count for count, _ in found}
    if len(counts) != 1:
        return None
    return counts.pop(), [n for _, names in sorted(found) for n in names]


def missing_layout(calls: list[AttentionCall], modules: dict[str, torch.nn.Module], patches: int | None) -> str:
    """What the token counts of ``calls`` (over more than one set of tokens) say the layout lacks, in words: attention
    over channels (a softmax as wide as its module's heads: XCiT's cross-covariance, not attention over image
    tokens), pooled keys (fewer keys than queries: Twins, MViT v2), two token sets that take turns (CrossViT's two
    branches, TNT's inner and outer tokens), class-attention layers (a few queries over every token: CaiT), else
    pooled stages (PiT, LeViT). ``patches``: the patch embedding's count, where one was found (a softmax as wide
    as the heads over as many tokens as the patches, or a few more, is taken for attention over tokens)."""
    for c in calls:
        module = modules.get(c.name)
        width = getattr(module, "head_dim", None) or (_width(module, c.heads) // c.heads if module else None)
        over_tokens = patches is not None and 0 <= c.keys - patches <= 8
        if c.queries == c.keys == width and not over_tokens and any(o.keys != width for o in calls):
            return (f"cross-covariance attention (layer {c.index}, {c.name}: over {width} channels a head) is not "
                    "attention over image tokens")
    pooled = next((c for c in calls if c.keys < c.queries), None)
    if pooled is not None:
        return (f"pooled keys (layer {pooled.index}, {pooled.name}: {pooled.queries} queries over {pooled.keys} keys, "
                "a spatial reduction)")
    seen, back = [], None
    for c in calls:
        if seen and c.queries != seen[-1] and c.queries in seen:
            back = c
            break
        if not seen or c.queries != seen[-1]:
            seen.append(c.queries)
    if back is not None:
        return (f"two token sets that take turns (layer {back.index}, {back.name}, over {back.queries} tokens again: "
                "two branches, or inner and outer tokens)")
    few = next((c for c in calls if c.queries < c.keys and c.queries <= 4), None)
    if few is not None:
        return f"class-attention layers (layer {few.index}, {few.name}: {few.queries} queries over {few.keys} keys)"
    change = next((c for c in calls if c.queries != calls[0].queries), None)
    if change is None:  # every call over the same queries, some over more keys (EfficientFormer V2's downsampling)
        strided = next(c for c in calls if c.keys != c.queries)
        return (f"pooled queries (layer {strided.index}, {strided.name}: {strided.queries} queries over "
                f"{strided.keys} keys, a strided attention)")
    return f"pooled stages (layer {change.index}, {change.name}: tokens {' -> '.join(str(n) for n in seen[:6])})"


def infer_layout(model: torch.nn.Module, image_hw: tuple[int, int], channels: int,
                 grid: tuple[int, int] | None = None, prefix: int | None = None, left_out: dict | None = None
                 ) -> tuple[LibraryLayout, list[AttentionCall], bool, image_tokens.ImageTokenCalls | None]:
    """Where ``model``'s tokens sit at an ``image_hw`` input, its attention calls (its layers), whether it is a
    classifier (its output a ``(B, n)`` linear layer's), and the calls set aside as attention of learnt queries
    (``image_tokens.split_calls``: DETR's decoder; None where every call is a layer), from one forward on the meta
    device. ``grid`` (rows, cols) and ``prefix`` override the patch embedding's grid and the token parameters' count.
    ValueError (one line) where the calls run over different token counts or the layout does not account for every
    token. ``left_out`` (a dict) is given the calls that are no layer over image tokens (``layer_kinds``: attention
    over channels), module -> why."""
    try:
        calls, mode, out = _trace(model, image_hw, channels)
    except Exception:  # noqa: BLE001 - a forward that reads a value (.item(), numpy): one image, for real
        try:
            calls, mode, out = _trace(model, image_hw, channels, meta=False)
        except TooManyTokens:  # the probe's own bound, already one line
            raise
        except Exception as e:  # noqa: BLE001 - any module's forward: its own error, in one line
            raise ValueError(f"its forward fails on one {image_hw[0]}x{image_hw[1]}-px image, so where its tokens "
                             f"sit cannot be read ({type(e).__name__}: {_one_line(e)})") from None
    if not calls and no_rows(model):
        raise ValueError(f"its attention is {no_rows(model)}: no map of attention over image tokens to record")
    if not calls:
        raise ValueError("its forward makes no attention call this road sees (F.scaled_dot_product_attention, "
                         "nn.MultiheadAttention, or a softmax over (B, heads, T, T) in a module)")
    calls, skipped = split_layers(calls, dict(model.named_modules()))
    if left_out is not None:
        left_out.update(skipped)
    try:
        return (*_placed(model, calls, mode, out, image_hw, grid, prefix), None)
    except ValueError:
        if grid is not None or prefix is not None:
            raise
        split = image_tokens.split_calls(model, calls, mode, image_hw, token_parameters(model)[0])
        if split is None:
            grouped = _grouped(model, calls, mode, out, image_hw)
            if grouped is None:
                raise
            return grouped
    # some calls attend among learnt queries (DETR's decoder, Perceiver's latents): the layers are the others
    layout = _one_grid(model, split.tokens, mode, image_hw, split.grid, None)
    return layout, list(split.kept), _classifier(out, mode), split


def _grouped(model: torch.nn.Module, calls: list[AttentionCall], mode: AttentionRecording, out, image_hw):
    """GroupViT's: its first stage's layers over the patches and its group tokens after them, the assign steps and
    the later stages (over groups) set aside and named (``placing.group_tokens``); None where it is no such model."""
    from vit.sources.library_road.placing import group_tokens

    grid = (image_hw[0] // mode.patch[0], image_hw[1] // mode.patch[1]) if mode.patch is not None else None
    found = group_tokens.split_groups(model, calls, grid)
    if found is None:
        return None
    split, groups = found
    layout = LibraryLayout(0, tuple(mode.patch), tuple(image_hw), num_suffix_tokens=groups)
    return layout, list(split.kept), _classifier(out, mode), split


def _placed(model: torch.nn.Module, calls: list[AttentionCall], mode: AttentionRecording, out, image_hw, grid,
            prefix) -> tuple[LibraryLayout, list[AttentionCall], bool]:
    """``infer_layout``'s layout of every call, or ValueError (one line)."""
    counts = sorted({c.keys for c in calls} | {c.queries for c in calls})
    if len(counts) != 1 or any(c.batch != 1 for c in calls):  # stages, windows, class attention: a place a layer
        return _staged(model, calls, mode, out, image_hw, grid, prefix), calls, _classifier(out, mode)
    try:
        layout = _one_grid(model, counts[0], mode, image_hw, grid, prefix, calls)
    except ValueError:
        if grid is not None or prefix is not None:
            raise
        try:  # a convolutional stem before the patches (ViTamin's, MobileCLIP's): a feature map of the forward's
            return _staged(model, calls, mode, out, image_hw, None, None), calls, _classifier(out, mode)
        except ValueError:
            pass
        raise
    if grid is None and prefix is None:  # one grid, but its patches taken in windows (LW-DETR, every layer global)
        reordered = _partitioned(model, calls, mode, image_hw, whole=True)
        layout = layout if reordered is None else reordered
    return layout, calls, _classifier(out, mode)


def _one_grid(model: torch.nn.Module, tokens: int, mode: AttentionRecording, image_hw: tuple[int, int],
              grid: tuple[int, int] | None, prefix: int | None, calls: list[AttentionCall] = ()) -> LibraryLayout:
    """The layout of ``calls`` all over ``tokens`` tokens: ``grid`` (else the patch embedding's, else a flattened
    feature map's) and ``prefix`` (else the token parameters' count, the model's or, where the model holds several
    ViTs, those of the one each call runs in: ``tower_tokens``), the patches after the prefix. ValueError (one line)
    where they do not account for every token."""
    if grid is not None:
        gh, gw = _pair(tuple(grid), "grid")
        if image_hw[0] % gh or image_hw[1] % gw:
            raise ValueError(f"grid {gh}x{gw} does not divide the {image_hw[0]}x{image_hw[1]}-px input into whole "
                             "patches")
        patch = (image_hw[0] // gh, image_hw[1] // gw)
    elif mode.patch is not None:
        patch = mode.patch
        gh, gw = image_hw[0] // patch[0], image_hw[1] // patch[1]
    elif declared_patch(model) is not None:  # a timm patchify by reshape, row-major (Gemma 4's)
        patch = declared_patch(model)
        gh, gw = image_hw[0] // patch[0], image_hw[1] // patch[1]
    elif mode.flat_grid is not None and not (image_hw[0] % mode.flat_grid[0] or image_hw[1] % mode.flat_grid[1]):
        gh, gw = mode.flat_grid  # a convolutional stem's map, flattened row-major into the tokens
        patch = (image_hw[0] // gh, image_hw[1] // gw)
    else:
        raise ValueError("no patch embedding found (a convolution or unfold over the whole input whose stride is its "
                         "kernel, or a feature map flattened into the tokens): give grid=(rows, cols)")
    extra = tokens - gh * gw
    if extra < 0:
        raise ValueError(f"its attention runs over {tokens} tokens, fewer than the {gh}x{gw} patches of a "
                         f"{patch[0]}x{patch[1]}-px patch at {image_hw[0]}x{image_hw[1]} px (windows, or a stage "
                         "after a downsampling, which this road has no layout for); give grid=(rows, cols) if its "
                         "tokens are one grid")
    if prefix is None:
        counted, names = token_parameters(model)
        if counted != extra:
            counted, names = tower_tokens(model, calls) or (counted, names)
        if counted != extra:
            said = f"its token parameters ({', '.join(names)}) account for {counted}" if names else \
                "no token parameter of its (cls_token, register_tokens, ...) accounts for them"
            raise ValueError(f"its attention runs over {tokens} tokens, {gh}x{gw} patches and {extra} more, and "
                             f"{said}; give prefix={extra} if all {extra} come before the patches")
        prefix = extra
    elif isinstance(prefix, bool) or not isinstance(prefix, int) or prefix != extra:
        raise ValueError(f"its attention runs over {tokens} tokens: {gh}x{gw} patches and {extra} more, not "
                         f"prefix={str(prefix)[:20]}; {extra - prefix if isinstance(prefix, int) else extra} "
                         "token(s) would be left unplaced")
    return LibraryLayout(prefix, patch, tuple(image_hw))


def _classifier(out, mode: AttentionRecording) -> bool:
    return isinstance(out, torch.Tensor) and out.dim() == 2 and mode.linear_out is out


def _staged(model: torch.nn.Module, calls: list[AttentionCall], mode: AttentionRecording, out, image_hw,
            grid, prefix) -> LibraryLayout:
    """The layout of a model whose layers run over different tokens (``layer_places``), or ValueError (one line)
    naming what its layers lack: attention over channels (XCiT's) first, which is no layer over image tokens."""
    from vit.sources.library_road.placing.layer_places import infer_places, no_layout, staged_layout

    names = dict(model.named_modules())
    patches = (image_hw[0] // mode.patch[0]) * (image_hw[1] // mode.patch[1]) if mode.patch else None
    missing = missing_layout(calls, names, patches) if len({c.queries for c in calls} | {c.keys for c in calls}) > 1 \
        else None
    # XCiT's cross-covariance attention (its module's learnt per-head temperature) is over channels, which a square
    # input's grid may match in number: refused by what the module declares, not by the count
    if missing and missing.startswith("cross-covariance") and any(
            isinstance(getattr(names.get(c.name), "temperature", None), torch.nn.Parameter) for c in calls):
        raise ValueError(f"its {missing}: no layout on this road")
    unplaced = no_layout(calls, names)
    if unplaced:
        raise ValueError(f"its {unplaced}: no layout on this road")
    counted, named = token_parameters(model)
    own = dict(model.named_parameters())
    each = [1 if own[n].dim() == 1 else int(own[n].shape[-2]) for n in named]  # a branch's own (CrossViT's)
    prefixes = tuple(dict.fromkeys((counted, *each, 0)))
    maps = set(mode.maps)
    if mode.patch is not None:  # the patch embedding's grid, where no feature map of it is 4-D (TNT's unfolded)
        maps.add((image_hw[0] // mode.patch[0], image_hw[1] // mode.patch[1]))
    try:
        places = infer_places(calls, sorted(maps), tuple(image_hw), names, prefixes)
    except ValueError as e:
        partitioned = _partitioned(model, calls, mode, image_hw) if grid is None and prefix is None else None
        if partitioned is not None:
            return partitioned
        raise ValueError(f"its {missing}: no layout on this road ({e})" if missing else str(e)) from None
    if grid is not None or prefix is not None:
        raise ValueError("its layers run over different tokens (stages, windows or class tokens), each placed on "
                         "its own grid: leave out grid= and prefix=")
    return staged_layout(places, tuple(image_hw))


def _partitioned(model: torch.nn.Module, calls: list[AttentionCall], mode: AttentionRecording, image_hw,
                 whole: bool = False):
    """The layout of windows the model's own code folds into the batch and joins again (``placing.partitions``:
    LW-DETR's, RF-DETR's), where some call attends over several pieces, or (``whole``) where every call attends over
    the whole image but its first block takes the patches in another order than row-major (LW-DETR with no windowed
    layer: its windows joined, in window order); None where its first block's input is no partition of the patch
    grid, or (``whole``) holds the patches row-major."""
    from vit.sources.library_road.placing import partitions, patch_codes

    if mode.patch is None or (not whole and all(c.batch == 1 for c in calls)):
        return None
    grid = (image_hw[0] // mode.patch[0], image_hw[1] // mode.patch[1])
    codes = partitions.first_pieces(model, calls, tuple(image_hw), _channels(model), grid)
    if codes is None or (whole and patch_codes.in_row_order(codes)):  # the common case: read once, nothing placed
        return None
    try:
        found = partitions.partition_places(model, calls, tuple(image_hw), _channels(model), grid, codes)
    except ValueError:
        if whole:  # calls that are not its pieces joined (pooled stages): no reordering of this kind
            return None
        raise
    return partitions.partitioned_layout(*found, tuple(image_hw))


def _declared(module: torch.nn.Module, *names: str):
    """The first of ``names`` the module (or its ``patch_embed``) declares, else None."""
    for owner in (module, getattr(module, "patch_embed", None)):
        for name in names:
            value = getattr(owner, name, None)
            if value is not None and not isinstance(value, torch.Tensor | torch.nn.Module):
                return value
    return None


def _statistics(module: torch.nn.Module, mean, std) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``mean`` and ``std`` as given, else what the object declares (open_clip's ``preprocess_cfg`` or
    ``image_mean`` / ``image_std``, timm's ``pretrained_cfg``); ValueError (one line) where neither says."""
    cfg = getattr(module, "preprocess_cfg", None) or getattr(module, "pretrained_cfg", None) or {}
    mean = mean if mean is not None else getattr(module, "image_mean", None) or cfg.get("mean")
    std = std if std is not None else getattr(module, "image_std", None) or cfg.get("std")
    if mean is None or std is None:
        raise ValueError(f"{type(module).__name__} declares no normalisation: give mean= and std= (e.g. ImageNet's "
                         "mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))")
    try:
        return tuple(float(v) for v in mean), tuple(float(v) for v in std)
    except (TypeError, ValueError):
        raise ValueError(f"mean {str(mean)[:40]} and std {str(std)[:40]} are not sequences of numbers") from None


def _image_hw(module: torch.nn.Module, image_size) -> tuple[int, int]:
    size = image_size if image_size is not None else _declared(module, "image_size", "img_size", "input_resolution")
    if size is None and type(module).__module__.startswith("transformers.") and hasattr(module, "config"):
        size = transformers_models.config_size(module.config)
    if size is None:
        raise ValueError(f"{type(module).__name__} does not say what input it takes: give image_size=(height, width)")
    return _pair(tuple(size) if isinstance(size, list) else size, "image_size")


def _preprocessing(module, image_hw, channels, mean, std) -> Preprocessing:
    mean, std = _statistics(module, mean, std)
    side = image_hw if image_hw[0] != image_hw[1] else image_hw[0]
    return Preprocessing(image_size=side, num_channels=channels, mean=mean, std=std)


def _channels(module: torch.nn.Module) -> int:
    """The input channels the module declares (timm's ``in_chans``: a stem that folds pixels into channels first,
    TResNet's space-to-depth, CSATv2's DCT, has no convolution over the image's own), else those of the module's
    first convolution (3 where it has none)."""
    declared = getattr(module, "in_chans", None)
    if isinstance(declared, int) and not isinstance(declared, bool) and 0 < declared <= 64:
        return declared
    conv = next((m for m in module.modules() if isinstance(m, torch.nn.Conv2d)), None)
    return int(conv.in_channels) if conv is not None else 3


def _open_recorded(module, origin, image_size, mean, std, grid, prefix) -> Checkpoint:
    image_hw = _image_hw(module, image_size)
    channels = _channels(module)
    preprocessing = _preprocessing(module, image_hw, channels, mean, std)
    skipped: dict[str, str] = {}
    layout, calls, classifier, aside = infer_layout(module, image_hw, channels, grid, prefix, skipped)
    # an open_clip tower's linear projection (a timm trunk's head.proj) gives an image embedding, not logits; so does
    # a dual encoder's image features (``embeds``: ``placing.image_part.ImagePart``'s)
    classifier = classifier and not type(module).__module__.startswith("open_clip") and not getattr(module, "embeds",
                                                                                                    False)
    names = {name: m for name, m in module.named_modules()}
    stand_in = ViTConfig(image_size=preprocessing.image_size, patch_size=layout.patch_hw if layout.patch_hw[0] !=
                         layout.patch_hw[1] else layout.patch_hw[0], num_channels=channels, num_classes=0)
    problem = preprocessing_problem(preprocessing, stand_in)
    if problem:
        raise ValueError(problem)
    first = calls[0]
    width = _width(names[first.name], first.heads)
    model = ModuleModel(module, layout, [names[c.name] for c in calls], [c.name for c in calls], classifier,
                        max(c.heads for c in calls), width, channels)
    model.layer_heads = [c.heads for c in calls]
    model.attention_kinds = tuple(c.kind for c in calls)  # "sdpa", "mha", "softmax": what computed each layer
    model.skipped = frozenset(names[name] for name in skipped)
    n = _output_classes(module, classifier)
    architecture = f"module:{type(module).__module__}.{type(module).__qualname__}"
    metadata = {"source": {"kind": "module", "path": None, "architecture": architecture},
                "architecture": architecture, "parameters": sum(p.numel() for p in module.parameters()),
                "road": ROAD, "layers": [c.name for c in calls]}
    if skipped:  # named, not drawn: attention over channels, not over image tokens
        metadata["left_out"] = dict(skipped)
    if aside is not None:  # the calls of learnt queries (DETR's decoder): run, never layers; named
        model.call_layers, model.total_calls = [c.index for c in calls], len(calls) + len(aside.others)
        metadata["not_layers"] = aside.describe_others()
    return Checkpoint(model=model, class_names=[f"class {i}" for i in range(n)], preprocessing=preprocessing,
                      metadata=metadata, path=None, road=ROAD)


def _width(attention: torch.nn.Module, heads: int) -> int:
    """The attention's width (its heads' dimensions together): an ``embed_dim``, a ``qkv`` layer's input, else
    the first linear layer's."""
    width = getattr(attention, "embed_dim", None) or getattr(attention, "dim", None)
    if isinstance(width, int):
        return width
    linear = next((m for m in attention.modules() if isinstance(m, torch.nn.Linear)), None)
    return int(linear.in_features) if linear is not None else heads * 64


def _output_classes(module: torch.nn.Module, classifier: bool) -> int:
    """A classifier's classes: its last linear layer's outputs."""
    if not classifier:
        return 0
    linear = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
    return int(linear[-1].out_features) if linear else 0
