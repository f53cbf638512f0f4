"""Types of the image-text-to-text auto-mapping the road refused for a piece it misread (issue 113, item 1), built tiny
by the VLM census's generic builder with their own processors' classes and saved whole:

- no chat template, the processor itself putting the image's tokens in a plain question: BLIP-2's and InstructBLIP's
  Q-Former queries before the text, Kosmos-2's latent queries between its image markers (found by the processor's
  ``image_embeds_position_mask``, its config naming no image token); Kosmos-2.5's latent queries over its flattened
  patches, whose ``max_patches`` counts patches, not tiles: each answers with ``generate``'s tokens on the same plain
  question, each answer token's attention at every layer the eager row, and a map on the image is refused in one line
  naming its learned queries;
- Video-LLaVA's images under ``pixel_values_images`` and Gemma 4 Unified's encoder-free embedder (each 48-px patch
  one image token, where its processor's ``image_position_ids`` say): placed, checked against the positions the
  processor states, on a placement that would fail transposed.
"""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_vlm_answer import (  # noqa: E402
    NEW_TOKENS,
    QUESTION,
    by_hand,
    eager_image_rows,
    picture,
    processor_inputs,
)
from vlm_saved import saved  # noqa: E402

import vit  # noqa: E402
from vit.registry import VLM_ARCHITECTURES  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

# Each type, and what its image tokens are when they are not placed (None: placed)
KINDS = {"blip-2": r"a Q-Former's 32 learned queries \(num_query_tokens\)",
         "instructblip": r"a Q-Former's 32 learned queries \(num_query_tokens\)",
         "kosmos-2": r"64 learned latent queries over the tower's states \(latent_query_num\)",
         "kosmos-2.5": r"2048 learned latent queries over the tower's states \(latent_query_num\)",
         "video_llava": None, "gemma4_unified": None}


@pytest.fixture(scope="module", params=list(KINDS))
def asked(request, tmp_path_factory):
    """``(kind, vit's answer, transformers' eager generate output, the processor's inputs, the image's positions)``:
    the plain question, as the processor lays it out itself (no chat template) or through the template."""
    kind = request.param
    with pytest.MonkeyPatch.context() as patch:
        if kind == "kosmos-2.5":
            # Kosmos-2.5's 4,096 patches read as patches (tests/test_vlm_tower_sizes); fewer here, for time: its
            # processor's call takes max_patches from the processor class's images_kwargs (4,096), not from its image
            # processor's (which left the tower 4,096 patches, 4.8 s of CPU), so that default is the one set, for
            # vit's answer and transformers' reference alike
            patch.setattr(transformers.Kosmos2_5Processor, "images_kwargs",
                          {**transformers.Kosmos2_5Processor.images_kwargs, "max_patches": 256})
        return _asked(kind, tmp_path_factory.mktemp(kind.replace(".", "_")))


def _asked(kind: str, folder):
    model = saved(kind, folder, images={"max_patches": 256} if kind == "kosmos-2.5" else None)
    answer = vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    templated = transformers.AutoProcessor.from_pretrained(folder).chat_template is not None
    reference = type(model).from_pretrained(folder, attn_implementation="eager").eval()
    inputs = processor_inputs(folder, picture(), None if templated else QUESTION).to(dtype=reference.dtype)
    with torch.no_grad():
        out = reference.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_attentions=True,
                                 return_dict_in_generate=True)
    marked = inputs.get("image_embeds_position_mask")  # Kosmos-2's: its config names no image token
    image_token = getattr(reference.config, "image_token_id", None) or getattr(reference.config,
                                                                               "image_token_index", None)
    positions = (marked[0] if marked is not None else inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    if kind == "kosmos-2.5":
        assert inputs["flattened_patches"].shape[1] == 256  # the patches set, the processor's own call
    return kind, answer, out, inputs, positions


def test_the_answer_and_its_rows_are_generates(asked):
    kind, answer, out, inputs, positions = asked
    assert kind not in VLM_ARCHITECTURES
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    assert len(positions) and torch.equal(answer.layout.positions, positions)
    for i in range(len(answer.tokens)):
        for layer in range(len(out.attentions[0])):
            np.testing.assert_allclose(answer.image_rows(i, layer).numpy(), eager_image_rows(out, i, layer, positions),
                                       rtol=0, atol=1e-5)


def test_learned_queries_are_refused_on_the_image_in_one_line(asked):
    kind, answer, *_ = asked
    if KINDS[kind] is None:
        pytest.skip("placed: test_the_image_tokens_are_placed_where_the_processor_says")
    with pytest.raises(ValueError, match=rf"^its image tokens are not placed on the image: they are {KINDS[kind]}, "
                                         r"which cover no patch; "):
        answer.attention(0)


def _stated(kind: str, inputs, count: int) -> np.ndarray:
    """(grid rows, grid columns) -> image token index, as the processor's outputs state where each token's patch is:
    Gemma 4 Unified's ``image_position_ids`` (each patch's column and row, -1 padding), Video-LLaVA's CLIP patches
    (224 / 14 a side, the CLS dropped) row-major."""
    if kind == "gemma4_unified":
        where = inputs["image_position_ids"][0]
        where = where[(where >= 0).all(-1)]
        assert len(where) == count
        index = np.full((int(where[:, 1].max()) + 1, int(where[:, 0].max()) + 1), -1)
        for k, (col, row) in enumerate(where.tolist()):
            index[row, col] = k
        return index
    side = inputs["pixel_values_images"].shape[-1] // 14
    assert side * side == count
    return np.arange(count).reshape(side, side)


def test_the_image_tokens_are_placed_where_the_processor_says(asked):
    kind, answer, out, inputs, positions = asked
    if KINDS[kind] is not None:
        pytest.skip("learned queries: test_learned_queries_are_refused_on_the_image_in_one_line")
    index = _stated(kind, inputs, len(positions))
    assert (index >= 0).all() and answer.layout.grid == index.shape and answer.layout.unit == 1
    for i in range(len(answer.tokens)):
        row = eager_image_rows(out, i, 1, positions).mean(0)
        ours = answer.attention(i, layer=1)
        np.testing.assert_allclose(ours, row[index], rtol=0, atol=1e-5)
        np.testing.assert_allclose(ours, by_hand(row, index.shape, 1, 0), rtol=0, atol=1e-5)
        # laid column-major the placement would fail: the test tells them apart
        transposed = row.reshape(index.shape[1], index.shape[0]).T
        assert np.abs(ours - transposed).max() > 1e-3
