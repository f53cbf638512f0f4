"""Census of the vision-language models transformers ships (issue 113's "Done when"): every model type of its
image-text-to-text auto-mapping (``MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES``, what ``AutoModelForImageTextToText``
opens) built TINY with random weights and its own processor, saved whole, opened by path with ``vit.open_vlm`` in a
fresh HOME / HF_HOME (no network) and asked a question with ``vit.ask_vlm``. Run from the repository root::

    .venv/bin/python -m bench.census_vlm [--json PATH] [--only TYPE ...] [--timeout SECONDS]

Each type runs under a time limit in its own try/except, so one failure never stops the census. A type is
``answered`` (its tokens those of transformers' greedy ``generate`` on the same folder, and each answer token's
attention over the image tokens at every self-attention layer (every cross-attention layer, over the tower's states,
where the image is read through them: Mllama's) compared with the eager ``generate``'s row: ``eager_max``) and
``placed`` (its first answer token's attention drawn on the image) or not placed (the one line naming the missing
piece); ``refused`` (the one line ``vit.open_vlm`` or ``vit.ask_vlm`` gave); ``answers differ``
(flagged: a bug); or ``build failed``: the census could not build the tiny model with a processor offline (the
census's own gap, not a refusal). The types the test suite builds are built by its builders
(``tests/test_vlm_answer.py``, ``tests/test_vlm_any.py``); every other by one generic builder: transformers' default
config with its sizes shrunk consistently (``_shrunk``: the sizes ``SIZES`` names, and by how their names end every
MLP's inner width, every convolution's channels and every embedding's width no name there covers, a Mamba mixer's
heads, state and chunk together), its processor's class (or its module's) with each part's
default class over a word-level tokenizer of the special tokens its code names, the config's token ids set to the
tokenizer's and its image token to the one the processor repeats for an image, its parameters counted on the meta
device before it is built; where transformers' defaults do not build on their own, the general rules of
``bench/census_vlm_rules.py`` (a processor from its kin, fields its code needs that the default leaves None, widths
its validation ties together, one rope entry per kind of layer, the few fields only checkpoints state).
Where the processor and the shrunk config must agree, the builder reads what the
processor states: its marker tokens' ids the config lacks (``_marker_ids``), its patch, temporal patch and merge sizes
(``_patch_agreed``), the count of learned queries it writes an image token for (BLIP-2's ``num_query_tokens``), the
side its tiles or token count fix (``_side_agreed``, a second tower's from the image processor's size named after
it); widths the full config states as the vision width times its merge unit and M-RoPE
sections the code defaults for a full-size head are kept consistent shrunk (``_merged_widths``, ``_sections``).
"""

from __future__ import annotations

if __name__ == "__main__":  # run as the census: a fresh home before anything imports huggingface_hub
    from bench.census_home import fresh_home

    _HOME: str | None = fresh_home()
else:
    _HOME = None

import argparse  # noqa: E402
import datetime
import json
import math
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.census_families import TimeLimit, _alarm, one_line, source, versions
from bench.census_vlm_rules import (
    aliased,
    code_of,
    divided_widths,
    expert_groups,
    filled,
    hidden_widths,
    patch_of_counts,
    pinpoint_side,
    prefixed_words,
    processor_from_config,
    processor_of_kin,
    rope_per_kind,
    sections,
    stated_fields,
    timm_tower,
    tower_field,
    vq_tokenizer,
    vq_tokens,
)

RESULTS = Path("bench/results/cpu-2026-11-29")
NEW_TOKENS = 3
EAGER_ATOL = 1e-4  # float32 rows of tiny random models: the families the tests build differ by under 1e-5
QUESTION = "what is this ?"
# The kinds of the test suite's builders for the types they build (tests/test_vlm_answer.py's _build)
TEST_KINDS = {"llava": "llava", "llava_next": "llava_next", "llava_next_video": "llava_next_video",
              "llava_onevision": "llava_onevision", "qwen2_vl": "qwen2_vl", "qwen2_5_vl": "qwen2_5_vl",
              "qwen3_vl": "qwen3_vl", "qwen3_vl_moe": "qwen3_vl_moe", "paligemma": "paligemma", "gemma3": "gemma3",
              "internvl": "internvl", "glm4v": "glm4v", "glm4v_moe": "glm4v_moe", "glm46v": "glm46v",
              "mistral3": "mistral3", "idefics3": "idefics3", "smolvlm": "smolvlm", "qwen3_5": "qwen3_5",
              "qwen3_5_moe": "qwen3_5_moe", "llama4": "llama4", "mllama": "mllama", "florence2": "florence2",
              "molmo2": "molmo2", "gemma3n": "gemma3n"}
ANY_KINDS = ("vipllava", "glm_ocr")  # tests/test_vlm_any.py's builders

# The generic builder's sizes: each field a config may have, the tiny value it gets
LAYERS = ("num_hidden_layers", "depth", "num_layers", "encoder_layers", "decoder_layers", "vision_layers",
          "text_layers", "layers")  # Kosmos-2's and 2.5's text configs: layers, attention_heads, ffn_dim
