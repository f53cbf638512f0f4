"""The explorer's Mechanism view in a real browser: switch a head off on a real photo and see the prediction change,
zeroed, then set to its mean over uploaded reference photos in every map.

The shipped 2-CPU-core CIFAR-10 model (opened by its link, ``?model=cifar10-cifar-s``: the app's default is the GPU one)
calls its sample photo cat_1.png an airplane (44 %); with head 4.3 zero-ablated it says
cat (50 %), as ``python -m vit.predict checkpoints/cifar10-cifar-s.pt checkpoints/samples/cifar10-cifar-s/cat_1.png
--ablate 4.3`` prints too.
"""

from pathlib import Path

import pytest
from helpers import ARTIFACTS, BROWSER_TIMEOUT_MS, chromium, click_until, shared_tab, streamlit_app

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_MS = BROWSER_TIMEOUT_MS  # what a user would wait (tests/helpers.py)


@pytest.fixture
def server(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {"VIT_CHECKPOINTS_DIR": str(ROOT / "checkpoints"), "VIT_RUNS_DIR": str(runs),
           "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_HOME": str(tmp_path / "hf-home")}
    ARTIFACTS.mkdir(exist_ok=True)
    with streamlit_app(env, log=ARTIFACTS / "explorer-mechanism-server.log") as (url, _):
        yield url


@pytest.fixture
def page():
    with chromium() as browser:
        page = shared_tab(browser, {"width": 1500, "height": 1100})
        page.set_default_timeout(TIMEOUT_MS)
        yield page


def test_switching_a_head_off_on_a_real_photo_changes_the_prediction(server, page):
    if not (ROOT / "checkpoints" / "samples" / "cifar10-cifar-s" / "cat_1.png").is_file():
        pytest.skip("the shipped CIFAR-10 sample photos are missing")
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(f"{server}/?model=cifar10-cifar-s")
    page.get_by_text("Colours span").wait_for()
    box = page.get_by_role("combobox", name="…or a sample image", exact=True)
    box.click()
    page.keyboard.type("cat 1")
    page.keyboard.press("Enter")
    page.get_by_text("cat_1.png, 32×32 px").wait_for()
    page.get_by_text("Mechanism: logit lens, head attribution, ablation, phenomena").click()
    page.get_by_text("Each patch's probability of").wait_for()  # the first tab, drawn
    heads = page.get_by_role("combobox", name="Switch heads off (layer.head)", exact=True)
    # On two loaded cores a click that lands while the page reruns can be lost, and the tabs are redrawn under it.
    click_until(lambda ms: page.get_by_role("tab", name="Ablation", exact=True).click(timeout=ms), heads, TIMEOUT_MS,
                (page, ARTIFACTS / "explorer-mechanism-no-ablation-tab.png"))
    heads.click()
    page.keyboard.type("4.3")
    page.keyboard.press("Enter")
    page.get_by_text("Heads 4.3 off (zero ablation): predicts cat.").wait_for()
    page.get_by_text("All heads on.", exact=True).wait_for()
    # Before: airplane on top; after: cat on top (the sidebar's prediction chart comes first). The charts are drawn
    # after the text above (Plotly draws once the element is laid out): wait for their tops, then read them.
    tops = """() => Array.from(document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot'))
        .filter(p => p.data && p.data[0].type === 'bar').map(p => p.data[0].y[0])"""  # most probable first
    page.wait_for_function(f"""() => {{ const tops = ({tops})();
        return tops.length >= 3 && tops.slice(-2).join() === 'airplane,cat'; }}""")
    assert page.evaluate(tops)[-2:] == ["airplane", "cat"], page.evaluate(tops)
    page.screenshot(path=str(ARTIFACTS / "explorer-mechanism-ablation.png"), full_page=True)

    # Mean ablation over three photos uploaded as references (what an HF or timm model, with no samples, has),
    # then in every map: the sidebar's prediction follows (4.3 set to its mean over them: cat, 40 %).
    samples = ROOT / "checkpoints" / "samples" / "cifar10-cifar-s"
    uploader = page.locator('[data-testid="stFileUploader"]').filter(has_text="Reference images")
    uploader.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(
        [str(samples / f"{name}_1.png") for name in ("airplane", "automobile", "bird")])
    uploader.get_by_text("bird_1.png").wait_for()  # the upload is in the page's state before the click's rerun
    click_until(lambda ms: page.get_by_text("its mean over reference images").click(timeout=ms),
                page.get_by_text("Means over the 3 uploaded reference images"), TIMEOUT_MS,
                (page, ARTIFACTS / "explorer-mechanism-no-mean.png"))
    page.get_by_text("Heads 4.3 off (mean ablation): predicts cat.").wait_for()
    page.get_by_text("Every map on this page with these heads off").click()
    page.get_by_text("(mean ablation over the 3 uploaded reference images) in the prediction").wait_for()
    page.wait_for_function("""() => { const bars = Array.from(document.querySelectorAll(
        '[data-testid="stPlotlyChart"] .js-plotly-plot')).filter(p => p.data && p.data[0].type === 'bar');
        return bars.length >= 3 && bars[0].data[0].y[0] === 'cat'; }""")
    page.screenshot(path=str(ARTIFACTS / "explorer-mechanism-mean-ablation.png"), full_page=True)
    # Another Mechanism tab, then another click there: the heads stay off (a closed tab draws none of its widgets).
    page.get_by_role("tab", name="Head attribution", exact=True).click()
    page.get_by_text("TransformerLens's apply_ln_to_stack").wait_for()
    page.get_by_role("tab", name="Logit lens", exact=True).click()
    page.get_by_text("Each patch's probability of").wait_for()
    page.get_by_text("(mean ablation over the 3 uploaded reference images) in the prediction").wait_for()
