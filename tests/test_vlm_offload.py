"""A VLM placed across devices and offloaded (issue 92, item 5): ``vit.open_vlm(folder, device_map=...,
offload_folder=...)`` places transformers' model through accelerate (here on CPU: one decoder layer and the head
offloaded to disk, the rest in memory, as a model larger than its GPUs is), and every map of an answer is the same as
the model's in one place: the tokens, every layer's attention, gradient x attention, TAM (which reads the head's
rows: brought in by accelerate's own hook), AttnLRP (its rules run inside accelerate's hooks) and the logit lens.
``dtype`` opens the weights in another precision, its answer transformers' own in that precision.
"""

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from test_vlm_answer import NEW_TOKENS, QUESTION, picture, processor_inputs, saved_whole  # noqa: E402

import vit  # noqa: E402
from vit.sources.vlm.whole_vlm import VLMError  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

PLACED = {"model.vision_tower": "cpu", "model.multi_modal_projector": "cpu", "model.language_model.embed_tokens": "cpu",
          "model.language_model.layers.0": "disk", "model.language_model.layers.1": "cpu",
          "model.language_model.norm": "cpu", "model.language_model.rotary_emb": "cpu", "lm_head": "disk"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return saved_whole(tmp_path_factory, ["llava"])["llava"]


@pytest.fixture(scope="module")
def both(folder, tmp_path_factory):
    whole = vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    vlm = vit.open_vlm(folder, device_map=PLACED, offload_folder=tmp_path_factory.mktemp("offload"))
    return whole, vit.ask_vlm(vlm, picture(), QUESTION, max_new_tokens=NEW_TOKENS), vlm


def test_an_offloaded_model_is_placed_as_asked(both):
    _, _, vlm = both
    assert vlm.model.hf_device_map == PLACED and vlm.device == torch.device("cpu")
    assert vlm.model.lm_head.weight.device.type == "meta"  # on disk until it runs


def test_every_map_of_an_offloaded_model_is_the_one_in_one_place(both):
    whole, placed, _ = both
    assert placed.tokens == whole.tokens
    for i in range(NEW_TOKENS):
        for layer in range(whole.layers):
            for head in (None, 0, 3):
                np.testing.assert_allclose(placed.attention(i, layer, head), whole.attention(i, layer, head),
                                           rtol=0, atol=1e-6)
    for name, call in [("gradxattn", lambda a: a.relevance(2)), ("gradxattn layer", lambda a: a.relevance(2, 0)),
                       ("tam", lambda a: a.tam(2)), ("attnlrp", lambda a: a.relevance(2, method="attnlrp")),
                       ("lens", lambda a: a.logit_lens(2))]:
        np.testing.assert_allclose(call(placed), call(whole), rtol=0, atol=1e-5, err_msg=name)


def test_another_precision_answers_as_transformers_does_in_it(folder):
    vlm = vit.open_vlm(folder, dtype="bfloat16")
    assert next(vlm.model.parameters()).dtype == torch.bfloat16
    answer = vit.ask_vlm(vlm, picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    config = json.loads((folder / "config.json").read_text())
    model = getattr(transformers, config["architectures"][0]).from_pretrained(folder, dtype=torch.bfloat16).eval()
    inputs = processor_inputs(folder, picture())
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert list(answer.tokens) == out[0, inputs["input_ids"].shape[1]:].tolist()
    assert np.isfinite(answer.attention(1)).all()


def test_a_wrong_precision_or_a_device_and_a_device_map_are_refused_in_one_line(folder):
    with pytest.raises(VLMError, match=r"^dtype must be one of auto, float32, bfloat16, float16, got 'int8'$"):
        vit.open_vlm(folder, dtype="int8")
    with pytest.raises(VLMError, match=r"^give a device or a device_map .*, not both$"):
        vit.open_vlm(folder, "cpu", device_map="auto")
