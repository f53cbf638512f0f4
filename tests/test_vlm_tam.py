"""TAM, the Token Activation Map of a VLM's answer token (issue 80, item 2d): Li et al., ICCV 2025, equal to the
authors' ``TAM`` (xmed-lab/TAM, commit 7c7df1d, ``tam.py``, vendored under tests/reference/tam).

The reference is run as the authors' ``demo.py`` and ``eval.py`` run it: transformers' own ``generate`` with
``output_hidden_states=True``, ``logits = [model.lm_head(feats[-1]) for feats in outputs.hidden_states]``, then
``TAM(tokens, vision_shape, logits, special_ids, image, processor, '', i, records)`` for each round ``i`` in turn with
one shared record list. Its map is the rank Gaussian filter's output, caught before the authors cast it to uint8
(their ``* 255`` for the picture), and compared with ``VLMAnswer.tam`` to 1e-5 of its peak, each image token's value
written into every patch its unit covers. ``special_ids`` is the authors' form for each family (Qwen: between the
vision start and end tokens; LLaVA: every image token; the question between the image and the assistant's turn).
"""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("cv2")  # the authors' function converts the picture with OpenCV

from test_vlm_answer import (  # noqa: E402,F401
    NEW_TOKENS,
    QUESTION,
    internvl_tiles,
    llava_onevision,
    nearest_tokens,
    packed_tags,
    picture,
    processor_inputs,
    saved_whole,
)

import vit  # noqa: E402
from vit.costs.bounds import TooManyTokens  # noqa: E402
from vit.explain.language.vlm_tam import rank_gaussian_filter  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

TOL = 1e-5
TAM_KINDS = ["llava", "qwen2_5_vl"]


@pytest.fixture(scope="module")
def reference_tam():
    from reference.tam import tam

    return tam


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``{kind: folder}``: LLaVA and Qwen2.5-VL (the authors' demo family) saved whole with their processors."""
    return saved_whole(tmp_path_factory, TAM_KINDS)


@pytest.fixture(scope="module")
def asked(folders):
    return {kind: vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=NEW_TOKENS)
            for kind, folder in folders.items()}


