"""Asking a VLM where it looked (issue 80, item 6; issue 92's speed criterion): ``vit.ask_vlm`` and its maps next to
transformers' eager ``generate(output_attentions=True)``, on the same model, image and question, on the CPU.

``--family`` picks the model: a family's class from transformers at a published model's widths (``FAMILIES``: which
model each follows, its language model's and tower's widths, its processor's pixel bounds) at reduced depth, random
weights (float32), saved whole with ``save_pretrained``, its processor beside it as tests/test_vlm_answer.py's
``_build(kind)`` builds its tiny one (a word-level tokenizer with the family's special tokens, its chat template) and
its image processor at the published model's own settings. The default, ``qwen2_5_vl``, is Qwen2.5-VL-3B's widths
(language model 2,048 wide, 16 heads over 2 KV heads, SwiGLU 11,008, a 151,936-word vocabulary tied to the embeddings;
tower 1,280 wide, 16 heads, SwiGLU 3,420, 112-px windows with one global layer in four, the 2 x 2 merger), with
``--layers`` language-model and ``--vision-layers`` tower layers (the 3B has 36 and 32). Each side runs in a process
of its own, forked after the imports (``measure``), ``--threads`` torch threads:

- transformers: the folder opened with ``attn_implementation="eager"``, the processor's inputs for the image and the
  question through the chat template (Florence-2, which has none: the question, as its processor lays out the rest),
  in the model's dtype, then ``generate(..., do_sample=False, output_attentions=True, return_dict_in_generate=True)``:
  every step's attention at every layer, what a notebook reads its maps from (Llama 3.2 Vision's cross-attention
  layers' among them; Florence-2's decoder cross-attentions, ``out.cross_attentions``);
- ours: ``vit.ask_vlm(vit.open_vlm(folder), image, question, max_new_tokens=N)`` (the model's own sdpa, each layer's
  query row recorded), then the last answer token's ``answer.attention(i, -1)`` and ``answer.relevance(i, -1)`` (a
  family that refuses it is shown "refused"; ``--no-relevance`` skips it).

Measured per process after the model is opened, its weights copied into the process's memory
(``weights_in_memory``: transformers maps the weights' files, a page read when first used and dropped under other
work's memory pressure) and a warm-up answer to a small image (lazy imports, thread pools):
CPU seconds (``time.process_time``, every thread) and the resident set's peak over the resident set just before the
work (VmHWM reset through /proc/self/clear_refs, glibc handing freed blocks back at once: ``tests/peak_memory.py``):
what the answer holds above the weights. Ours is measured to the attention map (the answer and one map, what
transformers' attentions give) and on to the relevance map (its forward and backward, beyond what theirs gives).
Rounds alternate the order (theirs then ours, then ours then theirs), so background load slows both alike; the
table gives medians, and theirs / ours as the median of each round's ratio. Both answers are checked equal token for
token. Run from the repository root::

    python -m bench.bench_vlm_answer --layers 4 --vision-layers 4 --sizes 448 1024 --new-tokens 16 --rounds 3 \\
        --out bench/results/cpu-2026-11-26/vlm-answer.txt
    python -m bench.bench_vlm_answer --family qwen2_vl --sizes 448 --new-tokens 16 --rounds 2 --threads 1 \\
        --no-relevance --out /tmp/qwen2_vl.txt

``--tiny`` keeps tests/test_vlm_answer.py's tiny widths (the smoke test, tests/test_bench_vlm_answer.py).
``--folder`` keeps the built model there and reuses it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script, or loaded by a test

QUESTION = "what is this ?"
WARM_SIDE = 56  # px: the warm-up image (Qwen's smallest, one image token; a tiled family's one tile)
MROPE = {"rope_type": "default", "mrope_section": [16, 24, 24], "rope_theta": 1000000.0}


@dataclass
class Family:
    """A family as the bench builds it: tests/test_vlm_answer.py's tiny ``kind`` with a published model's widths."""

    kind: str  # tests/test_vlm_answer.py's _build(kind): its classes, tokenizer, template
    follows: str  # the published model whose config.json the widths are
    text: dict  # its language model's widths (text_config)
    vision: dict  # its tower's widths (vision_config)
    images: dict = field(default_factory=dict)  # its image processor's settings (preprocessor_config.json)
    processor: dict = field(default_factory=dict)  # its processor's own (image tokens per tile, patch size)
    videos: dict = field(default_factory=dict)  # its video processor's, where they follow the tower (patch size)
    top: dict = field(default_factory=dict)  # the composite config's own fields that follow the widths
    # the composite's other sub-configs' widths (Molmo 2's adapter_config, Gemma 3n's audio_config)
    parts: dict = field(default_factory=dict)
    note: str = ""  # where the shape departs from the published one, and why


# Each published model's config.json and preprocessor_config.json (the Hugging Face Hub), depths left to the command
# line; the vocabularies are the published ones, the tokenizer the tests' word-level one (its ids a subset)
FAMILIES = {
    "qwen2_5_vl": Family(
        "qwen2_5_vl", "Qwen/Qwen2.5-VL-3B-Instruct",
        dict(hidden_size=2048, intermediate_size=11008, num_attention_heads=16, num_key_value_heads=2,
             vocab_size=151936, max_position_embeddings=128000, tie_word_embeddings=True, rope_parameters=MROPE),
        dict(hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048, patch_size=14,
             spatial_merge_size=2, window_size=112),
        images=dict(size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 16384}),
        top=dict(tie_word_embeddings=True)),
    "qwen2_vl": Family(
        "qwen2_vl", "Qwen/Qwen2-VL-2B-Instruct",
        dict(hidden_size=1536, intermediate_size=8960, num_attention_heads=12, num_key_value_heads=2,
             vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True, rope_parameters=MROPE),
        dict(embed_dim=1280, mlp_ratio=4, num_heads=16, hidden_size=1536, patch_size=14, spatial_merge_size=2),
        images=dict(size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 16384}),
        top=dict(tie_word_embeddings=True)),
    "qwen3_vl": Family(
        "qwen3_vl", "Qwen/Qwen3-VL-2B-Instruct",
        dict(hidden_size=2048, intermediate_size=6144, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
             vocab_size=151936, max_position_embeddings=262144, tie_word_embeddings=True,
             rope_parameters={"rope_type": "default", "mrope_section": [24, 20, 20], "rope_theta": 5000000.0,
                              "mrope_interleaved": True}),
        dict(hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2048, patch_size=16,
             spatial_merge_size=2, num_position_embeddings=2304),
        images=dict(size={"shortest_edge": 65536, "longest_edge": 16777216}),
        top=dict(tie_word_embeddings=True),
        note="DeepStack: the tower's layers 0, 1, 2 of 4 (the 2B's 5, 11, 17 of 24)"),
    "glm4v": Family(
        "glm4v", "zai-org/GLM-4.1V-9B-Thinking",
        dict(hidden_size=4096, intermediate_size=13696, num_attention_heads=32, num_key_value_heads=2, head_dim=128,
             vocab_size=151552, max_position_embeddings=65536,
             rope_parameters={"rope_type": "default", "mrope_section": [8, 12, 12], "rope_theta": 10000.0,
                              "partial_rotary_factor": 0.5}),
        dict(hidden_size=1536, intermediate_size=13696, num_heads=12, out_hidden_size=4096, patch_size=14,
             image_size=336, spatial_merge_size=2),
        images=dict(size={"shortest_edge": 12544, "longest_edge": 9633792})),
    "smolvlm": Family(
        "smolvlm", "HuggingFaceTB/SmolVLM-Instruct (2.2B)",
        dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=32,
             head_dim=64, vocab_size=49155, max_position_embeddings=16384,
             rope_parameters={"rope_type": "default", "rope_theta": 273768.0}),
        dict(hidden_size=1152, intermediate_size=4304, num_attention_heads=16, image_size=384, patch_size=14),
        images=dict(size={"longest_edge": 768}, max_image_size={"longest_edge": 384}),
        processor=dict(image_seq_len=81), top=dict(scale_factor=3),
        note="the image cut at most 768 px on its longest edge (2 x 2 tiles of 384 px and the whole image), not the "
             "published 1,536 (4 x 4 tiles): a 448-px image's 405 image tokens, not 1,377"),
    "mistral3": Family(
        "mistral3", "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
        dict(hidden_size=5120, intermediate_size=32768, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
             vocab_size=131072, max_position_embeddings=131072,
             rope_parameters={"rope_type": "default", "rope_theta": 1000000000.0}),
        dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=16, head_dim=64, patch_size=14,
             image_size=1540, rope_theta=10000.0),
        images=dict(size={"longest_edge": 1540}, patch_size={"height": 14, "width": 14}),
        processor=dict(patch_size=14), top=dict(tie_word_embeddings=False),
        note="run at 2 language-model layers, not 4: its untied 131,072-word embeddings and head (1.3 B) and "
             "32,768-wide SwiGLU (0.5 B a layer) are 9.4 GB of float32 at 2, 13.7 GB at 4, on a machine of 23 GB "
             "shared"),
    "mllama": Family(
        "mllama", "meta-llama/Llama-3.2-11B-Vision-Instruct",
        dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
             vocab_size=128256, max_position_embeddings=131072,
             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192}),
        dict(hidden_size=1280, intermediate_size=5120, attention_heads=16, image_size=560, patch_size=14,
             max_num_tiles=4),
        images=dict(size={"height": 560, "width": 560}, max_image_tiles=4),
        note="the tower's intermediate layers read: each of its layers (the 11B's 3, 7, 15, 23, 30 of 32), so its "
             "output 1,280 x (layers + 1) wide (the 11B's 7,680); global layers: half the tower's (the 11B's 8 after "
             "32); cross-attention layers: the language model's last (the 11B's 3, 8, ..., 38 of 40: one in five)"),
    "llama4": Family(
        "llama4", "meta-llama/Llama-4-Scout-17B-16E-Instruct",
        dict(hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384, num_attention_heads=40,
             num_key_value_heads=8, head_dim=128, vocab_size=202048, max_position_embeddings=10485760,
             num_local_experts=1, interleave_moe_layer_step=1, attention_chunk_size=8192,
             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}),
        dict(hidden_size=1408, intermediate_size=5632, num_attention_heads=16, image_size=336, patch_size=14,
             pixel_shuffle_ratio=0.5, projector_input_dim=4096, projector_output_dim=4096, vision_output_dim=4096),
        images=dict(size={"height": 336, "width": 336}, max_patches=16), processor=dict(patch_size=14),
        note="one expert per MoE layer, not Scout's 16 (each expert 126 M parameters: 16 are 8 GB of float32 a "
             "layer), and 2 language-model layers, not 4 (its untied 202,048-word embeddings and head are 7.7 GB): "
             "each token through its one routed expert (top 1, as in Scout) and the shared one"),
    "florence2": Family(
        "florence2", "microsoft/Florence-2-base",
        dict(d_model=768, encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072,
             decoder_ffn_dim=3072, vocab_size=51289, max_position_embeddings=1024),
        dict(embed_dim=[128, 256, 512, 1024], num_heads=[4, 8, 16, 32], num_groups=[4, 8, 16, 32],
             window_size=12, projection_dim=768, max_position_embeddings=50, max_temporal_embeddings=100),
        images=dict(size={"height": 768, "width": 768}, image_seq_length=577),
        note="the base's widths, not the large's: vit.open_vlm refuses a Florence-2-large (its declared-tower check "
             "counts each DaViT block at the last stage's 2,048 width, more than the weights hold); DaViT's stages "
             "1, 1, N - 3, 1 blocks deep (the base's 1, 1, 9, 1); --layers encoder and decoder layers each (the "
             "base's 6 and 6)"),
    "qwen3_vl_moe": Family(
        "qwen3_vl_moe", "Qwen/Qwen3-VL-30B-A3B-Instruct",
        dict(hidden_size=2048, intermediate_size=6144, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
             num_experts=32, num_experts_per_tok=8, moe_intermediate_size=768, decoder_sparse_step=1,
             vocab_size=151936, max_position_embeddings=262144, tie_word_embeddings=False,
             rope_parameters={"rope_type": "default", "mrope_section": [24, 20, 20], "rope_theta": 5000000.0,
                              "mrope_interleaved": True}),
        dict(hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=2048, patch_size=16,
             spatial_merge_size=2, num_position_embeddings=2304),
        images=dict(size={"shortest_edge": 65536, "longest_edge": 16777216}),
        top=dict(tie_word_embeddings=False),
        note="32 experts per MoE layer, not the 30B-A3B's 128 (each expert 4.7 M parameters: 128 are 2.4 GB of "
             "float32 a layer, 9.7 GB at 4 layers beside 2.5 GB of untied embeddings and head, on a machine of "
             "23 GB shared): each token still through its top 8, so the same multiply-adds a token; DeepStack: the "
             "tower's layers 0, 1, 2 of 4 (the 30B-A3B's 8, 16, 24 of 27)"),
    "qwen3_5": Family(
        "qwen3_5", "Qwen/Qwen3.5-0.8B",
        dict(hidden_size=1024, intermediate_size=3584, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
             linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
             linear_conv_kernel_dim=4, vocab_size=248320, max_position_embeddings=262144, tie_word_embeddings=True,
             rope_parameters={"rope_type": "default", "mrope_section": [11, 11, 10], "rope_theta": 10000000.0,
                              "mrope_interleaved": True, "partial_rotary_factor": 0.25}),
        dict(hidden_size=768, intermediate_size=3072, num_heads=12, out_hidden_size=1024, patch_size=16,
             spatial_merge_size=2, num_position_embeddings=2304),
        images=dict(size={"shortest_edge": 65536, "longest_edge": 16777216}),
        top=dict(tie_word_embeddings=True),
        note="the 0.8B's config.json as a public repository's test copies it (its every field; the Hub is not "
             "reachable here): one full-attention layer in four (full_attention_interval 4: layers 0-2 the gated "
             "delta rule, layer 3 attention); its image processor Qwen3-VL's (16-px patches, 2 x 2 merge), "
             "assumed, as its processor class is Qwen3-VL's"),
    "molmo2": Family(
        "molmo2", "allenai/Molmo2-4B",
        dict(hidden_size=2560, intermediate_size=9728, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
             vocab_size=151936, additional_vocab_size=128, max_position_embeddings=36864, tie_word_embeddings=False,
             rope_parameters={"rope_type": "default", "rope_theta": 5000000.0}),
        dict(hidden_size=1152, intermediate_size=4304, num_attention_heads=16, num_key_value_heads=16, head_dim=72,
             image_size=[378, 378], patch_size=14, num_position_embeddings=729),
        images=dict(size={"height": 378, "width": 378}, patch_size=14, max_crops=8, overlap_margins=[4, 4],
                    pooling_size=[2, 2]),
        videos=dict(size={"height": 378, "width": 378}, patch_size=14),
        top=dict(tie_word_embeddings=False),
        parts=dict(adapter_config=dict(hidden_size=1152, num_attention_heads=16, num_key_value_heads=16,
                                       head_dim=72, intermediate_size=9728, text_hidden_size=2560)),
        note="the adapter reads the tower's last layer and the one two before it (vision_feature_layer -1, -3; the "
             "4B's -3, -9 of 27, its layers 24 and 18); its video processor's patches and frame size the image "
             "processor's (assumed: vit refuses a video patch size other than the tower's, and the 4B's "
             "video_preprocessor_config.json was not at hand)"),
    "gemma3n": Family(
        "gemma3n", "google/gemma-3n-E4B-it",
        dict(hidden_size=2048, intermediate_size=16384, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
             vocab_size=262400, vocab_size_per_layer_input=262144, hidden_size_per_layer_input=256,
             altup_num_inputs=4, laurel_rank=64, sliding_window=512, max_position_embeddings=32768),
        dict(architecture="mobilenetv5_300m_enc", model_args=None, hidden_size=2048, vocab_size=128,
             vocab_offset=262144),
        images=dict(size={"height": 768, "width": 768}),
        parts=dict(audio_config=dict(vocab_size=128, vocab_offset=262272)),
        note="the tower whole (MobileNetV5-300M at its published widths: a convolutional tower, no layers to "
             "count); the language model's layers sliding, full, sliding, full with the last two reusing the keys "
             "of the two before (the E4B's 35: every fifth full, the last 15 reusing), the first's activations "
             "sparse (the E4B's first 10); the image's special tokens at the tests' tokenizer's ids (64, 65), "
             "inside the text vocabulary, not at 262,144-262,145 (an embedding row either way); the audio tower "
             "the tests' tiny one (an image question never runs it)"),
    "llava_next_video": Family(
        "llava_next_video", "llava-hf/LLaVA-NeXT-Video-7B-hf",
        dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32, num_key_value_heads=32, head_dim=128,
             vocab_size=32064, max_position_embeddings=4096, tie_word_embeddings=False,
             rope_parameters={"rope_type": "linear", "factor": 2.5, "rope_theta": 10000.0}),
        dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=16, image_size=336, patch_size=14,
             projection_dim=768),
        images=dict(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336},
                    image_grid_pinpoints=[[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]),
        videos=dict(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}),
        processor=dict(patch_size=14),
        top=dict(image_grid_pinpoints=[[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
                 tie_word_embeddings=False),
        note="asked about an image (the bench asks no clip): LLaVA-NeXT's base image and its 2 x 2 crops of 336 px "
             "for a square image, unpadded, a newline token after each row"),
}


def deepen(family: Family, config: dict, layers: int, vision_layers: int) -> None:
    """``config`` (a composite config's dict) at ``layers`` language-model and ``vision_layers`` tower layers, what
    follows from the depths with them (which tower layers are global, DeepStack's, the cross-attention layers, the
    layers an adapter reads, which layers share their keys)."""
    text, vision = config["text_config"], config["vision_config"]
    kind = family.kind
    if kind == "florence2":
        text.update(encoder_layers=layers, decoder_layers=layers)
        vision["depths"] = [1, 1, max(vision_layers - 3, 1), 1]
        return
    text["num_hidden_layers"] = layers
    text.pop("layer_types", None)  # derived from the depth
    text.pop("rope_scaling_layers", None)  # Molmo 2's: every layer, derived from the depth
    if kind in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "glm4v"):
        vision["depth"] = vision_layers
    elif kind != "gemma3n":  # Gemma 3n's MobileNetV5 is built whole, from its timm architecture's name
        vision["num_hidden_layers"] = vision_layers
    if kind == "qwen2_5_vl":  # the 3B's 7, 15, 23, 31: one in four
        vision["fullatt_block_indexes"] = list(range(3, vision_layers, 4)) or [vision_layers - 1]
    if kind in ("qwen3_vl", "qwen3_vl_moe"):
        vision["deepstack_visual_indexes"] = list(range(min(vision_layers - 1, 3))) or [0]  # the 2B reads 3
    if "num_experts" in text:  # Qwen3-VL-MoE's widths name the tiny's num_local_experts by its published name
        text.pop("num_local_experts", None)
    if kind == "molmo2":  # the 4B reads two layers, its deepest the last it runs
        config["adapter_config"]["vision_feature_layer"] = [-1, -3] if vision_layers >= 3 else [-1]
    if kind == "gemma3n":  # the last half reuse the keys of the layer of their kind before them (KV sharing)
        text["layer_types"] = ["sliding_attention", "full_attention"] * (layers // 2) + \
            ["sliding_attention"] * (layers % 2)
        text["num_kv_shared_layers"] = layers // 2
        sparse = max(round(layers * 10 / 35), 1)  # the E4B's first 10 of 35
        text["activation_sparsity_pattern"] = [0.95] * sparse + [0.0] * (layers - sparse)
    if kind == "llama4":  # Scout's layers 4, 8, ... are NoPE (no_rope_layers 0); every layer of experts
        text["no_rope_layers"] = [int((i + 1) % 4 != 0) for i in range(layers)]
        text.pop("moe_layers", None)
    if kind == "mllama":
        text["cross_attention_layers"] = [layers - 1]
        vision.update(num_global_layers=max(vision_layers // 2, 1),
                      intermediate_layers_indices=list(range(vision_layers)))
        vision["vision_output_dim"] = vision["hidden_size"] * (vision_layers + 1)


def build(folder: Path, layers: int, vision_layers: int, tiny: bool, family: str = "qwen2_5_vl") -> None:
    """``family`` at its published model's widths (or tests/test_vlm_answer.py's tiny ones) with ``layers`` and
    ``vision_layers``, random weights, saved whole in ``folder`` with its processor (the tests' tokenizer and chat
    template, the published image processor's settings)."""
    import torch

    from tests.test_vlm_answer import _build

    spec = FAMILIES[family]
    torch.manual_seed(0)
    tiny_model, processor = _build(spec.kind)
    config = tiny_model.config.to_dict()
    if not tiny:
        for part, widths in (("text_config", spec.text), ("vision_config", spec.vision), *spec.parts.items()):
            config[part] = {k: v for k, v in config[part].items() if k != "head_dim"} | widths
        config.update(spec.top)
    deepen(spec, config, layers, vision_layers)
    config_class, model_class = type(tiny_model.config), type(tiny_model)
    del tiny_model
    torch.manual_seed(0)
    model_class(config_class(**config)).eval().save_pretrained(folder)
    processor.save_pretrained(folder)
    if not tiny:  # the published image processor's settings, written where the processor reads them
        saved = folder / "processor_config.json"
        settings = json.loads(saved.read_text())
        settings["image_processor"].update(spec.images)
        if spec.videos:
            settings["video_processor"].update(spec.videos)
        settings.update(spec.processor)
        saved.write_text(json.dumps(settings, indent=2))


def picture(side: int):
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8))


