"""Asking a VLM where it looked (issue 80, item 6): ``vit.ask_vlm`` and its maps next to transformers' eager
``generate(output_attentions=True)``, on the same model, image and question, on the CPU.

The model is a Qwen2.5-VL-3B-shaped ``Qwen2_5_VLForConditionalGeneration`` at reduced depth, built by transformers
with random weights (float32) and saved whole with ``save_pretrained``, its processor beside it as
tests/test_vlm_answer.py builds its tiny ones (a word-level tokenizer with Qwen's image tokens, its chat template),
the image processor at Qwen's own pixel bounds: the 3B's widths (language model 2,048 wide, 16 heads over 2 KV heads,
SwiGLU 11,008, a 151,936-word vocabulary tied to the embeddings; tower 1,280 wide, 16 heads, SwiGLU 3,420, 112-px
windows with one global layer in four, the 2 x 2 merger) with ``--layers`` language-model and ``--vision-layers``
tower layers (the 3B has 36 and 32). Each side runs in its own fresh process, ``--threads`` torch threads:

- transformers: the folder opened with ``attn_implementation="eager"``, the processor's inputs for the image and the
  question through the chat template, then ``generate(..., do_sample=False, output_attentions=True,
  return_dict_in_generate=True)``: every step's attention at every layer, what a notebook reads its maps from;
- ours: ``vit.ask_vlm(vit.open_vlm(folder), image, question, max_new_tokens=N)`` (the model's own sdpa, each layer's
  query row recorded), then the last answer token's ``answer.attention(i, -1)`` and ``answer.relevance(i, -1)``.

Measured per process after the model is opened and a warm-up answer to a 56-px image (lazy imports, thread pools):
CPU seconds (``time.process_time``, every thread) and the resident set's peak over the resident set just before the
work (VmHWM reset through /proc/self/clear_refs, glibc handing freed blocks back at once: ``tests/peak_memory.py``):
what the answer holds above the weights. Ours is measured to the attention map (the answer and one map, what
transformers' attentions give) and on to the relevance map (its forward and backward, beyond what theirs gives).
Rounds alternate the order (theirs then ours, then ours then theirs), so background load slows both alike; the
table gives medians, and theirs / ours as the median of each round's ratio. Both answers are checked equal token for
token. Run from the repository root::

    python -m bench.bench_vlm_answer --layers 4 --vision-layers 4 --sizes 448 1024 --new-tokens 16 --rounds 3 \\
        --out bench/results/cpu-2026-11-26/vlm-answer.txt

``--tiny`` swaps the 3B's widths for tests/test_vlm_answer.py's tiny ones (the smoke test,
tests/test_bench_vlm_answer.py). ``--folder`` keeps the built model there and reuses it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script, or loaded by a test

QUESTION = "what is this ?"
WARM_SIDE = 56  # px: Qwen's smallest image (min_pixels 56 x 56), one image token
# Qwen2.5-VL-3B-Instruct's config.json, its depths left to the command line
TEXT_3B = dict(hidden_size=2048, intermediate_size=11008, num_attention_heads=16, num_key_value_heads=2,
               vocab_size=151936, max_position_embeddings=128000, tie_word_embeddings=True,
               rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24], "rope_theta": 1000000.0})
VISION_3B = dict(hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048, patch_size=14,
                 spatial_merge_size=2, window_size=112)
PIXELS_3B = dict(min_pixels=56 * 56, max_pixels=28 * 28 * 16384)  # the 3B's preprocessor_config.json
# tests/test_vlm_answer.py's tiny Qwen2.5-VL (the smoke test's)
TEXT_TINY = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                 vocab_size=1000, max_position_embeddings=4096,
                 rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0})
VISION_TINY = dict(hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=32)
PIXELS_TINY = dict(min_pixels=56 * 56, max_pixels=28 * 28 * 64)


def build(folder: Path, layers: int, vision_layers: int, tiny: bool) -> None:
    """Qwen2.5-VL at the 3B's widths (or the tests' tiny ones) with ``layers`` and ``vision_layers``, random weights,
    saved whole in ``folder`` with its processor (tests/test_vlm_answer.py's tokenizer and chat template)."""
    import torch
    import transformers
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    from tests.test_vlm_answer import QWEN_SPECIALS, TEMPLATE, tokenizer

    words = tokenizer(QWEN_SPECIALS)
    ids = {token: words.convert_tokens_to_ids(token) for token in QWEN_SPECIALS}
    text = dict(TEXT_TINY if tiny else TEXT_3B, num_hidden_layers=layers, eos_token_id=1)
    globals_ = list(range(3, vision_layers, 4)) or [vision_layers - 1]  # the 3B's 7, 15, 23, 31: one in four
    vision = dict(VISION_TINY if tiny else VISION_3B, depth=vision_layers, fullatt_block_indexes=globals_)
    config = transformers.Qwen2_5_VLConfig(
        vision_config=vision, text_config=text, image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"], eos_token_id=1,
        tie_word_embeddings=text.get("tie_word_embeddings", False))
    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
    processor = transformers.Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(**(PIXELS_TINY if tiny else PIXELS_3B)), tokenizer=words,
        video_processor=transformers.Qwen2VLVideoProcessor(),
        chat_template=TEMPLATE.replace("IMAGE", "<|vision_start|><|image_pad|><|vision_end|>"))
    model.save_pretrained(folder)
    processor.save_pretrained(folder)


