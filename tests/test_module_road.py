"""``vit.load(module, ...)``: a model in the user's hands opens as it is, its attention recorded where it is computed
(``vit.sources.library_road.module_road``). References: the authors' DINOv2 (tests/reference/dinov2, their code
unchanged) with each layer's probabilities from its own q and k, open_clip's ``VisionTransformer`` with each
``nn.MultiheadAttention``'s own per-head weights, the modules' own outputs."""

import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from test_attention_recorder import authors_dinov2, own_probabilities

import vit
from vit.checkpoint import CheckpointError

IMAGENET = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}


def picture(height: int = 21, width: int = 35, seed: int = 0) -> Image.Image:
    """An image at the model's own input size (no crop: the model sees all of it)."""
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def seen_inputs(model: torch.nn.Module, attentions: list[torch.nn.Module]) -> tuple[dict, list]:
    """Forward pre-hooks that keep what the model and each attention module were given."""
    kept = {"model": [], "attention": {}}
    handles = [model.register_forward_pre_hook(lambda m, a: kept["model"].append(a[0].detach()))]
    for i, attention in enumerate(attentions):
        handles.append(attention.register_forward_pre_hook(
            lambda m, a, i=i: kept["attention"].__setitem__(i, a[0].detach())))
    return kept, handles


class FineTune(torch.nn.Module):
    """A user's fine-tune: the authors' DINOv2 backbone and a linear head, in a class of the user's own."""

    def __init__(self, backbone: torch.nn.Module, classes: int = 5):
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(backbone.embed_dim, classes)

    def forward(self, x):
        return self.head(self.backbone(x))


def test_the_authors_dinov2_with_registers_opens_and_every_layer_is_its_own_attention_on_the_grid():
    model = authors_dinov2()
    checkpoint = vit.load(model, image_size=(21, 35), **IMAGENET)
    layout = checkpoint.model.layout
    assert (layout.num_prefix_tokens, layout.grid, checkpoint.road) == (3, (3, 5), "library")  # CLS + 2 registers
    assert checkpoint.metadata["layers"] == ["blocks.0.0.attn", "blocks.0.1.attn", "blocks.0.2.attn"]
    attentions = [block.attn for block in model.blocks[0]]
    for layer in range(3):
        kept, handles = seen_inputs(model, attentions)
        try:
            explanation = vit.explain(checkpoint, picture(), "attention", layer=layer)
        finally:
            for h in handles:
                h.remove()
        with torch.no_grad():
            own = own_probabilities(attentions[layer], kept["attention"][layer])  # (1, H, 18, 18)
        cls_row = own[0, :, 0, 3:]  # CLS's row, the CLS and register keys dropped: (H, 15)
        assert np.allclose(explanation.heads, cls_row.reshape(4, 3, 5).numpy(), atol=1e-5)
        # the same numbers placed column-major (a transposed grid) are not what it draws
        assert not np.allclose(explanation.heads, cls_row.reshape(4, 5, 3).transpose(1, 2).numpy(), atol=1e-3)
        _, whole = checkpoint.model.run(kept["model"][0], layers=[layer])
        assert torch.allclose(whole[layer], own, atol=1e-5)  # every row, every head


def test_its_features_are_the_last_blocks_tokens_and_a_recording_changes_nothing():
    model = authors_dinov2()
    checkpoint = vit.load(model, image_size=(21, 35), **IMAGENET)
    pixels = torch.randn(2, 3, 21, 35)
    with torch.no_grad():
        expected = model.forward_features(pixels)["x_prenorm"]  # the authors' last block's output, before the norm
        own = model(pixels)
    assert torch.allclose(checkpoint.model(pixels), expected, atol=1e-5)
    checkpoint.model.run(pixels, layers=[0, 1, 2])
    with torch.no_grad():
        assert torch.equal(model(pixels), own)


