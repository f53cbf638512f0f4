"""Whole-dataset analysis: statistics on a model whose answers are known, the CLI's files, the page."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import follow_page_link, selectbox_labelled
from PIL import Image
from streamlit.testing.v1 import AppTest

from tests.test_app import dirs  # noqa: F401  (fixture)
from vit import analyze
from vit.checkpoint import load_checkpoint, save_checkpoint
from vit.evaluate import labelled_files
from vit.explain.views import dataset
from vit.model import ViT, ViTConfig

CONFIG = ViTConfig(image_size=16, patch_size=4, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32, num_classes=3)
CLASSES = ["cat", "dog", "ship"]
APP = str(Path(__file__).resolve().parent.parent / "app.py")


def always(index: int, probability_logit: float = 10.0) -> ViT:
    """A model that answers class ``index`` whatever the image, with uniform attention (zero query/key weights)."""
    torch.manual_seed(0)
    model = ViT(CONFIG).eval()
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.zero_()
        model.head.bias[index] = probability_logit
        for block in model.blocks:
            block.attn.qkv.weight[: 2 * CONFIG.hidden_size].zero_()  # q = k = bias: every score equal
            block.attn.qkv.bias[: 2 * CONFIG.hidden_size].zero_()
    return model


@pytest.fixture
def world(tmp_path):
    save_checkpoint(tmp_path / "cat.pt", always(0), CLASSES)
    rng = np.random.default_rng(0)
    for name, count in (("cat", 3), ("dog", 2), ("ship", 1)):
        (tmp_path / "data" / name).mkdir(parents=True)
        for i in range(count):
            pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "data" / name / f"{i}.png")
    (tmp_path / "data" / "dog" / "broken.png").write_text("not an image")
    return tmp_path


def test_an_always_cat_model_with_uniform_attention_by_hand(world):
    checkpoint = load_checkpoint(world / "cat.pt")
    files = labelled_files(world / "data", CLASSES)
    calls = []
    result = dataset.analyze_files(checkpoint, files, batch_size=4, progress=lambda d, t: calls.append((d, t)))
    assert result.count == 6 and len(result.skipped) == 1 and "broken.png" in result.skipped[0]
    assert calls[-1] == (7, 7)
    np.testing.assert_array_equal(result.confusion, [[3, 0, 0], [2, 0, 0], [1, 0, 0]])
    assert result.accuracy == pytest.approx(0.5)
    np.testing.assert_array_equal(result.class_counts, [3, 2, 1])
    # Uniform attention over 17 tokens: every patch gets 1/17, entropy ln 17. Rollout's factor is
    # (J/17 + I)/2 (J all ones, J @ J = 17 J), so two layers give (3 J/17 + I)/4: 3/68 for each patch.
    np.testing.assert_allclose(result.class_attention, np.full((3, 4, 4), 1 / 17), rtol=1e-5)
    np.testing.assert_allclose(result.entropy, np.full((2, 2), np.log(17)), rtol=1e-5)
    np.testing.assert_allclose(result.class_rollout, np.full((3, 4, 4), 3 / 68), rtol=1e-5)
    # Mean distance of uniform attention on a 4x4 grid of 4-px patches: the mean pairwise centre distance.
    centres = np.array([(r, c) for r in range(4) for c in range(4)]) * 4.0
    pairwise = np.linalg.norm(centres[:, None] - centres[None], axis=-1).mean()
    np.testing.assert_allclose(result.distance, np.full((2, 2), pairwise), rtol=1e-5)
    assert [m.label for m in result.mistakes] == ["dog", "dog", "ship"]
    assert all(m.predicted == "cat" and m.confidence > 0.99 for m in result.mistakes)


def test_cli_writes_json_pngs_and_one_html_report(world, capsys):
    code = analyze.main([str(world / "cat.pt"), "--data", str(world / "data"), "--out", str(world / "out"),
                         "--limit", "7"])
    out = capsys.readouterr()
    assert code == 1  # one unreadable image, named on stderr
    assert "skipped" in out.err and "broken.png" in out.err and "analysing" in out.err
    summary = json.loads(out.out)
    assert summary["count"] == 6
    saved = json.loads((world / "out" / "analysis.json").read_text())
    assert saved["confusion"] == [[3, 0, 0], [2, 0, 0], [1, 0, 0]]
    assert len(saved["most_confident_mistakes"]) == 3
    assert np.array(saved["mean_attention_distance"]).shape == (2, 2)
    for name in ("distance", "entropy", "class_attention", "class_rollout", "confusion"):
        assert (world / "out" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert (world / "out" / "report.html").read_text().count("plotly-graph-div") >= 5


@pytest.mark.slow
def analyse_on_page(world, dirs) -> AppTest:  # noqa: F811
    """The Analyse page run on ``world``'s data folder with the always-cat model."""
    checkpoints, _ = dirs
    save_checkpoint(checkpoints / "cat.pt", always(0), CLASSES)
    at = AppTest.from_file(APP, default_timeout=180)
    at.switch_page("app_pages/analyze.py")
    at.run()
    assert not at.exception
    at.text_input(key="analyze_folder").set_value(str(world / "data"))
    at.run()  # the button is enabled once a folder is given
    at.button[0].click()
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def test_page_analyses_a_folder_and_opens_a_mistake_in_the_explorer(world, dirs):  # noqa: F811
    at = analyse_on_page(world, dirs)
    assert [m.value for m in at.metric] == ["6", "50.0%", "1"]
    assert len(at.get("plotly_chart")) == 5
    assert [link.value for link in at.page_link].count("Open in the explorer") == 3
    at = follow_page_link(at, "Open in the explorer")
    assert not at.exception, [e.message for e in at.exception]
    assert any("Close " in b.label for b in at.sidebar.button)  # the explorer shows the opened file
    assert any(".png, 16×16 px" in c.value for c in at.main.caption)


