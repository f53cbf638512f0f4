"""The one access rule on the pages, tried as issue 39's attacker did: a server on localhost behind a reverse proxy
(a token set) and a visitor who never entered it.

Streamlit drops a widget's value sent for a widget the page does not draw, but a page that reads
``st.session_state`` directly would still see it: the attacks set the widgets' keys in the session state, as a
crafted message could, and check that the page reads nothing.
"""

import pytest
from streamlit.testing.v1 import AppTest
from test_analyze import CLASSES as ANALYSE_CLASSES
from test_analyze import always, world  # noqa: F401  (world: a fixture)
from test_app import APP, TIMEOUT, default_world, dirs, run_app, write_checkpoint  # noqa: F401  (fixtures)

from vit.checkpoint import save_checkpoint
from vit.runs import access

TOKEN = "correct-horse-battery-staple"


@pytest.fixture
def proxied(monkeypatch):
    """`streamlit run app.py` on 127.0.0.1 behind a reverse proxy: a token is set."""
    from streamlit import config

    monkeypatch.setenv("VIT_TRAIN_TOKEN", TOKEN)
    before = config.get_option("server.address")
    config.set_option("server.address", "127.0.0.1")
    yield
    config.set_option("server.address", before)


def shown(at: AppTest) -> list[str]:
    """Everything the page says, and the checkpoint picker's options."""
    said = [e.value for kind in ("error", "warning", "info", "caption", "markdown") for e in getattr(at, kind)]
    return said + [o for s in at.sidebar.selectbox if s.label == "Checkpoint" for o in s.options]


def test_behind_a_token_the_explorer_opens_no_model_by_path_before_the_token_is_entered(default_world, proxied,  # noqa: F811
                                                                                       tmp_path):
    """Attack (a): a model folder outside every root, typed as a path, was opened and its predictions shown."""
    other = write_checkpoint(tmp_path / "elsewhere" / "secret.pt", seed=3)
    at = run_app(explorer_open_path=str(other))
    assert not [t for t in at.sidebar.text_input if t.label == "Open a path"]
    assert not any("secret" in line for line in shown(at))
    assert any("needs the token: enter it on the Train page" in c.value for c in at.sidebar.caption)


def test_behind_a_token_a_path_gets_the_same_answer_whether_it_exists_or_not(default_world, proxied, tmp_path):  # noqa: F811
    """Attack (b): '/etc/shadow is not a checkpoint' but '~/.ssh/id_rsa: checkpoint not found' told which exist."""
    existing = tmp_path / "shadow"
    existing.write_text("root:*:19000:0:99999:7:::\n")
    answers = [shown(run_app(explorer_open_path=str(path))) for path in (existing, tmp_path / "id_rsa")]
    assert answers[0] == answers[1]


def test_one_token_entered_on_the_train_page_unlocks_opening_a_path_in_the_explorer(default_world, proxied,  # noqa: F811
                                                                                    tmp_path):
    other = write_checkpoint(tmp_path / "elsewhere" / "mine.pt", seed=3)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.switch_page("app_pages/training.py")
    at.run()
    at.text_input(key="train_token_input").set_value(TOKEN)
    next(b for b in at.button if b.label == "Unlock").click()
    at.run()
    assert at.session_state[access.UNLOCKED]
    at.switch_page("app_pages/explorer.py")
    at.run()
    next(t for t in at.sidebar.text_input if t.label == "Open a path").set_value(str(other))
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert next(s for s in at.sidebar.selectbox if s.label == "Checkpoint").value == str(other)


def analyse_page(dirs, **state) -> AppTest:  # noqa: F811
    save_checkpoint(dirs[0] / "cat.pt", always(0), ANALYSE_CLASSES)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.switch_page("app_pages/analyze.py")
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def test_behind_a_token_the_analyse_page_reads_no_folder_before_the_token_is_entered(world, dirs,  # noqa: F811
                                                                                   proxied):
    """Attack (c): a folder outside the data roots was analysed and its images shown."""
    at = analyse_page(dirs, analyze_folder=str(world / "data"), analyze_open_path=str(world / "cat.pt"))
    assert any("Enter the token on the Train page" in w.value for w in at.warning)
    assert not at.text_input and not at.button and not at.metric and not at.image


def test_unlocked_the_analyse_page_still_reads_only_the_data_roots_and_says_so_alike_for_any_outside_folder(
        world, dirs, proxied, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setenv("VIT_DATA_ROOTS", str(world / "elsewhere"))
    answers = []
    for folder in (world / "data", tmp_path / "missing"):
        at = analyse_page(dirs, **{access.UNLOCKED: True})
        at.text_input(key="analyze_folder").set_value(str(folder))
        at.run()
        next(b for b in at.button if b.label == "Analyse").click()
        at.run()
        assert not at.exception and not at.metric and not at.image, "nothing was analysed"
        answers.append([e.value for e in at.error])
    assert answers[0] == answers[1] and "image folders must be inside elsewhere" in answers[0][0]
