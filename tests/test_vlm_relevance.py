"""Gradient x attention of a VLM's answer token over the image (issue 80, item 2c): Chefer et al. 2021b's rule
(``interpret`` in hila-chefer/Transformer-MM-Explainability, commit 58eaea8, CLIP_explainability.ipynb): per layer
``cam = (grad * attn).clamp(min=0).mean(heads)``, rolled out as ``R = I; R = R + cam @ R``, for the logit of answer
token ``i`` at the query that predicted it.

The reference is transformers alone: the eager model opened from the same folder, one forward over the prompt and the
answer's first ``i`` tokens with ``output_attentions=True``, ``torch.autograd.grad`` of the logit to every layer's
attention probabilities, the paper's loop written out with whole ``T x T`` matrices; its query row over the image
tokens placed by hand (``by_hand``) and compared with ``VLMAnswer.relevance`` to 1e-5 (relative to the map's
largest value, as gradients of random models are large).
"""

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_vlm_answer import (  # noqa: E402,F401
    KINDS,
    LAYOUT,
    NEW_TOKENS,
    PAN_AND_SCAN,
    QUESTION,
    by_hand,
    gemma3_pas,
    internvl_tiles,
    llava_next,
    llava_onevision,
    nearest_tokens,
    packed_places,
    packed_tags,
    picture,
    vlms,
    where_tiles_are,
)

import vit  # noqa: E402
from vit.costs.bounds import TooManyTokens  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

TOL = 1e-5


@pytest.fixture(scope="module")
def asked(vlms):  # noqa: F811
    """``{kind: vit's answer}`` to the one question about the one picture."""
    return {kind: vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=NEW_TOKENS)
            for kind, folder in vlms.items()}