def attentions_kept(out) -> int:
    """Bytes of every attention tensor ``generate`` returned (an encoder-decoder's encoder, decoder and cross
    attentions)."""
    import torch

    def size(value) -> int:
        if isinstance(value, torch.Tensor):
            return value.numel() * value.element_size()
        return sum(size(v) for v in value) if isinstance(value, (tuple, list)) else 0

    return sum(size(getattr(out, name, None) or ()) for name in
               ("attentions", "encoder_attentions", "decoder_attentions", "cross_attentions"))


def weights_in_memory(model) -> None:
    """Every weight and buffer of ``model`` copied into the process's own memory, before the warm-up. transformers
    maps the weights' files: a page is read when its weight is first used (an expert no warm-up token was routed to:
    134 MB of Qwen3-VL-MoE's at 448 px were counted in the answer's peak) and may be dropped again when other work
    needs memory (GLM-4.1V's tower lost 182 MB of them mid-answer, hiding the answer's own peak). A copy is neither,
    so the peak over the resident set once the model is open is the answer's alone."""
    import itertools

    import torch

    with torch.no_grad():
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            tensor.data = tensor.data.clone()  # a tied weight is one Parameter: still one


def theirs(folder: Path, side: int, new_tokens: int) -> dict:
    """transformers alone, eager, every step's attentions returned: the answer's CPU seconds and peak."""
    import torch
    import transformers

    from tests.peak_memory import peak, start

    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    model = getattr(transformers, architecture).from_pretrained(
        folder, attn_implementation="eager", dtype="auto").eval()
    processor = transformers.AutoProcessor.from_pretrained(folder)
    weights_in_memory(model)

    def answer(image, n):
        if processor.chat_template is None:  # Florence-2: its processor lays out the rest of the prompt
            text = QUESTION
        else:
            messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
            text = processor.apply_chat_template(messages, add_generation_prompt=True)
        # in the model's dtype, as transformers' examples pass them (Llama 4's processor gives bfloat16 pixels)
        inputs = processor(images=[image], text=text, return_tensors="pt").to(dtype=model.dtype)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=n, do_sample=False, output_attentions=True,
                                 return_dict_in_generate=True)
        return out, inputs["input_ids"].shape[1]

    answer(picture(WARM_SIDE), 2)
    image = picture(side)
    base, cpu, wall = start(), time.process_time(), time.perf_counter()
    out, prompt = answer(image, new_tokens)
    cpu, wall, held = time.process_time() - cpu, time.perf_counter() - wall, peak() - base
    # an encoder-decoder's sequences are the decoder's, from its start token; a decoder's, the prompt and the answer
    first = 1 if model.config.is_encoder_decoder else prompt
    return {"answer_cpu": cpu, "answer_wall": wall, "answer_peak": held, "kept": attentions_kept(out),
            "prompt": prompt, "tokens": out.sequences[0, first:].tolist()}


