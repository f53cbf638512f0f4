"""The VLM census's general rules for building a type tiny where transformers' default config or its processor's
defaults do not build on their own (``bench/census_vlm.py``'s ``generic_build`` applies them). Each rule reads
transformers' own code or config classes, never a type's name:

- ``processor_of_kin``: a type whose own module defines no processor takes the processor of its kin: the type whose
  image-text-to-text class is the same class (GLM-GA's ``Glm46VForConditionalGeneration``), the family its modular
  file builds its config on (FastVLM on LLaVA, Cosmos 3 Omni on Qwen3-VL), or the processor its generating class's
  own docstring example loads (``VisionEncoderDecoderModel``'s TrOCR).
- ``filled``: the fields a model's code needs that the default config leaves None: an expert count or width (a
  block built as a mixture of experts whatever the config says: DiffusionGemma's), and a per-layer list its code
  indexes by layer (``config.mlp_layer_types[layer_idx]``: DeepSeek-OCR 2's) given the kinds its docstring names.
- ``hidden_widths``: a width the config's validation requires equal to a hidden size (Dots 3's adapters'
  ``adapter_in_dim``, ``adapter_out_dim``) kept equal shrunk.
- ``aliased``: the names a config class stores a standard field under (Inkling's vision ``n_layers`` for
  ``num_hidden_layers``), so the shrinking reaches them.
- ``divided_widths``: a hidden size the config's code divides by a constant kept at least that constant.
- ``rope_per_kind``: a rope dict the code reads per kind of layer (``rope_parameters[layer_type]``) and the
  default leaves empty given one default entry per kind (Cohere Compass's).
- ``processor_from_config``: a processor's setting left None taken from the config's field of that name.
- ``vq_tokenizer``: a VQ image tokenizer's config (Chameleon's, Emu3's) made tiny, its ``vocabulary_map`` the
  tokenizer's vocabulary with its codes in the names the model's code finds (``VQ_CODES``, as transformers' testers
  build it), the processor's side and count of image tokens those of its latent grid.
- ``prefixed_words``: a tokenizer that puts SentencePiece's piece before each text where the processor's code strips
  it (``PREFIX_PIECE``: Fuyu's).
- ``STATED``: the few fields no rule can derive, which the checkpoints' configs state and transformers' defaults
  leave unusable (a None its code needs, a tower its default names of another kind), each with its source.
"""

from __future__ import annotations

import copy
import inspect
import re
import sys

EXPERTS = {"num_experts": 4, "n_routed_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
           "top_k_experts": 2, "moe_intermediate_size": 16}  # an expert block's counts and width, tiny

TIMM_WIDTH = 64  # a timm tower's widest stage, tiny
WINDOW = 32  # a sliding layer's window, shorter than the census's prompt so the window shows
# a model's code building its sliding-window mask whatever its layers' kinds (a dict entry beside the full mask, not
# under ``if self.has_sliding_layers``), which needs a window
UNGUARDED_WINDOW = '"sliding_attention": create_sliding_window_causal_mask('

# Fields the checkpoints' configs state where transformers' default config leaves them unusable and no rule derives
# them, shrunk to the census's sizes: {model_type: {dotted field: value}}
STATED = {
    # Granite 4 Vision: deepstack_layer_map (vision layer, language layer) pairs and the Q-Former's downsample_rate
    # ("query side/window side"), None by default, break the build: one pair per tiny language layer; its canvases'
    # 336-px tiles (``pinpoint_side``) in 14-px patches (24 a side) read in 4 x 4 windows, 2 x 2 queries each
    "granite4_vision": {"deepstack_layer_map": [[-2, 0], [-1, 1]], "spatial_target_layers": [0, 1, 1, 1],
                        "downsample_rate": "2/4", "vision_config.patch_size": 14},
    # Qwen4-Exp: its attention builds the QSA indexer on every indexed layer; the default leaves the indexer's
    # sizes None (its validation: all five or none)
    "qwen4_exp": {"text_config.indexer_n_heads": 2, "text_config.indexer_kv_heads": 1,
                  "text_config.indexer_head_dim": 8, "text_config.indexer_budget": 64,
                  "text_config.indexer_compress_ratio": 4},
    # Perception LM (facebook/Perception-LM-1B): a timm PE-core ViT whose model_args the projector reads
    # (model_args["embed_dim"]); the default names timm's ResNet-50 and no model_args. Its 14-px patches over the
    # image processor's 448-px tiles, tiny
    "perception_lm": {"projector_pooling_ratio": 2,  # as its processor's pooling_ratio counts
                      "vision_config.architecture": "vit_pe_core_large_patch14_336",
                      "vision_config.model_args": {"embed_dim": 32, "depth": 2, "num_heads": 4, "img_size": 448,
                                                   "patch_size": 14}},
}


