"""What a vision-language model's folder declares, counted before anything of it is built (issue 95, item 2).

A VLM in the server's HF cache may be asked by a visitor without the token, so its own files are data to bound, not
settings to trust: a text config of 10^6 layers grew the server by 1.5 GB in 80 s while transformers built it;
InternVL's ``max_patches`` of 10^6 starts a loop of 10^12 steps in its processor; LLaVA's
``num_additional_image_tokens`` of 10^8 grew the prompt to 3 GB in 6 s; a generation config asking for
``output_attentions`` keeps every layer's attention of every step, past what the cost model counts. ``problem``
reads the folder's small files (config.json, its processor's and generation config) and the weights files' headers,
nothing else, and says in one line what is wrong; ``vit.sources.vlm.whole_vlm.open_whole_vlm`` asks it before the
tower, the processor or the model is built. The chat template is bounded where it is rendered
(``vit.explain.language.chat_template``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from vit.registry import VLM_ARCHITECTURES
from vit.sources.files import auxiliary_problem, read_json

MAX_TEXT_LAYERS = 256  # the largest published language models have 126 (Llama 3.1 405B); VLMs' 80 at most
MAX_TILES = 64  # tiles or crops of one image: InternVL's max_patches is 12 (40 at most), OneVision's canvas 6 x 6
MAX_IMAGE_TOKENS = 4096  # tokens of one view: PaliGemma at 896 px has 4,096, LLaVA at 336 px 576, InternVL 256
MAX_MERGED_TOKENS = 16_384  # Qwen2.5-VL's max_pixels (12,845,056) and Qwen3-VL's are 16,384 merge units
# A video processor's most over a clip: its 64 frames (``vlm_layouts.MAX_CLIP_FRAMES``) at an image's most (Qwen3-VL's
# published video_preprocessor_config.json says 24,576 units, GLM-4.1V's 60,000)
MAX_CLIP_MERGED_TOKENS = 64 * MAX_MERGED_TOKENS
MAX_PINPOINTS = 256  # LLaVA-NeXT's canvases (5 for 1.6, 36 for OneVision)
# Settings of the processor that multiply what one image becomes: tiles or crops, and image tokens per view
TILE_KEYS = ("max_patches", "min_patches", "pan_and_scan_max_num_crops", "max_image_tiles", "max_num_tiles",
             "max_num_crops")
TOKEN_KEYS = ("image_seq_length", "num_image_tokens", "num_additional_image_tokens", "mm_tokens_per_image",
              "image_seq_len", "num_query_tokens")
# What makes generate keep more than the answer's tokens and cache (the cost model counts those alone)
KEEPS_EVERY_STEP = ("output_attentions", "output_hidden_states", "output_scores", "output_logits")
# The processor's settings that must be the tower's own (the image tokens are counted from the tower's patches)
SAME_AS_TOWER = (("patch_size", "patch_size"), ("merge_size", "spatial_merge_size"),
                 ("temporal_patch_size", "temporal_patch_size"))
# Of those, the ones whose meaning is the same for every type, checked on a type no layout names too: the frames a
# patch spans (a patch size may be the tower's patch times its merge, Aya Vision's; a merge may be the processor's own)
SAME_FOR_EVERY_TYPE = (("temporal_patch_size", "temporal_patch_size"),)


@dataclass(frozen=True)
class DeclaredTower:
    """A VLM's vision tower that no port here reads (GLM-4.1V's, Pixtral's), as its whole model's config declares
    it: the patch, the merge unit of the patches its merger joins into one image token, and its sizes for the cost
    model. transformers' own tower runs in the answer; only where its tokens sit is read here, on the grid the
    processor gives (``image_grid_thw``, or the pixels' sides over the patch)."""

    name: str  # the vision config's model_type
    unit: int  # patches per image token along each side (the merger's ``spatial_merge_size``)
    shape: object  # ``vit.costs.plan.LibraryShape``: layers, heads, widths, patch, channels
    lead: int = 0  # image tokens before the patches' that cover no patch (Florence-2's mean of its grid)
    # A model type no layout here names (``any_vlm.read_tower``): what placing its tokens lacks ("" nothing); its
    # ``unit`` 0 where its config declares none (read from the processor's counts)
    missing: str = ""


# The towers a declared config places, each with its config's names for (layers, heads, channels) and where its
# merge unit is declared, and as what: the vision config (GLM), the whole config (Mistral 3's patch merger, Idefics3's
# pixel shuffle), or nowhere (1).
# Each merges ``spatial_merge_size`` x ``spatial_merge_size`` patches into one image token, row-major over the
# patch grid: transformers' ``Glm4vVisionModel`` by its downsample convolution over each merge unit the image
# processor lays out together, ``Mistral3PatchMerger`` by ``unfold`` over the image's patch grid; a Pixtral under
# LLaVA (Pixtral-12B) gives each patch its token. The processor's row breaks (``[IMG_BREAK]``) are not image tokens.
DECLARED_TOWERS = {
    "glm4v_vision": (("depth", "num_heads", "in_channels"), ("vision", "spatial_merge_size")),  # GLM-4.1V / 4.6V
    "glm4v_moe_vision": (("depth", "num_heads", "in_channels"), ("vision", "spatial_merge_size")),  # GLM-4.5V
    "pixtral": (("num_hidden_layers", "num_attention_heads", "num_channels"), ("model", "spatial_merge_size")),
    "qwen3_5_vision": (("depth", "num_heads", "in_channels"), ("vision", "spatial_merge_size")),  # Qwen3.5
    "qwen3_5_moe_vision": (("depth", "num_heads", "in_channels"), ("vision", "spatial_merge_size")),
    # Idefics3's and SmolVLM's SigLIP-like tower, its connector's pixel shuffle of scale_factor x scale_factor
    "idefics3_vision": (("num_hidden_layers", "num_attention_heads", "num_channels"), ("model", "scale_factor")),
    "smolvlm_vision": (("num_hidden_layers", "num_attention_heads", "num_channels"), ("model", "scale_factor")),
    # Llama 4's tower: its pixel shuffle keeps pixel_shuffle_ratio of each side (0.5: 2 x 2 patches a token,
    # ``Llama4VisionPixelShuffleMLP``), its CLS dropped before the projector
    "llama4_vision_model": (("num_hidden_layers", "num_attention_heads", "num_channels"),
                            ("vision", "pixel_shuffle_ratio")),
    # Molmo 2's tower: each patch its state; its adapter pools them as the processor's image_token_pooling says
    "molmo2_vision": (("num_hidden_layers", "num_attention_heads", "num_channels"), ("vision", "spatial_merge_size")),
    # Llama 3.2 Vision's tower: each patch its state, read by the language model's cross-attention layers
    "mllama_vision_model": (("num_hidden_layers", "attention_heads", "num_channels"), ("vision", "spatial_merge_size")),
}
# The merge units declared as the share of each side kept (a ratio r: 1 / r patches a token along each side)
RATIOS = ("pixel_shuffle_ratio",)


def declared_tower(config_json: Mapping) -> DeclaredTower | None:
    """The tower ``config_json`` (a whole VLM's) declares, if it is one of ``DECLARED_TOWERS``; None otherwise.
    ValueError (one line) for sizes that are not positive whole numbers."""
    from vit.costs.plan import LibraryShape

    vision = config_json.get("vision_config")
    if isinstance(vision, Mapping) and vision.get("model_type") == "florence_vision":
        return _davit(vision)
    if isinstance(vision, Mapping) and vision.get("model_type") == "gemma3n_vision":
        return _mobilenet(vision, config_json)
    if not isinstance(vision, Mapping) or vision.get("model_type") not in DECLARED_TOWERS:
        return None
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    (layers, heads, channels), (merged_in, merge) = DECLARED_TOWERS[vision["model_type"]]
    where = vision if merged_in == "vision" else config_json

    def size(name: str, config: Mapping = vision) -> int:
        """``config``'s ``name``, else its transformers config class's default (a config.json written by hand may
        leave a default out; transformers then builds the default)."""
        value = config.get(name)
        if value is None and str(config.get("model_type")) in CONFIG_MAPPING:
            value = getattr(CONFIG_MAPPING[str(config["model_type"])](), name, None)
        if value is None and name == merge:  # a tower whose merger is not there (LLaVA's Pixtral)
            return 1
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= 2**20:
            whose = "vision config" if config is vision else "config"
            raise ValueError(f"its {whose}'s {name} is {str(value)[:20]}, not a positive whole number")
        return value

    patch = size("patch_size")
    unit = _unit(where.get(merge)) if merge in RATIOS else size(merge, where)
    shape = LibraryShape(size(layers), size(heads), size("hidden_size"), size("intermediate_size"), 0,
                         (patch, patch), size(channels))
    return DeclaredTower(str(vision["model_type"]), unit, shape)


def _davit(vision: Mapping) -> DeclaredTower:
    """Florence-2's DaViT tower (``Florence2VisionBackbone``): four stages of overlapping convolutional patch
    embeddings, their strides' product the pixels a token of the last stage steps over, each stage's spatial and
    channel blocks; its projector (``Florence2MultiModalProjector``) gives the grid's mean first, then each token of
    the grid row-major. Its sizes: the last stage's blocks (a spatial and a channel block each: attention and MLP at
    the widest width), which its parameters hold at least (``_declared_tower_problem``'s bound; Florence-2-large's
    12 blocks at 2,048 would claim more than its weights). ValueError (one line) for sizes that are not lists of
    positive whole numbers."""
    from transformers import Florence2VisionConfig

    from vit.costs.plan import LibraryShape

    default = Florence2VisionConfig()

    def stages(name: str) -> list[int]:
        value = vision.get(name, list(getattr(default, name)))
        if not isinstance(value, list) or len(value) != 4 or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 2**16 for v in value):
            raise ValueError(f"its vision config's {name} is {str(value)[:40]}, not four positive whole numbers")
        return value

    stride = math.prod(stages("patch_stride"))
    widths, heads = stages("embed_dim"), stages("num_heads")
    ratio = vision.get("mlp_ratio", default.mlp_ratio)
    if not _number(ratio) or not 0 < ratio <= 64:
        raise ValueError(f"its vision config's mlp_ratio is {str(ratio)[:20]}, not a positive number")
    channels = vision.get("in_channels", default.in_channels)
    shape = LibraryShape(2 * stages("depths")[-1], heads[-1], widths[-1], int(widths[-1] * ratio), 0,
                         (stride, stride), channels if isinstance(channels, int) and 0 < channels <= 64 else 3)
    return DeclaredTower("florence_vision", 1, shape, lead=1)


