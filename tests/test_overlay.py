"""Rendering: upsampling geometry, colour maps, blending, patch picking and downloads."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from vit.explain.views.overlay import (
    attentions_npz_bytes,
    colorize,
    draw_mask_contours,
    overlay,
    patch_at,
    patch_box,
    to_png_bytes,
    upsample,
)


def test_nearest_upsampling_gives_exact_blocks():
    grid = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    result = upsample(grid, (4, 6), mode="nearest")
    expected = np.array([[1, 1, 2, 2, 3, 3],
                         [1, 1, 2, 2, 3, 3],
                         [4, 4, 5, 5, 6, 6],
                         [4, 4, 5, 5, 6, 6]], dtype=np.float32)
    assert result.dtype == np.float32
    np.testing.assert_array_equal(result, expected)


def test_nearest_blocks_on_an_uneven_size_follow_patch_box():
    grid = np.arange(6, dtype=np.float32).reshape(2, 3)
    height, width = 23, 37
    result = upsample(torch.from_numpy(grid), (height, width), mode="nearest")
    assert result.shape == (23, 37)
    for patch in range(6):
        left, top, right, bottom = patch_box(patch, (width, height), (2, 3))
        assert (result[top:bottom, left:right] == patch).all()


def test_bilinear_keeps_constant_maps_and_puts_values_at_cell_centres():
    np.testing.assert_allclose(upsample(np.full((2, 3), 0.25), (20, 30)), 0.25, rtol=1e-6)
    grid = np.array([[0.0, 1.0]])
    result = upsample(grid, (2, 8), mode="bilinear")  # cells of 4 px; centres at x = 1.5 and 5.5
    np.testing.assert_allclose(result[0], [0, 0, 0.125, 0.375, 0.625, 0.875, 1, 1])


def test_bilinear_hits_each_patch_value_at_its_cell_centre_for_any_aspect_ratio():
    grid = np.random.default_rng(0).random((2, 3)).astype(np.float32)
    result = upsample(grid, (14, 33), mode="bilinear")  # cells of 7 x 11 px, centres at pixels (3, 5) + ...
    for r in range(2):
        for c in range(3):
            assert result[3 + 7 * r, 5 + 11 * c] == pytest.approx(grid[r, c], rel=1e-6)


def test_upsample_rejects_unknown_modes_and_non_2d_maps():
    with pytest.raises(ValueError, match="nearest, bilinear"):
        upsample(np.ones((2, 2)), (4, 4), mode="lanczos")
    with pytest.raises(ValueError, match="2-D"):
        upsample(np.ones((1, 2, 2)), (4, 4))


def test_colorize_is_rgb_not_bgr():
    values = np.array([[0.0, 1.0]])
    rgb = colorize(values, "Reds")
    assert rgb.dtype == np.uint8 and rgb.shape == (1, 2, 3)
    r, g, b = rgb[0, 1].astype(int)
    assert r > 100 and r > g + 50 and r > b + 50  # the top of 'Reds' is dark red
    r, g, b = colorize(values, "Blues")[0, 1].astype(int)
    assert b > r + 50 and b > g


def test_colorize_normalises_by_min_max_unless_given():
    ramp = np.array([[10.0, 20.0]])
    np.testing.assert_array_equal(colorize(ramp, "gray"), [[[0, 0, 0], [255, 255, 255]]])
    np.testing.assert_array_equal(colorize(ramp, "gray", vmin=0, vmax=40), colorize(np.array([[0.25, 0.5]]), "gray",
                                                                                     vmin=0, vmax=1))


def test_colorize_constant_map_does_not_divide_by_zero():
    with np.errstate(all="raise"):
        rgb = colorize(np.full((3, 4), 0.7), "gray")
    np.testing.assert_array_equal(rgb, 0)


def test_colorize_rejects_unknown_colour_maps():
    with pytest.raises(ValueError, match="unknown colour map"):
        colorize(np.zeros((2, 2)), "no-such-map")


def test_overlay_keeps_the_size_of_a_non_square_image():
    image = Image.new("RGB", (57, 31), (10, 20, 30))
    result = overlay(image, np.random.default_rng(0).random((4, 4)), show_grid=True, outline_patch=5)
    assert result.size == (57, 31) and result.mode == "RGB"


def test_overlay_with_opacity_zero_returns_the_image():
    pixels = np.random.default_rng(0).integers(0, 256, (21, 34, 3), dtype=np.uint8)
    image = Image.fromarray(pixels, "RGB")
    np.testing.assert_array_equal(np.asarray(overlay(image, np.eye(2), opacity=0.0)), pixels)


def test_overlay_with_opacity_one_is_the_colour_map_alone():
    image = Image.new("RGB", (8, 4), (0, 0, 0))
    result = np.asarray(overlay(image, np.array([[0.0, 1.0]]), opacity=1.0, colormap="gray", mode="nearest"))
    np.testing.assert_array_equal(result[:, :4], 0)
    np.testing.assert_array_equal(result[:, 4:], 255)


def test_overlay_blends_half_and_half():
    image = Image.new("RGB", (4, 4), (200, 100, 0))
    result = np.asarray(overlay(image, np.ones((2, 2)), opacity=0.5, colormap="gray"))  # constant: black
    np.testing.assert_array_equal(result, np.broadcast_to([100, 50, 0], (4, 4, 3)))


def test_overlay_converts_rgba_and_greyscale_images():
    rgba = Image.new("RGBA", (6, 6), (0, 0, 0, 0))  # transparent: composited on white
    result = np.asarray(overlay(rgba, np.zeros((2, 2)), opacity=0.0))
    np.testing.assert_array_equal(result, 255)
    assert overlay(Image.new("L", (6, 6), 50), np.zeros((3, 3))).mode == "RGB"


def test_overlay_draws_grid_lines_at_patch_borders_and_outlines_the_chosen_patch():
    image = Image.new("RGB", (9, 6), (0, 0, 0))
    result = np.asarray(overlay(image, np.zeros((2, 3)), opacity=0.0, show_grid=True, grid_color=(255, 0, 0)))
    for x in (3, 6):
        np.testing.assert_array_equal(result[:, x], np.broadcast_to([255, 0, 0], (6, 3)))
    np.testing.assert_array_equal(result[3], np.broadcast_to([255, 0, 0], (9, 3)))
    assert (result[:, [0, 1, 2, 4, 5, 7, 8]][[0, 1, 2, 4, 5]] == 0).all()

    outlined = np.asarray(overlay(image, np.zeros((2, 3)), opacity=0.0, outline_patch=5, outline_color=(0, 255, 0)))
    left, top, right, bottom = patch_box(5, (9, 6), (2, 3))  # (6, 3, 9, 6)
    assert (left, top, right, bottom) == (6, 3, 9, 6)
    border = np.zeros((6, 9), bool)
    border[top:bottom, left:right] = True
    border[top + 1:bottom - 1, left + 1:right - 1] = False
    assert (outlined[border] == [0, 255, 0]).all()
    assert (outlined[~border] == 0).all()


def test_a_pixel_map_is_drawn_pixel_by_pixel_with_its_patch_grids_lines_and_outline():
    # issue 90, item 3: a pixel method's (H, W) map on the model's input pixels, its patches 3 x 3 px on a 2 x 3 grid
    image = Image.new("RGB", (9, 6), (0, 0, 0))
    pixels = np.arange(54, dtype=np.float32).reshape(6, 9)
    heat = np.asarray(overlay(image, pixels, opacity=1.0, colormap="gray", grid=(2, 3)))
    np.testing.assert_array_equal(heat, colorize(pixels, "gray"))  # each pixel its own value, none a patch's
    lined = np.asarray(overlay(image, pixels, opacity=0.0, show_grid=True, grid_color=(255, 0, 0), grid=(2, 3)))
    assert (lined[:, 3] == [255, 0, 0]).all() and (lined[3] == [255, 0, 0]).all() and (lined[:3, 4] == 0).all()
    outlined = np.asarray(overlay(image, pixels, opacity=0.0, outline_patch=5, outline_color=(0, 255, 0),
                                  grid=(2, 3)))
    assert (outlined[3:6, 6] == [0, 255, 0]).all() and (outlined[:3] == 0).all()  # patch 5: (6, 3, 9, 6)


def test_overlay_rejects_opacity_out_of_range():
    with pytest.raises(ValueError, match="opacity"):
        overlay(Image.new("RGB", (4, 4)), np.zeros((2, 2)), opacity=1.5)


def test_patch_at_and_patch_box_round_trip_on_a_non_square_image():
    size, grid = (37, 23), (2, 3)  # (width, height); 2 rows, 3 columns
    seen = np.full((23, 37), -1)
    for patch in range(6):
        left, top, right, bottom = patch_box(patch, size, grid)
        assert left < right and top < bottom
        seen[top:bottom, left:right] = patch
        for y in range(top, bottom):
            for x in range(left, right):
                assert patch_at(x, y, size, grid) == patch
                assert patch_at(x + 0.9, y + 0.5, size, grid) == patch
    assert (seen >= 0).all()  # the boxes tile the image


def test_patch_at_is_row_major_and_clamps_to_the_image():
    size, grid = (300, 200), (2, 3)
    assert patch_at(0, 0, size, grid) == 0
    assert patch_at(299, 0, size, grid) == 2
    assert patch_at(0, 199, size, grid) == 3
    assert patch_at(150, 150, size, grid) == 4
    assert patch_at(-20, -5, size, grid) == 0
    assert patch_at(1e6, 1e6, size, grid) == 5
    assert patch_box(4, size, grid) == (100, 100, 200, 200)


def test_patch_box_rejects_patches_out_of_range():
    with pytest.raises(ValueError, match="out of range for a 2x3 grid"):
        patch_box(6, (30, 20), (2, 3))


def test_to_png_bytes_round_trips():
    image = Image.fromarray(np.arange(48, dtype=np.uint8).reshape(4, 4, 3), "RGB")
    data = to_png_bytes(image)
    assert data.startswith(b"\x89PNG")
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(data))), np.asarray(image))


def test_attentions_npz_holds_each_layer_as_float32_and_the_extras():
    layers = [torch.rand(2, 3, 5, 5, dtype=torch.float64), np.random.default_rng(0).random((3, 5, 5))]
    data = attentions_npz_bytes(layers, logits=torch.tensor([1.0, 2.0]), grid=np.array([2, 2]))
    with np.load(io.BytesIO(data)) as archive:
        assert sorted(archive.files) == ["grid", "layer_0", "layer_1", "logits"]
        assert archive["layer_0"].dtype == np.float32 and archive["layer_0"].shape == (2, 3, 5, 5)
        np.testing.assert_allclose(archive["layer_0"], layers[0].numpy(), rtol=1e-6)
        assert archive["layer_1"].shape == (3, 5, 5)
        np.testing.assert_array_equal(archive["logits"], [1.0, 2.0])


def test_attentions_npz_rejects_clashing_names_and_bad_shapes():
    with pytest.raises(ValueError, match="clash"):
        attentions_npz_bytes([np.ones((1, 2, 2))], layer_0=np.zeros(1))
    with pytest.raises(ValueError, match="layer 0"):
        attentions_npz_bytes([np.ones((2, 3))])


def test_overlay_on_a_given_range_uses_the_same_colours_for_the_same_values():
    image = Image.new("RGB", (4, 2), (0, 0, 0))
    low = overlay(image, np.array([[0.01, 0.02]]), 1.0, "gray", "nearest", vmin=0.0, vmax=1.0)
    # On 0..1 the values 0.01 and 0.02 are nearly black, not stretched to black and white.
    assert np.asarray(low).max() <= round(0.02 * 255) + 1
    own = overlay(image, np.array([[0.01, 0.02]]), 1.0, "gray", "nearest")
    assert np.asarray(own)[0, 0].tolist() == [0, 0, 0] and np.asarray(own)[0, 3].tolist() == [255, 255, 255]


def test_mask_contours_run_along_the_patch_borders_of_the_kept_region():
    image = Image.new("RGB", (8, 8), (0, 0, 0))
    mask = np.array([[True, False], [False, False]])  # the top-left 4 x 4 patch of a 2 x 2 grid
    drawn = np.asarray(draw_mask_contours(image, mask, color=(255, 0, 0), width=1))[..., 0] > 0
    expected = np.zeros((8, 8), dtype=bool)
    expected[0, 0:4] = expected[0:4, 0] = True  # image edge above and left of the patch
    expected[0:4, 4] = expected[4, 0:4] = True  # the borders with the dropped patches: their first pixels
    assert (drawn == expected).all(), drawn.astype(int)
    assert not np.asarray(draw_mask_contours(image, np.zeros((2, 2), bool))).any()


KILLED_MID_STREAM = """
import os, signal, sys
import numpy as np
from vit.explain.views.overlay import write_npz_streamed