def sections(values: list[int], total: int) -> list[int]:
    """Rotary sections ``values`` scaled to sum to ``total``, each at least 1, the ones equal before equal after
    (Ernie 4.5 VL's height and width sections, which its code stacks pairwise), the rounding's remainder on a
    section with no equal."""
    scaled = [max(1, v * total // sum(values)) for v in values]
    lone = [i for i, v in enumerate(values) if values.count(v) == 1] or [0]
    scaled[lone[0]] = max(1, scaled[lone[0]] + total - sum(scaled))
    return scaled


def code_of(model_class, config: dict) -> str:
    """The source of ``model_class``'s module and of the modules of the models its sub-configs name (the language
    model an ``AutoModel`` builds from ``text_config``: GLM-GA's is GLM-4V's)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    modules = [sys.modules.get(model_class.__module__)]
    for sub in config.values():
        name = MODEL_MAPPING_NAMES.get(sub.get("model_type")) if isinstance(sub, dict) else None
        name = name[0] if isinstance(name, (list, tuple)) else name
        if name and hasattr(transformers, name):
            modules.append(sys.modules.get(getattr(transformers, name).__module__))
    code = []
    for module in dict.fromkeys(m for m in modules if m is not None):
        try:
            code.append(inspect.getsource(module))
        except (OSError, TypeError):
            pass
    return "\n".join(code)


def config_class(model_type):
    """transformers' config class for ``model_type``, or None."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        return CONFIG_MAPPING[model_type] if isinstance(model_type, str) else None
    except KeyError:
        return None


def processor_of_kin(model_type: str) -> str | None:
    """The name of the processor class of ``model_type``'s kin (see the module's docstring), or None."""
    import importlib

    import transformers
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as GENERATING
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES as PROCESSORS

    same = [t for t, name in GENERATING.items() if name == GENERATING.get(model_type) and t in PROCESSORS]
    if same:
        return PROCESSORS[same[0]]
    module = model_type_to_module_name(model_type)
    try:
        modular = importlib.import_module(f"transformers.models.{module}.modular_{module}")
        code = inspect.getsource(modular)
    except (ImportError, OSError, TypeError):
        code = ""
    for family in re.findall(r"^from \.\.(\w+)\.configuration_\w+ import", code, re.M):
        kin = [t for t in PROCESSORS if model_type_to_module_name(t) == family]
        if kin:
            return PROCESSORS[kin[0]]
    generating = getattr(transformers, GENERATING.get(model_type, ""), None)
    for checkpoint in re.findall(r"AutoProcessor\.from_pretrained\(\s*[\"']([^\"']+)[\"']",
                                 inspect.getdoc(generating.forward) or "" if generating else ""):
        name = re.sub(r"[^a-z0-9]", "", checkpoint.rpartition("/")[2].lower())
        kin = sorted((t for t in PROCESSORS if name.startswith(re.sub(r"[^a-z0-9]", "", t))), key=len)
        if kin:
            return PROCESSORS[kin[-1]]  # the longest type its checkpoint's name starts with
    return None


def _kinds(config_class, field: str) -> list[str]:
    """The quoted kinds the config class's docstring names for ``field`` (``"dense"`` or ``"sparse"``)."""
    doc = config_class.__doc__ or ""
    found = re.search(rf"^\s*{field} \(.*?\n(.*?)(?=^\s*\w+ \(`|\Z)", doc, re.M | re.S)
    return list(dict.fromkeys(re.findall(r'`"(\w+)"`', found.group(1)))) if found else []


def filled(config: dict, model_class) -> None:
    """Fill the fields ``model_class``'s code needs that ``config`` (a config dict, nested ones alike) leaves None
    (in place): expert counts and widths at their tiny size, a window (``WINDOW``) where its layers slide or its
    code builds a sliding mask whatever they are, per-layer lists its code indexes by layer with the kinds the
    config class's docstring names, cycled over the shrunk depth."""
    try:
        code = inspect.getsource(sys.modules[model_class.__module__])
    except (OSError, TypeError, KeyError):
        code = ""
    indexed = set(re.findall(r"config\.(\w+_types)\[layer_id", code))
    for sub in (config, *(v for v in config.values() if isinstance(v, dict))):
        for key, tiny in EXPERTS.items():
            if key in sub and sub[key] is None:
                sub[key] = tiny
        if "sliding_window" in sub and sub["sliding_window"] is None and isinstance(sub.get("layer_types"), list) \
                and ("sliding_attention" in sub["layer_types"] or UNGUARDED_WINDOW in code):
            sub["sliding_window"] = WINDOW  # a window its code builds a mask with (Step 3.7's, on full layers too)
        layers = sub.get("num_hidden_layers")
        cls = config_class(sub.get("model_type"))
        for key in indexed:
            if key in sub and sub[key] is None and isinstance(layers, int) and cls is not None:
                kinds = _kinds(cls, key)
                if kinds:
                    sub[key] = [kinds[i % len(kinds)] for i in range(layers)]


def expert_groups(config: dict) -> None:
    """A router's expert groups (``n_group``, ``topk_group``) kept to what the shrunk experts hold (in place): its
    code views the experts as ``n_group`` groups of ``experts // n_group`` and takes the top 2 of each group
    (DeepSeek-V3's ``TopkRouter``, Kimi K2.5's language model), so each group keeps at least 2 experts, the groups
    dividing the experts, and the groups chosen at most the groups."""
    for sub in (config, *(v for v in config.values() if isinstance(v, dict))):
        experts = next((sub[k] for k in ("n_routed_experts", "num_local_experts", "num_experts")
                        if isinstance(sub.get(k), int) and sub[k] > 0), None)
        groups = sub.get("n_group")
        if experts is None or not isinstance(groups, int) or groups < 1 or (
                experts % groups == 0 and experts // groups >= 2):
            continue
        sub["n_group"] = max([g for g in range(1, min(groups, experts // 2) + 1) if experts % g == 0] or [1])
        if isinstance(sub.get("topk_group"), int):
            sub["topk_group"] = max(1, min(sub["topk_group"], sub["n_group"]))


def patch_of_counts(config: dict, processor) -> int | None:
    """The tower's patch where the config maps patch counts and the processor maps image sides to the same query
    counts (Aria's ``projector_patch_to_query_dict`` {1225: 128, 4900: 256} beside its processor's
    ``size_conversion`` {490: 128, 980: 256}): each side over the root of its count's patches (490 / 35 = 14), set
    on the vision config (in place) where every pair agrees; None where none is stated."""
    import math

    def whole_map(value):
        return isinstance(value, dict) and value and all(
            isinstance(k, int) and isinstance(v, int) and k > 0 for k, v in value.items())

    sides = [v for v in vars(processor).values() if whole_map(v)]
    patches = set()
    for counts in (v for v in config.values() if whole_map(v)):
        for conversion in sides:
            for side, queries in conversion.items():
                count = next((c for c, q in counts.items() if q == queries), None)
                root = math.isqrt(count) if count else 0
                if root and root * root == count and side % root == 0:
                    patches.add(side // root)
    vision = config.get("vision_config")
    if len(patches) != 1 or not isinstance(vision, dict) or not isinstance(vision.get("patch_size"), int):
        return None
    vision["patch_size"] = patches.pop()
    return vision["patch_size"]


def timm_tower(config: dict, processor) -> dict | None:
    """A timm tower (``timm_wrapper`` vision config) whose ``model_args`` state no sizes, built tiny (in place): the
    int tuples its timm entry point's ``model_args`` states (FastViT-MCi3's ``layers`` (2, 12, 24, 4, 2),
    ``embed_dims`` (96, ..., 1536)), each depth cut to 1 and the widths scaled so the widest is ``TIMM_WIDTH``; its
    hidden size the tiny tower's own ``num_features``, the processor's patch the tower's total stride (its last
    feature's ``reduction``) and its image processor's side the tower's default input side where that stride does
    not divide the side it had. Returns the model_args set, or None where the rule does not apply."""
    import timm
    import torch

    vision = config.get("vision_config")
    if not (isinstance(vision, dict) and vision.get("model_type") == "timm_wrapper" and vision.get("architecture")):
        return None
    args = dict(vision.get("model_args") or {})
    if any(isinstance(v, (int, tuple, list)) and not isinstance(v, bool) for v in args.values()):
        return None  # sizes stated already (Perception LM's)
    try:
        source = inspect.getsource(timm.models.model_entrypoint(vision["architecture"]))
    except (RuntimeError, OSError, TypeError):
        return None
    tuples = {k: [int(x) for x in re.findall(r"\d+", v)]
              for k, v in re.findall(r"^\s*(\w+)=\(([\d,\s]+)\),?$", source, re.M)}
    depths = {k: v for k, v in tuples.items() if k in ("layers", "depths")}
    widths = {k: v for k, v in tuples.items() if k in ("embed_dims", "dims", "embed_dim")}
    if not (depths or widths):
        return None
    for key, values in depths.items():
        args[key] = tuple(1 for _ in values)
    for key, values in widths.items():
        scale = max(values) // TIMM_WIDTH or 1
        args[key] = tuple(max(1, v // scale) for v in values)
    with torch.device("meta"):
        model = timm.create_model(vision["architecture"], pretrained=False, **args)
    vision["model_args"], vision["hidden_size"] = args, model.num_features
    stride = model.feature_info[-1]["reduction"]
    if hasattr(processor, "patch_size"):
        processor.patch_size = stride
    images = getattr(processor, "image_processor", None)
    side = (model.pretrained_cfg.get("input_size") or (0, 0, 0))[-1]
    for name in ("crop_size", "size"):
        size = getattr(images, name, None)
        old = getattr(size, "height", None) or getattr(size, "shortest_edge", None)
        if isinstance(old, int) and old % stride and side and side % stride == 0:
            setattr(images, name, type(size)(**{k: side for k, v in vars(size).items() if v is not None}))
    return args


def tower_field(images, field: str):
    """The image processor's ``field`` as the vision tower takes it: its ``vision_``-named one where it states both
    (Step 3.7's ``vision_patch_size`` 14, "``Step3p7VisionEmbeddings.patch_size``", beside its ``patch_size`` 504,
    the side of its local crops), else its own."""
    vision = getattr(images, f"vision_{field}", None)
    return vision if isinstance(vision, int) and not isinstance(vision, bool) else getattr(images, field, None)


def hidden_widths(full: dict, config: dict) -> None:
    """Widths the config class's validation requires equal to its hidden size (``self.adapter_in_dim !=
    self.hidden_size``: Dots 3's vision adapter), the shrinking left whole, set to the shrunk hidden size (in
    place)."""
    try:  # the module of its config classes, its sub-configs' alike
        code = inspect.getsource(sys.modules[config_class(full.get("model_type")).__module__])
    except (OSError, TypeError, KeyError, AttributeError):
        return
    equal = re.findall(r"self\.(\w+) != self\.hidden_size", code)
    equal += re.findall(r"self\.hidden_size != self\.(\w+)", code)
    pairs = [(full, config), *((full[k], config[k]) for k in full if isinstance(full[k], dict)
                               and isinstance(config.get(k), dict))]
    for whole, shrunk in pairs:
        for key in equal:
            if key in shrunk and shrunk[key] == whole.get(key) and isinstance(shrunk.get("hidden_size"), int):
                shrunk[key] = shrunk["hidden_size"]
    # across configs: self.vision_config.adapter_out_dim != self.text_config.hidden_size
    for sub, key, other in re.findall(r"self\.(\w+)\.(\w+) != self\.(\w+)\.hidden_size", code):
        if isinstance(config.get(sub), dict) and key in config[sub] and isinstance(config.get(other), dict) \
                and isinstance(config[other].get("hidden_size"), int):
            config[sub][key] = config[other]["hidden_size"]


def aliased(config: dict, standard: tuple[str, ...], back: bool = False) -> dict:
    """``config`` (nested ones alike) with the keys its config class stores a ``standard`` field under renamed to
    the standard name (Inkling's vision ``n_layers`` for ``num_hidden_layers``; ``back``: renamed back)."""
    cls = config_class(config.get("model_type"))
    names = {alias: stored for alias, stored in (getattr(cls, "attribute_map", {}) or {}).items()
             if alias in standard and stored not in standard}
    rename = {stored: alias for alias, stored in names.items()} if not back else names
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and "model_type" in value:
            value = aliased(value, standard, back)
        out[key if key not in rename or rename[key] in config else rename[key]] = value
    return out


def divided_widths(config: dict, model_type: str) -> None:
    """A sub-config's hidden size its config class's code divides by a constant (Granite 4 Vision's Q-Former heads,
    ``self.vision_config.hidden_size // 64``) kept at least that constant, so the quotient is not zero (in place)."""
    try:
        code = inspect.getsource(config_class(model_type))
    except (OSError, TypeError):
        return
    for key, unit in re.findall(r"self\.(\w+)\.hidden_size // (\d+)", code):
        sub = config.get(key)
        if isinstance(sub, dict) and isinstance(sub.get("hidden_size"), int) and sub["hidden_size"] < int(unit):
            sub["hidden_size"] = int(unit)


def rope_per_kind(config: dict, model_class) -> None:
    """A rope dict the model's code reads per kind of layer (``rope_parameters[layer_type]``) that the config
    leaves without an entry per kind: one default entry each (in place)."""
    try:
        code = inspect.getsource(sys.modules[model_class.__module__])
    except (OSError, TypeError, KeyError):
        return
    if "rope_parameters[layer_type]" not in code:
        return
    for sub in (config, *(v for v in config.values() if isinstance(v, dict))):
        rope, kinds = sub.get("rope_parameters"), sub.get("layer_types")
        if isinstance(rope, dict) and isinstance(kinds, list) and kinds and not any(k in rope for k in kinds):
            base = {k: v for k, v in rope.items() if not isinstance(v, dict)}
            entry = {"rope_type": base.pop("rope_type", "default"), "rope_theta": base.pop("rope_theta", 10000.0),
                     **base}
            sub["rope_parameters"] = {kind: dict(entry) for kind in dict.fromkeys(kinds)}


def processor_from_config(processor, config: dict) -> None:
    """The processor's settings it leaves None that the config states under the same name, at its top or in its
    vision config (Granite 4 Vision's ``patch_size``, ``vision_feature_select_strategy``, ``downsample_rate``, which
    its checkpoint's processor saves): the processor counts its image tokens with them (in place)."""
    for key, value in vars(processor).items():
        if value is not None or key.startswith("_"):
            continue
        stated = next((sub[key] for sub in (config, config.get("vision_config") or {})
                       if isinstance(sub, dict) and sub.get(key) is not None), None)
        if stated is not None:
            setattr(processor, key, stated)


def pinpoint_side(processor) -> int | None:
    """The tile side the image processor's canvases (``image_grid_pinpoints``) are cut into where its crop side does
    not divide them (Granite 4 Vision's default 224-px crop beside canvases of 336-px multiples): their greatest
    common divisor, the image processor made to crop to it; None where its side divides them."""
    import math

    images = getattr(processor, "image_processor", None)
    points = getattr(images, "image_grid_pinpoints", None)
    crop = getattr(images, "crop_size", None)
    side = getattr(crop, "height", None)
    if not (isinstance(points, list) and points and isinstance(side, int)):
        return None
    tile = math.gcd(*(v for point in points for v in point))
    if tile % side == 0:
        return None
    images.crop_size = type(crop)(height=tile, width=tile)
    size = getattr(images, "size", None)
    if getattr(size, "shortest_edge", None):
        images.size = type(size)(shortest_edge=tile)
    return tile


# Processor settings the checkpoints' processors state where the class's default does not count the tower's tokens
STATED_PROCESSOR = {
    # Granite 4 Vision's default CLIP tower has a class token its processor's count leaves out by default
    "granite4_vision": {"num_additional_image_tokens": 1},
    # Perception LM: the tower's patch, which its count divides the tiles by; at most 4 tiles of 448 px (its default
    # 36 make a 9,216-token prompt of a 90-px image)
    "perception_lm": {"patch_size": 14, "image_processor.max_num_tiles": 4},
}


def stated_fields(config: dict, model_type: str, processor=None) -> None:
    """The fields ``STATED`` gives ``model_type`` set in ``config``, and ``STATED_PROCESSOR``'s on ``processor``
    (in place)."""
    for dotted, value in STATED_PROCESSOR.get(model_type, {}).items() if processor is not None else ():
        *path, name = dotted.split(".")
        part = processor
        for key in path:
            part = getattr(part, key)
        setattr(part, name, value)
    for dotted, value in STATED.get(model_type, {}).items():
        *path, name = dotted.split(".")
        sub = config
        for key in path:
            sub = sub[key]
        sub[name] = copy.deepcopy(value)  # a copy: a caller editing the built config (test_vlm_sweep's narrowed
        # Perception LM's model_args) must not edit STATED for the next build in the same process


# A VQ image tokenizer's codes are tokens of the language model's vocabulary, which the config's ``vocabulary_map``
# (the checkpoint's tokenizer vocabulary, token -> id) names in the form the model's code finds them by
# (``ChameleonImageVocabularyMapping.image_tokens``: names starting "IMGIMG", the code's digits as letters A to J,
# then "Z"; ``Emu3ImageVocabularyMapping``: "<|visual token000123|>"), beside the markers its code looks up in the map
# (Emu3's row end "<|extra_200|>"); transformers' own testers build the map so (ChameleonModelTester.get_config,
# Emu3Vision2TextModelTester.get_config)
VQ_CODES = {
    "chameleon": (lambda i: "IMGIMG" + "".join(chr(ord("A") + int(c)) for c in str(i)) + "Z", ()),
    "emu3": (lambda i: f"<|visual token{i:06d}|>", ("<|extra_200|>",)),
}
VQ_CODEBOOK = 16  # a tiny VQ image tokenizer's codes
VQ_SIDE = 6  # latent cells along the side of a square image a tiny VQ image tokenizer reads (Chameleon's crop)
VQ_CODEBOOK_FIELDS = ("num_embeddings", "codebook_size")  # Chameleon's, Emu3's


def vq_tokens(model_type: str) -> list[str]:
    """The tokens a tiny VQ image tokenizer's codes and markers are in the vocabulary (``VQ_CODES``); none for a
    model type without one."""
    if model_type not in VQ_CODES:
        return []
    name, markers = VQ_CODES[model_type]
    return [*(name(i) for i in range(VQ_CODEBOOK)), *markers]


def vq_tokenizer(config: dict, words, processor, image: int | None) -> int | None:
    """A VQ image tokenizer's config (``vq_config``) made tiny and agreed with the vocabulary and the processor (in
    place): its codebook ``VQ_CODEBOOK`` codes, its channels the 32 groups of its GroupNorm, one residual block a
    level, its codes 4 wide; the config's ``vocabulary_map`` the tokenizer's vocabulary with "<image>" the token the
    processor repeats for an image (``image``), as the checkpoint's tokenizer names it; the image processor's side
    (or its pixel range) and the processor's count of image tokens (``image_seq_length``) those of ``VQ_SIDE``
    latent cells a side, each cell ``2 ** (levels - 1)`` pixels (the encoder halves the side at each level of
    ``channel_multiplier`` but the last). Returns that cell's side, or None where the config has no VQ tokenizer."""
    vq = config.get("vq_config")
    if not isinstance(vq, dict) or "vocabulary_map" not in config or not isinstance(vq.get("channel_multiplier"),
                                                                                        list):
        return None
    for key in VQ_CODEBOOK_FIELDS:
        if key in vq:
            vq[key] = VQ_CODEBOOK
    if isinstance(vq.get("hidden_size"), int):  # its middle block's attention width: the last level's channels
        vq["hidden_size"] = 32 * vq["channel_multiplier"][-1]  # (Emu3's 1,024 = 256 x 4)
    vq["base_channels"] = 32  # GroupNorm's 32 groups over the first level's channels
    vq["num_res_blocks"] = 1
    for key in ("embed_dim", "latent_channels"):  # each code's width, as transformers' testers' (5, 4)
        if isinstance(vq.get(key), int):
            vq[key] = 4
    config["vocabulary_map"] = {**words.get_vocab(), **({"<image>": image} if image is not None else {})}
    cell = 2 ** (len(vq["channel_multiplier"]) - 1)
    side = cell * VQ_SIDE
    images = getattr(processor, "image_processor", None)
    if hasattr(images, "min_pixels") and hasattr(images, "max_pixels"):  # Emu3's: the image at its own aspect
        images.min_pixels, images.max_pixels = side * side, 4 * side * side
        if isinstance(getattr(images, "size", None), dict):
            images.size = {"min_pixels": images.min_pixels, "max_pixels": images.max_pixels}
    for name in ("size", "crop_size"):  # Chameleon's: its shortest edge resized, then cropped square
        size = getattr(images, name, None)
        if size is not None and not isinstance(size, dict):
            setattr(images, name, type(size)(**{k: side for k, v in vars(size).items() if v is not None}))
    if isinstance(getattr(processor, "image_seq_length", None), int):
        processor.image_seq_length = VQ_SIDE * VQ_SIDE
    return cell


# Processors whose code strips the piece a SentencePiece tokenizer puts before every text it encodes, its checkpoint's
# tokenizer holding the image tokens as plain pieces of its vocabulary (Fuyu's, tokenizing its image tokens apart:
# "strip off the underscore which is always prepended before special image tokens"): the census's words do so too
PREFIX_PIECE = {"fuyu": "\u2581"}


def prefixed_words(model_type: str, words: list[str], specials: list[str]):
    """A word-level ``tokenizers.Tokenizer`` over ``words`` and ``specials`` as plain pieces that puts
    ``PREFIX_PIECE`` before every text it encodes and between its words (SentencePiece's ``Metaspace``), each
    special and that piece split out on its own; None for a type whose processor reads no such piece."""
    piece = PREFIX_PIECE.get(model_type)
    if piece is None:
        return None
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    pieces = list(dict.fromkeys([*words, piece, *specials]))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(pieces)}, unk_token=words[0]))
    alone = "|".join(re.escape(t) for t in sorted([piece, *set(specials)], key=len, reverse=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement=piece, prepend_scheme="always", split=False),
        pre_tokenizers.Split(Regex(alone), behavior="isolated")])
    return tok
