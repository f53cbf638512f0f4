"""A link's parameters reproduce the explorer's view in a fresh session, and the access rule holds for links
(issue 50). The fixtures are test_app's."""

from pathlib import Path

import pytest
import test_app
import test_app_features
import torch
from helpers import displayed
from streamlit.testing.v1 import AppTest
from test_app import APP, CLASSES, TIMEOUT, charts, overlay_caption, sidebar_widget, write_checkpoint
from test_app_features import open_features
from test_app_mechanism import open_mechanism, sample_input, switch_heads_off

from vit.app import explorer_page as explorer
from vit.explain.mechanism.components import ablate_heads
from vit.runs.access import TOKEN_ENV

dirs, default_world, sae_world = test_app.dirs, test_app.default_world, test_app_features.sae_world  # fixtures


def open_link(params: dict[str, str]) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in params.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def notes(at: AppTest) -> list[str]:
    """The page's lines on the link's values that were not used, as the browser shows them."""
    return [line for w in at.main.warning for line in displayed(w.value).splitlines() if "was not used" in line]


def under_the_title(at: AppTest) -> str:
    """What the main area shows right under the page's title (its first element that shows something)."""
    shown = [node for node in at.main if node.type not in ("empty", "plotly_chart")]  # app.py's cleared frame
    titles = [i for i, node in enumerate(shown) if node.type == "title"]
    assert titles, [node.type for node in shown]
    return displayed(shown[titles[0] + 1].value)


