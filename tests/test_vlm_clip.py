"""A question about a clip (issue 92, item 2): ``vit.ask_vlm(vlm, video=frames, question=...)`` answers with
transformers' own greedy ``generate`` over the processor's prompt of the clip (its chat template's video entry, the
frames as given), and each answer token's attention to each temporal slice is the eager row over that slice's tokens,
placed by hand on its patch grid: Qwen2.5-VL's and Qwen3-VL's ``video_grid_thw`` (slices two frames deep, 2 x 2 merge
units row-major; Qwen3-VL's timestamps between them), GLM-4.1V's (its frames written with its image token),
LLaVA-NeXT-Video's frames (each pooled 2 x 2), InternVL's frames (each one view, "FrameN: <img>...</img>" with its
image token, its 2 x 2 pixel-shuffle units), Qwen3.5's (Qwen3-VL's slices), LLaVA-OneVision's frames (5 x 5 patches
resized to 3 x 3 tokens, placed where its own ``apply_pooling`` puts them), SmolVLM's (each frame one view after its
timestamp, with its image token), Molmo 2's (each frame one crop, its tokens pooled from the patches its
``video_token_pooling`` names, placed by its own ``arange_for_pooling``). The slices taken in reverse would be other
maps.
"""

import json

import numpy as np
import pytest
import torch
from PIL import Image

transformers = pytest.importorskip("transformers")
from test_vlm_answer import ATOL, NEW_TOKENS, QUESTION, by_hand, picture, saved_whole  # noqa: E402

import vit  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds

KINDS = ["qwen2_5_vl", "qwen3_vl", "glm4v", "llava_next_video", "internvl", "qwen3_5", "llava_onevision_video",
         "smolvlm", "molmo2"]
FRAMES = [picture(90, 70), picture(90, 70).rotate(3), picture(90, 70).transpose(0), picture(90, 70).transpose(1)]


@pytest.fixture(scope="module")
def vlms(tmp_path_factory):
    return saved_whole(tmp_path_factory, KINDS + ["llava"])


def eager_clip(folder):
    """transformers alone: the eager model's greedy generate over the processor's prompt of the clip (its video
    entry through the chat template, the frames unsampled), every step's attentions; the clip's token id."""
    config = json.loads((folder / "config.json").read_text())
    model = getattr(transformers, config["architectures"][0]).from_pretrained(folder, attn_implementation="eager")
    processor = transformers.AutoProcessor.from_pretrained(folder)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": QUESTION}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    video = np.stack([np.asarray(frame) for frame in FRAMES])
    inputs = processor(videos=[video], text=text, return_tensors="pt", do_sample_frames=False)
    with torch.no_grad():
        out = model.eval().generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, output_attentions=True,
                                    return_dict_in_generate=True)
    c = model.config
    as_images = ("glm4v", "internvl", "smolvlm", "molmo2")  # their frames written with the image token
    token = c.image_token_id if config["model_type"] in as_images else getattr(c, "video_token_id", None)
    token = c.video_token_index if token is None else token
    return out, inputs, (inputs["input_ids"][0] == token).nonzero()[:, 0]


@pytest.fixture(scope="module")
def answers(vlms):
    return {kind: (vit.ask_vlm(vit.open_vlm(vlms[kind]), video=FRAMES, question=QUESTION, frames=4,
                               max_new_tokens=NEW_TOKENS), *eager_clip(vlms[kind])) for kind in KINDS}


