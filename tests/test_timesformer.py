"""TimeSformer opened through ``vit.sources`` matches transformers on the same decoded frames: logits and the last
hidden states to 1e-4 relative, and in every layer both attentions to 1e-5 (the spatial one against
``output_attentions``, ``(B * frames, heads, 1 + P, 1 + P)``; the temporal one, which transformers computes but does
not return, against its own ``temporal_attention`` module asked for its probabilities), at two clip lengths and
non-square frames. The per-frame maps read our time-major tokens; transformers keeps them position-major (row, col,
frame), so a map that swapped time and rows, or took HF's order for ours, fails here (frames, rows and cols all
differ).

The models are tiny random ``TimesformerForVideoClassification`` built by transformers, sigma 0.05 noise on every
parameter, saved natively with a processor.
"""

import numpy as np
import pytest
import torch
from helpers import lxt_norms
from PIL import Image

from vit.core.clips import clip_pixels, read_clip
from vit.explain.views.video import explain_clip
from vit.model.layouts import divided_partitions, partition, unpartition
from vit.sources.open import SourceError, open_source
from vit.sources.ports.families.video_ports.import_timesformer import hf_token_order

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds

# (frames, height, width): two clip lengths; HF TimeSformer reads the frame's width from its config (image_size), so
# the non-square frames are taller or shorter than wide, its square table resized by nearest neighbour
CLIPS = [(4, 24, 32), (6, 40, 16)]
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def timesformer_folder(folder, frames: int, height: int, width: int, classes: int = 5):
    """A tiny random TimeSformer classifier (sigma 0.05 noise on every parameter), saved with its processor."""
    config = transformers.TimesformerConfig(image_size=width, patch_size=8, num_frames=frames, hidden_size=32,
                                            num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                            num_labels=classes)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.TimesformerForVideoClassification(config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    model.save_pretrained(folder)
    processor = transformers.VideoMAEImageProcessor(size={"shortest_edge": max(height, width) + 4},
                                                    crop_size={"height": height, "width": width},
                                                    image_mean=IMAGENET[0], image_std=IMAGENET[1])
    processor.save_pretrained(folder)
    return model, processor


def write_gif(path, count: int, size=(48, 44), seed: int = 0):
    rng = np.random.default_rng(seed)
    frames = [Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)) for _ in range(count)]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=40, loop=0)
    return path


def temporal_attentions(model, pixels):
    """Each layer's temporal attention as transformers computes it, ``(B * gh*gw, heads, frames, frames)``: its
    ``temporal_attention.attention`` module called again on the input it received, asked for its probabilities."""
    inputs, hooks = [], []
    for layer in model.timesformer.encoder.layer:
        module = layer.temporal_attention.attention
        hooks.append(module.register_forward_hook(lambda m, args, out: inputs.append((m, args[0]))))
    with torch.no_grad():
        model(pixel_values=pixels)
    for hook in hooks:
        hook.remove()
    with torch.no_grad():
        return [m(x, output_attentions=True)[1] for m, x in inputs]


def relative(ours, theirs):
    return float((ours - theirs).abs().max().detach() / theirs.abs().max())


