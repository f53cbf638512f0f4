"""The explorer's "Ask in words" box on an open_clip CLIP (issue 22): zero-shot scores equal open_clip's own on
the image the model saw, a map for each label by every method that applies, the difference of two labels, the
curves, plain-text labels, and one-line errors past the bounds; models without a text side show no box."""

import io

import numpy as np
import pytest
import torch
from PIL import Image
from test_app import charts, dirs, png_bytes, run_app, sidebar_widget, upload  # noqa: F401 (a fixture)
from test_app_mechanism import switch_heads_off
from test_app_share import open_link, url
from test_prompts import save_open_clip

from vit.core.text import escape_markdown

open_clip = pytest.importorskip("open_clip")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dirs")]

LABELS = ["a dog", "a cat", "<b>bold</b> *star*"]


@pytest.fixture
def clip(tmp_path):
    return save_open_clip(tmp_path / "open_clip", layers=6)  # six blocks: CLIP Surgery's too


def open_clip_app(folder, image: bytes):
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(folder))
    at.run()
    upload(at, "photo.png", image)
    assert not at.exception, [e.message for e in at.exception]
    return at


def ask(at, text):
    [area] = [w for w in at.main.text_area if w.label == "Labels"]
    area.set_value(text)
    at.run()
    assert not at.exception, [e.message for e in at.exception]


def open_clip_probabilities(model, folder, image: bytes) -> torch.Tensor:
    """open_clip's own zero-shot pipeline on ``image``: its eval transform, tokenizer and encoders, ``(labels,)``."""
    transform = open_clip.image_transform(32, is_train=False, mean=open_clip.OPENAI_DATASET_MEAN,
                                          std=open_clip.OPENAI_DATASET_STD)
    tokens = open_clip.get_tokenizer(f"local-dir:{folder}")([f"a photo of a {label}." for label in LABELS])
    with torch.no_grad():
        x = transform(Image.open(io.BytesIO(image)))[None]
        return (model.logit_scale.exp() * model.encode_image(x, normalize=True)
                @ model.encode_text(tokens, normalize=True).T).softmax(dim=-1)[0]


def score_bars(at):
    bars = [t for fig in charts(at) for t in fig["data"] if t.get("type") == "bar"]
    assert len(bars) == 1
    return bars[0]


def test_ask_in_words_scores_and_maps_every_label(clip):
    model, folder = clip
    image = png_bytes(32, 32, seed=4)  # the model's own size: every pipeline leaves it as it is
    at = open_clip_app(folder, image)
    assert "Ask in words" in [h.value for h in at.main.subheader]
    ask(at, ", ".join(LABELS))
    bars = score_bars(at)
    expected = open_clip_probabilities(model, folder, image)
    escaped = ["a dog", "a cat", "&lt;b&gt;bold&lt;/b&gt; *star*"]  # Plotly reads tags: shown as typed
    got = dict(zip(bars["y"], bars["x"], strict=True))
    assert sorted(got) == sorted(escaped)
    assert [got[e] for e in escaped] == pytest.approx(expected.tolist(), abs=1e-5)
    assert any("softmax" in c.value for c in at.main.caption)

    [method] = [w for w in at.main.selectbox if w.label == "Method"]
    assert method.options == ["gradient rollout (Chefer et al. 2021b)", "LeGrad", "AttnLRP", "Grad-ECLIP", "SCLIP",
                              "NACLIP", "ClearCLIP", "MaskCLIP", "CLIP Surgery"]
    for key, name in (("rollout", "gradient rollout"), ("legrad", "LeGrad"), ("attnlrp", "AttnLRP"),
                      ("grad_eclip", "Grad-ECLIP"), ("sclip", "SCLIP"), ("naclip", "NACLIP"),
                      ("clearclip", "ClearCLIP"), ("maskclip", "MaskCLIP"), ("clipsurgery", "CLIP Surgery")):
        [method] = [w for w in at.main.selectbox if w.label == "Method"]
        method.set_value(key)
        at.run()
        assert not at.exception, [e.message for e in at.exception]
        assert any(c.value.startswith(f"**{name}") and "for “a dog”" in c.value for c in at.main.caption)
        if key == "legrad":  # a CLIP's readout alone: SigLIP's probe and empty prompt are not this model's
            [caption] = [c.value for c in at.main.caption if c.value.startswith("**LeGrad")]
            assert "CLIP readout (ln_post of the mean over tokens)" in caption
            assert "SigLIP" not in caption and "empty prompt" not in caption
    [label] = [w for w in at.main.selectbox if w.label == "Map for"]
    assert label.options == LABELS  # plain text: the options show the labels as typed
    label.set_value(2)
    [minus] = [w for w in at.main.selectbox if w.label == "Minus (optional)"]
    minus.set_value(0)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    difference = [c.value for c in at.main.caption if "minus" in c.value]
    assert difference and f"“{escape_markdown(LABELS[2])}” minus “a dog”" in difference[0]  # shown as typed


