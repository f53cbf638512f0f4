"""The explorer's Prompts section for a whole SAM / SAM 2 (issue 81), driven through AppTest: a prompt's masks, IoU
scores and decoder attention are the library's (transformers' whole model on the same image and prompt), the link
reproduces them in a fresh session, a second prompt runs the decoder alone, and a click's point is the image pixel
under it.

The models are test_sam_prompts' tiny random ``SamModel`` / ``Sam2Model`` saved whole with their processors; the
image is 90 x 50 px, so a prompt read with x and y swapped lands elsewhere (or outside the image)."""

import io
import re

import numpy as np
import pytest
import torch
from helpers import displayed
from PIL import Image
from streamlit.testing.v1 import AppTest
from test_app import APP, TIMEOUT, dirs, png_bytes, run_app, sidebar_widget, upload  # noqa: F401 (a fixture)
from test_sam_prompts import (
    _sam,
    _sam2,
    library_inputs,
    library_run,
    recorded_attention,
    with_a_shrunk_decoder_weight,
)

from vit.app import sam_prompt_view as prompts

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dirs")]

PROMPT = dict(points=[(70, 20, 1), (30, 35, 0)], box=(10, 5, 85, 45))
LINKED = {"points": ((70, 20, 1), (30, 35, 0)), "box": (10, 5, 85, 45), "token": "mask2", "dattn": "b2.i2t",
          "dhead": 2}


@pytest.fixture(scope="module", params=["sam", "sam2"])
def whole(request, tmp_path_factory):
    """(family, the library's model, its processor, the folder it is saved whole in)."""
    model, processor = (_sam if request.param == "sam" else _sam2)()
    folder = tmp_path_factory.mktemp(request.param) / "model"
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return request.param, model, processor, folder


def opened(folder, **state) -> AppTest:
    """The explorer on ``folder`` with a 90 x 50 upload, ``state`` set before the next run."""
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(folder))
    at.run()
    upload(at, "photo.png", png_bytes(90, 50, seed=4))
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def image() -> Image.Image:
    """The uploaded photo, as the page decodes it."""
    return Image.open(io.BytesIO(png_bytes(90, 50, seed=4))).convert("RGB")


def mask_captions(at: AppTest) -> list[str]:
    return [displayed(c.value) for c in at.main.caption if displayed(c.value).startswith("mask ")]


def expected_captions(family, model, processor) -> tuple[list[str], object]:
    """The three masks' captions from the library's own answer to ``PROMPT`` on the image."""
    inputs = library_inputs(processor, image(), **PROMPT)
    with torch.no_grad():
        out, masks = library_run(family, model, processor, inputs)
    scores = out.iou_scores[0, 0]
    best = int(scores.argmax())
    return [prompts.mask_caption(i, float(scores[i]), int(masks[i].sum()), 90 * 50, i == best)
            for i in range(3)], inputs


def drawn_maps(monkeypatch) -> list[np.ndarray]:
    """The maps the page draws with the explorer's overlay code, in order."""
    from vit.app import drawing

    drawn, overlay = [], drawing.overlay_image
    monkeypatch.setattr(drawing, "overlay_image", lambda image, map2d, *a, **k: drawn.append(np.asarray(map2d))
                        or overlay(image, map2d, *a, **k))
    return drawn


def check_the_librarys(at, family, model, processor, drawn):
    captions, inputs = expected_captions(family, model, processor)
    assert mask_captions(at) == captions
    # mask 2's token (the decoder's tokens: SAM's IoU token then 4 mask tokens, SAM 2's object-score token first;
    # multimask outputs are mask tokens 1..3), block 2's image-to-token attention, head 2
    weights = recorded_attention(family, model, processor, inputs)
    position = {"sam": 1, "sam2": 2}[family] + 1 + 1
    grid = {"sam": (7, 7), "sam2": (8, 8)}[family]
    expected = weights[3 * 1 + 2][0][1, :, position].reshape(grid)
    np.testing.assert_allclose(drawn[-1], expected.numpy(), rtol=0, atol=1e-5)
    assert "block 2, image to token attention, head 2" in " ".join(displayed(c.value) for c in at.main.caption)


