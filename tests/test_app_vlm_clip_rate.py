"""A zip of frames' rate in the explorer's "Ask the VLM" (issue 116, item 12): a zip says no rate (a video's and a
GIF's files do), so the clip upload offers "Frame rate of the zip's frames" (frames a second, 0.01 to 1,000, two
decimals, 24 by default: transformers' own guess for a clip of unknown rate). The rate takes ``vit.ask_vlm(video=...,
fps=...)``'s path (``vit.core.clips.at_rate``), so the processor gets the metadata a video of that rate gives,
written by hand here as test_vlm_clip writes it; the link keeps it (``lm_fps``) and restores it, and a rate out of
range is one line, in a link and in the API alike."""

import io
import zipfile

import numpy as np
import pytest
from helpers import displayed
from PIL import Image
from test_app import dirs  # noqa: F401 (a fixture: the explorer's own folders)

from vit.app.share import LABELS, decode, encode
from vit.core.clips import DEFAULT_FPS, MAX_FPS, SampledClip, at_rate, check_fps, read_clip_bytes

LABEL = "Frame rate of the zip's frames (frames a second)"


def zipped(frames) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for i, frame in enumerate(frames):
            png = io.BytesIO()
            frame.save(png, format="PNG")
            archive.writestr(f"clip/frame{i}.png", png.getvalue())
    return buffer.getvalue()


def test_a_link_keeps_a_rate_of_two_decimals_as_written_and_refuses_any_other_in_one_line():
    for text in ("24", "29.97", "0.01", "1000"):
        values, lines = decode({"lm_fps": text}, {}, True)
        assert lines == [] and encode(values) == {"lm_fps": text}
    for text in ("0", "1000.01", "1001", "29.976", "-2", "nan", "inf", "2e1", ""):
        values, lines = decode({"lm_fps": text}, {}, True)
        assert values == {} and lines == [f"The link's lm_fps={text} was not used: give a number of frames a second "
                                          f"from 0.01 to {MAX_FPS}, at most two decimals."], lines


def test_a_rate_joins_a_zips_frames_and_is_refused_for_a_file_with_its_own_or_out_of_range():
    frames = [Image.new("RGB", (8, 8), (40 * i, 0, 0)) for i in range(6)]
    sampled = read_clip_bytes(zipped(frames), "frames.zip", 3, once=True)
    assert sampled.fps is None and sampled.metadata() is None
    timed = at_rate(sampled, 2.5)
    assert timed.fps == 2.5 and timed.metadata() == {"total_num_frames": 6, "fps": 2.5, "duration": 6 / 2.5,
                                                     "frames_indices": [0, 2, 4]}
    assert at_rate(sampled, None) is sampled and DEFAULT_FPS == 24.0
    with pytest.raises(ValueError, match=r"^this clip's file gives its own rate \(10 frames a second\); fps= is for a "
                                         "folder, a zip or a list of frames$"):
        at_rate(SampledClip(frames[:2], [0, 1], 2, fps=10.0), 2)
    for bad in (0, -1, MAX_FPS + 1, float("nan"), float("inf"), True, "10"):
        with pytest.raises(ValueError, match="^fps must be a number of frames a second above 0 and at most 1000, got"
                                             ) as refused:
            check_fps(bad)
        assert "\n" not in str(refused.value)


def test_the_rate_field_is_kept_while_the_section_is_not_drawn_and_named_as_the_link_names_it():
    from app_pages.explorer_sections import ask_vlm, ask_vlm_clip

    assert ask_vlm_clip.FPS_KEY.startswith(ask_vlm.KEPT) and ask_vlm.WIDGETS["lm_fps"] == ask_vlm_clip.FPS_KEY
    assert LABEL == LABELS["lm_fps"]


@pytest.mark.slow  # a tiny Qwen2.5-VL answers on the page and by hand
@pytest.mark.usefixtures("dirs")
def test_the_pages_rate_reaches_the_processor_as_fps_does_and_its_link_restores_it(tmp_path_factory, monkeypatch):
    import torch
    from test_app_ask_vlm import LENGTH, ask, open_folder
    from test_app_share import notes, open_link, url
    from test_vlm_answer import QUESTION, saved_whole
    from test_vlm_clip import FRAMES

    import vit
    from app_pages.explorer_sections import ask_vlm

    transformers = pytest.importorskip("transformers")
    folder = saved_whole(tmp_path_factory, ("qwen2_5_vl",))["qwen2_5_vl"]
    prepared, original = [], ask_vlm.prepare
    monkeypatch.setattr(ask_vlm, "prepare", lambda *a, **k: prepared.append(original(*a, **k)) or prepared[-1])
    data = zipped(FRAMES)

    at = open_folder(folder)
    [clip] = [w for w in at.main.file_uploader if w.label == "Or a clip to ask about instead (optional)"]
    clip.set_value(("frames.zip", data, "application/zip"))
    at.run()
    [rate] = [w for w in at.main.number_input if w.label == LABEL]
    assert rate.value == DEFAULT_FPS and (rate.min, rate.max) == (0.01, float(MAX_FPS))
    [frames] = [w for w in at.main.number_input if w.label == "Clip frames"]
    frames.set_value(4)
    rate.set_value(2.0)  # 2 frames a second: Qwen2.5-VL's slices of 2 frames 1 s apart
    ask(at, QUESTION)
    assert not at.main.error, [e.value for e in at.main.error]
    processor = transformers.AutoProcessor.from_pretrained(folder)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": QUESTION}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    timed = dict(total_num_frames=4, fps=2.0, duration=2.0, frames_indices=[0, 1, 2, 3])  # by hand
    inputs = processor(videos=[np.stack([np.asarray(f.convert("RGB")) for f in FRAMES])], text=text,
                       return_tensors="pt", do_sample_frames=False, video_metadata=[timed])
    ours = prepared[-1].inputs
    assert torch.equal(ours["input_ids"], inputs["input_ids"])
    assert torch.as_tensor(ours["second_per_grid_ts"]).tolist() == torch.as_tensor(
        inputs["second_per_grid_ts"]).tolist() == [1.0]  # 24 a second (the default) gives 2 / 24
    answer = vit.ask_vlm(vit.open_vlm(folder), video=[f.convert("RGB") for f in FRAMES], question=QUESTION, frames=4,
                         fps=2, max_new_tokens=LENGTH)
    assert [t.value.strip() for t in at.main.text if t.value.startswith("Answer:")] == [f"Answer: {answer.text}"]
    at.run()
    link = url(at)
    assert link["lm_fps"] == "2" and link["lm_frames"] == "4"

    linked = open_link(link)
    assert not linked.main.error and notes(linked) == [], [e.value for e in linked.main.error]
    assert [w.value for w in linked.main.number_input if w.label == LABEL] == [2.0]
    assert torch.as_tensor(prepared[-1].inputs["second_per_grid_ts"]).tolist() == [1.0]
    assert url(linked) == link
    past = open_link({**link, "lm_fps": "0"})  # out of range: dropped in one line, the default rate taken
    assert [displayed(n) for n in notes(past)] == ["The link's lm_fps=0 was not used: give a number of frames a "
                                                   "second from 0.01 to 1000, at most two decimals."]
    assert [w.value for w in past.main.number_input if w.label == LABEL] == [DEFAULT_FPS]
