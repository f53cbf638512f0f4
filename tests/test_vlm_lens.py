"""The language model's side of a VLM's answer (issue 92, item 3): ``VLMAnswer.logit_lens`` and ``VLMAnswer.ablate``
against transformers alone, the same reading and the same intervention done by hand on the eager model opened from
the same folder (``test_vlm_answer``'s tiny random VLMs): its ``output_hidden_states`` read through its own final
norm and head (and Gemma 2's final soft cap, by its formula), and a forward pre-hook written here that zeroes (or
sets to the image tokens' mean) the language model's input embeddings at the image tokens of a box, those tokens
found from the layout by hand (each image token's unit of patches, row-major).
"""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_vlm_answer import NEW_TOKENS, QUESTION, picture, saved_whole  # noqa: E402
from test_vlm_answer_attnlrp import _eager, _inputs  # noqa: E402

import vit  # noqa: E402
from vit.costs.bounds import TooManyTokens  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

KINDS = ["llava", "qwen2_5_vl", "paligemma2", "qwen3_5"]  # PaliGemma 2: Gemma 2's final soft cap; Qwen3.5: a hybrid


@pytest.fixture(scope="module")
def vlms(tmp_path_factory):
    return saved_whole(tmp_path_factory, KINDS)


@pytest.fixture(scope="module")
def asked(vlms):
    return {kind: vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=NEW_TOKENS)
            for kind, folder in vlms.items()}


def by_hand_lens(folder, tokens: list[int], i: int) -> np.ndarray:
    """transformers alone: the eager model's hidden states at the query of answer token ``i``, each read through the
    language model's final norm and the head (Gemma 2's soft cap ``tanh(x / c) c``), softmax, token ``i``'s entry;
    the last hidden state is the model's own logits' (transformers returns it normed)."""
    model, processor = _eager(folder)
    inputs = _inputs(model, processor, tokens, i)
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True, use_cache=False)
    lm = model.model.language_model
    cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    probabilities = []
    for state in out.hidden_states[:-1]:
        logits = model.get_output_embeddings()(lm.norm(state[0, -1])).float()
        logits = torch.tanh(logits / cap) * cap if cap else logits
        probabilities.append(float(logits.softmax(-1)[tokens[i]]))
    probabilities.append(float(out.logits[0, -1].float().softmax(-1)[tokens[i]]))
    assert len(probabilities) == len(lm.layers) + 1
    return np.array(probabilities, dtype=np.float32)


@pytest.mark.parametrize("kind", KINDS)
def test_the_logit_lens_is_the_hidden_states_read_through_the_models_own_head(vlms, asked, kind):
    answer = asked[kind]
    for i in (0, NEW_TOKENS - 1):
        lens = answer.logit_lens(i)
        expected = by_hand_lens(vlms[kind], list(answer.tokens), i)
        np.testing.assert_allclose(lens, expected, rtol=0, atol=1e-5)
    assert not np.allclose(answer.logit_lens(1), answer.logit_lens(2), atol=1e-4)  # each token its own query


def by_hand_ablation(folder, tokens: list[int], i: int, positions: list[int], how: str) -> tuple[float, float]:
    """transformers alone: token ``i``'s logit at its query, whole and with the language model's input embeddings at
    ``positions`` zeroed (or set to the mean over every image token of the prompt) by a pre-hook written here."""
    model, processor = _eager(folder)
    inputs = _inputs(model, processor, tokens, i)
    image = (inputs["input_ids"][0] == model.config.image_token_id).nonzero()[:, 0]

    def intervene(module, args, kwargs):
        embeds = kwargs["inputs_embeds"].clone()
        embeds[0, positions] = 0 if how == "zero" else embeds[0, image].mean(0)
        return args, {**kwargs, "inputs_embeds": embeds}

    with torch.no_grad():
        whole = float(model(**inputs, use_cache=False).logits[0, -1, tokens[i]])
        handle = model.model.language_model.register_forward_pre_hook(intervene, with_kwargs=True)
        try:
            ablated = float(model(**inputs, use_cache=False).logits[0, -1, tokens[i]])
        finally:
            handle.remove()
    return whole, ablated


