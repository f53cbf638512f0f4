"""The explorer's Mechanism view through Streamlit's AppTest: logit lens, head attribution, ablation, phenomena."""

import base64
import re
from pathlib import Path

import numpy as np
import pytest
import test_app
import torch
from test_app import CLASSES, TINY, array_shape, charts, png_bytes, run_app, write_checkpoint

from vit.app import drawing
from vit.checkpoint import load_checkpoint
from vit.core.images import open_image
from vit.core.inference import InputSize, input_shape, preprocess, preprocess_at
from vit.core.runfiles import DEFAULT_CHECKPOINT
from vit.explain.mechanism.components import ablate_heads, direct_logit_attribution, mean_contexts
from vit.explain.mechanism.phenomena import find_register_neurons
from vit.explain.methods.attention import rollout
from vit.explain.views import mechanism_views
from vit.model import ViTConfig

pytest.importorskip("streamlit")
pytestmark = pytest.mark.slow  # each test starts the app
dirs, default_world, forwards = test_app.dirs, test_app.default_world, test_app.forwards  # fixtures


def heatmaps(at, title: str) -> list[dict]:
    """The heatmaps of the figures titled ``title``."""
    return [t for fig in charts(at) if fig["layout"].get("title", {}).get("text") == title
            for t in fig["data"] if t["type"] == "heatmap"]


def open_mechanism(at, tab: str):
    at.toggle(key="mechanism_view").set_value(True)
    at.session_state["mechanism_tab"] = tab
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def switch_heads_off(at, heads: list[str], everywhere: bool = False):
    """Pick ``heads`` ('layer.head') in the Ablation tab, and with ``everywhere`` switch them off in every map."""
    key = next(w.key for w in at.multiselect if w.label.startswith("Switch heads off"))
    at.multiselect(key=key).set_value(heads)
    at.run()
    if everywhere:
        at.toggle(key="ablate_everywhere").set_value(True)
        at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def sampleless_app(dirs, tab: str):
    """The app on a model without sample images (as any HF or timm model), a 40x24 upload, ``tab`` open."""
    checkpoints, _ = dirs
    write_checkpoint(checkpoints / DEFAULT_CHECKPOINT)
    at = run_app()
    image = png_bytes(40, 24, seed=3)
    test_app.upload(at, "cat.png", image)
    return open_mechanism(at, tab), checkpoints, image


def sample_bytes(checkpoints: Path) -> bytes:
    return sorted((checkpoints / "samples" / Path(DEFAULT_CHECKPOINT).stem).iterdir())[0].read_bytes()


def sample_input(checkpoints: Path):
    checkpoint = load_checkpoint(checkpoints / DEFAULT_CHECKPOINT)
    sample = sorted((checkpoints / "samples" / Path(DEFAULT_CHECKPOINT).stem).iterdir())[0]
    image = open_image(sample.read_bytes(), name=sample.name)
    return checkpoint, preprocess([image], checkpoint.preprocessing)


def test_logit_lens_shows_every_layer_and_the_pooled_top_3(default_world, monkeypatch):
    sheets = []
    sheet = drawing.heads_grid_image
    monkeypatch.setattr(drawing, "heads_grid_image", lambda cells, columns, gap=2, labels=None: (
        sheets.append((len(cells), labels)), sheet(cells, columns, gap, labels))[1])
    at = open_mechanism(run_app(), "Logit lens")
    assert (4, ["embedding", "layer 1", "layer 2", "layer 3"]) in sheets  # each thumbnail says what it reads
    [table] = at.dataframe
    assert list(table.value["after"]) == ["embedding", "layer 1", "layer 2", "layer 3"]
    assert all(any(c in cell for c in CLASSES) for cell in table.value["top 1"])
    assert any("after the embedding" in c.value for c in at.caption)


