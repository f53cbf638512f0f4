"""Where a VLM looked when it said each word (issue 80, items 1, 2a, 3, 5): ``vit.ask_vlm`` answers with transformers'
own greedy ``generate``, and each answer token's attention to the image tokens is the row transformers' eager
attention returns for the query that predicted it, placed on the tower's patch grid through the model's own layout.

References are transformers' own tiny random VLMs (noise on every parameter) saved whole in many shards with their
processor: its image processor, a word-level tokenizer built offline with the image's special tokens, and a chat
template. Each answer is compared with ``generate(..., output_attentions=True, return_dict_in_generate=True)`` of the
eager model opened from the same folder, at every answer token, layer and head (and their mean), to 1e-5; each eager
row is placed by hand, each image token's value written into every patch its unit covers.
"""

import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402

import vit  # noqa: E402
from vit.costs.bounds import TooManyTokens  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

ATOL = 1e-5
NEW_TOKENS = 5
WORDS = ["[UNK]", "<pad>", "dog", "cat", "hot", "red", "sky", "what", "is", "this", "?", "a", "the", "user:",
         "assistant:", *(f"w{i}" for i in range(40))]
# A chat template of the shape real ones have: each message's role, its image placeholder and text
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {% for c in m['content'] %}{% if c['type'] == 'image' %}"
            "IMAGE {% elif c['type'] == 'video' %}VIDEO {% else %}{{ c['text'] }} {% endif %}{% endfor %}{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")
QWEN_SPECIALS = ["<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|video_pad|>"]
GLM_SPECIALS = ["<|image|>", "<|begin_of_image|>", "<|end_of_image|>", "<|video|>", "<|begin_of_video|>",
                "<|end_of_video|>"]
CLIP_TOWER = dict(model_type="clip_vision_model", image_size=32, patch_size=8, hidden_size=32, intermediate_size=48,
                  num_hidden_layers=3, num_attention_heads=2)
LLAMA = dict(model_type="llama", hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8)
NEXT_PINPOINTS = [[32, 64], [64, 32], [64, 64], [64, 96], [96, 64]]  # LLaVA-NeXT's canvases, (height, width) px
# Gemma 3's pan-and-scan settings, saved in its image processor (which Gemma3Processor's own defaults override)
PAN_AND_SCAN = dict(do_pan_and_scan=True, pan_and_scan_min_crop_size=8, pan_and_scan_max_num_crops=4,
                    pan_and_scan_min_ratio_to_activate=1.2)
KINDS = ["llava", "llava_full", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "gemma3", "paligemma",
         "paligemma2", "internvl", "glm4v", "glm4v_moe", "glm46v", "mistral3", "pixtral",
         "qwen3_5", "qwen3_5_moe", "llama4", "gemma3n"]
QUESTION = "what is this ?"


def tokenizer(specials: list[str], named: dict[str, str] | None = None, bos: str | None = None):
    """A word-level tokenizer of ``WORDS`` split at spaces, with ``specials`` and ``named`` special tokens (Gemma 3's
    processor reads its ``boi_token``, ``eoi_token`` and ``image_token`` by name) and a ``bos`` token (PaliGemma's
    processor puts it after the image), built offline."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([*specials, *(named or {}).values(), *([bos] if bos else [])])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="<pad>",
                                                eos_token="<pad>", bos_token=bos, additional_special_tokens=specials,
                                                extra_special_tokens=named or {})


def qwen3_processor(words, template: str):
    """Qwen3-VL's processor (Qwen3.5's too): 16-px patches merged 2 x 2, at most 64 merge units."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    images = Qwen2VLImageProcessor(patch_size=16, merge_size=2, min_pixels=64 * 64, max_pixels=32 * 32 * 64,
                                   image_mean=[0.5] * 3, image_std=[0.5] * 3)
    return transformers.Qwen3VLProcessor(image_processor=images, tokenizer=words,
                                         video_processor=transformers.Qwen3VLVideoProcessor(), chat_template=template)


