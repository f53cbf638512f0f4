"""Comparing runs (the settings that differ) and checkpoints (the difference of two maps)."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from PIL import Image

from vit.explain.views.compare import (
    ABSENT,
    config_diff,
    difference,
    difference_overlay,
    flatten,
    format_setting,
    symmetric_limit,
)


def test_config_diff_shows_only_the_parameters_that_differ():
    rows = config_diff({
        "a": {"lr": 0.001, "epochs": 10, "preset": "cifar-s", "out": "runs/a", "model": {"num_layers": 6}},
        "b": {"lr": 0.002, "epochs": 10, "preset": "cifar-s", "out": "runs/b", "model": {"num_layers": 4}},
    })
    assert rows == [{"Parameter": "lr", "a": "0.001", "b": "0.002"},
                    {"Parameter": "model.num_layers", "a": "6", "b": "4"}]


def test_config_diff_marks_a_setting_one_run_lacks_and_treats_2_and_2_0_as_equal():
    rows = config_diff({"old": {"epochs": 2, "warmup_epochs": 0}, "new": {"epochs": 2.0, "warmup_epochs": 0,
                                                                          "threads": 1}})
    assert rows == [{"Parameter": "threads", "old": ABSENT, "new": "1"}]


def test_config_diff_of_three_runs_keeps_a_row_when_any_one_differs_and_shows_unset_as_empty():
    rows = config_diff({"a": {"ema": None, "seed": 0}, "b": {"ema": None, "seed": 0}, "c": {"ema": 0.99, "seed": 0}})
    assert rows == [{"Parameter": "ema", "a": "", "b": "", "c": "0.99"}]


def test_config_diff_needs_two_runs():
    assert config_diff({"a": {"lr": 1.0}}) == []


def test_flatten_and_format():
    assert flatten({"model": {"a": 1, "b": {"c": 2}}, "x": 3}) == {"model.a": 1, "model.b.c": 2, "x": 3}
    assert [format_setting(v) for v in (None, True, 1e-3, [1, 2], "s")] == ["", "true", "0.001", "[1, 2]", "s"]


def test_difference_subtracts_after_upsampling_so_different_grids_compare():
    a = np.array([[1.0, 0.0]])  # 1x2 grid
    b = np.array([[0.5]])  # 1x1 grid
    np.testing.assert_allclose(difference(a, b, (2, 4), "nearest"), [[0.5, 0.5, -0.5, -0.5]] * 2)


def test_difference_overlay_puts_zero_at_the_centre_of_the_diverging_colour_map():
    image = Image.new("RGB", (4, 2), (0, 0, 0))
    a = np.array([[1.0, 0.0], [0.0, 0.0]])
    b = np.array([[0.0, 0.0], [0.0, 1.0]])
    shown = np.asarray(difference_overlay(image, a, b, opacity=1.0, mode="nearest"))
    cmap = matplotlib.colormaps["RdBu_r"]
    top = np.array(cmap(1.0, bytes=True)[:3])  # +1: A attends more, the red end
    low = np.array(cmap(0.0, bytes=True)[:3])  # -1: the blue end
    mid = np.array(cmap(0.5, bytes=True)[:3])  # 0: white
    np.testing.assert_array_equal(shown[0, 0], top)
    np.testing.assert_array_equal(shown[1, 3], low)
    np.testing.assert_array_equal(shown[0, 3], mid)
    assert symmetric_limit(np.zeros((2, 2))) > 0
    with pytest.raises(ValueError, match="opacity"):
        difference_overlay(image, a, b, opacity=2.0)


def test_settings_for_the_other_checkpoint_match_relative_depth_and_find_classes_by_name():
    from types import SimpleNamespace

    from vit.explain.views.attention_maps import MapSettings

    a = SimpleNamespace(num_layers=4, num_heads=4, grid=(8, 8), num_prefix_tokens=1)
    deeper = SimpleNamespace(num_layers=6, num_heads=4, grid=(8, 8), num_prefix_tokens=1)
    coarse = SimpleNamespace(num_layers=4, num_heads=2, grid=(4, 4), num_prefix_tokens=1, input_size=(64, 64))
    from vit.explain.views.compare import settings_for_other

    s = settings_for_other(MapSettings(layer=-1), a, deeper, ["x", "y"], ["x", "y"])
    assert s.layer == 5  # A's last layer (4 of 4) is B's last (6 of 6): the same relative depth
    s = settings_for_other(MapSettings(layer=1), a, deeper, ["x", "y"], ["x", "y"])
    assert s.layer == 2  # layer 2 of 4 (half way) is layer 3 of 6
    s = settings_for_other(MapSettings(kind="class", class_index=1), a, deeper, ["x", "y"], ["y", "x"])
    assert s.class_index == 0
    s = settings_for_other(MapSettings(kind="legrad", class_index=1), a, deeper, ["x", "y"], ["y", "x"])
    assert s.class_index == 0  # every class-explaining map finds the class by name
    with pytest.raises(ValueError, match="no head 3"):
        settings_for_other(MapSettings(head=2), a, coarse, [], [])
    with pytest.raises(ValueError, match=r"\(64×64 px in 4 rows × 4 columns of patches, 1 prefix\); only the CLS"):
        settings_for_other(MapSettings(query=5), a, coarse, [], [])
    with pytest.raises(ValueError, match="no class named 'y'"):
        settings_for_other(MapSettings(kind="class", class_index=1), a, deeper, ["x", "y"], ["x", "z"])


@pytest.mark.parametrize("layer, L_a, L_b, expected", [(3, 4, 6, 5), (3, 6, 12, 7), (11, 12, 6, 5), (0, 12, 6, 0),
                                                       (5, 6, 4, 3), (2, 4, 4, 2), (0, 1, 12, 11)])
def test_same_depth_matches_the_share_of_the_network(layer, L_a, L_b, expected):
    from vit.explain.views.compare import same_depth

    assert same_depth(layer, L_a, L_b) == expected


def test_the_depth_note_names_both_layers():
    from vit.explain.views.attention_maps import MapSettings
    from vit.explain.views.compare import depth_note

    assert depth_note(MapSettings(layer=3), MapSettings(layer=7), 6, 12) == \
        "A's layer 4 of 6 is compared with B's layer 8 of 12 (the same relative depth)."
    assert depth_note(MapSettings(layer=3), MapSettings(layer=3), 6, 6) == ""