def _mobilenet(vision: Mapping, config_json: Mapping) -> DeclaredTower:
    """Gemma 3n's MobileNetV5 tower (timm's, through ``TimmWrapper``): its multi-scale fusion gives a fixed grid of
    ``vision_soft_tokens_per_image`` tokens (16 x 16), each its image token, row-major, whatever the input's size; a
    token covers the input's side over that grid (``vlm_layouts.image_layouts``). Its sizes, for the cost model, its
    output width: a convolutional tower has no attention layers or heads to count. ValueError (one line) for a token
    count that is not a square."""
    from vit.costs.plan import LibraryShape

    tokens = config_json.get("vision_soft_tokens_per_image", 256)
    side = math.isqrt(tokens) if _number(tokens) and tokens == int(tokens) and 0 < tokens <= 2**16 else 0
    if not side or side * side != tokens:
        raise ValueError(f"its vision_soft_tokens_per_image is {str(tokens)[:20]}, not a square grid of tokens")
    width = vision.get("hidden_size", 2048)
    width = width if isinstance(width, int) and 0 < width <= 2**16 else 2048
    return DeclaredTower("gemma3n_vision", 1, LibraryShape(0, 1, width, 4 * width, 0, (1, 1), 3))


def _unit(ratio: object) -> int:
    """The merge unit of a pixel shuffle keeping ``ratio`` of each side (Llama 4's 0.5: 2); ValueError (one line)
    for a ratio that is not 1 over a whole number."""
    if _number(ratio) and 0 < ratio <= 1 and math.isclose(1 / ratio, round(1 / ratio)) and round(1 / ratio) <= 64:
        return round(1 / ratio)
    raise ValueError(f"its vision config's pixel_shuffle_ratio is {str(ratio)[:20]}, not 1 over a whole number of "
                     "patches")


