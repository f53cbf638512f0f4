"""VLMs whose image tokens are a VQ image tokenizer's codes (issue 113): Chameleon and Emu3 read the image as the codes
of a VQ-VAE (``vq_config``), each code one token of the language model's vocabulary, one per cell of the encoder's
latent grid (the image's side halved at each level of its ``channel_multiplier`` but the last). Built tiny by
transformers with their own processors (the VLM census's builder: the config's ``vocabulary_map`` made of the
tokenizer's vocabulary as transformers' own testers make it) and saved whole, each answers through ``vit.ask_vlm``
with transformers' greedy ``generate``'s tokens, each answer token's attention at every layer equal to the eager row,
and its image tokens are placed on the latent grid: Chameleon's 6 x 6 codes of its square crop row-major, Emu3's
9 x 11 codes of the 72 x 88 image it keeps at its aspect, each row closed by a row-end token over no cell. Chameleon's
processor class takes no chat template: the folder's (``chat_template.jinja``) is its tokenizer's, as transformers
loads it, and the question is asked through it."""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_vlm_answer import NEW_TOKENS, QUESTION, eager_image_rows  # noqa: E402
from vlm_saved import assert_answer_is_generates, assert_image_rows_are_eager, census_answers  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

KINDS = ("chameleon", "emu3")


def eager_generate(folder, image):
    """transformers alone: the eager model and the processor from ``folder``, the question through the folder's chat
    template (the processor's, else its tokenizer's: Chameleon's processor class takes none), greedy ``generate``
    with every step's attentions; and the prompt's inputs and the image token's id."""
    model = transformers.AutoModelForImageTextToText.from_pretrained(folder, attn_implementation="eager").eval()
    processor = transformers.AutoProcessor.from_pretrained(folder)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    templated = processor if processor.chat_template else processor.tokenizer
    text = templated.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(images=[image], text=text, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_attentions=True,
                             return_dict_in_generate=True)
    return out, inputs, processor.image_token_id


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    return census_answers(tmp_path_factory, KINDS, eager_generate)  # through the folder's chat template


@pytest.mark.parametrize("kind", KINDS)
def test_the_answer_is_generates_greedy_answer(answers, kind):
    assert_answer_is_generates(*answers[kind][:3])


@pytest.mark.parametrize("kind", KINDS)
def test_each_tokens_attention_at_every_layer_is_the_eager_row(answers, kind):
    assert_image_rows_are_eager(*answers[kind])


def test_chameleons_codes_are_placed_row_major_on_its_latent_grid(answers):
    """96-px crops (the census's tiny processor), four levels of halving: 6 x 6 cells of 16 px, one code each."""
    answer, out, inputs, _ = answers["chameleon"]
    assert tuple(inputs["pixel_values"].shape[-2:]) == (96, 96)
    assert answer.layout.grid == (6, 6) and answer.layout.unit == 1 and answer.layout.lead == 0
    for i in range(len(answer.tokens)):
        row = eager_image_rows(out, i, 1, answer.layout.positions).mean(0)  # (36,)
        ours = answer.attention(i, layer=1)
        np.testing.assert_allclose(ours, row.reshape(6, 6), rtol=0, atol=1e-5)
        assert np.abs(ours - row.reshape(6, 6).T).max() > 1e-3  # transposed, the placement would fail


def test_emu3s_codes_are_placed_row_major_each_row_closed_by_its_row_end(answers):
    """Emu3's processor keeps the 90 x 70 picture's aspect (72 x 88 px, multiples of its 8-px cells): 9 rows of 11
    codes, each row followed by the row-end token its model appends (``<|extra_200|>``): 9 x 12 image tokens, the
    twelfth of each row over no cell."""
    answer, out, inputs, _ = answers["emu3"]
    assert inputs["image_sizes"].tolist() == [[72, 88]] and len(answer.layout.positions) == 9 * 12
    assert answer.layout.grid == (9, 11)
    for i in range(len(answer.tokens)):
        row = eager_image_rows(out, i, 1, answer.layout.positions).mean(0)  # (108,)
        ours = answer.attention(i, layer=1)
        np.testing.assert_allclose(ours, row.reshape(9, 12)[:, :11], rtol=0, atol=1e-5)
        # read without the row ends, or the rows taken as columns, the placement would fail
        assert np.abs(ours - row[:99].reshape(9, 11)).max() > 1e-3
        assert np.abs(ours - row.reshape(12, 9)[:11].T).max() > 1e-3
