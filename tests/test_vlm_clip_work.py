"""What a clip (or an image) becomes before a VLM reads it (issue 114, items 1 and 4; issue 113): the processor's work
is counted before it runs, from the visitor's frames' sizes and the processor's own resize rule, and a clip shorter
than the frames asked for is read with each frame once.

Measured in a fresh process (tests/peak_memory.py) on the tiny random Qwen2.5-VL of test_vlm_answer, saved whole
with transformers' own processor, under ``VIT_ANALYSIS_MEMORY_MB=64``; before the count, on 2 busy cores:
- 12 PNG frames of 1,024² (48 MB decoded, inside the clip bound) grew the process by about 310 MB in the processor;
  refused now in one line, the process grown by what the frames hold decoded.
- a video processor whose least pixels a frame are 10^6 (1,276 merge units, under the folder's declared bound) grew
  it by about 330 MB for an 8-frame 64 x 48 GIF; refused now before the processor runs.
- ``size.shortest_edge`` 2 x 10^8 (the issue's, which killed the server) and 10^10 (a raw RuntimeError) are refused
  when the folder is opened, nothing built.
"""

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from peak_memory import ALLOCATOR_SLACK, ROADS, can_reset_the_peak, run_measured
from PIL import Image

transformers = pytest.importorskip("transformers")
from test_vlm_answer import NEW_TOKENS, QUESTION, picture, saved_whole  # noqa: E402

import vit  # noqa: E402
from vit.costs import processors  # noqa: E402
from vit.sources.vlm.whole_vlm import VLMError  # noqa: E402

pytestmark = pytest.mark.slow  # importing transformers takes seconds
MB = 2**20
LIMIT_MB = 64  # the memory bound each measured ask runs under


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """A tiny random Qwen2.5-VL saved whole with its processor (Qwen2-VL's video processor, its defaults)."""
    return saved_whole(tmp_path_factory, ["qwen2_5_vl"])["qwen2_5_vl"]


def with_video_size(qwen, tmp_path, **size) -> str:
    """A copy of ``qwen`` whose video processor's ``size`` is ``size``."""
    folder = tmp_path / "hostile"
    shutil.copytree(qwen, folder)
    settings = json.loads((folder / "processor_config.json").read_text())
    settings["video_processor"]["size"] = size
    (folder / "processor_config.json").write_text(json.dumps(settings))
    return str(folder)


def gif(frames: list[Image.Image]) -> bytes:
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=500, loop=0)
    return buffer.getvalue()


# --- the processor's output, by its own rule ------------------------------------------------------------------------

@pytest.mark.parametrize(("frames", "height", "width", "size"), [
    (4, 70, 90, None),  # the default: at least 128 merge units a frame, so a small frame grows
    (3, 1000, 300, None),  # an odd count (padded to the temporal patch), a large frame shrunk to 768 units at most
    (8, 48, 64, {"shortest_edge": 10**6, "longest_edge": 2 * 10**6}),  # a hostile least
])
def test_the_counted_output_is_the_video_processors_own(qwen, frames, height, width, size):
    """``output_values`` is the size of what transformers' video processor returns for these frames, exactly."""
    videos = transformers.AutoProcessor.from_pretrained(qwen).video_processor
    if size is not None:
        videos.size = size
    clip = np.zeros((frames, height, width, 3), dtype=np.uint8)
    out = videos(videos=[clip], return_tensors="pt", do_sample_frames=False)["pixel_values_videos"]
    assert processors.output_values(videos, frames, height, width, video=True) == out.numel()


@pytest.mark.parametrize(("height", "width"), [(70, 90), (900, 400)])
def test_the_counted_output_is_the_image_processors_own(qwen, height, width):
    images = transformers.AutoProcessor.from_pretrained(qwen).image_processor
    out = images(images=[np.zeros((height, width, 3), dtype=np.uint8)], return_tensors="pt")["pixel_values"]
    assert processors.output_values(images, 1, height, width, video=False) == out.numel()


@pytest.mark.parametrize("size", [{"height": 64, "width": 48}, {"shortest_edge": 336},
                                  {"shortest_edge": 336, "longest_edge": 672}, {"max_height": 100, "max_width": 100}])
