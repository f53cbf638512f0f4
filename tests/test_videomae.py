"""VideoMAE opened through ``vit.sources`` matches transformers on the same decoded frames: logits to 1e-4 relative
(our preprocessing of the frames against ``VideoMAEImageProcessor``'s pixels) and every layer's attention to 1e-5
against ``output_attentions`` (eager), at two clip lengths and a non-square frame size; the per-frame maps are
VideoMAE's time-major token order (its Conv3d output flattened); a bad or oversized clip is refused in one line.

The models are tiny random ``VideoMAEForVideoClassification`` built by transformers, sigma 0.05 noise on every
parameter, saved natively with their processor.
"""

import numpy as np
import pytest
import torch
from PIL import Image

from vit.core.clips import ClipError, clip_pixels, read_clip, sample_indices
from vit.explain.views.attention_maps import MapSettings
from vit.explain.views.video import analyse_clip, clip_map, explain_clip
from vit.model.layouts import clip_token, frame_maps
from vit.sources.open import open_source

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # importing transformers takes seconds

# (frames, height, width): two clip lengths; non-square frames both ways, so t, rows and cols all differ
CLIPS = [(4, 24, 32), (6, 32, 16)]


def videomae_folder(folder, frames: int, height: int, width: int, classes: int = 5):
    """A tiny random VideoMAE classifier (sigma 0.05 noise on every parameter), saved with its processor."""
    config = transformers.VideoMAEConfig(image_size=[height, width], patch_size=8, num_frames=frames, tubelet_size=2,
                                         hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, num_labels=classes)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.VideoMAEForVideoClassification(config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    model.save_pretrained(folder)
    processor = transformers.VideoMAEImageProcessor(size={"shortest_edge": max(height, width) + 4},
                                                    crop_size={"height": height, "width": width})
    processor.save_pretrained(folder)
    return model, processor


def write_gif(path, count: int, size=(40, 30), seed: int = 0):
    rng = np.random.default_rng(seed)
    frames = [Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)) for _ in range(count)]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=40, loop=0)
    return path


@pytest.mark.parametrize("frames, height, width", CLIPS, ids=[f"{f}x{w}x{h}" for f, h, w in CLIPS])
def test_logits_and_every_attention_equal_transformers_on_the_same_frames(tmp_path, frames, height, width):
    model, processor = videomae_folder(tmp_path / "videomae", frames, height, width)
    checkpoint = open_source(tmp_path / "videomae")
    assert checkpoint.config.num_frames == frames and checkpoint.config.tubelet_size == 2
    sampled = read_clip(write_gif(tmp_path / "clip.gif", 2 * frames + 1), frames)
    pixels = processor(sampled.frames, return_tensors="pt").pixel_values  # (1, frames, 3, H, W)
    assert torch.allclose(clip_pixels(sampled.frames, checkpoint.preprocessing), pixels, atol=1e-6)
    with torch.no_grad():
        out = model(pixel_values=pixels, output_attentions=True)
    clip = analyse_clip(checkpoint, sampled.frames)
    logits = torch.from_numpy(clip.analysis.prediction.logits)
    assert torch.allclose(logits, out.logits[0], rtol=1e-4, atol=1e-4 * out.logits.abs().max().item())
    assert len(clip.analysis.attentions) == len(out.attentions)
    for ours, theirs in zip(clip.analysis.attentions, out.attentions, strict=True):
        assert ours.shape == theirs.shape
        assert (ours - theirs).abs().max().item() <= 1e-5


