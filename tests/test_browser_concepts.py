"""From words to regions in a real browser (issue 94): ``streamlit run app.py`` in headless Chromium opens a tiny
DINOv3 with its dino.txt head (the authors' files, test_dinotxt's builder), labels are typed into Ask in words and
the dino.txt patch-text map of each is drawn; and a tiny SAM 3 (test_sam3_concepts' builder), where a typed concept
draws its instances and the explained one's decoder attention, whose exported values are ``vit.segment``'s (held
to transformers in test_sam3_concepts) and which the page's link, opened in a fresh page, draws again."""

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
from browser_tabs import new_tab
from helpers import chromium

pytestmark = [pytest.mark.browser, pytest.mark.slow]
pytest.importorskip("transformers")

import vit  # noqa: E402

TIMEOUT_MS = 180_000  # the model loads on two busy cores


@pytest.fixture(scope="module")
def server(local_app):
    """The app server the browser modules share (tests/shared_app.py: no token, so a visitor opens a folder by its
    path); each test opens its own model folder by its link, in sessions of its own. Its start and the app's first
    imports are paid once for every browser module, not by this one (issue 112)."""
    return local_app.url


def exported_map(page, tmp_path: Path, name: str) -> np.ndarray:
    """The values of the map the page shows, from its "Export this view (HTML)" (each patch's hovered value)."""
    with page.expect_download() as download:
        page.get_by_role("button", name="Export this view (HTML)").click()
    html = Path(download.value.path()).read_text(encoding="utf-8")
    (tmp_path / name).write_text(html, encoding="utf-8")
    [body] = re.findall(r'Plotly\.newPlot\(\s*"map",\s*(\[.*?\]),\s*\{', html, flags=re.S)
    [points] = json.loads(body)
    data = points["customdata"]
    if isinstance(data, dict):  # Plotly 6: base64 of the array's bytes
        data = np.frombuffer(base64.b64decode(data["bdata"]), dtype=data["dtype"])
    return np.asarray(data, dtype=np.float32)


def test_a_concept_on_a_sam3_draws_its_instances_and_the_decoder_attention(server, tmp_path):
    """Long (~26 s of CPU) because a tiny SAM 3 is built and segmented here (the reference) and opened and run on
    the server, in two page loads of a real Chromium (the concept, its link)."""
    from test_sam3_concepts import TEXT, build_sam3, picture

    folder = build_sam3(tmp_path / "sam3")
    photo = tmp_path / "photo.png"
    picture().save(photo)
    want = vit.segment(vit.open_sam3(folder), picture(), text=TEXT, threshold=0.0)
    last = f"decoder layer {len(want.attention)}"
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1500, "height": 1100}, accept_downloads=True)
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(f"{server}?model={folder}&cthreshold=0")
        page.locator('[data-testid="stSidebar"] input[type="file"]').set_input_files(str(photo))
        main = page.locator('[data-testid="stMain"]')
        concept = main.get_by_role("textbox", name="Concept")
        concept.fill(TEXT)
        concept.press("Enter")
        main.get_by_text("The concept's presence score").wait_for()  # the instances tinted on the image
        main.get_by_text(re.compile(rf"Instance {want.instance + 1}\*?\*? \(score .*decoder layer "
                                    rf"{len(want.attention)}, the heads' mean")).wait_for()
        main.locator('[data-testid="stDataFrame"]').first.wait_for()  # the instances' table
        page.wait_for_function("() => window.location.search.includes('concept=')")
        np.testing.assert_allclose(exported_map(page, tmp_path, "concept.html"), want.attention[last].mean(0).ravel(),
                                   rtol=0, atol=1e-6)
        link = page.evaluate("() => window.location.href")
        again = new_tab(page, TIMEOUT_MS)  # the link in a fresh session: the upload is the server's, named in the link
        again.goto(link)
        again.locator('[data-testid="stMain"]').get_by_text(re.compile(rf"Instance {want.instance + 1}")).wait_for()
        np.testing.assert_allclose(exported_map(again, tmp_path, "linked.html"), want.attention[last].mean(0).ravel(),
                                   rtol=0, atol=1e-6)


def test_labels_on_a_dinotxt_draw_each_labels_patch_text_map(server, tmp_path):
    """Long (~10 s of CPU) because the authors' DINOv3 with its dino.txt head is built and opened on the server,
    and its maps drawn in a real Chromium."""
    from test_browser_words import MAP_SRC, choose, map_image
    from test_dinotxt import LABELS, authors_dinotxt, save_authors_layout

    head = save_authors_layout(authors_dinotxt(), tmp_path / "dinotxt")
    photo = tmp_path / "photo.png"
    rng = np.random.default_rng(4)
    from PIL import Image

    Image.fromarray(rng.integers(0, 255, (32, 48, 3), dtype=np.uint8)).save(photo)
    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(f"{server}?model={head}")
        page.locator('[data-testid="stSidebar"] input[type="file"]').set_input_files(str(photo))
        page.get_by_text("Ask in words").wait_for()
        area = page.get_by_role("textbox", name="Labels")
        area.fill(", ".join(LABELS))
        area.press("Control+Enter")
        page.get_by_text("softmax").first.wait_for()
        choose(page, "Method", "dino.txt patch-text map")
        page.get_by_text(f"dino.txt patch-text map for “{LABELS[0]}”").wait_for()
        first = map_image(page)
        choose(page, "Map for", LABELS[2])
        page.get_by_text(f"dino.txt patch-text map for “{LABELS[2]}”").wait_for()
        page.wait_for_function(f"(before) => ({MAP_SRC})() !== before", arg=first)
        assert map_image(page) != first  # each label's own map
