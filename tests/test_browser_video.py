"""A video model in a real browser (issue 65): a tiny random VideoMAE opened by path, an animated GIF uploaded, the
time slider moved by keyboard and a patch clicked on the shown frame, which makes it the query of every frame's
map. Its screenshot is the README's (docs/explorer-video.png, copied from test-artifacts/)."""

import pytest
from helpers import ARTIFACTS
from PIL import Image, ImageDraw
from test_browser_explorer import page, server, world  # noqa: F401 (fixtures)
from test_videomae import videomae_folder

pytestmark = [pytest.mark.browser, pytest.mark.slow]

FRAMES, SIDE = 8, 112  # 4 tubelets of 14 x 14 patches of 8 px


def moving_square_gif(path, count: int = 16, side: int = 160):
    """A white square crossing a dark gradient: a clip in which something moves."""
    frames = []
    for i in range(count):
        frame = Image.linear_gradient("L").resize((side, side)).convert("RGB").point(lambda v: v // 3)
        x = 10 + i * (side - 50) // (count - 1)
        ImageDraw.Draw(frame).rectangle([x, side // 2 - 20, x + 40, side // 2 + 20], fill=(250, 250, 250))
        frames.append(frame)
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=80, loop=0)
    return path


def test_a_clip_with_its_time_slider_and_a_clicked_patch_in_a_real_browser(server, page, tmp_path):  # noqa: F811
    pytest.importorskip("transformers")
    videomae_folder(tmp_path / "videomae", FRAMES, SIDE, SIDE, classes=3)
    clip = moving_square_gif(tmp_path / "square.gif")
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        page.goto(server)
        page.get_by_text("Colours span").wait_for()
        field = page.get_by_role("textbox", name="Open a path")
        field.fill(str(tmp_path / "videomae"))
        field.press("Enter")
        page.get_by_text("Upload a clip in the sidebar").wait_for()
        page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(clip))
        page.get_by_text("Uniform sampling of 8 frames over 16: frames 0, 2, 4, 6, 8, 10, 12, 14").wait_for()
        page.get_by_text("Sampled frame 1 of 8").wait_for()
        page.wait_for_function("Array.from(document.querySelectorAll('[data-testid=\"stImage\"] img'))"
                               ".filter(img => img.complete && img.naturalWidth > 0).length >= 8")  # the strip

        thumb = page.get_by_role("slider", name="Frame")
        thumb.focus()
        for _ in range(4):
            thumb.press("ArrowRight")
        page.get_by_text("Sampled frame 5 of 8 (frame 8 of square.gif)").wait_for()

        # a click on the shown frame's patch in row 8, col 11 of 14 x 14: the query of every frame's map
        picker = page.locator('[data-testid="stPlotlyChart"] .nsewdrag').first
        box = picker.bounding_box()
        page.mouse.click(box["x"] + box["width"] * 10.5 / 14, box["y"] + box["height"] * 7.5 / 14)
        page.get_by_text("query frame 5, row 8, col 11").wait_for()
        page.wait_for_timeout(500)  # the strip's images redrawn
    finally:
        page.screenshot(path=str(ARTIFACTS / "explorer-video.png"), full_page=True)