def test_a_fine_tune_in_a_users_class_is_a_classifier_whose_class_map_explains_its_argmax():
    torch.manual_seed(5)
    fine_tune = FineTune(authors_dinov2()).eval()
    checkpoint = vit.load(fine_tune, image_size=(21, 35), **IMAGENET)
    assert checkpoint.model.is_classifier and len(checkpoint.class_names) == 5
    kept, handles = seen_inputs(fine_tune, [])
    try:
        explanation = vit.explain(checkpoint, picture(seed=1), "class")
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad():
        logits = fine_tune(kept["model"][0])
    argmax = int(logits.argmax(-1))
    assert explanation.target == checkpoint.class_names[argmax]
    assert explanation.prediction.class_index == argmax
    assert np.allclose(explanation.prediction.logits, logits[0].numpy(), atol=1e-5)  # the module's own logits
    asked = vit.explain(checkpoint, picture(seed=1), "class", target=argmax)
    other = vit.explain(checkpoint, picture(seed=1), "class", target=(argmax + 1) % 5)
    assert explanation.map.shape == (3, 5) and np.array_equal(explanation.map, asked.map)
    assert not np.allclose(explanation.map, other.map)  # the map is the argmax's, not any class's


def test_open_clips_vision_transformer_object_opens_each_layer_its_multihead_attentions_own_weights():
    from open_clip.transformer import VisionTransformer

    torch.manual_seed(6)
    tower = VisionTransformer(image_size=(28, 42), patch_size=14, width=32, layers=2, heads=4, mlp_ratio=2,
                              output_dim=16).eval()
    checkpoint = vit.load(tower, **IMAGENET)  # its input size is its own
    assert (checkpoint.model.layout.num_prefix_tokens, checkpoint.model.layout.grid) == (1, (2, 3))
    attentions = [block.attn for block in tower.transformer.resblocks]
    pixels = torch.randn(1, 3, 28, 42)
    kept, handles = seen_inputs(tower, attentions)
    try:
        _, recorded = checkpoint.model.run(pixels, layers=[0, 1])
    finally:
        for h in handles:
            h.remove()
    for layer, attention in enumerate(attentions):
        x = kept["attention"][layer]
        with torch.no_grad():
            _, own = attention(x, x, x, need_weights=True, average_attn_weights=False)
        assert torch.allclose(recorded[layer], own, atol=1e-5)


def test_a_timm_model_object_goes_timms_road():
    import timm

    from vit.sources.library_road.timm_models import TimmLibraryModel

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=(32, 48), depth=2, num_classes=3)
    checkpoint = vit.load(model)
    assert isinstance(checkpoint.model, TimmLibraryModel) and checkpoint.model.model is model
    assert checkpoint.model.layout.grid == (2, 3) and len(checkpoint.class_names) == 3
    pixels = torch.randn(1, 3, 32, 48)
    _, first = checkpoint.model.run(pixels, layers=[1])
    again = vit.load(model)  # a notebook's cell run twice: the same object opens again, the same numbers
    _, second = again.model.run(pixels, layers=[1])
    assert torch.equal(first[1], second[1])


class Leftover(torch.nn.Module):
    """A module that lies: one CLS parameter, but a second token it forms after the patches."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Conv2d(3, 8, 4, 4)
        self.cls_token = torch.nn.Parameter(torch.zeros(1, 1, 8))
        self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        x = self.proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x, x.mean(1, keepdim=True)], 1)
        return self.attn(x, x, x, need_weights=False)[0]


class Pooling(torch.nn.Module):
    """A module whose tokens change between its layers (half the tokens pooled away after the first)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Conv2d(3, 8, 4, 4)
        self.blocks = torch.nn.ModuleList(torch.nn.MultiheadAttention(8, 2, batch_first=True) for _ in range(2))

    def forward(self, x):
        x = self.proj(x).flatten(2).transpose(1, 2)
        x = self.blocks[0](x, x, x, need_weights=False)[0]
        x = x[:, ::2]
        return self.blocks[1](x, x, x, need_weights=False)[0]