def test_page_shows_a_mistakes_file_name_with_its_control_characters(world, dirs):  # noqa: F811
    """A file named 'photo\u202egnp.exe' showed as 'photoexe.png' among the mistakes."""
    (world / "data" / "ship" / "0.png").rename(world / "data" / "ship" / "x\u202egnp.exe.png")
    at = analyse_on_page(world, dirs)
    texts = [t.value for t in at.text]
    assert any(t.startswith("x\\u202egnp.exe.png\ntrue: ship") for t in texts), texts
    assert not any("\u202e" in t for t in texts)


OUTSIDE_THE_FIGURE = """() => { const svg = document.querySelector('.main-svg').getBoundingClientRect();
  return [...document.querySelectorAll('.xtick text, .ytick text, .g-xtitle text, .g-ytitle text')]
    .filter(e => { const b = e.getBoundingClientRect();
                   return b.left < svg.left - 0.5 || b.right > svg.right + 0.5 || b.top < svg.top - 0.5
                          || b.bottom > svg.bottom + 0.5; })
    .map(e => e.textContent); }"""


@pytest.mark.browser
def test_the_analysis_figures_draw_their_tick_labels_and_titles_inside_the_figure():
    # Issue 45, item 7: the page's figures carry Streamlit's Plotly template (set when streamlit is imported), which
    # has no automargin: with the margins at 0 the axis numbers, class names and titles fell outside the figure.
    import streamlit  # noqa: F401  (the template the page's figures are built with)
    from helpers import chromium

    from vit.explain.views import figures

    built = [figures.layer_stats_figure(np.linspace(0, 100, 72).reshape(12, 6), "mean attention distance (px)",
                                        "Mean attention distance per head"),
             dataset.confusion_figure(np.eye(3), ["airplane", "automobile", "bird"]),
             figures.massive_activations_figure(np.ones((3, 4))), figures.norm_histogram_figure(np.ones(5), 1.0)]
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 700, "height": 600})
        for fig in built:
            assert fig.layout.template.layout.xaxis.automargin is None  # Streamlit's template, as on the page
            page.set_content(fig.update_layout(width=600).to_html(include_plotlyjs=True, full_html=True))
            page.wait_for_selector(".main-svg .xtick text")
            assert page.evaluate(OUTSIDE_THE_FIGURE) == [], fig.layout.title.text


def test_class_names_in_the_figures_are_text_not_html():
    names = ["<b>x</b>", "<a href='http://example.invalid'>y</a>"]
    confusion = dataset.confusion_figure(np.eye(2), names)
    assert list(confusion.data[0].x) == ["&lt;b&gt;x&lt;/b&gt;", "&lt;a href='http://example.invalid'&gt;y&lt;/a&gt;"]
    maps = dataset.class_maps_figure(np.zeros((2, 2, 2)), names, "maps")
    titles = [a.text for a in maps.layout.annotations]
    assert titles == list(confusion.data[0].x) and not any("<" in t for t in titles)


