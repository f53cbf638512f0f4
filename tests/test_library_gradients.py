"""The class-specific map on the library road (issue 91, item 3): Chefer, Gur & Wolf's gradient rollout of a model
opened as its library builds it. The attention it weighs and the class logit's gradient with respect to it equal
what autograd gives through the library's own eager attention (transformers' ``output_attentions=True``, timm's
explicit path), and the map equals the rollout done by hand on those references. Tiny random models, built and
saved by their own library."""

from __future__ import annotations

import pytest
import torch

import vit
from vit.costs.bounds import TooManyTokens

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")
from test_library_path import reference, save_family  # noqa: E402
from test_library_timm import build  # noqa: E402

TIMM = "flexivit_small"


def image(side: int):
    from PIL import Image

    generator = torch.Generator().manual_seed(3)
    return Image.fromarray((torch.rand(side, side, 3, generator=generator) * 255).to(torch.uint8).numpy())


def by_hand(attentions, gradients, query: int, prefix: int, grid) -> torch.Tensor:
    """Chefer et al.'s rollout written out: R = I, R = R + mean_h(max(grad * A, 0)) @ R per layer; row ``query``,
    the patches' keys on the grid."""
    T = attentions[0].shape[-1]
    R = torch.eye(T, dtype=torch.float64)
    for a, g in zip(attentions, gradients, strict=True):
        R = R + (g[0].double() * a[0].double()).clamp(min=0).mean(0) @ R
    return R[query, prefix:].reshape(grid).float()


def transformers_eager(folder, x: torch.Tensor, class_index: int):
    """transformers' own eager model: its attentions (in the graph) and the class logit's gradient of each."""
    model = reference(folder, "eager")
    out = model(pixel_values=x, output_attentions=True)
    gradients = torch.autograd.grad(out.logits[0, class_index], out.attentions)
    return out.logits.detach(), [a.detach() for a in out.attentions], list(gradients)


def timm_explicit(x: torch.Tensor, class_index: int):
    """timm's own model on its explicit path: the probabilities each block's ``attn_drop`` receives (in the graph)
    and the class logit's gradient of each."""
    model = build(TIMM)
    kept = []
    for block in model.blocks:
        block.attn.fused_attn = False
        block.attn.attn_drop.register_forward_hook(lambda module, args, output: kept.append(args[0]))
    logits = model(x)
    gradients = torch.autograd.grad(logits[0, class_index], kept)
    return logits.detach(), [a.detach() for a in kept], list(gradients)


def test_transformers_attention_and_its_class_gradient_equal_eager_autograd(msn):
    checkpoint = vit.load(msn, device="cpu")
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    logits, attentions, gradients = checkpoint.model.class_gradients(x, 2, range(3))
    their_logits, their_attentions, their_gradients = transformers_eager(msn, x, 2)
    assert torch.allclose(logits, their_logits, atol=1e-6, rtol=0)
    for layer in range(3):
        assert gradients[layer].shape == their_gradients[layer].shape == (1, 4, 17, 17)
        assert torch.allclose(attentions[layer], their_attentions[layer], atol=1e-6, rtol=0)
        assert their_gradients[layer].abs().max() > 1e-4  # a gradient that says something
        assert torch.allclose(gradients[layer], their_gradients[layer], atol=1e-6, rtol=1e-5)