# (kind, box, the image tokens under it, by hand): LLaVA's 4 x 4 patches one token each, row-major; Qwen2.5-VL's
# 4 x 6 patches in 2 x 2 merge units, 2 x 3 of them row-major; PaliGemma 2's 16 x 16 patches one token each
CASES = [("llava", (0, 1, 2, 3), [1, 2, 5, 6]), ("qwen2_5_vl", (1, 2, 4, 4), [1, 4]),
         ("qwen2_5_vl", (0, 0, 1, 1), [0]), ("paligemma2", (15, 0, 16, 2), [240, 241])]


@pytest.mark.parametrize(("kind", "box", "tokens"), CASES)
@pytest.mark.parametrize("how", ["zero", "mean"])
def test_ablating_a_regions_image_tokens_is_the_same_intervention_by_hand(vlms, asked, kind, box, tokens, how):
    answer = asked[kind]
    folder = vlms[kind]
    positions = answer.layout.positions[tokens].tolist()
    i = 2
    result = answer.ablate(i, box, how=how)
    whole, ablated = by_hand_ablation(folder, list(answer.tokens), i, positions, how)
    assert result.image_tokens == len(tokens) and result.token == answer.tokens[i]
    assert result.logit == pytest.approx(whole, abs=1e-4) and result.ablated_logit == pytest.approx(ablated, abs=1e-4)
    assert abs(result.effect) > 1e-4  # the region reaches the token: the test can tell a wrong region
    # another region's tokens would move it otherwise
    others = [t for t in range(len(answer.layout.positions)) if t not in tokens][:len(tokens)]
    _, elsewhere = by_hand_ablation(folder, list(answer.tokens), i, answer.layout.positions[others].tolist(), how)
    assert abs(elsewhere - result.ablated_logit) > 1e-4


def test_a_box_off_the_grid_or_an_unknown_ablation_is_refused_in_one_line(asked):
    answer = asked["llava"]
    with pytest.raises(ValueError, match=r"^box must be \(top, left, bottom, right\) whole patches with top < bottom "
                                         r"<= 4 and left < right <= 4 on the 4x4 patch grid, got \(0, 0, 5, 1\)$"):
        answer.ablate(0, (0, 0, 5, 1))
    with pytest.raises(ValueError, match=r"^box must be .* got \(2, 0, 2, 1\)$"):
        answer.ablate(0, (2, 0, 2, 1))
    with pytest.raises(ValueError, match=r"^how must be one of zero, mean, got 'noise'$"):
        answer.ablate(0, (0, 0, 1, 1), how="noise")
    with pytest.raises(ValueError, match=r"^answer token 9 does not exist"):
        answer.logit_lens(9)


@pytest.mark.parametrize("call", [lambda a: a.logit_lens(1), lambda a: a.ablate(1, (0, 0, 1, 1))])
def test_the_lens_and_the_ablation_are_counted_before_any_forward(asked, monkeypatch, call):
    answer = asked["llava"]
    vlm = answer._source[0]
    monkeypatch.setattr(answer, "_lens", {})  # a lens read before is kept, not counted again
    monkeypatch.setattr(vlm.model, "forward", lambda *a, **k: pytest.fail("the model ran"))
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.01")
    with pytest.raises(TooManyTokens, match=r"^Reading answer token's layers at \d+ tokens \(a 4x4-patch image\) "
                                            r"needs about .* MB, over the 0 MB limit \(VIT_ANALYSIS_MEMORY_MB\)"):
        call(answer)