HEADS = ("num_attention_heads", "num_heads", "encoder_attention_heads", "decoder_attention_heads", "attention_heads")
SIZES = {"hidden_size": 32, "intermediate_size": 64, "embed_dim": 32, "out_hidden_size": 32,
         "projector_hidden_size": 32, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16,
         "moe_hidden_size": 16,  # MUSE Spark's experts' width (4,096)
         "n_routed_experts": 4, "num_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
         "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8,
         "qk_nope_head_dim": 8, "v_head_dim": 8, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "d_model": 32,
         "projection_dim": 32, "vision_output_dim": 32, "projector_input_dim": 32, "projector_output_dim": 32,
         "text_hidden_size": 32, "vision_hidden_size": 32, "mm_hidden_size": 32, "encoder_hidden_size": 32,
         "linear_head_dim": 8, "linear_num_heads": 4, "index_head_dim": 8, "index_n_heads": 4, "qk_head_dim": 16,
         "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_num_key_heads": 2,
         "linear_num_value_heads": 4, "hidden_size_per_layer_input": 8,
         # OPT's (BLIP-2's) embeddings' width, projected to hidden_size; Kosmos' ffn_dim; Kimi K2.5's projector's
         "word_embed_proj_dim": 32, "ffn_dim": 64, "projection_hidden_size": 32,
         "downsample_channels": 32,  # DeepSeek-OCR 2's SAM widths, the last its encoder's hidden size
         "decoder_hidden_size": 32,  # PP-FormulaNet's vision projector's output: its decoder's d_model
         # a Mamba mixer's (Nemotron-H's 128 heads of 64 over a state of 128): 4 heads of 16, twice the hidden size
         "mamba_num_heads": 4, "mamba_n_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 16}
# Widths by how their name ends, each field no SIZES name covers: an MLP's or expert's inner width (SAM's mlp_dim
# 3,072, Nemotron-H's shared expert's 7,688, MiniMax-M3's dense_intermediate_size 12,288, Pix2Struct's d_ff) at most
# twice the tiny hidden size, as SIZES' intermediate_size; a convolution's channels (SAM's neck, 256, and the
# projectors' convolutions over it, 512 and 1,024) at most the hidden size (an image's 3 channels stay 3)
MLP_WIDTHS = ("intermediate_size", "intermediate_dim", "mlp_dim", "ffn_dim", "d_ff", "expert_dim", "_hidden_dim")
MLP_WIDTH = 2 * SIZES["hidden_size"]
CHANNELS = "_channels"
EMBEDDINGS = "_embed_dim"  # an embedding's width beside the hidden size (Gemma 4 Unified's mm_embed_dim, 3,840, which
# "matches the text model hidden_size"): at most the hidden size, as SIZES' embed_dim
SSM_CHUNK = 16  # a Mamba mixer's scan chunk (Nemotron-H's 128), so the census's prompt spans several padded chunks
# Lists of layer indices: dropped, so the config's class computes them again for the shrunk depth (a list with one
# entry per layer is cut to the shrunk depth instead)
DERIVED = ("deepstack_visual_indexes", "fullatt_block_indexes", "out_indices", "out_features", "stage_names",
           "full_attention_layers")
MAX_PARAMETERS = 100_000_000  # a tiny model has well under a million; a VQ image tokenizer keeps some width
MAX_KINDS = 4  # kinds of layer a shrunk stack keeps one of each (LFM 3's convolution, full and sliding attention)
ROPE = ("rope_parameters", "rope_scaling")
ROPE_DIMS = ("mrope_section", "freq_allocation")  # rotary widths a rope dict splits each head into: scaled with it
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {% for c in m['content'] %}{% if c['type'] == 'image' %}"
            "IMAGE {% else %}{{ c['text'] }} {% endif %}{% endfor %}{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")
WORDS = ["[UNK]", "<pad>", "user:", "assistant:", "what", "is", "this", "?", *(f"w{i}" for i in range(40))]


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _first(config: dict, names: tuple[str, ...]) -> int | None:
    return next((config[name] for name in names if _whole(config.get(name)) and config[name] > 0), None)


def _rope_shrunk(rope, ratio: float):
    """A rope dict (or one per layer type) with its rotary sections scaled by ``ratio``, their sum kept whole."""
    if not isinstance(rope, dict):
        return rope
    out = {}
    for key, value in rope.items():
        if isinstance(value, dict):
            out[key] = _rope_shrunk(value, ratio)
        elif key in ROPE_DIMS and _whole(value):
            out[key] = max(1, round(value * ratio))
        elif key in ROPE_DIMS and isinstance(value, list) and value and all(_whole(v) for v in value):
            out[key] = sections(value, max(len(value), round(sum(value) * ratio)))  # summing to the half-width
        else:
            out[key] = value
    return out


def _kept_layers(config: dict, layers: int | None) -> list[int]:
    """The layers a shrunk depth keeps: the first two, or, where a per-layer list names layers of several kinds
    (``layer_types``: Qwen 3.5's linear and full attention, LFM's convolutions), the first layer of each kind (at
    most ``MAX_KINDS``), so a stack whose attention layers come after others keeps one."""
    keep = list(range(min(layers or 2, 2)))
    for value in config.values():
        if layers and isinstance(value, list) and len(value) == layers and value and all(
                isinstance(v, str) for v in value):
            firsts = sorted({kind: i for i, kind in reversed(list(enumerate(value)))}.values())[:MAX_KINDS]
            if len(firsts) > 1:
                return firsts
    return keep