def url(at: AppTest) -> dict[str, str]:
    return {k: v[-1] if isinstance(v, list) else v for k, v in ((k, at.query_params[k]) for k in at.query_params)}


def test_a_prompts_masks_scores_and_decoder_attention_are_the_librarys_and_the_link_reproduces_them(whole,
                                                                                                 monkeypatch):
    family, model, processor, folder = whole
    drawn = drawn_maps(monkeypatch)
    at = opened(folder, sam_linked=LINKED)  # the prompt as a click and a drag leave it (and as a link gives it)
    assert not at.main.error, [e.value for e in at.main.error]
    check_the_librarys(at, family, model, processor, drawn)
    link = url(at)
    assert {k: link[k] for k in ("points", "box", "token", "dattn", "dhead")} == {
        "points": "70,20,1;30,35,0", "box": "10,5,85,45", "token": "mask2", "dattn": "b2.i2t", "dhead": "2"}

    fresh = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in link.items():
        fresh.query_params[key] = value
    fresh.run()
    assert not fresh.exception and not fresh.main.error, [e.value for e in fresh.main.error]
    check_the_librarys(fresh, family, model, processor, drawn)
    assert url(fresh) == link


def test_a_second_prompt_runs_the_decoder_alone_and_the_same_prompt_nothing(whole, monkeypatch):
    from vit.explain.methods import segment

    _, _, _, folder = whole
    encoded, decoded = [], []
    embed, decode = segment.image_embedding, segment.decode
    monkeypatch.setattr(segment, "image_embedding", lambda *a, **k: encoded.append(1) or embed(*a, **k))
    monkeypatch.setattr(segment, "decode", lambda *a, **k: decoded.append(1) or decode(*a, **k))
    at = opened(folder, sam_linked={"points": ((70, 20, 1),)})
    assert len(encoded) == 1 and mask_captions(at)
    [best] = [i for i, c in enumerate(mask_captions(at)) if c.endswith("(best)")]
    assert at.radio(key="sam_token").value == f"mask{best + 1}"  # until a token is chosen, the best mask's
    first = len(decoded)
    at.session_state["sam_points"] = [(70, 20, 1), (20, 30, 0)]  # as a second click leaves it
    at.run()
    assert len(encoded) == 1 and len(decoded) > first
    again = len(decoded)
    at.run()  # any other widget's rerun: the answer is kept
    assert len(encoded) == 1 and len(decoded) == again


def test_a_link_prompt_outside_the_image_is_dropped_with_one_line(whole):
    _, _, _, folder = whole
    at = opened(folder, sam_linked={"points": ((20, 70, 1),)})  # (70, 20) read as y, x: below the 50-px image
    [warning] = [displayed(w.value) for w in at.main.warning if "prompt was not used" in displayed(w.value)]
    assert "outside the 90x50 image" in warning and "\n" not in warning
    assert not mask_captions(at)


def test_a_folder_whose_prompt_half_does_not_fit_its_config_is_one_line(whole, tmp_path):
    """Issue 95, item 6: torch's size-mismatch RuntimeError reached the page as Streamlit's traceback box."""
    folder, name = with_a_shrunk_decoder_weight(whole[3], tmp_path)
    at = opened(folder, sam_linked={"points": ((20, 20, 1),)})
    [error] = [displayed(e.value) for e in at.error]
    assert f"weights do not match its config.json (size mismatch for {name}:" in error and "\n" not in error
    assert not mask_captions(at)


def test_a_click_is_the_image_pixel_under_it_x_from_the_left_y_from_the_top():
    # 90 x 50 px: 64 clickable cells along the long side (1.40625 px), 36 rows; point 14 * 64 + 49 is row 14, col 49
    assert prompts.click_grid((90, 50)) == (36, 64, 90 / 64)
    assert prompts.click_from_selection({"point_indices": [14 * 64 + 49]}, (90, 50)) == (70, 20)
    figure = prompts.prompt_figure("data:,", (0, 0, 90, 90), (90, 50))  # SAM's canvas: 90 x 90 px of the image's
    xs, ys = figure.data[0].x, figure.data[0].y
    assert (xs[14 * 64 + 49], ys[14 * 64 + 49]) == (70, 20)  # the point drawn where the click lands
    assert list(figure.layout.xaxis.range) == [0, 90] and list(figure.layout.yaxis.range) == [90, 0]
    assert max(ys) < 50 and max(xs) < 90  # points on the image only, none on SAM's padding


