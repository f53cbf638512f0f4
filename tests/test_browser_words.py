"""Asking a CLIP in words in a real browser (issue 22): an open_clip model in the HF cache is opened by
``streamlit run app.py`` in headless Chromium on a real photo (the shipped cat sample), labels with Markdown and
HTML are typed, and the page shows the zero-shot bars, two labels' maps and their difference, with the labels as
text, fetching nothing they name."""

from pathlib import Path

import pytest
from helpers import chromium, shared_tab, streamlit_app
from test_prompts import save_open_clip

pytestmark = [pytest.mark.browser, pytest.mark.slow]
pytest.importorskip("open_clip")

TIMEOUT_MS = 180_000  # a CLIP and its text tower load on two busy cores
ROOT = Path(__file__).resolve().parent.parent
LABELS = ["<b>bold</b>", "![x](http://example.invalid/x.png)", "a cat"]
TICKS = '[data-testid="stPlotlyChart"] .ytick text'  # the charts' category labels


@pytest.fixture
def server(tmp_path):
    checkpoints, runs = tmp_path / "checkpoints", tmp_path / "runs"
    checkpoints.mkdir()
    runs.mkdir()
    model_dir = tmp_path / "hf-cache" / "models--someone--tiny-clip"
    save_open_clip(model_dir / "snapshots" / "rev1")
    (model_dir / "refs").mkdir()
    (model_dir / "refs" / "main").write_text("rev1")
    env = {"VIT_CHECKPOINTS_DIR": str(checkpoints), "VIT_RUNS_DIR": str(runs), "HOME": str(tmp_path),
           "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf-cache")}
    with streamlit_app(env) as (url, _):
        yield url, ROOT / "checkpoints" / "samples" / "cifar10-cifar-s" / "cat_1.png"


# The "Ask in words" map: the last image of the page's last horizontal block that holds the "Map for" selectbox.
MAP_SRC = """() => {
  const box = [...document.querySelectorAll('[data-testid="stSelectbox"]')]
      .find(b => b.innerText.includes("Map for"));
  const column = box && box.closest('[data-testid="stColumn"]');
  const images = column ? column.querySelectorAll('[data-testid="stImage"] img') : [];
  return images.length ? images[images.length - 1].src : "";
}"""


def map_image(page) -> str:
    page.wait_for_function(f"() => ({MAP_SRC})() !== ''")
    return page.evaluate(MAP_SRC)


def choose(page, label: str, option: str) -> None:
    """Pick ``option`` in the selectbox labelled ``label`` by typing it, as a keyboard user would."""
    page.get_by_role("combobox", name=label, exact=True).click()
    page.keyboard.type(option)
    page.keyboard.press("Enter")


def test_labels_are_asked_and_shown_as_text(server):
    url, image = server
    requested: list[str] = []
    with chromium() as browser:
        page = shared_tab(browser, {"width": 1400, "height": 1000})
        page.set_default_timeout(TIMEOUT_MS)
        page.on("request", lambda request: requested.append(request.url))
        page.goto(url)
        page.locator('[data-testid="stSidebar"] input[type="file"]').set_input_files(str(image))
        page.get_by_text("Ask in words").wait_for()
        area = page.get_by_role("textbox", name="Labels")
        area.fill(", ".join(LABELS))
        area.press("Control+Enter")
        page.get_by_text("softmax").first.wait_for()
        page.get_by_text("Drawn over the part of the image the model saw").wait_for()
        # The bars' chart draws once its width is measured, which can be after the captions: wait for its labels.
        page.wait_for_function(f"""(labels) => {{ const ticks = [...document.querySelectorAll({TICKS!r})]
            .map(t => t.textContent); return labels.every(label => ticks.includes(label)); }}""", arg=LABELS)
        labels = page.locator(TICKS).all_text_contents()
        for label in LABELS:
            assert label in labels, labels
        app = page.locator('[data-testid="stApp"]')
        assert app.locator('img[src*="example.invalid"]').count() == 0
        assert app.locator('a[href*="example.invalid"]').count() == 0
        assert page.locator('[data-testid="stPlotlyChart"] .ytick text b').count() == 0
        caption = page.get_by_text("gradient rollout (Chefer et al. 2021b) for").inner_text()
        assert "“<b>bold</b>”" in caption  # the first label, as typed
        first = map_image(page)
        choose(page, "Map for", "a cat")
        page.get_by_text("gradient rollout (Chefer et al. 2021b) for “a cat”").wait_for()
        page.wait_for_function(f"(before) => ({MAP_SRC})() !== before", arg=first)
        second = map_image(page)
        choose(page, "Minus (optional)", "<b>bold</b>")
        page.get_by_text("“a cat” minus “<b>bold</b>”").wait_for()
        page.wait_for_function(f"(before) => ({MAP_SRC})() !== before", arg=second)
        assert len({first, second, map_image(page)}) == 3  # two labels' maps and their difference
    assert not [u for u in requested if "example.invalid" in u], "the page fetched a URL a label gave"