def authors_maps(tam, folder, monkeypatch, eci: bool = True) -> tuple[list[int], list[np.ndarray], tuple]:
    """The authors' way: ``(generated ids, [each round's map before the uint8 cast], vision_shape)``; ``eci``
    False: their least-squares factor held at 0, the causal inference undone."""
    import json

    config = json.loads((folder / "config.json").read_text())
    model = getattr(transformers, config["architectures"][0]).from_pretrained(folder).eval()
    processor = transformers.AutoProcessor.from_pretrained(folder)
    inputs = processor_inputs(folder, picture())
    with torch.no_grad():
        outputs = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True,
                                 output_hidden_states=True, return_dict_in_generate=True)
        logits = [model.lm_head(feats[-1]) for feats in outputs.hidden_states]
    tokens = outputs.sequences[0].tolist()
    prompt = inputs["input_ids"].shape[1]
    ids = processor.tokenizer.convert_tokens_to_ids
    assistant = ids("assistant:")
    # The authors' special ids locate by the last occurrence; the answer must not repeat them
    assert assistant not in tokens[prompt:] and tokens.count(assistant) == 1
    if config["model_type"] == "qwen2_5_vl":  # their demo's: between <|vision_start|> and <|vision_end|>
        start, end = ids("<|vision_start|>"), ids("<|vision_end|>")
        special_ids = {"img_id": [start, end], "prompt_id": [end, [assistant]], "answer_id": [[assistant], -1]}
        t, h, w = inputs["image_grid_thw"][0].tolist()
        vision_shape = (h // 2, w // 2)
    else:  # LLaVA: every token of the image token's id (their int form), the question after the last one
        image = model.config.image_token_id
        special_ids = {"img_id": [image], "prompt_id": [[image], [assistant]], "answer_id": [[assistant], -1]}
        side = inputs["pixel_values"].shape[-1] // config["vision_config"]["patch_size"]
        vision_shape = (side, side)
    caught = []
    filter_ = tam.rank_guassian_filter
    monkeypatch.setattr(tam, "rank_guassian_filter", lambda img, k=3: caught.append(filter_(img, k)) or caught[-1])
    if not eci:
        monkeypatch.setattr(tam, "least_squares", lambda map1, map2: 0.0)
    maps, records = [], []
    for i in range(len(logits)):
        before = len(caught)
        returned = tam.TAM(tokens, vision_shape, logits, special_ids, picture(), processor, "", i, records, True)
        # Round 0 maps every question word and returns the first's (their ``first_ori``); later rounds map one
        np.testing.assert_array_equal(returned, (caught[before] * 255).astype("uint8"))
        maps.append(caught[before])
    monkeypatch.undo()
    return tokens[prompt:], maps, vision_shape


@pytest.mark.parametrize("kind", TAM_KINDS)
def test_each_tokens_tam_is_the_authors(folders, asked, reference_tam, monkeypatch, kind):
    answer = asked[kind]
    tokens, maps, shape = authors_maps(reference_tam, folders[kind], monkeypatch)
    assert list(answer.tokens) == tokens and len(maps) == NEW_TOKENS
    unit = answer.layout.unit
    for i, expected in enumerate(maps):
        assert expected.shape == shape and expected.max() > 0
        placed = np.repeat(np.repeat(expected, unit, axis=0), unit, axis=1)
        np.testing.assert_allclose(answer.tam(i), placed, rtol=0, atol=TOL * expected.max())


@pytest.mark.parametrize("kind", TAM_KINDS)
def test_the_causal_inference_step_changes_the_maps_it_is_checked_on(folders, asked, reference_tam, monkeypatch,
                                                                       kind):
    """Without the estimated causal inference the authors' maps move far past the tolerance: the test above fails
    for a port that drops it."""
    _, maps, _ = authors_maps(reference_tam, folders[kind], monkeypatch, eci=False)
    answer = asked[kind]
    unit = answer.layout.unit
    moved = [np.abs(answer.tam(i)[::unit, ::unit] - m).max() / m.max() for i, m in enumerate(maps) if i > 0]
    assert max(moved) > 100 * TOL


def test_the_rank_gaussian_filter_is_the_authors(reference_tam):
    values = np.random.default_rng(0).normal(0.3, 0.4, (7, 5)).astype(np.float32)
    values[0, :] = 0  # windows whose mean is not positive
    np.testing.assert_allclose(rank_gaussian_filter(values), reference_tam.rank_guassian_filter(values, 3),
                               rtol=0, atol=1e-6)


def test_a_raw_prompt_without_the_question_is_refused_in_one_line(folders):
    vlm = vit.open_vlm(folders["llava"])
    answer = vit.ask_vlm(vlm, picture(), prompt="<image>", max_new_tokens=2)
    with pytest.raises(ValueError, match="question"):
        answer.tam(1)


def test_tam_over_the_memory_limit_is_refused_before_the_forward(asked, monkeypatch):
    answer = asked["llava"]
    vlm = answer._source[0]
    monkeypatch.setattr(vlm.model.base_model, "forward", lambda *a, **k: pytest.fail("the model ran"))
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.01")
    with pytest.raises(TooManyTokens, match=r"^TAM of answer token 3 runs the model over \d+ tokens \(a 4x4-patch "
                                            r"image\): about .* MB, over the 0 MB limit \(VIT_ANALYSIS_MEMORY_MB\); "
                                            r"choose an earlier token or a smaller image\.$"):
        answer.tam(3)
    with pytest.raises(ValueError, match=r"^answer token 5 does not exist"):
        answer.tam(5)


def test_the_cost_counts_the_classes_rows_never_the_vocabulary_over_every_position(folders):
    """The head's rows over the image tokens grow with the classes asked, not with the vocabulary x tokens."""
    import dataclasses

    from vit.costs import plan
    from vit.explain.language.vlm_answer import text_shape

    vlm = vit.open_vlm(folders["llava"])
    text = text_shape(vlm)
    big = dataclasses.replace(text, vocab=10 ** 6)
    parts = dict(plan.vlm_tam(vlm.tower.model, (4, 4), big, 40, 3, 16, 8).parts)
    rows = parts["the head's rows of the classes and their activations"]
    assert rows == 8 * (text.hidden + 16 + 40) * 4 + 10 ** 6 * 4  # one vocabulary row: the greedy class


def test_a_tiled_images_tam_is_on_the_tiles_canvas_and_its_overview(internvl_tiles):  # noqa: F811
    """The authors filter each image's own token grid and ask crops to be mapped to the image ("map crops to raw
    size"): InternVL's tiles are filtered on their canvas, the thumbnail on its own grid, each unit's patches alike."""
    from vit.explain.language.vlm_tam import token_canvas

    answer = vit.ask_vlm(vit.open_vlm(internvl_tiles), picture(), QUESTION, max_new_tokens=3)
    for overview in (False, True):
        layout = answer.layout.view(overview)
        index, unit = token_canvas(layout)
        drawn = answer.tam(2, overview=overview)
        assert drawn.shape == layout.grid == tuple(s * unit for s in index.shape)
        assert (drawn == np.repeat(np.repeat(drawn[::unit, ::unit], unit, 0), unit, 1)).all()
        assert np.isfinite(drawn).all() and 0 <= drawn.min() and drawn.max() <= 1


def test_llava_onevisions_tam_is_filtered_on_its_tokens_own_grid(llava_onevision):  # noqa: F811
    """LLaVA-OneVision's canvas tokens (8 x 10, or 5 x 6 shrunk past anyres_max_2) are filtered on their own grid,
    its newlines left out, and drawn on each patch of the unpadded canvas the token ``pack_image_features`` samples
    nearest it covers; the base image's 4 x 4 as the overview."""
    answer = vit.ask_vlm(vit.open_vlm(llava_onevision), picture(), QUESTION, max_new_tokens=3)
    inputs = processor_inputs(llava_onevision, picture())
    index = nearest_tokens(packed_tags(llava_onevision, inputs), 0, 1, (8, 10))  # (8, 10) into the image tokens
    values = answer.image_tam(2)
    high = 5 if len(values) == 16 + 5 * 7 else 8
    own = values[16:].reshape(high, -1)[:, :-1]  # each row's newline dropped
    filtered = np.zeros(len(values), dtype=np.float32)
    filtered[16:] = np.pad(rank_gaussian_filter(own), ((0, 0), (0, 1))).reshape(-1)
    np.testing.assert_allclose(answer.tam(2), filtered[index], rtol=0, atol=1e-6)
    np.testing.assert_allclose(answer.tam(2, overview=True), rank_gaussian_filter(values[:16].reshape(4, 4)),
                               rtol=0, atol=1e-6)
