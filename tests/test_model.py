"""The ViT model: config validation, presets, the attention contract, both attention paths, other input sizes."""

import math

import pytest
import torch
import torch.nn.functional as F

from vit.model import PRESETS, ViT, ViTConfig, count_parameters, resample_pos_embed
from vit.model.vision_transformer import patchify

SMALL = dict(image_size=32, patch_size=4, num_channels=3, num_classes=10, hidden_size=48, num_layers=4,
             num_heads=4, mlp_size=192)


@pytest.fixture
def model() -> ViT:
    torch.manual_seed(0)
    return ViT(ViTConfig(**SMALL)).eval()


def reference_forward(model: ViT, images: torch.Tensor) -> torch.Tensor:
    """The ViT paper's equations (1)-(4) written out from the model's weights, at the training size."""
    c = model.config
    B, nh, d = images.shape[0], c.num_heads, c.hidden_size
    hd = d // nh
    x = model.patch_embed(images).flatten(2).transpose(1, 2)  # (B, N, D)
    x = torch.cat([model.cls_token.expand(B, 1, d), x], dim=1) + model.pos_embed  # (B, T, D)
    for block in model.blocks:
        h = F.layer_norm(x, (d,), block.norm1.weight, block.norm1.bias, c.layer_norm_eps)
        q, k, v = F.linear(h, block.attn.qkv.weight, block.attn.qkv.bias).split(d, dim=-1)  # each (B, T, D)
        q, k, v = (t.reshape(B, -1, nh, hd).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hd)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), dim=-1)  # (B, nh, T, T)
        y = (a @ v).transpose(1, 2).reshape(B, -1, d)  # (B, T, D)
        x = x + block.attn.proj(y)
        h = F.layer_norm(x, (d,), block.norm2.weight, block.norm2.bias, c.layer_norm_eps)
        x = x + block.mlp.fc2(F.gelu(block.mlp.fc1(h)))
    x = F.layer_norm(x, (d,), model.norm.weight, model.norm.bias, c.layer_norm_eps)
    return model.head(x[:, 0])  # (B, classes)


# --- config validation ------------------------------------------------------------------------

def test_config_rejects_hidden_size_not_divisible_by_heads():
    with pytest.raises(ValueError, match=r"hidden_size \(50\) must be divisible by num_heads \(4\)"):
        ViTConfig(**{**SMALL, "hidden_size": 50})


def test_config_rejects_image_not_divisible_by_patch():
    with pytest.raises(ValueError, match=r"image_size \(30\) must be divisible by patch_size \(4\)"):
        ViTConfig(**{**SMALL, "image_size": 30})


@pytest.mark.parametrize("name", ["image_size", "patch_size", "num_channels", "hidden_size",
                                  "num_layers", "num_heads", "mlp_size"])
@pytest.mark.parametrize("value", [0, -4, 2.5, True])
def test_config_rejects_non_positive_or_non_integer_sizes(name, value):
    with pytest.raises(ValueError, match=f"{name} must be a positive integer"):
        ViTConfig(**{**SMALL, name: value})


def test_config_sides_are_an_int_for_a_square_and_a_height_width_pair_otherwise():
    square = ViTConfig(**{**SMALL, "image_size": [32, 32], "patch_size": (4, 4)})  # a JSON list, a square pair
    assert (square.image_size, square.patch_size) == (32, 4) and square == ViTConfig(**SMALL)
    rect = ViTConfig(**{**SMALL, "image_size": [16, 64], "patch_size": [2, 8]})
    assert (rect.image_size, rect.patch_size, rect.image_hw, rect.patch_hw) == ((16, 64), (2, 8), (16, 64), (2, 8))
    assert (rect.grid_size, rect.num_patches) == ((8, 8), 64)
    assert ViTConfig.from_dict(rect.to_dict()) == rect


