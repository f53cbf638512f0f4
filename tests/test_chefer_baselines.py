"""Chefer et al. (CVPR 2021)'s three baselines against their own code (tests/reference/chefer, copied from
hila-chefer/Transformer-Explainability @ c3e578f7) on the same weights: GradCAM on the last attention
(ViT_explanation_generator.py's ``Baselines.generate_cam_attn`` on ViT_new.py's model), and partial and full LRP
(``LRP.generate_LRP`` with ``method="last_layer"`` / ``"full"`` on ViT_orig_LRP.py's model, layers_lrp.py's rules).

Their generator hard-codes a 14 x 14 grid, so the model here has one (56 px, patches of 4). LRP's near-cancelling
sums make two correct float32 orders differ by ~1e-2 of the map on random weights (tests/test_relevance.py), so the
LRP comparisons run on float64 copies of both models.
"""

import dataclasses

import numpy as np
import pytest
import torch

from tests.reference.chefer.ViT_explanation_generator import LRP, Baselines
from vit.explain.methods.cam import attention_gradcam
from vit.explain.methods.relevance import UnsupportedModelError, full_lrp, partial_lrp, patch_sums
from vit.model import ViT, ViTConfig

CONFIG = ViTConfig(image_size=56, patch_size=4, num_channels=3, num_classes=5, hidden_size=32, num_layers=3,
                   num_heads=4, mlp_size=64)


def random_vit(config: ViTConfig = CONFIG, seed: int = 1) -> ViT:
    torch.manual_seed(seed)
    model = ViT(config).eval()
    with torch.no_grad():  # zero biases and unit norms would hide mapping mistakes
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            if name.endswith("qkv.weight"):
                p.mul_(8)  # peaked attention: at timm's init every row is nearly uniform and the maps ~1e-6
    return model


def images(batch: int = 1, channels: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, channels, 56, 56, generator=torch.Generator().manual_seed(seed))


def reference(ours: ViT, module):
    """Their ``module``'s VisionTransformer with our weights (and our LayerNorm eps: theirs mixes 1e-6 and 1e-5)."""
    c = ours.config
    ref = module.VisionTransformer(img_size=c.image_size, patch_size=c.patch_size, in_chans=c.num_channels,
                                   num_classes=c.num_classes, embed_dim=c.hidden_size, depth=c.num_layers,
                                   num_heads=c.num_heads, mlp_ratio=c.mlp_size / c.hidden_size, qkv_bias=c.qkv_bias)
    state = {k.replace("patch_embed.", "patch_embed.proj."): v for k, v in ours.state_dict().items()}
    ref.load_state_dict(state, strict=True)
    for module in ref.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = c.layer_norm_eps
    return ref.to(next(ours.parameters()).dtype).eval()


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)  # their generator's .cuda() on a CPU


def min_max(x: torch.Tensor) -> torch.Tensor:
    return (x - x.min()) / (x.max() - x.min())