@pytest.mark.usefixtures("default_world")
def test_a_links_parameters_reproduce_the_view_and_the_url_keeps_them():
    link = {"model": Path(test_app.DEFAULT_CHECKPOINT).stem, "sample": "dog_1.png", "size": "0", "aspect": "0",
            "map": "attention",
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


@pytest.mark.parametrize("named", ["cifar10-gone", "runs/gone/best.pt"])
@pytest.mark.usefixtures("default_world")
def test_a_link_to_a_missing_model_says_so_under_the_title_and_opens_the_default_with_the_rest(dirs, named):
    """Issue 69, item 12: a link naming a model this server does not have opened nothing ("This checkpoint cannot
    be loaded"). It is one line right under the title, and the rest of the link applies to the default model."""
    checkpoints, _ = dirs
    at = open_link({"model": named, "sample": "dog_1.png", "layer": "2", "head": "2", "cmap": "viridis"})
    [line] = notes(at)
    assert line == (f"The link's model={named} was not used: this server has no model of that name or path, and "
                     "it is no Hub id; the default model opened instead.")
    assert under_the_title(at) == line
    assert not at.error
    assert at.session_state["explorer_checkpoint_choice"] == str(checkpoints / test_app.DEFAULT_CHECKPOINT)
    assert sidebar_widget(at, "selectbox", "…or a sample image").value.name == "dog_1.png"
    assert "Layer 2 of 3, head 2" in overlay_caption(at)
    assert at.session_state["colormap"] == "viridis"


@pytest.mark.usefixtures("default_world")
def test_a_link_to_a_hub_model_that_does_not_open_says_so_under_the_title(dirs, monkeypatch):
    """A Hub id the server's cache lacks (and this visitor may not download) opens the default, and says so where
    the recipient looks, not only in the sidebar's "Open from the Hub"."""
    checkpoints, _ = dirs
    monkeypatch.setenv(TOKEN_ENV, "correct-horse-battery-staple")  # downloads take the token
    at = open_link({"model": "nobody/nothing", "layer": "2"})
    assert notes(at) == ["The link's model=nobody/nothing was not used: it did not open from this server's Hugging "
                         "Face cache (the sidebar's \"Open from the Hub\" says why); the default model opened "
                         "instead."]
    assert under_the_title(at) == notes(at)[0]
    assert any("not in the server's Hugging Face cache" in displayed(e.value) for e in at.sidebar.error)
    assert at.session_state["explorer_checkpoint_choice"] == str(checkpoints / test_app.DEFAULT_CHECKPOINT)
    assert "Layer 2 of 3" in overlay_caption(at)


@pytest.mark.usefixtures("default_world")
def test_the_values_a_link_could_not_use_are_lines_right_under_the_title():
    """Each value dropped, whether on reading the link or against the model, is a line of one warning under the
    title, not a caption at the foot of the sidebar; it stays while the link's model is shown."""
    at = open_link({"layer": "99", "cmap": "hot", "**zoom**": "2"})  # layer: dropped once the model is known
    assert len(notes(at)) == 3
    assert under_the_title(at).splitlines() == notes(at)
    assert "The link's **zoom**=2 was not used: this explorer has no such setting." in notes(at), "as typed"
    assert not [c for c in at.sidebar.caption if "was not used" in c.value]
    at.sidebar.slider(key="opacity").set_value(0.3).run()
    assert len(notes(at)) == 3, "still there after a click elsewhere"


@pytest.mark.usefixtures("default_world")
def test_a_linked_attribution_setting_the_linked_method_does_not_take_is_a_line_not_a_silent_drop():
    at = open_link({"map": "occlusion", "attr": "n_steps=7,strides=4"})  # n_steps is Integrated Gradients'
    assert notes(at) == ["The link's n_steps=7 was not used: occlusion does not take it."]
    assert at.session_state["attr-strides"] == 4 and "attr-n_steps" not in at.session_state


@pytest.mark.usefixtures("default_world")
def test_a_visitor_without_the_token_cannot_open_a_path_through_a_link(tmp_path, monkeypatch):
    other = write_checkpoint(tmp_path / "elsewhere.pt", seed=1)
    monkeypatch.setenv(TOKEN_ENV, "correct-horse-battery-staple")  # a token is set: only a session that entered it
    at = open_link({"model": str(other)})
    assert any("is a path on the server" in n for n in notes(at))
    assert str(other) not in at.session_state["explorer_checkpoint_choice"]
    assert all(str(other) not in str(o) for o in sidebar_widget(at, "selectbox", "Checkpoint").options)


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
    # The page drew that map, not only kept the parameter: rollout is a main map, LeGrad one of the other methods.
    assert at.session_state["map_kind"] == (kind if kind == "rollout" else explorer.MORE_METHODS)
    assert kind == "rollout" or at.session_state["method_kind"] == kind


def url(at: AppTest) -> dict[str, str]:
    """The page's URL parameters, as the browser's address bar holds them."""
    return {k: v[-1] if isinstance(v, list) else v for k, v in ((k, at.query_params[k]) for k in at.query_params)}


def test_an_sae_features_view_has_its_own_url(sae_world):
    """Issue 50: choosing a feature puts the SAE and the feature in the URL, and that URL shows that feature."""
    _, folder, _ = sae_world
    at = open_features(test_app.run_app(), folder)
    [strongest] = [r for r in at.radio if r.key == "sae_strongest"]
    first, second = (int(o.split(" ")[1]) for o in strongest.options[:2])
    assert url(at)["sae"] == str(folder) and url(at)["feature"] == str(first), "the feature shown on opening it"
    strongest.set_value(second)
    at.run()
    assert url(at)["feature"] == str(second)

    again = open_link(url(at))
    assert notes(again) == []
    assert again.session_state["sae_feature"] == second
    assert any(c.value.startswith(f"Feature {second}'s activation") for c in again.caption)
    assert url(again)["feature"] == str(second)


def test_a_links_feature_past_the_saes_is_dropped_with_one_line(sae_world):
    _, folder, _ = sae_world
    at = open_link({"sae": str(folder), "feature": "32"})  # the SAE has 32 features, 0 to 31
    assert any("feature=32 was not used: this SAE has 32 features" in displayed(c.value) for c in at.caption)
    assert [r for r in at.radio if r.key == "sae_strongest"], "the SAE's features are shown all the same"


def test_a_link_carries_the_heads_switched_off_in_every_map(default_world):
    """The prediction a link with heads switched off shows is the model's with those heads zero-ablated."""
    checkpoints, _ = default_world
    at = switch_heads_off(open_mechanism(test_app.run_app(), "Ablation"), ["1.1", "3.2"], everywhere=True)
    assert url(at)["ablate"] == "1.1,3.2"

    again = open_link(url(at))
    assert notes(again) == []
    assert any("are switched off (zero ablation)" in i.value for i in again.info), [i.value for i in again.info]
    checkpoint, x = sample_input(checkpoints)
    with torch.no_grad():
        expected = ablate_heads(checkpoint.model, x, [(0, 0), (2, 1)])[0].softmax(-1)[0]
    prediction = next(t for fig in charts(again) for t in fig["data"] if t.get("type") == "bar")
    for name, p in zip(prediction["y"], prediction["x"], strict=True):
        assert p == pytest.approx(float(expected[CLASSES.index(name)]), abs=1e-6)
    assert url(again)["ablate"] == "1.1,3.2"


@pytest.mark.usefixtures("default_world")
def test_a_linked_upload_is_named_by_its_file_name_as_plain_text():
    name = "<b>street</b> *1*.png"  # Markdown and HTML in a file name are shown as typed
    at = test_app.upload(test_app.run_app(), name, test_app.png_bytes(40, 24, seed=7))
    assert len(url(at)["upload"]) == 64

    again = open_link(url(at))
    assert [t.value for t in again.sidebar.text if t.value.startswith("The linked upload")] == [
        f"The linked upload: {name}"]
    assert any(displayed(c.value).startswith(f"Click a patch to make it the query. {name}, 40×24 px")
               for c in again.caption)


@pytest.mark.parametrize("size", ["4096", "17"])
@pytest.mark.usefixtures("default_world")
def test_a_links_size_the_models_size_list_lacks_is_one_line_and_the_models_own_size_shows(size):
    """Issue 62, item 6: such a size reset to the model's own with no line (the picker has no such option)."""
    at = open_link({"size": size, "layer": "2"})
    assert notes(at) == [f"The link's size={size} was not used: this model's sizes are 0 (its own), 16, 32, 64, "
                          "224, 256, 320, 384, 448, 480, 518, 640, 768, 1024."]
    assert at.session_state["input_side"] == 0
    assert "Layer 2 of 3" in overlay_caption(at)  # the rest of the link applies
    assert notes(open_link({"size": "32"})) == [] and sidebar_widget(open_link({"size": "32"}), "selectbox",
                                                                       "Input size").value == 32


@pytest.mark.parametrize("kind", ["probe", "probe_rollout"])
@pytest.mark.usefixtures("default_world")
def test_a_links_map_the_model_cannot_draw_is_one_line(kind):
    """Issue 62, item 6: map=probe on a model without an attention-pooling probe fell back to its first map with no
    line."""
    at = open_link({"map": kind, "layer": "2"})
    assert notes(at) == [f"The link's map={kind} was not used: this model has no attention-pooling probe; its maps "
                          "are attention, rollout, class, legrad, lrp, attnlrp, gradcam, gradcam++, xgradcam, "
                          "eigencam, layercam, scorecam, integrated_gradients, smoothgrad, input_x_gradient, "
                          "occlusion, feature_ablation, kernel_shap, rise, attn-gradcam, lrp-partial, lrp-full, flow, "
                          "norms."]
    assert at.session_state["map_kind"] == "attention" and "Layer 2 of 3" in overlay_caption(at)


@pytest.mark.usefixtures("default_world")
def test_a_line_found_only_once_the_model_is_known_shows_on_the_links_first_run():
    """The lines under the title were drawn only where the link had a line before the model loaded."""
    assert notes(open_link({"layer": "99"})) == ["The link's layer=99 was not used: this model has 3 layers."]