@pytest.mark.parametrize(("module", "keywords", "says"), [
    (Leftover, {}, r"8 tokens, 2x3 patches and 2 more, and its token parameters \(cls_token\) account for 1"),
    (Leftover, {"prefix": 1}, r"not prefix=1; 1 token\(s\) would be left unplaced"),
    (Pooling, {}, r"its pooled stages \(layer 1, blocks\.1"),
    (Leftover, {"image_size": (100_000, 100_000)}, r"image_size .* is not a side"),
    (Leftover, {"mean": None}, r"declares no normalisation: give mean= and std="),
])
def test_a_module_that_lies_or_says_too_little_is_refused_in_one_line(module, keywords, says):
    given = {"image_size": (8, 12), **IMAGENET, **keywords}
    with pytest.raises(CheckpointError, match=says) as refused:
        vit.load(module().eval(), **given)
    assert "\n" not in str(refused.value)


def test_a_grid_overrides_where_no_patch_embedding_is_found():
    class Unfolded(torch.nn.Module):  # patches by reshape alone: no convolution or unfold to read a patch from
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Linear(48, 8)
            self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            B = x.shape[0]
            x = x.reshape(B, 3, 2, 4, 3, 4).permute(0, 2, 4, 1, 3, 5).reshape(B, 6, 48)
            x = self.embed(x)
            return self.attn(x, x, x, need_weights=False)[0]

    with pytest.raises(CheckpointError, match=r"no patch embedding found .*give grid=\(rows, cols\)"):
        vit.load(Unfolded().eval(), image_size=(8, 12), **IMAGENET)
    checkpoint = vit.load(Unfolded().eval(), image_size=(8, 12), grid=(2, 3), **IMAGENET)
    assert checkpoint.model.layout.grid == (2, 3) and checkpoint.model.layout.num_prefix_tokens == 0


def test_a_device_for_a_module_in_hand_is_refused_and_a_modules_keywords_for_a_path():
    with pytest.raises(TypeError, match=r"runs on its own device: move it first"):
        vit.load(authors_dinov2(), "cpu", image_size=(21, 35), **IMAGENET)
    with pytest.raises(TypeError, match=r"are for a module in hand"):
        vit.load("some/folder", image_size=(21, 35))


def test_nothing_of_a_module_is_pickled_or_written(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)

    def refuse(*args, **kwargs):
        raise AssertionError("a module in hand was pickled or saved")

    monkeypatch.setattr(torch, "save", refuse)
    monkeypatch.setattr(pickle, "dumps", refuse)
    monkeypatch.setattr(pickle, "dump", refuse)
    checkpoint = vit.load(authors_dinov2(), image_size=(21, 35), **IMAGENET)
    vit.explain(checkpoint, picture(), "rollout")
    assert list(tmp_path.iterdir()) == []


def test_a_transformers_model_object_goes_transformers_library_road_equal_to_its_eager_attention():
    import copy

    from transformers import ViTConfig, ViTForImageClassification

    from vit.sources.library_road.transformers_models import LibraryModel

    torch.manual_seed(7)
    config = ViTConfig(image_size=(32, 48), patch_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, num_labels=3)
    model = ViTForImageClassification(config).eval()
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    with pytest.raises(CheckpointError, match="declares no normalisation .*give mean= and std="):
        vit.load(model)
    checkpoint = vit.load(model, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))  # its size: its config's
    assert type(checkpoint.model) is LibraryModel and checkpoint.model.model is model
    assert checkpoint.model.layout.grid == (2, 3) and checkpoint.class_names == ["LABEL_0", "LABEL_1", "LABEL_2"]
    pixels = torch.randn(1, 3, 32, 48)
    out, kept = checkpoint.model.run(pixels, layers=[0, 1])
    with torch.no_grad():
        own = eager(pixel_values=pixels, output_attentions=True)
    assert torch.allclose(out.logits, own.logits, atol=1e-5)
    for layer in range(2):
        assert torch.allclose(kept[layer], own.attentions[layer], atol=1e-5)


