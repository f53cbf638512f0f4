"""Hiera opened through ``vit.sources`` matches its libraries: logits, the last hidden state and every layer's
attention (mask units, pooled queries, global) to 1e-5 at two input sizes, each placed on the image's grids; the
rollout through query pooling equals a dense reference built from the library's own attentions.

- HF: a tiny random ``HieraForImageClassification`` (3 stages, 4x4 mask units in stages 0-1, global in stage 2),
  saved natively, opened once; 48 px runs HF with ``interpolate_pos_encoding``. Each layer's attention
  ``(B, nh, nw, q, k)`` is read from its attention module's output (``output_attentions`` keeps each stage's last).
- timm: tiny random ``hiera_tiny_224``-style models built at each size (timm's position table is fixed to its
  size), saved with ``save_for_hf``; the attention read from its softmax (``torch.Tensor.softmax`` patched for the
  forward: timm's Hiera has no module around it).
- The libraries hold tokens "unrolled"; which grid token each position holds is read by running the library's own
  unroll (and its max-pooling) on the token indices, so the placement is the library's, not ours.
"""

import pytest
import torch
from parity_helpers import assert_parity, randomize

from vit.explain.methods.attention import layer_on_grid
from vit.explain.methods.stage_maps import rollout_row
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
pytestmark = pytest.mark.slow  # importing transformers and timm takes seconds

# Patch stride 4 on 32 px: an 8x8 grid in 4x4 mask units, pooled to 4x4 (units of 2x2), then 2x2 (global).
# 48 px: 12x12 in 9 units, 6x6, 3x3.
SIZES = (32, 48)
HF_TINY = dict(embed_dim=8, depths=[1, 2, 2], num_heads=[1, 2, 4], masked_unit_size=[4, 4],
               masked_unit_attention=[True, True, False], num_query_pool=2, num_labels=5)
TIMM_TINY = dict(embed_dim=8, num_heads=1, stages=(1, 2, 2), q_pool=2, mask_unit_size=(4, 4),
                 mask_unit_attn=(True, True, False), num_classes=5)


def save_hf_hiera(folder, size: int = SIZES[0], **config):
    """A tiny HF ``HieraForImageClassification`` (``HF_TINY``, ``config`` overrides) at ``size`` px, eager, seed 0
    and noise on every parameter, saved to ``folder``; returns it."""
    config = transformers.HieraConfig(image_size=[size] * 2, **{**HF_TINY, **config})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(transformers.HieraForImageClassification(config))
    model.save_pretrained(folder)
    return model