def test_a_drag_is_the_box_it_drew_in_the_images_pixels_clipped_to_it():
    assert prompts.box_from_selection({"box": [{"x": [80.4, 10.2], "y": [5, 60]}]}, (90, 50)) == (10, 5, 80, 50)
    assert prompts.box_from_selection({"box": [{"x": [3, 3.2], "y": [5, 9]}]}, (90, 50)) is None
    assert prompts.box_from_selection({"box": [], "point_indices": [3]}, (90, 50)) is None


def test_the_prompt_in_a_link_reads_back_as_written():
    from vit.app import share

    values, notes = share.decode({"points": "70,20,1;30.5,35,0", "box": "10,5,85,45", "token": "iou",
                                  "dattn": "final", "dhead": "0"}, {}, False)
    assert notes == [] and values["points"] == ((70, 20, 1), (30.5, 35, 0)) and values["box"] == (10, 5, 85, 45)
    assert share.encode(values) == {"points": "70,20,1;30.5,35,0", "box": "10,5,85,45", "token": "iou",
                                    "dattn": "final", "dhead": "0"}
    _, notes = share.decode({"points": "70,20", "dattn": "b0.t2i"}, {}, False)
    assert len(notes) == 2 and all(re.search("was not used: give", n) for n in notes)


def test_the_exported_view_holds_the_prompts_masks_and_the_decoders_attention(whole, monkeypatch):
    import functools
    import html

    from app_pages.explorer_sections import share_view

    family, model, processor, folder = whole
    exports = []  # the page's "Export this view" data, built as its button would on a click
    monkeypatch.setattr(share_view, "partial", lambda f, *a, **k: exports.append(functools.partial(f, *a, **k))
                        or exports[-1])
    drawn = drawn_maps(monkeypatch)
    opened(folder, sam_linked=LINKED)
    last = [f for f in exports if getattr(f.func, "__name__", "") == "_export"][-1]
    before = len(drawn)
    page = last().decode()
    captions, _ = expected_captions(family, model, processor)
    assert all(f"<figcaption class=\"caption\">{html.escape(c)}</figcaption>" in page for c in captions)
    assert "(70, 20) on the object; (30, 35) off the object; the box (10, 5) to (85, 45)" in page
    assert str(folder.parent) not in page and "Model</th><td>model</td>" in page  # by its name, not the server's path
    assert "Decoder attention</th><td>block 2, image to token" in page and 'id="decoder-attention"' in page
    grid = {"sam": (7, 7), "sam2": (8, 8)}[family]
    weights = recorded_attention(family, model, processor, library_inputs(processor, image(), **PROMPT))
    # the export draws its attention first: block 2's image-to-token, head 2, of mask 2's token
    expected = weights[5][0][1, :, {"sam": 3, "sam2": 4}[family]].reshape(grid).numpy()
    np.testing.assert_allclose(drawn[before], expected, rtol=0, atol=1e-5)
    assert 'id="pixel-map"' not in page and "Which pixels made the mask:" not in page  # none chosen: none drawn


def test_the_masks_attnlrp_drawn_is_lxts_on_the_librarys_model_and_the_link_keeps_it(whole, monkeypatch):
    """"Which pixels made the mask": AttnLRP of the drawn mask (mask 2, the chosen token's) summed over it, equal to
    lxt's rules patched into the library's whole model (test_sam_attnlrp_lxt), kept in the link as ``smap``."""
    from test_sam_attnlrp_lxt import RTOL, distance, lxt_relevance

    family, model, processor, folder = whole
    drawn = drawn_maps(monkeypatch)
    at = opened(folder, sam_linked={**LINKED, "smap": "attnlrp"})
    assert not at.main.error, [e.value for e in at.main.error]
    theirs = lxt_relevance(family, model, processor, image(), PROMPT, 1, None, monkeypatch)
    assert distance(drawn[-1], theirs) <= RTOL
    assert "AttnLRP (lxt's rules" in " ".join(displayed(c.value) for c in at.main.caption)
    link = url(at)
    assert link["smap"] == "attnlrp"
    fresh = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in link.items():
        fresh.query_params[key] = value
    fresh.run()
    assert not fresh.exception and fresh.radio(key="sam_map").value == "attnlrp"
    assert distance(drawn[-1], theirs) <= RTOL and url(fresh) == link