def test_head_attribution_grid_sums_to_the_logit_in_its_caption(default_world):
    checkpoints, _ = default_world
    at = open_mechanism(run_app(), "Head attribution")
    [grid] = heatmaps(at, "Direct logit attribution")
    assert array_shape(grid["z"]) == (3, 3)  # 3 layers x (2 heads + the MLP column)
    checkpoint, x = sample_input(checkpoints)
    dla = direct_logit_attribution(checkpoint.model, x)
    [caption] = [c.value for c in at.caption if "apply_ln_to_stack" in c.value]
    assert f"({float(dla.logit[0]):.4g})" in caption and caption.endswith(f"= {float(dla.total()[0]):.4g}, the logit.")


def test_switching_heads_off_shows_the_ablated_prediction_and_the_grid(default_world):
    checkpoints, _ = default_world
    at = switch_heads_off(open_mechanism(run_app(), "Ablation"), ["1.1", "3.2"])
    bars = [t for fig in charts(at) for t in fig["data"] if t.get("type") == "bar"]
    assert len(bars) == 3  # the sidebar's prediction, then before and after
    checkpoint, x = sample_input(checkpoints)
    with torch.no_grad():
        expected = ablate_heads(checkpoint.model, x, [(0, 0), (2, 1)])[0].softmax(-1)[0]
    shown = dict(zip(bars[2]["y"], bars[2]["x"], strict=True))
    for name, p in shown.items():
        assert p == pytest.approx(float(expected[CLASSES.index(name)]), abs=1e-6)
    assert any("Heads 1.1, 3.2 off" in c.value for c in at.caption)
    assert any("rollout with those heads off" in c.value for c in at.caption)
    image = open_image(sample_bytes(checkpoints), name="x.png")
    view = mechanism_views.ablation_view(checkpoint, image, [(0, 0), (2, 1)])
    with torch.no_grad():
        _, attentions = ablate_heads(checkpoint.model, x, [(0, 0), (2, 1)], output_attentions=True)
    expected_off = rollout(list(attentions), "mean")[0, 0, 1:].reshape(4, 4)  # the CLS row, the CLS key left out
    np.testing.assert_allclose(view.rollout_off, expected_off.numpy(), atol=1e-6)
    assert view.rollout_on.shape == (4, 4) and not np.allclose(view.rollout_on, view.rollout_off)
    at.toggle(key="ablation_grid").set_value(True)
    at.run()
    assert [array_shape(h["z"]) for h in heatmaps(at, "Logit change when one head is ablated")] == [(3, 2)]


def maps_shown(at) -> list[str]:
    """Every figure on the page but the prediction bars, whole (the main map, first, is an image in its layout)."""
    import json

    return [json.dumps(fig, sort_keys=True) for fig in charts(at)
            if not any(t.get("type") == "bar" for t in fig["data"])]


def test_every_map_and_the_prediction_follow_the_heads_switched_off(default_world):
    """Issue 24: switch heads off and watch the prediction and every map update (zero ablation, in the weights)."""
    checkpoints, _ = default_world
    at = open_mechanism(run_app(), "Ablation")
    full_maps = maps_shown(at)
    switch_heads_off(at, ["1.1", "3.2"], everywhere=True)
    assert any("are switched off (zero ablation)" in i.value for i in at.info), [i.value for i in at.info]
    checkpoint, x = sample_input(checkpoints)
    with torch.no_grad():
        full = checkpoint.model(x)[0].softmax(-1)[0]
        expected = ablate_heads(checkpoint.model, x, [(0, 0), (2, 1)])[0].softmax(-1)[0]
    bars = [t for fig in charts(at) for t in fig["data"] if t.get("type") == "bar"]
    sidebar, before, after = (dict(zip(b["y"], b["x"], strict=True)) for b in bars[:3])
    for shown, reference in ((sidebar, expected), (before, full), (after, expected)):
        for name, p in shown.items():
            assert p == pytest.approx(float(reference[CLASSES.index(name)]), abs=1e-6)
    changed = [a != b for a, b in zip(full_maps, maps_shown(at), strict=True)]
    # The image itself, then the overlay, the heads grid, the attention matrix and the layer statistics.
    assert changed == [False] + [True] * (len(full_maps) - 1), changed
    at.toggle(key="ablate_everywhere").set_value(False)
    at.run()
    assert not at.info or not any("switched off" in i.value for i in at.info)
    assert maps_shown(at) == full_maps


