"""What a model change leaves of the last model's view (issue 90, item 7), driven through AppTest: a choice the new
model does not offer goes back to its default map, and a main map the model refuses is said in one line where the
map goes while the rest of the page (a SAM's Prompts, Compare) is drawn, each section with its own refusal. And a
model opened by path stays chosen when the browser's next message still carries the picker's old value.

The models are test_app's tiny random ViTs and test_sam_prompts' tiny random ``SamModel`` saved whole."""

from dataclasses import replace

import pytest
from helpers import displayed
from streamlit.runtime.scriptrunner_utils.exceptions import RerunException
from streamlit.runtime.scriptrunner_utils.script_requests import RerunData
from test_app import (  # noqa: F401 (default_world and dirs: fixtures)
    TINY,
    default_world,
    dirs,
    png_bytes,
    run_app,
    sidebar_widget,
    upload,
    write_checkpoint,
)

from vit.app import catalog
from vit.core.runfiles import DEFAULT_CHECKPOINT
from vit.explain.methods import attention_flow

pytestmark = pytest.mark.slow


@pytest.fixture
def checkpoints(request):
    """The checkpoints folder of test_app's ``default_world``: the default tiny ViT and its two samples."""
    return request.getfixturevalue("default_world")[0]


def choose_method(at, method: str):
    at.session_state["map_kind"] = "methods"  # "More: LeGrad, LRP, …", then its Method picker
    at.run()
    at.session_state["method_kind"] = method
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    return at


def test_a_method_the_new_model_does_not_offer_goes_back_to_its_default_map_with_one_line(checkpoints):
    """LRP (class-specific) chosen on a classifier, then a feature model opens: not the Method list's first entry
    (attention flow, a max-flow: slow, and refused past 400 tokens) but the feature model's default map."""
    write_checkpoint(checkpoints / "features.pt", config=replace(TINY, num_classes=0), classes=[])
    at = choose_method(run_app(), "lrp")
    sidebar_widget(at, "selectbox", "Checkpoint").set_value(str(checkpoints / "features.pt"))
    at.run()
    upload(at, "photo.png", png_bytes(40, 30))
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.session_state["map_kind"] == "attention"
    assert "Method" not in [w.label for w in at.sidebar.selectbox]
    captions = [displayed(c.value) for c in at.sidebar.caption]
    assert "LRP transformer attribution does not apply to this model: its default map is shown." in captions


def test_a_method_both_models_offer_stays_chosen(checkpoints):
    write_checkpoint(checkpoints / "other.pt", seed=3)
    at = choose_method(run_app(), "lrp")
    sidebar_widget(at, "selectbox", "Checkpoint").set_value(str(checkpoints / "other.pt"))
    at.run()
    upload(at, "photo.png", png_bytes(40, 30))
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert (at.session_state["map_kind"], at.session_state["method_kind"]) == ("methods", "lrp")


@pytest.fixture
def sam_folder(tmp_path):
    pytest.importorskip("transformers")
    from test_sam_prompts import _sam

    model, processor = _sam()
    folder = tmp_path / "sam"
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def test_attention_flow_carried_to_a_sam_is_refused_in_one_line_and_its_prompts_are_still_drawn(
        checkpoints, sam_folder, monkeypatch):
    """Attention flow chosen on a ViT of 17 tokens, then a SAM of 49 opens, over flow's limit (30 here, 400 in the
    app: a SAM ViT-B has 4,096): the refusal stands where the map goes, in one line, and the Prompts section, the
    heads' tabs and Compare are drawn below it (the refusal stopped the page before them)."""
    monkeypatch.setattr(attention_flow, "MAX_FLOW_TOKENS", 30)
    at = choose_method(run_app(), "flow")
    sidebar_widget(at, "text_input", "Open a path").set_value(str(sam_folder))
    at.run()
    upload(at, "photo.png", png_bytes(90, 50, seed=4))
    assert not at.exception, [e.message for e in at.exception]
    assert at.session_state["method_kind"] == "flow"  # a SAM draws flow: only its size is refused
    [error] = [displayed(e.value) for e in at.main.error]
    assert error.startswith("Attention flow solves one max-flow problem per token: 49 tokens is over its limit of 30")
    assert "\n" not in error
    headers = [h.value for h in at.main.header]
    assert "Prompts" in headers
    assert at.radio(key="sam_mouse") is not None and at.tabs  # the Prompts section's controls, the analyses' tabs
    sidebar_widget(at, "selectbox", "Compare with (a second checkpoint)").set_value(
        str(checkpoints / DEFAULT_CHECKPOINT))
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    [warning] = [displayed(w.value) for w in at.main.warning if displayed(w.value).startswith("A cannot")]
    assert warning == f"A cannot show this map: {error}"


