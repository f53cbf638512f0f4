"""Any image-text-to-text model type answers by what it is (issue 113): types the project's list of named
families (``registry.VLM_ARCHITECTURES``) never held and refused before, built tiny by transformers with their own
processors and saved whole: VipLLaVA (a CLIP tower's patches, one token each, from several of its layers), GLM-OCR
(14-px patches merged 2 x 2, M-RoPE, a grid the processor states in ``image_grid_thw``), and two the VLM census's
generic builder opens (DeepSeek-VL; MiniMax-M3-VL, whose attention builds its sparse mask only under the names
'eager' and 'sdpa', answers in ``test_vlm_same_branch``). Each answers with
transformers' greedy ``generate``'s tokens; each answer token's attention at every layer equals the eager row of
``generate(output_attentions=True)``; its image tokens are placed row-major over their merge units, checked by hand
on a grid the placement would fail transposed. The census's generic builder's Qwen Omni thinkers, PaddleOCR-VL,
VideoLLaMA 3 and MUSE Spark are placed on the grid their processor's ``image_grid_thw`` states, Ovis 2 and
DeepSeek-VL-Hybrid on their towers' grids (Aya Vision's and Qianfan-OCR's tiles: ``test_vlm_stated_tiles``). A
type whose processor's views cannot be placed still answers, its attention a list over the image tokens, and a map
on the image is refused in one line naming what is missing.
"""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_vlm_answer import (  # noqa: E402
    CLIP_TOWER,
    GLM_SPECIALS,
    LLAMA,
    NEW_TOKENS,
    QUESTION,
    TEMPLATE,
    by_hand,
    eager_generate,
    eager_image_rows,
    noisy,
    picture,
    tokenizer,
)
from vlm_saved import assert_answer_is_generates, assert_image_rows_are_eager  # noqa: E402

import vit  # noqa: E402
from vit.registry import VLM_ARCHITECTURES  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

KINDS = ["vipllava", "glm_ocr", "deepseek_vl", "cosmos3_edge", "qwen2_5_omni_thinker",
         "qwen3_omni_moe_thinker", "paddleocr_vl", "video_llama_3", "ovis2", "deepseek_vl_hybrid",
         "muse_spark", "glm5_next", "fast_vlm"]  # MUSE Glimmer answers one token with these weights
# Types the VLM census's generic builder opened (bench/census_vlm.py): transformers' default config shrunk, its own
# processor's classes; DeepSeek-VL's 16-px patches one token each,
# Cosmos 3 Edge's M-RoPE, whose generate needs the mm_token_type_ids its processor gives only when asked; the Qwen
# Omni thinkers (their vision_start_token_id from the processor's vision_bos_token), PaddleOCR-VL (M-RoPE sections
# over the shrunk head) and VideoLLaMA 3 (the processor's 14-px patches on the tower): grids the processor states
GENERIC = ("deepseek_vl", "cosmos3_edge", "qwen2_5_omni_thinker", "qwen3_omni_moe_thinker",
           "paddleocr_vl", "video_llama_3", "ovis2", "deepseek_vl_hybrid", "muse_spark",
           "glm5_next", "fast_vlm", "chameleon", "emu3", "fuyu")  # the last three: for the sweep (test_vlm_vq,
# test_vlm_patch_rows test them)


def build(kind: str):
    """``(model, processor)`` of a tiny ``kind``, built by transformers alone."""
    if kind in GENERIC:
        from bench.census_vlm import generic_build

        model, processor = generic_build(kind)
        if kind == "deepseek_vl_hybrid":  # its high-res SAM tower read 1,024 px (4,096 tokens: 3 s of CPU a
            # question); 256 px here, which its model interpolates to the low-res grid as ever
            config = model.config
            config.high_res_vision_config.image_size = 256
            processor.image_processor.high_res_size = type(processor.image_processor.high_res_size)(height=256,
                                                                                                    width=256)
            model = type(model)(config)
        return model, processor
    if kind == "vipllava":  # CLIP's 4 x 4 patches (its CLS dropped), two of its layers' states concatenated
        words = tokenizer(["<image>"])
        config = transformers.VipLlavaConfig(vision_config=CLIP_TOWER, text_config=dict(LLAMA, vocab_size=len(words)),
                                             image_token_index=words.convert_tokens_to_ids("<image>"),
                                             vision_feature_layers=[-2, -1])
        images = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        processor = transformers.LlavaProcessor(image_processor=images, tokenizer=words, patch_size=8,
                                                vision_feature_select_strategy="default",
                                                num_additional_image_tokens=1,
                                                chat_template=TEMPLATE.replace("IMAGE", "<image>"))
        return transformers.VipLlavaForConditionalGeneration(config), processor
    from transformers.models.glm4v.image_processing_glm4v import Glm4vImageProcessor

    words = tokenizer(GLM_SPECIALS)
    ids = {token: words.convert_tokens_to_ids(token) for token in GLM_SPECIALS}
    text = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, vocab_size=len(words), max_position_embeddings=256,
                rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0,
                                 "partial_rotary_factor": 0.5})
    vision = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=32, patch_size=14,
                  image_size=56, spatial_merge_size=2)
    config = transformers.GlmOcrConfig(
        vision_config=vision, text_config=text, image_token_id=ids["<|image|>"], video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"], image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"], video_end_token_id=ids["<|end_of_video|>"], eos_token_id=1)
    processor = transformers.Glm46VProcessor(
        image_processor=Glm4vImageProcessor(min_pixels=56 * 56, max_pixels=28 * 28 * 40, patch_size=14, merge_size=2),
        tokenizer=words, video_processor=transformers.Glm4vVideoProcessor(),
        chat_template=TEMPLATE.replace("IMAGE", "<|begin_of_image|><|image|><|end_of_image|>").replace(
            "VIDEO", "<|begin_of_video|><|video|><|end_of_video|>"))
    return transformers.GlmOcrForConditionalGeneration(config), processor


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    built = {}
    for kind in KINDS:
        torch.manual_seed(0)
        model, processor = build(kind)
        folder = tmp_path_factory.mktemp(kind)
        noisy(model).save_pretrained(folder)
        processor.save_pretrained(folder)
        built[kind] = folder
    return built


