"""``vit.train --init X --finetune {full,linear-probe} --layer-decay D``: how a trained model is fine-tuned.

The layer-wise rates are checked against a hand computation, MAE's rule (``util/lr_decay.py``, restated below)
and timm's ``param_groups_layer_decay``; the schedule against MAE's ``util/lr_sched.py``; the linear probe by
the weights it must leave untouched.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch
from helpers import make_image_folder

from vit.checkpoint import load_checkpoint, read_checkpoint_payload, save_checkpoint
from vit.model import ViT, ViTConfig
from vit.train import main
from vit.training import options
from vit.training.data import Dataset, Split
from vit.training.optimization import layer_id, param_groups, schedule_factor
from vit.training.trainer import Trainer

TINY = ViTConfig(image_size=8, patch_size=4, num_classes=2, hidden_size=8, num_layers=2, num_heads=2, mlp_size=16,
                 drop_path=0.1, dropout=0.1)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("data") / "colours", classes=("green", "red"), per_class=8)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A trained model of ours to start from: 2 blocks, the dataset's classes, dropout and stochastic depth on."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("source") / "tiny.pt"
    save_checkpoint(path, ViT(TINY), ["green", "red"])
    return path


def run(images: Path, out: Path, source: Path, *extra: str) -> int:
    return main(["--dataset", f"folder:{images}", "--out", str(out), "--cache-dir", str(out.parent / "cache"),
                 "--init", str(source), "--epochs", "2", "--batch-size", "4", "--threads", "1",
                 "--attention-every", "0", *extra])


def tiny_trainer(source: Path, *extra: str) -> Trainer:
    """A Trainer on 8 random 8x8 images, its model from ``source``, built as the CLI builds it."""
    args = options.parse_args(["--dataset", "folder:unused", "--out", "unused-run", "--init", str(source),
                               "--batch-size", "4", "--threads", "1", *extra])
    options.resolve_model(args, num_classes=2, class_names=["green", "red"])
    images = torch.randint(0, 256, (8, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    split = Split(images, torch.arange(8) % 2)
    data = Dataset("tiny", ["green", "red"], split, split, (0.5,) * 3, (0.25,) * 3, True)
    return Trainer(options.settings_from_args(args), data, None)


def scales_by_name(model: torch.nn.Module, groups: list[dict]) -> dict[str, tuple[float, float]]:
    """{parameter name: (lr_scale, weight_decay)} of a list of parameter groups."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: (g["lr_scale"], g["weight_decay"]) for g in groups for p in g["params"]}


# -- layer-wise learning-rate decay -------------------------------------------------------------


def test_layer_decay_scales_are_the_hand_computed_powers():
    # 2 blocks, decay 0.5: embeddings 0.5^3, block 0 0.5^2, block 1 0.5^1, final norm and head 0.5^0.
    model = ViT(TINY)
    scales = scales_by_name(model, param_groups(model, 0.05, layer_decay=0.5))
    expected = {"cls_token": 0.125, "pos_embed": 0.125, "patch_embed.weight": 0.125, "patch_embed.bias": 0.125,
                "blocks.0.attn.qkv.weight": 0.25, "blocks.0.norm1.bias": 0.25, "blocks.1.mlp.fc2.weight": 0.5,
                "norm.weight": 1.0, "head.weight": 1.0, "head.bias": 1.0}
    assert {name: scales[name][0] for name in expected} == expected
    assert sorted({scale for scale, _ in scales.values()}) == [0.125, 0.25, 0.5, 1.0]
    assert len(scales) == len(list(model.parameters()))  # every parameter in exactly one group


def mae_layer_id(name: str, num_layers: int) -> int:
    """MAE's ``util/lr_decay.get_layer_id_for_vit`` (facebookresearch/mae, after BEiT), restated: its
    ``num_layers`` is the number of blocks + 1."""
    if name in ("cls_token", "pos_embed") or name.startswith("patch_embed"):
        return 0
    if name.startswith("blocks"):
        return int(name.split(".")[1]) + 1
    return num_layers


def mae_groups(model: ViT, weight_decay: float, no_weight_decay_list: tuple[str, ...], layer_decay: float):
    """MAE's ``param_groups_lrd``, restated: a group per (layer, decay or not), scaled decay^(num_layers - layer)."""
    num_layers = len(model.blocks) + 1
    layer_scales = [layer_decay ** (num_layers - i) for i in range(num_layers + 1)]
    groups: dict[str, dict] = {}
    for name, param in model.named_parameters():
        no_decay = param.ndim == 1 or name in no_weight_decay_list
        layer = mae_layer_id(name, num_layers)
        group = groups.setdefault(f"layer_{layer}_{'no_decay' if no_decay else 'decay'}", {
            "lr_scale": layer_scales[layer], "weight_decay": 0.0 if no_decay else weight_decay, "params": []})
        group["params"].append(param)
    return list(groups.values())