def _build(kind: str):
    if kind.startswith("paligemma"):  # SigLIP's 4 x 4 patches, one image token each, read as a bidirectional prefix
        words = tokenizer(["<image>"], bos="<bos>")
        # Untied: Gemma's embeddings scaled by sqrt(hidden) and tied to its head repeat the last token, every step;
        # bos as the end: the answer runs its NEW_TOKENS
        text = dict(LLAMA, model_type="gemma", vocab_size=len(words), tie_word_embeddings=False,
                    eos_token_id=len(words) - 1)
        tower = dict(CLIP_TOWER, model_type="siglip_vision_model", vision_use_head=False)
        if kind == "paligemma2":  # PaliGemma 2: the same config over Gemma 2 (soft caps, sliding-window layers),
            text = dict(text, model_type="gemma2", sliding_window=512, attn_logit_softcapping=5.0,
                        final_logit_softcapping=30.0)
            tower = dict(tower, image_size=64, patch_size=4)  # and PaliGemma's 256 image tokens, 16 x 16
        config = transformers.PaliGemmaConfig(vision_config=tower, text_config=text, projection_dim=32,
                                              image_token_id=words.convert_tokens_to_ids("<image>"),
                                              tie_word_embeddings=False, eos_token_id=len(words) - 1)
        side = tower["image_size"]
        images = transformers.SiglipImageProcessor(size={"height": side, "width": side}, resample=3)
        images.image_seq_length = (side // tower["patch_size"]) ** 2
        # No chat template, as PaliGemma's checkpoints have none: its processor lays out the prompt
        return (transformers.PaliGemmaForConditionalGeneration(config),
                transformers.PaliGemmaProcessor(image_processor=images, tokenizer=words))
    if kind == "internvl":  # a 4 x 4 grid pixel-shuffled 2 x 2 into 2 x 2 image tokens, one view (no tiles)
        named = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
                 "video_token": "<video>"}
        words = tokenizer([], named)
        config = transformers.InternVLConfig(
            vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                               num_attention_heads=2, attention_bias=True, use_qk_norm=True),
            text_config=dict(LLAMA, model_type="qwen2", vocab_size=len(words)),
            image_token_id=words.convert_tokens_to_ids("<IMG_CONTEXT>"), eos_token_id=1)
        processor = transformers.InternVLProcessor(
            image_processor=transformers.GotOcr2ImageProcessor(size={"height": 32, "width": 32}, max_patches=1),
            tokenizer=words, video_processor=transformers.InternVLVideoProcessor(size={"height": 32, "width": 32}),
            image_seq_length=4, chat_template=TEMPLATE.replace("IMAGE", "<IMG_CONTEXT>").replace("VIDEO", "<video>"))
        return transformers.InternVLForConditionalGeneration(config), processor
    if kind in ("gemma3", "gemma3_pas"):  # an 8 x 8 SigLIP grid pooled 4 x 4 into 2 x 2 image tokens; sliding-window
        # layers
        # "_pas": pan-and-scan, a crop beside another along a long side, each its own image of 2 x 2 tokens
        scan = PAN_AND_SCAN if kind == "gemma3_pas" else {}
        named = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
        words = tokenizer([], named)
        ids = {name: words.convert_tokens_to_ids(token) for name, token in named.items()}
        text = dict(LLAMA, model_type="gemma3_text", vocab_size=len(words), sliding_window=512)
        config = transformers.Gemma3Config(
            vision_config=dict(CLIP_TOWER, model_type="siglip_vision_model", image_size=64, vision_use_head=False),
            text_config=text, mm_tokens_per_image=4, image_token_id=ids["image_token"],
            boi_token_id=ids["boi_token"], eoi_token_id=ids["eoi_token"], eos_token_id=1)
        processor = transformers.Gemma3Processor(
            image_processor=transformers.Gemma3ImageProcessor(size={"height": 64, "width": 64}, **scan),
            tokenizer=words,
            image_seq_length=4, chat_template=TEMPLATE.replace("IMAGE", "<start_of_image>"))
        return transformers.Gemma3ForConditionalGeneration(config), processor
    if kind.startswith("llava_next"):  # a 4 x 4-patch base image, then 32-px crops of its canvas unpadded, newline
        # tokens; "llava_next_video": LLaVA-NeXT-Video asked about an image, which it reads as LLaVA-NeXT does
        video = kind == "llava_next_video"
        words = tokenizer(["<image>", "<video>"] if video else ["<image>"])
        ids = dict(image_token_id=words.convert_tokens_to_ids("<image>"))
        if video:
            ids = dict(image_token_index=ids["image_token_id"],
                       video_token_index=words.convert_tokens_to_ids("<video>"))
        config = (transformers.LlavaNextVideoConfig if video else transformers.LlavaNextConfig)(
            vision_config=CLIP_TOWER, text_config=dict(LLAMA, vocab_size=len(words)),
            image_grid_pinpoints=NEXT_PINPOINTS, **ids)
        images = transformers.LlavaNextImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                                      image_grid_pinpoints=NEXT_PINPOINTS)
        extra = dict(video_processor=transformers.LlavaNextVideoVideoProcessor(
            size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})) if video else {}
        processor = (transformers.LlavaNextVideoProcessor if video else transformers.LlavaNextProcessor)(
            image_processor=images, tokenizer=words, patch_size=8, vision_feature_select_strategy="default",
            num_additional_image_tokens=1,
            chat_template=TEMPLATE.replace("IMAGE", "<image>").replace("VIDEO", "<video>"), **extra)
        return (transformers.LlavaNextVideoForConditionalGeneration if video
                else transformers.LlavaNextForConditionalGeneration)(config), processor
    if kind.startswith("llava_onevision"):  # NeXT's canvas over SigLIP (no CLS); "_2": shrunk past anyres_max_2;
        # "_video": 40-px frames, 5 x 5 patches resized to 3 x 3 tokens (bilinear, not a whole factor)
        aspect = "anyres_max_2" if kind.endswith("_2") else "anyres_max_9"
        side = 40 if kind.endswith("_video") else 32
        words = tokenizer(["<image>", "<video>"])
        tower = dict(CLIP_TOWER, model_type="siglip_vision_model", vision_use_head=False, image_size=side)
        config = transformers.LlavaOnevisionConfig(
            vision_config=tower, text_config=dict(LLAMA, model_type="qwen2", vocab_size=len(words)),
            image_token_id=words.convert_tokens_to_ids("<image>"),
            video_token_id=words.convert_tokens_to_ids("<video>"),
            image_grid_pinpoints=NEXT_PINPOINTS, vision_aspect_ratio=aspect, eos_token_id=1)
        images = transformers.LlavaOnevisionImageProcessor(size={"height": side, "width": side},
                                                           image_grid_pinpoints=NEXT_PINPOINTS)
        processor = transformers.LlavaOnevisionProcessor(
            image_processor=images, tokenizer=words, num_image_tokens=(side // 8) ** 2,
            video_processor=transformers.LlavaOnevisionVideoProcessor(size={"height": side, "width": side}),
            vision_feature_select_strategy="full", vision_aspect_ratio=aspect,
            chat_template=TEMPLATE.replace("IMAGE", "<image>").replace("VIDEO", "<video>"))
        return transformers.LlavaOnevisionForConditionalGeneration(config), processor
    if kind.startswith("llava"):
        strategy = "full" if kind == "llava_full" else "default"  # "full": CLIP's CLS is an image token too
        words = tokenizer(["<image>"])
        config = transformers.LlavaConfig(vision_config=CLIP_TOWER, text_config=dict(LLAMA, vocab_size=len(words)),
                                          image_token_id=words.convert_tokens_to_ids("<image>"),
                                          vision_feature_select_strategy=strategy)
        images = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        processor = transformers.LlavaProcessor(image_processor=images, tokenizer=words, patch_size=8,
                                                vision_feature_select_strategy=strategy,
                                                num_additional_image_tokens=1,
                                                chat_template=TEMPLATE.replace("IMAGE", "<image>"))
        return transformers.LlavaForConditionalGeneration(config), processor
    if kind == "gemma3n":  # Gemma 3n: timm's MobileNetV5 tower (its smallest, channels x 1/8), whose multi-scale
        # fusion gives a fixed 16 x 16 grid of image tokens; a language model with AltUp, per-layer inputs and its last
        # two layers reusing the keys of the last two before them (KV sharing); an audio tower beside
        return _gemma3n()
    if kind == "molmo2":  # Molmo 2: a tower no port reads (its config declares it), 32-px crops of 4 x 4 patches
        # overlapping by a patch each side, each canvas patch read from one crop, pooled 2 x 2 into a token as
        # image_token_pooling says; the whole image resized to one crop first (the overview), column tokens after
        # each row
        specials = ["<im_patch>", "<im_col>", "<im_start>", "<low_res_im_start>", "<frame_start>", "<im_end>",
                    "<frame_end>", "<im_low>"]
        words = tokenizer(specials, named={"image_token": "<|image|>", "video_token": "<|video|>"}, bos="<s>")
        ids = {token: words.convert_tokens_to_ids(token) for token in specials}
        text = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=len(words),
                    additional_vocab_size=4, num_hidden_layers=2, intermediate_size=48, max_position_embeddings=512)
        vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
                      num_key_value_heads=2, head_dim=16, image_size=[32, 32], patch_size=8, num_position_embeddings=16)
        adapter = dict(vision_feature_layer=[-1], hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
                       head_dim=16, intermediate_size=48, text_hidden_size=32)
        config = transformers.Molmo2Config(
            vision_config=vision, adapter_config=adapter, text_config=text, image_start_token_id=ids["<im_start>"],
            low_res_image_start_token_id=ids["<low_res_im_start>"], image_end_token_id=ids["<im_end>"],
            image_patch_id=ids["<im_patch>"], frame_start_token_id=ids["<frame_start>"],
            frame_end_token_id=ids["<frame_end>"], eos_token_id=1)
        square = {"height": 32, "width": 32}
        processor = transformers.Molmo2Processor(
            image_processor=transformers.Molmo2ImageProcessor(size=square, patch_size=8, max_crops=4,
                                                              overlap_margins=[1, 1], pooling_size=[2, 2]),
            video_processor=transformers.Molmo2VideoProcessor(patch_size=8, size=square), tokenizer=words,
            chat_template=TEMPLATE.replace("IMAGE", "<|image|>").replace("VIDEO", "<|video|>"))
        return transformers.Molmo2ForConditionalGeneration(config), processor
    if kind == "florence2":  # Florence-2: a DaViT tower no port reads (its config declares it), four stages of
        # strides 4, 2, 2, 2 (a 128-px image: a 4 x 4 grid), its projector's grid mean first; BART's encoder reads the
        # image's tokens and the question, its decoder writes the answer, cross-attending to them; no chat template
        words = tokenizer(["<image>", "<s>"], named={"image_token": "<image>"}, bos="<s>")
        start = words.convert_tokens_to_ids("<s>")
        text = dict(model_type="bart", vocab_size=len(words), d_model=32, encoder_layers=2, decoder_layers=2,
                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48,
                    max_position_embeddings=256, bos_token_id=start, eos_token_id=1, pad_token_id=1,
                    decoder_start_token_id=start, forced_eos_token_id=None)
        vision = dict(depths=[1, 1, 1, 1], embed_dim=[8, 16, 16, 32], num_heads=[1, 2, 2, 4], num_groups=[1, 2, 2, 4],
                      window_size=2, projection_dim=32, max_position_embeddings=8, max_temporal_embeddings=4)
        config = transformers.Florence2Config(vision_config=vision, text_config=text,
                                              image_token_id=words.convert_tokens_to_ids("<image>"))
        images = transformers.CLIPImageProcessor(size={"height": 128, "width": 128}, do_center_crop=False)
        images.image_seq_length = 1 + 4 * 4
        return (transformers.Florence2ForConditionalGeneration(config),
                transformers.Florence2Processor(image_processor=images, tokenizer=words))
    if kind == "mllama":  # Llama 3.2 Vision: a tower no port reads (its config declares it), 32-px tiles of 4 x 4
        # patches and a CLS each, up to 4 tiles of the canvas (no global image), read by the language model's
        # cross-attention layers (1 and 3 of 4), one <|image|> placeholder in the sequence
        words = tokenizer(["<|image|>", "<|python_tag|>"], bos="<|begin_of_text|>")
        text = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=len(words) + 1, max_position_embeddings=256,
                    cross_attention_layers=[1, 3], eos_token_id=1, pad_token_id=1,
                    bos_token_id=words.convert_tokens_to_ids("<|begin_of_text|>"))
        vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_global_layers=1,
                      attention_heads=2, image_size=32, patch_size=8, max_num_tiles=4, vision_output_dim=64,
                      intermediate_layers_indices=[0],
                      supported_aspect_ratios=[[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]])
        config = transformers.MllamaConfig(vision_config=vision, text_config=text,
                                           image_token_index=words.convert_tokens_to_ids("<|image|>"))
        images = transformers.MllamaImageProcessor(size={"height": 32, "width": 32}, max_image_tiles=4)
        return (transformers.MllamaForConditionalGeneration(config),
                transformers.MllamaProcessor(image_processor=images, tokenizer=words,
                                             chat_template=TEMPLATE.replace("IMAGE", "<|image|>")))
    if kind.startswith("llama4"):  # Llama 4: a tower no port reads (its config declares it), 32-px tiles of 4 x 4
        # patches, each pixel-shuffled 2 x 2 into 2 x 2 image tokens (its CLS dropped), a language model of experts
        # every other layer, chunked attention and NoPE layers; "llama4" reads one tile, "llama4_tiles" cuts an
        # image into up to 4 tiles of its canvas and a global image after them
        specials = ["<|image_start|>", "<|image_end|>", "<|image|>", "<|patch|>", "<|tile_x_separator|>",
                    "<|tile_y_separator|>"]
        words = tokenizer(specials)
        ids = {token: words.convert_tokens_to_ids(token) for token in specials}
        text = dict(hidden_size=32, intermediate_size=48, intermediate_size_mlp=48, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=len(words),
                    max_position_embeddings=256, num_local_experts=2, interleave_moe_layer_step=2,
                    attention_chunk_size=17, no_rope_layers=[1, 1, 1, 0], eos_token_id=1, pad_token_id=1)
        # chunks of 17 tokens: the one tile's 13-token prompt and its answer in the first chunk, which the cache's
        # window (17 - 1 keys kept) outgrows; the tiles' 33-token prompt in the second, which holds the last tiles'
        # tokens and the global image's
        # its pixel shuffle's MLP reads intermediate_size channels: hidden_size x 4 (1,408 x 4 = 5,632 in Scout)
        vision = dict(hidden_size=32, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                      image_size=32, patch_size=8, pixel_shuffle_ratio=0.5, projector_input_dim=32,
                      projector_output_dim=32, vision_output_dim=32)
        config = transformers.Llama4Config(vision_config=vision, text_config=text,
                                           image_token_index=ids["<|patch|>"], boi_token_index=ids["<|image_start|>"],
                                           eoi_token_index=ids["<|image_end|>"], eos_token_id=1)
        images = transformers.Llama4ImageProcessor(size={"height": 32, "width": 32},
                                                   max_patches=4 if kind == "llama4_tiles" else 1)
        processor = transformers.Llama4Processor(image_processor=images, tokenizer=words, patch_size=8,
                                                 pixel_shuffle_ratio=0.5,
                                                 chat_template=TEMPLATE.replace("IMAGE", "<|image|>"))
        return transformers.Llama4ForConditionalGeneration(config), processor
    if kind in ("idefics3", "smolvlm"):  # a SigLIP-like tower no port reads (its config declares it): 32-px tiles of
        # 4 x 4 patches, each pixel-shuffled 2 x 2 into 2 x 2 image tokens, the image split into tiles (longest edge
        # 64 px) and the whole image resized to one tile after them
        specials = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
                    *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))]
        words = tokenizer(specials)
        smol = kind == "smolvlm"
        config = (transformers.SmolVLMConfig if smol else transformers.Idefics3Config)(
            vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                               image_size=32, patch_size=8),
            text_config=dict(LLAMA, vocab_size=len(words)), scale_factor=2,
            image_token_id=words.convert_tokens_to_ids("<image>"), eos_token_id=1)
        images = (transformers.SmolVLMImageProcessor if smol else transformers.Idefics3ImageProcessor)(
            size={"longest_edge": 64}, max_image_size={"longest_edge": 32}, do_image_splitting=True)
        # a clip's frames each resized to one 32-px view, as SmolVLM's video processor reads them
        extra = dict(video_processor=transformers.SmolVLMVideoProcessor(
            size={"longest_edge": 32}, max_image_size={"longest_edge": 32})) if smol else {}
        processor = (transformers.SmolVLMProcessor if smol else transformers.Idefics3Processor)(
            image_processor=images, tokenizer=words, image_seq_len=4,
            chat_template=TEMPLATE.replace("IMAGE", "<image>").replace("VIDEO", "<video>"), **extra)
        return (transformers.SmolVLMForConditionalGeneration if smol
                else transformers.Idefics3ForConditionalGeneration)(config), processor
    if kind in ("mistral3", "pixtral"):  # a Pixtral tower no port reads (its config declares it), 8-px patches, 2D
        # RoPE, the image kept at its aspect (longest edge 64 px), a row break token after each row of image tokens.
        # "mistral3": Mistral 3's patch merger joins 2 x 2 patches; "pixtral": Pixtral-12B, the tower under LLaVA
        # (each patch its token)
        merge = 2 if kind == "mistral3" else 1
        words = tokenizer(["[IMG]", "[IMG_BREAK]", "[IMG_END]"])
        text = dict(LLAMA, model_type="mistral", vocab_size=len(words))
        vision = dict(model_type="pixtral", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=2, head_dim=16, patch_size=8, image_size=64)
        images = transformers.PixtralImageProcessor(size={"longest_edge": 64}, patch_size={"height": 8, "width": 8})
        processor = transformers.PixtralProcessor(image_processor=images, tokenizer=words, patch_size=8,
                                                  spatial_merge_size=merge,
                                                  chat_template=TEMPLATE.replace("IMAGE", "[IMG]"))
        image_token = words.convert_tokens_to_ids("[IMG]")
        if kind == "pixtral":
            config = transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_id=image_token,
                                              vision_feature_layer=-1, vision_feature_select_strategy="full",
                                              eos_token_id=1)
            return transformers.LlavaForConditionalGeneration(config), processor
        config = transformers.Mistral3Config(vision_config=vision, text_config=text, image_token_index=image_token,
                                             spatial_merge_size=merge, eos_token_id=1)
        return transformers.Mistral3ForConditionalGeneration(config), processor
    if kind.startswith("glm4"):  # GLM-4.1V: a tower no port reads (its config declares it), 14-px patches merged
        # 2 x 2 by a convolution, M-RoPE over half of each head (partial_rotary_factor 0.5); "glm4v_moe" (GLM-4.5V):
        # the same tower beside a language model of experts; "glm46v" (GLM-4.6V): GLM-4.1V's two parts by AutoModel
        from transformers.models.glm4v.image_processing_glm4v import Glm4vImageProcessor

        words = tokenizer(GLM_SPECIALS)
        ids = {token: words.convert_tokens_to_ids(token) for token in GLM_SPECIALS}
        text = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=16, vocab_size=len(words), max_position_embeddings=256,
                    rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0,
                                     "partial_rotary_factor": 0.5})
        vision = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=32, patch_size=14,
                      image_size=56, spatial_merge_size=2)
        config, model, processor = {
            "glm4v": (transformers.Glm4vConfig, transformers.Glm4vForConditionalGeneration,
                      transformers.Glm4vProcessor),
            "glm4v_moe": (transformers.Glm4vMoeConfig, transformers.Glm4vMoeForConditionalGeneration,
                          transformers.Glm4vProcessor),
            "glm46v": (transformers.Glm46VConfig, transformers.Glm46VForConditionalGeneration,
                       transformers.Glm46VProcessor)}[kind]
        if kind == "glm4v_moe":
            text.update(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=1)
        if kind == "glm46v":
            text, vision = dict(text, model_type="glm4v_text"), dict(vision, model_type="glm4v_vision")
        config = config(
            vision_config=vision, text_config=text, image_token_id=ids["<|image|>"], video_token_id=ids["<|video|>"],
            image_start_token_id=ids["<|begin_of_image|>"], image_end_token_id=ids["<|end_of_image|>"],
            video_start_token_id=ids["<|begin_of_video|>"], video_end_token_id=ids["<|end_of_video|>"], eos_token_id=1)
        processor = processor(
            image_processor=Glm4vImageProcessor(min_pixels=56 * 56, max_pixels=28 * 28 * 40, patch_size=14,
                                                merge_size=2),
            tokenizer=words, video_processor=transformers.Glm4vVideoProcessor(),
            chat_template=TEMPLATE.replace("IMAGE", "<|begin_of_image|><|image|><|end_of_image|>").replace(
                "VIDEO", "<|begin_of_video|><|video|><|end_of_video|>"))
        return model(config), processor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    words = tokenizer(QWEN_SPECIALS)
    ids = {token: words.convert_tokens_to_ids(token) for token in QWEN_SPECIALS}
    template = TEMPLATE.replace("IMAGE", "<|vision_start|><|image_pad|><|vision_end|>").replace(
        "VIDEO", "<|vision_start|><|video_pad|><|vision_end|>")
    if kind.startswith("qwen3_5"):  # Qwen3.5: a Qwen3-VL-like tower its config declares, beside a hybrid language
        # model whose linear-attention layers (the gated delta rule) alternate with attention layers; "_moe": its MLPs
        # experts
        text = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=8, vocab_size=len(words), max_position_embeddings=256,
                    layer_types=["linear_attention", "full_attention"] * 2, linear_num_key_heads=2,
                    linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                    rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0,
                                     "mrope_interleaved": True, "partial_rotary_factor": 1.0})
        moe = kind == "qwen3_5_moe"
        if moe:
            text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                        shared_expert_intermediate_size=16)
        config = (transformers.Qwen3_5MoeConfig if moe else transformers.Qwen3_5Config)(
            vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=32,
                               num_position_embeddings=64),
            text_config=text, image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"], eos_token_id=1)
        processor = qwen3_processor(words, template)
        return (transformers.Qwen3_5MoeForConditionalGeneration if moe
                else transformers.Qwen3_5ForConditionalGeneration)(config), processor
    if kind in ("qwen3_vl", "qwen3_vl_moe"):  # 16-px patches, interleaved M-RoPE, DeepStack
        text = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=8, vocab_size=len(words), max_position_embeddings=256,
                    rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0,
                                     "mrope_interleaved": True})
        moe = kind == "qwen3_vl_moe"  # Qwen3-VL's tower beside a language model of experts (issue 92)
        if moe:
            text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, decoder_sparse_step=1)
        config = (transformers.Qwen3VLMoeConfig if moe else transformers.Qwen3VLConfig)(
            vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=32,
                               num_position_embeddings=64, deepstack_visual_indexes=[0]),
            text_config=text, image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"], eos_token_id=1)
        processor = qwen3_processor(words, template)
        return (transformers.Qwen3VLMoeForConditionalGeneration if moe
                else transformers.Qwen3VLForConditionalGeneration)(config), processor
    text = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=len(words), max_position_embeddings=256,
                rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0})
    if kind == "qwen2_vl":  # every tower layer global, LayerNorms, QuickGELU (issue 92)
        config = transformers.Qwen2VLConfig(
            vision_config=dict(depth=2, embed_dim=32, mlp_ratio=2, num_heads=2, hidden_size=32),
            text_config=text, image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"], eos_token_id=1)
        processor = transformers.Qwen2VLProcessor(
            image_processor=Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=28 * 28 * 40), tokenizer=words,
            video_processor=transformers.Qwen2VLVideoProcessor(), chat_template=template)
        return transformers.Qwen2VLForConditionalGeneration(config), processor
    config = transformers.Qwen2_5_VLConfig(
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=32,
                           fullatt_block_indexes=[1]),
        text_config=text, image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], eos_token_id=1)
    processor = transformers.Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=28 * 28 * 40), tokenizer=words,
        video_processor=transformers.Qwen2VLVideoProcessor(), chat_template=template)
    return transformers.Qwen2_5_VLForConditionalGeneration(config), processor