def openai_clip_tower() -> torch.nn.Module:
    """A tiny random ``VisionTransformer`` of OpenAI's CLIP, built by their code (tests/reference/openai_clip)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent / "reference" / "openai_clip" / "model.py"
    spec = importlib.util.spec_from_file_location("openai_clip_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(8)
    return module.VisionTransformer(input_resolution=32, patch_size=8, width=32, layers=2, heads=4,
                                    output_dim=16).eval()


def test_openai_clips_vision_transformer_opens_each_layer_its_multihead_attentions_own_weights():
    tower = openai_clip_tower()
    checkpoint = vit.load(tower, **IMAGENET)  # its input_resolution: 32 px
    assert (checkpoint.model.layout.num_prefix_tokens, checkpoint.model.layout.grid) == (1, (4, 4))
    attentions = [block.attn for block in tower.transformer.resblocks]
    pixels = torch.randn(2, 3, 32, 32)
    kept, handles = seen_inputs(tower, attentions)
    try:
        out, recorded = checkpoint.model.run(pixels, layers=[0, 1])
    finally:
        for h in handles:
            h.remove()
    for layer, attention in enumerate(attentions):
        x = kept["attention"][layer]  # (tokens, batch, width), as their blocks run
        with torch.no_grad():
            _, own = attention(x, x, x, need_weights=True, average_attn_weights=False)
        assert torch.allclose(recorded[layer], own, atol=1e-5)
    assert out.last_hidden_state.shape == (2, 17, 32)  # their last block's tokens, batch first


def test_a_timm_vit_with_registers_in_a_users_class_is_recorded_at_its_fused_attention_as_its_explicit_path():
    import timm

    torch.manual_seed(9)
    backbone = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=(32, 48), depth=2,
                                 reg_tokens=2, num_classes=0)
    fine_tune = FineTune(backbone, classes=4).eval()  # timm's fused path (SDPA) runs
    checkpoint = vit.load(fine_tune, image_size=(32, 48), **IMAGENET)
    assert (checkpoint.model.layout.num_prefix_tokens, checkpoint.model.layout.grid) == (3, (2, 3))
    assert checkpoint.metadata["layers"] == ["backbone.blocks.0.attn", "backbone.blocks.1.attn"]
    pixels = torch.randn(1, 3, 32, 48)
    out, recorded = checkpoint.model.run(pixels, layers=[0, 1])
    own = {}
    for i, block in enumerate(backbone.blocks):
        block.attn.fused_attn = False  # timm's explicit path: its probabilities pass through attn_drop
        block.attn.attn_drop.register_forward_hook(lambda m, a, o, i=i: own.__setitem__(i, a[0]))
    with torch.no_grad():
        logits = fine_tune(pixels)
    assert torch.allclose(out.logits, logits, atol=1e-5)
    for layer in range(2):
        assert torch.allclose(recorded[layer], own[layer], atol=1e-5)


class ReadsAValue(torch.nn.Module):
    """A forward that reads a value (``.item()``), which the meta device cannot give."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Conv2d(3, 8, 4, 4)
        self.register_buffer("gain", torch.tensor(2.0))
        self.blocks = torch.nn.ModuleList([torch.nn.MultiheadAttention(8, 2, batch_first=True)])

    def forward(self, x):
        if x.shape[-1] != 12:
            raise RuntimeError(f"built for 12-px wide inputs, not {x.shape[-1]}\nsee its docs")
        x = self.proj(x).flatten(2).transpose(1, 2) * self.gain.item()
        return self.blocks[0](x, x, x, need_weights=False)[0]


def test_a_forward_that_reads_a_value_is_traced_on_one_real_image_and_one_that_fails_is_refused_in_one_line():
    checkpoint = vit.load(ReadsAValue().eval(), image_size=(8, 12), **IMAGENET)
    assert checkpoint.model.layout.grid == (2, 3) and checkpoint.model.layout.num_prefix_tokens == 0
    with pytest.raises(CheckpointError, match=r"its forward fails on one 8x16-px image, .*RuntimeError: built for"
                       ) as refused:
        vit.load(ReadsAValue().eval(), image_size=(8, 16), **IMAGENET)
    assert "\n" not in str(refused.value)