@pytest.mark.parametrize("depth", [1, 3, 12])
def test_layer_decay_groups_follow_maes_param_groups_lrd(depth):
    model = ViT(ViTConfig(image_size=8, patch_size=4, num_classes=3, hidden_size=8, num_layers=depth, num_heads=2,
                          mlp_size=16))
    ours = param_groups(model, 0.05, layer_decay=0.65)
    reference = mae_groups(model, 0.05, ("cls_token", "pos_embed"), 0.65)
    assert [(g["lr_scale"], g["weight_decay"], [id(p) for p in g["params"]]) for g in ours] == \
        [(g["lr_scale"], g["weight_decay"], [id(p) for p in g["params"]]) for g in reference]


def test_layer_decay_agrees_with_timm_except_where_timm_puts_the_final_norm():
    timm_optim = pytest.importorskip("timm.optim")
    from timm.models.vision_transformer import VisionTransformer

    model = ViT(ViTConfig(image_size=8, patch_size=4, num_classes=3, hidden_size=8, num_layers=3, num_heads=2,
                          mlp_size=16, num_register_tokens=2))
    model.group_matcher = lambda coarse=False: VisionTransformer.group_matcher(None, coarse)  # timm's ViT rule
    theirs = scales_by_name(model, timm_optim.param_groups_layer_decay(
        model, 0.05, no_weight_decay_list=("cls_token", "pos_embed", "reg_token"), layer_decay=0.5))
    ours = scales_by_name(model, param_groups(model, 0.05, layer_decay=0.5))
    assert set(ours) == set(theirs)
    differ = {name for name in ours if ours[name] != theirs[name]}
    assert differ == {"norm.weight", "norm.bias"}  # timm: with the last block; MAE and we: with the head
    assert ours["norm.weight"] == (1.0, 0.0) and theirs["norm.weight"] == (0.5, 0.0)
    assert ours["reg_token"][0] == 0.5 ** 4  # registers are embeddings: layer 0


def test_layer_ids_put_every_embedding_first_and_everything_after_the_blocks_last():
    assert [layer_id(n, 12) for n in ("cls_token", "dist_token", "reg_token", "pos_embed", "patch_embed.weight",
                                      "norm_pre.weight")] == [0] * 6
    assert [layer_id(n, 12) for n in ("blocks.0.ls1", "blocks.11.attn.qkv.weight")] == [1, 12]
    assert [layer_id(n, 12) for n in ("norm.bias", "fc_norm.weight", "attn_pool.latent", "head.weight",
                                      "head_dist.bias")] == [13] * 5


def test_without_layer_decay_there_are_two_groups_as_before(source):
    trainer = tiny_trainer(source)
    assert [g["weight_decay"] for g in trainer.optimizer.param_groups] == [0.05, 0.0]
    assert trainer.lr_scales == [1.0, 1.0]


def test_the_schedule_scales_every_group_by_its_share_as_maes_lr_sched(source):
    # MAE's util/lr_sched.adjust_learning_rate: lr = min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi * t / T)) after
    # the warmup, then each group's lr = lr * lr_scale (its floor scaled too).
    trainer = tiny_trainer(source, "--layer-decay", "0.5", "--epochs", "4", "--warmup-epochs", "0",
                           "--lr", "1e-3", "--min-lr", "1e-4")
    total = trainer.total_steps
    for step in range(total + 1):
        mae_lr = 1e-4 + (1e-3 - 1e-4) * 0.5 * (1 + math.cos(math.pi * step / total))
        got = [g["lr"] for g in trainer.optimizer.param_groups]
        torch.testing.assert_close(got, [mae_lr * s for s in trainer.lr_scales], rtol=1e-12, atol=0)
        assert trainer.lr() == pytest.approx(mae_lr, rel=1e-12)  # the reported rate: the head's
        if step < total:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # stepping the schedule without training
                trainer.scheduler.step()


def test_schedule_factor_warms_up_linearly_then_follows_the_cosine_to_the_floor():
    assert schedule_factor(0, 4, 10, "cosine", 0.1) == pytest.approx(1e-3)
    assert schedule_factor(2, 4, 10, "cosine", 0.1) == pytest.approx(1e-3 + (1 - 1e-3) / 2)
    assert schedule_factor(4, 4, 10, "cosine", 0.1) == 1.0
    assert schedule_factor(7, 4, 10, "cosine", 0.1) == pytest.approx(0.1 + 0.9 * 0.5)
    assert schedule_factor(10, 4, 10, "cosine", 0.1) == pytest.approx(0.1)
    assert schedule_factor(9, 4, 10, "constant", 0.1) == 1.0


