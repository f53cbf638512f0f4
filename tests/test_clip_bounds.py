"""A clip's frames are checked before they are decoded, whatever their header says (issue 77, items 1, 2 and 8).

A GIF's logical screen is not the size Pillow decodes at: a frame whose image descriptor reaches past it widens the
canvas, and every later frame is decoded at that size (the attack: a 16 x 16 screen whose frames are 12,000², 295 KB
here, 321 KB in the issue). A TIFF's pages each have their own size; a transport stream's frames may grow past the
size its headers declare, in frames that are never sampled. Pillow refuses a screen past twice its pixel limit with
``DecompressionBombError``, neither OSError nor ValueError. A clip is an upload like an image: its frames keep the
uploads' 64:1 aspect bound. Each is refused in one line (ClipError), the memory untouched, and ``vit.predict`` goes
on with the next clip. The GIFs are written byte by byte here (``gif_bytes``: LZW coded as giflib codes it)."""

import io
import json
import struct
import zipfile
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from helpers import displayed
from peak_memory import run_forked
from PIL import Image
from streamlit.testing.v1 import AppTest
from test_app import dirs  # noqa: F401 (a fixture)

from vit.core.clips import ClipError, read_clip, read_clip_bytes

ROOT = Path(__file__).resolve().parent.parent
ATTACK = dict(screen=(16, 16), frames=[(0, 0, 16, 16)] + [(0, 0, 12_000, 12_000)] * 3)  # the GIF


def lzw_run(pixels: int, colour: int = 1, min_code_size: int = 2) -> bytes:
    """A GIF frame's image data: its LZW code size, then the sub-blocks coding ``pixels`` pixels of ``colour``, as
    giflib's encoder codes a run (each code one pixel longer than the last while the table grows, a clear code when
    it is full): 144 M pixels in 98 KB."""
    clear, end = 1 << min_code_size, (1 << min_code_size) + 1
    packed, filled, out = 0, 0, bytearray()

    def emit(code: int, width: int) -> None:
        nonlocal packed, filled
        packed |= code << filled
        filled += width
        while filled >= 8:
            out.append(packed & 0xFF)
            packed >>= 8
            filled -= 8

    width, running, longest, codes = min_code_size + 1, clear + 2, 1, {1: colour}
    emit(clear, width)
    remaining = pixels
    while remaining:
        take = min(longest, remaining)
        remaining -= take
        emit(codes[take], width)
        if running >= 1 << width and width < 12:
            width += 1
        if not remaining:
            break
        if running >= 4095:  # the table is full
            emit(clear, width)
            width, running, longest, codes = min_code_size + 1, clear + 2, 1, {1: colour}
        else:
            codes[take + 1], running, longest = running, running + 1, take + 1
    emit(end, width)
    if filled:
        out.append(packed & 0xFF)
    return bytes([min_code_size]) + b"".join(bytes([len(out[i:i + 255])]) + out[i:i + 255]
                                             for i in range(0, len(out), 255)) + b"\0"


def gif_bytes(screen: tuple[int, int], frames: list[tuple[int, int, int, int]]) -> bytes:
    """A GIF89a: its logical screen ``(width, height)``, a black-and-white global palette, and one image per
    ``(left, top, width, height)`` descriptor, all white."""
    head = b"GIF89a" + struct.pack("<2H", *screen) + bytes([0x80, 0, 0]) + b"\0\0\0\xff\xff\xff"
    images = (b"," + struct.pack("<4HB", *frame, 0) + lzw_run(frame[2] * frame[3]) for frame in frames)
    return head + b"".join(images) + b";"


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message and message
    return message


def test_the_written_gifs_decode_as_pillow_decodes_them():
    """The helper's LZW is valid: every pixel of every frame is the colour it codes, and a frame reaching past the
    screen widens Pillow's canvas (the behaviour the reader must foresee)."""
    data = gif_bytes((40, 30), [(0, 0, 40, 30), (10, 5, 50, 40)])
    with Image.open(io.BytesIO(data)) as image:
        assert image.size == (40, 30) and np.asarray(image.convert("L")).min() == 255
        image.seek(1)
        assert image.size == (60, 45)
        assert np.asarray(image.convert("L"))[5:, 10:].min() == 255