def test_a_huge_size_declared_in_a_wrapped_config_is_refused_before_anything_runs():
    from transformers import ViTConfig, ViTModel

    model = ViTModel(ViTConfig(image_size=32, patch_size=16, hidden_size=32, num_hidden_layers=1,
                               num_attention_heads=4, intermediate_size=64)).eval()
    model.config.image_size = 1_000_000  # what its config says, not what it was built for
    with pytest.raises(CheckpointError, match=r"image_size \(1000000, 1000000\) is not a side .* from 1 to 2048"):
        vit.load(model, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def authors_dinov3() -> tuple[torch.nn.Module, object]:
    """A tiny random DINOv3 with 2 storage tokens (registers) and RoPE, built by the authors' own code
    (tests/reference/dinotxt/dinov3, the copy dino.txt's tests run), and that code's module."""
    import importlib.util
    import sys
    from pathlib import Path

    root = Path(__file__).parent / "reference" / "dinotxt"
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    spec = importlib.util.spec_from_file_location("dinov3_vision_transformer",
                                                  root / "dinov3" / "models" / "vision_transformer.py")
    code = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(code)
    torch.manual_seed(10)
    model = code.DinoVisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, ffn_ratio=2,
                                       n_storage_tokens=2, layerscale_init=1.0, pos_embed_rope_dtype="fp32")
    model.init_weights()
    return model.eval(), code


def test_the_authors_dinov3_with_storage_tokens_and_rope_opens_every_layer_its_own_attention_on_the_grid():
    model, code = authors_dinov3()
    checkpoint = vit.load(model, image_size=(24, 40), **IMAGENET)  # 3 x 5 patches of 8 px
    assert (checkpoint.model.layout.num_prefix_tokens, checkpoint.model.layout.grid) == (3, (3, 5))
    qkv = {}
    for i, block in enumerate(model.blocks):
        block.attn.qkv.register_forward_hook(lambda m, a, o, i=i: qkv.__setitem__(i, o.detach()))
    pixels = torch.randn(1, 3, 24, 40)
    _, recorded = checkpoint.model.run(pixels, layers=[0, 1])
    rope = model.rope_embed(H=3, W=5)  # the sines and cosines its forward gives each block
    for layer, block in enumerate(model.blocks):
        attention = block.attn
        q, k, _ = [t.transpose(1, 2) for t in torch.unbind(qkv[layer].reshape(1, 18, 3, 4, 8), 2)]
        with torch.no_grad():
            q, k = attention.apply_rope(q, k, rope)  # their own rotation of the patches' q and k
            own = ((q @ k.transpose(-2, -1)) * 8 ** -0.5).softmax(-1)  # (1, H, 18, 18)
        assert torch.allclose(recorded[layer], own, atol=1e-5)
        assert not torch.allclose(recorded[layer][0, :, 0, 3:].reshape(4, 3, 5),
                                  own[0, :, 0, 3:].reshape(4, 5, 3).transpose(1, 2), atol=1e-3)


class EncoderViT(torch.nn.Module):
    """A user's ViT on ``nn.TransformerEncoder`` (its fused fast path in eval mode when nothing records)."""

    def __init__(self):
        super().__init__()
        self.patch = torch.nn.Conv2d(3, 16, 4, 4)
        self.cls_token = torch.nn.Parameter(torch.randn(1, 1, 16))
        self.pos = torch.nn.Parameter(torch.randn(1, 7, 16))
        layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], 1) + self.pos
        return self.head(self.encoder(x)[:, 0])


