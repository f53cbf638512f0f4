"""A VLM's maps at sliding-window layers (issue 90, item 1): Gemma 3 and PaliGemma 2 alternate sliding-window layers,
whose cache keeps only the last keys, and global ones. Each answer token's row at a sliding layer is the row
transformers' eager attention forms, over the keys inside the window (the others 0), for every token, every window
and every cache (dynamic, and static where the generation config asks for it), the prompt alone longer than the
window too; gradient x attention, TAM and AttnLRP follow the model there as everywhere.

The models are ``test_vlm_answer``'s tiny random Gemma 3 and PaliGemma 2 (``_build``, ``noisy``), saved with a tiny
``sliding_window`` (Gemma 3's two layers one sliding, one global, as its real checkpoints alternate them). The reference
is transformers alone: the eager model opened from the same folder, one forward over the prompt and the answer with
``output_attentions=True``, the row of the query that predicted each answer token, compared at every layer and head
to 1e-5.
"""

import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from test_vlm_answer import LAYOUT, QUESTION, _build, by_hand, noisy, picture, processor_inputs  # noqa: E402

import vit  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

ATOL = 1e-5
NEW = 8  # answer tokens: enough for Gemma 3's 12-token prompt and its answer to outgrow a 16-token window
# (kind, sliding_window, the generation config's cache_implementation): the prompt alone longer than the window
# (Gemma 3 at 4 and 8, PaliGemma 2's 261 tokens at 8), or outgrown by the answer (Gemma 3 at 16, PaliGemma 2 at 264)
# (transformers' PaliGemma does not generate on a static cache: its mask mapping reaches create_causal_mask)
CASES = [("gemma3", 4, None), ("gemma3", 8, "static"), ("gemma3", 16, None), ("gemma3", 16, "static"),
         ("paligemma2", 8, None), ("paligemma2", 264, None)]


def _name(case) -> str:
    kind, window, cache = case
    return f"{kind}-window{window}-{cache or 'dynamic'}"


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    """``{case: folder}``: each model of ``CASES`` built as ``test_vlm_answer.saved_whole`` builds it (seed 0, noise
    on every parameter), saved with its window, Gemma 3's layers one sliding and one global, and the cache its
    generation config asks for."""
    folders = {}
    for case in CASES:
        kind, window, cache = case
        torch.manual_seed(0)
        model, processor = _build(kind)
        text = model.config.text_config
        text.sliding_window = window
        if kind == "gemma3":
            text.layer_types = ["sliding_attention", "full_attention"]
        model.generation_config.cache_implementation = cache
        folder = tmp_path_factory.mktemp(_name(case))
        noisy(model).save_pretrained(folder, max_shard_size="20KB")
        processor.save_pretrained(folder)
        folders[case] = folder
    return folders


@pytest.fixture(scope="module")
def asked(windowed):
    """``{case: vit's answer}`` to the one question about the one picture."""
    return {case: vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=NEW)
            for case, folder in windowed.items()}


