"""Which class answers a VLM folder (``whole_vlm.architecture_of``): the one transformers' image-text-to-text
auto-mapping gives its model type, also when the folder names it by a subclass (a deprecated alias); a folder naming a
class with no ``generate`` has no language-model head; one naming another generating class (BLIP's question
answerer) is refused in one line that names the class to open instead, and the refusal's premise is checked on
transformers' own BlipForQuestionAnswering: its decoder attends to its text encoder's states over the question, not
to the image's tokens."""
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import vit  # noqa: E402
from vit.sources.vlm.whole_vlm import VLMError, architecture_of, can_answer  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds


def saved_config(folder, model_type: str, architecture: str):
    (folder / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": [architecture]}))
    return folder


def test_a_subclass_of_the_mapped_class_answers_as_the_mapped_class(tmp_path):
    """Ernie 4.5 VL's folders name the deprecated ``Ernie4_5_VL_MoeForConditionalGeneration``, a subclass of the
    mapped ``Ernie4_5_VLMoeForConditionalGeneration`` that only warns: the same weights, answered through it."""
    mapped = "Ernie4_5_VLMoeForConditionalGeneration"
    alias = "Ernie4_5_VL_MoeForConditionalGeneration"
    assert issubclass(getattr(transformers, alias), getattr(transformers, mapped))
    folder = saved_config(tmp_path, "ernie4_5_vl_moe", alias)
    assert architecture_of(folder) == ("ernie4_5_vl_moe", mapped)
    assert can_answer(folder)


@pytest.mark.parametrize("named", ["BlipModel", "BlipForImageTextRetrieval", "NoSuchClass", "__class__"])
def test_a_class_without_generate_has_no_language_model_head(tmp_path, named):
    folder = saved_config(tmp_path, "blip", named)
    with pytest.raises(VLMError, match="no language-model head to answer with; open a BlipForConditionalGeneration"):
        architecture_of(folder)
    assert not can_answer(folder)


@pytest.fixture(scope="module")
def question_answerer(tmp_path_factory):
    """A tiny random ``BlipForQuestionAnswering`` saved with its own save_pretrained."""
    torch.manual_seed(0)
    config = transformers.BlipConfig(
        vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8),
        text_config=dict(vocab_size=60, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=2, encoder_hidden_size=32, max_position_embeddings=32,
                         bos_token_id=2, sep_token_id=3, pad_token_id=0),
        projection_dim=32)
    model = transformers.BlipForQuestionAnswering(config).eval()
    folder = tmp_path_factory.mktemp("blip_vqa")
    model.save_pretrained(folder)
    return model, folder


def test_blip_question_answering_is_refused_in_one_line_naming_the_captioner(question_answerer):
    folder = question_answerer[1]
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["BlipForQuestionAnswering"]
    with pytest.raises(VLMError) as refused:
        vit.open_vlm(folder)
    line = str(refused.value)
    assert "\n" not in line and "no language-model head" not in line  # it has one: it generates
    assert "BlipForQuestionAnswering, which writes its answer through its own generate" in line
    assert line.endswith("open a folder saved as a BlipForConditionalGeneration")
    assert not can_answer(folder)


def test_blip_question_answerers_decoder_attends_to_the_question_not_the_image(question_answerer):
    """The refusal's premise, on transformers' own model: each answer token's cross-attention keys are the text
    encoder's states over the question's tokens, not the ViT's CLS and patches."""
    model = question_answerer[0]
    keys = []
    hook = model.text_decoder.register_forward_pre_hook(
        lambda _m, _a, kwargs: keys.append(kwargs["encoder_hidden_states"].shape[1]), with_kwargs=True)
    question = torch.tensor([[2, 7, 8, 9, 10, 11, 12]])
    with torch.no_grad():
        model.generate(input_ids=question, pixel_values=torch.randn(1, 3, 32, 32), max_new_tokens=3)
    hook.remove()
    image_tokens = 1 + (32 // 8) ** 2
    assert keys and set(keys) == {question.shape[1]} and question.shape[1] != image_tokens


def test_every_mapped_class_with_its_own_generation_is_refused_before_it_is_built():
    """A class whose generation is its own (``generation_config_class`` other than transformers' ``GenerationConfig``:
    Diffusion Gemma's block diffusion denoises a canvas of tokens, no answer token with one query row) is refused by
    ``answering_problem`` from its class alone, so the road never builds one: found by reading each mapped type's
    modeling code (an import of every model would take seconds), then its class checked."""
    from pathlib import Path

    from transformers.models.auto.configuration_auto import model_type_to_module_name
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    from vit.sources.vlm.whole_vlm import answering_problem

    models = Path(transformers.__file__).parent / "models"
    own = []
    for model_type, architecture in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.items():
        folder = models / model_type_to_module_name(model_type)
        if any("generation_config_class" in f.read_text() for f in folder.glob("modeling_*.py")):
            cls = getattr(transformers, architecture)
            if cls.generation_config_class is not transformers.GenerationConfig:
                own.append(architecture)
    assert "DiffusionGemmaForBlockDiffusion" in own
    for architecture in own:
        assert answering_problem(architecture) is not None, architecture
