"""``vit.explore``'s arguments, its models in hand and its server's settings (issue 117, item 5), fast: refusals in
one line before any server starts, the in-memory hold the page reads, the access rule the server's address gives,
the call's return when the page's last tab has gone (and not on a reload), and the page on a model in hand. The real
browser test is tests/test_browser_explore.py."""

import threading
from pathlib import Path

import pytest
import torch
from helpers import displayed
from test_module_road import IMAGENET, Leftover

import vit
from vit.app.notebook import in_hand
from vit.checkpoint import CheckpointError
from vit.runs import access

timm = pytest.importorskip("timm")


@pytest.fixture(scope="module")
def tiny():
    """A tiny timm ViT classifier built with random weights by timm, and its checkpoint opened in hand."""
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=(32, 48), patch_size=8, depth=2,
                              embed_dim=32, num_heads=2, num_classes=3).eval()
    return model, vit.load(model)


@pytest.fixture
def no_server(monkeypatch):
    """A server start fails the test: a refusal comes before any."""
    def start():
        raise AssertionError("a server started")

    monkeypatch.setattr(in_hand, "_start", start)


@pytest.mark.usefixtures("no_server")
@pytest.mark.parametrize(("given", "keywords", "error", "says"), [
    (42, {}, TypeError, r"takes a torch module, a vit\.load\(\.\.\.\) checkpoint, a path or a Hub id, not a int"),
    (Leftover(), {"image_size": (8, 12), **IMAGENET}, CheckpointError, r"8 tokens, 2x3 patches and 2 more"),
    ("some/folder", {"image_size": 32}, TypeError, r"are for a module in hand \(vit\.explore\(module, \.\.\.\)\)"),
])
def test_what_explore_cannot_open_is_refused_in_one_line_before_any_server(given, keywords, error, says):
    before = in_hand.count()
    with pytest.raises(error, match=says) as refused:
        vit.explore(given, **keywords, open_browser=False)
    assert "\n" not in str(refused.value) and in_hand.count() == before


def test_a_checkpoint_with_keywords_is_refused(tiny, no_server):
    with pytest.raises(TypeError, match="are for a module in hand"):
        vit.explore(tiny[1], mean=(0.5,) * 3)


class Served:
    """``in_hand.serve``'s answer, without a server: what was asked for, and whether it was waited on and stopped."""

    def __init__(self, text: str):
        self.model, self.url, self.calls = text, f"http://127.0.0.1:1/?model={text}", []

    def wait(self):
        self.calls.append(("wait", in_hand.held(self.model) is not None))
        self.stop()

    def stop(self):
        self.calls.append("stop")
        in_hand.forget(self.model)


@pytest.fixture
def served(monkeypatch):
    """Every ``in_hand.serve`` call's answer (``Served``), no server started."""
    answers = []
    monkeypatch.setattr(in_hand, "serve", lambda text: answers.append(Served(text)) or answers[-1])
    return answers


def test_a_module_or_its_checkpoint_is_held_in_memory_while_the_call_blocks(tiny, served, capsys):
    before = in_hand.count()
    vit.explore(tiny[0], name="mine", open_browser=False)
    vit.explore(tiny[1], open_browser=False)  # the checkpoint vit.load(module) gave
    assert [in_hand.is_in_hand(s.model) for s in served] == [True, True]
    assert [s.calls for s in served] == [[("wait", True), "stop"]] * 2 and in_hand.count() == before
    assert capsys.readouterr().out.startswith(f"The explorer on mine: {served[0].url} (close its tab")
    handle = vit.explore(tiny[0], block=False, open_browser=False)
    assert handle is served[2] and handle.calls == [] and in_hand.held(handle.model).name == "VisionTransformer"
    handle.stop()


def test_our_own_vit_opens_on_the_page_by_its_file_under_the_access_rule(tmp_path, served):
    from helpers import ship_default
    from test_browser_explorer import TINY

    from vit.core.runfiles import DEFAULT_CHECKPOINT

    checkpoints, _ = ship_default(tmp_path, TINY, ["airplane", "cat", "dog"])
    vit.explore(checkpoints / DEFAULT_CHECKPOINT, open_browser=False)
    assert served[0].model == str(checkpoints / DEFAULT_CHECKPOINT)  # ?model=PATH, as a link to it names it
    opened = vit.load(checkpoints / DEFAULT_CHECKPOINT)
    for given in (opened, vit.ablate(opened, [(0, 0)])):  # an object, never its file in its place: the copy keeps
        with pytest.raises(ValueError, match=r"vit\.explore\(PATH\) for the file") as refused:  # the path
            vit.explore(given, open_browser=False)
        assert "\n" not in str(refused.value)
    assert len(served) == 1


def test_explore_is_a_name_of_vit():
    assert "explore" in vit.API and "explore" in dir(vit) and vit.explore is vit.api.explore_page.explore


