"""The explorer's sink diagnostics (Mechanism > Phenomena) through Streamlit's AppTest: a table per layer and head
with the engine's numbers for the image shown, and a caption."""

import pytest
import test_app
import torch
from test_app import run_app
from test_app_mechanism import open_mechanism, sample_input

from vit.explain.mechanism import components as mechanism
from vit.explain.mechanism.sink_diagnostics import sink_diagnostics

pytest.importorskip("streamlit")
pytestmark = pytest.mark.slow  # each test starts the app
dirs, default_world = test_app.dirs, test_app.default_world  # fixtures


def test_sink_diagnostics_show_one_row_per_layer_and_head_with_the_engines_numbers(default_world):
    checkpoints, _ = default_world
    at = open_mechanism(run_app(), "Phenomena")
    at.toggle(key="sink_diagnostics").set_value(True)
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    [table] = [d.value for d in at.dataframe if "verdict" in d.value.columns]
    checkpoint, x = sample_input(checkpoints)
    model = checkpoint.model
    with torch.no_grad():
        expected = sink_diagnostics(model, mechanism.hidden_states(model, x), model.patch_grid(*x.shape[-2:]))
    assert list(zip(table["layer"], table["head"], strict=True)) == [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2)]
    assert list(table["verdict"]) == list(expected.verdict[0].flat)
    assert list(table["stable rank"]) == pytest.approx(expected.stable_rank[0].flatten().tolist(), rel=1e-6)
    assert list(table["value ratio"]) == pytest.approx(expected.value_ratio[0].flatten().tolist(), rel=1e-6)
    assert any("broadcast sinks" in c.value and "among 3 layers × 2 heads" in c.value for c in at.caption)
