"""The explorer's "Ask the VLM" (issue 80, item 4): a question to a tiny random VLM saved whole (test_vlm_answer's
builders), opened by path; its answer is transformers' greedy ``generate``; the clicked answer token's map, at the
picked layer and head, is ``VLMAnswer.attention``'s (the notebook API's, itself checked against transformers' eager
rows in test_vlm_answer) drawn over the pixels the model saw; the strip gives each token's share on the image; the
view is part of the link and of the exported HTML; a visitor without a token asks within bounds."""

import functools
from pathlib import Path

import numpy as np
import pytest
from helpers import displayed
from test_app import dirs, run_app, sidebar_widget, upload  # noqa: F401 (fixtures)
from test_app_share import notes, open_link

transformers = pytest.importorskip("transformers")
from test_vlm_answer import QUESTION, eager_generate, internvl_tiles, picture, saved_whole  # noqa: E402, F401

import vit  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dirs")]
LENGTH = 4


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``{kind: folder}``: LLaVA and Qwen2.5-VL saved whole with their processor (test_vlm_answer's builders)."""
    return saved_whole(tmp_path_factory, ("llava", "qwen2_5_vl"))


@pytest.fixture
def drawn(monkeypatch):
    """The maps the page draws over the image, in order."""
    from vit.app import drawing

    maps, original = [], drawing.overlay_image
    monkeypatch.setattr(drawing, "overlay_image",
                        lambda image, map2d, *a, **k: maps.append(np.asarray(map2d)) or original(image, map2d, *a, **k))
    return maps


def png(image) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def open_folder(folder):
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(folder))
    at.run()
    return upload(at, "photo.png", png(picture()))


def ask(at, question: str, length: int = LENGTH):
    [box] = [w for w in at.main.text_input if w.label == "Question"]
    [count] = [w for w in at.main.number_input if w.label == "Answer length"]
    count.set_value(length)
    box.set_value(question)
    at.run()
    assert not at.exception, [e.stack_trace for e in at.exception]
    return at


def pills(at):
    [tokens] = [w for w in at.main.pills if w.label == "Answer token"]
    return tokens


def main_select(at, label: str):
    [found] = [w for w in at.main.selectbox if w.label == label]
    return found


@functools.cache
def answer_of(folder, length: int = LENGTH):
    """The API's answer to ``QUESTION`` about ``picture()`` (the page's reference): computed once per folder (the
    module's own, tiny) and length, read-only in every test that compares with it (issue 112: it was opened and
    generated again in each of 14 tests)."""
    return vit.ask_vlm(vit.open_vlm(folder), picture(), QUESTION, max_new_tokens=length)


@pytest.mark.parametrize("kind", ["llava", "qwen2_5_vl"])
def test_the_answer_is_generates_and_a_clicked_tokens_map_is_vlm_answer_attention(folders, kind, drawn):
    at = open_folder(folders[kind])
    assert "Ask the VLM" in [h.value for h in at.main.subheader]
    ask(at, QUESTION)
    answer = answer_of(folders[kind])
    out, inputs, _ = eager_generate(folders[kind], picture())
    assert list(answer.tokens) == out.sequences[0, inputs["input_ids"].shape[1]:].tolist()[:LENGTH]
    shown = [t.value.strip() for t in at.main.text if t.value.startswith("Answer:")]
    assert shown == [f"Answer: {answer.text}".strip()]
    tokens = pills(at)
    assert len(tokens.options) == LENGTH
    np.testing.assert_allclose(drawn[-1], answer.attention(0, answer.layers - 1), rtol=0, atol=0)  # the default
    head = main_select(at, "Head")  # the heads fused: its box says so, not Streamlit's "Choose an option"
    assert head.value is None and head.proto.placeholder == "all heads (mean)"
    tokens.set_value(2)
    at.run()
    main_select(at, "Layer").set_value(0)
    at.run()
    main_select(at, "Head").set_value(1)
    at.run()
    assert not at.exception
    np.testing.assert_allclose(drawn[-1], answer.attention(2, 0, 1), rtol=0, atol=0)
    main_select(at, "Head").set_value(None)
    at.run()
    [fusion] = [w for w in at.main.radio if w.label == "Heads fused by"]
    fusion.set_value("max")
    at.run()
    assert main_select(at, "Head").proto.placeholder == "all heads (max)"
    np.testing.assert_allclose(drawn[-1], answer.image_rows(2, 0).amax(0).numpy().reshape(answer.grid)
                               if kind == "llava" else answer.attention(2, 0, None, "max"), rtol=0, atol=1e-7)
    assert not np.allclose(drawn[-1], answer.attention(2, 0))  # max is not the mean
    [strip] = [d for d in at.main.dataframe if "on the image" in d.value.columns]
    np.testing.assert_allclose(strip.value["on the image"].to_numpy() / 100,
                               [answer.image_share(i, 0) for i in range(LENGTH)], rtol=0, atol=1e-6)
    assert list(strip.value["token"]) == list(answer.pieces)


def test_a_click_redraws_without_generating_again(folders, monkeypatch):
    at = ask(open_folder(folders["llava"]), QUESTION)
    monkeypatch.setattr("vit.explain.language.vlm_answer.generate_answer",
                        lambda *a, **k: pytest.fail("the answer was generated again"))
    from vit.app import vlm_ask

    monkeypatch.setattr(vlm_ask, "generate_answer", lambda *a, **k: pytest.fail("the answer was generated again"))
    pills(at).set_value(1)
    at.run()
    main_select(at, "Layer").set_value(0)
    at.run()
    assert not at.exception, [e.stack_trace for e in at.exception]


def test_the_question_and_answer_are_shown_as_plain_text(folders):
    question = "**what** is <b>this</b> [x](http://a.b) ?"
    at = ask(open_folder(folders["llava"]), question)
    assert not at.main.error, [e.value for e in at.main.error]
    [box] = [w for w in at.main.text_input if w.label == "Question"]
    assert box.value == question
    assert [t for t in at.main.text if t.value.startswith("Answer:")]  # st.text: never Markdown


def test_a_tokens_label_shows_its_text_as_written():
    from types import SimpleNamespace

    from vit.app.vlm_ask import token_label

    answer = SimpleNamespace(pieces=("**dog**", " <b>x</b>", " ", "", "a\u202eb"), tokens=(5, 6, 7, 8, 9))
    assert [displayed(token_label(answer, i)) for i in range(5)] == ["**dog**", "·<b>x</b>", "·", "#8", "a\\u202eb"]


def test_tokens_alike_get_labels_apart_their_positions_said():
    """A widget knows its options by their labels: two answer tokens of the same text are told apart by their
    positions (from 1), every other label as written; a token whose own text looks like such a label stays apart."""
    from types import SimpleNamespace

    from vit.app.vlm_ask import token_labels

    answer = SimpleNamespace(pieces=(" the", " dog", " the", " the (3)", " the"), tokens=(5, 6, 5, 7, 5))
    labels = [displayed(label) for label in token_labels(answer)]
    assert labels == ["·the (1)", "·dog", "·the (3)", "·the (3) (4)", "·the (5)"], labels


