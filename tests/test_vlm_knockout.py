"""Attention knockout inside a VLM's language model (issue 115, item 1): ``VLMAnswer.knockout`` against transformers
alone, the same knockout done by hand on the eager model opened from the same folder: a wrapper written here around
the language model's own ``eager_attention_forward`` (its modelling file's) that adds -inf to the mask it is handed,
at the chosen layers' calls, on the chosen heads' rows of the chosen edges (query position -> key position), so the
eager softmax renormalises each row over the keys it still reads; the answer token's probability at its query from
the whole model's forward over the prompt and the answer's first ``i`` tokens (``_inputs``), softmax of its logits.

The models are ``test_vlm_answer``'s tiny random LLaVA, Qwen2.5-VL, PaliGemma 2 (Gemma 2's soft caps, its prefix read
both ways: a mask that is not causal) and Gemma 3 with its first layer a sliding window of 8 keys (its second global),
a knockout there of edges inside the window.
"""

import sys

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_vlm_answer import QUESTION, _build, noisy, picture, saved_whole  # noqa: E402
from test_vlm_answer_attnlrp import _eager, _inputs  # noqa: E402

import vit  # noqa: E402
from vit.costs.bounds import TooManyTokens  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

NEW = 4
WINDOW = 8  # Gemma 3's sliding layer's keys: its ~12-token prompt outgrows it
ATOL = 1e-5


@pytest.fixture(scope="module")
def vlms(tmp_path_factory):
    folders = saved_whole(tmp_path_factory, ["llava", "qwen2_5_vl", "paligemma2"])
    torch.manual_seed(0)
    model, processor = _build("gemma3")
    model.config.text_config.sliding_window = WINDOW
    model.config.text_config.layer_types = ["sliding_attention", "full_attention"]
    folder = tmp_path_factory.mktemp("gemma3_window")
    noisy(model).save_pretrained(folder, max_shard_size="20KB")
    processor.save_pretrained(folder)
    folders["gemma3"] = folder
    return folders


@pytest.fixture(scope="module")
def asked(vlms):
    return {kind: vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=NEW)
            for kind, folder in vlms.items()}


def by_hand(folder, tokens: list[int], i: int, edges: list[tuple[int, int]], layers, heads=None) -> float:
    """transformers alone: answer token ``i``'s probability at its query with ``edges`` (query, key) masked by -inf
    in ``layers`` (decoder layer indices) at ``heads`` (None: all), by a wrapper around the eager attention."""
    model, processor = _eager(folder)
    inputs = _inputs(model, processor, tokens, i)
    attention = model.model.language_model.layers[0].self_attn
    modelling = sys.modules[type(attention).__module__]
    eager = modelling.eager_attention_forward  # the tower's attention may call it too (Qwen's): not blocked
    chosen = {model.model.language_model.layers[n].self_attn for n in layers}

    def blocking(module, query, key, value, attention_mask, **kwargs):
        if module in chosen:
            assert attention_mask is not None  # the eager attention is always handed its mask
            mask = attention_mask[:, :, :, :key.shape[-2]]
            mask = mask.expand(1, query.shape[1], *mask.shape[2:]).clone()  # a mask per head
            for head in range(query.shape[1]) if heads is None else heads:
                for q, k in edges:
                    mask[0, head, q, k] = float("-inf")
            attention_mask = mask
        return eager(module, query, key, value, attention_mask, **kwargs)

    modelling.eager_attention_forward = blocking
    try:
        with torch.no_grad():
            logits = model(**inputs, use_cache=False).logits[0, -1].float()
    finally:
        modelling.eager_attention_forward = eager
    return float(logits.softmax(-1)[tokens[i]])


def edges(sources, targets) -> list[tuple[int, int]]:
    return [(s, t) for s in sources for t in targets]


@pytest.mark.parametrize("kind", ["llava", "qwen2_5_vl", "gemma3", "paligemma2"])
def test_a_knockout_of_the_query_to_the_image_is_the_eager_models_by_hand(vlms, asked, kind):
    answer, i = asked[kind], 2
    query = answer.prompt_tokens + i - 1
    image = answer.layout.positions.tolist()
    tokens = list(answer.tokens)
    result = answer.knockout(i, target="image", layers=[1])
    assert result.sources == (query,) and result.targets == tuple(image) and result.windows == ((1,),)
    assert result.baseline == pytest.approx(by_hand(vlms[kind], tokens, i, [], []), abs=ATOL)
    expected = by_hand(vlms[kind], tokens, i, edges([query], image), [1])
    assert result.probability == pytest.approx(expected, abs=ATOL)
    assert abs(result.probability - result.baseline) > 1e-4  # the edges reach the token: a wrong mask would show


