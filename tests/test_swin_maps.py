"""Swin's maps on the image, against dense references built from HF's own attentions: each layer's row placed on its
own grid (HF's ``window_partition`` of a token-index map, padded and rolled as HF does), and the rollout through the
stages (a dense product of every layer's placed attention, the merge as the average of each 2x2 neighbourhood)."""

import json

import numpy as np
import pytest
import torch
from parity_helpers import randomize
from PIL import Image

import vit
from vit.core.inference import preprocess
from vit.explain.methods.stage_maps import clicked_row, layer_row, rollout_row
from vit.model import covering_token
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds

SIZE = 40  # a 10x10 grid in windows of 4: padded to 12x12 and shifted; then 5x5 padded to 8x8, shifted again
CLASS = 3  # the class of the class map
IMAGE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def swin(tmp_path_factory):
    from transformers.models.swin.modeling_swin import window_partition

    config = transformers.SwinConfig(image_size=SIZE, patch_size=4, embed_dim=24, depths=[2, 2], num_heads=[2, 4],
                                     window_size=4, num_labels=5)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = randomize(transformers.SwinForImageClassification(config))
    folder = tmp_path_factory.mktemp("swin")
    model.save_pretrained(folder)
    checkpoint = open_source(folder)
    images = preprocess([IMAGE], checkpoint.preprocessing)  # what vit.explain feeds the model
    assert images.shape == (1, 3, SIZE, SIZE)
    layers = [block for stage in model.swin.encoder.layers for block in stage.blocks]
    captured = []
    hooks = [b.attention.register_forward_hook(lambda m, i, o: captured.append(o[1])) for b in layers]
    states = []  # each block's output
    hooks += [b.register_forward_hook(lambda m, i, o: states.append(o[0] if isinstance(o, tuple) else o))
              for b in layers]
    logits = model(pixel_values=images).logits
    for attn in captured:
        attn.retain_grad()
    logits[0, CLASS].backward()  # the attentions' gradients for the class map
    for hook in hooks:
        hook.remove()
    grids = [(10, 10)] * 2 + [(5, 5)] * 2
    dense, dense_grad = [], []
    for layer, attn, grid in zip(layers, captured, grids, strict=True):
        T, w, s = grid[0] * grid[1], layer.window_size, layer.shift_size
        ids = torch.arange(T, dtype=torch.float32).view(1, *grid, 1)
        ids, _ = layer.maybe_pad(ids + 1, *grid)  # padding reads 0 -> -1 below
        slots = window_partition(torch.roll(ids, (-s, -s), (1, 2)), w).reshape(-1, w * w).long() - 1  # (nw, n)
        for windows, out in ((attn.detach(), dense), (attn.grad, dense_grad)):
            full = torch.zeros(attn.shape[1], T, T)
            for win, tokens in enumerate(slots):
                real = (tokens >= 0).nonzero()[:, 0]
                full[:, tokens[real][:, None], tokens[real][None, :]] = windows[win][:, real][:, :, real]
            out.append(full)
    states = [state.detach() for state in states]
    return checkpoint, images, grids, dense, states, dense_grad


def merge_reference(grid):
    gh, gw = grid
    oh, ow = (gh + 1) // 2, (gw + 1) // 2
    m = torch.zeros(oh * ow, gh * gw)
    for r in range(oh):
        for c in range(ow):
            inputs = [(2 * r + dr) * gw + 2 * c + dc for dr in (0, 1) for dc in (0, 1)
                      if 2 * r + dr < gh and 2 * c + dc < gw]
            m[r * ow + c, inputs] = 1 / len(inputs)
    return m


def test_every_layers_row_is_hfs_placed_on_its_own_grid(swin):
    checkpoint, images, grids, dense, _, _ = swin
    with torch.no_grad():
        attentions = checkpoint.model.encode(images, output_attentions=True).attentions
    layouts = checkpoint.model.layer_layouts((10, 10))
    for layer, grid in enumerate(grids):
        for query in (0, 7, grid[0] * grid[1] - 1):
            ours = layer_row(attentions, layouts, layer, query)  # (1, H, gh, gw)
            assert ours.shape[-2:] == grid
            assert torch.allclose(ours[0].flatten(1), dense[layer][:, query], atol=1e-5)


def test_a_clicked_patch_is_the_covering_token_of_each_layers_grid(swin):
    checkpoint, images, _, dense, _, _ = swin
    assert covering_token(0, (10, 10), (5, 5)) == 0
    assert covering_token(10 * 3 + 9, (10, 10), (5, 5)) == 1 * 5 + 4  # row 3, column 9 -> cell (1, 4)
    with torch.no_grad():
        attentions = checkpoint.model.encode(images, output_attentions=True).attentions
    layouts = checkpoint.model.layer_layouts((10, 10))
    assert torch.allclose(clicked_row(attentions, layouts, 3, 39)[0].flatten(1), dense[3][:, 9], atol=1e-5)