def picture(side: int):
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8))


def theirs(folder: Path, side: int, new_tokens: int) -> dict:
    """transformers alone, eager, every step's attentions returned: the answer's CPU seconds and peak."""
    import torch
    import transformers

    from tests.peak_memory import peak, start

    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        folder, attn_implementation="eager", dtype="auto").eval()
    processor = transformers.AutoProcessor.from_pretrained(folder)

    def answer(image, n):
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True)
        inputs = processor(images=[image], text=text, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=n, do_sample=False, output_attentions=True,
                                 return_dict_in_generate=True)
        return out, inputs["input_ids"].shape[1]

    answer(picture(WARM_SIDE), 2)
    image = picture(side)
    base, cpu, wall = start(), time.process_time(), time.perf_counter()
    out, prompt = answer(image, new_tokens)
    cpu, wall, held = time.process_time() - cpu, time.perf_counter() - wall, peak() - base
    kept = sum(a.numel() * a.element_size() for step in out.attentions for a in step)
    return {"answer_cpu": cpu, "answer_wall": wall, "answer_peak": held, "kept": kept, "prompt": prompt,
            "tokens": out.sequences[0, prompt:].tolist()}


def ours(folder: Path, side: int, new_tokens: int) -> dict:
    """``vit.ask_vlm`` and then one attention map and one relevance map of the last answer token at the last layer:
    each stage's CPU and wall seconds, the peak to the attention map and to the relevance map."""
    import vit
    from tests.peak_memory import peak, start

    vlm = vit.open_vlm(folder)
    warm = vit.ask_vlm(vlm, picture(WARM_SIDE), QUESTION, max_new_tokens=2)
    warm.attention(1, -1)
    warm.relevance(1, -1)
    del warm
    image = picture(side)
    result = {}
    base = start()
    cpu, wall = time.process_time(), time.perf_counter()
    answer = vit.ask_vlm(vlm, image, QUESTION, max_new_tokens=new_tokens)
    result.update(answer_cpu=time.process_time() - cpu, answer_wall=time.perf_counter() - wall)
    last = len(answer.tokens) - 1
    cpu, wall = time.process_time(), time.perf_counter()
    answer.attention(last, -1)
    result.update(map_cpu=time.process_time() - cpu, map_wall=time.perf_counter() - wall, map_peak=peak() - base)
    start()  # the relevance's peak from here, over the same base: the answer's cache is still held
    cpu, wall = time.process_time(), time.perf_counter()
    answer.relevance(last, -1)
    result.update(relevance_cpu=time.process_time() - cpu, relevance_wall=time.perf_counter() - wall,
                  relevance_peak=peak() - base, prompt=answer.prompt_tokens, tokens=list(answer.tokens),
                  grid=list(answer.grid))
    return result


SIDES = {"theirs": theirs, "ours": ours}


