"""SAM 3 tracker's prompts in the explorer (issue 116, item 12): opened by path, the library road's page draws its
vision encoder's maps and, below them, the Prompts section a whole SAM 2 gets on the main page, through
``vit.segment``. A prompt's masks and IoU scores are transformers' own (``Sam3TrackerModel`` with its processor on the
same image and prompt), the decoder attention drawn is its eager attention, the mask's gradient x input is
``vit.segment``'s, and the link reproduces the view in a fresh session.

The model is test_library_sam3's tiny random tracker (a 4 x 4 image embedding); the image is 50 x 30 px, so a prompt
read with x and y swapped lands elsewhere."""

import io

import numpy as np
import pytest
from helpers import displayed
from PIL import Image
from streamlit.testing.v1 import AppTest
from test_app import APP, TIMEOUT, dirs, png_bytes, run_app, sidebar_widget, upload  # noqa: F401 (a fixture)

transformers = pytest.importorskip("transformers")

from test_library_sam3 import (  # noqa: E402
    TRACKER_MODELING,
    eager_windows,
    library,
    tracker,  # noqa: F401 (a fixture)
    tracker_inputs,
    tracker_run,
)

import vit  # noqa: E402
from vit.app import sam_prompt_view as prompts  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dirs")]

WIDTH, HEIGHT = 50, 30
POINTS, BOX = ((40, 10, 1), (12, 20, 0)), (5, 4, 45, 26)
LINKED = {"points": POINTS, "box": BOX, "token": "mask2", "dattn": "b2.i2t", "dhead": 2, "smap": "gradient_x_input"}


def image() -> Image.Image:
    return Image.open(io.BytesIO(png_bytes(WIDTH, HEIGHT, seed=4))).convert("RGB")


@pytest.fixture
def drawn(monkeypatch) -> list[np.ndarray]:
    """The maps the page draws with the explorer's overlay code, in order."""
    from vit.app import drawing

    maps, overlay = [], drawing.overlay_image
    monkeypatch.setattr(drawing, "overlay_image", lambda picture, map2d, *a, **k: maps.append(np.asarray(map2d))
                        or overlay(picture, map2d, *a, **k))
    return maps


def url(at: AppTest) -> dict[str, str]:
    return {k: v[-1] if isinstance(v, list) else v for k, v in ((k, at.query_params[k]) for k in at.query_params)}


def check_the_librarys(at: AppTest, folder, drawn: list[np.ndarray]) -> None:
    """The masks' captions, mask 2's token's block-2 image-to-token attention of head 2 and the mask's gradient x
    input drawn, against transformers' model on the same image and prompt (and ``vit.segment`` for the map)."""
    processor = transformers.Sam3TrackerProcessor.from_pretrained(folder)
    inputs = tracker_inputs(processor, image(), points=POINTS, box=BOX)
    out = tracker_run(library(folder, "Sam3TrackerModel", "sdpa"), inputs)
    masks = processor.post_process_masks(out.pred_masks, inputs["original_sizes"])[0][0]  # (3, H, W)
    scores = out.iou_scores[0, 0]
    best = int(scores.argmax())
    expected = [prompts.mask_caption(i, float(scores[i]), int(masks[i].sum()), WIDTH * HEIGHT, i == best)
                for i in range(3)]
    assert [displayed(c.value) for c in at.main.caption if displayed(c.value).startswith("mask ")] == expected
    eager = library(folder, "Sam3TrackerModel")
    weights = eager_windows(TRACKER_MODELING, lambda: tracker_run(eager, inputs))[-7:]
    position = 2 + 1 + 1  # the object-score token, the IoU token, mask token 0; mask 2 is mask token 2
    attention = weights[3 * 1 + 2][0][1, :, position].reshape(4, 4)  # block 2's image-to-token, head 2
    assert any(np.allclose(m, attention.numpy(), rtol=0, atol=1e-5) for m in drawn if m.shape == (4, 4))
    assert "block 2, image to token attention, head 2" in " ".join(displayed(c.value) for c in at.main.caption)
    checkpoint = vit.load(folder, device="cpu")
    seg = vit.segment(checkpoint, image(), points=list(POINTS), box=BOX, mask=1, methods=["gradient_x_input"])
    np.testing.assert_allclose(drawn[-1], seg.maps["gradient_x_input"], rtol=0, atol=0)
    assert np.abs(drawn[-1]).max() > 0


