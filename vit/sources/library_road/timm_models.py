"""The library road for timm: a timm model whose architecture has no port, opened as timm builds it.

``timm.create_model`` builds the folder's architecture (its config.json's ``architecture``, ``model_args`` and
``num_classes``), and its weights are loaded with ``strict=True``: what runs is timm's own modules, so logits and
features are timm's by construction. Every attention module of timm's (``Attention``, ``AttentionRope``,
``EvaAttention``, ``RelPosAttention`` ...) has a fused path (SDPA) and an explicit one chosen by its ``fused_attn``
flag, and the explicit one passes the post-softmax probabilities through its ``attn_drop``. Each attention module is
given a ``fused_attn`` that is False only for the layers the current recorder asks (a ContextVar's, so two threads
over one model never see each other's), and a hook on its ``attn_drop`` hands those probabilities to the recorder:
the layers a view does not ask run timm's fused path, the asked ones timm's own explicit path, whose probabilities
are what timm's attention computes.

Where the patches are (``LibraryLayout``) comes from the model itself: ``num_prefix_tokens`` and the patch
embedding's ``patch_size``, at the input size of its pretrained config (or ``model_args``' ``img_size``). A model
whose attention runs over other tokens (windows, pooled stages, two branches) is refused in one line, checked on
the meta device before any weight is read.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.overrides import TorchFunctionMode

from vit.checkpoint import Checkpoint, preprocessing_problem
from vit.model import ViTConfig
from vit.sources.files import SourceError, _one_line
from vit.sources.library_road.transformers_models import (
    ROAD,
    LibraryLayout,
    LibraryModel,
    _AttentionRecorder,
    _pair,
)

# The recorder current in this context: its ``layers`` (attention module -> layer) run timm's explicit path and
# hand it their probabilities
_RECORDING: contextvars.ContextVar[object | None] = contextvars.ContextVar("vit_timm_recording", default=None)
_RECORDED_CLASSES: dict[type, type] = {}
_RECORDED_POOLS: dict[type, type] = {}  # an attention-pooling head's class, recorded (``_recorded_pool_class``)


def _recorded_class(cls: type) -> type:
    """``cls`` (a timm attention module's class) with a ``fused_attn`` that is False while the current recorder
    asks this module, else the module's own flag."""
    if cls not in _RECORDED_CLASSES:
        def fused_attn(self) -> bool:
            recorder = _RECORDING.get()
            if recorder is not None and self in recorder.layers:
                return False
            return self.__dict__["_vit_fused_attn"]

        def set_fused_attn(self, value: bool) -> None:
            self.__dict__["_vit_fused_attn"] = value

        _RECORDED_CLASSES[cls] = type(cls.__name__, (cls,), {"fused_attn": property(fused_attn, set_fused_attn),
                                                             "__module__": cls.__module__,
                                                             "__qualname__": cls.__qualname__})
    return _RECORDED_CLASSES[cls]


class _SoftmaxTaken(TorchFunctionMode):
    """Within it, every softmax's result is kept (``taken``): timm's attention-pooling head (``AttentionPoolLatent``)
    forms its probabilities by one softmax on its explicit path, and hands them to no module a hook could read."""

    SOFTMAX = (torch.Tensor.softmax, torch.softmax, torch.nn.functional.softmax)

    def __init__(self):
        super().__init__()
        self.taken: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self.SOFTMAX:
            self.taken.append(out)
        return out


def _recorded_pool_class(cls: type) -> type:
    """``cls`` (timm's attention-pooling head) recorded as ``_recorded_class`` records an attention, and, while the
    current recorder asks this module, run on its explicit path with its one softmax's probabilities ``(B, H, latents,
    T)`` handed to the recorder."""
    if cls not in _RECORDED_POOLS:
        attention = _recorded_class(cls)

        def forward(self, *args, **kwargs):
            recorder = _RECORDING.get()
            layer = None if recorder is None else recorder.layers.get(self)
            if layer is None:
                return cls.forward(self, *args, **kwargs)
            with _SoftmaxTaken() as softmax:
                out = cls.forward(self, *args, **kwargs)
            if len(softmax.taken) != 1:
                raise ValueError(f"{cls.__name__}'s explicit path formed {len(softmax.taken)} softmaxes, not its "
                                 "one attention's; its probabilities cannot be read")
            recorder.keep_probabilities(layer, softmax.taken[0])
            return out

        _RECORDED_POOLS[cls] = type(cls.__name__, (attention,), {"forward": forward, "__module__": cls.__module__,
                                                                 "__qualname__": cls.__qualname__})
    return _RECORDED_POOLS[cls]


def pooling_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """``model``'s attention-pooling head (timm's ``attn_pool``, ``AttentionPoolLatent``: a latent query's attention
    over the tokens, what a MAP-pooled embedding reads) made recordable, or None where it has none."""
    pool = getattr(model, "attn_pool", None)
    if not isinstance(pool, torch.nn.Module):
        return None
    if type(pool) in _RECORDED_POOLS.values():  # made recordable before
        return pool
    if "fused_attn" not in vars(pool):
        return None
    fused = bool(pool.__dict__.pop("fused_attn"))
    pool.__class__ = _recorded_pool_class(type(pool))
    pool.fused_attn = fused
    return pool


def _hand_probabilities(attention: torch.nn.Module):
    """The forward hook of ``attention``'s ``attn_drop``: its input, the post-softmax probabilities (B, H, T, T), to
    the current recorder when it asks this module."""
    def hook(module, args, output) -> None:
        recorder = _RECORDING.get()
        layer = None if recorder is None else recorder.layers.get(attention)
        if layer is not None:
            recorder.keep_probabilities(layer, args[0])
    return hook


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """timm's attention modules of ``model``'s blocks, in order: one per layer (those with a ``fused_attn`` flag and
    an ``attn_drop``; a pooling head's attention is not a layer)."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, torch.nn.Module):
        return []
    return [m for m in blocks.modules() if ("fused_attn" in vars(m) or "_vit_fused_attn" in vars(m))
            and isinstance(getattr(m, "attn_drop", None), torch.nn.Dropout)]  # recorded already: a model opened again


def _record_through(modules: list[torch.nn.Module]) -> None:
    """Make each of ``modules`` recordable: its class given the recorder's ``fused_attn``, its ``attn_drop`` hooked."""
    for module in modules:
        if "fused_attn" not in vars(module):  # made recordable when it was opened before (a model in hand, again)
            continue
        fused = bool(module.__dict__.pop("fused_attn"))
        module.__class__ = _recorded_class(type(module))
        module.fused_attn = fused
        module.attn_drop.register_forward_hook(_hand_probabilities(module))


@contextlib.contextmanager
def recording(recorder):
    """Within it, the modules ``recorder.layers`` lists run timm's explicit path and hand it their probabilities,
    in this context only."""
    token = _RECORDING.set(recorder)
    try:
        yield recorder
    finally:
        _RECORDING.reset(token)


class TimmLibraryModel(LibraryModel):
    """A timm model as timm builds it, its asked layers' attention recorded. ``model`` is the module that runs (eval
    mode): timm's model, or open_clip's tower around a timm ``trunk``, which holds the attention; ``layout`` places
    the trunk's tokens on the image."""

    forms_asked_rows = False  # timm's explicit path forms a layer's whole attention

    def __init__(self, model: torch.nn.Module, layout: LibraryLayout, attention_modules: list[torch.nn.Module],
                 trunk: torch.nn.Module | None = None):
        super().__init__(model, layout, attention_modules)
        self.trunk = model if trunk is None else trunk

    @property
    def config(self):
        """timm's pretrained config (``pretrained_cfg``)."""
        return getattr(self.model, "pretrained_cfg", {})

    @property
    def num_heads(self) -> int:
        return int(self._attention[0].num_heads)

    @property
    def is_classifier(self) -> bool:
        return int(getattr(self.model, "num_classes", 0) or 0) > 0

    def cost_shape(self):
        """What the cost model reads of it (``vit.costs.plan.LibraryShape``), from timm's modules: the attention's
        input width, its MLP's hidden widths (every linear layer of the first block's ``mlp`` but the one back to
        the stream: a gated MLP's both branches), the prefix tokens, the patch and the channels."""
        from vit.costs.plan import LibraryShape

        attention = self._attention[0]
        qkv = getattr(attention, "qkv", None)
        hidden = int(qkv.in_features if isinstance(qkv, torch.nn.Linear) else self.trunk.embed_dim)
        mlp = getattr(self.trunk.blocks[0], "mlp", None)
        widths = [m.out_features for m in (mlp.modules() if mlp is not None else ())
                  if isinstance(m, torch.nn.Linear) and m.out_features != hidden]
        proj = getattr(self.trunk.patch_embed, "proj", None)
        return LibraryShape(self.num_layers, self.num_heads, hidden, sum(widths) or 4 * hidden,
                            self.layout.num_prefix_tokens, self.layout.patch_hw,
                            int(getattr(proj, "in_channels", 3)))

    def _recorded_forward(self, pixels: torch.Tensor, recorder: _AttentionRecorder) -> SimpleNamespace:
        """timm's forward of ``pixels``: ``logits`` of a classifier, else ``last_hidden_state`` (its
        ``forward_features``), else open_clip's ``image_embeds``; the layers ``recorder`` lists on timm's explicit
        path, their probabilities kept (with autograd where the recorder asks for gradients)."""
        with torch.set_grad_enabled(recorder.gradient), recording(recorder):
            if self.is_classifier:
                return SimpleNamespace(logits=self.model(pixels))
            if self.trunk is self.model:
                return SimpleNamespace(last_hidden_state=self.model.forward_features(pixels))
            return SimpleNamespace(image_embeds=self.model(pixels))  # open_clip's tower: its image embedding

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """The logits of a classifier, else timm's features ``(B, T, hidden)``, or open_clip's image embedding."""
        out = vars(self.run(pixels)[0])
        return next(iter(out.values()))


UNTRACED = "its forward cannot be traced on the meta device"


def _layout_problem(model: TimmLibraryModel, channels: int) -> str | None:
    """Why the layout does not place the tokens every layer's attention runs over (timm's forward on the meta
    device, every layer recorded: shapes only), or None."""
    pixels = torch.empty(1, channels, *model.layout.image_hw, device="meta")
    seen: list[int] = []

    class Shapes:  # a recorder that notes each layer's key count and keeps nothing
        layers = {module: i for i, module in enumerate(model._attention)}

        @staticmethod
        def keep_probabilities(layer, probabilities) -> None:
            seen.append(int(probabilities.shape[-1]))

    module = model.model
    swapped = {name: torch.empty_like(t, device="meta")  # a model with its weights in: their shapes alone
               for name, t in [*module.named_parameters(remove_duplicate=False),
                               *module.named_buffers(remove_duplicate=False)] if t.device.type != "meta"}
    try:
        with torch.no_grad(), recording(Shapes()):
            torch.func.functional_call(module, swapped, (pixels,)) if swapped else module(pixels)
    except (RuntimeError, ValueError, TypeError, NotImplementedError, IndexError, AssertionError) as e:
        return f"{UNTRACED} to check where its tokens sit ({_one_line(e)})"
    expected = model.layout.num_tokens
    if len(seen) != model.num_layers or set(seen) != {expected}:
        gh, gw = model.layout.grid
        return (f"its attention runs over {sorted(set(seen)) or 'no recorded'} tokens, not the "
                f"{model.layout.num_prefix_tokens} prefix tokens and {gh}x{gw} patches the library road places "
                "(windows, pooled stages or several branches need a layout of their own: issue 91)")
    return None


MAX_LAYERS = 1000  # blocks a model_args may declare (each is built, on the meta device, before the weights' check)
MAX_NUMBER = 1_000_000  # any other number in model_args (a width, a ratio's numerator), as the weights bound them


def _declared_problem(model_args: Mapping) -> str | None:
    """Why ``model_args`` declares more than can be built before the weights' shapes are checked, or None: the
    layers (``depth``, ``depths``) and every number, nested lists included."""
    def numbers(value):
        if isinstance(value, bool):
            return
        if isinstance(value, (int, float)):
            yield value
        elif isinstance(value, (list, tuple)):
            for item in value[:64]:
                yield from numbers(item)
            if len(value) > 64:
                yield float("inf")
        elif isinstance(value, Mapping):
            yield float("inf")

    depth = model_args.get("depth", 0)
    depths = model_args.get("depths", ())
    layers = (sum(numbers(depth)) if not isinstance(depth, bool) else 0) + sum(numbers(depths))
    if not layers <= MAX_LAYERS:
        return f"its model_args declare {layers} layers, over the {MAX_LAYERS} this program builds"
    for key, value in model_args.items():
        if any(not abs(n) <= MAX_NUMBER for n in numbers(value)):
            return f"its model_args' {str(key)[:40]} is over {MAX_NUMBER:,} (or not a plain number or list of them)"
    return None


def _sides(value):
    """A side or (height, width) as ``_pair`` reads it: a list made a tuple."""
    return tuple(value) if isinstance(value, list) else value


def with_tied(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with each weight the model ties under several names (CoaT's convolutional position encoding, shared
    by its blocks) given under all of them, where the weights name it once (``safetensors.torch.save_model`` keeps one
    name of a shared tensor); a name the model does not tie is left to the strict load."""
    state = dict(state)
    names: dict[int, list[str]] = {}
    for name, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        names.setdefault(id(tensor), []).append(name)
    for tied in names.values():
        present = next((n for n in tied if n in state), None)
        if len(tied) > 1 and present is not None:
            state.update({n: state[present] for n in tied if n not in state})
    return state


def _build(name: str, kwargs: Mapping, device: str | torch.device) -> torch.nn.Module:
    import timm

    with torch.device(device):
        return timm.create_model(name, pretrained=False, **kwargs)


def open_timm_library(path: Path, state: Mapping[str, torch.Tensor], name: str, config_json: Mapping,
                      model_args: Mapping, preprocessing_of, map_location: str | torch.device = "cpu") -> Checkpoint:
    """``state`` (timm weights of architecture ``name``) in the model timm builds for it, in a ``Checkpoint`` with
    ``road="library"``. ``preprocessing_of(stand_in)`` is timm's evaluation transform for a ``ViTConfig`` that
    carries the input size and patch size (``vit.sources.ports.libraries.import_timm.preprocessing_from_timm``).
    ``map_location="meta"``: built on the meta device, the weights' shapes checked, no data read. SourceError (one
    line) for an architecture timm does not know, weights that do not fit it, or attention the layout cannot
    place."""
    import timm

    origin = f"{path} (timm {name}, opened as timm builds it)"
    if not timm.is_model(name):
        raise SourceError(f"{origin}: timm has no architecture {name[:60]!r}")
    kwargs = dict(model_args)
    problem = _declared_problem(kwargs)
    if problem:
        raise SourceError(f"{origin}: {problem}")
    classes = config_json.get("num_classes")
    if isinstance(classes, int) and not isinstance(classes, bool) and 0 <= classes <= 100_000:
        kwargs["num_classes"] = classes
    if "img_size" in kwargs:
        try:
            _pair(_sides(kwargs["img_size"]), "img_size")
        except ValueError as e:
            raise SourceError(f"{origin}: {_one_line(e)}") from None
    meta = torch.device(map_location).type == "meta"
    try:
        # the meta pass first: every declared size checked against the weights' shapes before any memory is taken
        model = _build(name, kwargs, "meta" if meta else "cpu")
        model.load_state_dict(with_tied(model, state), strict=True, assign=meta)
        model = model.to(map_location).eval()
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError, AssertionError) as e:
        raise SourceError(f"{origin}: the weights do not fit {name} as timm builds it ({_one_line(e)})") from None
    labels = config_json.get("label_names") or (config_json.get("pretrained_cfg") or {}).get("label_names")
    n = int(getattr(model, "num_classes", 0) or 0)
    names = [str(label) for label in labels] if isinstance(labels, list) and len(labels) == n else [
        f"class {i}" for i in range(n)]
    return _checkpoint(path, origin, model, model, preprocessing_of, names, "timm", f"timm:{name}", meta)


def _checkpoint(path: Path, origin: str, model: torch.nn.Module, trunk: torch.nn.Module, preprocessing_of,
                names: list[str], kind: str, architecture: str, meta: bool) -> Checkpoint:
    """The checkpoint of ``model`` (built, its weights in), whose timm ``trunk`` holds the attention: the trunk's
    attention made recordable, its layout read and checked (on the meta device), the preprocessing read."""
    modules = attention_modules(trunk)
    if not modules:  # attention of its own (CaiT, PiT, EfficientFormer ...): the recorder at the attention function
        return _recorded(path, origin, model, trunk, names, kind, architecture, preprocessing_of)
    embed = getattr(trunk, "patch_embed", None)
    if not isinstance(embed, torch.nn.Module) or not hasattr(embed, "patch_size") or not hasattr(embed, "img_size"):
        # patch embeddings of its own (Twins' one a stage): the recorder's layers and places
        return _recorded(path, origin, model, trunk, names, kind, architecture, preprocessing_of)
    try:
        patch = _pair(_sides(embed.patch_size), "patch_size")
        # the input's channels: its first convolution's (a hybrid's backbone stem, before its proj)
        channels = int(next((m.in_channels for m in embed.modules() if isinstance(m, torch.nn.Conv2d)), 3))
        own = _pair(_sides(embed.img_size), "img_size")
        stand_in = ViTConfig(image_size=own if own[0] != own[1] else own[0],
                             patch_size=patch if patch[0] != patch[1] else patch[0], num_channels=channels,
                             num_classes=0)
        preprocessing = preprocessing_of(stand_in)
        prefix = int(getattr(trunk, "num_prefix_tokens", 0))
        layout = LibraryLayout(prefix, patch, preprocessing.image_hw)
    except (ValueError, TypeError, AttributeError) as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None
    problem = preprocessing_problem(preprocessing, stand_in)
    if problem:
        raise SourceError(f"{path} has unusable preprocessing settings: {problem}")
    if not meta and trunk is model and _other_calls(model, len(modules), layout, channels):
        # attention calls beside its timm Attention (XCiT's class attention): the recorder's layers, or its refusal
        return _recorded(path, origin, model, trunk, names, kind, architecture, preprocessing_of)
    _record_through(modules)
    wrapped = TimmLibraryModel(model, layout, modules, trunk)
    problem = _layout_problem(wrapped, channels)  # on the meta device, a model in hand's too
    if problem and (meta or not problem.startswith(UNTRACED)):  # tokens its patch embedding does not place (a
        # convolutional stem before it: ViTamin's): the recorder's layers and places, or what its layout lacks in
        # the recorder's words (XCiT's channels)
        try:
            return _recorded(path, origin, model, trunk, names, kind, architecture, preprocessing_of)
        except SourceError as named:
            raise SourceError(str(named)) from None
    metadata = {"source": {"kind": kind, "path": str(path), "architecture": architecture},
                "architecture": architecture, "parameters": sum(p.numel() for p in model.parameters()),
                "road": ROAD}
    return Checkpoint(model=wrapped, class_names=names, preprocessing=preprocessing, metadata=metadata, path=path,
                      road=ROAD)


def _other_calls(model: torch.nn.Module, modules: int, layout: LibraryLayout, channels: int) -> bool:
    """Whether ``model``'s forward (traced on the meta device by the recorder at the attention function) makes more
    attention calls than its ``modules`` timm Attention layers: then those are not all its layers. The calls of its
    attention-pooling head (``attn_pool``: PE-Core's MAP, which this road records itself, ``pooling_head``) are not
    layers."""
    from vit.sources.library_road import recorded_road

    try:
        calls, _, _ = recorded_road._trace(model, layout.image_hw, channels)
    except Exception:  # noqa: BLE001 - a forward the meta device cannot run: the timm road's own check decides
        return False
    layers = [call for call in calls if call.name != "attn_pool" and not call.name.startswith("attn_pool.")]
    return len(layers) > modules


def _recorded(path: Path, origin: str, model: torch.nn.Module, trunk: torch.nn.Module, names: list[str], kind: str,
              architecture: str, preprocessing_of) -> Checkpoint:
    """A timm model (or open_clip's tower around a timm trunk) whose attention timm's road cannot place (none of its
    blocks has timm's ``Attention``, or its tokens are not its patch embedding's: a convolutional stem before it),
    through the recorder at the attention function (``recorded_road``), at the input its ``patch_embed`` (the tower's
    ``image_size``) or ``pretrained_cfg`` says, normalised as ``preprocessing_of`` (timm's or open_clip's transform)
    says; SourceError (one line) naming what the recorder cannot place."""
    from vit.sources.library_road import recorded_road

    size = recorded_road._declared(model, "img_size", "image_size")  # open_clip's tower around a trunk: the tower
    if size is None:
        size = tuple((getattr(model, "pretrained_cfg", None) or {}).get("input_size", (3, 224, 224))[-2:])
    try:
        side = _pair(_sides(size), "img_size")
        timm_says = preprocessing_of(ViTConfig(image_size=side if side[0] != side[1] else side[0], patch_size=1,
                                               num_classes=0))  # its statistics, from its pretrained_cfg
        checkpoint = recorded_road._open_recorded(model, origin, timm_says.image_hw, timm_says.mean, timm_says.std,
                                                None, None)  # the input timm's transform (or the keywords) says
    except (ValueError, TypeError, SourceError) as e:
        raise SourceError(f"{origin}: off timm's Attention, the recorder cannot place it: "
                          f"{(str(e).splitlines() or [''])[0][:400]}") from None
    checkpoint.path, checkpoint.class_names = path, names if len(names) == len(checkpoint.class_names) else \
        checkpoint.class_names
    checkpoint.metadata["source"].update(kind=kind, path=str(path), architecture=architecture)
    checkpoint.metadata["architecture"] = architecture
    return checkpoint


def tower_fitting(embed_dim: int, vision_cfg: Mapping, state: Mapping[str, torch.Tensor],
                  map_location: str | torch.device = "cpu") -> torch.nn.Module:
    """The image tower open_clip builds for ``vision_cfg`` (``open_clip.model._build_vision_tower``) holding
    ``state``'s ``visual.*`` weights, loaded strictly, in eval mode on ``map_location``. It is built on the meta device
    first and the weights' names and shapes checked there, so a config declaring more than its weights hold (a width,
    a ratio) is refused before any memory is taken; RuntimeError and the like for weights that do not fit."""
    import open_clip

    visual = {k.removeprefix("visual."): v for k, v in state.items() if k.startswith("visual.")}
    with torch.device("meta"):
        tower = open_clip.model._build_vision_tower(embed_dim, dict(vision_cfg))
    tower.load_state_dict(visual, strict=True, assign=True)  # names and shapes: the model is the weights' size
    if torch.device(map_location).type != "meta":
        with torch.device("cpu"):
            tower = open_clip.model._build_vision_tower(embed_dim, dict(vision_cfg))
        tower.load_state_dict(visual, strict=True)
    return tower.to(map_location).eval()


def open_clip_library(path: Path, state: Mapping[str, torch.Tensor], config_json: Mapping, preprocessing_of,
                      map_location: str | torch.device = "cpu") -> Checkpoint:
    """An open_clip image tower whose trunk is a timm model (``vision_cfg.timm_model_name``: SigLIP 2, PE-Core), as
    open_clip builds it (``open_clip.model._build_vision_tower``, its ``visual.*`` weights loaded strictly), the
    trunk's attention recorded; its output is open_clip's image embedding. ``preprocessing_of(stand_in)`` is
    open_clip's transform for a ``ViTConfig`` with the input and patch size. SourceError (one line) as
    ``open_timm_library``."""
    import timm

    origin = f"{path} (open_clip, opened as open_clip builds it)"
    model_cfg = config_json.get("model_cfg")
    vision_cfg = model_cfg.get("vision_cfg") if isinstance(model_cfg, Mapping) else None
    name = vision_cfg.get("timm_model_name") if isinstance(vision_cfg, Mapping) else None
    if not isinstance(name, str) or not name:
        raise SourceError(f"{origin}: its open_clip_config.json names no timm trunk (vision_cfg.timm_model_name)")
    if not timm.is_model(name):
        raise SourceError(f"{origin}: timm has no architecture {name[:60]!r}")
    numbers = {k: v for k, v in vision_cfg.items() if not isinstance(v, str)}
    problem = _declared_problem({**numbers, "embed_dim": model_cfg.get("embed_dim", 0)})
    if problem:
        raise SourceError(f"{origin}: {problem}")
    try:
        _pair(_sides(vision_cfg.get("image_size", 224)), "image_size")
    except ValueError as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None
    meta = torch.device(map_location).type == "meta"
    try:
        tower = tower_fitting(int(model_cfg.get("embed_dim", 0)), {**vision_cfg, "timm_model_pretrained": False},
                              state, map_location)
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError, AssertionError) as e:
        raise SourceError(f"{origin}: the weights do not fit its tower as open_clip builds it ({_one_line(e)})"
                          ) from None
    trunk = getattr(tower, "trunk", None)
    if not isinstance(trunk, torch.nn.Module):
        raise SourceError(f"{origin}: open_clip built no timm trunk for it")
    return _checkpoint(path, origin, tower, trunk, preprocessing_of, [], "open_clip", f"open_clip:timm:{name}", meta)
