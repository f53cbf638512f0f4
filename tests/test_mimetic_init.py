"""Mimetic initialisation (Trockman & Kolter, ICML 2023, arXiv:2305.09828): each head's W_q W_k^T is the best
rank-head_dim approximation of alpha1 Z1 + beta1 I, each layer's W_v W_proj is alpha2 Z2 - beta2 I, checked against
that closed form with the same Z (drawn from the seeded generator in the documented order); the default leaves the
weights as they were; ``vit.train --mimetic-init`` reaches the model and its config.json."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from helpers import make_image_folder

from vit.checkpoint import load_checkpoint
from vit.core.cli import UsageError
from vit.model import MIMETIC_DEFAULTS, ViT, ViTConfig, mimetic_init_
from vit.train import main as train
from vit.training import options
from vit.training.options import parse_args, resolve_model

BASE = ViTConfig(image_size=16, patch_size=4, num_classes=3, hidden_size=16, num_layers=2, num_heads=2, mlp_size=24)
ALPHAS = (0.7, 0.7, 0.4, 0.4)


def split_qkv(attn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The paper's per-head W_q, W_k (nh, d, hd) and the layer's W_v (d, nh*hd), from our qkv Linear."""
    nh, hd = attn.num_heads, attn.head_dim
    d = attn.qkv.weight.shape[1]
    q, k, v = attn.qkv.weight.detach().view(3, nh, hd, d).unbind(0)
    return q.transpose(1, 2), k.transpose(1, 2), v.reshape(nh * hd, d).T