def test_the_view_is_in_the_link_and_the_exported_html(folders, drawn, monkeypatch):
    from app_pages.explorer_sections import ask_vlm

    exports = []
    monkeypatch.setattr(ask_vlm, "partial", lambda f, *a, **k: exports.append(functools.partial(f, *a, **k))
                        or exports[-1])
    folder = folders["qwen2_5_vl"]
    link = {"model": str(folder), "question": QUESTION, "answer_length": str(LENGTH), "answer_token": "3",
            "lm_layer": "1", "lm_head": "2"}
    at = open_link(link)
    upload(at, "photo.png", png(picture()))
    assert notes(at) == [] and not at.main.error, [e.value for e in at.main.error]
    answer = answer_of(folder)
    np.testing.assert_allclose(drawn[-1], answer.attention(2, 0, 1), rtol=0, atol=0)
    params = {k: at.query_params[k][0] if isinstance(at.query_params[k], list) else at.query_params[k]
              for k in at.query_params}
    assert {k: params.get(k) for k in link if k != "model"} == {k: v for k, v in link.items() if k != "model"}
    [page] = [f().decode() for f in exports if getattr(f.func, "__name__", "") == "_export"][-1:]
    assert "where the answer looked" in page and "Answer token 3" in page
    assert "Question</th><td>what is this ?" in page
    assert str(folder) not in page and f"Model</th><td>{folder.name}</td>" in page  # by its name, not its path

    at = open_link({**link, "answer_token": "9", "lm_head": "7"})  # past the answer's tokens, the model's heads
    upload(at, "photo.png", png(picture()))
    lines = notes(at)
    assert any("answer_token=9 was not used: the answer has 4 tokens" in n for n in lines), lines
    assert any("lm_head=7 was not used: the language model has 4 heads" in n for n in lines), lines


def test_a_visitor_without_a_token_asks_within_bounds(folders):
    from vit.app import vlm_ask
    from vit.explain.language.vlm_answer import prepare

    vlm = vit.open_vlm(folders["qwen2_5_vl"])
    assert vlm_ask.max_new_tokens(False) == vlm_ask.VISITOR_NEW_TOKENS < vlm_ask.max_new_tokens(True)
    prepared = prepare(vlm, picture(), QUESTION, max_new_tokens=vlm_ask.VISITOR_NEW_TOKENS + 1)
    with pytest.raises(ValueError, match=r"^an answer of 33 tokens is more than the 32 a visitor may ask for here"):
        vlm_ask.check_visitor(prepared, may_open=False)
    vlm_ask.check_visitor(prepared, may_open=True)
    large = prepare(vlm, picture(1400, 1000), QUESTION, max_new_tokens=4)  # the processor's max_pixels: 40 units
    assert large.layout.grid[0] * large.layout.grid[1] <= vlm_ask.VISITOR_PATCHES  # this processor stays small
    vlm_ask.check_visitor(prepare(vlm, [picture(1400, 1000)] * 7, QUESTION, max_new_tokens=4), may_open=False)
    several = prepare(vlm, [picture(1400, 1000)] * 8, QUESTION, max_new_tokens=4)  # 140 patches each
    with pytest.raises(ValueError, match=r"^the model's processor makes these 8 images 1,120 patches in all, more "
                                         r"than the 1,024 a visitor may ask about here; ask about fewer"):
        vlm_ask.check_visitor(several, may_open=False)
    vlm_ask.check_visitor(several, may_open=True)


def test_the_page_streams_the_answer_so_far_into_its_work(folders):
    """The page's generation (``vlm_ask.generate``) writes the answer so far into its work as each token is chosen,
    before the token is reported: the text drawn under the progress is ``generate``'s first k tokens, decoded."""
    from vit.app import vlm_ask, work
    from vit.explain.language.vlm_answer import prepare

    seen = []

    class Watched(work.Work):
        def __call__(self, done, total):
            seen.append((done, self.so_far))
            super().__call__(done, total)

    vlm = vit.open_vlm(folders["llava"])
    answer = vlm_ask.generate(vlm, prepare(vlm, picture(), QUESTION, max_new_tokens=LENGTH),
                              Watched("key", "test", unit="tokens"))
    out, inputs, _ = eager_generate(folders["llava"], picture())
    expected = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()[:LENGTH]
    decode = transformers.AutoProcessor.from_pretrained(folders["llava"]).decode
    assert list(answer.tokens) == expected
    assert seen == [(0, "")] + [(k, f"Answer so far ({k} of {LENGTH} tokens at most): "
                                    f"{decode(expected[:k], skip_special_tokens=True)}") for k in range(1, LENGTH + 1)]


def test_the_answer_grows_under_its_progress_and_stop_keeps_its_tokens_and_their_maps(folders, drawn, monkeypatch):
    """While the answer is generated the page draws its progress, the answer so far and Stop; Stop ends it after the
    tokens so far, which stay clickable, each drawn with the whole answer's map of that token."""
    import time

    from app_pages.explorer_sections import long_work
    from vit.app import work

    original = work.Work.__call__

    def held_after_one_token(self, done, total):  # the generation waits after its first token until Stop is asked
        deadline = time.monotonic() + 30
        while self.unit == "tokens" and done == 1 and self._reason is None and time.monotonic() < deadline:
            self.touch()
            time.sleep(0.02)
        original(self, done, total)

    monkeypatch.setattr(work.Work, "__call__", held_after_one_token)
    monkeypatch.setattr(long_work, "QUICK_S", 0.5)
    folder = folders["llava"]
    whole = answer_of(folder)
    at = ask(open_folder(folder), QUESTION)
    assert [b for b in at.button if b.key == "long_work_stop-ask_vlm"], "no Stop button while the answer is generated"
    [bar] = at.get("progress")
    assert "Answering in at most 4 tokens" in bar.proto.text
    growing = [t.value for t in at.main.text if t.value.startswith("Answer so far")]
    assert growing == [f"Answer so far (1 of {LENGTH} tokens at most): {whole.pieces[0].strip()}"], growing
    assert not pills_or_none(at)
    [stop] = [b for b in at.button if b.key == "long_work_stop-ask_vlm"]
    stop.click()
    at.run()
    assert not at.exception, [e.stack_trace for e in at.exception]
    assert any(f"stopped after 1 of {LENGTH} tokens (stopped by you)" in displayed(i.value) for i in at.info), \
        [i.value for i in at.info]
    shown = [t.value.strip() for t in at.main.text if t.value.startswith("Answer:")]
    assert shown == [f"Answer: {whole.pieces[0]}".strip()]
    assert len(pills(at).options) == 1
    np.testing.assert_allclose(drawn[-1], whole.attention(0, whole.layers - 1), rtol=0, atol=0)
    main_select(at, "Layer").set_value(0)
    at.run()  # a click redraws the stopped answer's map: it is not generated again
    assert not at.exception and len(pills(at).options) == 1
    np.testing.assert_allclose(drawn[-1], whole.attention(0, 0), rtol=0, atol=0)


def pills_or_none(at):
    return [w for w in at.main.pills if w.label == "Answer token"]