def test_on_a_network_without_a_token_the_page_reads_no_folder(world, dirs):  # noqa: F811
    from streamlit import config

    checkpoints, _ = dirs
    save_checkpoint(checkpoints / "cat.pt", always(0), CLASSES)
    before = config.get_option("server.address")
    config.set_option("server.address", "0.0.0.0")
    try:
        at = AppTest.from_file(APP, default_timeout=180)
        at.switch_page("app_pages/analyze.py")
        at.session_state["analyze_folder"] = str(world / "data")  # as a crafted widget message would
        at.run()
    finally:
        config.set_option("server.address", before)
    assert not at.exception
    assert any("are disabled" in w.value and "VIT_TRAIN_TOKEN" in w.value for w in at.warning)
    assert not at.text_input and not at.button and not at.metric, "no folder, no model path, nothing analysed"


def test_page_opens_a_model_by_path_and_draws_its_maps_without_the_theme(world, dirs):  # noqa: F811
    """Issue 19, item 7: any openable model, not only shipped ones; Plotly's own colours (no pink low end)."""
    at = AppTest.from_file(APP, default_timeout=180)
    at.switch_page("app_pages/analyze.py")
    at.run()
    assert any("No checkpoints yet" in i.value for i in at.info)  # the app's checkpoints folder is empty
    at.text_input(key="analyze_open_path").set_value(str(world / "cat.pt"))  # a file outside it
    at.run()
    assert selectbox_labelled(at, "Checkpoint").value == str(world / "cat.pt")
    at.text_input(key="analyze_folder").set_value(str(world / "data"))
    at.run()
    [analyse] = [b for b in at.button if b.label == "Analyse"]
    analyse.click()
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert [m.value for m in at.metric] == ["6", "50.0%", "1"]
    charts = at.get("plotly_chart")
    assert len(charts) == 5 and all(c.proto.theme == "" for c in charts)


def test_a_path_opened_stays_chosen_when_the_next_message_holds_the_pickers_old_value(world, dirs):  # noqa: F811
    """The explorer's picker race (tests/test_app_model_change.py) on the Analyse page, which shares its picker: the
    browser's message sent before it got the path's model (a folder typed at once) holds the old picker's value,
    which is ignored; the visitor's pick on the new picker is not."""
    checkpoints, _ = dirs
    save_checkpoint(checkpoints / "shipped.pt", always(1), CLASSES)
    at = AppTest.from_file(APP, default_timeout=180)
    at.switch_page("app_pages/analyze.py")
    at.run()
    assert selectbox_labelled(at, "Checkpoint").value == str(checkpoints / "shipped.pt")
    at.text_input(key="analyze_open_path").set_value(str(world / "cat.pt"))
    at.text_input(key="analyze_folder").set_value(str(world / "data"))
    browser = at._tree.get_widget_states()  # the path and the folder typed, the picker on shipped.pt
    at.run()
    assert selectbox_labelled(at, "Checkpoint").value == str(world / "cat.pt")
    at._run(widget_state=browser)  # AppTest.run() would send the states of the picker just drawn
    assert not at.exception, [e.message for e in at.exception]
    assert selectbox_labelled(at, "Checkpoint").value == str(world / "cat.pt")
    selectbox_labelled(at, "Checkpoint").set_value(str(checkpoints / "shipped.pt")).run()
    assert selectbox_labelled(at, "Checkpoint").value == str(checkpoints / "shipped.pt")


def test_the_page_caps_how_many_images_it_analyses(world, dirs, monkeypatch):  # noqa: F811
    """Issue 20, item 9: 'all of them' on a huge folder is a seeded sample of at most the page's cap, said."""
    checkpoints, _ = dirs
    save_checkpoint(checkpoints / "cat.pt", always(0), CLASSES)
    monkeypatch.setenv("VIT_ANALYSE_MAX_IMAGES", "4")  # the folder has 7 files
    at = AppTest.from_file(APP, default_timeout=180)
    at.switch_page("app_pages/analyze.py")
    at.run()
    at.number_input(key="analyze_limit").set_value(0)
    at.text_input(key="analyze_folder").set_value(str(world / "data"))
    at.run()
    [analyse] = [b for b in at.button if b.label == "Analyse"]
    analyse.click()
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("has 7 images; this page analyses a seeded sample of 4" in i.value for i in at.info)
    images, _, unreadable = (m.value for m in at.metric)
    assert int(images) + int(unreadable) == 4