def drawn(d: int, heads: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The Z1 of each head, then Z2, as mimetic_init_ draws them: N(0, 1/d) entries from the global generator."""
    z1 = [torch.randn(d, d) / math.sqrt(d) for _ in range(heads)]
    return z1, torch.randn(d, d) / math.sqrt(d)


def test_query_key_product_is_alpha1_z_plus_beta1_i_exactly_when_a_head_spans_the_width():
    attn = ViT(replace(BASE, num_heads=1)).blocks[0].attn  # head_dim == d: no truncation
    torch.manual_seed(3)
    mimetic_init_(attn, *ALPHAS)
    torch.manual_seed(3)
    (z1,), _ = drawn(16, 1)
    w_q, w_k, _ = split_qkv(attn)
    torch.testing.assert_close(w_q[0] @ w_k[0].T, 0.7 * z1 + 0.7 * torch.eye(16), rtol=0, atol=1e-5)


def test_each_heads_query_key_product_is_the_best_rank_head_dim_approximation_of_its_target():
    """Eckart-Young: rank <= k, and the residual's spectral and Frobenius norms are the target's discarded
    singular values (sigma_{k+1}, and the root of the sum of squares past k), read off svdvals alone."""
    attn = ViT(replace(BASE, hidden_size=24, num_heads=3)).blocks[0].attn  # head_dim 8 of 24
    torch.manual_seed(4)
    mimetic_init_(attn, 0.5, 0.9, 0.3, 0.2)
    torch.manual_seed(4)
    z1, _ = drawn(24, 3)
    w_q, w_k, _ = split_qkv(attn)
    for h in range(3):
        target = 0.5 * z1[h] + 0.9 * torch.eye(24)
        product = w_q[h] @ w_k[h].T
        sigma = torch.linalg.svdvals(target)
        residual = target - product
        assert torch.linalg.matrix_rank(product) == 8
        assert torch.linalg.matrix_norm(residual, 2) == pytest.approx(sigma[8].item(), rel=1e-4)
        assert torch.linalg.matrix_norm(residual) == pytest.approx(sigma[8:].square().sum().sqrt().item(), rel=1e-4)
        # the product is "approximately beta1 I": the identity's share survives on the diagonal
        assert torch.diagonal(product).mean() > 0.2


def test_value_projection_product_is_alpha2_z_minus_beta2_i():
    attn = ViT(BASE).blocks[1].attn
    torch.manual_seed(5)
    mimetic_init_(attn, *ALPHAS)
    torch.manual_seed(5)
    _, z2 = drawn(16, 2)
    _, _, w_v = split_qkv(attn)
    w_proj = attn.proj.weight.detach().T  # (nh*hd, d)
    torch.testing.assert_close(w_v @ w_proj, 0.4 * z2 - 0.4 * torch.eye(16), rtol=0, atol=1e-5)


def test_the_model_initialises_every_layer_so_and_nothing_else():
    """Through ViT(config): the same seed without the option consumes the generator identically up to the
    mimetic draws, so every other weight is bit-identical and the draws that follow are the layers' Z."""
    torch.manual_seed(0)
    mimetic = ViT(replace(BASE, mimetic_init=ALPHAS))
    torch.manual_seed(0)
    plain = ViT(BASE)
    changed = set()
    for (name, a), b in zip(mimetic.state_dict().items(), plain.state_dict().values(), strict=True):
        if not torch.equal(a, b):
            changed.add(name)
    assert changed == {f"blocks.{i}.attn.{w}.weight" for i in range(2) for w in ("qkv", "proj")}
    for block in mimetic.blocks:
        z1, z2 = drawn(16, 2)
        w_q, w_k, w_v = split_qkv(block.attn)
        torch.testing.assert_close(w_v @ block.attn.proj.weight.detach().T, 0.4 * z2 - 0.4 * torch.eye(16),
                                   rtol=0, atol=1e-5)
        for h in range(2):
            target = 0.7 * z1[h] + 0.7 * torch.eye(16)
            residual = torch.linalg.matrix_norm(target - w_q[h] @ w_k[h].T, 2)
            assert residual == pytest.approx(torch.linalg.svdvals(target)[8].item(), rel=1e-4)


def test_off_by_default_so_old_configs_and_their_weights_are_unchanged():
    old = {k: v for k, v in BASE.to_dict().items() if k != "mimetic_init"}  # a config.json from before the field
    assert ViTConfig.from_dict(old) == BASE and BASE.mimetic_init == ()
    torch.manual_seed(0)
    a = ViT(ViTConfig.from_dict(old)).state_dict()
    torch.manual_seed(0)
    b = ViT(BASE).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert 0.01 < b["blocks.0.attn.qkv.weight"].std() < 0.03  # the plain init's trunc_normal(0.02)
    config = replace(BASE, mimetic_init=[0.7, 0.7, 0.4, 0.4])  # a JSON list reads back as the tuple
    assert ViTConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_a_model_on_the_meta_device_builds_without_drawing():
    with torch.device("meta"):
        net = ViT(replace(BASE, mimetic_init=ALPHAS))
    assert net.blocks[0].attn.qkv.weight.is_meta


def test_the_config_refuses_values_it_cannot_use():
    for bad in ((0.7, 0.7, 0.4), (0.7, 0.7, 0.4, -1), (0.7, 0.7, 0.4, float("nan")), (True, 1, 1, 1), "0.7"):
        with pytest.raises(ValueError, match="mimetic_init must be empty or four numbers"):
            replace(BASE, mimetic_init=bad)


def test_the_cli_flag_alone_gives_the_papers_values_and_takes_four_others(tmp_path):
    assert options.MIMETIC_DEFAULTS == MIMETIC_DEFAULTS == ALPHAS
    run = ["--dataset", "cifar10", "--out", str(tmp_path / "r")]
    assert resolve_model(parse_args(run), 10).mimetic_init == ()
    assert resolve_model(parse_args([*run, "--mimetic-init"]), 10).mimetic_init == ALPHAS
    args = parse_args([*run, "--mimetic-init", "0.5,0.6,0.1,0.2"])
    assert resolve_model(args, 10).mimetic_init == (0.5, 0.6, 0.1, 0.2)
    assert args.model["mimetic_init"] == (0.5, 0.6, 0.1, 0.2)
    for bad in ("0.5,0.6", "a,b,c,d", "0.5,0.6,0.1,nan"):
        with pytest.raises(UsageError, match="four numbers"):
            parse_args([*run, "--mimetic-init", bad])


def test_a_run_trains_with_it_and_records_it(tmp_path):
    out = tmp_path / "run"
    images = make_image_folder(tmp_path / "data", per_class=6, size=32)
    assert train(["--dataset", f"folder:{images}", "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
                  "--epochs", "1", "--batch-size", "4", "--threads", "1", "--image-size", "32", "--num-layers", "1",
                  "--hidden-size", "24", "--num-heads", "2", "--mlp-size", "32", "--attention-every", "0",
                  "--mimetic-init"]) == 0
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["model"]["mimetic_init"] == list(ALPHAS)
    assert recorded["args"]["mimetic_init"] == list(ALPHAS)
    assert load_checkpoint(out / "best.pt").model.config.mimetic_init == ALPHAS