def test_a_visitor_without_a_token_asks_a_cached_vlm_within_bounds(folders, dirs, monkeypatch):  # noqa: F811
    """Behind a token (``VIT_TRAIN_TOKEN``) a visitor opens a VLM of the server's Hugging Face cache, asks at most
    ``VISITOR_NEW_TOKENS``: a link's longer answer is dropped in one line and the box stops there."""
    import shutil

    from vit.app.vlm_ask import VISITOR_NEW_TOKENS

    checkpoints, _ = dirs
    model_dir = checkpoints.parent / "hf-cache" / "models--tiny--llava"  # HF_HUB_CACHE (the dirs fixture)
    snapshot = model_dir / "snapshots" / "rev1"
    shutil.copytree(folders["llava"], snapshot)
    (model_dir / "refs").mkdir()
    (model_dir / "refs" / "main").write_text("rev1")
    monkeypatch.setenv("VIT_TRAIN_TOKEN", "secret")
    at = open_link({"model": "tiny/llava", "question": QUESTION, "answer_length": "100"})
    upload(at, "photo.png", png(picture()))
    assert not at.main.error, [e.value for e in at.main.error]
    [count] = [w for w in at.main.number_input if w.label == "Answer length"]
    assert count.value == VISITOR_NEW_TOKENS and count.max == VISITOR_NEW_TOKENS
    assert any(f"answer_length=100 was not used: a visitor may ask for at most {VISITOR_NEW_TOKENS} tokens" in n
               for n in notes(at)), notes(at)
    assert len(pills(at).options) == len(answer_of(folders["llava"], VISITOR_NEW_TOKENS).tokens)


def test_the_map_may_be_gradient_x_attention_at_a_layer_or_rolled_out(folders, drawn):
    """The "Map" choice draws ``VLMAnswer.relevance`` (checked against autograd on transformers' eager model in
    test_vlm_relevance) for the clicked token, at the picked layer or rolled out; the choice is in the link."""
    folder = folders["qwen2_5_vl"]
    at = ask(open_folder(folder), QUESTION)
    answer = answer_of(folder)
    pills(at).set_value(2)
    at.run()
    main_select(at, "Layer").set_value(0)
    at.run()
    [method] = [w for w in at.main.radio if w.label == "Map"]
    method.set_value("gradxattn")
    at.run()
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    np.testing.assert_allclose(drawn[-1], answer.relevance(2, 0), rtol=0, atol=1e-6)
    assert not [w for w in at.main.selectbox if w.label == "Head"]  # the rule averages the heads
    assert at.query_params.get("lm_method") in ("gradxattn", ["gradxattn"])
    [method] = [w for w in at.main.radio if w.label == "Map"]
    method.set_value("gradxattn_rollout")
    at.run()
    np.testing.assert_allclose(drawn[-1], answer.relevance(2), rtol=0, atol=1e-6)
    assert not np.allclose(drawn[-1], answer.relevance(2, 0), rtol=0, atol=1e-6)
    assert any("gradient × attention rolled out over every layer" in c.value for c in at.main.caption)

    at = open_link({"model": str(folder), "question": QUESTION, "answer_length": str(LENGTH), "answer_token": "3",
                    "lm_layer": "1", "lm_method": "gradxattn"})
    upload(at, "photo.png", png(picture()))
    assert notes(at) == [] and not at.main.error, [e.value for e in at.main.error]
    np.testing.assert_allclose(drawn[-1], answer.relevance(2, 0), rtol=0, atol=1e-6)


def test_a_tiled_image_is_drawn_over_the_canvas_it_was_read_as_and_its_overview_on_a_toggle(
        internvl_tiles, monkeypatch):  # noqa: F811 (test_vlm_answer's fixture)
    """InternVL cut the photo into 2 x 3 tiles and a thumbnail: the map is drawn over the tiles' canvas as the model
    read it (the answer's ``layout.pixels``, checked against the image processor in test_vlm_answer), at the canvas's
    aspect, not over a square tile; the toggle draws the overview's map over the thumbnail; the link keeps it."""
    from PIL import Image
    from test_app_share import url

    from vit.app import drawing
    from vit.explain.views.overlay import display_image

    under, original = [], drawing.overlay_image
    monkeypatch.setattr(drawing, "overlay_image", lambda image, map2d, *a, **k: under.append(
        (image, np.asarray(map2d))) or original(image, map2d, *a, **k))
    at = ask(open_folder(internvl_tiles), QUESTION)
    answer = answer_of(internvl_tiles)
    image, map2d = under[-1]
    np.testing.assert_allclose(map2d, answer.attention(0, answer.layers - 1), rtol=0, atol=0)
    canvas = answer.layout.pixels
    assert map2d.shape == (8, 12) and canvas.shape[:2] == (64, 96)
    assert abs(image.width / image.height - 96 / 64) < 0.02  # the canvas, at display size
    # The tiny model answers one word thrice: the test's pills (AppTest reads a pill back by its label) pick the last,
    # whose label is its own.
    pills(at).set_value(LENGTH - 1)
    at.run()
    np.testing.assert_allclose(under[-1][1], answer.attention(LENGTH - 1, answer.layers - 1), rtol=0, atol=0)
    expected = display_image(Image.fromarray(canvas), max_side=480)
    np.testing.assert_array_equal(np.asarray(image), np.asarray(expected))  # the canvas, at display size
    [toggle] = [w for w in at.main.toggle if w.label == "The whole image's view"]
    toggle.set_value(True)
    at.run()
    assert not at.exception, [e.stack_trace for e in at.exception]
    image, map2d = under[-1]
    np.testing.assert_allclose(map2d, answer.attention(LENGTH - 1, answer.layers - 1, overview=True), rtol=0, atol=0)
    assert image.width == image.height  # the thumbnail: one square tile
    expected = display_image(Image.fromarray(answer.layout.overview.pixels), max_side=480)
    np.testing.assert_array_equal(np.asarray(image), np.asarray(expected))
    assert url(at)["lm_overview"] == "1"
    linked = open_link(url(at))
    assert linked.session_state["vlm_ask_overview"] is True


def test_the_map_may_be_the_tokens_tam(folders, drawn):
    """The "Map" choice "tam" draws ``VLMAnswer.tam`` (checked against the authors' function in test_vlm_tam) for
    the clicked token; the choice is in the link, and a link with it draws it again."""
    folder = folders["qwen2_5_vl"]
    at = ask(open_folder(folder), QUESTION)
    answer = answer_of(folder)
    pills(at).set_value(2)
    at.run()
    [method] = [w for w in at.main.radio if w.label == "Map"]
    assert "tam" in method.options or "TAM (token activation map)" in method.options
    method.set_value("tam")
    at.run()
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    np.testing.assert_allclose(drawn[-1], answer.tam(2), rtol=0, atol=1e-6)
    assert any("TAM (Li et al., ICCV 2025)" in c.value for c in at.main.caption)
    assert at.query_params.get("lm_method") in ("tam", ["tam"])

    at = open_link({"model": str(folder), "question": QUESTION, "answer_length": str(LENGTH), "answer_token": "3",
                    "lm_method": "tam"})
    upload(at, "photo.png", png(picture()))
    assert notes(at) == [] and not at.main.error, [e.value for e in at.main.error]
    np.testing.assert_allclose(drawn[-1], answer.tam(2), rtol=0, atol=1e-6)