def upload_references(at, *images: bytes):
    [uploader] = [u for u in at.sidebar.get("file_uploader") if u.label.startswith("Reference images")]
    uploader.set_value([(f"ref_{i}.png", data, "image/png") for i, data in enumerate(images)])
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def test_mean_ablation_over_uploaded_references_switches_every_map(dirs):
    """A model without sample images (any HF or timm model) mean-ablates over reference images uploaded in the
    sidebar, and every map on the page follows, as it does for zero ablation."""
    at, checkpoints, image = sampleless_app(dirs, "Ablation")
    assert at.radio(key="ablation_mode").disabled  # nothing to average over yet
    references = [png_bytes(24, 40, seed=5), png_bytes(16, 16, seed=6), png_bytes(50, 20, seed=7)]
    upload_references(at, *references)
    assert not at.radio(key="ablation_mode").disabled
    full_maps = maps_shown(at)
    at.radio(key="ablation_mode").set_value("mean")
    switch_heads_off(at, ["1.1", "3.2"])
    assert any("Means over the 3 uploaded reference images" in c.value for c in at.caption)
    at.toggle(key="ablate_everywhere").set_value(True)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("(mean ablation over the 3 uploaded reference images)" in i.value for i in at.info), \
        [i.value for i in at.info]

    checkpoint = load_checkpoint(checkpoints / DEFAULT_CHECKPOINT)
    x = preprocess([open_image(image, name="cat.png")], checkpoint.preprocessing)
    refs = preprocess([open_image(r, name="r.png") for r in references], checkpoint.preprocessing)
    with torch.no_grad():
        expected = ablate_heads(checkpoint.model, x, [(0, 0), (2, 1)], "mean",
                                mean_contexts(checkpoint.model, refs))[0].softmax(-1)[0]
        zeroed = ablate_heads(checkpoint.model, x, [(0, 0), (2, 1)])[0].softmax(-1)[0]
    assert not torch.allclose(expected, zeroed, atol=1e-4)
    bars = [t for fig in charts(at) for t in fig["data"] if t.get("type") == "bar"]
    sidebar, _, after = (dict(zip(b["y"], b["x"], strict=True)) for b in bars[:3])
    for shown in (sidebar, after):
        for name, p in shown.items():
            assert p == pytest.approx(float(expected[CLASSES.index(name)]), abs=1e-6)
    mean_maps = maps_shown(at)
    assert [a != b for a, b in zip(full_maps, mean_maps, strict=True)] == [False] + [True] * (len(full_maps) - 1)
    at.radio(key="ablation_mode").set_value("zero")
    at.run()
    assert any("(zero ablation)" in i.value for i in at.info)
    zero_maps = maps_shown(at)
    assert [a != b for a, b in zip(zero_maps, mean_maps, strict=True)] == [False] + [True] * (len(full_maps) - 1)


def test_without_uploads_mean_ablation_averages_over_the_sample_images(default_world):
    checkpoints, _ = default_world
    at = open_mechanism(run_app(), "Ablation")
    at.radio(key="ablation_mode").set_value("mean")
    switch_heads_off(at, ["2.1"])
    assert any("Means over the 2 sample images" in c.value for c in at.caption)
    checkpoint, x = sample_input(checkpoints)
    samples = sorted((checkpoints / "samples" / Path(DEFAULT_CHECKPOINT).stem).iterdir())
    refs = preprocess([open_image(p.read_bytes(), name=p.name) for p in samples], checkpoint.preprocessing)
    with torch.no_grad():
        expected = ablate_heads(checkpoint.model, x, [(1, 0)], "mean",
                                mean_contexts(checkpoint.model, refs))[0].softmax(-1)[0]
    bars = [t for fig in charts(at) for t in fig["data"] if t.get("type") == "bar"]
    for name, p in dict(zip(bars[2]["y"], bars[2]["x"], strict=True)).items():
        assert p == pytest.approx(float(expected[CLASSES.index(name)]), abs=1e-6)