@pytest.mark.parametrize("sides", [(300, 900), (900, 300), (301, 299), (70, 90)])
def test_another_processors_size_is_applied_as_transformers_resizes(size, sides):
    """A processor that does not patch its frames (LLaVA's CLIP processor, OneVision's, InternVL's) resizes them by
    its ``size`` as transformers' torchvision backend does: the sides counted are those of its ``resize``'s output."""
    from transformers.image_processing_backends import TorchvisionBackend
    from transformers.image_utils import SizeDict

    resized = TorchvisionBackend().resize(torch.zeros(3, *sides, dtype=torch.uint8), SizeDict(**size))
    assert processors.resized_sides(size, *sides) == tuple(resized.shape[-2:])


def test_a_longest_edge_alone_or_no_size_is_counted_by_hand():
    """SmolVLM's video processor resizes its longest edge (a rule of its own); a size that says nothing: the frame."""
    assert processors.resized_sides({"longest_edge": 364}, 300, 900) == (121, 364)  # 300 x 364 / 900 = 121.3
    assert processors.resized_sides({}, 300, 900) == (300, 900)


def test_a_clips_refusal_names_as_many_frames_as_fit(qwen, monkeypatch):
    """The frames the one-line refusal names fit the bound, and one more does not."""
    import re

    videos = transformers.AutoProcessor.from_pretrained(qwen).video_processor
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str(LIMIT_MB))
    with pytest.raises(processors.TooManyTokens, match=r"^12 frames of 1,024x1,024 px .* ask about at most \d+ of "
                                                       r"its frames, or a smaller clip$") as refusal:
        processors.check_processor(videos, [(1024, 1024)] * 12, video=True)
    fits = int(re.search(r"at most (\d+) of its frames", str(refusal.value)).group(1))
    processors.check_processor(videos, [(1024, 1024)] * fits, video=True)
    with pytest.raises(processors.TooManyTokens):
        processors.check_processor(videos, [(1024, 1024)] * (fits + 1), video=True)


# --- measured in a fresh process -------------------------------------------------------------------------------------

WORKER = r'''
import json, resource, sys
sys.path.insert(0, sys.argv[2])
from peak_memory import peak, start
import vit

vlm = vit.open_vlm(sys.argv[1])  # before the measure: the model, its processor and imports
limit = vit.costs.bounds.memory_limit()
with open("/proc/self/statm") as f:  # past the bound and 768 MB more an allocation fails, instead of taking the machine
    mapped = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (mapped + limit + 768 * 2**20, resource.getrlimit(resource.RLIMIT_AS)[1]))
since = start()
try:
    vit.ask_vlm(vlm, video=sys.argv[3], frames=int(sys.argv[4]), question="what is this ?", max_new_tokens=2)
    refused = None
except (ValueError, MemoryError, RuntimeError) as e:
    refused = f"{type(e).__name__}: {e}"
print(json.dumps({"refused": refused, "grown": peak() - since, "limit": limit}))
'''


def asked(folder, clip, frames: int) -> dict:
    from peak_memory import ROOT

    done = run_measured(WORKER, [str(folder), str(ROOT / "tests"), str(clip), str(frames)], timeout=280, preload=ROADS,
                        VIT_ANALYSIS_MEMORY_MB=str(LIMIT_MB))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


needs_peak = pytest.mark.skipif(not can_reset_the_peak(), reason="the peak RSS cannot be reset here (clear_refs)")


@needs_peak
def test_a_clip_of_large_frames_is_refused_before_the_video_processor_runs(qwen, tmp_path):
    """12 PNG frames of 1,024² (compressed to a few kB each): 48 MB decoded, inside the clip bound (64 MB), but the
    processor's copies and its float32 output at 768 merge units a frame are several times the bound. Refused in one
    line saying how many frames fit, the process grown by no more than the bound."""
    frames = tmp_path / "frames"
    frames.mkdir()
    ramp = np.broadcast_to(np.arange(1024, dtype=np.uint8)[None, :, None], (1024, 1024, 3))
    for i in range(12):
        Image.fromarray(np.ascontiguousarray(ramp + i)).save(frames / f"frame{i}.png")
    out = asked(qwen, frames, 12)
    refused = out["refused"] or ""
    assert refused.startswith("TooManyTokens: 12 frames of 1,024x1,024 px through its video processor would hold "
                              "about ") and "VIT_ANALYSIS_MEMORY_MB); ask about at most " in refused, refused
    assert "\n" not in refused
    assert out["grown"] <= out["limit"] + ALLOCATOR_SLACK, out["grown"] / MB