def slices_by_hand(kind: str, inputs) -> tuple[int, tuple[int, int], int]:
    """(slices, each one's patch grid, unit) as the processor's outputs give them."""
    if "video_grid_thw" in inputs:
        t, h, w = inputs["video_grid_thw"][0].tolist()
        return t, (h, w), 2
    if kind == "llava_onevision_video":  # 40-px frames: 5 x 5 patches, resized (not pooled) to 3 x 3 tokens
        return inputs["pixel_values_videos"].shape[1], (5, 5), None
    if kind == "molmo2":  # 32-px frames: 4 x 4 patches, pooled in 3 x 3 windows (padded) into 2 x 2 tokens
        return inputs["pixel_values_videos"].shape[0], (4, 4), None
    if kind in ("internvl", "smolvlm"):  # frames as pixel_values ((1,) frames, C, H, W), each pixel-shuffled 2 x 2
        frames = inputs["pixel_values"].shape[-4]
        return frames, (inputs["pixel_values"].shape[-1] // 8,) * 2, 2
    side = inputs["pixel_values_videos"].shape[-1] // 8
    return inputs["pixel_values_videos"].shape[1], (side, side), 2  # LLaVA-NeXT-Video's pooling stride


def resized_tokens(folder) -> np.ndarray:
    """transformers alone: LLaVA-OneVision's token over each of a frame's 5 x 5 patches, from its own
    ``apply_pooling`` (bilinear, 5 x 5 to 3 x 3): each patch's one-hot feature map resized, the token that takes
    the most of it."""
    model = transformers.LlavaOnevisionForConditionalGeneration.from_pretrained(folder).model
    with torch.no_grad():
        tokens = model.apply_pooling(torch.eye(25)[:, :, None].expand(25, 25, 1))  # (patch, token, 1)
    return tokens[..., 0].argmax(-1).reshape(5, 5).numpy()


def pooled_tokens(folder) -> np.ndarray:
    """transformers alone: Molmo 2's token over each of a frame's 4 x 4 patches, from its own ``arange_for_pooling``
    with its video processor's pooling size: the window that holds the patch."""
    from transformers.models.molmo2.image_processing_molmo2 import arange_for_pooling

    videos = transformers.AutoProcessor.from_pretrained(folder).video_processor
    windows, _, _ = arange_for_pooling(torch.arange(16).reshape(4, 4), *videos.pooling_size)
    return np.array([next(k for k, window in enumerate(windows.tolist()) if p in window)
                     for p in range(16)]).reshape(4, 4)


def placed(kind: str, row: np.ndarray, grid: tuple[int, int], unit: int | None, vlms) -> np.ndarray:
    """A slice's row over its tokens on its patch grid, by hand: each unit's token row-major, or OneVision's token
    over each patch (``resized_tokens``), or Molmo 2's (``pooled_tokens``)."""
    if unit is None:
        return row[(pooled_tokens if kind == "molmo2" else resized_tokens)(vlms[kind])]
    return by_hand(row, grid, unit, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_each_tokens_attention_to_each_slice_is_the_eager_row_over_its_tokens(answers, vlms, kind):
    """OneVision's clip ends on one newline token, which covers no patch."""
    answer, out, inputs, positions = answers[kind]
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    slices, grid, unit = slices_by_hand(kind, inputs)
    per = {"llava_onevision_video": 9, "molmo2": 4}.get(kind) or (grid[0] // unit) * (grid[1] // unit)
    newline = int(kind == "llava_onevision_video")
    assert len(answer.layouts) == slices > 1 and len(positions) == slices * per + newline and answer.clip
    for i in range(len(answer.tokens)):
        for layer in range(answer.layers):
            rows = out.attentions[i][layer][0, :, -1, positions].numpy()
            for k in range(slices):
                mine = rows[:, k * per:(k + 1) * per]
                np.testing.assert_allclose(answer.attention(i, layer, image=k),
                                           placed(kind, mine.mean(0), grid, unit, vlms), rtol=0, atol=ATOL)
                assert answer.image_share(i, layer, image=k) == pytest.approx(mine.sum(-1).mean(), abs=ATOL)
    rows = out.attentions[1][-1][0, :, -1, positions].numpy().mean(0)
    last = rows[(slices - 1) * per:slices * per]
    assert not np.allclose(answer.attention(1, -1, image=0), placed(kind, last, grid, unit, vlms), rtol=0, atol=1e-4)


def test_what_is_drawn_for_one_image_and_a_model_without_clips_are_refused_in_one_line(answers, vlms):
    answer = answers["qwen2_5_vl"][0]
    with pytest.raises(ValueError, match=r"^TAM is drawn for a question about one image; this one is about a clip: "
                                         r"use attention or gradient × attention, per slice$"):
        answer.tam(0)
    with pytest.raises(ValueError, match=r"^AttnLRP is drawn for a question about one image; this one is about a "
                                         r"clip"):
        answer.relevance(0, method="attnlrp")
    assert answer.relevance(0, 0, image=1).shape == answer.layouts[1].grid  # gradient x attention per slice
    with pytest.raises(ValueError, match=r"^a llava model does not answer about a clip here; ask qwen2_vl, "):
        vit.ask_vlm(vit.open_vlm(vlms["llava"]), video=FRAMES, question=QUESTION, frames=4)
    with pytest.raises(ValueError, match=r"^frames must be a whole number from 1 to 64, got 65$"):
        vit.ask_vlm(vlms["qwen2_5_vl"], video=FRAMES, question=QUESTION, frames=65)
    with pytest.raises(ValueError, match=r"^ask about an image or a video, not both$"):
        vit.ask_vlm(vlms["qwen2_5_vl"], FRAMES[0], QUESTION, video=FRAMES)


def resized_by_hand(kind: str, frame, size: tuple[int, int]) -> np.ndarray:
    """The frame as the model's video processor prepares it, by PIL alone: Qwen-VL's and GLM's resized to the slice's
    pixels (bicubic); LLaVA-NeXT-Video's shortest side to the crop's, then cropped at the centre (CLIP's way)."""
    h, w = size
    frame = frame.convert("RGB")
    if kind != "llava_next_video":
        return np.asarray(frame.resize((w, h), Image.BICUBIC))
    scale = h / min(frame.size)
    frame = frame.resize((max(h, round(frame.width * scale)), max(h, round(frame.height * scale))), Image.BICUBIC)
    left, top = (frame.width - w) // 2, (frame.height - h) // 2
    return np.asarray(frame.crop((left, top, left + w, top + h)))


@pytest.mark.parametrize("kind", KINDS)
def test_each_slice_is_drawn_over_its_first_frame_as_the_processor_prepared_it(answers, kind):
    """The pixels a slice's map is drawn over (``layouts[k].pixels``, the processor's normalisation undone) are the
    slice's first frame at the size the processor resized it to: the map's grid times the patch. Another frame of
    the clip (FRAMES differ by a turn and by mirroring) or the frame transposed would be far off. SmolVLM's video
    processor resizes each frame twice (its longest edge, then to the square view) with its own resampling, which
    PIL does not redo: its frames are held to the processor's pixel tensor, its normalisation undone by hand; Molmo
    2's to its own resize function, as its image's overview is."""
    from test_vlm_answer import unnormalised

    answer, _, inputs, _ = answers[kind]
    depth = len(FRAMES) // len(answer.layouts)
    for k, layout in enumerate(answer.layouts):
        pixels = layout.pixels.astype(np.float32)
        side = {"llava_next_video": 8, "internvl": 8, "llava_onevision_video": 8, "smolvlm": 8, "molmo2": 8,
                "qwen3_vl": 16,
                "qwen3_5": 16}.get(kind, 14)  # the tower's patch
        assert pixels.shape[:2] == (layout.grid[0] * side, layout.grid[1] * side)
        videos = transformers.AutoProcessor.from_pretrained(answer._source[0].folder).video_processor
        if kind == "smolvlm":
            views = [unnormalised(videos, view) for view in inputs["pixel_values"][0]]
        elif kind == "molmo2":  # its own resize (as its image's overview), without the normalisation
            from transformers.models.molmo2.image_processing_molmo2 import resize_and_normalize_image

            views = [resize_and_normalize_image(videos, torch.from_numpy(np.asarray(frame)).permute(2, 0, 1)[None],
                                                [32, 32], videos.resample, False, 1.0, False, videos.image_mean,
                                                videos.image_std)[0].permute(1, 2, 0).numpy() for frame in FRAMES]
        else:
            views = [resized_by_hand(kind, frame, pixels.shape[:2]) for frame in FRAMES]
        errors = [np.abs(view - pixels).mean() for view in views]
        assert errors[k * depth] < 0.5, errors
        assert min(e for j, e in enumerate(errors) if j != k * depth) > 10, errors


def test_a_videos_frames_times_reach_the_processor_as_transformers_takes_them(vlms, tmp_path):
    """A video file's sampled frames keep their times, as ``VideoMetadata`` (each frame's index in the video over its
    frames per second), which the processor reads: Qwen3-VL writes each slice's timestamp into the prompt, and
    Qwen2.5-VL spaces its slices' temporal positions by them (``second_per_grid_ts``, from the sampled frame rate).
    Asked about a 10-fps video of 20 frames, 4 sampled (frames 0, 5, 10, 15: 2 a second), the processor's inputs
    and the answer are transformers' own with that metadata by hand, not those its default gives (the frames taken
    as consecutive at 24 fps)."""
    from test_video_files import write_video

    from vit.core.clips import read_clip

    path = write_video(tmp_path / "clip.mp4", 20, size=(64, 48), rate=10)
    sampled = read_clip(path, 4)
    assert sampled.indices == [0, 5, 10, 15] and sampled.fps == pytest.approx(10.0)
    folder = vlms["qwen2_5_vl"]
    answer = vit.ask_vlm(vit.open_vlm(folder), video=path, question=QUESTION, frames=4, max_new_tokens=NEW_TOKENS)
    processor = transformers.AutoProcessor.from_pretrained(folder)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": QUESTION}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    video = np.stack([np.asarray(frame) for frame in sampled.frames])
    timed = dict(total_num_frames=20, fps=10.0, duration=2.0, frames_indices=[0, 5, 10, 15])
    inputs = processor(videos=[video], text=text, return_tensors="pt", do_sample_frames=False,
                       video_metadata=[timed])
    untimed = processor(videos=[video], text=text, return_tensors="pt", do_sample_frames=False)
    ours = answer._source[1].inputs
    assert torch.equal(ours["input_ids"], inputs["input_ids"])
    assert torch.equal(torch.as_tensor(ours["second_per_grid_ts"]), torch.as_tensor(inputs["second_per_grid_ts"]))
    assert torch.as_tensor(inputs["second_per_grid_ts"]).tolist() == [1.0]  # 2 frames a slice, 2 frames a second
    assert not torch.equal(torch.as_tensor(untimed["second_per_grid_ts"]), torch.as_tensor([1.0]))
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert list(answer.tokens) == out[0, inputs["input_ids"].shape[1]:].tolist()


def test_a_list_of_frames_given_its_rate_keeps_their_times_as_a_video_file_does(vlms):
    """``fps=`` for a clip whose file does not say its rate: 20 frames at 10 a second, 4 sampled (0, 5, 10, 15), reach
    the processor with the metadata a 10-fps video's would have, written by hand here: Qwen2.5-VL's
    ``second_per_grid_ts`` is 1.0 (2 frames a slice, 2 a second), and the answer is transformers' own with it."""
    rng = np.random.default_rng(5)
    frames = [Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)) for _ in range(20)]
    folder = vlms["qwen2_5_vl"]
    answer = vit.ask_vlm(vit.open_vlm(folder), video=frames, question=QUESTION, frames=4, fps=10,
                         max_new_tokens=NEW_TOKENS)
    processor = transformers.AutoProcessor.from_pretrained(folder)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": QUESTION}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    video = np.stack([np.asarray(frames[i]) for i in (0, 5, 10, 15)])
    timed = dict(total_num_frames=20, fps=10.0, duration=2.0, frames_indices=[0, 5, 10, 15])
    inputs = processor(videos=[video], text=text, return_tensors="pt", do_sample_frames=False,
                       video_metadata=[timed])
    ours = answer._source[1].inputs
    assert torch.equal(ours["input_ids"], inputs["input_ids"]) and torch.equal(ours["pixel_values_videos"],
                                                                               inputs["pixel_values_videos"])
    assert torch.as_tensor(ours["second_per_grid_ts"]).tolist() == [1.0]
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert list(answer.tokens) == out[0, inputs["input_ids"].shape[1]:].tolist()


@pytest.mark.parametrize("fps, video, message", [
    (0, "frames", "fps must be a number of frames a second above 0"),
    (float("nan"), "frames", "fps must be"),
    (True, "frames", "fps must be"),
    ("10", "frames", "fps must be"),
    (10, "mp4", r"this clip's file gives its own rate \(10 frames a second\); fps= is for a folder"),
    (10, None, "fps= is the rate of a clip: ask about one with video="),
])
def test_a_rate_that_is_no_rate_or_over_a_files_own_is_refused_in_one_line(vlms, tmp_path, fps, video, message):
    from test_video_files import write_video

    frames = [Image.new("RGB", (32, 32), (i * 10, 0, 0)) for i in range(6)]
    clip = {"frames": frames, "mp4": write_video(tmp_path / "clip.mp4", 6, size=(32, 32), rate=10), None: None}[video]
    with pytest.raises(ValueError, match=message) as refused:
        vit.ask_vlm(vlms["qwen2_5_vl"], frames[0] if video is None else None, QUESTION, video=clip, frames=2,
                    fps=fps, max_new_tokens=2)
    assert "\n" not in str(refused.value)
