"""``vit.analyze --mechanism``: head attribution, ablation, high-norm tokens, massive activations and sinks over
a dataset, on a model whose answers are known by hand (it always says "cat" with uniform attention)."""

import json

import numpy as np
import pytest
import torch
from test_analyze import CLASSES, always, world  # noqa: F401 (world is a fixture)
from test_app import dirs  # noqa: F401 (a fixture)

from vit import analyze
from vit.checkpoint import load_checkpoint
from vit.evaluate import labelled_files
from vit.explain.mechanism import components as mechanism
from vit.explain.views import dataset


def test_mechanism_of_an_always_cat_model_by_hand(world):  # noqa: F811
    checkpoint = load_checkpoint(world / "cat.pt")
    files = labelled_files(world / "data", CLASSES)
    stats = dataset.analyze_mechanism(checkpoint, files, norm_threshold=0.0)
    np.testing.assert_array_equal(stats.class_counts, [3, 2, 1])  # the broken file is skipped
    # The head reads nothing (zero weights): every component's direct attribution and every ablation is 0.
    np.testing.assert_array_equal(stats.dla_heads, np.zeros((3, 2, 2)))
    np.testing.assert_allclose(stats.ablation, np.zeros((2, 2)), atol=1e-6)
    # Uniform attention over 17 tokens: every key gets 1/17 of it.
    np.testing.assert_allclose(stats.sink_mass, np.full((2, 2), 1 / 17), rtol=1e-5)
    assert (stats.sink_value_norm > 0).all()
    np.testing.assert_array_equal(stats.high_norm_rate, np.ones(3))  # every token's norm is over 0
    assert stats.high_norm_positions.shape == (4, 4) and stats.prefix_high_norm_rate.tolist() == [1.0]
    assert stats.massive.shape == (2, 4) and (stats.massive[:, 0] >= stats.massive[:, 2]).all()


def test_the_default_threshold_is_twice_the_median_patch_norm(world):  # noqa: F811
    checkpoint = load_checkpoint(world / "cat.pt")
    files = labelled_files(world / "data", CLASSES)
    stats = dataset.analyze_mechanism(checkpoint, files, ablation=False)
    assert stats.ablation is None
    from vit.core.images import open_image
    from vit.core.inference import preprocess

    norms = []
    for path, _ in files:
        if path.name != "broken.png":
            x = preprocess([open_image(path.read_bytes(), name=path.name)], checkpoint.preprocessing)
            with torch.no_grad():
                norms.append(mechanism.hidden_states(checkpoint.model, x)[0, -1, 1:].norm(dim=-1))
    assert stats.norm_threshold == pytest.approx(2 * float(np.median(torch.cat(norms).numpy())), rel=1e-4)


def test_cli_mechanism_adds_json_pngs_and_report_sections(world, capsys):  # noqa: F811
    code = analyze.main([str(world / "cat.pt"), "--data", str(world / "data"), "--out", str(world / "out"),
                         "--mechanism", "--norm-threshold", "1.5"])
    out = capsys.readouterr()
    assert code == 1 and "broken.png" in out.err
    saved = json.loads((world / "out" / "analysis.json").read_text())["mechanism"]
    assert saved["norm_threshold"] == 1.5 and np.array(saved["dla_heads"]).shape == (3, 2, 2)
    for stem in ("dla", "ablation", "high_norm_rate", "high_norm_positions", "massive", "sinks"):
        assert (world / "out" / f"mechanism_{stem}.png").read_bytes()[:4] == b"\x89PNG"
    assert (world / "out" / "report.html").read_text().count("plotly-graph-div") >= 11


def test_class_names_in_the_mechanism_figures_are_text_not_html():
    stats = dataset.MechanismStats(
        class_counts=np.array([1, 1]), dla_heads=np.ones((2, 1, 1)), dla_mlps=np.zeros((2, 1)),
        ablation=None, norm_threshold=1.0, high_norm_rate=np.zeros(2), high_norm_positions=np.zeros((2, 2)),
        prefix_high_norm_rate=np.zeros(1), massive=np.ones((1, 4)), sink_mass=np.ones((1, 1)),
        sink_value_norm=np.ones((1, 1)), sink_on_prefix=np.zeros((1, 1)))
    fig = dataset.mechanism_figures(stats, ["<b>x</b>", "y"])["mechanism_dla"]
    assert [a.text for a in fig.layout.annotations] == ["&lt;b&gt;x&lt;/b&gt;", "y"]


@pytest.mark.slow
def test_page_adds_the_mechanism_when_asked(world, dirs):  # noqa: F811
    from streamlit.testing.v1 import AppTest
    from test_analyze import APP

    from vit.checkpoint import save_checkpoint

    checkpoints, _ = dirs
    save_checkpoint(checkpoints / "cat.pt", always(0), CLASSES)
    at = AppTest.from_file(APP, default_timeout=180)
    at.switch_page("app_pages/analyze.py")
    at.run()
    at.text_input(key="analyze_folder").set_value(str(world / "data"))
    at.checkbox(key="analyze_mechanism").check()
    at.run()
    at.button[0].click()
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    titles = [json.loads(c.proto.spec)["layout"].get("title", {}).get("text", "") for c in at.get("plotly_chart")]
    assert len(titles) == 5 + 6 and "Massive activations (mean over images)" in titles
    assert any("High-norm tokens: norm over" in c.value for c in at.caption)