def eager_rows(folder, tokens: list[int]):
    """transformers alone: ``(generate's answer, [(H, T, T) per layer], prompt tokens, image positions, layer
    types)``: the eager model's greedy answer, and its attentions from one forward (no cache) over the prompt and
    ``tokens`` but the last, extended as ``generate`` extends them; answer token ``i``'s row is at
    ``prompt + i - 1``."""
    config = json.loads((folder / "config.json").read_text())
    model = getattr(transformers, config["architectures"][0]).from_pretrained(folder, attn_implementation="eager")
    model = model.eval()
    inputs = dict(processor_inputs(folder, picture()))
    inputs.pop("labels", None)  # PaliGemma's processor's, for a loss
    prompt = inputs["input_ids"].shape[1]
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)[0, prompt:].tolist()
    new = torch.tensor([tokens[:-1]], dtype=torch.long)
    inputs["input_ids"] = torch.cat([inputs["input_ids"], new], -1)
    inputs["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(new)], -1)
    if "token_type_ids" in inputs:  # PaliGemma's answer is its causal suffix (1), Gemma 3's text (0)
        suffix = 1 if model.config.model_type == "paligemma" else 0
        inputs["token_type_ids"] = torch.cat([inputs["token_type_ids"], torch.full_like(new, suffix)], -1)
    with torch.no_grad():
        out = model(**inputs, output_attentions=True, use_cache=False)
    positions = (inputs["input_ids"][0, :prompt] == model.config.image_token_id).nonzero()[:, 0]
    types = model.config.get_text_config().layer_types
    return generated, [a[0] for a in out.attentions], prompt, positions, types


@pytest.fixture(scope="module")
def references(windowed, asked):
    return {case: eager_rows(folder, list(asked[case].tokens)) for case, folder in windowed.items()}


@pytest.mark.parametrize("case", CASES, ids=_name)
def test_each_tokens_row_at_every_layer_is_the_eager_row_over_the_window(asked, references, case):
    """Every answer token's whole row at every layer, sliding and global: the eager row, the keys outside a sliding
    layer's window 0; the answer is ``generate``'s on the same cache."""
    answer = asked[case]
    generated, attentions, prompt, _, types = references[case]
    _, window, _ = case
    assert list(answer.tokens) == generated and len(generated) == NEW
    assert "sliding_attention" in types and "full_attention" in types
    outgrown = 0
    for layer, kind in enumerate(types):
        for i in range(NEW):
            seen = prompt + i  # the query that predicted token i, and every position before it
            expected = attentions[layer][:, seen - 1, :seen]  # (H, seen)
            np.testing.assert_allclose(answer.row(i, layer).numpy(), expected.numpy(), rtol=0, atol=ATOL)
            # An answer token's query past the window reads none of the keys before it (the prompt's last position
            # reads PaliGemma's whole bidirectional prefix)
            if kind == "sliding_attention" and i > 0 and seen > window:
                assert expected[:, :seen - window].abs().max() == 0
                outgrown += 1
    assert outgrown > 0


@pytest.mark.parametrize("case", CASES, ids=_name)
def test_each_tokens_map_at_every_layer_and_head_is_the_eager_rows_image_part(asked, references, case):
    answer = asked[case]
    _, attentions, prompt, positions, types = references[case]
    unit, lead = LAYOUT[case[0]]
    for layer in range(len(types)):
        for i in range(NEW):
            rows = attentions[layer][:, prompt + i - 1, positions].numpy()  # (H, N)
            for head in range(rows.shape[0]):
                np.testing.assert_allclose(answer.attention(i, layer, head),
                                           by_hand(rows[head], answer.grid, unit, lead), rtol=0, atol=ATOL)
            np.testing.assert_allclose(answer.attention(i, layer), by_hand(rows.mean(0), answer.grid, unit, lead),
                                       rtol=0, atol=ATOL)
            np.testing.assert_allclose(answer.image_share(i, layer), rows.sum(-1).mean(), rtol=0, atol=ATOL)


@pytest.mark.parametrize("case", [("gemma3", 4, None), ("gemma3", 8, "static"), ("paligemma2", 8, None)],
                         ids=_name)
def test_over_the_models_eager_attention_the_rows_are_the_same(windowed, references, case):
    """A language model on its eager attention hands the recording attention float masks (its dtype's lowest where a
    key is masked), not sdpa's boolean ones: the same rows, the keys kept from the first the prompt's last query
    reads."""
    vlm = vit.open_vlm(windowed[case])
    vlm.language_model.set_attn_implementation("eager")
    answer = vit.ask_vlm(vlm, picture(), QUESTION, max_new_tokens=NEW)
    generated, attentions, prompt, _, types = references[case]
    assert vlm.language_model.config._attn_implementation.endswith("eager") and list(answer.tokens) == generated
    for layer in range(len(types)):
        for i in range(NEW):
            expected = attentions[layer][:, prompt + i - 1, :prompt + i]  # (H, prompt + i)
            np.testing.assert_allclose(answer.row(i, layer).numpy(), expected.numpy(), rtol=0, atol=ATOL)
    window = case[1]
    first = 0 if case[0] == "paligemma2" else prompt - window  # PaliGemma's last prefix position reads it all
    assert answer._recorder.kept_from[types.index("sliding_attention")] == first


def test_a_window_that_cuts_the_image_leaves_its_earlier_tokens_at_0(asked, references):
    """Gemma 3 at a window of 4: the first answer token's window starts after the image's first tokens, whose share
    is 0 at the sliding layer and not at the global one (the maps above compare windows, not zeros alone)."""
    case = ("gemma3", 4, None)
    answer = asked[case]
    _, _, prompt, positions, types = references[case]
    assert int(positions[0]) < prompt - 4 and types == ["sliding_attention", "full_attention"]
    sliding, full = answer.row(0, 0)[:, positions], answer.row(0, 1)[:, positions]
    assert sliding[:, 0].abs().max() == 0 and full[:, 0].min() > 0


def test_a_sliding_layers_kept_keys_are_counted_in_what_the_answer_holds(asked):
    """The keys a sliding layer's cache drops are kept by the answer, and ``held`` counts them."""
    answer = asked[("gemma3", 4, None)]
    kept = [k for k in answer._recorder.keys if k is not None]
    assert len(kept) == 1  # the sliding layer's; the global layer's are the cache's
    held = {id(t) for t in answer.held()}
    assert all(id(chunk) in held for chunk in kept[0])


@pytest.mark.parametrize("case", [("gemma3", 4, None), ("gemma3", 16, "static"), ("paligemma2", 264, None)],
                         ids=_name)
def test_a_sliding_layers_kept_keys_are_counted_before_the_answer(asked, case):
    """The cost model counts each sliding layer's keys over the prompt and the answer where the answer may outgrow
    its window, and nothing where it may not (the cache holds them all)."""
    from vit.costs.plan import vlm_answer

    answer = asked[case]
    vlm, prepared = answer._source
    part = "the sliding-window layers' keys, kept past the window"
    counted = dict(vlm_answer(vlm.tower.model, prepared.layout.grid, prepared.text, prepared.prompt_tokens,
                              NEW).parts)
    kept = sum(chunk.nbytes for k in answer._recorder.keys if k is not None for chunk in k)
    assert 0 < kept <= counted[part]
    assert counted[part] == 2 * (prepared.prompt_tokens + NEW) * 8 * 4  # one layer, 2 kv heads of 8, float32
    within = case[1] - prepared.prompt_tokens  # an answer that cannot outgrow the window: its keys stay cached
    if within > 0:
        assert part not in dict(vlm_answer(vlm.tower.model, prepared.layout.grid, prepared.text,
                                           prepared.prompt_tokens, within).parts)


@pytest.mark.parametrize("case", [("gemma3", 4, None), ("gemma3", 8, "static"), ("paligemma2", 8, None)],
                         ids=_name)
def test_gradient_x_attention_at_sliding_layers_is_chefers_rule_on_the_eager_model(windowed, asked, case):
    from test_vlm_relevance import _close, reference

    answer = asked[case]
    unit, lead = LAYOUT[case[0]]
    for i in (0, NEW - 1):
        cams, rolled, positions = reference(windowed[case], list(answer.tokens), i)
        for layer in range(answer.layers):
            _close(answer.relevance(i, layer), by_hand(cams[layer][positions.numpy()], answer.grid, unit, lead))
        _close(answer.relevance(i), by_hand(rolled[positions.numpy()], answer.grid, unit, lead))


@pytest.mark.parametrize("case", [("gemma3", 4, None), ("paligemma2", 8, None)], ids=_name)
def test_attnlrp_past_the_window_equals_lxts_rules_on_the_eager_model(windowed, asked, monkeypatch, case):
    from test_vlm_answer_attnlrp import assert_equal_to_lxt, lxt_relevance, on_patches

    answer = asked[case]
    for i in (0, NEW - 1):
        theirs = on_patches(lxt_relevance(windowed[case], list(answer.tokens), i, monkeypatch), case[0], answer.grid)
        assert_equal_to_lxt(answer.relevance(i, method="attnlrp"), theirs)


def test_tam_past_the_window_is_the_authors(windowed, asked, monkeypatch):
    """PaliGemma 2 (its head untied, so its maps have a spread) with a prompt longer than the window: each token's
    TAM is the authors' function over the model's own generation."""
    from reference.tam import tam
    from test_vlm_tam import TOL, authors_maps

    case = ("paligemma2", 8, None)
    answer = asked[case]
    tokens, maps, _, values = authors_maps(tam, windowed[case], monkeypatch)
    assert list(answer.tokens[:len(tokens)]) == tokens
    peak = max(m.max() for m in maps)
    assert peak > 0
    for i, (before, expected) in enumerate(zip(values, maps, strict=True)):
        np.testing.assert_allclose(answer.image_tam(i), before.ravel(), rtol=0, atol=TOL * max(before.max(), 1e-3))
        np.testing.assert_allclose(answer.tam(i), expected, rtol=0, atol=TOL * max(expected.max(), peak))


def test_predict_ask_save_maps_prints_the_answer_when_the_prompt_outgrows_the_window(windowed, asked, references,
                                                                                     tmp_path, capsys):
    """``vit.predict --ask --save-maps`` on Gemma 3 whose 12-token prompt is longer than its window of 4: the answer
    printed, exit 0, every token's attention at every layer and head the eager row's image part."""
    from vit.predict import main

    case = ("gemma3", 4, None)
    picture().save(tmp_path / "photo.png")
    assert main([str(windowed[case]), str(tmp_path / "photo.png"), "--ask", QUESTION, "--max-new-tokens", str(NEW),
                 "--save-maps", str(tmp_path / "maps"), "--device", "cpu"]) == 0
    [record] = json.loads(capsys.readouterr().out)
    answer = asked[case]
    assert record["tokens"] == list(answer.tokens) and record["answer"] == answer.text
    _, attentions, prompt, positions, types = references[case]
    saved = np.load(record["maps"]["npz"])
    assert saved["attention"].shape == (NEW, len(types), 4, *answer.grid)
    for i in range(NEW):
        for layer in range(len(types)):
            rows = attentions[layer][:, prompt + i - 1, positions].numpy()
            for head in range(4):
                np.testing.assert_allclose(saved["attention"][i, layer, head], by_hand(rows[head], answer.grid, 4, 0),
                                           rtol=0, atol=ATOL)