def ours(folder: Path, side: int, new_tokens: int, relevance: bool = True) -> dict:
    """``vit.ask_vlm`` and then one attention map and one relevance map of the last answer token at the last layer:
    each stage's CPU and wall seconds, the peak to the attention map and to the relevance map (``relevance`` False:
    the attention map's alone)."""
    import vit
    from tests.peak_memory import peak, start

    vlm = vit.open_vlm(folder)
    weights_in_memory(vlm.model)
    warm = vit.ask_vlm(vlm, picture(WARM_SIDE), QUESTION, max_new_tokens=2)
    warm.attention(len(warm.tokens) - 1, -1)
    if relevance:
        try:
            warm.relevance(len(warm.tokens) - 1, -1)
        except ValueError:  # refused: so is the measured one
            pass
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
    result.update(prompt=answer.prompt_tokens, tokens=list(answer.tokens), grid=list(answer.grid))
    if not relevance:
        return result
    start()  # the relevance's peak from here, over the same base: the answer's cache is still held
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        answer.relevance(last, -1)
    except ValueError as refused:  # a family whose relevance vit refuses (one line): no such map
        return result | {"relevance_refused": str(refused)}
    result.update(relevance_cpu=time.process_time() - cpu, relevance_wall=time.perf_counter() - wall,
                  relevance_peak=peak() - base)
    return result