@pytest.mark.parametrize(("sides", "message"), [
    ({"image_size": (16, 60), "patch_size": (2, 8)}, r"image_size \(\(16, 60\)\) must be divisible by patch_size"),
    ({"patch_size": (2, 8, 1)}, r"patch_size must be a positive integer or a \(height, width\) pair"),
    ({"patch_size": (2, 0)}, r"patch_size must be a positive integer or a \(height, width\) pair"),
    ({"image_size": (16, 10**6), "patch_size": (2, 8)}, r"image_size is \[16, 1000000\]; at most 8,192"),
])
def test_config_refuses_bad_pairs_naming_the_field(sides, message):
    with pytest.raises(ValueError, match=message):
        ViTConfig(**{**SMALL, **sides})


def test_rectangular_patches_embed_as_a_convolution_with_that_kernel():
    """The patch embedding of (2, 8) patches is F.conv2d with a (2, 8) kernel and stride, and each input row of
    ph x pw pixels becomes one token: a hand-built reference on the same weights."""
    config = ViTConfig(**{**SMALL, "image_size": (8, 32), "patch_size": (2, 8)})
    model = ViT(config).eval()
    images = torch.randn(2, 3, 8, 32)
    with torch.no_grad():
        tokens = model.embed(images)[:, 1:] - model.pos_embed[:, 1:]  # (B, 16, D): the patches alone
        patches = images.unfold(2, 2, 2).unfold(3, 8, 8)  # (B, C, 4, 4, 2, 8)
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(2, 16, 3 * 2 * 8)  # row-major patches, (c, y, x) each
        expected = patches @ model.patch_embed.weight.reshape(config.hidden_size, -1).T + model.patch_embed.bias
    torch.testing.assert_close(tokens, expected, rtol=1e-5, atol=1e-5)
    assert model.patch_grid(8, 32) == (4, 4)
    with pytest.raises(ValueError, match="multiple of 2 px in height and 8 in width"):
        model.patch_grid(8, 30)


@pytest.mark.parametrize("name", ["num_classes", "num_register_tokens"])
@pytest.mark.parametrize("value", [-1, 2.5, True])
def test_config_rejects_negative_or_non_integer_counts(name, value):
    with pytest.raises(ValueError, match=f"{name} must be a whole number of at least 0"):
        ViTConfig(**{**SMALL, name: value})


def test_a_model_without_classes_has_no_head_and_returns_no_logits_but_every_attention():
    model = ViT(ViTConfig(**{**SMALL, "num_classes": 0})).eval()
    assert model.head is None and not any(k.startswith("head") for k in model.state_dict())
    logits, attentions = model(torch.randn(2, 3, 32, 32), output_attentions=True)
    assert logits is None and len(attentions) == SMALL["num_layers"]


def test_prefix_tokens_are_cls_dist_then_registers_and_only_positioned_ones_have_table_entries():
    config = ViTConfig(**{**SMALL, "distillation_token": True, "num_register_tokens": 3, "prefix_positions": "cls"})
    model = ViT(config)
    assert model.num_prefix_tokens == config.num_prefix_tokens == 5
    assert model.pos_embed.shape == (1, 1 + 64, SMALL["hidden_size"])
    _, attentions = model.eval()(torch.randn(1, 3, 32, 32), output_attentions=True)
    assert attentions[0].shape[-1] == 5 + 64


def test_default_config_keeps_the_original_state_dict_keys():
    keys = set(ViT(ViTConfig(**SMALL)).state_dict())
    assert not any(k.split(".")[0] in ("dist_token", "reg_token", "fc_norm", "head_dist") for k in keys)
    assert not any(".ls1" in k or ".ls2" in k for k in keys)


@pytest.mark.parametrize("name", ["dropout", "attention_dropout", "drop_path"])
@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5])
def test_config_rejects_rates_outside_zero_one(name, value):
    with pytest.raises(ValueError, match=rf"{name} must be in \[0, 1\)"):
        ViTConfig(**{**SMALL, name: value})


def test_config_rejects_bad_eps_and_qkv_bias():
    with pytest.raises(ValueError, match="layer_norm_eps must be positive"):
        ViTConfig(layer_norm_eps=0.0)
    with pytest.raises(ValueError, match="qkv_bias must be true or false"):
        ViTConfig(qkv_bias=1)