@pytest.mark.parametrize("frames, height, width", CLIPS, ids=[f"{f}x{w}x{h}" for f, h, w in CLIPS])
def test_logits_states_and_both_attentions_equal_transformers_on_the_same_frames(tmp_path, frames, height, width):
    model, processor = timesformer_folder(tmp_path / "timesformer", frames, height, width)
    checkpoint = open_source(tmp_path / "timesformer")
    sampled = read_clip(write_gif(tmp_path / "clip.gif", 2 * frames + 1), frames)
    pixels = processor(sampled.frames, return_tensors="pt").pixel_values  # (1, frames, 3, H, W)
    ours_pixels = clip_pixels(sampled.frames, checkpoint.preprocessing)
    assert torch.allclose(ours_pixels, pixels, atol=1e-5)
    with torch.no_grad():
        out = model(pixel_values=pixels, output_attentions=True)
        last = model.timesformer(pixel_values=pixels).last_hidden_state  # (1, 1 + P*t, D), HF's order
        encoding = checkpoint.model.encode(ours_pixels, output_attentions=True)
        x, _ = checkpoint.model.tokens(ours_pixels)
    assert relative(encoding.logits, out.logits) < 1e-4
    grid = (frames, height // 8, width // 8)
    assert relative(checkpoint.model.norm(x)[:, hf_token_order(grid)], last) < 1e-4
    assert len(encoding.attentions) == len(out.attentions) == 2
    for ours, theirs in zip(encoding.attentions, out.attentions, strict=True):
        assert ours.shape == theirs.shape == (frames, 4, 1 + grid[1] * grid[2], 1 + grid[1] * grid[2])
        assert torch.allclose(ours, theirs, atol=1e-5)
    names = [f"blocks.{i}.temporal_attn.hook_pattern" for i in range(2)]
    with torch.no_grad():
        _, cache = checkpoint.model.run_with_cache(ours_pixels, names)
    for name, theirs in zip(names, temporal_attentions(model, pixels), strict=True):
        assert cache[name].shape == theirs.shape == (grid[1] * grid[2], 4, frames, frames)
        assert torch.allclose(cache[name], theirs, atol=1e-5)


def test_timesformer_model_opens_and_its_states_equal_transformers(tmp_path):
    model, processor = timesformer_folder(tmp_path / "classifier", 4, 24, 32)
    model.timesformer.save_pretrained(tmp_path / "encoder")
    processor.save_pretrained(tmp_path / "encoder")
    checkpoint = open_source(tmp_path / "encoder")
    assert checkpoint.model.head is None and checkpoint.config.divided_attention
    pixels = torch.randn(1, 4, 3, 24, 32)
    with torch.no_grad():
        last = model.timesformer(pixel_values=pixels).last_hidden_state
        x, _ = checkpoint.model.tokens(pixels)
    assert relative(checkpoint.model.norm(x)[:, hf_token_order((4, 3, 4))], last) < 1e-4


def test_each_map_sits_on_its_frame_and_patch_time_major(tmp_path):
    """frames 4, rows 3, cols 4: a spatial row drawn on another frame, or a temporal one on another position (time and
    rows swapped, or HF's position-major order read as ours), puts the values elsewhere."""
    frames, height, width = 4, 24, 32
    t, gh, gw = frames, height // 8, width // 8
    model, _ = timesformer_folder(tmp_path / "timesformer", frames, height, width)
    checkpoint = open_source(tmp_path / "timesformer")
    sampled = read_clip(write_gif(tmp_path / "clip.gif", frames), frames)
    pixels = clip_pixels(sampled.frames, checkpoint.preprocessing)
    with torch.no_grad():
        out = model(pixel_values=pixels, output_attentions=True, output_hidden_states=True)
    temporal = temporal_attentions(model, pixels)
    f, r, c = 2, 1, 3
    spatial = explain_clip(checkpoint, sampled.frames, "attention", layer=1, head=3, query=(f, r, c))
    assert spatial.query == 1 + (f * gh + r) * gw + c and spatial.map.shape == (t, gh, gw)
    expected = np.zeros((t, gh, gw), np.float32)
    expected[f] = out.attentions[1][f, 3, 1 + r * gw + c, 1:].view(gh, gw).numpy()
    assert np.allclose(spatial.map, expected, atol=1e-6)
    over_time = explain_clip(checkpoint, sampled.frames, "temporal", layer=0, head=1, query=(f, r, c))
    expected = np.zeros((t, gh, gw), np.float32)
    expected[:, r, c] = temporal[0][r * gw + c, 1, f].numpy()
    assert np.allclose(over_time.map, expected, atol=1e-6) and over_time.heads.shape == (4, t, gh, gw)
    cls = explain_clip(checkpoint, sampled.frames, "attention", layer=0)  # the CLS's row in each frame, heads' mean
    assert np.allclose(cls.map, out.attentions[0][:, :, 0, 1:].mean(1).view(t, gh, gw).numpy(), atol=1e-6)
    norms = explain_clip(checkpoint, sampled.frames, "norms", layer=0)
    hf_norms = out.hidden_states[1][0, 1:].norm(dim=-1).view(gh, gw, t).permute(2, 0, 1)  # HF: row, col, frame
    assert np.allclose(norms.map, hf_norms.numpy(), rtol=1e-4)


def test_rollout_and_a_temporal_cls_are_refused_in_one_line(tmp_path):
    timesformer_folder(tmp_path / "timesformer", 4, 16, 16)
    checkpoint = open_source(tmp_path / "timesformer")
    frames = read_clip(write_gif(tmp_path / "clip.gif", 4), 4).frames
    for method, query in (("rollout", None), ("temporal", 0), ("legrad", None)):
        with pytest.raises(ValueError) as error:
            explain_clip(checkpoint, frames, method, query=query)
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="takes clips of 4 frames"):
        checkpoint.model.encode(torch.zeros(1, 6, 3, 16, 16))