@pytest.mark.parametrize("index", [None, 0, 3])
def test_attention_gradcam_equals_their_generate_cam_attn(on_cpu, index):
    from tests.reference.chefer import ViT_new

    model = random_vit()
    x = images(seed=2)
    theirs = Baselines(reference(model, ViT_new)).generate_cam_attn(x, index)  # (14, 14), min-max normalised
    ours = attention_gradcam(model, x, index)  # (1, 14, 14)
    torch.testing.assert_close(min_max(ours[0]), theirs.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("index", [None, 1, 4])
def test_partial_lrp_equals_their_last_layer_relprop(on_cpu, index):
    from tests.reference.chefer import ViT_orig_LRP

    model = random_vit().double()
    x = images(seed=3).double()
    theirs = LRP(reference(model, ViT_orig_LRP)).generate_LRP(x, index, method="last_layer")  # (gh*gw,)
    ours = partial_lrp(model, x, index)  # (1, 14, 14)
    scale = theirs.abs().max()
    torch.testing.assert_close(ours.flatten() / scale, theirs.detach() / scale, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("channels", [3, 1])  # the z^B rule on RGB, alpha-beta on one channel: their Conv2d's two
@pytest.mark.parametrize("index", [None, 2])
def test_full_lrp_equals_their_full_relprop(on_cpu, channels, index):
    from tests.reference.chefer import ViT_orig_LRP

    model = random_vit(dataclasses.replace(CONFIG, num_channels=channels)).double()
    x = images(channels=channels, seed=4).double()
    theirs = LRP(reference(model, ViT_orig_LRP)).generate_LRP(x, index, method="full")  # (1, 56, 56)
    ours = full_lrp(model, x, index)  # (1, 56, 56)
    scale = theirs.abs().max()
    torch.testing.assert_close(ours / scale, theirs.detach() / scale, rtol=1e-5, atol=1e-7)


def test_full_lrp_passes_on_the_relevance_that_reaches_the_pixels_to_its_patches():
    model = random_vit().double()
    x = images(2, seed=5).double()
    pixels = full_lrp(model, x, torch.tensor([0, 3]))
    assert pixels.shape == (2, 56, 56)
    assert patch_sums(pixels, (14, 14)).shape == (2, 14, 14)


@pytest.mark.parametrize("method", [attention_gradcam, partial_lrp, full_lrp])
def test_a_batch_equals_one_image_at_a_time(method):
    model = random_vit().double()
    x = images(3, seed=6).double()
    classes = torch.tensor([0, 2, 4])
    batched = method(model, x, classes)
    for b in range(3):
        torch.testing.assert_close(batched[b:b + 1], method(model, x[b:b + 1], int(classes[b])), rtol=1e-7,
                                   atol=1e-12)
    torch.testing.assert_close(method(model, x), method(model, x, model(x)[0].argmax(-1)))  # default: predicted


@pytest.mark.parametrize("method", [partial_lrp, full_lrp])
def test_lrp_baselines_refuse_a_model_their_rules_do_not_reach_in_one_line(method):
    model = random_vit(dataclasses.replace(CONFIG, pooling="avg"))
    with pytest.raises(UnsupportedModelError, match="has no rule for pooling='avg'") as error:
        method(model, images())
    assert "\n" not in str(error.value)


def test_attention_gradcam_refuses_a_model_without_cls_in_one_line():
    model = random_vit(dataclasses.replace(CONFIG, class_token=False, pooling="avg"))
    with pytest.raises(ValueError, match="no CLS token") as error:
        attention_gradcam(model, images())
    assert "\n" not in str(error.value)
    assert np.isfinite(attention_gradcam(random_vit(dataclasses.replace(CONFIG, num_register_tokens=2)), images())
                       .numpy()).all()  # registers: the patches after every prefix token


# --- in the explorer and vit.explain ------------------------------------------------------------------------

def test_vit_explain_draws_their_gradcam_on_attention_and_both_lrps(tmp_path, on_cpu):
    from PIL import Image

    import vit
    from tests.reference.chefer import ViT_new
    from vit.checkpoint import save_checkpoint
    from vit.core.inference import preprocess
    from vit.explain.views import attention_maps

    model = random_vit()
    save_checkpoint(tmp_path / "m.pt", model, ["a", "b", "c", "d", "e"])
    checkpoint = vit.load(tmp_path / "m.pt", device="cpu")
    baselines = {"attn-gradcam", "lrp-partial", "lrp-full"}
    assert baselines <= set(vit.methods(checkpoint)) and baselines <= set(attention_maps.MAP_KINDS)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (60, 50, 3), dtype=np.uint8))
    x = preprocess([image], checkpoint.preprocessing)
    theirs = Baselines(reference(model, ViT_new)).generate_cam_attn(x, 2)
    shown = vit.explain(checkpoint, image, "attn-gradcam", target=2).map
    np.testing.assert_allclose(min_max(torch.from_numpy(shown)).numpy(), theirs.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(vit.explain(checkpoint, image, "lrp-partial", target=2).map,
                               partial_lrp(checkpoint.model, x, 2)[0].numpy(), rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(vit.explain(checkpoint, image, "lrp-full", target=2).map,
                               patch_sums(full_lrp(checkpoint.model, x, 2), (14, 14))[0].numpy(), rtol=1e-6,
                               atol=1e-12)


def test_gradcam_on_attention_is_costed_by_its_last_layer_alone(tmp_path, monkeypatch):
    # Its gradient stops at the last block (``attention_gradcam``'s leaf), so the bound counts that layer's attention
    # and gradient, not every layer's (it counted all: 142 MB against 70 grown on a wide BEiT at 96 px). Under a
    # bound between the two counts it is drawn, the same map, where partial LRP (every layer's) is refused.
    from PIL import Image

    import vit
    from vit.checkpoint import save_checkpoint
    from vit.core.inference import preprocess
    from vit.costs import plan

    save_checkpoint(tmp_path / "m.pt", random_vit(), ["a", "b", "c", "d", "e"])
    checkpoint = vit.load(tmp_path / "m.pt", device="cpu")
    last, every = (plan.gradient(checkpoint.model, (14, 14), "x", layers=n).memory for n in (1, None))
    assert every > 2 * last
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str((last + every) / 2 / 2**20))
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (56, 56, 3), dtype=np.uint8))
    x = preprocess([image], checkpoint.preprocessing)
    np.testing.assert_allclose(vit.explain(checkpoint, image, "attn-gradcam", target=2).map,
                               attention_gradcam(checkpoint.model, x, 2)[0].numpy(), rtol=1e-6, atol=1e-12)
    with pytest.raises(ValueError, match="keeps every layer's attention and gradient") as refused:
        vit.explain(checkpoint, image, "lrp-partial", target=2)
    assert "\n" not in str(refused.value)
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str(last / 2 / 2**20))  # under its own count: refused, in its words
    with pytest.raises(ValueError, match="^GradCAM on the last attention keeps its last layer's attention and grad"):
        plan.decide(plan.gradient(checkpoint.model, (14, 14), "GradCAM on the last attention", layers=1))