def test_config_from_dict_names_unknown_fields_and_round_trips():
    config = ViTConfig(**SMALL)
    assert ViTConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="unknown ViTConfig field.*depth"):
        ViTConfig.from_dict({**config.to_dict(), "depth": 3})


# --- presets ----------------------------------------------------------------------------------

PAPER = {  # image, channels, patch, hidden, layers, heads, MLP, dropout, classes
    "tintn-cifar10": (32, 3, 4, 48, 4, 4, 192, 0.0, 10),
    "cifar10-p8": (32, 3, 8, 64, 4, 4, 256, 0.1, 10),
    "mnist-p7": (28, 1, 7, 64, 3, 8, 2048, 0.0, 10),
    "vit-base-16": (224, 3, 16, 768, 12, 12, 3072, 0.0, 1000),
    "vit-large-16": (224, 3, 16, 1024, 24, 16, 4096, 0.0, 1000),
    "vit-huge-14": (224, 3, 14, 1280, 32, 16, 5120, 0.0, 1000),
}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_preset_has_the_published_numbers(name):
    c = ViTConfig.from_preset(name)
    assert (c.image_size, c.num_channels, c.patch_size, c.hidden_size, c.num_layers, c.num_heads, c.mlp_size,
            c.dropout, c.num_classes) == PAPER[name]
    assert c.qkv_bias


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_a_valid_config(name):
    c = ViTConfig.from_preset(name)
    assert c == PRESETS[name]
    assert c.num_patches == (c.image_size // c.patch_size) ** 2


def test_tintn_preset_is_the_seed_model_exactly():
    c = ViTConfig.from_preset("tintn-cifar10")
    assert (c.dropout, c.attention_dropout, c.drop_path) == (0.0, 0.0, 0.0)
    assert count_parameters(ViT(c)) == 119_194  # the seed blog's "0.12 M parameters"


@pytest.mark.parametrize("name, count", [("vit-base-16", 86_567_656), ("vit-large-16", 304_326_632),
                                         ("vit-huge-14", 632_045_800)])
def test_paper_models_have_their_parameter_counts(name, count):
    with torch.device("meta"):  # shapes only, no memory: huge has 632 M parameters
        model = ViT(ViTConfig.from_preset(name))
    assert count_parameters(model) == count  # timm's vit_{base,large}_patch16_224, vit_huge_patch14_224


def test_from_preset_applies_overrides_and_rejects_unknown_names():
    assert ViTConfig.from_preset("tintn-cifar10", num_classes=100).num_classes == 100
    with pytest.raises(ValueError, match="unknown preset 'vit-tiny'; choose one of: tintn-cifar10"):
        ViTConfig.from_preset("vit-tiny")


@pytest.mark.parametrize("name", ["tintn-cifar10", "cifar10-p8", "mnist-p7", "cifar-s"])
def test_small_presets_run_forward(name):
    torch.manual_seed(0)
    c = ViTConfig.from_preset(name)
    model = ViT(c).eval()
    logits, attentions = model(torch.randn(2, c.num_channels, c.image_size, c.image_size), output_attentions=True)
    assert logits.shape == (2, c.num_classes)
    assert len(attentions) == c.num_layers
    assert attentions[0].shape == (2, c.num_heads, c.num_patches + 1, c.num_patches + 1)


# --- the attention contract -------------------------------------------------------------------

def test_attentions_are_none_unless_asked(model):
    logits, attentions = model(torch.randn(2, 3, 32, 32))
    assert logits.shape == (2, 10)
    assert attentions is None


@pytest.mark.parametrize("batch", [1, 3])
def test_attentions_are_one_row_stochastic_tensor_per_layer(model, batch):
    _, attentions = model(torch.randn(batch, 3, 32, 32), output_attentions=True)
    assert isinstance(attentions, tuple) and len(attentions) == 4
    for attn in attentions:
        assert attn.shape == (batch, 4, 65, 65)
        assert (attn >= 0).all()
        torch.testing.assert_close(attn.sum(dim=-1), torch.ones(batch, 4, 65))


def test_fused_and_explicit_attention_paths_agree(model):
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        fused, _ = model(images, output_attentions=False)
        explicit, _ = model(images, output_attentions=True)
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 7, 64])  # chunks of queries that do not divide the 65 tokens, and one query
def test_fused_attention_in_query_chunks_agrees_with_the_explicit_path(model, monkeypatch, rows):
    import vit.model

    images = torch.randn(2, 3, 32, 32)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counted(q, *args, **kwargs):
        calls.append(q.shape[2])
        return sdpa(q, *args, **kwargs)

    monkeypatch.setattr(vit.model.blocks.F, "scaled_dot_product_attention", counted)
    # B 2, 4 heads of 12, 65 keys
    monkeypatch.setattr(vit.model.blocks, "FUSED_CHUNK_FLOPS", rows * 4 * 2 * 4 * 65 * 12)
    with torch.no_grad():
        chunked, _ = model(images)
        explicit, _ = model(images, output_attentions=True)
    assert calls[:-(-65 // rows)] == [rows] * (65 // rows) + ([65 % rows] if 65 % rows else [])
    torch.testing.assert_close(chunked, explicit, rtol=0, atol=1e-5)


@pytest.mark.parametrize("batch", [1, 3])  # one bias for the batch (BEiT's table), or one per image
def test_fused_attention_in_query_chunks_adds_each_chunks_rows_of_the_bias(monkeypatch, batch):
    import vit.model

    torch.manual_seed(0)
    q, k, v = torch.randn(3, 3, 2, 9, 4).unbind(0)  # each (B 3, 2 heads, 9 tokens, 4)
    bias = torch.randn(batch, 2, 9, 9)
    whole = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    monkeypatch.setattr(vit.model.blocks, "FUSED_CHUNK_FLOPS", 2 * 4 * 3 * 2 * 9 * 4)  # two query rows a chunk
    torch.testing.assert_close(vit.model.fused_attention(q, k, v, bias=bias), whole, rtol=0, atol=1e-6)


def test_fused_and_explicit_paths_agree_with_dropout_in_eval_mode():
    torch.manual_seed(0)
    model = ViT(ViTConfig.from_preset("cifar10-p8", attention_dropout=0.2, drop_path=0.1)).eval()
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(images)[0], model(images, output_attentions=True)[0], rtol=0, atol=1e-5)


def test_model_matches_the_written_out_equations(model):
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(images, output_attentions=True)[0], reference_forward(model, images))