def _shrunk(config: dict) -> dict:
    """A config's dict with every size ``SIZES``, ``LAYERS`` and ``HEADS`` name shrunk, and every other width whose
    name ends as an MLP's (``MLP_WIDTHS``), a convolution's channels (``CHANNELS``) or an embedding's (``EMBEDDINGS``,
    with the ``*_dim(s)`` its config states equal to it), nested configs alike, kept
    consistent as transformers' configs check: a Mamba mixer's groups dividing its heads, its scan chunk cut only
    beside an SSM state; key/value heads as many as the heads where they were, the head's
    width the hidden size over the heads, the rotary sections scaled with it, the depth cut to the layers
    ``_kept_layers`` keeps and each per-layer list to their entries, the lists of layer indices dropped (its class
    computes them again)."""
    layers, heads, hidden = _first(config, LAYERS), _first(config, HEADS), _first(config, ("hidden_size",))
    keep = _kept_layers(config, layers)
    head_dim = _first(config, ("head_dim",)) or (hidden // heads if hidden and heads else None)
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and value and layers and all(str(k).isdigit() and int(k) < layers for k in value):
            out[key] = {k: v for k, v in value.items() if int(k) < 2}  # one entry per layer index, as the depth
        elif isinstance(value, dict) and ("model_type" in value or key.endswith("config")):
            out[key] = _shrunk(value)
        elif key in DERIVED:
            continue
        elif key in LAYERS and _whole(value):
            out[key] = min(value, len(keep)) if value == layers else min(value, 2)
        elif key in HEADS and _whole(value):
            out[key] = min(value, 4)
        elif key == "num_key_value_heads" and _whole(value):
            out[key] = min(value, 4) if value == heads else min(value, 2)
        elif key in SIZES and _whole(value) and value > 0:
            out[key] = min(value, SIZES[key])
        elif key in SIZES and isinstance(value, list) and value and all(_whole(v) for v in value):
            out[key] = [min(v, SIZES[key]) for v in value]
        elif key.endswith(MLP_WIDTHS) and _whole(value) and value > 0:
            out[key] = min(value, MLP_WIDTH)
        elif key.endswith((CHANNELS, EMBEDDINGS)) and _whole(value) and value > 0:
            out[key] = min(value, SIZES["hidden_size"])
        elif isinstance(value, list) and layers and layers > len(keep) and len(value) == layers:
            out[key] = [value[i] for i in keep]  # one entry per layer
        elif key.endswith(("_indexes", "_indices")) and layers and value and isinstance(value, list) \
                and all(_whole(v) and 0 <= v < layers for v in value):  # layer indices a shrunk depth lacks
            out[key] = sorted({min(v, min(layers, len(keep)) - 1) for v in value})  # SAM's global_attn_indexes
        else:
            out[key] = value
    for key, value in config.items():  # a width its config states equal to an embedding's shrunk here (Gemma 4
        # Unified's output_proj_dims, the embedder's input, beside its mm_embed_dim): shrunk with it
        same = [k for k in out if k.endswith(EMBEDDINGS) and config[k] == value and out[k] != value]
        if same and key.endswith(("_dim", "_dims")) and _whole(value) and out[key] == value:
            out[key] = out[same[0]]
    ssm_heads = _first(out, ("mamba_num_heads", "mamba_n_heads"))
    if _whole(out.get("ssm_state_size")) and _whole(out.get("chunk_size")):  # a Mamba mixer's scan chunk (only
        out["chunk_size"] = min(out["chunk_size"], SSM_CHUNK)  # there: Pi0's chunk_size is its actions')
    if ssm_heads and _whole(out.get("n_groups")) and out["n_groups"] > 0:  # its groups of heads divide the heads
        out["n_groups"] = math.gcd(out["n_groups"], ssm_heads)
    new_hidden, new_heads = _first(out, ("hidden_size",)), _first(out, HEADS)
    if _whole(out.get("d_kv")) and new_hidden and new_heads:  # T5's head width (Pix2Struct's): the width over the heads
        out["d_kv"] = new_hidden // new_heads
    if "head_dim" in out and (out["head_dim"] is None or _whole(out["head_dim"]) and out["head_dim"] > 0) \
            and new_hidden and new_heads:
        out["head_dim"] = new_hidden // new_heads
        for key in ROPE:
            if head_dim and key in out:
                out[key] = _rope_shrunk(out[key], out["head_dim"] / head_dim)
    elif head_dim and new_hidden and new_heads:
        for key in ROPE:
            if key in out:
                out[key] = _rope_shrunk(out[key], new_hidden / new_heads / head_dim)
    return out


def _tokens_of(processor_class) -> tuple[list[str], dict[str, str]]:
    """``(specials, named)``: the special token strings a processor class's ``__init__`` defaults name (its image
    token, its markers) or its code looks up in the vocabulary, and the tokenizer attributes its code reads by name
    (``tokenizer.image_token``), each given a token of its own name."""
    import inspect
    import re

    found = []
    for parameter in inspect.signature(processor_class.__init__).parameters.values():
        value = parameter.default
        if parameter.name.endswith("token") and isinstance(value, str) and value:
            found.append(value)
    try:
        code = inspect.getsource(inspect.getmodule(processor_class))
    except (OSError, TypeError):
        code = ""
    found += re.findall(r"(?:vocab\[|convert_tokens_to_ids\()\s*[\"']([^\"'\s]+)[\"']", code)
    found += re.findall(r"<\|?[A-Za-z_][\w|]*\|?>", code)  # the markers its code writes (<IMG_ATOM>, <|image|>)
    read = re.findall(r"tokenizer\.(\w+_token)\b", code)
    read += re.findall(r"getattr\(\s*(?:self\.)?tokenizer,\s*[\"'](\w+_token)[\"']", code)  # Gemma 4's
    # a token the code reads as an AddedToken (``self.image_token.content``: BLIP-2's, InstructBLIP's) is left to its
    # own fallback (an AddedToken it adds when the tokenizer has none): a named one is a str, which has no content
    added = set(re.findall(r"\.(\w+_token)\.content\b", code))
    named = {name: f"<{name}>" for name in sorted(set(read))  # not a tokenizer's own flag (Pi0's add_bos_token)
             if name not in ("pad_token", "eos_token", "bos_token", "unk_token") and name not in added
             and not name.startswith("add_")}
    return found, named


def processor_class_of(model_type: str):
    """The processor class transformers names for ``model_type``, else the one its model's module defines."""
    import importlib

    import transformers
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    name = PROCESSOR_MAPPING_NAMES.get(model_type)
    if name is not None:
        return getattr(transformers, name)
    try:
        module = importlib.import_module(f"transformers.models.{model_type_to_module_name(model_type)}")
    except ImportError:
        module = None
    found = [getattr(module, n) for n in dir(module) if n.endswith("Processor") and issubclass(
        getattr(module, n), transformers.ProcessorMixin)] if module else []
    if len(found) == 1:
        return found[0]
    kin = processor_of_kin(model_type)  # its kin's (bench/census_vlm_rules.py)
    if kin is None:
        raise LookupError(f"transformers names no processor class for {model_type}")
    return getattr(transformers, kin)


# Each part a processor takes, the auto-mapping that names its class for a model type
PART_MAPPINGS = {"image_processor": "image_processing_auto.IMAGE_PROCESSOR_MAPPING_NAMES",
                 "video_processor": "video_processing_auto.VIDEO_PROCESSOR_MAPPING_NAMES",
                 "feature_extractor": "feature_extraction_auto.FEATURE_EXTRACTOR_MAPPING_NAMES"}


def _part(part: str, model_type: str, processor_class):
    """A default instance of the class ``part`` of ``processor_class`` has for ``model_type``: the auto-mapping's
    class for the type, else for a type whose processor is the same class, else the one its module defines."""
    import importlib
    import inspect
    import re

    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    module, _, table = PART_MAPPINGS[part].partition(".")
    names = getattr(importlib.import_module(f"transformers.models.auto.{module}"), table)
    kin = [t for t, n in PROCESSOR_MAPPING_NAMES.items() if n == processor_class.__name__]
    for key in (model_type, *kin):
        name = names.get(key)
        name = (name.get("torchvision") or name.get("pil")) if isinstance(name, dict) else name
        if name and hasattr(transformers, name):
            return getattr(transformers, name)()
    home = importlib.import_module(processor_class.__module__.rpartition(".")[0])
    suffix = {"image_processor": "ImageProcessor", "video_processor": "VideoProcessor",
              "feature_extractor": "FeatureExtractor"}[part]
    found = [n for n in dir(home) if n.endswith(suffix)]
    if len(found) == 1:
        return getattr(home, found[0])()
    # else the one class of that kind the processor's code names (Nemotron-H Omni's ParakeetFeatureExtractor)
    code = inspect.getsource(sys.modules[processor_class.__module__])
    named = {n for n in re.findall(rf"\b(\w+{suffix})\b", code) if isinstance(getattr(transformers, n, None), type)}
    return getattr(transformers, named.pop())() if len(named) == 1 else None


def _token_ids(config: dict, processor, words, vocab: int, image: int | None) -> None:
    """Every token id of ``config`` and its nested configs (in place): the ``image`` token's id (the one the
    processor repeats for an image) for the image token, the tokenizer's id of the processor's token of that name,
    else the id kept where the vocabulary holds it, else the padding's; every vocabulary its size."""
    for key, value in config.items():
        if not isinstance(key, str):
            continue
        if isinstance(value, dict):
            _token_ids(value, processor, words, vocab, image)
        # Gemma 3n's and 4's per-layer inputs' too, and Qwen4-Exp's n-gram table's
        elif (key.startswith("vocab_size") or key.endswith("vocab_size_base")) and _whole(value):
            config[key] = vocab
        elif key in ("image_token_id", "image_token_index") and image is not None:
            config[key] = image
        elif key.endswith(("token_id", "token_index")) and _whole(value):
            token = getattr(processor, key.rsplit("_", 1)[0], None)  # image_token_id -> image_token
            config[key] = words.convert_tokens_to_ids(token) if isinstance(token, str) else \
                value if 0 <= value < vocab else 1
        elif key.endswith("token_id") and isinstance(value, list) and all(_whole(v) for v in value):
            config[key] = [v if 0 <= v < vocab else 1 for v in value]


def _marker_ids(config: dict, processor, words) -> None:
    """The ids of the processor's marker tokens the config leaves out (in place): its ``<x>_token`` gives
    ``<x>_token_id``, a ``bos``/``eos`` one also the ``start``/``end`` name (the Qwen Omni thinkers' code reads
    ``vision_start_token_id``, which their configs' defaults lack and their checkpoints' config.json sets)."""
    for key, value in vars(processor).items():
        if not (key.endswith("_token") and isinstance(value, str) and value):
            continue
        token = words.convert_tokens_to_ids(value)
        if token == words.unk_token_id:
            continue
        for name in {key, key.replace("_bos_", "_start_"), key.replace("_eos_", "_end_")}:
            if f"{name}_id" not in config and f"{name}_index" not in config:  # Aya Vision's image_token_index
                config[f"{name}_id"] = token


def _processor(processor_class, model_type: str, specials: list[str], named: dict[str, str]):
    """``(processor, tokenizer)``: ``processor_class`` built from its parts' default classes for ``model_type``
    over a word-level tokenizer holding ``specials`` and the ``named`` tokens."""
    import inspect

    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    plain = prefixed_words(model_type, WORDS, [*specials, *named.values()])  # its specials plain pieces (Fuyu's)
    tok = plain or Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    if plain is None:
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.add_special_tokens([*specials, *(t for t in named.values() if t not in specials)])
    words = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="<pad>",
                                                 eos_token="<pad>", additional_special_tokens=[] if plain else specials,
                                                 extra_special_tokens=named)
    parts = {}
    for name, parameter in inspect.signature(processor_class.__init__).parameters.items():
        if "tokenizer" in name and name != "audio_tokenizer":
            parts[name] = words
        elif name in PART_MAPPINGS:
            part = _part(name, model_type, processor_class)
            if getattr(part, "draw_on_frames", False):  # the census asks about an image: no font from the hub
                part.draw_on_frames = False  # (Ernie 4.5 VL's clips' timestamps, drawn with a font it downloads)
            if part is not None or parameter.default is inspect.Parameter.empty:
                parts[name] = part
    return processor_class(**parts), words


