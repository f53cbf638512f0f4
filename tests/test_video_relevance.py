"""One class's maps of a VideoMAE clip against references computed on transformers' own
``VideoMAEForVideoClassification`` (eager attention, ``output_attentions``) by hand-written autograd, never our output:
the class map is Chefer et al.'s gradient rollout (``R = R + mean_h((∇A ⊙ A)⁺) @ R``, their
``generate_relevance``) on HF's attentions, LeGrad the authors' per-layer ``relu(∂s_l/∂A_l)`` averaged over heads
and queries with the classifier (mean pooling, fc_norm, head) reading each layer's output, AttnLRP lxt's rules
(tests/reference/lxt) patched into HF's modules. Every map kind either draws for a clip or is refused in one line.

The models are tiny random transformers classifiers (sigma 0.05 noise), t, rows and cols all different, so a map
that swapped time and rows would not match.
"""

import numpy as np
import pytest
import torch
from helpers import lxt_norms
from test_videomae import videomae_folder, write_gif

from tests.reference.lxt.patches import wrap_attention_forward
from vit.core.clips import clip_pixels, read_clip
from vit.explain.views.attention_maps import MAP_KINDS
from vit.explain.views.video import analyse_clip, explain_analysed, explain_clip
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds

FRAMES, HEIGHT, WIDTH = 4, 24, 32  # t, gh, gw = 2, 3, 4: a swap of time and rows shows


@pytest.fixture(scope="module")
def videomae(tmp_path_factory):
    folder = tmp_path_factory.mktemp("videomae")
    model, processor = videomae_folder(folder / "model", FRAMES, HEIGHT, WIDTH)
    checkpoint = open_source(folder / "model")
    frames = read_clip(write_gif(folder / "clip.gif", FRAMES + 3), FRAMES).frames
    pixels = processor(frames, return_tensors="pt").pixel_values  # (1, frames, 3, H, W)
    assert torch.allclose(clip_pixels(frames, checkpoint.preprocessing), pixels, atol=1e-6)
    return model, checkpoint, frames, pixels