def measure(side_name: str, folder: Path, side: int, new_tokens: int, threads: int) -> dict:
    """One side's answer in a fresh process: its measures (JSON)."""
    from tests.peak_memory import environment

    env = environment(OMP_NUM_THREADS=str(threads), VIT_THREADS=str(threads),
                      VIT_ANALYSIS_MEMORY_MB="1000000")  # measured, not refused: the bound is not what is compared
    done = subprocess.run([sys.executable, "-m", "bench.bench_vlm_answer", "--worker", side_name, "--folder",
                           str(folder), "--sizes", str(side), "--new-tokens", str(new_tokens), "--threads",
                           str(threads)], capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"{side_name} at {side} px failed:\n{done.stderr.strip()[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def med(rows: list[dict], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def pairs(theirs_rows: list[dict], ours_rows: list[dict], ratio) -> float:
    """The median over the rounds of ``ratio(theirs' run, ours' run)``."""
    return statistics.median(ratio(a, b) for a, b in zip(theirs_rows, ours_rows, strict=True))


def answer_map(run: dict) -> float:
    """Ours' CPU seconds to the answer and its attention map."""
    return run["answer_cpu"] + run["map_cpu"]


def table(args, folder: Path, emit) -> None:
    """Every size's rounds, alternating the order; a row per side and the ratios, medians."""
    import torch
    import transformers

    shape = ("tests/test_vlm_answer.py's tiny widths" if args.tiny else
             "Qwen2.5-VL-3B widths (LM 2,048 wide, 16 heads / 2 KV heads, SwiGLU 11,008, vocabulary 151,936 tied; "
             "tower 1,280 wide, 16 heads, SwiGLU 3,420, 112-px windows, one global layer in four, 2 x 2 merger)")
    emit(f"# python -m bench.bench_vlm_answer {' '.join(args.argv)}   (issue 80, item 6)")
    emit(f"# Machine: 2 logical CPUs shared with other work; torch {torch.__version__} on the CPU, {args.threads} "
         f"thread(s); transformers {transformers.__version__}")
    config = json.loads((folder / "config.json").read_text())  # the folder's own depths (--folder may be reused)
    layers, vision_layers = config["text_config"]["num_hidden_layers"], config["vision_config"]["depth"]
    emit(f"# {shape}, {layers} language-model and {vision_layers} tower layers, random weights (float32); "
         f"'{QUESTION}' about a random image; {args.new_tokens} answer tokens at most; each side in a fresh process, "
         f"{args.rounds} round(s), order alternating")
    emit("# peak: the resident set's high-water mark over the resident set once the model is open (the weights); "
         "CPU s: every thread's. ours' map: the last answer token's attention at the last layer; relevance: its "
         "gradient x attention at the last layer, peak over the same base")
    emit(f"# load average before: {load()}")
    emit("| image | side | answer CPU s | answer wall s | peak MB (answer + attention map) | attention map s "
         "(CPU / wall) | relevance s (CPU / wall) | peak MB (+ relevance) |")
    emit("|---|---|---|---|---|---|---|---|")
    ratios = []
    for side in args.sizes:
        runs: dict[str, list[dict]] = {"theirs": [], "ours": []}
        for r in range(args.rounds):
            for name in ("theirs", "ours") if r % 2 == 0 else ("ours", "theirs"):
                runs[name].append(measure(name, folder, side, args.new_tokens, args.threads))
        t, o = runs["theirs"], runs["ours"]
        same = all(a["tokens"] == b["tokens"] for a, b in zip(t, o, strict=True))
        image = f"{side} px, {o[0]['grid'][0]}x{o[0]['grid'][1]} patches, {o[0]['prompt']:,}-token prompt, " \
                f"{len(o[0]['tokens'])} answer tokens{'' if same else ' (ANSWERS DIFFER)'}"

        emit(f"| {image} | transformers, eager, output_attentions | {med(t, 'answer_cpu'):,.1f} | "
             f"{med(t, 'answer_wall'):,.1f} | {med(t, 'answer_peak') / 2**20:,.0f} (attentions returned: "
             f"{med(t, 'kept') / 2**20:,.0f}) | (returned) | - | - |")
        emit(f"| {image} | vit.ask_vlm | {med(o, 'answer_cpu'):,.1f} | {med(o, 'answer_wall'):,.1f} | "
             f"{med(o, 'map_peak') / 2**20:,.0f} | {med(o, 'map_cpu'):.3f} / {med(o, 'map_wall'):.3f} | "
             f"{med(o, 'relevance_cpu'):,.1f} / {med(o, 'relevance_wall'):,.1f} | "
             f"{med(o, 'relevance_peak') / 2**20:,.0f} |")
        ratios.append((side, {
            "CPU, answer": pairs(t, o, lambda a, b: a["answer_cpu"] / b["answer_cpu"]),
            "CPU, answer + attention map": pairs(t, o, lambda a, b: a["answer_cpu"] / answer_map(b)),
            "CPU, answer + both maps": pairs(t, o, lambda a, b: a["answer_cpu"] / (answer_map(b)
                                                                                + b["relevance_cpu"])),
            "memory, answer + attention map": pairs(t, o, lambda a, b: a["answer_peak"] / b["map_peak"]),
            "memory, + relevance": pairs(t, o, lambda a, b: a["answer_peak"] / b["relevance_peak"])}))
    emit(f"# load average after: {load()}")
    emit("theirs / ours (median of the rounds' ratios; above 1: ours is cheaper)")
    names = list(ratios[0][1])
    emit(f"| image | {' | '.join(names)} |")
    emit(f"|---|{'---|' * len(names)}")
    for side, r in ratios:
        emit(f"| {side} px | {' | '.join(f'{r[n]:.2f}' for n in names)} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4, help="language-model layers (the 3B: 36)")
    parser.add_argument("--vision-layers", type=int, default=4, help="tower layers (the 3B: 32)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[448, 1024], help="square images' sides, px")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="tests/test_vlm_answer.py's tiny widths")
    parser.add_argument("--folder", type=Path, help="where the model is built, or was (default: a temporary one)")
    parser.add_argument("--out", type=Path, help="also write the table here")
    parser.add_argument("--worker", choices=sorted(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(SIDES[args.worker](args.folder, args.sizes[0], args.new_tokens)))
        return 0
    lines = []

    def emit(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    with tempfile.TemporaryDirectory() as scratch:
        folder = args.folder or Path(scratch) / "qwen2_5_vl"
        if not (folder / "config.json").is_file():
            started = time.perf_counter()
            build(folder, args.layers, args.vision_layers, args.tiny)
            print(f"# built {folder} in {time.perf_counter() - started:.0f} s", flush=True)
        table(args, folder, emit)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
