"""The Train page's attention views (issue 12) through AppTest, on run folders written here: the epoch slider
over the probe images, the statistics over epochs, the GIF export and the config diff of selected runs."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

from vit.training import snapshots

PAGE = str(Path(__file__).resolve().parent.parent / "app_pages" / "training.py")
TIMEOUT = 300
LAYERS, HEADS, GRID = 2, 3, (2, 2)


def fake_run(runs_dir: Path, name: str, lr: float, epochs: int = 3, started: str = "2026-11-20T10:00:00+00:00") -> Path:
    """A completed CLI run folder with a probe set of 4 images and a snapshot for epochs 0..epochs."""
    run = runs_dir / name
    run.mkdir(parents=True)
    args = {"dataset": "folder:/data/colours", "preset": "cifar-s", "lr": lr, "epochs": epochs, "batch_size": 4,
            "out": str(run), "model": {"num_layers": LAYERS, "num_heads": HEADS}}
    (run / "config.json").write_text(json.dumps({"args": args}))
    (run / "status.json").write_text(json.dumps({
        "state": "completed", "epoch": epochs, "total_epochs": epochs, "progress": 1.0, "pid": 1, "host": "elsewhere",
        "start_time": started, "updated_time": started, "best_val_acc": 0.5, "device": "cpu", "world_size": 1}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"epoch": e, "train_loss": 1.0 / e, "val_loss": 1.0,
                                                           "train_acc": 0.5, "val_acc": 0.5, "lr": lr}) + "\n"
                                               for e in range(1, epochs + 1)))
    probe = snapshots.Probe(images=torch.full((4, 3, 8, 8), 128, dtype=torch.uint8), labels=[0, 1, 0, 1],
                            indices=[0, 1, 2, 3], class_names=["cat", "dog"], sample_indices=[0, 1, 2, 3])
    snapshots.save_probe(run, probe)
    rng = np.random.default_rng(0)
    for epoch in range(epochs + 1):
        add_epoch(run, epoch, rng)
    return run


def add_epoch(run: Path, epoch: int, rng: np.random.Generator | None = None) -> None:
    """The snapshot a training run writes at the end of ``epoch`` (0: before the first step)."""
    rng = np.random.default_rng(epoch) if rng is None else rng
    logits = np.zeros((4, 2), np.float32)
    logits[:, epoch % 2] = 2.0  # even epochs predict cat for every image, odd ones dog
    snapshots.write_snapshot(run, epoch, {
        "logits": logits, "cls_attention": rng.random((LAYERS, 4, HEADS, *GRID), dtype=np.float32),
        "rollout": rng.random((4, *GRID), dtype=np.float32),
        "distance": np.full((LAYERS, HEADS), float(epoch), np.float32),
        "entropy": np.arange(LAYERS * HEADS, dtype=np.float32).reshape(LAYERS, HEADS) + epoch,
        "sample_size": np.int64(4), "patch_size": np.int64(4), "num_prefix_tokens": np.int64(1)})


@pytest.fixture
def runs_dir(tmp_path, monkeypatch) -> Path:
    runs = tmp_path / "runs"
    monkeypatch.setenv("VIT_RUNS_DIR", str(runs))
    monkeypatch.setenv("VIT_DATA_DIR", str(tmp_path / "data"))
    fake_run(runs, "alpha", lr=0.001, started="2026-11-20T11:00:00+00:00")
    fake_run(runs, "beta", lr=0.002, epochs=2)
    return runs


def shown_text(markdown: str) -> str:
    """What a reader sees of Markdown whose punctuation the page escaped (vit.core.text)."""
    return re.sub(r"\\(.)", r"\1", markdown)


def heatmap_values(spec: dict) -> np.ndarray:
    """z of a plotly heatmap spec; plotly sends numpy arrays as base64 typed arrays."""
    z = spec["data"][0]["z"]
    if isinstance(z, dict):
        shape = [int(n) for n in str(z["shape"]).split(",")]
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=np.dtype(z["dtype"])).reshape(shape)
    return np.array(z)


def open_page() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    return at


def test_the_epoch_slider_shows_the_probe_images_and_predictions_of_that_epoch(runs_dir):
    at = open_page()
    assert at.multiselect(key="selected_runs").value == ["alpha"]  # the newest run
    slider = at.select_slider(key="snap_epoch")
    assert slider.options == ["0", "1", "2", "3"] and slider.value == 3  # the latest epoch first
    captions = at.get("image")[0].proto.imgs
    assert [shown_text(c.caption) for c in captions] == ["cat → dog 88% ✗", "dog → dog 88% ✓"] * 2
    at = at.select_slider(key="snap_epoch").set_value(2).run()
    assert not at.exception
    captions = [shown_text(c.caption) for c in at.get("image")[0].proto.imgs]
    assert captions == ["cat → cat 88% ✓", "dog → cat 88% ✗"] * 2


def test_the_slider_follows_new_epochs_while_it_is_on_the_newest_and_stays_where_it_was_moved_back(runs_dir):
    at = open_page()
    assert at.select_slider(key="snap_epoch").value == 3
    add_epoch(runs_dir / "alpha", 4)  # the run trains on
    at = at.run()
    assert at.select_slider(key="snap_epoch").value == 4
    at = at.select_slider(key="snap_epoch").set_value(1).run()
    add_epoch(runs_dir / "alpha", 5)
    at = at.run()
    assert not at.exception and at.select_slider(key="snap_epoch").value == 1


def test_rollout_and_single_heads_redraw_without_errors(runs_dir):
    at = open_page()
    at = at.radio(key="snap_kind").set_value("rollout").run()
    assert not at.exception and any("rollout over 2 layers" in shown_text(c.value) for c in at.caption)
    at = at.radio(key="snap_kind").set_value("attention").run()
    at = at.selectbox(key="snap_head").set_value(2).run()
    assert not at.exception
    assert any("layer 2, head 3" in shown_text(c.value) for c in at.caption)


def test_play_steps_to_the_next_epoch_on_each_refresh(runs_dir):
    at = open_page()
    at = at.select_slider(key="snap_epoch").set_value(1).run()
    at = at.toggle(key="snap_play").set_value(True).run()
    assert not at.exception
    first = at.select_slider(key="snap_epoch").value
    at = at.run()
    assert at.select_slider(key="snap_epoch").value == (first + 1) % 4


def test_the_statistics_view_is_layers_by_epochs_per_head_or_averaged(runs_dir):
    at = open_page()
    charts = {c.proto.id: json.loads(c.proto.spec) for c in at.get("plotly_chart")}
    entropy = next(spec for spec in charts.values() if "entropy" in json.dumps(spec["layout"]["title"]).lower())
    heat = entropy["data"][0]
    assert heat["type"] == "heatmap" and heat["x"] == [0, 1, 2, 3] and heat["y"] == ["L1", "L2"]
    np.testing.assert_allclose(heatmap_values(entropy)[:, 0], [1.0, 4.0])  # mean of heads 0..2, then 3..5
    at = at.selectbox(key="snap_stat_head").set_value(2).run()
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    entropy = next(spec for spec in charts if "entropy" in json.dumps(spec["layout"]["title"]).lower())
    np.testing.assert_allclose(heatmap_values(entropy)[:, 3], [2.0 + 3, 5.0 + 3])


def test_the_config_diff_of_selected_runs_shows_only_what_differs(runs_dir):
    at = open_page()
    at = at.multiselect(key="selected_runs").set_value(["alpha", "beta"]).run()
    assert not at.exception
    diff = next(d.value for d in at.dataframe if "Parameter" in d.value.columns)
    assert list(diff["Parameter"]) == ["epochs", "lr"]
    assert list(diff["alpha"]) == ["3", "0.001"] and list(diff["beta"]) == ["2", "0.002"]


def test_the_gif_export_has_a_frame_per_epoch(runs_dir):
    frames = snapshots.animation_frames(runs_dir / "alpha", 1, "attention", layer=-1, head=None, size=64)
    assert len(frames) == 4
    at = open_page()
    assert any(b.proto.label == "Animated GIF" for b in at.get("download_button"))
