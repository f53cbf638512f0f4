"""V-JEPA 2's encoder opened through ``vit.sources`` matches transformers on the same pixels: the last hidden states
to 1e-4 relative and every layer's attention to 1e-5 against ``output_attentions`` (eager), at two clip lengths and
a non-square frame size (HF numbers every token on its configured square grid whatever the frames' size); its 3D
rotary reads time, then rows, then columns, and the parity fails when two of them are swapped; the per-frame maps
are drawn from it; the classifier's logits and its attentive probe's attention equal transformers'.

The models are tiny random ``VJEPA2Model`` built by transformers, sigma 0.05 noise on every parameter, saved
natively and opened by path.
"""

import math

import numpy as np
import pytest
import torch
from helpers import lxt_norms
from PIL import Image

from vit.core.clips import clip_pixels
from vit.explain.views.attention_maps import MapSettings
from vit.explain.views.video import analyse_clip, clip_map, explain_clip
from vit.model.positions import vjepa2_rope
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds

# (frames, height, width): the configured 32 px square at two clip lengths, and non-square frames of another size
CLIPS = [(4, 32, 32), (6, 32, 32), (6, 24, 40)]
HEADS, WIDTH = 3, 48  # head size 16: three rotated segments of 4 channels, 4 left as they are


def vjepa2_folder(folder, architecture: str = "VJEPA2Model"):
    """A tiny random V-JEPA 2 (sigma 0.05 noise on every parameter, the predictor too), saved natively."""
    config = transformers.VJEPA2Config(crop_size=32, patch_size=8, frames_per_clip=4, tubelet_size=2,
                                       hidden_size=WIDTH, num_attention_heads=HEADS, num_hidden_layers=2,
                                       mlp_ratio=2.0, pred_hidden_size=16, pred_num_attention_heads=2,
                                       pred_num_hidden_layers=1, num_pooler_layers=1, num_labels=3)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    model.save_pretrained(folder)
    return model


def frames_of(count: int, height: int, width: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)) for _ in range(count)]


def assert_parity(checkpoint, model, pixels):
    with torch.no_grad():
        theirs = model(pixel_values_videos=pixels, skip_predictor=True, output_attentions=True)
        tokens, attentions = checkpoint.model.tokens(pixels, output_attentions=True)
        ours = checkpoint.model.norm(tokens)
    scale = theirs.last_hidden_state.abs().max().item()
    assert ours.shape == theirs.last_hidden_state.shape
    assert torch.allclose(ours, theirs.last_hidden_state, rtol=1e-4, atol=1e-4 * scale)
    assert len(attentions) == len(theirs.attentions) == 2
    for a, b in zip(attentions, theirs.attentions, strict=True):
        assert a.shape == b.shape and (a - b).abs().max().item() <= 1e-5


@pytest.mark.parametrize("frames, height, width", CLIPS, ids=[f"{f}x{w}x{h}" for f, h, w in CLIPS])
def test_last_hidden_states_and_every_attention_equal_transformers(tmp_path, frames, height, width):
    model = vjepa2_folder(tmp_path / "vjepa2")
    checkpoint = open_source(tmp_path / "vjepa2")
    c = checkpoint.model.config
    assert (c.rope, c.rope_ref_grid, c.num_frames, c.tubelet_size, c.num_prefix_tokens) == ("vjepa2", 4, 4, 2, 0)
    pixels = torch.randn(1, frames, 3, height, width, generator=torch.Generator().manual_seed(frames))
    assert_parity(checkpoint, model, pixels)


def test_swapping_time_and_rows_in_the_rotary_breaks_the_parity(tmp_path, monkeypatch):
    """The parity above is a test of the segments' order: with the time and row segments swapped (each 4 channels
    here) the same model no longer matches transformers."""
    import vit.model.vision_transformer as vt

    model = vjepa2_folder(tmp_path / "vjepa2")
    checkpoint = open_source(tmp_path / "vjepa2")

    def swapped(*args, **kwargs):
        cos, sin = vjepa2_rope(*args, **kwargs)
        order = [*range(4, 8), *range(0, 4), *range(8, 16)]  # rows' segment first, then time's
        return cos[:, order], sin[:, order]

    monkeypatch.setattr(vt, "vjepa2_rope", swapped)
    with pytest.raises(AssertionError):
        assert_parity(checkpoint, model, torch.randn(1, 4, 3, 32, 32, generator=torch.Generator().manual_seed(0)))


