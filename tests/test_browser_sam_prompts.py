"""A whole SAM in a real browser (issue 81): a click on the shipped sample photo gives the masks and the mask
decoder's attention, the point is the image pixel clicked (x from the left, y from the top), and the link opens the
same masks in a fresh session; a box dragged over the photo gives the masks ``vit.segment`` gives for that box, and
the link keeps the box. Screenshots in test-artifacts/."""

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from browser_tabs import new_tab
from helpers import ARTIFACTS, chromium, shared_tab
from test_browser_explorer import TIMEOUT_MS, server, world  # noqa: F401 (fixtures)
from test_browser_share import settled
from test_sam_prompts import _sam

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PHOTO = Path(__file__).resolve().parent.parent / "checkpoints" / "samples" / "cifar10-cifar-s" / "cat_1.png"
CANVAS = 56 * 32 / 48  # SAM's canvas in the photo's pixels: its 32 px resized to 48, padded to 56


def masks_shown(page) -> list[str]:
    page.get_by_text("mask 3 · predicted IoU").wait_for()
    return sorted(page.get_by_text("· predicted IoU").all_inner_texts())


def saved_sam(tmp_path) -> Path:
    """The tiny random SAM of tests/test_sam_prompts.py saved whole with its processor."""
    if not PHOTO.exists():
        pytest.skip("the shipped CIFAR-10 sample photo is missing")
    model, processor = _sam()
    folder = tmp_path / "sam"
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    ARTIFACTS.mkdir(exist_ok=True)
    return folder


def open_on_photo(page, server, folder) -> None:  # noqa: F811
    """The explorer on ``folder``'s SAM with the sample photo uploaded, its Prompts section drawn."""
    page.goto(server)
    page.get_by_text("Colours span").wait_for()
    field = page.get_by_role("textbox", name="Open a path")
    field.fill(str(folder))
    field.press("Enter")
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(PHOTO))
    page.get_by_text("Click the image to add a point", exact=False).wait_for()
    settled(page)


def picker_box(page) -> dict:
    """The prompt figure's plotting area on the screen (its axes span the canvas: the photo and SAM's padding)."""
    picker = page.locator(".st-key-sam_picker .nsewdrag").first
    picker.scroll_into_view_if_needed()
    return picker.bounding_box()


def test_a_click_and_a_box_on_the_sample_photo_show_their_masks_and_attention_and_their_links_reopen_them(
        server, tmp_path):  # noqa: F811
    """Long (~20 s of CPU) because a SAM is saved and opened on the server, its image encoder run on the photo, and
    the page and each prompt's link drawn in a real Chromium (three page loads).

    A click on the photo: the masks and the decoder's attention, the point the pixel clicked, and the link opens the
    same masks in a fresh session. Then, on the same page, the prompt cleared and a box dragged: the masks
    ``vit.segment`` gives for that box, and the link keeps the box. The box was a test of its own, which loaded the
    page, opened the SAM and encoded the photo again (issue 112)."""
    import vit
    from vit.app.sam_prompt_view import mask_caption

    folder = saved_sam(tmp_path)
    x0, y0, x1, y1 = 6, 4, 28, 20  # in the photo's pixels: wider than tall, so read as (y, x) it is another box
    expected = vit.segment(vit.load(folder, device="cpu"), PHOTO, box=(x0, y0, x1, y1))
    total = 32 * 32
    captions = sorted(mask_caption(i, float(s), int(expected.masks[i].sum()), total, i == expected.mask)
                      for i, s in enumerate(expected.scores))
    with chromium() as browser:
        page = shared_tab(browser, {"width": 1500, "height": 1400})
        page.set_default_timeout(TIMEOUT_MS)
        try:
            open_on_photo(page, server, folder)
            box = picker_box(page)
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

            fresh = new_tab(page, TIMEOUT_MS)  # a new session, drawn by page's renderer (tests/browser_tabs.py)
            fresh.goto(link)
            assert masks_shown(fresh) == shown
            fresh.get_by_text("final, token to image attention, the mean of the heads", exact=False).wait_for()
            assert parse_qs(urlsplit(fresh.url).query)["points"] == ["24,8,1"]
            fresh.get_by_text("mask 1 · predicted IoU").scroll_into_view_if_needed()
            fresh.screenshot(path=str(ARTIFACTS / "explorer-sam-prompt-link.png"))
            fresh.close()
        finally:
            page.screenshot(path=str(ARTIFACTS / "explorer-sam-prompt-last.png"), full_page=True)

        try:  # the prompt cleared, then a box dragged over the photo
            page.get_by_role("button", name="Clear the prompt").click()
            page.get_by_text("mask 1 · predicted IoU").wait_for(state="detached")  # the point's masks are gone
            page.get_by_text("drags a box").click()
            settled(page)
            area = picker_box(page)

            def at(x, y):  # the screen point over the photo's pixel (x, y)
                return area["x"] + area["width"] * x / CANVAS, area["y"] + area["height"] * y / CANVAS

            page.mouse.move(*at(x0, y0))
            page.mouse.down()
            page.mouse.move(*at((x0 + x1) / 2, (y0 + y1) / 2), steps=5)
            page.mouse.move(*at(x1, y1), steps=5)
            page.mouse.up()
            assert masks_shown(page) == captions
            page.get_by_text(f"the box ({x0}, {y0}) to ({x1}, {y1})", exact=False).wait_for()
            page.get_by_text("final, token to image attention, the mean of the heads", exact=False).wait_for()
            settled(page)
            query = parse_qs(urlsplit(page.url).query)
            assert query["box"] == [f"{x0},{y0},{x1},{y1}"] and "points" not in query
            page.get_by_text("mask 1 · predicted IoU").scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "explorer-sam-box.png"))

            fresh = new_tab(page, TIMEOUT_MS)
            fresh.goto(page.url)
            assert masks_shown(fresh) == captions
            fresh.get_by_text(f"the box ({x0}, {y0}) to ({x1}, {y1})", exact=False).wait_for()
            assert parse_qs(urlsplit(fresh.url).query)["box"] == [f"{x0},{y0},{x1},{y1}"]
            fresh.close()
        finally:
            page.screenshot(path=str(ARTIFACTS / "explorer-sam-box-last.png"), full_page=True)