def problem(folder: Path, config_json: Mapping) -> str | None:
    """What is wrong with the sizes ``folder`` (a VLM's, ``config_json`` its config.json) declares, in one line, or
    None: its small files or tokenizer over their bounds (``files.AUXILIARY_FILES``), a language model of more
    than ``MAX_TEXT_LAYERS`` layers or of more parameters than its weights files hold, a processor of more than
    ``MAX_TILES`` tiles or ``MAX_IMAGE_TOKENS`` image tokens a view or of other patches than its tower's, a config
    or generation config that keeps every step's attention, states or logits. Reads the small files and the
    weights' headers only."""
    return (auxiliary_problem(folder) or _flags_problem(config_json, "config.json")
            or _generation_problem(folder) or _processor_problem(folder, config_json)
            or _text_problem(folder, config_json) or _declared_tower_problem(folder, config_json))


def files_problem(folder: Path, config_json: Mapping) -> str | None:
    """The part of ``problem`` read from the folder's small files alone (no weights file, which a folder holding only
    the tower's shards lacks): its files' sizes and its processors' declared sizes, image and video. What the
    explorer's picker asks of a listed VLM folder, whose tower it describes."""
    return auxiliary_problem(folder) or _processor_problem(folder, config_json)


def _walk(value: object) -> Iterator[tuple[str, str, object]]:
    """Every ``(path, key, value)`` of a JSON object and the objects inside it (sub-configs, processors), without
    recursion (a file of 4 MB may nest deeper than Python's stack)."""
    stack = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, Mapping):
            for key, inner in item.items():
                yield f"{where}{key}", str(key), inner
                stack.append((f"{where}{key}.", inner))
        elif isinstance(item, list):  # its items under the list's path, with no key of their own
            for inner in item:
                yield where.rstrip("."), "", inner
                stack.append((where, inner))


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite_problem(settings: Mapping, name: str) -> str | None:
    """A NaN or an infinity (JSON as Python reads it allows both) where a size may be: no size is either; in a
    config.json, an infinity transformers' own config class has as that field's default (Nemotron-H's
    ``time_step_limit`` (0.0, inf), a bound, not a size) excepted."""
    for path, _, value in _walk(settings):
        if isinstance(value, float) and not math.isfinite(value) and not (
                name == "config.json" and value in _default_of(settings, path)):
            return f"its {name} sets {path} = {value}, which is no size; give a finite number"
    return None


