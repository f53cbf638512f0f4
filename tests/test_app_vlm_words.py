"""The explorer's words for a vision-language model's tower (issue 68): words typed under "Ask in words" on a LLaVA
or Qwen2.5-VL folder opened by path; the sidebar's "A word" map draws a word's visual logit lens (equal to
``vit.visual_logit_lens``'s map and to the product done by hand on transformers' modules) and its LeGrad, gradient
rollout and AttnLRP (``vit.explain_word``'s, and LeGrad by hand on transformers' LLaVA); every refusal is one line;
the view is part of the link and of the exported HTML. A Qwen2.5-VL windowed layer's attention row is the query's
window, as transformers computes it, under a caption that says so."""

import io
import shutil

import numpy as np
import pytest
import torch
from helpers import displayed
from test_app import default_world, dirs, run_app, sidebar_widget, upload  # noqa: F401 (fixtures)
from test_app_share import notes, open_link

transformers = pytest.importorskip("transformers")
from test_qwen_vl_parity import IMAGES, folder, qwen, transformers_attention  # noqa: E402, F401 (fixtures)
from test_visual_lens import (  # noqa: E402
    ATOL,
    _build,
    _index,
    _legrad_on_transformers,
    by_hand,
    noisy,
    picture,
    tiny_tokenizer,
)

import vit  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dirs")]


@pytest.fixture(scope="module")
def vlms(tmp_path_factory):
    """``{kind: (folder, model, processor)}``: LLaVA and Qwen2.5-VL saved whole in many shards with their processor
    and a word-level tokenizer (test_visual_lens's)."""
    built = {}
    for kind in ("llava", "qwen2_5_vl"):
        torch.manual_seed(0)
        model, processor = _build(kind)
        model = noisy(model)
        model.set_attn_implementation("eager")  # the path that returns attention probabilities
        path = tmp_path_factory.mktemp(kind)
        model.save_pretrained(path, max_shard_size="20KB")
        processor.save_pretrained(path)
        tiny_tokenizer().save_pretrained(path)
        built[kind] = path, model, processor
    return built


def png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def drawn(monkeypatch):
    """The main maps as the page draws them, in order."""
    from vit.app import drawing

    maps, original = [], drawing.overlay_image
    monkeypatch.setattr(drawing, "overlay_image",
                        lambda image, map2d, *a, **k: maps.append(np.asarray(map2d)) or original(image, map2d, *a, **k))
    return maps


def open_vlm(path, image=None):
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(path))
    at.run()
    upload(at, "photo.png", png(image or picture()))
    return at


def type_words(at, text: str):
    [area] = [w for w in at.main.text_area if w.label == "Words"]
    area.set_value(text)
    at.run()
    assert not at.exception, [e.message for e in at.exception]


def word_map(at, method: str, word: str | None = None, target: str | None = None, query: int | None = None):
    sidebar_widget(at, "radio", "Map").set_value("words")
    at.run()
    sidebar_widget(at, "selectbox", "Method").set_value(method)
    if word is not None:
        sidebar_widget(at, "selectbox", "Word").set_value(word)
    if target is not None:
        at.run()
        sidebar_widget(at, "radio", "Target").set_value(target)
    if query is not None:
        at.run()
        sidebar_widget(at, "selectbox", "Query token").set_value(query)
    at.run()
    assert not at.exception, [e.stack_trace for e in at.exception]


def map_caption(at) -> str:
    [caption] = [c.value for c in at.main.caption if "Colours span" in c.value]
    return caption


def errors(at) -> list[str]:
    return [e.value for e in at.main.error]


@pytest.mark.parametrize("kind", ["llava", "qwen2_5_vl"])
def test_the_lens_map_is_vit_visual_logit_lens_and_the_product_by_hand(vlms, kind, drawn):
    path, model, processor = vlms[kind]
    at = open_vlm(path)
    assert "Ask in words" in [h.value for h in at.main.subheader]
    assert not [t for t in at.main.toggle if t.key == "faithfulness_curves"]  # no class probability to track
    type_words(at, "dog, hot dog")
    word_map(at, "word_lens", word="hot dog")
    assert not errors(at)
    image = picture()
    [_, hot_dog] = vit.visual_logit_lens(vit.load(path, device="cpu"), image, ["dog", "hot dog"])
    np.testing.assert_allclose(drawn[-1], hot_dog.map, rtol=0, atol=0)  # the page's map is the API's
    np.testing.assert_allclose(drawn[-1], by_hand(model, processor, kind, image, [7, 5]), rtol=0, atol=ATOL)
    caption = map_caption(at)
    [name] = [k for k in _index(path) if k.endswith("embed_tokens.weight")]
    assert "**Visual logit lens of “hot dog”**" in caption
    shown = displayed(caption)
    assert "tokens “hot” (7), “dog” (5), their embeddings averaged" in shown
    assert f"{name} (64 × 24 float32, 6.0 KiB, in {_index(path)[name]}), of which 2 rows were read (192 bytes)" \
        in shown
    assert ("each covering the 2×2 patches of its merge unit" if kind == "qwen2_5_vl" else "each covering one patch") \
        in caption
    # The section's table: each word as the tokenizer reads it, and where its lens is highest.
    [table] = at.main.dataframe
    assert list(table.value["word"]) == ["dog", "hot dog"] and list(table.value["tokens"]) == ["dog", "hot dog"]
    assert table.value["max"][1] == pytest.approx(float(hot_dog.map.max()), abs=1e-6)