def test_a_model_in_hand_is_held_in_memory_under_a_random_id_until_forgotten(tiny):
    checkpoint = tiny[1]
    first, second = in_hand.hold(checkpoint, "one"), in_hand.hold(checkpoint, "two")
    assert first != second and in_hand.is_in_hand(first) and len(first) > len(in_hand.PREFIX) + 16
    assert in_hand.held(first).checkpoint is checkpoint and in_hand.held(second).name == "two"
    in_hand.forget(first)
    assert in_hand.held(first) is None and in_hand.held(second) is not None
    in_hand.forget(second)
    assert in_hand.held("/a/path") is None and not in_hand.is_in_hand("google/vit-base-patch16-224")
    with pytest.raises(TypeError, match="not a VisionTransformer"):
        in_hand.hold(tiny[0], "a module, not opened")


def test_the_server_listens_on_loopback_with_the_apps_defaults_so_the_access_rule_is_the_apps():
    options = in_hand.server_options(Path(__file__).resolve().parent.parent, 8765)
    assert options["server.address"] == "127.0.0.1" and options["server.port"] == 8765
    assert options["client.showErrorDetails"] == "none" and options["runner.postScriptGC"] is False  # config.toml's
    assert access.server_access(options["server.address"], None).mode == "open"
    assert access.server_access(options["server.address"], "x" * 16).mode == "token"


def test_inside_a_running_streamlit_app_no_second_server_is_started(monkeypatch):
    from streamlit.runtime import Runtime, RuntimeState

    class Running:
        state = RuntimeState.ONE_OR_MORE_SESSIONS_CONNECTED

    monkeypatch.setattr(Runtime, "_instance", Running())
    with pytest.raises(RuntimeError, match="this process already runs a Streamlit app"):
        in_hand._start()
    assert Runtime._instance.state is RuntimeState.ONE_OR_MORE_SESSIONS_CONNECTED  # left as it was


class FakeServer:
    """Streamlit's server as ``Explorer.wait`` reads it: whether a browser is connected, poll by poll."""

    def __init__(self, connected: list[bool]):
        self.connected = connected

    @property
    def browser_is_connected(self) -> bool:
        return self.connected.pop(0) if len(self.connected) > 1 else self.connected[0]


def waited(monkeypatch, connected: list[bool]) -> tuple[list[bool], list]:
    """``Explorer.wait`` over ``connected``: (what was left unread, the servers stopped)."""
    stopped = []
    monkeypatch.setattr(in_hand, "POLL_S", 0.001)
    monkeypatch.setattr(in_hand, "_stop", stopped.append)
    alive = threading.Thread(target=threading.Event().wait, args=(5,), daemon=True)
    alive.start()
    server = FakeServer(connected)
    serving = in_hand._Serving("http://127.0.0.1:1", server, None, alive, {"in-hand:x"})
    monkeypatch.setattr(in_hand, "_SERVING", serving)
    in_hand.Explorer("http://127.0.0.1:1/?model=in-hand:x", "in-hand:x", serving).wait(closed_after_s=0.05)
    return server.connected, stopped


def test_the_call_returns_once_the_pages_last_tab_has_gone_and_stops_the_server(monkeypatch):
    left, stopped = waited(monkeypatch, [False] * 20 + [True] * 3 + [False])  # not yet opened, open, closed
    assert left == [False] and len(stopped) == 1 and in_hand._SERVING is None


def test_a_reload_does_not_return_the_call(monkeypatch):
    sequence = [True, False, True, True] + [False]  # a reload: gone for one poll, back
    left, stopped = waited(monkeypatch, sequence)
    assert left == [False] and len(stopped) == 1  # every poll read: it returned only after the last close


def test_a_model_in_hands_line_in_the_picker_names_no_file(tiny):
    from app_pages.explorer_sections import in_hand as page

    entry = page.entry_for("in-hand:x", "my model", tiny[1])
    assert entry.ok and entry.source == "in-hand" and entry.name == "my model"
    assert entry.class_names == tuple(tiny[1].class_names) and len(entry.class_names) == 3


@pytest.mark.slow  # the explorer page's first run: its imports
def test_the_page_on_a_model_in_hand_and_on_one_no_longer_held(tiny):
    from streamlit.testing.v1 import AppTest
    from test_app import APP, TIMEOUT

    from app_pages.explorer_sections import in_hand as page

    text = in_hand.hold(tiny[1], "my [tiny](http://x) model")
    try:
        at = AppTest.from_file(APP, default_timeout=TIMEOUT)
        at.query_params["model"] = text
        at.run()
        assert not at.exception, [e.message for e in at.exception]
        assert f"my [tiny](http://x) model: {page.SERVED}." in [displayed(c.value) for c in at.caption]  # plain text
        assert [i.value for i in at.info] == ["Upload an image in the sidebar to see what the model attends to."]
    finally:
        in_hand.forget(text)
    gone = AppTest.from_file(APP, default_timeout=TIMEOUT)
    gone.query_params["model"] = text
    gone.run()
    assert [e.value for e in gone.error] == [page.GONE]