def test_the_map_may_be_the_tokens_attnlrp_to_the_pixels_drawn_around_zero(folders, monkeypatch):
    """The "Map" choice "attnlrp" draws ``VLMAnswer.relevance(i, method="attnlrp")`` (checked against lxt's rules on
    transformers' whole model in test_vlm_answer_attnlrp) for the clicked token, signed: with the diverging colour
    map on a range symmetric around 0; the choice is in the link, and a link with it draws it again."""
    from vit.app import drawing
    from vit.explain.views.overlay import DIVERGING_COLORMAP

    under, original = [], drawing.overlay_image
    monkeypatch.setattr(drawing, "overlay_image", lambda image, map2d, opacity, colormap, *a, **k: under.append(
        (np.asarray(map2d), colormap, a[-2:])) or original(image, map2d, opacity, colormap, *a, **k))
    folder = folders["llava"]
    at = ask(open_folder(folder), QUESTION)
    answer = answer_of(folder)
    pills(at).set_value(2)
    at.run()
    [method] = [w for w in at.main.radio if w.label == "Map"]
    method.set_value("attnlrp")
    at.run()
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    map2d, colormap, (vmin, vmax) = under[-1]
    expected = answer.relevance(2, method="attnlrp")
    np.testing.assert_allclose(map2d, expected, rtol=0, atol=1e-6)
    bound = float(np.abs(expected).max())
    assert colormap == DIVERGING_COLORMAP and vmin == pytest.approx(-bound) and vmax == pytest.approx(bound)
    assert any("AttnLRP (Achtibat et al. 2024" in c.value for c in at.main.caption)
    assert at.query_params.get("lm_method") in ("attnlrp", ["attnlrp"])

    at = open_link({"model": str(folder), "question": QUESTION, "answer_length": str(LENGTH), "answer_token": "3",
                    "lm_method": "attnlrp"})
    upload(at, "photo.png", png(picture()))
    assert notes(at) == [] and not at.main.error, [e.value for e in at.main.error]
    np.testing.assert_allclose(under[-1][0], expected, rtol=0, atol=1e-6)
    assert under[-1][1] == DIVERGING_COLORMAP


def test_a_folder_whose_weights_do_not_fit_its_config_is_one_line_on_the_page(folders, tmp_path):
    """Issue 95, item 6: transformers' size-mismatch RuntimeError reached the page as Streamlit's traceback box; it
    is the refusal's one line (``whole_vlm``), and the page stays up."""
    from test_vlm_hostile_folders import with_weights

    shrunk = "language_model.model.layers.0.mlp.down_proj.weight"
    folder = with_weights(folders, tmp_path, "llava", lambda tensors: {
        name: t[:-1] if name == shrunk else t for name, t in tensors.items()})
    at = ask(open_folder(folder), QUESTION)
    [error] = [e.value.replace("\\", "") for e in at.error]  # as written, less Markdown's escapes
    assert "its weights do not match its config.json (size mismatch for model.language_model.layers.0.mlp" in error
    assert "\n" not in error and not [w for w in at.main.pills if w.label == "Answer token"]


@pytest.mark.parametrize("template", ["{% set kept = [] %}{{ kept.append(1) }}<image>",
                                      "{% for m in messages %}<image>"])
def test_a_chat_template_the_sandbox_refuses_or_that_does_not_parse_is_one_line_on_the_page(folders, tmp_path,
                                                                                            template):
    """jinja's SecurityError and TemplateSyntaxError (of several lines) are the one line of the refusal."""
    from test_vlm_hostile_folders import with_template

    at = ask(open_folder(with_template(folders, tmp_path, template)), QUESTION)
    [error] = [e.value.replace("\\", "") for e in at.error]  # as written, less Markdown's escapes
    assert error.startswith("the model's chat template fails: ") and "\n" not in error, error
    assert "SecurityError" in error or "TemplateSyntaxError" in error, error


def test_the_clicked_tokens_logit_lens_is_the_apis_on_demand(folders):
    """Off by default (one forward of the model); on, the clicked token's probability at every layer is
    ``VLMAnswer.logit_lens``'s (held by hand to transformers' hidden states in test_vlm_lens)."""
    at = ask(open_folder(folders["llava"]), QUESTION)
    def lens():
        [found] = [w for w in at.main.toggle if w.label == "Read the token at every layer (logit lens)"]
        return found

    assert not lens().value and not [d for d in at.main.dataframe if "probability" in d.value.columns]
    pills(at).set_value(2)
    at.run()
    lens().set_value(True)
    at.run()
    assert not at.exception, [e.stack_trace for e in at.exception]
    expected = answer_of(folders["llava"]).logit_lens(2)
    [table] = [d for d in at.main.dataframe if "probability" in d.value.columns]
    assert list(table.value["layer"]) == ["input", "1", "2"]
    np.testing.assert_allclose(table.value["probability"].to_numpy() / 100, expected, rtol=0, atol=1e-6)
    from test_app_share import url

    assert url(at)["lm_lens"] == "1"  # the view, lens shown, is the link's
    linked = open_link(url(at))  # and a fresh session opened from it shows the lens again
    [table] = [d for d in linked.main.dataframe if "probability" in d.value.columns]
    np.testing.assert_allclose(table.value["probability"].to_numpy() / 100, expected, rtol=0, atol=1e-6)


def test_a_question_about_two_images_draws_each_tokens_map_on_the_picked_image_and_the_link_keeps_both(folders,
                                                                                                        drawn):
    """More images for the question (the section's uploader): the answer is ``vit.ask_vlm``'s about the page's image
    and the upload, in that order; the picked image's map and shares are ``VLMAnswer``'s for that image (each held
    to transformers' eager rows in test_vlm_several_images); the link names the upload and the image, and a fresh
    session opened from it draws the same map; TAM, drawn for one image, is one line."""
    from test_app_share import url

    folder = folders["qwen2_5_vl"]
    second = picture(60, 90).transpose(0)  # another picture, of another shape
    at = open_folder(folder)
    [more] = [w for w in at.main.file_uploader if w.label == "More images for the question (optional)"]
    more.set_value([("second.png", png(second), "image/png")])
    at.run()
    ask(at, QUESTION)
    answer = vit.ask_vlm(vit.open_vlm(folder), [picture(), second], QUESTION, max_new_tokens=LENGTH)
    assert [t.value.strip() for t in at.main.text if t.value.startswith("Answer:")] == [f"Answer: {answer.text}"]
    assert answer.layouts[0].grid != answer.layouts[1].grid  # a map drawn on the wrong image would not fit
    [image] = [w for w in at.main.radio if w.label == "Image"]
    assert [displayed(o) for o in image.options] == ["1: photo.png", "2: second.png"] and image.value == 0
    np.testing.assert_allclose(drawn[-1], answer.attention(0, answer.layers - 1, image=0), rtol=0, atol=0)
    pills(at).set_value(2)
    at.run()
    [image] = [w for w in at.main.radio if w.label == "Image"]
    image.set_value(1)
    at.run()
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    expected = answer.attention(2, answer.layers - 1, image=1)
    assert expected.shape == answer.layouts[1].grid
    np.testing.assert_allclose(drawn[-1], expected, rtol=0, atol=0)
    assert any("On image 2 of the question's 2." in c.value for c in at.main.caption)
    [strip] = [d for d in at.main.dataframe if "on the image" in d.value.columns]
    np.testing.assert_allclose(strip.value["on the image"].to_numpy() / 100,
                               [answer.image_share(i, answer.layers - 1, 1) for i in range(LENGTH)], rtol=0, atol=1e-6)
    link = url(at)
    from vit.app.uploads import upload_digest

    assert link["more"] == upload_digest(png(second)) and link["lm_image"] == "2" and link["answer_token"] == "3"
    linked = open_link(link)
    assert not linked.main.error and notes(linked) == [], [e.value for e in linked.main.error]
    np.testing.assert_allclose(drawn[-1], expected, rtol=0, atol=0)

    [method] = [w for w in at.main.radio if w.label == "Map"]
    method.set_value("tam")
    at.run()
    assert [displayed(e.value) for e in at.main.error] == [
        "TAM is drawn for a question about one image; this one has 2: use attention or gradient × attention, per "
        "image"]