def test_predict_ask_writes_each_tokens_logit_lens(vlms, asked, tmp_path, capsys):
    """``--lm-method lens`` writes ``logit_lens`` (answer tokens, layers + 1): the API's, itself held by hand above."""
    import json

    from vit.predict import main

    picture().save(tmp_path / "photo.png")
    assert main([str(vlms["llava"]), str(tmp_path / "photo.png"), "--ask", QUESTION, "--max-new-tokens",
                 str(NEW_TOKENS), "--save-maps", str(tmp_path / "maps"), "--lm-method", "lens", "attention",
                 "--device", "cpu"]) == 0
    [record] = json.loads(capsys.readouterr().out)
    saved = np.load(record["maps"]["npz"])
    answer = asked["llava"]
    assert saved["logit_lens"].shape == (NEW_TOKENS, 3) and "tam" not in saved
    np.testing.assert_allclose(saved["logit_lens"], np.stack([answer.logit_lens(i) for i in range(NEW_TOKENS)]),
                               rtol=0, atol=1e-6)


def test_a_tokens_logit_lens_is_read_once(asked, monkeypatch):
    """The explorer asks again on every rerun while its table is shown: the second ask runs no model."""
    answer = asked["llava"]
    first = answer.logit_lens(3)
    monkeypatch.setattr(answer._source[0].model, "forward", lambda *a, **k: pytest.fail("the model ran again"))
    np.testing.assert_array_equal(answer.logit_lens(3), first)


def by_hand_patching(folder, tokens: list[int], i: int, positions: list[int], source) -> tuple[float, float]:
    """transformers alone: token ``i``'s logit at its query, whole and with the language model's input embeddings at
    ``positions`` replaced by those the processor's run over ``source`` (and the question) gives there, each read
    by a pre-hook written here."""
    model, processor = _eager(folder)
    inputs = _inputs(model, processor, tokens, i)
    kept = {}

    def read(module, args, kwargs):
        kept["embeds"] = kwargs["inputs_embeds"].clone()

    def intervene(module, args, kwargs):
        embeds = kwargs["inputs_embeds"].clone()
        embeds[0, positions] = kept["embeds"][0, positions]
        return args, {**kwargs, "inputs_embeds": embeds}

    lm = model.model.language_model
    with torch.no_grad():
        handle = lm.register_forward_pre_hook(read, with_kwargs=True)
        try:
            model(**_inputs(model, processor, tokens, 0, image=source), use_cache=False)
        finally:
            handle.remove()
        whole = float(model(**inputs, use_cache=False).logits[0, -1, tokens[i]])
        handle = lm.register_forward_pre_hook(intervene, with_kwargs=True)
        try:
            patched = float(model(**inputs, use_cache=False).logits[0, -1, tokens[i]])
        finally:
            handle.remove()
    return whole, patched


@pytest.mark.parametrize(("kind", "box", "tokens"), [CASES[0], CASES[1]])
def test_patching_a_regions_image_tokens_from_a_source_image_is_the_same_intervention_by_hand(vlms, asked, kind,
                                                                                               box, tokens):
    """Activation patching (TransformerLens' and nnsight's view, on the image): the image tokens under a box replaced
    by those a source image of the same size gives at the same places. The asked image as its own source moves
    nothing; a source laid out otherwise (Qwen2.5-VL keeps the aspect: a tall image has another grid) is refused in
    one line before any forward of the asked question's."""
    answer = asked[kind]
    source = picture().rotate(180)
    positions = answer.layout.positions[tokens].tolist()
    result = answer.patch(2, box, source)
    whole, patched = by_hand_patching(vlms[kind], list(answer.tokens), 2, positions, source)
    assert result.image_tokens == len(tokens) and result.token == answer.tokens[2]
    assert result.logit == pytest.approx(whole, abs=1e-4) and result.ablated_logit == pytest.approx(patched, abs=1e-4)
    assert abs(result.effect) > 1e-4
    itself = answer.patch(2, box, picture())
    assert itself.ablated_logit == pytest.approx(itself.logit, abs=1e-5)
    if kind == "qwen2_5_vl":
        with pytest.raises(ValueError, match=r"^the source image is laid out otherwise than the image asked about "
                                             r"\(\w+ differs: another count of image tokens, grid or tiles\); give a "
                                             r"source image of its size$"):
            answer.patch(2, box, picture(60, 90))
