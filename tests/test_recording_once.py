"""Issue 117's speed items on the library road: a recorded layer's attention is computed once at its SDPA call
(``vit.core.attention_recorder.sdpa_once``, the module road's piece, shared by transformers' recording attention),
and only the asked query rows are formed, ``rows x T`` a head, never ``T x T``. References: transformers' own forward
(SDPA) for the outputs and its eager ``output_attentions`` for the rows; hand-computed byte counts for the cost."""

from __future__ import annotations

import pytest
import torch
from test_library_path import pixels, reference, save_family
from torch.overrides import TorchFunctionMode

import vit
from vit.core import attention_recorder, recording_attention
from vit.costs import bounds, plan

pytest.importorskip("transformers")

TOKENS = 17  # a 32 x 32 input, 8-px patches and a CLS token


@pytest.fixture(scope="module")
def msn(tmp_path_factory):
    folder = save_family(tmp_path_factory.mktemp("vit_msn"), "vit_msn")
    with torch.no_grad():
        x = pixels()
        sdpa = reference(folder, "sdpa")(pixel_values=x).logits
        eager = reference(folder, "eager")(pixel_values=x, output_attentions=True).attentions
    return vit.load(folder, device="cpu").model, x, sdpa, eager


class _Softmaxes(TorchFunctionMode):
    """Every softmax's input shape and every SDPA call the forward makes."""

    def __init__(self):
        super().__init__()
        self.shapes, self.sdpa = [], 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in attention_recorder.SOFTMAX:
            self.shapes.append(tuple(args[0].shape))
        elif func is attention_recorder.SDPA:
            self.sdpa += 1
        return func(*args, **kwargs)


def _no_eager(*args, **kwargs):
    raise AssertionError("the eager function ran beside SDPA")


def test_every_row_asked_computes_each_layer_once_and_equals_the_librarys_own(msn, monkeypatch):
    model, x, sdpa, eager = msn
    monkeypatch.setattr(recording_attention, "_eager_of", _no_eager)
    with torch.no_grad(), _Softmaxes() as spy:
        out, kept = model.run(x, layers=range(3))
    assert spy.sdpa == 0 and spy.shapes == [(2, 4, TOKENS, TOKENS)] * 3  # one softmax a layer, no SDPA beside it
    torch.testing.assert_close(out.logits, sdpa, atol=1e-5, rtol=0)
    for layer in range(3):
        torch.testing.assert_close(kept[layer], eager[layer], atol=1e-5, rtol=0)


def test_asked_rows_alone_are_formed_and_equal_eagers_rows(msn, monkeypatch):
    model, x, sdpa, eager = msn
    monkeypatch.setattr(recording_attention, "_eager_of", _no_eager)
    rows = [0, 9]
    with torch.no_grad(), _Softmaxes() as spy:
        out, kept = model.run(x, layers=[1, 2], rows=rows)
    # two recorded layers: their softmax over the asked rows alone; the output SDPA's own, every layer's
    assert spy.shapes == [(2, 4, 2, TOKENS)] * 2 and spy.sdpa == 3
    assert not any(shape[-2:] == (TOKENS, TOKENS) for shape in spy.shapes)
    torch.testing.assert_close(out.logits, sdpa, atol=1e-5, rtol=0)
    for layer in (1, 2):
        torch.testing.assert_close(kept[layer], eager[layer][:, :, rows], atol=1e-5, rtol=0)


def test_the_cost_counts_the_asked_rows_alone():
    """The 896-px CLS map of a ViT-B/14 (12 heads, 64 x 64 patches and a CLS token): one row's scores, not the
    1.5 GB of the whole layer's, under the default 1,024 MB bound."""
    tokens = 64 * 64 + 1
    cost = plan.library_attention(1, 12, tokens, 1, rows=1, rows_formed=True)
    assert cost.memory == 4 * 12 * tokens + 2 * 4 * 12 * tokens  # kept + one row's scores and probabilities
    assert cost.memory < bounds.memory_limit()
    plan.decide(cost)
    whole = plan.library_attention(1, 12, tokens, 1, rows=1, rows_formed=False)
    assert whole.memory > 1.5e9 and whole.memory > bounds.memory_limit()


def test_one_row_is_not_refused_where_the_whole_layer_would_be(msn, monkeypatch):
    """The 896-px refusal at a small size: the bound scaled down between one row's bytes and the whole layer's."""
    model, x, _, eager = msn
    assert model.forms_asked_rows
    whole_layer = 2 * 4 * 2 * 4 * TOKENS * TOKENS  # scores and probabilities, float32, two images, four heads
    monkeypatch.setenv(bounds.ANALYSIS_MEMORY_ENV, str(whole_layer / 2 / 2**20))
    with torch.no_grad():
        _, kept = model.run(x, layers=[2], rows=[0])
    torch.testing.assert_close(kept[2], eager[2][:, :, [0]], atol=1e-5, rtol=0)
    with pytest.raises(bounds.TooManyTokens, match="one query's row"), torch.no_grad():
        model.run(x, layers=[2])  # every row asked: still refused, in one line