# -- linear probe -------------------------------------------------------------------------------


def test_a_linear_probe_leaves_every_backbone_tensor_bit_identical_and_trains_the_head(images, source, tmp_path):
    out = tmp_path / "probe"
    assert run(images, out, source, "--finetune", "linear-probe", "--lr", "1e-2", "--ema", "0.5") == 0
    before = load_checkpoint(source).model.state_dict()
    for name in ("last.pt", "best.pt"):
        after = load_checkpoint(out / name).model.state_dict()
        backbone = [k for k in before if not k.startswith("head.")]
        assert len(backbone) > 20
        assert all(torch.equal(after[k], before[k]) for k in backbone), name
        assert not torch.equal(after["head.weight"], before["head.weight"])
    state = read_checkpoint_payload(out / "last.pt")["training_state"]["optimizer"]
    assert sum(len(g["params"]) for g in state["param_groups"]) == 2  # head.weight and head.bias only
    config = json.loads((out / "config.json").read_text())
    assert config["args"]["finetune"] == "linear-probe" and config["args"]["layer_decay"] == 1.0
    # The frozen part runs without dropout: its features in training are those it gives at inference.
    assert (config["model"]["dropout"], config["model"]["attention_dropout"], config["model"]["drop_path"]) == (0, 0, 0)


def test_a_linear_probe_trainer_optimizes_the_classifier_alone(source):
    trainer = tiny_trainer(source, "--finetune", "linear-probe")
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable == {"head.weight", "head.bias"}
    in_optimizer = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(trainer.model.head.weight), id(trainer.model.head.bias)}


# -- the options: recorded, kept on resume, refused where they make no sense ----------------------


def test_layer_decay_is_recorded_and_a_resume_keeps_it(images, source, tmp_path):
    out = tmp_path / "lrd"
    assert run(images, out, source, "--layer-decay", "0.65", "--epochs", "1") == 0
    config = json.loads((out / "config.json").read_text())
    assert config["args"]["layer_decay"] == 0.65 and config["args"]["finetune"] == "full"
    assert config["args"]["init"] == str(source)
    assert main(["--resume", str(out), "--epochs", "2"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["args"]["layer_decay"] == 0.65 and config["resumes"][0]["from_epoch"] == 1
    groups = read_checkpoint_payload(out / "last.pt")["training_state"]["optimizer"]["param_groups"]
    # 2 blocks: layers 0..3, each with decayed and undecayed parameters.
    assert sorted({round(g["lr"] / max(x["lr"] for x in groups), 9) for g in groups}) == \
        [round(0.65 ** k, 9) for k in (3, 2, 1, 0)]


def test_resume_refuses_a_new_fine_tuning_mode(images, source, tmp_path, capsys):
    out = tmp_path / "fixed"
    assert run(images, out, source, "--epochs", "1") == 0
    capsys.readouterr()
    assert main(["--resume", str(out), "--epochs", "2", "--finetune", "linear-probe"]) == 2
    assert "--finetune cannot change when resuming" in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--layer-decay", "0"], "argument --layer-decay: expected a number in (0, 1], got '0'"),
    (["--layer-decay", "1.5"], "argument --layer-decay: expected a number in (0, 1], got '1.5'"),
    (["--layer-decay", "nan"], "argument --layer-decay: expected a number in (0, 1], got 'nan'"),
    (["--finetune", "probe"], "argument --finetune: invalid choice: 'probe'"),
    (["--finetune", "linear-probe", "--layer-decay", "0.65"], "--layer-decay has no effect with --finetune "
                                                              "linear-probe"),
    (["--finetune", "linear-probe", "--drop-path", "0.1"], "--drop-path cannot be given with --finetune "
                                                            "linear-probe"),
])
def test_bad_fine_tuning_options_are_one_line_usage_errors(images, source, tmp_path, capsys, extra, message):
    assert run(images, tmp_path / "bad", source, *extra) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("extra, message", [
    (["--finetune", "linear-probe"], "--finetune linear-probe needs --init"),
    (["--layer-decay", "0.65"], "--layer-decay needs --init"),
])
def test_fine_tuning_options_without_init_are_refused(images, tmp_path, capsys, extra, message):
    argv = ["--dataset", f"folder:{images}", "--out", str(tmp_path / "scratch"), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