def _expanded_image_token(processor, words) -> int | None:
    """The id of the special token the processor repeats most for one image in a prompt (the token the model's
    image features replace), or None where it repeats none or cannot process the image."""
    from collections import Counter

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    try:
        text = processor.apply_chat_template(messages, add_generation_prompt=True)
        ids = processor(images=sample_image(), text=text, return_tensors="pt")["input_ids"][0].tolist()
    except Exception:  # noqa: BLE001 - the census then asks with the processor's named image token
        return None
    counts = Counter(i for i in ids if i >= len(WORDS)).most_common(1)  # the tokens added past the words
    return counts[0][0] if counts and counts[0][1] > 1 else None


def _processor_side(processor) -> int | None:
    """The square side the processor's image processor resizes or crops to, where it states one."""
    images = getattr(processor, "image_processor", None)
    for name in ("crop_size", "size"):
        size = getattr(images, name, None)
        height, width = (getattr(size, "height", None), getattr(size, "width", None)) if not isinstance(
            size, dict) else (size.get("height"), size.get("width"))
        if _whole(height) and height == width:
            return height
    return None


def _counts(side, patch, tokens: int) -> bool:
    """Whether ``tokens`` image tokens are a whole merge unit's (1 to 4 patches a side) over ``side``'s patches."""
    if not (_whole(side) and _whole(patch)) or side % patch:
        return False
    return any((side // patch) ** 2 == tokens * unit ** 2 for unit in range(1, 5))


def _side_agreed(config: dict, processor) -> int | None:
    """The square side the tower takes, its image processor made to resize to it where the processor states what
    fixes it: its own tile side (``img_size``: Aya Vision's tokens per tile are counted on it), or a token count
    (``image_seq_length``: Ovis 2, Qianfan-OCR; ``num_image_tokens`` where the image processor's side does not give
    it: GOT-OCR2) counted on the vision config's default side; else the image processor's own side (the config then
    takes it)."""
    images = getattr(processor, "image_processor", None)
    own = (config.get("vision_config") or {}).get("image_size")
    own = own[0] if isinstance(own, list) and own and all(_whole(v) and v == own[0] for v in own) else own
    if _whole(getattr(processor, "img_size", None)):
        side = processor.img_size
    elif _whole(getattr(processor, "image_seq_length", None)) and _whole(own):
        side = own
    elif _whole(getattr(processor, "num_image_tokens", None)) and _whole(own) and not _counts(
            _processor_side(processor), (config.get("vision_config") or {}).get("patch_size"),
            processor.num_image_tokens):
        side = own  # a count the image processor's side does not give (GOT-OCR2's 256 on its tower's 1,024 px)
    else:
        return _processor_side(processor)
    size = getattr(images, "size", None)
    if size is not None and _whole(getattr(size, "height", None)):
        images.size = type(size)(height=side, width=side)
    return side


def sample_image():
    """The census's image: random pixels, not square (70 x 90), so a transposed placement shows."""
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.random.default_rng(3).integers(0, 256, (70, 90, 3), dtype=np.uint8))


def generic_build(model_type: str):
    """``(model, processor)`` of a tiny ``model_type`` by the generic builder (see the module's docstring)."""

    import inspect

    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    model_class = getattr(transformers, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type])
    if "pixel_values" not in inspect.signature(model_class.forward).parameters and not getattr(
            CONFIG_MAPPING[model_type], "sub_configs", None):
        # a language model alone (Mistral 4's causal LM): no image to process, its tokenizer its processor
        words = _processor(type("Words", (), {"__init__": lambda self, tokenizer=None: None}), model_type, [], {})[1]
        words.chat_template = TEMPLATE.replace("IMAGE", "")
        config = _shrunk(CONFIG_MAPPING[model_type]().to_dict())
        _token_ids(config, words, words, len(words), None)
        return model_class(CONFIG_MAPPING[model_type].from_dict(config)), words
    processor_class = processor_class_of(model_type)
    found, named = _tokens_of(processor_class)
    specials = list(dict.fromkeys([*found, *vq_tokens(model_type)]))  # a VQ tokenizer's codes: vocabulary tokens
    processor, words = _processor(processor_class, model_type, specials, named)
    # the tokens the processor holds (its image token, its markers) that the tokenizer lacks: given one each
    lacking = [v for k, v in vars(processor).items() if k.endswith("_token") and isinstance(v, str) and v
               and words.convert_tokens_to_ids(v) == words.unk_token_id and v not in specials]
    if lacking:
        specials += lacking
        processor, words = _processor(processor_class, model_type, specials, named)
    config = CONFIG_MAPPING[model_type]().to_dict()
    stated_fields(config, model_type, processor)
    processor_from_config(processor, config)
    # the learned queries the processor writes an image token for, where it takes their count (BLIP-2's, whose
    # default None writes none: the image would not be read), as many as the config's Q-Former gives
    queries = config.get("num_query_tokens")
    if "num_query_tokens" in vars(processor) and processor.num_query_tokens is None and _whole(queries):
        processor.num_query_tokens = queries
    # the chat template's image placeholder: the first of the processor's image tokens it expands for an image
    candidates = [v for k, v in vars(processor).items() if k.endswith("_token") and isinstance(v, str)
                  and ("image" in k or "img" in k)]
    candidates = list(dict.fromkeys([*candidates, *(s for s in [*specials, *named.values()]
                                                    if "image" in s.lower() or "img" in s.lower()), "<image>"]))
    # then each wrapped in the processor's start and end markers (HunYuan-VL's processor refuses it bare)
    marks = vars(processor)
    candidates += [f"{marks[key]}{placeholder}{marks[key.replace('_start_', '_end_')]}" for placeholder in candidates
                   for key in marks if key.endswith("_start_token") and isinstance(marks[key], str)
                   and isinstance(marks.get(key.replace("_start_", "_end_")), str)]
    for placeholder in candidates:
        processor.chat_template = TEMPLATE.replace("IMAGE", placeholder)
        expanded = _expanded_image_token(processor, words)
        if expanded is not None:
            break
    else:
        if words.convert_tokens_to_ids(candidates[0]) == words.unk_token_id:  # a placeholder the words lack: given
            specials.append(candidates[0])  # one, which ``_written_out`` writes out (PP-Chart2Table's)
            processor, words = _processor(processor_class, model_type, specials, named)
            stated_fields(config, model_type, processor)
            processor_from_config(processor, config)
        processor.chat_template = TEMPLATE.replace("IMAGE", candidates[0])
    vision = getattr(CONFIG_MAPPING[model_type], "sub_configs", {}).get("vision_config")
    if config.get("vision_config") is None and vision is not None:  # an optional tower left out by default (Gemma 4)
        config["vision_config"] = vision().to_dict()
    full, config = config, aliased(_shrunk(aliased(config, LAYERS + HEADS)), LAYERS + HEADS, back=True)
    filled(config, model_class)
    expert_groups(config)
    hidden_widths(full, config)
    divided_widths(config, model_type)
    rope_per_kind(config, model_class)
    _token_ids(config, processor, words, len(words), expanded)
    _marker_ids(config, processor, words)
    if config.get("is_encoder_decoder") and not _whole(config.get("decoder_start_token_id")):
        # the decoder's first token, which every checkpoint states (a VisionEncoderDecoder's default has none)
        config["decoder_start_token_id"] = words.bos_token_id if words.bos_token_id is not None else words.pad_token_id
    vq_tokenizer(config, words, processor, expanded)
    side = pinpoint_side(processor) or _side_agreed(config, processor)
    for sub in (config, *(v for v in config.values() if isinstance(v, dict))):
        if side and _whole(sub.get("image_size")):  # the tower's input side: the one the processor resizes to
            sub["image_size"] = side
    for key, sub in config.items():  # a second tower's side: the one the image processor names after it
        stated = getattr(getattr(processor, "image_processor", None), key.removesuffix("_vision_config") + "_size",
                         None) if key.endswith("_vision_config") and isinstance(sub, dict) else None
        if _whole(getattr(stated, "height", None)) and _whole(sub.get("image_size")):  # DeepSeek-VL-Hybrid's high_res
            sub["image_size"] = stated.height
    _patch_agreed(config, processor)
    timm_tower(config, processor)
    patch_of_counts(config, processor)
    _merged_widths(full, config)
    _sections(config, model_class)
    config = CONFIG_MAPPING[model_type].from_dict(config)
    _bounded(model_class, config)
    model = model_class(config)
    _frames_agreed(model, processor)
    if expanded is None:
        _written_out(model, processor, words, candidates[0])
    return model, processor