def test_the_rotary_reads_time_rows_and_columns_off_the_index_on_its_square_grid():
    """Hand-computed: on a side-2 grid token 6 is (time 1, row 1, col 0) and token 3 is (0, 1, 1); head size 16
    gives segments of 4 channels at frequencies (1, 1/100), tiled [f0, f1, f0, f1], and 4 channels unturned."""
    cos, sin = vjepa2_rope(12, 2, 16, 10000.0)
    assert cos.shape == sin.shape == (12, 16)
    rates = torch.tensor([1.0, 0.01, 1.0, 0.01])

    def segment(position):
        return torch.cos(position * rates)

    for token, (t, r, col) in {6: (1, 1, 0), 3: (0, 1, 1), 11: (2, 1, 1), 4: (1, 0, 0)}.items():
        assert torch.allclose(cos[token], torch.cat([segment(t), segment(r), segment(col), torch.ones(4)]))
    assert torch.equal(sin[:, 12:], torch.zeros(12, 4)) and sin[6, 0].item() == pytest.approx(math.sin(1.0))


@pytest.mark.parametrize("frames", [4, 6])
def test_explain_draws_attention_rollout_and_norms_per_frame(tmp_path, frames):
    model = vjepa2_folder(tmp_path / "vjepa2")
    checkpoint = open_source(tmp_path / "vjepa2")
    sampled = frames_of(frames, 32, 32)
    pixels = clip_pixels(sampled, checkpoint.preprocessing)  # (1, frames, 3, 32, 32)
    with torch.no_grad():
        out = model(pixel_values_videos=pixels, skip_predictor=True, output_attentions=True)
    t, gh, gw = frames // 2, 4, 4
    clip = analyse_clip(checkpoint, sampled)
    for layer, theirs in enumerate(out.attentions):
        assert (clip.analysis.attentions[layer] - theirs).abs().max().item() <= 1e-5
    explained = explain_clip(checkpoint, sampled, "attention", layer=1, head=2, query=(frames - 1, 2, 1))
    assert explained.query == ((t - 1) * gh + 2) * gw + 1
    expected = out.attentions[1][0, 2, explained.query].view(t, gh, gw)  # HF's time-major keys
    assert explained.map.shape == (frames, gh, gw)
    for f in range(frames):  # a tubelet's value on each of its two frames
        assert torch.allclose(torch.from_numpy(explained.map[f]), expected[f // 2], atol=1e-6)
    for kind in ("rollout", "norms"):
        drawn = clip_map(clip, MapSettings(kind=kind, query=explained.query))
        assert drawn.shape == (frames, gh, gw) and np.isfinite(drawn).all() and np.allclose(drawn[0::2], drawn[1::2])


@pytest.mark.parametrize("frames, height, width", CLIPS[1:], ids=[f"{f}x{w}x{h}" for f, h, w in CLIPS[1:]])
def test_the_classifiers_logits_and_its_probes_attention_equal_transformers(tmp_path, frames, height, width):
    """VJEPA2ForVideoClassification: the encoder, its attentive pooler (a self-attention layer, then the query's
    cross-attention read off a norm of the tokens, the query as its residual) and the classifier."""
    model = vjepa2_folder(tmp_path / "classifier", "VJEPA2ForVideoClassification")
    checkpoint = open_source(tmp_path / "classifier")
    c = checkpoint.model.config
    assert (c.num_classes, c.pooling, c.pool_head, c.pool_layers) == (3, "map", "vjepa2", 1)
    pixels = torch.randn(1, frames, 3, height, width, generator=torch.Generator().manual_seed(frames))
    probes = []
    hook = model.pooler.cross_attention_layer.register_forward_hook(lambda m, args, out: probes.append(out[1]))
    with torch.no_grad():
        theirs = model(pixel_values_videos=pixels, output_attentions=True)
        logits, attentions = checkpoint.model(pixels, output_attentions=True)
        _, probe = checkpoint.model.pool(checkpoint.model.tokens(pixels)[0])
    hook.remove()
    scale = theirs.logits.abs().max().item()
    assert torch.allclose(logits, theirs.logits, rtol=1e-4, atol=1e-4 * scale), (logits, theirs.logits)
    assert probe.shape == probes[0].shape == (1, HEADS, 1, (frames // 2) * (height // 8) * (width // 8))
    assert (probe - probes[0]).abs().max().item() <= 1e-5
    for a, b in zip(attentions, theirs.attentions, strict=True):
        assert (a - b).abs().max().item() <= 1e-5
    with torch.no_grad():  # the probe's residual is the query: without it (a projection in its place, the
        checkpoint.model.attn_pool.proj = torch.nn.Identity()  # SigLIP head's path) the logits are another model's
        assert not torch.allclose(checkpoint.model(pixels)[0], theirs.logits, rtol=1e-2, atol=1e-2 * scale)


def test_a_folder_without_processor_settings_prepares_frames_as_vjepa2s_video_processor(tmp_path):
    """``VJEPA2VideoProcessor``'s defaults (the short side to crop * 256 / 224, centre crop, bilinear, ImageNet's
    statistics) on frames of another size and aspect; its settings file is not read yet."""
    vjepa2_folder(tmp_path / "vjepa2")
    checkpoint = open_source(tmp_path / "vjepa2")
    frames = frames_of(4, 30, 45)
    theirs = transformers.VJEPA2VideoProcessor(crop_size=32)(np.stack([np.asarray(f) for f in frames]),
                                                             return_tensors="pt").pixel_values_videos
    assert torch.allclose(clip_pixels(frames, checkpoint.preprocessing), theirs, atol=1e-5)


def test_vit_explain_and_predict_take_a_clip(tmp_path, capsys):
    import json

    import vit
    from vit.predict import main

    vjepa2_folder(tmp_path / "vjepa2")
    frames_of(1, 36, 48)[0].save(tmp_path / "clip.gif", save_all=True, append_images=frames_of(8, 36, 48, 1),
                                 duration=40, loop=0)
    explained = vit.explain(vit.load(str(tmp_path / "vjepa2")), str(tmp_path / "clip.gif"), "norms", layer=1)
    assert explained.map.shape == (4, 4, 4)
    capsys.readouterr()
    assert main([str(tmp_path / "vjepa2"), str(tmp_path / "clip.gif"), "--save-maps", str(tmp_path / "maps")]) == 0
    [record] = json.loads(capsys.readouterr().out)
    assert np.load(record["maps"]["npz"])["layer_0"].shape == (HEADS, 2 * 4 * 4, 2 * 4 * 4)


def test_a_clip_without_a_classifier_draws_its_maps_and_offers_no_class_map(tmp_path):
    from vit.explain.views.video import clip_map_kinds, explain_analysed

    vjepa2_folder(tmp_path / "vjepa2")
    checkpoint = open_source(tmp_path / "vjepa2")
    assert clip_map_kinds(checkpoint) == ("attention", "rollout", "norms", "similarity", "eigencam")
    clip = analyse_clip(checkpoint, frames_of(4, 32, 32))
    assert explain_analysed(checkpoint, clip, "similarity", query=(2, 1, 3)).map.shape == (4, 4, 4)
    for kind in ("lens", "legrad", "attnlrp", "gradcam", "layercam"):
        with pytest.raises(ValueError, match="no classifier") as error:
            explain_analysed(checkpoint, clip, kind)
        assert "\n" not in str(error.value)


def test_eigencam_of_an_encoder_is_pytorch_grad_cams_own_on_the_3d_feature_map(tmp_path):
    """pytorch-grad-cam's own EigenCAM (gradient-free: an encoder without a classifier has one) on HF's V-JEPA 2,
    hooking the last layer's ``norm1`` with a ``reshape_transform`` to ``(B, D, t, gh, gw)``, min-max scaled as its
    ``forward`` scales; each tubelet's value over its two frames."""
    from test_cam import scaled

    from tests.reference.pytorch_grad_cam.eigen_cam import EigenCAM

    model = vjepa2_folder(tmp_path / "vjepa2")
    checkpoint = open_source(tmp_path / "vjepa2")
    frames = frames_of(4, 32, 32)
    pixels = clip_pixels(frames, checkpoint.preprocessing)  # (1, 4, 3, 32, 32)

    class Tokens(torch.nn.Module):  # pytorch-grad-cam calls model(input) for a tensor (unread by EigenCAM)
        def __init__(self):
            super().__init__()
            self.hf = model

        def forward(self, x):
            return self.hf(pixel_values_videos=x, skip_predictor=True).last_hidden_state.mean(1)

    def reshape_transform(tensor):  # tokens (B, t*gh*gw, D), time-major
        return tensor.reshape(tensor.size(0), 2, 4, 4, tensor.size(2)).permute(0, 4, 1, 2, 3)

    reference = EigenCAM(model=Tokens().eval(), target_layers=[model.encoder.layer[-1].norm1],
                         reshape_transform=reshape_transform)
    reference.get_target_width_height = lambda input_tensor: None  # the map on the tubelet grid: no zoom
    with reference:
        expected = torch.from_numpy(reference(pixels.clone(), None))[0]  # (t, gh, gw)
    ours = explain_clip(checkpoint, frames, "eigencam").map  # (frames, gh, gw)
    np.testing.assert_array_equal(ours[0::2], ours[1::2])
    assert float(expected.max()) > 0.99  # a map, not a ReLU'd zero
    torch.testing.assert_close(scaled(torch.from_numpy(ours[0::2].copy())[None])[0], expected, rtol=0, atol=2e-5)


def test_the_classifiers_attnlrp_is_lxts_rules_patched_into_transformers_pooler_and_all(tmp_path, monkeypatch):
    """AttnLRP through VJEPA2ForVideoClassification: lxt's rules (tests/reference/lxt) patched into transformers'
    LayerNorm, GELU and every eager attention, the encoder's and the attentive pooler's (its self-attention layer and
    the query's cross-attention), the relevance ``x * dx`` of each frame's pixels summed per patch. With the rule
    left off the pooler's attentions alone the reference is another map: the test sees the pooler."""
    from transformers.models.vjepa2 import modeling_vjepa2

    from tests.reference.lxt.patches import wrap_attention_forward

    model = vjepa2_folder(tmp_path / "classifier", "VJEPA2ForVideoClassification")
    checkpoint = open_source(tmp_path / "classifier")
    frames = frames_of(4, 32, 32)
    pixels = clip_pixels(frames, checkpoint.preprocessing)  # (1, 4, 3, 32, 32)
    eager = modeling_vjepa2.eager_attention_forward
    ruled = wrap_attention_forward(eager)
    pooler = set(model.pooler.modules())

    def relevance(index: int, pooler_ruled: bool) -> torch.Tensor:
        def attention(module, *args, **kwargs):
            return (ruled if pooler_ruled or module not in pooler else eager)(module, *args, **kwargs)
        with monkeypatch.context() as m, torch.enable_grad():  # undone before our model runs
            lxt_norms(m)
            m.setattr(modeling_vjepa2, "eager_attention_forward", attention)
            x = pixels.clone().requires_grad_(True)
            model(pixel_values_videos=x).logits[0, index].backward()
        per_pixel = (x * x.grad).sum(dim=2)[0].detach()  # (frames, H, W): each frame's own pixels
        return per_pixel.reshape(4, 4, 8, 4, 8).sum(dim=(2, 4))  # (frames, gh, gw)

    for index in (0, 2):
        expected = relevance(index, pooler_ruled=True)
        ours = torch.from_numpy(explain_clip(checkpoint, frames, "attnlrp", class_index=index).map).double()
        scale = expected.abs().max().double()
        assert ours.shape == expected.shape
        torch.testing.assert_close(ours / scale, expected.double() / scale, rtol=1e-4, atol=1e-5)
        unruled = relevance(index, pooler_ruled=False).double()
        assert (unruled - ours).abs().max() > 1e-2 * scale


@pytest.mark.parametrize("method, layer, index", [("gradcam", -1, 2), ("gradcam", 0, 0), ("layercam", -1, 1)])
def test_the_classifiers_cams_are_pytorch_grad_cams_own_through_its_pooler(tmp_path, method, layer, index):
    """pytorch-grad-cam's own GradCAM and LayerCAM on HF's VJEPA2ForVideoClassification (the class's gradient by
    autograd, through the attentive pooler), hooking a layer's ``norm1`` with a ``reshape_transform`` to
    ``(B, D, t, gh, gw)``, min-max scaled as its ``forward`` scales."""
    from test_cam import REFERENCE, scaled

    from tests.reference.pytorch_grad_cam.model_targets import ClassifierOutputTarget

    model = vjepa2_folder(tmp_path / "classifier", "VJEPA2ForVideoClassification")
    checkpoint = open_source(tmp_path / "classifier")
    frames = frames_of(4, 32, 32)
    pixels = clip_pixels(frames, checkpoint.preprocessing)  # (1, 4, 3, 32, 32)

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hf = model

        def forward(self, x):
            return self.hf(pixel_values_videos=x).logits

    def reshape_transform(tensor):  # tokens (B, t*gh*gw, D), time-major
        return tensor.reshape(tensor.size(0), 2, 4, 4, tensor.size(2)).permute(0, 4, 1, 2, 3)

    reference = REFERENCE[method](model=Logits().eval(), target_layers=[model.vjepa2.encoder.layer[layer].norm1],
                                  reshape_transform=reshape_transform)
    reference.get_target_width_height = lambda input_tensor: None  # the map on the tubelet grid: no zoom
    with reference, torch.enable_grad():
        expected = torch.from_numpy(reference(pixels.clone(), [ClassifierOutputTarget(index)]))[0]  # (t, gh, gw)
    ours = explain_clip(checkpoint, frames, method, layer=layer, class_index=index).map  # (frames, gh, gw)
    np.testing.assert_array_equal(ours[0::2], ours[1::2])
    assert float(expected.max()) > 0.99  # a map, not a ReLU'd zero
    torch.testing.assert_close(scaled(torch.from_numpy(ours[0::2].copy())[None])[0], expected, rtol=0, atol=2e-5)


def test_the_classifiers_other_class_maps_are_refused_in_one_line_and_not_offered(tmp_path):
    from vit.explain.views.video import CLASS_READ_KINDS, clip_map_kinds

    vjepa2_folder(tmp_path / "classifier", "VJEPA2ForVideoClassification")
    checkpoint = open_source(tmp_path / "classifier")
    assert set(clip_map_kinds(checkpoint)) & set(CLASS_READ_KINDS) == {"attnlrp", "gradcam", "layercam"}
    for method in ("class", "legrad", "lens"):
        with pytest.raises(ValueError, match="attentive pooler.*use AttnLRP") as error:
            explain_clip(checkpoint, frames_of(4, 32, 32), method)
        assert "\n" not in str(error.value)


def test_attnlrps_cost_counts_the_poolers_own_blocks_on_both_paths(tmp_path):
    """The pooler's blocks run after the checkpointed ones with their whole graphs: each adds at least a block's
    graph under the rules, 10 and 2 floats a token per hidden and MLP unit (measured 9.3 and 2, tests/test_costs.py),
    to the whole path's count and to the checkpointed one's (bench/results/cpu-2026-11-25/vjepa2-classifier.txt:
    346 MB measured at 1,568 tokens with 3 pooler layers, 386 counted, where leaving them out counted 248)."""
    from dataclasses import replace

    from vit.costs import plan
    from vit.model.vision_transformer import ViT

    vjepa2_folder(tmp_path / "classifier", "VJEPA2ForVideoClassification")
    model = open_source(tmp_path / "classifier").model
    c = model.config
    without = ViT(replace(c, pool_layers=0))
    grid, tokens = (2 * 4, 4), 2 * 4 * 4  # 4 frames of 32 px: 2 tubelets in time, 4 x 4 patches each
    block = 4 * tokens * (10 * c.hidden_size + 2 * (c.pool_mlp_size or c.mlp_size))
    with_pooler, bare = plan.attnlrp(model, grid), plan.attnlrp(without, grid)
    assert c.pool_layers == 1 and with_pooler.tokens == tokens
    assert with_pooler.memory - bare.memory >= c.pool_layers * block
    assert with_pooler.chunked - bare.chunked >= c.pool_layers * block
