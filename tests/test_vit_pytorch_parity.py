"""lucidrains' vit-pytorch ViT and SimpleViT state dicts open exactly: logits and every layer's attention equal to
the vit-pytorch package's own (its ``Recorder``, or a hook on each ``attend`` softmax), to 1e-5."""

import json

import pytest
import torch
from parity_helpers import assert_parity, randomize

from vit.model import ViT
from vit.sources.open import SourceError, open_source

vit_pytorch = pytest.importorskip("vit_pytorch")
from vit_pytorch.recorder import Recorder  # noqa: E402
from vit_pytorch.simple_vit import SimpleViT, posemb_sincos_2d  # noqa: E402


def save(tmp_path, model, arguments: dict | None) -> object:
    torch.save(model.state_dict(), tmp_path / "vit.pt")
    if arguments is not None:
        (tmp_path / "config.json").write_text(json.dumps(arguments))
    return tmp_path / "vit.pt"


def assert_same(ours, logits, attentions) -> None:
    """``attentions``: vit-pytorch's Recorder's (B, layers, H, T, T)."""
    our_logits, our_attentions = ours
    assert_parity("vit-pytorch", our_logits, logits, our_attentions, list(attentions.unbind(1)))


VIT_CASES = {  # constructor arguments; dim_head apart from dim / heads, mean pooling, one head without to_out
    "cls-dim_head": dict(image_size=32, patch_size=8, num_classes=10, dim=32, depth=2, heads=4, mlp_dim=48,
                         dim_head=16),
    "mean-pool": dict(image_size=32, patch_size=4, num_classes=7, dim=32, depth=2, heads=2, mlp_dim=40,
                      pool="mean", dim_head=64),
    "one-head-identity": dict(image_size=28, patch_size=7, num_classes=10, dim=24, depth=2, heads=1, mlp_dim=32,
                              dim_head=24, channels=1),
}


@pytest.mark.parametrize("case", list(VIT_CASES))
def test_vit_pytorch_vit_opens_exactly_with_its_config_json(tmp_path, case):
    arguments = VIT_CASES[case]
    model = randomize(vit_pytorch.ViT(**arguments))
    path = save(tmp_path, model, arguments)
    channels = arguments.get("channels", 3)
    images = torch.randn(2, channels, arguments["image_size"], arguments["image_size"])
    with torch.no_grad():
        logits, attentions = Recorder(model)(images)
        for source in (path, tmp_path):
            checkpoint = open_source(source)
            assert_same(checkpoint.model(images, output_attentions=True), logits, attentions)


