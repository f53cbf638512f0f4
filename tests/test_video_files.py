"""A video file in (issue 65, item 1): ``read_clip`` and ``read_clip_bytes`` decode MP4 / WebM / MKV / AVI through
PyAV, and the frames they sample are, pixel for pixel, PyAV's own decode of every frame at those indices (H.264
with B-frames and short keyframe intervals, so both the seeks and the forward decoding are exercised); a file whose
headers declare more than the bounds is refused in one line before a packet is read; a file that is not a video, or
holds no video stream, is refused in one line. The small clips are written here by PyAV's own encoders."""

import numpy as np
import pytest
from lazy_modules import lazy

from vit.core import clips
from vit.core.clips import ClipError, read_clip, read_clip_bytes, sample_indices

av = lazy("av")  # imported by the first test that reads it (tests/lazy_modules.py)


def write_video(path, count: int, size=(64, 48), codec: str = "libx264", gop: int | None = None, rate: int = 25,
                options: dict | None = None):
    """``count`` frames of a bar moving over still noise, every frame different, encoded by PyAV (x264 codes most of
    them as B-frames, which the reader skips unless sampled)."""
    width, height = size
    background = np.random.default_rng(0).integers(0, 64, (height, width, 3), dtype=np.uint8)
    if codec == "libx265":
        options = {"x265-params": "log-level=error", **(options or {})}
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=rate, options=options)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if gop:
            stream.codec_context.gop_size = gop
        for i in range(count):
            frame = background.copy()
            frame[:, (3 * i) % width:(3 * i) % width + 6] = 255
            frame[..., 1] = 4 * i % 256
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def every_frame(path) -> list[np.ndarray]:
    """The reference: PyAV decoding every frame, in order, as RGB."""
    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


# (file, codec, keyframe interval, encoder options): x264's B-frames with its own keyframes, and with one every 6 to 8
# frames; B-frames where the container's timestamps do not place them: AVI's (decoding order, or a seek by decoding
# time), an MPEG program stream's (whose threaded decoders misname a frame's timestamp) and transport stream's
BFRAMES = {"bf": "2"}
VIDEOS = [("clip.mp4", "libx264", None, None), ("short-gop.mp4", "libx264", 6, None), ("clip.webm", "libvpx", 7, None),
          ("clip.mkv", "mpeg4", 5, None), ("clip.avi", "mpeg4", 8, None), ("hevc.mp4", "libx265", 9, None),
          ("b-frames.avi", "mpeg4", 6, BFRAMES), ("h264.avi", "libx264", 8, None),
          ("clip.mpg", "mpeg2video", 6, BFRAMES), ("mpeg1.mpg", "mpeg1video", 6, BFRAMES),
          ("clip.ts", "mpeg2video", 7, BFRAMES), ("h264.ts", "libx264", 10, None)]


@pytest.mark.parametrize("name, codec, gop, options", VIDEOS, ids=[v[0] for v in VIDEOS])
def test_the_sampled_frames_are_a_full_decodes_frames_at_their_indices(tmp_path, name, codec, gop, options):
    path = write_video(tmp_path / name, 37, codec=codec, gop=gop, options=options)
    reference = every_frame(path)
    assert len(reference) == 37
    for wanted in (4, 16, 50):  # 50: a clip shorter than the model's frames repeats some
        sampled = read_clip(path, wanted)
        assert sampled.total == 37 and sampled.indices == sample_indices(37, wanted)
        for index, frame in zip(sampled.indices, sampled.frames, strict=True):
            assert frame.mode == "RGB"
            np.testing.assert_array_equal(np.asarray(frame), reference[index])
    uploaded = read_clip_bytes(path.read_bytes(), name, 16)  # in memory: PyAV reads a BytesIO
    assert uploaded.indices == read_clip(path, 16).indices
    for index, frame in zip(uploaded.indices, uploaded.frames, strict=True):
        np.testing.assert_array_equal(np.asarray(frame), reference[index])


def test_an_upload_is_known_as_a_video_by_its_first_bytes_whatever_its_name(tmp_path):
    path = write_video(tmp_path / "clip.mp4", 10)
    sampled = read_clip_bytes(path.read_bytes(), "clip.bin", 4)
    np.testing.assert_array_equal(np.asarray(sampled.frames[1]), every_frame(path)[sampled.indices[1]])


@pytest.fixture
def no_decoding(monkeypatch):
    """Reading a packet or decoding a frame fails the test: a refusal must come from the headers alone."""
    def forbidden(*args, **kwargs):
        raise AssertionError("the file was read past its headers")
    monkeypatch.setattr(clips, "_frame_timestamps", forbidden)
    monkeypatch.setattr(clips, "_decode_sampled", forbidden)