def drawn_colours(monkeypatch) -> list[tuple[np.ndarray, str, float | None, float | None]]:
    """``(map, colour map, vmin, vmax)`` of every map drawn with the explorer's overlay code, in order."""
    from vit.app import drawing

    drawn, overlay = [], drawing.overlay_image

    def record(image, map2d, opacity, colormap, mode, grid, outline, vmin=None, vmax=None, *a, **k):
        drawn.append((np.asarray(map2d), colormap, vmin, vmax))
        return overlay(image, map2d, opacity, colormap, mode, grid, outline, vmin, vmax, *a, **k)

    monkeypatch.setattr(drawing, "overlay_image", record)
    return drawn


def colour_bars(at: AppTest) -> list[tuple[str, float, float]]:
    """``(colour map, vmin, vmax)`` of every colour bar on the page (``drawing.colorbar_html``), in order."""
    bars = [e.proto.body for e in at.get("html") if 'class="vit-colorbar"' in e.proto.body]
    return [(re.search(r'data-colormap="([^"]*)"', b)[1], float(re.search(r'data-vmin="([^"]+)"', b)[1]),
             float(re.search(r'data-vmax="([^"]+)"', b)[1])) for b in bars]


def test_every_choice_of_which_pixels_made_the_mask_draws_its_map_and_colour_bar(whole, monkeypatch):
    """Issue 90, item 2: each choice of the picker, clicked in the page in turn, draws ``vit.segment``'s map of the
    drawn mask with a colour bar over its values (LeGrad's, unsigned, on its own range: that one crashed the page
    with no range for its bar), and "none" draws none; no choice raises or shows an error (SAM 2 is not offered
    LeGrad, which its FPN neck cannot give)."""
    import vit

    family, _, _, folder = whole
    drawn = drawn_colours(monkeypatch)
    at = opened(folder, sam_linked=LINKED)
    checkpoint = vit.load(folder, device="cpu")
    prompt = dict(points=list(LINKED["points"]), box=LINKED["box"])
    choices = prompts.pixel_maps(family)
    assert list(choices) == ["none", "gradient_x_input", "attnlrp", *(["legrad"] if family == "sam" else [])]
    assert at.radio(key="sam_map").options == list(choices.values())
    before = len(colour_bars(at))  # the main map's and the decoder attention's, none chosen yet
    for method in [*list(choices)[1:], "none"]:  # none last: from a drawn map back to none
        at.radio(key="sam_map").set_value(method).run()
        assert not at.exception, [e.message for e in at.exception]
        assert not at.main.error, [e.value for e in at.main.error]
        captions = " ".join(displayed(c.value) for c in at.main.caption)
        bars = colour_bars(at)
        if method == "none":
            assert len(bars) == before and "back to each input pixel" not in captions
            continue
        expected = np.asarray(vit.segment(checkpoint, image(), **prompt, mask=1, methods=[method]).maps[method])
        values, cmap, _, _ = drawn[-1]  # the pixel map is drawn last, under the decoder attention
        np.testing.assert_allclose(values, expected, rtol=0, atol=1e-6)
        assert len(bars) == before + 1, bars  # the pixel map's last
        name, low, high = bars[-1]
        assert name == cmap and np.isfinite([low, high]).all() and low <= values.min() and values.max() <= high
        assert prompts.describe_pixel_map(method, 1, expected) in captions


