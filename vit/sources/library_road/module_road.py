"""The model in the user's hands: a live ``torch.nn.Module`` opened as it is (``vit.load(module, ...)``).

Nothing is written to disk, nothing pickled, no weight copied: the module runs its own forward. A timm model goes the
road timm's folders go when no port reads them (``timm_models``: timm's explicit path for the asked layers, its
``pretrained_cfg`` read from the object), a transformers model the library road of its folder
(``transformers_models.library_checkpoint``, its config read from the object); an open_clip model opens its image
tower (``visual``). Any other module (the authors' DINOv2 and DINOv3, OpenAI's CLIP, a fine-tune wrapping a backbone
and a head in a class of the user's own) and an open_clip tower run under the recorder at the attention function
itself (``vit.core.attention_recorder``): its attention calls in order are the layers.

Where the tokens sit is inferred from one forward traced on the meta device (no data, no memory of the input's
size): the patch embedding (a convolution or unfold over the whole input whose stride is its kernel) and the input
size give the grid, and each call's token count less the patches the prefix tokens, which the module's own token
parameters (``cls_token``, ``register_tokens``, ``class_embedding``, ``dist_token`` ...) must account for (a forward
that reads a value, which the meta device has none of, is traced on one real image of zeros instead). Every call
must run over the same tokens; a layout that leaves a token unplaced is refused in one line, never guessed
(``grid=`` / ``prefix=`` override what inference cannot decide). The module is a classifier when its output is a
``(B, classes)`` tensor from a linear layer (its logits; an open_clip tower's projection is an embedding); else its
features are the last block's hidden tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import torch

from vit.checkpoint import Checkpoint, Preprocessing, preprocessing_problem
from vit.core.attention_recorder import AttentionCall, AttentionRecording
from vit.model import ViTConfig
from vit.sources.files import SourceError, _one_line
from vit.sources.library_road import transformers_models
from vit.sources.library_road.transformers_models import (
    PREFIX_PARAMETERS,
    ROAD,
    LibraryLayout,
    LibraryModel,
    _AttentionRecorder,
    _pair,
)

# The names (a parameter's last part) of a module's tokens before its patches: the library road's, and the
# authors' DINOv2 / DINOv3 (its "storage tokens") and timm spellings of registers and a distillation token
TOKEN_PARAMETERS = (*PREFIX_PARAMETERS, "reg_token", "dist_token", "class_token", "registers", "storage_tokens")


class ModuleModel(LibraryModel):
    """A module in the user's hands, its attention recorded where it is computed. ``calls`` is the module that
    makes each attention call, in the forward's order (one per layer); ``names`` their paths in the model."""

    forms_asked_rows = True  # the recorder forms only the asked query rows (``plan.library_attention``)

    def __init__(self, model: torch.nn.Module, layout: LibraryLayout, calls: list[torch.nn.Module],
                 names: list[str], classifier: bool, heads: int, width: int, channels: int):
        super().__init__(model, layout, calls)
        self.names, self.classifier, self.channels = list(names), classifier, channels
        self._heads, self._width = heads, width

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

    def _recorded_forward(self, pixels: torch.Tensor, recorder: _AttentionRecorder) -> SimpleNamespace:
        """The module's own forward of ``pixels``, the layers ``recorder`` lists recorded: ``logits`` of a
        classifier, else ``last_hidden_state``, the last block's output tokens ``(B, T, D)``."""
        hidden = {}
        hook = None
        last = None if self.classifier else self._last_block()
        if last is not None:
            def keep(module, args, output):
                hidden["x"] = output[0] if isinstance(output, (tuple, list)) else output
            hook = last.register_forward_hook(keep)
        try:
            with torch.set_grad_enabled(recorder.gradient), AttentionRecording(self.model, recorder) as mode:
                out = self.model(pixels)
        finally:
            if hook is not None:
                hook.remove()
        if mode.calls != self.num_layers:
            raise ValueError(f"its forward made {mode.calls} attention calls, not the {self.num_layers} it made when "
                             "it was opened: its layers change with the input, which this road cannot place")
        if self.classifier:
            return SimpleNamespace(logits=out)
        tokens = hidden.get("x", out[0] if isinstance(out, (tuple, list)) else out)
        batch = pixels.shape[0]
        if tokens.dim() == 3 and tokens.shape[0] != batch and tokens.shape[1] == batch:  # (T, B, D): OpenAI CLIP's
            tokens = tokens.transpose(0, 1)
        return SimpleNamespace(last_hidden_state=tokens)

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
    forward that reads a value, which the meta device has none of)."""
    trace: list[AttentionCall] = []
    if meta:
        swapped = {name: torch.empty_like(t, device="meta")
                   for name, t in [*model.named_parameters(remove_duplicate=False),
                                   *model.named_buffers(remove_duplicate=False)]}
        pixels = torch.empty(1, channels, *image_hw, device="meta")
        with torch.no_grad(), AttentionRecording(model, trace=trace, image_hw=image_hw) as mode:
            out = torch.func.functional_call(model, swapped, (pixels,))
        return trace, mode, out
    device = next(model.parameters(), torch.empty(0)).device
    with torch.no_grad(), AttentionRecording(model, trace=trace, image_hw=image_hw) as mode:
        out = model(torch.zeros(1, channels, *image_hw, device=device))
    return trace, mode, out


def token_parameters(model: torch.nn.Module) -> tuple[int, list[str]]:
    """The tokens the module's own parameters add before its patches (``TOKEN_PARAMETERS``: ``(1, n, D)`` or
    ``(n, D)`` each, CLIP's ``class_embedding`` ``(D,)`` one), and their names."""
    count, names = 0, []
    for name, parameter in model.named_parameters():
        if name.rpartition(".")[2] in TOKEN_PARAMETERS:
            count += 1 if parameter.dim() == 1 else int(parameter.shape[-2])
            names.append(name)
    return count, names