def test_gradients_flow_through_the_returned_attentions(model):
    _, attentions = model(torch.randn(2, 3, 32, 32), output_attentions=True)
    assert all(a.requires_grad for a in attentions)
    attentions[1][:, :, 0, 1:].pow(2).sum().backward()  # a loss on the layer-1 CLS map only
    assert model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    assert model.blocks[1].attn.qkv.weight.grad.abs().sum() > 0
    assert model.blocks[2].attn.qkv.weight.grad is None  # later layers do not shape layer 1
    assert model.head.weight.grad is None


def test_model_rejects_wrong_channels_and_sizes_that_do_not_tile(model):
    with pytest.raises(ValueError, match=r"expected images of shape \(batch, 3, height, width\)"):
        model(torch.randn(1, 1, 32, 32))
    with pytest.raises(ValueError, match="does not tile into 4x4 patches"):
        model(torch.randn(1, 3, 30, 32))


# --- other input sizes ------------------------------------------------------------------------

@pytest.mark.parametrize("height, width, grid", [(64, 64, (16, 16)), (48, 32, (12, 8)), (16, 40, (4, 10))])
def test_other_input_sizes_give_the_right_number_of_tokens(model, height, width, grid):
    assert model.patch_grid(height, width) == grid
    logits, attentions = model(torch.randn(2, 3, height, width), output_attentions=True)
    T = 1 + grid[0] * grid[1]
    assert logits.shape == (2, 10)
    assert all(a.shape == (2, 4, T, T) for a in attentions)
    with torch.no_grad():
        torch.testing.assert_close(model(torch.randn(1, 3, height, width))[0].shape, logits[:1].shape)


