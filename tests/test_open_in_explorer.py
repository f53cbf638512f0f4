"""Opening the explorer from the other pages goes through a link (``app_pages/open_in_explorer.py``): with
``st.switch_page`` a refreshing fragment's tick left the explorer blank for good (issue 69, item 0)."""

import ast
from pathlib import Path

import pytest
from helpers import follow_page_link
from streamlit.testing.v1 import AppTest
from test_catalog import write_checkpoint, write_run

from app_pages import open_in_explorer
from vit.core.runfiles import DEFAULT_CHECKPOINT

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
TIMEOUT = 120


def test_no_page_switches_pages_from_the_server():
    """Every page that hands over to the explorer refreshes a fragment on a timer; a server-side page switch races
    that timer (the module's docstring). Only links change pages."""
    calls = []
    for path in [ROOT / "app.py", *sorted((ROOT / "app_pages").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "switch_page":
                calls.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert calls == []


def test_the_check_sees_a_switch_page_call():
    tree = ast.parse("import streamlit as st\nif st.button('go'):\n    st.switch_page('app_pages/explorer.py')\n")
    assert any(isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "switch_page" for n in ast.walk(tree))


@pytest.fixture
def world(tmp_path, monkeypatch):
    checkpoints, runs = tmp_path / "checkpoints", tmp_path / "runs"
    write_checkpoint(checkpoints / DEFAULT_CHECKPOINT)  # what the explorer opens when nothing is handed over
    monkeypatch.setenv("VIT_CHECKPOINTS_DIR", str(checkpoints))
    monkeypatch.setenv("VIT_RUNS_DIR", str(runs))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    return write_run(runs, "tiny-run", "completed")


def test_a_completed_run_opens_in_the_explorer_through_its_link(world):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("app_pages/training.py").run()
    assert not at.exception, [e.message for e in at.exception]
    at = follow_page_link(at, "Open in explorer (best weights)")  # its checkpoint records no epoch
    assert not at.exception, [e.message for e in at.exception]
    assert at.session_state["explorer_last_checkpoint"] == str(world / "best.pt")
    assert open_in_explorer.PARAM not in at.query_params  # taken: the URL then follows the view alone


def test_a_link_naming_a_hand_off_this_session_did_not_make_opens_nothing(world):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params[open_in_explorer.PARAM] = "0123456789abcdef"  # e.g. a URL copied from another browser
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert open_in_explorer.PARAM not in at.query_params
    assert at.session_state["explorer_last_checkpoint"] != str(world / "best.pt")


def test_the_train_page_says_which_weights_each_link_opens_and_offers_the_last(tmp_path, monkeypatch):
    """Issue 76, item 7: after 60 epochs on a tiny validation split, best.pt was epoch 1's weights, opened without a
    word. Each link names its weights' epoch and accuracy (as the checkpoint records them), and the last opens too."""
    checkpoints, runs = tmp_path / "checkpoints", tmp_path / "runs"
    write_checkpoint(checkpoints / DEFAULT_CHECKPOINT)
    monkeypatch.setenv("VIT_CHECKPOINTS_DIR", str(checkpoints))
    monkeypatch.setenv("VIT_RUNS_DIR", str(runs))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    run = write_run(runs, "long-run", "completed", files=())
    write_checkpoint(run / "best.pt", epochs=1, val_acc=0.5)
    write_checkpoint(run / "last.pt", epochs=60, val_acc=0.25)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("app_pages/training.py").run()
    assert not at.exception, [e.message for e in at.exception]
    opens = [link.value for link in at.page_link if link.value.startswith("Open in explorer")]
    assert opens == ["Open in explorer (best weights: epoch 1, val acc 50.0 %)",
                     "Open in explorer (last weights: epoch 60, val acc 25.0 %)"]
    at = follow_page_link(at, opens[1])
    assert not at.exception, [e.message for e in at.exception]
    assert at.session_state["explorer_last_checkpoint"] == str(run / "last.pt")


def test_a_link_opened_in_a_new_tab_opens_the_model_it_names(world):
    """Issue 90, item 7: a new tab is another session, which holds no hand-off; the link names the model as a shared
    view's link does (the run's catalogue name), so the new tab opens that run, not the default model."""
    from urllib.parse import parse_qsl

    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.switch_page("app_pages/training.py").run()
    assert not at.exception, [e.message for e in at.exception]
    [link] = [link for link in at.page_link if link.value == "Open in explorer (best weights)"]
    params = dict(parse_qsl(link.proto.query_string))
    assert params["model"] == "tiny-run"  # its name in the catalogue, not its path on the server
    tab = AppTest.from_file(APP, default_timeout=TIMEOUT)  # a fresh session, as a new tab is
    for name, value in params.items():
        tab.query_params[name] = value
    tab.switch_page("app_pages/explorer.py").run()
    assert not tab.exception, [e.message for e in tab.exception]
    assert tab.session_state["explorer_last_checkpoint"] == str(world / "best.pt")
    assert not [w for w in tab.main.warning if "was not used" in w.value]