def test_only_divided_space_time_opens(tmp_path):
    config = transformers.TimesformerConfig(image_size=16, patch_size=8, num_frames=2, hidden_size=16,
                                            num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                            attention_type="space_only")
    transformers.TimesformerModel(config).save_pretrained(tmp_path / "space_only")
    with pytest.raises(SourceError, match="divided_space_time"):
        open_source(tmp_path / "space_only")


def test_the_two_partitions_group_a_position_over_time_and_a_frame_over_space():
    by_position, by_frame = divided_partitions((2, 3, 4))  # token n = (n // 12, n // 4 % 3, n % 4)
    assert by_position.shape == (12, 2) and by_position[7].tolist() == [7, 19]  # row 1, col 3 in frames 0 and 1
    assert by_frame.shape == (2, 12) and by_frame[1].tolist() == list(range(12, 24))
    x = torch.arange(2 * 24.0).view(2, 24, 1)  # (B, N, D)
    groups = partition(x, by_position)  # (B * 12, 2, 1), batch-major
    assert groups.shape == (24, 2, 1) and groups[12 + 7, :, 0].tolist() == [24 + 7, 24 + 19]
    assert torch.equal(unpartition(groups, by_position), x)


def test_predict_saves_each_layers_spatial_and_temporal_attentions(tmp_path, capsys):
    import json

    from vit.predict import main

    model, _ = timesformer_folder(tmp_path / "timesformer", 4, 24, 32)
    write_gif(tmp_path / "clip.gif", 4)
    capsys.readouterr()  # transformers' saving progress
    status = main([str(tmp_path / "timesformer"), str(tmp_path / "clip.gif"), "--save-maps", str(tmp_path / "maps")])
    [record] = json.loads(capsys.readouterr().out)
    saved = np.load(record["maps"]["npz"])
    assert status == 0 and saved["grid"].tolist() == [4, 3, 4] and int(saved["tubelet"]) == 1
    assert saved["layer_1"].shape == (4, 4, 13, 13) and saved["temporal_1"].shape == (12, 4, 4, 4)
    processor = transformers.VideoMAEImageProcessor.from_pretrained(tmp_path / "timesformer")
    pixels = processor(read_clip(tmp_path / "clip.gif", 4).frames, return_tensors="pt").pixel_values
    with torch.no_grad():
        out = model(pixel_values=pixels, output_attentions=True)
    for i, (spatial, temporal) in enumerate(zip(out.attentions, temporal_attentions(model, pixels), strict=True)):
        np.testing.assert_allclose(saved[f"layer_{i}"], spatial.numpy(), rtol=0, atol=1e-5)  # transformers' values
        np.testing.assert_allclose(saved[f"temporal_{i}"], temporal.numpy(), rtol=0, atol=1e-5)


def test_a_layers_divided_attentions_are_computed_once_for_every_head_and_rerun(tmp_path, monkeypatch):
    from vit.explain.views import video

    timesformer_folder(tmp_path / "timesformer", 4, 16, 16)
    checkpoint = open_source(tmp_path / "timesformer")
    clip = video.analyse_clip(checkpoint, read_clip(write_gif(tmp_path / "clip.gif", 4), 4).frames)
    calls, real = [], video._divided_attentions
    monkeypatch.setattr(video, "_divided_attentions", lambda clip, layer: calls.append(layer) or real(clip, layer))
    first = video.explain_analysed(checkpoint, clip, "temporal", layer=1, query=3)  # every head's map too
    again = video.explain_analysed(checkpoint, clip, "attention", layer=1, head=2, query=3)
    video.explain_analysed(checkpoint, clip, "temporal", layer=0, query=3)
    assert calls == [1, 0] and first.heads.shape[0] == 4 and again.map.shape == (4, 2, 2)


