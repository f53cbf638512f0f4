"""Lee et al. 2021's levers for ViTs on small data, as the authors wrote them (github.com/aanna0701/SPT_LSA_ViT):
shifted patch tokens (``patch_shift="diagonal"``, their ``PatchShifting``) and locality self-attention
(``attention="lsa"``: a learned scale per head, each token's own key masked out), checked against hand-computed
tensors; a run trains with them (``--preset cifar-m-sl``, ``--patch-shift``, ``--attention``) and the explorer's
maps of such a model are its own attention. vit-pytorch's versions are checked against vit-pytorch itself in
tests/test_vit_pytorch_parity.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import make_image_folder
from PIL import Image

from vit.checkpoint import Checkpoint, Preprocessing, load_checkpoint
from vit.core.inference import TRAINING_SIZE, preprocess
from vit.explain.views import attention_maps, image_analysis
from vit.model import ViT, ViTConfig
from vit.model.vision_transformer import shifted_copies
from vit.train import main as train
from vit.training.options import parse_args, resolve_model

BASE = dict(image_size=16, patch_size=4, num_classes=3, hidden_size=16, num_layers=2, num_heads=2, mlp_size=24)


def model(**options) -> ViT:
    torch.manual_seed(0)
    net = ViT(ViTConfig(**{**BASE, **options})).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return net


def test_diagonal_shifts_are_the_image_and_its_copies_half_a_patch_towards_each_corner():
    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).reshape(2, 3, 8, 8) + 1  # no pixel is 0
    out = shifted_copies(x, "diagonal", patch=4)  # s = 2
    assert out.shape == (2, 15, 8, 8)
    assert torch.equal(out[:, :3], x)
    # Copy k at (i, j) is x at (i + di, j + dj), 0 where that falls outside: PatchShifting's crops of pad(x, 2),
    # [:H, :W], [:H, 2s:], [2s:, :W], [2s:, 2s:].
    for k, (di, dj) in enumerate([(-2, -2), (-2, 2), (2, -2), (2, 2)]):
        copy = out[:, 3 * (k + 1):3 * (k + 2)]
        for i in range(8):
            for j in range(8):
                inside = 0 <= i + di < 8 and 0 <= j + dj < 8
                expected = x[:, :, i + di, j + dj] if inside else torch.zeros(2, 3)
                assert torch.equal(copy[:, :, i, j], expected), (k, i, j)


def test_the_patch_embedding_norms_each_flattened_patch_of_the_five_copies_then_projects_it():
    net = model(patch_shift="diagonal")
    images = torch.randn(2, 3, 16, 16)
    stacked = shifted_copies(images, "diagonal", 4)  # (2, 15, 16, 16)
    patch = stacked[:, :, 4:8, 8:12].reshape(2, -1)  # the patch at row 1, column 2: token 1 + 1 * 4 + 2
    normed = torch.nn.functional.layer_norm(patch, (240,), net.patch_norm.weight, net.patch_norm.bias, 1e-6)
    expected = normed @ net.patch_embed.weight.reshape(16, -1).T + net.patch_embed.bias
    with torch.no_grad():
        embedded = net.embed(images)  # CLS first, then the patches plus their positions
    torch.testing.assert_close(embedded[:, 1 + 6] - net.pos_embed[0, 1 + 6], expected, rtol=0, atol=1e-5)


def test_locality_attention_is_a_softmax_of_each_heads_scaled_logits_without_the_own_key():
    net = model(attention="lsa")
    with torch.no_grad():
        net.blocks[0].attn.lsa_scale.copy_(torch.tensor([0.9, -0.4]))  # each head its own scale
        images = torch.randn(2, 3, 16, 16)
        x = net.embed(images)
        _, attentions = net(images, output_attentions=True)
    block = net.blocks[0]
    h = torch.nn.functional.layer_norm(x, (16,), block.norm1.weight, block.norm1.bias, 1e-6)
    q, k, _ = (h @ block.attn.qkv.weight.T + block.attn.qkv.bias).reshape(2, 17, 3, 2, 8).permute(2, 0, 3, 1, 4)
    logits = (q @ k.transpose(-2, -1)) * torch.tensor([0.9, -0.4]).view(1, 2, 1, 1)  # the authors' scale, per head
    logits = logits.masked_fill(torch.eye(17, dtype=torch.bool), -987654321)  # and their mask value
    torch.testing.assert_close(attentions[0], logits.softmax(-1), rtol=0, atol=1e-6)
    with torch.no_grad():  # the fused path (scaled_dot_product_attention) gives the same logits
        torch.testing.assert_close(net(images)[0], net(images, output_attentions=True)[0], rtol=0, atol=1e-6)
    initial = ViT(ViTConfig(**{**BASE, "attention": "lsa"})).blocks[0].attn.lsa_scale  # the authors': dim_head ** -0.5
    torch.testing.assert_close(initial.detach(), torch.full((2,), 8 ** -0.5), rtol=0, atol=0)


def test_the_explorers_maps_of_such_a_model_are_its_own_attention():
    net = model(attention="lsa", patch_shift="diagonal")
    checkpoint = Checkpoint(model=net, class_names=["a", "b", "c"], preprocessing=Preprocessing.default_for(net.config))
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 30, 3), dtype=np.uint8))
    analysis = image_analysis.analyse(checkpoint, image)
    x = preprocess([image], checkpoint.preprocessing, TRAINING_SIZE, 4)
    with torch.no_grad():
        _, attentions = net(x, output_attentions=True)
    for layer in (0, 1):
        for query in (0, 6):  # CLS, and a patch's row (read from the layer's queries, keys and mask)
            drawn = attention_maps.attention_map(analysis, attention_maps.MapSettings(kind="attention", layer=layer,
                                                                                      query=query))
            expected = attentions[layer][0, :, query, 1:].mean(0).reshape(4, 4).numpy()
            np.testing.assert_allclose(drawn, expected, atol=1e-6)
    import vit

    with pytest.raises(ValueError, match="has no rule for attention='lsa'; use AttnLRP"):  # no rule of theirs for it
        vit.explain(checkpoint, image, "lrp")
    assert np.isfinite(vit.explain(checkpoint, image, "attnlrp").map).all()
    rows = attention_maps.query_rows(analysis, 6)  # (L, H, T)
    torch.testing.assert_close(rows, torch.stack([a[0, :, 6] for a in attentions]), rtol=0, atol=1e-6)
    assert rows[:, :, 6].abs().max() == 0  # the patch never attends to itself


@pytest.mark.parametrize("options", [["--preset", "cifar-m-sl"], ["--patch-shift", "cardinal", "--attention",
                                                                    "lsa_temperature"]])
def test_a_run_trains_with_the_levers_and_its_checkpoint_keeps_them(tmp_path, options):
    out = tmp_path / "run"
    small = ["--num-layers", "1", "--hidden-size", "24", "--num-heads", "2", "--mlp-size", "32"]
    images = make_image_folder(tmp_path / "data", per_class=6, size=32)
    assert train(["--dataset", f"folder:{images}", "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
                  "--epochs", "1", "--batch-size", "4", "--threads", "1", "--image-size", "32", *options,
                  *small]) == 0
    config = load_checkpoint(out / "best.pt").model.config
    expected = ("diagonal", "lsa") if "cifar-m-sl" in options else ("cardinal", "lsa_temperature")
    assert (config.patch_shift, config.attention) == expected
    assert json.loads((out / "config.json").read_text())["model"]["patch_shift"] == expected[0]


def test_the_levers_are_refused_where_they_do_not_apply(tmp_path):
    with pytest.raises(ValueError, match="patch_shift .* square patches of images"):
        ViTConfig(**{**BASE, "patch_shift": "diagonal", "patch_norm": True})
    with pytest.raises(ValueError, match="lsa .* global layer over every token"):
        ViTConfig(**{**BASE, "attention": "lsa", "stage_depths": (1, 1)})
    args = parse_args(["--dataset", "cifar10", "--out", str(tmp_path / "r"), "--attention", "lsa"])
    assert resolve_model(args, 10).attention == "lsa"


def test_a_compiled_model_traces_the_levers_in_one_graph():
    """vit.train --compile: a graph break at every layer (a data-dependent mask) would cost the GPU's pace."""
    net = model(attention="lsa", patch_shift="diagonal")
    images = torch.randn(2, 3, 16, 16)
    compiled = torch.compile(net, fullgraph=True, backend="eager")  # fullgraph: a graph break raises
    with torch.no_grad():
        torch.testing.assert_close(compiled(images)[0], net(images)[0], rtol=0, atol=1e-6)