PEAK = """
import resource, sys
from vit.core.clips import ClipError, read_clip_bytes
data = open(sys.argv[1], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    read_clip_bytes(data, "attack.gif", 16)
    print("accepted")
except ClipError as e:
    print(e)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


@pytest.mark.parametrize("frames", [ATTACK["frames"], [(0, 0, 16, 16)] + [(11_999, 11_999, 1, 1)] * 3,
                                    [(0, 0, 16, 16), (0, 0, 12_000, 12_000)]],
                         ids=["12000-squared-frames", "one-pixel-frames-at-12000", "one-12000-squared-frame"])
def test_a_gif_whose_frames_widen_its_screen_is_refused_before_they_are_decoded(tmp_path, frames):
    """The issue's GIF (and one whose 1-pixel frames sit at 12,000, 12,000: Pillow widens the canvas all the same;
    and one such frame, whose 432 MB of RGB is under the bound, but which PIL decodes holding 1.8 GB), read as the
    page reads an upload, in a process of its own: refused in one line that names the canvas, its peak memory grown
    by less than one such frame would take (the previous code took 2.9 GB for the first, 1.8 GB for the last)."""
    path = tmp_path / "attack.gif"
    path.write_bytes(gif_bytes((16, 16), frames))
    assert path.stat().st_size < 400_000
    run = run_forked(PEAK, [str(path)], timeout=300)  # forked from the measuring server: no torch imported again
    assert run.returncode == 0, run.stderr[-2000:]
    message, grown_mb = run.stdout.strip().splitlines()
    assert "12,000x12,000 px" in message and "16x16 px first frame" in message, message
    assert int(grown_mb) < 100


def test_the_notebook_api_refuses_the_same_gif_in_one_line(tmp_path, monkeypatch):
    """``read_clip`` on a path (the notebook API's and ``vit.predict``'s reader), the bound lowered so that 4,000²
    frames are past it."""
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "64")
    path = tmp_path / "wide.gif"
    path.write_bytes(gif_bytes((16, 16), [(0, 0, 16, 16)] + [(0, 0, 4_000, 4_000)] * 3))
    with pytest.raises(ClipError) as error:
        read_clip(path, 16)
    assert "decoding 4 frames of 4,000x4,000 px" in one_line(error)


def test_each_page_of_a_tiff_is_checked_before_it_is_decoded(monkeypatch):
    """Another container whose frames differ in size: a TIFF of a 16 x 16 page and a 4,000² one (deflated: 30 KB)."""
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", "16")
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buffer, "TIFF", save_all=True, compression="tiff_adobe_deflate",
                                    append_images=[Image.new("RGB", (4_000, 4_000))])
    assert len(buffer.getvalue()) < 100_000
    with pytest.raises(ClipError) as error:
        read_clip_bytes(buffer.getvalue(), "pages.tiff", 4)
    assert "4,000x4,000 px" in one_line(error)


@pytest.mark.parametrize("side, limit_mb", [(20_000, None), (14_000, None), (20_000, "4096")],
                         ids=["past-the-bound", "past-pils-limit", "past-pils-limit-with-the-bound-raised"])
def test_a_gif_declaring_more_pixels_than_pil_decodes_is_refused_in_one_line(side, limit_mb, monkeypatch):
    """Item 2: a few dozen bytes declaring 20,000² (past the memory bound, and past twice PIL's pixel limit, where
    Image.open raises DecompressionBombError); 14,000² is under the bound but past PIL's limit."""
    if limit_mb:
        monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", limit_mb)
    data = gif_bytes((side, side), [(0, 0, 1, 1)])
    assert len(data) < 68
    with pytest.raises(ClipError) as error:
        read_clip_bytes(data, "bomb.gif", 16)
    assert "bomb.gif" in one_line(error)


