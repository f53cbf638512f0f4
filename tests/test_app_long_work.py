"""Long work on the explorer page (issue 33, item 1): a progress bar with the passes done and the time left, a Stop
button that stops it at its next chunk, and a page that stays usable after; a work nobody looks at stops."""

import threading

import numpy as np
import pytest
import test_app
from test_analyze import world  # noqa: F401  (fixture)
from test_app import run_app
from test_app_mechanism import open_mechanism

from pages.explorer_sections import long_work
from vit.app import explorer, work

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

    monkeypatch.setattr(explorer, "ablation_effects", slow)
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
    real = explorer.ablation_effects

    def recorded(*args, progress=None, **kwargs):
        return real(*args, progress=lambda done, total: (totals.append(total), progress(done, total)), **kwargs)

    monkeypatch.setattr(explorer, "ablation_effects", lambda *a: recorded(*a[:-1], progress=a[-1]))
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

    from vit.explain import dataset

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
