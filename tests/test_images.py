"""Images: every mode a user may bring becomes the same kind of model input; bad ones raise ImageError."""

import io
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from vit.core.images import MAX_SIDE, UPLOAD_MAX_PIXELS, ImageError, normalize, open_image, to_mode, to_uint8

RED, BLUE, WHITE = (255, 0, 0), (0, 0, 255), (255, 255, 255)


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def pixels(image: Image.Image) -> list:
    return np.asarray(image).tolist()


def error_of(source, **kwargs) -> str:
    with pytest.raises(ImageError) as info:
        open_image(source, **kwargs)
    message = str(info.value)
    assert "\n" not in message, "errors are one line"
    return message


# ---------------------------------------------------------------------------------------------
# Modes


def test_rgb_is_kept_as_is():
    image = Image.fromarray(np.array([[[10, 20, 30], [200, 100, 0]]], dtype=np.uint8), "RGB")
    decoded = open_image(encode(image, "PNG"))
    assert pixels(to_mode(decoded, 3)) == [[[10, 20, 30], [200, 100, 0]]]


def test_rgba_is_composited_on_white():
    rgba = np.array([[[255, 0, 0, 0], [255, 0, 0, 255], [0, 0, 0, 128]]], dtype=np.uint8)
    decoded = open_image(encode(Image.fromarray(rgba, "RGBA"), "PNG"))
    assert decoded.mode == "RGBA"
    # transparent -> white, opaque -> itself, half-transparent black -> mid grey
    assert pixels(to_mode(decoded, 3)) == [[list(WHITE), list(RED), [127, 127, 127]]]


def test_rgba_to_greyscale_composites_before_dropping_colour():
    rgba = np.array([[[0, 0, 0, 0], [0, 0, 0, 255]]], dtype=np.uint8)
    assert pixels(to_mode(Image.fromarray(rgba, "RGBA"), 1)) == [[255, 0]]


def test_greyscale_gives_one_channel_or_three_equal_ones():
    grey = Image.fromarray(np.array([[0, 100, 255]], dtype=np.uint8), "L")
    decoded = open_image(encode(grey, "PNG"))
    assert pixels(to_mode(decoded, 1)) == [[0, 100, 255]]
    assert pixels(to_mode(decoded, 3)) == [[[0, 0, 0], [100, 100, 100], [255, 255, 255]]]


def test_greyscale_with_alpha_is_composited_on_white():
    la = np.array([[[50, 0], [50, 255]]], dtype=np.uint8)
    decoded = open_image(encode(Image.fromarray(la, "LA"), "PNG"))
    assert decoded.mode == "LA"
    assert pixels(to_mode(decoded, 1)) == [[255, 50]]


def palette_image() -> Image.Image:
    image = Image.new("P", (2, 1), 0)
    image.putpalette([0, 0, 0, *RED] + [0] * (256 * 3 - 6))
    image.putpixel((1, 0), 1)
    return image


@pytest.mark.parametrize("fmt", ["PNG", "GIF"])
def test_palette_transparency_becomes_white(fmt):
    decoded = open_image(encode(palette_image(), fmt, transparency=0))
    assert decoded.mode == "P"
    assert pixels(to_mode(decoded, 3)) == [[list(WHITE), list(RED)]]


def test_palette_without_transparency_keeps_its_colours():
    decoded = open_image(encode(palette_image(), "PNG"))
    assert pixels(to_mode(decoded, 3)) == [[[0, 0, 0], list(RED)]]


def test_greyscale_with_a_transparent_value_becomes_white():
    grey = Image.fromarray(np.array([[0, 100]], dtype=np.uint8), "L")
    decoded = open_image(encode(grey, "PNG", transparency=0))
    assert pixels(to_mode(decoded, 1)) == [[255, 100]]


def test_rgb_with_a_transparent_colour_becomes_white():
    rgb = Image.fromarray(np.array([[[0, 0, 0], [10, 20, 30]]], dtype=np.uint8), "RGB")
    decoded = open_image(encode(rgb, "PNG", transparency=(0, 0, 0)))
    assert pixels(to_mode(decoded, 3)) == [[list(WHITE), [10, 20, 30]]]


def test_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (4, 4), RED), Image.new("RGB", (4, 4), BLUE)]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    assert Image.open(io.BytesIO(data)).n_frames == 2
    assert to_mode(open_image(data), 3).getpixel((0, 0)) == RED