SIDES = {"theirs": theirs, "ours": ours}


# Each side's process is forked from one that imported torch, transformers, vit and the family's modeling module once
# (vit.core.forkserver), so it starts from the same clean state as a fresh interpreter would (its own heap, its peak
# reset by clear_refs, no thread pool) without the ~5 s of CPU a fresh interpreter spent on those imports before each
# answer (issue 112). What a side measures starts after its own model's opening and warm-up answer, as before.
PRELOAD = ("import numpy, torch, transformers, PIL.Image\nimport vit, bench.bench_vlm_answer, tests.peak_memory\n"
           "getattr(transformers, {architecture!r})  # its modeling module: 2.6 s of CPU for Qwen2.5-VL's\n")
WORKER = "import sys\nfrom bench.bench_vlm_answer import main\nsys.exit(main(sys.argv[1:]))\n"
_servers: dict = {}  # (threads, architecture) -> its ForkServer (the thread count is read once, at its start)


def measure(side_name: str, folder: Path, side: int, new_tokens: int, threads: int, relevance: bool = True) -> dict:
    """One side's answer in a process of its own (forked from ``PRELOAD``'s server): its measures (JSON)."""
    from tests.peak_memory import environment
    from vit.core.forkserver import ForkServer

    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    if (threads, architecture) not in _servers:
        env = environment(OMP_NUM_THREADS=str(threads), VIT_THREADS=str(threads))
        _servers[threads, architecture] = ForkServer(
            PRELOAD.format(architecture=architecture), env={k: v for k, v in env.items() if os.environ.get(k) != v},
            cwd=str(ROOT))
    done = _servers[threads, architecture].run(
        WORKER, ["--worker", side_name, "--folder", str(folder), "--sizes", str(side), "--new-tokens",
                 str(new_tokens), "--threads", str(threads), *([] if relevance else ["--no-relevance"])],
        env={"VIT_ANALYSIS_MEMORY_MB": "1000000"})  # measured, not refused
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


