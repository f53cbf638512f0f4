"""A whole SAM in a real browser (issue 81): a click on the shipped sample photo gives the masks and the mask
decoder's attention, the point is the image pixel clicked (x from the left, y from the top), and the link opens the
same masks in a fresh session. Screenshots in test-artifacts/."""

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from helpers import ARTIFACTS, chromium
from test_browser_explorer import TIMEOUT_MS, server, world  # noqa: F401 (fixtures)
from test_browser_share import settled
from test_sam_prompts import _sam

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PHOTO = Path(__file__).resolve().parent.parent / "checkpoints" / "samples" / "cifar10-cifar-s" / "cat_1.png"
CANVAS = 56 * 32 / 48  # SAM's canvas in the photo's pixels: its 32 px resized to 48, padded to 56


def masks_shown(page) -> list[str]:
    page.get_by_text("mask 3 · predicted IoU").wait_for()
    return sorted(page.get_by_text("· predicted IoU").all_inner_texts())


def test_a_click_on_the_sample_photo_shows_the_masks_and_the_decoders_attention_and_the_link_reopens_them(
        server, tmp_path):  # noqa: F811
    if not PHOTO.exists():
        pytest.skip("the shipped CIFAR-10 sample photo is missing")
    model, processor = _sam()
    folder = tmp_path / "sam"
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    ARTIFACTS.mkdir(exist_ok=True)
    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1500, "height": 1400}).new_page()
        page.set_default_timeout(TIMEOUT_MS)
        try:
            page.goto(server)
            page.get_by_text("Colours span").wait_for()
            field = page.get_by_role("textbox", name="Open a path")
            field.fill(str(folder))
            field.press("Enter")
            page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(PHOTO))
            page.get_by_text("Click the image to add a point", exact=False).wait_for()
            settled(page)
            picker = page.locator(".st-key-sam_picker .nsewdrag").first
            picker.scroll_into_view_if_needed()
            box = picker.bounding_box()
            # the photo's pixel (24, 8): right of the centre, near the top; read as (8, 24) it is left and low
            page.mouse.click(box["x"] + box["width"] * 24 / CANVAS, box["y"] + box["height"] * 8 / CANVAS)
            shown = masks_shown(page)
            page.get_by_text("What the decoder looked at").wait_for()
            page.get_by_text("final, token to image attention, the mean of the heads", exact=False).wait_for()
            settled(page)
            link = page.url
            assert parse_qs(urlsplit(link).query)["points"] == ["24,8,1"]
            page.get_by_text("What the decoder looked at").scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "explorer-sam-prompt.png"))

            fresh = browser.new_context(viewport={"width": 1500, "height": 1400}).new_page()
            fresh.set_default_timeout(TIMEOUT_MS)
            fresh.goto(link)
            assert masks_shown(fresh) == shown
            fresh.get_by_text("final, token to image attention, the mean of the heads", exact=False).wait_for()
            assert parse_qs(urlsplit(fresh.url).query)["points"] == ["24,8,1"]
            fresh.get_by_text("mask 1 · predicted IoU").scroll_into_view_if_needed()
            fresh.screenshot(path=str(ARTIFACTS / "explorer-sam-prompt-link.png"))
        finally:
            page.screenshot(path=str(ARTIFACTS / "explorer-sam-prompt-last.png"), full_page=True)