def test_a_linked_map_the_family_cannot_draw_is_reset_to_none_with_one_line(whole):
    """LeGrad in a link: drawn on SAM; on SAM 2 (whose FPN neck reads every Hiera stage at once) the picker is back at
    none with one line saying why, not the engine's refusal as an error."""
    family, _, _, folder = whole
    at = opened(folder, sam_linked={**LINKED, "smap": "legrad"})
    assert not at.main.error, [e.value for e in at.main.error]
    warnings = [displayed(w.value) for w in at.main.warning if "does not apply" in displayed(w.value)]
    if family == "sam":
        assert at.radio(key="sam_map").value == "legrad" and not warnings
    else:
        assert at.radio(key="sam_map").value == "none"
        assert warnings == ["LeGrad does not apply to SAM 2's image encoder: no pixel map is drawn."]


AT = (70, 20)  # the pixel explained: the prompt's first point (on the object)


def test_the_masks_pixel_map_at_a_pixel_is_vit_segments_there_and_the_link_reproduces_it(whole, monkeypatch):
    """"Explain: its logit at one pixel": the drawn map is ``vit.segment(..., at=(x, y))``'s (itself equal to autograd
    on the library's model, test_sam_prompts), not the mask's sum; the link keeps the pixel as ``sat``; gradient x
    input is signed, drawn on the diverging colours symmetric around 0."""
    import vit

    family, model, processor, folder = whole
    drawn = drawn_colours(monkeypatch)
    at = opened(folder, sam_linked={**LINKED, "smap": "gradient_x_input", "sat": AT})
    assert not at.main.error, [e.value for e in at.main.error]
    checkpoint = vit.load(folder, device="cpu")
    prompt = dict(points=list(LINKED["points"]), box=LINKED["box"])
    theirs = vit.segment(checkpoint, image(), **prompt, mask=1, methods=["gradient_x_input"], at=AT)
    summed = vit.segment(checkpoint, image(), **prompt, mask=1, methods=["gradient_x_input"])
    expected = np.asarray(theirs.maps["gradient_x_input"])
    values, cmap, vmin, vmax = drawn[-1]
    np.testing.assert_allclose(values, expected, rtol=0, atol=1e-6)
    assert not np.allclose(expected, np.asarray(summed.maps["gradient_x_input"]))  # the pixel, not the sum
    bound = float(np.abs(expected).max())
    assert cmap == "RdBu_r" and vmin == pytest.approx(-bound) and vmax == pytest.approx(bound)
    assert "logit at pixel (70, 20)" in " ".join(displayed(c.value) for c in at.main.caption)
    link = url(at)
    assert link["smap"] == "gradient_x_input" and link["sat"] == "70,20"
    fresh = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in link.items():
        fresh.query_params[key] = value
    fresh.run()
    assert not fresh.exception and not fresh.main.error, [e.value for e in fresh.main.error]
    assert fresh.radio(key="sam_map_at").value == "pixel" and url(fresh) == link
    np.testing.assert_allclose(drawn[-1][0], expected, rtol=0, atol=1e-6)


def test_the_exported_view_holds_the_masks_pixel_map_titled_by_its_method(whole, monkeypatch):
    """The export draws "Which pixels made the mask" as the page does: its title and caption name the method and the
    pixel explained, the map is the page's (gradient x input on the diverging colours), with its colour bar."""
    import functools
    import html

    from app_pages.explorer_sections import share_view

    _, _, _, folder = whole
    exports = []
    monkeypatch.setattr(share_view, "partial", lambda f, *a, **k: exports.append(functools.partial(f, *a, **k))
                        or exports[-1])
    drawn = drawn_colours(monkeypatch)
    at = opened(folder, sam_linked={**LINKED, "smap": "gradient_x_input", "sat": AT})
    on_page = drawn[-1]
    [caption] = [displayed(c.value) for c in at.main.caption if displayed(c.value).startswith("Gradient x input")]
    last = [f for f in exports if getattr(f.func, "__name__", "") == "_export"][-1]
    before = len(drawn)
    page = last().decode()
    assert '<h2 id="pixel-map-title">Which pixels made the mask: Gradient x input</h2>' in page
    assert 'id="pixel-map"' in page and 'id="pixel-map-colorbar"' in page
    assert f'<figcaption class="caption">{html.escape(caption)}</figcaption>' in page
    assert "logit at pixel (70, 20)" in caption
    assert "Explained at pixel (x, y)</th><td>(70, 20)" in page
    [(values, cmap, vmin, vmax)] = [d for d in drawn[before:] if d[0].shape == on_page[0].shape
                                    and np.array_equal(d[0], on_page[0])]
    assert (cmap, vmin, vmax) == on_page[1:] and cmap == "RdBu_r" and vmin == -vmax