def relevance_cells(o: list[dict]) -> str:
    """Ours' relevance columns: medians, or why there are none."""
    if all("relevance_cpu" in run for run in o):
        return (f"{med(o, 'relevance_cpu'):,.1f} / {med(o, 'relevance_wall'):,.1f} | "
                f"{med(o, 'relevance_peak') / 2**20:,.0f}")
    return f"{'refused' if any('relevance_refused' in run for run in o) else 'not measured'} | -"


def answer_map(run: dict) -> float:
    """Ours' CPU seconds to the answer and its attention map."""
    return run["answer_cpu"] + run["map_cpu"]


def widths(part: dict) -> str:
    """A config part's widths, as the table's header names them."""
    return ", ".join(f"{k} {v}" for k, v in part.items() if k != "rope_parameters")


def depths(config: dict) -> tuple[str, str]:
    """The folder's own language-model and tower depths (``--folder`` may be reused)."""
    text, vision = config["text_config"], config["vision_config"]
    if "encoder_layers" in text:  # Florence-2: BART's encoder and decoder, DaViT's stages
        return (f"{text['encoder_layers']} encoder + {text['decoder_layers']} decoder",
                f"{sum(vision['depths'])} ({'-'.join(map(str, vision['depths']))})")
    if "architecture" in vision:  # Gemma 3n: a timm tower, built whole
        return str(text["num_hidden_layers"]), f"all of {vision['architecture']}'s"
    return str(text["num_hidden_layers"]), str(vision.get("depth", vision.get("num_hidden_layers")))


