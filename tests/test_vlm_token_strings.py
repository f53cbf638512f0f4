"""Real InstructBLIP folders name their image token in tokenizer_config.json as a plain string ("image_token":
"<image>"), and transformers' processor, which reads it as a token object (``self.image_token.content``), fails on it
with an AttributeError (issue 113's review). Built tiny by the VLM census's generic builder with its own processor,
saved whole, its tokenizer config then naming the token as a string: the folder answers with transformers' greedy
``generate``'s tokens on the inputs its processor gives as saved (the token an object), and a string naming another
token than the model's is refused in one line."""

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_vlm_answer import NEW_TOKENS, QUESTION, picture  # noqa: E402
from vlm_saved import generated, saved  # noqa: E402

import vit  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds


@pytest.fixture(scope="module")
def instructblip(tmp_path_factory):
    folder = tmp_path_factory.mktemp("instructblip")
    return saved("instructblip", folder), folder


def named_as_string(folder, tmp_path, token: str):
    copy = tmp_path / "string"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["image_token"] = token
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    return copy


def test_an_image_token_named_as_a_string_answers_as_generate_does(instructblip, tmp_path):
    model, folder = instructblip
    copy = named_as_string(folder, tmp_path, "<image>")
    with pytest.raises(AttributeError, match="content"):  # transformers' own processor on the folder
        transformers.AutoProcessor.from_pretrained(copy)(images=[picture()], text=QUESTION, return_tensors="pt")
    inputs = transformers.AutoProcessor.from_pretrained(folder)(images=[picture()], text=QUESTION,
                                                                 return_tensors="pt")
    out = generated(model, folder, inputs)
    answer = vit.ask_vlm(vit.open_vlm(copy), picture(), prompt=QUESTION, max_new_tokens=NEW_TOKENS)
    # generate's sequences end with its NEW_TOKENS answer tokens (InstructBLIP's hold what its language model was given
    # beyond the image's queries before them)
    assert list(answer.tokens) == out.sequences[0, -NEW_TOKENS:].tolist() and len(answer.tokens) == NEW_TOKENS
    assert torch.equal(answer.layout.positions, (inputs["input_ids"][0] == model.config.image_token_index)
                       .nonzero()[:, 0])


def test_a_string_naming_another_token_than_the_models_is_refused_in_one_line(instructblip, tmp_path):
    _, folder = instructblip
    vlm = vit.open_vlm(named_as_string(folder, tmp_path, "<picture>"))
    with pytest.raises(ValueError, match="image placeholder '<picture>'") as e:  # never transformers' AttributeError
        vit.ask_vlm(vlm, picture(), prompt=QUESTION, max_new_tokens=1)
    assert "\n" not in str(e.value)
