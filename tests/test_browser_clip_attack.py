"""Issue 77's GIF through the page, in a real browser, with the server's memory watched (items 1 and 2).

``streamlit run app.py`` with a training token set; a visitor who has not entered it opens a tiny VideoMAE of the
server's Hugging Face cache by a link (``/?model=ORG/NAME``) and uploads, in "Upload a clip", the issue's GIF: a
16 x 16 logical screen whose three later frames are 12,000² (295 KB; the previous code decoded them, and the server
went from 0.9 GB to 3.4 GB and died), then a few dozen bytes declaring 20,000² (PIL's DecompressionBombError). Each
answers in one line; the server's peak resident memory (VmHWM) grows by less than one such frame holds as RGB; a
second visitor, meanwhile, is served a clip of their own.

The three visitors are tabs of one blank page (tests/browser_tabs.py), where each had a context and so a renderer of
its own: each load is still a Streamlit session of its own, and what is checked is the server's (its memory, its
serving one session while another is refused), which no browser state reaches: none of them enters the token, and
the app keeps no cookie and no browser storage.
"""

import pytest
from browser_tabs import opener, tabs
from helpers import BROWSER_TIMEOUT_MS, chromium, streamlit_app
from test_browser_memory import peak_rss_mb
from test_clip_bounds import ATTACK, gif_bytes

from vit.runs.access import TOKEN_ENV

pytestmark = [pytest.mark.browser, pytest.mark.slow]

FRAMES, SIDE = 4, 16
GROWTH_BOUND_MB = 300  # one 12,000² frame is 432 MB as RGB, 576 MB as PIL holds it; refused, nothing is decoded
HUB_NAME = "someone/tiny-videomae"


@pytest.fixture
def server(tmp_path):
    pytest.importorskip("transformers")
    from test_videomae import videomae_folder

    model_dir = tmp_path / "hf-cache" / f"models--{HUB_NAME.replace('/', '--')}"
    videomae_folder(model_dir / "snapshots" / "rev1", FRAMES, SIDE, SIDE)
    (model_dir / "refs").mkdir()
    (model_dir / "refs" / "main").write_text("rev1")
    for name in ("checkpoints", "runs"):
        (tmp_path / name).mkdir()
    env = {"VIT_CHECKPOINTS_DIR": str(tmp_path / "checkpoints"), "VIT_RUNS_DIR": str(tmp_path / "runs"),
           "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_HOME": str(tmp_path / "hf-home"),
           TOKEN_ENV: "correct-horse-battery-staple"}
    with streamlit_app(env, log=tmp_path / "server.log", unset=["VIT_ANALYSIS_MEMORY_MB"]) as (url, process):
        yield url, process


def visitor(page, url: str):
    """A fresh session in the tab ``page`` (no token entered) on the VideoMAE the link names, before any clip."""
    page.goto(f"{url}/?model={HUB_NAME}")
    page.get_by_text("Upload a clip in the sidebar").wait_for()
    return page


def upload(page, path) -> None:
    page.locator('[data-testid="stSidebar"] [data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(path))


def test_the_issues_gif_is_refused_in_one_line_and_the_server_keeps_serving(server, tmp_path):
    from test_videomae import write_gif

    url, process = server
    attack, bomb = tmp_path / "attack.gif", tmp_path / "bomb.gif"
    attack.write_bytes(gif_bytes(**ATTACK))
    bomb.write_bytes(gif_bytes((20_000, 20_000), [(0, 0, 1, 1)]))
    good = write_gif(tmp_path / "good.gif", 6, size=(SIDE, SIDE))
    with chromium() as browser, tabs(opener(browser, viewport={"width": 1400, "height": 1000}),
                                     BROWSER_TIMEOUT_MS) as tab:
        first, second = visitor(tab(), url), visitor(tab(), url)
        idle_mb = peak_rss_mb(process.pid)

        upload(first, attack)
        refusal = first.get_by_text("Cannot use this clip: attack.gif")
        refusal.wait_for()
        assert "decoding 4 frames of 12,000x12,000 px" in refusal.inner_text()
        upload(second, good)  # the second visitor, while the first is refused
        second.get_by_text("Uniform sampling of 4 frames over 6").wait_for()

        upload(first, bomb)
        first.get_by_text("Cannot use this clip: bomb.gif").wait_for()
        assert first.locator('[data-testid="stException"]').count() == 0

        grown = peak_rss_mb(process.pid) - idle_mb
        assert grown < GROWTH_BOUND_MB, f"the server's peak memory grew by {grown:,.0f} MB"
        assert process.poll() is None
        third = visitor(tab(), url)  # a visitor after them is served
        upload(third, good)
        third.get_by_text("Uniform sampling of 4 frames over 6").wait_for()