def ratio_or_dash(t: list[dict], o: list[dict], key: str, ratio) -> float | None:
    """``pairs`` where every round of ours measured ``key``; None where it was refused or skipped."""
    return pairs(t, o, ratio) if all(key in run for run in o) else None


def table(args, folder: Path, emit) -> None:
    """Every size's rounds, alternating the order; a row per side and the ratios, medians."""
    import torch
    import transformers

    spec = FAMILIES[args.family]
    shape = (f"tests/test_vlm_answer.py's tiny {spec.kind}" if args.tiny else
             f"{args.family} at {spec.follows}'s widths (language model: {widths(spec.text)}; tower: "
             f"{widths(spec.vision)}; image processor: {widths(spec.images)}"
             f"{'; ' + widths(spec.processor) if spec.processor else ''}"
             f"{'; ' + widths(spec.top) if spec.top else ''}"
             f"{''.join(f'; {part}: {widths(part_widths)}' for part, part_widths in spec.parts.items())})"
             f"{'; ' + spec.note if spec.note else ''}")
    emit(f"# python -m bench.bench_vlm_answer {' '.join(args.argv)}   (issue 80, item 6; issue 92)")
    emit(f"# Machine: 2 logical CPUs shared with other work; torch {torch.__version__} on the CPU, {args.threads} "
         f"thread(s); transformers {transformers.__version__}")
    config = json.loads((folder / "config.json").read_text())  # the folder's own depths (--folder may be reused)
    layers, vision_layers = depths(config)
    emit(f"# {shape}, {layers} language-model and {vision_layers} tower layers, random weights (float32); "
         f"'{QUESTION}' about a random image; {args.new_tokens} answer tokens at most; each side in a process of its "
         f"own, {args.rounds} round(s), order alternating")
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
                runs[name].append(measure(name, folder, side, args.new_tokens, args.threads, args.relevance))
        t, o = runs["theirs"], runs["ours"]
        same = all(a["tokens"] == b["tokens"] for a, b in zip(t, o, strict=True))
        image = f"{side} px, {o[0]['grid'][0]}x{o[0]['grid'][1]} patches, {o[0]['prompt']:,}-token prompt, " \
                f"{len(o[0]['tokens'])} answer tokens{'' if same else ' (ANSWERS DIFFER)'}"

        emit(f"| {image} | transformers, eager, output_attentions | {med(t, 'answer_cpu'):,.1f} | "
             f"{med(t, 'answer_wall'):,.1f} | {med(t, 'answer_peak') / 2**20:,.0f} (attentions returned: "
             f"{med(t, 'kept') / 2**20:,.0f}) | (returned) | - | - |")
        emit(f"| {image} | vit.ask_vlm | {med(o, 'answer_cpu'):,.1f} | {med(o, 'answer_wall'):,.1f} | "
             f"{med(o, 'map_peak') / 2**20:,.0f} | {med(o, 'map_cpu'):.3f} / {med(o, 'map_wall'):.3f} | "
             f"{relevance_cells(o)} |")
        ratios.append((side, {
            "CPU, answer": pairs(t, o, lambda a, b: a["answer_cpu"] / b["answer_cpu"]),
            "CPU, answer + attention map": pairs(t, o, lambda a, b: a["answer_cpu"] / answer_map(b)),
            "CPU, answer + both maps": ratio_or_dash(t, o, "relevance_cpu", lambda a, b: a["answer_cpu"] / (
                answer_map(b) + b["relevance_cpu"])),
            "memory, answer + attention map": pairs(t, o, lambda a, b: a["answer_peak"] / b["map_peak"]),
            "memory, + relevance": ratio_or_dash(t, o, "relevance_peak",
                                                 lambda a, b: a["answer_peak"] / b["relevance_peak"])}))
    emit(f"# load average after: {load()}")
    emit("theirs / ours (median of the rounds' ratios; above 1: ours is cheaper)")
    names = list(ratios[0][1])
    emit(f"| image | {' | '.join(names)} |")
    emit(f"|---|{'---|' * len(names)}")
    for side, r in ratios:
        emit(f"| {side} px | {' | '.join('-' if r[n] is None else f'{r[n]:.2f}' for n in names)} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4, help="language-model layers (the 3B: 36)")
    parser.add_argument("--vision-layers", type=int, default=4, help="tower layers (the 3B: 32)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[448, 1024], help="square images' sides, px")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--family", choices=sorted(FAMILIES), default="qwen2_5_vl",
                        help="the published model's widths to build (FAMILIES names which)")
    parser.add_argument("--tiny", action="store_true", help="tests/test_vlm_answer.py's tiny widths")
    parser.add_argument("--no-relevance", dest="relevance", action="store_false",
                        help="ours to the attention map alone (issue 92's criterion), not on to the relevance map")
    parser.add_argument("--folder", type=Path, help="where the model is built, or was (default: a temporary one)")
    parser.add_argument("--out", type=Path, help="also write the table here")
    parser.add_argument("--worker", choices=sorted(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        extra = {"relevance": args.relevance} if args.worker == "ours" else {}
        print(json.dumps(SIDES[args.worker](args.folder, args.sizes[0], args.new_tokens, **extra)))
        return 0
    lines = []

    def emit(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    with tempfile.TemporaryDirectory() as scratch:
        folder = args.folder or Path(scratch) / args.family
        if not (folder / "config.json").is_file():
            started = time.perf_counter()
            build(folder, args.layers, args.vision_layers, args.tiny, args.family)
            print(f"# built {folder} in {time.perf_counter() - started:.0f} s", flush=True)
        try:
            table(args, folder, emit)
        finally:  # the sides' servers hold transformers' imports: not past the bench (a test's worker runs on)
            for server in _servers.values():
                server.close()
            _servers.clear()
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