def test_timm_attention_and_its_class_gradient_equal_its_explicit_paths_autograd(flexivit):
    checkpoint = vit.load(flexivit, device="cpu")
    x = torch.randn(1, 3, 48, 48, generator=torch.Generator().manual_seed(1))
    logits, attentions, gradients = checkpoint.model.class_gradients(x, 1, range(2))
    their_logits, their_attentions, their_gradients = timm_explicit(x, 1)
    assert torch.allclose(logits, their_logits, atol=1e-5, rtol=0)
    for layer in range(2):
        assert gradients[layer].shape == (1, 2, 37, 37)
        assert torch.allclose(attentions[layer], their_attentions[layer], atol=1e-6, rtol=0)
        assert their_gradients[layer].abs().max() > 1e-4
        assert torch.allclose(gradients[layer], their_gradients[layer], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("layer", [-1, 1])
def test_vit_explain_draws_the_class_map_as_the_rollout_by_hand_of_eagers_gradients(msn, layer):
    checkpoint = vit.load(msn, device="cpu")
    picture = image(40)
    x = vit.core.inference.preprocess([picture], checkpoint.preprocessing)
    explanation = vit.explain(checkpoint, picture, "class", target="fox", layer=layer, query=3)
    _, attentions, gradients = transformers_eager(msn, x, 2)
    end = layer % 3 + 1
    expected = by_hand(attentions[:end], gradients[:end], 3, 1, (4, 4))
    assert explanation.map.shape == (4, 4) and explanation.target == "fox"
    assert torch.allclose(torch.from_numpy(explanation.map), expected, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(torch.from_numpy(explanation.map), expected.T, atol=1e-6, rtol=1e-5)
    assert explanation.prediction is not None and "fox" in explanation.description


def test_the_class_map_defaults_to_the_predicted_class(flexivit):
    checkpoint = vit.load(flexivit, device="cpu")
    picture = image(48)
    x = vit.core.inference.preprocess([picture], checkpoint.preprocessing)
    explanation = vit.explain(checkpoint, picture, "class")
    with torch.no_grad():
        predicted = int(build(TIMM)(x)[0].argmax())
    _, attentions, gradients = timm_explicit(x, predicted)
    assert explanation.target == checkpoint.class_names[predicted]
    expected = by_hand(attentions, gradients, 0, 1, (6, 6))
    assert torch.allclose(torch.from_numpy(explanation.map), expected, atol=1e-6, rtol=1e-5)


def test_the_class_map_is_listed_for_a_classifier_and_refused_in_one_line_without_one(msn, tmp_path):
    assert "class" in vit.methods(vit.load(msn, device="cpu"))
    ijepa = vit.load(save_family(tmp_path, "ijepa"), device="cpu")
    assert "class" not in vit.methods(ijepa)
    with pytest.raises(ValueError, match="^class explains a class: this model has no classifier$"):
        vit.explain(ijepa, image(32), "class")
    with pytest.raises(ValueError, match="does not read head; it reads target, layer, query$"):
        vit.explain(vit.load(msn, device="cpu"), image(32), "class", head=0)


def test_past_the_memory_limit_the_class_map_is_refused_in_one_line_before_the_forward(msn, monkeypatch):
    checkpoint = vit.load(msn, device="cpu")
    ran = []
    checkpoint.model.model.register_forward_pre_hook(lambda *args: ran.append(1))
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.01")
    with pytest.raises(TooManyTokens) as refused:
        vit.explain(checkpoint, image(32), "class")
    assert "\n" not in str(refused.value) and not ran


# -- the CAMs: pytorch-grad-cam's own classes on the library's own model ------------------------------------------

from test_cam import REFERENCE, reference_cam, scaled, vit_transform  # noqa: E402


class Logits(torch.nn.Module):
    """transformers' classifier as pytorch-grad-cam calls a model: pixels in, logits out."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(pixel_values=x).logits


@pytest.mark.parametrize("method", list(REFERENCE))
@pytest.mark.parametrize("road", ["transformers", "timm"])
def test_each_cam_equals_pytorch_grad_cams_own_on_the_librarys_own_norm1(msn, flexivit, road, method):
    """pytorch-grad-cam's class on the library's own model, its target the explained layer's first norm named by
    hand (transformers' ``layernorm_before``, timm's ``norm1``, the ViT tutorial's), with the tutorial's
    ``reshape_transform``; both maps min-max scaled as pytorch-grad-cam scales its output."""
    folder, side, grid, layer = (msn, 40, (4, 4), 2) if road == "transformers" else (flexivit, 48, (6, 6), 0)
    checkpoint = vit.load(folder, device="cpu")
    picture = image(side)
    x = vit.core.inference.preprocess([picture], checkpoint.preprocessing)
    if road == "transformers":
        theirs = reference(folder, "eager")
        model, target = Logits(theirs), theirs.vit.layers[layer].layernorm_before
    else:
        model = build(TIMM)
        target = model.blocks[layer].norm1
    expected = reference_cam(method, model, target, vit_transform(1, grid), x, 1)[0]
    options = {} if method == "eigencam" else {"target": 1}
    ours = vit.explain(checkpoint, picture, method, layer=layer, **options)
    assert ours.map.shape == grid
    assert torch.from_numpy(ours.map).abs().max() > 0
    assert torch.allclose(scaled(torch.from_numpy(ours.map)[None])[0], expected, atol=1e-4, rtol=0)
    if method != "eigencam":
        assert ours.target == checkpoint.class_names[1]
        assert not torch.allclose(scaled(torch.from_numpy(ours.map.T.copy())[None])[0], expected, atol=1e-4, rtol=0)


# -- AttnLRP: lxt's own rules patched into transformers' own model -----------------------------------------------

from tests.reference.lxt.patches import layer_norm_forward, non_linear_forward, wrap_attention_forward  # noqa: E402


def lxt_relevance(folder, x: torch.Tensor, class_index: int, monkeypatch) -> torch.Tensor:
    """lxt's AttnLRP of the class logit on transformers' own eager model, its efficient rules patched in as
    ``lxt.efficient`` patches a model's classes (``layer_norm_forward`` on ``nn.LayerNorm``, ``non_linear_forward``
    on the activation classes, ``wrap_attention_forward`` on the modelling file's ``eager_attention_forward``):
    input x gradient at ``pixel_values`` summed over the channels, ``(H, W)``."""
    from transformers import activations
    from transformers.models.vit_msn import modeling_vit_msn

    model = reference(folder, "eager")
    with monkeypatch.context() as m:
        m.setattr(torch.nn.LayerNorm, "forward", layer_norm_forward)
        for act in {type(module) for module in model.modules() if type(module).__module__ == activations.__name__}:
            m.setattr(act, "original_forward", act.forward, raising=False)
            m.setattr(act, "forward", non_linear_forward)
        m.setattr(modeling_vit_msn, "eager_attention_forward",
                  wrap_attention_forward(modeling_vit_msn.eager_attention_forward))
        pixels = x.clone().requires_grad_(True)
        with torch.enable_grad():
            [grad] = torch.autograd.grad(model(pixel_values=pixels).logits[0, class_index], pixels)
    return (pixels.detach() * grad).sum(1)[0]


def test_attnlrp_equals_lxts_rules_on_transformers_own_model(msn, monkeypatch):
    checkpoint = vit.load(msn, device="cpu")
    picture = image(40)
    x = vit.core.inference.preprocess([picture], checkpoint.preprocessing)
    theirs = lxt_relevance(msn, x, 0, monkeypatch).reshape(4, 8, 4, 8).sum((1, 3))
    ours = vit.explain(checkpoint, picture, "attnlrp", target=0)
    scale = float(theirs.abs().max())
    assert ours.map.shape == (4, 4) and scale > 0 and ours.target == "cat"
    assert float((torch.from_numpy(ours.map) - theirs).abs().max()) <= 1e-5 * scale
    assert float((torch.from_numpy(ours.map.T.copy()) - theirs).abs().max()) > 1e-2 * scale
    with torch.enable_grad():  # the rules changed the map: it is not the plain gradient x input
        pixels = x.clone().requires_grad_(True)
        [grad] = torch.autograd.grad(reference(msn, "eager")(pixel_values=pixels).logits[0, 0], pixels)
    plain = (pixels.detach() * grad).sum(1)[0].reshape(4, 8, 4, 8).sum((1, 3))
    assert float((torch.from_numpy(ours.map) - plain).abs().max()) > 1e-2 * scale
    # the rules are current only inside the map: the model's own forward afterwards is the plain one
    with torch.no_grad():
        assert torch.allclose(checkpoint.model(x), reference(msn, "sdpa")(pixel_values=x).logits, atol=1e-6, rtol=0)


def test_attnlrp_on_timms_own_modules_is_refused_in_one_line_and_not_listed(flexivit, msn):
    checkpoint = vit.load(flexivit, device="cpu")
    assert "attnlrp" not in vit.methods(checkpoint) and "class" in vit.methods(checkpoint)
    assert "attnlrp" in vit.methods(vit.load(msn, device="cpu"))
    with pytest.raises(ValueError, match="^AttnLRP on the library road puts lxt's rules on transformers' modules;"):
        vit.explain(checkpoint, image(48), "attnlrp")


@pytest.mark.parametrize("method", ["gradcam", "attnlrp", "legrad", "scorecam"])
def test_past_the_memory_limit_each_gradient_map_is_refused_in_one_line_before_the_forward(msn, monkeypatch, method):
    checkpoint = vit.load(msn, device="cpu")
    ran = []
    checkpoint.model.model.register_forward_pre_hook(lambda *args: ran.append(1))
    if method == "scorecam":  # its forwards, one per channel, past the limit of forwards
        from vit.costs import plan

        monkeypatch.setattr(plan, "MAX_PASSES", 31)
        picture = image(32)
        with pytest.raises(TooManyTokens, match="would run 32 forwards") as refused:
            vit.explain(checkpoint, picture, method)
    else:
        monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "0.01")
        with pytest.raises(TooManyTokens) as refused:
            vit.explain(checkpoint, image(32), method)
        assert not ran
    assert "\n" not in str(refused.value)


def test_the_library_gradient_cost_counts_the_backward_and_the_kept_layers():
    """The bytes ``plan.library_gradient`` counts, by hand: captum's gradient pass of one input
    (``memory.library_pass_bytes``) and 2 x H x T² floats a kept layer."""
    from vit.costs import memory, plan

    shape = plan.LibraryShape(12, 12, 768, 3072, 1, (16, 16))
    base = plan.library_gradient(shape, (14, 14), "x").memory
    assert base == memory.library_pass_bytes(shape, (14, 14), True)
    assert plan.library_gradient(shape, (14, 14), "x", 12).memory - base == 2 * 4 * 12 * 197 * 197 * 12


# -- LeGrad: the head reading an earlier layer, as a model cut after that layer reads it ----------------------------

def legrad_by_hand(per_layer: list[tuple[torch.Tensor, torch.Tensor]], prefix: int, grid) -> torch.Tensor:
    """LeGrad's aggregation written out: relu(dS_l/dA_l) averaged over heads and queries, summed over the layers,
    the patches' keys on the grid."""
    total = sum(g[0].clamp(min=0).mean(0).mean(0) for _, g in per_layer)
    return total[prefix:].reshape(grid).float()


def transformers_cut(folder, x: torch.Tensor, class_index: int, layer: int):
    """transformers' own eager model with its layers after ``layer`` removed, so its head reads that layer's
    output: the class logit's gradient with respect to that layer's attention."""
    model = reference(folder, "eager")
    model.vit.layers = torch.nn.ModuleList(list(model.vit.layers)[:layer + 1])
    out = model(pixel_values=x, output_attentions=True)
    [grad] = torch.autograd.grad(out.logits[0, class_index], out.attentions[layer])
    return out.attentions[layer].detach(), grad


def timm_cut(x: torch.Tensor, class_index: int, layer: int):
    model = build(TIMM)
    model.blocks = model.blocks[:layer + 1]
    kept = []
    for block in model.blocks:
        block.attn.fused_attn = False
        block.attn.attn_drop.register_forward_hook(lambda module, args, output: kept.append(args[0]))
    [grad] = torch.autograd.grad(model(x)[0, class_index], kept[layer])
    return kept[layer].detach(), grad


@pytest.mark.parametrize("road", ["transformers", "timm"])
def test_legrad_equals_the_aggregation_by_hand_of_cut_models_eager_gradients(msn, flexivit, road):
    folder, side, grid, first, layers = (msn, 40, (4, 4), 1, 3) if road == "transformers" else (flexivit, 48, (6, 6),
                                                                                               0, 2)
    checkpoint = vit.load(folder, device="cpu")
    picture = image(side)
    x = vit.core.inference.preprocess([picture], checkpoint.preprocessing)
    cut = (lambda layer: transformers_cut(folder, x, 2, layer)) if road == "transformers" else (
        lambda layer: timm_cut(x, 2, layer))
    expected = legrad_by_hand([cut(layer) for layer in range(first, layers)], 1, grid)
    ours = vit.explain(checkpoint, picture, "legrad", target=2, layer=first)
    assert ours.map.shape == grid and float(expected.abs().max()) > 0
    assert torch.allclose(torch.from_numpy(ours.map), expected, atol=1e-7, rtol=1e-5)
    assert not torch.allclose(torch.from_numpy(ours.map.T.copy()), expected, atol=1e-7, rtol=1e-5)


def test_legrad_defaults_to_the_last_two_layers_and_the_predicted_class(msn):
    checkpoint = vit.load(msn, device="cpu")
    picture = image(40)
    x = vit.core.inference.preprocess([picture], checkpoint.preprocessing)
    with torch.no_grad():
        predicted = int(reference(msn, "sdpa")(pixel_values=x).logits[0].argmax())
    expected = legrad_by_hand([transformers_cut(msn, x, predicted, layer) for layer in (1, 2)], 1, (4, 4))
    ours = vit.explain(checkpoint, picture, "legrad")
    assert ours.target == checkpoint.class_names[predicted] and ours.settings["layer"] == 1
    assert torch.allclose(torch.from_numpy(ours.map), expected, atol=1e-7, rtol=1e-5)
    with torch.no_grad():  # the blocks pass their input on only inside LeGrad: the model afterwards is whole
        assert torch.allclose(checkpoint.model(x), reference(msn, "sdpa")(pixel_values=x).logits, atol=1e-6, rtol=0)