def test_more_reference_images_than_averaged_are_refused_in_one_line(default_world):
    at = open_mechanism(run_app(), "Ablation")
    upload_references(at, *[png_bytes(8, 8, seed=i) for i in range(mechanism_views.MAX_REFERENCE_IMAGES + 1)])
    at.radio(key="ablation_mode").set_value("mean")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert any(f"{mechanism_views.MAX_REFERENCE_IMAGES + 1} reference images are uploaded; at most "
               f"{mechanism_views.MAX_REFERENCE_IMAGES} are averaged: remove some" in w.value.replace("\\", "")
               for w in at.warning)


def test_a_test_time_register_finds_its_neurons_on_the_uploaded_references(dirs):
    """Without samples (an HF or timm model) the register neurons are found on this image and the references
    uploaded in the sidebar, not on this image alone."""
    at, checkpoints, image = sampleless_app(dirs, "Phenomena")
    references = [png_bytes(24, 40, seed=5), png_bytes(16, 16, seed=6)]
    upload_references(at, *references)
    at.slider(key="norm_threshold").set_value(0.0)  # every token an outlier: every image counts
    at.toggle(key="tt_register").set_value(True)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    [caption] = [c.value for c in at.caption if "Register neurons (layer.neuron)" in c.value]
    checkpoint = load_checkpoint(checkpoints / DEFAULT_CHECKPOINT)
    opened = [open_image(data, name="x.png") for data in (image, *references)]
    with torch.no_grad():
        found = find_register_neurons(checkpoint.model, preprocess(opened, checkpoint.preprocessing), 0.0, top_k=10)
        alone = find_register_neurons(checkpoint.model, preprocess(opened[:1], checkpoint.preprocessing), 0.0,
                                      top_k=10)
    assert [(a, b) for a, b, _ in found] != [(a, b) for a, b, _ in alone]
    shown = caption.replace("\\", "").split("(layer.neuron): ")[-1].rstrip(".")
    assert shown == ", ".join(f"{layer + 1}.{neuron}" for layer, neuron, _ in found)


def test_reference_means_take_the_images_grid_whatever_the_references_aspect(tmp_path):
    """With the aspect kept, each reference is resized to exactly the analysed image's input shape (means are per
    token position), read a chunk at a time: the mean is the one over the whole set at once."""
    checkpoint = load_checkpoint(write_checkpoint(tmp_path / "m.pt"))
    image = open_image(png_bytes(40, 24, seed=3), name="x.png")
    size = InputSize(32, keep_aspect=True)
    references = [open_image(png_bytes(w, h, seed=i), name="r.png")
                  for i, (w, h) in enumerate([(24, 40), (16, 16), (50, 20)] * 4)]  # 12: two chunks
    means = mechanism_views.reference_means(checkpoint, references, image, size)
    shape = input_shape(image, checkpoint.preprocessing, 4, size)
    assert shape == (20, 32)  # long side 32, short side in proportion, whole patches
    with torch.no_grad():
        expected = mean_contexts(checkpoint.model, preprocess_at(references, checkpoint.preprocessing, shape))
    assert means.shape == (3, 1 + 5 * 8, 2, 8)
    torch.testing.assert_close(means, expected, rtol=0, atol=1e-6)
    # preprocess_at prepares an image of the analysed aspect exactly as the image itself is prepared
    torch.testing.assert_close(preprocess_at([image], checkpoint.preprocessing, shape),
                               preprocess([image], checkpoint.preprocessing, size, 4), rtol=0, atol=0)