def tubelets(values: torch.Tensor) -> torch.Tensor:
    """HF's token order (its Conv3d output flattened) -> (t, gh, gw), each tubelet repeated over its 2 frames."""
    return values.reshape(FRAMES // 2, HEIGHT // 8, WIDTH // 8).repeat_interleave(2, dim=0)


def assert_close_to_scale(ours: np.ndarray, expected: torch.Tensor) -> None:
    scale = expected.abs().max()
    assert ours.shape == tuple(expected.shape)
    torch.testing.assert_close(torch.from_numpy(ours).double() / scale, expected.double() / scale,
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("class_index, query", [(None, 0), (2, 13)])
def test_the_class_map_is_chefers_gradient_rollout_on_transformers_attentions(videomae, class_index, query):
    model, checkpoint, frames, pixels = videomae
    with torch.enable_grad():
        out = model(pixel_values=pixels, output_attentions=True)
        index = int(out.logits.argmax()) if class_index is None else class_index
        grads = torch.autograd.grad(out.logits[0, index], out.attentions)
    T = out.attentions[0].shape[-1]
    R = torch.eye(T)
    for attention, grad in zip(out.attentions, grads, strict=True):  # Chefer et al.'s generate_relevance
        cam = (grad[0] * attention[0]).clamp(min=0).mean(dim=0)
        R = R + cam @ R
    explained = explain_clip(checkpoint, frames, "class", query=query, class_index=class_index)
    assert explained.query == query and explained.heads is None
    assert_close_to_scale(explained.map, tubelets(R[query].detach()))


@pytest.mark.parametrize("start_layer", [-2, 1])
def test_legrad_is_the_authors_formula_with_the_mean_pooled_classifier_at_each_layer(videomae, start_layer):
    model, checkpoint, frames, pixels = videomae
    with torch.enable_grad():
        out = model(pixel_values=pixels, output_attentions=True, output_hidden_states=True)
        index = 3
        L, total = len(out.attentions), 0
        for layer in range(L)[start_layer:]:  # the classifier reads layer `layer`'s output (no final norm)
            score = model.classifier(model.fc_norm(out.hidden_states[layer + 1].mean(1)))[0, index]
            [grad] = torch.autograd.grad(score, out.attentions[layer], retain_graph=True)
            total = total + grad[0].clamp(min=0).mean(dim=0).mean(dim=0)  # heads, then queries: (T,)
    explained = explain_clip(checkpoint, frames, "legrad", layer=start_layer, class_index=index)
    assert_close_to_scale(explained.map, tubelets(total))


def relevance_with_lxts_rules(model, pixels, index: int, wrap, monkeypatch) -> torch.Tensor:
    """Class ``index``'s relevance ``x * dx`` of each frame's pixels, (frames, H, W), through HF's VideoMAE with lxt's
    norm rules and its eager attention wrapped by ``wrap`` (lxt's ``wrap_attention_forward`` or
    ``cp_wrap_attention_forward``), all undone before our model runs."""
    from transformers.models.videomae import modeling_videomae

    with monkeypatch.context() as m, torch.enable_grad():
        lxt_norms(m)
        m.setattr(modeling_videomae, "eager_attention_forward", wrap(modeling_videomae.eager_attention_forward))
        x = pixels.clone().requires_grad_(True)
        model(pixel_values=x).logits[0, index].backward()
    return (x * x.grad).sum(dim=2)[0].detach()


def test_attnlrp_is_lxts_rules_patched_into_transformers_videomae(videomae, monkeypatch):
    model, checkpoint, frames, pixels = videomae
    relevance = relevance_with_lxts_rules(model, pixels, 1, wrap_attention_forward, monkeypatch)
    expected = relevance.reshape(FRAMES, HEIGHT // 8, 8, WIDTH // 8, 8).sum(dim=(2, 4))  # (frames, gh, gw)
    assert not torch.allclose(expected[0::2], expected[1::2])  # a frame's own, not its tubelet's
    explained = explain_clip(checkpoint, frames, "attnlrp", class_index=1)
    assert_close_to_scale(explained.map, expected)


def test_cp_lrp_of_a_clip_is_lxts_cp_rules_patched_into_transformers_videomae(videomae, monkeypatch):
    """CP-LRP (no relevance through the attention weights), the notebook API's ``relevance.attnlrp(cp=True)`` as for
    images, on a clip: lxt's ``cp_wrap_attention_forward`` (q and k stopped) patched into HF's VideoMAE; AttnLRP's
    relevance is another map here."""
    from tests.reference.lxt.patches import cp_wrap_attention_forward
    from vit.explain.methods.relevance import attnlrp

    model, checkpoint, frames, pixels = videomae
    expected = relevance_with_lxts_rules(model, pixels, 1, cp_wrap_attention_forward, monkeypatch)  # (frames, H, W)
    scale = expected.abs().max()
    torch.testing.assert_close(attnlrp(checkpoint.model, pixels, 1, cp=True)[0] / scale, expected / scale,
                               rtol=1e-5, atol=1e-5)
    assert (attnlrp(checkpoint.model, pixels, 1)[0] - expected).abs().max() > 1e-2 * scale


@pytest.mark.parametrize("method, layer, class_index", [("gradcam", -1, 3), ("gradcam", 0, None), ("layercam", -1, 1),
                                                      ("eigencam", -1, None), ("eigencam", 0, None)])
def test_a_clips_cams_are_pytorch_grad_cams_own_on_the_3d_feature_map_of_transformers_videomae(videomae, method,
                                                                                               layer, class_index):
    """pytorch-grad-cam's own GradCAM, LayerCAM and EigenCAM (tests/reference/pytorch_grad_cam: their 5-D branches)
    on HF's VideoMAE, hooking the explained layer's ``layernorm_before`` with a ``reshape_transform`` to the 3D feature
    map ``(B, D, t, gh, gw)``, as pytorch-grad-cam#529 asks for VideoMAE; compared on the tubelet grid, min-max scaled
    as its ``forward`` scales. Taking frames for rows (a 2D map of the folded grid) would not match."""
    from test_cam import REFERENCE, scaled

    from tests.reference.pytorch_grad_cam.model_targets import ClassifierOutputTarget

    model, checkpoint, frames, pixels = videomae
    t, gh, gw = FRAMES // 2, HEIGHT // 8, WIDTH // 8

    class Logits(torch.nn.Module):  # pytorch-grad-cam calls model(input) for a tensor of logits
        def __init__(self):
            super().__init__()
            self.hf = model

        def forward(self, x):
            return self.hf(pixel_values=x).logits

    def reshape_transform(tensor):  # tokens (B, t*gh*gw, D), time-major as HF's Conv3d flattens them
        return tensor.reshape(tensor.size(0), t, gh, gw, tensor.size(2)).permute(0, 4, 1, 2, 3)

    wrapped = Logits().eval()
    index = class_index if class_index is not None else int(wrapped(pixels).argmax())
    reference = REFERENCE[method](model=wrapped, target_layers=[model.videomae.encoder.layer[layer].layernorm_before],
                                  reshape_transform=reshape_transform)
    reference.get_target_width_height = lambda input_tensor: None  # the map on the tubelet grid: no zoom
    with reference, torch.enable_grad():
        expected = torch.from_numpy(reference(pixels.clone(), [ClassifierOutputTarget(index)]))[0]  # (t, gh, gw)
    assert expected.shape == (t, gh, gw)
    ours = explain_clip(checkpoint, frames, method, layer=layer, class_index=class_index).map  # (frames, gh, gw)
    np.testing.assert_array_equal(ours[0::2], ours[1::2])  # a tubelet's value over its two frames
    assert float(expected.max()) > 0.99  # a map, not a ReLU'd zero
    torch.testing.assert_close(scaled(torch.from_numpy(ours[0::2].copy())[None])[0], expected, rtol=0, atol=2e-5)


def test_a_clips_cam_past_the_memory_bound_is_refused_in_one_line_before_the_work(videomae, monkeypatch):
    from vit.costs import plan
    from vit.explain.methods import cam

    _, checkpoint, frames, _ = videomae
    clip = analyse_clip(checkpoint, frames)
    need = plan.gradient(checkpoint.model, clip.analysis.grid, "Grad-CAM", layers=2).memory
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str((need - 1) / 2**20))
    monkeypatch.setattr(cam, "layer_activations", lambda *args, **kwargs: pytest.fail("the work ran"))
    with pytest.raises(ValueError, match="Grad-CAM keeps .*a clip's size is the model's own: raise "
                                         "VIT_ANALYSIS_MEMORY_MB, or choose a later layer") as error:
        explain_analysed(checkpoint, clip, "gradcam", layer=0)
    assert "\n" not in str(error.value)
    monkeypatch.undo()
    assert explain_analysed(checkpoint, clip, "gradcam", layer=-1).map.shape == (FRAMES, HEIGHT // 8, WIDTH // 8)


def test_every_map_kind_draws_for_a_clip_or_is_refused_in_one_line(videomae):
    _, checkpoint, frames, _ = videomae
    clip = analyse_clip(checkpoint, frames)
    drawn = []
    for kind in [*MAP_KINDS, "similarity", "lens"]:  # the image page's kinds, and the clip's own
        try:
            explained = explain_analysed(checkpoint, clip, kind)
        except ValueError as error:
            assert "\n" not in str(error) and "yet" not in str(error), (kind, str(error))
            continue
        assert explained.map.shape == (FRAMES, HEIGHT // 8, WIDTH // 8) and np.isfinite(explained.map).all()
        drawn.append(kind)
    assert drawn == ["attention", "rollout", "class", "legrad", "attnlrp", "gradcam", "eigencam", "layercam", "norms",
                     "similarity", "lens"]
    with pytest.raises(ValueError, match="Chefer et al.'s.*use AttnLRP"):
        explain_analysed(checkpoint, clip, "lrp")
    with pytest.raises(ValueError, match="leave query out"):
        explain_analysed(checkpoint, clip, "legrad", query=3)
    with pytest.raises(ValueError, match="out of range: this model has 5 classes"):
        explain_analysed(checkpoint, clip, "attnlrp", class_index=5)


def test_a_class_map_is_computed_once_per_class_and_then_read_from_the_clips_cache(videomae, monkeypatch):
    from vit.explain.methods import relevance

    _, checkpoint, frames, _ = videomae
    clip = analyse_clip(checkpoint, frames)
    calls, real = [], relevance.legrad
    monkeypatch.setattr(relevance, "legrad", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = explain_analysed(checkpoint, clip, "legrad", class_index=0).map
    again = explain_analysed(checkpoint, clip, "legrad", class_index=0).map
    assert len(calls) == 1 and np.array_equal(first, again)


def test_similarity_over_frames_is_the_cosine_of_transformers_hidden_states(videomae):
    model, checkpoint, frames, pixels = videomae
    with torch.no_grad():
        states = model(pixel_values=pixels, output_hidden_states=True).hidden_states  # no final norm: mean pooling
    query = 12 + 4 + 2  # the second tubelet's row 1, col 2 (12 tubelets a time step, 4 a row)
    for layer in (0, 1):
        tokens = states[layer + 1][0]  # (T, D)
        expected = torch.nn.functional.cosine_similarity(tokens, tokens[query][None], dim=-1)
        explained = explain_clip(checkpoint, frames, "similarity", layer=layer, query=query)
        assert_close_to_scale(explained.map, tubelets(expected))
    assert explained.map[2, 1, 2] == explained.map[3, 1, 2] == pytest.approx(1.0, abs=1e-5)  # itself, both frames


def test_pca_colours_over_frames_are_one_fit_on_the_whole_clip_of_transformers_states(videomae):
    """sklearn's ``PCA(3, whiten=True)`` as its documentation computes it (a centred SVD, the largest entry of each
    component positive, whitened over N - 1), then the DINOv2/v3 notebooks' ``sigmoid(2 x projection)``."""
    from vit.explain.views.video import clip_pca

    model, checkpoint, frames, pixels = videomae
    with torch.no_grad():
        tokens = model(pixel_values=pixels, output_hidden_states=True).hidden_states[2][0].double().numpy()
    centred = tokens - tokens.mean(axis=0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    components = vt[:3] * np.sign(vt[:3][np.arange(3), np.abs(vt[:3]).argmax(axis=1)])[:, None]
    projection = centred @ components.T / (s[:3] / np.sqrt(len(tokens) - 1))  # (T, 3), whitened
    expected = 1 / (1 + np.exp(-2 * projection))
    colours = clip_pca(checkpoint, analyse_clip(checkpoint, frames), layer=1)  # (frames, gh, gw, 3)
    assert colours.shape == (FRAMES, HEIGHT // 8, WIDTH // 8, 3)
    for channel in range(3):
        np.testing.assert_allclose(colours[..., channel], tubelets(torch.from_numpy(expected[:, channel])).numpy(),
                                   rtol=0, atol=1e-5)


@pytest.mark.parametrize("layer", [0, 1])
def test_the_logit_lens_reads_each_of_transformers_tokens_through_its_fc_norm_and_head(videomae, layer):
    model, checkpoint, frames, pixels = videomae
    with torch.no_grad():
        states = model(pixel_values=pixels, output_hidden_states=True).hidden_states
        probabilities = model.classifier(model.fc_norm(states[layer + 1][0])).softmax(dim=-1)  # (T, classes)
    explained = explain_clip(checkpoint, frames, "lens", layer=layer, class_index=4)
    assert_close_to_scale(explained.map, tubelets(probabilities[:, 4]))


def test_direct_logit_attribution_splits_transformers_logit_into_each_heads_share(videomae):
    """Head ``h`` of layer ``l`` wrote ``context_h @ dense.weight[:, h]ᵀ`` into every token; the mean pooling averages
    it, and fc_norm, frozen at the scale of the final pooled vector, and the classifier read it linearly."""
    from vit.explain.views.video import clip_logit_attribution

    model, checkpoint, frames, pixels = videomae
    contexts = []
    hooks = [layer.attention.attention.register_forward_hook(lambda m, args, out: contexts.append(out[0]))
             for layer in model.videomae.encoder.layer]
    with torch.no_grad():
        out = model(pixel_values=pixels, output_hidden_states=True)
    for hook in hooks:
        hook.remove()
    pooled = out.hidden_states[-1][0].mean(dim=0)  # (D,): what fc_norm reads
    norm, index = model.fc_norm, 2
    scale = (pooled.var(unbiased=False) + norm.eps).sqrt()
    H, D = model.config.num_attention_heads, model.config.hidden_size
    hd = D // H
    expected = torch.zeros(len(contexts), H)
    for layer, context in enumerate(contexts):  # (1, T, D): the heads' contexts side by side
        weight = model.videomae.encoder.layer[layer].attention.output.dense.weight  # (D, D)
        for h in range(H):
            written = (context[0, :, h * hd:(h + 1) * hd] @ weight[:, h * hd:(h + 1) * hd].T).mean(dim=0)  # (D,)
            frozen = (written - written.mean()) / scale * norm.weight
            expected[layer, h] = model.classifier.weight[index] @ frozen
    attribution = clip_logit_attribution(checkpoint, analyse_clip(checkpoint, frames), index)
    torch.testing.assert_close(attribution.heads[0], expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(attribution.total()[0], out.logits[0, index], rtol=1e-4, atol=1e-5)


def test_attnlrp_past_the_memory_bound_is_refused_in_one_line_naming_what_runs_in_chunks(tmp_path, monkeypatch):
    # 2,048 tubelets: AttnLRP's checkpointed path counts 18 MB (each block's input and one block's graph, 32 wide),
    # LeGrad's 11 (8, and the clip's 16 frames preprocessed again: 3)
    videomae_folder(tmp_path / "big", 16, 128, 128)
    checkpoint = open_source(tmp_path / "big")
    frames = read_clip(write_gif(tmp_path / "clip.gif", 16, size=(128, 128)), 16).frames
    clip = analyse_clip(checkpoint, frames)  # within the default bound (37 MB)
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "12")
    with pytest.raises(ValueError, match="a clip's size is the model's own: raise VIT_ANALYSIS_MEMORY_MB, or choose "
                                         "LeGrad or the class map") as error:
        explain_analysed(checkpoint, clip, "attnlrp")
    with pytest.raises(ValueError, match="a clip's size is the model's own") as error:  # no input size to choose
        explain_analysed(checkpoint, clip, "class")
    assert "smaller input" not in str(error.value) and "\n" not in str(error.value)
    assert "\n" not in str(error.value) and "12 MB limit" in str(error.value)
    assert explain_analysed(checkpoint, clip, "legrad").map.shape == (16, 16, 16)  # in chunks, within the bound


def test_attnlrp_past_its_whole_paths_bound_checkpoints_the_blocks_and_draws_the_same_map(tmp_path, monkeypatch):
    """Between the two paths' bounds AttnLRP keeps each block's input and runs the block again in the backward
    (one block's graph at a time): the map is the whole path's."""
    from vit.costs import plan
    from vit.model.layouts import folded_grid

    videomae_folder(tmp_path / "big", 16, 128, 128)  # 2,048 tubelets
    checkpoint = open_source(tmp_path / "big")
    frames = read_clip(write_gif(tmp_path / "clip.gif", 16, size=(128, 128)), 16).frames
    clip = analyse_clip(checkpoint, frames)
    cost = plan.attnlrp(checkpoint.model, folded_grid(clip.grid))
    assert cost.chunked < cost.memory
    whole = explain_analysed(checkpoint, clip, "attnlrp").map
    clip = analyse_clip(checkpoint, frames)  # a new analysis, nothing cached (within the default bound: 37 MB)
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str((cost.chunked + cost.memory) / 2 / 2**20))
    assert plan.decide(plan.attnlrp(checkpoint.model, folded_grid(clip.grid))) == "chunks"
    np.testing.assert_allclose(explain_analysed(checkpoint, clip, "attnlrp").map, whole, rtol=1e-6, atol=1e-12)


def test_head_ablation_and_each_heads_effect_on_a_clip_equal_transformers_with_the_heads_context_zeroed(videomae):
    """``mechanism.ablate_heads`` and ``ablation_grid`` on a clip's pixels: transformers' VideoMAE with one head's
    slice of its context zeroed before the output projection (a forward pre-hook on HF's ``dense``)."""
    from vit.explain.mechanism import components as mechanism

    model, checkpoint, frames, pixels = videomae
    ours = checkpoint.model
    layers, heads = len(ours.blocks), ours.blocks[0].attn.num_heads
    head_dim = ours.config.hidden_size // heads

    def theirs(layer: int, head: int) -> torch.Tensor:
        def zero_head(module, args):
            context = args[0].clone()
            context[..., head * head_dim:(head + 1) * head_dim] = 0
            return (context,)
        hook = model.videomae.encoder.layer[layer].attention.output.dense.register_forward_pre_hook(zero_head)
        try:
            with torch.no_grad():
                return model(pixel_values=pixels).logits[0]
        finally:
            hook.remove()

    with torch.no_grad():
        intact = model(pixel_values=pixels).logits[0]
    for layer, head in ((0, 1), (layers - 1, 0)):
        logits, _ = mechanism.ablate_heads(ours, pixels, [(layer, head)])
        torch.testing.assert_close(logits[0], theirs(layer, head), rtol=1e-5, atol=1e-5)
    effects = mechanism.ablation_grid(ours, pixels, classes=1)  # (1, layers, heads)
    expected = torch.tensor([[(theirs(layer, head) - intact)[1].item() for head in range(heads)]
                             for layer in range(layers)])
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(effects[0], expected, rtol=1e-4, atol=1e-5)
