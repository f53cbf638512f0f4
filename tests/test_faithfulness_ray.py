"""The faithfulness benchmarks on a real local Ray cluster (two nodes, one CPU each): ``vit.faithfulness --ray``."""

from __future__ import annotations

import json

import pytest
import torch
from vit_commands import vit_command

from tests.test_faithfulness_chefer import tiny_model_and_images


@pytest.mark.slow
def test_on_ray_every_score_equals_the_local_runs(ray_cluster, tmp_path, capsys):
    """ROAD (its imputation noise and the random baseline seeded per batch), the benchmark's own maps and one map of
    vit.methods() (drawn by the actors through vit.api): 4 images in batches of 1 over 2 actors, returned in any
    order, joined in the set's order."""
    from vit import faithfulness

    checkpoint = tiny_model_and_images(tmp_path, labelled=True)
    common = [str(checkpoint), "--benchmark", "road", "--data", str(tmp_path / "data"), "--methods",
              "random,class,gradcam", "--batch-size", "1"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the actors (one CPU each): the same float sums
    try:
        assert faithfulness.main([*common, "--out", str(tmp_path / "local")]) == 0
    finally:
        torch.set_num_threads(threads)
    capsys.readouterr()
    # The command in this process too (tests/vit_commands.py): its job's entrypoint and actors are real processes
    # on the cluster; a second torch start-up here (~2.5 s of CPU) proved nothing test_plugins's `--help` does not.
    done = vit_command("vit.faithfulness", *common, "--out", tmp_path / "ray", "--ray", ray_cluster.address)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "vit.faithfulness: job faithfulness-ray-" in done.stdout and "succeeded" in done.stdout

    local, on_ray = (json.loads((tmp_path / name / "faithfulness.json").read_text()) for name in ("local", "ray"))
    assert on_ray.pop("workers") == 2 and on_ray.pop("maps_per_s_per_worker") > 0
    for result in (local, on_ray):
        for scores in result["methods"].values():
            assert scores.pop("images_per_s") > 0
    assert local["images"] == 4 and local == on_ray  # every score, exactly
    assert (tmp_path / "ray" / "faithfulness.png").read_bytes()[:4] == b"\x89PNG"
