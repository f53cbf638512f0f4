"""Long work on the explorer page (issue 33, item 1): a progress bar with the passes done and the time left, a Stop
button that stops it at its next chunk, and a page that stays usable after; a work nobody looks at stops."""

import threading

import numpy as np
import pytest
import test_app
from test_analyze import world  # noqa: F401  (fixture)
from test_app import run_app
from test_app_mechanism import open_mechanism

from app_pages.explorer_sections import long_work
from vit.app import work
from vit.explain.views import attention_maps, image_analysis, mechanism_views

pytest.importorskip("streamlit")
pytestmark = pytest.mark.slow  # each test starts the app
dirs, default_world = test_app.dirs, test_app.default_world  # fixtures


@pytest.fixture
def slow_grid(monkeypatch):
    """The ablation grid made slow (200 chunks of 50 ms, 10 s in all), its passes counted; its progress is shown
    after half a second (the first passes done)."""
    monkeypatch.setattr(long_work, "QUICK_S", 0.5)
    passes, started = [], threading.Event()

    def slow(checkpoint, image, class_index, mode="zero", means=None, size=None, progress=None):
        for i in range(200):
            progress(i, 200)
            started.set()
            threading.Event().wait(0.05)
            passes.append(i)
        progress(200, 200)
        return np.zeros((3, 2))

    monkeypatch.setattr(mechanism_views, "ablation_effects", slow)
    return passes, started


def stop_button(at):
    return [b for b in at.button if b.key == "long_work_stop-ablation_grid"]


def test_a_long_grid_shows_its_progress_and_a_stop_button_and_stops(default_world, slow_grid):
    passes, started = slow_grid
    at = open_mechanism(run_app(), "Ablation")
    at.toggle(key="ablation_grid").set_value(True)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert stop_button(at), "no Stop button while the grid runs"
    [bar] = at.get("progress")
    assert "Ablating each head in turn" in bar.proto.text and "of 200 heads" in bar.proto.text
    assert started.wait(30)
    current = at.session_state[long_work.SESSION_KEY]
    stop_button(at)[0].click()
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert current.wait(10) and current.state == "stopped"
    ran = len(passes)
    assert any("stopped after" in i.value and "stopped by you" in i.value for i in at.info)
    assert [b for b in at.button if b.key == "long_work_again-ablation_grid"]
    threading.Event().wait(0.3)
    assert len(passes) == ran  # nothing runs after the stop
    # The page stays usable: another tab draws, the grid is not started again behind it.
    at.session_state["mechanism_tab"] = "Phenomena"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("Attention sinks" in (c.proto.spec or "") for c in at.get("plotly_chart"))
    assert len(passes) == ran


def test_the_grids_toggle_counts_what_its_progress_counts(default_world, monkeypatch):
    totals = []
    real = mechanism_views.ablation_effects

    def recorded(*args, progress=None, **kwargs):
        return real(*args, progress=lambda done, total: (totals.append(total), progress(done, total)), **kwargs)

    monkeypatch.setattr(mechanism_views, "ablation_effects", lambda *a: recorded(*a[:-1], progress=a[-1]))
    at = open_mechanism(run_app(), "Ablation")
    at.toggle(key="ablation_grid").set_value(True)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert set(totals) == {6}  # the tiny model's 3 layers x 2 heads, each ablated alone
    assert at.toggle(key="ablation_grid").label == "Each head alone (6 heads)"


def test_a_second_grid_asked_for_in_a_session_stops_the_first(default_world, slow_grid):
    """At most one heavy computation per session: a changed widget (another ablation) stops the running one."""
    _, started = slow_grid
    at = open_mechanism(run_app(), "Ablation")
    at.toggle(key="ablation_grid").set_value(True)
    at.run()
    assert started.wait(30)
    first = at.session_state[long_work.SESSION_KEY]
    at.session_state["mechanism_tab"] = "Ablation"
    at.radio(key="ablation_mode").set_value("mean")
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert first.wait(10) and first.state == "stopped" and "another computation" in str(first.error)
    at.session_state[long_work.SESSION_KEY].stop("test over")


def test_the_server_bound_is_shared_by_every_session():
    slots = long_work.server_slots(long_work.at_once())
    assert slots is long_work.server_slots(long_work.at_once())
    assert isinstance(slots, work.Slots) and slots.size >= 1


def test_the_analyse_pages_dataset_pass_can_be_stopped_and_run_again(world, dirs, monkeypatch):  # noqa: F811
    """The Analyse page's pass shows its progress in images with a Stop button; stopped, the page stays usable
    and Run again gives the analysis."""
    from test_analyze import analyse_on_page

    from vit.explain.views import dataset

    monkeypatch.setattr(long_work, "QUICK_S", 0.5)
    real, release = dataset.analyze_files, threading.Event()

    def slow(checkpoint, files, progress=None, **kwargs):
        for i in range(len(files)):
            progress(i, len(files))
            release.wait(0.2)
        return real(checkpoint, files, progress=progress, **kwargs)

    monkeypatch.setattr(dataset, "analyze_files", slow)
    at = analyse_on_page(world, dirs)
    [bar] = at.get("progress")
    assert "Analysing 7 images" in bar.proto.text and "images" in bar.proto.text.split(":")[1]
    [stop] = [b for b in at.button if b.key == "long_work_stop-analyse"]
    stop.click()
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("stopped by you" in i.value for i in at.info)
    assert not at.metric  # no analysis shown
    release.set()  # run again, at full speed
    [again] = [b for b in at.button if b.key == "long_work_again-analyse"]
    long_work.QUICK_S = 600.0
    again.click()
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    at.run()  # the page reruns once the work is done (the progress fragment asks for it in a browser)
    assert [m.value for m in at.metric][:2] == ["6", "50.0%"]