def _gemma3n():
    """Gemma 3n and its processor: its vocabulary the text's (64 words), then the vision tower's soft tokens, then the
    audio's (the vocab offsets its embeddings read), a word-level tokenizer placing its special tokens there."""
    size = 64
    named = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>",
             "boa_token": "<start_of_audio>", "eoa_token": "<end_of_audio>", "audio_token": "<audio_soft_token>"}
    vocab = {w: i for i, w in enumerate(WORDS)}
    vocab.update({"<start_of_image>": len(vocab), "<start_of_audio>": len(vocab) + 1})
    vocab.update({f"<unused{i}>": i for i in range(len(vocab), size)})
    vocab.update({"<end_of_image>": size, "<image_soft_token>": size + 1, "<end_of_audio>": size + 4,
                  "<audio_soft_token>": size + 5})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(named.values()))
    words = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="<pad>",
                                                 eos_token="<pad>", extra_special_tokens=named)
    ids = {name: words.convert_tokens_to_ids(token) for name, token in named.items()}
    text = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                head_dim=16, vocab_size=size + 8, vocab_size_per_layer_input=size, hidden_size_per_layer_input=8,
                altup_num_inputs=2, laurel_rank=4, num_kv_shared_layers=2, sliding_window=512,
                layer_types=["sliding_attention", "full_attention"] * 2, activation_sparsity_pattern=[0.0] * 4,
                max_position_embeddings=1024, eos_token_id=1, pad_token_id=1, bos_token_id=2)
    vision = dict(architecture="mobilenetv5_base", model_args={"channel_multiplier": 0.125}, hidden_size=2048,
                  vocab_size=4, vocab_offset=size)
    audio = dict(vocab_size=4, vocab_offset=size + 4, input_feat_size=16, hidden_size=16, conf_num_attention_heads=2,
                 conf_num_hidden_layers=1, sscp_conv_channel_size=[4, 4])
    config = transformers.Gemma3nConfig(
        text_config=text, vision_config=vision, audio_config=audio, vision_soft_tokens_per_image=256,
        audio_soft_tokens_per_image=4, boi_token_id=ids["boi_token"], eoi_token_id=ids["eoi_token"],
        image_token_id=ids["image_token"], boa_token_id=ids["boa_token"], eoa_token_id=ids["eoa_token"],
        audio_token_id=ids["audio_token"])
    processor = transformers.Gemma3nProcessor(
        feature_extractor=transformers.Gemma3nAudioFeatureExtractor(),
        image_processor=transformers.SiglipImageProcessor(size={"height": 128, "width": 128}), tokenizer=words,
        chat_template=TEMPLATE.replace("IMAGE", "<image_soft_token>"), image_seq_length=256, audio_seq_length=4)
    return transformers.Gemma3nForConditionalGeneration(config), processor


def noisy(model: torch.nn.Module) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.3)
    return model.eval()


def saved_whole(tmp_path_factory, kinds) -> dict:
    """``{kind: folder}``: each VLM of ``kinds`` built (seed 0), saved whole in many shards with its processor."""
    built = {}
    for kind in kinds:
        torch.manual_seed(0)
        model, processor = _build(kind)
        folder = tmp_path_factory.mktemp(kind)
        noisy(model).save_pretrained(folder, max_shard_size="20KB")
        processor.save_pretrained(folder)
        built[kind] = folder
    return built


@pytest.fixture(scope="module")
def vlms(tmp_path_factory):
    """``{kind: folder}``: each VLM saved whole in many shards with its processor."""
    return saved_whole(tmp_path_factory, KINDS)


def picture(width: int = 90, height: int = 70) -> Image.Image:
    return Image.fromarray(np.random.default_rng(3).integers(0, 256, (height, width, 3), dtype=np.uint8))


def eager_generate(folder, image: Image.Image, text: str | None = None, **images_kwargs):
    """transformers alone: the eager model and the processor from ``folder``, greedy ``generate`` with every step's
    attentions, and the prompt's input ids (``images_kwargs``: the processor's, as its call takes them)."""
    config = json.loads((folder / "config.json").read_text())
    model = getattr(transformers, config["architectures"][0]).from_pretrained(folder, attn_implementation="eager")
    # in the model's dtype, as transformers' examples pass them (Llama 4's processor gives bfloat16 pixels)
    inputs = processor_inputs(folder, image, text, **images_kwargs).to(dtype=model.dtype)
    with torch.no_grad():
        out = model.eval().generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_attentions=True,
                                    return_dict_in_generate=True)
    return out, inputs, model.config.image_token_id


def reference_processor(folder):
    """transformers' ``AutoProcessor.from_pretrained(folder)``, read once while the folder's files stay as they were
    (their names, sizes and times: a test that edits one reads it again). Each load parses the tokenizer and the
    processors' configs (~0.1 s of CPU), and ``processor_inputs`` alone asked ~60 times a run of this module for a
    dozen folders (issue 112). For reading (a decode, an image processor's settings), never to edit."""
    folder = Path(folder)
    files = tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in folder.iterdir() if f.is_file()))
    return _reference_processor(folder, files)


@functools.lru_cache(maxsize=32)
def _reference_processor(folder: Path, files: tuple):
    return transformers.AutoProcessor.from_pretrained(folder)


def processor_inputs(folder, image: Image.Image, text: str | None = None, **images_kwargs):
    """transformers alone: the processor's inputs for ``image`` and the question through its chat template."""
    processor = reference_processor(folder)
    if text is None and processor.chat_template is None:  # PaliGemma's prompt: its processor adds bos and newline
        text = processor.image_token + QUESTION
    elif text is None:
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True)
    return processor(images=[image], text=text, return_tensors="pt", **images_kwargs)


def eager_image_rows(out, i: int, layer: int, positions: torch.Tensor) -> np.ndarray:
    """(H, len(positions)): answer token ``i``'s query row at ``layer`` of transformers' eager ``generate`` over the
    image's ``positions``. A sliding or chunked layer's cache hands the attention its last keys alone (Llama 4's
    chunked layers: ``DynamicSlidingWindowLayer``), its row's last key the query's own: a position before them was
    not read (0)."""
    row = out.attentions[i][layer][0, :, -1]  # (H, keys)
    seen = out.attentions[0][layer].shape[-2] + i  # the prompt's positions and the answer's so far
    index = positions - (seen - row.shape[-1])
    return torch.where(index >= 0, row[:, index.clamp(min=0)], 0).numpy()