def test_ask_in_words_curves_track_the_similarity(clip):
    _, folder = clip
    at = open_clip_app(folder, png_bytes(32, 32, seed=4))
    ask(at, "a dog, a cat")
    [toggle] = [t for t in at.main.toggle if t.key == "words_curves"]
    toggle.set_value(True)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    curves = [fig for fig in charts(at) if any(t.get("name", "").startswith("deletion") for t in fig["data"])]
    assert curves and "cos(image" in curves[0]["layout"]["yaxis"]["title"]["text"]


@pytest.mark.parametrize("text, template, message", [
    (",".join(str(i) for i in range(65)), None, "at most 64"),
    ("a dog, a dog", None, "twice"),
    ("a dog", "no slot", "exactly once"),
])
def test_ask_in_words_refuses_in_one_line(clip, text, template, message):
    _, folder = clip
    at = open_clip_app(folder, png_bytes(32, 32))
    if template is not None:
        [box] = [w for w in at.main.text_input if w.label == "Template"]
        box.set_value(template)
    ask(at, text)
    errors = [e.value for e in at.main.error]
    assert any(message in e and "\n" not in e for e in errors), errors


def test_a_model_without_text_shows_no_box(tmp_path):
    import transformers

    transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(
        image_size=32, patch_size=8, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=2)).save_pretrained(tmp_path / "v")
    at = open_clip_app(tmp_path / "v", png_bytes(32, 32))
    assert "Ask in words" not in [h.value for h in at.main.subheader]
    assert np.all([w.label != "Labels" for w in at.main.text_area])


def test_a_clips_logit_lens_reads_the_typed_labels(clip):
    """Issue 24: for a feature model the logit lens reads the labels typed under "Ask in words": each token through
    ln_post, the projection and the cosine to the labels. After the last layer the CLS token's read-out is what
    open_clip's own zero-shot pipeline gives the image, so its top row equals open_clip's probabilities."""
    model, folder = clip
    image = png_bytes(32, 32, seed=4)
    at = open_clip_app(folder, image)
    ask(at, ", ".join(LABELS))
    at.toggle(key="mechanism_view").set_value(True)
    at.session_state["mechanism_tab"] = "Logit lens"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    expected = open_clip_probabilities(model, folder, image)
    [table] = at.dataframe
    order = expected.argsort(descending=True)
    assert list(table.value["top 1"])[-1] == f"{LABELS[order[0]]} ({float(expected[order[0]]):.1%})"
    assert list(table.value["top 2"])[-1] == f"{LABELS[order[1]]} ({float(expected[order[1]]):.1%})"
    assert any("cosine to the typed labels" in c.value for c in at.caption)
    # Without labels the tab says where they come from.
    ask(at, "")
    assert any("type labels under" in i.value for i in at.info)



@pytest.mark.parametrize("broken, side", [("token_embedding.weight", "the text model's embeddings of these labels"),
                                          ("visual.proj", "its weights hold NaN or infinite values")])
def test_nan_weights_are_named_instead_of_nan_scores(clip, broken, side):
    """A CLIP whose weights hold NaN gave NaN zero-shot scores without a word (noticed in the last note)."""
    from safetensors.torch import load_file, save_file

    _, folder = clip
    state = load_file(folder / "open_clip_model.safetensors")
    state[broken] = torch.full_like(state[broken], float("nan"))
    save_file(state, folder / "open_clip_model.safetensors")
    at = open_clip_app(folder, png_bytes(32, 32, seed=4))
    ask(at, "a dog, a cat")
    assert not [t for fig in charts(at) for t in fig["data"] if t.get("type") == "bar" and "a dog" in t["y"]]
    errors = [e.value.replace("\\", "") for e in at.main.error]
    assert any(side in e and "not finite" in e for e in errors), errors


