"""Ask the VLM in a real browser (issue 80, item 4): ``streamlit run app.py`` in headless Chromium opens a tiny LLaVA
saved whole (test_vlm_answer's builder), a question is typed, the answer's second token clicked and head 2 picked; the
map the page shows (its exported values) is ``VLMAnswer.attention`` of that token, layer and head; the page's link,
opened in a fresh page, shows the same map, and there the knockout and the heads grid, switched on, show the API's
values and a head clicked in the grid draws its map. Then a second image is uploaded for the question (issue 92,
item 2) and picked: the map is the token's on that image, and the link reproduces it; and a clip, on a Qwen2.5-VL,
its second slice picked on the time slider."""

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import chromium, click_until
from shared_app import ask_the_vlm

pytestmark = [pytest.mark.browser, pytest.mark.slow]
pytest.importorskip("transformers")
from test_vlm_answer import QUESTION, _build, noisy, picture  # noqa: E402

import vit  # noqa: E402

TIMEOUT_MS = 240_000  # the tower and the whole VLM load on two busy cores
LENGTH = 4


@pytest.fixture(scope="module")
def server(local_app, llava, tmp_path_factory):
    """The app server the browser modules share (tests/shared_app.py: no token) and its tiny LLaVA saved whole, for
    the module's tests, each in sessions of its own: a server's start and the LLaVA's build and first load in it are
    paid once, not per test or per module (issue 112); and the photo the questions are about."""
    photo = tmp_path_factory.mktemp("ask_vlm") / "photo.png"
    picture().save(photo)
    return local_app.url, llava, photo


def exported_map(page, tmp_path: Path, name: str) -> np.ndarray:
    """The values of the map the page shows, from its "Export this answer (HTML)" (each patch's hovered value)."""
    with page.expect_download() as download:
        page.get_by_role("button", name="Export this answer (HTML)").click()
    path = tmp_path / name
    path.write_bytes(Path(download.value.path()).read_bytes())
    html = path.read_text(encoding="utf-8")
    [body] = re.findall(r'Plotly\.newPlot\(\s*"map",\s*(\[.*?\]),\s*\{', html, flags=re.S)
    [points] = json.loads(body)
    data = points["customdata"]
    if isinstance(data, dict):  # Plotly 6: base64 of the array's bytes
        data = np.frombuffer(base64.b64decode(data["bdata"]), dtype=data["dtype"])
    return np.asarray(data, dtype=np.float32)


def exported_settings(page, tmp_path: Path, name: str) -> dict[str, str]:
    """The settings table of the page's "Export this answer (HTML)": label -> value, as the export writes them."""
    import html as markup

    with page.expect_download() as download:
        page.get_by_role("button", name="Export this answer (HTML)").click()
    text = Path(download.value.path()).read_text(encoding="utf-8")
    (tmp_path / name).write_text(text, encoding="utf-8")
    return {markup.unescape(k): markup.unescape(v) for k, v in re.findall(r"<th>(.*?)</th><td>(.*?)</td>", text)}


def answer_tokens(main):
    """The answer's tokens, its pills (one choice), once all ``LENGTH`` are drawn: the caption of the first token's
    map can be drawn before them (``count()`` does not wait; ``wait_for`` is cheaper than ``expect``'s polls,
    tests/helpers.py)."""
    tokens = main.locator('[data-testid="stButtonGroup"]').get_by_role("radio")
    tokens.nth(LENGTH - 1).wait_for()
    assert tokens.count() == LENGTH, tokens.all_inner_texts()
    return tokens