def test_a_clip_past_the_uploads_aspect_bound_is_refused_as_an_image_is():
    """Item 8: a 1 x 65,535 GIF screen, a frame that widens a 16 x 16 one to 16 x 2,000, a zip's frame."""
    from vit.core.images import MAX_ASPECT

    tall = gif_bytes((1, 65_535), [(0, 0, 1, 1)])
    widened = gif_bytes((16, 16), [(0, 0, 16, 16), (0, 0, 16, 2_000)])
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for i in range(2):
            frame = io.BytesIO()
            Image.new("RGB", (1_000, 10)).save(frame, "PNG")
            archive.writestr(f"frame{i}.png", frame.getvalue())
    for data, name in ((tall, "tall.gif"), (widened, "widened.gif"), (buffer.getvalue(), "strip.zip")):
        with pytest.raises(ClipError, match=f"more than {MAX_ASPECT} times as long as it is wide") as error:
            read_clip_bytes(data, name, 4)
        assert name in one_line(error)
    read_clip_bytes(gif_bytes((MAX_ASPECT, 1), [(0, 0, MAX_ASPECT, 1)]), "edge.gif", 4)  # at the bound: taken


def test_a_zip_frame_that_cannot_be_decoded_is_a_clip_error(tmp_path):
    """What ``open_image`` refuses in a zip is the ClipError the page catches, not its ImageError."""
    frame = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(frame, "PNG")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("frame0.png", frame.getvalue())
        archive.writestr("frame1.png", frame.getvalue()[: len(frame.getvalue()) // 2])
    with pytest.raises(ClipError) as error:
        read_clip_bytes(buffer.getvalue(), "cut.zip", 2)
    assert "frame1.png is truncated" in one_line(error)


def transport_stream(segments: list[tuple[int, int]], rate: int = 25) -> bytes:
    """An H.264 MPEG-TS of ``(frames, side)`` segments one after the other, each a file of its own (its own
    parameter sets) concatenated, timestamps running on: the frame size changes where a segment starts."""
    av = pytest.importorskip("av")
    data, start = b"", 0
    for count, side in segments:
        buffer = io.BytesIO()
        with av.open(buffer, "w", format="mpegts") as container:
            stream = container.add_stream("libx264", rate=rate)
            stream.width, stream.height, stream.pix_fmt = side, side, "yuv420p"
            for i in range(count):
                frame = av.VideoFrame.from_ndarray(np.full((side, side, 3), 7 * i % 256, np.uint8), format="rgb24")
                frame.pts, frame.time_base = start + i, Fraction(1, rate)
                for packet in stream.encode(frame):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        data, start = data + buffer.getvalue(), start + count
    return data


def test_a_transport_stream_that_grows_between_its_sampled_frames_is_refused_at_its_first_larger_frame():
    """Item 8's stream, small: 40 frames of 16 x 16, 3 of 64 x 64, 43 of 16 x 16. The 4 frames sampled from 86
    (0, 21, 43, 64) are all 16 x 16, but decoding in order goes through the larger ones, which no bound counted."""
    av = pytest.importorskip("av")
    data = transport_stream([(40, 16), (3, 64), (43, 16)])
    with av.open(io.BytesIO(data)) as container:
        sizes = [frame.width for frame in container.decode(video=0)]
    assert len(sizes) == 86 and sizes[40:43] == [64] * 3 and {sizes[i] for i in (0, 21, 43, 64)} == {16}
    with pytest.raises(ClipError) as error:
        read_clip_bytes(data, "grows.ts", 4)
    assert "grows.ts declares 16x16 px but holds 64x64" in one_line(error)


@pytest.mark.slow  # transformers builds the model
def test_predict_and_explain_refuse_each_bad_clip_in_one_line_and_the_batch_goes_on(tmp_path, monkeypatch, capsys):
    transformers = pytest.importorskip("transformers")  # noqa: F841
    from test_videomae import videomae_folder, write_gif

    import vit
    from vit.predict import main

    videomae_folder(tmp_path / "videomae", 4, 16, 16)
    (tmp_path / "bomb.gif").write_bytes(gif_bytes((20_000, 20_000), [(0, 0, 1, 1)]))
    (tmp_path / "pil-bomb.gif").write_bytes(gif_bytes((14_000, 14_000), [(0, 0, 1, 1)]))
    (tmp_path / "wide.gif").write_bytes(gif_bytes(**ATTACK))
    (tmp_path / "tall.gif").write_bytes(gif_bytes((1, 65_535), [(0, 0, 1, 1)]))
    write_gif(tmp_path / "good.gif", 4, size=(16, 16))
    bad = ["bomb.gif", "pil-bomb.gif", "wide.gif", "tall.gif"]
    capsys.readouterr()
    status = main([str(tmp_path / "videomae"), *(str(tmp_path / name) for name in [*bad, "good.gif"])])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert status == 1 and len(lines) == len(bad), lines
    for line, name in zip(lines, bad, strict=True):
        assert line.startswith("vit.predict: skipped: ") and name in line
    assert [record["clip"] for record in json.loads(out)] == [str(tmp_path / "good.gif")]

    checkpoint = vit.load(tmp_path / "videomae")
    for name in bad:
        with pytest.raises(ClipError) as error:
            vit.explain(checkpoint, tmp_path / name)
        assert name in one_line(error)


@pytest.mark.slow  # transformers builds the model
@pytest.mark.usefixtures("dirs")  # the app's own folders; its HF cache is tmp_path / "hf-cache"
def test_the_page_refuses_each_bad_clip_in_one_line_for_a_visitor_without_the_token_and_takes_the_next(
        tmp_path, monkeypatch):
    """The issue's path: a server with a token, a visitor who has not entered it opening a VideoMAE of the server's
    HF cache by a link (``?model=ORG/NAME``), and uploading each clip in "Upload a clip": one error line each (the
    bomb raised PIL's DecompressionBombError through the page), then a good GIF is shown."""
    pytest.importorskip("transformers")
    from test_app_video import FRAMES, HEIGHT, WIDTH
    from test_videomae import videomae_folder, write_gif

    from vit.runs.access import TOKEN_ENV

    model_dir = tmp_path / "hf-cache" / "models--someone--tiny-videomae"
    videomae_folder(model_dir / "snapshots" / "rev1", FRAMES, HEIGHT, WIDTH)
    (model_dir / "refs").mkdir()
    (model_dir / "refs" / "main").write_text("rev1")
    monkeypatch.setenv(TOKEN_ENV, "correct-horse-battery-staple")
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.query_params["model"] = "someone/tiny-videomae"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("Upload a clip in the sidebar" in i.value for i in at.info), [i.value for i in at.info]
    clips = [("bomb.gif", gif_bytes((20_000, 20_000), [(0, 0, 1, 1)])),
             ("pil-bomb.gif", gif_bytes((14_000, 14_000), [(0, 0, 1, 1)])),
             ("attack.gif", gif_bytes(**ATTACK)), ("tall.gif", gif_bytes((1, 65_535), [(0, 0, 1, 1)]))]

    def upload(name: str, data: bytes) -> None:
        [uploader] = [u for u in at.sidebar.file_uploader if u.label == "Upload a clip"]
        uploader.set_value((name, data, "image/gif"))
        at.run()

    for name, data in clips:
        upload(name, data)
        assert not at.exception, (name, [e.message for e in at.exception])
        errors = [e.value for e in at.main.error]
        assert len(errors) == 1, "\n".join(displayed(e) for e in errors)
        error = errors[0]
        assert error.startswith("Cannot use this clip: ") and "\n" not in error and name in error.replace("\\", "")
    upload("good.gif", write_gif(tmp_path / "good.gif", FRAMES).read_bytes())
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    assert any("Uniform sampling of 4 frames over 4" in c.value for c in at.caption)