def _frames_agreed(model, processor) -> None:
    """The image processor's temporal patch set to 1 where the tower's patch embedding (the model's first linear
    layer or convolution over one patch's pixels) takes one frame a patch, not its ``temporal_patch_size`` frames
    (dots.ocr 3's convolution over 3 x 14 x 14 pixels, where MUSE's linear takes 2 x 3 x 14 x 14) (in place)."""
    images = getattr(processor, "image_processor", None)
    frames, patch = getattr(images, "temporal_patch_size", None), getattr(images, "patch_size", None)
    if not (_whole(frames) and frames > 1 and _whole(patch)):
        return
    import torch

    one = 3 * patch * patch
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.in_features in (one, frames * one):
            if module.in_features == one:
                images.temporal_patch_size = 1
            return
        if isinstance(module, torch.nn.Conv3d) and tuple(module.kernel_size[1:]) == (patch, patch):
            if module.kernel_size[0] == 1:
                images.temporal_patch_size = 1
            return
        if isinstance(module, torch.nn.Conv2d) and tuple(module.kernel_size) == (patch, patch):
            if module.in_channels == 3:
                images.temporal_patch_size = 1
            return


def _written_out(model, processor, words, placeholder: str) -> int | None:
    """Where the processor expands no image token (PP-Chart2Table's, whose checkpoint's chat template writes its
    image tokens out), the template's one placeholder written out as many times as the model's own
    ``get_image_features`` returns features for the census's image, and the config's image token made that
    placeholder's (in place); returns that count, or None where the prompt does not hold the placeholder once, the
    model's code does not check one image token per feature ("image tokens do not match": a cross-attention's one
    token stays one) or it gives no count."""
    import inspect

    import torch

    token = words.convert_tokens_to_ids(placeholder)
    try:  # only a model whose forward checks one image token per feature (not a cross-attention's one <|image|>)
        counted = "image tokens do not match" in inspect.getsource(sys.modules[type(model).__module__])
    except (OSError, TypeError, KeyError):
        counted = False
    if token == words.unk_token_id or not counted:
        return None
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    try:
        inputs = processor(images=sample_image(), text=processor.apply_chat_template(
            messages, add_generation_prompt=True), return_tensors="pt")
        if inputs["input_ids"][0].tolist().count(token) != 1 or not hasattr(model, "get_image_features"):
            return None
        with torch.no_grad():
            features = model.get_image_features(pixel_values=inputs["pixel_values"])
    except Exception:  # noqa: BLE001 - the census then asks as it is and reports what fails
        return None
    features = getattr(features, "pooler_output", features)
    features = features[0] if isinstance(features, (tuple, list)) else features
    count = features.shape[-2] if isinstance(features, torch.Tensor) and features.dim() >= 2 else None
    if not count or count < 2:
        return None
    for name in ("image_token_id", "image_token_index"):
        if hasattr(model.config, name):
            setattr(model.config, name, token)
    processor.chat_template = TEMPLATE.replace("IMAGE", " ".join([placeholder] * count))
    return count