def knockout_and_heads_grid(page, main, answer, curve, sums, tmp_path: Path) -> None:
    """On ``page`` (the answer's second token drawn, at the last layer), the knockout over the whole image and the
    heads grid switched on: their exported values are ``curve``'s and ``sums``'s, the link names both, and layer 1's
    head 2 clicked in the grid draws its map."""
    main.get_by_text("Knock out the token's attention to the image").click()
    main.get_by_text("blocked in each window of layers").wait_for()
    main.get_by_text("The heads that ground the token").click()
    main.get_by_text("Localization heads, best first").wait_for()
    page.wait_for_function("() => window.location.search.includes('lm_heads=1')")
    link = page.evaluate("() => window.location.href")
    assert "lm_knockout=1" in link and "answer_token=2" in link and "lm_kbox" not in link
    settings = exported_settings(page, tmp_path, "inside.html")
    # A head clicked in the grid draws its map: layer 1's row, head 2's cell (the grid's columns, the layer's
    # and each head's, share its width alike; its header row and each body row are 35 px high).
    grid = main.locator('[data-testid="stDataFrame"]').last

    def head_2(ms):
        grid.scroll_into_view_if_needed(timeout=ms)  # a click lands only within the viewport
        box = grid.bounding_box(timeout=ms)
        page.mouse.click(box["x"] + box["width"] * 2.5 / (answer.heads + 1), box["y"] + 35 + 17, delay=50)

    click_until(head_2, main.get_by_text(re.compile(r"Answer token 2 “.*layer 1 of the language model, head 2")),
                40_000, (page, tmp_path / "grid.png"), attempt_ms=10_000)
    page.wait_for_function("() => window.location.search.includes('lm_layer=1')")  # it was layer 2, head 2
    np.testing.assert_allclose(exported_map(page, tmp_path, "head.html"), answer.attention(1, 0, 1).ravel(),
                               rtol=0, atol=1e-6)
    shown = [float(settings[f"Knockout, layer {n + 1}"].split("%")[0]) / 100 for n in range(answer.layers)]
    np.testing.assert_allclose(shown, curve.probability, rtol=0, atol=1e-6)  # written to 4 decimals of a percent
    assert f"{curve.baseline:.4%}" in settings["Knockout"]
    grid = [[float(v.rstrip("%")) / 100 for v in settings[f"Heads' attention on the image, layer {n + 1}"].split(", ")]
            for n in range(answer.layers)]
    np.testing.assert_allclose(grid, sums, rtol=0, atol=1e-4)  # written to 2 decimals of a percent


def test_a_question_a_clicked_token_and_its_link_show_vlm_answer_attention(server, tmp_path):
    """Long (~43 s of CPU) because its scenario is three page loads in a real Chromium (the question, its link, the
    second image's link), each ~4 s of Chromium's CPU (bench/results/cpu-2026-11-29e/browser-cache-per-context.txt),
    and a LLaVA's answers, knockout and heads grid on the server and in the test, the references.

    On the link's page (a fresh session on the clicked token), the knockout over the whole image and the heads grid
    switched on: the curve's and the grid's values the page exports are ``VLMAnswer.knockout(1, windows=1)``'s (held
    to a knockout by hand on transformers' eager attention in test_vlm_knockout) and
    ``VLMAnswer.grounding_heads(1)``'s attention sums (held to the authors' code in test_vlm_heads), and the link
    names both; a head clicked in the grid draws that head's map (``VLMAnswer.attention`` at its layer and head).
    These were a test of their own, which loaded the page and asked the question again (issue 112)."""
    url, folder, photo = server
    answer = vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=LENGTH)
    want = answer.attention(1, answer.layers - 1, 1)
    curve = answer.knockout(1, windows=1)
    sums = answer.grounding_heads(1).attention_sum
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1500, "height": 1100}, accept_downloads=True)
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        main = ask_the_vlm(page, url, folder, photo, QUESTION, LENGTH)
        main.get_by_text("Answer token 1 “").wait_for()  # the first token's map, with its caption
        tokens = answer_tokens(main)
        click_until(lambda ms: tokens.nth(1).click(timeout=ms), main.get_by_text("Answer token 2 “"), TIMEOUT_MS)
        main.get_by_role("combobox", name="Head").click()
        page.get_by_role("option", name="head 2", exact=True).click()
        main.get_by_text(re.compile(r"Answer token 2 “.*”\*?\*?, layer 2 of the language model, head 2")).wait_for()
        page.wait_for_function("() => window.location.search.includes('lm_head=2')")
        np.testing.assert_allclose(exported_map(page, tmp_path, "asked.html"), want.ravel(), rtol=0, atol=1e-6)
        link = page.evaluate("() => window.location.href")
        assert "answer_token=2" in link and "lm_layer=2" in link and "question=" in link

        again = context.new_page()  # the link in a fresh session: the upload is the server's, named in the link
        again.set_default_timeout(TIMEOUT_MS)
        again.goto(link)
        again_main = again.locator('[data-testid="stMain"]')
        again_main.get_by_text(re.compile(r"Answer token 2 “.*layer 2 of the language model, head 2")).wait_for()
        np.testing.assert_allclose(exported_map(again, tmp_path, "linked.html"), want.ravel(), rtol=0, atol=1e-6)
        knockout_and_heads_grid(again, again_main, answer, curve, sums, tmp_path)

        # A second image for the question, from the section's uploader: the answer is about both, and the clicked
        # token's map on the second image is VLMAnswer's for that image; the link keeps both and the image shown.
        second = tmp_path / "second.png"
        picture(70, 90).save(second)
        both = vit.ask_vlm(vit.open_vlm(folder), [picture(), picture(70, 90)], QUESTION, max_new_tokens=LENGTH)
        want_second = both.attention(1, both.layers - 1, 1, image=1)
        assert not np.allclose(want_second, both.attention(1, both.layers - 1, 1, image=0))
        more = main.locator('[data-testid="stFileUploader"]').filter(has_text="More images for the question")
        more.locator('input[type="file"]').set_input_files(str(second))
        main.get_by_text("2: second.png").click()  # the Image choice, once the answer about both is drawn
        main.get_by_text(re.compile(r"On image 2 of the question.s 2")).wait_for()
        page.wait_for_function("() => window.location.search.includes('lm_image=2')")
        np.testing.assert_allclose(exported_map(page, tmp_path, "second.html"), want_second.ravel(), rtol=0, atol=1e-6)
        link = page.evaluate("() => window.location.href")
        assert "more=" in link and "answer_token=2" in link and "lm_head=2" in link

        third = context.new_page()
        third.set_default_timeout(TIMEOUT_MS)
        third.goto(link)
        third.locator('[data-testid="stMain"]').get_by_text(re.compile(r"On image 2 of the question.s 2")).wait_for()
        np.testing.assert_allclose(exported_map(third, tmp_path, "linked-second.html"), want_second.ravel(), rtol=0,
                                   atol=1e-6)