def test_heads_switched_off_in_every_map_change_the_words_scores_as_open_clip_with_those_heads_zeroed(clip):
    """A feature model has no prediction to ablate, but its heads can be switched off in every map: the scores of
    the labels asked in words are then open_clip's own with those heads' outputs zeroed (their columns of
    ``out_proj``, which nn.MultiheadAttention reads directly)."""
    import copy

    model, folder = clip
    image = png_bytes(32, 32, seed=4)
    at = open_clip_app(folder, image)
    ask(at, ", ".join(LABELS))
    full = dict(zip(score_bars(at)["y"], score_bars(at)["x"], strict=True))
    at.toggle(key="mechanism_view").set_value(True)
    at.session_state["mechanism_tab"] = "Ablation"
    at.run()
    assert any("no classifier: heads switched off here change every map" in i.value for i in at.info)
    switch_heads_off(at, ["1.2", "3.1"], everywhere=True)
    assert any("are switched off (zero ablation)" in i.value for i in at.info), [i.value for i in at.info]

    ablated = copy.deepcopy(model)
    hd = ablated.visual.transformer.resblocks[0].attn.head_dim
    with torch.no_grad():
        ablated.visual.transformer.resblocks[0].attn.out_proj.weight[:, hd:2 * hd] = 0  # head 1.2
        ablated.visual.transformer.resblocks[2].attn.out_proj.weight[:, :hd] = 0  # head 3.1
    expected = open_clip_probabilities(ablated, folder, image)
    escaped = ["a dog", "a cat", "&lt;b&gt;bold&lt;/b&gt; *star*"]
    got = dict(zip(score_bars(at)["y"], score_bars(at)["x"], strict=True))
    assert [got[e] for e in escaped] == pytest.approx(expected.tolist(), abs=1e-5)
    assert [got[e] for e in escaped] != pytest.approx([full[e] for e in escaped], abs=1e-4)


def test_the_prediction_box_reads_the_labels_once_they_are_scored(clip):
    """Issue 33, item 6: a CLIP's Prediction box said "no classifier" even after labels were typed and scored."""
    _, folder = clip
    at = open_clip_app(folder, png_bytes(32, 32, seed=4))
    assert any("no classifier" in info.value for info in at.main.info)
    ask(at, "a dog, a cat")
    assert not any("no classifier" in info.value for info in at.main.info)
    assert any(m.value.startswith("Of the 2 label(s) asked in words below, most probable: **“a ")
               for m in at.main.markdown)
    assert len(score_bars(at)["y"]) == 2  # the scores chart is not drawn twice


def test_the_label_box_shows_no_character_counter_and_still_bounds_the_text(clip):
    """Issue 33, item 10: max_chars made Streamlit show a "47/12928" counter under the labels; the bound stays,
    as one line, from split_labels."""
    _, folder = clip
    at = open_clip_app(folder, png_bytes(32, 32, seed=4))
    [area] = [w for w in at.main.text_area if w.label == "Labels"]
    assert not area.proto.max_chars
    ask(at, "a dog, " * 3000)
    assert any("characters long" in e.value for e in at.main.error)


def test_a_label_whose_article_the_template_doubles_is_pointed_out():
    from vit.explain.language import prompts, words

    def described(labels, template, ensemble=False):
        asked = words.Answer(prompts.Prompts(labels, [template], torch.zeros(len(labels), 2), 100.0, 0.0, "softmax"),
                             np.zeros(len(labels)), np.full(len(labels), 1 / len(labels)))
        return words.describe_scores(asked, ensemble)

    assert escape_markdown("“a dog” is read as “a photo of a a dog.”") in described(["cat", "a dog"],
                                                                                    "a photo of a {}.")
    assert escape_markdown("“An apple” is read as “a photo of the An apple.”") in described(["An apple"],
                                                                                           "a photo of the {}.")
    for labels, template in ((["a dog"], "{}"), (["dog", "another dog", "A"], "a photo of a {}."),
                             (["a dog"], "a photo of my {}.")):
        assert "Note" not in described(labels, template)
    assert "Note" not in described(["a dog"], "a photo of a {}.", ensemble=True)  # 80 templates: not one prompt


def test_a_link_carries_the_labels_asked_in_words(clip):
    """A CLIP's labels in a link are asked again: the scores are open_clip's own for them on the linked image."""
    model, folder = clip
    image = png_bytes(32, 32, seed=4)
    at = open_clip_app(folder, image)
    ask(at, ", ".join(LABELS))
    assert url(at)["labels"] == ", ".join(LABELS)

    again = open_link(url(at))
    assert [w.value for w in again.main.text_area if w.label == "Labels"] == [", ".join(LABELS)]
    got = dict(zip(*(score_bars(again)[k] for k in ("y", "x")), strict=True))
    expected = open_clip_probabilities(model, folder, image)
    assert [got[e] for e in ("a dog", "a cat", "&lt;b&gt;bold&lt;/b&gt; *star*")] == pytest.approx(
        expected.tolist(), abs=1e-5)
