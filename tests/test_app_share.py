"""A link's parameters reproduce the explorer's view in a fresh session, and the access rule holds for links
(issue 50). The fixtures are test_app's."""

import pytest
from helpers import displayed
from streamlit.testing.v1 import AppTest
from test_app import APP, TIMEOUT, default_world, dirs, overlay_caption, sidebar_widget, write_checkpoint  # noqa: F401

from vit.runs.access import TOKEN_ENV


def open_link(params: dict[str, str]) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in params.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def notes(at: AppTest) -> list[str]:
    """The sidebar's notes on dropped parameters, as the browser shows them."""
    return [displayed(c.value) for c in at.sidebar.caption if "was not used" in displayed(c.value)]


@pytest.mark.usefixtures("default_world")
def test_a_links_parameters_reproduce_the_view_and_the_url_keeps_them():
    link = {"model": "cifar10-cifar-s", "sample": "dog_1.png", "size": "0", "aspect": "0", "map": "attention",
            "query": "3", "layer": "2", "head": "2", "opacity": "0.35", "cmap": "viridis", "scale": "zero",
            "upsample": "nearest", "grid": "1"}
    at = open_link(link)
    assert notes(at) == []
    assert sidebar_widget(at, "selectbox", "…or a sample image").value.name == "dog_1.png"
    assert "Layer 2 of 3, head 2" in overlay_caption(at)
    assert at.session_state["opacity"] == 0.35 and at.session_state["colormap"] == "viridis"
    assert {k: at.query_params[k][0] if isinstance(at.query_params[k], list) else at.query_params[k]
            for k in at.query_params} == link


@pytest.mark.usefixtures("default_world")
def test_bad_parameters_are_dropped_with_one_line_each_and_the_page_opens():
    at = open_link({"layer": "99", "cmap": "hot", "sample": "gone.png"})
    assert len(notes(at)) == 3
    assert any("layer=99" in n and "3 layers" in n for n in notes(at))
    assert at.get("plotly_chart"), "the view is drawn all the same"


@pytest.mark.usefixtures("default_world")
def test_a_visitor_without_the_token_cannot_open_a_path_through_a_link(tmp_path, monkeypatch):
    other = write_checkpoint(tmp_path / "elsewhere.pt", seed=1)
    monkeypatch.setenv(TOKEN_ENV, "correct-horse-battery-staple")  # a token is set: only a session that entered it
    at = open_link({"model": str(other)})
    assert any("is a path on the server" in n for n in notes(at))
    assert str(other) not in at.session_state["explorer_checkpoint_choice"]
    assert all(str(other) not in str(o) for o in at.sidebar.selectbox(key="explorer_checkpoint_choice").options)


@pytest.mark.usefixtures("default_world")
def test_a_local_visitor_opens_a_path_through_a_link(tmp_path):
    other = write_checkpoint(tmp_path / "elsewhere.pt", seed=1)
    at = open_link({"model": str(other)})
    assert at.session_state["explorer_checkpoint_choice"] == str(other)


@pytest.mark.usefixtures("default_world")
def test_a_link_to_an_upload_the_server_no_longer_holds_asks_for_it_again():
    at = open_link({"upload": "0" * 64})
    assert any("no longer holds" in i.value and "upload it again" in i.value for i in at.info)


@pytest.mark.parametrize("kind", ["rollout", "legrad"])
@pytest.mark.usefixtures("default_world")
def test_a_links_map_is_the_map_shown(kind):
    at = open_link({"map": kind})
    assert at.query_params["map"] in (kind, [kind])