def test_sampled_frames_past_the_memory_bound_are_refused_from_the_headers(tmp_path, monkeypatch, no_decoding):
    path = write_video(tmp_path / "big.mp4", 20, size=(320, 240))
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "1")  # 16 frames of 320 x 240 RGB: 3.7 MB
    with pytest.raises(ClipError, match=r"decoding 16 frames of 320x240 px would hold 4 MB \(at most 1 MB") as error:
        read_clip(path, 16)
    assert "\n" not in str(error.value)
    with pytest.raises(ClipError, match="big.mp4"):
        read_clip_bytes(path.read_bytes(), "big.mp4", 16)


def test_a_file_declaring_too_much_decoding_is_refused_from_the_headers(tmp_path, monkeypatch, no_decoding):
    mp4, webm = write_video(tmp_path / "clip.mp4", 40), write_video(tmp_path / "clip.webm", 40, codec="libvpx")
    monkeypatch.setattr(clips, "MAX_DECODE_PIXELS", 39 * 64 * 48)  # one frame fewer than the clip
    for path in (mp4, webm):  # MP4 declares its frame count, WebM its duration x rate
        with pytest.raises(ClipError, match="40 frames of 64x48 px are") as error:
            read_clip(path, 4)
        assert "\n" not in str(error.value) and "ffmpeg" in str(error.value)


def test_a_ten_minute_4k_clip_is_past_the_decoding_bound_and_ten_seconds_of_1080p_is_not():
    with pytest.raises(ClipError, match="18,000 frames of 3,840x2,160 px"):
        clips._check_decoding("talk.mp4", 10 * 60 * 30, 3840, 2160)
    clips._check_decoding("clip.mp4", 10 * 30, 1920, 1080)


def test_a_header_that_undercounts_is_caught_by_the_packets_before_decoding(tmp_path, monkeypatch):
    path = write_video(tmp_path / "clip.mp4", 40)
    monkeypatch.setattr(clips, "_declared_frames", lambda container, stream: 1)  # a header that lies
    monkeypatch.setattr(clips, "MAX_DECODE_PIXELS", 39 * 64 * 48)
    monkeypatch.setattr(clips, "_decode_sampled", lambda *a: pytest.fail("decoded past the bound"))
    with pytest.raises(ClipError, match="40 frames of 64x48 px are"):
        read_clip(path, 4)