@pytest.mark.parametrize("fmt", ["JPEG", "TIFF"])
def test_cmyk_becomes_rgb(fmt):
    decoded = open_image(encode(Image.new("CMYK", (4, 4), (0, 255, 255, 0)), fmt))
    assert decoded.mode == "CMYK"
    assert to_mode(decoded, 3).getpixel((0, 0)) == RED


def test_16_bit_greyscale_is_scaled_not_clipped():
    values = np.array([[0, 4000, 32768, 65535]], dtype=np.uint16)
    decoded = open_image(encode(Image.fromarray(values), "PNG"))
    assert decoded.mode.startswith("I")
    # v / 65535 * 255, rounded: clipping would give [0, 255, 255, 255]
    assert pixels(to_mode(decoded, 1)) == [[0, 16, 128, 255]]
    assert pixels(to_mode(decoded, 3))[0][2] == [128, 128, 128]


def rotated_jpeg(width: int, height: int) -> bytes:
    """A JPEG stored ``width`` x ``height``, left half red and right half blue, whose EXIF says rotate 90° CW."""
    image = Image.new("RGB", (width, height), BLUE)
    image.paste(RED, (0, 0, width // 2, height))
    exif = image.getexif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    return encode(image, "JPEG", exif=exif.tobytes(), quality=95)


def assert_red_above_blue(top: tuple, bottom: tuple) -> None:
    """The stored left (red) half is the top half once displayed."""
    assert top[0] > 200 and top[2] < 60
    assert bottom[2] > 200 and bottom[0] < 60


def test_exif_orientation_is_applied():
    decoded = open_image(rotated_jpeg(8, 4))
    assert decoded.size == (4, 8)
    assert_red_above_blue(decoded.getpixel((2, 1)), decoded.getpixel((2, 6)))


@pytest.mark.parametrize("fmt,options", [("WEBP", {"lossless": True}), ("BMP", {}), ("TIFF", {})])
def test_other_formats_decode_exactly(fmt, options):
    array = np.array([[[10, 20, 30], [40, 50, 60]], [[70, 80, 90], [250, 251, 252]]], dtype=np.uint8)
    decoded = open_image(encode(Image.fromarray(array, "RGB"), fmt, **options))
    assert pixels(to_mode(decoded, 3)) == array.tolist()


def test_open_image_reads_paths_and_file_objects(tmp_path):
    data = encode(Image.new("RGB", (3, 2), RED), "PNG")
    path = tmp_path / "red.png"
    path.write_bytes(data)
    for source in (path, str(path), io.BytesIO(data), data, bytearray(data)):
        image = open_image(source)
        assert image.size == (3, 2) and image.getpixel((0, 0)) == RED


# ---------------------------------------------------------------------------------------------
# The evaluation transform


def test_to_uint8_resizes_to_a_square_channels_first_tensor():
    out = to_uint8(Image.new("RGB", (30, 10), RED), image_size=16, num_channels=3)
    assert out.dtype == torch.uint8 and out.shape == (3, 16, 16)
    assert out[:, 8, 8].tolist() == list(RED)


def test_to_uint8_greyscale_has_one_channel():
    out = to_uint8(Image.new("RGB", (16, 16), (255, 255, 255)), image_size=16, num_channels=1)
    assert out.shape == (1, 16, 16) and int(out.min()) == 255


def test_to_uint8_keeps_an_image_of_the_right_size_untouched():
    array = np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    out = to_uint8(Image.fromarray(array, "RGB"), image_size=8, num_channels=3)
    assert torch.equal(out, torch.from_numpy(array).permute(2, 0, 1))


def test_normalize_uses_per_channel_mean_and_std():
    batch = torch.tensor([0, 255, 51], dtype=torch.uint8).view(1, 3, 1, 1)
    out = normalize(batch, mean=(0.0, 0.5, 0.2), std=(1.0, 0.5, 0.1))
    assert out.dtype == torch.float32
    assert torch.allclose(out.flatten(), torch.tensor([0.0, 1.0, 0.0]), atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Inputs that are not usable images


def test_text_is_not_an_image():
    assert "is not an image" in error_of(b"hello, I am a text file\n", name="notes.txt")


def test_empty_bytes():
    assert "is empty" in error_of(b"", name="empty.png")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_image(fmt):
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    data = encode(Image.fromarray(noise, "RGB"), fmt)
    message = error_of(data[: len(data) // 2], name=f"photo.{fmt.lower()}")
    assert "truncated or corrupt" in message and f"photo.{fmt.lower()}" in message


def test_decompression_bomb_in_pils_warning_range(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    data = encode(Image.new("RGB", (40, 40)), "PNG")  # 1600 px: over the limit, under twice it
    assert "too large to decode safely" in error_of(data, name="big.png")


def test_decompression_bomb_in_pils_error_range(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    data = encode(Image.new("RGB", (50, 50)), "PNG")  # 2500 px: over twice the limit
    assert "too large to decode safely" in error_of(data, name="huge.png")


def test_a_jpeg_in_pils_warning_range_passes_when_its_reduced_decode_is_under_the_limit(monkeypatch):
    """Issue 20, item 9: a comment said 100-MP JPEGs pass (they are decoded reduced), yet PIL's warning for 89 to
    179 M pixels refused them before any reduction; the limit now applies to the pixels actually decoded."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    data = encode(Image.new("RGB", (40, 40), BLUE), "JPEG")  # 1600 px: over the limit, under twice it
    assert open_image(data, max_side=16).size == (16, 16)  # decoded at half size: 400 px
    assert "too large to decode safely (over 1,000 pixels)" in error_of(data, name="big.jpg")  # decoded whole
    assert "too large to decode safely (over 2,000 pixels)" in error_of(  # PIL's hard limit, for JPEGs too
        encode(Image.new("RGB", (50, 50)), "JPEG"), name="huge.jpg")


def test_a_108_megapixel_photo_uploads():
    data = encode(Image.new("L", (12_000, 9_000), 128), "JPEG")  # a phone's 108-MP sensor: 1.3 MB
    assert open_image(data, name="phone.jpg", max_pixels=UPLOAD_MAX_PIXELS).size == (2048, 1536)


def test_image_under_the_pixel_limit_is_fine(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    assert open_image(encode(Image.new("RGB", (30, 30)), "PNG")).size == (30, 30)


def test_missing_path(tmp_path):
    message = error_of(tmp_path / "nope.png")
    assert "nope.png" in message and "no such file" in message


def test_folder_is_not_an_image(tmp_path):
    assert "is not a file" in error_of(tmp_path)


def test_pil_warnings_do_not_reach_the_user(monkeypatch):
    real_open = Image.open

    def open_with_warning(*args, **kwargs):
        warnings.warn("Corrupt EXIF data", UserWarning, stacklevel=2)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(Image, "open", open_with_warning)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        open_image(encode(Image.new("RGB", (2, 2)), "PNG"))
    assert caught == []


def test_normalize_builds_its_channel_tensors_once_per_statistics_and_device():
    from vit.core.images import _channel_tensors

    batch = torch.full((2, 3, 2, 2), 51, dtype=torch.uint8)
    first = normalize(batch, [0.1, 0.2, 0.3], [0.5, 0.5, 0.5])  # a list is accepted as before
    hits = _channel_tensors.cache_info().hits
    again = normalize(batch, (0.1, 0.2, 0.3), (0.5, 0.5, 0.5))
    assert _channel_tensors.cache_info().hits == hits + 1
    assert torch.equal(first, again)
    assert torch.allclose(again[:, 0], torch.full((2, 2, 2), (0.2 - 0.1) / 0.5))


# ---------------------------------------------------------------------------------------------
# Big images cost what display and model need, not what the file declares


def test_large_images_are_reduced_to_max_side_at_decode():
    decoded = open_image(encode(Image.new("RGB", (3000, 1500), RED), "PNG"))
    assert decoded.size == (MAX_SIDE, MAX_SIDE // 2)
    assert decoded.getpixel((100, 100)) == RED


def test_images_up_to_max_side_keep_their_size():
    assert open_image(encode(Image.new("RGB", (MAX_SIDE, 700)), "PNG")).size == (MAX_SIDE, 700)


def test_max_side_is_enough_for_a_1024_px_model_input():
    assert MAX_SIDE >= 2048


def test_large_jpegs_are_decoded_at_a_reduced_scale(monkeypatch):
    from PIL import JpegImagePlugin

    loaded = []
    real_load = JpegImagePlugin.JpegImageFile.load

    def spy(self):
        loaded.append(self.size)  # the size the decoder fills, after draft()
        return real_load(self)

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "load", spy)
    decoded = open_image(encode(Image.new("RGB", (8192, 4096), BLUE), "JPEG"))
    assert loaded and loaded[0] == (2048, 1024), "decoded at a quarter of its size by the JPEG decoder"
    assert decoded.size == (MAX_SIDE, MAX_SIDE // 2)


def test_exif_orientation_survives_the_reduction():
    decoded = open_image(rotated_jpeg(4000, 2000))
    assert decoded.size == (MAX_SIDE // 2, MAX_SIDE)
    assert_red_above_blue(decoded.getpixel((500, 100)), decoded.getpixel((500, 1900)))


def test_pixel_limit_refuses_an_image_before_decoding_it(monkeypatch):
    from PIL import ImageFile

    data = encode(Image.new("RGB", (100, 60)), "PNG")
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: pytest.fail("the image was decoded"))
    message = error_of(data, name="poster.png", max_pixels=5_000)
    assert "poster.png is too large (100×60 px; at most 5,000 pixels)" in message


def test_upload_pixel_limit_is_well_under_pils_own():
    # PIL refuses at 2 x 89 M pixels and only warns from 89 M: a 9,400 x 9,400 PNG (265 MB decoded) passed.
    assert UPLOAD_MAX_PIXELS <= 40_000_000 < 9_400 * 9_400


def test_a_197_byte_40000x1_png_is_refused_before_it_is_decoded(monkeypatch):
    """Its shape, not its size, is the bomb: resized to a 256-px short side it would be 10 G pixels."""
    import io

    from vit.core.images import MAX_ASPECT, ImageError, open_image

    buffer = io.BytesIO()
    Image.new("L", (40000, 1)).save(buffer, format="PNG", optimize=True)
    assert len(buffer.getvalue()) < 1000
    monkeypatch.setattr(Image.Image, "load", lambda self: pytest.fail("the pixels were decoded"))
    with pytest.raises(ImageError, match=f"more than {MAX_ASPECT} times as long as it is wide") as error:
        open_image(buffer.getvalue(), name="bomb.png")
    assert "\n" not in str(error.value)


def test_shapes_up_to_the_aspect_limit_and_single_pixels_open():
    import io

    from vit.core.images import MAX_ASPECT, open_image

    for size in ((MAX_ASPECT, 1), (1, 1), (3, 2)):
        buffer = io.BytesIO()
        Image.new("RGB", size).save(buffer, format="PNG")
        assert open_image(buffer.getvalue()).size == size


def test_a_resize_that_would_exceed_the_pixel_bound_is_refused_before_resizing():
    from vit.core.images import MAX_RESIZED_PIXELS, ImageError, resized_size

    assert resized_size((640, 480), 256, "shortest_edge") == (341, 256)
    with pytest.raises(ImageError, match=f"at most {MAX_RESIZED_PIXELS:,} pixels"):
        resized_size((2048, 32), 1024, "shortest_edge")  # would be 65,536 x 1,024


def test_decodes_that_overlap_in_two_threads_leave_the_warning_filters_as_they_were(monkeypatch):
    """Sessions decode uploads at once, and the warning filters are the process's: each decode kept the filters it
    found and put them back, so of two that overlapped (the first ended before the second) the second put back the
    first's "ignore", and every warning of the server was gone from then on."""
    import threading

    from vit.core import images

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="PNG")
    before = list(warnings.filters)
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    decode, seen = images._decode, []

    def paced(*args, **kwargs):
        if not first_in.is_set():  # the first decode: waits for the second to start
            first_in.set()
            second_in.wait(10)
        else:  # the second: waits for the first to end, then looks
            second_in.set()
            first_out.wait(10)
            seen.append(warnings.filters[0][0])  # still off for this one
        return decode(*args, **kwargs)

    monkeypatch.setattr(images, "_decode", paced)

    def first():
        images.open_image(buffer.getvalue(), "a.png")
        first_out.set()

    threads = [threading.Thread(target=first), threading.Thread(target=lambda: (first_in.wait(10), images.open_image(
        buffer.getvalue(), "b.png")))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == ["ignore"]
    assert list(warnings.filters) == before
