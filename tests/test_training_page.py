"""The training page through Streamlit's AppTest, on a runs folder of its own.

A launch starts a real (niced, tiny) training process; the tests stop it again rather than
wait for it, so they stay fast.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import displayed
from streamlit.testing.v1 import AppTest
from test_runs import make_image_folder

from vit.runs import access
from vit.runs.manager import RunManager

PAGE = str(Path(__file__).resolve().parent.parent / "app_pages" / "training.py")
TIMEOUT = 300  # the first run imports torch; on two busy cores that takes a while


@pytest.fixture
def folders(tmp_path, monkeypatch):
    monkeypatch.setenv("VIT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("VIT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("VIT_DATA_ROOTS", str(tmp_path))  # the generated image folder lives here
    monkeypatch.delenv("VIT_TRAIN_TOKEN", raising=False)  # a developer's token would lock the page
    return make_image_folder(tmp_path / "images"), tmp_path / "runs"


def fill_tiny_run(at: AppTest, images, name: str) -> None:
    at.selectbox(key="train_dataset").set_value("folder")
    at.text_input(key="train_folder").set_value(str(images))
    for field, value in dict(image_size=16, patch_size=4, hidden_size=16, num_layers=1, num_heads=2,
                             mlp_size=32, epochs=1, batch_size=4).items():
        at.number_input(key=f"train_{field}").set_value(value)
    at.number_input(key="train_warmup_epochs").set_value(0.0)
    at.text_input(key="train_name").set_value(name)


def submit(at: AppTest) -> AppTest:
    at.button(key="train_submit").click()
    return at.run(timeout=TIMEOUT)


def errors(at: AppTest) -> list[str]:
    return [displayed(e.value) for e in at.error]


def test_the_page_opens_with_an_empty_runs_folder(folders):
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    assert not at.exception
    assert any("No runs yet" in i.value for i in at.info)


def test_bad_fields_show_their_own_errors_and_launch_nothing(folders):
    images, runs_dir = folders
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    fill_tiny_run(at, images, "bad run!")
    at.text_input(key="train_folder").set_value(str(images / "missing"))
    at.number_input(key="train_epochs").set_value(0)
    at.number_input(key="train_lr").set_value(-1.0)
    at = submit(at)
    shown = errors(at)
    assert any("does not exist" in e for e in shown)  # dataset
    assert any("positive integer" in e for e in shown)  # epochs
    assert any("positive number" in e for e in shown)  # learning rate
    assert any("letters, digits" in e for e in shown)  # name
    assert any("not launched" in e for e in shown)
    assert RunManager(runs_dir).names() == []


def test_launch_creates_a_run_the_table_shows_and_stop_cancels_it(folders):
    images, runs_dir = folders
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    fill_tiny_run(at, images, "from-the-page")
    at = submit(at)
    assert not at.exception
    assert errors(at) == [], errors(at)
    notice = displayed(at.success[0].value)
    assert notice.startswith("Started from-the-page on ") and ("CPU" in notice or "GPU" in notice)
    table = at.dataframe[0].value
    assert list(table["Name"]) == ["from-the-page"]
    assert table["State"][0] == "running"
    assert at.multiselect(key="selected_runs").value == ["from-the-page"]

    at.button(key="stop-from-the-page").click()
    at = at.run(timeout=TIMEOUT)
    assert not at.exception
    manager = RunManager(runs_dir)
    deadline = time.time() + TIMEOUT
    while manager.get("from-the-page").state == "running" and time.time() < deadline:
        time.sleep(0.5)
    assert manager.get("from-the-page").state == "cancelled"
    at = at.run(timeout=TIMEOUT)
    assert at.dataframe[0].value["State"][0] == "cancelled"


def test_run_names_errors_and_logs_are_shown_as_plain_text(folders):
    import json

    from markdown_it import MarkdownIt

    from vit.core.runfiles import now_iso

    _, runs_dir = folders
    run = runs_dir / "![x](http:example.invalid) <b>x<b>"
    run.mkdir(parents=True)
    (run / "status.json").write_text(json.dumps({
        "state": "failed", "updated_time": now_iso(),
        "error": "ValueError: [click](http://example.invalid) <b>bad</b> ![y](http://example.invalid/y.png)"}))
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    assert not at.exception
    bodies = [e.value for kind in ("markdown", "caption", "error", "warning", "info", "success") for e in at.get(kind)]
    for body in bodies:
        rendered = MarkdownIt("commonmark").render(body)
        assert "<img" not in rendered and "<a " not in rendered and "<b>" not in rendered, body
    shown = "\n".join(displayed(body) for body in bodies)
    assert ("![x](http:example.invalid) <b>x<b> · failed · ValueError: [click](http://example.invalid) <b>bad</b>"
            in shown)


def test_a_damaged_run_is_its_own_row_and_the_other_runs_keep_their_buttons(folders):
    _, runs_dir = folders
    good, bad = runs_dir / "good", runs_dir / "bad"
    good.mkdir(parents=True)
    (good / "status.json").write_text('{"state": "completed", "updated_time": "2026-01-01T00:00:00+00:00"}')
    bad.mkdir()
    (bad / "status.json").write_text('{"state": "running", "pid": "4242"}')
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    assert not at.exception
    table = at.dataframe[0].value
    states = dict(zip(table["Name"], table["State"], strict=True))
    assert states == {"good": "completed", "bad": "damaged"}
    at.multiselect(key="selected_runs").set_value(["good", "bad"])
    at = at.run(timeout=TIMEOUT)
    assert not at.exception
    assert at.button(key="resume-good") and at.button(key="delete-bad")
    assert any("'pid' is \"4242\", not a whole number" in e for e in errors(at))


@pytest.fixture
def networked(monkeypatch):
    """The server as `streamlit run app.py --server.address 0.0.0.0` starts it."""
    from streamlit import config

    before = config.get_option("server.address")
    config.set_option("server.address", "0.0.0.0")
    yield
    config.set_option("server.address", before)


def test_on_a_network_without_a_token_the_page_is_disabled(folders, networked, monkeypatch):
    monkeypatch.delenv("VIT_TRAIN_TOKEN", raising=False)
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    assert not at.exception
    assert any("training, " in w.value and "are disabled" in w.value and "VIT_TRAIN_TOKEN" in w.value
               for w in at.warning)
    assert not at.button and not at.dataframe and not at.text_input  # no form, no runs, no logs


def test_on_a_network_the_page_opens_only_with_the_token(folders, networked, monkeypatch):
    monkeypatch.setenv("VIT_TRAIN_TOKEN", "correct-horse-battery-staple")
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    assert [t.label for t in at.text_input] == ["Training token"]
    assert not at.selectbox and not at.dataframe
    at.text_input(key="train_token_input").set_value("guess")
    at = submit_unlock(at)
    assert any("not the training token" in e.value for e in at.error)
    assert not at.selectbox
    at.text_input(key="train_token_input").set_value("correct-horse-battery-staple")
    at = submit_unlock(at)
    assert not at.exception
    assert at.selectbox(key="train_preset") is not None  # the form
    assert [i.value for i in at.info if "No runs yet" in i.value] == ["No runs yet."]  # not where the runs are kept


def submit_unlock(at: AppTest) -> AppTest:
    next(b for b in at.button if b.label == "Unlock").click()
    return at.run(timeout=TIMEOUT)


def test_behind_the_token_the_page_names_the_data_roots_without_their_paths(folders, networked, monkeypatch, tmp_path):
    """Issue 20, item 9: a network visitor was shown where the server keeps its data (absolute paths)."""
    images, runs_dir = folders
    monkeypatch.setenv("VIT_TRAIN_TOKEN", "correct-horse-battery-staple")
    at = AppTest.from_file(PAGE)
    at.session_state[access.UNLOCKED] = True
    at = at.run(timeout=TIMEOUT)
    fill_tiny_run(at, images, "outside")
    at.text_input(key="train_folder").set_value("/etc")
    at = submit(at)
    assert any(f"folder datasets must be inside {tmp_path.name};" in e for e in errors(at)), errors(at)
    at.text_input(key="train_folder").set_value(str(images / "missing"))
    at = submit(at)
    assert any(f"{tmp_path.name}/images/missing" in e for e in errors(at)), errors(at)
    assert not any(str(tmp_path) in e for e in errors(at)), errors(at)
    assert RunManager(runs_dir).names() == []


def test_a_run_folder_named_with_a_right_to_left_override_is_shown_with_it_visible(folders):
    """Issue 20, item 9: U+202E in a run folder's name showed 'evil\u202egpj.exe' as 'evilexe.jpg'."""
    _, runs_dir = folders
    run = runs_dir / "evil\u202egpj.exe"
    run.mkdir(parents=True)
    (run / "status.json").write_text('{"state": "completed", "updated_time": "2026-01-01T00:00:00+00:00"}')
    at = AppTest.from_file(PAGE).run(timeout=TIMEOUT)
    assert not at.exception
    assert list(at.dataframe[0].value["Name"]) == ["evil\\u202egpj.exe"]
    assert at.multiselect(key="selected_runs").options == ["evil\\u202egpj.exe"]
    bodies = [displayed(e.value) for kind in ("markdown", "error", "caption") for e in at.get(kind)]
    assert any(b.startswith("evil\\u202egpj.exe · completed") for b in bodies), bodies
    assert not any("\u202e" in b for b in bodies)