def test_training_size_input_is_not_interpolated(model):
    assert resample_pos_embed(model.pos_embed, (8, 8), (8, 8)) is model.pos_embed  # bit for bit, no resampling
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(images)[0], reference_forward(model, images), rtol=0, atol=1e-6)


def test_interpolation_keeps_the_cls_embedding_and_a_constant_grid():
    D = 6
    cls = torch.randn(1, 1, D)
    grid = torch.ones(1, 16, D) * torch.arange(D)  # the same vector at every patch of a 4x4 grid
    pos = torch.cat([cls, grid], dim=1)
    resized = resample_pos_embed(pos, (6, 2), (4, 4))
    assert resized.shape == (1, 1 + 12, D)
    assert torch.equal(resized[:, :1], cls)
    torch.testing.assert_close(resized[:, 1:], torch.ones(1, 12, D) * torch.arange(D))


def test_interpolation_keeps_all_prefix_tokens_and_matches_bicubic_resizing():
    D = 3
    pos = torch.randn(1, 2 + 4 * 4, D)
    resized = resample_pos_embed(pos, (8, 6), (4, 4), num_prefix_tokens=2)
    assert torch.equal(resized[:, :2], pos[:, :2])
    image = pos[:, 2:].reshape(1, 4, 4, D).permute(0, 3, 1, 2)  # (1, D, 4, 4)
    expected = F.interpolate(image, size=(8, 6), mode="bicubic", align_corners=False)
    torch.testing.assert_close(resized[:, 2:], expected.permute(0, 2, 3, 1).reshape(1, 48, D))


# --- hook points ------------------------------------------------------------------------------

def test_hook_points_hold_the_pieces_of_the_written_out_equations_on_a_non_square_input(model):
    x = torch.randn(2, 3, 24, 36, generator=torch.Generator().manual_seed(3))  # a 6 x 9 grid
    wanted = ("blocks.1.", "blocks.3.hook_resid_post", "hook_")
    enc, cache = model.run_with_cache(x, lambda name: name.startswith(wanted))
    logits, attentions = model(x, output_attentions=True)
    torch.testing.assert_close(enc.logits, logits, rtol=0, atol=1e-5)
    c, block = model.config, model.blocks[1]
    d, nh = c.hidden_size, c.num_heads
    hd = d // nh
    resid = cache["blocks.1.hook_resid_pre"]
    h = F.layer_norm(resid, (d,), block.norm1.weight, block.norm1.bias, c.layer_norm_eps)
    torch.testing.assert_close(cache["blocks.1.hook_attn_in"], h)
    q, k, v = F.linear(h, block.attn.qkv.weight, block.attn.qkv.bias).split(d, dim=-1)  # each (B, T, D)
    q, k, v = (t.reshape(2, -1, nh, hd).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hd)
    for name, expected in (("q", q), ("k", k), ("v", v)):
        torch.testing.assert_close(cache[f"blocks.1.attn.hook_{name}"], expected)
    a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), dim=-1)  # (B, nh, T, T)
    torch.testing.assert_close(cache["blocks.1.attn.hook_pattern"], a)
    torch.testing.assert_close(cache["blocks.1.attn.hook_pattern"], attentions[1])
    torch.testing.assert_close(cache["blocks.1.attn.hook_z"], (a @ v).transpose(1, 2))  # (B, T, nh, hd)
    attn_out = block.attn.proj((a @ v).transpose(1, 2).reshape(2, -1, d))
    torch.testing.assert_close(cache["blocks.1.hook_attn_out"], attn_out)
    mid = resid + attn_out
    torch.testing.assert_close(cache["blocks.1.hook_resid_mid"], mid)
    pre = block.mlp.fc1(F.layer_norm(mid, (d,), block.norm2.weight, block.norm2.bias, c.layer_norm_eps))
    torch.testing.assert_close(cache["blocks.1.mlp.hook_pre"], pre)
    torch.testing.assert_close(cache["blocks.1.mlp.hook_post"], F.gelu(pre))
    torch.testing.assert_close(cache["blocks.1.hook_resid_post"], mid + block.mlp.fc2(F.gelu(pre)))
    normed = F.layer_norm(cache["blocks.3.hook_resid_post"], (d,), model.norm.weight, model.norm.bias,
                          c.layer_norm_eps)
    torch.testing.assert_close(cache["hook_normed"], normed)
    torch.testing.assert_close(cache["hook_pooled"], normed[:, 0])
    torch.testing.assert_close(cache["hook_logits"], model.head(normed[:, 0]))