def relevance_with_lxts_rules(tmp_path, monkeypatch, rule):
    """(checkpoint, frames, pixels, relevance) of class 1 through HF's TimeSformer (4 frames of 24 x 32 px) with lxt's
    LayerNorm and activation rules and ``rule(qkv) -> (q, k, v)`` in its attention, which is written inline (no
    attention function to wrap: its forward is restated with the rule); the relevance ``x * dx`` per pixel,
    (frames, H, W)."""
    from transformers.models.timesformer import modeling_timesformer

    def attention_forward(self, hidden_states, output_attentions=False):  # HF's, with lxt's rule on q, k, v
        B, N, C = hidden_states.shape
        q, k, v = rule(self.qkv(hidden_states).reshape(B, N, 3, self.num_heads, C // self.num_heads)
                       .permute(2, 0, 3, 1, 4))
        probs = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        context = (probs @ v).transpose(1, 2).reshape(B, N, C)
        return (context, probs) if output_attentions else (context,)

    model, processor = timesformer_folder(tmp_path / "timesformer", 4, 24, 32)
    checkpoint = open_source(tmp_path / "timesformer")
    frames = read_clip(write_gif(tmp_path / "clip.gif", 5), 4).frames
    pixels = processor(frames, return_tensors="pt").pixel_values  # (1, frames, 3, H, W)
    with monkeypatch.context() as m, torch.enable_grad():  # undone before our model runs
        lxt_norms(m)
        m.setattr(modeling_timesformer.TimesformerSelfAttention, "forward", attention_forward)
        x = pixels.clone().requires_grad_(True)
        model(pixel_values=x).logits[0, 1].backward()
    return checkpoint, frames, pixels, (x * x.grad).sum(dim=2)[0].detach()


def test_attnlrp_runs_through_divided_blocks_as_lxts_rules_patched_into_transformers_timesformer(tmp_path,
                                                                                                 monkeypatch):
    """lxt's rules (tests/reference/lxt: LayerNorm, the activation, the uniform rule on q, k and v) put into HF's
    TimeSformer; each frame's pixels' relevance summed over its patches."""
    from tests.reference.lxt.rules import divide_gradient

    checkpoint, frames, _, relevance = relevance_with_lxts_rules(
        tmp_path, monkeypatch, lambda qkv: (divide_gradient(qkv[0], 4), divide_gradient(qkv[1], 4),
                                            divide_gradient(qkv[2], 2)))
    expected = relevance.reshape(4, 3, 8, 4, 8).sum(dim=(2, 4))  # (frames, gh, gw)
    explained = explain_clip(checkpoint, frames, "attnlrp", class_index=1)
    scale = expected.abs().max()
    torch.testing.assert_close(torch.from_numpy(explained.map).double() / scale, expected.double() / scale,
                               rtol=1e-4, atol=1e-5)
    from vit.explain.views.attention_maps import MAP_KINDS
    from vit.explain.views.video import analyse_clip, explain_analysed

    clip, drawn = analyse_clip(checkpoint, frames), []
    for kind in [*MAP_KINDS, "temporal", "similarity", "lens"]:  # each draws, or is refused in one line saying why
        try:
            explain_analysed(checkpoint, clip, kind, query=None if kind in ("norms", "attnlrp", "lens") else 1)
            drawn.append(kind)
        except ValueError as error:
            assert "\n" not in str(error) and "yet" not in str(error), (kind, str(error))
            if kind in ("rollout", "class", "legrad", "lrp"):  # one attention per block
                assert "attend twice" in str(error)
    assert drawn == ["attention", "attnlrp", "norms", "temporal", "similarity", "lens"]


def test_cp_lrp_through_divided_blocks_is_lxts_cp_rule_in_transformers_timesformer(tmp_path, monkeypatch):
    """CP-LRP (no relevance through the attention weights), the notebook API's ``relevance.attnlrp(cp=True)``, through
    both attentions of TimeSformer's blocks: lxt's ``cp_wrap_attention_forward`` rule (q and k stopped) put into HF's
    attention, with lxt's LayerNorm and activation rules; AttnLRP's relevance is another map here."""
    from tests.reference.lxt.rules import stop_gradient
    from vit.explain.methods.relevance import attnlrp

    checkpoint, frames, pixels, expected = relevance_with_lxts_rules(
        tmp_path, monkeypatch, lambda qkv: (stop_gradient(qkv[0]), stop_gradient(qkv[1]), qkv[2]))
    ours = clip_pixels(frames, checkpoint.preprocessing)
    torch.testing.assert_close(ours, pixels)  # the same pixels in
    scale = expected.abs().max()
    torch.testing.assert_close(attnlrp(checkpoint.model, ours, 1, cp=True)[0] / scale, expected / scale,
                               rtol=1e-5, atol=1e-5)
    assert (attnlrp(checkpoint.model, ours, 1)[0] - expected).abs().max() > 1e-2 * scale