def _default_of(config_json: Mapping, path: str) -> tuple:
    """The values (flattened one level) of the default transformers' config class of the (sub-)config holding
    ``path`` gives that field, or ``()``."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    *where, key = path.split(".")
    holder = config_json
    for part in where:
        holder = holder.get(part) if isinstance(holder, Mapping) else None
    model_type = holder.get("model_type") if isinstance(holder, Mapping) else None
    try:
        default = getattr(CONFIG_MAPPING[model_type], key, None) if isinstance(model_type, str) else None
    except KeyError:
        return ()
    return tuple(default) if isinstance(default, (tuple, list)) else (default,)


def _flags_problem(config: Mapping, name: str) -> str | None:
    for path, key, value in _walk(config):
        if key in KEEPS_EVERY_STEP and value not in (None, False):
            return (f"its {name} sets {path} = {str(value)[:20]}, which keeps every layer's {key[7:]} of every "
                    "step beyond what the answer is counted for; remove it (the maps are computed when asked)")
    return None


def _generation_problem(folder: Path) -> str | None:
    path = folder / "generation_config.json"
    if not path.is_file():
        return None
    config = read_json(path)
    flags = _finite_problem(config, "generation_config.json") or _flags_problem(config, "generation_config.json")
    if flags:
        return flags
    if _number(config.get("num_return_sequences")) and config["num_return_sequences"] != 1:
        return (f"its generation_config.json asks for {config['num_return_sequences']} answers at once "
                "(num_return_sequences); one is counted: remove it")
    if _number(config.get("guidance_scale")) and config["guidance_scale"] != 1:
        return ("its generation_config.json sets guidance_scale, which runs the model twice a step beyond what the "
                "answer is counted for; remove it")
    for key in ("custom_generate", "prompt_lookup_num_tokens", "assistant_early_exit"):
        if config.get(key) not in (None, False):
            return (f"its generation_config.json sets {key}, another way to generate than the greedy one counted "
                    "here; remove it")
    return None


def _processor_settings(folder: Path) -> dict:
    """The processor's settings as saved: processor_config.json (its image and video processors nested,
    transformers 5), preprocessor_config.json (the image processor alone, as older folders keep it) and
    video_preprocessor_config.json (the video processor alone)."""
    settings = {}
    for name in ("processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json"):
        if (folder / name).is_file():
            settings[name] = read_json(folder / name)
    return settings


def _processor_problem(folder: Path, config_json: Mapping) -> str | None:
    vision = config_json.get("vision_config") if isinstance(config_json.get("vision_config"), Mapping) else {}
    side = vision.get("image_size")
    side = side[0] if isinstance(side, list) and side else side
    for name, settings in {**_processor_settings(folder), "config.json": config_json}.items():
        finite = _finite_problem(settings, name)
        if finite:
            return finite
        patches = _patches_problem(settings, name)
        if patches:
            return patches
        for path, key, value in _walk(settings):
            if key in TILE_KEYS and _number(value) and not 0 <= value <= MAX_TILES and not _counts_patches(
                    settings, path):
                return (f"its {name} sets {path} = {value:,}: an image cut into that many tiles; at most "
                        f"{MAX_TILES} are read")
            if key in TOKEN_KEYS and _number(value) and not 0 <= value <= MAX_IMAGE_TOKENS:
                return (f"its {name} sets {path} = {value:,} image tokens; at most {MAX_IMAGE_TOKENS:,} a view are "
                        "read")
            if key == "image_grid_pinpoints" and isinstance(value, list):
                pinpoints = _pinpoints_problem(value, side)
                if pinpoints:
                    return f"its {name} sets {path} {pinpoints}"
        if name == "config.json":
            continue
        resize = _resize_problem(settings, video=name.startswith("video"))
        if resize:
            return f"its {name} {resize}"
        # a type no layout here names: its tokens are counted from the processor's outputs (Aya Vision's
        # patch_size is its tower's patch x merge), only the settings every type means alike checked
        same = SAME_AS_TOWER if config_json.get("model_type") in VLM_ARCHITECTURES else SAME_FOR_EVERY_TYPE
        for path, key, value in _walk(settings):
            tower_key = dict(same).get(key)
            if tower_key and _number(value) and _number(vision.get(tower_key)) and value != vision[tower_key]:
                return (f"its {name} sets {path} = {value:,} but its vision tower's {tower_key} is "
                        f"{vision[tower_key]:,}: the processor would give other image tokens than the model reads")
    return None


def _counts_patches(settings: Mapping, path: str) -> bool:
    """Whether the ``max_patches`` at ``path`` of ``settings`` counts the tower's patches, not tiles: the processor
    holding it states a ``patch_size`` and cuts no tiles (no ``crop_to_patches`` or ``min_patches``): Pix2Struct's
    and Kosmos-2.5's flattened patches (``max_patches`` of them, the image resized to fit), Kimi K2.5's NaViT resize
    to at most ``max_patches`` patches. GOT-OCR2's, InternVL's and Cohere 2 Vision's count tiles."""
    *parents, key = path.split(".")
    holder = settings
    for part in parents:
        holder = holder.get(part) if isinstance(holder, Mapping) else None
    return (key == "max_patches" and isinstance(holder, Mapping) and holder.get("patch_size") is not None
            and not any(tiles in holder for tiles in ("crop_to_patches", "min_patches")))