def test_the_trackers_prompt_draws_the_librarys_masks_and_attention_and_its_link_reproduces_them(tracker,  # noqa: F811
                                                                                                  drawn):
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(tracker))
    at.run()
    upload(at, "photo.png", png_bytes(WIDTH, HEIGHT, seed=4))
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    assert "Prompts" in [h.value for h in at.main.header]  # below the vision encoder's map, before any prompt
    assert not [c for c in at.main.caption if displayed(c.value).startswith("mask ")]
    at.session_state["sam_linked"] = LINKED  # the prompt as a click and a drag leave it (and as a link gives it)
    at.run()
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    check_the_librarys(at, tracker, drawn)
    link = url(at)
    assert {k: link[k] for k in ("points", "box", "token", "dattn", "dhead", "smap")} == {
        "points": "40,10,1;12,20,0", "box": "5,4,45,26", "token": "mask2", "dattn": "b2.i2t", "dhead": "2",
        "smap": "gradient_x_input"}
    assert link["map"] == at.session_state["library_method"]  # the encoder's map stays in the same link

    fresh = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in link.items():
        fresh.query_params[key] = value
    fresh.run()
    assert not fresh.exception and not fresh.main.error, [e.value for e in fresh.main.error]
    check_the_librarys(fresh, tracker, drawn)
    assert url(fresh) == link


def test_a_linked_map_the_tracker_cannot_draw_is_reset_to_none_with_one_line(tracker):  # noqa: F811
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(tracker))
    at.run()
    upload(at, "photo.png", png_bytes(WIDTH, HEIGHT, seed=4))
    at.session_state["sam_linked"] = {**LINKED, "smap": "attnlrp"}
    at.run()
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    assert [displayed(w.value) for w in at.main.warning] == [
        "AttnLRP does not apply to SAM 3 tracker's image encoder: no pixel map is drawn."]
    assert at.radio(key="sam_map").value == "none"
    at.run()  # the URL follows the view as the next run draws it
    assert "smap" not in url(at) and url(at)["points"] == "40,10,1;12,20,0"


def test_the_trackers_pixel_maps_are_those_vit_segment_draws_for_it():
    from vit.explain.methods.segment import MAP_FAMILIES

    assert list(prompts.pixel_maps("sam3_tracker")) == ["none"] + [m for m, f in MAP_FAMILIES.items()
                                                                    if "sam3_tracker" in f] == ["none",
                                                                                                "gradient_x_input"]


def test_the_library_pages_export_holds_the_trackers_prompt_masks_and_pixel_map(tracker):  # noqa: F811
    """"This view, offline (HTML)" of the tracker's page: the encoder's map, then the prompt, its masks with their
    captions (transformers' scores, as the page's) and the mask's gradient x input titled by its method."""
    import html

    from app_pages.explorer_sections import library_view, sam_prompts

    checkpoint = vit.load(tracker, device="cpu")
    target = sam_prompts.PromptTarget(checkpoint, ("tracker",), "m", image(), "photo")
    seg = vit.segment(checkpoint, image(), points=list(POINTS), box=BOX, mask=1)
    page = library_view._export(vit.explain(checkpoint, image(), "attention"), 0.6, "tracker", "photo.png", target,
                                dict(LINKED)).decode("utf-8")
    text = html.unescape(page)
    assert "<h2>Prompts</h2>" in page and "Prompt, in the image's pixels: (40, 10) on the object" in text
    for i in range(3):
        assert prompts.mask_caption(i, float(seg.scores[i]), int(seg.masks[i].sum()), WIDTH * HEIGHT,
                                    i == int(np.argmax(seg.scores))) in text
    assert "Which pixels made the mask: Gradient x input" in text
    assert "<h2>Prompts</h2>" not in library_view._export(vit.explain(checkpoint, image(), "attention"), 0.6,
                                                          "tracker", "photo.png").decode("utf-8")
