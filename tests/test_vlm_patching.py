"""Activation patching inside a VLM's language model (issue 115, item 1): ``VLMAnswer.patch(..., layer=, head=, at=)``
against the same patch done by hand on transformers' eager model opened from the same folder, TransformerLens's
``run_with_hooks`` way: a forward hook written here on the decoder layer caches its output (the residual stream) at
the chosen positions over the source image's run and writes it into the asked image's run; for a head, a wrapper
around the language model's own ``eager_attention_forward`` does the same with its output ``(B, T, H, d)`` at that
head. The answer token's logit at its query from the whole model's forward over the prompt and the answer's first
``i`` tokens (``_inputs``).

The models are ``test_vlm_answer``'s tiny random LLaVA, Qwen2.5-VL and Gemma 3.
"""

import sys

import numpy as np
import pytest
import torch
from PIL import Image

transformers = pytest.importorskip("transformers")
from test_vlm_answer import QUESTION, picture, saved_whole  # noqa: E402
from test_vlm_answer_attnlrp import _eager, _inputs  # noqa: E402

import vit  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

NEW = 4
KINDS = ["llava", "qwen2_5_vl", "gemma3"]


def other_picture() -> Image.Image:
    return Image.fromarray(np.random.default_rng(11).integers(0, 256, (70, 90, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def vlms(tmp_path_factory):
    return saved_whole(tmp_path_factory, KINDS)


@pytest.fixture(scope="module")
def asked(vlms):
    return {kind: vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=NEW)
            for kind, folder in vlms.items()}


def by_hand(folder, tokens: list[int], i: int, positions: list[int], layer: int, head: int | None) -> tuple:
    """transformers alone: token ``i``'s (clean logit, patched logit) with decoder layer ``layer``'s output (``head``:
    its attention's output at that head) at ``positions`` taken from the source image's run."""
    model, processor = _eager(folder)
    clean = _inputs(model, processor, tokens, i)
    source = _inputs(model, processor, tokens, i, image=other_picture())
    decoder = model.model.language_model.layers[layer]
    modelling = sys.modules[type(decoder.self_attn).__module__]
    eager, cache = modelling.eager_attention_forward, {}

    def attention(module, *args, **kwargs):  # (B, T, H, d), weights
        out, weights = eager(module, *args, **kwargs)
        if module is decoder.self_attn and "source" not in cache:
            cache["source"] = out[0, positions, head].clone()
        elif module is decoder.self_attn and cache.get("patch"):
            out = out.clone()
            out[0, positions, head] = cache["source"]
        return out, weights

    def residual(module, args, output):
        stream = output[0] if isinstance(output, tuple) else output
        if "source" not in cache:
            cache["source"] = stream[0, positions].clone()
        elif cache.get("patch"):
            stream = stream.clone()
            stream[0, positions] = cache["source"]
            return (stream, *output[1:]) if isinstance(output, tuple) else stream
        return None

    handle = decoder.register_forward_hook(residual) if head is None else None
    modelling.eager_attention_forward = attention if head is not None else eager
    try:
        with torch.no_grad():
            model(**source, use_cache=False)
            whole = float(model(**clean, use_cache=False).logits[0, -1, tokens[i]])
            cache["patch"] = True
            patched = float(model(**clean, use_cache=False).logits[0, -1, tokens[i]])
    finally:
        modelling.eager_attention_forward = eager
        if handle is not None:
            handle.remove()
    return whole, patched


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("layer", "head"), [(0, None), (1, None), (0, 2), (1, 1)])
def test_patching_at_a_layer_or_head_is_the_hooks_by_hand(vlms, asked, kind, layer, head):
    answer, i = asked[kind], 2
    image = answer.layout.positions.tolist()
    at = None if head is None else "attention"
    result = answer.patch(i, "image", other_picture(), layer=layer, head=head, at=at)
    whole, patched = by_hand(vlms[kind], list(answer.tokens), i, image, layer, head)
    assert result.image_tokens == len(image) and result.token == answer.tokens[i]
    assert result.logit == pytest.approx(whole, abs=1e-4)
    assert result.ablated_logit == pytest.approx(patched, abs=1e-4)
    if layer == 1:  # the last layer's output at the image reaches no later layer, nor the query
        assert result.effect == 0
        # with the query's own position it does: the source's there
        query = answer.prompt_tokens + i - 1
        result = answer.patch(i, [*image, query], other_picture(), layer=layer, head=head, at=at)
        patched = by_hand(vlms[kind], list(answer.tokens), i, [*image, query], layer, head)[1]
        assert result.ablated_logit == pytest.approx(patched, abs=1e-4)
    assert abs(result.effect) > 1e-4  # the source's states reach the token


def test_a_box_and_the_query_position_are_patched_where_they_are(vlms, asked):
    answer, i = asked["llava"], 1
    box = answer.layout.positions[[0, 1]].tolist()  # the first two patches
    result = answer.patch(i, (0, 0, 1, 2), other_picture(), layer=0)
    assert result.ablated_logit == pytest.approx(by_hand(vlms["llava"], list(answer.tokens), i, box, 0, None)[1],
                                                 abs=1e-4)
    # at the query itself, the last layer's stream is the source run's: its logit the source's own
    query = answer.patch(i, "last", other_picture(), layer=-1)
    model, processor = _eager(vlms["llava"])
    with torch.no_grad():
        source = model(**_inputs(model, processor, list(answer.tokens), i, image=other_picture()), use_cache=False)
    assert query.ablated_logit == pytest.approx(float(source.logits[0, -1, answer.tokens[i]]), abs=1e-4)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"layer": 0, "at": "mlp"}, r"^at must be one of residual, attention, got 'mlp'$"),
    ({"layer": 0, "head": 1}, r"^a head is patched in its attention output: give at='attention' with head=$"),
    ({"layer": 0, "head": 9, "at": "attention"}, r"^head 9 does not exist: the language model has 4 heads"),
    ({"layer": 5}, r"^layer 5 does not exist"),
    ({"head": 1, "at": "attention"}, r"^patching inside the language model needs layer=, the layer to patch at$"),
])
def test_what_does_not_fit_is_refused_in_one_line(asked, kwargs, message):
    with pytest.raises(ValueError, match=message):
        asked["llava"].patch(0, "image", other_picture(), **kwargs)


