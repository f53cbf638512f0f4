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
from lazy_modules import lazy

transformers = pytest.importorskip("transformers")
lazy("cv2")  # the authors' function converts the picture with OpenCV (imported when it does)

from test_vlm_answer import (  # noqa: E402,F401
    NEW_TOKENS,
    QUESTION,
    internvl_tiles,
    llava_next,
    llava_onevision,
    nearest_tokens,
    noisy,
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
# Every family ``vit.ask_vlm`` answers for, one view each (the tiled ones below)
TAM_KINDS = ["llava", "llava_full", "qwen2_5_vl", "qwen3_vl", "internvl", "gemma3", "paligemma", "paligemma2", "glm4v",
             "mistral3", "pixtral"]  # Qwen3.5's test folder left out: transformers reloads its word-level tokenizer
# as Qwen3_5Tokenizer, whose own BPE spells the question's words otherwise, so the question is not found


@pytest.fixture(scope="module")
def reference_tam():
    from reference.tam import tam

    return tam


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``{kind: folder}``: each family saved whole with its processor; Gemma 3's head untied from its embeddings
    (tied, the tiny model repeats "assistant:" and that class's logit is negative on all four image tokens: every
    map 0, nothing compared), as PaliGemma's builder unties Gemma's."""
    built = saved_whole(tmp_path_factory, TAM_KINDS)
    config = transformers.AutoConfig.from_pretrained(built["gemma3"])
    config.tie_word_embeddings = config.text_config.tie_word_embeddings = False
    torch.manual_seed(0)  # the head the checkpoint lacks is drawn afresh
    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(built["gemma3"], config=config)
    noisy(model).save_pretrained(built["gemma3"], max_shard_size="20KB")
    return built


@pytest.fixture(scope="module")
def asked(folders):
    return {kind: vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=NEW_TOKENS)
            for kind, folder in folders.items()}


def authors_form(config: dict, image: int, inputs, ids) -> tuple[dict, tuple]:
    """``(special_ids, vision_shape)`` as the authors' code passes them for this kind of model: the image tokens
    between their start and end markers where the model has them (their Qwen demo: ``<|vision_start|>`` and
    ``<|vision_end|>``; their InternVL demo: ``<img>`` and ``</img>``, ``vision_shape`` the pixel-shuffled grid;
    Gemma 3 alike between ``<start_of_image>`` and ``<end_of_image>``), else every token of the image token's id
    (their int form); the question from the image's end to the assistant's turn (PaliGemma, whose prompt has no
    turn: to its last word, the prompt's last position their separate context entry), the answer after it. A tiled
    image: one ``vision_shape`` per view (their form for several images), each view's tokens in the prompt's order."""
    kind = config["model_type"]
    assistant = [ids("assistant:")]
    answer = {"answer_id": [assistant, -1]}
    if kind in ("qwen2_5_vl", "qwen3_vl"):  # their Qwen demo's
        start, end = ids("<|vision_start|>"), ids("<|vision_end|>")
        _, h, w = inputs["image_grid_thw"][0].tolist()
        return {"img_id": [start, end], "prompt_id": [end, assistant], **answer}, (h // 2, w // 2)
    if kind == "glm4v":  # their Qwen demo's form, GLM-4.1V's markers: its 2 x 2 merge units between them
        start, end = ids("<|begin_of_image|>"), ids("<|end_of_image|>")
        _, h, w = inputs["image_grid_thw"][0].tolist()
        return {"img_id": [start, end], "prompt_id": [end, assistant], **answer}, (h // 2, w // 2)
    if kind == "internvl":  # their InternVL3 demo's, one view of (448 / 14 / 2)² there, (32 / 8 / 2)² here
        start, end = ids("<img>"), ids("</img>")
        side = config["vision_config"]["image_size"][0] // config["vision_config"]["patch_size"][0] // 2
        views = inputs["pixel_values"].shape[0]
        shape = (side, side) if views == 1 else ((side, side),) * views
        return {"img_id": [start, end], "prompt_id": [end, assistant], **answer}, shape
    if kind == "gemma3":
        start, end = ids("<start_of_image>"), ids("<end_of_image>")
        side = int(config["mm_tokens_per_image"] ** 0.5)
        return {"img_id": [start, end], "prompt_id": [end, assistant], **answer}, (side, side)
    if kind in ("mistral3", "llava") and config["vision_config"]["model_type"] == "pixtral":  # their int form, on
        # the merge units' grid of the image kept at its aspect (the row breaks are other tokens); the question
        # after the image's end token
        merge = config.get("spatial_merge_size", 2) if kind == "mistral3" else 1
        h, w = (int(v) // (config["vision_config"]["patch_size"] * merge) for v in inputs["image_sizes"][0])
        return {"img_id": [image], "prompt_id": [[ids("[IMG_END]")], assistant], **answer}, (h, w)
    if kind == "llama4":  # their int form over one tile's pixel-shuffled grid; the question after the image's end
        side = int(config["vision_config"]["image_size"] // config["vision_config"]["patch_size"]
                   * config["vision_config"]["pixel_shuffle_ratio"])
        return {"img_id": [image], "prompt_id": [[ids("<|image_end|>")], assistant], **answer}, (side, side)
    side = config["vision_config"]["image_size"] // config["vision_config"]["patch_size"]
    if kind == "paligemma":  # image tokens, <bos>, the question: no turn after it
        last = int(inputs["input_ids"][0, -1])
        return {"img_id": [image], "prompt_id": [[ids("<bos>")], last], "answer_id": [[last], -1]}, (side, side)
    if config.get("vision_feature_select_strategy") == "full":  # CLIP's CLS first: the tokens after the first
        return {"img_id": [image, ids("what")], "prompt_id": [[image], assistant], **answer}, (side, side)
    return {"img_id": [image], "prompt_id": [[image], assistant], **answer}, (side, side)


def authors_maps(tam, folder, monkeypatch, eci: bool = True, shape: tuple | None = None, question: str = QUESTION
                 ) -> tuple[list[int], list, tuple, list]:
    """The authors' way: ``(generated ids, [each round's map before the uint8 cast], vision_shape, [each round's
    values before the filter])``, a map and its values lists of each view's for a tiled image; ``eci`` False: their
    least-squares factor held at 0, the causal inference undone; ``shape``: the ``vision_shape`` given instead;
    ``question``: PaliGemma's (its prompt has no template)."""
    import json

    config = json.loads((folder / "config.json").read_text())
    model = getattr(transformers, config["architectures"][0]).from_pretrained(folder).eval()
    processor = transformers.AutoProcessor.from_pretrained(folder)
    inputs = processor_inputs(folder, picture(), None if question == QUESTION else processor.image_token + question)
    inputs = inputs.to(dtype=model.dtype)  # in the model's dtype, as transformers' examples pass them (Llama 4's
    # processor gives bfloat16 pixels)
    with torch.no_grad():
        outputs = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True,
                                 output_hidden_states=True, return_dict_in_generate=True)
        # their ``model.lm_head``: the model's head, which Llama 4 keeps in its language model
        logits = [model.get_output_embeddings()(feats[-1]) for feats in outputs.hidden_states]
    tokens = outputs.sequences[0].tolist()
    prompt = inputs["input_ids"].shape[1]
    ids = processor.tokenizer.convert_tokens_to_ids
    special_ids, vision_shape = authors_form(config, model.config.image_token_id, inputs, ids)
    vision_shape = shape or vision_shape
    # The authors' special ids locate by the last occurrence; the answer must not repeat them
    marker = special_ids["answer_id"][0]
    assert [k for k in range(len(tokens)) if tokens[k:k + len(marker)] == marker] == [prompt - len(marker)]
    views = len(vision_shape) if isinstance(vision_shape[0], tuple) else 1
    image = [picture()] * views if views > 1 else picture()
    caught, given = [], []
    filter_ = tam.rank_guassian_filter

    def catching(img, k=3):
        given.append(img.copy())
        caught.append(filter_(img, k))
        return caught[-1]

    monkeypatch.setattr(tam, "rank_guassian_filter", catching)
    if not eci:
        monkeypatch.setattr(tam, "least_squares", lambda map1, map2: 0.0)
    maps, values, records = [], [], []
    for i in range(len(logits)):
        before = len(caught)
        returned = tam.TAM(tokens, vision_shape, logits, special_ids, image, processor, "", i, records, True)
        # Round 0 maps every question word and returns the first's (their ``first_ori``); later rounds map one
        if views == 1:
            np.testing.assert_array_equal(returned, (caught[before] * 255).astype("uint8"))
            maps.append(caught[before])
            values.append(given[before])
        else:
            for v in range(views):
                np.testing.assert_array_equal(returned[v], (caught[before + v] * 255).astype("uint8"))
            maps.append(caught[before:before + views])
            values.append(given[before:before + views])
    monkeypatch.undo()
    return tokens[prompt:], maps, vision_shape, values


