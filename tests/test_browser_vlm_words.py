"""A VLM tower's words in a real browser (issue 68): ``streamlit run app.py`` in headless Chromium opens a link to a
tiny LLaVA folder's word map; the photo uploaded, the page shows the word's visual logit lens under its caption, the
words' small maps, and a word the tokenizer cannot read as one line of plain text."""

from urllib.parse import urlencode

import pytest
import torch
from browser_tabs import opener, tabs
from helpers import chromium, click_until
from test_browser_explorer import expect_selected

pytestmark = [pytest.mark.browser, pytest.mark.slow]
pytest.importorskip("transformers")
from test_visual_lens import _build, noisy, picture, tiny_tokenizer  # noqa: E402

TIMEOUT_MS = 180_000  # the tower and transformers' tokenizer load on two busy cores


@pytest.fixture(scope="module")
def server(local_app, tmp_path_factory):
    """The shared app server (tests/shared_app.py: no token, so a local visitor may open a folder by its link) and
    one tiny LLaVA saved whole for the module's tests, each in sessions of its own: the LLaVA's build and first
    load are paid once, not per test (issue 112)."""
    tmp_path = tmp_path_factory.mktemp("vlm_words")
    folder = tmp_path / "llava"
    torch.manual_seed(0)
    model, processor = _build("llava")
    noisy(model).save_pretrained(folder, max_shard_size="20KB")
    processor.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    picture().save(tmp_path / "photo.png")
    return local_app.url, folder, tmp_path / "photo.png"


@pytest.fixture(scope="module")
def first():
    """The blank page the module's pages are tabs of (tests/browser_tabs.py: one renderer draws both)."""
    with chromium() as browser:
        yield opener(browser, viewport={"width": 1400, "height": 1000})


def test_a_link_to_a_words_lens_draws_it_and_an_unknown_word_is_one_line(server, first):
    """Long (~11 s of CPU) because it is the module's first on its server: the LLaVA folder and transformers'
    tokenizer load there, and the page is drawn in a real Chromium."""
    url, folder, photo = server
    link = {"model": str(folder), "map": "word_lens", "labels": "dog, hot dog", "word": "hot dog"}
    with tabs(first, TIMEOUT_MS) as tab:
        page = tab()
        page.goto(f"{url}?{urlencode(link)}")
        page.locator('[data-testid="stSidebar"] input[type="file"]').set_input_files(str(photo))
        caption = page.locator('[data-testid="stCaptionContainer"]').filter(has_text="Visual logit lens of “hot dog”")
        caption.wait_for()
        assert "of which 2 rows were read (192 bytes)" in caption.inner_text()
        page.get_by_text("Each word's visual logit lens on one colour range").wait_for()
        area = page.get_by_role("textbox", name="Words")
        area.fill("dog, *zebra*")
        area.press("Control+Enter")
        errors = page.locator('[data-testid="stAlertContentError"]')
        errors.filter(has_text="cannot encode '*zebra*'").first.wait_for()  # the asterisks shown, not italics
        assert page.locator('[data-testid="stAlertContentError"] em').count() == 0
        assert all("\n" not in text.strip() for text in errors.all_inner_texts())


def test_a_words_gradient_rollout_opens_on_the_centre_patch_and_a_click_picks_another(server, first):
    # Issue 76, item 1: gradient rollout draws one image token's row and has no "every image token" target; a LLaVA's
    # query defaulted to its CLS, which the projector leaves out, so the map opened on a red error.
    url, folder, photo = server
    link = {"model": str(folder), "map": "word_class", "labels": "dog, hot dog", "word": "hot dog"}
    with tabs(first, TIMEOUT_MS) as tab:
        page = tab()
        page.goto(f"{url}?{urlencode(link)}")
        page.locator('[data-testid="stSidebar"] input[type="file"]').set_input_files(str(photo))
        captions = page.locator('[data-testid="stCaptionContainer"]')
        errors = page.locator('[data-testid="stAlertContentError"]')
        rollout = captions.filter(has_text="Gradient rollout of “hot dog”'s lens score")
        rollout.or_(errors).first.wait_for()
        assert errors.count() == 0, errors.all_inner_texts()
        # The tiny LLaVA's 4 x 4 grid: the centre patch is row 3, col 3 (token 1 + 2 * 4 + 2 = 11), and the caption
        # says how to pick another.
        centre = rollout.filter(has_text="over the patch row 3, col 3 (outlined")
        centre.wait_for()
        assert "click another patch on the image" in centre.inner_text()
        expect_selected(page, "Query token", "11 · patch row 3, col 3", timeout_ms=TIMEOUT_MS)
        picker = page.locator('[data-testid="stPlotlyChart"]').first.locator(".nsewdrag").first
        box = picker.bounding_box()
        click_until(lambda ms: page.mouse.click(box["x"] + box["width"] * 0.5 / 4, box["y"] + box["height"] * 0.5 / 4),
                    rollout.filter(has_text="over the patch row 1, col 1 (outlined"), TIMEOUT_MS)
        assert errors.count() == 0, errors.all_inner_texts()
