"""The recorder at the attention function (``vit.core.attention_recorder``): whatever code calls it, SDPA,
``nn.MultiheadAttention`` or an explicit softmax hands over the same probabilities the module weighs its values by,
and the module's output is its own. References: torch's own SDPA and ``nn.MultiheadAttention``'s own weights, timm's
explicit path, the authors' DINOv2 (tests/reference/dinov2) with its q and k read from its own ``qkv``."""

import sys
import warnings
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vit.core.attention_recorder import AttentionRecording, sdpa_probabilities
from vit.costs.bounds import ANALYSIS_MEMORY_ENV, TooManyTokens
from vit.sources.library_road.transformers_models import _AttentionRecorder

DINOV2 = Path(__file__).parent / "reference" / "dinov2"


def authors_dinov2(registers: int = 2, depth: int = 3) -> torch.nn.Module:
    """A tiny random DINOv2 with registers, built by the authors' own code (xFormers absent: their ``Attention``
    calls ``F.scaled_dot_product_attention``)."""
    if str(DINOV2) not in sys.path:
        sys.path.insert(0, str(DINOV2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from dinov2.layers import MemEffAttention
        from dinov2.layers import NestedTensorBlock as Block
        from dinov2.models.vision_transformer import DinoVisionTransformer
    torch.manual_seed(0)
    model = DinoVisionTransformer(img_size=28, patch_size=7, embed_dim=32, depth=depth, num_heads=4, mlp_ratio=2,
                                  block_fn=partial(Block, attn_class=MemEffAttention),
                                  num_register_tokens=registers, init_values=1.0)
    model.init_weights()
    with torch.no_grad():  # registers and CLS away from zero, so a misplaced token shows
        model.cls_token.normal_()
        if registers:
            model.register_tokens.normal_()
    return model.eval()


def own_probabilities(attention: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The authors' ``Attention``'s own probabilities for its input ``x`` (B, N, C): q and k from its own ``qkv``,
    split as its forward splits them, ``softmax(q k^T * scale)``."""
    B, N, C = x.shape
    qkv = attention.qkv(x).reshape(B, N, 3, attention.num_heads, C // attention.num_heads)
    q, k, _ = [t.transpose(1, 2) for t in torch.unbind(qkv, 2)]
    return ((q @ k.transpose(-2, -1)) * attention.scale).softmax(-1)


def record(model, modules, pixels, rows=None):
    recorder = _AttentionRecorder(dict(modules), None, rows)
    with torch.no_grad(), AttentionRecording(model, recorder):
        out = model(pixels)
    return out, recorder.kept


def test_sdpa_probabilities_weigh_sdpas_own_values_with_masks_causal_gqa_and_scale():
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    boolean = torch.rand(2, 1, 5, 7) > 0.3
    boolean[..., 0] = True  # every query keeps a key
    additive = torch.randn(1, 4, 5, 7)
    for mask, causal, scale in ((None, False, None), (boolean, False, None), (additive, False, 0.3),
                                (None, True, None), (boolean[..., :5, :7], False, 2.0)):
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                                  enable_gqa=True)
        p = sdpa_probabilities(q, k, mask, causal, scale)
        assert torch.allclose(p @ v.repeat_interleave(2, dim=1), expected, atol=1e-5)
        assert torch.allclose(p.sum(-1), torch.ones(2, 4, 5), atol=1e-6)


def test_asked_rows_alone_are_the_same_rows_of_the_whole():
    torch.manual_seed(2)
    q, k = torch.randn(1, 3, 6, 4), torch.randn(1, 3, 6, 4)
    mask = torch.randn(1, 1, 6, 6)
    whole = sdpa_probabilities(q, k, mask, True)
    assert torch.equal(sdpa_probabilities(q, k, mask, True, rows=[4, 0]), whole[:, :, [4, 0]])


def test_authors_dinov2_every_layer_is_its_own_attention_from_its_q_and_k_and_its_output_unchanged():
    model = authors_dinov2()
    pixels = torch.randn(2, 3, 21, 35)  # 3 x 5 patches, non-square
    inputs = {}
    hooks = [block.attn.register_forward_pre_hook(lambda m, a, i=i: inputs.__setitem__(i, a[0]))
             for i, block in enumerate(model.blocks[0])]
    with torch.no_grad():
        expected_out = model(pixels)
    for h in hooks:
        h.remove()
    out, kept = record(model, {i: b.attn for i, b in enumerate(model.blocks[0])}, pixels)
    assert torch.allclose(out, expected_out, atol=1e-5)
    for i, block in enumerate(model.blocks[0]):
        with torch.no_grad():
            expected = own_probabilities(block.attn, inputs[i])
        assert kept[i].shape == (2, 4, 1 + 2 + 15, 18)
        assert torch.allclose(kept[i], expected, atol=1e-5)


def test_only_the_asked_layers_are_kept_and_only_the_asked_rows_formed():
    model = authors_dinov2()
    pixels = torch.randn(1, 3, 21, 35)
    _, whole = record(model, {1: model.blocks[0][1].attn}, pixels)
    out, rows = record(model, {1: model.blocks[0][1].attn}, pixels, rows=[0, 5])
    assert list(rows) == [1] and rows[1].shape == (1, 4, 2, 18)
    assert torch.allclose(rows[1], whole[1][:, :, [0, 5]], atol=1e-6)
    with torch.no_grad():
        assert torch.equal(out, model(pixels))  # SDPA's own output where only rows were formed



def test_each_call_forms_the_asked_rows_its_recorder_names_for_it():
    """Fast: one rule for both roads (``formed_rows``): every row under a gradient or in a window; a layer's own rows
    over the asked ones; a recorder naming each call's rows (Qwen's pieces) is asked with the call's query count."""
    from types import SimpleNamespace

    from vit.core.attention_recorder import formed_rows

    plain = SimpleNamespace(gradient=False, rows=[0, 5], rows_of={2: [1]}, windows={3: object()})
    assert formed_rows(plain, 1, 18) == [0, 5] and formed_rows(plain, 2, 18) == [1]
    assert formed_rows(plain, 3, 18) is None
    assert formed_rows(SimpleNamespace(gradient=True, rows=[0], rows_of=None), 1, 18) is None
    asked = []
    pieces = SimpleNamespace(gradient=False, rows=None, rows_of=None, rows_for=lambda layer, n: asked.append(n) or [])
    assert formed_rows(pieces, 1, 7) == [] and asked == [7]
    recorder = _AttentionRecorder({}, None, [4])
    assert recorder.rows_for(0, 18) == [4] and formed_rows(recorder, 0, 18) == [4]

def test_layers_are_the_calls_in_order_named_by_the_module_that_made_them():
    model = authors_dinov2()
    trace = []
    with torch.no_grad(), AttentionRecording(model, trace=trace, image_hw=(21, 35)) as mode:
        model(torch.randn(1, 3, 21, 35))
    assert [(c.index, c.name, c.kind, c.heads, c.queries, c.keys) for c in trace] == [
        (i, f"blocks.0.{i}.attn", "sdpa", 4, 18, 18) for i in range(3)]
    assert mode.patch == (7, 7)


def test_multihead_attention_hands_its_own_per_head_weights_and_returns_what_was_asked():
    torch.manual_seed(3)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 8)
    mask = torch.randn(5, 5)
    with torch.no_grad():
        own_out, own_weights = mha(x, x, x, attn_mask=mask, need_weights=True, average_attn_weights=False)
    recorder = _AttentionRecorder({0: mha}, None, None)
    with torch.no_grad(), AttentionRecording(mha, recorder):
        out, weights = mha(x, x, x, attn_mask=mask, need_weights=False)
    assert weights is None
    assert torch.allclose(out, own_out, atol=1e-6)
    assert torch.allclose(recorder.kept[0], own_weights, atol=1e-6)


def test_an_explicit_softmax_is_recorded_as_timms_explicit_path_forms_it():
    from timm.layers import Attention

    torch.manual_seed(4)
    attention = Attention(16, num_heads=2).eval()
    attention.fused_attn = False
    x = torch.randn(1, 6, 16)
    own = {}
    attention.attn_drop.register_forward_hook(lambda m, a, o: own.__setitem__("p", a[0]))
    with torch.no_grad():
        expected_out = attention(x)
    recorder = _AttentionRecorder({0: attention}, None, None)
    with torch.no_grad(), AttentionRecording(attention, recorder):
        out = attention(x)
    assert torch.equal(out, expected_out)
    assert torch.equal(recorder.kept[0], own["p"])


def test_a_layer_over_the_memory_limit_is_refused_before_its_scores_are_formed(monkeypatch):
    model = authors_dinov2(depth=1)
    monkeypatch.setenv(ANALYSIS_MEMORY_ENV, "0.001")  # about 1 kB: under one layer's 4 x 18 x 18 floats
    with pytest.raises(TooManyTokens, match=r"blocks\.0\.0\.attn.*one query's row"):
        record(model, {0: model.blocks[0][0].attn}, torch.randn(1, 3, 21, 35))
    _, kept = record(model, {0: model.blocks[0][0].attn}, torch.randn(1, 3, 21, 35), rows=[0])  # one row fits
    assert kept[0].shape == (1, 4, 1, 18)