def test_rollout_through_the_stages_matches_a_dense_product(swin):
    checkpoint, images, grids, dense, _, _ = swin
    with torch.no_grad():
        attentions = checkpoint.model.encode(images, output_attentions=True).attentions
    layouts = checkpoint.model.layer_layouts((10, 10))
    factors = []
    for full in dense:
        a = full.mean(0).double() + torch.eye(full.shape[-1], dtype=torch.float64)
        factors.append(a / a.sum(-1, keepdim=True))
    product = factors[3] @ factors[2] @ merge_reference((10, 10)).double() @ factors[1] @ factors[0]  # (25, 100)
    for query in (0, 12, 24):
        ours = rollout_row(attentions, layouts, -1, query)  # (1, 10, 10)
        assert torch.allclose(ours[0].flatten().double(), product[query], atol=1e-5)
        assert ours.sum().item() == pytest.approx(1.0, abs=1e-5)
    first = rollout_row(attentions, layouts, 1, 5)[0].flatten().double()  # within stage 0: no merge
    assert torch.allclose(first, (factors[1] @ factors[0])[5], atol=1e-5)


def test_vit_explain_counts_layers_through_the_stages_and_reads_the_query_on_the_layers_own_grid(swin):
    checkpoint, _, _, dense, _, _ = swin
    for layer, query, head in ((0, 37, 1), (3, 9, 2), (2, 24, None)):
        explanation = vit.explain(checkpoint, IMAGE, "attention", layer=layer, head=head, query=query)
        grid = (10, 10) if layer < 2 else (5, 5)
        expected = dense[layer][head] if head is not None else dense[layer].mean(0)  # (T_l, T_l)
        assert explanation.map.shape == explanation.grid == grid
        assert np.allclose(explanation.map.ravel(), expected[query].numpy(), atol=1e-5)
        assert explanation.heads.shape == (dense[layer].shape[0], *grid)  # the layer's own heads
    with pytest.raises(ValueError, match="5x5 tokens"):
        vit.explain(checkpoint, IMAGE, "attention", layer=3, query=25)
    with pytest.raises(ValueError, match="this layer has 4 heads"):
        vit.explain(checkpoint, IMAGE, "attention", layer=3, head=4)


def test_vit_explain_rolls_out_from_a_later_stages_token_to_the_image(swin):
    checkpoint, _, _, dense, _, _ = swin
    factors = []
    for full in dense:
        a = full.mean(0).double() + torch.eye(full.shape[-1], dtype=torch.float64)
        factors.append(a / a.sum(-1, keepdim=True))
    product = factors[3] @ factors[2] @ merge_reference((10, 10)).double() @ factors[1] @ factors[0]  # (25, 100)
    explanation = vit.explain(checkpoint, IMAGE, "rollout", layer=3, query=17)
    assert explanation.map.shape == (10, 10)
    assert np.allclose(explanation.map.ravel(), product[17].numpy(), atol=1e-5)


def test_vit_explain_norms_are_each_layers_output_on_its_own_grid(swin):
    checkpoint, _, _, _, states, _ = swin
    for layer, state in enumerate(states):  # HF's blocks' outputs
        explanation = vit.explain(checkpoint, IMAGE, "norms", layer=layer)
        assert np.allclose(explanation.map.ravel(), state[0].norm(dim=-1).numpy(), atol=1e-4)


@pytest.mark.parametrize("method", ["lrp", "flow"])
def test_vit_explain_refuses_the_maps_of_one_grid_in_one_line(swin, method):
    with pytest.raises(ValueError, match="not drawn for a model with stages") as error:
        vit.explain(swin[0], IMAGE, method)
    assert "\n" not in str(error.value)


def test_vit_explain_draws_legrad_of_a_swin_on_the_image_patches(swin):
    from vit.explain.methods.relevance import legrad  # against HF's autograd: test_stage_legrad

    checkpoint, images, _, _, _, _ = swin
    explanation = vit.explain(checkpoint, IMAGE, "legrad", target=1)
    assert explanation.map.shape == explanation.grid == (10, 10)
    assert np.allclose(explanation.map, legrad(checkpoint.model, images, 1)[0].numpy(), atol=1e-7)
    assert "average pooling" in explanation.description