def by_hand(row: np.ndarray, grid: tuple[int, int], unit: int, lead: int) -> np.ndarray:
    """Each image token's value written into every patch its unit covers, units row-major after ``lead`` tokens."""
    gh, gw = grid
    placed = np.zeros(grid, dtype=np.float32)
    for r in range(gh):
        for c in range(gw):
            placed[r, c] = row[lead + (r // unit) * (gw // unit) + c // unit]
    return placed


# (unit, lead): patches per image token along each side, image tokens before the patches'
LAYOUT = {"llava": (1, 0), "llava_full": (1, 1), "qwen2_vl": (2, 0), "qwen2_5_vl": (2, 0), "qwen3_vl": (2, 0),
          "qwen3_vl_moe": (2, 0), "glm4v": (2, 0), "glm4v_moe": (2, 0), "glm46v": (2, 0),
          "mistral3": (2, 0), "pixtral": (1, 0), "qwen3_5": (2, 0),
          "qwen3_5_moe": (2, 0), "llama4": (2, 0), "gemma3n": (1, 0),
          "gemma3": (4, 0), "paligemma": (1, 0), "paligemma2": (1, 0), "internvl": (2, 0)}


@pytest.fixture(scope="module")
def answers(vlms):
    """``{kind: (vit's answer, transformers' eager generate output, the prompt's input ids, image token id)}``."""
    image = picture()
    return {kind: (vit.ask_vlm(vit.open_vlm(folder), image, QUESTION, max_new_tokens=NEW_TOKENS),
                   *eager_generate(folder, image)) for kind, folder in vlms.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_the_answer_is_generates_greedy_answer_token_for_token(vlms, answers, kind):
    answer, out, inputs, _ = answers[kind]
    expected = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    assert list(answer.tokens) == expected and len(expected) == NEW_TOKENS
    processor = reference_processor(vlms[kind])
    assert answer.text == processor.decode(expected, skip_special_tokens=True) and answer.text.strip()
    assert answer.pieces == tuple(processor.decode([t]) for t in expected)


@pytest.mark.parametrize("kind", KINDS)
def test_the_answer_is_streamed_token_by_token_as_generate_chooses_them(vlms, answers, kind):
    """``on_token`` is given the answer so far after each token: its ids are ``generate``'s first k, its text their
    decoding; the last is the answer returned. (transformers' greedy run of the same folder, picture and question:
    the ``answers`` fixture's.)"""
    streamed = []
    answer = vit.ask_vlm(vlms[kind], picture(), QUESTION, max_new_tokens=NEW_TOKENS,
                         on_token=lambda tokens, text: streamed.append((tokens, text)))
    _, out, inputs, _ = answers[kind]
    expected = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    processor = reference_processor(vlms[kind])
    assert [list(tokens) for tokens, _ in streamed] == [expected[:k] for k in range(1, NEW_TOKENS + 1)]
    assert [text for _, text in streamed] == [processor.decode(expected[:k], skip_special_tokens=True)
                                              for k in range(1, NEW_TOKENS + 1)]
    assert streamed[-1] == (answer.tokens, answer.text) and answer.stopped is None


@pytest.mark.parametrize("kind", ["llava", "qwen2_5_vl"])
def test_a_stop_after_k_tokens_keeps_k_tokens_whose_maps_are_the_whole_runs(vlms, answers, kind):
    """A ``Stop`` raised by ``progress`` once k tokens are done ends the generation there: the answer keeps
    ``generate``'s first k tokens, each token's attention is transformers' eager row of the whole run (the
    ``answers`` fixture's, of the same folder, picture and question), and its relevance and TAM are those of the
    whole answer's token."""
    from vit.core.progress import Stop
    from vit.explain.language.vlm_answer import generate_answer, prepare

    k, told = 2, []

    def stop_at_k(done, total):
        told.append((done, total))
        if done == k:
            raise Stop("stopped by the test")

    vlm = vit.open_vlm(vlms[kind])
    answer = generate_answer(vlm, prepare(vlm, picture(), QUESTION, max_new_tokens=NEW_TOKENS), stop_at_k)
    _, out, inputs, image_token = answers[kind]
    assert told == [(i, NEW_TOKENS) for i in range(k + 1)]
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()[:k]
    assert answer.stopped == "stopped by the test" and len(answer.pieces) == k
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    unit, lead = LAYOUT[kind]
    for i in range(k):
        for layer in range(answer.layers):
            rows = out.attentions[i][layer][0, :, -1, positions].numpy()  # (H, lead + N): step i's query
            for head in range(rows.shape[0]):
                np.testing.assert_allclose(answer.attention(i, layer, head),
                                           by_hand(rows[head], answer.grid, unit, lead), rtol=0, atol=ATOL)
    whole = answers[kind][0]  # vit.ask_vlm of the same folder, picture and question, not stopped
    np.testing.assert_allclose(answer.relevance(k - 1), whole.relevance(k - 1), rtol=0, atol=1e-6)
    np.testing.assert_allclose(answer.tam(k - 1), whole.tam(k - 1), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=rf"^answer token {k} does not exist: the answer has {k} tokens"):
        answer.attention(k)


def test_a_stop_before_the_first_token_keeps_nothing(vlms, monkeypatch):
    from vit.core.progress import Stop
    from vit.explain.language.vlm_answer import generate_answer, prepare

    vlm = vit.open_vlm(vlms["llava"])
    prepared = prepare(vlm, picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    monkeypatch.setattr(vlm.model, "generate", lambda *a, **k: pytest.fail("the model ran"))

    def stop(done, total):
        raise Stop("stopped at once")

    with pytest.raises(Stop, match="stopped at once"):
        generate_answer(vlm, prepared, stop)


@pytest.mark.parametrize("kind", KINDS)
def test_each_tokens_attention_is_the_eager_row_placed_through_the_models_layout(answers, kind):
    answer, out, inputs, image_token = answers[kind]
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    unit, lead = LAYOUT[kind]
    grid = answer.grid
    assert len(positions) == lead + (grid[0] // unit) * (grid[1] // unit)
    for i in range(NEW_TOKENS):
        for layer in range(answer.layers):
            rows = eager_image_rows(out, i, layer, positions)  # (H, lead + N): step i's query
            for head in range(rows.shape[0]):
                np.testing.assert_allclose(answer.attention(i, layer, head), by_hand(rows[head], grid, unit, lead),
                                           rtol=0, atol=ATOL)
            np.testing.assert_allclose(answer.attention(i, layer), by_hand(rows.mean(0), grid, unit, lead),
                                       rtol=0, atol=ATOL)


def _differs(a: np.ndarray, b: np.ndarray) -> bool:
    return not np.allclose(a, b, rtol=0, atol=1e-4)


def test_llavas_cls_image_token_covers_no_patch(answers):
    """Under LLaVA's "full" strategy the first image token is CLIP's CLS: the patches are the tokens after it, and
    the layout taken row-major from the first image token would be another map."""
    answer, out, inputs, image_token = answers["llava_full"]
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    rows = out.attentions[2][1][0, :, -1, positions].numpy().mean(0)  # (1 + 16,)
    assert answer.grid == (4, 4) and rows.shape == (17,)
    np.testing.assert_allclose(answer.attention(2, 1), rows[1:].reshape(4, 4), rtol=0, atol=ATOL)
    assert _differs(answer.attention(2, 1), rows[:16].reshape(4, 4))  # row-major from the CLS
    np.testing.assert_allclose(answer.image_rows(2, 1)[:, 0].numpy(),
                               out.attentions[2][1][0, :, -1, positions[0]].numpy(), rtol=0, atol=ATOL)


def test_qwens_image_tokens_are_merge_units_row_major(answers):
    """Qwen2.5-VL's image tokens are its 2 x 2 merge units, row-major (the tower's window order undone before the
    merger): on a 4 x 6 patch grid, 2 x 3 units; the units taken column-major would be another map."""
    answer, out, inputs, image_token = answers["qwen2_5_vl"]
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    assert answer.grid == (4, 6) and len(positions) == 6
    for i in range(NEW_TOKENS):
        rows = out.attentions[i][-1][0, :, -1, positions].numpy().mean(0)  # (6,)
        units = rows.reshape(2, 3)
        np.testing.assert_allclose(answer.attention(i, -1), np.kron(units, np.ones((2, 2))), rtol=0, atol=ATOL)
        assert _differs(answer.attention(i, -1), np.kron(rows.reshape(3, 2).T, np.ones((2, 2))))  # column-major


def test_glms_image_tokens_are_merge_units_row_major_from_a_tower_its_config_declares(answers, vlms):
    """GLM-4.1V's tower has no port here: the answer places its image tokens from what the config declares (14-px
    patches, 2 x 2 merge units) over the processor's ``image_grid_thw``: on a 6 x 8 patch grid, 3 x 4 units
    row-major; taken column-major they would be another map. ``vit.load`` itself refuses the folder in one line."""
    from vit.sources.vlm.declared import DeclaredTower

    answer, out, inputs, image_token = answers["glm4v"]
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    assert answer.grid == (6, 8) and len(positions) == 12 and inputs["image_grid_thw"].tolist() == [[1, 6, 8]]
    assert isinstance(vit.open_vlm(vlms["glm4v"]).tower, DeclaredTower)
    for i in range(NEW_TOKENS):
        rows = out.attentions[i][-1][0, :, -1, positions].numpy().mean(0)  # (12,)
        np.testing.assert_allclose(answer.attention(i, -1), np.kron(rows.reshape(3, 4), np.ones((2, 2))), rtol=0,
                                   atol=ATOL)
        assert _differs(answer.attention(i, -1), np.kron(rows.reshape(4, 3).T, np.ones((2, 2))))  # column-major
    from vit.checkpoint import CheckpointError

    with pytest.raises(CheckpointError) as refused:
        vit.load(vlms["glm4v"], device="cpu")
    assert "\n" not in str(refused.value) and "glm4v has no port here" in str(refused.value)
    assert str(refused.value).endswith("it answers questions about an image as transformers builds it: "
                                       "vit.ask_vlm(folder, image, question), vit-predict --ask")


@pytest.mark.parametrize("kind", ["mistral3", "pixtral"])
def test_pixtrals_image_tokens_are_its_rows_without_their_breaks(vlms, kind):
    """A Pixtral tower (no port here: its config declares it) reads the image at its aspect; the prompt holds a row
    of image tokens per row of merge units (Mistral 3: 2 x 2 patches; Pixtral-12B under LLaVA: one patch), each row
    followed by a break token that covers no patch. Placed row-major on the patch grid the processor's
    ``image_sizes`` give (a wide image: 64 x 32 px); taken column-major they would be another map."""
    image = picture(120, 40)
    answer = vit.ask_vlm(vlms[kind], image, QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, image_token = eager_generate(vlms[kind], image)
    unit = LAYOUT[kind][0]
    height, width = (int(v) for v in inputs["image_sizes"][0])
    grid = (height // 8, width // 8)
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    rows, cols = grid[0] // unit, grid[1] // unit
    assert answer.grid == grid and grid[0] != grid[1] and len(positions) == rows * cols
    gaps = positions[1:] - positions[:-1]  # a row's tokens side by side, one break token between rows
    assert gaps.tolist() == [2 if (k + 1) % cols == 0 else 1 for k in range(len(positions) - 1)]
    for i in range(NEW_TOKENS):
        row = out.attentions[i][-1][0, :, -1, positions].numpy().mean(0)
        np.testing.assert_allclose(answer.attention(i, -1), np.kron(row.reshape(rows, cols), np.ones((unit, unit))),
                                   rtol=0, atol=ATOL)
        assert _differs(answer.attention(i, -1), np.kron(row.reshape(cols, rows).T, np.ones((unit, unit))))


def test_a_hybrid_language_models_maps_are_its_attention_layers_and_its_states_are_counted(answers, vlms):
    """Qwen3.5's decoder alternates linear-attention layers (the gated delta rule: a recurrent state, no attention
    over the tokens) with attention layers: the answer's layers are the 2 attention layers of its 4, as transformers'
    output_attentions numbers them (their rows equal: ``test_each_tokens_attention_is_the_eager_row...``); the cost
    counts a KV cache for those and each linear layer's recurrent and convolution states (by hand from the config:
    value heads x key dim x value dim float32, and (2 x key heads x key dim + value heads x value dim) x kernel)."""
    from vit.explain.language.vlm_answer import text_shape

    answer, out, _, _ = answers["qwen3_5"]
    assert answer.layers == len(out.attentions[0]) == 2
    text = text_shape(vit.open_vlm(vlms["qwen3_5"]))
    assert text.layers == 2 and text.state_bytes == 2 * (2 * 8 * 8 * 4 + (2 * 2 * 8 + 2 * 8) * 4 * 4)
    with pytest.raises(ValueError, match=r"^layer 2 does not exist: the language model has 2 layers"):
        answer.attention(0, 2)


def test_predict_ask_refuses_a_hybrids_rollout_before_answering(vlms, tmp_path, capsys, monkeypatch):
    """``--lm-method gradxattn_rollout`` on a hybrid language model is refused in one line before the answer is
    generated, nothing written; its layers' gradient x attention is written."""
    from vit.predict import main

    picture().save(tmp_path / "photo.png")
    vlm_class = transformers.Qwen3_5ForConditionalGeneration
    generate = vlm_class.generate
    monkeypatch.setattr(vlm_class, "generate", lambda *a, **k: pytest.fail("the model answered"))
    assert main([str(vlms["qwen3_5"]), str(tmp_path / "photo.png"), "--ask", QUESTION, "--max-new-tokens", "2",
                 "--save-maps", str(tmp_path / "maps"), "--lm-method", "gradxattn_rollout", "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the rollout multiplies every layer's attention" in err
    assert not (tmp_path / "maps" / "photo.npz").exists()
    monkeypatch.setattr(vlm_class, "generate", generate)
    assert main([str(vlms["qwen3_5"]), str(tmp_path / "photo.png"), "--ask", QUESTION, "--max-new-tokens", "2",
                 "--save-maps", str(tmp_path / "maps"), "--lm-method", "gradxattn", "--device", "cpu"]) == 0
    [record] = json.loads(capsys.readouterr().out)
    assert np.load(record["maps"]["npz"])["gradxattn"].shape[:2] == (2, 2)  # 2 tokens x its 2 attention layers


def test_only_query_rows_are_kept_never_a_layers_attention(answers):
    """What the answer keeps per layer and token is the query row that predicted it, (heads, head dim), and the KV
    cache the generation held anyway: never a T x T attention."""
    answer, _, inputs, _ = answers["qwen2_5_vl"]
    recorder = answer._recorder
    assert len(recorder.queries) == answer.layers == 2
    assert all(q.shape == (4, 8) for layer in recorder.queries for q in layer)
    assert [s for s in recorder.seen[0]] == [inputs["input_ids"].shape[1] + i for i in range(NEW_TOKENS)]


@pytest.mark.parametrize("kind", ["llava", "glm4v"])  # GLM-4.1V's tower counted from what its config declares
def test_the_cost_is_counted_before_any_forward(vlms, monkeypatch, kind):
    from vit.explain.language import vlm_inputs

    vlm = vit.open_vlm(vlms[kind])
    monkeypatch.setattr(vlm.model, "generate", lambda *a, **k: pytest.fail("the model ran"))
    # the processor's work, counted before it runs, is past so small a bound too (test_vlm_clip_work): not asked here
    monkeypatch.setattr(vlm_inputs, "check_processor", lambda *a, **k: None)
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.01")
    with pytest.raises(TooManyTokens, match=r"^Answering 5 tokens to a prompt of \d+ tokens .* over the 0 MB limit "
                                            r"\(VIT_ANALYSIS_MEMORY_MB\); ask for fewer tokens or a smaller image\.$"):
        vit.ask_vlm(vlm, picture(), QUESTION, max_new_tokens=NEW_TOKENS)


def test_a_raw_prompt_bypasses_the_chat_template(vlms):
    image, text = picture(), "<image> what is the dog ?"
    answer = vit.ask_vlm(vlms["llava"], image, prompt=text, max_new_tokens=NEW_TOKENS)  # a folder: opened for it
    out, inputs, _ = eager_generate(vlms["llava"], image, text)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    assert answer.prompt_tokens == inputs["input_ids"].shape[1]


@pytest.mark.parametrize(("call", "message"), [
    (dict(question=QUESTION, prompt="<image> hi"), r"^give a question .* or prompt= .*, not both$"),
    (dict(prompt="no image here"), r"^prompt= must hold the model's image placeholder '<image>' once, got 0$"),
    (dict(question=QUESTION, max_new_tokens=0), r"^max_new_tokens must be a whole number from 1 to 512, got 0$"),
])
def test_a_wrong_question_is_refused_in_one_line(vlms, call, message):
    vlm = vit.open_vlm(vlms["llava"])
    with pytest.raises(ValueError, match=message):
        vit.ask_vlm(vlm, picture(), **call)


def test_a_token_layer_or_head_that_does_not_exist_is_refused_in_one_line(answers):
    answer = answers["llava"][0]
    with pytest.raises(ValueError, match=r"^answer token 5 does not exist: the answer has 5 tokens, numbered 0 to 4$"):
        answer.attention(5)
    with pytest.raises(ValueError, match=r"^layer 2 does not exist: the language model has 2 layers"):
        answer.attention(0, 2)
    with pytest.raises(ValueError, match=r"^head 4 does not exist: the language model has 4 heads"):
        answer.attention(0, 0, 4)


def test_a_folder_that_is_no_generating_vlm_is_refused_in_one_line(tmp_path):
    from vit.sources.vlm.whole_vlm import VLMError

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit", "architectures": ["ViTModel"]}))
    with pytest.raises(VLMError, match=r"is a 'vit' model, which transformers' image-text-to-text auto-mapping "
                                       r"\(AutoModelForImageTextToText\) does not hold; asking a question reads a "
                                       r"generating vision-language model: llava, llava_next, .*, gemma3n, \.\.\.$"):
        vit.open_vlm(tmp_path)


def test_predict_ask_writes_the_answer_and_each_tokens_maps(vlms, answers, tmp_path, capsys):
    from vit.predict import main

    picture().save(tmp_path / "photo.png")
    maps = tmp_path / "maps"
    assert main([str(vlms["qwen2_5_vl"]), str(tmp_path / "photo.png"), "--ask", QUESTION, "--max-new-tokens",
                 str(NEW_TOKENS), "--save-maps", str(maps), "--device", "cpu"]) == 0
    [record] = json.loads(capsys.readouterr().out)
    answer, out, inputs, image_token = answers["qwen2_5_vl"]
    assert record["tokens"] == list(answer.tokens) and record["answer"] == answer.text
    saved = np.load(record["maps"]["npz"])
    assert saved["attention"].shape == (NEW_TOKENS, 2, 4, 4, 6) and tuple(saved["grid"]) == (4, 6)
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    for i in range(NEW_TOKENS):
        for layer in range(2):
            rows = out.attentions[i][layer][0, :, -1, positions].numpy()  # (H, 6)
            for head in range(4):
                np.testing.assert_allclose(saved["attention"][i, layer, head], by_hand(rows[head], (4, 6), 2, 0),
                                           rtol=0, atol=ATOL)
            np.testing.assert_allclose(saved["image_share"][i, layer], rows.sum(-1), rtol=0, atol=ATOL)
    assert saved["tam"].shape == (NEW_TOKENS, 4, 6) and "gradxattn" not in saved  # TAM by default, relevance asked
    for i in range(NEW_TOKENS):  # the API's TAM (test_vlm_tam checks it against the authors' function)
        np.testing.assert_allclose(saved["tam"][i], answer.tam(i), rtol=0, atol=1e-6)


def test_predict_ask_answers_with_a_tower_its_config_declares(vlms, answers, tmp_path, capsys):
    """GLM-4.1V's folder (no tower port, ``vit.load`` refuses it) answers on the command line as in the API: the
    tokens generate chose, each token's eager rows on its 6 x 8 grid of 14-px patches."""
    from vit.predict import main

    picture().save(tmp_path / "photo.png")
    assert main([str(vlms["glm4v"]), str(tmp_path / "photo.png"), "--ask", QUESTION, "--max-new-tokens",
                 str(NEW_TOKENS), "--save-maps", str(tmp_path / "maps"), "--device", "cpu"]) == 0
    [record] = json.loads(capsys.readouterr().out)
    answer, out, inputs, image_token = answers["glm4v"]
    assert record["tokens"] == list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    saved = np.load(record["maps"]["npz"])
    assert saved["attention"].shape == (NEW_TOKENS, 2, 2, 6, 8) and tuple(saved["grid"]) == (6, 8)
    assert tuple(saved["patch_size"]) == (14, 14)
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    for i in range(NEW_TOKENS):
        rows = out.attentions[i][-1][0, :, -1, positions].numpy()  # (H, 12)
        for head in range(2):
            np.testing.assert_allclose(saved["attention"][i, -1, head], by_hand(rows[head], (6, 8), 2, 0), rtol=0,
                                       atol=ATOL)


def test_predict_ask_writes_the_maps_lm_method_names(vlms, answers, tmp_path, capsys):
    """``--lm-method`` takes the explorer's ``lm_method`` names: gradient x attention at each layer and rolled out
    are the API's (test_vlm_relevance checks them against autograd on transformers' model), from one run per token;
    attention is left out when not named."""
    from vit.explain.language.vlm_answer import MAP_METHODS
    from vit.predict import ANSWER_MAP_METHODS, main

    assert ANSWER_MAP_METHODS == MAP_METHODS
    picture().save(tmp_path / "photo.png")
    assert main([str(vlms["qwen2_5_vl"]), str(tmp_path / "photo.png"), "--ask", QUESTION, "--max-new-tokens",
                 str(NEW_TOKENS), "--save-maps", str(tmp_path / "maps"), "--device", "cpu", "--lm-method",
                 "gradxattn", "gradxattn_rollout", "tam", "attnlrp"]) == 0
    [record] = json.loads(capsys.readouterr().out)
    answer = answers["qwen2_5_vl"][0]
    saved = np.load(record["maps"]["npz"])
    assert "attention" not in saved and saved["image_share"].shape == (NEW_TOKENS, 2, 4)
    assert saved["gradxattn"].shape == (NEW_TOKENS, 2, 4, 6) and saved["gradxattn_rollout"].shape == (NEW_TOKENS, 4, 6)
    for i in range(NEW_TOKENS):
        for layer in range(2):
            np.testing.assert_allclose(saved["gradxattn"][i, layer], answer.relevance(i, layer), rtol=0, atol=1e-6)
        np.testing.assert_allclose(saved["gradxattn_rollout"][i], answer.relevance(i), rtol=0, atol=1e-6)
        np.testing.assert_allclose(saved["tam"][i], answer.tam(i), rtol=0, atol=1e-6)
        # AttnLRP's: the API's, which test_vlm_answer_attnlrp holds equal to lxt's rules on transformers' model
        lrp = answer.relevance(i, method="attnlrp")
        np.testing.assert_allclose(saved["attnlrp"][i], lrp, rtol=0, atol=1e-6 * np.abs(lrp).max())
    assert main([str(vlms["qwen2_5_vl"]), str(tmp_path / "photo.png"), "--ask", QUESTION,
                 "--lm-method", "tam"]) == 2
    assert "--lm-method chooses the maps --save-maps writes; add --save-maps DIR" in capsys.readouterr().err


def test_predict_ask_counts_the_relevance_maps_before_answering(vlms, tmp_path, capsys, monkeypatch):
    """The maps ``--lm-method`` names count against ``--max-maps-mb`` before any forward: 512 tokens of attention
    fit 2 MB on a 10 x 12 grid, with gradient x attention's per layer they do not; and the last token's gradient x
    attention over the memory limit is refused before the answer too."""
    from vit.costs.plan import vlm_answer, vlm_attnlrp, vlm_relevance
    from vit.explain.language.vlm_answer import prepare, text_shape
    from vit.predict import main

    picture(280, 250).save(tmp_path / "photo.png")  # 10 x 12 patches (the processor's max_pixels)
    vlm = vit.open_vlm(vlms["qwen2_5_vl"])
    prepared = prepare(vlm, picture(280, 250), QUESTION, max_new_tokens=512)
    assert prepared.maps_bytes(4, ("attention",)) <= 2 * 2**20 < prepared.maps_bytes(4, ("attention", "gradxattn"))
    monkeypatch.setattr("vit.explain.language.vlm_answer.generate_answer", lambda *a: pytest.fail("the model ran"))
    monkeypatch.delenv("VIT_MAX_MAPS_MB", raising=False)
    args = [str(vlms["qwen2_5_vl"]), str(tmp_path / "photo.png"), "--ask", QUESTION, "--max-new-tokens", "512",
            "--save-maps", str(tmp_path / "maps"), "--device", "cpu"]
    assert main([*args, "--max-maps-mb", "2", "--lm-method", "attention", "gradxattn"]) == 1
    err = capsys.readouterr().err
    assert "--save-maps would write up to 2 MB" in err and "over the 2 MB limit" in err, err
    assert "(512 tokens x (attention 2 layers x 4 heads + gradxattn 2 layers) maps x 10x12 patches)" in err
    answering = vlm_answer(vlm.tower.model, prepared.layout.grid, text_shape(vlm), prepared.prompt_tokens, 512).memory
    relevance = vlm_relevance(vlm.tower.model, prepared.layout.grid, text_shape(vlm), prepared.prompt_tokens + 511,
                              511).memory
    assert relevance > answering  # a limit between them: the answer may run, its last token's relevance not
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str((answering + relevance) / 2 / 2**20))
    assert main([*args, "--max-maps-mb", "100", "--lm-method", "gradxattn_rollout"]) == 1
    err = capsys.readouterr().err
    assert "Gradient x attention of answer token 511 runs the model over" in err, err
    lrp = vlm_attnlrp(vlm.tower.model, prepared.layout.grid, text_shape(vlm), prepared.prompt_tokens + 511, 511).memory
    assert lrp > answering
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str((answering + min(lrp, relevance)) / 2 / 2**20))
    assert main([*args, "--max-maps-mb", "100", "--lm-method", "attnlrp"]) == 1
    assert "AttnLRP of answer token 511 runs the model over" in capsys.readouterr().err
    assert not list((tmp_path / "maps").iterdir())


def test_predict_ask_refuses_maps_over_the_limit_before_answering(vlms, tmp_path, capsys, monkeypatch):
    from vit.predict import main

    picture(280, 250).save(tmp_path / "photo.png")  # 10 x 12 patches (max_pixels): 2.2 MB of maps
    monkeypatch.setattr("vit.explain.language.vlm_answer.generate_answer", lambda *a: pytest.fail("the model ran"))
    monkeypatch.setattr("vit.predict.MAX_MAPS_MB", 1)
    monkeypatch.delenv("VIT_MAX_MAPS_MB", raising=False)
    assert main([str(vlms["qwen2_5_vl"]), str(tmp_path / "photo.png"), "--ask", QUESTION, "--max-new-tokens",
                 "512", "--save-maps", str(tmp_path / "maps"), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "--save-maps would write up to 2 MB" in err and "(512 tokens x (attention 2 layers x 4 heads + tam 1) " \
                                                           "maps x 10x12 patches)" in err, err
    assert "over the 1 MB limit; raise --max-maps-mb" in err
    assert not list((tmp_path / "maps").iterdir())


@pytest.fixture(scope="module")
def internvl_tiles(tmp_path_factory):
    """InternVL whose processor cuts ``picture()`` (90 x 70) into 3 x 2 tiles and a thumbnail (at most 6 tiles: the
    canvas nearest its aspect), each tile 2 x 2 pixel-shuffled tokens, saved whole."""
    torch.manual_seed(0)
    model, processor = _build("internvl")
    processor.image_processor.max_patches = 6
    folder = tmp_path_factory.mktemp("internvl_tiles")
    noisy(model).save_pretrained(folder, max_shard_size="20KB")
    processor.save_pretrained(folder)
    return folder


def where_tiles_are(folder, image: Image.Image, side: int = 32) -> list[tuple[int, int]]:
    """transformers alone: the (row, column) on the canvas of each tile the image processor cut, found by its pixels:
    of every canvas of ``tiles`` crops, the one whose crops (the image processor's resize of the whole image to the
    canvas, cut) are the tiles, pixel for pixel."""
    images = reference_processor(folder).image_processor
    tiles = images(image, crop_to_patches=True, return_tensors="pt")["pixel_values"][:-1]  # the thumbnail last
    n = tiles.shape[0]
    for rows in (r for r in range(1, n + 1) if n % r == 0):
        cols = n // rows
        canvas = images(image, crop_to_patches=False, size={"height": rows * side, "width": cols * side},
                        return_tensors="pt")["pixel_values"][0]
        crops = {(r, c): canvas[:, r * side:(r + 1) * side, c * side:(c + 1) * side]
                 for r in range(rows) for c in range(cols)}
        found = [next((place for place, crop in crops.items() if torch.equal(tile, crop)), None) for tile in tiles]
        if None not in found:
            return found
    raise AssertionError("no canvas's crops are the tiles")


def test_internvls_tiles_are_placed_where_the_processor_cut_them(internvl_tiles):
    """Each tile's four image tokens (its 2 x 2 pixel-shuffle units) cover the part of the 8 x 12-patch canvas its
    pixels came from; the thumbnail's, after the tiles', are the overview. Tiles taken column-major would be another
    map."""
    image = picture()
    answer = vit.ask_vlm(vit.open_vlm(internvl_tiles), image, QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, image_token = eager_generate(internvl_tiles, image)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    places = where_tiles_are(internvl_tiles, image)
    assert sorted(places) == [(r, c) for r in range(2) for c in range(3)] and inputs["pixel_values"].shape[0] == 7
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    assert answer.grid == (8, 12) and len(positions) == 7 * 4
    for i in range(NEW_TOKENS):
        for layer in range(answer.layers):
            rows = out.attentions[i][layer][0, :, -1, positions].numpy()  # (H, 28)
            for head in (*range(rows.shape[0]), None):
                row = rows.mean(0) if head is None else rows[head]
                expected = np.zeros((8, 12), dtype=np.float32)
                for k, (r, c) in enumerate(places):
                    expected[4 * r:4 * r + 4, 4 * c:4 * c + 4] = by_hand(row[4 * k:4 * k + 4], (4, 4), 2, 0)
                np.testing.assert_allclose(answer.attention(i, layer, head), expected, rtol=0, atol=ATOL)
                np.testing.assert_allclose(answer.attention(i, layer, head, overview=True),
                                           by_hand(row[24:], (4, 4), 2, 0), rtol=0, atol=ATOL)
    row = out.attentions[1][0][0, :, -1, positions].numpy().mean(0)
    column_major = np.zeros((8, 12), dtype=np.float32)
    for k in range(6):
        column_major[4 * (k % 2):4 * (k % 2) + 4, 4 * (k // 2):4 * (k // 2) + 4] = by_hand(row[4 * k:4 * k + 4],
                                                                                         (4, 4), 2, 0)
    assert _differs(answer.attention(1, 0), column_major)
    with pytest.raises(ValueError, match=r"^this image was read in one view"):
        vit.ask_vlm(vit.open_vlm(internvl_tiles), picture(32, 32), QUESTION, max_new_tokens=1).attention(
            0, overview=True)


@pytest.fixture(scope="module", params=["idefics3", "smolvlm"])
def idefics3_tiles(request, tmp_path_factory):
    """Idefics3 / SmolVLM saved whole, whose image processor splits an image into 32-px tiles of its 64-px resize,
    the whole image resized to one tile after them: ``(kind, folder)``."""
    return request.param, saved_whole(tmp_path_factory, [request.param])[request.param]


@pytest.fixture(scope="module", params=["idefics3", "smolvlm", "llama4_tiles"])
def split_tiles(request, tmp_path_factory):
    """``idefics3_tiles``'s, and Llama 4 saved whole, whose processor resizes an image into a canvas of up to 4
    32-px tiles (padded to fill it), the whole image resized to one tile (the global image) after them."""
    return request.param, saved_whole(tmp_path_factory, [request.param])[request.param]


def quadrants(width: int, height: int) -> Image.Image:
    """An image of four flat colours, one a quadrant: where each tile came from is read off its colour."""
    colours = np.array([[[230, 20, 20], [20, 230, 20]], [[20, 20, 230], [230, 230, 20]]], dtype=np.uint8)
    rows = (np.arange(height) >= height // 2).astype(int)
    cols = (np.arange(width) >= width // 2).astype(int)
    return Image.fromarray(colours[rows[:, None], cols[None, :]])


def quadrant_places(tiles: torch.Tensor) -> list[tuple[int, int]]:
    """(n, 3, h, w) tiles of ``quadrants`` -> each tile's (row, column) on the canvas, read off its colours: a 2 x 2
    split's tiles are one quadrant each; a wide image's two tiles its left half (red over blue) and right (green over
    yellow)."""
    reds, greens, blues = (tiles[:, channel].mean((-1, -2)).tolist() for channel in range(3))
    if len(reds) == 2:
        return [(0, int(g > r)) for r, g in zip(reds, greens, strict=True)]
    colour = {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}  # red, green, blue, yellow
    return [colour[int(np.argmax([r - g - b, g - r - b, b - r - g, r + g - 2 * b]))]
            for r, g, b in zip(reds, greens, blues, strict=True)]


@pytest.mark.parametrize(("width", "height", "places"), [(80, 80, [(0, 0), (0, 1), (1, 0), (1, 1)]),
                                                         (100, 50, [(0, 0), (0, 1)])])
def test_idefics3s_tiles_are_placed_where_the_processor_cut_them(split_tiles, width, height, places):
    """Idefics3's, SmolVLM's and Llama 4's split image: each tile's four image tokens (its 2 x 2 pixel-shuffle
    units) cover the part of the canvas its pixels came from (read off the quadrants' colours of the pixels the
    tower read, not from our layout), the global image's tokens after them are the overview; the tokens are
    generate's. Tiles taken column-major would be another map (the 2 x 2 split)."""
    kind, folder = split_tiles
    image = quadrants(width, height)
    answer = vit.ask_vlm(vit.open_vlm(folder), image, QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, image_token = eager_generate(folder, image)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    tiles = inputs["pixel_values"] if kind == "llama4_tiles" else inputs["pixel_values"][0]  # Idefics3's (1, n, ...)
    found = quadrant_places(tiles[:-1])  # the global image last
    rows, cols = max(p[0] for p in places) + 1, max(p[1] for p in places) + 1
    assert found == places and answer.grid == (4 * rows, 4 * cols)
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    assert len(positions) == (len(places) + 1) * 4
    for i in range(NEW_TOKENS):
        for layer in range(answer.layers):
            heads = eager_image_rows(out, i, layer, positions)
            for head in (*range(heads.shape[0]), None):
                row = heads.mean(0) if head is None else heads[head]
                expected = np.zeros((4 * rows, 4 * cols), dtype=np.float32)
                for k, (r, c) in enumerate(found):
                    expected[4 * r:4 * r + 4, 4 * c:4 * c + 4] = by_hand(row[4 * k:4 * k + 4], (4, 4), 2, 0)
                np.testing.assert_allclose(answer.attention(i, layer, head), expected, rtol=0, atol=ATOL)
                np.testing.assert_allclose(answer.attention(i, layer, head, overview=True),
                                           by_hand(row[-4:], (4, 4), 2, 0), rtol=0, atol=ATOL)
    if rows == cols == 2:  # at the last layer: Llama 4's first ones are chunked, their chunk past the image
        row = eager_image_rows(out, 1, answer.layers - 1, positions).mean(0)
        column_major = np.zeros((8, 8), dtype=np.float32)
        for k in range(4):
            column_major[4 * (k % 2):4 * (k % 2) + 4, 4 * (k // 2):4 * (k // 2) + 4] = by_hand(
                row[4 * k:4 * k + 4], (4, 4), 2, 0)
        assert _differs(answer.attention(1, answer.layers - 1), column_major)


@pytest.fixture(scope="module")
def llava_next(tmp_path_factory):
    """LLaVA-NeXT saved whole: ``picture()`` (90 x 70) on its 64 x 96-px canvas, 2 x 3 crops of 4 x 4 patches."""
    torch.manual_seed(0)
    model, processor = _build("llava_next")
    folder = tmp_path_factory.mktemp("llava_next")
    noisy(model).save_pretrained(folder, max_shard_size="20KB")
    processor.save_pretrained(folder)
    return folder


def packed_tags(folder, inputs, column_major: bool = False) -> list[tuple[float, float] | None]:
    """transformers alone: the canvas (row, column) of the patch each image token holds, as ``pack_image_features``
    of ``LlavaNextModel`` or ``LlavaOnevisionModel`` lays out the base image and the crops (None: the base image's
    tokens and the newlines): each crop's features tagged with the canvas place of its patches (crops row-major on
    the canvas, as the image processor cuts them; ``column_major``: a wrong reading of them), packed, and read back
    (OneVision's bilinear shrink interpolates the tags: a token's tag is the canvas place it samples)."""
    config = json.loads((folder / "config.json").read_text())
    model = getattr(transformers, config["architectures"][0]).from_pretrained(folder)
    crops, side = inputs["pixel_values"].shape[1] - 1, 4
    rows, cols = 2, 3
    assert crops == rows * cols
    tags = torch.full((crops + 1, side * side, 2), -1.0)  # the base image's: (-1, -1)
    for k in range(crops):
        row, col = (k % rows, k // rows) if column_major else (k // cols, k % cols)
        for p in range(side * side):
            tags[k + 1, p] = torch.tensor([row * side + p // side, col * side + p % side], dtype=torch.float)
    if config["model_type"] == "llava_onevision":
        packed, _ = model.model.pack_image_features([tags], inputs["image_sizes"], torch.full((2,), -2.0),
                                                    config["vision_aspect_ratio"])
    else:
        packed, _ = model.model.pack_image_features([tags], inputs["image_sizes"], "default",
                                                    image_newline=torch.full((2,), -2.0))
    return [None if tag[0] < 0 else (float(tag[0]), float(tag[1])) for tag in packed[0]]


def packed_places(folder, inputs) -> list[tuple[int, int] | None]:
    """``packed_tags`` of LLaVA-NeXT, whose tags are whole patches."""
    return [None if tag is None else (int(tag[0]), int(tag[1])) for tag in packed_tags(folder, inputs)]


def packed_like_transformers(answer, out, positions, places) -> tuple[int, int]:
    """Every answer token's map, each layer, head and their mean, on the 8 x 10 canvas and the 4 x 4 overview, equal
    to transformers' eager rows (``out.attentions``) at the image ``positions`` placed at ``places``; the canvas's
    (top, left) corner in the tags."""
    top, left = min(p[0] for p in places if p), min(p[1] for p in places if p)
    for i in range(NEW_TOKENS):
        for layer in range(answer.layers):
            rows = out.attentions[i][layer][0, :, -1, positions].numpy()  # (H, 104)
            for head in (*range(rows.shape[0]), None):
                row = rows.mean(0) if head is None else rows[head]
                expected = np.full((8, 10), np.nan, dtype=np.float32)
                for value, place in zip(row, places, strict=True):
                    if place is not None:
                        expected[place[0] - top, place[1] - left] = value
                np.testing.assert_allclose(answer.attention(i, layer, head), expected, rtol=0, atol=ATOL)
                np.testing.assert_allclose(answer.attention(i, layer, head, overview=True),
                                           by_hand(row[:16], (4, 4), 1, 0), rtol=0, atol=ATOL)
    return top, left


@pytest.fixture(scope="module")
def llava_next_video(tmp_path_factory):
    """LLaVA-NeXT-Video saved whole, asked about ``picture()``: LLaVA-NeXT's canvas (``llava_next``)."""
    return saved_whole(tmp_path_factory, ["llava_next_video"])["llava_next_video"]


@pytest.mark.parametrize("kind", ["llava_next", "llava_next_video"])
def test_llava_nexts_crops_are_placed_as_transformers_packs_them(request, kind):
    """LLaVA-NeXT's 104 image tokens: the base image's 16 (the overview), then the 2 x 3 crops' patches on the
    canvas, its padding columns dropped (8 x 10 of 8 x 12), each row followed by a newline token that covers no patch,
    as ``pack_image_features`` packs them. The crops taken row-major without the unpadding and the newlines would be
    another map. LLaVA-NeXT-Video reads an image as LLaVA-NeXT does (its tower opens by the same port)."""
    llava_next = request.getfixturevalue(kind)
    image = picture()
    answer = vit.ask_vlm(vit.open_vlm(llava_next), image, QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, image_token = eager_generate(llava_next, image)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    places = packed_places(llava_next, inputs)
    assert len(positions) == len(places) == 104 and answer.grid == (8, 10)
    assert packed_like_transformers(answer, out, positions, places) == (0, 1)  # the canvas's 1st column is padding
    row = out.attentions[1][0][0, :, -1, positions].numpy().mean(0)
    assert _differs(answer.attention(1, 0), row[16:96].reshape(8, 10))  # the newlines taken for patches


@pytest.fixture(scope="module", params=["llava_onevision", "llava_onevision_2"])
def llava_onevision(request, tmp_path_factory):
    """LLaVA-OneVision saved whole: NeXT's 2 x 3 crops of ``picture()``; "_2": its 8 x 10-patch unpadded canvas over
    ``anyres_max_2`` (sqrt(80 / 32) > 1.1) shrunk to 5 x 6 tokens."""
    return saved_whole(tmp_path_factory, [request.param])[request.param]


def nearest_tokens(tags, top: int, left: int, grid: tuple[int, int], wrong=None) -> np.ndarray:
    """(gh, gw): the image token whose packed tag is nearest each patch of the unpadded canvas (its first patch at
    canvas row ``top``, column ``left``), asserted unambiguous."""
    which = np.array([k for k, tag in enumerate(tags) if tag is not None])
    places = np.array([tags[k] for k in which])  # (n, 2)
    index = np.zeros(grid, dtype=np.int64)
    for r in range(grid[0]):
        for c in range(grid[1]):
            distance = np.hypot(places[:, 0] - (top + r), places[:, 1] - (left + c))
            order = np.argsort(distance, kind="stable")
            assert wrong is not None or distance[order[1]] > distance[order[0]] + 1e-3
            index[r, c] = which[order[0]]
    return index


def test_llava_onevisions_crops_are_placed_as_transformers_packs_them(llava_onevision):
    """LLaVA-OneVision's image tokens: the base image's 16 (the overview), then the 2 x 3 crops' patches on the
    canvas unpadded (8 x 10 of 8 x 12), shrunk by bilinear interpolation past ``anyres_max_N`` (5 x 6 tokens under
    anyres_max_2), each row followed by a newline token, as ``pack_image_features`` packs them: each patch holds the
    token whose sample lies nearest it. Crops read column-major would be another map."""
    image = picture()
    answer = vit.ask_vlm(vit.open_vlm(llava_onevision), image, QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, image_token = eager_generate(llava_onevision, image)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    tags = packed_tags(llava_onevision, inputs)
    shrunk = llava_onevision.name.startswith("llava_onevision_2")
    assert len(positions) == len(tags) == (16 + 5 * 7 if shrunk else 16 + 8 * 11) and answer.grid == (8, 10)
    index = nearest_tokens(tags, 0, 1, (8, 10))  # the canvas's first column is padding, as NeXT's
    wrong = nearest_tokens(packed_tags(llava_onevision, inputs, column_major=True), 0, 1, (8, 10), wrong=True)
    for i in range(NEW_TOKENS):
        for layer in range(answer.layers):
            rows = out.attentions[i][layer][0, :, -1, positions].numpy()  # (H, K)
            for head in (*range(rows.shape[0]), None):
                row = rows.mean(0) if head is None else rows[head]
                np.testing.assert_allclose(answer.attention(i, layer, head), row[index], rtol=0, atol=ATOL)
                np.testing.assert_allclose(answer.attention(i, layer, head, overview=True),
                                           by_hand(row[:16], (4, 4), 1, 0), rtol=0, atol=ATOL)
    row = out.attentions[1][0][0, :, -1, positions].numpy().mean(0)
    assert _differs(answer.attention(1, 0), row[wrong])


@pytest.fixture(scope="module")
def gemma3_pas(tmp_path_factory):
    """Gemma 3 saved whole, its processor's pan-and-scan on."""
    return saved_whole(tmp_path_factory, ["gemma3_pas"])["gemma3_pas"]


def where_crops_are(folder, image: Image.Image) -> list[tuple[int, int]]:
    """transformers alone: the (top, left) pixel at which ``Gemma3ImageProcessor.pan_and_scan_batched`` cut each
    crop, in the order it returns them (the order of ``pixel_values`` after the original image): an image of its
    own pixel coordinates cut by it."""
    images = reference_processor(folder).image_processor
    r, c = torch.meshgrid(torch.arange(image.height), torch.arange(image.width), indexing="ij")
    crops = images.pan_and_scan_batched(torch.stack([r, c])[None].float(), images.pan_and_scan_min_crop_size,
                                        images.pan_and_scan_max_num_crops,
                                        images.pan_and_scan_min_ratio_to_activate)
    return [(int(crop[0, 0, 0, 0]), int(crop[0, 1, 0, 0])) for crop in crops]


@pytest.mark.parametrize(("width", "height", "crops"), [(200, 60, 3), (60, 130, 2)])
def test_gemma3s_pan_and_scan_crops_are_placed_where_the_processor_cut_them(gemma3_pas, width, height, crops):
    """Gemma 3's pan-and-scan: the original image's 4 tokens first (the overview), then each crop's own 2 x 2 pooled
    tokens, each crop on the canvas where ``pan_and_scan_batched`` cut it from the image (side by side along the
    longer side, ``where_crops_are``), equal to transformers' eager rows. The crops in reverse would be another
    map."""
    image = picture(width, height)
    answer = vit.ask_vlm(vit.open_vlm(gemma3_pas, pan_and_scan=True), image, QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, image_token = eager_generate(gemma3_pas, image, **PAN_AND_SCAN)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    cuts = where_crops_are(gemma3_pas, image)
    assert len(cuts) == crops and len(positions) == 4 * (crops + 1)
    tops, lefts = sorted({t for t, _ in cuts}), sorted({left for _, left in cuts})
    places = [(tops.index(t), lefts.index(left)) for t, left in cuts]  # each crop's (row, column) on the canvas
    assert answer.grid == (8 * len(tops), 8 * len(lefts))

    def expected(row: np.ndarray, order) -> np.ndarray:
        canvas = np.zeros(answer.grid, dtype=np.float32)
        for k, (r, c) in zip(order, places, strict=True):
            canvas[8 * r:8 * r + 8, 8 * c:8 * c + 8] = by_hand(row[4 * (k + 1):4 * (k + 2)], (8, 8), 4, 0)
        return canvas

    for i in range(NEW_TOKENS):
        for layer in range(answer.layers):
            rows = out.attentions[i][layer][0, :, -1, positions].numpy()  # (H, 4 x (crops + 1))
            for head in (*range(rows.shape[0]), None):
                row = rows.mean(0) if head is None else rows[head]
                np.testing.assert_allclose(answer.attention(i, layer, head), expected(row, range(crops)),
                                           rtol=0, atol=ATOL)
                np.testing.assert_allclose(answer.attention(i, layer, head, overview=True),
                                           by_hand(row[:4], (8, 8), 4, 0), rtol=0, atol=ATOL)
    row = out.attentions[1][0][0, :, -1, positions].numpy().mean(0)
    assert _differs(answer.attention(1, 0), expected(row, reversed(range(crops))))
    images = reference_processor(gemma3_pas).image_processor
    np.testing.assert_array_equal(answer.layout.overview.pixels, unnormalised(images, inputs["pixel_values"][0]))


def test_a_hub_id_opens_the_whole_vlm_from_the_hub_then_from_the_cache(vlms, fake_hub, monkeypatch):
    """``vit.ask_vlm("org/name", ...)``: the Hub's snapshot, every shard (the language model answers too) and the
    processor's files, downloaded into the HF cache; then the cache entry alone, offline. The answer is the
    folder's."""
    folder = vlms["llava"]
    fake_hub.add_folder("org/tiny-llava", folder)
    expected = vit.ask_vlm(folder, picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    answer = vit.ask_vlm("org/tiny-llava", picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    assert answer.tokens == expected.tokens and answer.text == expected.text
    np.testing.assert_allclose(answer.attention(1, 0), expected.attention(1, 0), rtol=0, atol=1e-6)
    local = {p.name for p in folder.iterdir() if p.is_file()}
    assert local <= set(fake_hub.fetched("GET"))  # every file of the folder: shards, processor, chat template
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fetched = len(fake_hub.fetched("GET"))
    again = vit.ask_vlm("org/tiny-llava", picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    assert again.tokens == expected.tokens and len(fake_hub.fetched("GET")) == fetched


def test_predict_ask_with_pan_and_scan_writes_the_crops_canvas_and_the_whole_image(gemma3_pas, tmp_path, capsys):
    """``vit.predict --ask --pan-and-scan``: the API's pan-and-scan answer and maps (the crops' canvas, the whole
    image as the overview, which a Gemma 3 read without it has not); without ``--ask``, one line."""
    from vit.predict import main

    image = picture(200, 60)
    image.save(tmp_path / "wide.png")
    args = [str(gemma3_pas), str(tmp_path / "wide.png"), "--ask", QUESTION, "--max-new-tokens", str(NEW_TOKENS),
            "--device", "cpu", "--lm-method", "attention"]
    assert main([*args, "--pan-and-scan", "--save-maps", str(tmp_path / "crops")]) == 0
    [record] = json.loads(capsys.readouterr().out)
    answer = vit.ask_vlm(vit.open_vlm(gemma3_pas, pan_and_scan=True), image, QUESTION, max_new_tokens=NEW_TOKENS)
    assert record["tokens"] == list(answer.tokens) and record["answer"] == answer.text
    saved = np.load(record["maps"]["npz"])
    for i in range(NEW_TOKENS):
        np.testing.assert_allclose(saved["attention"][i, 0, 0], answer.attention(i, 0, 0), rtol=0, atol=1e-6)
        np.testing.assert_allclose(saved["overview_attention"][i, 0, 0], answer.attention(i, 0, 0, overview=True),
                                   rtol=0, atol=1e-6)
    assert main([*args, "--save-maps", str(tmp_path / "whole")]) == 0
    [record] = json.loads(capsys.readouterr().out)
    assert "overview_attention" not in np.load(record["maps"]["npz"])  # one view: the image as the model read it
    assert main([str(gemma3_pas), str(tmp_path / "wide.png"), "--pan-and-scan"]) == 2
    assert "--pan-and-scan is how a Gemma 3 reads the image it is asked about; it goes with --ask" in \
        capsys.readouterr().err


def test_pan_and_scan_on_another_family_is_refused_in_one_line(llava_next):
    from vit.sources.vlm.whole_vlm import VLMError

    with pytest.raises(VLMError, match=r"^pan-and-scan is Gemma 3's processor's; .* is a llava_next model"):
        vit.open_vlm(llava_next, pan_and_scan=True)


def unnormalised(images, pixels: torch.Tensor) -> np.ndarray:
    """(C, H, W) of an image processor's output -> (H, W, 3) uint8: its rescale and normalisation undone by hand."""
    mean = torch.tensor(images.image_mean).view(-1, 1, 1)
    std = torch.tensor(images.image_std).view(-1, 1, 1)
    x = (pixels.float() * std + mean) / images.rescale_factor
    return x.round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()


def test_a_tiled_answer_is_drawn_over_the_canvas_and_the_overview_the_model_read(internvl_tiles, llava_next):
    """The pixels under a tiled map (``layout.pixels``) are those the model read, on the map's own grid: InternVL's
    canvas is the image processor's resize of the image to the 2 x 3 tiles' canvas (which ``where_tiles_are`` finds
    cut into the very tiles), its thumbnail the overview; LLaVA-NeXT's is its crops stitched row-major with the
    padding ``pack_image_features`` drops cut away, its base image the overview."""
    image = picture()
    answer = vit.ask_vlm(vit.open_vlm(internvl_tiles), image, QUESTION, max_new_tokens=1)
    images = reference_processor(internvl_tiles).image_processor
    side = images.size["height"]
    canvas = images(image, crop_to_patches=False, size={"height": 2 * side, "width": 3 * side},
                    return_tensors="pt")["pixel_values"][0]
    np.testing.assert_array_equal(answer.layout.pixels, unnormalised(images, canvas))
    thumbnail = images(image, crop_to_patches=True, return_tensors="pt")["pixel_values"][-1]
    np.testing.assert_array_equal(answer.layout.overview.pixels, unnormalised(images, thumbnail))
    assert answer.layout.pixels.shape[:2] == (answer.grid[0] * side // 4, answer.grid[1] * side // 4)

    answer = vit.ask_vlm(vit.open_vlm(llava_next), image, QUESTION, max_new_tokens=1)
    inputs = processor_inputs(llava_next, image)
    images = reference_processor(llava_next).image_processor
    places = [p for p in packed_places(llava_next, inputs) if p is not None]
    top, left = min(p[0] for p in places), min(p[1] for p in places)
    bottom, right = max(p[0] for p in places) + 1, max(p[1] for p in places) + 1
    crops = inputs["pixel_values"][0, 1:7]
    patch = crops.shape[-1] // 4
    padded = torch.cat([torch.cat(list(crops[r * 3:(r + 1) * 3]), dim=2) for r in range(2)], dim=1)
    expected = padded[:, top * patch:bottom * patch, left * patch:right * patch]
    np.testing.assert_array_equal(answer.layout.pixels, unnormalised(images, expected))
    assert answer.layout.pixels.shape[:2] == (answer.grid[0] * patch, answer.grid[1] * patch)
    np.testing.assert_array_equal(answer.layout.overview.pixels, unnormalised(images, inputs["pixel_values"][0, 0]))


def test_a_visitor_is_bounded_by_every_tiles_patches(internvl_tiles, monkeypatch):
    """The tower reads each of InternVL's six tiles and its thumbnail: 112 patches, more than the canvas's 96."""
    from vit.app import vlm_ask
    from vit.explain.language.vlm_answer import prepare

    prepared = prepare(vit.open_vlm(internvl_tiles), picture(), QUESTION, max_new_tokens=1)
    assert prepared.layout.grid == (8, 12) and prepared.layout.patches == 7 * 16
    monkeypatch.setattr(vlm_ask, "VISITOR_PATCHES", 100)
    with pytest.raises(ValueError, match=r"^the model's processor makes this image 7 tiles of 4x4 = 112 patches, "
                                         r"more than the 100 a visitor may ask about here"):
        vlm_ask.check_visitor(prepared, may_open=False)
    vlm_ask.check_visitor(prepared, may_open=True)


def test_predict_ask_writes_the_tiles_canvas_and_the_overview(internvl_tiles, tmp_path, capsys):
    """InternVL's tiles: ``attention`` on the 8 x 12-patch canvas, ``overview_attention`` on the thumbnail's 4 x 4,
    each the eager row placed where the processor cut the tiles."""
    from vit.predict import main

    picture().save(tmp_path / "photo.png")
    assert main([str(internvl_tiles), str(tmp_path / "photo.png"), "--ask", QUESTION, "--max-new-tokens",
                 str(NEW_TOKENS), "--save-maps", str(tmp_path / "maps"), "--device", "cpu"]) == 0
    [record] = json.loads(capsys.readouterr().out)
    saved = np.load(record["maps"]["npz"])
    assert saved["attention"].shape == (NEW_TOKENS, 2, 4, 8, 12)
    assert saved["overview_attention"].shape == (NEW_TOKENS, 2, 4, 4, 4)
    out, inputs, image_token = eager_generate(internvl_tiles, picture())
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    places = where_tiles_are(internvl_tiles, picture())
    for i in (0, NEW_TOKENS - 1):
        rows = out.attentions[i][1][0, :, -1, positions].numpy()  # (H, 28)
        for head in range(4):
            expected = np.zeros((8, 12), dtype=np.float32)
            for k, (r, c) in enumerate(places):
                expected[4 * r:4 * r + 4, 4 * c:4 * c + 4] = by_hand(rows[head, 4 * k:4 * k + 4], (4, 4), 2, 0)
            np.testing.assert_allclose(saved["attention"][i, 1, head], expected, rtol=0, atol=ATOL)
            np.testing.assert_allclose(saved["overview_attention"][i, 1, head], by_hand(rows[head, 24:], (4, 4), 2, 0),
                                       rtol=0, atol=ATOL)
    answer = vit.ask_vlm(vit.open_vlm(internvl_tiles), picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    assert saved["tam"].shape == (NEW_TOKENS, 8, 12) and saved["overview_tam"].shape == (NEW_TOKENS, 4, 4)
    for i in range(NEW_TOKENS):  # the API's, each filtered on its own view's grid
        np.testing.assert_allclose(saved["tam"][i], answer.tam(i), rtol=0, atol=1e-6)
        np.testing.assert_allclose(saved["overview_tam"][i], answer.tam(i, overview=True), rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["glm4v", "mistral3", "pixtral", "qwen3_5", "llama4", "gemma3n"])
def test_a_tower_no_port_reads_gives_the_pixels_its_one_view_was_read_as(answers, kind):
    """A tower its config declares has no preprocessing of ours to redo: the map is drawn over the processor's own
    pixels (``layout.pixels``, its normalisation undone; GLM's and Qwen3.5's flat patches put back on the image,
    Pixtral's cut from its padded batch). They are ``picture()`` as PIL resizes it to the layout's grid (within the
    resampling's difference), not its mirror image (nor patches put back in another order)."""
    answer = answers[kind][0]
    [layout] = answer.layouts
    pixels = layout.pixels.astype(np.float32)
    gh, gw = layout.grid
    assert pixels.shape[0] % gh == 0 and pixels.shape[1] % gw == 0 and pixels.shape[0] // gh == pixels.shape[1] // gw
    if kind == "llama4":  # resized without distortion into its tile, then padded (transformers' own sizes)
        from transformers.models.llama4.image_processing_llama4 import get_max_res_without_distortion

        h, w = get_max_res_without_distortion((picture().height, picture().width), pixels.shape[:2])
        pixels = pixels[:h, :w]
    resized = np.asarray(picture().resize(pixels.shape[1::-1], Image.BICUBIC), dtype=np.float32)
    error = np.abs(pixels - resized).mean()
    assert error < 12, error
    assert np.abs(pixels - resized[:, ::-1]).mean() > 3 * error + 5


@pytest.fixture(scope="module")
def molmo2(tmp_path_factory):
    return saved_whole(tmp_path_factory, ["molmo2"])["molmo2"]


def molmo2_tokens(folder, image: Image.Image) -> tuple[np.ndarray, np.ndarray]:
    """transformers alone: the canvas token over each canvas patch and the overview token over each overview patch,
    from its image processor's own crop and pooling functions (``_build_overlapping_crops``, ``arange_for_pooling``):
    each canvas patch's crop patch, and the pooling window that holds it."""
    from transformers.models.molmo2.image_processing_molmo2 import arange_for_pooling

    images = reference_processor(folder).image_processor
    _, grid = images._build_overlapping_crops(
        torch.zeros(1, 3, image.height, image.width), max_crops=images.max_crops,
        overlap_margins=images.overlap_margins, crop_size=32, resample=images.resample, do_rescale=False,
        rescale_factor=1.0, do_normalize=False, image_mean=images.image_mean, image_std=images.image_std,
        image_patch_size=8)
    pooled, _, _ = arange_for_pooling(grid, *images.pooling_size)
    canvas = np.array([[next(k for k, window in enumerate(pooled.tolist()) if int(q) in window) for q in row]
                       for row in grid])
    overview, _, _ = arange_for_pooling(torch.arange(16).reshape(4, 4), *images.pooling_size)
    windows = overview.tolist()
    whole = np.array([[next(k for k, window in enumerate(windows) if q in window) for q in range(r * 4, r * 4 + 4)]
                      for r in range(4)])
    return canvas, whole


@pytest.mark.parametrize(("width", "height"), [(90, 70), (100, 40)])
def test_molmo2s_pooled_tokens_are_placed_where_its_crops_and_pooling_put_them(molmo2, width, height):
    """Molmo 2: each canvas patch under the token whose pooling window holds the crop patch it was read from, the
    overview's tokens (first in the prompt) over the whole image resized to one crop; every token's map at every
    layer and head the eager row; the tokens generate's. Its canvas read column-major would be another map."""
    image = picture(width, height)
    answer = vit.ask_vlm(vit.open_vlm(molmo2), image, QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, image_token = eager_generate(molmo2, image)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    canvas, whole = molmo2_tokens(molmo2, image)
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    low = int(whole.max()) + 1
    assert answer.grid == canvas.shape and len(positions) == low + int(canvas.max()) + 1
    for i in range(NEW_TOKENS):
        for layer in range(answer.layers):
            heads = eager_image_rows(out, i, layer, positions)
            for head in (*range(heads.shape[0]), None):
                row = heads.mean(0) if head is None else heads[head]
                np.testing.assert_allclose(answer.attention(i, layer, head), row[low:][canvas], rtol=0, atol=ATOL)
                np.testing.assert_allclose(answer.attention(i, layer, head, overview=True), row[:low][whole],
                                           rtol=0, atol=ATOL)
    row = eager_image_rows(out, 1, 0, positions).mean(0)
    assert _differs(answer.attention(1, 0), row[low:][canvas.T.reshape(canvas.shape)])
    # drawn over the canvas the crops were cut from: the image as its processor resizes it there (its own function,
    # without the normalisation), to the rounding of undoing the normalisation
    from transformers.models.molmo2.image_processing_molmo2 import resize_and_normalize_image

    images = reference_processor(molmo2).image_processor
    resized = resize_and_normalize_image(images, torch.from_numpy(np.asarray(image)).permute(2, 0, 1)[None],
                                         [canvas.shape[0] * 8, canvas.shape[1] * 8], images.resample, False, 1.0,
                                         False, images.image_mean, images.image_std)[0].permute(1, 2, 0).numpy()
    assert np.abs(answer.layout.pixels.astype(int) - resized.astype(int)).max() <= 1
    with pytest.raises(ValueError, match=r"^AttnLRP's pixels are not placed on Molmo 2's overlapping crops here; use "
                                         r"gradient × attention or TAM \(token activation map\)$"):
        answer.relevance(1, method="attnlrp")
    from test_vlm_relevance import reference  # Chefer's rule on the eager model, autograd (test_vlm_relevance)

    cams, _, where = reference(molmo2, list(answer.tokens), 1, image=image)
    for layer in range(answer.layers):
        expected = cams[layer][where.numpy()][low:][canvas]
        np.testing.assert_allclose(answer.relevance(1, layer), expected, rtol=0,
                                   atol=ATOL * max(1.0, float(np.abs(expected).max())))


def test_gemma3ns_logit_lens_is_refused_in_one_line(answers):
    """Gemma 3n's stream is its AltUp streams, read out otherwise than through the final norm and head: the lens's
    own check (its last layer is the model's logits) fails, and it is refused in one line, not drawn wrong."""
    with pytest.raises(ValueError, match=r"^the logit lens reads each layer's stream through the final norm and head, "
                                         r"and this model's last layer read so is not its own logits"):
        answers["gemma3n"][0].logit_lens(1)