def test_a_vit_on_nn_transformer_encoder_opens_each_layer_its_self_attentions_own_weights():
    torch.manual_seed(11)
    model = EncoderViT().eval()
    checkpoint = vit.load(model, image_size=(8, 12), **IMAGENET)
    assert checkpoint.metadata["layers"] == ["encoder.layers.0.self_attn", "encoder.layers.1.self_attn"]
    assert checkpoint.model.is_classifier and checkpoint.model.layout.num_prefix_tokens == 1
    attentions = [layer.self_attn for layer in model.encoder.layers]
    pixels = torch.randn(2, 3, 8, 12)
    kept, handles = seen_inputs(model, attentions)
    try:
        out, recorded = checkpoint.model.run(pixels, layers=[0, 1])
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad():
        assert torch.allclose(out.logits, model(pixels), atol=1e-5)
        for layer, attention in enumerate(attentions):
            x = kept["attention"][layer]
            _, own = attention(x, x, x, need_weights=True, average_attn_weights=False)
            assert torch.allclose(recorded[layer], own, atol=1e-5)


class Changing(torch.nn.Module):
    """A module that lies: its second layer runs only for some inputs (a value of the input decides)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Conv2d(3, 8, 4, 4)
        self.blocks = torch.nn.ModuleList(torch.nn.MultiheadAttention(8, 2, batch_first=True) for _ in range(2))

    def forward(self, x):
        x = self.proj(x).flatten(2).transpose(1, 2)
        both = x.mean() > 0  # the embedding decides (for an image of zeros, its bias alone: whatever the weights)
        x = self.blocks[0](x, x, x, need_weights=False)[0]
        if both:
            x = self.blocks[1](x, x, x, need_weights=False)[0]
        return x


def test_a_forward_whose_layers_change_with_the_input_is_refused_in_one_line_when_it_changes():
    model = Changing().eval()
    with torch.no_grad():
        model.proj.bias.fill_(-10.0)  # an image of zeros (the trace's: the meta device has no value) runs one layer
    checkpoint = vit.load(model, image_size=(8, 12), **IMAGENET)
    assert checkpoint.model.num_layers == 1
    with torch.no_grad():
        model.proj.bias.fill_(10.0)  # now the same input runs two
    with pytest.raises(ValueError, match=r"made 2 attention calls, not the 1 .*its layers change with the input"
                       ) as refused:
        checkpoint.model.run(torch.zeros(1, 3, 8, 12), layers=[0])
    assert "\n" not in str(refused.value)


def test_a_transformers_model_inside_a_users_class_is_recorded_at_its_sdpa_equal_to_its_eager_attentions():
    import copy

    from transformers import Dinov2WithRegistersConfig, Dinov2WithRegistersModel

    torch.manual_seed(12)
    config = Dinov2WithRegistersConfig(image_size=28, patch_size=7, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=4, intermediate_size=64, num_register_tokens=2)
    backbone = Dinov2WithRegistersModel(config).eval()
    with torch.no_grad():
        backbone.embeddings.cls_token.normal_()
        backbone.embeddings.register_tokens.normal_()
    eager = copy.deepcopy(backbone)
    eager.set_attn_implementation("eager")

    class Features(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(pixel_values=x).last_hidden_state

    checkpoint = vit.load(Features(backbone).eval(), image_size=(21, 35), **IMAGENET)
    assert (checkpoint.model.layout.num_prefix_tokens, checkpoint.model.layout.grid) == (3, (3, 5))
    pixels = torch.randn(1, 3, 21, 35)
    _, recorded = checkpoint.model.run(pixels, layers=[0, 1])
    with torch.no_grad():
        own = eager(pixel_values=pixels, output_attentions=True).attentions
    for layer in range(2):
        assert torch.allclose(recorded[layer], own[layer], atol=1e-5)


def test_an_open_clip_tower_with_a_linear_projection_gives_an_embedding_not_logits():
    from open_clip.timm_model import TimmModel

    tower = TimmModel("vit_tiny_patch16_224", embed_dim=16, pretrained=False, proj="linear").eval()
    checkpoint = vit.load(tower, **IMAGENET)  # its image_size: 224 px
    assert not checkpoint.model.is_classifier and checkpoint.class_names == []
    assert checkpoint.model.layout.num_prefix_tokens == 1 and checkpoint.model.layout.grid == (14, 14)