@pytest.mark.parametrize("frames, height, width", CLIPS, ids=[f"{f}x{w}x{h}" for f, h, w in CLIPS])
def test_a_maps_frames_follow_videomaes_time_major_tokens(tmp_path, frames, height, width):
    """The reference is transformers' own order: its Conv3d output (B, D, t, gh, gw) flattened, so a query's
    attention row reads ``.view(t, gh, gw)``; a map that swapped time and rows would put other tubelets' values in
    each frame (t, gh and gw all differ here)."""
    model, processor = videomae_folder(tmp_path / "videomae", frames, height, width)
    checkpoint = open_source(tmp_path / "videomae")
    sampled = read_clip(write_gif(tmp_path / "clip.gif", frames), frames)
    with torch.no_grad():
        out = model(pixel_values=processor(sampled.frames, return_tensors="pt").pixel_values, output_attentions=True)
    t, gh, gw = frames // 2, height // 8, width // 8
    explained = explain_clip(checkpoint, sampled.frames, "attention", layer=1, head=3, query=(frames - 1, gh - 1, 0))
    assert explained.query == clip_token((t, gh, gw), t - 1, gh - 1, 0) == ((t - 1) * gh + gh - 1) * gw
    expected = out.attentions[1][0, 3, explained.query].view(t, gh, gw)  # (t, gh, gw)
    assert explained.map.shape == (frames, gh, gw)
    for f in range(frames):  # a tubelet's value on each of its two frames
        assert torch.allclose(torch.from_numpy(explained.map[f]), expected[f // 2], atol=1e-6)
    clip = analyse_clip(checkpoint, sampled.frames)
    rollout = clip_map(clip, MapSettings(kind="rollout", query=explained.query))
    assert rollout.shape == (frames, gh, gw) and np.allclose(rollout[0::2], rollout[1::2])


def test_frame_maps_repeat_each_tubelet_over_its_frames_time_first():
    values = torch.arange(2 * 3 * 4.0)  # token n = (n // 12, n // 4 % 3, n % 4)
    maps = frame_maps(values, (2, 3, 4), tubelet=2)
    assert maps.shape == (4, 3, 4)
    assert maps[3, 2, 1] == 1 * 12 + 2 * 4 + 1 and maps[0, 1, 3] == 7 and torch.equal(maps[2], maps[3])


def test_uniform_sampling_is_transformers_sample_frames():
    assert sample_indices(10, 4) == [0, 2, 5, 7]
    assert sample_indices(3, 4) == [0, 0, 1, 2]  # a short clip repeats frames


def test_a_bad_or_oversized_clip_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    from vit.predict import main

    videomae_folder(tmp_path / "videomae", 4, 16, 16)
    (tmp_path / "notes.gif").write_text("not a gif")
    (tmp_path / "empty").mkdir()
    (tmp_path / "clip.mp4").write_bytes(b"\0" * 64)
    write_gif(tmp_path / "big.gif", 4, size=(400, 300))
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "1")  # 4 frames of 400 x 300 RGB: 1.4 MB, refused before decoding
    for name in ("notes.gif", "empty", "clip.mp4", "big.gif"):
        with pytest.raises(ClipError) as error:
            read_clip(tmp_path / name, 4)
        assert "\n" not in str(error.value)
    assert "1 MB" in str(pytest.raises(ClipError, read_clip, tmp_path / "big.gif", 4).value)
    capsys.readouterr()  # transformers' saving progress
    status = main([str(tmp_path / "videomae"), str(tmp_path / "big.gif"), str(tmp_path / "clip.mp4")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and len(err) == 2 and all(line.startswith("vit.predict: skipped: ") for line in err)
    checkpoint = open_source(tmp_path / "videomae")
    with pytest.raises(ValueError, match="takes clips of 4 frames of 16x16 px"):
        checkpoint.model.encode(torch.zeros(1, 6, 3, 16, 16))


def test_predict_prints_a_clips_classes_and_saves_each_layer_over_the_tubelets(tmp_path, capsys):
    import json

    from vit.predict import main

    model, processor = videomae_folder(tmp_path / "videomae", 4, 24, 32)
    write_gif(tmp_path / "clip.gif", 9)
    status = main([str(tmp_path / "videomae"), str(tmp_path / "clip.gif"), "--top-k", "2",
                   "--save-maps", str(tmp_path / "maps")])
    [record] = json.loads(capsys.readouterr().out)
    assert status == 0 and len(record["predictions"]) == 2
    saved = np.load(record["maps"]["npz"])
    assert saved["grid"].tolist() == [2, 3, 4] and int(saved["tubelet"]) == 2
    assert saved["frames"].tolist() == [0, 2, 4, 6]
    sampled = read_clip(tmp_path / "clip.gif", 4)
    with torch.no_grad():
        out = model(pixel_values=processor(sampled.frames, return_tensors="pt").pixel_values, output_attentions=True)
    for i, theirs in enumerate(out.attentions):  # each (heads, T, T) over the tubelets, transformers' values
        assert saved[f"layer_{i}"].shape == (4, 2 * 3 * 4, 2 * 3 * 4)
        np.testing.assert_allclose(saved[f"layer_{i}"], theirs[0].numpy(), rtol=0, atol=1e-5)


def test_predict_ablate_gives_a_clips_classes_and_maps_with_the_heads_context_zeroed_in_transformers(tmp_path,
                                                                                                   capsys):
    """``vit.predict MODEL clip --ablate 1.2 --save-maps``: the first layer's second head zero-ablated; the clip's
    probabilities and the second layer's attention over the tubelets equal transformers' VideoMAE with that head's
    slice of its context zeroed before the output projection (a forward pre-hook on HF's ``dense``)."""
    import json

    from vit.predict import main

    model, processor = videomae_folder(tmp_path / "videomae", 4, 24, 32)
    write_gif(tmp_path / "clip.gif", 9)
    status = main([str(tmp_path / "videomae"), str(tmp_path / "clip.gif"), "--top-k", "5", "--ablate", "1.2",
                   "--save-maps", str(tmp_path / "maps")])
    [record] = json.loads(capsys.readouterr().out)
    assert status == 0
    ours = {p["label"]: p["probability"] for p in record["predictions"]}
    pixels = processor(read_clip(tmp_path / "clip.gif", 4).frames, return_tensors="pt").pixel_values
    head_dim = model.config.hidden_size // model.config.num_attention_heads

    def zero_head(module, args):
        context = args[0].clone()
        context[..., head_dim:2 * head_dim] = 0  # head 2 of layer 1, counted from 1
        return (context,)
    with torch.no_grad():
        intact = model(pixel_values=pixels).logits.softmax(-1)[0]
        hook = model.videomae.encoder.layer[0].attention.output.dense.register_forward_pre_hook(zero_head)
        out = model(pixel_values=pixels, output_attentions=True)
        hook.remove()
    theirs = out.logits.softmax(-1)[0]
    labels = [model.config.id2label[i] for i in range(len(theirs))]
    assert (theirs - intact).abs().max() > 1e-3  # the head matters here
    np.testing.assert_allclose([ours[label] for label in labels], theirs.numpy(), rtol=1e-4, atol=1e-6)
    saved = np.load(record["maps"]["npz"])
    np.testing.assert_allclose(saved["layer_1"], out.attentions[1][0].numpy(), rtol=0, atol=1e-5)


def test_predict_ablate_is_refused_in_one_line_for_timesformers_two_attentions(tmp_path, capsys):
    from tests.test_timesformer import timesformer_folder
    from vit.predict import main

    timesformer_folder(tmp_path / "timesformer", 4, 32, 32)
    write_gif(tmp_path / "clip.gif", 9)
    capsys.readouterr()  # saving's progress bars
    status = main([str(tmp_path / "timesformer"), str(tmp_path / "clip.gif"), "--ablate", "1.1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "attend twice" in err[0]


def test_save_maps_over_the_limit_is_refused_in_one_line_before_any_clip_is_read(tmp_path, capsys, monkeypatch):
    from vit.core import clips
    from vit.predict import main

    write_gif(tmp_path / "clip.gif", 9)
    monkeypatch.setattr(clips, "read_clip", lambda *a, **k: pytest.fail("a clip was read"))
    videomae_folder(tmp_path / "big", 16, 128, 128)  # 8 x 16 x 16 tubelets: 2 layers x 4 heads x 2048² x 4 B = 128 MB
    capsys.readouterr()
    maps = tmp_path / "maps"
    assert main([str(tmp_path / "big"), str(tmp_path / "clip.gif"), "--save-maps", str(maps),
                 "--max-maps-mb", "100"]) == 2
    [message] = capsys.readouterr().err.strip().splitlines()
    assert "128 MB per clip" in message and "100 MB limit" in message and "--max-maps-mb" in message
    assert "VIT_MAX_MAPS_MB" in message and "float16" in message
    assert not maps.exists()