def _patches_problem(settings: Mapping, name: str) -> str | None:
    """A ``max_patches`` that counts the tower's patches (``_counts_patches``) past what an image is read as at
    most: ``MAX_MERGED_TOKENS`` image tokens, each the processor's ``merge_size`` squared patches where it states
    one."""
    for path, key, value in _walk(settings):
        if key != "max_patches" or not _number(value) or not _counts_patches(settings, path):
            continue
        holder = settings
        for part in path.split(".")[:-1]:
            holder = holder[part]
        merge = holder.get("merge_size") if _number(holder.get("merge_size")) and holder["merge_size"] >= 1 else 1
        most = MAX_MERGED_TOKENS * int(merge) ** 2
        if not 0 <= value <= most:
            return (f"its {name} sets {path} = {value:,} patches of the tower an image is resized to; at most "
                    f"{most:,} are read ({MAX_MERGED_TOKENS:,} image tokens)")
    return None


def _resize_problem(settings: Mapping, video: bool = False) -> str | None:
    """Qwen-VL's processors resize every image, and every frame of a clip, to between ``min_pixels`` and
    ``max_pixels`` (transformers 5 saves them as ``size.shortest_edge`` and ``size.longest_edge``): more than
    ``MAX_IMAGE_TOKENS`` merge units at least would grow any image or frame, the smallest too, before anything
    counts it (2^26 pixels took 1.5 GB for a 90 x 70 image; a video processor's 2 x 10^8 killed the server on an
    8-frame 64 x 48 GIF); more than ``MAX_MERGED_TOKENS`` at most would let an upload of 40 M pixels through the
    processor whole. A video processor's most may be over a whole clip (Qwen3-VL's 24,576 units, GLM-4.1V's
    60,000): ``MAX_CLIP_MERGED_TOKENS`` at most. ``video``: ``settings`` are a video processor's own
    (video_preprocessor_config.json); a nested one is known by its key (``video_processor``)."""
    processors = [(settings, video), *((v, video or "video" in str(k)) for k, v in settings.items()
                                       if isinstance(v, Mapping))]
    for processor, frames in processors:
        patch, merge = processor.get("patch_size"), processor.get("merge_size")
        if not (_number(patch) and _number(merge) and patch >= 1 and merge >= 1):
            continue  # no Qwen-VL processor (a wrong patch size is the tower's check's)
        size = processor.get("size") if isinstance(processor.get("size"), Mapping) else {}
        unit = int(patch * merge) ** 2
        what, most_units = ("frame of a clip", MAX_CLIP_MERGED_TOKENS) if frames else ("image", MAX_MERGED_TOKENS)
        for least in (processor.get("min_pixels"), size.get("shortest_edge")):
            if _number(least) and least > MAX_IMAGE_TOKENS * unit:
                return (f"resizes every {what} to at least {least:,} pixels (min_pixels), "
                        f"{least / unit:,.0f} image tokens; at most {MAX_IMAGE_TOKENS:,} a view are read")
        for most in (processor.get("max_pixels"), size.get("longest_edge")):
            if _number(most) and most > most_units * unit:
                where = ("a clip's 64 frames at an image's most" if frames else "Qwen2.5-VL's and Qwen3-VL's own")
                return (f"resizes {'a clip' if frames else 'an image'} to up to {most:,} pixels (max_pixels), "
                        f"{most / unit:,.0f} image tokens; at most {most_units:,} ({where})")
    return None