def test_a_words_legrad_rollout_and_attnlrp_are_vit_explain_words_and_legrad_by_hand(vlms, drawn):
    path, model, processor = vlms["llava"]
    at = open_vlm(path)
    type_words(at, "dog, hot dog")
    image, checkpoint = picture(), vit.load(path, device="cpu")
    pixels = processor(images=[image], return_tensors="pt")["pixel_values"]
    word = model.get_input_embeddings().weight[[7, 5]].mean(0).detach()
    word_map(at, "word_legrad", word="hot dog", target="patch", query=1 + 6)  # CLS first: token 7 is patch 6
    assert not errors(at)
    np.testing.assert_allclose(drawn[-1], vit.explain_word(checkpoint, image, "hot dog", "legrad", patch=6).map,
                               rtol=0, atol=0)
    np.testing.assert_allclose(drawn[-1], _legrad_on_transformers(model, pixels, word, 6), rtol=0, atol=ATOL)
    caption = map_caption(at)
    assert "**LeGrad of “hot dog”'s lens score**, at the image token over the patch row 2, col 3 (outlined" in caption
    sidebar_widget(at, "radio", "Target").set_value("all")
    at.run()
    np.testing.assert_allclose(drawn[-1], _legrad_on_transformers(model, pixels, word, None), rtol=0, atol=ATOL)
    assert "summed over all 16 image tokens" in map_caption(at)
    for method, name in (("word_class", "class"), ("word_attnlrp", "attnlrp")):
        sidebar_widget(at, "selectbox", "Method").set_value(method)
        at.run()
        assert not errors(at) and not at.exception
        patch = 6 if method == "word_class" or sidebar_widget(at, "radio", "Target").value == "patch" else None
        want = vit.explain_word(checkpoint, image, "hot dog", name, patch=patch).map
        np.testing.assert_allclose(drawn[-1], want, rtol=0, atol=0)
    assert "red for, blue against" in map_caption(at)


def test_a_words_maps_refuse_in_one_line_and_the_page_goes_on(vlms, tmp_path):
    path = vlms["qwen2_5_vl"][0]
    at = open_vlm(path)
    word_map(at, "word_lens")
    assert any("No word yet" in c.value for c in at.main.caption)  # the map says where to type
    type_words(at, "dog, zebra")  # the tokenizer's unknown token
    [*lines] = errors(at)
    assert lines and all("cannot encode 'zebra'" in displayed(e) and "\n" not in e for e in lines), lines
    assert [w for w in at.main.text_area if w.label == "Words"]  # the words can be mended
    type_words(at, "dog")
    sidebar_widget(at, "selectbox", "Method").set_value("word_class")
    at.run()
    assert not errors(at) and not at.exception  # gradient rollout runs through Qwen2.5-VL's windows

    bare = tmp_path / "bare"
    shutil.copytree(path, bare, ignore=shutil.ignore_patterns("tokenizer*"))
    at = open_vlm(bare)
    type_words(at, "dog")
    [line] = errors(at)
    assert "has no tokenizer files" in displayed(line) and "\n" not in line
    [name] = [k for k in _index(path) if k.endswith("embed_tokens.weight")]
    (bare / _index(path)[name]).unlink()  # as a Hub download that fetched the tower's shards alone
    at = open_vlm(bare)
    type_words(at, "dog")
    [line] = errors(at)
    assert f"lacks {_index(path)[name]}, the shard that holds" in displayed(line) and "\n" not in line


def test_a_word_map_is_in_the_link_and_the_exported_view(vlms, drawn, monkeypatch):
    import functools

    from app_pages.explorer_sections import share_view

    exports = []  # the page's "Export this view" data, built as its button would on a click
    monkeypatch.setattr(share_view, "partial", lambda f, *a, **k: exports.append(functools.partial(f, *a, **k))
                        or exports[-1])
    path = vlms["llava"][0]
    link = {"model": str(path), "map": "word_attnlrp", "labels": "dog, red", "space": "0", "word": "red",
            "target": "patch", "query": "4"}
    at = open_link(link)
    upload(at, "photo.png", png(picture()))
    assert notes(at) == [] and not errors(at)
    assert sidebar_widget(at, "selectbox", "Word").value == "red"
    assert sidebar_widget(at, "radio", "Target").value == "patch"
    caption = map_caption(at)
    assert "**AttnLRP of “red”'s lens score**, at the image token over the patch row 1, col 4" in caption
    want = vit.explain_word(vit.load(path, device="cpu"), picture(), "red", "attnlrp", patch=3).map
    np.testing.assert_allclose(drawn[-1], want, rtol=0, atol=0)
    params = {k: at.query_params[k][0] if isinstance(at.query_params[k], list) else at.query_params[k]
              for k in at.query_params}
    assert {k: params.get(k) for k in link if k not in ("model", "space")} == {
        k: v for k, v in link.items() if k not in ("model", "space")}
    assert "space" not in params  # off: left out, as the other flags the page leaves at their default
    [page] = [f().decode() for f in exports if getattr(f.func, "__name__", "") == "_export"][-1:]
    assert "AttnLRP of “red”" in page and "embed_tokens.weight" in page
    assert "Word</th><td>red" in page.replace("\n", "").replace(" ", "") or ">red<" in page

    at = open_link({**link, "word": "sky"})  # a word the link does not type
    upload(at, "photo.png", png(picture()))
    assert any("word=sky was not used: it is not one of the link's words" in n for n in notes(at))


