"""Fuyu (issue 113): no vision tower, its image's 30-px patches flattened and projected straight into the language
model, and its processor writes the image's tokens itself, one per patch, each row of patches closed by a
``|NEWLINE|`` token, before a plain question. Built tiny by transformers with its own processor (the VLM census's
builder, its tokenizer putting the SentencePiece piece before each text as the checkpoint's does, which the processor
strips) and saved whole, it answers with transformers' greedy ``generate``'s tokens, each answer token's attention at
every layer equal to the eager row; its tokens are placed row-major on the patch rows the prompt lays out (a
120 x 50 picture: 2 rows of 4 patches, the second half padding), the pixels drawn those the patches hold."""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_vlm_answer import NEW_TOKENS, QUESTION, eager_image_rows, picture  # noqa: E402
from vlm_saved import assert_answer_is_generates, saved  # noqa: E402

import vit  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

WIDE = dict(width=120, height=50)  # 4 patches across, 2 down (50 px padded to 60)


@pytest.fixture(scope="module")
def fuyu(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuyu")
    saved("fuyu", folder)
    image = picture(**WIDE)
    answer = vit.ask_vlm(vit.open_vlm(folder), image, QUESTION, max_new_tokens=NEW_TOKENS)
    # transformers alone: the processor puts the image's tokens before the plain question itself
    reference = transformers.AutoModelForImageTextToText.from_pretrained(folder, attn_implementation="eager").eval()
    processor = transformers.AutoProcessor.from_pretrained(folder)
    inputs = processor(images=[image], text=QUESTION, return_tensors="pt")
    with torch.no_grad():
        out = reference.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_attentions=True,
                                 return_dict_in_generate=True)
    return answer, out, inputs, processor


def test_the_answer_is_generates_greedy_answer(fuyu):
    assert_answer_is_generates(*fuyu[:3])


def test_each_tokens_attention_at_every_layer_is_the_eager_row(fuyu):
    answer, out, inputs, processor = fuyu
    positions = (inputs["input_ids"][0] == processor.image_token_id).nonzero()[:, 0]
    assert torch.equal(answer.layout.positions, positions) and len(positions) == 2 * 4
    for i in range(len(answer.tokens)):
        for layer in range(len(out.attentions[0])):
            np.testing.assert_allclose(answer.image_rows(i, layer).numpy(),
                                       eager_image_rows(out, i, layer, positions), rtol=0, atol=1e-5)


def test_the_patch_rows_the_prompt_lays_out_are_the_grid(fuyu):
    answer, out, inputs, processor = fuyu
    ids = inputs["input_ids"][0].tolist()
    speaker, newline = processor.image_token_id, processor.image_newline_id
    assert ids[:10] == [speaker] * 4 + [newline] + [speaker] * 4 + [newline]  # two rows of four, each closed
    assert answer.layout.grid == (2, 4) and answer.layout.unit == 1
    for i in range(len(answer.tokens)):
        row = eager_image_rows(out, i, 1, answer.layout.positions).mean(0)  # (8,)
        ours = answer.attention(i, layer=1)
        np.testing.assert_allclose(ours, row.reshape(2, 4), rtol=0, atol=1e-5)
        assert np.abs(ours - row.reshape(4, 2).T).max() > 1e-3  # the patches taken column-major would fail


def test_the_pixels_drawn_are_the_patches_the_model_read(fuyu):
    """The 120 x 50 picture in the first 50 of the 60 rows its two patch rows cover (normalised to [-1, 1] and back:
    within one level), the rest the processor's padding."""
    answer = fuyu[0]
    pixels = answer.layout.pixels
    assert pixels.shape == (60, 120, 3)
    drawn = pixels[:50].astype(int)
    assert np.abs(drawn - np.asarray(picture(**WIDE)).astype(int)).max() <= 1