def simple_vit_attentions(model: torch.nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SimpleViT's logits and each layer's attention: the output of its own ``attend`` softmax, as Recorder reads."""
    recorded = []
    hooks = [m.attend.register_forward_hook(lambda _, __, out: recorded.append(out))
             for m in model.transformer.modules() if hasattr(m, "attend")]
    logits = model(images)
    for hook in hooks:
        hook.remove()
    return logits, torch.stack(recorded, dim=1)


def test_simple_vit_opens_exactly_with_its_sincos_positions(tmp_path):
    arguments = dict(image_size=32, patch_size=4, num_classes=10, dim=32, depth=2, heads=4, mlp_dim=48, dim_head=8)
    model = randomize(SimpleViT(**arguments))
    path = save(tmp_path, model, arguments)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        checkpoint = open_source(path)
        assert_same(checkpoint.model(images, output_attentions=True), *simple_vit_attentions(model, images))
    assert checkpoint.config.pooling == "avg" and not checkpoint.config.class_token


def test_simple_vit_positions_are_vit_pytorchs():
    from vit.sources.ports.libraries.import_vit_pytorch import posemb_sincos_2d as ours

    torch.testing.assert_close(ours((4, 6), 32), posemb_sincos_2d(4, 6, 32), rtol=0, atol=0)


def test_arch_arguments_open_a_bare_state_dict(tmp_path):
    arguments = VIT_CASES["mean-pool"]
    model = randomize(vit_pytorch.ViT(**arguments))
    path = save(tmp_path, model, None)
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        checkpoint = open_source(path, arch="vit_pytorch:heads=2,patch_size=4,image_size=32")
        assert_same(checkpoint.model(images, output_attentions=True), *Recorder(model)(images))


def test_what_the_weights_cannot_tell_is_asked_for_in_one_line(tmp_path):
    path = save(tmp_path, vit_pytorch.ViT(**VIT_CASES["cls-dim_head"]), None)
    with pytest.raises(SourceError, match=r"do not say heads, patch_size, image_size: pass heads=N, "
                                          r"patch_size=N, image_size=N \(--arch vit_pytorch:heads=N") as error:
        open_source(path)
    assert "\n" not in str(error.value)


def test_simple_vit_image_size_is_asked_for_in_one_line(tmp_path):
    path = save(tmp_path, SimpleViT(image_size=32, patch_size=4, num_classes=10, dim=32, depth=1, heads=4,
                                    mlp_dim=48), None)
    with pytest.raises(SourceError, match="do not say image_size: pass image_size=N"):
        open_source(path, arch="vit_pytorch:heads=4,patch_size=4")


def test_simple_vit_starts_a_run_with_vit_train_init_exactly(tmp_path):
    from vit.training.finetune import load_init, prepare_init

    arguments = dict(image_size=32, patch_size=8, num_classes=10, dim=32, depth=2, heads=2, mlp_dim=48, dim_head=16)
    model = randomize(SimpleViT(**arguments))
    save(tmp_path, model, arguments)
    init = prepare_init(str(tmp_path), num_classes=10)
    ours = ViT(init.config)
    load_init(ours, init)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert_same(ours.eval()(images, output_attentions=True), *simple_vit_attentions(model, images))


def test_vit_pytorch_1_0_prenorm_layout_opens_exactly(tmp_path):
    """Releases around 1.0 (tests/reference/vit_pytorch_1_0, that release's vit.py): PreNorm wrappers, and
    mlp_head = LayerNorm + Linear; their class token is stored with either pooling, so pool=cls is asked for."""
    from reference.vit_pytorch_1_0.vit import ViT as ViT_1_0

    arguments = dict(image_size=32, patch_size=8, num_classes=10, dim=32, depth=2, heads=4, mlp_dim=48, dim_head=16)
    model = randomize(ViT_1_0(**arguments))
    path = save(tmp_path, model, None)
    with pytest.raises(SourceError, match="pass pool=cls"):
        open_source(path, arch="vit_pytorch:heads=4,patch_size=8,image_size=32")
    images = torch.randn(2, 3, 32, 32)
    recorded = []
    for module in model.modules():
        if hasattr(module, "attend"):
            module.attend.register_forward_hook(lambda _, __, out: recorded.append(out))
    with torch.no_grad():
        logits = model(images)
        checkpoint = open_source(path, arch="vit_pytorch:heads=4,pool=cls,patch_size=8,image_size=32")
        assert_same(checkpoint.model(images, output_attentions=True), logits, torch.stack(recorded, dim=1))


def test_layer_decay_puts_vit_pytorchs_patch_norms_with_the_embeddings():
    from vit.training.optimization import layer_id

    assert layer_id("patch_norm.weight", 6) == layer_id("embed_norm.bias", 6) == layer_id("patch_embed.weight", 6) == 0


NON_SQUARE = {  # vit-pytorch's own models whose patch counts are squares, so the weights look like square ones'
    "patch_size": dict(image_size=32, patch_size=(2, 8), num_classes=10, dim=32, depth=2, heads=2, mlp_dim=48),
    "image_size": dict(image_size=(16, 64), patch_size=4, num_classes=10, dim=32, depth=2, heads=2, mlp_dim=48),
    "both": dict(image_size=(16, 64), patch_size=(2, 8), num_classes=10, dim=32, depth=2, heads=2, mlp_dim=48),
}


def images_of(arguments: dict, batch: int = 2) -> torch.Tensor:
    size = arguments["image_size"]
    return torch.randn(batch, arguments.get("channels", 3), *((size, size) if isinstance(size, int) else size))


@pytest.mark.parametrize("argument", list(NON_SQUARE))
def test_non_square_patches_or_images_open_exactly(tmp_path, argument):
    arguments = NON_SQUARE[argument]
    model = randomize(vit_pytorch.ViT(**arguments))
    path = save(tmp_path, model, {"heads": 2})  # the sides the weights cannot tell are asked for, not guessed
    with pytest.raises(SourceError, match=r"do not say patch_size, image_size: pass patch_size=N, image_size=N"):
        open_source(path)
    (tmp_path / "config.json").write_text(json.dumps(arguments))  # tuples become [height, width] lists
    images = images_of(arguments)
    with torch.no_grad():
        logits, attentions = Recorder(model)(images)
        ours, our_attentions = open_source(path).model(images, output_attentions=True)
    assert_same((ours, our_attentions), logits, attentions)
    torch.testing.assert_close(ours, logits, rtol=0, atol=1e-6)
    for mine, theirs in zip(our_attentions, attentions.unbind(1), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)


@pytest.mark.parametrize("argument", list(NON_SQUARE))
def test_simple_vit_with_non_square_sides_opens_exactly(tmp_path, argument):
    arguments = {**NON_SQUARE[argument], "dim_head": 8}
    model = randomize(SimpleViT(**arguments))
    path = save(tmp_path, model, arguments)
    images = images_of(arguments)
    with torch.no_grad():
        assert_same(open_source(path).model(images, output_attentions=True), *simple_vit_attentions(model, images))


@pytest.mark.parametrize(("change", "message"), [
    ({"image_size": [16, 60]}, r"image_size=\[16, 60\] is not a multiple of patch_size=\[2, 8\]"),
    ({"image_size": [16, 32]}, r"image_size=\[16, 32\] in 2x8-px patches makes 32 patches, but the position table "
                               r"has 64"),
    ({"patch_size": [3, 8]}, r"not 3 channels of 3x8 patches"),
    ({"patch_size": [2, 8, 1]}, r"patch_size must be a whole number or a \[height, width\] pair, got \[2, 8, 1\]"),
    ({"patch_size": [2, 0.5]}, r"patch_size must be a positive whole number, got 0.5"),
])
def test_rectangular_sides_the_weights_contradict_are_refused_naming_them(tmp_path, change, message):
    arguments = NON_SQUARE["both"]
    path = save(tmp_path, vit_pytorch.ViT(**arguments), {**arguments, **change})
    with pytest.raises(SourceError, match=message) as error:
        open_source(path)
    assert "\n" not in str(error.value)


def test_square_sides_given_as_pairs_open_exactly(tmp_path):
    arguments = dict(image_size=(32, 32), patch_size=(8, 8), num_classes=10, dim=32, depth=2, heads=4, mlp_dim=48)
    model = randomize(vit_pytorch.ViT(**arguments))
    path = save(tmp_path, model, arguments)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert_same(open_source(path).model(images, output_attentions=True), *Recorder(model)(images))


@pytest.mark.parametrize(("change", "message"), [
    ({"depth": 10**6}, r"depth=1000000 contradicts the weights \(its layers number 2\)"),
    ({"dim": 64}, r"dim=64 contradicts the weights \(the model's width is 32\)"),
    ({"mlp_dim": 4}, r"mlp_dim=4 contradicts the weights"),
    ({"num_classes": 3}, r"num_classes=3 contradicts the weights"),
    ({"image_size": float("nan")}, r"image_size must be a positive whole number, got nan"),
    ({"image_size": 1e6}, r"image_size must be a positive whole number, got 1000000.0"),
    ({"image_size": 64}, r"image_size=64 in 8-px patches makes 64 patches, but the position table has 16"),
    ({"patch_size": 4}, r"not 3 channels of 4x4 patches"),
    ({"emb_dropout": 2}, r"emb_dropout must be a number in \[0, 1\)"),
])
def test_a_config_json_the_weights_contradict_is_refused_naming_the_value(tmp_path, change, message):
    arguments = VIT_CASES["cls-dim_head"]
    path = save(tmp_path, vit_pytorch.ViT(**arguments), {**arguments, **change})
    with pytest.raises(SourceError, match=message) as error:
        open_source(path)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("case", ["cls-dim_head", "one-channel"])
def test_vit_for_small_datasets_opens_exactly_with_its_shifted_patches_and_locality_attention(tmp_path, case):
    """Lee et al. 2021's levers as vit-pytorch writes them: shifted patch tokens and locality self-attention."""
    from vit_pytorch.vit_for_small_dataset import ViT as SmallViT

    arguments = dict(image_size=32, patch_size=8, num_classes=10, dim=32, depth=2, heads=4, mlp_dim=48, dim_head=16,
                     pool="cls")  # its mean pooling keeps a class token too, so the weights cannot tell
    if case == "one-channel":
        arguments.update(image_size=28, patch_size=4, channels=1, heads=2)
    model = randomize(SmallViT(**arguments))
    with torch.no_grad():  # temperatures apart per layer, so a layer's own is the one read
        for i, layer in enumerate(model.transformer.layers):
            layer[0].temperature.add_(0.3 * i)
    path = save(tmp_path, model, arguments)
    side, channels = arguments["image_size"], arguments.get("channels", 3)
    images = torch.randn(2, channels, side, side)
    with torch.no_grad():
        checkpoint = open_source(path)
        logits, attentions = simple_vit_attentions(model, images)
        ours = checkpoint.model(images, output_attentions=True)
        assert_same(ours, logits, attentions)
        torch.testing.assert_close(checkpoint.model(images)[0], logits, rtol=0, atol=1e-5)  # the fused path too
    config = checkpoint.config
    assert (config.patch_shift, config.attention, config.patch_norm) == ("cardinal", "lsa_temperature", False)
    assert ours[1][0].diagonal(dim1=-2, dim2=-1).abs().max() == 0  # no token attends to itself


def test_other_vit_pytorch_variants_are_refused_naming_what_they_are(tmp_path):
    from vit_pytorch.deepvit import DeepViT
    from vit_pytorch.simple_vit_with_value_residual import SimpleViT as ValueResidualViT

    arguments = dict(image_size=32, patch_size=8, num_classes=10, dim=32, depth=2, heads=4, mlp_dim=48)
    path = save(tmp_path, DeepViT(**arguments), arguments)
    with pytest.raises(SourceError, match=r"reattn_weights is in no vit-pytorch ViT or SimpleViT: these weights are "
                                          r"DeepViT .*does not open") as error:
        open_source(path)
    assert "pool" not in str(error.value)
    path = save(tmp_path, ValueResidualViT(**arguments), arguments)
    with pytest.raises(SourceError, match=r"transformer\.layers\.0\.1\.0\.weight is in no vit-pytorch ViT or "
                                          r"SimpleViT: these weights are another vit-pytorch model"):
        open_source(path)


def test_fine_tuning_a_rectangular_model_is_refused_in_one_line(tmp_path):
    from vit.training.finetune import prepare_init

    arguments = NON_SQUARE["both"]
    save(tmp_path, vit_pytorch.ViT(**arguments), arguments)
    with pytest.raises(ValueError, match=r"rectangular patches or images \(image_size \(16, 64\), patch_size "
                                         r"\(2, 8\)\); training starts only from square ones") as error:
        prepare_init(str(tmp_path), num_classes=10)
    assert "\n" not in str(error.value)


def test_chefers_lrp_opens_on_a_model_whose_heads_are_not_dim_wide(tmp_path):
    """Its numbers are checked against the authors' code in test_relevance (their ViT has no patch norms)."""
    from vit.explain.methods.relevance import transformer_attribution

    arguments = dict(image_size=32, patch_size=4, num_classes=10, dim=64, depth=2, heads=4, mlp_dim=128, dim_head=32)
    checkpoint = open_source(save(tmp_path, randomize(vit_pytorch.ViT(**arguments)), arguments))
    relevance = transformer_attribution(checkpoint.model, torch.randn(1, 3, 32, 32), 3)  # a shape error before
    assert relevance.shape == (1, 65, 65) and relevance.isfinite().all()