def typed_and_uploaded(at, path):
    """The browser's widget states once ``path`` is typed into "Open a path" and a photo is uploaded, the picker
    still showing the model it showed (the page has not drawn the path's model yet)."""
    sidebar_widget(at, "text_input", "Open a path").set_value(str(path))
    at.sidebar.file_uploader[0].set_value(("photo.png", png_bytes(40, 30), "image/png"))
    return at._tree.get_widget_states()  # what AppTest.run() sends, kept to be sent again


def test_a_path_opened_while_an_upload_stops_its_run_stays_chosen(checkpoints, monkeypatch):
    """The browser test of a Swin and a DINOv3 (test_browser_families) timed out twice, once on CI and once in a
    gate here: the path entered, a photo uploaded at once, and the page stayed on the default model. The upload's
    run had stopped the path's run after it had marked the path opened and before it drew the picker, and the
    upload's message held the picker's old value, which chose the default model again. Here the path's run is
    stopped at the same place (a rerun asked with those states, as Streamlit stops a run for a newer message) and the
    page shows the path's model with the photo."""
    other = write_checkpoint(checkpoints.parent / "elsewhere" / "other.pt", seed=3)
    at = run_app()
    assert sidebar_widget(at, "selectbox", "Checkpoint").value == str(checkpoints / DEFAULT_CHECKPOINT)
    browser = typed_and_uploaded(at, other)
    describe, stopped = catalog.describe_current, []

    def stopped_once(*args, **kwargs):  # after the path was read and marked opened, before the picker is drawn
        if not stopped:
            stopped.append(True)
            raise RerunException(RerunData(widget_states=browser))
        return describe(*args, **kwargs)

    monkeypatch.setattr(catalog, "describe_current", stopped_once)
    at.run()
    assert stopped and not at.exception, [e.message for e in at.exception]
    assert sidebar_widget(at, "selectbox", "Checkpoint").value == str(other)
    assert any("photo.png, 40×30 px" in displayed(c.value) for c in at.main.caption)


def test_a_message_sent_before_the_page_showed_the_opened_path_does_not_undo_it(checkpoints):
    """The same message arriving after the path's run has drawn its picker, sent by the browser before it got it:
    the old picker's value is ignored, the path's model stays chosen; the visitor's own choice on the new picker then
    changes it."""
    other = write_checkpoint(checkpoints.parent / "elsewhere" / "other.pt", seed=3)
    at = run_app()
    browser = typed_and_uploaded(at, other)
    at.run()
    assert sidebar_widget(at, "selectbox", "Checkpoint").value == str(other)
    at._run(widget_state=browser)  # AppTest.run() would send the states of the picker just drawn
    assert not at.exception, [e.message for e in at.exception]
    assert sidebar_widget(at, "selectbox", "Checkpoint").value == str(other)
    sidebar_widget(at, "selectbox", "Checkpoint").set_value(str(checkpoints / DEFAULT_CHECKPOINT)).run()
    assert sidebar_widget(at, "selectbox", "Checkpoint").value == str(checkpoints / DEFAULT_CHECKPOINT)


def interrupted_once(monkeypatch, module, name: str) -> list:
    """``module.name`` counting its calls, the first of which gets a message from the browser midway (what an upload
    or a click during it sends): Streamlit then stops the run at the next message the page sends. Returns the calls."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    real, calls = getattr(module, name), []

    def counted(*args, **kwargs):
        calls.append(args[:1])
        result = real(*args, **kwargs)
        if len(calls) == 1:
            assert get_script_run_ctx().script_requests.request_rerun(RerunData())
        return result

    monkeypatch.setattr(module, name, counted)
    return calls


def test_a_model_loaded_while_the_browser_sends_a_message_is_kept_not_loaded_again(checkpoints, monkeypatch):
    """The spinner's end, inside the cached load, was where Streamlit stopped the run for that message: the loaded
    model was thrown away and loaded again by the next run (a large model: another minute, lost again at the next
    click). The spinner goes around the cache now."""
    from app_pages.explorer_sections import caches

    loads = interrupted_once(monkeypatch, caches, "open_source")
    at = run_app()
    assert len(loads) == 1, loads
    assert any("Colours span" in displayed(c.value) for c in at.main.caption), "the page was drawn with it"


def test_a_forward_run_while_the_browser_sends_a_message_is_kept_not_run_again(checkpoints, monkeypatch):
    from vit.explain.views import image_analysis

    forwards = interrupted_once(monkeypatch, image_analysis, "analyse")
    run_app()
    assert len(forwards) == 1, forwards
