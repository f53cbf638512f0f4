"""A Hub model downloading while the visitor goes on, in a real browser: an image uploaded mid-download neither stops
the transfer nor loses the model or the image.

The download ran in the script run of its Download click, so the upload's rerun stopped that run and the transfer
with it: huggingface_hub deleted the unfinished weights, the sidebar showed the Download button again, and a
multi-gigabyte model started over at the next click. It runs beside the page now (``hub_download``), whose progress
redraws itself every second in a fragment and reruns the page when the files are in: the model then opens on the
image uploaded meanwhile.
"""

import os
import re
from pathlib import Path

import pytest
import torch
from helpers import ARTIFACTS, BROWSER_TIMEOUT_MS, chromium, click_until, ship_default, streamlit_app
from shared_app import TINY, enter, png, upload_image
from test_browser_explorer import SCRIPT_DONE
from test_hub import repo, tiny_vit  # noqa: F401 (fixtures: a tiny transformers ViT on the local Hub)

from vit.runs.access import TOKEN_ENV

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Bytes of the weights every 0.2 s (1 kB/s): the 37-kB file takes half a minute unless released, and the download's
# rate floor (100 kB/s) gives it up a minute in: what the test checks midway is done within seconds.
PACE = 200


def test_an_upload_mid_download_neither_stops_it_nor_loses_the_model_or_the_image(repo, fake_hub, tmp_path):  # noqa: F811
    fake_hub.repos[repo].pace["model.safetensors"] = PACE
    torch.manual_seed(0)
    checkpoints, runs = ship_default(tmp_path, TINY, ["cat", "dog", "owl"])
    image = tmp_path / "upload.png"
    image.write_bytes(png(120, 80, seed=2))
    ARTIFACTS.mkdir(exist_ok=True)
    env = {"VIT_CHECKPOINTS_DIR": str(checkpoints), "VIT_RUNS_DIR": str(runs)}  # the HF cache: fake_hub's
    with streamlit_app(env, log=tmp_path / "server.log", unset=(TOKEN_ENV,)) as (url, server), chromium() as browser:
        page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        page.set_default_timeout(BROWSER_TIMEOUT_MS)
        try:
            page.goto(url)
            page.get_by_text("Upload an image in the sidebar").wait_for()  # the default model
            page.wait_for_function(SCRIPT_DONE)
            # On two loaded cores a rerun can redraw the field under the typing, or the button under the click
            field, button = page.get_by_role("textbox", name="Open from the Hub"), page.get_by_role(
                "button", name=re.compile("^Download "))
            try:
                click_until(lambda ms: enter(field, repo, ms), button, BROWSER_TIMEOUT_MS,
                            screenshot=(page, ARTIFACTS / "hub-download-offered.png"))
            except Exception:  # what the sidebar said instead, and where the page's requests went
                sidebar = page.locator('[data-testid="stSidebar"]').inner_text()
                raise AssertionError(f"no Download button; the Hub at {os.environ['HF_ENDPOINT']} saw "
                                     f"{[r.path for r in fake_hub.requests]}; the server's {server_hub_env(server)}; "
                                     f"the sidebar: {sidebar!r}") from None
            bar = page.locator('[data-testid="stSidebar"] [data-testid="stProgress"]')
            click_until(lambda ms: button.click(timeout=ms), bar, BROWSER_TIMEOUT_MS,
                        screenshot=(page, ARTIFACTS / "hub-download-started.png"))
            assert not page.get_by_role("button", name=re.compile("^Download ")).count(), "the bar took its place"
            for _ in range(600):  # the weights' first bytes (the config comes first), within a minute
                if fake_hub.sent.get("model.safetensors"):
                    break
                page.wait_for_timeout(100)
            sent = fake_hub.sent["model.safetensors"]

            upload_image(page, image)  # its rerun stopped the download, which ran in the script run
            page.get_by_text("upload.png, 120×80 px").wait_for()
            page.wait_for_timeout(1500)  # the progress redraws once a second: a second look at it
            page.get_by_text(re.compile(f"^Downloading {re.escape(repo)}: ")).wait_for()
            assert not page.get_by_role("button", name=re.compile("^Download ")).count()
            assert fake_hub.sent["model.safetensors"] > sent, "the same transfer went on"
            page.screenshot(path=str(ARTIFACTS / "hub-download-mid-upload.png"), full_page=True)

            fake_hub.release.set()  # the rest of the weights at once: the page reruns and opens the model
            from playwright.sync_api import expect

            expect(page.get_by_role("combobox", name="Checkpoint", exact=True)).to_have_value(
                re.compile(re.escape(repo)), timeout=BROWSER_TIMEOUT_MS)
            page.get_by_text("upload.png, 120×80 px").wait_for()  # on the image uploaded meanwhile
            page.get_by_text("Colours span").wait_for()
            assert not page.get_by_text(re.compile(f"^Downloading {re.escape(repo)}")).count()
        finally:
            page.screenshot(path=str(ARTIFACTS / "hub-download-done.png"), full_page=True)
    assert fake_hub.fetched("GET").count("model.safetensors") == 1, "one transfer of the weights"


def server_hub_env(server) -> dict[str, str]:
    """The app server's environment variables that decide how it reaches the Hub (offline, endpoint, proxies)."""
    try:
        raw = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
    except OSError as e:
        return {"unreadable": str(e)}
    pairs = dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)
    return {k: v for k, v in pairs.items() if "OFFLINE" in k or "PROXY" in k.upper() or k.startswith("HF_")}
