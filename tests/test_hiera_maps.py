"""Hiera's and SAM 2's Hiera's maps on the image through ``vit.explain``, against dense references built from the
libraries' own attentions: HF ``HieraForImageClassification``'s (read at each attention module, placed by HF's own
``unroll`` and pooling of token indices, ``test_hiera_parity``), timm ``hiera_*``'s and timm ``sam2_hiera_*``'s (read
from their softmax; SAM 2's windows placed by timm's own ``window_partition`` and query ``MaxPool2d`` run on token
indices). A query is a token of layer ``l``'s own grid; a pooled-query layer's row lies over its keys, the previous
stage's grid. The rollout and the class map pass through each pooling as each pooled token's 2x2 keys, 1/4 each.
"""

import numpy as np
import pytest
import torch
from parity_helpers import randomize
from PIL import Image
from test_hiera_parity import SAM2_TINY, TIMM_TINY, dense_library_attentions, library_dense, save_hf_hiera, stage_tokens

import vit
from vit.core.inference import InputSize, preprocess
from vit.explain.methods.stage_maps import clicked_row
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing transformers and timm takes seconds

SIZE = 32  # an 8x8 grid in 4x4 mask units; 4x4 in units of 2 (its first layer pooling 8x8); 2x2 global
CLASS = 3
IMAGE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8))
GRIDS = [(8, 8), (4, 4), (4, 4), (2, 2), (2, 2)]  # each layer's queries
KEY_GRIDS = [(8, 8), (8, 8), (4, 4), (4, 4), (2, 2)]  # its keys: the previous stage's in a pooling layer