def test_a_pixel_map_the_export_cannot_draw_is_named_with_the_reason(whole, monkeypatch):
    """A map refused in the export (over the memory limit, an empty mask) is not left out silently: its title and the
    one-line reason stand where it would be."""
    import functools

    from app_pages.explorer_sections import sam_prompts, share_view

    _, _, _, folder = whole
    exports = []
    monkeypatch.setattr(share_view, "partial", lambda f, *a, **k: exports.append(functools.partial(f, *a, **k))
                        or exports[-1])
    opened(folder, sam_linked={**LINKED, "smap": "attnlrp"})

    def refused(*args, **kwargs):
        raise ValueError("AttnLRP of the mask would hold 9 GB, over the 1 GB limit")

    monkeypatch.setattr(sam_prompts, "mask_map", refused)
    last = [f for f in exports if getattr(f.func, "__name__", "") == "_export"][-1]
    page = last().decode()
    assert '<h2 id="pixel-map-title">Which pixels made the mask: AttnLRP</h2>' in page
    assert ('<p class="caption" id="pixel-map-refused">Not drawn: AttnLRP of the mask would hold 9 GB, over the 1 GB '
            'limit</p>') in page
    assert 'id="pixel-map"' not in page


def test_the_pixel_maps_signed_colours_come_from_the_engines_list():
    from vit.explain.methods.segment import MAP_LABELS, SIGNED_MAPS

    values = np.array([[-0.5, 0.25], [0.0, 0.1]], dtype=np.float32)
    assert set(SIGNED_MAPS) == {"gradient_x_input", "attnlrp"}  # input times gradient, relevance: both signed
    for method in MAP_LABELS:
        cmap, vmin, vmax = prompts.pixel_map_colours(method, values, "viridis")
        if method in SIGNED_MAPS:
            assert (cmap, vmin, vmax) == ("RdBu_r", -0.5, 0.5)
        else:
            assert (cmap, vmin, vmax) == ("viridis", None, None)


def test_an_unsigned_pixel_maps_colour_bar_spans_its_finite_values_whatever_they_are():
    """LeGrad's colours have no bounds of their own (None: the map's range); its colour bar is given the range the
    colours span (``drawing.map_range``, as ``overlay.colorize`` reads it): finite values only, 0 to 1 with none."""
    from vit.app import drawing

    for values, expected in [([[0.0, 0.25], [0.5, 0.125]], (0.0, 0.5)), ([[np.nan, 2.0], [np.inf, 1.0]], (1.0, 2.0)),
                             ([[3.0, 3.0]], (3.0, 3.0)), ([[np.nan, np.nan]], (0.0, 1.0))]:
        values = np.asarray(values, dtype=np.float32)
        cmap, vmin, vmax = prompts.pixel_map_colours("legrad", values, "magma")
        assert drawing.map_range(values, vmin, vmax) == expected
        bar = drawing.colorbar_html(*drawing.map_range(values, vmin, vmax), cmap)
        assert f'data-vmin="{expected[0]!r}"' in bar and 'data-colormap="magma"' in bar


def test_the_pixel_to_explain_in_a_link_reads_back_and_a_bad_one_is_one_line():
    from vit.app import share

    values, notes = share.decode({"smap": "attnlrp", "sat": "70,20"}, {}, False)
    assert notes == [] and values["sat"] == (70, 20)
    assert share.encode(values) == {"smap": "attnlrp", "sat": "70,20"}
    for bad in ("70", "70,20,1", "-3,4", "7.5,2", "x,y"):
        _, notes = share.decode({"sat": bad}, {}, False)
        [note] = notes
        assert "was not used: give the pixel to explain as x,y" in note and "\n" not in note
