"""The library road: a transformers vision model whose family has no port, opened as transformers builds it.

The folder's own model class (``architectures[0]``, else ``AutoModel``) is built from its config.json and weights,
offline and without remote code, with its attention implementation set to the recording attention over SDPA
(``vit.core.recording_attention``): every attention module of the model runs through transformers' own
``sdpa_attention_forward``, so logits and features are the library's by construction. Only when a view asks
(``LibraryModel.run(pixels, layers=...)``) does the recording keep, for the asked layers, the post-softmax attention
probabilities (what ``output_attentions=True`` returns), formed once at the layer's SDPA call: the asked query rows
alone beside SDPA's output, or every row and the output computed from them (``vit.core.attention_recorder.sdpa_once``,
the module road's piece), in a recorder that is the current context's alone, so concurrent calls never mix. What it
keeps is counted by the cost model (``vit.costs.plan.library_attention``) and refused in one line past the limit before
the forward.

Where the patches are (``LibraryLayout``) comes from the config and the image processor: the patch size, the input
size (its size or crop), and the prefix tokens before the patches (a CLS token, registers, Pixio's several CLS
tokens), counted from the embeddings' own token parameters. Families with a port never come here
(``vit.sources.open.open_hf_folder`` asks ``opens`` only for a model_type no port reads).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Hashable, Iterator, Mapping
from pathlib import Path

import torch

from vit.checkpoint import Checkpoint, Preprocessing, preprocessing_problem
from vit.core import recording_attention
from vit.model import ViTConfig
from vit.sources.build_bounds import declared_number_problem
from vit.sources.files import SourceError, _one_line, library_error_line, library_errors
from vit.sources.hf_preprocessing import hf_preprocessing
from vit.sources.library_road.class_reading import read_class
from vit.sources.library_road.library_model import (  # noqa: F401 - importable from here, as before the split
    ROAD,
    LibraryLayout,
    LibraryModel,
    _AttentionRecorder,
    _GradientRecorder,
    _inner_config,
    _pass_through,
    _take_input,
    grid_of,
)
from vit.sources.library_road.placing import one_frame

# The embeddings' parameters that are tokens before the patches: (1, n, hidden) each, CLIP's (hidden,) one
PREFIX_PARAMETERS = ("cls_token", "class_embedding", "register_tokens", "distillation_token",
                     "cls_register_token")  # C-RADIO's CLS and registers: (n, hidden)
SUFFIX_PARAMETERS = ("detection_tokens",)  # the embeddings' tokens after the patches: YOLOS's (1, n, hidden)
MAX_SIDE = 2048  # px, as vit.sources.open.MAX_INPUT_SIZE
# model_types whose tokens are not one image's prefix and patches, each opened by a module of its own that builds on
# this one (so imported by its name when asked): PE video's clip, a timm trunk per frame and a temporal encoder (alone,
# or beside a text model); Qwen-VL's towers, fed their processor's flattened patches; Llama 3.2 Vision's, its tile slots
OWN_LAYOUTS = {**dict.fromkeys(("pe_video_encoder", "pe_video"), "vit.sources.library_road.pe_video"),
               **dict.fromkeys(("tipsv2", "pixtral", "molmo2_vision"), "vit.sources.library_road.whole_folders"),
               **dict.fromkeys(("qwen2_5_vl_vision", "qwen3_vl_vision"), "vit.sources.library_road.merged_towers"),
               "mllama_vision_model": "vit.sources.library_road.tiled_towers"}


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules whose forward calls transformers' attention interface (``ALL_ATTENTION_FUNCTIONS``), in the order
    the model holds them: one per layer."""
    return [m for m in model.modules() if "ALL_ATTENTION_FUNCTIONS" in getattr(
        getattr(type(m).forward, "__code__", None), "co_names", ())]


def _pair(value, name: str) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if not (isinstance(value, (list, tuple)) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SIDE for v in value)):
        raise ValueError(f"{name} {str(value)[:40]} is not a side (or height, width) in pixels from 1 to {MAX_SIDE}")
    return int(value[0]), int(value[1])