def test_a_model_no_lrp_rule_reaches_is_refused_for_that_before_its_inputs_size(tmp_path, monkeypatch):
    # A layer scale (BEiT's, DINOv2's) has no rule of theirs at any size: under a bound its gradient is over (each
    # LRP keeps its layers' attention and gradient), the refusal is the missing rule, not "choose a smaller input"
    # and then the rule.
    import vit
    from vit.checkpoint import save_checkpoint
    from vit.costs import plan

    save_checkpoint(tmp_path / "m.pt", random_vit(dataclasses.replace(CONFIG, layer_scale=0.1)), list("abcde"))
    checkpoint = vit.load(tmp_path / "m.pt", device="cpu")
    every = plan.gradient(checkpoint.model, (14, 14), "x").memory
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str(every / 2 / 2**20))
    image = np.zeros((56, 56, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match="over the"):  # the bound is below what an LRP would keep here
        plan.decide(plan.gradient(checkpoint.model, (14, 14), "Chefer et al.'s LRP"))
    for kind in ("lrp", "lrp-partial", "lrp-full"):
        with pytest.raises(UnsupportedModelError, match="has no rule for layer_scale=0.1; use AttnLRP"):
            vit.explain(checkpoint, image, kind, target=2)


def test_a_model_their_lrp_has_no_rule_for_is_offered_neither_lrp_and_told_why(tmp_path):
    import vit
    from vit.checkpoint import save_checkpoint

    save_checkpoint(tmp_path / "m.pt", random_vit(dataclasses.replace(CONFIG, pooling="avg")), list("abcde"))
    checkpoint = vit.load(tmp_path / "m.pt", device="cpu")
    offered = vit.methods(checkpoint)
    assert "lrp-partial" not in offered and "lrp-full" not in offered and "attn-gradcam" in offered
    with pytest.raises(ValueError, match="has no rule for pooling='avg'") as error:
        vit.explain(checkpoint, np.zeros((56, 56, 3), dtype=np.uint8), "lrp-full")
    assert "\n" not in str(error.value)