@pytest.mark.usefixtures("default_world")
def test_a_link_to_a_word_map_of_a_model_without_a_projector_is_dropped_in_one_line():
    at = open_link({"map": "word_lens", "labels": "dog", "word": "dog"})  # the default model: a classifier
    lines = notes(at)
    assert any("map=word_lens was not used: this model is no vision-language model's tower" in n for n in lines)
    assert any("word=dog was not used" in n for n in lines)
    assert "words" not in sidebar_widget(at, "radio", "Map").options


def test_a_qwen_windowed_layers_row_is_the_querys_window_as_transformers_computes_it(qwen, folder, drawn):  # noqa: F811
    """Issue 68: the query's row in a windowed layer is its 8 x 8 window (four 2 x 2 merge units a side, tiling the
    grid from its top left, the edge's cut), zero elsewhere, as transformers' eager attention gives it; a global
    layer's reads the whole grid."""
    from test_qwen_vl_parity import image
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    picture_ = image(IMAGES[0])  # 310 x 230 px: 16 x 22 patches, windows cut by the right edge
    theirs = Qwen2VLImageProcessor.from_pretrained(folder)(images=[picture_], return_tensors="pt")
    grid = tuple(theirs["image_grid_thw"][0, 1:].tolist())
    reference, _ = transformers_attention(qwen, theirs["pixel_values"], theirs["image_grid_thw"])
    at = open_vlm(folder, picture_)
    query = 7 * grid[1] + 17  # row 8, column 18: in the third column of windows
    sidebar_widget(at, "selectbox", "Query token").set_value(query)
    sidebar_widget(at, "select_slider", "Layer").set_value(1)
    at.run()
    assert not errors(at)
    want = reference[0][:, query].mean(0).view(grid).numpy()  # the mean over heads
    np.testing.assert_allclose(drawn[-1], want, rtol=0, atol=ATOL)
    assert np.count_nonzero(drawn[-1]) == 8 * 6
    assert "in its 8×8 window: cut by the grid's edge, rows 1–8, cols 17–22 of the grid (zero outside it" \
        in map_caption(at)
    sidebar_widget(at, "select_slider", "Layer").set_value(3)  # fullatt_block_indexes [2]
    at.run()
    np.testing.assert_allclose(drawn[-1], reference[2][:, query].mean(0).view(grid).numpy(), rtol=0, atol=ATOL)
    assert "over the whole grid (one of its global layers" in map_caption(at)


@pytest.mark.parametrize("kind", ["llava", "qwen2_5_vl"])
def test_a_towers_page_says_the_size_it_is_shown_and_its_prediction_box_points_to_the_word_lens(vlms, kind):
    # Issue 76, item 2: Qwen2.5-VL's sidebar said 1,036 px (74 x 74 patches), the size its config is built at, where
    # each image is shown at its own (smart_resize); a tower's prediction box called it "a feature model such as DINO".
    from vit.core.images import smart_resize

    path, _, processor = vlms[kind]
    at = open_vlm(path)
    [info] = [i.value for i in at.main.info if "No prediction" in i.value]
    assert "vision-language model's tower has no classifier" in info and "“Ask in words”" in info
    assert "visual logit lens" in info and "DINO" not in info
    first = sidebar_widget(at, "selectbox", "Input size").options[0]
    [image_caption] = [c.value for c in at.main.caption if "the model sees it as" in c.value]
    if kind == "llava":
        assert first == "the model's size (32 px)"
        return
    low, high, unit = processor.size["shortest_edge"], processor.size["longest_edge"], 28
    assert first == f"each image at its own size (smart_resize, {low:,} to {high:,} pixels in whole {unit}-px units)"
    height, width = smart_resize(picture().height, picture().width, unit, low, high)  # Qwen's own, as it is shown
    assert f"the model sees it as {width}×{height} px in {height // 14} rows × {width // 14} columns" \
        in displayed(image_caption)
    assert any("each image at its own size" in displayed(c.value) for c in at.sidebar.caption)