def reference(folder, tokens: list[int], i: int, image=None,
              **images_kwargs) -> tuple[list[np.ndarray], np.ndarray, torch.Tensor]:
    """transformers alone: ``([cam_l[q] for each layer], R[q], image positions)`` for answer token ``i``, q the last
    position of the prompt followed by the answer's first ``i`` tokens (extended as ``generate`` extends them);
    ``image``: ``picture()`` unless given, through the processor with its ``images_kwargs``."""
    config = json.loads((folder / "config.json").read_text())
    model = getattr(transformers, config["architectures"][0]).from_pretrained(folder, attn_implementation="eager")
    processor = transformers.AutoProcessor.from_pretrained(folder)
    if processor.chat_template is None:  # PaliGemma's prompt: its processor adds bos and newline
        text = processor.image_token + QUESTION
    else:
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True)
    # in the model's dtype, as transformers' examples pass them (Llama 4's processor gives bfloat16 pixels)
    inputs = dict(processor(images=[image or picture()], text=text, return_tensors="pt", **images_kwargs)
                  .to(dtype=model.dtype))
    inputs.pop("labels", None)  # PaliGemma's processor's, for a loss
    positions = (inputs["input_ids"][0] == model.config.image_token_id).nonzero()[:, 0]
    new = torch.tensor([tokens[:i]], dtype=torch.long)
    inputs["input_ids"] = torch.cat([inputs["input_ids"], new], -1)
    inputs["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(new)], -1)
    if "token_type_ids" in inputs:  # as generate extends them: PaliGemma's answer is its causal suffix (1), Gemma 3's
        suffix = 1 if model.config.model_type == "paligemma" else 0  # the last value (text, 0)
        inputs["token_type_ids"] = torch.cat([inputs["token_type_ids"], torch.full_like(new, suffix)], -1)
    if "mm_token_type_ids" in inputs:
        inputs["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(new)], -1)
    out = model.eval()(**inputs, output_attentions=True, use_cache=False)
    attentions = out.attentions  # (1, H, T, T) per layer, in the graph
    grads = torch.autograd.grad(out.logits[0, -1, tokens[i]], attentions)
    cams = [(g * a)[0].clamp(min=0).mean(dim=0).detach() for g, a in zip(grads, attentions, strict=True)]  # (T, T)
    t = cams[0].shape[-1]
    rollout = torch.eye(t)
    for cam in cams:  # the paper's loop, layer 0 first
        rollout = rollout + cam @ rollout
    return [cam[-1].numpy() for cam in cams], rollout[-1].numpy(), positions


def _close(ours: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(ours, expected, rtol=0, atol=TOL * max(1.0, float(np.abs(expected).max())))


@pytest.mark.parametrize("kind", KINDS)
def test_gradient_x_attention_is_chefers_rule_on_transformers_eager_model(vlms, asked, kind):  # noqa: F811
    answer = asked[kind]
    unit, lead = LAYOUT[kind]
    for i in (0, NEW_TOKENS - 1):
        cams, rolled, positions = reference(vlms[kind], list(answer.tokens), i)
        for layer in range(answer.layers):
            expected = by_hand(cams[layer][positions.numpy()], answer.grid, unit, lead)
            assert np.abs(expected).max() > 0  # the token's logit reaches the image through this layer
            _close(answer.relevance(i, layer), expected)
        if kind.startswith("qwen3_5"):  # a hybrid: its linear-attention layers have no attention to roll out
            with pytest.raises(ValueError, match=r"^the rollout multiplies every layer's attention, and this language "
                                                 r"model's Qwen3_5(Moe)?GatedDeltaNet layers mix the tokens by a "
                                                 r"recurrent state, not an attention; ask one layer's gradient x "
                                                 r"attention$"):
                answer.relevance(i)
        else:
            _close(answer.relevance(i), by_hand(rolled[positions.numpy()], answer.grid, unit, lead))
        _close(answer.relevance(i, -1), by_hand(cams[-1][positions.numpy()], answer.grid, unit, lead))


def test_each_answer_token_has_its_own_query_row(vlms, asked):  # noqa: F811
    """Token 2's map is read at the query that predicted it (answer token 1), not at the prompt's last token nor at
    token 2 itself: the maps of neighbouring tokens differ."""
    answer = asked["llava"]
    cams, rolled, positions = reference(vlms["llava"], list(answer.tokens), 2)
    _close(answer.relevance(2), by_hand(rolled[positions.numpy()], answer.grid, 1, 0))
    for other in (1, 3):
        assert not np.allclose(answer.relevance(other), answer.relevance(2), rtol=0, atol=1e-4)


def test_qwens_relevance_is_placed_by_merge_units_row_major(vlms, asked):  # noqa: F811
    """Qwen2.5-VL's six image tokens are 2 x 3 merge units of its 4 x 6 patch grid, row-major; column-major units
    would be another map."""
    answer = asked["qwen2_5_vl"]
    _, rolled, positions = reference(vlms["qwen2_5_vl"], list(answer.tokens), 1)
    row = rolled[positions.numpy()]
    assert answer.grid == (4, 6) and row.shape == (6,)
    _close(answer.relevance(1), np.kron(row.reshape(2, 3), np.ones((2, 2))))
    assert not np.allclose(answer.relevance(1), np.kron(row.reshape(3, 2).T, np.ones((2, 2))), rtol=0, atol=1e-6)


def test_the_relevance_is_counted_before_any_forward(asked, monkeypatch):
    answer = asked["llava"]
    vlm = answer._source[0]
    monkeypatch.setattr(vlm.model, "forward", lambda *a, **k: pytest.fail("the model ran"))
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.01")
    with pytest.raises(TooManyTokens, match=r"^Gradient x attention of answer token 3 runs the model over \d+ tokens "
                                            r"\(a 4x4-patch image\) with the language model's graph: about .* MB, over "
                                            r"the 0 MB limit \(VIT_ANALYSIS_MEMORY_MB\); choose an earlier token or a "
                                            r"smaller image\.$"):
        answer.relevance(3)


def test_a_token_or_layer_that_does_not_exist_is_refused_in_one_line(asked):
    answer = asked["llava"]
    with pytest.raises(ValueError, match=r"^answer token 5 does not exist"):
        answer.relevance(5)
    with pytest.raises(ValueError, match=r"^layer 2 does not exist"):
        answer.relevance(0, 2)


def test_internvls_relevance_is_placed_where_the_processor_cut_the_tiles(internvl_tiles):  # noqa: F811
    """Gradient x attention over InternVL's 3 x 2 tiles and thumbnail: each tile's four tokens on the part of the
    canvas its pixels came from (``where_tiles_are``), the thumbnail's as the overview."""
    image = picture()
    answer = vit.ask_vlm(vit.open_vlm(internvl_tiles), image, QUESTION, max_new_tokens=NEW_TOKENS)
    places = where_tiles_are(internvl_tiles, image)
    cams, rolled, positions = reference(internvl_tiles, list(answer.tokens), 2)
    for values, ours in ((cams[0], answer.relevance(2, 0)), (rolled, answer.relevance(2))):
        row = values[positions.numpy()]  # (28,)
        expected = np.zeros((8, 12), dtype=np.float32)
        for k, (r, c) in enumerate(places):
            expected[4 * r:4 * r + 4, 4 * c:4 * c + 4] = by_hand(row[4 * k:4 * k + 4], (4, 4), 2, 0)
        _close(ours, expected)
    _close(answer.relevance(2, overview=True), by_hand(rolled[positions.numpy()][24:], (4, 4), 2, 0))


def test_llava_nexts_relevance_is_placed_as_transformers_packs_the_crops(llava_next):  # noqa: F811
    """Gradient x attention over LLaVA-NeXT's base image and crops: the crops' tokens on the unpadded canvas as
    ``pack_image_features`` packs them (``packed_places``), the newlines on no patch, the base image as the
    overview."""
    from transformers import AutoProcessor

    answer = vit.ask_vlm(vit.open_vlm(llava_next), picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    processor = AutoProcessor.from_pretrained(llava_next)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    inputs = processor(images=[picture()], text=processor.apply_chat_template(messages, add_generation_prompt=True),
                       return_tensors="pt")
    places = packed_places(llava_next, inputs)
    cams, rolled, positions = reference(llava_next, list(answer.tokens), 3)
    for values, ours in ((cams[1], answer.relevance(3, 1)), (rolled, answer.relevance(3))):
        expected = np.full((8, 10), np.nan, dtype=np.float32)
        for value, place in zip(values[positions.numpy()], places, strict=True):
            if place is not None:
                expected[place[0], place[1] - 1] = value
        _close(ours, expected)
    _close(answer.relevance(3, overview=True), by_hand(rolled[positions.numpy()][:16], (4, 4), 1, 0))


def test_llava_onevisions_relevance_is_placed_as_transformers_packs_the_crops(llava_onevision):  # noqa: F811
    """Gradient x attention over LLaVA-OneVision's base image and crops: each patch of the unpadded canvas holds the
    token ``pack_image_features`` samples nearest it (``nearest_tokens``; shrunk past anyres_max_2 too), the base
    image as the overview."""
    answer = vit.ask_vlm(vit.open_vlm(llava_onevision), picture(), QUESTION, max_new_tokens=NEW_TOKENS)
    processor = transformers.AutoProcessor.from_pretrained(llava_onevision)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    inputs = processor(images=[picture()], text=processor.apply_chat_template(messages, add_generation_prompt=True),
                       return_tensors="pt")
    index = nearest_tokens(packed_tags(llava_onevision, inputs), 0, 1, (8, 10))
    cams, rolled, positions = reference(llava_onevision, list(answer.tokens), 3)
    for values, ours in ((cams[1], answer.relevance(3, 1)), (rolled, answer.relevance(3))):
        _close(ours, values[positions.numpy()][index])
    _close(answer.relevance(3, overview=True), by_hand(rolled[positions.numpy()][:16], (4, 4), 1, 0))


def test_gemma3s_pan_and_scan_relevance_is_placed_where_the_processor_cut_the_crops(gemma3_pas):  # noqa: F811
    """Gradient x attention over Gemma 3's original image (the overview) and its 3 pan-and-scan crops side by side,
    each crop's 2 x 2 pooled tokens where ``pan_and_scan_batched`` cut it."""
    from test_vlm_answer import where_crops_are

    image = picture(200, 60)
    answer = vit.ask_vlm(vit.open_vlm(gemma3_pas, pan_and_scan=True), image, QUESTION, max_new_tokens=NEW_TOKENS)
    cams, rolled, positions = reference(gemma3_pas, list(answer.tokens), 3, image, **PAN_AND_SCAN)
    lefts = [left for _, left in where_crops_are(gemma3_pas, image)]
    assert answer.grid == (8, 24) and len(positions) == 16
    for values, ours in ((cams[1], answer.relevance(3, 1)), (rolled, answer.relevance(3))):
        row = values[positions.numpy()]
        expected = np.zeros((8, 24), dtype=np.float32)
        for k, left in enumerate(lefts):
            c = sorted(lefts).index(left)
            expected[:, 8 * c:8 * c + 8] = by_hand(row[4 * (k + 1):4 * (k + 2)], (8, 8), 4, 0)
        _close(ours, expected)
    _close(answer.relevance(3, overview=True), by_hand(rolled[positions.numpy()][:4], (8, 8), 4, 0))