def test_the_page_lists_a_bounded_part_of_a_large_hf_cache_and_finds_the_rest_by_name(world, dirs):  # noqa: F811
    """Issue 20, item 9: the picker looks into at most MAX_HF_CACHE_EXAMINED of the HF cache's models."""
    from tests.test_catalog import tiny_hf_cache
    from vit.app import catalog

    count = catalog.MAX_HF_CACHE_EXAMINED + 5
    tiny_hf_cache(dirs[0].parent / "hf-cache", count)  # the dirs fixture points HF_HUB_CACHE here
    at = AppTest.from_file(APP, default_timeout=180)
    at.switch_page("app_pages/analyze.py")
    at.run()
    assert len(selectbox_labelled(at, "Checkpoint").options) == catalog.MAX_HF_CACHE_EXAMINED
    assert any(f"{count:,} models in the Hugging Face cache match" in c.value for c in at.caption)
    at.text_input(key="analyze_hf_filter").set_value(f"vit-{count - 1:04d}")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert [o.split(" · ")[0] for o in selectbox_labelled(at, "Checkpoint").options] == [f"org/vit-{count - 1:04d}"]


def test_the_aggregate_does_not_depend_on_how_the_files_were_batched(world):
    checkpoint = load_checkpoint(world / "cat.pt")
    files = labelled_files(world / "data", CLASSES)
    summaries = dataset.image_summaries(checkpoint, [path for path, _ in files])  # one batch, broken.png too
    whole = dataset.Aggregator(CLASSES, files)
    whole.add(summaries)
    pieces = dataset.Aggregator(CLASSES, files)
    for rows in (slice(0, 3), slice(3, 4), slice(4, None)):
        pieces.add({key: value[rows] for key, value in summaries.items()})
    assert pieces.result().to_json() == whole.result().to_json()  # the same digits: image by image in file order
    assert whole.result().count == 6 and len(whole.result().skipped) == 1
    with pytest.raises(ValueError, match="for 3 of 7 files"):
        short = dataset.Aggregator(CLASSES, files)
        short.add({key: value[:3] for key, value in summaries.items()})
        short.result()


def test_an_analysis_reads_back_from_its_json_and_refuses_what_is_not_one(world):
    checkpoint = load_checkpoint(world / "cat.pt")
    analysis = dataset.analyze_files(checkpoint, labelled_files(world / "data", CLASSES))
    back = dataset.DatasetAnalysis.from_json(json.loads(json.dumps(analysis.to_json())))
    assert json.dumps(back.to_json()) == json.dumps(analysis.to_json())
    for damaged in ({}, {**analysis.to_json(), "confusion": [[1]]}, {**analysis.to_json(), "class_names": "cat"},
                    {**analysis.to_json(), "mean_attention_distance": [[float("nan")]]}):
        with pytest.raises(ValueError) as error:
            dataset.DatasetAnalysis.from_json(damaged)
        assert "\n" not in str(error.value)


def test_an_analysis_read_back_for_a_folder_refuses_a_mistake_outside_it(world):
    """Issue 39, item 4: analysis.json is written elsewhere (a Ray job on shared storage) and its mistakes open
    in the explorer: one naming /dev/zero or a file outside the folder is refused when the file is read."""
    checkpoint = load_checkpoint(world / "cat.pt")
    written = dataset.analyze_files(checkpoint, labelled_files(world / "data", CLASSES)).to_json()
    assert dataset.DatasetAnalysis.from_json(written, folder=world / "data").mistakes
    (world / "data" / "cat" / "link.png").symlink_to(world / "cat.pt")  # inside by name, outside once resolved
    for path in ("/dev/zero", str(world / "cat.pt"), str(world / "data" / "cat" / "link.png"),
                 str(world / "data" / ".." / "cat.pt")):
        forged = {**written, "most_confident_mistakes": [{**written["most_confident_mistakes"][0], "path": path}]}
        with pytest.raises(ValueError, match="outside the analysed folder"):
            dataset.DatasetAnalysis.from_json(forged, folder=world / "data")


def test_an_image_linked_from_a_folder_to_a_file_outside_it_is_not_the_folders(world):
    """Issue 39, item 5b: labelled_files followed a file link out of a data root (only folders were resolved)."""
    outside = world / "outside.png"
    (world / "data" / "cat" / "0.png").rename(outside)
    (world / "data" / "cat" / "0.png").symlink_to(outside)
    (world / "data" / "cat" / "1-again.png").symlink_to(world / "data" / "cat" / "1.png")  # a link inside: kept
    cats = [path.name for path, label in labelled_files(world / "data", CLASSES) if label == 0]
    assert cats == ["1-again.png", "1.png", "2.png"]
