"""Census of the vision-language models transformers ships (issue 113's "Done when"): every model type of its
image-text-to-text auto-mapping (``MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES``, what ``AutoModelForImageTextToText``
opens) built TINY with random weights and its own processor, saved whole, opened by path with ``vit.open_vlm`` in a
fresh HOME / HF_HOME (no network) and asked a question with ``vit.ask_vlm``. Run from the repository root::

    .venv/bin/python -m bench.census_vlm [--json PATH] [--only TYPE ...] [--timeout SECONDS]

Each type runs under a time limit in its own try/except, so one failure never stops the census. A type is
``answered`` (its tokens those of transformers' greedy ``generate`` on the same folder) and ``placed`` (its first answer
token's attention drawn on the image) or not placed (the one line naming the missing piece); ``refused`` (the one line
``vit.open_vlm`` or ``vit.ask_vlm`` gave); ``answers differ`` (flagged: a bug); or ``build failed``: the census could
not build the tiny model with a processor offline (the census's own gap, not a refusal). The types the test suite
builds are built by its builders (``tests/test_vlm_answer.py``, ``tests/test_vlm_any.py``); every other by one
generic builder: transformers' default config with its sizes shrunk, its processor's classes with their defaults over
a word-level tokenizer of the processor's special tokens, the config's token ids set to the tokenizer's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.census_families import _HOME, TimeLimit, _alarm, one_line, source, versions

RESULTS = Path("bench/results/cpu-2026-11-29")
NEW_TOKENS = 3
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
          "text_layers")
SIZES = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 8, "num_heads": 4, "embed_dim": 32, "out_hidden_size": 32, "projector_hidden_size": 32,
         "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16, "n_routed_experts": 4,
         "num_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
         "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
         "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
         "d_model": 32, "projection_dim": 32, "vision_output_dim": 32, "projector_input_dim": 32,
         "projector_output_dim": 32, "text_hidden_size": 32, "vision_hidden_size": 32, "mm_hidden_size": 32}
DERIVED = ("layer_types", "mlp_layer_types", "no_rope_layers", "full_attention_layers", "deepstack_visual_indexes",
           "fullatt_block_indexes", "out_indices", "out_features", "stage_names")
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {% for c in m['content'] %}{% if c['type'] == 'image' %}"
            "IMAGE {% else %}{{ c['text'] }} {% endif %}{% endfor %}{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")
WORDS = ["[UNK]", "<pad>", "user:", "assistant:", "what", "is", "this", "?", *(f"w{i}" for i in range(40))]


def _shrunk(config: dict) -> dict:
    """A config's dict with every size ``SIZES`` and ``LAYERS`` name shrunk, the lists derived from the layers
    dropped (its class computes them again), nested configs alike."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and ("model_type" in value or key.endswith("config")):
            out[key] = _shrunk(value)
        elif key in DERIVED:
            continue
        elif key in LAYERS and isinstance(value, int) and not isinstance(value, bool):
            out[key] = min(value, 2)
        elif key in SIZES and isinstance(value, int) and not isinstance(value, bool):
            out[key] = min(value, SIZES[key])
        elif key in SIZES and isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            out[key] = [min(v, SIZES[key]) for v in value]
        else:
            out[key] = value
    return out


def _tokens_of(processor_class) -> tuple[list[str], dict[str, str]]:
    """``(specials, named)``: the special token strings a processor class's ``__init__`` defaults name (its image
    token, its markers), and the tokenizer attributes its code reads by name (``tokenizer.image_token``), each given
    a token of its own name."""
    import inspect
    import re

    found = []
    for parameter in inspect.signature(processor_class.__init__).parameters.values():
        value = parameter.default
        if parameter.name.endswith("token") and isinstance(value, str) and value:
            found.append(value)
    try:
        code = inspect.getsource(processor_class)
    except (OSError, TypeError):
        code = ""
    named = {name: f"<{name}>" for name in sorted(set(re.findall(r"tokenizer\.(\w+_token)\b", code)))
             if name not in ("pad_token", "eos_token", "bos_token", "unk_token")}
    return found, named