def test_reference_means_read_no_more_references_than_they_average(tmp_path):
    checkpoint = load_checkpoint(write_checkpoint(tmp_path / "m.pt"))
    image = open_image(png_bytes(seed=3), name="x.png")
    read = []

    def endless():
        while True:
            read.append(1)
            yield image

    with pytest.raises(ValueError, match=f"1 to {mechanism_views.MAX_REFERENCE_IMAGES} reference images; remove some"):
        mechanism_views.reference_means(checkpoint, endless(), image)
    assert len(read) <= mechanism_views.MAX_REFERENCE_IMAGES + mechanism_views.REFERENCE_CHUNK
    with pytest.raises(ValueError, match="add some"):
        mechanism_views.reference_means(checkpoint, [], image)


def test_heads_switched_off_stay_off_while_another_mechanism_tab_is_open(default_world):
    """A closed tab draws none of its widgets and Streamlit forgets such widgets' values: heads switched off in
    every map came back on at the next click after opening another tab."""
    at = switch_heads_off(open_mechanism(run_app(), "Ablation"), ["1.1", "3.2"], everywhere=True)
    at.session_state["mechanism_tab"] = "Head attribution"
    at.run()
    at.run()  # the next click, with the Ablation tab closed
    assert any("are switched off (zero ablation)" in i.value for i in at.info), [i.value for i in at.info]
    at.session_state["mechanism_tab"] = "Ablation"
    at.run()
    [heads] = [w for w in at.multiselect if w.label.startswith("Switch heads off")]
    assert heads.value == ["1.1", "3.2"] and at.toggle(key="ablate_everywhere").value


def test_a_rerun_runs_no_pass_for_the_ablation_and_the_test_time_register(default_world, forwards):
    """The before/after ablation view and the test-time register are cached: a click elsewhere on the page
    (any rerun) ran both again, three and four passes of the model."""
    at = switch_heads_off(open_mechanism(run_app(), "Ablation"), ["1.1", "3.2"])
    passes = forwards.call_count
    at.run()
    assert forwards.call_count == passes
    at.session_state["mechanism_tab"] = "Phenomena"
    at.run()
    at.slider(key="norm_threshold").set_value(0.0)
    at.toggle(key="tt_register").set_value(True)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    passes = forwards.call_count
    at.run()
    assert forwards.call_count == passes


def test_phenomena_draw_norms_massive_activations_and_sinks(default_world):
    at = open_mechanism(run_app(), "Phenomena")
    titles = [fig["layout"].get("title", {}).get("text") for fig in charts(at)]
    assert {"Token norms after layer 3", "Massive activations", "Attention sinks"} <= set(titles)
    [sinks] = heatmaps(at, "Attention sinks")
    assert array_shape(sinks["z"]) == (3, 2)
    assert re.search(r"\d+ of 16 patches over", " ".join(c.value for c in at.caption))
    at.slider(key="norm_threshold").set_value(0.0)
    at.run()
    assert any("16 of 16 patches over" in c.value for c in at.caption)


def test_a_feature_model_gets_the_phenomena_and_no_class_views(dirs):
    checkpoints, _ = dirs
    write_checkpoint(checkpoints / DEFAULT_CHECKPOINT, config=ViTConfig(**{**TINY.to_dict(), "num_classes": 0}),
                     classes=[])
    samples = checkpoints / "samples" / Path(DEFAULT_CHECKPOINT).stem
    samples.mkdir(parents=True)
    (samples / "x_1.png").write_bytes(png_bytes(seed=1))
    at = open_mechanism(run_app(), "Logit lens")
    assert any("no classifier" in i.value for i in at.info)
    at.session_state["mechanism_tab"] = "Phenomena"
    at.run()
    assert not at.exception
    assert "Attention sinks" in [fig["layout"].get("title", {}).get("text") for fig in charts(at)]


