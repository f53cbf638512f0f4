"""SaCo (Wu et al. CVPR 2024) against the authors' compute_SaCo.py (tests/reference/saco, copied verbatim). They
publish the coefficient's loop and leave s(G_i) and pred(x, G_i) as ``...``: their loop runs unchanged on ours, and
the groups and perturbations are checked against the paper's definition, one image and one group at a time."""

import ast
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from vit.explain.benchmarks.metrics import input_maps, saco_coefficient, saco_groups

REFERENCE = Path(__file__).parent / "reference" / "saco" / "compute_SaCo.py"


def their_saco(s_G, pred_x_G):
    """compute_SaCo's own statements but the two left as ``...`` (and the map they come from), run unchanged."""
    text = REFERENCE.read_text()
    function = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "compute_SaCo")
    skipped = {"salience_map", "s_G", "pred_x_G"}
    body = [n for n in function.body
            if not (isinstance(n, ast.Expr) or isinstance(n, ast.Return)
                    or isinstance(n, ast.Assign) and n.targets[0].id in skipped)]
    namespace = {"K": len(s_G), "s_G": list(s_G), "pred_x_G": list(pred_x_G)}
    exec("\n".join(textwrap.dedent(ast.get_source_segment(text, n, padded=True)) for n in body), namespace)
    return namespace["F"]


def test_coefficient_equals_their_loop_with_ties():
    g = np.random.default_rng(0)
    salience = g.random((6, 10))
    change = g.normal(size=(6, 10))
    change[1, 3:6] = 0.25  # equal changes: their >= counts the pair for
    salience[2] = np.sort(salience[2])  # salience rising while the groups go down the ranking
    salience[3, :4] = 0.5  # equal saliences: pairs of weight 0
    ours = saco_coefficient(salience, change)
    for b in range(6):
        assert ours[b] == pytest.approx(their_saco(salience[b], change[b]), abs=1e-6)
    assert np.all(np.abs(ours) <= 1)


def test_coefficient_of_a_flat_map_is_nan_where_theirs_raises():
    salience, change = np.full((1, 4), 0.3), np.arange(4.0)[None]
    with pytest.raises(ValueError, match="total weight is zero"):
        their_saco(salience[0], change[0])
    assert np.isnan(saco_coefficient(salience, change)[0])


def test_groups_perturb_each_share_of_the_ranking_alone_with_the_image_mean():
    from vit.model import ViT, ViTConfig

    torch.manual_seed(0)
    model = ViT(ViTConfig(image_size=20, patch_size=4, hidden_size=32, num_layers=2, num_heads=2, mlp_size=64,
                          num_classes=4)).eval()
    g = torch.Generator().manual_seed(1)
    images = torch.randn(3, 3, 20, 20, generator=g)
    maps = torch.rand(3, 5, 5, generator=g)
    maps[1] = (maps[1] * 3).round()  # ties: row-major order among equals
    target = torch.tensor([0, 3, 1])
    K = 7  # 400 pixels: groups of 57 and 58
    salience, change = saco_groups(model, images, maps, target, K, batch_size=5)
    pixels = input_maps(maps, (20, 20)).reshape(3, -1)
    for b in range(3):
        order = sorted(range(400), key=lambda p: (-float(pixels[b, p]), p))
        with torch.no_grad():
            before = model(images[b:b + 1])[0].softmax(-1)[0, target[b]]
        for k in range(K):
            # the paper's G_k: (k - 1) HW / K <= rank < k HW / K, counting k from 1
            members = [p for r, p in enumerate(order) if k * 400 / K <= r < (k + 1) * 400 / K]
            assert salience[b, k] == pytest.approx(float(pixels[b, members].double().sum()), abs=1e-6)
            perturbed = images[b].reshape(3, -1).clone()
            perturbed[:, members] = images[b].mean(dim=(1, 2))[:, None]
            with torch.no_grad():
                after = model(perturbed.reshape(1, 3, 20, 20))[0].softmax(-1)[0, target[b]]
            assert change[b, k] == pytest.approx(float(before - after), abs=1e-6)
    assert np.all(np.diff(salience, axis=1) <= 1e-9)  # most salient group first


def test_cli_saco_prints_the_mean_coefficient_per_method(tmp_path, capsys):
    import json

    from tests.test_faithfulness_chefer import tiny_model_and_images
    from vit import faithfulness

    checkpoint = tiny_model_and_images(tmp_path, labelled=False)
    code = faithfulness.main([str(checkpoint), "--benchmark", "saco", "--data", str(tmp_path / "data"),
                              "--methods", "rollout", "legrad", "--groups", "5", "--out", str(tmp_path / "out")])
    out = capsys.readouterr()
    assert code == 0, out.err
    result = json.loads(out.out)
    assert result["groups"] == 5 and result["images"] == 4
    for scores in result["methods"].values():
        assert -1 <= scores["saco"] <= 1 and scores["undefined"] == 0
    assert (tmp_path / "out" / "faithfulness.png").read_bytes()[:4] == b"\x89PNG"
