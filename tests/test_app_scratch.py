"""The explorer opens a learner's model by path (tintn's experiment folder) and refuses unknown weights briefly."""

import pytest
import torch
from helpers import displayed
from test_app import dirs, open_by_path, png_bytes, run_app, sidebar_widget, upload  # noqa: F401 (a fixture)
from test_convert_mapping import Wrapper, notebook_model
from test_scratch_parity import tintn_experiment

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dirs")]  # the app's own empty world


def test_a_tintn_experiment_folder_opened_by_path_predicts_and_says_its_preprocessing_was_assumed(tmp_path):
    folder, _ = tintn_experiment(tmp_path, faster=False)
    at = run_app()
    open_by_path(at, folder)
    assert any("assumed defaults" in displayed(w.value) and "mean (0.5, 0.5, 0.5)" in displayed(w.value)
               for w in at.sidebar.warning)
    assert not at.main.error, [e.value for e in at.main.error]
    assert [c.value for c in at.main.caption if "Colours span" in c.value]  # the overlay is drawn


def test_unknown_weights_are_refused_with_their_description_and_the_command(tmp_path):
    torch.save(Wrapper(notebook_model()).state_dict(), tmp_path / "mine.pt")
    at = run_app()
    sidebar_widget(at, "text_input", "Open a path").set_value(str(tmp_path / "mine.pt"))
    at.run()
    [error] = at.main.error
    shown = displayed(error.value)
    assert "a ViT with 2 blocks of width 64, keys like `net.encoder.0.attn.qkv.weight`" in shown
    assert shown.endswith(f"python -m vit.convert {tmp_path / 'mine.pt'} --inspect")
    assert len(shown) < 400


def test_a_from_scratch_models_default_class_names_say_how_to_name_them(tmp_path):
    folder, _ = tintn_experiment(tmp_path, faster=False)  # tintn's config.json holds no class names
    at = run_app()
    open_by_path(at, folder)
    [note] = [displayed(c.value) for c in at.sidebar.caption if "class 0" in displayed(c.value)]
    assert f'give them as "class_names": […] in {folder / "config.json"}, one per class' in note