@pytest.mark.parametrize("kind", TAM_KINDS)
def test_each_tokens_tam_is_the_authors(folders, asked, reference_tam, monkeypatch, kind):
    assert_authors(asked[kind], folders[kind], reference_tam, monkeypatch)


def test_llama4s_tam_is_the_authors_though_its_output_has_no_last_hidden_state(tmp_path_factory, reference_tam,
                                                                                 monkeypatch):
    """Llama 4's model returns its logits and no ``last_hidden_state``: TAM reads the head's input, which every
    family's head reads, not a field of one family's output."""
    folder = saved_whole(tmp_path_factory, ["llama4"])["llama4"]
    answer = vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    assert_authors(answer, folder, reference_tam, monkeypatch)


def assert_authors(answer, folder, reference_tam, monkeypatch) -> None:
    """``answer``'s TAM of each token, before the filter and after it, equals the authors' on ``folder``."""
    tokens, maps, shape, values = authors_maps(reference_tam, folder, monkeypatch)
    assert list(answer.tokens) == tokens and len(maps) == NEW_TOKENS
    lead = answer.layout.lead  # CLIP's CLS under "full": no place on the grid, 0 in ours, outside theirs
    for i, before in enumerate(values):  # before the filter: the grid's tokens row-major, as theirs reshapes them
        np.testing.assert_allclose(answer.image_tam(i), np.concatenate([np.zeros(lead), before.ravel()]), rtol=0,
                                   atol=TOL * max(before.max(), 1e-3))
    unit = answer.layout.unit
    # A 2 x 2 grid's round may leave nothing after the causal inference (the authors' map all 0): to the answer's peak
    peak = max(m.max() for m in maps)
    assert peak > 0
    for i, expected in enumerate(maps):
        assert expected.shape == shape
        placed = np.repeat(np.repeat(expected, unit, axis=0), unit, axis=1)
        np.testing.assert_allclose(answer.tam(i), placed, rtol=0, atol=TOL * max(expected.max(), peak))