def test_vit_explain_draws_attnlrp_of_a_swin_on_the_image_patches(swin):
    from vit.explain.methods.relevance import attnlrp, patch_sums

    checkpoint, images, _, _, _, _ = swin
    explanation = vit.explain(checkpoint, IMAGE, "attnlrp", target=1)
    expected = patch_sums(attnlrp(checkpoint.model, images, 1), (10, 10))[0]  # lxt's rules: test_swin_methods
    assert np.allclose(explanation.map, expected.numpy(), atol=1e-6)


def test_the_explorers_flow_refuses_a_swin_in_one_line_and_its_mechanism_entry_points_answer(swin):
    from vit.explain.views import mechanism_views, method_maps

    checkpoint = swin[0]
    with pytest.raises(ValueError, match="stages") as error:
        method_maps.model_method_map(checkpoint, IMAGE, "flow", 0)
    assert "\n" not in str(error.value)
    # Mechanism works per layer's grid (its numbers: test_stage_mechanism against HF edited by hooks)
    mechanism_views.mechanism_view(checkpoint, IMAGE, 0)
    mechanism_views.patching_view(checkpoint, IMAGE, IMAGE.transpose(Image.Transpose.FLIP_LEFT_RIGHT))
    means = mechanism_views.reference_means(checkpoint, [IMAGE], IMAGE)
    assert len(means) == len(checkpoint.model.blocks)


def test_the_class_map_rolls_hfs_gradient_weighted_attention_out_through_the_stages(swin):
    """Chefer et al.'s ``R = (I + Ā_3)(I + Ā_2) M (I + Ā_1)(I + Ā_0)`` with ``Ā = mean_heads((grad * attn)+)`` of HF's
    attentions and their gradients placed on each grid, ``M`` the merge; read from what the pooling reads."""
    checkpoint, _, _, dense, _, dense_grad = swin
    terms = [(g * a).clamp(min=0).mean(0).double() for a, g in zip(dense, dense_grad, strict=True)]
    eye = [torch.eye(t.shape[0], dtype=torch.float64) for t in terms]
    product = ((eye[3] + terms[3]) @ (eye[2] + terms[2]) @ merge_reference((10, 10)).double() @ (eye[1] + terms[1])
               @ (eye[0] + terms[0]))  # (25, 100)
    explanation = vit.explain(checkpoint, IMAGE, "class", target=CLASS)
    assert explanation.map.shape == (10, 10)
    expected = product.mean(0).numpy()
    spread = expected - expected.mean()  # the relevance on top of the identity's uniform share
    assert np.abs(spread).max() > 1e-5
    np.testing.assert_allclose(explanation.map.ravel() - expected.mean(), spread, atol=1e-3 * np.abs(spread).max())
    with pytest.raises(ValueError, match="average pooling"):
        vit.explain(checkpoint, IMAGE, "class", query=3)


def test_what_stacks_a_swins_hidden_states_refuses_it_in_one_line_and_the_dataset_analysis_runs(swin, tmp_path, capsys):
    from vit import analyze
    from vit.explain.methods.hidden import forward_with_hidden_states

    checkpoint, images = swin[0], swin[1]
    with pytest.raises(ValueError, match="do not stack") as error:
        forward_with_hidden_states(checkpoint.model, images)
    assert "\n" not in str(error.value)
    for name in ("LABEL_0", "LABEL_1"):
        (tmp_path / "data" / name).mkdir(parents=True)
        IMAGE.save(tmp_path / "data" / name / "a.png")
    args = [str(checkpoint.path), "--data", str(tmp_path / "data"), "--out", str(tmp_path / "out")]
    assert analyze.main([*args, "--mechanism"]) != 0  # the mechanism stacks hidden states of one grid
    [line] = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert "--mechanism" in line and "stages" in line and not (tmp_path / "out").exists()
    assert analyze.main(args) == 0  # the summaries each layer has on its own grid (test_stage_dataset)
    assert json.loads((tmp_path / "out" / "analysis.json").read_text())["readout"] == "average pooling"


def test_a_forward_in_inference_mode_leaves_cached_windows_a_gradient_pass_can_save(swin):
    """The explorer's forward runs in inference mode, then LeGrad or AttnLRP takes gradients through the same model:
    the shift mask and relative index the first caches must not be inference tensors, which autograd cannot save."""
    from vit.model.stages import shift_mask, swin_relative_index

    checkpoint = swin[0]
    shift_mask.cache_clear()
    swin_relative_index.cache_clear()
    images = preprocess([IMAGE], checkpoint.preprocessing)
    with torch.inference_mode():
        checkpoint.model(images)
    images.requires_grad_(True)
    checkpoint.model(images)[0][0, 0].backward()
    assert images.grad is not None and images.grad.abs().sum() > 0