def test_replacing_a_heads_context_is_zeroing_its_columns_of_the_projection(model):
    x = torch.randn(2, 3, 32, 32)

    def drop_head_2(z, hook):
        z = z.clone()
        z[:, :, 2] = 0  # (B, T, nh, hd)
        return z

    hooked = model.run_with_hooks(x, [("blocks.0.attn.hook_z", drop_head_2)]).logits
    torch.manual_seed(0)
    edited = ViT(model.config).eval()
    edited.load_state_dict(model.state_dict())
    with torch.no_grad():
        edited.blocks[0].attn.proj.weight[:, 24:36] = 0  # head 2's 12 input columns
    torch.testing.assert_close(hooked, edited(x)[0], rtol=0, atol=1e-6)
    assert not torch.allclose(hooked, model(x)[0])


def test_hooks_last_only_for_their_block_and_unknown_names_are_refused(model):
    x = torch.randn(1, 3, 32, 32)
    before = model(x)[0]
    with model.hooks([("blocks.3.hook_resid_post", lambda t, hook: t * 0)]):
        assert torch.equal(model(x)[0], model.head(model.norm.bias.expand(1, -1)))  # norm of zeros: its bias
        assert model.blocks[3].hook_resid_post.fns
    assert not model.blocks[3].hook_resid_post.fns
    assert torch.equal(model(x)[0], before)
    with pytest.raises(ValueError, match="no hook point 'blocks.9.hook_resid_post'"):
        model.run_with_hooks(x, [("blocks.9.hook_resid_post", lambda t, hook: None)])


def test_submodules_read_back_as_last_assigned_or_deleted(model):
    """Children are also kept as plain attributes (a speed-up); that copy must follow nn.Module's record."""
    x = torch.randn(1, 3, 32, 32)
    head = torch.nn.Linear(48, 3)
    model.head = head
    assert model.head is head and model._modules["head"] is head and model(x)[0].shape == (1, 3)
    model.head = None
    assert model.head is None and model(x)[0] is None
    proj = model.blocks[0].attn.proj
    del model.blocks[0].attn.proj
    with pytest.raises(AttributeError):
        assert model.blocks[0].attn.proj is None  # never reached
    model.blocks[0].attn.add_module("proj", proj)
    assert model.blocks[0].attn.proj is proj


def test_hooks_and_rules_apply_in_their_own_thread_only(model):
    import threading

    from vit.model import Rules, current_rules, use_rules

    x = torch.randn(1, 3, 32, 32)
    before, seen = model(x)[0], {}

    def elsewhere():  # another session's page, running while this one has hooks and rules set
        seen["logits"], seen["rules"] = model(x)[0], current_rules()

    rules = Rules()
    with model.hooks([("hook_logits", lambda t, hook: t * 0)]), use_rules(rules):
        assert not model(x)[0].any() and current_rules() is rules
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
    assert torch.equal(seen["logits"], before) and seen["rules"] is not rules


# --- the MLP's activation in place -----------------------------------------------------------------

TORCH_ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
                     "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x), "relu": F.relu, "silu": F.silu}