@pytest.mark.parametrize("kind", TAM_KINDS)
def test_the_causal_inference_step_changes_the_maps_it_is_checked_on(folders, asked, reference_tam, monkeypatch,
                                                                       kind):
    """Without the estimated causal inference the authors' maps move far past the tolerance: the test above fails
    for a port that drops it."""
    _, maps, _, _ = authors_maps(reference_tam, folders[kind], monkeypatch, eci=False)
    answer = asked[kind]
    unit = answer.layout.unit
    moved = [np.abs(answer.tam(i)[::unit, ::unit] - m).max() / m.max() for i, m in enumerate(maps)
             if i > 0 and m.max() > 0]
    assert max(moved) > 100 * TOL


def test_a_one_word_question_that_ends_the_prompt_is_the_authors(folders, reference_tam, monkeypatch):
    """PaliGemma asked one word: the question is the prompt's last position alone, no question word before it (the
    authors' prompt span empty); answer token 0's map is that position's own class's, as their round 0 makes it."""
    answer = vit.ask_vlm(vit.open_vlm(folders["paligemma"]), picture(), "dog", max_new_tokens=NEW_TOKENS)
    tokens, maps, _, values = authors_maps(reference_tam, folders["paligemma"], monkeypatch, question="dog")
    assert list(answer.tokens) == tokens
    peak = max(m.max() for m in maps)
    assert peak > 0
    for i, (expected, before) in enumerate(zip(maps, values, strict=True)):
        np.testing.assert_allclose(answer.image_tam(i), before.ravel(), rtol=0, atol=TOL * peak)
        np.testing.assert_allclose(answer.tam(i), expected, rtol=0, atol=TOL * peak)


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