def _pinpoints_problem(pinpoints: list, side: object) -> str | None:
    if len(pinpoints) > MAX_PINPOINTS:
        return f"to {len(pinpoints):,} canvases; at most {MAX_PINPOINTS} are read"
    for point in pinpoints:
        if not (isinstance(point, list) and len(point) == 2 and all(_number(v) and v > 0 for v in point)):
            return f"to {str(point)[:40]}, which is no canvas (height, width)"
        tiles = math.ceil(point[0] / side) * math.ceil(point[1] / side) if _number(side) and side > 0 else 0
        if tiles > MAX_TILES:
            return (f"to a {point[0]:,}x{point[1]:,}-px canvas, {tiles:,} tiles of {side} px; at most {MAX_TILES} "
                    "are read")
    return None


def _text_problem(folder: Path, config_json: Mapping) -> str | None:
    """The language model: its layers (counted in the JSON, before transformers builds a config whose lists grow
    with them), then its parameters at least (``text_parameters``) against those the weights files hold."""
    from vit.sources.hub import MAX_CONFIG_LAYERS, _layer_count

    every = _layer_count(config_json)
    if every > MAX_CONFIG_LAYERS:
        return (f"its config.json declares {every:,} layers in all, more than any model this program opens "
                f"({MAX_CONFIG_LAYERS:,})")
    text = config_json.get("text_config") if isinstance(config_json.get("text_config"), Mapping) else config_json
    layers = text.get("num_hidden_layers")
    if _number(layers) and not 0 < layers <= MAX_TEXT_LAYERS:
        return (f"its config.json declares a language model of {layers:,} layers; at most {MAX_TEXT_LAYERS} are "
                "built (the largest published have 126)")
    from huggingface_hub.errors import StrictDataclassError  # transformers' configs validate their fields' types

    try:
        declared = text_parameters(_text_config(config_json))
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError, ZeroDivisionError,
            StrictDataclassError) as e:
        return f"its config.json's language model cannot be read ({str(e).splitlines()[0][:120] if str(e) else e!r})"
    from vit.checkpoint import CheckpointError
    from vit.sources.open import read_hf_weights

    try:
        held = sum(t.numel() for t in read_hf_weights(folder, "meta").values())
    except (CheckpointError, OSError, ValueError) as e:
        return f"its weights cannot be read ({str(e).splitlines()[0][:200]})"
    if declared > held:
        return (f"its config.json declares a language model of at least {declared:,} parameters, but its weights "
                f"files hold {held:,} in all: the config does not describe these weights")
    return None