@needs_peak
def test_a_video_processors_least_pixels_are_counted_before_it_grows_a_small_clip(qwen, tmp_path):
    """A least of 10^6 pixels a frame (1,276 merge units: under the folder's declared bound, 4,096 a view) makes an
    8-frame 64 x 48 GIF 8 x 10^6 pixels of float32 copies: refused before the processor runs, the process not
    grown by it."""
    folder = with_video_size(qwen, tmp_path, shortest_edge=10**6, longest_edge=2 * 10**6)
    (tmp_path / "clip.gif").write_bytes(gif([picture(64, 48).rotate(10 * i) for i in range(8)]))
    out = asked(folder, tmp_path / "clip.gif", 8)
    refused = out["refused"] or ""
    assert refused.startswith("TooManyTokens: 8 frames of 64x48 px through its video processor would hold about "), \
        refused
    assert out["grown"] <= 16 * MB, out["grown"] / MB


@needs_peak
def test_the_count_holds_what_the_video_processor_holds(qwen):
    """The count is not vacuous: measured in a fresh process, the frames decoded (PIL) and everything the answer's
    preparation of them holds (the stack, the processor's copies and output) stay under ``processor_bytes``, and
    that is under twice the measure."""
    from peak_memory import ROOT

    code = r'''
import json, sys
sys.path.insert(0, sys.argv[2])
from peak_memory import peak, start
from PIL import Image
import vit
from vit.costs.processors import processor_bytes
from vit.explain.language.vlm_answer import _clip_inputs

vlm = vit.open_vlm(sys.argv[1])
_clip_inputs(vlm, [Image.new("RGB", (64, 48))] * 2, "what is this ?")  # the template rendered, lazy imports
since = start()
frames = [Image.new("RGB", (800, 600), (i, 2 * i, 3 * i)) for i in range(8)]
_clip_inputs(vlm, frames, "what is this ?")
print(json.dumps({"grown": peak() - since, "counted": processor_bytes(vlm.processor.video_processor,
                                                                      [f.size for f in frames], True)}))
'''
    done = run_measured(code, [str(qwen), str(ROOT / "tests")], timeout=280, preload=ROADS)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["grown"] <= out["counted"] + ALLOCATOR_SLACK <= 2 * out["grown"], (out["grown"] / MB,
                                                                                   out["counted"] / MB)


@pytest.mark.parametrize(("least", "message"), [
    (2 * 10**8, r"its processor_config.json resizes every frame of a clip to at least 200,000,000 pixels "
                r"\(min_pixels\), 255,102 image tokens; at most 4,096 a view are read"),
    (10**10, r"resizes every frame of a clip to at least 10,000,000,000 pixels"),
])
def test_a_video_processors_declared_least_is_refused_when_the_folder_opens(qwen, tmp_path, least, message):
    """The issue's values: 2 x 10^8 killed the server on an 8-frame 64 x 48 GIF, 10^10 gave a raw RuntimeError."""
    folder = with_video_size(qwen, tmp_path, shortest_edge=least, longest_edge=least)
    with pytest.raises(VLMError, match=message) as refusal:
        vit.open_vlm(folder)
    assert "\n" not in str(refusal.value)


def test_the_picker_lists_a_folder_of_a_hostile_video_processor_as_refused(qwen, tmp_path):
    """The explorer's picker describes a listed VLM by its tower; its video processor's declared size (which only a
    question reads) is counted there too, so the folder is listed as refused in one line, not offered to a visitor
    whose clip would be refused (issue 114, finding 4)."""
    from vit.app import catalog

    folder = with_video_size(qwen, tmp_path, shortest_edge=2 * 10**8, longest_edge=2 * 10**8)
    entry = catalog.describe(catalog.Candidate(Path(folder), "hf-cache", "evil/video"), library_road=True)
    assert "resizes every frame of a clip to at least 200,000,000 pixels" in entry.error
    assert "\n" not in entry.error
    assert catalog.describe(catalog.Candidate(Path(qwen), "hf-cache", "good/video"), library_road=True).ok