def infer_layout(model: torch.nn.Module, image_hw: tuple[int, int], channels: int,
                 grid: tuple[int, int] | None = None, prefix: int | None = None
                 ) -> tuple[LibraryLayout, list[AttentionCall], bool]:
    """Where ``model``'s tokens sit at an ``image_hw`` input, its attention calls, and whether it is a classifier
    (its output a ``(B, n)`` linear layer's), from one forward on the meta device. ``grid`` (rows, cols) and
    ``prefix`` override the patch embedding's grid and the token parameters' count. ValueError (one line) where the
    calls run over different token counts or the layout does not account for every token."""
    try:
        calls, mode, out = _trace(model, image_hw, channels)
    except Exception:  # noqa: BLE001 - a forward that reads a value (.item(), numpy): one image, for real
        try:
            calls, mode, out = _trace(model, image_hw, channels, meta=False)
        except Exception as e:  # noqa: BLE001 - any module's forward: its own error, in one line
            raise ValueError(f"its forward fails on one {image_hw[0]}x{image_hw[1]}-px image, so where its tokens "
                             f"sit cannot be read ({type(e).__name__}: {_one_line(e)})") from None
    if not calls:
        raise ValueError("its forward makes no attention call this road sees (F.scaled_dot_product_attention, "
                         "nn.MultiheadAttention, or a softmax over (B, heads, T, T) in a module)")
    counts = sorted({c.keys for c in calls} | {c.queries for c in calls})
    if len(counts) != 1:
        odd = next(c for c in calls if (c.queries, c.keys) != (calls[0].queries, calls[0].keys))
        raise ValueError(f"its attention runs over {counts} tokens (layer {odd.index}, {odd.name}: {odd.queries} "
                         f"queries over {odd.keys} keys, layer 0 over {calls[0].keys}); this road places one set of "
                         "tokens in every layer (pooled stages, windows or cross-attention need a layout of their own)")
    tokens = counts[0]
    if grid is not None:
        gh, gw = _pair(tuple(grid), "grid")
        if image_hw[0] % gh or image_hw[1] % gw:
            raise ValueError(f"grid {gh}x{gw} does not divide the {image_hw[0]}x{image_hw[1]}-px input into whole "
                             "patches")
        patch = (image_hw[0] // gh, image_hw[1] // gw)
    elif mode.patch is not None:
        patch = mode.patch
        gh, gw = image_hw[0] // patch[0], image_hw[1] // patch[1]
    else:
        raise ValueError("no patch embedding found (a convolution or unfold over the whole input whose stride is its "
                         "kernel): give grid=(rows, cols)")
    extra = tokens - gh * gw
    if extra < 0:
        raise ValueError(f"its attention runs over {tokens} tokens, fewer than the {gh}x{gw} patches of a "
                         f"{patch[0]}x{patch[1]}-px patch at {image_hw[0]}x{image_hw[1]} px; give grid=(rows, cols)")
    if prefix is None:
        counted, names = token_parameters(model)
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
    classifier = (isinstance(out, torch.Tensor) and out.dim() == 2 and mode.linear_out is out)
    return LibraryLayout(prefix, patch, tuple(image_hw)), calls, classifier


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


def open_module(module: torch.nn.Module, image_size=None, mean: Sequence[float] | None = None,
                std: Sequence[float] | None = None, grid: tuple[int, int] | None = None,
                prefix: int | None = None) -> Checkpoint:
    """``module`` (a live ``torch.nn.Module``, put in eval mode) in a ``Checkpoint`` with ``road="library"``, as it
    is: a timm model through timm's road, an open_clip model's image tower and any other module through the
    recorder at the attention function. ``image_size`` the input it takes (a side or (height, width); default: what
    the module declares), ``mean`` / ``std`` its normalisation (default: what it declares), ``grid`` / ``prefix``
    the layout where inference cannot decide. SourceError (one line) for what cannot be placed or is not given."""
    origin = f"{type(module).__name__} (a module in hand)"
    if not isinstance(module, torch.nn.Module):
        raise SourceError(f"vit.load takes a path, a Hub id or a torch.nn.Module, not a {type(module).__name__}")
    module.eval()
    visual = getattr(module, "visual", None)
    if isinstance(visual, torch.nn.Module) and type(module).__module__.startswith("open_clip"):
        module = visual  # an open_clip model: its image tower, whose output is the image embedding
    try:
        if grid is None and prefix is None:
            if type(module).__module__.startswith("timm."):
                return _open_timm(module, origin, image_size, mean, std)
            if type(module).__module__.startswith("transformers.") and hasattr(module, "config") and \
                    transformers_models.attention_modules(module):  # else its attention runs off the interface
                return _open_transformers(module, origin, image_size, mean, std)
        return _open_recorded(module, origin, image_size, mean, std, grid, prefix)
    except (ValueError, TypeError) as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None


def _preprocessing(module, image_hw, channels, mean, std) -> Preprocessing:
    mean, std = _statistics(module, mean, std)
    side = image_hw if image_hw[0] != image_hw[1] else image_hw[0]
    return Preprocessing(image_size=side, num_channels=channels, mean=mean, std=std)


def _channels(module: torch.nn.Module) -> int:
    """The input channels of the module's first convolution (3 where it has none)."""
    conv = next((m for m in module.modules() if isinstance(m, torch.nn.Conv2d)), None)
    return int(conv.in_channels) if conv is not None else 3


def _open_recorded(module, origin, image_size, mean, std, grid, prefix) -> Checkpoint:
    image_hw = _image_hw(module, image_size)
    channels = _channels(module)
    preprocessing = _preprocessing(module, image_hw, channels, mean, std)
    layout, calls, classifier = infer_layout(module, image_hw, channels, grid, prefix)
    # an open_clip tower's linear projection (a timm trunk's head.proj) gives an image embedding, not logits
    classifier = classifier and not type(module).__module__.startswith("open_clip")
    names = {name: m for name, m in module.named_modules()}
    stand_in = ViTConfig(image_size=preprocessing.image_size, patch_size=layout.patch_hw if layout.patch_hw[0] !=
                         layout.patch_hw[1] else layout.patch_hw[0], num_channels=channels, num_classes=0)
    problem = preprocessing_problem(preprocessing, stand_in)
    if problem:
        raise ValueError(problem)
    first = calls[0]
    width = _width(names[first.name], first.heads)
    model = ModuleModel(module, layout, [names[c.name] for c in calls], [c.name for c in calls], classifier,
                        first.heads, width, channels)
    n = _output_classes(module, classifier)
    architecture = f"module:{type(module).__module__}.{type(module).__qualname__}"
    metadata = {"source": {"kind": "module", "path": None, "architecture": architecture},
                "architecture": architecture, "parameters": sum(p.numel() for p in module.parameters()),
                "road": ROAD, "layers": [c.name for c in calls]}
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


def _open_timm(model: torch.nn.Module, origin: str, image_size, mean, std) -> Checkpoint:
    """A timm model object on timm's road (``timm_models._checkpoint``), its ``pretrained_cfg`` read from it; the
    keywords override its input size and statistics."""
    from vit.sources.library_road import timm_models
    from vit.sources.ports.libraries import import_timm

    cfg = dict(getattr(model, "pretrained_cfg", None) or {})
    if mean is not None or std is not None or cfg.get("mean") is None or cfg.get("std") is None:
        cfg["mean"], cfg["std"] = _statistics(model, mean, std)
    own = getattr(getattr(model, "patch_embed", None), "img_size", None)  # what the object was built for, over
    size = image_size if image_size is not None else own  # its pretrained_cfg's input_size (a default's)
    args = {}
    if size is not None:
        args["img_size"] = list(_pair(tuple(size) if isinstance(size, list) else size, "image_size"))
    name = str(cfg.get("architecture") or type(model).__name__)
    n = int(getattr(model, "num_classes", 0) or 0)
    try:
        return timm_models._checkpoint(
            Path(f"timm:{name}"), origin, model, model,
            lambda stand_in: import_timm.preprocessing_from_timm(name, stand_in, cfg, args),
            [f"class {i}" for i in range(n)], "module", f"timm:{name}", False)
    except SourceError as e:
        raise ValueError(str(e).partition(": ")[2] or str(e)) from None



def _open_transformers(model: torch.nn.Module, origin: str, image_size, mean, std) -> Checkpoint:
    """A transformers model object on transformers' library road (``transformers_models.library_checkpoint``), its
    config read from it, the keywords its image processor (a transformers model carries none): a resize straight to
    ``image_size`` (default its config's) and ``mean`` / ``std``, which it does not declare."""
    from vit.sources.library_road import transformers_models

    problem = transformers_models.declared_problem(model.config.to_dict())
    if problem:
        raise ValueError(problem)
    if mean is None or std is None:
        raise ValueError(f"{type(model).__name__} declares no normalisation (its image processor does): give mean= "
                         "and std= (its processor's image_mean and image_std)")
    size = image_size if image_size is not None else transformers_models.config_size(model.config)
    if size is None:
        raise ValueError(f"{type(model).__name__}'s config has no image_size: give image_size=(height, width)")
    h, w = _pair(tuple(size) if isinstance(size, list) else size, "image_size")
    processor = {"do_resize": True, "size": {"height": h, "width": w}, "do_center_crop": False,
                 "do_normalize": True, "image_mean": [float(v) for v in mean], "image_std": [float(v) for v in std]}
    try:
        checkpoint = transformers_models.library_checkpoint(model, processor, Path(type(model).__name__), origin)
    except SourceError as e:
        raise ValueError(str(e).partition(": ")[2] or str(e)) from None
    checkpoint.path = None
    checkpoint.metadata["source"]["kind"] = "module"
    checkpoint.metadata["source"]["path"] = None
    return checkpoint