def _declared_tower_problem(folder: Path, config_json: Mapping) -> str | None:
    """A tower no port reads (``whole_vlm.declared_tower``: transformers builds it from the config alone): its sizes
    whole numbers, and its parameters at least (each layer's attention and MLP) not more than the weights files
    hold."""
    from vit.sources.open import read_hf_weights

    try:
        tower = declared_tower(config_json)
    except ValueError as e:
        return str(e)
    if tower is None:
        return None
    shape = tower.shape
    declared = shape.num_layers * (4 * shape.hidden_size ** 2 + 2 * shape.hidden_size * shape.mlp_size)
    held = sum(t.numel() for t in read_hf_weights(folder, "meta").values())
    if declared > held:
        return (f"its config.json declares a vision tower of at least {declared:,} parameters, but its weights files "
                f"hold {held:,} in all: the config does not describe these weights")
    return None


FLOAT_TAGS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def special_floats(value):
    """``value`` (a config.json's dict) with the floats JSON cannot hold decoded as transformers writes them
    (``{"__float__": "Infinity"}``: Nemotron-H's ``time_step_limit`` (0, inf)), as its own loading does, so its
    config classes' validation takes them."""
    if isinstance(value, dict):
        if set(value) == {"__float__"} and value["__float__"] in FLOAT_TAGS:
            return FLOAT_TAGS[value["__float__"]]
        return {k: special_floats(v) for k, v in value.items()}
    return [special_floats(v) for v in value] if isinstance(value, list) else value


def _text_config(config_json: Mapping):
    """transformers' config of the folder's language model (its defaults filled in), from the JSON alone."""
    from transformers import PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = CONFIG_MAPPING[str(config_json["model_type"])].from_dict(dict(config_json))
    text = config.get_text_config()
    if not isinstance(text, PretrainedConfig):
        raise TypeError("no text config")
    return text


def text_parameters(text) -> int:
    """The parameters a language model of ``text`` (transformers' text config) has at least: its token embeddings
    and, per layer, the attention's four projections (a latent attention's two it surely has) and an MLP's two
    matrices (a gated one has three; norms,
    biases and an untied head come on top). ValueError for a size that is not a positive whole number."""
    def size(name: str, default: int | None = None) -> int:
        value = getattr(text, name, None)
        value = default if value is None else value
        if isinstance(value, list) and value:  # per layer (Gemma 3n's intermediate sizes): at least the least
            value = min(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} is {str(value)[:20]}, not a positive whole number")
        return value

    hidden, heads, vocab = size("hidden_size"), size("num_attention_heads"), size("vocab_size")
    kv_heads = size("num_key_value_heads", heads)
    if _number(getattr(text, "kv_lora_rank", None)) and text.kv_lora_rank > 0:
        # multi-head latent attention (DeepSeek-V3's, GLM-5 Next's), whose head_dim names the rotary part alone (0
        # where there is none): at least its output projection from each head's values and the keys' and values'
        # down-projection; its queries' and the up-projections' low ranks come on top
        attention = heads * size("v_head_dim") * hidden + hidden * text.kv_lora_rank
    else:
        attention = 2 * hidden * size("head_dim", max(1, hidden // heads)) * (heads + kv_heads)
    from vit.costs.plan import mlp_width

    mlp, layers = size("intermediate_size", mlp_width(text)), size("num_hidden_layers")
    return vocab * hidden + layers * (attention + 2 * hidden * mlp)