def test_a_source_laid_out_otherwise_is_refused_before_any_forward(asked, monkeypatch):
    answer = asked["qwen2_5_vl"]  # Qwen keeps the aspect: a square source has another grid
    monkeypatch.setattr(answer._source[0].model, "forward", lambda *a, **k: pytest.fail("the model ran"))
    with pytest.raises(ValueError, match=r"^the source image is laid out otherwise than the image asked about"):
        answer.patch(0, "image", picture(64, 64), layer=0)


def test_gemma3ns_several_streams_are_refused_in_one_line_and_its_heads_patched(tmp_path_factory):
    """Gemma 3n's decoder layers hand on AltUp's several streams, no one residual stream: refused in one line; its
    attention output is one tensor and is patched as the others'."""
    folder = saved_whole(tmp_path_factory, ["gemma3n"])["gemma3n"]
    answer = vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=3)
    with pytest.raises(ValueError, match=r"^this model's decoder layers hand on 3-D streams, not one residual "
                                         r"stream: patch at='attention' instead$"):
        answer.patch(2, "image", other_picture(), layer=0)
    image = answer.layout.positions.tolist()
    result = answer.patch(2, "image", other_picture(), layer=0, head=1, at="attention")
    whole, patched = by_hand(folder, list(answer.tokens), 2, image, 0, 1)
    assert result.logit == pytest.approx(whole, abs=1e-4) and result.ablated_logit == pytest.approx(patched, abs=1e-4)
