"""Regenerate the README's screenshots from the real app: ``python scripts/screenshots.py [--out docs]``.

Starts ``streamlit run app.py`` on the shipped checkpoints, drives it with Debian's headless
Chromium (``/usr/bin/chromium``, through Playwright) and writes:

- ``explorer.png``: the default checkpoint on its first sample, with DINO's attention-mass contour;
- ``explorer-heads.png``: every layer's heads for a clicked patch, on one shared colour scale;
- ``explorer-matrix.png``: the attention matrix of the last layer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from helpers import CHROMIUM, CHROMIUM_ARGS, streamlit_app  # noqa: E402

VIEWPORT = {"width": 1400, "height": 1000}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs"), help="folder for the PNGs (default docs/)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    # The shipped checkpoints and samples, whatever folders this shell points the app at.
    with streamlit_app({}, unset=("VIT_CHECKPOINTS_DIR", "VIT_RUNS_DIR")) as (url, _), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1)
        page.set_default_timeout(120_000)
        page.goto(url)
        page.get_by_text("Colours span").wait_for()
        page.get_by_text("Attention-mass contour (DINO)").click()
        page.get_by_text("the patches that hold").or_(page.get_by_text("Colours span")).first.wait_for()
        page.wait_for_timeout(1500)
        page.evaluate("document.querySelector('[data-testid=\"stSidebarContent\"]').scrollTo(0, 0)")
        page.screenshot(path=str(out / "explorer.png"))

        picker = page.locator('[data-testid="stPlotlyChart"]').first.locator(".nsewdrag").first
        box = picker.bounding_box()
        page.mouse.click(box["x"] + box["width"] * 5.5 / 8, box["y"] + box["height"] * 3.5 / 8)
        page.get_by_text("(outlined)").first.wait_for()
        page.get_by_text("one range for every head shown").click()
        page.get_by_text("Every layer (").click()
        page.wait_for_timeout(2500)
        page.get_by_text("Click a head").scroll_into_view_if_needed()
        heads = page.locator('[data-testid="stPlotlyChart"]').filter(has_text="head 1")
        page.wait_for_timeout(1000)
        heads.screenshot(path=str(out / "explorer-heads.png"))

        page.get_by_role("tab", name="Attention matrix").click()
        page.get_by_text("Row i is what token i attends to").wait_for()
        page.wait_for_timeout(2000)
        page.get_by_text("Row i is what token i attends to").scroll_into_view_if_needed()
        matrix = page.locator('[data-testid="stPlotlyChart"]').filter(has_text="key token")
        matrix.screenshot(path=str(out / "explorer-matrix.png"))
        browser.close()
    for name in ("explorer.png", "explorer-heads.png", "explorer-matrix.png"):
        print(out / name)
    return 0


if __name__ == "__main__":
    if not CHROMIUM.is_file():
        sys.exit(f"{CHROMIUM} is missing: install it with `apt-get install -y chromium`")
    raise SystemExit(main())