# The image processor's patch fields and the vision config's names for them
PATCH_FIELDS = {"patch_size": ("patch_size",), "temporal_patch_size": ("temporal_patch_size",),
                "merge_size": ("spatial_merge_size", "merge_size")}


def _patch_agreed(config: dict, processor) -> None:
    """The vision config's patch, temporal patch and merge sizes set to the image processor's where it states them
    as numbers (its ``vision_``-named one where it has both: Step 3.7's ``patch_size`` is its crop side), the
    processor's own where the image processor states its patch as a size (Pixtral's) (in place): the processor cuts
    the pixels into its patches and counts its tokens over them, which the tower's patch embedding and merger must
    take."""
    images = getattr(processor, "image_processor", None)
    patch = getattr(images, "patch_size", None)
    sized = patch is not None and not _whole(patch)  # Pixtral's {"height": 16, "width": 16}
    for field, names in PATCH_FIELDS.items():
        value = tower_field(images, field)
        if sized:  # the processor's own patch and merge sizes, which count its tokens
            value = next((getattr(processor, name) for name in (field, *names)
                          if _whole(getattr(processor, name, None))), None)
        if not _whole(value):
            continue
        for sub in (config, *(v for v in config.values() if isinstance(v, dict))):
            for name in names:
                if _whole(sub.get(name)):
                    sub[name] = value


def _merged_widths(full: dict, config: dict) -> None:
    """The widths the full config states as the vision tower's width times its merge unit (a 2 x 2 unit's four
    patches folded into the channels: MUSE's out_hidden_size 6,144 = 1,536 x 4) kept so in the shrunk ``config``."""
    vision, small = full.get("vision_config") or {}, config.get("vision_config") or {}
    merge = next((small[k] for k in ("merge_size", "spatial_merge_size") if _whole(small.get(k))), None)
    old = next((vision[k] for k in ("merge_size", "spatial_merge_size") if _whole(vision.get(k))), None)
    if not (merge and old and _whole(vision.get("hidden_size")) and _whole(small.get("hidden_size"))):
        return
    for whole, shrunk in ((full, config), (vision, small)):
        for key in SIZES:
            if key != "hidden_size" and _whole(whole.get(key)) and whole[key] == vision["hidden_size"] * old ** 2:
                shrunk[key] = small["hidden_size"] * merge ** 2


def _sections(config: dict, model_class) -> None:
    """The language model's M-RoPE sections where its code reads them from the rope dict with a default for the
    full-size head (``rope_parameters.get("mrope_section", [22, 22, 20])``, in its own module or its language
    model's) and the config states none (in place): the code's default scaled to the shrunk head's half-width, which
    the full-size default would not sum to (equal sections kept equal)."""
    import re

    code = code_of(model_class, config)
    if '.get("mrope_section"' not in code:
        return
    found = re.search(r'\.get\("mrope_section", \[([\d, ]+)\]\)', code)
    default = [int(v) for v in found.group(1).split(",")] if found else [16, 24, 24]  # Qwen2-VL's, else
    for sub in (config, config.get("text_config")):
        rope = sub.get("rope_parameters") if isinstance(sub, dict) else None
        hidden, heads = _first(sub or {}, ("hidden_size",)), _first(sub or {}, HEADS)
        if not isinstance(rope, dict) or not (hidden and heads):
            continue
        half = (_first(sub, ("head_dim",)) or hidden // heads) // 2
        kinds = [v for v in rope.values() if isinstance(v, dict)] or [rope]  # one rope dict per kind of layer
        for entry in kinds:
            entry.setdefault("mrope_section", sections(default, half))


def _bounded(model_class, config) -> None:
    """Build the model without memory first (torch's meta device) and refuse it above ``MAX_PARAMETERS``, naming its
    largest parts: a size the shrinking missed must not take the machine's memory."""
    import torch

    try:
        with torch.device("meta"):
            model = model_class(config)
    except Exception:  # noqa: BLE001 - the real build below reports what fails
        return
    count = sum(p.numel() for p in model.parameters())
    if count > MAX_PARAMETERS:
        largest = sorted(((p.numel(), n) for n, p in model.named_parameters()), reverse=True)[:2]
        raise ValueError(f"the shrunk config still has {count:,} parameters (" + ", ".join(
            f"{n} {tuple(model.get_parameter(n).shape)}" for _, n in largest) + ")")


TESTS = str(Path(__file__).resolve().parent.parent / "tests")  # the test suite's builders, imported from there
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)