def prefix_tokens(model: torch.nn.Module, names: tuple[str, ...] = PREFIX_PARAMETERS) -> int:
    """The tokens before the patches: the embeddings' token parameters (CLS, registers, a distillation token:
    ``(1, n, hidden)`` each; CLIP's ``class_embedding``: ``(hidden,)``, one token); with ``SUFFIX_PARAMETERS``
    those after them (YOLOS's detection tokens)."""
    embeddings = next((m for name, m in model.named_modules() if name.rpartition(".")[2] == "embeddings"), None)
    if embeddings is None:  # a tower whose tokens its own parameters give (Llama 4's), or why not
        from vit.sources.library_road.placing import tower_tokens

        return tower_tokens.count(model, names == SUFFIX_PARAMETERS)
    count = 0
    for name, parameter in embeddings.named_parameters(recurse=False):
        if name in names:
            count += 1 if parameter.dim() == 1 else int(parameter.shape[-2])
    return count


def instead_of_port(refused: SourceError, library_road: bool, folder: Path, config_json: Mapping,
                    processor: Callable[[Path], Mapping | None], map_location: str | torch.device) -> Checkpoint:
    """A folder whose port refuses its config (an HF ViT's non-square ``image_size``) as transformers builds it, where
    the library road is asked (``library_road``: ``vit.load``) and takes it (``opens``); else ``refused`` raised.
    ``processor(folder)``: its image processor's settings."""
    if not library_road or not opens(config_json):
        raise refused
    return open_library(folder, config_json, processor(folder), map_location)


def opens(config_json: Mapping) -> bool:
    """Whether the library road takes the folder (asked for a model_type no port reads): transformers knows its
    model_type, its model class runs its attention through the attention interface
    (``_supports_attention_backend``), and its config has a patch size (a vision model). Judged from config.json and
    transformers' classes, nothing of the folder's built; any other folder keeps its one-line refusal."""
    from transformers import CONFIG_MAPPING

    model_type = config_json.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        return False
    if model_type in OWN_LAYOUTS:
        return True
    try:
        config_class = CONFIG_MAPPING[model_type]
        cls = _model_class(config_json, config_class)
        vision = declares_patch(config_json) or hasattr(config_class(), "patch_size")
        recorded = (getattr(cls, "_supports_attention_backend", False) or calls_interface(cls)
                    or _backbone_class(config_json) is not None)
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    return vision and bool(recorded)


def missing_piece(config_json: Mapping) -> str | None:
    """What keeps the library road from a folder whose model_type transformers knows and no port reads, in words
    (``opens`` is False), or None when it opens or transformers does not know it: the patch size the layout needs,
    or attention that runs through transformers' attention interface."""
    from transformers import CONFIG_MAPPING

    model_type = config_json.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING or opens(config_json):
        return None
    try:
        config_class = CONFIG_MAPPING[model_type]
        cls = _model_class(config_json, config_class)
        has_patch = declares_patch(config_json) or hasattr(config_class(), "patch_size")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return f"transformers cannot name its model class ({_one_line(e)})"
    if not has_patch:
        nested = [key for key, value in config_json.items() if isinstance(value, Mapping) and "patch_size" in value]
        where = f" (it sits in {', '.join(nested)}: open that part's own folder)" if nested else ""
        return f"its config has no patch size at its top level to place its tokens by{where}"
    return (f"{cls.__name__}'s attention does not run through transformers' attention interface (no module of its "
            "modelling file calls ALL_ATTENTION_FUNCTIONS), which the library road records")


def declares_patch(config_json: Mapping) -> bool:
    """Whether config.json names a patch size where the library road reads it (``config_patch``): at its top level,
    in its ``backbone_config`` (SAM 3's vision encoder) or in its ``vision_config``'s (SAM 3 tracker)."""
    vision = config_json.get("vision_config")
    nested = (config_json.get("backbone_config"),
              vision.get("backbone_config") if isinstance(vision, Mapping) else None)
    return "patch_size" in config_json or any(isinstance(c, Mapping) and "patch_size" in c for c in nested)


