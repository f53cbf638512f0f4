"""The explorer in a real browser: ``streamlit run app.py`` driven through headless Chromium with Playwright.

Uses Debian's /usr/bin/chromium (no browser download); skipped with a reason where it is
missing. Screenshots go to test-artifacts/ (git-ignored).
"""

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, free_port, wait_for_health
from PIL import Image

from vit.catalog import DEFAULT_CHECKPOINT
from vit.checkpoint import save_checkpoint
from vit.model import ViT, ViTConfig

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_MS = 120_000  # the server imports torch and runs the model on a busy machine
TINY = ViTConfig(image_size=16, patch_size=4, num_channels=3, num_classes=3, hidden_size=16, num_layers=2,
                 num_heads=2, mlp_size=32)  # a 4 x 4 patch grid


def png(width: int, height: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def world(tmp_path):
    """A tiny random model under the default name with one sample, and an image to upload."""
    checkpoints, runs = tmp_path / "checkpoints", tmp_path / "runs"
    runs.mkdir()
    torch.manual_seed(0)
    save_checkpoint(checkpoints / DEFAULT_CHECKPOINT, ViT(TINY), ["airplane", "cat", "dog"],
                    metadata={"dataset": "folder:data/tiny", "val_acc": 0.5})
    samples = checkpoints / "samples" / Path(DEFAULT_CHECKPOINT).stem
    samples.mkdir(parents=True)
    (samples / "cat_1.png").write_bytes(png(32, 32, seed=1))
    upload = tmp_path / "wide-upload.png"
    upload.write_bytes(png(120, 80, seed=2))
    return checkpoints, runs, upload


@pytest.fixture
def server(world):
    checkpoints, runs, _ = world
    port = free_port()
    env = {**os.environ, "VIT_CHECKPOINTS_DIR": str(checkpoints), "VIT_RUNS_DIR": str(runs), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port), "--server.headless", "true",
         "--server.fileWatcherType", "none", "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://localhost:{port}"
    try:
        wait_for_health(url, process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


@pytest.fixture
def page():
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"{CHROMIUM} is missing: install it with `apt-get install -y chromium`")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1500, "height": 1100})
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            yield page
        finally:
            browser.close()


def query_selectbox_text(page) -> str:
    return page.get_by_role("combobox", name="Query token").input_value()


def test_upload_predict_and_click_a_patch_in_a_real_browser(server, world, page):
    _, _, upload = world
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(server)
    page.wait_for_selector('[data-testid="stApp"]')
    # The default checkpoint opens on its sample: a prediction, the picker and the overlay.
    page.get_by_text("Colours span").wait_for()
    page.get_by_text("cat_1.png, 32×32 px").wait_for()

    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(upload))
    page.get_by_text("wide-upload.png, 120×80 px").wait_for()
    charts = page.locator('[data-testid="stPlotlyChart"]')
    page.wait_for_function("document.querySelectorAll('[data-testid=\"stPlotlyChart\"] .bars .point').length >= 3")
    # The overlay, the model's input and the heads grid, all decoded (not broken links).
    page.wait_for_function("Array.from(document.querySelectorAll('[data-testid=\"stImage\"] img'))"
                           ".filter(img => img.complete && img.naturalWidth > 0).length >= 4")
    assert query_selectbox_text(page).startswith("0 · CLS")
    page.screenshot(path=str(ARTIFACTS / "explorer-upload.png"), full_page=True)

    # Click the patch in row 2, column 3 of the 4 x 4 grid: token 1 + 1 * 4 + 2 = 7.
    picker = charts.first.locator(".nsewdrag").first
    box = picker.bounding_box()
    page.mouse.click(box["x"] + box["width"] * 2.5 / 4, box["y"] + box["height"] * 1.5 / 4)
    page.get_by_text("the query patch row 2, col 3 (outlined)").wait_for()
    assert query_selectbox_text(page).startswith("7 · patch row 2, col 3")
    page.screenshot(path=str(ARTIFACTS / "explorer-clicked-patch.png"), full_page=True)

    # A second click elsewhere moves the query again (the picker is redrawn with a fresh selection).
    page.mouse.click(box["x"] + box["width"] * 0.5 / 4, box["y"] + box["height"] * 3.5 / 4)
    page.get_by_text("the query patch row 4, col 1 (outlined)").wait_for()
    assert query_selectbox_text(page).startswith("13 · patch row 4, col 1")


def hf_registers_folder(folder: Path) -> Path:
    """A tiny DINOv2 with 2 registers and no classifier, saved by transformers itself: 16 px, 4-px patches."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Dinov2WithRegistersConfig(image_size=16, patch_size=4, hidden_size=8, num_hidden_layers=2,
                                                    num_attention_heads=2, mlp_ratio=2, num_register_tokens=2)
    torch.manual_seed(0)
    transformers.Dinov2WithRegistersModel(config).save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(
        '{"do_resize": true, "size": {"shortest_edge": 20}, "do_center_crop": true, "crop_size": 16, "resample": 3,'
        ' "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}')
    return folder


def test_open_an_hf_folder_by_path_and_see_register_tokens_in_a_real_browser(server, world, page, tmp_path):
    _, _, upload = world
    folder = hf_registers_folder(tmp_path / "dinov2-registers")
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(server)
    page.wait_for_selector('[data-testid="stApp"]')
    page.get_by_text("Colours span").wait_for()
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(upload))
    page.get_by_text("wide-upload.png, 120×80 px").wait_for()
    field = page.get_by_role("textbox", name="Open a path")
    field.fill(str(folder))
    field.press("Enter")
    page.get_by_text("No prediction: this model has no classifier").wait_for()
    page.get_by_text("Colours span").wait_for()
    page.get_by_role("combobox", name="Query token").click()
    page.get_by_role("option", name="1 · REG 1").wait_for()
    page.get_by_role("option", name="2 · REG 2").click()
    page.get_by_text("the REG 2 token").first.wait_for()
    assert query_selectbox_text(page).startswith("2 · REG 2")
    page.screenshot(path=str(ARTIFACTS / "explorer-hf-registers.png"), full_page=True)