def test_a_link_to_more_images_past_the_question_or_gone_from_the_server_says_so(folders):
    from vit.app.share import decode

    values, lines = decode({"more": ",".join(["a" * 64] * 16)}, {}, True)
    assert "more" not in values and len(lines) == 1 and "give at most 15 uploads' SHA-256s" in lines[0], lines
    values, lines = decode({"more": f"{'a' * 64},{'c' * 64}", "lm_image": "3"}, {}, True)
    assert values == {"more": ("a" * 64, "c" * 64), "lm_image": 3} and lines == []
    at = open_link({"model": str(folders["llava"]), "question": QUESTION, "answer_length": str(LENGTH),
                    "more": "b" * 64, "lm_image": "2"})
    upload(at, "photo.png", png(picture()))
    assert any("no longer holds" in w.value for w in at.main.warning), [w.value for w in at.main.warning]
    assert any("lm_image=2 was not used: the question has 1 image" in n for n in notes(at)), notes(at)


def gif(frames) -> bytes:
    """An animated GIF of ``frames``, 2 a second: Qwen2.5-VL's slices of 2 frames a second apart, whose temporal
    positions differ from those of its default rate (a test fails if the explorer drops the clip's times)."""
    import io

    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=500, loop=0)
    return buffer.getvalue()


def test_a_question_about_a_clip_draws_each_tokens_map_on_the_picked_slice_and_the_link_keeps_it(
        folders, monkeypatch, tmp_path):
    """A clip for the question (the section's second uploader, an animated GIF): the answer is ``vit.ask_vlm``'s
    about the clip's frames, read from the same file (each slice's map held to transformers' eager rows in
    test_vlm_clip); the picked slice's map is drawn over the pixels its first frame was prepared as; the link names
    the upload, its frames and the slice, and a fresh session opened from it draws the same map; more images beside
    a clip are one line."""
    from PIL import Image
    from test_app_share import url
    from test_vlm_clip import FRAMES

    from vit.app import drawing
    from vit.app.uploads import upload_digest
    from vit.explain.views.overlay import display_image

    drawn, original = [], drawing.overlay_image
    monkeypatch.setattr(drawing, "overlay_image", lambda image, map2d, *a, **k: drawn.append(
        (np.asarray(image), np.asarray(map2d))) or original(image, map2d, *a, **k))
    folder, data = folders["qwen2_5_vl"], gif(FRAMES)
    (tmp_path / "clip.gif").write_bytes(data)
    answer = vit.ask_vlm(vit.open_vlm(folder), video=tmp_path / "clip.gif", question=QUESTION, frames=4,
                         max_new_tokens=LENGTH)
    assert len(answer.layouts) == 2 and answer.clip
    at = open_folder(folder)
    [clip] = [w for w in at.main.file_uploader if w.label == "Or a clip to ask about instead (optional)"]
    clip.set_value(("clip.gif", data, "image/gif"))
    at.run()
    [frames] = [w for w in at.main.number_input if w.label == "Clip frames"]
    assert frames.value == 8
    frames.set_value(4)
    ask(at, QUESTION)
    assert [t.value.strip() for t in at.main.text if t.value.startswith("Answer:")] == [f"Answer: {answer.text}"]
    [when] = [w for w in at.main.select_slider if w.label == "Slice of the clip"]
    assert [displayed(o) for o in when.options] == ["frames 1–2", "frames 3–4"] and when.value == 0
    when.set_value(1)  # the slice moves, the clicked token stays
    at.run()
    assert pills(at).value == 0 and any(c.value.startswith("**Answer token 1 “") and "On slice 2 of" in c.value
                                        for c in at.main.caption), [c.value for c in at.main.caption]
    np.testing.assert_allclose(drawn[-1][1], answer.attention(0, answer.layers - 1, image=1), rtol=0, atol=0)
    pills(at).set_value(2)
    at.run()
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    expected = answer.attention(2, answer.layers - 1, image=1)
    assert not np.allclose(expected, answer.attention(2, answer.layers - 1, image=0))
    pixels, map2d = drawn[-1]
    np.testing.assert_allclose(map2d, expected, rtol=0, atol=0)
    seen = np.asarray(display_image(Image.fromarray(answer.layouts[1].pixels), max_side=480))
    np.testing.assert_array_equal(pixels, seen)  # slice 2's first frame (the clip's third) as prepared
    assert any("On slice 2 of the clip's 2 (its sampled frames 3–4), drawn over frame 3" in c.value
               for c in at.main.caption), [c.value for c in at.main.caption]
    [strip] = [d for d in at.main.dataframe if "on the image" in d.value.columns]
    np.testing.assert_allclose(strip.value["on the image"].to_numpy() / 100,
                               [answer.image_share(i, answer.layers - 1, 1) for i in range(LENGTH)], rtol=0, atol=1e-6)
    link = url(at)
    assert link["lm_clip"] == upload_digest(data) and link["lm_frames"] == "4" and link["lm_image"] == "2"
    linked = open_link(link)
    assert not linked.main.error and notes(linked) == [], [e.value for e in linked.main.error]
    np.testing.assert_allclose(drawn[-1][1], expected, rtol=0, atol=0)
    past = open_link({**link, "lm_image": "3"})  # a slice the clip does not have: dropped, said, the first drawn
    assert any("lm_image=3 was not used: the clip has 2 slices" in n for n in notes(past)), notes(past)
    np.testing.assert_allclose(drawn[-1][1], answer.attention(2, answer.layers - 1, image=0), rtol=0, atol=0)

    [more] = [w for w in at.main.file_uploader if w.label == "More images for the question (optional)"]
    more.set_value([("second.png", png(picture(60, 90)), "image/png")])
    at.run()
    assert [displayed(e.value) for e in at.main.error] == [
        "A question is about images or a clip, not both: remove the more images or the clip."]


def test_a_clip_shorter_than_its_frames_is_read_with_each_frame_once(folders, tmp_path):
    """A 4-frame GIF at the default 8 "Clip frames" (issue 113): its 4 frames each once, Qwen's 2 slices of 2, the
    answer ``vit.ask_vlm``'s about the same file (itself transformers' ``generate`` on the frames given, in
    test_vlm_clip_work); read with its frames repeated it was 4 slices."""
    from test_vlm_clip import FRAMES

    folder, data = folders["qwen2_5_vl"], gif(FRAMES)
    (tmp_path / "clip.gif").write_bytes(data)
    answer = vit.ask_vlm(vit.open_vlm(folder), video=tmp_path / "clip.gif", question=QUESTION, max_new_tokens=LENGTH)
    at = open_folder(folder)
    [clip] = [w for w in at.main.file_uploader if w.label == "Or a clip to ask about instead (optional)"]
    clip.set_value(("clip.gif", data, "image/gif"))
    at.run()
    [frames] = [w for w in at.main.number_input if w.label == "Clip frames"]
    assert frames.value == 8
    ask(at, QUESTION)
    assert [t.value.strip() for t in at.main.text if t.value.startswith("Answer:")] == [f"Answer: {answer.text}"]
    [when] = [w for w in at.main.select_slider if w.label == "Slice of the clip"]
    assert [displayed(o) for o in when.options] == ["frames 1–2", "frames 3–4"] and len(answer.layouts) == 2