def pooling(key_grid, grid):
    """``(Tq, Tk)``: each pooled token built from its 2x2 keys, 1/4 each (written out by hand)."""
    (gh, gw), (kh, kw) = grid, key_grid
    m = torch.zeros(gh * gw, kh * kw, dtype=torch.float64)
    for r in range(kh):
        for c in range(kw):
            m[(r // 2) * gw + c // 2, r * kw + c] = 0.25
    return m


def residuals():
    return [torch.eye(g[0] * g[1], dtype=torch.float64) if g == k else pooling(k, g)
            for g, k in zip(GRIDS, KEY_GRIDS, strict=True)]


@pytest.fixture(scope="module")
def hiera(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hiera")
    model = save_hf_hiera(folder, SIZE)
    checkpoint = open_source(folder)
    images = preprocess([IMAGE], checkpoint.preprocessing)  # what vit.explain feeds the model
    assert images.shape == (1, 3, SIZE, SIZE)
    captured = []
    hooks = [layer.attn.register_forward_hook(lambda m, i, o: captured.append(o[1]))
             for stage in model.hiera.encoder.stages for layer in stage.layers]
    out = model(pixel_values=images, output_hidden_states=True, output_attentions=True)
    for hook in hooks:
        hook.remove()
    for attn in captured:
        attn.retain_grad()
    out.logits[0, CLASS].backward()
    dense = [a[0] for a in dense_library_attentions(checkpoint.model, [a.detach() for a in captured], (8, 8))]
    grads = [g[0] for g in dense_library_attentions(checkpoint.model, [a.grad for a in captured], (8, 8))]
    states = [s[0].detach() for s in out.reshaped_hidden_states]  # (H, W, C) after each stage, row-major
    return checkpoint, images, dense, grads, states, out.logits.detach()


def test_every_layers_row_for_a_query_on_its_own_grid_is_hfs_on_its_keys_grid(hiera):
    checkpoint, _, dense, _, _, _ = hiera
    for layer, (grid, keys) in enumerate(zip(GRIDS, KEY_GRIDS, strict=True)):
        for query in (0, min(5, grid[0] * grid[1] - 2), grid[0] * grid[1] - 1):
            for head in (None, dense[layer].shape[0] - 1):
                explanation = vit.explain(checkpoint, IMAGE, "attention", layer=layer, head=head, query=query)
                expected = dense[layer][head] if head is not None else dense[layer].mean(0)  # (Tq, Tk)
                assert explanation.map.shape == explanation.grid == keys
                assert np.allclose(explanation.map.ravel(), expected[query].numpy(), atol=1e-5)
        assert explanation.heads.shape == (dense[layer].shape[0], *keys)  # the layer's own heads
    with pytest.raises(ValueError, match="2x2 tokens"):
        vit.explain(checkpoint, IMAGE, "attention", layer=3, query=4)


def test_a_clicked_patch_is_the_token_covering_it_in_each_layer(hiera):
    checkpoint, images, dense, _, _, _ = hiera
    with torch.no_grad():
        attentions = checkpoint.model.encode(images, output_attentions=True).attentions
    layouts = checkpoint.model.layer_layouts((8, 8))
    patch = 8 * 5 + 6  # row 5, column 6: cell (2, 3) of the 4x4 grid, (1, 1) of the 2x2
    for layer, token in ((1, 11), (3, 3), (4, 3)):
        row = clicked_row(attentions, layouts, layer, patch)[0].flatten(1)  # (H, Tk)
        assert torch.allclose(row, dense[layer][:, token], atol=1e-5)


def test_the_rollout_through_query_pooling_is_the_dense_product_of_hfs_attentions(hiera):
    checkpoint, _, dense, _, _, _ = hiera
    product = None
    for full, residual in zip(dense, residuals(), strict=True):
        a = full.mean(0).double() + residual
        a = a / a.sum(-1, keepdim=True)
        product = a if product is None else a @ product  # (T_l, 64)
    for layer, query in ((4, 2), (4, 0)):
        explanation = vit.explain(checkpoint, IMAGE, "rollout", layer=layer, query=query)
        assert explanation.map.shape == (8, 8)
        assert np.allclose(explanation.map.ravel(), product[query].numpy(), atol=1e-5)
    stage0 = dense[0].mean(0).double() + torch.eye(64, dtype=torch.float64)
    explanation = vit.explain(checkpoint, IMAGE, "rollout", layer=0, query=9)
    assert np.allclose(explanation.map.ravel(), (stage0 / stage0.sum(-1, keepdim=True))[9].numpy(), atol=1e-5)


def test_the_class_map_is_chefers_rollout_of_hfs_gradients_through_the_pooling(hiera):
    """``R = (P_4 + Ā_4) ... (P_0 + Ā_0)`` with ``Ā = mean_heads((grad * attn)+)`` of HF's attentions and gradients
    on the grids, ``P`` the identity or the pooling; read from what the average pooling reads."""
    checkpoint, _, dense, grads, _, _ = hiera
    product = None
    for a, g, residual in zip(dense, grads, residuals(), strict=True):
        factor = residual + (g * a).clamp(min=0).mean(0).double()
        product = factor if product is None else factor @ product
    expected = product.mean(0).numpy()  # (64,)
    explanation = vit.explain(checkpoint, IMAGE, "class", target=CLASS)
    assert explanation.map.shape == (8, 8)
    spread = expected - expected.mean()
    assert np.abs(spread).max() > 1e-5
    np.testing.assert_allclose(explanation.map.ravel() - expected.mean(), spread, atol=1e-3 * np.abs(spread).max())


def test_token_norms_after_each_stage_are_hfs_hidden_states(hiera):
    checkpoint, _, _, _, states, _ = hiera
    for layer, state in ((0, states[1]), (2, states[2]), (4, states[3])):
        explanation = vit.explain(checkpoint, IMAGE, "norms", layer=layer)
        assert np.allclose(explanation.map, state.norm(dim=-1).numpy(), atol=1e-4)


def test_predict_saves_hieras_logits_and_each_layers_windows_with_what_places_them(hiera, tmp_path):
    from vit import predict
    from vit.explain.methods.attention import layer_on_grid
    from vit.model.stages import LayerLayout

    checkpoint, _, dense, _, _, logits = hiera
    IMAGE.save(tmp_path / "photo.png")
    assert predict.main([str(checkpoint.path), str(tmp_path / "photo.png"), "--save-maps", str(tmp_path / "maps")]) == 0
    saved = np.load(tmp_path / "maps" / "photo.npz")
    np.testing.assert_allclose(saved["logits"], logits[0].numpy(), atol=1e-5)
    for i, expected in enumerate(dense):
        layout = LayerLayout(tuple(saved[f"layer_{i}_grid"].tolist()), int(saved[f"layer_{i}_window"]),
                             int(saved[f"layer_{i}_shift"]), stride=int(saved[f"layer_{i}_stride"]))
        placed = layer_on_grid(torch.from_numpy(saved[f"layer_{i}"]), layout)[0]
        torch.testing.assert_close(placed, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", ["lrp", "flow"])
def test_the_maps_of_one_grid_refuse_a_hiera_in_one_line(hiera, method):
    with pytest.raises(ValueError, match="not drawn for a model with stages") as error:
        vit.explain(hiera[0], IMAGE, method)
    assert "\n" not in str(error.value)


def capture_softmax(monkeypatch, model, images):
    """A timm model's output and every softmax it took (its attentions: timm's Hiera has no module around them)."""
    captured, softmax = [], torch.Tensor.softmax

    def recording(self, *args, **kwargs):
        out = softmax(self, *args, **kwargs)
        captured.append(out)
        return out

    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "softmax", recording)
        out = model(images)
    return out, captured


def test_timm_hieras_rows_and_class_map_are_timms(tmp_path, monkeypatch):
    timm.layers.set_fused_attn(False)
    try:
        torch.manual_seed(1)
        model = randomize(timm.create_model("hiera_tiny_224", pretrained=False, img_size=SIZE, **TIMM_TINY))
    finally:
        timm.layers.set_fused_attn(True)
    args = {k: v for k, v in TIMM_TINY.items() if k != "num_classes"}
    timm.models.save_for_hf(model, tmp_path, model_args=dict(img_size=SIZE, **args), safe_serialization=True)
    checkpoint = open_source(tmp_path)
    images = preprocess([IMAGE], checkpoint.preprocessing)
    logits, captured = capture_softmax(monkeypatch, model, images)
    for attn in captured:
        attn.retain_grad()
    logits[0, 1].backward()
    orders = stage_tokens(lambda x: model.unroll(x), (8, 8), 3)  # timm's own Unroll module
    c = checkpoint.model.config
    keys = [c.stage_of(i) - (i == c.stage_start(c.stage_of(i)) and c.stage_of(i) > 0) for i in range(5)]
    dense = [library_dense(a.detach(), orders[c.stage_of(i)], orders[keys[i]])[0] for i, a in enumerate(captured)]
    grads = [library_dense(a.grad, orders[c.stage_of(i)], orders[keys[i]])[0] for i, a in enumerate(captured)]
    explanation = vit.explain(checkpoint, IMAGE, "attention", layer=3, query=1)  # pooled: 4x4 keys, in units of 2
    assert np.allclose(explanation.map.ravel(), dense[3].mean(0)[1].numpy(), atol=1e-5)
    product = None
    for a, g, residual in zip(dense, grads, residuals(), strict=True):
        factor = residual + (g * a).clamp(min=0).mean(0).double()
        product = factor if product is None else factor @ product
    expected = product.mean(0).numpy()
    explanation = vit.explain(checkpoint, IMAGE, "class", target=1)
    spread = expected - expected.mean()
    np.testing.assert_allclose(explanation.map.ravel() - expected.mean(), spread, atol=1e-3 * np.abs(spread).max())


SAM2_SIZE = 64  # 16x16 in windows of 4; 8x8 in windows of 6 (padded to 12x12), pooled from 16x16; 4x4 global last


def sam2_slots(block, key_grid):
    """A timm SAM 2 block's (query slots, key slots) per window, ``(nw, nq)`` and ``(nw, nk)``: its own padding and
    ``window_partition`` run on the key grid's token indices, its query ``MaxPool2d`` on those (-1: padding)."""
    from timm.models.hieradet_sam2 import window_partition

    kh, kw = key_grid
    w = block.window_size[0]
    ids = torch.arange(kh * kw, dtype=torch.float32).view(1, kh, kw, 1) + 1
    ids = torch.nn.functional.pad(ids, (0, 0, 0, -kw % w, 0, -kh % w))  # padding reads 0
    windows = window_partition(ids, (w, w))  # (nw, w, w, 1)
    keys = windows.flatten(1).long() - 1
    if block.attn.q_pool is None:
        return keys, keys
    pooled = block.attn.q_pool(windows.permute(0, 3, 1, 2))[:, 0].flatten(1).long() - 1  # the max key of 2x2
    queries = torch.where(pooled >= 0, (pooled // kw) // 2 * (kw // 2) + (pooled % kw) // 2, -1)
    return queries, keys


def test_sam2_hieras_rows_are_timms_windows_and_its_class_maps_are_refused(tmp_path, monkeypatch):
    timm.layers.set_fused_attn(False)
    try:
        torch.manual_seed(0)
        model = randomize(timm.create_model("sam2_hiera_tiny", pretrained=False, num_classes=0, **SAM2_TINY))
    finally:
        timm.layers.set_fused_attn(True)
    timm.models.save_for_hf(model, tmp_path, model_args=SAM2_TINY, safe_serialization=True)
    checkpoint = open_source(tmp_path)
    image = IMAGE.resize((SAM2_SIZE, SAM2_SIZE))
    images = preprocess([image], checkpoint.preprocessing, InputSize(SAM2_SIZE), 4)  # its own size is SAM 2's 896 px
    with torch.no_grad():
        _, captured = capture_softmax(monkeypatch, model, images)
    key_grids = [(16, 16), (16, 16), (8, 8), (8, 8), (4, 4)]
    grids = [(16, 16), (8, 8), (8, 8), (4, 4), (4, 4)]
    for layer, (block, attn) in enumerate(zip(model.blocks, captured, strict=True)):
        (gh, gw), (kh, kw) = grids[layer], key_grids[layer]
        queries, keys = (sam2_slots(block, (kh, kw)) if block.is_windowed else
                         (torch.arange(gh * gw)[None], torch.arange(kh * kw)[None]))
        dense = torch.zeros(attn.shape[1], gh * gw, kh * kw)
        for win in range(queries.shape[0]):
            q, k = queries[win] >= 0, keys[win] >= 0
            dense[:, queries[win][q][:, None], keys[win][k][None, :]] = attn[win][:, q][:, :, k]
        for query in (0, gh * gw - 1):
            explanation = vit.explain(checkpoint, image, "attention", layer=layer, query=query, size=SAM2_SIZE)
            assert explanation.map.shape == (kh, kw)
            assert np.allclose(explanation.map.ravel(), dense.mean(0)[query].numpy(), atol=1e-5)
    assert vit.explain(checkpoint, image, "rollout", layer=4, query=5, size=SAM2_SIZE).map.shape == (16, 16)
    for method in ("class", "attnlrp"):
        with pytest.raises(ValueError, match="does not apply to this model") as error:
            vit.explain(checkpoint, image, method, size=SAM2_SIZE)
        assert "\n" not in str(error.value)