def test_internvls_tiles_tam_is_the_authors_per_view_filtered_on_the_canvas(internvl_tiles, reference_tam,  # noqa: F811
                                                                            monkeypatch):
    """The authors' code reads one view per image ("if you want to use dynamic reso, please map crops to raw size",
    their InternVL demo, which resizes to one 448-px tile): their form for several images (one ``vision_shape`` per
    view, normalised together, each filtered on its own grid) gives each tile's and the thumbnail's values. Ours:
    those values (equal before the filter), the thumbnail filtered as theirs (the overview), the tiles placed on the
    canvas where the processor cut them and filtered there, across the tiles' seams (the crops mapped to raw size)."""
    from test_vlm_answer import where_tiles_are

    answer = vit.ask_vlm(vit.open_vlm(internvl_tiles), picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    tokens, maps, shape, values = authors_maps(reference_tam, internvl_tiles, monkeypatch)
    assert list(answer.tokens) == tokens and shape == ((2, 2),) * 7
    places = where_tiles_are(internvl_tiles, picture())
    peak = max(max(m.max() for m in views) for views in maps)
    assert peak > 0
    for i in range(NEW_TOKENS):
        np.testing.assert_allclose(answer.image_tam(i), np.concatenate([v.ravel() for v in values[i]]), rtol=0,
                                   atol=TOL * peak)
        np.testing.assert_allclose(answer.tam(i, overview=True), np.repeat(np.repeat(maps[i][6], 2, 0), 2, 1),
                                   rtol=0, atol=TOL * peak)
        canvas = np.zeros((4, 6))
        for k, (r, c) in enumerate(places):
            canvas[2 * r:2 * r + 2, 2 * c:2 * c + 2] = values[i][k]
        expected = reference_tam.rank_guassian_filter(canvas, 3)
        np.testing.assert_allclose(answer.tam(i), np.repeat(np.repeat(expected, 2, 0), 2, 1), rtol=0,
                                   atol=TOL * peak)
    # Each tile filtered alone (their several-images form) is another map: the seams are smoothed across
    alone = np.zeros((4, 6))
    for k, (r, c) in enumerate(places):
        alone[2 * r:2 * r + 2, 2 * c:2 * c + 2] = maps[1][k]
    assert np.abs(answer.tam(1)[::2, ::2] - alone).max() > 100 * TOL * peak


def test_llava_nexts_tam_is_the_authors_per_view_filtered_on_the_unpadded_canvas(llava_next, reference_tam,  # noqa: F811
                                                                                monkeypatch):
    """LLaVA-NeXT in the authors' form for several images: the base image's 4 x 4 tokens, then the crops' 8 rows of 10
    patches each followed by its newline token (8 x 11, as the model packs them). Ours: the same values before the
    filter, the base image's map theirs (the overview), the crops' filtered on the 8 x 10 canvas, the newline tokens
    (no patch) left out of the filter's windows."""
    answer = vit.ask_vlm(vit.open_vlm(llava_next), picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    tokens, maps, _, values = authors_maps(reference_tam, llava_next, monkeypatch, shape=((4, 4), (8, 11)))
    assert list(answer.tokens) == tokens and answer.grid == (8, 10)
    peak = max(max(m.max() for m in views) for views in maps)
    assert peak > 0
    for i in range(NEW_TOKENS):
        np.testing.assert_allclose(answer.image_tam(i), np.concatenate([v.ravel() for v in values[i]]), rtol=0,
                                   atol=TOL * peak)
        np.testing.assert_allclose(answer.tam(i, overview=True), maps[i][0], rtol=0, atol=TOL * peak)
        expected = reference_tam.rank_guassian_filter(values[i][1][:, :10].copy(), 3)
        np.testing.assert_allclose(answer.tam(i), expected, rtol=0, atol=TOL * peak)


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