def build(model_type: str):
    """``(model, processor, builder)`` of a tiny ``model_type``: the test suite's builder where it has one."""
    if model_type in TEST_KINDS:
        from test_vlm_answer import _build

        return (*_build(TEST_KINDS[model_type]), "tests")
    if model_type in ANY_KINDS:
        from test_vlm_any import build as any_build

        return (*any_build(model_type), "tests")
    return (*generic_build(model_type), "generic")


def census_one(model_type: str, root: Path, timeout: int) -> dict:
    """Build, save, open and ask one type; every outcome is a row, none raises."""
    import numpy as np
    import torch
    import transformers
    from test_vlm_answer import noisy

    import vit

    row = dict(type=model_type, builder=None, result=None, placed=None, message="", seconds=None)
    folder = root / model_type
    start = time.perf_counter()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        try:
            torch.manual_seed(0)
            model, processor, row["builder"] = build(model_type)
            noisy(model).save_pretrained(folder)
            processor.save_pretrained(folder)
        except TimeLimit:
            raise
        except Exception as error:  # noqa: BLE001 - the census's own gap, reported as such
            row.update(result="build failed", message=one_line(error).splitlines()[0][:300])
            return row
        image = sample_image()
        try:
            answer = vit.ask_vlm(vit.open_vlm(folder), image, QUESTION, max_new_tokens=NEW_TOKENS)
        except TimeLimit:
            raise
        except Exception as error:  # noqa: BLE001 - a refusal is a row, whatever raised it
            text = str(error)
            row.update(result="refused", message=(text.splitlines()[0] if text else type(error).__name__)[:400],
                       error=type(error).__name__)
            if "\n" in text.strip() or type(error).__module__.split(".")[0] != "vit" and not isinstance(
                    error, ValueError):
                row["flag"] = f"{type(error).__name__} from {type(error).__module__}"
            return row
        try:  # transformers alone: its generating class from the folder, eager, greedy generate on the same prompt
            reference = transformers.AutoModelForImageTextToText.from_pretrained(
                folder, attn_implementation="eager").eval()
            inputs = {k: v.to(reference.dtype) if hasattr(v, "is_floating_point") and v.is_floating_point() else v
                      for k, v in answer._source[1].inputs.items()}
            kept = own_rows(answer, reference)  # where generate returns no cross rows: each module's own (BLIP's)
            with torch.no_grad(), kept:
                out = reference.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False,
                                         output_attentions=True, return_dict_in_generate=True)
            # after the prompt: generate's steps are its last tokens (an encoder-decoder's decoder prompt, its start
            # token and the processor's decoder_input_ids, before them)
            decoder = getattr(reference.config, "is_encoder_decoder", False)
            steps = out.decoder_attentions if decoder else out.attentions
            expected = out.sequences[0, out.sequences.shape[1] - len(steps):].tolist()
        except TimeLimit:
            raise
        except Exception as error:  # noqa: BLE001
            row.update(result="answered", flag="no reference", message=f"generate: {one_line(error)}"[:300])
            return row
        if list(answer.tokens) != expected:
            row.update(result="answers differ", flag="tokens differ from generate's",
                       message=f"{list(answer.tokens)} vs {expected}")
            return row
        try:
            row["eager_max"] = cross_difference(answer, out) if decoder else kept.difference(answer) if kept.rows \
                else eager_difference(answer, out)
        except (IndexError, RuntimeError) as error:  # rows the census cannot line up: said, not hidden
            row.update(eager_max=None, eager_note=one_line(error)[:200])
        if row["eager_max"] is not None and row["eager_max"] > EAGER_ATOL:
            row.update(result="answers differ", flag="attention differs from the eager rows",
                       message=f"the image rows differ from the eager ones by {row['eager_max']:.2g}")
            return row
        row["result"] = "answered"
        try:
            drawn = answer.attention(0)
            row.update(placed=bool(np.isfinite(drawn).all()), grid=list(drawn.shape))
        except ValueError as error:
            row.update(placed=False, message=str(error).splitlines()[0][:400])
        return row
    except TimeLimit:
        row.update(result="timed out", message=f"past {timeout} s")
        return row
    finally:
        signal.alarm(0)
        row["seconds"] = round(time.perf_counter() - start, 1)
        row["message"] = row["message"].replace(str(folder), "the folder")  # no temporary path in the table


def eager_difference(answer, out) -> float | None:
    """The largest difference between each answer token's attention over the image tokens at every self-attention
    layer (at every cross-attention layer, over the tower's states, for a model that reads the image through them)
    and the eager ``generate``'s row (``out.attentions``); None where transformers gives no such rows (a layer
    without attention weights)."""
    import numpy as np
    import torch

    positions = answer.layout.positions if len(answer.layouts) == 1 else torch.cat(
        [layout.positions for layout in answer.layouts])
    # the layers whose keys are the image's states, not the prompt's (Mllama's cross-attention): where the answer
    # reads those alone, its k-th layer is the k-th of them, its row the whole eager row over the tower's states
    cross = [layer for layer, weights in enumerate(out.attentions[0])
             if weights is not None and weights.shape[-1] != weights.shape[-2]]
    if not cross and cross_reads(answer):
        return None  # its answer reads cross-attention layers whose rows generate does not return (Idefics')
    if cross and answer.layers == len(cross):
        return max(float(np.abs(answer.image_rows(i, k).numpy() - out.attentions[i][layer][0, :, -1].float().numpy())
                         .max()) for i in range(len(answer.tokens)) for k, layer in enumerate(cross))
    largest = 0.0
    for i in range(len(answer.tokens)):
        for layer, weights in enumerate(out.attentions[i]):
            if weights is None:
                return None
            if out.attentions[0][layer].shape[-1] != out.attentions[0][layer].shape[-2]:
                continue  # a cross-attention layer (Mllama's): its keys are the image's states, not the prompt's
            row = weights[0, :, -1].float()  # (H, keys): a sliding layer's cache hands it its last keys alone
            seen = out.attentions[0][layer].shape[-2] + i
            index = positions - (seen - row.shape[-1])
            expected = torch.where(index >= 0, row[:, index.clamp(min=0)], 0).numpy()
            got = np.concatenate([answer.image_rows(i, layer, image).numpy() for image in range(len(answer.layouts))],
                                 axis=-1) if len(answer.layouts) > 1 else answer.image_rows(i, layer).numpy()
            largest = max(largest, float(np.abs(got - expected).max()))
    return largest