def pieces():
    yield np.ones((2, 4), np.float32)
    sys.stdout.flush()
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))  # as a user's kill, mid-stream
    yield np.ones((2, 4), np.float32)

write_npz_streamed(sys.argv[1], [("layer_0", (4, 4), np.float32, pieces())])
"""


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_streamed_npz_killed_mid_stream_leaves_nothing(tmp_path, how):
    from peak_memory import run_forked  # forked from the measuring server: no torch imported again

    (tmp_path / "maps").mkdir()
    ended = run_forked(KILLED_MID_STREAM, [str(tmp_path / "maps" / "image.npz"), how], timeout=300)
    assert ended.returncode == -getattr(__import__("signal"), how), ended.stderr
    assert list((tmp_path / "maps").iterdir()) == []


def test_a_streamed_npz_replaces_the_file_only_when_complete(tmp_path):
    from vit.explain.views.overlay import write_npz_streamed

    path = tmp_path / "image.npz"
    np.savez(path, layer_0=np.zeros((1,)))
    write_npz_streamed(path, [("layer_0", (2, 3), np.float32, [np.arange(3), np.arange(3, 6)])],
                       labels=np.array(["a", "b"]))
    with np.load(path) as saved:
        np.testing.assert_array_equal(saved["layer_0"], np.arange(6, dtype=np.float32).reshape(2, 3))
        np.testing.assert_array_equal(saved["labels"], ["a", "b"])
    with pytest.raises(ValueError, match="5 values written for shape"):
        write_npz_streamed(path, [("layer_0", (2, 3), np.float32, [np.arange(5)])])
    with np.load(path) as saved:
        assert saved["layer_0"].shape == (2, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image.npz"]


def test_without_o_tmpfile_a_streamed_npz_is_written_beside_and_renamed(tmp_path, monkeypatch):
    import os

    from vit.explain.views.overlay import write_npz_streamed

    monkeypatch.delattr(os, "O_TMPFILE")  # as on macOS
    write_npz_streamed(tmp_path / "image.npz", [("layer_0", (2,), np.float16, [np.ones(2)])])
    with np.load(tmp_path / "image.npz") as saved:
        np.testing.assert_array_equal(saved["layer_0"], np.ones(2, np.float16))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image.npz"]


def test_a_rectangular_patch_maps_to_exactly_its_ph_x_pw_pixels_of_the_model_input():
    """vit-pytorch's patch_size=(2, 8) on image_size=(16, 64): patch (row 3, column 5) is input rows 6-7 and
    columns 40-47, and its map cell (drawn over the 64x16 input, or an image of that shape) covers exactly those."""
    from vit.checkpoint import Preprocessing
    from vit.core.inference import input_shape, preprocess
    from vit.model import ViT, ViTConfig

    config = ViTConfig(image_size=(16, 64), patch_size=(2, 8), num_classes=2, hidden_size=16, num_layers=1,
                       num_heads=2, mlp_size=16)
    model, pre = ViT(config).eval(), Preprocessing.default_for(config)
    image = Image.new("RGB", (320, 80))  # width x height, the model's aspect
    shape = input_shape(image, pre, config.patch_size)
    assert shape == (16, 64) == tuple(preprocess([image], pre).shape[-2:])
    grid = model.patch_grid(*shape)
    assert grid == (8, 8)
    patch = 3 * 8 + 5
    one_hot = np.zeros(grid)
    one_hot.flat[patch] = 1.0
    cell = upsample(one_hot, shape, mode="nearest")  # (16, 64)
    rows, cols = np.nonzero(cell)
    assert (rows.min(), rows.max(), cols.min(), cols.max(), len(rows)) == (6, 7, 40, 47, 2 * 8)
    assert patch_box(patch, (64, 16), grid) == (40, 6, 48, 8)
    assert patch_at(40.5, 6.5, (64, 16), grid) == patch_at(47.5, 7.5, (64, 16), grid) == patch
    # Over the original 320x80 image the same cell is 5x its 2x8 pixels.
    assert patch_box(patch, image.size, grid) == (200, 30, 240, 40)
