"""Every command that runs a model's forward asks the one cost model first (issue 67, item 2): ``vit.predict``,
``vit.analyze`` (locally, inside its Ray job, and the summaries the Ray actors and the Analyse page compute) and
``vit.sae train`` (locally and in its Ray Train worker) ask ``plan.decide(plan.forward(...))`` before any image,
and an input over the memory limit per image is refused in one line before any block runs.

The model is a plain ViT (no windows, no position bias: the model's own layout check has nothing to refuse) under
the token gate; only the limit per image (VIT_ANALYSIS_MEMORY_MB, set to 16 KB here) is over, so only the cost
model's forward can refuse it. Blocks run are counted through ``Block.forward`` (every block of every model).
"""

from __future__ import annotations

import pytest
import torch
from helpers import make_image_folder

from vit.checkpoint import Preprocessing, load_checkpoint, save_checkpoint
from vit.costs import plan
from vit.model import ViT, ViTConfig
from vit.model.blocks import Block

CONFIG = ViTConfig(image_size=32, patch_size=4, hidden_size=16, num_layers=2, num_heads=2, mlp_size=32,
                   num_classes=2)
LIMIT_MB = "0.015625"  # 16 KB: one image's forward at 32 px (65 tokens) holds ~50 KB by the cost model


@pytest.fixture
def blocks_run(monkeypatch) -> list:
    """The blocks run from now on, in any model of this process."""
    ran, forward = [], Block.forward

    def counted(self, *args, **kwargs):
        ran.append(self)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(Block, "forward", counted)
    return ran


@pytest.fixture
def over_the_limit(tmp_path, monkeypatch):
    """A checkpoint and a labelled folder of images whose forward is over VIT_ANALYSIS_MEMORY_MB."""
    torch.manual_seed(0)
    path = save_checkpoint(tmp_path / "tiny.pt", ViT(CONFIG).eval(), ["cat", "dog"],
                           Preprocessing(32, 3, (0.5,) * 3, (0.5,) * 3))
    data = make_image_folder(tmp_path / "data", per_class=2, size=32)
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", LIMIT_MB)
    return path, data


def refusal(err: str) -> str:
    [line] = err.strip().splitlines()
    assert "one image's forward" in line and "VIT_ANALYSIS_MEMORY_MB" in line and "Traceback" not in line, line
    return line


def test_the_cost_model_refuses_this_forward_and_nothing_else_does(over_the_limit, monkeypatch):
    """The premise: under the token gate, no layout, only the forward's bytes over the limit (and under it at the
    default limit: the same input runs)."""
    model = load_checkpoint(over_the_limit[0]).model
    grid = model.patch_grid(32, 32)
    cost = plan.forward(model, grid)
    assert cost.memory > float(LIMIT_MB) * 2**20 and cost.tokens == 65
    with pytest.raises(plan.TooManyTokens):
        plan.decide(cost)
    monkeypatch.delenv("VIT_ANALYSIS_MEMORY_MB")
    assert plan.decide(plan.forward(model, grid)) == "run"


def test_predict_refuses_before_any_block(over_the_limit, blocks_run, capsys):
    from vit import predict

    path, data = over_the_limit
    assert predict.main([str(path), str(next((data / "cat").iterdir()))]) == 2
    assert "32 px input (--size)" in refusal(capsys.readouterr().err)
    assert not blocks_run


def test_analyze_refuses_before_any_block_locally_and_in_its_ray_job(over_the_limit, blocks_run, capsys, tmp_path):
    from vit import analyze

    path, data = over_the_limit
    for job in ([], ["--ray-job"]):  # the job's own process checks before it starts any actor
        assert analyze.main([str(path), "--data", str(data), "--out", str(tmp_path / "out"), *job]) == 2
        assert "32×32 px input" in refusal(capsys.readouterr().err)
    assert not blocks_run and not (tmp_path / "out").exists()


def test_the_summaries_the_ray_actors_and_the_page_compute_refuse_before_any_block(over_the_limit, blocks_run):
    from vit.explain.views.dataset import analyze_files, image_summaries

    path, data = over_the_limit
    checkpoint = load_checkpoint(path)
    files = sorted((data / "cat").iterdir())
    with pytest.raises(plan.TooManyTokens, match="one image's forward"):
        image_summaries(checkpoint, files)  # what vit.runs.ray_analyze's actors call on each batch
    with pytest.raises(plan.TooManyTokens, match="one image's forward"):
        analyze_files(checkpoint, [(f, 0) for f in files])  # the Analyse page's
    assert not blocks_run


def test_sae_train_refuses_before_any_block_locally_and_in_its_ray_worker(over_the_limit, blocks_run, capsys,
                                                                           tmp_path):
    from vit import sae

    path, data = over_the_limit
    argv = ["train", str(path), "--data", str(data), "--layer", "1", "--k", "2", "--out", str(tmp_path / "sae")]
    assert sae.main(argv) == 2
    assert "32×32 px input" in refusal(capsys.readouterr().err)

    def harvest(*args):  # the Ray actors' harvest: never asked
        raise AssertionError("harvested")

    with pytest.raises(RuntimeError) as refused:  # vit.runs.ray_sae's Ray Train worker
        sae.train_in_worker(argv, "cpu", None, harvest)
    assert str(refused.value).startswith("vit.sae: error:") and "one image's forward" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert not blocks_run and not (tmp_path / "sae" / "last.pt").exists()


def test_the_dataset_analysis_counts_every_layers_attention_it_reads_and_asks_once(tmp_path, monkeypatch):
    """``vit.analyze``'s forward returns every layer's attention (``output_attentions``) for the summaries: 2 layers x
    2 heads x 65² float32, and the costliest layer's scores beside its probabilities, 3 x 33,800 bytes; an input
    whose forward alone fits but not with them is refused, and the command asks the cost model once."""
    from vit import analyze
    from vit.explain.views import dataset

    torch.manual_seed(0)
    model = ViT(CONFIG).eval()
    grid = model.patch_grid(32, 32)
    alone, returned = plan.forward(model, grid), plan.forward(model, grid, attentions=True)
    assert returned.memory - alone.memory == 3 * 2 * 65 ** 2 * 4
    path = save_checkpoint(tmp_path / "tiny.pt", model, ["cat", "dog"], Preprocessing(32, 3, (0.5,) * 3, (0.5,) * 3))
    data = make_image_folder(tmp_path / "data", per_class=2, size=32)
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str((alone.memory + returned.memory) / 2 / 2**20))
    with pytest.raises(plan.TooManyTokens, match="one image's forward with every layer's attention"):
        dataset.check_forward_fits(load_checkpoint(path))
    monkeypatch.setenv("VIT_ANALYSIS_MEMORY_MB", str(returned.memory / 2**20))
    asked, forward = [], plan.forward
    monkeypatch.setattr(plan, "forward", lambda *args, **kwargs: asked.append(1) or forward(*args, **kwargs))
    assert analyze.main([str(path), "--data", str(data), "--out", str(tmp_path / "out")]) == 0
    assert len(asked) == 1