def test_a_link_to_a_clip_past_its_slices_or_gone_from_the_server_says_so(folders):
    from vit.app.share import decode

    values, lines = decode({"lm_clip": "a" * 64, "lm_frames": "65"}, {}, True)
    assert values == {"lm_clip": "a" * 64} and len(lines) == 1 and "lm_frames=65" in lines[0], lines
    at = open_link({"model": str(folders["qwen2_5_vl"]), "question": QUESTION, "answer_length": str(LENGTH),
                    "lm_clip": "b" * 64, "lm_frames": "4"})
    upload(at, "photo.png", png(picture()))
    assert any("The clip the link asks about was an upload the server no longer holds" in w.value
               for w in at.main.warning), [w.value for w in at.main.warning]


@pytest.fixture(scope="module")
def no_port(tmp_path_factory):
    """Qwen3.5, Llama 4, Llama 3.2 Vision, Florence-2, Molmo 2 and Gemma 3n saved whole: towers their configs declare,
    which no port reads."""
    return saved_whole(tmp_path_factory, ("qwen3_5", "llama4", "mllama", "florence2", "molmo2", "gemma3n"))


@pytest.mark.parametrize("kind", ["qwen3_5", "llama4", "mllama", "florence2", "molmo2", "gemma3n"])
def test_a_vlm_whose_tower_no_port_reads_gets_its_question_page(no_port, kind, monkeypatch):
    """Its folder opens on a page of its own (the image, then "Ask the VLM"), not the refusal ``vit.load`` gives its
    tower: the clicked token's map is ``VLMAnswer.attention``'s, drawn over the pixels the processor prepared (Qwen3.5's
    flat patches put back on the image; Llama 4's tile, padded; Llama 3.2 Vision's tiles' canvas, its map at a
    cross-attention layer; Florence-2's, its decoder's cross-attention, asked without a chat template), and the link
    reproduces the view in a fresh page."""
    from PIL import Image

    from vit.app import drawing
    from vit.explain.views.overlay import display_image

    drawn, original = [], drawing.overlay_image
    monkeypatch.setattr(drawing, "overlay_image", lambda image, map2d, *a, **k: drawn.append(
        (np.asarray(image), np.asarray(map2d))) or original(image, map2d, *a, **k))
    folder = no_port[kind]
    at = open_folder(folder)
    assert not at.main.error, [e.value for e in at.main.error]
    assert "Ask the VLM" in [h.value for h in at.main.subheader]
    ask(at, QUESTION)
    pills(at).set_value(2)
    at.run()
    main_select(at, "Layer").set_value(0)
    at.run()
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    answer = answer_of(folder)
    assert [t.value.strip() for t in at.main.text if t.value.startswith("Answer:")] == \
        [f"Answer: {answer.text}".strip()]
    seen = np.asarray(display_image(Image.fromarray(answer.layouts[0].pixels), max_side=480))
    image, map2d = drawn[-1]
    np.testing.assert_allclose(map2d, answer.attention(2, 0), rtol=0, atol=0)
    assert image.shape == seen.shape and np.array_equal(image, seen)
    params = {k: at.query_params[k][0] if isinstance(at.query_params[k], list) else at.query_params[k]
              for k in at.query_params}
    assert {k: params.get(k) for k in ("question", "answer_token", "lm_layer")} == \
        {"question": QUESTION, "answer_token": "3", "lm_layer": "1"}

    drawn.clear()
    at = open_link({k: params[k] for k in ("model", "question", "answer_length", "answer_token", "lm_layer")})
    upload(at, "photo.png", png(picture()))
    assert notes(at) == [] and not at.main.error, [e.value for e in at.main.error]
    np.testing.assert_allclose(drawn[-1][1], answer.attention(2, 0), rtol=0, atol=0)


def test_the_page_of_its_own_is_chosen_by_the_config_json_it_reads_now(tmp_path):
    # The explorer asks at every rerun whether a folder is a VLM whose tower its config declares; it reads that
    # config.json once per version of it: the folder rewritten as a plain ViT's is no longer one.
    from app_pages.explorer_sections import vlm_view

    transformers.Glm4vConfig().to_json_file(tmp_path / "config.json")
    assert vlm_view.applies(tmp_path) and vlm_view.applies(str(tmp_path))
    transformers.ViTConfig(hidden_size=48).to_json_file(tmp_path / "config.json")  # another size: another version
    assert not vlm_view.applies(tmp_path)
    assert not vlm_view.applies(None) and not vlm_view.applies(tmp_path / "missing")


def toggle(at, label: str):
    [found] = [w for w in at.main.toggle if w.label == label]
    return found


KNOCKOUT = "Knock out the token's attention to the image, layer window by layer window"
HEADS = "The heads that ground the token (layer × head)"


def test_the_map_without_the_sinks_is_the_apis_and_in_the_link_and_the_export(folders, drawn, monkeypatch):
    """Off by default; on, the clicked token's map is ``VLMAnswer.attention(..., sinks=VLMAnswer.sinks())``'s (held
    to the authors' code in test_vlm_sinks), said in the caption, the link and the export."""
    from test_app_share import url

    from app_pages.explorer_sections import ask_vlm

    exports = []
    monkeypatch.setattr(ask_vlm, "partial", lambda f, *a, **k: exports.append(functools.partial(f, *a, **k))
                        or exports[-1])
    at = ask(open_folder(folders["llava"]), QUESTION)
    assert not toggle(at, "Without the visual sinks").value
    pills(at).set_value(1)
    at.run()
    toggle(at, "Without the visual sinks").set_value(True)
    at.run()
    assert not at.exception, [e.stack_trace for e in at.exception]
    answer = answer_of(folders["llava"])
    sinks = answer.sinks()
    want = answer.attention(1, answer.layers - 1, sinks=sinks)
    np.testing.assert_allclose(drawn[-1], want, rtol=0, atol=1e-7)
    assert any("Without the" in c.value and "visual sink token" in c.value for c in at.main.caption)
    assert url(at)["lm_sinks"] == "1"
    [page] = [f().decode() for f in exports if getattr(f.func, "__name__", "") == "_export"][-1:]
    assert "without the visual sinks" in page
    linked = open_link(url(at))
    np.testing.assert_allclose(drawn[-1], want, rtol=0, atol=1e-7)
    assert toggle(linked, "Without the visual sinks").value