@pytest.mark.parametrize("kind", ["llava", "qwen2_5_vl"])
def test_a_box_at_chosen_heads_and_the_question_to_the_image_are_the_eager_models_by_hand(vlms, asked, kind):
    answer, i = asked[kind], 1
    tokens, query = list(answer.tokens), answer.prompt_tokens + i - 1
    box = answer.layout.positions[[0, 1]].tolist()  # LLaVA's first two patches; Qwen's first two merge units
    result = answer.knockout(i, target=(0, 0, 1, 2) if kind == "llava" else (0, 0, 2, 4), layers=0, heads=[1, 3])
    assert result.targets == tuple(box) and result.heads == (1, 3)
    expected = by_hand(vlms[kind], tokens, i, edges([query], box), [0], heads=[1, 3])
    assert result.probability == pytest.approx(expected, abs=ATOL)
    assert abs(result.probability - result.baseline) > 1e-5
    # the question's tokens ("what is this ?", found in the prompt) to every image token, in both layers
    question = answer.knockout(i, source="question", target="image", layers=[0, 1])
    assert len(question.sources) == 4 and question.sources[-1] < answer.prompt_tokens
    expected = by_hand(vlms[kind], tokens, i, edges(question.sources, answer.layout.positions.tolist()), [0, 1])
    assert question.probability == pytest.approx(expected, abs=ATOL)


def test_a_knockout_at_a_sliding_layer_blocks_keys_inside_its_window(vlms, asked):
    """Gemma 3's layer 0 reads the query's last 8 keys: the question's tokens there are blocked as the eager model's
    are; the image's tokens lie before the window, already unread, so blocking them there changes nothing."""
    answer, i = asked["gemma3"], 3
    tokens, query = list(answer.tokens), answer.prompt_tokens + i - 1
    inside = list(range(query - 4, query))
    assert query - WINDOW < inside[0] and answer.layout.positions.max() <= query - WINDOW
    result = answer.knockout(i, target=inside, layers=[0])
    expected = by_hand(vlms["gemma3"], tokens, i, edges([query], inside), [0])
    assert result.probability == pytest.approx(expected, abs=ATOL)
    assert abs(result.probability - result.baseline) > 1e-4
    outside = answer.knockout(i, target="image", layers=[0])
    assert outside.probability == pytest.approx(outside.baseline, abs=1e-7)


@pytest.mark.parametrize("kind", ["llava", "gemma3"])
def test_windows_of_layers_are_one_knockout_each(vlms, asked, kind):
    answer, i = asked[kind], 2
    tokens, query = list(answer.tokens), answer.prompt_tokens + i - 1
    image = answer.layout.positions.tolist()
    result = answer.knockout(i, target="image", windows=1)
    assert result.windows == ((0,), (1,)) and result.probability.shape == (2,)
    for n, window in enumerate(result.windows):
        expected = by_hand(vlms[kind], tokens, i, edges([query], image), list(window))
        assert result.probability[n] == pytest.approx(expected, abs=ATOL)
    both = answer.knockout(i, target="image", windows=2)
    assert both.windows == ((0, 1),) and both.probability[0] == pytest.approx(
        by_hand(vlms[kind], tokens, i, edges([query], image), [0, 1]), abs=ATOL)


@pytest.mark.parametrize(("call", "message"), [
    (lambda a: a.knockout(0, target="everything"), r"^target must be an image box \(top, left, bottom, right\), one "
                                                   r"of image, question, last or token indices, got 'everything'$"),
    (lambda a: a.knockout(0, target=[0, 999]), r"^target's token indices must be positions 0 to \d+ of the prompt"),
    (lambda a: a.knockout(0, target=(0, 0, 9, 9)), r"^box must be \(top, left, bottom, right\) whole patches"),
    (lambda a: a.knockout(0, layers=[2]), r"^layers must be an int or a list of ints from 0 to 1"),
    (lambda a: a.knockout(0, heads=4), r"^heads must be an int or a list of ints from 0 to 3"),
    (lambda a: a.knockout(0, windows=3), r"^windows must be a whole number of layers from 1 to 2, got 3$"),
    (lambda a: a.knockout(0, target=list(range(200))), r"^target's token indices"),
    (lambda a: a.knockout(1, target=list(range(a.prompt_tokens + 1))),
     r"^the knockout blocks every key position \d+ reads; its attention would read nothing$"),
    (lambda a: a.knockout(9), r"^answer token 9 does not exist"),
])
def test_what_does_not_fit_is_refused_in_one_line(asked, call, message):
    with pytest.raises(ValueError, match=message):
        call(asked["llava"])


def test_a_knockout_is_counted_before_any_forward(asked, monkeypatch):
    answer = asked["llava"]
    monkeypatch.setattr(answer._source[0].model, "forward", lambda *a, **k: pytest.fail("the model ran"))
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.01")
    with pytest.raises(TooManyTokens, match=r"^Reading answer token's layers at \d+ tokens"):
        answer.knockout(1, target="image")


def test_a_cross_attention_vlms_knockout_is_refused_in_one_line(tmp_path_factory):
    folder = saved_whole(tmp_path_factory, ["mllama"])["mllama"]
    answer = vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=1)
    with pytest.raises(ValueError, match=r"^a knockout blocks the language model's self-attention edges to the "
                                         r"image's tokens, and this model reads the image through its cross-attention "
                                         r"layers instead: not done for it$"):
        answer.knockout(0)


def test_the_knockout_leaves_the_answers_attention_as_it_was(asked):
    answer = asked["llava"]
    before = answer.attention(1, layer=1)
    answer.knockout(1, target="image")
    np.testing.assert_array_equal(answer.attention(1, layer=1), before)
