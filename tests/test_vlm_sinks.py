"""Visual attention sinks (issue 115, item 3): ``VLMAnswer.sinks`` against the authors' own ``DimProspector``
(seilk/VisAttnSink, ``src/logic/logic.py``, vendored unchanged under ``tests/reference/visattnsink``) run on the hidden
states transformers' eager model returns (``output_hidden_states``: each decoder layer's input) over the same prompt,
with the same sink dimensions and threshold; the map "without the sinks" against the eager ``generate``'s attention
row by hand: the sinks' share set to 0, each head's other image tokens scaled to its whole image share, placed through
the layout as ``test_vlm_answer`` places rows (``by_hand``).

The models are ``test_vlm_answer``'s tiny random LLaVA and Qwen2.5-VL. Their hidden width of 32 cannot reach the
authors' tau of 20 (an RMS-normalised value is at most sqrt(32)), so the tests set tau between the prompt's values.
"""

import json
from collections import defaultdict

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from test_vlm_answer import (  # noqa: E402
    LAYOUT,
    NEW_TOKENS,
    QUESTION,
    by_hand,
    eager_generate,
    eager_image_rows,
    picture,
    processor_inputs,
    saved_whole,
)

import vit  # noqa: E402
from vit.costs.bounds import TooManyTokens  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

KINDS = ["llava", "qwen2_5_vl"]


@pytest.fixture(scope="module")
def vlms(tmp_path_factory):
    return saved_whole(tmp_path_factory, KINDS)


@pytest.fixture(scope="module")
def asked(vlms):
    return {kind: vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=NEW_TOKENS)
            for kind, folder in vlms.items()}


def eager_hidden_states(folder) -> tuple:
    """transformers alone: the eager model's hidden states entering each decoder layer over the prompt."""
    config = json.loads((folder / "config.json").read_text())
    model = getattr(transformers, config["architectures"][0]).from_pretrained(folder, attn_implementation="eager")
    with torch.no_grad():
        out = model.eval()(**processor_inputs(folder, picture()), output_hidden_states=True, use_cache=False)
    return out.hidden_states[:-1]


def authors_sinks(hidden_states, dims: tuple[int, ...], tau: float, monkeypatch) -> list[list[int]]:
    """The authors' ``DimProspector.run_logic`` at each layer, their sink dimensions and tau set to ours."""
    from reference.visattnsink.logic import DimProspector, LogicEngine

    monkeypatch.setattr(LogicEngine, "dim_sink", torch.tensor(dims))
    monkeypatch.setattr(LogicEngine, "indices", defaultdict(list))
    monkeypatch.setattr(LogicEngine, "tau", tau, raising=False)
    for layer, hs in enumerate(hidden_states):
        DimProspector.run_logic(hs, layer)
    return [LogicEngine.indices[layer].tolist() for layer in range(len(hidden_states))]


@pytest.mark.parametrize("kind", KINDS)
def test_the_sink_tokens_are_the_authors_dimprospectors(vlms, asked, kind, monkeypatch):
    from reference.visattnsink.logic import DimProspector

    answer = asked[kind]
    states = eager_hidden_states(vlms[kind])
    # the sink dimensions found: the two largest of each dimension's largest normalised magnitude, by hand
    peaks = torch.stack([DimProspector.rmsnorm(hs)[0].abs().amax(0) for hs in states]).amax(0)
    dims = tuple(sorted(peaks.argsort(descending=True)[:2].tolist()))
    values = DimProspector.rmsnorm(states[1])[0].abs()[:, list(dims)].amax(-1)
    tau = float(values.median())  # about half the prompt's tokens over it at layer 1
    found = answer.sinks(tau=tau)
    assert found.dims == dims and found.tau == tau
    expected = authors_sinks(states, dims, tau, monkeypatch)
    assert [list(layer) for layer in found.tokens] == expected
    assert 0 < len(expected[1]) < answer.prompt_tokens
    # other dimensions, given: the authors' with those
    given = answer.sinks(dims=[3, 7, 11], tau=1.5)
    assert [list(layer) for layer in given.tokens] == authors_sinks(states, (3, 7, 11), 1.5, monkeypatch)


def test_the_map_without_the_sinks_is_the_row_renormalised_over_the_other_image_tokens(vlms, asked, monkeypatch):
    kind = "llava"
    answer = asked[kind]
    out, inputs, image_token = eager_generate(vlms[kind], picture())
    positions = (inputs["input_ids"][0] == image_token).nonzero()[:, 0]
    unit, lead = LAYOUT[kind]
    states = eager_hidden_states(vlms[kind])
    dims = answer.sinks(tau=1.0).dims
    sinks = answer.sinks(dims=dims, tau=2.0)
    seen = 0
    for layer in range(answer.layers):
        sink_positions = authors_sinks(states, dims, 2.0, monkeypatch)[layer]
        sink = np.isin(positions.numpy(), sink_positions)
        if sink.all() or not sink.any():
            continue
        seen += 1
        for i in (0, NEW_TOKENS - 1):
            rows = eager_image_rows(out, i, layer, positions)  # (H, N)
            kept = np.where(sink, 0, rows)
            kept = kept * rows.sum(-1, keepdims=True) / kept.sum(-1, keepdims=True)
            np.testing.assert_allclose(answer.attention(i, layer, sinks=sinks), by_hand(kept.mean(0), answer.grid,
                                                                                         unit, lead), atol=1e-5)
            for head in (0, 3):
                np.testing.assert_allclose(answer.attention(i, layer, head, sinks=sinks),
                                           by_hand(kept[head], answer.grid, unit, lead), atol=1e-5)
            # its image share is the map's own: the sinks' mass moved to the other image tokens
            assert answer.attention(i, layer, sinks=sinks).sum() == pytest.approx(
                answer.attention(i, layer).sum(), rel=1e-5)
    assert seen  # a layer with sinks and other image tokens


def test_the_caption_says_when_most_of_a_rows_mass_sits_on_sinks(asked):
    from vit.explain.language.inside.sinks import sink_note

    answer = asked["llava"]
    positions = answer.layout.positions
    none = answer.sinks(tau=1e6)
    assert sink_note(answer, none, 0, 1) is None
    every = answer.sinks(tau=1e-6)  # every token is a sink: the whole row on them
    note = sink_note(answer, every, 0, 1)
    assert note.startswith("100% of this row's attention to the image sits on 16 visual sink tokens (massive "
                           f"activations in dimensions {', '.join(map(str, every.dims))})")
    with pytest.raises(ValueError, match=r"^every image token is a sink at layer 1: there is no map without them$"):
        answer.attention(0, 1, sinks=every)
    assert len(positions) == 16


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tau": -1}, r"^tau must be a positive number, got -1$"),
    ({"dims": [32]}, r"^dims must be the language model's hidden dimensions, ints from 0 to 31, got \[32\]$"),
    ({"dims": "12"}, r"^dims must be the language model's hidden dimensions"),
])
def test_what_does_not_fit_is_refused_in_one_line(asked, kwargs, message):
    with pytest.raises(ValueError, match=message):
        asked["llava"].sinks(**kwargs)


def test_the_sinks_are_counted_before_any_forward(asked, monkeypatch):
    answer = asked["llava"]
    monkeypatch.setattr(answer._source[0].model, "forward", lambda *a, **k: pytest.fail("the model ran"))
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.01")
    with pytest.raises(TooManyTokens):
        answer.sinks()