def test_the_knockout_curve_is_the_apis_for_the_image_or_a_box_and_in_the_link_and_the_export(folders, monkeypatch):
    """On demand, the clicked token's curve over windows of layers is ``VLMAnswer.knockout``'s (held to a hand-made
    knockout on transformers' eager attention in test_vlm_knockout): the whole image, then a box; the window and the
    box are the link's, and the curve the export's."""
    from test_app_share import url

    from app_pages.explorer_sections import ask_vlm

    exports = []
    monkeypatch.setattr(ask_vlm, "partial", lambda f, *a, **k: exports.append(functools.partial(f, *a, **k))
                        or exports[-1] if f is ask_vlm._export else functools.partial(f, *a, **k))
    folder = folders["qwen2_5_vl"]
    at = ask(open_folder(folder), QUESTION)
    pills(at).set_value(2)
    at.run()
    assert not [d for d in at.main.dataframe if "change" in d.value.columns]
    toggle(at, KNOCKOUT).set_value(True)
    at.run()
    assert not at.exception, [e.stack_trace for e in at.exception]
    answer = answer_of(folder)
    whole = answer.knockout(2, windows=1)

    def curve(app):
        [table] = [d for d in app.main.dataframe if "change" in d.value.columns]
        return table.value

    shown = curve(at)
    assert list(shown["layers"]) == [f"layer {n + 1}" for n in range(answer.layers)]
    np.testing.assert_allclose(shown["probability"].to_numpy() / 100, whole.probability, rtol=0, atol=1e-7)
    np.testing.assert_allclose(shown["change"].to_numpy() / 100, whole.change, rtol=0, atol=1e-6)
    [window] = [w for w in at.main.number_input if w.label == "Layers per window"]
    window.set_value(2)
    [box] = [w for w in at.main.text_input if w.label == "Box (optional)"]
    box.set_value("0,0,2,2")
    at.run()
    assert not at.exception, [e.stack_trace for e in at.exception]
    boxed = answer.knockout(2, target=(0, 0, 2, 2), windows=2)
    assert len(boxed.windows) == answer.layers - 1
    np.testing.assert_allclose(curve(at)["probability"].to_numpy() / 100, boxed.probability, rtol=0, atol=1e-7)
    assert list(curve(at)["layers"]) == ["layers 1–2"]
    params = url(at)
    assert params["lm_knockout"] == "2" and params["lm_kbox"] == "0,0,2,2"
    [page] = [f().decode() for f in exports if getattr(f.func, "__name__", "") == "_export"][-1:]
    assert "Knockout, layers 1–2</th><td>" + f"{float(boxed.probability[0]):.4%}" in page
    linked = open_link(params)
    assert not linked.exception and not linked.main.error, [e.value for e in linked.main.error]
    np.testing.assert_allclose(curve(linked)["probability"].to_numpy() / 100, boxed.probability, rtol=0, atol=1e-7)

    box = [w for w in at.main.text_input if w.label == "Box (optional)"][0]
    box.set_value("2,2,1,1")  # empty: one line, no curve
    at.run()
    assert any("is empty" in e.value for e in at.main.error) and not at.exception


def test_the_heads_grid_is_the_apis_and_a_clicked_head_draws_its_map(folders, drawn):
    """On demand, a layer x head grid of each head's attention sum on the image at the clicked token's query,
    ``VLMAnswer.grounding_heads``'s (held to the authors' code in test_vlm_heads); a clicked cell (the grid's
    selection callback) draws that head's map; the grid is the link's."""
    from test_app_share import url

    from app_pages.explorer_sections import ask_vlm

    at = ask(open_folder(folders["llava"]), QUESTION)
    toggle(at, HEADS).set_value(True)
    at.run()
    assert not at.exception, [e.stack_trace for e in at.exception]
    answer = answer_of(folders["llava"])
    scores = answer.grounding_heads(0)
    [grid] = [d for d in at.main.dataframe if "head 1" in d.value.columns]
    assert list(grid.value["layer"]) == [str(n + 1) for n in range(answer.layers)]
    np.testing.assert_allclose(grid.value[[f"head {h + 1}" for h in range(answer.heads)]].to_numpy() / 100,
                               scores.attention_sum, rtol=0, atol=1e-6)
    assert url(at)["lm_heads"] == "1"

    ask_vlm.pick_head(at.session_state, [(0, "head 2")])  # what the grid's callback does with a clicked cell
    at.run()
    np.testing.assert_allclose(drawn[-1], answer.attention(0, 0, 1), rtol=0, atol=0)
    assert main_select(at, "Head").value == 1 and main_select(at, "Layer").value == 0


def test_a_knockout_box_is_four_whole_patches_and_a_grid_cell_names_its_head():
    from vit.app import share, vlm_inside

    assert vlm_inside.parse_box(" 0, 1 ,2,3") == (0, 1, 2, 3)
    for bad, said in (("0,0,2", "four whole numbers"), ("1,1,1,2", "is empty"), ("-1,0,2,2", "four whole numbers"),
                      ("a,b,c,d", "four whole numbers")):
        with pytest.raises(ValueError, match=said):
            vlm_inside.parse_box(bad)
    assert share.encode({"lm_kbox": (0, 1, 2, 3)}) == {"lm_kbox": "0,1,2,3"}
    assert vlm_inside.head_at((3, "head 2")) == (3, 1)
    assert vlm_inside.head_at((3, "layer")) is None and vlm_inside.head_at(None) is None