def generic_build(model_type: str):
    """``(model, processor)`` of a tiny ``model_type`` by the generic builder (see the module's docstring)."""
    import inspect

    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
    from transformers.models.auto.video_processing_auto import VIDEO_PROCESSOR_MAPPING_NAMES

    processor_name = PROCESSOR_MAPPING_NAMES.get(model_type)
    if processor_name is None:
        raise LookupError(f"transformers names no processor class for {model_type}")
    processor_class = getattr(transformers, processor_name)
    found, named = _tokens_of(processor_class)
    specials = list(dict.fromkeys(found))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([*specials, *(t for t in named.values() if t not in specials)])
    words = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="<pad>",
                                                 eos_token="<pad>", additional_special_tokens=specials,
                                                 extra_special_tokens=named)
    images = IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type)
    images = images.get("torchvision") or images.get("pil") if isinstance(images, dict) else images
    parts = {"tokenizer": words}
    if images:
        parts["image_processor"] = getattr(transformers, images)()
    videos = VIDEO_PROCESSOR_MAPPING_NAMES.get(model_type)
    videos = videos.get("torchvision") if isinstance(videos, dict) else videos
    if videos and "video_processor" in inspect.signature(processor_class.__init__).parameters:
        parts["video_processor"] = getattr(transformers, videos)()
    processor = processor_class(**parts)
    placeholder = getattr(processor, "image_token", None) or next(
        (s for s in [*specials, *named.values()] if "image" in s.lower() or "img" in s.lower()), "<image>")
    processor.chat_template = TEMPLATE.replace("IMAGE", placeholder)
    config = _shrunk(CONFIG_MAPPING[model_type]().to_dict())
    for key in list(config):  # the config's token ids: the tokenizer's for the processor's tokens
        if key.endswith(("token_id", "token_index")) and isinstance(config[key], int):
            name = key.rsplit("_", 1)[0]  # image_token_id -> image_token
            token = getattr(processor, name, None)
            config[key] = words.convert_tokens_to_ids(token) if isinstance(token, str) else 1
    for sub in config.values():
        if isinstance(sub, dict) and "vocab_size" in sub:
            sub["vocab_size"] = len(words)
    if "vocab_size" in config:
        config["vocab_size"] = len(words)
    config = CONFIG_MAPPING[model_type].from_dict(config)
    model = getattr(transformers, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type])(config)
    return model, processor


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
    from PIL import Image
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
        image = Image.fromarray(np.random.default_rng(3).integers(0, 256, (70, 90, 3), dtype=np.uint8))
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
        try:  # transformers alone: its generating class from the folder, greedy generate on the same prompt
            reference = transformers.AutoModelForImageTextToText.from_pretrained(folder).eval()
            inputs = {k: v.to(reference.dtype) if hasattr(v, "is_floating_point") and v.is_floating_point() else v
                      for k, v in answer._source[1].inputs.items()}
            with torch.no_grad():
                out = reference.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
            # an encoder-decoder's (Florence-2's): the decoder's sequence after its start token; else after the prompt
            first = 1 if getattr(reference.config, "is_encoder_decoder", False) else inputs["input_ids"].shape[1]
            expected = out[0, first:].tolist()
        except TimeLimit:
            raise
        except Exception as error:  # noqa: BLE001
            row.update(result="answered", flag="no reference", message=f"generate: {one_line(error)}"[:300])
            return row
        if list(answer.tokens) != expected:
            row.update(result="answers differ", flag="tokens differ from generate's",
                       message=f"{list(answer.tokens)} vs {expected}")
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


def totals(rows: list[dict]) -> dict:
    """The counts the docs and the README read."""
    built = [r for r in rows if r["result"] != "build failed"]
    return dict(types=len(rows), built=len(built), answered=sum(r["result"] == "answered" for r in rows),
                placed=sum(bool(r["placed"]) for r in rows), refused=sum(r["result"] == "refused" for r in rows),
                build_failed=len(rows) - len(built), flagged=sum(bool(r.get("flag")) for r in rows))


def markdown(rows: list[dict], summary: dict, meta: dict) -> str:
    """The census's table, as the docs show it (``docs/hooks.py``'s ``census-vlm``)."""
    lines = [f"Of {summary['types']} image-text-to-text types in transformers' auto-mapping, the census built "
             f"{summary['built']} tiny with a processor offline: {summary['answered']} answered as `generate` does, "
             f"{summary['placed']} placed on the image, {summary['refused']} refused in one line "
             f"({meta['date']}, transformers {meta['versions'].get('transformers', '?')}; "
             f"`{meta['command']}`).", "", "| type | built by | result | placed | why not / note |",
             "|---|---|---|---|---|"]
    for r in rows:
        placed = "" if r["placed"] is None else "yes" if r["placed"] else "no"
        note = r["message"].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{r['type']}` | {r['builder'] or ''} | {r['result']} | {placed} | {note} |")
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