@pytest.fixture(scope="module")
def answers(folders):
    """``{kind: (vit's answer, transformers' eager generate output, the prompt's input ids, image token id)}``."""
    image = picture()
    # Cosmos 3 Edge's generate reads the mm_token_type_ids its processor gives when asked (transformers' own error)
    asked = {"cosmos3_edge": dict(return_mm_token_type_ids=True)}
    return {kind: (vit.ask_vlm(vit.open_vlm(folder), image, QUESTION, max_new_tokens=NEW_TOKENS),
                   *eager_generate(folder, image, **asked.get(kind, {}))) for kind, folder in folders.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_the_type_is_none_the_project_names(kind):
    assert kind not in VLM_ARCHITECTURES


@pytest.mark.parametrize("kind", KINDS)
def test_the_answer_is_generates_greedy_answer(answers, kind):
    assert_answer_is_generates(*answers[kind][:3])  # GLM-OCR's ends early, at its end token


@pytest.mark.parametrize("kind", KINDS)
def test_each_tokens_attention_at_every_layer_is_the_eager_row(answers, kind):
    assert_image_rows_are_eager(*answers[kind])


# The grid each type's processor gives the 90 x 70 picture, and its merge unit: GLM-OCR's is not square; None:
# the grid the processor's image_grid_thw states, merged by the image processor's merge_size
GRIDS = {"vipllava": ((4, 4), 1), "glm_ocr": ((6, 8), 2), "deepseek_vl": ((24, 24), 1),
         "cosmos3_edge": ((16, 20), 2), "qwen2_5_omni_thinker": None,
         "qwen3_omni_moe_thinker": None, "paddleocr_vl": None, "video_llama_3": None,
         # Ovis 2: 224-px images, 14-px patches (the 256 tokens its processor counts); DeepSeek-VL-Hybrid: its
         # low-res tower's 384 / 16
         "ovis2": ((16, 16), 1), "deepseek_vl_hybrid": ((24, 24), 1), "muse_spark": None,
         "glm5_next": None,  # GLM-5 Next: a latent attention whose head_dim is 0, linear layers named self_attn
         "fast_vlm": ((4, 4), 1)}  # FastVLM: a timm FastViT's last map, 256 px at its stride of 64 (timm's sizes)


@pytest.mark.parametrize("kind", KINDS)
def test_the_image_tokens_are_placed_row_major_over_their_merge_units(folders, answers, kind):
    answer, out, inputs, _ = answers[kind]
    if GRIDS[kind] is None:
        images = transformers.AutoProcessor.from_pretrained(folders[kind]).image_processor
        grid, unit = tuple(inputs["image_grid_thw"][0, 1:].tolist()), images.merge_size
        assert grid[0] != grid[1]  # not square: a transposed placement differs (VideoLLaMA 3 merges images 1 x 1)
    else:
        grid, unit = GRIDS[kind]
    if "image_grid_thw" in inputs:
        assert inputs["image_grid_thw"].tolist() == [[1, *grid]]
    assert answer.layout.grid == grid and answer.layout.unit == unit and answer.layout.lead == 0
    layer = min(1, len(out.attentions[0]) - 1)  # GLM-5 Next's two layers: one linear, one attending
    for i in range(len(answer.tokens)):
        row = eager_image_rows(out, i, layer, answer.layout.positions).mean(0)
        expected = by_hand(row, grid, unit, 0)
        ours = answer.attention(i, layer=layer)
        np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-5)
        # transposed (the units laid column-major) the placement would fail: the test tells them apart
        (gh, gw), u = grid, unit
        transposed = row.reshape(gw // u, gh // u).T.repeat(u, 0).repeat(u, 1)
        assert np.abs(ours - transposed).max() > 1e-3


def test_tokens_no_processor_output_places_still_answer_and_a_map_is_refused_in_one_line(folders, monkeypatch):
    """With no patch size the tower declares (the piece placing VipLLaVA's tokens reads), the answer and its
    attention over the image tokens still come; a map on the image is refused naming the missing piece."""
    from vit.sources.vlm import any_vlm

    real = any_vlm.read_tower

    def no_patch(config_json):
        from dataclasses import replace

        return replace(real(config_json), missing="a patch_size in its vision config")

    monkeypatch.setattr(any_vlm, "read_tower", no_patch)
    answer = vit.ask_vlm(vit.open_vlm(folders["vipllava"]), picture(), QUESTION, max_new_tokens=2)
    assert len(answer.tokens) == 2 and answer.image_rows(1, 0).shape[-1] == 16
    with pytest.raises(ValueError, match=r"^its image tokens are not placed on the image: a patch_size in its vision "
                                         r"config; their values come as a list over the image tokens \(image_rows\)$"):
        answer.attention(1)
    with pytest.raises(ValueError, match="not placed on the image: a patch_size"):
        answer.tam(1)


def test_a_type_outside_the_image_text_to_text_mapping_is_refused_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    import vit.checkpoint  # run alone, nothing imported it yet

    with pytest.raises(vit.checkpoint.CheckpointError, match=r"'bert' model, which transformers' image-text-to-text "
                                                             r"auto-mapping \(AutoModelForImageTextToText\) does not "
                                                             r"hold"):
        vit.open_vlm(tmp_path)


def test_predict_ask_writes_a_new_types_maps_as_the_api_draws_them(folders, answers, tmp_path, capsys):
    """The command line answers for GLM-OCR too: its npz holds the API's attention at every layer and head, and its
    TAM (the default ``--lm-method``)."""
    import json

    from vit.predict import main

    picture().save(tmp_path / "photo.png")
    maps = tmp_path / "maps"
    assert main([str(folders["glm_ocr"]), str(tmp_path / "photo.png"), "--ask", QUESTION, "--max-new-tokens",
                 str(NEW_TOKENS), "--save-maps", str(maps), "--device", "cpu"]) == 0
    [record] = json.loads(capsys.readouterr().out)
    answer = answers["glm_ocr"][0]
    assert record["tokens"] == list(answer.tokens)
    saved = np.load(record["maps"]["npz"])
    for i in range(len(answer.tokens)):
        for layer in range(2):
            for head in range(2):
                np.testing.assert_allclose(saved["attention"][i, layer, head], answer.attention(i, layer, head),
                                           rtol=0, atol=1e-6)
        np.testing.assert_allclose(saved["tam"][i], answer.tam(i), rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def blip2(tmp_path_factory):
    """BLIP-2 tiny: a Q-Former's 4 learned queries over a 4 x 4 patch grid (their count tiles it 2 x 2, and they
    cover no patch), an OPT language model whose stack is ``model.decoder``; no chat template, a raw prompt."""
    words = tokenizer(["<image>"])
    config = transformers.Blip2Config(
        vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8),
        qformer_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48,
                            encoder_hidden_size=32, vocab_size=len(words)),
        text_config=dict(model_type="opt", hidden_size=32, ffn_dim=48, num_hidden_layers=2, num_attention_heads=4,
                         vocab_size=len(words), word_embed_proj_dim=32, eos_token_id=1, pad_token_id=1),
        num_query_tokens=4, image_token_index=words.convert_tokens_to_ids("<image>"))
    processor = transformers.Blip2Processor(
        image_processor=transformers.BlipImageProcessor(size={"height": 32, "width": 32}), tokenizer=words,
        num_query_tokens=4)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("blip2")
    noisy(transformers.Blip2ForConditionalGeneration(config)).save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def test_learned_queries_answer_as_generate_with_their_rows_and_are_not_placed(blip2):
    """BLIP-2's answer is generate's and its rows the eager ones over its 4 query tokens; that 4 tokens would tile
    its 4 x 4 grid in 2 x 2 units does not place them: a map is refused naming what they are."""
    answer = vit.ask_vlm(vit.open_vlm(blip2), picture(), prompt=QUESTION, max_new_tokens=NEW_TOKENS)
    out, inputs, image_token = eager_generate(blip2, picture(), text=QUESTION)
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    assert torch.equal(answer.layout.positions, positions) and len(positions) == 4
    for i in range(len(answer.tokens)):
        for layer in range(2):
            np.testing.assert_allclose(answer.image_rows(i, layer).numpy(), eager_image_rows(out, i, layer, positions),
                                       rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match=r"^its image tokens are not placed on the image: they are a Q-Former's 4 "
                                         r"learned queries \(num_query_tokens\), which cover no patch; "):
        answer.attention(0)