def test_a_sharded_vlm_from_the_hub_opens_on_its_towers_shards_and_asks_once_its_language_model_is_in(folders,
                                                                                                      fake_hub):
    """"Open from the Hub" on a sharded VLM downloads the shards its tower is in (as ``vit.predict`` does), not the
    language model's: a 7B VLM's tower is about a gigabyte of its 15, and the whole was over the download bound, so
    the page refused what its maps needed. "Ask the VLM" then offers the language model's shards on a Download
    button of their own, and answers as the folder does once they are in."""
    import json

    from vit.app import catalog
    from vit.sources.hub import format_bytes

    catalog.forget_hub_plans()  # file lists read from another test's Hub
    folder = folders["llava"]
    fake_hub.add_folder("acme/tiny-llava", folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    language = {shard for shard in index.values()  # the shards holding the language model's tensors alone
                if all(name.startswith("language_model.") for name, s in index.items() if s == shard)}
    assert language and set(index.values()) - language, "the tiny model's shards: some its language model's alone"
    size = lambda names: sum((folder / n).stat().st_size for n in names)  # noqa: E731

    at = run_app()
    sidebar_widget(at, "text_input", "Open from the Hub").set_value("acme/tiny-llava")
    at.run()
    [button] = [b for b in at.sidebar.button if b.label.startswith("Download ")]
    button.click()
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    fetched = set(fake_hub.fetched("GET"))
    # what the button said is what came after its click (its config.json and shard index, kilobytes, to plan it)
    planned = {"config.json", "model.safetensors.index.json"}
    assert button.label == f"Download {format_bytes(size(fetched - planned))}"
    shards = {f for f in fetched if f.endswith(".safetensors")}
    assert shards and not shards & language  # the language model's shards stayed on the Hub
    rest = set(index.values()) - shards
    at = upload(at, "photo.png", png(picture()))
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    assert not [w for w in at.main.text_input if w.label == "Question"]  # nothing to answer with yet
    # "Ask in words" reads one tensor of the language model: the shard that holds it, on a button of its own
    embedding = index["language_model.model.embed_tokens.weight"]
    assert embedding in rest
    assert at.button(key="word_lens_download").label == f"Download {format_bytes(size([embedding]))}"
    button = at.button(key="ask_vlm_download")
    assert button.label == f"Download {format_bytes(size(rest))}"
    button.click()
    at.run()
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    assert {f for f in fake_hub.fetched("GET") if f.endswith(".safetensors")} == set(index.values())
    assert not [b for b in at.main.button if b.label.startswith("Download ")]  # the words' shard came with them
    at = ask(at, QUESTION)
    answer = answer_of(folder)  # the folder's, opened by path
    shown = [t.value.strip() for t in at.main.text if t.value.startswith("Answer:")]
    assert shown == [f"Answer: {answer.text}".strip()]
    [strip] = [d for d in at.main.dataframe if "on the image" in d.value.columns]  # at the last layer, the default
    np.testing.assert_allclose(strip.value["on the image"].to_numpy() / 100,
                               [answer.image_share(i, answer.layers - 1) for i in range(LENGTH)], rtol=0, atol=1e-6)


def tower_only_snapshot(folder, cache, commit="ab" * 20, repo="acme/tiny-llava"):
    """``folder`` as huggingface_hub keeps it in the HF cache ``cache`` after a download for its tower alone: the
    shards holding only its language model's tensors left out. Returns (snapshot, the shards left out)."""
    import json
    import shutil

    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    language = {shard for shard in index.values()
                if all(name.startswith("language_model.") for name, s in index.items() if s == shard)}
    model_dir = cache / f"models--{repo.replace('/', '--')}"
    snapshot = model_dir / "snapshots" / commit
    shutil.copytree(folder, snapshot, ignore=lambda _, names: [n for n in names if n in language])
    (model_dir / "refs").mkdir()
    (model_dir / "refs" / "main").write_text(commit)
    return snapshot, language


def test_a_vlm_lacking_its_language_models_shards_is_refused_saying_how_to_get_them(folders, tmp_path, fake_hub):
    """``vit.open_vlm`` of a folder whose index lists shards it lacks: one line, naming the first, and the Hub id
    that downloads them for a snapshot of the HF cache (a plain folder: copy them in)."""
    import shutil

    from huggingface_hub import constants

    from vit.sources.vlm.whole_vlm import VLMError

    snapshot, language = tower_only_snapshot(folders["llava"], Path(constants.HF_HUB_CACHE))
    with pytest.raises(VLMError) as e:
        vit.open_vlm(snapshot)
    message = str(e.value)
    assert f"lacks {len(language)} of the weights files its index lists ({min(language)}, ...)" in message, message
    assert message.endswith("open it by its Hub id, acme/tiny-llava, to download them") and "\n" not in message
    plain = shutil.copytree(snapshot, tmp_path / "plain")
    with pytest.raises(VLMError, match="copy them into the folder$"):
        vit.open_vlm(plain)


def test_ask_in_words_downloads_the_embeddings_shard_alone_and_a_visitor_without_the_token_is_told(
        folders, fake_hub, monkeypatch):
    """"Ask in words" reads the word embeddings from one shard of the language model: that shard alone is offered,
    and the lens works once it is in, while "Ask the VLM" offers the rest. Behind a token, a visitor who has not
    entered it is told what downloading takes, with no button."""
    import json

    from huggingface_hub import constants

    from vit.app import catalog
    from vit.sources.hub import format_bytes

    catalog.forget_hub_plans()
    folder = folders["llava"]
    fake_hub.add_folder("acme/tiny-llava", folder)
    commit = fake_hub.repos["acme/tiny-llava"].sha
    snapshot, language = tower_only_snapshot(folder, Path(constants.HF_HUB_CACHE), commit)
    embedding = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"][
        "language_model.model.embed_tokens.weight"]
    at = open_folder(snapshot)
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    button = at.button(key="word_lens_download")
    assert button.label == f"Download {format_bytes((folder / embedding).stat().st_size)}"
    button.click()
    at.run()
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    assert [f for f in fake_hub.fetched("GET") if f.endswith(".safetensors")] == [embedding]
    assert not [b for b in at.main.button if b.key == "word_lens_download"]
    rest = sum((folder / n).stat().st_size for n in language - {embedding})
    assert at.button(key="ask_vlm_download").label == f"Download {format_bytes(rest)}"
    [words] = [w for w in at.main.text_area if w.label == "Words"]  # the lens, once its shard is in
    words.set_value("dog, cat")
    at.run()
    assert not at.exception and not at.main.error, [e.value for e in at.main.error]
    assert [d for d in at.main.dataframe if "word" in d.value.columns][0].value["word"].tolist() == ["dog", "cat"]

    monkeypatch.setenv("VIT_MAX_DOWNLOAD_GB", str(rest / 2 / 1e9))  # the rest over the bound: said, no button
    catalog.forget_hub_plans()
    at.run()
    [error] = [displayed(e.value) for e in at.main.error]
    assert error.startswith(f"acme/tiny-llava@{commit} is {format_bytes(rest)}, over the ") and "\n" not in error
    assert not [b for b in at.main.button if b.label.startswith("Download ")]
    monkeypatch.delenv("VIT_MAX_DOWNLOAD_GB")

    monkeypatch.setenv("VIT_TRAIN_TOKEN", "secret")  # a visitor who has not entered it
    (snapshot / embedding).unlink()
    at = open_link({"model": "acme/tiny-llava"})
    upload(at, "photo.png", png(picture()))
    errors = [e.value.replace("\\", "") for e in at.main.error]
    said = ("The server's Hugging Face cache holds acme/tiny-llava without its language model, and downloading it "
            "takes the training token: enter it on the Train page.")
    assert errors == [said, said], errors  # the words' section and the question's
    assert not [b for b in at.main.button if b.label.startswith("Download ")]


def test_a_links_word_map_on_a_snapshot_lacking_the_embeddings_points_at_the_sections_download(folders, fake_hub):
    """A link to a word's map of a VLM opened from the Hub for its tower: the map's one line says the embeddings'
    shard is still on the Hub and where its Download button is, not the library's "download that file into the
    folder" (a visitor has no folder of the server's to download into)."""
    import json

    from huggingface_hub import constants

    from vit.app import catalog

    catalog.forget_hub_plans()
    folder = folders["llava"]
    fake_hub.add_folder("acme/tiny-llava", folder)
    tower_only_snapshot(folder, Path(constants.HF_HUB_CACHE), fake_hub.repos["acme/tiny-llava"].sha)
    embedding = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"][
        "language_model.model.embed_tokens.weight"]
    at = open_link({"model": "acme/tiny-llava", "map": "word_lens", "labels": "dog", "word": "dog"})
    upload(at, "photo.png", png(picture()))
    errors = [displayed(e.value) for e in at.main.error]
    assert errors == [f"The word maps read the language model's word embeddings, in {embedding}, which was left on "
                      "the Hub when the model was opened (its tower's shards alone were downloaded): download it "
                      "under “Ask in words” below."], errors
    assert at.button(key="word_lens_download").label.startswith("Download ")


def test_a_shard_the_hub_lacks_too_is_said_in_one_line(folders, fake_hub):
    """A snapshot whose index lists a shard the Hub's repository does not have either: one line, no button."""
    from huggingface_hub import constants

    from vit.app import catalog

    catalog.forget_hub_plans()
    folder = folders["llava"]
    fake_hub.add_folder("acme/tiny-llava", folder)
    commit = fake_hub.repos["acme/tiny-llava"].sha
    snapshot, language = tower_only_snapshot(folder, Path(constants.HF_HUB_CACHE), commit)
    gone = max(language)
    del fake_hub.repos["acme/tiny-llava"].files[gone]
    at = open_folder(snapshot)
    errors = [displayed(e.value) for e in at.main.error]
    assert f"acme/tiny-llava lacks {gone}, which its index lists and the Hub does not have either" in errors, errors
    assert not [b for b in at.main.button if b.key == "ask_vlm_download"]