class _NewHidden(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the new (B, T, mlp) tensors the operations under it allocate (an in-place one writes over its input)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width, self.count = width, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        if isinstance(out, torch.Tensor) and out.shape[-1] == self.width and out.untyped_storage().data_ptr() \
                not in inputs:
            self.count += 1
        return out


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu", "silu"])
def test_an_inference_mlp_holds_one_hidden_tensor_not_two(activation):
    """Without gradients or a hook on fc1's output, the activation is written over it (one (B, T, mlp) tensor where
    there were two: PE core's forward, 2.4 MB a block, faulted in anew from the kernel each time); the values are
    torch's own activation's."""
    torch.manual_seed(0)
    mlp = ViT(ViTConfig(**SMALL, activation=activation)).blocks[0].mlp.eval()
    x = torch.randn(2, 65, SMALL["hidden_size"])
    counter = _NewHidden(SMALL["mlp_size"])
    with torch.inference_mode(), counter:
        out = mlp(x)
    assert counter.count == 1
    torch.testing.assert_close(out, mlp.fc2(TORCH_ACTIVATIONS[activation](mlp.fc1(x))), rtol=0, atol=0)


@pytest.mark.parametrize("activation", list(TORCH_ACTIVATIONS))
def test_the_in_place_activation_leaves_a_cached_pre_activation_and_gradients_as_they_were(activation):
    """A hook that keeps fc1's output (run_with_cache) and autograd, which saves it for the backward, each still
    read fc1's output itself, not the activation written over it."""
    torch.manual_seed(0)
    model = ViT(ViTConfig(**SMALL, activation=activation)).eval()
    names = ["blocks.1.hook_mlp_in", "blocks.1.mlp.hook_pre", "blocks.1.mlp.hook_post"]
    mlp, act = model.blocks[1].mlp, TORCH_ACTIVATIONS[activation]
    with torch.inference_mode():
        _, cache = model.run_with_cache(torch.randn(2, 3, 32, 32), names)
        torch.testing.assert_close(cache["blocks.1.mlp.hook_pre"], mlp.fc1(cache["blocks.1.hook_mlp_in"]))
        torch.testing.assert_close(cache["blocks.1.mlp.hook_post"], act(cache["blocks.1.mlp.hook_pre"]))
    x = torch.randn(2, 65, SMALL["hidden_size"], requires_grad=True)
    reference = x.detach().clone().requires_grad_(True)
    mlp(x).square().sum().backward()
    mlp.fc2(act(mlp.fc1(reference))).square().sum().backward()
    torch.testing.assert_close(x.grad, reference.grad)


class _Products(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the matrix products the operations under it run."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket.__name__ in ("linear", "addmm", "mm", "bmm", "matmul")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("width, key_bias", [(96, True), (768, True), (768, False)])
def test_q_k_and_v_are_one_product_at_any_width(width, key_bias):
    """One product of the whole qkv weight, as timm's: three of its thirds (ours from 384 channels up) were no faster
    at one thread and cost 1.5-2x its CPU time at two (bench/bench_families.py). DINOv3's key has no bias."""
    from vit.model import Attention

    torch.manual_seed(0)
    attn = Attention(ViTConfig(**{**SMALL, "hidden_size": width, "mlp_size": 4 * width, "key_bias": key_bias}))
    torch.nn.init.normal_(attn.qkv.bias)
    x = torch.randn(2, 65, width)
    counter = _Products()
    with torch.no_grad(), counter:
        q, k, v = attn.queries_keys_values(x)
    assert counter.count == 1
    bias = attn.qkv.bias.detach().clone()
    if not key_bias:
        bias[width:2 * width] = 0
    expected = F.linear(x, attn.qkv.weight, bias).reshape(2, 65, 3, 4, width // 4).permute(2, 0, 3, 1, 4)
    for ours, theirs in zip((q, k, v), expected, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize("kernel, shape", [((14, 14), (2, 3, 42, 28)), ((16, 8), (1, 3, 32, 24)),
                                           ((2, 14, 14), (1, 3, 4, 28, 42))])
def test_patchify_then_linear_is_the_convolution_whose_stride_is_its_kernel(kernel, shape):
    torch.manual_seed(0)  # float64: the patches are a rearrangement, so only the sums' order may differ
    pixels, weight = torch.randn(shape, dtype=torch.float64), torch.randn(7, shape[1], *kernel, dtype=torch.float64)
    bias = torch.randn(7, dtype=torch.float64)
    conv = F.conv3d if len(kernel) == 3 else F.conv2d
    expected = conv(pixels, weight, bias, stride=kernel).flatten(2).transpose(1, 2)  # (B, N, 7), row-major
    ours = F.linear(patchify(pixels, kernel), weight.flatten(1), bias)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-10)
