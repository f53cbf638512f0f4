"""Regenerate the README's screenshots from the real app: ``python scripts/screenshots.py [--out docs]``.

Starts ``streamlit run app.py`` on the shipped checkpoints, drives it with Debian's headless
Chromium (``/usr/bin/chromium``, through Playwright) and writes:

- ``explorer.png``: the default checkpoint on its first sample, with DINO's attention-mass contour;
- ``explorer-heads.png``: every layer's heads for a clicked patch, on one shared colour scale;
- ``explorer-matrix.png``: the attention matrix of the last layer;
- ``explorer-dense.png``, ``explorer-dense-matches.png``: "What the patches represent" on the shipped CIFAR-10
  model (trained weights; none can be downloaded here) with its horse sample and its deer photo as the second
  image: PCA colours fitted on both, a clicked patch's similarity, and the correspondences of the two.
- ``explorer-dense-dinov2.png``: the same section on a DINOv2-shaped model (ViT-S/14 with 4 registers, built by
  transformers with *random* weights, converted with ``python -m vit.convert``) at 224 px on the horse photo,
  layer 4: the PCA colours of an untrained network, whose tokens still carry the pixels through the residual
  stream.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from helpers import CHROMIUM, CHROMIUM_ARGS, streamlit_app  # noqa: E402

VIEWPORT = {"width": 1400, "height": 1000}
SAMPLES = ROOT / "checkpoints" / "samples" / "cifar10-cifar-s"
DENSE = ("explorer-dense.png", "explorer-dense-matches.png")
DINOV2 = "explorer-dense-dinov2.png"


def clip_between(page, top, bottom, pad: int = 8) -> dict:
    """The full-width box from ``top``'s top to ``bottom``'s bottom (two locators), in the viewport."""
    a, b = top.bounding_box(), bottom.bounding_box()
    main = page.locator('[data-testid="stMainBlockContainer"]').bounding_box()
    return {"x": main["x"], "y": a["y"] - pad, "width": main["width"],
            "height": b["y"] + b["height"] - a["y"] + 2 * pad}


def dense_section(page, out: Path) -> None:
    """The dense-features section on the horse sample, with the deer photo as the second image."""
    page.set_viewport_size({"width": VIEWPORT["width"], "height": 2400})  # the section in one view: clips need it
    page.get_by_role("combobox", name="…or a sample image").click()
    page.get_by_role("option", name="horse 1", exact=True).click()
    page.get_by_text("horse_1.png, 32×32 px").wait_for()
    page.get_by_text("What the patches represent").click()
    uploader = page.locator('[data-testid="stFileUploader"]').filter(has_text="Second image")
    uploader.locator('input[type="file"]').set_input_files(str(SAMPLES / "deer_1.png"))
    page.get_by_text("Fitted on both images together").wait_for()
    page.get_by_text("mutual matches shown").wait_for()
    # Layer 4 of 6: the last layer of a classifier this small mixes its patches; the middle one still maps them.
    page.get_by_role("combobox", name="Layer (its output after the final norm)").click()
    page.get_by_role("option", name="4", exact=True).click()
    page.get_by_text("layer 4.").wait_for()
    # The patch chosen in the picker's selectbox: a click on the picture sets the same value, and a scripted click
    # on the chart did not register reliably in headless Chromium.
    page.get_by_role("combobox", name="Patch", exact=True).click()
    page.keyboard.type("20 · patch row 3, col 4")  # the list shows its first options only: filter it
    page.keyboard.press("Enter")
    page.get_by_text("Cosine similarity to patch row 3, col 4").wait_for()
    page.wait_for_timeout(2500)
    heading = page.get_by_text("PCA colours", exact=True)
    # What sits above each part goes to the top, under Streamlit's header: the part itself stays in full view.
    page.get_by_text("Layer (its output after the final norm)").evaluate("e => e.scrollIntoView({block: 'start'})")
    second = page.get_by_text("The same patch's token against every patch of the second image")
    page.screenshot(path=str(out / DENSE[0]), clip=clip_between(page, heading, second))
    matches = page.get_by_text("mutual matches shown")
    matches.evaluate("e => e.scrollIntoView({block: 'center'})")
    page.wait_for_timeout(1000)
    page.screenshot(path=str(out / DENSE[1]), clip=clip_between(page, page.get_by_text("Correspondences (mutual"),
                                                                    matches))


def random_dinov2(folder: Path) -> Path:
    """A DINOv2-shaped checkpoint (ViT-S/14, 4 registers, no classifier) with random weights, in ``folder`` with
    the CIFAR-10 samples beside it; transformers builds it, ``vit.convert`` converts it."""
    import subprocess

    import torch
    from transformers import Dinov2WithRegistersConfig, Dinov2WithRegistersModel

    torch.manual_seed(0)
    config = Dinov2WithRegistersConfig(hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
                                       intermediate_size=1536, patch_size=14, image_size=224, num_register_tokens=4)
    hf = folder / "hf"
    Dinov2WithRegistersModel(config).save_pretrained(hf)
    target = folder / "checkpoints" / "dinov2-small-random.pt"
    target.parent.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "vit.convert", str(hf), "--out", str(target)], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    samples = target.parent / "samples" / target.stem
    samples.mkdir(parents=True)
    for name in ("horse_1.png", "deer_1.png"):
        (samples / name).write_bytes((SAMPLES / name).read_bytes())
    return target.parent


def dinov2_dense(out: Path) -> None:
    """The dense section's PCA colours and a patch's similarity on the random DINOv2-shaped model."""
    import tempfile

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as folder:
        checkpoints = random_dinov2(Path(folder))
        with streamlit_app({"VIT_CHECKPOINTS_DIR": str(checkpoints)}, unset=("VIT_RUNS_DIR",)) as (url, _), \
                sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": VIEWPORT["width"], "height": 2400}, device_scale_factor=1)
            page.set_default_timeout(300_000)
            page.goto(url)
            page.get_by_role("combobox", name="…or a sample image").click()
            page.get_by_role("option", name="horse 1", exact=True).click()
            page.get_by_text("What the patches represent").click()
            page.get_by_text("Fitted on").first.wait_for()
            # Layer 4 of 12: past it an untrained network's blocks mix the patches more and more.
            page.get_by_role("combobox", name="Layer (its output after the final norm)").click()
            page.get_by_role("option", name="4", exact=True).click()
            page.get_by_text("layer 4.").wait_for()
            page.get_by_role("combobox", name="Patch", exact=True).click()
            page.keyboard.type("row 7, col 8")
            page.keyboard.press("Enter")
            page.get_by_text("Cosine similarity to patch row 7, col 8").wait_for()
            page.wait_for_timeout(2500)
            page.get_by_text("Layer (its output after the final norm)").evaluate(
                "e => e.scrollIntoView({block: 'start'})")
            heading = page.get_by_text("PCA colours", exact=True)
            similarity = page.get_by_text("Cosine similarity to patch row 7, col 8")
            page.screenshot(path=str(out / DINOV2), clip=clip_between(page, heading, similarity))
            browser.close()


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
        dense_section(page, out)
        browser.close()
    dinov2_dense(out)
    for name in ("explorer.png", "explorer-heads.png", "explorer-matrix.png", *DENSE, DINOV2):
        print(out / name)
    return 0


if __name__ == "__main__":
    if not CHROMIUM.is_file():
        sys.exit(f"{CHROMIUM} is missing: install it with `apt-get install -y chromium`")
    raise SystemExit(main())