def pooling_residual(Tq: int, Tk: int) -> torch.Tensor:
    """A layer's residual as a map of tokens, written out by hand: the identity, or in a pooling layer (``Tq`` of
    ``Tk`` square grids) each pooled token built from its 2x2 block uniformly (float64)."""
    if Tq == Tk:
        return torch.eye(Tq, dtype=torch.float64)
    side, key_side = int(Tq ** 0.5), int(Tk ** 0.5)
    residual = torch.zeros(Tq, Tk, dtype=torch.float64)
    for r in range(key_side):
        for c in range(key_side):
            residual[(r // 2) * side + c // 2, r * key_side + c] = 0.25
    return residual


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hiera")
    return save_hf_hiera(folder), open_source(folder)


def stage_tokens(unroll, grid: tuple[int, int], stages: int) -> list[torch.Tensor]:
    """Per stage, the token of that stage's grid (row-major) each of the library's positions holds: its unroll run
    on the patch indices, then its pooling (``view(B, stride, -1).max(1)``) once per stage."""
    gh, gw = grid
    index = unroll(torch.arange(gh * gw, dtype=torch.float64).view(1, -1, 1))[0, :, 0].long()  # stage 0's order
    orders = []
    for s in range(stages):
        orders.append((index // gw >> s) * (gw >> s) + (index % gw >> s))
        if s + 1 < stages:
            index = index.view(4, -1).max(dim=0).values  # the library's 2x2 max-pool of positions
    return orders


def library_dense(attn: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """A library's attention ``(B, nh, nw, q, k)`` (``(B, nh, q, k)`` global) -> ``(B, nh, Tq, Tk)`` on the grids:
    position ``i * nw + w`` is the ``i``-th token of window ``w`` (HF / timm's ``reshape(B, -1, nw, ...)``)."""
    if attn.dim() == 4:
        attn = attn[:, :, None]
    B, nh, nw, nq, nk = attn.shape
    q = queries.view(nq, nw).T  # (nw, nq)
    k = keys.view(nk, nw).T
    dense = attn.new_zeros(B, nh, queries.numel(), keys.numel())
    dense[:, :, q[:, :, None], k[:, None, :]] = attn
    return dense


def dense_library_attentions(model, attentions, grid) -> list[torch.Tensor]:
    """Every layer's library attention placed on the grids: queries on the layer's stage, keys on the stage it
    receives (the previous one in a stage's pooling first block)."""
    c = model.config
    orders = stage_tokens(lambda x: library_unroll(x, grid, c), grid, c.num_stages)
    dense = []
    for layer, attn in enumerate(attentions):
        s = c.stage_of(layer)
        key_stage = s - 1 if s and layer == c.stage_start(s) else s
        dense.append(library_dense(attn, orders[s], orders[key_stage]))
    return dense


def library_unroll(x, grid, config):
    """HF's ``unroll`` of ``x`` (1, gh*gw, 1) for a grid ``grid`` (HF's and timm's are the same code)."""
    from transformers.models.hiera.modeling_hiera import unroll
    return unroll(x, (grid[0] * 4, grid[1] * 4), [4, 4], [[2, 2]] * (config.num_stages - 1))


def hf_run(model, images):
    layers = [layer.attn for stage in model.hiera.encoder.stages for layer in stage.layers]
    captured = []
    hooks = [m.register_forward_hook(lambda m, i, o: captured.append(o[1])) for m in layers]
    try:
        with torch.no_grad():
            out = model(pixel_values=images, output_attentions=True,
                        interpolate_pos_encoding=images.shape[-1] != SIZES[0])
    finally:
        for hook in hooks:
            hook.remove()
    return out, captured


def ours_placed(checkpoint, images):
    with torch.no_grad():
        ours = checkpoint.model.encode(images, output_attentions=True)
        hidden, _ = checkpoint.model.tokens(images)
    layouts = checkpoint.model.layer_layouts((images.shape[-2] // 4, images.shape[-1] // 4))
    return ours, hidden, [layer_on_grid(a, lay) for a, lay in zip(ours.attentions, layouts, strict=True)], layouts


@pytest.mark.parametrize("size", SIZES)
def test_hf_hiera_matches_transformers_at_two_sizes(hf_pair, size):
    model, checkpoint = hf_pair
    images = torch.randn(2, 3, size, size)
    out, attentions = hf_run(model, images)
    ours, hidden, placed, _ = ours_placed(checkpoint, images)
    expected = dense_library_attentions(checkpoint.model, attentions, (size // 4, size // 4))
    assert [a.shape[-2:] for a in placed] == [(s * s, t * t) for s, t in [(size // 4,) * 2, (size // 8, size // 4),
                                                                          (size // 8,) * 2, (size // 16, size // 8),
                                                                          (size // 16,) * 2]]
    assert_parity(f"hiera | HF | {size} px", ours.logits, out.logits, placed, expected)
    with torch.no_grad():  # HF's output_hidden_states rerolls for its config's size only, so its encoder's output
        last = model.hiera(images, interpolate_pos_encoding=size != SIZES[0]).last_hidden_state
    assert torch.allclose(hidden, last, atol=1e-5)  # the last stage's tokens: row-major in both
    for a in placed:  # Hiera pads nothing: every row is whole on its key grid
        assert torch.allclose(a.sum(-1), torch.ones(a.shape[:-1]), atol=1e-5)


def test_a_pooled_row_lies_in_its_mask_unit_on_the_previous_grid(hf_pair):
    _, checkpoint = hf_pair
    _, _, placed, layouts = ours_placed(checkpoint, torch.randn(1, 3, 32, 32))
    assert (layouts[1].grid, layouts[1].window, layouts[1].key_grid, layouts[1].key_window) == ((4, 4), 2, (8, 8), 4)
    row = placed[1][0, :, 5].reshape(2, 8, 8)  # query (1, 1) of the 4x4 grid: its mask unit is the grid's top-left
    # 2x2, whose keys are the 8x8 grid's rows 0-3, columns 0-3
    assert row[:, :4, :4].sum(dim=(1, 2)).allclose(torch.ones(2), atol=1e-5)
    assert row[:, 4:].abs().max() == 0 and row[:, :, 4:].abs().max() == 0


def test_rollout_through_query_pooling_matches_a_dense_reference(hf_pair):
    model, checkpoint = hf_pair
    images = torch.randn(2, 3, 32, 32)
    _, attentions = hf_run(model, images)
    expected = dense_library_attentions(checkpoint.model, attentions, (8, 8))
    # The reference: each layer's heads averaged, plus its residual (the identity, or in a pooling layer each pooled
    # token built from its 2x2 block uniformly, written out here by hand), rows renormalised, multiplied out.
    result = None
    for a in expected:
        fused = a.mean(dim=1).double()  # (B, Tq, Tk)
        Tq, Tk = fused.shape[-2:]
        residual = pooling_residual(Tq, Tk)
        factor = (fused + residual) / (fused + residual).sum(-1, keepdim=True)
        result = factor if result is None else factor @ result  # (B, T_last, 64)
    with torch.no_grad():
        ours = checkpoint.model.encode(images, output_attentions=True).attentions
    layouts = checkpoint.model.layer_layouts((8, 8))
    for query in range(4):
        row = rollout_row(ours, layouts, -1, query).flatten(1)  # (2, 64): on the image's patch grid
        assert torch.allclose(row.double(), result[:, query], atol=1e-5)
        assert torch.allclose(row.sum(-1), torch.ones(2), atol=1e-5)


def test_a_size_the_mask_units_do_not_tile_is_refused_in_one_line(hf_pair):
    _, checkpoint = hf_pair
    with pytest.raises(ValueError, match="multiples of 16 px") as error:
        checkpoint.model.encode(torch.randn(1, 3, 40, 40))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("size", SIZES)
def test_timm_hiera_matches_timm_at_two_sizes(tmp_path, monkeypatch, size):
    timm.layers.set_fused_attn(False)
    try:
        torch.manual_seed(size)
        model = randomize(timm.create_model("hiera_tiny_224", pretrained=False, img_size=size, **TIMM_TINY))
    finally:
        timm.layers.set_fused_attn(True)
    args = {k: v for k, v in TIMM_TINY.items() if k != "num_classes"}
    timm.models.save_for_hf(model, tmp_path / "timm", model_args=dict(img_size=size, **args),
                            safe_serialization=True)
    checkpoint = open_source(tmp_path / "timm")
    images = torch.randn(2, 3, size, size)
    captured, softmax = [], torch.Tensor.softmax

    def recording(self, *args, **kwargs):
        out = softmax(self, *args, **kwargs)
        captured.append(out)
        return out

    monkeypatch.setattr(torch.Tensor, "softmax", recording)
    with torch.no_grad():
        logits = model(images)
    monkeypatch.undo()
    ours, _, placed, _ = ours_placed(checkpoint, images)
    grid = (size // 4, size // 4)
    orders = stage_tokens(lambda x: model.unroll(x), grid, 3)  # timm's own Unroll module
    c = checkpoint.model.config
    expected = [library_dense(a, orders[c.stage_of(i)],
                              orders[c.stage_of(i) - (i == c.stage_start(c.stage_of(i)) and c.stage_of(i) > 0)])
                for i, a in enumerate(captured)]
    assert_parity(f"hiera | timm hiera_tiny_224 | {size} px", ours.logits, logits, placed, expected)


# SAM 2's Hiera (timm HieraDet): 4x4 windows on the 16x16 grid of 64 px, then windows of 6 on 8x8 (padded to 12x12;
# the pooling block's too), pooled to 3 on 4x4 (padded to 6x6), a global last block; 80 px: 20x20, 10x10, 5x5.
SAM2_TINY = dict(embed_dim=8, num_heads=1, stages=(1, 2, 2), q_pool=2, window_spec=(4, 6, 2), global_att_blocks=(4,),
                 global_pos_size=(3, 3))


@pytest.fixture(scope="module")
def sam2_pair(tmp_path_factory):
    timm.layers.set_fused_attn(False)
    try:
        torch.manual_seed(0)
        model = randomize(timm.create_model("sam2_hiera_tiny", pretrained=False, num_classes=0, **SAM2_TINY))
    finally:
        timm.layers.set_fused_attn(True)
    folder = tmp_path_factory.mktemp("sam2")
    timm.models.save_for_hf(model, folder, model_args=SAM2_TINY, safe_serialization=True)
    return model, open_source(folder)


@pytest.mark.parametrize("size", (64, 80))
def test_timm_sam2_hiera_matches_timm_at_two_sizes(sam2_pair, monkeypatch, size):
    model, checkpoint = sam2_pair
    images = torch.randn(2, 3, size, size)
    captured, softmax = [], torch.Tensor.softmax

    def recording(self, *args, **kwargs):
        out = softmax(self, *args, **kwargs)
        captured.append(out)
        return out

    monkeypatch.setattr(torch.Tensor, "softmax", recording)
    with torch.no_grad():
        pooled, features = model(images), model.forward_features(images)
    monkeypatch.undo()
    with torch.no_grad():
        ours = checkpoint.model.encode(images, output_attentions=True)
        hidden, _ = checkpoint.model.tokens(images)
    # Both cut windows row-major on the zero-padded grid, slots row-major: each window's attention compares as is.
    assert_parity(f"sam2 hiera | timm sam2_hiera_tiny | {size} px", ours.embedding, pooled, ours.attentions,
                  captured[:len(ours.attentions)])
    assert torch.allclose(hidden, features.flatten(1, 2), atol=1e-5)
    layouts = checkpoint.model.layer_layouts((size // 4, size // 4))
    placed = layer_on_grid(ours.attentions[3], layouts[3])  # the pooled block: (4x4 or 5x5) x (8x8 or 10x10) keys
    assert placed.shape[-2:] == ((size // 16) ** 2, (size // 8) ** 2) and layouts[3].key_window == 6


def test_sam2_hiera_has_no_classifier_and_refuses_a_size_its_position_windows_do_not_tile(sam2_pair):
    _, checkpoint = sam2_pair
    assert checkpoint.model.head is None
    with pytest.raises(ValueError, match="multiples of 16 px") as error:
        checkpoint.model.encode(torch.randn(1, 3, 72, 72))
    assert "\n" not in str(error.value)


def test_hf_hiera_opens_by_hub_id_then_from_the_cache(hf_pair, tmp_path, fake_hub):
    """The issue's third way in: a Hub id (the local Hub server), downloaded once, then read from the HF cache."""
    model, _ = hf_pair
    model.save_pretrained(tmp_path / "hiera")
    fake_hub.add_folder("acme/hiera-tiny", tmp_path / "hiera")
    images = torch.randn(1, 3, SIZES[0], SIZES[0])
    out, attentions = hf_run(model, images)
    for _ in range(2):
        checkpoint = open_source("acme/hiera-tiny")
        ours, _, placed, _ = ours_placed(checkpoint, images)
        expected = dense_library_attentions(checkpoint.model, attentions, (SIZES[0] // 4,) * 2)
        assert_parity("hiera | HF Hub id", ours.logits, out.logits, placed, expected)
    assert fake_hub.fetched("GET").count("model.safetensors") == 1