def test_not_a_video_or_no_video_stream_is_refused_in_one_line(tmp_path):
    (tmp_path / "notes.mp4").write_text("not a video at all")
    audio = tmp_path / "sound.mp4"
    with av.open(str(audio), "w") as container:
        stream = container.add_stream("aac", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 8000
        for packet in [*stream.encode(frame), *stream.encode()]:
            container.mux(packet)
    for path, message in ((tmp_path / "notes.mp4", "is not a video this program can read"),
                          (audio, "holds no video stream")):
        for read, source in ((read_clip, path), (read_clip_bytes, path.read_bytes())):
            with pytest.raises(ClipError, match=message) as error:
                read(source, 4) if read is read_clip else read(source, path.name, 4)
            assert "\n" not in str(error.value) and path.name in str(error.value)


def test_a_truncated_video_is_refused_in_one_line(tmp_path):
    data = write_video(tmp_path / "clip.mp4", 30).read_bytes()
    with pytest.raises(ClipError) as error:
        read_clip_bytes(data[: len(data) // 2], "cut.mp4", 8)  # its index (moov) is at the end: gone
    assert "\n" not in str(error.value) and "cut.mp4" in str(error.value)


def test_the_reader_skips_frames_it_need_not_decode(tmp_path, monkeypatch):
    """So that the pixel equality above covers the seeks and the skipped B-frames, not only a forward decode."""
    path = write_video(tmp_path / "clip.mp4", 37, gop=6)
    decoded, real = [], clips._decoded

    def counting(*args):
        for frame in real(*args):
            decoded.append(frame.pts)
            yield frame
    monkeypatch.setattr(clips, "_decoded", counting)
    sampled = read_clip(path, 4)
    assert sampled.indices == [0, 9, 18, 27] and len(decoded) < 28  # a forward decode outputs frames 0 to 27


def test_keyframe_intervals_are_dealt_to_decoders_costliest_first():
    """Hand-counted: keyframes at 0, 10, 20, 30; an interval costs the frames from its keyframe to its last target
    (6, 3, 8 and 9 here); the costliest goes to the least loaded decoder first."""
    shares, loads = clips._shares([0, 5, 12, 25, 27, 38], [0, 10, 20, 30], list(range(40)), workers=2)
    assert shares == [[12, 38], [0, 5, 25, 27]] and loads == [12, 14]
    assert clips._shares([0, 5, 9], [0, 10], list(range(20)), workers=4) == ([[0, 5, 9]], [10])  # one interval


def test_decoders_run_at_once_on_their_own_containers_and_give_a_full_decodes_frames(tmp_path, monkeypatch):
    import threading

    path = write_video(tmp_path / "short-gop.mp4", 37, gop=6)
    reference = every_frame(path)
    monkeypatch.setattr(clips.threads, "usable_cores", lambda: 3)
    opened, decoders, real_open, real_decode = [], set(), clips._open_video, clips._decode_sampled

    def counting_open(*args):
        opened.append(args[0])
        return real_open(*args)

    # each decoder waits at the barrier until all three have started: they run at once, or the barrier times out (a
    # pool thread that had finished its share could otherwise take the next one on a busy machine: two threads)
    started = threading.Barrier(3, timeout=120)

    def noting_decode(container, stream, targets, *args):
        decoders.add((threading.get_ident(), tuple(targets)))
        started.wait()
        return real_decode(container, stream, targets, *args)
    monkeypatch.setattr(clips, "_open_video", counting_open)
    monkeypatch.setattr(clips, "_decode_sampled", noting_decode)
    for read, source in ((read_clip, path), (read_clip_bytes, path.read_bytes())):
        opened.clear(), decoders.clear()
        sampled = read(source, 16) if read is read_clip else read(source, path.name, 16)
        assert len(opened) == 3 and len({thread for thread, _ in decoders}) == 3  # three decoders, three threads
        assert sum(len(targets) for _, targets in decoders) == len(set(sampled.indices))  # each frame once
        for index, frame in zip(sampled.indices, sampled.frames, strict=True):
            np.testing.assert_array_equal(np.asarray(frame), reference[index])


def test_the_packets_no_frame_refers_to_are_named_before_decoding(tmp_path):
    """x264 without a B-pyramid codes its B-frames as references to nothing: the frames the bitstream filter keeps
    are exactly the decoded I- and P-frames; a codec it cannot read (VP8, MPEG-4 part 2) names none."""
    from av.video.frame import PictureType

    path = write_video(tmp_path / "clip.mp4", 37, gop=10, options={"x264-params": "b-pyramid=none:bframes=2"})
    with av.open(str(path)) as container:
        kinds = {frame.pts: PictureType(frame.pict_type).name for frame in container.decode(video=0)}
    assert "B" in kinds.values()
    for name, expected in (("clip.mp4", {pts for pts, kind in kinds.items() if kind in ("I", "P")}),
                           ("clip.webm", None), ("clip.avi", None)):
        if name != "clip.mp4":
            path = write_video(tmp_path / name, 37, codec="libvpx" if name.endswith("webm") else "mpeg4")
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stamps, _, references, _, _ = clips._frame_timestamps(container, stream, name, 64, 48)
        assert len(stamps) == 37 and references == expected


def test_a_video_is_opened_without_decoding_when_its_headers_say_enough(tmp_path, monkeypatch):
    """FFmpeg's probe decodes frames; H.264 with B-frames declares its reordering in its headers, so one open that
    decodes nothing does; MPEG-4 part 2 without B-frames declares none, so it is opened again with the whole probe."""
    calls, real = [], av.open

    def counting(*args, **kwargs):
        calls.append(kwargs.get("stream_options"))
        return real(*args, **kwargs)
    monkeypatch.setattr(av, "open", counting)
    for name, codec, opens in (("clip.mp4", "libx264", 1), ("clip.avi", "mpeg4", 2)):
        path = write_video(tmp_path / name, 12, codec=codec)
        calls.clear()
        with clips._open_video(path, name) as container:
            assert container.streams.video[0].codec_context.width == 64
        assert len(calls) == opens and calls[0][0] == {"skip_frame": "all"} and (opens == 1 or calls[1] is None)


@pytest.mark.parametrize("rate", [10, 25])
def test_a_videos_frame_rate_and_an_animations_are_read_from_their_files(tmp_path, rate):
    """A clip's frames per second, which a VLM's processor turns into the sampled frames' times: a video's from its
    packets' timestamps (its frames over the span they cover), an animated GIF's from its frames' display times
    (100 ms, 200 ms, ...: their count over their sum), none where a frame says none, nor for a list of frames."""
    import io

    from PIL import Image

    from vit.core.clips import read_clip, read_clip_bytes

    clip = read_clip(write_video(tmp_path / "clip.mp4", 30, rate=rate), 3)
    assert clip.fps == pytest.approx(rate) and clip.indices == [0, 10, 20]
    assert clip.metadata() == {"total_num_frames": 30, "fps": clip.fps, "duration": 30 / clip.fps,
                               "frames_indices": [0, 10, 20]}
    frames = [Image.new("RGB", (8, 8), (40 * i, 0, 0)) for i in range(4)]
    for durations, fps in (([100, 200, 100, 100], 4 * 1000 / 500), (100, 10.0), ([100, 0, 100, 100], None)):
        data = io.BytesIO()
        frames[0].save(data, format="GIF", save_all=True, append_images=frames[1:], duration=durations, loop=0)
        animation = read_clip_bytes(data.getvalue(), "clip.gif", 4)
        assert animation.fps == (pytest.approx(fps) if fps else None)
    assert read_clip(frames, 2).fps is None and read_clip(frames, 2).metadata() is None