def test_a_video_processors_own_file_is_read_too(qwen, tmp_path):
    """A video processor saved apart (video_preprocessor_config.json, as older folders keep it) is counted alike."""
    folder = tmp_path / "apart"
    shutil.copytree(qwen, folder)
    settings = json.loads((folder / "processor_config.json").read_text())
    video = settings.pop("video_processor")
    (folder / "processor_config.json").write_text(json.dumps(settings))
    (folder / "video_preprocessor_config.json").write_text(json.dumps(dict(video, size={
        "shortest_edge": 2 * 10**8, "longest_edge": 2 * 10**8})))
    with pytest.raises(VLMError, match=r"its video_preprocessor_config.json resizes every frame of a clip to at least"):
        vit.open_vlm(folder)


def test_a_clip_processors_most_over_a_clip_is_bounded_but_a_published_one_opens(qwen, tmp_path):
    """A video processor's most may be over a whole clip (GLM-4.1V's 47,040,000 pixels, 60,000 units): it opens;
    past 64 frames at an image's most it is refused."""
    vit.open_vlm(with_video_size(qwen, tmp_path / "glm", shortest_edge=12544, longest_edge=47_040_000))
    with pytest.raises(VLMError, match=r"resizes a clip to up to 900,000,000 pixels \(max_pixels\), 1,147,959 image "
                                       r"tokens; at most 1,048,576 \(a clip's 64 frames at an image's most\)"):
        vit.open_vlm(with_video_size(qwen, tmp_path / "huge", shortest_edge=12544, longest_edge=900_000_000))


# --- a short clip's frames, each once -------------------------------------------------------------------------------

FOUR = [picture(90, 70), picture(90, 70).rotate(3), picture(90, 70).transpose(0), picture(90, 70).transpose(1)]


def test_a_clip_shorter_than_the_frames_asked_is_read_once_each_as_transformers_reads_it(qwen):
    """``ask_vlm(video=<4 frames>, fps=2)`` at its default 8 frames: the 4 frames, each once (2 slices of Qwen's 2
    frames), and the answer is transformers' greedy ``generate`` on the frames given with their times; read twice
    each ([0, 0, 1, 1, ...], 4 slices) the prompt and the answer differ."""
    answer = vit.ask_vlm(vit.open_vlm(qwen), video=FOUR, question=QUESTION, fps=2, max_new_tokens=NEW_TOKENS)
    processor = transformers.AutoProcessor.from_pretrained(qwen)
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": QUESTION}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    timed = dict(total_num_frames=4, fps=2.0, duration=2.0, frames_indices=[0, 1, 2, 3])
    inputs = processor(videos=[np.stack([np.asarray(f) for f in FOUR])], text=text, return_tensors="pt",
                       do_sample_frames=False, video_metadata=[timed])
    assert len(answer.layouts) == 2 and torch.equal(answer._source[1].inputs["input_ids"], inputs["input_ids"])
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(qwen).eval()
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert list(answer.tokens) == out[0, inputs["input_ids"].shape[1]:].tolist()


def test_a_short_gif_or_list_gives_each_frame_once_for_a_vlm_and_repeats_for_a_video_model():
    """A VLM's clip (``once``) takes each of a short clip's frames once; a video model's takes its own frame count,
    repeating (transformers' ``sample_frames`` for VideoMAE)."""
    from vit.core.clips import read_clip, read_clip_bytes

    data = gif(FOUR)
    assert read_clip_bytes(data, "clip.gif", 8, once=True).indices == [0, 1, 2, 3]
    assert read_clip(FOUR, 8, once=True).indices == [0, 1, 2, 3]
    assert read_clip_bytes(data, "clip.gif", 8).indices == [0, 0, 1, 1, 2, 2, 3, 3]
    assert read_clip_bytes(data, "clip.gif", 3, once=True).indices == [0, 1, 2]  # a longer clip: sampled as before