@pytest.mark.parametrize(("kind", "place", "blocks"), [("legrad", "legrad", 3 + 1), ("lrp", "lrp", 3),
                                                       ("attnlrp", "attnlrp", 3), ("class", "class map", 3)])
def test_main_maps_past_a_few_seconds_are_long_work_reporting_each_block(monkeypatch, kind, place, blocks):
    """Issue 52 item 6: the class map and LeGrad, LRP, AttnLRP at high resolution ran in the script thread, outside
    the server's bound, and kept computing after their tab closed; they go through long_work as the grids do."""
    from PIL import Image

    from app_pages.explorer_sections import caches
    from vit.checkpoint import Checkpoint, Preprocessing
    from vit.core.inference import TRAINING_SIZE
    from vit.explain.views.image_analysis import analyse
    from vit.model import ViT

    config = test_app.TINY  # 3 layers, 4 x 4 patches + CLS: 17 tokens
    checkpoint = Checkpoint(ViT(config).eval(), ["a", "b", "c"], Preprocessing.default_for(config))
    asked = []

    def recording(key, label, compute, place, unit="passes", kept=None, heavy=True):
        reports = []
        result = compute(lambda done, total: reports.append((done, total)))
        asked.append((place, unit, heavy, reports))
        return result

    monkeypatch.setattr(caches, "long_work", recording)
    monkeypatch.setattr(caches, "PROGRESS_TOKENS", 16)
    image, fingerprint = Image.new("RGB", (16, 16)), (f"bounds test {kind}",)
    analysis = analyse(checkpoint, image)  # the page's, whose 17 tokens are past PROGRESS_TOKENS
    if kind == "class":
        caches.class_relevance(fingerprint, "digest", TRAINING_SIZE, 1, checkpoint, image, analysis.num_tokens)
    else:
        caches.method_map(fingerprint, "digest", TRAINING_SIZE, kind, 1, 0, -1, "mean", checkpoint, image, -2,
                          analysis)
    assert asked == [(place, "blocks", True, [(i, blocks) for i in range(1, blocks + 1)])]


@pytest.mark.parametrize("kind", ["rollout", "probe_rollout"])
def test_a_rollout_built_from_chunks_is_long_work_and_the_explorers_rollout(monkeypatch, kind):
    """Issue 52 item 6: the rollout's row at high resolution (its factors past the cache, every layer recomputed in
    chunks) ran in the script thread; it is long work, and its map is still the rollout of the whole attentions."""
    import torch
    from PIL import Image

    from app_pages.explorer_sections import caches, map_settings
    from vit.checkpoint import Checkpoint, Preprocessing
    from vit.core.cache import ByteCache
    from vit.core.inference import TRAINING_SIZE, preprocess
    from vit.explain.methods.attention import fuse_heads, rollout
    from vit.model import ViT, ViTConfig

    config = ViTConfig(image_size=16, patch_size=4, num_classes=3, hidden_size=16, num_layers=3, num_heads=2,
                       mlp_size=32, pooling="map")  # an attention-pooling probe, and its rollout
    torch.manual_seed(0)
    checkpoint = Checkpoint(ViT(config).eval(), ["a", "b", "c"], Preprocessing.default_for(config))
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8))
    analysis = image_analysis.analyse(checkpoint, image)
    analysis.cache = ByteCache(64)  # the factors do not fit: the rollout is built row vector by row vector
    assert not attention_maps.factors_fit(analysis)
    asked = []

    def recording(key, label, compute, place, unit="passes", kept=None, heavy=True):
        reports = []
        result = compute(lambda done, total: reports.append((done, total)))
        asked.append((place, unit, reports[-1]))
        return result

    monkeypatch.setattr(caches, "long_work", recording)
    settings = attention_maps.MapSettings(kind=kind, query=5)
    choice = map_settings.MapChoice(settings, 3, list(range(17)), "query", None, 0.5, "inferno", "auto", "bilinear",
                                    False, None)
    shown = map_settings.main_map(checkpoint, (f"rollout test {kind}",), image, "digest", TRAINING_SIZE, analysis,
                                  choice).map2d
    assert asked == [("rollout", "layers", (3, 3))]
    with torch.no_grad():
        _, attentions = checkpoint.model(preprocess([image], checkpoint.preprocessing), output_attentions=True)
    whole = rollout(list(attentions), "mean", num_prefix_tokens=1)[0]  # (T, T)
    row = whole[5] if kind == "rollout" else fuse_heads(analysis.probe[None, :, None], "mean")[0, 0] @ whole
    np.testing.assert_allclose(shown, row[1:].reshape(4, 4).numpy(), rtol=0, atol=1e-6)
