"""A VLM's language model read where transformers reads it (issue 113): configs the census's generic builder met that
the checks before a folder is opened misread, each checked on transformers' own config and model classes.

- GLM-5 Next's latent attention states ``head_dim: 0`` (transformers' convention: the rotary part's width, none
  here); the declared parameters' bound counts what a latent attention surely has instead of refusing the folder,
  and stays at most what transformers' own model holds. Its linear-attention layers name their mixer ``self_attn``
  but state their kind: none of them is read as attention.
- A class of the image-text-to-text auto-mapping that cannot answer about an image in text is refused in one line
  before its language model is read: PI0 (no ``generate``: it predicts a robot's actions; its language model two
  configs deep), Mistral 4's causal language model (no image input); a processor that reads clips alone
  (InstructBLIP Video's) is named so.
- A timm tower whose ``model_args`` state no sizes (FastVLM's FastViT-MCi3, as its checkpoint's config gives it) is
  counted as timm builds it: its attention modules, their heads and width, its total stride the patch.
- Weights transformers' own renaming reads under names the model lacks (ShieldGemma 2's folder as the mapping's
  Gemma3ForConditionalGeneration saves it) are refused naming that renaming, not a weights file to copy.
- A VQ image tokenizer in place of a tower (Chameleon's, Emu3's ``vq_config``): its cells the patches; a vision
  config inside the encoder's (T5Gemma 2's) named in the refusal.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # importing transformers takes seconds

GLM5_NEXT = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                 intermediate_size=64, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
                 kv_lora_rank=16, q_lora_rank=16, qk_nope_head_dim=8, v_head_dim=8, vocab_size=100, pad_token_id=0,
                 linear_head_dim=8, linear_num_heads=4, index_head_dim=8, index_n_heads=2, index_topk=32,
                 index_kpool=16)


@pytest.fixture(scope="module")
def glm5_next():
    config = transformers.Glm5NextTextConfig(**GLM5_NEXT)
    with torch.device("meta"):
        return config, transformers.Glm5NextTextModel(config)


def test_a_latent_attention_with_head_dim_0_is_counted_by_its_value_heads_and_latent_rank(glm5_next):
    from vit.sources.vlm.declared import text_parameters

    config, model = glm5_next
    assert config.head_dim == 0 and config.layer_types[-1] == "indexed_attention"
    hidden, heads, layers = 32, 4, 4
    attention = heads * 8 * hidden + hidden * 16  # o_proj from 4 heads' 8-wide values; the keys' down-projection
    expected = 100 * hidden + layers * (attention + 2 * hidden * 64)
    assert text_parameters(config) == expected
    assert expected <= sum(p.numel() for p in model.parameters())  # a bound transformers' own model holds


def test_linear_attention_layers_named_self_attn_are_not_read_as_attention(glm5_next):
    from vit.core.recording_attention import attention_of
    from vit.explain.language.vlm_attention import attention_layers, linear_layers

    config, model = glm5_next
    kinds = [layer.block_type for layer in model.layers]
    assert kinds == ["linear_attention"] * 3 + ["indexed_attention"]
    assert [attention_of(layer) for layer in model.layers[:3]] == [None] * 3
    assert [n for n, _ in attention_layers(model)] == [3]
    assert attention_layers(model)[0][1] is model.layers[3].self_attn
    assert linear_layers(model) == ["Glm5NextTextLinearAttention"]


@pytest.mark.parametrize(("architecture", "refusal"), [
    ("PI0ForConditionalGeneration", "transformers' PI0ForConditionalGeneration generates no text (its can_generate() "
                                    "is False: it has no generate to answer with)"),
    ("Mistral4ForCausalLM", "transformers' Mistral4ForCausalLM takes no image (its forward has no pixel_values, "
                            "patches or image input); ask a model that does"),
    ("Kosmos2_5ForConditionalGeneration", None),  # its image comes as flattened_patches
    ("LlavaForConditionalGeneration", None)])
def test_a_class_that_cannot_answer_about_an_image_in_text_is_refused_in_one_line(architecture, refusal):
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    from vit.sources.vlm.whole_vlm import answering_problem

    assert architecture in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.values()  # each one the auto-mapping holds
    assert answering_problem(architecture) == refusal


def test_pi0s_folder_is_refused_for_its_generation_not_its_nested_language_model(tmp_path):
    """PI0's language model sits two configs deep (``vlm_config.text_config``), which ``get_text_config`` does not
    reach; before any of it is read, the folder is refused for what the class is: it predicts actions, no text."""
    import json

    import vit
    from vit.sources.vlm.whole_vlm import VLMError

    (tmp_path / "config.json").write_text(json.dumps(transformers.PI0Config().to_dict()))
    with pytest.raises(VLMError) as refused:
        vit.open_vlm(tmp_path)
    assert str(refused.value) == (f"{tmp_path} is refused: transformers' PI0ForConditionalGeneration generates no "
                                  "text (its can_generate() is False: it has no generate to answer with)")


def test_a_clip_only_processor_is_refused_naming_its_video_processor(tmp_path):
    """InstructBLIP Video's processor holds a video processor and no image processor: the folder is refused in one
    line saying so, not told to save a processor it has."""
    import vit
    from bench.census_vlm import generic_build
    from vit.sources.vlm.whole_vlm import VLMError

    torch.manual_seed(0)
    model, processor = generic_build("instructblipvideo")
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    with pytest.raises(VLMError) as refused:
        vit.open_vlm(tmp_path)
    assert str(refused.value) == (f"{tmp_path} is refused: its processor (InstructBlipVideoProcessor) reads clips "
                                  "alone (a video processor, no image processor); its model is asked about a clip, "
                                  "not an image")


def test_a_timm_towers_sizes_are_read_from_the_model_timm_builds():
    import timm

    from vit.sources.vlm.any_vlm import _timm_sizes

    vision = transformers.FastVlmConfig().vision_config  # model_args {"inference_mode": True}: no sizes
    assert vision.model_args == {"inference_mode": True}
    with torch.device("meta"):
        model = timm.create_model("fastvit_mci3", pretrained=False, inference_mode=True)
    attending = [m for m in model.modules() if isinstance(m, timm.models.fastvit.Attention)]
    assert [m.num_heads for m in attending] == [24] * 4 + [48] * 2  # its last two stages attend, 32-wide heads
    assert _timm_sizes(vision) == (dict(layers=6, heads=48, hidden_size=48 * 32), 64)


def test_weights_transformers_reads_under_names_the_model_lacks_are_named_so(tmp_path):
    """ShieldGemma 2 (issue 113): transformers' ``shieldgemma2`` conversion adds its classifier's ``model.`` prefix
    to the generating class's keys too, so the folder the image-text-to-text mapping's Gemma3ForConditionalGeneration
    saves does not load back: transformers' own loading report misses the language model's weights (here the
    reference). The refusal names that renaming, not a file to copy."""
    import vit
    from bench.census_vlm import generic_build
    from vit.sources.vlm.whole_vlm import VLMError

    torch.manual_seed(0)
    model, processor = generic_build("shieldgemma2")
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    _, loaded = transformers.AutoModelForImageTextToText.from_pretrained(tmp_path, output_loading_info=True)
    missing = sorted(loaded["missing_keys"])
    assert "lm_head.weight" in missing and "model.language_model.embed_tokens.weight" in missing
    with pytest.raises(VLMError) as refused:
        vit.open_vlm(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path} is refused: transformers {transformers.__version__} reads its weights files' tensors under names "
        "its Gemma3ForConditionalGeneration lacks (model.language_model.model.embed_tokens.weight as "
        f"model.model.language_model.model.embed_tokens.weight, and {len(missing) - 2} more), so {len(missing)} of "
        f"the model's weights ({missing[0]}, {missing[1]} and {len(missing) - 2} more) would be filled at random: "
        "these files do not load as this class")


def test_a_vq_tokenizers_cells_are_its_patches():
    """Chameleon's default VQ-VAE (the checkpoint's: five levels, 512-px images, 1,024 image tokens a prompt): 32 x
    32 codes, so 16-px cells, one token each; Emu3's four levels: 8-px cells (its processor's downsample_ratio)."""
    from vit.sources.vlm.any_vlm import read_tower

    chameleon = read_tower(transformers.ChameleonConfig().to_dict())
    assert chameleon.shape.patch_hw == (16, 16) and chameleon.unit == 1 and not chameleon.missing
    assert 512 // 16 * (512 // 16) == transformers.ChameleonProcessor.__init__.__defaults__[0]  # image_seq_length
    emu3 = read_tower(transformers.Emu3Config().to_dict())
    assert emu3.shape.patch_hw == (8, 8) and emu3.unit == 1


def test_a_vision_config_inside_the_encoders_is_named_in_the_refusal():
    from vit.sources.vlm.any_vlm import read_tower

    with pytest.raises(ValueError) as refused:
        read_tower(transformers.T5Gemma2Config().to_dict())
    assert str(refused.value) == (
        "its vision config is its encoder's (encoder.vision_config): the image is read by its encoder, and reaches "
        "the answer through the decoder's attention over the encoder's states, which is read here only from a "
        "decoder's cross-attention layers (Florence-2's)")


def test_a_timm_towers_model_args_never_name_a_file_timm_reads(tmp_path):
    """model_args come from the folder's config.json: create_model's own arguments (a checkpoint_path it would load)
    are not passed, only the model's."""
    from vit.sources.vlm.any_vlm import _timm_sizes

    vision = transformers.FastVlmConfig().vision_config
    vision.model_args = {"inference_mode": True, "checkpoint_path": str(tmp_path / "absent.pth")}
    assert _timm_sizes(vision) == (dict(layers=6, heads=48, hidden_size=48 * 32), 64)