def calls_interface(cls: type) -> bool:
    """Whether a module class of ``cls``'s modelling file calls transformers' attention interface
    (``ALL_ATTENTION_FUNCTIONS`` in its forward): a model whose class does not say so (no
    ``_supports_attention_backend``: EoMT, SAM-HQ, ViTPose, GIT) but whose attention runs through it."""
    import sys

    module = sys.modules.get(getattr(cls, "__module__", ""), None)
    return any(isinstance(item, type) and issubclass(item, torch.nn.Module)
               and "ALL_ATTENTION_FUNCTIONS" in getattr(getattr(item.forward, "__code__", None), "co_names", ())
               for item in vars(module).values()) if module is not None else False


def _backbone_class(config_json: Mapping):
    """The backbone class of a head that wraps one (``backbone_config``: Depth Anything's DINOv2) when its attention
    runs through the attention interface, else None."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_BACKBONE_MAPPING_NAMES

    backbone = config_json.get("backbone_config")
    model_type = backbone.get("model_type") if isinstance(backbone, Mapping) else None
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        return None
    import transformers

    cls = getattr(transformers, MODEL_FOR_BACKBONE_MAPPING_NAMES.get(model_type, ""), None)
    return cls if getattr(cls, "_supports_attention_backend", False) or cls and calls_interface(cls) else None


MAX_LAYERS = 1000  # layers a config may declare in all: each is built (on the meta device) before its weights' check
LAYER_KEYS = ("num_hidden_layers", "num_layers", "depth", "encoder_layers", "decoder_layers")
SIDE_KEYS = ("image_size", "patch_size")  # sides in pixels, bounded by MAX_SIDE before anything is built


def declared_problem(config_json: Mapping) -> str | None:
    """Why config.json declares more than can be built before its weights are checked, or None: a whole number past
    ``MAX_DECLARED`` under any key (``declared_number_problem``), more than ``MAX_LAYERS`` layers in all under the
    keys that name them (its sub-configs' too: a backbone's, a vision tower's; a layer count under any other key is
    stopped while it is built, ``bounded_build``) or an image or patch side over ``MAX_SIDE``. Read from the JSON
    alone, walked without recursion."""
    problem = declared_number_problem(config_json)
    if problem:
        return problem
    layers, stack = 0, [config_json]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            for key, value in item.items():
                if key in LAYER_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool):
                    layers += value
                elif key in SIDE_KEYS and value is not None:
                    try:
                        _pair(tuple(value) if isinstance(value, list) else value, key)
                    except ValueError as e:
                        return str(e)
                elif isinstance(value, (Mapping, list)):
                    stack.append(value)
        elif isinstance(item, list):
            stack.extend(item[:256])
    if not layers <= MAX_LAYERS:
        return f"its config declares {layers:g} layers, over the {MAX_LAYERS} this program builds"
    return None


def _model_class(config_json: Mapping, config_class):
    """The class the folder names (``architectures[0]``, one of transformers'), else ``AutoModel``'s for its
    config."""
    import transformers

    named = config_json.get("architectures")
    name = str(named[0]) if isinstance(named, list) and named else None
    if name is not None:
        cls = getattr(transformers, name, None)
        if cls is None or not isinstance(cls, type):
            raise ValueError(f"transformers has no class {name[:60]}")
        return cls
    return transformers.AutoModel._model_mapping[config_class]


def folder_class(folder: Path, config_json: Mapping, origin: str):
    """``(config, class)`` of a transformers folder: its declared sizes bounded first (``declared_problem``), its
    config as transformers reads it and the class it names (``_model_class``); SourceError (one line, after
    ``origin``) for what the library refuses."""
    import transformers

    problem = declared_problem(config_json)
    if problem:
        raise SourceError(f"{origin}: {problem}")
    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        return config, _model_class(config_json, type(config))
    except library_errors() as e:
        raise SourceError(f"{origin}: {library_error_line(e)}") from None


def open_library(folder: Path, config_json: Mapping, image_processor: Mapping | None,
                 map_location: str | torch.device = "cpu") -> Checkpoint:
    """The folder's model as transformers builds it (``LibraryModel``), in a ``Checkpoint`` with ``road="library"``:
    its class names from ``id2label``, its preprocessing from the image processor. ``map_location="meta"`` builds
    it on the meta device, no weight read. SourceError (one line) for a model whose attention does not run through
    transformers' attention interface, or whose layout cannot be read."""
    import importlib

    import transformers

    model_type = str(config_json.get("model_type"))
    if model_type in OWN_LAYOUTS:
        return importlib.import_module(OWN_LAYOUTS[model_type]).open_library(folder, config_json, image_processor,
                                                                             map_location)
    origin = f"{folder} ({model_type}, opened as transformers builds it)"
    problem = declared_problem(config_json)
    if problem:
        raise SourceError(f"{origin}: {problem}")
    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        cls = _model_class(config_json, type(config))
    except library_errors() as e:
        raise SourceError(f"{origin}: {library_error_line(e)}") from None
    flagged = bool(getattr(cls, "_supports_attention_backend", False))
    whole = flagged or calls_interface(cls)
    if not whole and _backbone_class(config_json) is None:
        raise SourceError(f"{folder}: {cls.__name__} has no port here and its attention does not run through "
                          "transformers' attention interface, which the library road records; "
                          "the README's table \"What it opens\" links a page listing every model this program opens")
    # the whole model's attention through the recording function over SDPA where its class takes an attention
    # function by name; a model whose modules call the interface without saying so (EoMT, ViTPose, GIT), or a head
    # that does not take it (Depth Anything), as transformers builds it, its attention (or its backbone's) routed
    # to the recording function over its own implementation at the first recording
    name = {"attn_implementation": recording_attention.recording_name("sdpa")} if flagged else {}
    model = read_class(cls, config, folder, origin, map_location, **name)
    return library_checkpoint(model, image_processor, folder, origin, torch.device(map_location).type == "meta")


# One opening's meta pass and real pass (``vit.sources.open.open_source`` builds a folder on the meta device from its
# headers, then for real): the meta pass's layout trace (``_layout_problem``: each layer's key count) notes each
# layer's query batch too, and the real pass reads them for the same folder, class, entry, layout and channels instead
# of tracing the same model at the same input again (``_pieces_problem``). Only what a trace on the meta device saw
# is noted (no weight's value). Outside ``one_open`` (a module in hand, a road opened on its own) nothing is noted and
# each pass traces its own, as before.
_META_BATCHES: contextvars.ContextVar[dict | None] = contextvars.ContextVar("meta_batches", default=None)


@contextlib.contextmanager
def one_open() -> Iterator[None]:
    """The meta pass and the real pass of one opening: what a trace noted in it is read in it, then dropped."""
    token = _META_BATCHES.set({})
    try:
        yield
    finally:
        _META_BATCHES.reset(token)


def note_traced(key: Hashable, seen: object) -> None:
    """Keep what a trace on the meta device saw (no value of any weight) of the model ``key`` names, at the input
    it names (inside ``one_open``)."""
    noted = _META_BATCHES.get()
    if noted is not None:
        noted[key] = seen


def noted_traced(key: Hashable):
    """What this opening's meta pass noted for ``key``, or None (none noted: trace it)."""
    noted = _META_BATCHES.get()
    return None if noted is None else noted.get(key)


def library_checkpoint(model: torch.nn.Module, image_processor: Mapping | None, folder: Path, origin: str,
                       meta: bool = False) -> Checkpoint:
    """A transformers model, built (from a folder by ``open_library``, or a user's object: ``module_road``), in the
    ``Checkpoint`` of the library road: its attention modules, layout and preprocessing read from it, its config and
    ``image_processor``; ``meta``: built on the meta device, its layout checked by a traced forward. SourceError (one
    line) as ``open_library``."""
    config, cls = model.config, type(model)
    whole = bool(getattr(cls, "_supports_attention_backend", False)) or calls_interface(cls)
    model.eval()
    part = model if whole else _backbone_part(model)
    if part is None:
        raise SourceError(f"{folder}: {cls.__name__} has no backbone whose attention runs through transformers' "
                          "attention interface; it cannot be recorded")
    modules, entry = attention_modules(model), None
    if not modules:
        raise SourceError(f"{folder}: {cls.__name__}'s attention does not run through transformers' attention "
                          "interface (no module of it calls ALL_ATTENTION_FUNCTIONS); it cannot be recorded")
    layers = getattr(config, "num_hidden_layers", None) or getattr(_inner_config(config), "num_hidden_layers",
                                                                   len(modules))
    vision = _vision_part(model, int(layers)) if whole and len(modules) != int(layers) else None
    if vision is not None:  # a model whose other parts attend too (SAM 3 tracker's mask decoder): its vision encoder
        part = entry = vision
        modules = attention_modules(vision)
    try:
        patch = _pair(config_patch(config), "patch_size")
        channels = int(getattr(config, "num_channels", 3))
        own = input_hw(config, image_processor)
        stand_in = ViTConfig(image_size=own if own[0] != own[1] else own[0], patch_size=patch if patch[0] != patch[1]
                             else patch[0], num_channels=channels, num_classes=0)
        preprocessing = hf_preprocessing(image_processor, stand_in, cls.__name__)
        layout = LibraryLayout(prefix_tokens(model), patch, preprocessing.image_hw, extra_tokens(config),
                               prefix_tokens(model, SUFFIX_PARAMETERS), window_sides(config, int(layers)))
        if layout.windows and layout.num_prefix_tokens + layout.num_suffix_tokens:
            raise ValueError("its windowed layers hold tokens beside the patches, which the library road does not "
                             "place in windows")
        own_size = config_size(config) is not None and _pair(config_size(config), "image_size") == layout.image_hw
    except (ValueError, TypeError, AttributeError) as e:
        raise SourceError(f"{origin}: {_one_line(e)}") from None
    problem = preprocessing_problem(preprocessing, stand_in)
    if problem:
        raise SourceError(f"{folder} has unusable preprocessing settings: {problem}")
    if len(modules) != int(layers):
        names = {m: name.rpartition(".")[2] for name, m in model.named_modules()}
        kinds = ", ".join(dict.fromkeys(names[m] for m in modules))  # X-CLIP's self_attn and message_attn
        clips = one_frame.fixed_clips(model)
        raise SourceError(f"{folder}: {len(modules)} attention modules for {layers} layers ({kinds}); the "
                          "library road reads one attention per layer" + (f"; {clips}" if clips else ""))
    if entry is None and one_frame.takes_clips(model):  # a video model (VideoMT): an image is a clip of one frame
        entry = one_frame.OneFrame(model)
    wrapped = LibraryModel(model, layout, modules, part, entry)
    # the layout checked against the tokens the model forms, layer by layer (EoMT's queries join its last blocks),
    # no data; one traced forward serves both passes of an opening (``one_open``)
    key = (str(folder), origin, cls, type(wrapped.entry), type(part), layout, channels, len(modules))
    if meta:
        batches: list[tuple[int, int]] = []
        problem = _layout_problem(wrapped, channels, own_size, batches)
        if not problem:
            note_traced(key, list(batches))
    else:
        batches = noted_traced(key)
        problem = ((_pieces_problem(wrapped, channels) if batches is None else _crops_problem(wrapped, batches))
                   or _order_problem(wrapped, channels))
    if problem:
        raise SourceError(f"{folder}: {problem}")
    classes = int(getattr(config, "num_labels", 0)) if wrapped.is_classifier else 0
    return _finish_library(wrapped, class_names(config, classes), preprocessing, folder, cls.__name__,
                           image_processor is None)


def input_hw(config, image_processor: Mapping | None) -> tuple[int, int]:
    """The input (height, width) in pixels: the image processor's ``size`` where it resizes to a height and a width
    (C-RADIO's config names one side, its processor any: transformers' processor feeds the model that), else the
    config's ``image_size`` (``config_size``)."""
    size = image_processor.get("size") if isinstance(image_processor, Mapping) else None
    if isinstance(size, Mapping) and {"height", "width"} <= size.keys() and image_processor.get("do_resize", True):
        return _pair((size["height"], size["width"]), "the image processor's size")
    return _pair(config_size(config), "image_size")


def config_size(config):
    """The config's own ``image_size`` (its backbone's, where a head wraps one, or the config its layers sit in:
    ``_inner_config``) as it gives it: a side, a pair, None."""
    return (getattr(config, "image_size", None) or getattr(getattr(config, "backbone_config", None), "image_size", None)
            or getattr(_inner_config(config), "image_size", None))


def config_patch(config):
    """The config's ``patch_size``, or that of the config its layers sit in (``_inner_config``: SAM 3's vision
    encoder keeps it in its backbone's, SAM 3 tracker in its vision encoder's backbone's), None where neither has
    one."""
    return getattr(config, "patch_size", None) or getattr(_inner_config(config), "patch_size", None)


def _vision_part(model: torch.nn.Module, layers: int) -> torch.nn.Module | None:
    """The pretrained model inside ``model`` whose attention modules are its ``layers`` layers (a vision encoder
    beside a decoder that attends too: SAM 3 tracker's), or None."""
    from transformers import PreTrainedModel

    return next((m for m in model.modules() if m is not model and isinstance(m, PreTrainedModel)
                 and len(attention_modules(m)) == layers), None)


def _backbone_part(model: torch.nn.Module) -> torch.nn.Module | None:
    """The first pretrained model inside ``model`` whose attention runs through the attention interface (a head's
    backbone), or None."""
    from transformers import PreTrainedModel

    return next((m for m in model.modules() if m is not model and isinstance(m, PreTrainedModel)
                 and (getattr(type(m), "_supports_attention_backend", False) or calls_interface(type(m)))), None)


def _order_problem(model: LibraryModel, channels: int) -> str | None:
    """Where the model's first block takes the patches in another order than the row-major one the layout places
    (``patch_codes.order_problem``: LW-DETR's windows, kept by a config whose every layer is global), why, in one line
    (the recorder's road then places them as the forward orders them); else None. Windowed layouts place their own."""
    from vit.sources.library_road.placing import patch_codes

    if model.layout.windows:
        return None
    names = {m: n for n, m in model.entry.named_modules()}
    first = names.get(model._attention[0])
    return None if first is None else patch_codes.order_problem(model.entry, first, model.layout.image_hw, channels)


def _pieces_problem(model: LibraryModel, channels: int) -> str | None:
    """Where a built model's layer attends over several pieces of one image at once and the layout places no
    windows there (Depth Pro's patch encoder over its overlapping crops), what it lacks, in one line; else None. Its
    forward runs once on the meta device (``_query_batches``)."""
    return _crops_problem(model, _query_batches(model, channels))


def _query_batches(model: LibraryModel, channels: int) -> list[tuple[int, int]]:
    """Each attention layer's ``(layer, query batch)`` as the built model's forward runs them once on the meta device,
    its weights swapped for meta tensors of their shapes; a forward that cannot gives the layers before it (the rest
    is left to each recording, as before)."""
    pieces: list[tuple[int, int]] = []  # (layer, query batch)

    class Shapes:  # a recorder that notes each layer's batch and keeps nothing
        layers = {module: i for i, module in enumerate(model._attention)}

        @staticmethod
        def keep(layer, query, key, value, attention_mask, kwargs) -> None:
            pieces.append((layer, int(query.shape[0])))

        @staticmethod
        def output(layer, out) -> None:
            pass

    entry = model.entry
    swapped = {name: torch.empty_like(t, device="meta") for name, t in
               [*entry.named_parameters(remove_duplicate=False), *entry.named_buffers(remove_duplicate=False)]}
    pixels = torch.empty(1, channels, *model.layout.image_hw, device="meta")
    try:
        with torch.no_grad(), recording_attention.recording(model.part, Shapes()):
            torch.func.functional_call(entry, swapped, (), {"pixel_values": pixels})
    except Exception:  # noqa: BLE001 - any forward the meta device cannot run: checked at each recording
        pass
    return pieces


def _crops_problem(model: LibraryModel, pieces: list[tuple[int, int]]) -> str | None:
    """``_pieces_problem``'s answer from the ``(layer, query batch)`` pairs a traced forward saw."""
    grid = model.layout.grid
    crops = next(((layer, b) for layer, b in pieces if b != 1 and model.layout.layer_layout(layer, grid) is None),
                 None)
    if crops is None:
        return None
    names = {module: name for name, module in model.model.named_modules()}
    return (f"its layer {crops[0]} ({names.get(model._attention[crops[0]], '?')}) attends over {crops[1]} pieces of "
            "one image at once (crops or tiles): no layout on this road")


def traced_key_counts(model: LibraryModel, part: torch.nn.Module, forward, seen: list[tuple[int, int]],
                      batches: list[tuple[int, int]] | None = None) -> None:
    """Run ``forward()`` (on meta tensors: shapes only) while transformers' attention interface is recorded in
    ``part``, appending to ``seen`` each of ``model``'s attention layers' ``(layer, key count)`` as it runs, and to
    ``batches`` (where given) its ``(layer, query batch)``; nothing else is kept. What ``forward`` raises is raised
    (``seen`` then holds the layers before it)."""

    class Shapes:  # a recorder that notes each layer's key count and keeps nothing
        layers = {module: i for i, module in enumerate(model._attention)}

        @staticmethod
        def keep(layer, query, key, value, attention_mask, kwargs) -> None:
            seen.append((layer, int(key.shape[-2])))
            if batches is not None:
                batches.append((layer, int(query.shape[0])))

        @staticmethod
        def output(layer, out) -> None:
            pass

    with torch.no_grad(), recording_attention.recording(part, Shapes()):
        forward()


def _layout_problem(model: LibraryModel, channels: int, own_size: bool,
                    batches: list[tuple[int, int]] | None = None) -> str | None:
    """Why the layout does not place the tokens the model forms (its forward on the meta device, one image at the
    input size: shapes only), or None: each layer's attention is over its extra tokens, the prefix tokens, the
    patches and the suffix tokens. A forward that reads a value of its input cannot run without data (Idefics3's
    patch mask, EoMT's mask annealing): the layers before that read are checked, the rest at each recording
    (``LibraryModel.run``), and only at the config's own input size (``own_size``): at another, one its processor
    asks for, it may form other tokens, or fail (EoMT's mask head is built for the config's grid). ``batches``
    (where given) is given each layer's ``(layer, query batch)`` the trace saw (``_query_batches``'s)."""
    pixels = torch.empty(1, channels, *model.layout.image_hw, device="meta")
    seen: list[tuple[int, int]] = []  # (layer, keys), in the order the forward runs them
    entry = model.entry  # a tensor its build made off the meta device (LW-DETR's ``nn.Parameter(torch.Tensor(n))``
    off = {n: torch.empty_like(t, device="meta") for n, t in [  # ignores the device it is built on): a meta one
        *entry.named_parameters(remove_duplicate=False), *entry.named_buffers(remove_duplicate=False)] if not t.is_meta}
    try:
        traced_key_counts(model, model.part, lambda: torch.func.functional_call(
            entry, off, (), {"pixel_values": pixels}, strict=False), seen, batches)
    except (RuntimeError, ValueError, TypeError, NotImplementedError, IndexError) as e:
        if "item() cannot be called on meta" not in str(e):
            size = config_size(model.config)
            hint = ("" if own_size or size is None else
                    "; it may run only at its config's image_size {}: give it an image processor of that size"
                    .format("x".join(str(v) for v in _pair(size, "image_size"))))  # SAM 3's rotary grid
            return (f"its forward cannot be traced on the meta device to check where its tokens sit ({_one_line(e)})"
                    f"{hint}")
        if not own_size:
            h, w = model.layout.image_hw
            return (f"its image processor asks for {h}x{w}-px inputs, not its config's image_size, and its forward "
                    "reads a value of its input, so where its tokens sit at that size cannot be checked on the meta "
                    "device; give it an image processor of its config's size")
    layout = model.layout
    if any(keys != layout.keys_of(layer) for layer, keys in seen):
        gh, gw = layout.grid
        return (f"its attention runs over {sorted({keys for _, keys in seen})} tokens, not the "
                f"{layout.num_prefix_tokens} prefix tokens and {gh}x{gw} patches the library road places (tokens "
                "after the patches, windows or stages need a layout of their own: issue 91)")
    return None


def window_sides(config, layers: int) -> tuple[int, ...]:
    """The layout adapter of ViTDet's windows, read from the config (or the config its layers sit in:
    ``_inner_config``): each layer's window side in patches, ``window_size``, but 0 for the layers
    ``global_attn_indexes`` lists (SAM 3's vision encoder); empty for a config without both (every layer global)."""
    inner = config if hasattr(config, "global_attn_indexes") else _inner_config(config)
    window, kept_global = getattr(inner, "window_size", None), getattr(inner, "global_attn_indexes", None)
    if inner is None or kept_global is None or not window:
        return ()
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= MAX_SIDE:
        raise ValueError(f"window_size {str(window)[:40]} is not a side in patches from 1 to {MAX_SIDE}")
    if not isinstance(kept_global, (list, tuple)) or not all(isinstance(i, int) for i in kept_global):
        raise ValueError(f"global_attn_indexes {str(kept_global)[:40]} is not a list of layers")
    return tuple(0 if i in kept_global else window for i in range(layers))


def extra_tokens(config) -> tuple[int, ...]:
    """The layout adapter where the config says it and the tokens do not: tokens a layer has before its prefix
    tokens, layer by layer. EoMT (and EoMT-DINOv3) puts its ``num_queries`` object queries before the CLS token in
    its last ``num_blocks`` layers; every other model: none."""
    if getattr(config, "model_type", None) not in ("eomt", "eomt_dinov3", "videomt"):  # VideoMT: EoMT a frame
        return ()
    layers, blocks, queries = int(config.num_hidden_layers), int(config.num_blocks), int(config.num_queries)
    if not 0 <= blocks <= layers:
        raise ValueError(f"num_blocks {blocks} is not between 0 and its {layers} layers")
    return (0,) * (layers - blocks) + (queries,) * blocks


def class_names(config, classes: int) -> list[str]:
    """The config's ``id2label`` in index order, 'class 0', 'class 1', ... where it does not name them all."""
    labels = getattr(config, "id2label", None) or {}
    try:
        by_index = {int(k): str(v) for k, v in labels.items()}
    except (TypeError, ValueError, AttributeError):
        by_index = {}
    return [by_index.get(i, f"class {i}") for i in range(classes)]


def _finish_library(model: LibraryModel, names: list[str], preprocessing: Preprocessing, folder: Path,
                    architecture: str, guessed: bool) -> Checkpoint:
    """The checkpoint the one door returns, its metadata as a port's (``vit.sources.open_shared._finish``), the road
    marked."""
    metadata = {"source": {"kind": "hf", "path": str(folder), "architecture": f"hf:{architecture}"},
                "architecture": f"hf:{architecture}", "parameters": sum(p.numel() for p in model.parameters()),
                "road": ROAD}
    if guessed:
        metadata["preprocessing_guessed"] = (
            "No preprocessor_config.json came with these weights, so the images are prepared with assumed "
            f"defaults: {preprocessing.size_text}, mean {preprocessing.mean}, std {preprocessing.std}.")
    return Checkpoint(model=model, class_names=names, preprocessing=preprocessing, metadata=metadata, path=folder,
                      road=ROAD)