class own_rows:  # noqa: N801 - a context manager named for what it keeps
    """Within it, where the answer's rows are a cross-attention's whose module computes its softmax itself (BLIP's
    text decoder's: its generate returns no cross rows), the eager reference's same modules (by name) hand their own
    probabilities (their output's second item), each call's last query row kept per layer: ``difference`` compares
    them with the answer's rows."""

    def __init__(self, answer, reference):
        from vit.core.recording_attention import computes_softmax

        self.rows, self.hooks = {}, []
        model = answer._source[0]
        if not (getattr(answer._recorder, "rows_kept", False) and cross_reads(answer)):
            return
        names = {module: name for name, module in model.model.named_modules()}
        theirs = dict(reference.named_modules())
        for module, layer in answer._recorder.layers.items():
            if computes_softmax(module):
                self.rows[layer] = []
                self.hooks.append(theirs[names[module]].register_forward_hook(
                    lambda _m, _a, out, layer=layer: self.rows[layer].append(out[1][0, :, -1].float())))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()

    def difference(self, answer) -> float:
        import numpy as np

        return max(float(np.abs(answer.row(i, k).numpy() - self.rows[k][i].numpy()).max())
                   for i in range(len(answer.tokens)) for k in self.rows)


def cross_reads(answer) -> bool:
    """Whether the answer's rows are a cross-attention's over the tower's states (not the prompt's tokens)."""
    from vit.explain.language.vlm_attention import cross_attending

    return cross_attending(answer._source[0].language_model)


def cross_difference(answer, out) -> float | None:
    """An encoder-decoder's: the largest difference between each answer token's whole cross-attention row over the
    encoder's states at every decoder layer and the eager ``generate``'s (``out.cross_attentions``, its last query);
    None where the answer's layers are not the decoder's every layer."""
    import numpy as np

    if not out.cross_attentions or answer.layers != len(out.cross_attentions[0]):
        return None
    return max(float(np.abs(answer.row(i, k).numpy() - out.cross_attentions[i][k][0, :, -1].float().numpy()).max())
               for i in range(len(answer.tokens)) for k in range(answer.layers))


def totals(rows: list[dict]) -> dict:
    """The counts the docs and the README read."""
    built = [r for r in rows if r["result"] != "build failed"]
    return dict(types=len(rows), built=len(built), answered=sum(r["result"] == "answered" for r in rows),
                placed=sum(bool(r["placed"]) for r in rows),
                eager_equal=sum(r.get("eager_max") is not None and r["eager_max"] <= EAGER_ATOL for r in rows),
                refused=sum(r["result"] == "refused" for r in rows),
                build_failed=len(rows) - len(built), flagged=sum(bool(r.get("flag")) for r in rows))


def markdown(rows: list[dict], summary: dict, meta: dict) -> str:
    """The census's table, as the docs show it (``docs/hooks.py``'s ``census-vlm``)."""
    lines = [f"Of {summary['types']} image-text-to-text types in transformers' auto-mapping, the census built "
             f"{summary['built']} tiny with a processor offline: {summary['answered']} answered as `generate` does, "
             f"{summary['placed']} placed on the image, {summary.get('eager_equal', 0)} with every answer token's "
             f"attention over the image tokens at every self-attention layer the eager row (within {EAGER_ATOL:g}), "
             f"{summary['refused']} refused in one line "
             f"({meta['date']}, transformers {meta['versions'].get('transformers', '?')}; "
             f"`{meta['command']}`).", "", "| type | built by | result | placed | vs eager rows | why not / note |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        placed = "" if r["placed"] is None else "yes" if r["placed"] else "no"
        # the libraries' messages name tokens such as <image>: shown as text, never read as a tag
        note = (r["message"] or r.get("eager_note", "")).replace("&", "&amp;").replace("<", "&lt;")
        note = note.replace("|", "\\|").replace("\n", " ")
        eager = "" if r.get("eager_max") is None else f"{r['eager_max']:.1g}"
        lines.append(f"| `{r['type']}` | {r['builder'] or ''} | {r['result']} | {placed} | {eager} | {note} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=RESULTS / "census_vlm.json", help="where the rows go")
    parser.add_argument("--only", nargs="*", default=None, help="model types to run, for a retry")
    parser.add_argument("--timeout", type=int, default=90, help="seconds per type")
    args = parser.parse_args(argv)
    import warnings

    import torch
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    transformers.logging.set_verbosity_error()
    types = [t for t in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES if args.only is None or t in args.only]
    root = Path(tempfile.mkdtemp(prefix="census-vlm-"))
    rows = []
    for model_type in types:
        row = census_one(model_type, root, args.timeout)
        rows.append(row)
        shutil.rmtree(root / model_type, ignore_errors=True)
        print(f"{model_type[:28]:28} {row['seconds']:6.1f}s {row['result']:14} "
              f"{'' if row['placed'] is None else 'placed' if row['placed'] else 'unplaced':9} {row['message'][:120]}",
              flush=True)
    shutil.rmtree(root, ignore_errors=True)
    if _HOME is not None:
        shutil.rmtree(_HOME, ignore_errors=True)
    summary = totals(rows)
    print("\nTotals: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in summary.items()))
    command = "python -m bench.census_vlm " + shlex.join(argv if argv is not None else sys.argv[1:])
    meta = dict(date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), command=command.strip(),
                code=source(), versions=versions())
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(dict(meta, totals=summary, rows=rows), indent=1) + "\n")
    args.json.with_suffix(".md").write_text(markdown(rows, summary, meta))


if __name__ == "__main__":
    main()
