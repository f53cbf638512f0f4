"""A DINOv3 folder in a real browser: opened by path, its map drawn at 640x480 with the aspect ratio kept, and its
4 storage (register) tokens labelled in the query list. Screenshot in test-artifacts/."""

from pathlib import Path

import pytest
import torch
from helpers import ARTIFACTS
from test_browser_explorer import choose, open_dropdown, page, photo, server, world  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def dinov3_folder(folder: Path) -> Path:
    """A tiny DINOv3 with 4 storage tokens, saved by transformers itself: 224 px, 16-px patches, 2 layers."""
    transformers = pytest.importorskip("transformers")
    config = transformers.DINOv3ViTConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                          num_attention_heads=2, num_register_tokens=4)
    torch.manual_seed(0)
    transformers.DINOv3ViTModel(config).save_pretrained(folder)
    return folder


def test_a_dinov3_map_at_640x480_keeping_the_aspect_with_its_register_tokens_labelled(server, page, tmp_path):  # noqa: F811
    folder = dinov3_folder(tmp_path / "dinov3")
    upload = tmp_path / "street.png"
    upload.write_bytes(photo(640, 480, seed=3))
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        page.goto(server)
        page.get_by_text("Colours span").wait_for()
        field = page.get_by_role("textbox", name="Open a path")
        field.fill(str(folder))
        field.press("Enter")
        page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(upload))
        page.get_by_text("No prediction: this model has no classifier").wait_for()
        choose(page, "Input size", "640 px")
        page.get_by_text("Keep the aspect ratio").click()
        page.get_by_text("sees it as 640×480 px in 30 rows × 40 columns of 16-px patches (1,205 tokens)").wait_for()
        page.get_by_text("Colours span").wait_for()
        open_dropdown(page, "Query token")
        for i in range(1, 5):
            page.get_by_role("option", name=f"{i} · REG {i}").wait_for()
        page.get_by_role("option", name="4 · REG 4").click()
        page.get_by_text("the REG 4 token").first.wait_for()
    finally:
        page.screenshot(path=str(ARTIFACTS / "explorer-dinov3-640x480.png"), full_page=True)