def test_a_question_about_a_clip_draws_the_picked_slices_map_and_its_link_reproduces_it(server, tmp_path):
    """Long (~16 s of CPU) because a Qwen2.5-VL is built, asked here (the reference) and asked again on the server,
    in two page loads of a real Chromium.

    A clip (an animated GIF) for the question, from the section's second uploader, on a Qwen2.5-VL saved whole:
    the time slider's second slice picked (the token clicked before kept), then the answer's second token clicked,
    shows that token's map on that slice, ``VLMAnswer.attention`` of the same clip asked through ``vit.ask_vlm`` (its
    slices held to transformers' eager rows in test_vlm_clip); the page's link, opened in a fresh page, shows the
    same."""
    from test_app_ask_vlm import gif
    from test_vlm_clip import FRAMES

    url, _, photo = server
    folder = tmp_path / "qwen2_5_vl"
    torch.manual_seed(0)
    model, processor = _build("qwen2_5_vl")
    noisy(model).save_pretrained(folder, max_shard_size="20KB")
    processor.save_pretrained(folder)
    clip = tmp_path / "clip.gif"
    clip.write_bytes(gif(FRAMES))
    answer = vit.ask_vlm(vit.open_vlm(folder), video=clip, question=QUESTION, frames=4, max_new_tokens=LENGTH)
    want = answer.attention(1, answer.layers - 1, image=1)
    assert len(answer.layouts) == 2 and not np.allclose(want, answer.attention(1, answer.layers - 1, image=0))
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1500, "height": 1100}, accept_downloads=True)
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        main = ask_the_vlm(page, url, folder, photo, QUESTION, LENGTH, clip=clip, frames=4)
        main.get_by_text(re.compile(r"On slice 1 of the clip.s 2 \(its sampled frames 1–2\)")).wait_for()
        # The time slider's track clicked at its right end (the last slice), then the answer's second token.
        track = main.locator('[data-testid="stSlider"]').filter(has_text="Slice of the clip").locator(
            '[role="group"] > div').first

        def last_slice(ms):
            track.scroll_into_view_if_needed(timeout=ms)  # a click lands only within the viewport
            box = track.bounding_box(timeout=ms)
            page.mouse.click(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)

        click_until(last_slice, main.get_by_text(re.compile(r"Answer token 1 “.*On slice 2 of the clip.s 2 \(its "
                                                            r"sampled frames 3–4\)")), TIMEOUT_MS)
        tokens = answer_tokens(main)
        click_until(lambda ms: tokens.nth(1).click(timeout=ms),
                    main.get_by_text(re.compile(r"Answer token 2 “.*On slice 2 of the clip.s 2")), TIMEOUT_MS)
        page.wait_for_function("() => window.location.search.includes('answer_token=2')")
        page.wait_for_function("() => window.location.search.includes('lm_image=2')")
        np.testing.assert_allclose(exported_map(page, tmp_path, "clip.html"), want.ravel(), rtol=0, atol=1e-6)
        link = page.evaluate("() => window.location.href")
        assert "lm_clip=" in link and "lm_frames=4" in link

        again = context.new_page()
        again.set_default_timeout(TIMEOUT_MS)
        again.goto(link)
        again.locator('[data-testid="stMain"]').get_by_text(re.compile(r"On slice 2 of the clip.s 2")).wait_for()
        np.testing.assert_allclose(exported_map(again, tmp_path, "linked-clip.html"), want.ravel(), rtol=0, atol=1e-6)