def test_patching_shows_the_recovered_share_per_head_and_per_token(default_world):
    at = open_mechanism(run_app(), "Patching")
    assert not at.exception
    [grid] = heatmaps(at, "Recovered by patching one head")
    assert array_shape(grid["z"]) == (3, 2)
    assert any("on the corrupted one" in c.value for c in at.caption)
    at.toggle(key="patch_positions").set_value(True)
    at.run()
    assert not at.exception
    [tokens] = heatmaps(at, "Recovered by patching one token of one layer's input")
    assert array_shape(tokens["z"]) == (3, 17)  # CLS + 4 x 4 patches


def test_patching_takes_an_uploaded_corrupted_image(default_world):
    """A model without sample images (any HF or timm model) can be patched too: the corrupted image is uploaded."""
    checkpoints, _ = default_world
    at = open_mechanism(run_app(), "Patching")
    corrupted = png_bytes(40, 24, seed=9)
    [uploader] = [u for u in at.main.get("file_uploader") if "Corrupted image" in u.label]
    uploader.set_value(("dog.png", corrupted, "image/png"))
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert not [s for s in at.main.selectbox if s.label.startswith("…or one of the sample images")]
    checkpoint = load_checkpoint(checkpoints / DEFAULT_CHECKPOINT)
    expected = mechanism_views.patching_view(checkpoint, open_image(sample_bytes(checkpoints), name="x.png"),
                                             open_image(corrupted, name="dog.png"))
    [grid] = heatmaps(at, "Recovered by patching one head")
    z = grid["z"]
    if isinstance(z, dict):  # Plotly 6's base64 typed array
        z = np.frombuffer(base64.b64decode(z["bdata"]), dtype=np.dtype(z["dtype"])).reshape(array_shape(z))
    np.testing.assert_allclose(np.array(z, dtype=float), expected.heads, atol=1e-6)


def test_a_test_time_register_shows_the_last_layer_before_and_after(default_world):
    at = open_mechanism(run_app(), "Phenomena")
    at.slider(key="norm_threshold").set_value(0.0)  # every token an outlier: some neurons are found
    at.toggle(key="tt_register").set_value(True)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    [caption] = [c.value for c in at.caption if "Register neurons (layer.neuron)" in c.value]
    assert "before and after the test-time register" in caption
    assert len([n for n in caption.split(": ")[-1].split(", ")]) == 10


def test_a_test_time_register_of_a_mean_ablated_model_takes_the_means_with_the_register(tmp_path):
    """Issue 33, item 7: the means of mean-ablated heads hold for the image's tokens; the register adds one, and the
    page refused with advice it could not follow. With the image as its only reference, mean ablation puts back
    each head's own output, so the view must equal the full model's."""
    checkpoint = load_checkpoint(write_checkpoint(tmp_path / "m.pt"))
    image = open_image(png_bytes(seed=3), name="x.png")
    heads = [(0, 1), (1, 0)]
    ablated = mechanism_views.ablated_checkpoint(checkpoint, heads, "mean",
                                          mechanism_views.reference_means(checkpoint, [image], image))
    view = mechanism_views.registers_view(ablated, image, [image], 0.0, mean_ablated=(checkpoint, heads))
    full = mechanism_views.registers_view(checkpoint, image, [image], 0.0)
    assert [(layer, neuron) for layer, neuron, _ in view.neurons] == [(a, b) for a, b, _ in full.neurons]
    for name in ("attention_before", "attention_after", "norms_before", "norms_after"):
        np.testing.assert_allclose(getattr(view, name), getattr(full, name), rtol=1e-5, atol=1e-5)


def test_the_test_time_register_runs_while_heads_are_mean_ablated_everywhere(default_world):
    at = open_mechanism(run_app(), "Ablation")
    at.radio(key="ablation_mode").set_value("mean")
    switch_heads_off(at, ["2.1"], everywhere=True)
    at.session_state["mechanism_tab"] = "Phenomena"
    at.run()
    at.toggle(key="tt_register").set_value(True)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert not [w.value for w in at.warning if "token positions" in w.value]
    assert [c.value for c in at.caption if "Register neurons (layer.neuron)" in c.value]
